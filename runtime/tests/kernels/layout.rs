//! Layout kernels (strided copies), constants and iota: bit-exact.

use crate::common::*;
use weft_ir::tensor::HostTensor;
use weft_ir::{DType, Literal, Op};

const DTYPES: [DType; 7] = [DType::F32, DType::BF16, DType::F16, DType::F64, DType::I32, DType::U32, DType::Bool];

fn exact(be: &weft_runtime::CubeclBackend<cubecl::wgpu::WgpuRuntime>, op: Op, inputs: &[HostTensor]) {
    check_op(be, &op, inputs, true, 0.0, 0.0);
}

#[test]
fn broadcast_transpose_reshape() {
    let Some(be) = wgpu_or_skip() else { return };
    let mut rng = Rng::new(10);
    for d in DTYPES {
        let x = random(&mut rng, &ty(d, &[3, 1, 5]), -100.0, 100.0);
        exact(&be, Op::BroadcastInDim { dims: vec![0, 2, 3], shape: vec![3, 4, 7, 5] }, &[x.clone()]);
        exact(&be, Op::BroadcastInDim { dims: vec![1, 2, 3], shape: vec![2, 3, 1, 5] }, &[x.clone()]);
        let s = random(&mut rng, &ty(d, &[]), -100.0, 100.0);
        exact(&be, Op::BroadcastInDim { dims: vec![], shape: vec![17, 19] }, &[s]);
        let y = random(&mut rng, &ty(d, &[4, 6, 5, 3]), -100.0, 100.0);
        for perm in [[0, 1, 2, 3], [3, 2, 1, 0], [1, 0, 3, 2], [2, 0, 3, 1]] {
            exact(&be, Op::Transpose { perm: perm.to_vec() }, &[y.clone()]);
        }
        exact(&be, Op::Reshape { shape: vec![24, 15] }, &[y.clone()]);
        exact(&be, Op::Reshape { shape: vec![360] }, &[y]);
    }
    // Odd sizes and a large transpose.
    let z = random(&mut rng, &ty(DType::F32, &[513, 257]), -1.0, 1.0);
    exact(&be, Op::Transpose { perm: vec![1, 0] }, &[z]);
}

#[test]
fn slices_concatenation_and_padding() {
    let Some(be) = wgpu_or_skip() else { return };
    let mut rng = Rng::new(11);
    for d in DTYPES {
        let x = random(&mut rng, &ty(d, &[9, 10, 7]), -100.0, 100.0);
        exact(&be, Op::Slice { start: vec![1, 0, 2], limit: vec![8, 10, 7], stride: vec![1, 1, 1] }, &[x.clone()]);
        exact(&be, Op::Slice { start: vec![0, 3, 1], limit: vec![9, 10, 6], stride: vec![3, 2, 4] }, &[x.clone()]);
        exact(&be, Op::Slice { start: vec![4, 4, 4], limit: vec![4, 9, 5], stride: vec![1, 1, 1] }, &[x.clone()]);
        let a = random(&mut rng, &ty(d, &[9, 3, 7]), -100.0, 100.0);
        let b = random(&mut rng, &ty(d, &[9, 1, 7]), -100.0, 100.0);
        exact(&be, Op::Concatenate { dim: 1 }, &[x.clone(), a, b]);
        let c = random(&mut rng, &ty(d, &[2, 10, 7]), -100.0, 100.0);
        exact(&be, Op::Concatenate { dim: 0 }, &[c, x.clone()]);
        let v = random(&mut rng, &ty(d, &[]), -100.0, 100.0);
        let pads = [
            (vec![1, 0, 2], vec![0, 3, 1], vec![0, 0, 0]),
            (vec![-2, 1, 0], vec![1, -3, 0], vec![1, 0, 2]),
            (vec![0, -1, -1], vec![-1, 0, -2], vec![2, 1, 0]),
        ];
        for (low, high, interior) in pads {
            exact(&be, Op::Pad { low, high, interior }, &[x.clone(), v.clone()]);
        }
    }
}

#[test]
fn iota_and_constants() {
    let Some(be) = wgpu_or_skip() else { return };
    for d in DTYPES {
        // (iota of bool is not a valid op)
        for (shape, dim) in [(vec![7], 0), (vec![3, 300], 1), (vec![5, 4, 3], 0), (vec![2, 70000], 1)] {
            if d != DType::Bool {
                exact(&be, Op::Iota { dim, ty: ty(d, &shape) }, &[]);
            }
        }
        exact(&be, Op::Constant(Literal::splat(ty(d, &[33, 3]), 2.75)), &[]);
        exact(&be, Op::Constant(Literal::scalar(d, -1.0)), &[]);
        let dense = Literal::dense(ty(d, &[2, 3]), vec![1.0, -2.0, 3.5, 0.0, 1e3, 7.0]).unwrap();
        exact(&be, Op::Constant(dense), &[]);
    }
}

#[test]
fn empty_tensors() {
    let Some(be) = wgpu_or_skip() else { return };
    let x = HostTensor::from_f32(&[0, 3], vec![]).unwrap();
    exact(&be, Op::Transpose { perm: vec![1, 0] }, &[x.clone()]);
    exact(&be, Op::Unary(weft_ir::UnaryOp::Exp), &[x.clone()]);
    exact(&be, Op::Reduce { op: weft_ir::ReduceOp::Sum, dims: vec![0] }, &[x.clone()]);
    exact(&be, Op::Reduce { op: weft_ir::ReduceOp::Max, dims: vec![0] }, &[x]);
}

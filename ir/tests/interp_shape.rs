//! Data-movement ops: iota, broadcast_in_dim, reshape, transpose, slice,
//! concatenate, pad, and zero-extent tensors.

mod interp_util;

use interp_util::*;
use weft_ir::tensor::HostTensor;
use weft_ir::{BinaryOp, DType, Op, TensorType};

fn bcast(x: &HostTensor, dims: &[usize], shape: &[usize]) -> HostTensor {
    run_op(Op::BroadcastInDim { dims: dims.to_vec(), shape: shape.to_vec() }, &[x])
}

fn pad(x: &HostTensor, v: &HostTensor, low: &[i64], high: &[i64], interior: &[usize]) -> HostTensor {
    run_op(Op::Pad { low: low.to_vec(), high: high.to_vec(), interior: interior.to_vec() }, &[x, v])
}

fn slice(x: &HostTensor, start: &[usize], limit: &[usize], stride: &[usize]) -> HostTensor {
    run_op(Op::Slice { start: start.to_vec(), limit: limit.to_vec(), stride: stride.to_vec() }, &[x])
}

fn iota(dtype: DType, shape: &[usize], dim: usize) -> HostTensor {
    run_op(Op::Iota { dim, ty: TensorType::new(dtype, shape.to_vec()) }, &[])
}

fn range_i32(shape: &[usize]) -> HostTensor {
    let n: usize = shape.iter().product();
    i32t(shape, &(0..n as i32).collect::<Vec<_>>())
}

#[test]
fn iota_int_and_float() {
    assert_bits(&iota(DType::I32, &[2, 3], 1), &i32t(&[2, 3], &[0, 1, 2, 0, 1, 2]));
    assert_bits(&iota(DType::F32, &[2, 3], 0), &f32t(&[2, 3], &[0.0, 0.0, 0.0, 1.0, 1.0, 1.0]));
    assert_bits(&iota(DType::U32, &[3], 0), &u32t(&[3], &[0, 1, 2]));
    // bf16 has 8 significant bits: 257 rounds (tie) to 256, 259 to 260.
    let b = iota(DType::BF16, &[300], 0).to_f64_vec();
    assert_eq!((b[255], b[256], b[257], b[259]), (255.0, 256.0, 256.0, 260.0));
}

#[test]
fn broadcast_in_dim_maps_and_expands() {
    let v = f32t(&[3], &[1.0, 2.0, 3.0]);
    assert_bits(&bcast(&v, &[1], &[2, 3]), &f32t(&[2, 3], &[1.0, 2.0, 3.0, 1.0, 2.0, 3.0]));
    assert_bits(&bcast(&v, &[0], &[3, 2]), &f32t(&[3, 2], &[1.0, 1.0, 2.0, 2.0, 3.0, 3.0]));
    // Size-1 expansion of a mapped dimension.
    let col = i32t(&[2, 1], &[1, 2]);
    assert_bits(&bcast(&col, &[0, 1], &[2, 3]), &i32t(&[2, 3], &[1, 1, 1, 2, 2, 2]));
    // Scalar to a matrix.
    assert_bits(&bcast(&scalar(DType::I32, 7.0), &[], &[2, 2]), &i32t(&[2, 2], &[7, 7, 7, 7]));
    // [1,3] into [2,2,3] at dims (0, 2): expands dim 0, inserts dim 1.
    let row = i32t(&[1, 3], &[4, 5, 6]);
    let want = i32t(&[2, 2, 3], &[4, 5, 6, 4, 5, 6, 4, 5, 6, 4, 5, 6]);
    assert_bits(&bcast(&row, &[0, 2], &[2, 2, 3]), &want);
    // [2] into [2, 3] at dim 0 then a new trailing dim: values repeat along dim 1.
    let v = boolt(&[2], &[true, false]);
    assert_bits(&bcast(&v, &[0], &[2, 3]), &boolt(&[2, 3], &[true, true, true, false, false, false]));
}

#[test]
fn reshape_keeps_row_major_order() {
    let x = range_i32(&[2, 3]);
    assert_bits(&run_op(Op::Reshape { shape: vec![3, 2] }, &[&x]), &range_i32(&[3, 2]));
    assert_bits(&run_op(Op::Reshape { shape: vec![6] }, &[&x]), &range_i32(&[6]));
    assert_bits(&run_op(Op::Reshape { shape: vec![] }, &[&i32t(&[1, 1], &[9])]), &i32t(&[], &[9]));
}

#[test]
fn transpose_rank_3() {
    // x[i][j][k] = 4i + 2j + k; perm [1, 2, 0]: r[a][b][c] = x[c][a][b].
    let x = range_i32(&[2, 2, 2]);
    let r = run_op(Op::Transpose { perm: vec![1, 2, 0] }, &[&x]);
    assert_bits(&r, &i32t(&[2, 2, 2], &[0, 4, 1, 5, 2, 6, 3, 7]));
    // Non-cubic: x: [2,3,4], x[i][j][k] = 12i + 4j + k; perm [2, 0, 1] gives [4, 2, 3] with
    // r[a][b][c] = x[b][c][a] = 12b + 4c + a.
    let x = range_i32(&[2, 3, 4]);
    let r = run_op(Op::Transpose { perm: vec![2, 0, 1] }, &[&x]);
    let mut want = Vec::new();
    for a in 0..4 {
        for b in 0..2 {
            for c in 0..3 {
                want.push(12 * b + 4 * c + a);
            }
        }
    }
    assert_bits(&r, &i32t(&[4, 2, 3], &want));
    // First rows spelled out: a=0: [0,4,8, 12,16,20]; a=1: [1,5,9, ...].
    assert_eq!(r.to_f64_vec()[..7], [0.0, 4.0, 8.0, 12.0, 16.0, 20.0, 1.0]);
}

#[test]
fn strided_slice() {
    // x = [[0..5], [5..10], [10..15]]
    let x = range_i32(&[3, 5]);
    assert_bits(&slice(&x, &[0, 1], &[3, 5], &[2, 2]), &i32t(&[2, 2], &[1, 3, 11, 13]));
    assert_bits(&slice(&x, &[1, 0], &[2, 5], &[1, 1]), &i32t(&[1, 5], &[5, 6, 7, 8, 9]));
    let v = range_i32(&[7]);
    assert_bits(&slice(&v, &[1], &[6], &[3]), &i32t(&[2], &[1, 4]));
    assert_bits(&slice(&v, &[3], &[3], &[1]), &i32t(&[0], &[]));
}

#[test]
fn concatenate_along_each_dim() {
    let a = i32t(&[2, 2], &[1, 2, 3, 4]);
    let b = i32t(&[2, 1], &[5, 6]);
    assert_bits(&run_op(Op::Concatenate { dim: 1 }, &[&a, &b]), &i32t(&[2, 3], &[1, 2, 5, 3, 4, 6]));
    let c = i32t(&[1, 2], &[7, 8]);
    let r = run_op(Op::Concatenate { dim: 0 }, &[&a, &c, &a]);
    assert_bits(&r, &i32t(&[5, 2], &[1, 2, 3, 4, 7, 8, 1, 2, 3, 4]));
    let e = i32t(&[0, 2], &[]);
    assert_bits(&run_op(Op::Concatenate { dim: 0 }, &[&e, &c]), &c);
}

#[test]
fn concatenate_results_are_row_major_whatever_the_operands_layout() {
    // Inner-dimension concatenation of a column-major operand and a plain
    // one: the values are right and the result is in standard layout
    // (later ops read it as one slice).
    let cols = ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(&[2, 3]), vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0])
        .unwrap()
        .reversed_axes();
    assert!(!cols.is_standard_layout());
    let t = HostTensor::F32(cols);
    let b = f32t(&[3, 1], &[7.0, 8.0, 9.0]);
    let mut r = weft_ir::interp::eval_op(&Op::Concatenate { dim: 1 }, &[&t, &b]).unwrap();
    let r = r.remove(0);
    assert_bits(&r, &f32t(&[3, 3], &[1.0, 4.0, 7.0, 2.0, 5.0, 8.0, 3.0, 6.0, 9.0]));
    let HostTensor::F32(a) = &r else { panic!("f32") };
    assert!(a.is_standard_layout());
    let err = |xs: &[&HostTensor]| weft_ir::interp::eval_op(&Op::Concatenate { dim: 1 }, xs).unwrap_err().to_string();
    assert!(err(&[&b, &i32t(&[3, 1], &[1, 2, 3])]).contains("incompatible"));
    let ragged = err(&[&b, &f32t(&[2, 1], &[1.0, 2.0])]);
    assert!(ragged.contains("f32[2,1]"), "{ragged}");
}

#[test]
fn pad_low_high_interior() {
    let x = f32t(&[3], &[1.0, 2.0, 3.0]);
    let z = scalar(DType::F32, 0.0);
    assert_bits(&pad(&x, &z, &[1], &[2], &[1]), &f32t(&[8], &[0.0, 1.0, 0.0, 2.0, 0.0, 3.0, 0.0, 0.0]));
    assert_bits(&pad(&x, &z, &[0], &[0], &[2]), &f32t(&[7], &[1.0, 0.0, 0.0, 2.0, 0.0, 0.0, 3.0]));
}

#[test]
fn pad_negative_crops() {
    let z = scalar(DType::I32, 0.0);
    let x = i32t(&[4], &[1, 2, 3, 4]);
    assert_bits(&pad(&x, &z, &[-1], &[-1], &[0]), &i32t(&[2], &[2, 3]));
    // Interior first, then crop: [1,0,2,0,3] -> drop 2 in front -> [2,0,3].
    let x = i32t(&[3], &[1, 2, 3]);
    assert_bits(&pad(&x, &z, &[-2], &[0], &[1]), &i32t(&[3], &[2, 0, 3]));
    // Crop lands on padding: drop 1 in front -> [0,2,0,3]; drop 2 at the end -> [1,0,2].
    assert_bits(&pad(&x, &z, &[-1], &[0], &[1]), &i32t(&[4], &[0, 2, 0, 3]));
    assert_bits(&pad(&x, &z, &[0], &[-2], &[1]), &i32t(&[3], &[1, 0, 2]));
    // Crop everything.
    assert_bits(&pad(&x, &z, &[-3], &[0], &[0]), &i32t(&[0], &[]));
    // Mixed crop and pad.
    assert_bits(&pad(&x, &z, &[-1], &[2], &[0]), &i32t(&[4], &[2, 3, 0, 0]));
}

#[test]
fn pad_2d() {
    // [[1,2],[3,4]]: a row of 9s in front, columns interleaved with 9 then the last column cropped.
    let x = i32t(&[2, 2], &[1, 2, 3, 4]);
    let r = pad(&x, &scalar(DType::I32, 9.0), &[1, 0], &[0, -1], &[0, 1]);
    assert_bits(&r, &i32t(&[3, 2], &[9, 9, 1, 9, 3, 9]));
    let r = pad(&x, &scalar(DType::I32, 0.0), &[0, 1], &[1, 0], &[1, 0]);
    assert_bits(&r, &i32t(&[4, 3], &[0, 1, 2, 0, 0, 0, 0, 3, 4, 0, 0, 0]));
}

#[test]
fn zero_extent_tensors() {
    let e = f32t(&[0, 3], &[]);
    let r = run_op(Op::Binary(BinaryOp::Add), &[&e, &e]);
    assert_eq!(r.shape(), &[0, 3]);
    assert!(r.is_empty());
    let r = run_op(Op::Transpose { perm: vec![1, 0] }, &[&e]);
    assert_eq!(r.shape(), &[3, 0]);
    let r = bcast(&f32t(&[0], &[]), &[1], &[2, 0]);
    assert_eq!(r.shape(), &[2, 0]);
    let r = slice(&e, &[0, 1], &[0, 3], &[1, 1]);
    assert_eq!(r.shape(), &[0, 2]);
    let r = pad(&e, &scalar(DType::F32, 5.0), &[1, 0], &[0, 0], &[0, 0]);
    assert_bits(&r, &f32t(&[1, 3], &[5.0, 5.0, 5.0]));
    let r = run_op(Op::Reshape { shape: vec![3, 0, 2] }, &[&e]);
    assert_eq!(r.shape(), &[3, 0, 2]);
    let r = iota(DType::I32, &[0, 4], 1);
    assert_eq!(r.shape(), &[0, 4]);
}

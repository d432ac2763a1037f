//! Indexing kernels (gather, scatter_add, cumsum, top_k): bit-exact
//! against the CPU reference, sums included (same order, same accumulation
//! type).

use crate::common::*;
use weft_ir::tensor::HostTensor;
use weft_ir::{DType, IndexOp, Op};

type Be = weft_runtime::CubeclBackend<cubecl::wgpu::WgpuRuntime>;

const DTYPES: [DType; 7] = [DType::F32, DType::BF16, DType::F16, DType::F64, DType::I32, DType::U32, DType::Bool];
const NUMBERS: [DType; 6] = [DType::F32, DType::BF16, DType::F16, DType::F64, DType::I32, DType::U32];

fn exact(be: &Be, op: IndexOp, inputs: &[HostTensor]) {
    check_op(be, &Op::Index(op), inputs, true, 0.0, 0.0);
}

/// `i32` indices.
fn ids(shape: &[usize], v: Vec<i32>) -> HostTensor {
    HostTensor::from_vec(shape, v).unwrap()
}

/// The same index bits as `u32` (negative values become huge ones).
fn ids_u32(shape: &[usize], v: &[i32]) -> HostTensor {
    HostTensor::from_vec(shape, v.iter().map(|&i| i as u32).collect::<Vec<u32>>()).unwrap()
}

/// Random indices in `[lo, hi)`.
fn random_ids(rng: &mut Rng, shape: &[usize], lo: i32, hi: i32) -> Vec<i32> {
    let n: usize = shape.iter().product();
    (0..n).map(|_| rng.uniform(lo as f64, hi as f64).floor() as i32).collect()
}

/// Random indices in `[lo, hi)` with a few extreme out-of-range ones mixed in.
fn wild_ids(rng: &mut Rng, shape: &[usize], lo: i32, hi: i32) -> Vec<i32> {
    let mut v = random_ids(rng, shape, lo, hi);
    let extremes = [-1, i32::MIN, i32::MAX, hi, hi + 1000];
    for (k, e) in extremes.iter().enumerate() {
        if let Some(slot) = v.get_mut(k * 3) {
            *slot = *e;
        }
    }
    v
}

/// Checks `op` with the indices (input `at` of `rest`) as `i32` and as `u32`.
fn both_index_types(be: &Be, op: IndexOp, shape: &[usize], v: &[i32], at: usize, rest: &[HostTensor]) {
    for idx in [ids(shape, v.to_vec()), ids_u32(shape, v)] {
        let mut inputs = rest.to_vec();
        inputs.insert(at, idx);
        exact(be, op.clone(), &inputs);
    }
}

#[test]
fn gather_embedding_take_along_axis_and_middle_axes() {
    let Some(be) = wgpu_or_skip() else { return };
    let mut rng = Rng::new(40);
    for d in DTYPES {
        // Embedding lookup: a [V, D] table by [B, T] ids, some out of range.
        let table = random(&mut rng, &ty(d, &[11, 5]), -100.0, 100.0);
        let v = wild_ids(&mut rng, &[3, 7], -3, 14);
        both_index_types(&be, IndexOp::Gather { axis: 0, batch_dims: 0 }, &[3, 7], &v, 1, &[table]);
        // take_along_axis of [N, C] logits by [N] targets.
        let logits = random(&mut rng, &ty(d, &[6, 9]), -100.0, 100.0);
        let t = vec![0, 8, -1, 4, 9, 3];
        both_index_types(&be, IndexOp::Gather { axis: 1, batch_dims: 1 }, &[6], &t, 1, &[logits]);
        // An axis in the middle: batch, pre and post dimensions.
        let x = random(&mut rng, &ty(d, &[2, 3, 8, 4]), -100.0, 100.0);
        let v = wild_ids(&mut rng, &[2, 5], -2, 10);
        both_index_types(&be, IndexOp::Gather { axis: 2, batch_dims: 1 }, &[2, 5], &v, 1, &[x.clone()]);
        let v = random_ids(&mut rng, &[2, 3], 0, 3);
        exact(&be, IndexOp::Gather { axis: 1, batch_dims: 0 }, &[x.clone(), ids(&[2, 3], v)]);
        // Scalar index: the axis disappears.
        exact(&be, IndexOp::Gather { axis: 3, batch_dims: 0 }, &[x, ids(&[], vec![2])]);
    }
    // Larger: more threads than one cube row, rows of 64.
    let table = random(&mut rng, &ty(DType::F32, &[300, 64]), -1.0, 1.0);
    let v = wild_ids(&mut rng, &[4, 700], -10, 310);
    both_index_types(&be, IndexOp::Gather { axis: 0, batch_dims: 0 }, &[4, 700], &v, 1, &[table]);
}

#[test]
fn scatter_add_is_the_transpose_of_gather() {
    let Some(be) = wgpu_or_skip() else { return };
    let mut rng = Rng::new(41);
    for d in NUMBERS {
        // The embedding gradient: repeated and out-of-range ids.
        let upd = random(&mut rng, &ty(d, &[3, 7, 5]), -100.0, 100.0);
        let v = wild_ids(&mut rng, &[3, 7], -2, 6);
        both_index_types(&be, IndexOp::ScatterAdd { axis: 0, batch_dims: 0, size: 4 }, &[3, 7], &v, 0, &[upd]);
        // take_along_axis's transpose.
        let upd = random(&mut rng, &ty(d, &[6]), -100.0, 100.0);
        let t = vec![0, 8, -1, 4, 9, 8];
        both_index_types(&be, IndexOp::ScatterAdd { axis: 1, batch_dims: 1, size: 9 }, &[6], &t, 0, &[upd]);
        // An axis in the middle, with batch, pre and post dimensions.
        let upd = random(&mut rng, &ty(d, &[2, 3, 5, 4]), -100.0, 100.0);
        let v = wild_ids(&mut rng, &[2, 5], -1, 4);
        let op = IndexOp::ScatterAdd { axis: 2, batch_dims: 1, size: 3 };
        both_index_types(&be, op, &[2, 5], &v, 0, &[upd]);
    }
    // Many updates to few rows: the sum's order shows in f32, bf16 and i32
    // (wrapping) results.
    for (d, lo, hi) in [(DType::F32, -1e6, 1e6), (DType::BF16, -100.0, 100.0), (DType::I32, -2e9, 2e9)] {
        let upd = random(&mut rng, &ty(d, &[500, 3]), lo, hi);
        let v = wild_ids(&mut rng, &[500], 0, 5);
        both_index_types(&be, IndexOp::ScatterAdd { axis: 0, batch_dims: 0, size: 5 }, &[500], &v, 0, &[upd]);
    }
    // No index positions at all: a result of zeros.
    for d in [DType::F32, DType::I32] {
        let upd = random(&mut rng, &ty(d, &[0, 5]), -100.0, 100.0);
        both_index_types(&be, IndexOp::ScatterAdd { axis: 0, batch_dims: 0, size: 4 }, &[0], &[], 0, &[upd]);
    }
    // Mixed magnitudes in f32: any other summation order rounds differently.
    let vals: Vec<f32> = (0..64).map(|i| if i % 3 == 0 { 1e8 } else { 0.7 + i as f32 * 1e-3 }).collect();
    let upd = HostTensor::from_f32(&[64, 1], vals).unwrap();
    let v: Vec<i32> = (0..64).map(|i| i % 2).collect();
    both_index_types(&be, IndexOp::ScatterAdd { axis: 0, batch_dims: 0, size: 2 }, &[64], &v, 0, &[upd]);
}

#[test]
fn cumsum_both_directions() {
    let Some(be) = wgpu_or_skip() else { return };
    let mut rng = Rng::new(42);
    for d in NUMBERS {
        let (lo, hi) = if d.is_integer() { (-2e9, 2e9) } else { (-100.0, 100.0) };
        let lo = if d == DType::U32 { 0.0 } else { lo };
        let x = random(&mut rng, &ty(d, &[5, 37, 3]), lo, hi);
        for dim in 0..3 {
            for reverse in [false, true] {
                exact(&be, IndexOp::Cumsum { dim, reverse }, &[x.clone()]);
            }
        }
        let s = random(&mut rng, &ty(d, &[1]), lo, hi);
        exact(&be, IndexOp::Cumsum { dim: 0, reverse: true }, &[s]);
    }
    // Long lines, where the running sum's rounding shows.
    for d in [DType::F32, DType::BF16, DType::I32] {
        let x = random(&mut rng, &ty(d, &[3, 5000]), -10.0, 10.0);
        exact(&be, IndexOp::Cumsum { dim: 1, reverse: false }, &[x.clone()]);
        exact(&be, IndexOp::Cumsum { dim: 1, reverse: true }, &[x]);
    }
}

#[test]
fn top_k_ties_nan_and_infinities() {
    let Some(be) = wgpu_or_skip() else { return };
    let mut rng = Rng::new(43);
    for d in NUMBERS {
        let x = random(&mut rng, &ty(d, &[7, 13]), -100.0, 100.0);
        for k in [0, 1, 5, 13] {
            exact(&be, IndexOp::TopK { k }, &[x.clone()]);
        }
        // Many ties: values in {0, 1, 2, 3}.
        let x = random(&mut rng, &ty(d, &[4, 3, 20]), 0.0, 4.0);
        for k in [3, 20] {
            exact(&be, IndexOp::TopK { k }, &[x.clone()]);
        }
        let x = random(&mut rng, &ty(d, &[50]), -1000.0, 1000.0);
        exact(&be, IndexOp::TopK { k: 10 }, &[x]);
    }
    let (nan, inf) = (f32::NAN, f32::INFINITY);
    let row = vec![1.0, nan, -inf, 0.0, inf, -0.0, nan, 1.0, -inf, -1.0, 0.0, -nan];
    let n = row.len();
    let x = HostTensor::from_f32(&[1, n], row.clone()).unwrap();
    let all_neg_inf = HostTensor::from_f32(&[2, 3], vec![-inf; 6]).unwrap();
    for k in [0, 1, 3, 6, n] {
        exact(&be, IndexOp::TopK { k }, &[x.clone()]);
        let f64s = HostTensor::from_vec(&[n], row.iter().map(|&v| v as f64).collect::<Vec<f64>>()).unwrap();
        exact(&be, IndexOp::TopK { k }, &[f64s]);
    }
    for k in [0, 2, 3] {
        exact(&be, IndexOp::TopK { k }, &[all_neg_inf.clone()]);
    }
    let ints = ids(&[2, 5], vec![i32::MIN, 7, i32::MAX, 7, -1, 0, 0, 0, i32::MIN, i32::MAX]);
    for k in [0, 2, 5] {
        exact(&be, IndexOp::TopK { k }, &[ints.clone()]);
    }
    // More rows than one cube.
    let x = random(&mut rng, &ty(DType::F32, &[600, 17]), -1.0, 1.0);
    exact(&be, IndexOp::TopK { k: 4 }, &[x]);
}

#[test]
fn empty_index_tensors() {
    let Some(be) = wgpu_or_skip() else { return };
    let mut rng = Rng::new(44);
    let table = random(&mut rng, &ty(DType::F32, &[11, 5]), -1.0, 1.0);
    let g = IndexOp::Gather { axis: 0, batch_dims: 0 };
    exact(&be, g.clone(), &[table.clone(), ids(&[0], vec![])]);
    exact(&be, g.clone(), &[table, ids(&[3, 0], vec![])]);
    // An empty table: every index is out of range.
    let empty_table = HostTensor::from_f32(&[0, 5], vec![]).unwrap();
    exact(&be, g.clone(), &[empty_table.clone(), ids(&[3], vec![0, -1, 2])]);
    exact(&be, g, &[empty_table, ids(&[0], vec![])]);
    // No updates: zeros.
    let s = IndexOp::ScatterAdd { axis: 0, batch_dims: 0, size: 11 };
    let none = HostTensor::from_f32(&[0, 5], vec![]).unwrap();
    exact(&be, s, &[ids(&[0], vec![]), none.clone()]);
    let s = IndexOp::ScatterAdd { axis: 0, batch_dims: 0, size: 0 };
    let upd = random(&mut rng, &ty(DType::I32, &[3, 5]), -10.0, 10.0);
    exact(&be, s.clone(), &[ids(&[3], vec![0, -1, 2]), upd]);
    exact(&be, s, &[ids(&[0], vec![]), none.clone()]);
    exact(&be, IndexOp::Cumsum { dim: 0, reverse: false }, &[none.clone()]);
    exact(&be, IndexOp::Cumsum { dim: 1, reverse: true }, &[none.clone()]);
    exact(&be, IndexOp::TopK { k: 2 }, &[none]);
    exact(&be, IndexOp::TopK { k: 0 }, &[HostTensor::from_f32(&[3, 0], vec![]).unwrap()]);
}

//! Reductions and dot_general.

use crate::common::*;
use weft_ir::tensor::HostTensor;
use weft_ir::{DType, DotDims, Op, ReduceOp};

#[test]
fn reductions_over_any_dims() {
    let Some(be) = wgpu_or_skip() else { return };
    let mut rng = Rng::new(20);
    let cases: &[(&[usize], &[usize])] = &[
        (&[7], &[0]),
        (&[5, 9], &[1]),
        (&[5, 9], &[0]),
        (&[5, 9], &[0, 1]),
        (&[3, 4, 5, 6], &[1, 3]),
        (&[3, 4, 5, 6], &[0, 2]),
        (&[3000, 31], &[1]),      // many short rows: one thread per row
        (&[3000, 33], &[1]),      // many longer rows: a 32-thread cube per row
        (&[600, 700], &[1]),      // a 128-thread cube per row
        (&[3, 10007], &[1]),      // few long rows: split in two passes
        (&[40000], &[0]),         // one long row: split in two passes
        (&[1200, 130], &[0]),     // over the leading dimension: column blocks, 4 parts
        (&[40, 50, 70], &[0, 1]), // over two leading dimensions, 7 parts
        (&[700, 3], &[0]),        // fewer columns than a block
        (&[4, 300, 5], &[1]),     // over a middle dimension (rearranged first)
    ];
    for d in [DType::F32, DType::BF16, DType::F16, DType::F64, DType::I32, DType::U32] {
        for &(shape, dims) in cases {
            let (lo, hi) = if d.is_float() { (-1.0, 1.0) } else { (-1e6, 1e6) };
            let x = random(&mut rng, &ty(d, shape), lo, hi);
            for op in ReduceOp::ALL {
                // Sums of long rows may add in another order than the CPU:
                // tolerance relative to the sum of magnitudes.
                let n: usize = dims.iter().map(|&k| shape[k]).product();
                let atol = if d.is_float() { 4.0 * (n as f64) * rtol(d).max(1e-7) * 1e-1 } else { 0.0 };
                let exact = op != ReduceOp::Sum || !d.is_float();
                check_op(&be, &Op::Reduce { op, dims: dims.to_vec() }, &[x.clone()], exact, rtol(d), atol);
            }
        }
    }
    // NaN propagates through max and min; -0 and +0 are ordered.
    let x = HostTensor::from_f32(&[2, 4], vec![1.0, f32::NAN, 3.0, -1.0, -0.0, 0.0, -0.0, 0.0]).unwrap();
    for op in ReduceOp::ALL {
        check_op(&be, &Op::Reduce { op, dims: vec![1] }, &[x.clone()], true, 0.0, 0.0);
    }
}

fn dot(lb: &[usize], rb: &[usize], lc: &[usize], rc: &[usize]) -> Op {
    Op::DotGeneral(DotDims {
        lhs_batch: lb.to_vec(),
        rhs_batch: rb.to_vec(),
        lhs_contract: lc.to_vec(),
        rhs_contract: rc.to_vec(),
    })
}

#[test]
fn matrix_products_of_odd_sizes() {
    let Some(be) = wgpu_or_skip() else { return };
    let mut rng = Rng::new(21);
    for (m, k, n) in [(1, 1, 1), (3, 5, 7), (17, 33, 65), (64, 64, 64), (100, 1, 100), (1, 300, 1), (129, 70, 31)] {
        for d in [DType::F32, DType::BF16, DType::F16, DType::F64, DType::I32, DType::U32] {
            let (lo, hi) = if d.is_float() { (-1.0, 1.0) } else { (-100.0, 100.0) };
            let a = random(&mut rng, &ty(d, &[m, k]), lo, hi);
            let b = random(&mut rng, &ty(d, &[k, n]), lo, hi);
            // Tolerance relative to the magnitude of the terms (k of them).
            let atol = if d.is_float() { k as f64 * rtol(d) * 0.5 } else { 0.0 };
            check_op(&be, &Op::DotGeneral(DotDims::matmul()), &[a, b], false, rtol(d), atol);
        }
    }
}

#[test]
fn dot_general_with_batch_and_permuted_dims() {
    let Some(be) = wgpu_or_skip() else { return };
    let mut rng = Rng::new(22);
    for d in [DType::F32, DType::BF16, DType::I32] {
        let (lo, hi) = if d.is_float() { (-1.0, 1.0) } else { (-50.0, 50.0) };
        let atol = if d.is_float() { 40.0 * rtol(d) } else { 0.0 };
        // [b, m, k] x [b, k, n]
        let a = random(&mut rng, &ty(d, &[3, 5, 7]), lo, hi);
        let b = random(&mut rng, &ty(d, &[3, 7, 4]), lo, hi);
        check_op(&be, &dot(&[0], &[0], &[2], &[1]), &[a, b], false, rtol(d), atol);
        // Batch last on the lhs, contraction first on both: [k, m, b] x [k, b, n]
        let a = random(&mut rng, &ty(d, &[6, 5, 2]), lo, hi);
        let b = random(&mut rng, &ty(d, &[6, 2, 9]), lo, hi);
        check_op(&be, &dot(&[2], &[1], &[0], &[0]), &[a, b], false, rtol(d), atol);
        // Two contracting and two batch dims, free dims in the middle.
        let a = random(&mut rng, &ty(d, &[2, 3, 4, 5, 6]), lo, hi);
        let b = random(&mut rng, &ty(d, &[5, 3, 7, 2, 4]), lo, hi);
        check_op(&be, &dot(&[0, 2], &[3, 4], &[3, 1], &[0, 1]), &[a, b], false, rtol(d), atol);
        // An outer product (no contraction) and a contraction to a scalar.
        let a = random(&mut rng, &ty(d, &[5]), lo, hi);
        let b = random(&mut rng, &ty(d, &[3]), lo, hi);
        check_op(&be, &dot(&[], &[], &[], &[]), &[a, b], false, rtol(d), atol);
        let a = random(&mut rng, &ty(d, &[50]), lo, hi);
        let b = random(&mut rng, &ty(d, &[50]), lo, hi);
        check_op(&be, &dot(&[], &[], &[0], &[0]), &[a, b], false, rtol(d), atol);
    }
    // An empty contraction gives zeros.
    let a = HostTensor::from_f32(&[2, 0], vec![]).unwrap();
    let b = HostTensor::from_f32(&[0, 3], vec![]).unwrap();
    check_op(&be, &Op::DotGeneral(DotDims::matmul()), &[a, b], true, 0.0, 0.0);
}

/// The transposed products of a training step (`x^T @ dy`, `dy @ w^T`,
/// both at once) read their operands in place, with no dense copy, and
/// still equal the CPU's to rounding.
#[test]
fn transposed_matrix_operands_are_read_in_place() {
    let Some(be) = wgpu_or_skip() else { return };
    let mut rng = Rng::new(23);
    let (m, k, n) = (37, 29, 23);
    let atol = k as f64 * rtol(DType::F32) * 0.5;
    let cases = [
        (dot(&[], &[], &[0], &[0]), [k, m], [k, n]),
        (dot(&[], &[], &[1], &[1]), [m, k], [n, k]),
        (dot(&[], &[], &[0], &[1]), [k, m], [n, k]),
    ];
    for (op, a, b) in cases {
        let a = random(&mut rng, &ty(DType::F32, &a), -1.0, 1.0);
        let b = random(&mut rng, &ty(DType::F32, &b), -1.0, 1.0);
        check_op(&be, &op, &[a, b], false, rtol(DType::F32), atol);
    }
    let routines = be.matmul_routines();
    assert_eq!(routines.len(), 3, "{routines:?}");
    assert!(routines.iter().all(|(_, _, r)| !r.contains("copied dense")), "{routines:?}");
}

/// A single product with few output tiles and a long contraction (a
/// weight gradient's shape) splits its contraction into runs computed as
/// a batch and summed in order: the result still equals the CPU's to
/// rounding, for row-major and transposed (read in place) operands, and
/// the routine table shows the split problem.
#[test]
fn long_contractions_with_small_outputs_are_split() {
    let Some(be) = wgpu_or_skip() else { return };
    let mut rng = Rng::new(24);
    let (m, k, n) = (64, 2048, 48);
    for d in [DType::F32, DType::BF16] {
        let atol = k as f64 * rtol(d) * 0.5;
        let cases = [(dot(&[], &[], &[1], &[0]), [m, k], [k, n]), (dot(&[], &[], &[0], &[0]), [k, m], [k, n])];
        for (op, a, b) in cases {
            let a = random(&mut rng, &ty(d, &a), -1.0, 1.0);
            let b = random(&mut rng, &ty(d, &b), -1.0, 1.0);
            check_op(&be, &op, &[a, b], false, rtol(d), atol);
        }
    }
    let routines = be.matmul_routines();
    let split: Vec<_> = routines.iter().filter(|(_, [b, _, _, kk], _)| *b == 4 && *kk == k / 4).collect();
    assert_eq!(split.len(), 4, "{routines:?}");
    // A contraction four times longer splits into the most parts, 16
    // runs of 512.
    let a = random(&mut rng, &ty(DType::F32, &[8, 4 * k]), -1.0, 1.0);
    let b = random(&mut rng, &ty(DType::F32, &[4 * k, 8]), -1.0, 1.0);
    check_op(
        &be,
        &Op::DotGeneral(DotDims::matmul()),
        &[a, b],
        false,
        rtol(DType::F32),
        4.0 * k as f64 * rtol(DType::F32) * 0.5,
    );
    assert!(be.matmul_routines().iter().any(|(_, s, _)| *s == [16, 8, 8, 512]), "{:?}", be.matmul_routines());
}

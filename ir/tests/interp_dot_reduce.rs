//! dot_general (batch dims, unusual dimension orders, integer wrapping,
//! half-precision accumulation) and reductions (several dims, NaN, empty,
//! deterministic order).

mod interp_util;

use interp_util::*;
use weft_ir::tensor::HostTensor;
use weft_ir::{DType, DotDims, Op, ReduceOp};

fn dot(l: &HostTensor, r: &HostTensor, lb: &[usize], rb: &[usize], lc: &[usize], rc: &[usize]) -> HostTensor {
    let dims = DotDims {
        lhs_batch: lb.to_vec(),
        rhs_batch: rb.to_vec(),
        lhs_contract: lc.to_vec(),
        rhs_contract: rc.to_vec(),
    };
    run_op(Op::DotGeneral(dims), &[l, r])
}

fn reduce(op: ReduceOp, x: &HostTensor, dims: &[usize]) -> HostTensor {
    run_op(Op::Reduce { op, dims: dims.to_vec() }, &[x])
}

#[test]
fn matmul() {
    let a = f32t(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let b = f32t(&[3, 2], &[7.0, 8.0, 9.0, 10.0, 11.0, 12.0]);
    assert_bits(&dot(&a, &b, &[], &[], &[1], &[0]), &f32t(&[2, 2], &[58.0, 64.0, 139.0, 154.0]));
    let (a64, b64) = (a.convert(DType::F64), b.convert(DType::F64));
    assert_bits(&dot(&a64, &b64, &[], &[], &[1], &[0]), &f64t(&[2, 2], &[58.0, 64.0, 139.0, 154.0]));
    let (ai, bi) = (a.convert(DType::I32), b.convert(DType::I32));
    assert_bits(&dot(&ai, &bi, &[], &[], &[1], &[0]), &i32t(&[2, 2], &[58, 64, 139, 154]));
    let (au, bu) = (a.convert(DType::U32), b.convert(DType::U32));
    assert_bits(&dot(&au, &bu, &[], &[], &[1], &[0]), &u32t(&[2, 2], &[58, 64, 139, 154]));
}

#[test]
fn transposed_operands() {
    // lhs is [K, M] (contract dim 0), rhs is [N, K] (contract dim 1): the same product as `matmul`.
    let a = f32t(&[3, 2], &[1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
    let b = f32t(&[2, 3], &[7.0, 9.0, 11.0, 8.0, 10.0, 12.0]);
    assert_bits(&dot(&a, &b, &[], &[], &[0], &[1]), &f32t(&[2, 2], &[58.0, 64.0, 139.0, 154.0]));
}

#[test]
fn batch_dims() {
    // lhs[b] = [[1,2],[3,4]], [[5,6],[7,8]]; rhs[b] = I, [[2,0],[1,1]].
    let l = f32t(&[2, 2, 2], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]);
    let r = f32t(&[2, 2, 2], &[1.0, 0.0, 0.0, 1.0, 2.0, 0.0, 1.0, 1.0]);
    let want = f32t(&[2, 2, 2], &[1.0, 2.0, 3.0, 4.0, 16.0, 6.0, 22.0, 8.0]);
    assert_bits(&dot(&l, &r, &[0], &[0], &[2], &[1]), &want);
}

#[test]
fn batch_dim_in_the_middle_and_no_rhs_free_dims() {
    // lhs[m][b][k], rhs[k][b]; result[b][m] = sum_k lhs[m][b][k] * rhs[k][b].
    let l = i32t(&[2, 2, 2], &[1, 2, 3, 4, 5, 6, 7, 8]);
    let r = i32t(&[2, 2], &[1, 10, 2, 20]);
    assert_bits(&dot(&l, &r, &[1], &[1], &[2], &[0]), &i32t(&[2, 2], &[5, 17, 110, 230]));
}

#[test]
fn several_contracting_dims_and_outer_product() {
    let a = f32t(&[2, 2], &[1.0, 2.0, 3.0, 4.0]);
    let b = f32t(&[2, 2], &[5.0, 6.0, 7.0, 8.0]);
    assert_bits(&dot(&a, &b, &[], &[], &[0, 1], &[0, 1]), &f32t(&[], &[70.0]));
    // Pairing lhs dim 0 with rhs dim 1: sum a[i][j] * b[j][i].
    assert_bits(&dot(&a, &b, &[], &[], &[0, 1], &[1, 0]), &f32t(&[], &[69.0]));
    let u = i32t(&[2], &[1, 2]);
    let v = i32t(&[3], &[3, 4, 5]);
    assert_bits(&dot(&u, &v, &[], &[], &[], &[]), &i32t(&[2, 3], &[3, 4, 5, 6, 8, 10]));
}

#[test]
fn result_order_is_batch_lhs_free_rhs_free() {
    // lhs [M=2, B=1, K=1], rhs [N=3, K=1, B=1]: result [B, M, N].
    let l = i32t(&[2, 1, 1], &[1, 2]);
    let r = i32t(&[3, 1, 1], &[10, 20, 30]);
    let out = dot(&l, &r, &[1], &[2], &[2], &[1]);
    assert_bits(&out, &i32t(&[1, 2, 3], &[10, 20, 30, 20, 40, 60]));
}

#[test]
fn integer_dot_wraps() {
    let a = i32t(&[1, 2], &[65536, 1]);
    let b = i32t(&[2, 1], &[65536, 5]);
    assert_bits(&dot(&a, &b, &[], &[], &[1], &[0]), &i32t(&[1, 1], &[5]));
    let a = u32t(&[2], &[u32::MAX, 2]);
    let b = u32t(&[2], &[1, 1]);
    assert_bits(&dot(&a, &b, &[], &[], &[0], &[0]), &u32t(&[], &[1]));
}

#[test]
fn half_dot_accumulates_in_f32_and_rounds_once() {
    // 1 + 2^-8 + 2^-8 = 1 + 2^-7 exactly; rounding after every step would give 1.
    let e8 = 2f64.powi(-8);
    let a = t(DType::BF16, &[3], &[1.0, e8, e8]);
    let ones = t(DType::BF16, &[3], &[1.0, 1.0, 1.0]);
    assert_bits(&dot(&a, &ones, &[], &[], &[0], &[0]), &t(DType::BF16, &[], &[1.0 + 2.0 * e8]));
    let e11 = 2f64.powi(-11);
    let a = t(DType::F16, &[3], &[1.0, e11, e11]);
    let ones = t(DType::F16, &[3], &[1.0, 1.0, 1.0]);
    assert_bits(&dot(&a, &ones, &[], &[], &[0], &[0]), &t(DType::F16, &[], &[1.0 + 2.0 * e11]));
}

#[test]
fn empty_dots() {
    // Empty contraction gives zeros.
    let a = f32t(&[2, 0], &[]);
    let b = f32t(&[0, 3], &[]);
    assert_bits(&dot(&a, &b, &[], &[], &[1], &[0]), &f32t(&[2, 3], &[0.0; 6]));
    let a = i32t(&[2, 0], &[]);
    let b = i32t(&[0, 3], &[]);
    assert_bits(&dot(&a, &b, &[], &[], &[1], &[0]), &i32t(&[2, 3], &[0; 6]));
    let a = f32t(&[0, 4], &[]);
    let b = f32t(&[4, 3], &[0.0; 12]);
    assert_eq!(dot(&a, &b, &[], &[], &[1], &[0]).shape(), &[0, 3]);
}

#[test]
fn reduce_sum_over_dims() {
    let x = f32t(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    assert_bits(&reduce(ReduceOp::Sum, &x, &[1]), &f32t(&[2], &[6.0, 15.0]));
    assert_bits(&reduce(ReduceOp::Sum, &x, &[0]), &f32t(&[3], &[5.0, 7.0, 9.0]));
    assert_bits(&reduce(ReduceOp::Sum, &x, &[0, 1]), &f32t(&[], &[21.0]));
    assert_bits(&reduce(ReduceOp::Sum, &x, &[]), &x);
    // x[i][j][k] = 6i + 2j + k over [2,3,2]; summing dims (0, 2) gives 14 + 8j.
    let x = i32t(&[2, 3, 2], &(0..12).collect::<Vec<_>>());
    assert_bits(&reduce(ReduceOp::Sum, &x, &[0, 2]), &i32t(&[3], &[14, 22, 30]));
    assert_bits(&reduce(ReduceOp::Max, &x, &[0, 2]), &i32t(&[3], &[7, 9, 11]));
    assert_bits(&reduce(ReduceOp::Min, &x, &[1]), &i32t(&[2, 2], &[0, 1, 6, 7]));
}

#[test]
fn reduce_sum_order_is_sequential() {
    // Left fold in row-major order: ((1e8 + 1) - 1e8) + 1 = 0 + 1 = 1 in f32
    // (pairwise summation would give 0).
    let x = f32t(&[4], &[1e8, 1.0, -1e8, 1.0]);
    assert_bits(&reduce(ReduceOp::Sum, &x, &[0]), &f32t(&[], &[1.0]));
    // Over dims (0, 1) of [2, 2] the order is x00, x01, x10, x11.
    let x = f32t(&[2, 2], &[1e8, 1.0, -1e8, 1.0]);
    assert_bits(&reduce(ReduceOp::Sum, &x, &[0, 1]), &f32t(&[], &[1.0]));
    // Over dim 0 of the transpose-like layout: column j folds x0j then x1j.
    let x = f32t(&[4, 1], &[1e8, 1.0, -1e8, 1.0]);
    assert_bits(&reduce(ReduceOp::Sum, &x, &[0]), &f32t(&[1], &[1.0]));
}

#[test]
fn reduce_max_min_nan_and_signs() {
    let x = f32t(&[2, 3], &[1.0, f32::NAN, 3.0, -1.0, -5.0, -0.5]);
    assert_bits(&reduce(ReduceOp::Max, &x, &[1]), &f32t(&[2], &[f32::NAN, -0.5]));
    assert_bits(&reduce(ReduceOp::Min, &x, &[1]), &f32t(&[2], &[f32::NAN, -5.0]));
    assert_bits(&reduce(ReduceOp::Max, &x, &[0]), &f32t(&[3], &[1.0, f32::NAN, 3.0]));
    let x = f32t(&[1], &[f32::NEG_INFINITY]);
    assert_bits(&reduce(ReduceOp::Max, &x, &[0]), &f32t(&[], &[f32::NEG_INFINITY]));
}

#[test]
fn empty_reductions_give_identities() {
    let e = f32t(&[0, 2], &[]);
    assert_bits(&reduce(ReduceOp::Sum, &e, &[0]), &f32t(&[2], &[0.0, 0.0]));
    assert_bits(&reduce(ReduceOp::Max, &e, &[0]), &f32t(&[2], &[f32::NEG_INFINITY; 2]));
    assert_bits(&reduce(ReduceOp::Min, &e, &[0]), &f32t(&[2], &[f32::INFINITY; 2]));
    assert_eq!(reduce(ReduceOp::Sum, &e, &[1]).shape(), &[0]);
    let e = i32t(&[0], &[]);
    assert_bits(&reduce(ReduceOp::Max, &e, &[0]), &i32t(&[], &[i32::MIN]));
    assert_bits(&reduce(ReduceOp::Min, &e, &[0]), &i32t(&[], &[i32::MAX]));
    let e = u32t(&[0], &[]);
    assert_bits(&reduce(ReduceOp::Max, &e, &[0]), &u32t(&[], &[0]));
    assert_bits(&reduce(ReduceOp::Min, &e, &[0]), &u32t(&[], &[u32::MAX]));
    let e = t(DType::BF16, &[0], &[]);
    assert_bits(&reduce(ReduceOp::Max, &e, &[0]), &t(DType::BF16, &[], &[f64::NEG_INFINITY]));
}

#[test]
fn integer_and_half_sums() {
    let x = i32t(&[2], &[i32::MAX, 1]);
    assert_bits(&reduce(ReduceOp::Sum, &x, &[0]), &i32t(&[], &[i32::MIN]));
    let x = u32t(&[3], &[u32::MAX, 1, 5]);
    assert_bits(&reduce(ReduceOp::Sum, &x, &[0]), &u32t(&[], &[5]));
    // bf16 sums accumulate in f32 and round once.
    let e8 = 2f64.powi(-8);
    let x = t(DType::BF16, &[3], &[1.0, e8, e8]);
    assert_bits(&reduce(ReduceOp::Sum, &x, &[0]), &t(DType::BF16, &[], &[1.0 + 2.0 * e8]));
}

/// Physical data of a rank-3 tensor whose logical element `[a][b][c]` is
/// `f([a, b, c])`, stored with dimension `i` being logical dimension `perm[i]`.
fn permuted_tensor(logical: [usize; 3], perm: [usize; 3], f: impl Fn([usize; 3]) -> i32) -> HostTensor {
    let shape = perm.map(|p| logical[p]);
    let mut data = Vec::new();
    for p0 in 0..shape[0] {
        for p1 in 0..shape[1] {
            for p2 in 0..shape[2] {
                let mut l = [0; 3];
                for (i, p) in [p0, p1, p2].into_iter().enumerate() {
                    l[perm[i]] = p;
                }
                data.push(f(l));
            }
        }
    }
    i32t(&shape, &data)
}

const PERMS: [[usize; 3]; 6] = [[0, 1, 2], [0, 2, 1], [1, 0, 2], [1, 2, 0], [2, 0, 1], [2, 1, 0]];

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { failure_persistence: None, ..Default::default() })]

    /// dot_general with any placement of the batch, free and contracting
    /// dimensions equals a naive batched matmul.
    #[test]
    fn dot_general_matches_naive_loops(
        b in 0usize..3, m in 0usize..4, k in 0usize..4, n in 0usize..4,
        pl in 0usize..6, pr in 0usize..6, seed in 0i32..1000,
    ) {
        let (pl, pr) = (PERMS[pl], PERMS[pr]);
        let lv = |[bi, mi, ki]: [usize; 3]| (bi as i32 * 7 + mi as i32 * 3 + ki as i32 * 5 + seed) % 11 - 5;
        let rv = |[bi, ki, ni]: [usize; 3]| (bi as i32 * 2 + ki as i32 * 9 + ni as i32 * 4 + seed) % 13 - 6;
        let lhs = permuted_tensor([b, m, k], pl, lv);
        let rhs = permuted_tensor([b, k, n], pr, rv);
        let pos = |perm: [usize; 3], logical: usize| perm.iter().position(|&p| p == logical).unwrap();
        let got = dot(&lhs, &rhs, &[pos(pl, 0)], &[pos(pr, 0)], &[pos(pl, 2)], &[pos(pr, 1)]);
        let mut want = Vec::new();
        for bi in 0..b {
            for mi in 0..m {
                for ni in 0..n {
                    want.push((0..k).map(|ki| lv([bi, mi, ki]) * rv([bi, ki, ni])).sum::<i32>());
                }
            }
        }
        proptest::prop_assert!(got.bitwise_eq(&i32t(&[b, m, n], &want)), "got {got}");
        // The same product in f32 is exact for these small integers.
        let gotf = dot(&lhs.convert(DType::F32), &rhs.convert(DType::F32), &[pos(pl, 0)], &[pos(pr, 0)], &[pos(pl, 2)], &[pos(pr, 1)]);
        proptest::prop_assert!(gotf.bitwise_eq(&i32t(&[b, m, n], &want).convert(DType::F32)), "got {gotf}");
    }
}

//! Elementwise ops: unary, binary, compare, select, convert; NaN handling,
//! integer wrapping and half-precision rounding.

mod interp_util;

use interp_util::*;
use weft_ir::tensor::{assert_close, HostTensor};
use weft_ir::{BinaryOp, CompareOp, DType, Op, UnaryOp};

fn un(op: UnaryOp, x: &HostTensor) -> HostTensor {
    run_op(Op::Unary(op), &[x])
}

fn bin(op: BinaryOp, x: &HostTensor, y: &HostTensor) -> HostTensor {
    run_op(Op::Binary(op), &[x, y])
}

fn cmp(op: CompareOp, x: &HostTensor, y: &HostTensor) -> HostTensor {
    run_op(Op::Compare(op), &[x, y])
}

const NAN: f32 = f32::NAN;
const INF: f32 = f32::INFINITY;

#[test]
fn transcendentals_f32() {
    let x = f32t(&[4], &[0.0, 1.0, -INF, NAN]);
    assert_close(&un(UnaryOp::Exp, &x), &f32t(&[4], &[1.0, 2.7182817, 0.0, NAN]), 1e-7, 0.0);
    let x = f32t(&[4], &[1.0, 2.7182817, 0.0, -1.0]);
    assert_close(&un(UnaryOp::Log, &x), &f32t(&[4], &[0.0, 1.0, -INF, NAN]), 1e-6, 0.0);
    let x = f32t(&[3], &[0.0, -1.0, 1e-10]);
    assert_close(&un(UnaryOp::Log1p, &x), &f32t(&[3], &[0.0, -INF, 1e-10]), 1e-6, 0.0);
    let x = f32t(&[3], &[0.0, 1e4, -1e4]);
    assert_bits(&un(UnaryOp::Tanh, &x), &f32t(&[3], &[0.0, 1.0, -1.0]));
    let x = f32t(&[2], &[4.0, -1.0]);
    assert_close(&un(UnaryOp::Sqrt, &x), &f32t(&[2], &[2.0, NAN]), 0.0, 0.0);
    let x = f32t(&[2], &[4.0, 0.0]);
    assert_close(&un(UnaryOp::Rsqrt, &x), &f32t(&[2], &[0.5, INF]), 0.0, 0.0);
    let x = f32t(&[3], &[-1.5, 1.5, -0.0]);
    assert_bits(&un(UnaryOp::Floor, &x), &f32t(&[3], &[-2.0, 1.0, -0.0]));
}

#[test]
fn logistic_is_stable() {
    let x = f32t(&[5], &[0.0, 1000.0, -1000.0, 2.0, -2.0]);
    let y = un(UnaryOp::Logistic, &x);
    assert_close(&y, &f32t(&[5], &[0.5, 1.0, 0.0, 0.880797, 0.119203]), 1e-6, 0.0);
    let x = f64t(&[2], &[-800.0, 800.0]);
    assert_bits(&un(UnaryOp::Logistic, &x), &f64t(&[2], &[0.0, 1.0]));
}

#[test]
fn sign_neg_abs() {
    let x = f32t(&[5], &[-3.0, -0.0, 0.0, 2.0, NAN]);
    let s = un(UnaryOp::Sign, &x);
    assert_bits(&s, &f32t(&[5], &[-1.0, -0.0, 0.0, 1.0, NAN]));
    assert_bits(&un(UnaryOp::Neg, &f32t(&[2], &[0.0, 1.5])), &f32t(&[2], &[-0.0, -1.5]));
    assert_bits(&un(UnaryOp::Abs, &f32t(&[2], &[-0.0, -2.5])), &f32t(&[2], &[0.0, 2.5]));
    assert_bits(&un(UnaryOp::Sign, &i32t(&[3], &[-7, 0, 9])), &i32t(&[3], &[-1, 0, 1]));
    assert_bits(&un(UnaryOp::Neg, &i32t(&[2], &[i32::MIN, 5])), &i32t(&[2], &[i32::MIN, -5]));
    assert_bits(&un(UnaryOp::Abs, &i32t(&[2], &[i32::MIN, -3])), &i32t(&[2], &[i32::MIN, 3]));
}

#[test]
fn not_and_is_finite() {
    assert_bits(&un(UnaryOp::Not, &i32t(&[2], &[0, -1])), &i32t(&[2], &[-1, 0]));
    assert_bits(&un(UnaryOp::Not, &u32t(&[1], &[5])), &u32t(&[1], &[u32::MAX - 5]));
    assert_bits(&un(UnaryOp::Not, &boolt(&[2], &[true, false])), &boolt(&[2], &[false, true]));
    let x = f32t(&[4], &[1.0, INF, -INF, NAN]);
    assert_bits(&un(UnaryOp::IsFinite, &x), &boolt(&[4], &[true, false, false, false]));
    let x = t(DType::BF16, &[2], &[3.0, f64::INFINITY]);
    assert_bits(&un(UnaryOp::IsFinite, &x), &boolt(&[2], &[true, false]));
}

#[test]
fn f32_arithmetic_stays_in_f32() {
    // 2^24 + 1 is not an f32: an f32 add must round it away (f64 would not).
    let a = f32t(&[1], &[16777216.0]);
    let b = f32t(&[1], &[1.0]);
    assert_bits(&bin(BinaryOp::Add, &a, &b), &f32t(&[1], &[16777216.0]));
    let a = f64t(&[1], &[16777216.0]);
    let b = f64t(&[1], &[1.0]);
    assert_bits(&bin(BinaryOp::Add, &a, &b), &f64t(&[1], &[16777217.0]));
    let x = f32t(&[3], &[6.0, 1.0, -5.5]);
    let y = f32t(&[3], &[4.0, 0.0, 2.0]);
    assert_bits(&bin(BinaryOp::Sub, &x, &y), &f32t(&[3], &[2.0, 1.0, -7.5]));
    assert_bits(&bin(BinaryOp::Mul, &x, &y), &f32t(&[3], &[24.0, 0.0, -11.0]));
    assert_bits(&bin(BinaryOp::Div, &x, &y), &f32t(&[3], &[1.5, INF, -2.75]));
    // rem has the sign of the dividend.
    assert_bits(&bin(BinaryOp::Rem, &f32t(&[2], &[5.5, -5.5]), &f32t(&[2], &[2.0, 2.0])), &f32t(&[2], &[1.5, -1.5]));
    assert_bits(&bin(BinaryOp::Pow, &f32t(&[2], &[2.0, 9.0]), &f32t(&[2], &[10.0, 0.5])), &f32t(&[2], &[1024.0, 3.0]));
}

#[test]
fn max_min_propagate_nan() {
    let x = f32t(&[4], &[1.0, NAN, -0.0, 3.0]);
    let y = f32t(&[4], &[2.0, 1.0, 0.0, NAN]);
    assert_bits(&bin(BinaryOp::Max, &x, &y), &f32t(&[4], &[2.0, NAN, 0.0, NAN]));
    assert_bits(&bin(BinaryOp::Min, &x, &y), &f32t(&[4], &[1.0, NAN, -0.0, NAN]));
    // Symmetric in the signed zeros.
    assert_bits(&bin(BinaryOp::Max, &y, &x), &f32t(&[4], &[2.0, NAN, 0.0, NAN]));
    assert_bits(&bin(BinaryOp::Min, &y, &x), &f32t(&[4], &[1.0, NAN, -0.0, NAN]));
    let x = i32t(&[2], &[-5, 7]);
    let y = i32t(&[2], &[3, -9]);
    assert_bits(&bin(BinaryOp::Max, &x, &y), &i32t(&[2], &[3, 7]));
    assert_bits(&bin(BinaryOp::Min, &u32t(&[1], &[u32::MAX]), &u32t(&[1], &[1])), &u32t(&[1], &[1]));
}

#[test]
fn integers_wrap() {
    let r = bin(BinaryOp::Add, &i32t(&[2], &[i32::MAX, -1]), &i32t(&[2], &[1, i32::MIN]));
    assert_bits(&r, &i32t(&[2], &[i32::MIN, i32::MAX]));
    assert_bits(&bin(BinaryOp::Sub, &i32t(&[1], &[i32::MIN]), &i32t(&[1], &[1])), &i32t(&[1], &[i32::MAX]));
    assert_bits(&bin(BinaryOp::Mul, &i32t(&[1], &[65536]), &i32t(&[1], &[65536])), &i32t(&[1], &[0]));
    assert_bits(&bin(BinaryOp::Sub, &u32t(&[1], &[0]), &u32t(&[1], &[1])), &u32t(&[1], &[u32::MAX]));
    assert_bits(&bin(BinaryOp::Mul, &u32t(&[1], &[65537]), &u32t(&[1], &[65537])), &u32t(&[1], &[131073]));
}

#[test]
fn integer_division_edge_cases() {
    let x = i32t(&[5], &[7, -7, 7, i32::MIN, -7]);
    let y = i32t(&[5], &[2, 2, 0, -1, -2]);
    assert_bits(&bin(BinaryOp::Div, &x, &y), &i32t(&[5], &[3, -3, 0, i32::MIN, 3]));
    assert_bits(&bin(BinaryOp::Rem, &x, &y), &i32t(&[5], &[1, -1, 7, 0, -1]));
    let x = u32t(&[2], &[9, 9]);
    let y = u32t(&[2], &[0, 4]);
    assert_bits(&bin(BinaryOp::Div, &x, &y), &u32t(&[2], &[0, 2]));
    assert_bits(&bin(BinaryOp::Rem, &x, &y), &u32t(&[2], &[9, 1]));
}

#[test]
fn shifts_and_bitwise() {
    let ones = i32t(&[4], &[1, 1, 1, 1]);
    let s = i32t(&[4], &[0, 31, 32, -1]);
    assert_bits(&bin(BinaryOp::ShiftLeft, &ones, &s), &i32t(&[4], &[1, i32::MIN, 0, 0]));
    let x = i32t(&[3], &[-1, -8, 5]);
    let s = i32t(&[3], &[28, 1, 40]);
    assert_bits(&bin(BinaryOp::ShiftRightLogical, &x, &s), &i32t(&[3], &[15, 2147483644, 0]));
    let x = u32t(&[3], &[0x8000_0001, 3, 3]);
    let s = u32t(&[3], &[1, 33, 1]);
    assert_bits(&bin(BinaryOp::ShiftRightLogical, &x, &s), &u32t(&[3], &[0x4000_0000, 0, 1]));
    assert_bits(&bin(BinaryOp::ShiftLeft, &x, &s), &u32t(&[3], &[2, 0, 6]));
    let a = i32t(&[2], &[0b1100, -1]);
    let b = i32t(&[2], &[0b1010, 0]);
    assert_bits(&bin(BinaryOp::And, &a, &b), &i32t(&[2], &[0b1000, 0]));
    assert_bits(&bin(BinaryOp::Or, &a, &b), &i32t(&[2], &[0b1110, -1]));
    assert_bits(&bin(BinaryOp::Xor, &a, &b), &i32t(&[2], &[0b0110, -1]));
    let p = boolt(&[4], &[false, false, true, true]);
    let q = boolt(&[4], &[false, true, false, true]);
    assert_bits(&bin(BinaryOp::And, &p, &q), &boolt(&[4], &[false, false, false, true]));
    assert_bits(&bin(BinaryOp::Or, &p, &q), &boolt(&[4], &[false, true, true, true]));
    assert_bits(&bin(BinaryOp::Xor, &p, &q), &boolt(&[4], &[false, true, true, false]));
}

#[test]
fn bf16_and_f16_results_round_to_nearest_even() {
    let e8 = 2f64.powi(-8);
    // 1 + 2^-8 is a tie between 1 and 1 + 2^-7: the even one is 1.
    // (1 + 2^-7) + 2^-8 is a tie between 1 + 2^-7 (odd) and 1 + 2^-6: the even one is 1 + 2^-6.
    let a = t(DType::BF16, &[2], &[1.0, 1.0 + 2.0 * e8]);
    let b = t(DType::BF16, &[2], &[e8, e8]);
    assert_bits(&bin(BinaryOp::Add, &a, &b), &t(DType::BF16, &[2], &[1.0, 1.0 + 4.0 * e8]));
    // Just above the tie rounds up: 1 + 2^-8 + 2^-9 -> 1 + 2^-7.
    let c = t(DType::BF16, &[1], &[e8 + e8 / 2.0]);
    assert_bits(&bin(BinaryOp::Add, &t(DType::BF16, &[1], &[1.0]), &c), &t(DType::BF16, &[1], &[1.0 + 2.0 * e8]));
    // f16: 1 + 2^-11 ties to 1.
    let e11 = 2f64.powi(-11);
    let r = bin(BinaryOp::Add, &t(DType::F16, &[1], &[1.0]), &t(DType::F16, &[1], &[e11]));
    assert_bits(&r, &t(DType::F16, &[1], &[1.0]));
    // bf16 mul: 3 * (1 + 2^-7) = 3.0234375 is halfway between 3.015625 (odd) and 3.03125 (even).
    let r = bin(BinaryOp::Mul, &t(DType::BF16, &[1], &[3.0]), &t(DType::BF16, &[1], &[1.0 + 2.0 * e8]));
    assert_bits(&r, &t(DType::BF16, &[1], &[3.03125]));
    // Unary bf16 rounds too: exp(1) = 2.71828... -> 2.71875 in bf16.
    assert_bits(&un(UnaryOp::Exp, &t(DType::BF16, &[1], &[1.0])), &t(DType::BF16, &[1], &[2.71875]));
}

#[test]
fn comparisons() {
    let x = f32t(&[4], &[1.0, NAN, -0.0, 2.0]);
    let y = f32t(&[4], &[1.0, NAN, 0.0, 1.0]);
    let expect = [
        (CompareOp::Eq, [true, false, true, false]),
        (CompareOp::Ne, [false, true, false, true]),
        (CompareOp::Lt, [false, false, false, false]),
        (CompareOp::Le, [true, false, true, false]),
        (CompareOp::Gt, [false, false, false, true]),
        (CompareOp::Ge, [true, false, true, true]),
    ];
    for (op, want) in expect {
        assert_bits(&cmp(op, &x, &y), &boolt(&[4], &want));
        let (xb, yb) = (x.convert(DType::BF16), y.convert(DType::BF16));
        assert_bits(&cmp(op, &xb, &yb), &boolt(&[4], &want));
    }
    assert_bits(&cmp(CompareOp::Lt, &u32t(&[1], &[0]), &u32t(&[1], &[u32::MAX])), &boolt(&[1], &[true]));
    assert_bits(&cmp(CompareOp::Lt, &i32t(&[2], &[-1, 3]), &i32t(&[2], &[0, 3])), &boolt(&[2], &[true, false]));
    let p = boolt(&[2], &[false, true]);
    let q = boolt(&[2], &[true, true]);
    assert_bits(&cmp(CompareOp::Lt, &p, &q), &boolt(&[2], &[true, false]));
}

#[test]
fn select_full_and_scalar_predicate() {
    let on_t = i32t(&[2, 2], &[1, 2, 3, 4]);
    let on_f = i32t(&[2, 2], &[-1, -2, -3, -4]);
    let p = boolt(&[2, 2], &[true, false, false, true]);
    assert_bits(&run_op(Op::Select, &[&p, &on_t, &on_f]), &i32t(&[2, 2], &[1, -2, -3, 4]));
    let yes = boolt(&[], &[true]);
    assert_bits(&run_op(Op::Select, &[&yes, &on_t, &on_f]), &on_t);
    let no = boolt(&[], &[false]);
    assert_bits(&run_op(Op::Select, &[&no, &on_t, &on_f]), &on_f);
}

#[test]
fn convert_op_rounds_saturates_and_wraps() {
    let x = f32t(&[7], &[-2.7, -0.5, 0.0, 1.5, 3e9, NAN, -INF]);
    let conv = |x: &HostTensor, to| run_op(Op::Convert { to }, &[x]);
    assert_bits(&conv(&x, DType::I32), &i32t(&[7], &[-2, 0, 0, 1, i32::MAX, 0, i32::MIN]));
    assert_bits(&conv(&x, DType::U32), &u32t(&[7], &[0, 0, 0, 1, 3_000_000_000, 0, 0]));
    assert_bits(&conv(&x, DType::Bool), &boolt(&[7], &[true, true, false, true, true, true, true]));
    let bf = conv(&x, DType::BF16);
    assert_eq!(bf.to_f64_vec()[..5], [-2.703125, -0.5, 0.0, 1.5, 3003121664.0]);
    assert_bits(&conv(&i32t(&[2], &[-1, 7]), DType::U32), &u32t(&[2], &[u32::MAX, 7]));
    assert_bits(&conv(&u32t(&[2], &[u32::MAX, 7]), DType::I32), &i32t(&[2], &[-1, 7]));
    assert_bits(&conv(&boolt(&[2], &[true, false]), DType::F32), &f32t(&[2], &[1.0, 0.0]));
}

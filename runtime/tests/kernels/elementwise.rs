//! Unary, binary, compare, select and convert kernels.

use crate::common::*;
use weft_ir::tensor::HostTensor;
use weft_ir::{BinaryOp, CompareOp, DType, Op, UnaryOp};
use weft_runtime::gpu::is_transcendental;
use weft_runtime::Backend;

const SHAPES: &[&[usize]] = &[&[], &[1], &[7], &[3, 5], &[17, 33], &[2, 3, 4, 5], &[1000]];
const FLOATS: [DType; 4] = [DType::F32, DType::BF16, DType::F16, DType::F64];

/// The domain random inputs of a float unary op are drawn from.
fn domain(u: UnaryOp) -> (f64, f64) {
    match u {
        UnaryOp::Log | UnaryOp::Sqrt | UnaryOp::Rsqrt => (0.01, 50.0),
        UnaryOp::Log1p => (-0.9, 20.0),
        UnaryOp::Exp => (-20.0, 20.0),
        _ => (-6.0, 6.0),
    }
}

/// Floats including every special value, rounded to `d`.
fn specials(d: DType) -> HostTensor {
    let v = [
        0.0,
        -0.0,
        1.0,
        -1.0,
        0.5,
        -2.5,
        3.0,
        1e-3,
        -7e-4,
        1e-6,
        1e-30,
        65504.0,
        70000.0,
        1e30,
        -1e30,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
        2.0f64.powi(-20),
        123.456,
    ];
    HostTensor::from_values(&ty(d, &[v.len()]), &v).unwrap()
}

/// On wgpu, f64 transcendentals are refused with a clear error rather than
/// computed wrongly.
fn expect_unsupported<B: Backend>(be: &B, op: &Op, x: &HostTensor) {
    let buf = be.upload(x).unwrap();
    match be.compute(op, &[&buf]) {
        Err(weft_runtime::RuntimeError::Unsupported { what, .. }) => assert!(what.contains("f64"), "{what}"),
        Err(e) => panic!("{op:?} on f64: unexpected error {e}"),
        Ok(_) => panic!("{op:?} on f64 should be unsupported on wgpu"),
    }
}

#[test]
fn float_unary_ops_match_the_cpu() {
    let Some(be) = wgpu_or_skip() else { return };
    let mut rng = Rng::new(1);
    for u in UnaryOp::ALL {
        for d in FLOATS {
            if !u.accepts(d) {
                continue;
            }
            if d == DType::F64 && is_transcendental(&Op::Unary(u)) {
                expect_unsupported(&be, &Op::Unary(u), &specials(d));
                continue;
            }
            let (lo, hi) = domain(u);
            // Transcendentals are not correctly rounded on either side:
            // allow a few ulps relative, and absolute error near zeros.
            let exact_op =
                matches!(u, UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Sign | UnaryOp::Floor | UnaryOp::IsFinite);
            let atol = if d == DType::F64 { 1e-13 } else { 1e-6 };
            for shape in SHAPES {
                let x = random(&mut rng, &ty(d, shape), lo, hi);
                check_op(&be, &Op::Unary(u), &[x], exact_op, rtol(d), atol);
            }
            // GPU sin and cos reduce huge arguments inexactly (Vulkan only
            // bounds their error on [-pi, pi]): keep |x| < 1e4 for them.
            let sp = specials(d);
            let sp = if matches!(u, UnaryOp::Sin | UnaryOp::Cos) {
                let v: Vec<f64> = sp.to_f64_vec().into_iter().filter(|x| x.is_nan() || x.abs() < 1e4).collect();
                HostTensor::from_values(&ty(d, &[v.len()]), &v).unwrap()
            } else {
                sp
            };
            check_op(&be, &Op::Unary(u), &[sp], exact_op, rtol(d), atol);
        }
    }
}

#[test]
fn integer_and_bool_unary_ops_are_exact() {
    let Some(be) = wgpu_or_skip() else { return };
    let mut rng = Rng::new(2);
    for u in [UnaryOp::Neg, UnaryOp::Abs, UnaryOp::Sign, UnaryOp::Not] {
        for d in [DType::I32, DType::U32, DType::Bool] {
            if !u.accepts(d) {
                continue;
            }
            for shape in SHAPES {
                let x = match d {
                    DType::U32 => random_bits(&mut rng, shape),
                    _ => random(&mut rng, &ty(d, shape), -2e9, 2e9),
                };
                check_op(&be, &Op::Unary(u), &[x], true, 0.0, 0.0);
            }
        }
    }
    let edge = HostTensor::from_i32(&[5], vec![i32::MIN, i32::MAX, 0, -1, 1]).unwrap();
    for u in [UnaryOp::Neg, UnaryOp::Abs, UnaryOp::Sign, UnaryOp::Not] {
        check_op(&be, &Op::Unary(u), &[edge.clone()], true, 0.0, 0.0);
    }
}

/// Whether this adapter is lavapipe (llvmpipe) on a host without
/// AVX-512: there its f64 arithmetic breaks the exact product fmod relies
/// on (gpu/math.rs, `fmod`), for the special values whose remainder is a
/// tiny fraction of the quotient times the divisor (seen on an AVX2 AMD
/// EPYC with Mesa 22.3.6: `fmod(65504, -7e-4)` gives 5e-12, not 6e-4;
/// earlier CI runs on an AVX-512 host passed). A known limitation
/// (specs/runtime.md, §3), not a tolerance: f32 stays exact everywhere,
/// and f64 on random operands within the usual tolerance.
fn f64_rem_is_inexact_here<B: Backend>(be: &B) -> bool {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let inexact = be.name().contains("llvmpipe") && !cpuinfo.contains("avx512f");
    if inexact {
        eprintln!("NOTE: f64 fmod special values with large quotients not checked on {} without AVX-512", be.name());
    }
    inexact
}

/// A quotient small enough, and operands plain enough, that the f64
/// fmod is exact on every adapter (quotients below 2^20 of normal numbers).
fn finite_small(x: f64, y: f64) -> bool {
    !(x.is_finite() && y.is_finite() && y != 0.0) || (x / y).abs() < 1048576.0
}

#[test]
fn float_binary_ops_match_the_cpu() {
    let Some(be) = wgpu_or_skip() else { return };
    let f64_rem_inexact = f64_rem_is_inexact_here(&be);
    let mut rng = Rng::new(3);
    for b in BinaryOp::ALL {
        for d in FLOATS {
            if !b.accepts(d) {
                continue;
            }
            if d == DType::F64 && is_transcendental(&Op::Binary(b)) {
                continue;
            }
            let exact_op = matches!(b, BinaryOp::Max | BinaryOp::Min | BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul);
            let (lo, hi) = if b == BinaryOp::Pow { (0.1, 4.0) } else { (-10.0, 10.0) };
            for shape in SHAPES {
                let x = random(&mut rng, &ty(d, shape), lo, hi);
                let y = random(&mut rng, &ty(d, shape), lo, hi);
                check_op(&be, &Op::Binary(b), &[x, y], exact_op, rtol(d), 1e-6);
            }
            // Every pair of special values.
            let s = specials(d);
            let n = s.len();
            let sv = s.to_f64_vec();
            let xs: Vec<f64> = (0..n * n).map(|i| sv[i / n]).collect();
            let ys: Vec<f64> = (0..n * n).map(|i| sv[i % n]).collect();
            // fmod is exact for quotients below about 2^100 (see gpu/math.rs).
            let keep: Vec<usize> = (0..n * n)
                .filter(|&i| b != BinaryOp::Rem || (xs[i] / ys[i]).abs() <= 1e30 || (xs[i] / ys[i]).is_nan())
                .filter(|&i| b != BinaryOp::Rem || d != DType::F64 || !f64_rem_inexact || finite_small(xs[i], ys[i]))
                .collect();
            let xs: Vec<f64> = keep.iter().map(|&i| xs[i]).collect();
            let ys: Vec<f64> = keep.iter().map(|&i| ys[i]).collect();
            let x = HostTensor::from_values(&ty(d, &[xs.len()]), &xs).unwrap();
            let y = HostTensor::from_values(&ty(d, &[ys.len()]), &ys).unwrap();
            let tol = if b == BinaryOp::Pow { 1e-4 } else { rtol(d) };
            check_op(&be, &Op::Binary(b), &[x, y], matches!(b, BinaryOp::Max | BinaryOp::Min), tol, 1e-6);
        }
    }
    // Negative bases with integer exponents, and fmod with quotients that round.
    let x = HostTensor::from_f32(&[6], vec![-2.0, -2.0, -0.5, 7.0, -7.5, 1e7]).unwrap();
    let y = HostTensor::from_f32(&[6], vec![3.0, 2.0, -3.0, 0.1, 2.0, 3.0]).unwrap();
    check_op(&be, &Op::Binary(BinaryOp::Pow), &[x.clone(), y.clone()], false, 1e-5, 0.0);
    check_op(&be, &Op::Binary(BinaryOp::Rem), &[x, y], true, 0.0, 0.0);
}

#[test]
fn integer_binary_ops_are_bit_exact() {
    let Some(be) = wgpu_or_skip() else { return };
    let mut rng = Rng::new(4);
    for b in BinaryOp::ALL {
        for d in [DType::I32, DType::U32, DType::Bool] {
            if !b.accepts(d) {
                continue;
            }
            for shape in SHAPES {
                let (x, y) = match (d, b) {
                    (DType::Bool, _) => {
                        (random(&mut rng, &ty(d, shape), 0.0, 2.0), random(&mut rng, &ty(d, shape), 0.0, 2.0))
                    }
                    (_, BinaryOp::ShiftLeft | BinaryOp::ShiftRightLogical) => {
                        (random_bits(&mut rng, shape).convert(d), random(&mut rng, &ty(d, shape), 0.0, 40.0))
                    }
                    // Small divisors (zero and -1 included) for div and rem.
                    (_, BinaryOp::Div | BinaryOp::Rem) => (
                        random_bits(&mut rng, shape).convert(d),
                        random(&mut rng, &ty(DType::I32, shape), -3.0, 4.0).convert(d),
                    ),
                    _ => (random_bits(&mut rng, shape).convert(d), random_bits(&mut rng, shape).convert(d)),
                };
                check_op(&be, &Op::Binary(b), &[x, y], true, 0.0, 0.0);
            }
        }
    }
    let x = HostTensor::from_i32(&[4], vec![i32::MIN, i32::MIN, -7, 7]).unwrap();
    let y = HostTensor::from_i32(&[4], vec![-1, 0, 2, -2]).unwrap();
    for b in [BinaryOp::Div, BinaryOp::Rem, BinaryOp::ShiftRightLogical, BinaryOp::ShiftLeft] {
        check_op(&be, &Op::Binary(b), &[x.clone(), y.clone()], true, 0.0, 0.0);
    }
}

/// The operations of the Threefry-2x32 generator, on full-range words:
/// results must equal the CPU bit for bit.
#[test]
fn threefry_bit_ops_are_bit_exact() {
    let Some(be) = wgpu_or_skip() else { return };
    let mut rng = Rng::new(5);
    for shape in [&[4096usize][..], &[3, 7, 11]] {
        let x = random_bits(&mut rng, shape);
        let y = random_bits(&mut rng, shape);
        let rot = HostTensor::from_u32(shape, (0..x.len()).map(|i| (i % 33) as u32).collect()).unwrap();
        for b in [BinaryOp::Add, BinaryOp::Xor, BinaryOp::Or, BinaryOp::And, BinaryOp::Mul] {
            check_op(&be, &Op::Binary(b), &[x.clone(), y.clone()], true, 0.0, 0.0);
        }
        for b in [BinaryOp::ShiftLeft, BinaryOp::ShiftRightLogical] {
            check_op(&be, &Op::Binary(b), &[x.clone(), rot.clone()], true, 0.0, 0.0);
        }
    }
}

#[test]
fn comparisons_and_select() {
    let Some(be) = wgpu_or_skip() else { return };
    let mut rng = Rng::new(6);
    for d in [DType::F32, DType::BF16, DType::F16, DType::F64, DType::I32, DType::U32, DType::Bool] {
        for shape in SHAPES {
            let t = ty(d, shape);
            // Few distinct values, so equality happens.
            let (x, y) = (random(&mut rng, &t, -3.0, 3.0), random(&mut rng, &t, -3.0, 3.0));
            for c in CompareOp::ALL {
                check_op(&be, &Op::Compare(c), &[x.clone(), y.clone()], true, 0.0, 0.0);
            }
            let p = random(&mut rng, &ty(DType::Bool, shape), 0.0, 2.0);
            check_op(&be, &Op::Select, &[p, x.clone(), y.clone()], true, 0.0, 0.0);
            let p = random(&mut rng, &ty(DType::Bool, &[]), 0.0, 2.0);
            check_op(&be, &Op::Select, &[p, x, y], true, 0.0, 0.0);
        }
        if d.is_float() {
            let s = specials(d);
            let r =
                HostTensor::from_values(&s.ty(), &s.to_f64_vec().iter().rev().copied().collect::<Vec<_>>()).unwrap();
            for c in CompareOp::ALL {
                check_op(&be, &Op::Compare(c), &[s.clone(), r.clone()], true, 0.0, 0.0);
            }
        }
    }
}

#[test]
fn conversions_round_once_like_the_cpu() {
    let Some(be) = wgpu_or_skip() else { return };
    let mut rng = Rng::new(7);
    let all = [DType::F32, DType::BF16, DType::F16, DType::F64, DType::I32, DType::U32, DType::Bool];
    for from in all {
        let mut inputs = vec![specials(from).convert(from)];
        if from.is_float() {
            inputs[0] = specials(from);
            inputs.push(random(&mut rng, &ty(from, &[999]), -1e5, 1e5));
            inputs.push(random(&mut rng, &ty(from, &[999]), -5e9, 5e9));
            inputs.push(random(&mut rng, &ty(from, &[4, 250]), -2.0, 2.0));
        } else if from == DType::Bool {
            inputs = vec![random(&mut rng, &ty(from, &[77]), 0.0, 2.0)];
        } else {
            inputs = vec![random_bits(&mut rng, &[999]).convert(from)];
            // Integers just above 2^24 and 2^31: round-to-odd matters here.
            let near: Vec<u32> = (0..64).map(|i| (1 << 24) + i).chain((0..64).map(|i| (1 << 31) - 32 + i)).collect();
            inputs.push(HostTensor::from_u32(&[128], near).unwrap().convert(from));
        }
        for to in all {
            for x in &inputs {
                check_op(&be, &Op::Convert { to }, &[x.clone()], true, 0.0, 0.0);
            }
        }
    }
}

/// An elementwise op over more elements than 65535 cubes of 256 threads
/// cover: the launch must spread over a 2-D grid and still touch every
/// element exactly once.
#[test]
fn more_than_65535_cubes() {
    let Some(be) = wgpu_or_skip() else { return };
    let n = 65535 * 256 + 17;
    let x = HostTensor::from_f32(&[n], (0..n).map(|i| (i % 4093) as f32 * 0.25).collect()).unwrap();
    let y = HostTensor::from_f32(&[n], (0..n).map(|i| (i % 17) as f32).collect()).unwrap();
    check_op(&be, &Op::Binary(BinaryOp::Add), &[x.clone(), y], true, 0.0, 0.0);
    check_op(&be, &Op::Convert { to: DType::BF16 }, &[x], true, 0.0, 0.0);
    assert!(be.name().contains("wgpu"));
}

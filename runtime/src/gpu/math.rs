//! Scalar functions whose GPU builtins do not follow the numerics
//! contract (or are not accurate enough near zero), written out.
//!
//! - `log1p` and `tanh`: WGSL has no `log1p`, and `tanh` is computed from
//!   `exp`, so both lose all relative precision near 0; they are rebuilt
//!   from Kahan's compensated forms.
//! - `max`/`min` propagate NaN and order `-0 < +0`; builtins do neither.
//! - `fmod` is C's (exact, sign of the dividend), not `x - y*trunc(x/y)`.
//! - `pow` follows C's special cases (negative bases with integer
//!   exponents, `pow(x, 0) = 1`, `pow(1, y) = 1`).
//! - Shifts of 32 or more give 0 (builtins take the amount modulo 32).

// `a - a` and `zero / zero` below build NaNs at run time on purpose.
#![allow(clippy::eq_op)]

use cubecl::prelude::*;

/// True for NaN (as a plain `bool`, whatever the float type). CubeCL's
/// bit test is right for `f32`, but its `f64` version and float tricks
/// (`x - x`, `x * 0`) fail under wgpu on lavapipe, so `f64` tests its own
/// exponent and fraction bits.
///
/// (Type-dependent choices in these helpers branch at expansion time on
/// `F::type_size().comptime()` inside `comptime!`; a plain comparison of
/// `F::type_size()` would become a run-time branch, expanding both arms.)
#[cube]
pub fn is_nan<F: Float>(x: F) -> bool {
    let mut r = bool::cast_from(F::is_nan(x));
    let size = F::type_size().comptime();
    if comptime![size == 8] {
        let bits = u64::reinterpret(x);
        r = (bits >> 52u64) & 0x7FFu64 == 0x7FFu64 && (bits & 0x000F_FFFF_FFFF_FFFFu64) > 0u64;
    }
    r
}

/// True for ±infinity.
#[cube]
pub fn is_inf<F: Float>(x: F) -> bool {
    let mut r = bool::cast_from(F::is_inf(x));
    let size = F::type_size().comptime();
    if comptime![size == 8] {
        let bits = u64::reinterpret(x);
        r = (bits >> 52u64) & 0x7FFu64 == 0x7FFu64 && (bits & 0x000F_FFFF_FFFF_FFFFu64) == 0u64;
    }
    r
}

/// `e^x - 1`, accurate near 0 (Kahan: `(u - 1) * x / ln(u)` with `u = e^x`).
#[cube]
pub fn expm1<F: Float>(x: F) -> F {
    let u = F::exp(x);
    let um1 = u - F::new(1.0);
    // Lanes where u == 1 or u is infinite divide 0/0 or inf/inf here but
    // take another branch below.
    let kahan = um1 * x / F::ln(u);
    select(um1 == F::new(0.0), x, select(is_inf::<F>(u) || um1 == F::new(-1.0), um1, kahan))
}

/// `ln(1 + x)`, accurate near 0 (`ln(u) * x / (u - 1)` with `u = 1 + x`).
#[cube]
pub fn log1p<F: Float>(x: F) -> F {
    let u = F::new(1.0) + x;
    let d = u - F::new(1.0);
    let safe_d = select(d == F::new(0.0), F::new(1.0), d);
    let r = F::ln(u) * (x / safe_d);
    // u == 1: x is below half an ulp of 1, and ln(1 + x) = x to working
    // precision. u = +inf: the quotient would be inf/inf.
    let pos_inf = is_inf::<F>(u) && u > F::new(0.0);
    select(d == F::new(0.0), x, select(pos_inf, u, r))
}

/// Hyperbolic tangent: `expm1(2|x|) / (expm1(2|x|) + 2)` for small `|x|`,
/// `1 - 2 / (e^(2|x|) + 1)` otherwise, with the sign of `x`.
#[cube]
pub fn tanh<F: Float>(x: F) -> F {
    let ax = F::abs(x);
    let e = expm1::<F>(F::new(2.0) * F::min(ax, F::new(1.0)));
    let small = e / (e + F::new(2.0));
    let big = F::new(1.0) - F::new(2.0) / (F::exp(F::new(2.0) * ax) + F::new(1.0));
    let t = select(ax < F::new(0.625), small, big);
    // ±0 and NaN pass through (keeping the sign of zero).
    select(ax == F::new(0.0) || is_nan::<F>(x), x, select(x < F::new(0.0), -t, t))
}

/// `1 / (1 + e^-x)` for `x >= 0`, `e^x / (1 + e^x)` otherwise (no overflow).
#[cube]
pub fn logistic<F: Float>(x: F) -> F {
    let pos = F::new(1.0) / (F::new(1.0) + F::exp(-x));
    let e = F::exp(x);
    let neg = e / (F::new(1.0) + e);
    select(x >= F::new(0.0), pos, neg)
}

/// -1 or +1 by sign; ±0 and NaN unchanged.
#[cube]
pub fn sign<F: Float>(x: F) -> F {
    select(x > F::new(0.0), F::new(1.0), select(x < F::new(0.0), F::new(-1.0), x))
}

/// True for negative numbers and -0 (only meaningful when `x` is not NaN).
#[cube]
fn is_negative<F: Float>(x: F) -> bool {
    x < F::new(0.0) || (x == F::new(0.0) && F::new(1.0) / x < F::new(0.0))
}

/// Maximum; NaN if either is NaN; `max(-0, +0) = +0`.
#[cube]
pub fn max_nan<F: Float>(a: F, b: F) -> F {
    let pick_a = a > b || (a == b && is_negative::<F>(b));
    select(is_nan::<F>(a) || is_nan::<F>(b), a + b, select(pick_a, a, b))
}

/// Minimum; NaN if either is NaN; `min(-0, +0) = -0`.
#[cube]
pub fn min_nan<F: Float>(a: F, b: F) -> F {
    let pick_a = a < b || (a == b && is_negative::<F>(a));
    select(is_nan::<F>(a) || is_nan::<F>(b), a + b, select(pick_a, a, b))
}

/// `a * b` as an unevaluated sum `hi + lo`, exactly (Dekker's product
/// with Veltkamp splitting: no fused multiply-add needed, which software
/// Vulkan does not provide).
#[cube]
fn two_product<F: Float>(a: F, b: F) -> (F, F) {
    // 2^s + 1 splits a p-bit significand into halves (s = ceil(p / 2)).
    let mut split = F::new(4097.0);
    let size = F::type_size().comptime();
    if comptime![size == 8] {
        split = F::cast_from(134_217_729u32);
    }
    let hi = a * b;
    let ca = split * a;
    let ah = ca - (ca - a);
    let al = a - ah;
    let cb = split * b;
    let bh = cb - (cb - b);
    let bl = b - bh;
    let lo = ((ah * bh - hi) + ah * bl + al * bh) + al * bl;
    (hi, lo)
}

/// C's `fmod`: `a - n*b` with `n = trunc(a/b)`, exact, with the sign of `a`.
///
/// One step `r -= trunc(r/b) * b` is exact (the product is formed exactly
/// by [`two_product`], and `r - hi` is exact because `hi` is within a
/// factor of 2 of `r`), but the rounded quotient may be off by up to half
/// its ulp, leaving a remainder up to `2^-24` times the quotient times
/// `b`; steps repeat until the remainder is below `|b|` (at most a dozen
/// for f32), then the sign is fixed. Quotients beyond `2^115` (where the
/// exact product overflows) are out of reach.
#[cube]
pub fn fmod<F: Float>(a: F, b: F) -> F {
    let ab = F::abs(b);
    let mut r = a;
    let mut steps: u32 = 0;
    // NaN fails the test and leaves; infinities and b = 0 become NaN.
    while steps < 64u32 && F::abs(r) >= ab {
        let q = F::trunc(r / b);
        let (hi, lo) = two_product::<F>(q, b);
        r = (r - hi) - lo;
        steps += 1u32;
    }
    #[unroll]
    for _ in 0..2u32 {
        r = select(a >= F::new(0.0) && r < F::new(0.0), r + ab, r);
        r = select(a < F::new(0.0) && r > F::new(0.0), r - ab, r);
    }
    // A zero result has the sign of a.
    let zero_r = select(is_negative::<F>(a), -F::new(0.0), F::new(0.0));
    r = select(r == F::new(0.0), zero_r, r);
    let special = is_inf::<F>(b) || is_inf::<F>(a) || is_nan::<F>(a) || is_nan::<F>(b) || b == F::new(0.0);
    // b infinite and a finite: a itself; a infinite, b zero or NaN: NaN.
    let zero = a - a;
    let fallback = select(is_inf::<F>(b) && !is_inf::<F>(a) && !is_nan::<F>(a), a, (zero * b) / zero);
    select(special, fallback, r)
}

/// `a^b` with C's special cases.
#[cube]
pub fn pow<F: Float>(a: F, b: F) -> F {
    let mag = F::powf(F::abs(a), b);
    let b_int = F::trunc(b) == b;
    let half = b * F::new(0.5);
    let b_odd = b_int && F::trunc(half) != half;
    let neg_base = is_negative::<F>(a);
    let signed = select(neg_base && b_odd, -mag, mag);
    // A negative base needs an integer exponent (-0 counts as zero).
    // (a - a) / (a - a) is a NaN computed at run time (a is finite there).
    let zero = a - a;
    let nan_case = a < F::new(0.0) && !b_int && !is_inf::<F>(b) && !is_inf::<F>(a);
    let r = select(nan_case, zero / zero, signed);
    let r = select(F::abs(a) == F::new(1.0) && is_inf::<F>(b), F::new(1.0), r);
    // NaN in, NaN out (a + b is a NaN then), but for the two cases below.
    let r = select(is_nan::<F>(a) || is_nan::<F>(b), a + b, r);
    select(b == F::new(0.0) || a == F::new(1.0), F::new(1.0), r)
}

/// `a << b`, 0 when `b` (as unsigned) is 32 or more.
#[cube]
pub fn shift_left<I: Int>(a: I, b: I) -> I {
    let ua = u32::reinterpret(a);
    let ub = u32::reinterpret(b);
    let s = select(ub < 32u32, ub, 0u32);
    I::reinterpret(select(ub < 32u32, ua << s, 0u32))
}

/// Logical `a >> b` (zeros shifted in, also for i32), 0 when `b` (as
/// unsigned) is 32 or more.
#[cube]
pub fn shift_right_logical<I: Int>(a: I, b: I) -> I {
    let ua = u32::reinterpret(a);
    let ub = u32::reinterpret(b);
    let s = select(ub < 32u32, ub, 0u32);
    I::reinterpret(select(ub < 32u32, ua >> s, 0u32))
}

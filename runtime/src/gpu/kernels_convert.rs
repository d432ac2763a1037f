//! Conversion kernels.
//!
//! The contract rounds once from the exact source value. Two conversions
//! would round twice if done naively through `f32` (an `i32` or `f64` to a
//! half type), so they first round to `f32` *to odd* (keep 24 significant
//! bits, OR-ing any discarded bits into the last one), which the final
//! rounding to 8 or 11 significant bits then resolves exactly as a single
//! rounding would. Float-to-integer conversion truncates and saturates
//! explicitly (NaN to 0), as no builtin promises that.

use super::math::is_nan;
use super::round::apply_rounding;
use super::storage::Rounding;
use cubecl::prelude::*;

/// `out = round(F(x))`: numbers to a float type, exact or rounding once
/// (integers below 2^24, f32 to f64, half to f32, f32 to half).
#[cube(launch)]
pub fn to_float<S: Numeric, F: Float>(x: &Array<S>, out: &mut Array<F>, #[comptime] rnd: Rounding) {
    let i = ABSOLUTE_POS;
    if i < out.len() {
        out[i] = apply_rounding::<F>(F::cast_from(x[i]), rnd);
    }
}

/// `out = x != 0` as 0/1 (NaN is true).
#[cube(launch)]
pub fn nonzero<S: Numeric>(x: &Array<S>, out: &mut Array<u32>) {
    let i = ABSOLUTE_POS;
    if i < out.len() {
        // Not `!=` (ordered in naga's output, so NaN would give false).
        out[i] = select(x[i] == S::from_int(0), 0u32, 1u32);
    }
}

/// Float to integer: truncate toward zero, saturate, NaN to 0.
#[cube(launch)]
pub fn float_to_int<F: Float, I: Int>(x: &Array<F>, out: &mut Array<I>, #[comptime] signed: bool) {
    let i = ABSOLUTE_POS;
    if i < out.len() {
        let v = x[i];
        let t = F::trunc(v);
        let r = if signed {
            let hi = F::new(2147483648.0);
            select(t >= hi, I::max_value(), select(t < -hi, I::min_value(), I::cast_from(t)))
        } else {
            let hi = F::new(4294967296.0);
            let clamped = select(t < F::new(0.0), F::new(0.0), t);
            select(t >= hi, I::max_value(), I::cast_from(clamped))
        };
        out[i] = select(is_nan::<F>(v), I::new(0), r);
    }
}

/// 32-bit integer to a half type, rounding once (via round-to-odd `f32`).
#[cube(launch)]
pub fn int_to_half<I: Int>(x: &Array<I>, out: &mut Array<f32>, #[comptime] signed: bool, #[comptime] rnd: Rounding) {
    let i = ABSOLUTE_POS;
    if i < out.len() {
        let v = x[i];
        let neg = signed && v < I::new(0);
        let mag = select(neg, u32::reinterpret(I::new(0) - v), u32::reinterpret(v));
        let lz = u32::leading_zeros(mag);
        let s = select(lz < 8u32, 8u32 - lz, 0u32);
        let sticky = (mag & ((1u32 << s) - 1u32)) != 0u32;
        let keep = (mag >> s) | select(sticky, 1u32, 0u32);
        let f = f32::cast_from(keep) * f32::cast_from(1u32 << s);
        out[i] = apply_rounding::<f32>(select(neg, -f, f), rnd);
    }
}

/// `f64` to a half type, rounding once (via round-to-odd `f32`).
#[cube(launch)]
pub fn f64_to_half(x: &Array<f64>, out: &mut Array<f32>, #[comptime] rnd: Rounding) {
    let i = ABSOLUTE_POS;
    if i < out.len() {
        let v = x[i];
        let r = f32::cast_from(v);
        let back = f64::cast_from(r);
        let inexact = back != v && !is_nan::<f64>(v);
        let bits = u32::reinterpret(r);
        let toward_zero = select(inexact && f64::abs(back) > f64::abs(v), bits - 1u32, bits);
        let odd = select(inexact, toward_zero | 1u32, toward_zero);
        out[i] = apply_rounding::<f32>(f32::reinterpret(odd), rnd);
    }
}

//! In-kernel rounding of `f32` values to the nearest `bf16` or `f16`.
//!
//! Half-type buffers are stored as `f32` (see `storage.rs`); every kernel
//! that produces a half-type result rounds in registers with these
//! functions before storing. They work on the bit pattern with integer
//! operations only, so they are exact and identical on every runtime
//! (no dependence on a `round` builtin's tie rule, on fast-math, or on
//! denormal flushing) and agree bit for bit with the `half` crate the CPU
//! backend uses.

use super::storage::Rounding;
use cubecl::prelude::*;

/// `x` rounded to nearest-even `bf16`, as an `f32`. NaN becomes a quiet NaN
/// with the same sign (as `half::bf16::from_f32`).
#[cube]
pub fn round_bf16(x: f32) -> f32 {
    let b = u32::reinterpret(x);
    let lsb = (b >> 16) & 1u32;
    let rounded = (b + 0x7FFFu32 + lsb) & 0xFFFF_0000u32;
    let quiet = (b | 0x0040_0000u32) & 0xFFFF_0000u32;
    let is_nan = (b & 0x7FFF_FFFFu32) > 0x7F80_0000u32;
    f32::reinterpret(select(is_nan, quiet, rounded))
}

/// `x` rounded to nearest-even `f16` (subnormals kept, overflow to
/// infinity), as an `f32`.
#[cube]
pub fn round_f16(x: f32) -> f32 {
    let b = u32::reinterpret(x);
    let sign = b & 0x8000_0000u32;
    let a = b & 0x7FFF_FFFFu32;
    // Normal f16 range: keep 10 fraction bits of the f32 (drop 13), ties to even.
    let lsb = (a >> 13) & 1u32;
    let normal = (a + 0x0FFFu32 + lsb) & 0xFFFF_E000u32;
    // Below 2^-14 the f16 spacing is 2^-24: round the value to a multiple
    // of it. value = m * 2^(e - 150) with e the biased exponent (1 for
    // subnormals), so the multiple is m >> (126 - e), rounded to even.
    let e = a >> 23;
    let frac = a & 0x007F_FFFFu32;
    let m = select(e == 0u32, frac, frac | 0x0080_0000u32);
    let e1 = select(e == 0u32, 1u32, e);
    // For a < 2^-14, e1 <= 112 so the shift is at least 14; clamp to
    // [1, 31] (lanes outside that range take the other branches).
    let s = select(e1 > 95u32, select(e1 < 126u32, 126u32 - e1, 1u32), 31u32);
    let q = m >> s;
    let rem = m & ((1u32 << s) - 1u32);
    let half = 1u32 << (s - 1u32);
    let up = rem > half || (rem == half && (q & 1u32) == 1u32);
    let k = q + select(up, 1u32, 0u32);
    let small = u32::reinterpret(f32::cast_from(k) * f32::reinterpret(0x3380_0000u32));
    let mut r = select(a < 0x3880_0000u32, small, normal);
    // Above the largest f16 (65504) after rounding: infinity.
    r = select(r > 0x477F_E000u32, 0x7F80_0000u32, r);
    // NaN stays NaN (made quiet).
    r = select(a > 0x7F80_0000u32, a | 0x0040_0000u32, r);
    f32::reinterpret(r | sign)
}

/// Applies `rnd` to a float value of storage type `F` (a no-op unless `F`
/// is `f32` and the dtype is a half type).
#[cube]
pub fn apply_rounding<F: Float>(x: F, #[comptime] rnd: Rounding) -> F {
    match rnd {
        Rounding::None => x,
        Rounding::Bf16 => F::cast_from(round_bf16(f32::cast_from(x))),
        Rounding::F16 => F::cast_from(round_f16(f32::cast_from(x))),
    }
}

//! weft's own `f32` tanh: evaluated in `f64` and rounded once.
//!
//! Why not `f32::tanh`: that calls the host's libm (`tanhf`), whose
//! results differ between C libraries and versions (glibc 2.36's is
//! accurate to about 2 ulp), so a run's bits would depend on the machine;
//! and as a library call it is one scalar call per element (about 7 ns on
//! this project's 2-core VM), which made the GELU of a GPT step 13% of
//! it. This one is a fixed sequence of IEEE `f64` operations with no call
//! (its two selects compile to blends, not branches), so it is the same on
//! every machine and compiles to
//! vector code in the backends' loops ([`crate::interp::scalar`]; the fast
//! CPU backend's run it in the widest vectors the CPU has).
//!
//! The method: `tanh(x) = sign(x) · e / (e + 2)` with `e = expm1(2|x|)`
//! (no cancellation for small `|x|`), `expm1(y) = 2^k (1 + p) − 1` where
//! `k = round(y / ln 2)`, `r = y − k ln 2` (with `ln 2` split in two so
//! that `k · ln2_hi` is exact) and `p = expm1(r)` by its Taylor series to
//! `r^13 / 13!` (`|r| ≤ ln 2 / 2`: truncation below 2^-56 relative).
//! The `f64` value is within a few `f64` ulps of `tanh(x)`, so the one
//! rounding to `f32` is the correctly rounded result except when the true
//! value lies within about 2^-50 (relative) of the midpoint between two
//! `f32`s. `|x| ≥ 9.5` gives ±1 (`tanh` rounds to 1 in `f32` from
//! about 9.01), ±0 gives ±0, NaN gives NaN.

/// `ln 2` to 32 significant bits (so `k · LN2_HI` is exact for the `k`
/// used here) and the rest.
const LN2_HI: f64 = f64::from_bits(0x3FE6_2E42_FEE0_0000);
const LN2_LO: f64 = std::f64::consts::LN_2 - LN2_HI;
/// `1.5 · 2^52`: adding it rounds an `f64` below 2^51 to an integer
/// (nearest-even), held in the low bits of the sum's significand.
const ROUND: f64 = 6_755_399_441_055_744.0;
/// Inputs at or above this magnitude give ±1.
const SATURATE: f64 = 9.5;

/// `expm1(r)` for `|r| ≤ ln 2 / 2`: the Taylor series to degree 13, by Horner.
#[inline(always)]
fn expm1_reduced(r: f64) -> f64 {
    const C: [f64; 13] = [
        1.0,
        1.0 / 2.0,
        1.0 / 6.0,
        1.0 / 24.0,
        1.0 / 120.0,
        1.0 / 720.0,
        1.0 / 5_040.0,
        1.0 / 40_320.0,
        1.0 / 362_880.0,
        1.0 / 3_628_800.0,
        1.0 / 39_916_800.0,
        1.0 / 479_001_600.0,
        1.0 / 6_227_020_800.0,
    ];
    let mut p = C[12];
    for &c in C[..12].iter().rev() {
        p = c + r * p;
    }
    r * p
}

/// `tanh(x)` for `f32`: see the module documentation.
#[inline(always)]
pub fn tanh_f32(x: f32) -> f32 {
    let a = (x as f64).abs();
    // NaN goes through as 9.5 and is put back at the end.
    let a = if a < SATURATE { a } else { SATURATE };
    let y = a + a;
    let shifted = y * std::f64::consts::LOG2_E + ROUND;
    let k = shifted - ROUND;
    let r = (y - k * LN2_HI) - k * LN2_LO;
    // 2^k from the integer in the sum's low bits (0 ≤ k ≤ 27).
    let two_k = f64::from_bits((shifted.to_bits().wrapping_add(1023)) << 52);
    let e = two_k * expm1_reduced(r) + (two_k - 1.0);
    let t = (e / (e + 2.0)) as f32;
    let t = f32::from_bits(t.to_bits() | (x.to_bits() & 0x8000_0000));
    if x.is_nan() {
        x
    } else {
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `tanh` of `x` from libm's `f64` tanh (under 1 `f64` ulp), rounded.
    fn reference(x: f32) -> f32 {
        (x as f64).tanh() as f32
    }

    #[test]
    fn special_values() {
        assert_eq!(tanh_f32(0.0).to_bits(), 0.0f32.to_bits());
        assert_eq!(tanh_f32(-0.0).to_bits(), (-0.0f32).to_bits());
        assert!(tanh_f32(f32::NAN).is_nan());
        assert_eq!(tanh_f32(f32::INFINITY), 1.0);
        assert_eq!(tanh_f32(f32::NEG_INFINITY), -1.0);
        assert_eq!(tanh_f32(f32::MAX), 1.0);
        assert_eq!(tanh_f32(-20.0), -1.0);
        assert_eq!(tanh_f32(f32::MIN_POSITIVE), f32::MIN_POSITIVE);
        assert_eq!(tanh_f32(1e-45), 1e-45);
        assert_eq!(tanh_f32(-1e-30), -1e-30);
    }

    /// Every 251st `f32` bit pattern (17 million inputs, both signs, every
    /// binade) against the rounded `f64` reference.
    #[test]
    fn it_matches_the_rounded_f64_tanh_across_the_range() {
        let mut differ = Vec::new();
        let mut bits = 0u32;
        while let Some(next) = bits.checked_add(251) {
            let x = f32::from_bits(bits);
            if !x.is_nan() && tanh_f32(x).to_bits() != reference(x).to_bits() {
                differ.push(x);
            }
            bits = next;
        }
        assert!(differ.is_empty(), "{} inputs differ, e.g. {:?}", differ.len(), &differ[..differ.len().min(8)]);
    }

    /// All 2^32 inputs (run with `--ignored`; about a minute in release).
    #[test]
    #[ignore]
    fn it_matches_the_rounded_f64_tanh_everywhere() {
        let differ: Vec<u32> = (0..=u32::MAX)
            .filter(|&b| {
                let x = f32::from_bits(b);
                !x.is_nan() && tanh_f32(x).to_bits() != reference(x).to_bits()
            })
            .collect();
        assert!(differ.is_empty(), "{} inputs differ: {:x?}", differ.len(), &differ[..differ.len().min(16)]);
    }
}

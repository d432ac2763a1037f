//! Element types.
//!
//! weft has a small closed set of element types. Floating types are computed
//! by the reference interpreter in `f32` (for `bf16`, `f16` and `f32`) or `f64`;
//! `bf16` and `f16` are storage types whose values are rounded to nearest-even
//! whenever they are produced (see [`DType::round`]).

use std::fmt;

/// An element type.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// IEEE binary32.
    F32,
    /// IEEE binary64.
    F64,
    /// bfloat16: 8 exponent bits, 7 mantissa bits.
    BF16,
    /// IEEE binary16.
    F16,
    /// 32-bit two's-complement integer.
    I32,
    /// 32-bit unsigned integer (wrapping arithmetic; PRNG bits).
    U32,
    /// Boolean (results of comparisons, masks).
    Bool,
}

impl DType {
    /// Every dtype, in a fixed order (useful for tests and tables).
    pub const ALL: [DType; 7] = [DType::F32, DType::F64, DType::BF16, DType::F16, DType::I32, DType::U32, DType::Bool];

    /// The name used in the text format (`f32`, `bf16`, ...).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::BF16 => "bf16",
            DType::F16 => "f16",
            DType::I32 => "i32",
            DType::U32 => "u32",
            DType::Bool => "bool",
        }
    }

    /// Parses a dtype name as written in the text format.
    pub fn from_name(s: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.name() == s)
    }

    /// Bytes per element in memory (bool is stored as one byte).
    pub fn size_bytes(self) -> usize {
        match self {
            DType::F64 => 8,
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::BF16 | DType::F16 => 2,
            DType::Bool => 1,
        }
    }

    /// True for f32, f64, bf16, f16.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64 | DType::BF16 | DType::F16)
    }

    /// True for i32 and u32.
    pub fn is_integer(self) -> bool {
        matches!(self, DType::I32 | DType::U32)
    }

    /// True for bool.
    pub fn is_bool(self) -> bool {
        self == DType::Bool
    }

    /// Rounds an `f64` to the nearest value representable in this dtype, the
    /// way the interpreter stores it: round-to-nearest-even for floats,
    /// saturating truncation toward zero for integers (NaN becomes 0), and
    /// `!= 0` for bool. The result is returned as an `f64`, which holds every
    /// value of every dtype exactly.
    pub fn round(self, v: f64) -> f64 {
        match self {
            DType::F64 => v,
            DType::F32 => v as f32 as f64,
            // Rounds once, to nearest-even (see `bf16_from_f64`).
            DType::BF16 => bf16_from_f64(v).to_f64(),
            DType::F16 => f16_from_f64(v).to_f64(),
            DType::I32 => (v as i32) as f64,
            DType::U32 => (v as u32) as f64,
            DType::Bool => {
                if v != 0.0 {
                    1.0
                } else {
                    0.0
                }
            }
        }
    }
}

/// `v` rounded to `f32` with round-to-odd: exact values are kept, inexact
/// ones become whichever neighbour has an odd significand. Rounding that to
/// a format with at least two fewer significand bits (bf16, f16) gives the
/// correctly rounded result of `v`, with no double rounding.
fn f32_round_to_odd(v: f64) -> f32 {
    let r = v as f32;
    if r.is_nan() || r as f64 == v {
        return r;
    }
    // Truncate toward zero (one step down in magnitude if RNE went up; the
    // bit pattern of |r| is monotonic), then force the last bit to 1.
    let bits = if (r as f64).abs() > v.abs() { r.to_bits() - 1 } else { r.to_bits() };
    f32::from_bits(bits | 1)
}

/// `v` rounded once to the nearest `bf16`, ties to even. (`half::bf16::from_f64`
/// drops the low 32 bits of the mantissa before rounding, so it misrounds
/// values just above a tie.)
pub fn bf16_from_f64(v: f64) -> half::bf16 {
    half::bf16::from_f32(f32_round_to_odd(v))
}

/// `v` rounded once to the nearest `f16`, ties to even (see [`bf16_from_f64`]).
pub fn f16_from_f64(v: f64) -> half::f16 {
    half::f16::from_f32(f32_round_to_odd(v))
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for d in DType::ALL {
            assert_eq!(DType::from_name(d.name()), Some(d));
        }
        assert_eq!(DType::from_name("f8"), None);
    }

    #[test]
    fn bf16_rounds_to_nearest_even() {
        // 1 + 2^-8 is exactly halfway between bf16 1.0 and 1 + 2^-7: ties to even (1.0).
        assert_eq!(DType::BF16.round(1.0 + 2f64.powi(-8)), 1.0);
        // 1 + 3*2^-8 is halfway between 1+2^-7 (odd mantissa) and 1+2^-6: ties to even (1+2^-6).
        assert_eq!(DType::BF16.round(1.0 + 3.0 * 2f64.powi(-8)), 1.0 + 2f64.powi(-6));
        // Just above halfway rounds up.
        assert_eq!(DType::BF16.round(1.0 + 2f64.powi(-8) + 2f64.powi(-20)), 1.0 + 2f64.powi(-7));
        assert_eq!(DType::F16.round(1.0 + 2f64.powi(-11)), 1.0);
        assert_eq!(DType::F16.round(65520.0), f64::INFINITY);
    }

    #[test]
    fn integer_and_bool_rounding() {
        assert_eq!(DType::I32.round(-2.7), -2.0);
        assert_eq!(DType::I32.round(1e20), i32::MAX as f64);
        assert_eq!(DType::U32.round(-1.0), 0.0);
        assert_eq!(DType::Bool.round(0.5), 1.0);
        assert_eq!(DType::Bool.round(0.0), 0.0);
    }
}

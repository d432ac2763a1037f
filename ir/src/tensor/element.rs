//! The Rust element types behind each [`DType`].
//!
//! [`Element`] ties a Rust type to its dtype and to its [`HostTensor`]
//! variant, and gives the exact `f64` embedding and the little-endian byte
//! form, so generic code (constructors, conversions, file I/O, shape ops) is
//! written once instead of once per variant. The trait is sealed: the set of
//! dtypes is closed.

use super::HostTensor;
use crate::DType;
use half::{bf16, f16};
use ndarray::ArrayD;
use std::fmt;

mod private {
    pub trait Sealed {}
}

/// A Rust type that is the element type of one [`DType`].
pub trait Element: Copy + PartialEq + fmt::Debug + Send + Sync + 'static + private::Sealed {
    /// The dtype this type represents.
    const DTYPE: DType;
    /// The value as `f64` (exact for every dtype; bool is 0 or 1).
    fn to_f64_exact(self) -> f64;
    /// The value nearest to `v`, as [`DType::round`]: nearest-even for
    /// floats, truncation toward zero with saturation (NaN to 0) for
    /// integers, `v != 0` for bool.
    fn from_f64_rounded(v: f64) -> Self;
    /// The bit pattern, widened (for bitwise comparison).
    fn to_bits_u64(self) -> u64;
    /// Appends the little-endian bytes (bool: one byte, 0 or 1).
    fn write_le(self, out: &mut Vec<u8>);
    /// Reads a value from exactly `DTYPE.size_bytes()` little-endian bytes;
    /// `None` if the bytes are not a valid value (a bool byte other than 0/1).
    fn read_le(bytes: &[u8]) -> Option<Self>;
    /// Writes the value for humans (`Display` of [`HostTensor`]).
    fn fmt_value(self, f: &mut fmt::Formatter<'_>) -> fmt::Result;
    /// Wraps an array of this type into its [`HostTensor`] variant.
    fn wrap(a: ArrayD<Self>) -> HostTensor;
    /// The array, if `t` is of this element type.
    fn unwrap_ref(t: &HostTensor) -> Option<&ArrayD<Self>>;
    /// The array, if `t` is of this element type; otherwise `t` back.
    fn unwrap(t: HostTensor) -> Result<ArrayD<Self>, HostTensor>;
}

macro_rules! element_impl {
    ($T:ty, $variant:ident, $dtype:expr, |$v:ident| $from:expr, |$x:ident| $to:expr, |$b:ident| $bits:expr) => {
        impl private::Sealed for $T {}
        impl Element for $T {
            const DTYPE: DType = $dtype;
            fn to_f64_exact(self) -> f64 {
                let $x = self;
                $to
            }
            fn from_f64_rounded($v: f64) -> Self {
                $from
            }
            fn to_bits_u64(self) -> u64 {
                let $b = self;
                $bits
            }
            fn write_le(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            fn read_le(bytes: &[u8]) -> Option<Self> {
                Some(<$T>::from_le_bytes(bytes.try_into().ok()?))
            }
            fn fmt_value(self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}", self)
            }
            fn wrap(a: ArrayD<Self>) -> HostTensor {
                HostTensor::$variant(a)
            }
            fn unwrap_ref(t: &HostTensor) -> Option<&ArrayD<Self>> {
                match t {
                    HostTensor::$variant(a) => Some(a),
                    _ => None,
                }
            }
            fn unwrap(t: HostTensor) -> Result<ArrayD<Self>, HostTensor> {
                match t {
                    HostTensor::$variant(a) => Ok(a),
                    other => Err(other),
                }
            }
        }
    };
}

element_impl!(f32, F32, DType::F32, |v| v as f32, |x| x as f64, |b| b.to_bits() as u64);
element_impl!(f64, F64, DType::F64, |v| v, |x| x, |b| b.to_bits());
element_impl!(bf16, BF16, DType::BF16, |v| crate::dtype::bf16_from_f64(v), |x| x.to_f64(), |b| b.to_bits() as u64);
element_impl!(f16, F16, DType::F16, |v| crate::dtype::f16_from_f64(v), |x| x.to_f64(), |b| b.to_bits() as u64);
element_impl!(i32, I32, DType::I32, |v| v as i32, |x| x as f64, |b| b as u32 as u64);
element_impl!(u32, U32, DType::U32, |v| v as u32, |x| x as f64, |b| b as u64);

impl private::Sealed for bool {}
impl Element for bool {
    const DTYPE: DType = DType::Bool;
    fn to_f64_exact(self) -> f64 {
        if self {
            1.0
        } else {
            0.0
        }
    }
    fn from_f64_rounded(v: f64) -> Self {
        v != 0.0
    }
    fn to_bits_u64(self) -> u64 {
        self as u64
    }
    fn write_le(self, out: &mut Vec<u8>) {
        out.push(self as u8);
    }
    fn read_le(bytes: &[u8]) -> Option<Self> {
        match bytes {
            [0] => Some(false),
            [1] => Some(true),
            _ => None,
        }
    }
    fn fmt_value(self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")
    }
    fn wrap(a: ArrayD<Self>) -> HostTensor {
        HostTensor::Bool(a)
    }
    fn unwrap_ref(t: &HostTensor) -> Option<&ArrayD<Self>> {
        match t {
            HostTensor::Bool(a) => Some(a),
            _ => None,
        }
    }
    fn unwrap(t: HostTensor) -> Result<ArrayD<Self>, HostTensor> {
        match t {
            HostTensor::Bool(a) => Ok(a),
            other => Err(other),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_types_round_once_from_f64() {
        let e = |k| 2f64.powi(k);
        // Just above a tie (the excess is far below f32 precision): rounds up.
        assert_eq!(<bf16 as Element>::from_f64_rounded(1.0 + e(-8) + e(-40)).to_f64(), 1.0 + e(-7));
        assert_eq!(<f16 as Element>::from_f64_rounded(1.0 + e(-11) + e(-40)).to_f64(), 1.0 + e(-10));
        assert_eq!(<bf16 as Element>::from_f64_rounded(-(1.0 + e(-8) + e(-40))).to_f64(), -(1.0 + e(-7)));
        // Exact ties still go to even.
        assert_eq!(<bf16 as Element>::from_f64_rounded(1.0 + e(-8)).to_f64(), 1.0);
        assert_eq!(<f16 as Element>::from_f64_rounded(1.0 + 3.0 * e(-11)).to_f64(), 1.0 + e(-9));
        // 2^24 + 2^16 + 1 through f32 would be a tie (2^24 + 2^16) and go down.
        assert_eq!(<bf16 as Element>::from_f64_rounded(16842753.0).to_f64(), 16908288.0);
        // Overflow, underflow, subnormals, NaN.
        assert_eq!(<bf16 as Element>::from_f64_rounded(1e300).to_f64(), f64::INFINITY);
        assert_eq!(<f16 as Element>::from_f64_rounded(65519.0).to_f64(), 65504.0);
        assert_eq!(<f16 as Element>::from_f64_rounded(65520.0).to_f64(), f64::INFINITY);
        assert_eq!(<f16 as Element>::from_f64_rounded(e(-25) + e(-60)).to_f64(), e(-24));
        assert_eq!(<f16 as Element>::from_f64_rounded(e(-25)).to_f64(), 0.0);
        assert_eq!(<bf16 as Element>::from_f64_rounded(-1e-300).to_bits(), 0x8000);
        assert!(<bf16 as Element>::from_f64_rounded(f64::NAN).is_nan());
    }

    #[test]
    fn from_f64_matches_dtype_round() {
        let samples = [
            0.0,
            -0.0,
            1.5,
            -2.7,
            1e20,
            -1e20,
            1.0 + 2f64.powi(-8),
            1.0 + 2f64.powi(-8) + 2f64.powi(-40),
            65520.0,
            f64::NAN,
            f64::INFINITY,
            1e-50,
        ];
        for v in samples {
            let check = |got: f64, d: DType| {
                let want = d.round(v);
                assert!(got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()), "{d} {v}: {got} vs {want}");
            };
            check(f32::from_f64_rounded(v).to_f64_exact(), DType::F32);
            check(f64::from_f64_rounded(v).to_f64_exact(), DType::F64);
            check(<bf16 as Element>::from_f64_rounded(v).to_f64(), DType::BF16);
            check(<f16 as Element>::from_f64_rounded(v).to_f64(), DType::F16);
            check(i32::from_f64_rounded(v).to_f64_exact(), DType::I32);
            check(u32::from_f64_rounded(v).to_f64_exact(), DType::U32);
            check(bool::from_f64_rounded(v).to_f64_exact(), DType::Bool);
        }
    }
}

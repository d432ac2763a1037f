//! Comparing tensors: bit-exact equality (for deterministic stages) and
//! tolerance checks (for sharded runs, GPU kernels and gradient checks,
//! whose results legitimately differ in the last bits).
//!
//! Tolerance comparisons work on the exact `f64` values, so tensors of
//! different dtypes can be compared (a bf16 result against an f32
//! reference). NaN matches NaN and an infinity matches the same infinity.

use super::{for_each_variant, Element, HostTensor};
use crate::DType;
use std::cmp::Ordering;

impl HostTensor {
    /// True if both tensors have the same dtype, shape and bit pattern of
    /// every element (so NaN equals the same NaN, and `-0.0 != 0.0`).
    pub fn bitwise_eq(&self, other: &HostTensor) -> bool {
        if self.dtype() != other.dtype() || self.shape() != other.shape() {
            return false;
        }
        let bits =
            |t: &HostTensor| -> Vec<u64> { for_each_variant!(t, a => a.iter().map(|x| x.to_bits_u64()).collect()) };
        bits(self) == bits(other)
    }

    /// The largest `|self - other|` over all elements (0 for empty
    /// tensors); NaN against NaN and equal infinities count as 0, any other
    /// mismatch involving NaN or infinity as `+inf`. Shapes that differ give
    /// `+inf`.
    pub fn max_abs_diff(&self, other: &HostTensor) -> f64 {
        self.fold_pairs(other, abs_diff)
    }

    /// The largest relative difference `|a - b| / max(|a|, |b|)` over all
    /// elements (0 where both are 0), with NaN and infinities as in
    /// [`HostTensor::max_abs_diff`].
    pub fn max_rel_diff(&self, other: &HostTensor) -> f64 {
        self.fold_pairs(other, |a, b| {
            let d = abs_diff(a, b);
            if d == 0.0 || d.is_infinite() {
                d
            } else {
                d / a.abs().max(b.abs())
            }
        })
    }

    fn fold_pairs(&self, other: &HostTensor, f: impl Fn(f64, f64) -> f64) -> f64 {
        if self.shape() != other.shape() {
            return f64::INFINITY;
        }
        let (a, b) = (self.to_f64_vec(), other.to_f64_vec());
        a.iter().zip(&b).map(|(&x, &y)| f(x, y)).fold(0.0, f64::max)
    }
}

fn abs_diff(a: f64, b: f64) -> f64 {
    if a.is_nan() && b.is_nan() || a == b {
        0.0
    } else if a.is_nan() || b.is_nan() {
        f64::INFINITY
    } else {
        (a - b).abs()
    }
}

/// Checks `|actual - expected| <= atol + rtol * |expected|` elementwise (NaN
/// matches NaN; infinities must match exactly). On failure the message names
/// the first offending index, both values and how many elements fail.
/// Shapes must be equal; dtypes may differ.
pub fn check_close(actual: &HostTensor, expected: &HostTensor, rtol: f64, atol: f64) -> Result<(), String> {
    if actual.shape() != expected.shape() {
        return Err(format!("shape mismatch: actual {}, expected {}", actual.ty(), expected.ty()));
    }
    let (a, e) = (actual.to_f64_vec(), expected.to_f64_vec());
    let bad = |x: f64, y: f64| {
        let d = abs_diff(x, y);
        let within = matches!(d.partial_cmp(&(atol + rtol * y.abs())), Some(Ordering::Less | Ordering::Equal));
        d != 0.0 && !within
    };
    let failing = a.iter().zip(&e).filter(|(&x, &y)| bad(x, y)).count();
    match a.iter().zip(&e).position(|(&x, &y)| bad(x, y)) {
        None => Ok(()),
        Some(i) => Err(format!(
            "{failing} of {} elements differ (rtol {rtol}, atol {atol}); first at index {:?}: actual {} ({}), \
             expected {} ({}), abs diff {}",
            a.len(),
            unravel(i, actual.shape()),
            a[i],
            actual.dtype(),
            e[i],
            expected.dtype(),
            (a[i] - e[i]).abs()
        )),
    }
}

/// Panics with [`check_close`]'s message unless `actual` is close to
/// `expected`. For tests.
#[track_caller]
pub fn assert_close(actual: &HostTensor, expected: &HostTensor, rtol: f64, atol: f64) {
    if let Err(m) = check_close(actual, expected, rtol, atol) {
        panic!("assert_close failed: {m}\n  actual:   {actual}\n  expected: {expected}");
    }
}

/// The multi-index of row-major position `i` in `shape`.
fn unravel(mut i: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        idx[d] = i % shape[d];
        i /= shape[d];
    }
    idx
}

/// The machine epsilon of a float dtype (0 for others): a convenient unit
/// for tolerances.
pub fn epsilon(d: DType) -> f64 {
    match d {
        DType::F32 => f32::EPSILON as f64,
        DType::F64 => f64::EPSILON,
        DType::BF16 => half::bf16::EPSILON.to_f64(),
        DType::F16 => half::f16::EPSILON.to_f64(),
        _ => 0.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unravel_row_major() {
        assert_eq!(unravel(5, &[2, 3]), vec![1, 2]);
        assert_eq!(unravel(0, &[]), Vec::<usize>::new());
    }

    #[test]
    fn epsilons() {
        assert_eq!(epsilon(DType::BF16), 2f64.powi(-7));
        assert_eq!(epsilon(DType::I32), 0.0);
    }
}

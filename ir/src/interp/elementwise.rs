//! Elementwise kernels: unary, binary, compare and select.
//!
//! Float kernels are written once over [`Real`] (`f32` and `f64`); `bf16`
//! and `f16` operands are widened to `f32`, computed there and rounded back
//! to nearest-even per element. Integer kernels wrap. See the module
//! documentation of [`crate::interp`] for the full numerics contract.

use crate::tensor::HostTensor;
use crate::{BinaryOp, CompareOp, UnaryOp};
use half::{bf16, f16};
use ndarray::{ArrayD, Zip};

/// The float types kernels compute in, with the few operations whose
/// semantics weft pins down beyond what `std` gives.
pub(crate) trait Real: Copy + PartialOrd {
    /// `1 / (1 + e^-x)`, without overflow for large `|x|`.
    fn logistic(self) -> Self;
    /// -1, +1, or the input for ±0 and NaN.
    fn sign(self) -> Self;
    /// Maximum, NaN if either is NaN; `max(-0, +0) = +0`.
    fn max_nan(self, o: Self) -> Self;
    /// Minimum, NaN if either is NaN; `min(-0, +0) = -0`.
    fn min_nan(self, o: Self) -> Self;
    /// `tanh`: weft's own for `f32` ([`super::tanh`]), `std`'s for `f64`.
    fn tanh_pinned(self) -> Self;
}

macro_rules! real_impl {
    ($T:ty, $tanh:path) => {
        impl Real for $T {
            #[inline(always)]
            fn tanh_pinned(self) -> Self {
                $tanh(self)
            }
            #[inline(always)]
            fn logistic(self) -> Self {
                if self >= 0.0 {
                    1.0 / (1.0 + (-self).exp())
                } else {
                    let e = self.exp();
                    e / (1.0 + e)
                }
            }
            #[inline(always)]
            fn sign(self) -> Self {
                if self > 0.0 {
                    1.0
                } else if self < 0.0 {
                    -1.0
                } else {
                    self
                }
            }
            #[inline(always)]
            fn max_nan(self, o: Self) -> Self {
                if self.is_nan() || o.is_nan() {
                    <$T>::NAN
                } else if self > o || (self == o && o.is_sign_negative()) {
                    self
                } else {
                    o
                }
            }
            #[inline(always)]
            fn min_nan(self, o: Self) -> Self {
                if self.is_nan() || o.is_nan() {
                    <$T>::NAN
                } else if self < o || (self == o && self.is_sign_negative()) {
                    self
                } else {
                    o
                }
            }
        }
    };
}
real_impl!(f32, super::tanh::tanh_f32);
real_impl!(f64, f64::tanh);

/// Applies `|$x| $e` to every element of a float tensor (computing in f32
/// for the half types), or returns an error for other dtypes.
macro_rules! float_map {
    ($t:expr, $name:expr, |$x:ident| $e:expr) => {
        match $t {
            HostTensor::F32(a) => HostTensor::F32(a.mapv(|$x: f32| $e)),
            HostTensor::F64(a) => HostTensor::F64(a.mapv(|$x: f64| $e)),
            HostTensor::BF16(a) => HostTensor::BF16(a.mapv(|v| {
                let $x = v.to_f32();
                bf16::from_f32($e)
            })),
            HostTensor::F16(a) => HostTensor::F16(a.mapv(|v| {
                let $x = v.to_f32();
                f16::from_f32($e)
            })),
            other => return Err(unsupported($name, other)),
        }
    };
}

/// Combines two float tensors elementwise with `|$x, $y| $e`.
macro_rules! float_zip {
    ($l:expr, $r:expr, |$x:ident, $y:ident| $e:expr) => {
        match ($l, $r) {
            (HostTensor::F32(a), HostTensor::F32(b)) => {
                Some(HostTensor::F32(Zip::from(a).and(b).map_collect(|&$x: &f32, &$y: &f32| $e)))
            }
            (HostTensor::F64(a), HostTensor::F64(b)) => {
                Some(HostTensor::F64(Zip::from(a).and(b).map_collect(|&$x: &f64, &$y: &f64| $e)))
            }
            (HostTensor::BF16(a), HostTensor::BF16(b)) => {
                Some(HostTensor::BF16(Zip::from(a).and(b).map_collect(|p: &bf16, q: &bf16| {
                    let ($x, $y) = (p.to_f32(), q.to_f32());
                    bf16::from_f32($e)
                })))
            }
            (HostTensor::F16(a), HostTensor::F16(b)) => {
                Some(HostTensor::F16(Zip::from(a).and(b).map_collect(|p: &f16, q: &f16| {
                    let ($x, $y) = (p.to_f32(), q.to_f32());
                    f16::from_f32($e)
                })))
            }
            _ => None,
        }
    };
}

/// Combines two integer tensors (i32 or u32) elementwise with `|$x, $y| $e`.
macro_rules! int_zip {
    ($l:expr, $r:expr, |$x:ident, $y:ident| $e:expr) => {
        match ($l, $r) {
            (HostTensor::I32(a), HostTensor::I32(b)) => {
                Some(HostTensor::I32(Zip::from(a).and(b).map_collect(|&$x: &i32, &$y: &i32| $e)))
            }
            (HostTensor::U32(a), HostTensor::U32(b)) => {
                Some(HostTensor::U32(Zip::from(a).and(b).map_collect(|&$x: &u32, &$y: &u32| $e)))
            }
            _ => None,
        }
    };
}

/// Combines two bool tensors elementwise with `|$x, $y| $e`.
macro_rules! bool_zip {
    ($l:expr, $r:expr, |$x:ident, $y:ident| $e:expr) => {
        match ($l, $r) {
            (HostTensor::Bool(a), HostTensor::Bool(b)) => {
                Some(HostTensor::Bool(Zip::from(a).and(b).map_collect(|&$x: &bool, &$y: &bool| $e)))
            }
            _ => None,
        }
    };
}

fn unsupported(op: &str, t: &HostTensor) -> String {
    format!("`{op}` does not accept {}", t.dtype())
}

/// Applies a unary op.
pub(crate) fn unary(op: UnaryOp, x: &HostTensor) -> Result<HostTensor, String> {
    let name = op.name();
    Ok(match op {
        UnaryOp::Neg => match x {
            HostTensor::I32(a) => HostTensor::I32(a.mapv(i32::wrapping_neg)),
            _ => float_map!(x, name, |v| -v),
        },
        UnaryOp::Abs => match x {
            HostTensor::I32(a) => HostTensor::I32(a.mapv(i32::wrapping_abs)),
            _ => float_map!(x, name, |v| v.abs()),
        },
        UnaryOp::Sign => match x {
            HostTensor::I32(a) => HostTensor::I32(a.mapv(i32::signum)),
            _ => float_map!(x, name, |v| v.sign()),
        },
        UnaryOp::Exp => float_map!(x, name, |v| v.exp()),
        UnaryOp::Log => float_map!(x, name, |v| v.ln()),
        UnaryOp::Log1p => float_map!(x, name, |v| v.ln_1p()),
        UnaryOp::Tanh => float_map!(x, name, |v| v.tanh_pinned()),
        UnaryOp::Cos => float_map!(x, name, |v| v.cos()),
        UnaryOp::Sin => float_map!(x, name, |v| v.sin()),
        UnaryOp::Logistic => float_map!(x, name, |v| v.logistic()),
        UnaryOp::Sqrt => float_map!(x, name, |v| v.sqrt()),
        UnaryOp::Rsqrt => float_map!(x, name, |v| v.sqrt().recip()),
        UnaryOp::Floor => float_map!(x, name, |v| v.floor()),
        UnaryOp::Not => match x {
            HostTensor::I32(a) => HostTensor::I32(a.mapv(|v| !v)),
            HostTensor::U32(a) => HostTensor::U32(a.mapv(|v| !v)),
            HostTensor::Bool(a) => HostTensor::Bool(a.mapv(|v| !v)),
            other => return Err(unsupported(name, other)),
        },
        UnaryOp::IsFinite => HostTensor::Bool(match x {
            HostTensor::F32(a) => a.mapv(f32::is_finite),
            HostTensor::F64(a) => a.mapv(f64::is_finite),
            HostTensor::BF16(a) => a.mapv(|v| v.is_finite()),
            HostTensor::F16(a) => a.mapv(|v| v.is_finite()),
            other => return Err(unsupported(name, other)),
        }),
    })
}

/// Applies a binary op to two tensors of identical type.
pub(crate) fn binary(op: BinaryOp, l: &HostTensor, r: &HostTensor) -> Result<HostTensor, String> {
    same_type(op.name(), l, r)?;
    let out =
        match op {
            BinaryOp::Add => float_zip!(l, r, |x, y| x + y).or_else(|| int_zip!(l, r, |x, y| x.wrapping_add(y))),
            BinaryOp::Sub => float_zip!(l, r, |x, y| x - y).or_else(|| int_zip!(l, r, |x, y| x.wrapping_sub(y))),
            BinaryOp::Mul => float_zip!(l, r, |x, y| x * y).or_else(|| int_zip!(l, r, |x, y| x.wrapping_mul(y))),
            BinaryOp::Div => float_zip!(l, r, |x, y| x / y)
                .or_else(|| int_zip!(l, r, |x, y| if y == 0 { 0 } else { x.wrapping_div(y) })),
            BinaryOp::Rem => float_zip!(l, r, |x, y| x % y)
                .or_else(|| int_zip!(l, r, |x, y| if y == 0 { x } else { x.wrapping_rem(y) })),
            BinaryOp::Max => float_zip!(l, r, |x, y| x.max_nan(y)).or_else(|| int_zip!(l, r, |x, y| x.max(y))),
            BinaryOp::Min => float_zip!(l, r, |x, y| x.min_nan(y)).or_else(|| int_zip!(l, r, |x, y| x.min(y))),
            BinaryOp::Pow => float_zip!(l, r, |x, y| x.powf(y)),
            BinaryOp::And => int_zip!(l, r, |x, y| x & y).or_else(|| bool_zip!(l, r, |x, y| x & y)),
            BinaryOp::Or => int_zip!(l, r, |x, y| x | y).or_else(|| bool_zip!(l, r, |x, y| x | y)),
            BinaryOp::Xor => int_zip!(l, r, |x, y| x ^ y).or_else(|| bool_zip!(l, r, |x, y| x ^ y)),
            BinaryOp::ShiftLeft => int_zip!(l, r, |x, y| if y as u32 >= 32 { 0 } else { x << y }),
            BinaryOp::ShiftRightLogical => match (l, r) {
                (HostTensor::I32(a), HostTensor::I32(b)) => {
                    Some(HostTensor::I32(Zip::from(a).and(b).map_collect(|&x, &y| {
                        if y as u32 >= 32 {
                            0
                        } else {
                            ((x as u32) >> y) as i32
                        }
                    })))
                }
                (HostTensor::U32(a), HostTensor::U32(b)) => {
                    Some(HostTensor::U32(Zip::from(a).and(b).map_collect(|&x, &y| if y >= 32 { 0 } else { x >> y })))
                }
                _ => None,
            },
        };
    out.ok_or_else(|| unsupported(op.name(), l))
}

fn same_type(name: &str, l: &HostTensor, r: &HostTensor) -> Result<(), String> {
    if l.dtype() != r.dtype() || l.shape() != r.shape() {
        return Err(format!("`{name}` needs operands of identical type, got {} and {}", l.ty(), r.ty()));
    }
    Ok(())
}

fn compare_arrays<T: PartialOrd>(op: CompareOp, a: &ArrayD<T>, b: &ArrayD<T>) -> ArrayD<bool> {
    let z = Zip::from(a).and(b);
    match op {
        CompareOp::Eq => z.map_collect(|x, y| x == y),
        CompareOp::Ne => z.map_collect(|x, y| x != y),
        CompareOp::Lt => z.map_collect(|x, y| x < y),
        CompareOp::Le => z.map_collect(|x, y| x <= y),
        CompareOp::Gt => z.map_collect(|x, y| x > y),
        CompareOp::Ge => z.map_collect(|x, y| x >= y),
    }
}

/// Compares two tensors of identical type (IEEE semantics: every
/// comparison with NaN is false except `ne`; `-0 == +0`; `false < true`).
pub(crate) fn compare(op: CompareOp, l: &HostTensor, r: &HostTensor) -> Result<HostTensor, String> {
    same_type(op.name(), l, r)?;
    Ok(HostTensor::Bool(match (l, r) {
        (HostTensor::F32(a), HostTensor::F32(b)) => compare_arrays(op, a, b),
        (HostTensor::F64(a), HostTensor::F64(b)) => compare_arrays(op, a, b),
        (HostTensor::BF16(a), HostTensor::BF16(b)) => compare_arrays(op, a, b),
        (HostTensor::F16(a), HostTensor::F16(b)) => compare_arrays(op, a, b),
        (HostTensor::I32(a), HostTensor::I32(b)) => compare_arrays(op, a, b),
        (HostTensor::U32(a), HostTensor::U32(b)) => compare_arrays(op, a, b),
        (HostTensor::Bool(a), HostTensor::Bool(b)) => compare_arrays(op, a, b),
        _ => unreachable!("dtypes checked equal"),
    }))
}

fn select_arrays<T: Copy>(p: &ArrayD<bool>, a: &ArrayD<T>, b: &ArrayD<T>) -> ArrayD<T> {
    if p.ndim() == 0 {
        let take_a = *p.first().expect("a scalar has one element");
        return if take_a { a.clone() } else { b.clone() };
    }
    Zip::from(p).and(a).and(b).map_collect(|&p, &x, &y| if p { x } else { y })
}

/// `select(pred, on_true, on_false)` with a scalar or full-shape predicate.
pub(crate) fn select(p: &HostTensor, t: &HostTensor, f: &HostTensor) -> Result<HostTensor, String> {
    same_type("select", t, f)?;
    let p = p.as_bool().ok_or_else(|| format!("select predicate must be bool, got {}", p.ty()))?;
    if p.ndim() != 0 && p.shape() != t.shape() {
        return Err(format!("select predicate shape {:?} differs from the branches' {}", p.shape(), t.ty()));
    }
    Ok(match (t, f) {
        (HostTensor::F32(a), HostTensor::F32(b)) => HostTensor::F32(select_arrays(p, a, b)),
        (HostTensor::F64(a), HostTensor::F64(b)) => HostTensor::F64(select_arrays(p, a, b)),
        (HostTensor::BF16(a), HostTensor::BF16(b)) => HostTensor::BF16(select_arrays(p, a, b)),
        (HostTensor::F16(a), HostTensor::F16(b)) => HostTensor::F16(select_arrays(p, a, b)),
        (HostTensor::I32(a), HostTensor::I32(b)) => HostTensor::I32(select_arrays(p, a, b)),
        (HostTensor::U32(a), HostTensor::U32(b)) => HostTensor::U32(select_arrays(p, a, b)),
        (HostTensor::Bool(a), HostTensor::Bool(b)) => HostTensor::Bool(select_arrays(p, a, b)),
        _ => unreachable!("dtypes checked equal"),
    })
}

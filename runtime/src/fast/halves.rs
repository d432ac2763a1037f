//! `bf16` and `f16` storage with `f32` compute.
//!
//! The interpreter computes every half-precision op in `f32` and rounds
//! the result once to the op's type (`round(f32(a) + f32(b))`), and
//! accumulates dots and reductions in `f32`, rounding once at the end. The
//! fast kernels therefore carry half values as `f32` — widening is exact —
//! and round where the interpreter rounds: after each elementwise node of a
//! half type, and once on a dot's or reduction's result. The bits are the
//! interpreter's.

use super::pool::Pool;
use half::{bf16, f16};
use ndarray::{ArrayD, IxDyn};
use weft_ir::tensor::{to_standard_layout, HostTensor};
use weft_ir::DType;

/// How a chain value of some dtype is carried as `f32`.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Carry {
    /// Held exactly (`f32`; `bool` as 0/1).
    Exact,
    /// Rounded to `bf16` after each op.
    Bf16,
    /// Rounded to `f16` after each op.
    F16,
}

impl Carry {
    /// How values of `d` are carried, or `None` for dtypes that are not
    /// computed in `f32` (integers, `f64`).
    pub fn of(d: DType) -> Option<Carry> {
        match d {
            DType::F32 | DType::Bool => Some(Carry::Exact),
            DType::BF16 => Some(Carry::Bf16),
            DType::F16 => Some(Carry::F16),
            _ => None,
        }
    }

    /// Rounds `xs` to this type in place (nearest even, as `from_f32`).
    pub fn round(self, xs: &mut [f32]) {
        match self {
            Carry::Exact => {}
            Carry::Bf16 => xs.iter_mut().for_each(|x| *x = bf16::from_f32(*x).to_f32()),
            Carry::F16 => xs.iter_mut().for_each(|x| *x = f16::from_f32(*x).to_f32()),
        }
    }
}

/// Widens `src` into `dst` (same length), slice to slice.
fn widen_into<T: Copy>(src: &[T], dst: &mut [f32], f: impl Fn(T) -> f32) {
    for (o, &x) in dst.iter_mut().zip(src) {
        *o = f(x);
    }
}

/// A half-precision tensor widened to `f32` (exact), in pooled storage and
/// standard layout (a strided operand is first copied row by row).
pub(crate) fn widen(t: &HostTensor, pool: &mut Pool) -> Option<ArrayD<f32>> {
    if !matches!(t, HostTensor::BF16(_) | HostTensor::F16(_)) {
        return None;
    }
    let shape = IxDyn(t.shape());
    let mut out = pool.take(t.len());
    match t {
        HostTensor::BF16(a) => match a.as_slice() {
            Some(s) => widen_into(s, &mut out, bf16::to_f32),
            None => widen_into(to_standard_layout(a.view()).as_slice().expect("standard"), &mut out, bf16::to_f32),
        },
        HostTensor::F16(a) => match a.as_slice() {
            Some(s) => widen_into(s, &mut out, f16::to_f32),
            None => widen_into(to_standard_layout(a.view()).as_slice().expect("standard"), &mut out, f16::to_f32),
        },
        _ => unreachable!("checked above"),
    }
    Some(ArrayD::from_shape_vec(shape, out).expect("sized from the tensor"))
}

/// `f32` values (already rounded, or to be rounded once here) stored as
/// `dtype`, one of the carried float types; the storage goes back to the
/// pool when it is not kept.
pub(crate) fn narrow(a: ArrayD<f32>, dtype: DType, pool: &mut Pool) -> HostTensor {
    let out = match dtype {
        DType::BF16 => HostTensor::BF16(a.mapv(bf16::from_f32)),
        DType::F16 => HostTensor::F16(a.mapv(f16::from_f32)),
        _ => return HostTensor::F32(a),
    };
    pool.give(HostTensor::F32(a));
    out
}

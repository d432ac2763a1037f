//! `reduce_sum`, `reduce_max`, `reduce_min`.
//!
//! Deterministic order: the operand is viewed with the kept dimensions
//! first and the reduced dimensions last (each group in its original order);
//! each result element is a left fold, starting from the identity, over its
//! reduced elements in row-major order of the reduced dimensions. Sums of
//! `f32`, `bf16` and `f16` accumulate in `f32` (the half types round once at
//! the end), `f64` in `f64`, integers with wrapping arithmetic. Max and min
//! propagate NaN. Empty reductions give the identity: 0 for sums, `-inf` /
//! `+inf` for float max / min, the dtype's MIN / MAX for integers.

use super::elementwise::Real;
use crate::tensor::HostTensor;
use crate::ReduceOp;
use half::{bf16, f16};
use ndarray::{ArrayD, IxDyn};

/// Folds `a` over `dims` with `f`, starting each result element at `init`.
fn fold_dims<T: Copy>(a: &ArrayD<T>, dims: &[usize], init: T, f: impl Fn(T, T) -> T) -> ArrayD<T> {
    let rank = a.ndim();
    let kept: Vec<usize> = (0..rank).filter(|d| !dims.contains(d)).collect();
    let out_shape: Vec<usize> = kept.iter().map(|&d| a.shape()[d]).collect();
    let inner: usize = dims.iter().map(|&d| a.shape()[d]).product();
    let outer: usize = out_shape.iter().product();
    let out: Vec<T> = if inner == 0 {
        vec![init; outer]
    } else {
        let perm: Vec<usize> = kept.iter().chain(dims).copied().collect();
        let permuted = a.view().permuted_axes(IxDyn(&perm));
        let std = permuted.as_standard_layout();
        let flat = std.as_slice().expect("standard layout is contiguous");
        flat.chunks_exact(inner).map(|row| row.iter().fold(init, |acc, &x| f(acc, x))).collect()
    };
    ArrayD::from_shape_vec(IxDyn(&out_shape), out).expect("sized from the shape")
}

fn float_reduce<F>(op: ReduceOp, a: &ArrayD<F>, dims: &[usize], zero: F, inf: F) -> ArrayD<F>
where
    F: Real + std::ops::Add<Output = F> + std::ops::Neg<Output = F>,
{
    match op {
        ReduceOp::Sum => fold_dims(a, dims, zero, |x, y| x + y),
        ReduceOp::Max => fold_dims(a, dims, -inf, F::max_nan),
        ReduceOp::Min => fold_dims(a, dims, inf, F::min_nan),
    }
}

macro_rules! int_reduce {
    ($op:expr, $a:expr, $dims:expr, $T:ty) => {
        match $op {
            ReduceOp::Sum => fold_dims($a, $dims, 0, <$T>::wrapping_add),
            ReduceOp::Max => fold_dims($a, $dims, <$T>::MIN, <$T>::max),
            ReduceOp::Min => fold_dims($a, $dims, <$T>::MAX, <$T>::min),
        }
    };
}

/// Reduces `x` over the strictly increasing dimensions `dims`.
pub(crate) fn reduce(op: ReduceOp, x: &HostTensor, dims: &[usize]) -> Result<HostTensor, String> {
    let rank = x.shape().len();
    if dims.iter().enumerate().any(|(i, &d)| d >= rank || (i > 0 && dims[i - 1] >= d)) {
        return Err(format!("reduce dims {dims:?} must be increasing and in range for {}", x.ty()));
    }
    Ok(match x {
        HostTensor::F32(a) => HostTensor::F32(float_reduce(op, a, dims, 0.0, f32::INFINITY)),
        HostTensor::F64(a) => HostTensor::F64(float_reduce(op, a, dims, 0.0, f64::INFINITY)),
        HostTensor::BF16(a) => {
            let r = float_reduce(op, &a.mapv(bf16::to_f32), dims, 0.0, f32::INFINITY);
            HostTensor::BF16(r.mapv(bf16::from_f32))
        }
        HostTensor::F16(a) => {
            let r = float_reduce(op, &a.mapv(f16::to_f32), dims, 0.0, f32::INFINITY);
            HostTensor::F16(r.mapv(f16::from_f32))
        }
        HostTensor::I32(a) => HostTensor::I32(int_reduce!(op, a, dims, i32)),
        HostTensor::U32(a) => HostTensor::U32(int_reduce!(op, a, dims, u32)),
        HostTensor::Bool(_) => return Err(format!("`{}` does not accept bool", op.name())),
    })
}

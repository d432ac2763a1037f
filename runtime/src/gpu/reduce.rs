//! `reduce_sum`, `reduce_max`, `reduce_min` on the device.
//!
//! The operand is rearranged (one strided copy, skipped when the reduced
//! dimensions are already the innermost) to `[kept..., reduced...]`, i.e.
//! `[outer, inner]`, and each row is reduced by one of the kernels of
//! `kernels_reduce.rs`. Empty reductions produce the identity without
//! reading anything.

use super::kernels_reduce::{reduce_rows, reduce_rows_cube, reduce_rows_int, Red, CUBE_THREADS};
use super::layout::{copy, fill_value, strides, Copy};
use super::ops::with_float;
use super::storage::Rounding;
use super::{CubeBuffer, CubeclBackend};
use cubecl::prelude::*;
use weft_ir::{DType, ReduceOp, TensorType};

/// Rows at least this many use one thread per row (the CPU's exact order).
const ROWS_PER_THREAD_MIN: usize = 2048;
/// Rows at most this long use one thread per row even when there are few.
const SHORT_ROW: usize = 512;

/// The identity of a reduction, for empty reductions.
fn identity(op: ReduceOp, d: DType) -> f64 {
    match (op, d) {
        (ReduceOp::Sum, _) => 0.0,
        (ReduceOp::Max, DType::I32) => i32::MIN as f64,
        (ReduceOp::Min, DType::I32) => i32::MAX as f64,
        (ReduceOp::Max, DType::U32) => 0.0,
        (ReduceOp::Min, DType::U32) => u32::MAX as f64,
        (ReduceOp::Max, _) => f64::NEG_INFINITY,
        (ReduceOp::Min, _) => f64::INFINITY,
    }
}

/// `x` rearranged so the dimensions in `dims` come last (a view if they
/// already do).
fn reduced_last<R: Runtime>(be: &CubeclBackend<R>, x: &CubeBuffer<R>, dims: &[usize]) -> CubeBuffer<R> {
    let rank = x.ty.rank();
    let kept: Vec<usize> = (0..rank).filter(|d| !dims.contains(d)).collect();
    let perm: Vec<usize> = kept.iter().chain(dims).copied().collect();
    if perm.iter().enumerate().all(|(i, &p)| i == p) {
        return x.clone();
    }
    let shape: Vec<usize> = perm.iter().map(|&p| x.ty.shape[p]).collect();
    let xs = strides(&x.ty.shape);
    let src: Vec<usize> = perm.iter().map(|&p| xs[p]).collect();
    let out = be.empty(&TensorType::new(x.ty.dtype, shape.clone()));
    let dst = strides(&shape);
    copy(be, x, &out, Copy { shape: &shape, src_off: 0, src_strides: &src, dst_off: 0, dst_strides: &dst });
    out
}

/// Reduces `x` over `dims` into a new buffer of type `ty`.
pub(super) fn reduce<R: Runtime>(
    be: &CubeclBackend<R>,
    op: ReduceOp,
    x: &CubeBuffer<R>,
    dims: &[usize],
    ty: &TensorType,
) -> CubeBuffer<R> {
    let inner: usize = dims.iter().map(|&d| x.ty.shape[d]).product();
    if inner == 0 {
        return fill_value(be, ty, identity(op, ty.dtype)).expect("scalar upload");
    }
    let outer = ty.num_elements();
    let x = reduced_last(be, x, dims);
    let out = be.empty(ty);
    let red = match op {
        ReduceOp::Sum => Red::Sum,
        ReduceOp::Max => Red::Max,
        ReduceOp::Min => Red::Min,
    };
    let c = &be.client;
    let inner32 = u32::try_from(inner).expect("rows shorter than 2^32");
    let d = ty.dtype;
    if d.is_float() {
        let rnd = Rounding::of(d);
        if outer >= ROWS_PER_THREAD_MIN || inner <= SHORT_ROW {
            let (count, dim) = be.grid(outer);
            with_float!(d, F => reduce_rows::launch::<F, R>(c, count, dim, x.arg(), out.arg(), inner32, red, rnd));
        } else {
            let count = CubeCount::Static(outer as u32, 1, 1);
            let dim = CubeDim::new_1d(CUBE_THREADS as u32);
            with_float!(d, F => reduce_rows_cube::launch::<F, R>(c, count, dim, x.arg(), out.arg(), inner32, red, rnd));
        }
    } else {
        let (count, dim) = be.grid(outer);
        if d == DType::I32 {
            reduce_rows_int::launch::<i32, R>(c, count, dim, x.arg(), out.arg(), inner32, red);
        } else {
            reduce_rows_int::launch::<u32, R>(c, count, dim, x.arg(), out.arg(), inner32, red);
        }
    }
    out
}

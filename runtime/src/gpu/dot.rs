//! `dot_general` on the device.
//!
//! As in the interpreter, both operands are rearranged to a batch of
//! matrices, `lhs: [B, M, K]` (batch, free, contracting dimensions) and
//! `rhs: [B, K, N]` (batch, contracting, free), with one strided copy each
//! (none when already in that order); the `[B, M, N]` product is already
//! in StableHLO's result order. Float products use cubek-matmul (its
//! unit-tiled routine, which runs on every device including software
//! Vulkan) with `f32` accumulation, as the contract asks, and half types
//! round once at the end; when cubek declines a problem, and for integer
//! dots, the tiled kernel of `kernels_matmul.rs` runs instead.

use super::kernels_matmul::{matmul_tiled, TILE};
use super::layout::{fill_value, strides};
use super::ops::{round_to, with_storage};
use super::storage::Storage;
use super::{layout, CubeBuffer, CubeclBackend};
use crate::error::RuntimeError;
use cubecl::prelude::*;
use cubecl::zspace::{Shape, Strides};
use cubek::matmul::definition::MatmulElems;
use cubek::matmul::launch::{launch_ref, Strategy};
use cubek::std::InputBinding;
use weft_ir::{DType, DotDims, MatmulLayout, TensorType};

/// `x` permuted by `perm` and viewed as the 3-D `shape`.
fn as_batch<R: Runtime>(be: &CubeclBackend<R>, x: &CubeBuffer<R>, perm: &[usize], shape: [usize; 3]) -> CubeBuffer<R> {
    layout::transpose(be, x, perm).view(TensorType::new(x.ty.dtype, shape.to_vec()))
}

/// The dtype whose storage holds `d` without rounding (f32 for half types).
fn accumulator(d: DType) -> DType {
    match Storage::of(d) {
        Storage::F32 => DType::F32,
        _ => d,
    }
}

/// Computes `dot_general` into a new buffer of type `ty`.
pub(super) fn dot_general<R: Runtime>(
    be: &CubeclBackend<R>,
    l: &CubeBuffer<R>,
    r: &CubeBuffer<R>,
    dims: &DotDims,
    ty: &TensorType,
) -> Result<CubeBuffer<R>, RuntimeError> {
    let p = dims.matmul_layout(&l.ty.shape, &r.ty.shape);
    if p.k == 0 {
        return fill_value(be, ty, 0.0);
    }
    let l3 = as_batch(be, l, &p.lhs_perm, [p.b, p.m, p.k]);
    let r3 = as_batch(be, r, &p.rhs_perm, [p.b, p.k, p.n]);
    let acc_ty = TensorType::new(accumulator(ty.dtype), vec![p.b, p.m, p.n]);
    let acc = be.empty(&acc_ty);
    let done = ty.dtype.is_float() && cubek_matmul(be, &l3, &r3, &acc, &p);
    if !done {
        tiled(be, &l3, &r3, &acc, &p);
    }
    Ok(if acc_ty.dtype == ty.dtype { acc.view(ty.clone()) } else { round_to(be, &acc, ty) })
}

fn binding<R: Runtime>(x: &CubeBuffer<R>, shape: [usize; 3]) -> TensorBinding<R> {
    let st = strides(&shape);
    // SAFETY: `x` holds a dense row-major tensor of exactly this shape.
    unsafe { TensorBinding::from_raw_parts(x.handle.clone(), Strides::from(st), Shape::from(shape.to_vec())) }
}

/// Runs cubek-matmul's unit routine; false if it declines the problem.
fn cubek_matmul<R: Runtime>(
    be: &CubeclBackend<R>,
    l: &CubeBuffer<R>,
    r: &CubeBuffer<R>,
    out: &CubeBuffer<R>,
    p: &MatmulLayout,
) -> bool {
    let elem = with_storage!(out.ty.dtype, N => N::as_type_native_unchecked());
    let storage = elem.storage_type();
    let lhs = InputBinding::Normal(binding(l, [p.b, p.m, p.k]), storage);
    let rhs = InputBinding::Normal(binding(r, [p.b, p.k, p.n]), storage);
    let mut dtypes = MatmulElems::from_single_dtype(elem);
    let strategy = Strategy::SimpleUnit(Default::default());
    launch_ref(&strategy, &be.client, lhs, rhs, binding(out, [p.b, p.m, p.n]), &mut dtypes).is_ok()
}

/// The tiled fallback kernel.
fn tiled<R: Runtime>(
    be: &CubeclBackend<R>,
    l: &CubeBuffer<R>,
    r: &CubeBuffer<R>,
    out: &CubeBuffer<R>,
    p: &MatmulLayout,
) {
    let max = u16::MAX as usize;
    let count = CubeCount::Static(
        p.n.div_ceil(TILE).clamp(1, max) as u32,
        p.m.div_ceil(TILE).clamp(1, max) as u32,
        p.b.clamp(1, max) as u32,
    );
    let dim = CubeDim::new_2d(TILE as u32, TILE as u32);
    let dims: Vec<u32> = [p.b, p.m, p.k, p.n].iter().map(|&v| v as u32).collect();
    let (mh, ml) = be.meta(&dims);
    // SAFETY: `ml` u32 values were just written to `mh`.
    let meta = unsafe { ArrayArg::from_raw_parts(mh, ml) };
    with_storage!(out.ty.dtype, N => matmul_tiled::launch::<N, R>(&be.client, count, dim, l.arg(), r.arg(), out.arg(), meta));
}

//! The indexing ops on the device: `gather`, `scatter_add`, `cumsum`,
//! `top_k` (see `kernels_index.rs` for the kernels and why they match the
//! CPU bit for bit). The host reduces each shape to a few flat extents and
//! picks the storage-type instantiation; results of no elements never get
//! here (`ops::compute` returns them first).

use super::kernels_index::{
    cumsum_float, cumsum_int, gather, scatter_add_float, scatter_add_int, scatter_first, scatter_next, top_k_float,
    top_k_int,
};
use super::ops::with_float;
use super::storage::{Rounding, Storage};
use super::{CubeBuffer, CubeclBackend};
use cubecl::prelude::*;
use weft_ir::{DType, IndexOp, TensorType};

/// An extent as a kernel argument.
fn u32_of(v: usize) -> u32 {
    u32::try_from(v).expect("buffers hold fewer than 2^32 elements")
}

/// The flat extents of a gather from `x` (of shape `x`, or a scatter into
/// it) by indices of shape `idx`: the paired leading dimensions (`batch`)
/// need no extent of their own, as each kernel derives them from the
/// others; `pre` (the other dimensions before `axis`), `len` (the extent
/// along `axis`), `post` (after it) and `per` (index positions per batch
/// element), in that order.
fn geometry(x: &[usize], idx: &[usize], axis: usize, batch_dims: usize) -> [u32; 4] {
    let p = |s: &[usize]| s.iter().product::<usize>();
    [p(&x[batch_dims..axis]), x[axis], p(&x[axis + 1..]), p(&idx[batch_dims..])].map(u32_of)
}

/// Computes the indexing op `op` on `xs` into a new buffer of type `ty`
/// (the type [`IndexOp::infer`] gave, with at least one element).
pub(super) fn index<R: Runtime>(
    be: &CubeclBackend<R>,
    op: &IndexOp,
    xs: &[&CubeBuffer<R>],
    ty: &TensorType,
) -> CubeBuffer<R> {
    let out = be.empty(ty);
    let (count, dim) = be.grid(out.len());
    let c = &be.client;
    match *op {
        IndexOp::Gather { axis, batch_dims } => {
            let (x, idx) = (xs[0], xs[1]);
            let [pre, len, post, per] = geometry(&x.ty.shape, &idx.ty.shape, axis, batch_dims);
            let signed = idx.ty.dtype == DType::I32;
            if x.storage().size() == 8 {
                gather::launch::<f64, R>(c, count, dim, x.arg(), idx.arg(), out.arg(), pre, len, post, per, signed);
            } else {
                gather::launch::<u32, R>(c, count, dim, x.arg(), idx.arg(), out.arg(), pre, len, post, per, signed);
            }
        }
        IndexOp::ScatterAdd { axis, batch_dims, .. } => {
            let (idx, upd) = (xs[0], xs[1]);
            let [pre, len, post, per] = geometry(&ty.shape, &idx.ty.shape, axis, batch_dims);
            // Each index value's positions as a list (first, next), then
            // one thread per result element follows its own list. Negative
            // `i32` indices (top bit set) and others past `len` equal no
            // row, so no list reaches them.
            let batches: usize = idx.ty.shape[..batch_dims].iter().product();
            let (nf, nn) = (batches * len as usize, idx.len());
            let (first, next) = (be.client.empty(nf.max(1) * 4), be.client.empty(nn.max(1) * 4));
            // SAFETY: `h` was allocated above for `n` (at least one) `u32` elements.
            let arg = |h: &cubecl::server::Handle, n: usize| unsafe { ArrayArg::from_raw_parts(h.clone(), n.max(1)) };
            let (fc, fd) = be.grid(nf);
            scatter_first::launch::<R>(c, fc, fd, idx.arg(), arg(&first, nf), len, per);
            if nn > 0 {
                let (nc, nd) = be.grid(nn);
                scatter_next::launch::<R>(c, nc, nd, idx.arg(), arg(&next, nn), len, per);
            }
            let (f, n, u, o) = (arg(&first, nf), arg(&next, nn), upd.arg(), out.arg());
            match ty.dtype {
                DType::I32 => scatter_add_int::launch::<i32, R>(c, count, dim, f, n, u, o, pre, len, post, per),
                DType::U32 => scatter_add_int::launch::<u32, R>(c, count, dim, f, n, u, o, pre, len, post, per),
                d => with_float!(d, F => scatter_add_float::launch::<F, R>(
                    c, count, dim, f, n, u, o, pre, len, post, per, Rounding::of(d)
                )),
            }
        }
        IndexOp::Cumsum { dim: d, reverse } => {
            let x = xs[0];
            let shape = &x.ty.shape;
            let (n, inner) = (shape[d], shape[d + 1..].iter().product::<usize>());
            let lines = out.len() / n;
            let (count, dim) = be.grid(lines);
            let [lines, n, inner] = [lines, n, inner].map(u32_of);
            match Storage::of(ty.dtype) {
                Storage::I32 => {
                    cumsum_int::launch::<i32, R>(c, count, dim, x.arg(), out.arg(), lines, n, inner, reverse);
                }
                Storage::U32 => {
                    cumsum_int::launch::<u32, R>(c, count, dim, x.arg(), out.arg(), lines, n, inner, reverse);
                }
                _ => with_float!(ty.dtype, F => cumsum_float::launch::<F, R>(
                    c, count, dim, x.arg(), out.arg(), lines, n, inner, reverse, Rounding::of(ty.dtype)
                )),
            }
        }
        IndexOp::TopK { k } => {
            let x = xs[0];
            let n = *x.ty.shape.last().expect("top_k operands have a last dimension (checked by infer)");
            let rows = out.len() / k;
            let (count, dim) = be.grid(rows);
            let [rows, n, k] = [rows, n, k].map(u32_of);
            // The positions go into the i32 result as u32 bits (below 2^31).
            match Storage::of(x.ty.dtype) {
                Storage::I32 => top_k_int::launch::<i32, R>(c, count, dim, x.arg(), out.arg(), rows, n, k),
                Storage::U32 => top_k_int::launch::<u32, R>(c, count, dim, x.arg(), out.arg(), rows, n, k),
                _ => with_float!(x.ty.dtype, F => top_k_float::launch::<F, R>(
                    c, count, dim, x.arg(), out.arg(), rows, n, k
                )),
            }
        }
    }
    out
}

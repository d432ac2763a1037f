//! Layout ops as strided copies (see `kernels_copy.rs` for why one kernel
//! serves them all): the host computes offsets and strides per op.

use super::kernels_copy::{dim_index, fill, strided_copy};
use super::storage::{to_device_bytes, Storage};
use super::{ops, CubeBuffer, CubeclBackend};
use crate::error::RuntimeError;
use cubecl::prelude::*;
use weft_ir::tensor::HostTensor;
use weft_ir::{DType, TensorType};

/// Row-major strides of `shape`, in elements.
pub(super) fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for k in (0..shape.len().saturating_sub(1)).rev() {
        s[k] = s[k + 1] * shape[k + 1];
    }
    s
}

/// One strided copy: iteration space `shape`; element `idx` goes from
/// `src_off + idx·src_strides` to `dst_off + idx·dst_strides`.
pub(super) struct Copy<'a> {
    pub shape: &'a [usize],
    pub src_off: usize,
    pub src_strides: &'a [usize],
    pub dst_off: usize,
    pub dst_strides: &'a [usize],
}

/// Runs a strided copy from `src` into `dst` (which have one storage type).
pub(super) fn copy<R: Runtime>(be: &CubeclBackend<R>, src: &CubeBuffer<R>, dst: &CubeBuffer<R>, c: Copy<'_>) {
    let n: usize = c.shape.iter().product();
    if n == 0 {
        return;
    }
    let rank = c.shape.len();
    let mut meta = Vec::with_capacity(3 + 3 * rank);
    meta.extend([n, c.src_off, c.dst_off]);
    meta.extend_from_slice(c.shape);
    meta.extend_from_slice(c.src_strides);
    meta.extend_from_slice(c.dst_strides);
    let meta: Vec<u32> =
        meta.into_iter().map(|v| u32::try_from(v).expect("buffers hold fewer than 2^32 elements")).collect();
    let (mh, ml) = be.meta(&meta);
    // SAFETY: `ml` u32 values were just written to `mh`.
    let meta_arg = unsafe { ArrayArg::from_raw_parts(mh, ml) };
    let (count, dim) = be.grid(n);
    if src.storage().size() == 8 {
        strided_copy::launch::<f64, R>(&be.client, count, dim, src.arg(), dst.arg(), meta_arg, rank);
    } else {
        strided_copy::launch::<u32, R>(&be.client, count, dim, src.arg(), dst.arg(), meta_arg, rank);
    }
}

/// A new buffer of type `ty` with every element equal to the scalar buffer
/// `value`.
pub(super) fn fill_from<R: Runtime>(be: &CubeclBackend<R>, value: &CubeBuffer<R>, ty: &TensorType) -> CubeBuffer<R> {
    let out = be.empty(ty);
    let (count, dim) = be.grid(out.len());
    if Storage::of(ty.dtype).size() == 8 {
        fill::launch::<f64, R>(&be.client, count, dim, value.arg(), out.arg());
    } else {
        fill::launch::<u32, R>(&be.client, count, dim, value.arg(), out.arg());
    }
    out
}

/// A splat constant.
pub(super) fn fill_value<R: Runtime>(
    be: &CubeclBackend<R>,
    ty: &TensorType,
    v: f64,
) -> Result<CubeBuffer<R>, RuntimeError> {
    let scalar = HostTensor::scalar(ty.dtype, v);
    let handle = be.client.create_from_slice(&to_device_bytes(&scalar));
    let value = CubeBuffer { handle, ty: scalar.ty(), _runtime: std::marker::PhantomData };
    Ok(fill_from(be, &value, ty))
}

/// `iota`: the index along `dim`, converted to the dtype like `convert`.
pub(super) fn iota<R: Runtime>(
    be: &CubeclBackend<R>,
    ty: &TensorType,
    d: usize,
) -> Result<CubeBuffer<R>, RuntimeError> {
    let idx = be.empty(&TensorType::new(DType::U32, ty.shape.clone()));
    let pitch: usize = ty.shape[d + 1..].iter().product();
    let (count, dim) = be.grid(idx.len());
    dim_index::launch::<R>(&be.client, count, dim, idx.arg(), pitch as u32, ty.shape[d] as u32);
    Ok(ops::convert(be, &idx, ty.dtype))
}

/// `broadcast_in_dim`: unit or unmapped result dimensions read with
/// stride 0.
pub(super) fn broadcast_in_dim<R: Runtime>(
    be: &CubeclBackend<R>,
    x: &CubeBuffer<R>,
    dims: &[usize],
    ty: &TensorType,
) -> CubeBuffer<R> {
    let out = be.empty(ty);
    let xs = strides(&x.ty.shape);
    let mut src = vec![0; ty.rank()];
    for (i, &d) in dims.iter().enumerate() {
        if x.ty.shape[i] != 1 {
            src[d] = xs[i];
        }
    }
    let dst = strides(&ty.shape);
    copy(be, x, &out, Copy { shape: &ty.shape, src_off: 0, src_strides: &src, dst_off: 0, dst_strides: &dst });
    out
}

/// `transpose`: result dimension `j` reads operand dimension `perm[j]`.
pub(super) fn transpose<R: Runtime>(be: &CubeclBackend<R>, x: &CubeBuffer<R>, perm: &[usize]) -> CubeBuffer<R> {
    let shape: Vec<usize> = perm.iter().map(|&p| x.ty.shape[p]).collect();
    let ty = TensorType::new(x.ty.dtype, shape);
    if perm.iter().enumerate().all(|(i, &p)| i == p) {
        return x.view(ty);
    }
    let out = be.empty(&ty);
    let xs = strides(&x.ty.shape);
    let src: Vec<usize> = perm.iter().map(|&p| xs[p]).collect();
    let dst = strides(&ty.shape);
    copy(be, x, &out, Copy { shape: &ty.shape, src_off: 0, src_strides: &src, dst_off: 0, dst_strides: &dst });
    out
}

/// Strided `slice`.
pub(super) fn slice<R: Runtime>(
    be: &CubeclBackend<R>,
    x: &CubeBuffer<R>,
    start: &[usize],
    stride: &[usize],
    ty: &TensorType,
) -> CubeBuffer<R> {
    let out = be.empty(ty);
    let xs = strides(&x.ty.shape);
    let src_off = start.iter().zip(&xs).map(|(a, b)| a * b).sum();
    let src: Vec<usize> = xs.iter().zip(stride).map(|(a, b)| a * b).collect();
    let dst = strides(&ty.shape);
    copy(be, x, &out, Copy { shape: &ty.shape, src_off, src_strides: &src, dst_off: 0, dst_strides: &dst });
    out
}

/// `concatenate`: each operand copied into its window of the result.
pub(super) fn concatenate<R: Runtime>(
    be: &CubeclBackend<R>,
    xs: &[&CubeBuffer<R>],
    d: usize,
    ty: &TensorType,
) -> CubeBuffer<R> {
    let out = be.empty(ty);
    let dst = strides(&ty.shape);
    let mut at = 0;
    for x in xs {
        let src = strides(&x.ty.shape);
        let c = Copy { shape: &x.ty.shape, src_off: 0, src_strides: &src, dst_off: at * dst[d], dst_strides: &dst };
        copy(be, x, &out, c);
        at += x.ty.shape[d];
    }
    out
}

/// `pad`: fill with the value, then copy the operand elements that survive
/// cropping into the strided window (`interior` spreads them apart).
pub(super) fn pad<R: Runtime>(
    be: &CubeclBackend<R>,
    x: &CubeBuffer<R>,
    value: &CubeBuffer<R>,
    low: &[i64],
    interior: &[usize],
    ty: &TensorType,
) -> CubeBuffer<R> {
    let out = fill_from(be, value, ty);
    let rank = ty.rank();
    let (xs, os) = (strides(&x.ty.shape), strides(&ty.shape));
    let (mut count, mut src_off, mut dst_off, mut dst_strides) = (vec![0; rank], 0, 0, vec![0; rank]);
    for d in 0..rank {
        let n = x.ty.shape[d] as i64;
        let step = interior[d] as i64 + 1;
        let extent = ty.shape[d] as i64;
        // Operand element i lands at low + i*step; keep those in [0, extent).
        let first = if low[d] < 0 { (-low[d] + step - 1) / step } else { 0 };
        let last = if extent == 0 { -1 } else { (extent - 1 - low[d]).div_euclid(step).min(n - 1) };
        count[d] = (last - first + 1).max(0) as usize;
        src_off += first as usize * xs[d];
        dst_off += (low[d] + first * step).max(0) as usize * os[d];
        dst_strides[d] = step as usize * os[d];
    }
    let c = Copy { shape: &count, src_off, src_strides: &xs, dst_off, dst_strides: &dst_strides };
    copy(be, x, &out, c);
    out
}

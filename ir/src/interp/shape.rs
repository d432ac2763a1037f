//! Data-movement kernels: iota, broadcast_in_dim, reshape, transpose,
//! slice, concatenate and pad.
//!
//! Each is written once, generically over the element type, in terms of
//! `ndarray` views (axis insertion, broadcasting, permutation, strided
//! slicing), and materialized into a standard-layout array at the end. No
//! kernel computes per-element multi-indices.

use crate::tensor::{for_each_variant, map_variant, with_element_type, Element, HostTensor};
use crate::TensorType;
use ndarray::{ArrayD, ArrayViewD, Axis, IxDyn, Slice};

/// Copies a view of any layout into a new standard-layout array.
fn materialize<T: Copy>(v: ArrayViewD<'_, T>) -> ArrayD<T> {
    crate::tensor::to_standard_layout(v)
}

/// `iota`: each element is its index along `dim`, converted to the dtype.
pub(crate) fn iota(ty: &TensorType, dim: usize) -> Result<HostTensor, String> {
    if dim >= ty.rank() {
        return Err(format!("iota dimension {dim} is out of range for {ty}"));
    }
    Ok(with_element_type!(ty.dtype, T => {
        let line: Vec<T> = (0..ty.shape[dim]).map(|i| T::from_f64_rounded(i as f64)).collect();
        let line = ArrayD::from_shape_vec(IxDyn(&[ty.shape[dim]]), line).expect("1-d");
        T::wrap(broadcast_array(&line, &[dim], &ty.shape)?)
    }))
}

fn broadcast_array<T: Copy>(a: &ArrayD<T>, dims: &[usize], shape: &[usize]) -> Result<ArrayD<T>, String> {
    if dims.len() != a.ndim() {
        return Err(format!("broadcast_in_dim has {} dims for an operand of rank {}", dims.len(), a.ndim()));
    }
    if dims.iter().enumerate().any(|(i, &d)| d >= shape.len() || (i > 0 && dims[i - 1] >= d)) {
        return Err(format!("broadcast_in_dim dims {dims:?} must be increasing and below rank {}", shape.len()));
    }
    // Give the operand the result's rank by inserting unit axes at the
    // result dimensions it does not map to (dims is increasing), then let
    // ndarray broadcast size-1 axes to the result extents.
    let mut v = a.view();
    for d in 0..shape.len() {
        if !dims.contains(&d) {
            v = v.insert_axis(Axis(d));
        }
    }
    let b = v
        .broadcast(IxDyn(shape))
        .ok_or_else(|| format!("cannot broadcast {:?} with dims {dims:?} to {shape:?}", a.shape()))?;
    Ok(materialize(b))
}

/// `broadcast_in_dim`: operand dimension `i` becomes result dimension
/// `dims[i]`; unit extents expand.
pub(crate) fn broadcast_in_dim(x: &HostTensor, dims: &[usize], shape: &[usize]) -> Result<HostTensor, String> {
    Ok(map_variant!(x, a => broadcast_array(a, dims, shape)?))
}

/// Row-major reshape; takes ownership so a standard-layout array is reused.
pub(crate) fn reshape(x: HostTensor, shape: &[usize]) -> Result<HostTensor, String> {
    let from = x.ty();
    let n: usize = shape.iter().product();
    if n != x.len() {
        return Err(format!("cannot reshape {from} to {shape:?}"));
    }
    Ok(map_variant!(x, a => {
        let a = if a.is_standard_layout() { a } else { materialize(a.view()) };
        a.into_shape_with_order(IxDyn(shape)).expect("standard layout, element count checked")
    }))
}

/// `transpose`: result dimension `i` is operand dimension `perm[i]`.
pub(crate) fn transpose(x: &HostTensor, perm: &[usize]) -> Result<HostTensor, String> {
    let mut seen = vec![false; x.shape().len()];
    if perm.len() != seen.len() || perm.iter().any(|&p| p >= seen.len() || std::mem::replace(&mut seen[p], true)) {
        return Err(format!("{perm:?} is not a permutation of the dimensions of {}", x.ty()));
    }
    Ok(map_variant!(x, a => materialize(a.view().permuted_axes(IxDyn(perm)))))
}

/// Strided slice `[start, limit)` with `stride` per dimension.
pub(crate) fn slice(x: &HostTensor, start: &[usize], limit: &[usize], stride: &[usize]) -> Result<HostTensor, String> {
    let shape = x.shape();
    let rank = shape.len();
    if start.len() != rank || limit.len() != rank || stride.len() != rank {
        return Err(format!("slice attributes do not match the rank of {}", x.ty()));
    }
    for d in 0..rank {
        if stride[d] == 0 || start[d] > limit[d] || limit[d] > shape[d] {
            return Err(format!(
                "slice [{}, {}) step {} is invalid for dimension {d} of {}",
                start[d],
                limit[d],
                stride[d],
                x.ty()
            ));
        }
    }
    let info = |ax: ndarray::AxisDescription| {
        let d = ax.axis.index();
        Slice::new(start[d] as isize, Some(limit[d] as isize), stride[d] as isize)
    };
    Ok(map_variant!(x, a => materialize(a.slice_each_axis(info))))
}

/// Concatenates tensors of one dtype along `dim`.
///
/// Row-major throughout: for each index of the dimensions before `dim`,
/// each operand contributes one contiguous run (its extent along `dim`
/// times the inner extents), copied whole. The result is in standard
/// layout whatever the operands' layouts (`ndarray::concatenate` grows
/// the result along `dim` and leaves it in a transposed layout when `dim`
/// is not the outermost, which every later consumer then pays for).
pub(crate) fn concatenate(xs: &[&HostTensor], dim: usize) -> Result<HostTensor, String> {
    let first = xs.first().ok_or("concatenate needs at least one operand")?;
    let rank = first.shape().len();
    if dim >= rank {
        return Err(format!("concatenate dimension {dim} is out of range for {}", first.ty()));
    }
    for x in xs {
        let compatible = x.shape().len() == rank && (0..rank).all(|d| d == dim || x.shape()[d] == first.shape()[d]);
        if !compatible {
            return Err(format!("concatenate of {} and {} along dimension {dim}", first.ty(), x.ty()));
        }
    }
    fn typed<T: Element>(xs: &[&HostTensor], dim: usize) -> Result<ArrayD<T>, String> {
        let arrays = xs
            .iter()
            .map(|x| {
                let a = x.as_array::<T>().ok_or_else(|| format!("concatenate of mixed dtypes ({})", x.ty()))?;
                Ok(if a.is_standard_layout() {
                    std::borrow::Cow::Borrowed(a)
                } else {
                    std::borrow::Cow::Owned(materialize(a.view()))
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        let mut shape = arrays[0].shape().to_vec();
        shape[dim] = arrays.iter().map(|a| a.shape()[dim]).sum();
        let outer: usize = shape[..dim].iter().product();
        let runs: Vec<(&[T], usize)> = arrays
            .iter()
            .map(|a| (a.as_slice().expect("standard layout"), a.shape()[dim..].iter().product()))
            .collect();
        let mut out: Vec<T> = Vec::with_capacity(shape.iter().product());
        for o in 0..outer {
            for &(data, run) in &runs {
                out.extend_from_slice(&data[o * run..(o + 1) * run]);
            }
        }
        Ok(ArrayD::from_shape_vec(IxDyn(&shape), out).expect("element count matches shape"))
    }
    with_element_type!(first.dtype(), T => typed::<T>(xs, dim).map(T::wrap))
}

/// Pads `x` with the scalar `value`: `low`/`high` elements before/after each
/// dimension (negative values crop) and `interior` between neighbours.
pub(crate) fn pad(
    x: &HostTensor,
    value: &HostTensor,
    low: &[i64],
    high: &[i64],
    interior: &[usize],
) -> Result<HostTensor, String> {
    let rank = x.shape().len();
    if value.dtype() != x.dtype() || !value.shape().is_empty() {
        return Err(format!("pad value must be a {} scalar, got {}", x.dtype(), value.ty()));
    }
    if low.len() != rank || high.len() != rank || interior.len() != rank {
        return Err(format!("pad attributes do not match the rank of {}", x.ty()));
    }
    // Per dimension: the result extent, and which operand elements survive
    // cropping (first index, count) with where the first one lands.
    let mut out_shape = Vec::with_capacity(rank);
    let mut src = Vec::with_capacity(rank); // (first source index, count)
    let mut dst = Vec::with_capacity(rank); // (first result index, step)
    for d in 0..rank {
        let n = x.shape()[d] as i64;
        let step = interior[d] as i64 + 1;
        let inner = if n == 0 { 0 } else { (n - 1) * step + 1 };
        let extent = low[d] + inner + high[d];
        if extent < 0 {
            return Err(format!("pad gives a negative extent {extent} in dimension {d}"));
        }
        // Source element i lands at low + i * step; keep those in [0, extent).
        let first = if low[d] < 0 { (-low[d] + step - 1) / step } else { 0 };
        let last = if extent == 0 { -1 } else { ((extent - 1 - low[d]).div_euclid(step)).min(n - 1) };
        let count = (last - first + 1).max(0);
        out_shape.push(extent as usize);
        src.push((first, count));
        dst.push((low[d] + first * step, step));
    }
    fn typed<T: Element>(a: &ArrayD<T>, v: T, shape: &[usize], src: &[(i64, i64)], dst: &[(i64, i64)]) -> ArrayD<T> {
        let mut out = ArrayD::from_elem(IxDyn(shape), v);
        if src.iter().any(|&(_, count)| count == 0) {
            return out;
        }
        let s = a.slice_each_axis(|ax| {
            let (first, count) = src[ax.axis.index()];
            Slice::new(first as isize, Some((first + count) as isize), 1)
        });
        out.slice_each_axis_mut(|ax| {
            let (count, (start, step)) = (src[ax.axis.index()].1, dst[ax.axis.index()]);
            Slice::new(start as isize, Some((start + (count - 1) * step + 1) as isize), step as isize)
        })
        .assign(&s);
        out
    }
    Ok(for_each_variant!(x, a => {
        let v = *value.as_array().and_then(|p| p.first()).expect("dtype checked");
        Element::wrap(typed(a, v, &out_shape, &src, &dst))
    }))
}

//! Copying a strided view into a row-major array without per-element
//! index arithmetic.
//!
//! Transposes, broadcasts and slices are views with arbitrary strides
//! (zero for broadcast axes). Walking such a view element by element
//! through a generic iterator costs a multi-index update per element; here
//! the leading axes are walked by an odometer and the two innermost axes
//! are copied as whole rows (`memcpy` for unit stride, a fill for stride
//! zero), or, for a transposed pair, in square tiles that keep both the
//! reads and the writes in cache.

use ndarray::{ArrayD, ArrayViewD, IxDyn};

/// Tile edge of the transposed-pair copy.
const TILE: usize = 32;

/// A copy of `v` in standard (row-major) layout.
pub fn to_standard_layout<T: Copy>(v: ArrayViewD<'_, T>) -> ArrayD<T> {
    if v.is_standard_layout() {
        return v.to_owned();
    }
    let shape = v.shape().to_vec();
    let n: usize = shape.iter().product();
    let mut out: Vec<T> = Vec::with_capacity(n);
    if n > 0 {
        // SAFETY: `v.as_ptr()` with `v.strides()` addresses exactly the
        // view's elements; `copy_rec` writes each of the `n` row-major
        // positions of `out` once, so all are initialised before `set_len`.
        unsafe {
            copy_rec(v.as_ptr(), &shape, v.strides(), out.as_mut_ptr());
            out.set_len(n);
        }
    }
    ArrayD::from_shape_vec(IxDyn(&shape), out).expect("element count matches shape")
}

/// Copies the view at `src` (extents `shape`, strides `strides`) to the
/// row-major destination `dst`.
unsafe fn copy_rec<T: Copy>(src: *const T, shape: &[usize], strides: &[isize], dst: *mut T) {
    match shape.len() {
        0 => dst.write(*src),
        1 => copy_row(src, shape[0], strides[0], dst),
        2 => copy_matrix(src, shape, strides, dst),
        _ => {
            let inner: usize = shape[1..].iter().product();
            for i in 0..shape[0] {
                copy_rec(src.offset(i as isize * strides[0]), &shape[1..], &strides[1..], dst.add(i * inner));
            }
        }
    }
}

unsafe fn copy_row<T: Copy>(src: *const T, n: usize, stride: isize, dst: *mut T) {
    match stride {
        1 => std::ptr::copy_nonoverlapping(src, dst, n),
        0 => {
            let v = *src;
            for j in 0..n {
                dst.add(j).write(v);
            }
        }
        s => {
            for j in 0..n {
                dst.add(j).write(*src.offset(j as isize * s));
            }
        }
    }
}

unsafe fn copy_matrix<T: Copy>(src: *const T, shape: &[usize], strides: &[isize], dst: *mut T) {
    let (rows, cols) = (shape[0], shape[1]);
    let (sr, sc) = (strides[0], strides[1]);
    if sc == 1 || sc == 0 || rows < TILE || cols < TILE {
        if sr == 0 && rows > 1 {
            // Every row is the same: copy the first, then duplicate it.
            copy_row(src, cols, sc, dst);
            for i in 1..rows {
                std::ptr::copy_nonoverlapping(dst, dst.add(i * cols), cols);
            }
            return;
        }
        for i in 0..rows {
            copy_row(src.offset(i as isize * sr), cols, sc, dst.add(i * cols));
        }
        return;
    }
    // A transposed (or otherwise strided) pair: square tiles.
    for i0 in (0..rows).step_by(TILE) {
        for j0 in (0..cols).step_by(TILE) {
            for i in i0..(i0 + TILE).min(rows) {
                let s = src.offset(i as isize * sr);
                let d = dst.add(i * cols);
                for j in j0..(j0 + TILE).min(cols) {
                    d.add(j).write(*s.offset(j as isize * sc));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::{Array, Axis, Slice};

    fn check(v: ArrayViewD<'_, i32>) {
        let expect: Vec<i32> = v.iter().copied().collect();
        let got = to_standard_layout(v.clone());
        assert_eq!(got.shape(), v.shape());
        assert_eq!(got.as_slice().unwrap(), &expect[..]);
    }

    #[test]
    fn every_layout_copies_in_row_major_order() {
        let a = Array::from_iter(0..(5 * 37 * 41)).into_shape_with_order(IxDyn(&[5, 37, 41])).unwrap();
        for perm in [[0, 1, 2], [0, 2, 1], [2, 1, 0], [1, 0, 2], [2, 0, 1], [1, 2, 0]] {
            check(a.view().permuted_axes(IxDyn(&perm)));
        }
        check(a.slice_axis(Axis(2), Slice::new(3, Some(40), 2)).into_dyn());
        let row = Array::from_iter(0..41).into_dyn();
        check(row.view().insert_axis(Axis(0)).broadcast(IxDyn(&[37, 41])).unwrap().into_dyn());
        let col = Array::from_iter(0..37).into_dyn();
        check(col.view().insert_axis(Axis(1)).broadcast(IxDyn(&[37, 41])).unwrap().into_dyn());
        let s = Array::from_elem(IxDyn(&[]), 7);
        check(s.view().broadcast(IxDyn(&[3, 64, 40])).unwrap());
        check(s.view());
        let empty = Array::<i32, _>::zeros(IxDyn(&[0, 4])).reversed_axes();
        check(empty.view());
    }
}

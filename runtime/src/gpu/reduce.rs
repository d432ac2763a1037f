//! `reduce_sum`, `reduce_max`, `reduce_min` on the device.
//!
//! The operand is rearranged (one strided copy, skipped when the reduced
//! dimensions are already the innermost) to `[kept..., reduced...]`, i.e.
//! `[outer, inner]`, and each row is reduced by one of the kernels of
//! `kernels_reduce.rs`: rows of at most [`THREAD_ROW`] elements by a thread
//! each (the CPU's exact order), longer rows by a cube each whose threads
//! read neighbouring elements ([`row_threads`]), and a few very long rows
//! in two passes, each row split into parts that cubes reduce side by side
//! ([`parts`]). A float reduction over the leading dimensions (a bias
//! gradient's sum over tokens) is not rearranged: cubes read blocks of
//! neighbouring columns down the rows ([`col_parts`]). Every choice depends on the shape alone, so a reduction
//! adds in the same order on every run. Empty reductions produce the
//! identity without reading anything.

use super::kernels_fused::{FusedExpr, Source};
use super::kernels_reduce::{
    reduce_cols_cube, reduce_rows, reduce_rows_cube, reduce_rows_cube_int, reduce_rows_int, Red, COL_BLOCK, COL_LANES,
    CUBE_THREADS,
};
use super::layout::{copy, fill_value, strides, Copy};
use super::ops::with_float;
use super::storage::Rounding;
use super::storage::Storage;
use super::{CubeBuffer, CubeclBackend};
use cubecl::prelude::*;
use weft_ir::{DType, ReduceOp, TensorType};

/// Rows at most this long take one thread each (for floats, the CPU's
/// exact order); longer ones a cube. (Integer sums, maxima and minima are
/// exact in any order.)
const THREAD_ROW: usize = 32;
/// Elements each thread of a row's cube folds before the tree, at least.
const PER_THREAD: usize = 8;
/// Cubes that keep a device busy (a few per multiprocessor of a large GPU).
const BUSY_CUBES: usize = 512;
/// The shortest part of a row split over several cubes.
const MIN_PART: usize = 4096;

/// Threads of the cube that reduces a row (or part) of `len` elements: a
/// power of two from 32 to [`CUBE_THREADS`], about `len / PER_THREAD`.
fn row_threads(len: usize) -> usize {
    len.div_ceil(PER_THREAD).next_power_of_two().clamp(32, CUBE_THREADS)
}

/// Into how many parts the `rows` of a reduction over leading dimensions
/// with `cols` kept elements are split (1: one pass): enough cubes to fill
/// the device, each part at least [`MIN_COL_PART`] rows.
fn col_parts(rows: usize, cols: usize) -> usize {
    let blocks = cols.div_ceil(COL_BLOCK);
    BUSY_CUBES.div_ceil(blocks).min(rows / MIN_COL_PART).max(1)
}

/// `parts` lowered so that splitting `len` elements into parts of
/// `len.div_ceil(parts)` leaves none empty (an empty part of a max would
/// read past its row).
fn nonempty(len: usize, parts: usize) -> usize {
    len.div_ceil(len.div_ceil(parts.max(1)).max(1))
}

/// The fewest rows of a part of a reduction over leading dimensions.
const MIN_COL_PART: usize = 256;

const _: () = assert!(COL_LANES == 8, "reduce_cols_cube's tree has three levels");

/// Into how many parts each of `outer` rows of `inner` elements is split
/// (1: one pass), so that few long rows still fill the device.
fn parts(outer: usize, inner: usize) -> usize {
    if outer >= BUSY_CUBES || inner < 2 * MIN_PART {
        return 1;
    }
    BUSY_CUBES.div_ceil(outer).min(inner / MIN_PART).max(1)
}

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

/// What a float reduction reads at each element of the reduced value: a
/// fused expression over `inputs` ([`crate::gpu::fused`]), or a stored
/// operand (one load, [`Reads::operand`]).
pub(super) struct Reads<'a, R: Runtime> {
    /// The expression's inputs.
    pub inputs: Vec<&'a CubeBuffer<R>>,
    /// Where each input goes (its input sequence and index there).
    pub sources: Vec<Source>,
    /// The expression; node `stores[0]` is the value reduced.
    pub expr: FusedExpr,
    /// The storage dtype of its floats (`F32` or `F64`).
    pub storage: DType,
}

impl<'a, R: Runtime> Reads<'a, R> {
    /// The elements of the stored float buffer `x`.
    pub fn operand(x: &'a CubeBuffer<R>) -> Self {
        Reads {
            inputs: vec![x],
            sources: vec![Source::Float(0)],
            expr: FusedExpr::operand(),
            storage: Storage::float_of(x.ty.dtype),
        }
    }

    fn floats<F: Float>(&self) -> SequenceArg<R, Array<F>> {
        bound(&self.inputs, &self.sources, false)
    }

    fn masks(&self) -> SequenceArg<R, Array<u32>> {
        bound(&self.inputs, &self.sources, true)
    }
}

/// The kernel arguments of the `inputs` (of a fused expression) that
/// `sources` sends to one sequence: the boolean ones (`masks`) or the float ones.
pub(super) fn bound<R: Runtime, E: CubePrimitive>(
    inputs: &[&CubeBuffer<R>],
    sources: &[Source],
    masks: bool,
) -> SequenceArg<R, Array<E>> {
    inputs.iter().zip(sources).filter(|(_, s)| matches!(s, Source::Mask(_)) == masks).map(|(b, _)| b.arg()).collect()
}

/// Reduces `x` over `dims` into a new buffer of type `ty`.
pub(super) fn reduce<R: Runtime>(
    be: &CubeclBackend<R>,
    op: ReduceOp,
    x: &CubeBuffer<R>,
    dims: &[usize],
    ty: &TensorType,
) -> CubeBuffer<R> {
    if ty.dtype.is_float() {
        return reduce_float(be, op, &Reads::operand(x), &x.ty.shape, dims, ty).unwrap_or_else(|| {
            // Rearranged so the reduced dimensions come last, then read in place.
            let x = reduced_last(be, x, dims);
            let last: Vec<usize> = (x.ty.rank() - dims.len()..x.ty.rank()).collect();
            reduce_float(be, op, &Reads::operand(&x), &x.ty.shape, &last, ty).expect("innermost dimensions")
        });
    }
    let inner: usize = dims.iter().map(|&d| x.ty.shape[d]).product();
    if inner == 0 {
        return fill_value(be, ty, identity(op, ty.dtype)).expect("scalar upload");
    }
    let x = reduced_last(be, x, dims);
    let out = be.empty(ty);
    let (c, red, inner32) = (&be.client, op_of(op), u32::try_from(inner).expect("rows shorter than 2^32"));
    if inner > THREAD_ROW {
        // A cube per row, its threads reading neighbouring elements (an
        // argmax's minimum position over 8,192 classes took 1.3 ms on an
        // H200 with a thread per row).
        let (count, dim, threads, levels) = cube_per_row(be, out.len(), inner);
        if ty.dtype == DType::I32 {
            reduce_rows_cube_int::launch::<i32, R>(c, count, dim, x.arg(), out.arg(), inner32, threads, levels, red);
        } else {
            reduce_rows_cube_int::launch::<u32, R>(c, count, dim, x.arg(), out.arg(), inner32, threads, levels, red);
        }
        return out;
    }
    let (count, dim) = be.grid(ty.num_elements());
    if ty.dtype == DType::I32 {
        reduce_rows_int::launch::<i32, R>(c, count, dim, x.arg(), out.arg(), inner32, red);
    } else {
        reduce_rows_int::launch::<u32, R>(c, count, dim, x.arg(), out.arg(), inner32, red);
    }
    out
}

/// Reduces the float values `reads` gives (of `shape`) over `dims` into a
/// new buffer of type `ty`, reading them in place: `None` when the
/// reduced dimensions are neither the innermost nor the leading ones (a
/// stored operand is then rearranged first; a fused chain's values are
/// stored, then reduced).
pub(super) fn reduce_float<R: Runtime>(
    be: &CubeclBackend<R>,
    op: ReduceOp,
    reads: &Reads<'_, R>,
    shape: &[usize],
    dims: &[usize],
    ty: &TensorType,
) -> Option<CubeBuffer<R>> {
    let rank = shape.len();
    let inner: usize = dims.iter().map(|&d| shape[d]).product();
    if inner == 0 {
        return Some(fill_value(be, ty, identity(op, ty.dtype)).expect("scalar upload"));
    }
    let outer = ty.num_elements();
    let red = op_of(op);
    let leading = dims.len() < rank && (0..dims.len()).all(|k| dims.contains(&k));
    if leading && inner > THREAD_ROW {
        return Some(columns(be, reads, inner, outer, red, ty));
    }
    if !(rank - dims.len()..rank).all(|k| dims.contains(&k)) {
        return None;
    }
    let out = be.empty(ty);
    let rnd = Rounding::of(ty.dtype);
    if inner <= THREAD_ROW {
        let (count, dim) = be.grid(outer);
        let inner32 = u32::try_from(inner).expect("rows shorter than 2^32");
        let expr = reads.expr.clone();
        with_float!(reads.storage, F => reduce_rows::launch::<F, R>(
            &be.client, count, dim, reads.floats::<F>(), reads.masks(), out.arg(), inner32, red, rnd, expr
        ));
    } else {
        let p = nonempty(inner, parts(outer, inner));
        if p == 1 {
            rows_by_cubes(be, reads, &out, inner, 1, red, rnd);
        } else {
            // Partials in the storage type, unrounded; the second pass
            // reduces each row's `p` partials and rounds.
            let partial = be.empty(&TensorType::new(reads.storage, vec![outer * p]));
            rows_by_cubes(be, reads, &partial, inner, p, red, Rounding::None);
            rows_by_cubes(be, &Reads::operand(&partial), &out, p, 1, red, rnd);
        }
    }
    Some(out)
}

fn op_of(op: ReduceOp) -> Red {
    match op {
        ReduceOp::Sum => Red::Sum,
        ReduceOp::Max => Red::Max,
        ReduceOp::Min => Red::Min,
    }
}

/// Reduces `x`, viewed as `[rows, cols]`, over its rows into a new buffer
/// of type `ty` (`cols` elements): in one pass, or in parts whose unrounded
/// partials a second pass folds and rounds.
fn columns<R: Runtime>(
    be: &CubeclBackend<R>,
    reads: &Reads<'_, R>,
    rows: usize,
    cols: usize,
    red: Red,
    ty: &TensorType,
) -> CubeBuffer<R> {
    let out = be.empty(ty);
    let rnd = Rounding::of(ty.dtype);
    let p = nonempty(rows, col_parts(rows, cols));
    if p == 1 {
        columns_into(be, reads, &out, rows, cols, 1, red, rnd);
    } else {
        let partial = be.empty(&TensorType::new(reads.storage, vec![p * cols]));
        columns_into(be, reads, &partial, rows, cols, p, red, Rounding::None);
        columns_into(be, &Reads::operand(&partial), &out, p, cols, 1, red, rnd);
    }
    out
}

/// The sum of `x`, viewed as `[rows, ty's elements]`, over its rows, rounded
/// to `ty` (the partial products of a split contraction, in row order).
pub(super) fn sum_rows_of<R: Runtime>(
    be: &CubeclBackend<R>,
    x: &CubeBuffer<R>,
    rows: usize,
    ty: &TensorType,
) -> CubeBuffer<R> {
    columns(be, &Reads::operand(x), rows, ty.num_elements(), Red::Sum, ty)
}

/// One [`reduce_cols_cube`] launch: `parts` partial folds of each column.
#[allow(clippy::too_many_arguments)]
fn columns_into<R: Runtime>(
    be: &CubeclBackend<R>,
    reads: &Reads<'_, R>,
    out: &CubeBuffer<R>,
    rows: usize,
    cols: usize,
    parts: usize,
    red: Red,
    rnd: Rounding,
) {
    let chunk = rows.div_ceil(parts);
    let cubes = u32::try_from(cols.div_ceil(COL_BLOCK) * parts).expect("fewer than 2^32 cubes");
    let count = cubecl::server::CubeCountSelection::new(&be.client, cubes).cube_count();
    let dim = CubeDim::new_2d(COL_BLOCK as u32, COL_LANES as u32);
    let [rows, cols, chunk, parts] = [rows, cols, chunk, parts].map(|v| u32::try_from(v).expect("below 2^32"));
    let expr = reads.expr.clone();
    with_float!(reads.storage, F => reduce_cols_cube::launch::<F, R>(
        &be.client, count, dim, reads.floats::<F>(), reads.masks(), out.arg(), rows, cols, chunk, parts, red, rnd, expr
    ));
}

/// Launch geometry of one cube per row for `rows` rows of `len` elements:
/// the cube count, its dimension, and its threads as `2^levels`
/// ([`row_threads`]).
fn cube_per_row<R: Runtime>(be: &CubeclBackend<R>, rows: usize, len: usize) -> (CubeCount, CubeDim, usize, u32) {
    let threads = row_threads(len);
    let cubes = u32::try_from(rows).expect("fewer than 2^32 rows");
    let count = cubecl::server::CubeCountSelection::new(&be.client, cubes).cube_count();
    (count, CubeDim::new_1d(threads as u32), threads, threads.trailing_zeros())
}

/// Reduces each row of `x` (rows of `inner` elements, each split into
/// `parts` pieces) into `out` (`rows × parts` values) with one cube per
/// piece.
fn rows_by_cubes<R: Runtime>(
    be: &CubeclBackend<R>,
    reads: &Reads<'_, R>,
    out: &CubeBuffer<R>,
    inner: usize,
    parts: usize,
    red: Red,
    rnd: Rounding,
) {
    let chunk = inner.div_ceil(parts);
    let (count, dim, threads, levels) = cube_per_row(be, out.len(), chunk);
    let (inner, chunk, parts) = (inner as u32, chunk as u32, parts as u32);
    let expr = reads.expr.clone();
    with_float!(reads.storage, F => reduce_rows_cube::launch::<F, R>(
        &be.client, count, dim, reads.floats::<F>(), reads.masks(), out.arg(), inner, chunk, parts, threads, levels, red, rnd, expr
    ));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_rows_get_wide_cubes_and_few_long_rows_are_split() {
        assert_eq!(row_threads(33), 32);
        assert_eq!(row_threads(512), 64);
        assert_eq!(row_threads(8192), 256);
        assert_eq!(parts(4096, 8192), 1, "enough rows fill the device");
        assert_eq!(parts(1, 1 << 20), (1 << 20) / MIN_PART, "parts of at least MIN_PART");
        assert_eq!(parts(1, 1 << 24), BUSY_CUBES);
        assert_eq!(parts(1, 6000), 1, "too short to split");
        assert_eq!(parts(64, 1 << 20), BUSY_CUBES / 64);
        assert_eq!(parts(2, 20_000), 4, "parts of at least MIN_PART");
        assert_eq!(col_parts(4096, 2048), 8, "64 column blocks, 8 parts of 512 rows");
        assert_eq!(col_parts(4096, 512), 16, "parts of at least 256 rows");
        assert_eq!(col_parts(300, 64 * 1024), 1);
        assert_eq!(col_parts(131_073, 8), 512);
        assert_eq!(nonempty(131_073, 512), 511, "parts of 257 rows: 510 full, the last 4 rows");
        for (len, p) in [(9, 4), (10, 4), (4096, 3), (100, 100), (5, 9)] {
            let q = nonempty(len, p);
            let chunk = len.div_ceil(q);
            assert!((q - 1) * chunk < len && q * chunk >= len, "{len} {p}: {q} parts of {chunk}");
        }
    }
}

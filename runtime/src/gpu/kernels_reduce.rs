//! Reduction kernels over the last axis of a `[outer, inner]` view.
//!
//! Two shapes of parallelism: [`reduce_rows`] gives each output element
//! one thread that folds its row left to right from the identity - the
//! interpreter's exact order, so sums match the CPU bit for bit - and is
//! used whenever there are enough rows to fill the device. When there are
//! few long rows, [`reduce_rows_cube`] gives each row a cube of threads
//! that accumulate strided partial results and combine them in a shared
//! memory tree (a different summation order: float sums then agree with
//! the CPU to rounding, max and min still exactly).
//!
//! The float kernels read the reduced value through a fused expression
//! ([`FusedExpr`], evaluated per element by [`chain_value`]): a plain
//! reduction's is one load of its operand, and a fused chain that ends in
//! a reduction (a squared norm `sum(g * g)`, a layer norm's `sum((x -
//! mean)²)`) computes its elements where the reduction reads them, so
//! they are never stored.

use super::kernels_fused::{chain_value, FusedExpr};
use super::math::{max_nan, min_nan};
use super::round::apply_rounding;
use super::storage::Rounding;
use cubecl::prelude::*;

/// Which reduction.
#[allow(missing_docs)]
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Red {
    Sum,
    Max,
    Min,
}

/// Threads per cube of [`reduce_rows_cube`] (a power of two).
pub const CUBE_THREADS: usize = 256;

#[cube]
fn combine_float<F: Float>(a: F, b: F, #[comptime] op: Red) -> F {
    match op {
        Red::Sum => a + b,
        Red::Max => max_nan::<F>(a, b),
        Red::Min => min_nan::<F>(a, b),
    }
}

#[cube]
fn combine_int<I: Int>(a: I, b: I, #[comptime] op: Red) -> I {
    match op {
        Red::Sum => a + b,
        Red::Max => select(a > b, a, b),
        Red::Min => select(a < b, a, b),
    }
}

/// One thread per row: `out[r] = fold(x[r*inner .. (r+1)*inner])`, rounded
/// to the dtype. Sums start from 0; max/min from the first element (same
/// result as from the identity, which WGSL cannot spell: infinity).
#[cube(launch)]
pub fn reduce_rows<F: Float>(
    inputs: &Sequence<Array<F>>,
    masks: &Sequence<Array<u32>>,
    out: &mut Array<F>,
    inner: u32,
    #[comptime] op: Red,
    #[comptime] rnd: Rounding,
    #[comptime] x: FusedExpr,
) {
    let r = ABSOLUTE_POS;
    if r < out.len() {
        let base = r * inner as usize;
        let mut acc = match op {
            Red::Sum => F::new(0.0),
            _ => chain_value::<F>(inputs, masks, base, x.clone()),
        };
        for j in 0..inner as usize {
            acc = combine_float::<F>(acc, chain_value::<F>(inputs, masks, base + j, x.clone()), op);
        }
        out[r] = apply_rounding::<F>(acc, rnd);
    }
}

/// [`reduce_rows`] for integers (wrapping sums).
#[cube(launch)]
pub fn reduce_rows_int<I: Int>(x: &Array<I>, out: &mut Array<I>, inner: u32, #[comptime] op: Red) {
    let r = ABSOLUTE_POS;
    if r < out.len() {
        let base = r * inner as usize;
        let mut acc = match op {
            Red::Sum => I::new(0),
            _ => x[base],
        };
        for j in 0..inner as usize {
            acc = combine_int::<I>(acc, x[base + j], op);
        }
        out[r] = acc;
    }
}

/// [`reduce_rows_int`] with a cube of `threads = 2^levels` threads per row
/// (cube `c` reduces row `c`), neighbouring threads reading neighbouring
/// elements, as [`reduce_rows_cube`] does. Integer sums (wrapping), maxima
/// and minima are exact in any order, so this equals the one-thread fold.
#[cube(launch)]
pub fn reduce_rows_cube_int<I: Int>(
    x: &Array<I>,
    out: &mut Array<I>,
    inner: u32,
    #[comptime] threads: usize,
    #[comptime] levels: u32,
    #[comptime] op: Red,
) {
    let c = CUBE_POS;
    let t = UNIT_POS as usize;
    let mut shared = SharedMemory::<I>::new(threads);
    if c < out.len() {
        let base = c * inner as usize;
        let mut acc = match op {
            Red::Sum => I::new(0),
            _ => x[base],
        };
        let mut j = t;
        while j < inner as usize {
            acc = combine_int::<I>(acc, x[base + j], op);
            j += threads;
        }
        shared[t] = acc;
    }
    sync_cube();
    #[unroll]
    for level in 1..levels + 1 {
        let half = threads >> level as usize;
        if t < half {
            shared[t] = combine_int::<I>(shared[t], shared[t + half], op);
        }
        sync_cube();
    }
    if c < out.len() && t == 0 {
        out[c] = shared[0];
    }
}

/// One cube of `threads = 2^levels` threads (at most [`CUBE_THREADS`]) per piece of a row: cube `c` reduces part `c % parts`
/// of row `c / parts`, elements `[p·chunk, min((p+1)·chunk, inner))`,
/// into `out[c]`. Each thread folds a strided share (thread `t` reads
/// `t, t + threads, ...`: neighbouring threads read neighbouring elements),
/// then a shared-memory tree of fixed shape combines the shares: the same
/// order on every run. `rnd` rounds the result (a first pass of a
/// two-pass reduction keeps f32 partials: `Rounding::None`).
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn reduce_rows_cube<F: Float>(
    inputs: &Sequence<Array<F>>,
    masks: &Sequence<Array<u32>>,
    out: &mut Array<F>,
    inner: u32,
    chunk: u32,
    parts: u32,
    #[comptime] threads: usize,
    #[comptime] levels: u32,
    #[comptime] op: Red,
    #[comptime] rnd: Rounding,
    #[comptime] x: FusedExpr,
) {
    let c = CUBE_POS;
    let t = UNIT_POS as usize;
    let mut shared = SharedMemory::<F>::new(threads);
    if c < out.len() {
        let row = c / parts as usize;
        let start = (c % parts as usize) * chunk as usize;
        let stop = start + chunk as usize;
        let end = select(stop < inner as usize, stop, inner as usize);
        let base = row * inner as usize;
        let mut acc = match op {
            Red::Sum => F::new(0.0),
            _ => chain_value::<F>(inputs, masks, base + start, x.clone()),
        };
        let mut j = start + t;
        while j < end {
            acc = combine_float::<F>(acc, chain_value::<F>(inputs, masks, base + j, x.clone()), op);
            j += threads;
        }
        shared[t] = acc;
    }
    sync_cube();
    #[unroll]
    for level in 1..levels + 1 {
        let half = threads >> level as usize;
        if t < half {
            shared[t] = combine_float::<F>(shared[t], shared[t + half], op);
        }
        sync_cube();
    }
    if c < out.len() && t == 0 {
        out[c] = apply_rounding::<F>(shared[0], rnd);
    }
}

/// Columns per cube of [`reduce_cols_cube`] (its threads' x extent).
pub const COL_BLOCK: usize = 32;
/// Row lanes per cube of [`reduce_cols_cube`] (its threads' y extent; a
/// power of two).
pub const COL_LANES: usize = 8;

/// Reduces the rows of an `[rows, cols]` view: `out[p·cols + j]` is the
/// fold of column `j` over rows `[p·chunk, min((p+1)·chunk, rows))`. A cube
/// takes [`COL_BLOCK`] neighbouring columns of one part, so each row's
/// loads are contiguous; its [`COL_LANES`] lanes of rows fold strided shares
/// that a fixed shared-memory tree combines. The reduced dimensions lead,
/// so nothing is rearranged first (a bias gradient sums a `[tokens, width]`
/// tensor over its tokens).
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn reduce_cols_cube<F: Float>(
    inputs: &Sequence<Array<F>>,
    masks: &Sequence<Array<u32>>,
    out: &mut Array<F>,
    rows: u32,
    cols: u32,
    chunk: u32,
    parts: u32,
    #[comptime] op: Red,
    #[comptime] rnd: Rounding,
    #[comptime] x: FusedExpr,
) {
    let blocks = (cols as usize).div_ceil(COL_BLOCK);
    let c = CUBE_POS;
    let (tx, ty) = (UNIT_POS_X as usize, UNIT_POS_Y as usize);
    let part = c / blocks;
    let col = (c % blocks) * COL_BLOCK + tx;
    let live = part < parts as usize && col < cols as usize;
    let mut shared = SharedMemory::<F>::new(COL_BLOCK * COL_LANES);
    if live {
        let start = part * chunk as usize;
        let stop = start + chunk as usize;
        let end = select(stop < rows as usize, stop, rows as usize);
        let mut acc = match op {
            Red::Sum => F::new(0.0),
            _ => chain_value::<F>(inputs, masks, start * cols as usize + col, x.clone()),
        };
        let mut r = start + ty;
        while r < end {
            acc = combine_float::<F>(acc, chain_value::<F>(inputs, masks, r * cols as usize + col, x.clone()), op);
            r += COL_LANES;
        }
        shared[ty * COL_BLOCK + tx] = acc;
    }
    sync_cube();
    #[unroll]
    for level in 1..4u32 {
        let half = COL_LANES >> level as usize;
        if ty < half {
            shared[ty * COL_BLOCK + tx] =
                combine_float::<F>(shared[ty * COL_BLOCK + tx], shared[(ty + half) * COL_BLOCK + tx], op);
        }
        sync_cube();
    }
    if live && ty == 0 {
        out[part * cols as usize + col] = apply_rounding::<F>(shared[tx], rnd);
    }
}

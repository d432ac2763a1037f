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
    x: &Array<F>,
    out: &mut Array<F>,
    inner: u32,
    #[comptime] op: Red,
    #[comptime] rnd: Rounding,
) {
    let r = ABSOLUTE_POS;
    if r < out.len() {
        let base = r * inner as usize;
        let mut acc = match op {
            Red::Sum => F::new(0.0),
            _ => x[base],
        };
        for j in 0..inner as usize {
            acc = combine_float::<F>(acc, x[base + j], op);
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

/// One cube per row (`CUBE_POS`), [`CUBE_THREADS`] threads each.
#[cube(launch)]
pub fn reduce_rows_cube<F: Float>(
    x: &Array<F>,
    out: &mut Array<F>,
    inner: u32,
    #[comptime] op: Red,
    #[comptime] rnd: Rounding,
) {
    let r = CUBE_POS;
    let t = UNIT_POS as usize;
    let mut shared = SharedMemory::<F>::new(CUBE_THREADS);
    let n = inner as usize;
    if r < out.len() {
        let base = r * n;
        let mut acc = match op {
            Red::Sum => F::new(0.0),
            _ => x[base],
        };
        let mut j = t;
        while j < n {
            acc = combine_float::<F>(acc, x[base + j], op);
            j += CUBE_THREADS;
        }
        shared[t] = acc;
    }
    sync_cube();
    #[unroll]
    for level in 1..9u32 {
        let half = CUBE_THREADS >> level as usize;
        if t < half {
            shared[t] = combine_float::<F>(shared[t], shared[t + half], op);
        }
        sync_cube();
    }
    if r < out.len() && t == 0 {
        out[r] = apply_rounding::<F>(shared[0], rnd);
    }
}

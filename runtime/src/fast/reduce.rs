//! `reduce` over `f32` (and `bf16`/`f16`, widened to `f32` and rounded once
//! at the end, as the interpreter accumulates them) over one run of
//! consecutive dimensions: the leading dimensions (a column sum, e.g. a
//! bias gradient over the batch), middle ones (the pairs of a
//! mesh-invariant sum's tree level, `[k/2, 2, rest]`) and the trailing
//! dimensions (a row sum, or a whole-tensor sum such as a squared norm).
//!
//! Leading and middle reductions fold rows in order, exactly as the interpreter does,
//! with the loop over the kept elements innermost (vectorised). Trailing
//! reductions are latency-bound as one left fold, so they use 16
//! interleaved partial sums (lane `i` takes elements `i, i+16, ...`)
//! combined in lane order at the end: a fixed order, so the result is the
//! same on every run, and it differs from the interpreter's left fold only
//! by rounding. Max and min are exact in any order. Other layouts return
//! `None` (the interpreter runs them).

use super::halves::{narrow, widen};
use super::pool::Pool;
use ndarray::{ArrayD, IxDyn};
use weft_ir::interp::scalar::binary_f32;
use weft_ir::tensor::HostTensor;
use weft_ir::{BinaryOp, ReduceOp};

const LANES: usize = 16;

pub(crate) fn reduce(op: ReduceOp, x: &HostTensor, dims: &[usize], pool: &mut Pool) -> Option<HostTensor> {
    match x {
        HostTensor::F32(a) => reduce_f32(op, a, dims, pool).map(HostTensor::F32),
        // Half types accumulate in f32 and round once, as the interpreter.
        HostTensor::BF16(_) | HostTensor::F16(_) => {
            let wide = widen(x, pool)?;
            let r = reduce_f32(op, &wide, dims, pool);
            pool.give(HostTensor::F32(wide));
            Some(narrow(r?, x.dtype(), pool))
        }
        _ => None,
    }
}

fn reduce_f32(op: ReduceOp, a: &ArrayD<f32>, dims: &[usize], pool: &mut Pool) -> Option<ArrayD<f32>> {
    let data = a.as_slice()?;
    let shape = a.shape();
    let rank = shape.len();
    if dims.is_empty() || dims.iter().enumerate().any(|(i, &d)| d >= rank || (i > 0 && dims[i - 1] >= d)) {
        return None;
    }
    let (bin, init) = op_and_init(op);
    let f = |acc: f32, v: f32| binary_f32(bin, acc, v).expect("float op");
    // One run of consecutive dims: `[outer, reduced, inner]`.
    let contiguous = dims.iter().enumerate().all(|(i, &d)| d == dims[0] + i);
    let suffix = contiguous && dims[dims.len() - 1] == rank - 1;
    let reduced: usize = dims.iter().map(|&d| shape[d]).product();
    let kept_shape: Vec<usize> = (0..rank).filter(|d| !dims.contains(d)).map(|d| shape[d]).collect();
    let kept: usize = kept_shape.iter().product();
    if reduced == 0 || kept == 0 {
        return None;
    }
    let mut out = pool.take(kept);
    if suffix {
        for (o, row) in out.iter_mut().zip(data.chunks_exact(reduced)) {
            let mut fold = RowFold::new(op);
            fold.feed(row);
            *o = fold.finish();
        }
    } else if contiguous {
        // Leading (a column sum: one outer block) or middle dims (a sum
        // over the pairs of a tree level, `[k/2, 2, rest]`): rows folded
        // in order into each outer block's kept elements.
        let inner: usize = shape[dims[dims.len() - 1] + 1..].iter().product();
        out.fill(init);
        for (block, rows) in out.chunks_exact_mut(inner).zip(data.chunks_exact(inner * reduced)) {
            for row in rows.chunks_exact(inner) {
                for (o, &v) in block.iter_mut().zip(row) {
                    *o = f(*o, v);
                }
            }
        }
    } else {
        return None;
    }
    Some(ArrayD::from_shape_vec(IxDyn(&kept_shape), out).expect("sized"))
}

/// The interpreter's `max` (NaN if either is NaN, `+0` over `-0`) without
/// branches, so that a fold's lanes run as vector selects.
#[inline(always)]
fn max_lane(a: f32, b: f32) -> f32 {
    let r = if (a > b) | ((a == b) & b.is_sign_negative()) { a } else { b };
    if a.is_nan() | b.is_nan() {
        f32::NAN
    } else {
        r
    }
}

/// The interpreter's `min` (NaN if either is NaN, `-0` under `+0`) without
/// branches.
#[inline(always)]
fn min_lane(a: f32, b: f32) -> f32 {
    let r = if (a < b) | ((a == b) & a.is_sign_negative()) { a } else { b };
    if a.is_nan() | b.is_nan() {
        f32::NAN
    } else {
        r
    }
}

/// The binary op and the initial value of a reduction.
fn op_and_init(op: ReduceOp) -> (BinaryOp, f32) {
    match op {
        ReduceOp::Sum => (BinaryOp::Add, 0.0),
        ReduceOp::Max => (BinaryOp::Max, f32::NEG_INFINITY),
        ReduceOp::Min => (BinaryOp::Min, f32::INFINITY),
    }
}

/// A row fold in progress: `LANES` interleaved partial results (lane `i`
/// takes elements `i, i + LANES, ...` of the row), combined in lane order
/// by [`RowFold::finish`]. A row may be fed in pieces (a fused chain feeds
/// it block by block): as long as every piece but the last is a multiple of
/// `LANES` long, each element meets the lane it meets in one pass, so the
/// result is bit for bit the same.
pub(crate) struct RowFold {
    lanes: [f32; LANES],
    op: BinaryOp,
    init: f32,
}

impl RowFold {
    /// An empty fold of `op`.
    pub fn new(op: ReduceOp) -> RowFold {
        let (op, init) = op_and_init(op);
        RowFold { lanes: [init; LANES], op, init }
    }

    /// Folds the row's next elements (see the type's docs on pieces).
    #[inline]
    pub fn feed(&mut self, xs: &[f32]) {
        macro_rules! lanes {
            ($f:expr) => {{
                let mut chunks = xs.chunks_exact(LANES);
                for c in &mut chunks {
                    for (l, &v) in self.lanes.iter_mut().zip(c) {
                        *l = $f(*l, v);
                    }
                }
                for (l, &v) in self.lanes.iter_mut().zip(chunks.remainder()) {
                    *l = $f(*l, v);
                }
            }};
        }
        match self.op {
            BinaryOp::Add => lanes!(|a, v| binary_f32(BinaryOp::Add, a, v).expect("float op")),
            BinaryOp::Max => lanes!(max_lane),
            _ => lanes!(min_lane),
        }
    }

    /// The row's result: the lanes combined in lane order.
    pub fn finish(&self) -> f32 {
        match self.op {
            BinaryOp::Max => self.lanes.iter().fold(self.init, |acc, &l| max_lane(acc, l)),
            BinaryOp::Min => self.lanes.iter().fold(self.init, |acc, &l| min_lane(acc, l)),
            op => self.lanes.iter().fold(self.init, |acc, &l| binary_f32(op, acc, l).expect("float op")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weft_ir::Op;

    fn ramp(shape: &[usize]) -> HostTensor {
        let n: usize = shape.iter().product();
        HostTensor::from_f32(shape, (0..n).map(|i| ((i * 7919 % 1000) as f32 * 0.37).sin()).collect()).unwrap()
    }

    /// Max and min folds (in lanes, fed in pieces) give the
    /// interpreter's left fold bit for bit: NaN anywhere, `+0` over `-0`
    /// for max and `-0` over `+0` for min, infinities.
    #[test]
    fn max_and_min_folds_are_the_interpreters_bits() {
        let specials = [0.0, -0.0, f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 1.5, -2.5];
        let mut x = 12345u32;
        for len in [1, 5, 16, 33, 100, 1000] {
            for trial in 0..40 {
                let row: Vec<f32> = (0..len)
                    .map(|_| {
                        x ^= x << 13;
                        x ^= x >> 17;
                        x ^= x << 5;
                        // Mostly signed zeros and a few others; NaN in some rows only.
                        let pick = (x % 9) as usize;
                        match specials.get(pick) {
                            Some(v) if v.is_nan() && trial % 3 != 0 => 0.0,
                            Some(&v) => v,
                            None => (x % 1000) as f32 * 0.01 - 5.0,
                        }
                    })
                    .collect();
                for (op, bin, init) in
                    [(ReduceOp::Max, BinaryOp::Max, f32::NEG_INFINITY), (ReduceOp::Min, BinaryOp::Min, f32::INFINITY)]
                {
                    let want = row.iter().fold(init, |a, &v| binary_f32(bin, a, v).unwrap());
                    let mut fold = RowFold::new(op);
                    let cut = (len / 2) / LANES * LANES;
                    fold.feed(&row[..cut]);
                    fold.feed(&row[cut..]);
                    let got = fold.finish();
                    assert_eq!(got.to_bits(), want.to_bits(), "{op:?} of {row:?}: {got} vs {want}");
                }
            }
        }
    }

    #[test]
    fn one_run_of_consecutive_dims_takes_the_fast_path_with_the_interpreters_bits() {
        let mut pool = Pool::default();
        // Leading, middle (a tree level's pairs), trailing; the middle and
        // leading ones fold rows in order as the interpreter does.
        for (shape, dims, interp_bits) in [
            (&[6, 5][..], &[0][..], true),
            (&[4, 2, 3, 5], &[1], true),
            (&[4, 2, 3, 5], &[1, 2], true),
            (&[3, 8, 17], &[1], true),
            (&[4, 2, 3, 5], &[2, 3], false),
        ] {
            let x = ramp(shape);
            let got = reduce(ReduceOp::Sum, &x, dims, &mut pool).expect("the fast path");
            let want = weft_ir::interp::eval_op(&Op::Reduce { op: ReduceOp::Sum, dims: dims.to_vec() }, &[&x]).unwrap();
            let (g, w) = (got.to_f64_vec(), want[0].to_f64_vec());
            assert_eq!(got.shape(), want[0].shape(), "{shape:?} over {dims:?}");
            for (a, b) in g.iter().zip(&w) {
                if interp_bits {
                    assert_eq!(a.to_bits(), b.to_bits(), "{shape:?} over {dims:?}");
                } else {
                    assert!((a - b).abs() <= 1e-5 * b.abs().max(1.0));
                }
            }
        }
        // Dims that are not one run are left to the interpreter.
        assert!(reduce(ReduceOp::Sum, &ramp(&[4, 2, 3]), &[0, 2], &mut pool).is_none());
    }
}

//! The indexing ops in the builder: `gather`, `take_along_axis`,
//! `scatter_add`, `cumsum`, `top_k` (semantics in [`crate::indexing`];
//! out-of-range indices read zeros and are dropped).

use super::{FunctionBuilder, Value};
use crate::{IndexOp, Op};

impl FunctionBuilder {
    /// Slices of `x` along `axis` picked by the integer `indices`
    /// (TensorFlow's `gather` with `batch_dims`): the result's shape is
    /// `x.shape[..axis] ++ indices.shape[batch_dims..] ++
    /// x.shape[axis+1..]`. `gather(table, ids, 0, 0)` is an embedding
    /// lookup. Out-of-range indices read zeros.
    #[track_caller]
    pub fn gather(&self, x: Value, indices: Value, axis: isize, batch_dims: usize) -> Value {
        self.scope("gather", || {
            let Some(t) = self.input("gather", x) else { return self.poison() };
            let Some(axis) = self.axis("gather", &t, axis) else { return self.poison() };
            self.emit1(Op::Index(IndexOp::Gather { axis, batch_dims }), &[x, indices])
        })
    }

    /// NumPy's `take_along_axis`: `indices` has `x`'s rank and extents
    /// except along `axis`; `result[.., j, ..] = x[.., indices[.., j, ..],
    /// ..]`. Out-of-range indices read zeros.
    #[track_caller]
    pub fn take_along_axis(&self, x: Value, indices: Value, axis: isize) -> Value {
        self.scope("take_along_axis", || {
            let Some(tys) = self.inputs("take_along_axis", &[x, indices]) else { return self.poison() };
            let (t, it) = (&tys[0], &tys[1]);
            let Some(a) = self.axis("take_along_axis", t, axis) else { return self.poison() };
            let others = |s: &[usize]| [&s[..a], &s[a + 1..]].concat();
            if it.rank() != t.rank() || others(&t.shape) != others(&it.shape) {
                self.fail("take_along_axis", format!("indices {it} must have the shape of {t} except along axis {a}"));
                return self.poison();
            }
            // Move the axis last, gather with every other dimension paired.
            let last = t.rank() - 1;
            let perm: Vec<usize> = (0..t.rank()).filter(|&d| d != a).chain([a]).collect();
            let (xm, im) =
                if a == last { (x, indices) } else { (self.transpose(x, &perm), self.transpose(indices, &perm)) };
            let g = self.emit1(Op::Index(IndexOp::Gather { axis: last, batch_dims: last }), &[xm, im]);
            if a == last {
                return g;
            }
            let mut inv = vec![0; perm.len()];
            for (i, &p) in perm.iter().enumerate() {
                inv[p] = i;
            }
            self.transpose(g, &inv)
        })
    }

    /// Gather's transpose: a zero tensor whose extent along `axis` is
    /// `size`, with every slice of `updates` added at its index (repeated
    /// indices add up; out-of-range ones are dropped).
    #[track_caller]
    pub fn scatter_add(&self, indices: Value, updates: Value, axis: usize, batch_dims: usize, size: usize) -> Value {
        self.emit1(Op::Index(IndexOp::ScatterAdd { axis, batch_dims, size }), &[indices, updates])
    }

    /// Inclusive prefix sums along `axis` (suffix sums when `reverse`).
    #[track_caller]
    pub fn cumsum(&self, x: Value, axis: isize, reverse: bool) -> Value {
        self.scope("cumsum", || {
            let Some(t) = self.input("cumsum", x) else { return self.poison() };
            let Some(dim) = self.axis("cumsum", &t, axis) else { return self.poison() };
            self.emit1(Op::Index(IndexOp::Cumsum { dim, reverse }), &[x])
        })
    }

    /// The `k` largest elements along the last dimension and their `i32`
    /// positions, largest first (ties: the lower position first; NaN ranks
    /// highest), as `(values, indices)`.
    #[track_caller]
    pub fn top_k(&self, x: Value, k: usize) -> (Value, Value) {
        self.scope("top_k", || {
            let Some(t) = self.input("top_k", x) else { return (self.poison(), self.poison()) };
            let idx = self.emit1(Op::Index(IndexOp::TopK { k }), &[x]);
            if t.rank() == 0 {
                return (self.poison(), idx);
            }
            let last = t.rank() - 1;
            (self.emit1(Op::Index(IndexOp::Gather { axis: last, batch_dims: last }), &[x, idx]), idx)
        })
    }
}

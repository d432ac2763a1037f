//! Contractions: the primitive `dot_general`, NumPy-semantics `matmul`, and
//! the dense layer `linear`.
//!
//! `matmul` chooses dimension numbers so that no operand is materialized
//! larger than it is: a rank-2 right operand (a weight) is contracted
//! directly against any number of leading dims of the left one instead of
//! being broadcast over them. Only genuinely batched products with
//! different batch shapes get broadcasts.

use super::{broadcast_shapes, FunctionBuilder, Value};
use crate::{DotDims, Op};

impl FunctionBuilder {
    /// General contraction with explicit dimension numbers. The result's
    /// dimensions are: batch, lhs free, rhs free.
    #[track_caller]
    pub fn dot_general(&self, a: Value, b: Value, dims: DotDims) -> Value {
        self.emit1(Op::DotGeneral(dims), &[a, b])
    }

    /// Matrix product with `numpy.matmul` semantics: `a[..., m, k] @
    /// b[..., k, n] -> [..., m, n]`, where the leading (batch) dims
    /// broadcast; a 1-D `a` is a row vector and a 1-D `b` a column vector
    /// whose added dimension is removed from the result (`[k] @ [k]` is a
    /// scalar).
    #[track_caller]
    pub fn matmul(&self, a: Value, b: Value) -> Value {
        self.scope("matmul", || {
            let Some(ta) = self.input("matmul", a) else { return self.poison() };
            let Some(tb) = self.input("matmul", b) else { return self.poison() };
            let (ra, rb) = (ta.rank(), tb.rank());
            if ra == 0 || rb == 0 {
                self.fail("matmul", format!("operands must have rank >= 1, got {ta} and {tb}"));
                return self.poison();
            }
            let kb = if rb == 1 { 0 } else { rb - 2 };
            if ta.shape[ra - 1] != tb.shape[kb] {
                self.fail("matmul", format!("contracting extents differ: {ta} @ {tb}"));
                return self.poison();
            }
            let contract = |lc: usize, rc: usize| DotDims {
                lhs_batch: vec![],
                rhs_batch: vec![],
                lhs_contract: vec![lc],
                rhs_contract: vec![rc],
            };
            if ra <= 2 || rb <= 2 {
                // No batch dims on at least one side: contract directly.
                let r = self.dot_general(a, b, contract(ra - 1, kb));
                if ra == 2 && rb > 2 {
                    // [m, batch.., n] -> [batch.., m, n]
                    let mut perm: Vec<usize> = (1..rb - 1).collect();
                    perm.extend([0, rb - 1]);
                    return self.transpose(r, &perm);
                }
                return r;
            }
            let (ba, bb) = (&ta.shape[..ra - 2], &tb.shape[..rb - 2]);
            let batch = match broadcast_shapes(ba, bb) {
                Ok(s) => s,
                Err(_) => {
                    self.fail("matmul", format!("batch dimensions of {ta} and {tb} cannot be broadcast together"));
                    return self.poison();
                }
            };
            let with = |tail: &[usize]| [batch.as_slice(), tail].concat();
            let a = self.broadcast_to(a, &with(&ta.shape[ra - 2..]));
            let b = self.broadcast_to(b, &with(&tb.shape[rb - 2..]));
            let nb = batch.len();
            let dims = DotDims {
                lhs_batch: (0..nb).collect(),
                rhs_batch: (0..nb).collect(),
                lhs_contract: vec![nb + 1],
                rhs_contract: vec![nb],
            };
            self.dot_general(a, b, dims)
        })
    }

    /// A dense layer: `x[..., in] @ w[in, out] (+ b[out])`.
    #[track_caller]
    pub fn linear(&self, x: Value, w: Value, b: Option<Value>) -> Value {
        self.scope("linear", || {
            let Some(tx) = self.input("linear", x) else { return self.poison() };
            let Some(tw) = self.input("linear", w) else { return self.poison() };
            if tx.rank() == 0 || tw.rank() != 2 || tx.shape[tx.rank() - 1] != tw.shape[0] {
                self.fail("linear", format!("needs x[..., in] and w[in, out], got {tx} and {tw}"));
                return self.poison();
            }
            let y = self.matmul(x, w);
            let Some(b) = b else { return y };
            let Some(tb) = self.input("linear", b) else { return self.poison() };
            if tb.shape != [tw.shape[1]] {
                self.fail("linear", format!("bias must be [{}] for w {tw}, got {tb}", tw.shape[1]));
                return self.poison();
            }
            self.add(y, b)
        })
    }
}

//! The fused elementwise kernel: a whole chain per element, in registers.
//!
//! The chain arrives as a compile-time expression ([`FusedExpr`]): a list
//! of nodes, each an input read or a float op on earlier nodes, followed by
//! its rounding. The kernel walks the list at expansion time (the loop is
//! unrolled), keeping node values in a `Sequence` of registers, so each
//! distinct chain compiles to straight-line code: one load per input, the
//! ops, one store.

use super::elementwise::{float_binary_op, float_unary_op, BinaryF, UnaryF};
use super::round::apply_rounding;
use super::storage::Rounding;
use cubecl::prelude::*;

/// One node of a fused expression; operands index earlier nodes.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum FusedOp {
    /// Load of input `k` at the thread's element.
    Input(usize),
    /// A float unary op.
    Unary(UnaryF, usize),
    /// A float binary op.
    Binary(BinaryF, usize, usize),
}

/// A fused chain: the nodes with their result rounding; the last is the
/// result.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FusedExpr {
    /// The nodes, in evaluation order.
    pub nodes: Vec<(FusedOp, Rounding)>,
}

#[cube]
fn eval_node<F: Float>(inputs: &Sequence<Array<F>>, regs: &Sequence<F>, i: usize, #[comptime] op: FusedOp) -> F {
    match op {
        FusedOp::Input(k) => inputs.index(k)[i],
        FusedOp::Unary(u, a) => float_unary_op::<F>(*regs.index(a), u),
        FusedOp::Binary(b, x, y) => float_binary_op::<F>(*regs.index(x), *regs.index(y), b),
    }
}

/// `out[i] = expr(inputs[..][i])`.
#[cube(launch)]
pub fn fused_float<F: Float>(inputs: &Sequence<Array<F>>, out: &mut Array<F>, #[comptime] expr: FusedExpr) {
    let i = ABSOLUTE_POS;
    if i < out.len() {
        let mut regs = Sequence::<F>::new();
        let n = comptime![expr.nodes.len()];
        #[unroll]
        for k in 0..n {
            let (op, rnd) = comptime![expr.nodes[k].clone()];
            let v = eval_node::<F>(inputs, &regs, i, op);
            regs.push(apply_rounding::<F>(v, rnd));
        }
        out[i] = *regs.index(n - 1);
    }
}

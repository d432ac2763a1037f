//! The fused elementwise kernel: a whole chain per element, in registers.
//!
//! The chain arrives as a compile-time expression ([`FusedExpr`]): a list
//! of nodes, each an input read (of the thread's element, of a rank-0
//! input's only element - a splat - or through a broadcast's index map),
//! or an op on earlier nodes (float ops, comparisons, selects, boolean
//! not), followed by its rounding. Boolean inputs arrive in a sequence of
//! their own (stored as `u32`) and live in registers as 0 and 1. The
//! kernel walks the list at expansion time (the loop is unrolled), keeping
//! node values in a `Sequence` of registers, so each distinct chain
//! compiles to straight-line code: one load per input, the ops, one store
//! per value written (the result, and the values the chain keeps for later
//! steps, each to its own slot of one output array).

use super::elementwise::{compare_op, float_binary_op, float_unary_op, BinaryF, Cmp, UnaryF};
use super::math::{is_inf, is_nan};
use super::round::apply_rounding;
use super::storage::Rounding;
use cubecl::prelude::*;

/// Which input sequence a load reads, and the input's index in it.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Source {
    /// A float input.
    Float(usize),
    /// A boolean input (stored 0/1).
    Mask(usize),
}

/// Which element of its input a load reads for the thread's element `i`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Access {
    /// Element `i` (an input of the chain's shape).
    Element,
    /// The only element (a rank-0 input spread over the chain: a splat).
    Scalar,
    /// Through a broadcast: the element at `Σ ((i / pitch) % extent) *
    /// stride` over the `(pitch, extent, stride)` of each result dimension
    /// the operand varies along.
    Broadcast(Vec<(usize, usize, usize)>),
}

/// One node of a fused expression; operands index earlier nodes. Boolean
/// values (comparisons, masks) live in the float registers as 0 and 1.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum FusedOp {
    /// A load of an input.
    Load(Source, Access),
    /// A float unary op.
    Unary(UnaryF, usize),
    /// A float binary op.
    Binary(BinaryF, usize, usize),
    /// A comparison, as 0/1.
    Compare(Cmp, usize, usize),
    /// `select(pred, on_true, on_false)`.
    Select(usize, usize, usize),
    /// Logical not of a 0/1 value.
    Not(usize),
    /// Whether a float is not zero (NaN is), as 0/1: a float to `bool`.
    NonZero(usize),
    /// Whether a float is finite, as 0/1.
    IsFinite(usize),
}

/// A fused chain: the nodes with their result rounding, and the nodes
/// whose values the kernel writes.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FusedExpr {
    /// The nodes, in evaluation order.
    pub nodes: Vec<(FusedOp, Rounding)>,
    /// The nodes written, each to its own slot of the output: node
    /// `stores[s]` at `out[s * pitch + i]`.
    pub stores: Vec<usize>,
    /// The distance between two slots of the output, in elements.
    pub pitch: usize,
}

#[cube]
#[allow(clippy::needless_range_loop)] // an unrolled loop over a compile-time list
fn index(i: usize, #[comptime] access: Access) -> usize {
    match access {
        Access::Element => i,
        Access::Scalar => 0usize,
        Access::Broadcast(map) => {
            let mut at = 0usize;
            let n = comptime![map.len()];
            #[unroll]
            for j in 0..n {
                let (pitch, extent, stride) = comptime![map[j]];
                at += ((i / pitch) % extent) * stride;
            }
            at
        }
    }
}

#[cube]
fn flag<F: Float>(b: bool) -> F {
    select(b, F::new(1.0), F::new(0.0))
}

#[cube]
fn eval_node<F: Float>(
    inputs: &Sequence<Array<F>>,
    masks: &Sequence<Array<u32>>,
    regs: &Sequence<F>,
    i: usize,
    #[comptime] op: FusedOp,
) -> F {
    match op {
        FusedOp::Load(Source::Float(k), access) => inputs.index(k)[index(i, access)],
        FusedOp::Load(Source::Mask(k), access) => F::cast_from(masks.index(k)[index(i, access)]),
        FusedOp::Unary(u, a) => float_unary_op::<F>(*regs.index(a), u),
        FusedOp::Binary(b, x, y) => float_binary_op::<F>(*regs.index(x), *regs.index(y), b),
        FusedOp::Compare(c, x, y) => flag::<F>(compare_op::<F>(*regs.index(x), *regs.index(y), c)),
        FusedOp::Select(p, t, f) => select(*regs.index(p) != F::new(0.0), *regs.index(t), *regs.index(f)),
        FusedOp::Not(a) => F::new(1.0) - *regs.index(a),
        FusedOp::NonZero(a) => flag::<F>(!(*regs.index(a) == F::new(0.0))),
        FusedOp::IsFinite(a) => flag::<F>(!(is_nan::<F>(*regs.index(a)) || is_inf::<F>(*regs.index(a)))),
    }
}

/// The values of every node of `expr` at element `i`, in order (the
/// registers: one per node).
#[cube]
fn registers<F: Float>(
    inputs: &Sequence<Array<F>>,
    masks: &Sequence<Array<u32>>,
    i: usize,
    #[comptime] expr: FusedExpr,
) -> Sequence<F> {
    let mut regs = Sequence::<F>::new();
    let n = comptime![expr.nodes.len()];
    #[unroll]
    for k in 0..n {
        let (op, rnd) = comptime![expr.nodes[k].clone()];
        let v = eval_node::<F>(inputs, masks, &regs, i, op);
        regs.push(apply_rounding::<F>(v, rnd));
    }
    regs
}

/// The value of node `expr.stores[0]` at element `i`: what a reduction
/// reads (a plain one's expression is a load of its operand).
#[cube]
pub fn chain_value<F: Float>(
    inputs: &Sequence<Array<F>>,
    masks: &Sequence<Array<u32>>,
    i: usize,
    #[comptime] expr: FusedExpr,
) -> F {
    let at = comptime![expr.stores[0]];
    let regs = registers::<F>(inputs, masks, i, expr);
    *regs.index(at)
}

/// `out[s * pitch + i] = node stores[s] of expr(inputs[..][i],
/// masks[..][i])` for each slot `s`; `len` elements per slot.
#[cube(launch)]
#[allow(clippy::needless_range_loop)] // an unrolled loop over a compile-time list
pub fn fused_float<F: Float>(
    inputs: &Sequence<Array<F>>,
    masks: &Sequence<Array<u32>>,
    out: &mut Array<F>,
    len: usize,
    #[comptime] expr: FusedExpr,
) {
    let i = ABSOLUTE_POS;
    if i < len {
        let slots = comptime![expr.stores.len()];
        let pitch = comptime![expr.pitch];
        let stores = comptime![expr.stores.clone()];
        let regs = registers::<F>(inputs, masks, i, expr);
        #[unroll]
        for s in 0..slots {
            let at = comptime![s * pitch];
            out[at + i] = *regs.index(comptime![stores[s]]);
        }
    }
}

impl FusedExpr {
    /// A plain load of float input 0 at each element: what a reduction of
    /// a stored operand reads.
    pub fn operand() -> FusedExpr {
        FusedExpr {
            nodes: vec![(FusedOp::Load(Source::Float(0), Access::Element), Rounding::None)],
            stores: vec![0],
            pitch: 0,
        }
    }
}

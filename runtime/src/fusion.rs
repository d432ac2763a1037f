//! Fusion of elementwise chains: several compute steps run as one kernel.
//!
//! A device program computes e.g. `gelu(x @ w + b)` as a dot followed by a
//! handful of elementwise steps, each reading and writing a whole buffer.
//! On a GPU the elementwise part is bound by memory traffic, so computing
//! the whole chain per element in registers - one read of each input, one
//! write of the result, no intermediate buffers - is the classic win.
//!
//! [`plan_fusion`] finds *chains*: runs of consecutive elementwise compute
//! steps of one shape (free steps may sit between them) whose intermediate
//! results are used only inside the run. A backend that wants them
//! ([`crate::Backend::fusion`]) gets each chain as one
//! [`crate::Backend::compute_fused`] call at the chain's last step; the
//! chain's intermediates are never allocated, and frees inside the run are
//! applied after it. The default `compute_fused`
//! ([`crate::backend::compute_unfused`]) runs the nodes one by one,
//! so fusion never changes what is computed, only how.
//!
//! A backend may also ask for *splats* in chains ([`FusionOptions::splats`]):
//! a `broadcast_in_dim` of a scalar (no `dims`) and a splat `constant` of
//! the chain's shape. An optimizer update spreads the learning rate over
//! every parameter each step (`w - broadcast(lr) * g`); fused, the spread
//! value is a register or a cache-sized block instead of a whole tensor
//! written and read back once per parameter. A chain's inputs may then
//! include rank-0 buffers, read only by its broadcast nodes. A GPU backend
//! also asks for *broadcasts* ([`FusionOptions::broadcasts`]): any
//! `broadcast_in_dim` that keeps its operand's dimension order (a bias
//! spread over rows, a layer norm's statistics spread over features), whose
//! operand, of another shape, is then a chain input read through the
//! broadcast's index map.

use std::collections::HashSet;
use std::ops::RangeInclusive;
use weft_ir::device::{BufferId, DeviceProgram, Step};
use weft_ir::{Op, TensorType};

/// Where a node's operand comes from.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Arg {
    /// The chain's input `k` (see [`FusedChain::inputs`]).
    Input(usize),
    /// An earlier node's value.
    Node(usize),
}

/// One op of a chain.
#[derive(Clone, Debug, PartialEq)]
pub struct FusedNode {
    /// The elementwise op.
    pub op: Op,
    /// Its operands.
    pub args: Vec<Arg>,
    /// Its result type.
    pub ty: TensorType,
}

/// Elementwise steps computed together.
#[derive(Clone, Debug, PartialEq)]
pub struct FusedChain {
    /// The buffers the chain reads, in first-use order.
    pub inputs: Vec<BufferId>,
    /// The ops, in program order; the last one's value is the result. With
    /// [`FusionOptions::reductions`] the last may be a `reduce` of the one
    /// before it (every other node has the chain's shape).
    pub nodes: Vec<FusedNode>,
    /// The buffer that receives the result.
    pub output: BufferId,
    /// The buffers of the intermediate values (never allocated).
    pub intermediates: Vec<BufferId>,
    /// The steps the chain covers (its first to its last compute step).
    pub steps: RangeInclusive<usize>,
}

/// Which steps [`plan_fusion_with`] puts in chains (a backend's choice).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct FusionOptions {
    /// Plan chains of elementwise steps at all.
    pub elementwise: bool,
    /// Also take splats into chains: `broadcast_in_dim` of a rank-0 value
    /// with no `dims`, and splat `constant`s.
    pub splats: bool,
    /// Also end a chain with the `reduce` that is its value's only reader
    /// (a squared norm `sum(g * g)`: the squares are never stored).
    pub reductions: bool,
    /// Hand a chain the input it reads last, when that has the result's
    /// type, to write its result into
    /// ([`crate::Backend::compute_fused_into`]).
    pub in_place: bool,
    /// Also take any `broadcast_in_dim` that keeps its operand's dimension
    /// order (increasing `dims`) into chains: its operand, of another
    /// shape, becomes a chain input read through the broadcast's index
    /// map (a bias or a layer norm's statistics spread over rows).
    pub broadcasts: bool,
}

impl FusionOptions {
    /// No fusion.
    pub const NONE: FusionOptions =
        FusionOptions { elementwise: false, splats: false, reductions: false, in_place: false, broadcasts: false };
    /// Elementwise chains only (what every fusing backend understands).
    pub const ELEMENTWISE: FusionOptions =
        FusionOptions { elementwise: true, splats: false, reductions: false, in_place: false, broadcasts: false };
    /// Elementwise chains with their splats, ended by their reductions,
    /// computed in place where they can (what the fast CPU backend takes;
    /// not broadcasts).
    pub const ALL: FusionOptions =
        FusionOptions { elementwise: true, splats: true, reductions: true, in_place: true, broadcasts: false };
}

/// Whether `op` spreads one value over its result: a scalar broadcast
/// (reading a rank-0 operand) or a splat constant.
pub fn is_splat(op: &Op) -> bool {
    match op {
        Op::BroadcastInDim { dims, .. } => dims.is_empty(),
        Op::Constant(l) => matches!(l.data, weft_ir::LiteralData::Splat(_)),
        _ => false,
    }
}

/// Whether `op` is a `broadcast_in_dim` that keeps its operand's
/// dimensions in order (what [`FusionOptions::broadcasts`] takes).
pub fn is_ordered_broadcast(op: &Op) -> bool {
    matches!(op, Op::BroadcastInDim { dims, .. } if dims.windows(2).all(|w| w[0] < w[1]))
}

fn fusible(s: &Step, opts: FusionOptions) -> Option<(&Op, &[BufferId], BufferId)> {
    match s {
        Step::Compute { op, inputs, outputs }
            if outputs.len() == 1
                && (op.is_elementwise()
                    || (opts.splats && is_splat(op))
                    || (opts.broadcasts && is_ordered_broadcast(op))) =>
        {
            Some((op, inputs, outputs[0]))
        }
        _ => None,
    }
}

/// The buffers a step reads.
fn reads(s: &Step) -> Vec<BufferId> {
    match s {
        Step::Compute { inputs, .. } => inputs.clone(),
        Step::ShardSlice { input, .. } | Step::Collective { input, .. } => vec![*input],
        Step::Free(_) => vec![],
    }
}

/// The fusible elementwise chains of `p` (at least two compute steps each,
/// not overlapping, in program order).
pub fn plan_fusion(p: &DeviceProgram) -> Vec<FusedChain> {
    plan_fusion_with(p, FusionOptions::ELEMENTWISE)
}

/// The chains of `p` that `opts` allows (none unless `opts.elementwise`).
pub fn plan_fusion_with(p: &DeviceProgram, opts: FusionOptions) -> Vec<FusedChain> {
    if !opts.elementwise {
        return Vec::new();
    }
    let mut readers: Vec<Vec<usize>> = vec![Vec::new(); p.buffers.len()];
    for (i, s) in p.steps.iter().enumerate() {
        for b in reads(s) {
            readers[b.index()].push(i);
        }
    }
    let outputs: HashSet<BufferId> = p.outputs.iter().copied().collect();
    let mut chains = Vec::new();
    let mut i = 0;
    while i < p.steps.len() {
        match chain_at(p, i, &readers, &outputs, opts) {
            Some(c) => {
                i = *c.steps.end() + 1;
                chains.push(c);
            }
            None => i += 1,
        }
    }
    chains
}

/// The longest valid chain starting at step `start`, if it has two or more
/// compute steps.
fn chain_at(
    p: &DeviceProgram,
    start: usize,
    readers: &[Vec<usize>],
    outputs: &HashSet<BufferId>,
    opts: FusionOptions,
) -> Option<FusedChain> {
    let (op, ins, first_out) = fusible(&p.steps[start], opts)?;
    let shape = &p.ty(first_out).shape;
    // Operands have the chain's shape, but a splat's: rank 0 or none.
    let fits = |op: &Op, ins: &[BufferId]| {
        if is_splat(op) {
            ins.iter().all(|&b| p.ty(b).shape.is_empty())
        } else if matches!(op, Op::BroadcastInDim { .. }) {
            // An ordered broadcast (`fusible` checked): any operand shape.
            true
        } else {
            ins.iter().all(|&b| &p.ty(b).shape == shape)
        }
    };
    if !fits(op, ins) {
        return None;
    }
    // Candidate members: consecutive fusible steps of one shape, skipping
    // frees, and perhaps a reduction of the last one's value to end them.
    let mut members = vec![start];
    for (k, s) in p.steps.iter().enumerate().skip(start + 1) {
        match (s, fusible(s, opts)) {
            (Step::Free(_), _) => continue,
            (_, Some((op, ins, out))) if &p.ty(out).shape == shape && fits(op, ins) => members.push(k),
            (Step::Compute { op: Op::Reduce { .. }, inputs, outputs }, _)
                if opts.reductions
                    && inputs.len() == 1
                    && outputs.len() == 1
                    && writes(&p.steps[*members.last().expect("one")]) == Some(inputs[0]) =>
            {
                members.push(k);
                break;
            }
            _ => break,
        }
    }
    // Longest prefix whose intermediates are read only by later members.
    while members.len() >= 2 {
        let valid = members[..members.len() - 1].iter().all(|&m| {
            let (_, _, out) = member(&p.steps[m], opts).expect("member");
            !outputs.contains(&out) && readers[out.index()].iter().all(|r| members.contains(r) && *r > m)
        });
        if valid {
            return Some(build(p, &members, opts));
        }
        members.pop();
    }
    None
}

/// The one buffer a compute step writes.
fn writes(s: &Step) -> Option<BufferId> {
    match s {
        Step::Compute { outputs, .. } if outputs.len() == 1 => Some(outputs[0]),
        _ => None,
    }
}

/// A chain member: an elementwise or splat step, or the reduction ending it.
fn member(s: &Step, opts: FusionOptions) -> Option<(&Op, &[BufferId], BufferId)> {
    match s {
        Step::Compute { op: op @ Op::Reduce { .. }, inputs, outputs } if opts.reductions && outputs.len() == 1 => {
            Some((op, inputs, outputs[0]))
        }
        _ => fusible(s, opts),
    }
}

fn build(p: &DeviceProgram, members: &[usize], opts: FusionOptions) -> FusedChain {
    let mut inputs: Vec<BufferId> = Vec::new();
    let mut produced: Vec<BufferId> = Vec::new();
    let mut nodes = Vec::with_capacity(members.len());
    for &m in members {
        let (op, ins, out) = member(&p.steps[m], opts).expect("member");
        let args = ins
            .iter()
            .map(|b| match produced.iter().position(|x| x == b) {
                Some(n) => Arg::Node(n),
                None => Arg::Input(inputs.iter().position(|x| x == b).unwrap_or_else(|| {
                    inputs.push(*b);
                    inputs.len() - 1
                })),
            })
            .collect();
        nodes.push(FusedNode { op: op.clone(), args, ty: p.ty(out).clone() });
        produced.push(out);
    }
    let output = produced.pop().expect("two or more members");
    FusedChain { inputs, nodes, output, intermediates: produced, steps: members[0]..=members[members.len() - 1] }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weft_ir::device::Buffer;
    use weft_ir::{BinaryOp, DType, ReduceOp, UnaryOp};

    fn compute(op: Op, ins: &[u32], out: u32) -> Step {
        Step::Compute { op, inputs: ins.iter().map(|&b| BufferId(b)).collect(), outputs: vec![BufferId(out)] }
    }

    fn program(steps: Vec<Step>, outputs: &[u32]) -> DeviceProgram {
        let f = |s: &[usize]| Buffer { ty: TensorType::new(DType::F32, s.to_vec()), name: None };
        DeviceProgram {
            name: "p".into(),
            mesh: vec![("x".into(), 1)].into(),
            buffers: vec![f(&[4]), f(&[4]), f(&[4]), f(&[4]), f(&[4]), f(&[]), f(&[4])],
            inputs: vec![BufferId(0), BufferId(1)],
            outputs: outputs.iter().map(|&b| BufferId(b)).collect(),
            steps,
        }
    }

    #[test]
    fn chains_skip_frees_and_stop_at_escaping_values() {
        let add = Op::Binary(BinaryOp::Add);
        let p = program(
            vec![
                compute(add.clone(), &[0, 1], 2),
                Step::Free(vec![BufferId(1)]),
                compute(Op::Unary(UnaryOp::Tanh), &[2], 3),
                compute(Op::Binary(BinaryOp::Mul), &[3, 2], 4),
                Step::Free(vec![BufferId(2), BufferId(3)]),
                compute(Op::Reduce { op: ReduceOp::Sum, dims: vec![0] }, &[4], 5),
            ],
            &[5],
        );
        let c = plan_fusion(&p);
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].steps, 0..=3);
        assert_eq!(c[0].inputs, vec![BufferId(0), BufferId(1)]);
        assert_eq!(c[0].output, BufferId(4));
        assert_eq!(c[0].intermediates, vec![BufferId(2), BufferId(3)]);
        assert_eq!(c[0].nodes[2].args, vec![Arg::Node(1), Arg::Node(0)]);
        // %3 is a program output, so a chain must end at step 2; but then
        // %2 (read at step 3) would escape too: nothing fuses.
        let mut q = p.clone();
        q.outputs.push(BufferId(3));
        assert!(plan_fusion(&q).is_empty());
        // Without that second read of %2, steps 0..=2 fuse.
        q.steps[3] = compute(Op::Binary(BinaryOp::Mul), &[3, 3], 4);
        assert_eq!(plan_fusion(&q)[0].steps, 0..=2);
        // %2 is read after the run (by the reduction): no chain keeps it.
        let mut r = p.clone();
        r.steps[5] = compute(Op::Unary(UnaryOp::Neg), &[2], 6);
        r.steps.truncate(4);
        r.steps.push(compute(Op::Unary(UnaryOp::Neg), &[2], 6));
        r.outputs = vec![BufferId(4), BufferId(6)];
        let c = plan_fusion(&r);
        assert!(c.iter().all(|c| !c.intermediates.contains(&BufferId(2))), "{c:?}");
    }

    /// With [`FusionOptions::ALL`] a scalar broadcast joins the chain that
    /// reads it (its rank-0 operand becomes a chain input) and a reduction
    /// of a chain's value ends the chain; with the elementwise options
    /// neither does.
    #[test]
    fn splats_and_reductions_join_chains_only_when_asked() {
        let t = |s: &[usize]| Buffer { ty: TensorType::new(DType::F32, s.to_vec()), name: None };
        // %3 = broadcast %0; %4 = mul %3, %1; %5 = sub %2, %4;
        // %6 = mul %5, %5; %7 = reduce_sum %6 (all dims)
        let p = DeviceProgram {
            name: "p".into(),
            mesh: vec![("x".into(), 1)].into(),
            buffers: vec![t(&[]), t(&[4, 8]), t(&[4, 8]), t(&[4, 8]), t(&[4, 8]), t(&[4, 8]), t(&[4, 8]), t(&[])],
            inputs: vec![BufferId(0), BufferId(1), BufferId(2)],
            outputs: vec![BufferId(5), BufferId(7)],
            steps: vec![
                compute(Op::BroadcastInDim { dims: vec![], shape: vec![4, 8] }, &[0], 3),
                compute(Op::Binary(BinaryOp::Mul), &[3, 1], 4),
                compute(Op::Binary(BinaryOp::Sub), &[2, 4], 5),
                Step::Free(vec![BufferId(3), BufferId(4)]),
                compute(Op::Binary(BinaryOp::Mul), &[5, 5], 6),
                compute(Op::Reduce { op: ReduceOp::Sum, dims: vec![0, 1] }, &[6], 7),
            ],
        };
        let all = plan_fusion_with(&p, FusionOptions::ALL);
        assert_eq!(all.len(), 2, "{all:?}");
        assert_eq!((all[0].steps.clone(), all[0].output), (0..=2, BufferId(5)));
        assert_eq!(all[0].inputs, vec![BufferId(0), BufferId(1), BufferId(2)]);
        assert_eq!((all[1].steps.clone(), all[1].output), (4..=5, BufferId(7)));
        assert_eq!(all[1].intermediates, vec![BufferId(6)]);
        // Elementwise only: the broadcast and the reduction stay steps.
        let plain = plan_fusion(&p);
        assert_eq!(plain.len(), 1, "{plain:?}");
        assert_eq!(plain[0].steps, 1..=2);
        assert!(plan_fusion_with(&p, FusionOptions::NONE).is_empty());
        // A squared value read again after its reduction is not fused away.
        let mut q = p.clone();
        q.outputs.push(BufferId(6));
        assert!(plan_fusion_with(&q, FusionOptions::ALL).iter().all(|c| !c.intermediates.contains(&BufferId(6))));
    }

    /// Broadcasts join chains only when asked ([`FusionOptions::broadcasts`],
    /// which the CPU's [`FusionOptions::ALL`] leaves out), and only those
    /// that keep dimension order.
    #[test]
    fn ordered_broadcasts_join_chains_only_when_asked() {
        let t = |s: &[usize]| Buffer { ty: TensorType::new(DType::F32, s.to_vec()), name: None };
        let program = |dims: Vec<usize>| DeviceProgram {
            name: "p".into(),
            mesh: vec![("x".into(), 1)].into(),
            buffers: vec![t(&[3, 3]), t(&[3]), t(&[3, 3]), t(&[3, 3]), t(&[3, 3])],
            inputs: vec![BufferId(0), BufferId(1)],
            outputs: vec![BufferId(4)],
            steps: vec![
                compute(Op::BroadcastInDim { dims, shape: vec![3, 3] }, &[1], 2),
                compute(Op::Binary(BinaryOp::Add), &[0, 2], 3),
                compute(Op::Unary(UnaryOp::Neg), &[3], 4),
            ],
        };
        let asked = FusionOptions { broadcasts: true, ..FusionOptions::ELEMENTWISE };
        let c = plan_fusion_with(&program(vec![1]), asked);
        assert_eq!((c.len(), c[0].steps.clone(), c[0].inputs.clone()), (1, 0..=2, vec![BufferId(1), BufferId(0)]));
        assert_eq!(plan_fusion_with(&program(vec![1]), FusionOptions::ALL)[0].steps, 1..=2);
        assert!(is_ordered_broadcast(&Op::BroadcastInDim { dims: vec![0, 2], shape: vec![2, 2, 2] }));
        assert!(!is_ordered_broadcast(&Op::BroadcastInDim { dims: vec![1, 0], shape: vec![2, 2] }));
    }
}

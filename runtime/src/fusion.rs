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
//! include rank-0 buffers, read only by its broadcast nodes. The GPU and
//! fast CPU backends also ask for *broadcasts* ([`FusionOptions::broadcasts`]): any
//! `broadcast_in_dim` that keeps its operand's dimension order (a bias
//! spread over rows, a layer norm's statistics spread over features), whose
//! operand, of another shape, is then a chain input read through the
//! broadcast's index map.
//!
//! A GPU backend, where each launch costs microseconds of host time, also
//! asks for *kept values* ([`FusionOptions::kept`]): an intermediate
//! value that steps after the chain read (a forward value its backward
//! reads again, as GELU's `x³` and `tanh`) no longer ends the chain; the
//! chain writes it as well ([`FusedChain::kept`]). Without it each such
//! value ends a chain, and a training step's forward pass splits into
//! chains of one or two ops.

use std::collections::HashSet;
use std::ops::RangeInclusive;
use weft_ir::device::{BufferId, DeviceProgram, Step};
use weft_ir::{DType, Op, TensorType};

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
    /// The values the chain also writes besides its result (read after
    /// it; only with [`FusionOptions::kept`]): each node's index and its
    /// buffer, in node order.
    pub kept: Vec<(usize, BufferId)>,
    /// Its compute steps, in order: every step from the first to the last
    /// but frees, unless the chain reaches across other steps
    /// ([`FusionOptions::across`]).
    pub members: Vec<usize>,
}

impl FusedChain {
    /// The steps the chain covers: its first to its last member.
    pub fn steps(&self) -> RangeInclusive<usize> {
        self.members[0]..=self.members[self.members.len() - 1]
    }
}

/// Which steps [`plan_fusion_with`] puts in chains (a backend's choice).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
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
    /// map (a bias or a layer norm's statistics spread over rows); and a
    /// `select` whose predicate is a scalar (read once, as a splat).
    pub broadcasts: bool,
    /// Let a chain go on past an intermediate value that later steps read:
    /// the chain writes that value too ([`FusedChain::kept`]), and the
    /// backend's [`crate::Backend::compute_fused`] returns it after the
    /// result.
    pub kept: bool,
    /// With [`FusionOptions::kept`], also go on past a program output. A
    /// GPU takes it (each chain is a launch); the CPU does not: there an
    /// output is an updated parameter or moment, whose chain writes over
    /// the old value in place, and a chain that went on would join the
    /// next parameter's independent update and lose that.
    pub kept_outputs: bool,
    /// Let a chain reach across up to [`MAX_GAP`] compute steps in a row
    /// that read none of its values (and read at most [`MAX_INPUTS`]
    /// buffers): a running sum of per-parameter norms, or a residual add
    /// with a bias's conversion between its steps, still forms one chain.
    pub across: bool,
    /// Plan only chains one float kernel runs: every value a float of one
    /// width (`f64`, or the narrower floats) or a `bool`, and the result
    /// and kept values floats. A backend whose fused kernel is float-only
    /// (the GPU's) would otherwise run the others node by node: an
    /// integer step counter joined to a norm's sums, or a kept `bool` mask.
    pub float_kernels: bool,
    /// The most buffers one chain's kernel may bind: the chain's inputs,
    /// one per splat `constant` (a backend that reads each from a rank-0
    /// buffer), and [`CHAIN_OWN_BINDINGS`] of its own. A device limits
    /// this (Vulkan: `maxPerStageDescriptorStorageBuffers`, 32 on
    /// lavapipe), and a kernel past it fails to build; `usize::MAX` for
    /// none.
    pub max_bindings: usize,
}

/// Bindings a chain's kernel takes besides its inputs and constants: the
/// one allocation holding its result and kept values, and the runtime's
/// metadata buffer.
pub const CHAIN_OWN_BINDINGS: usize = 2;

impl FusionOptions {
    /// No fusion.
    pub const NONE: FusionOptions = FusionOptions {
        elementwise: false,
        splats: false,
        reductions: false,
        in_place: false,
        broadcasts: false,
        kept: false,
        kept_outputs: false,
        across: false,
        float_kernels: false,
        max_bindings: usize::MAX,
    };
    /// Elementwise chains only (what every fusing backend understands).
    pub const ELEMENTWISE: FusionOptions = FusionOptions { elementwise: true, ..FusionOptions::NONE };
    /// Elementwise chains with their splats, ended by their reductions,
    /// computed in place where they can (the fast CPU backend takes these
    /// and broadcasts).
    pub const ALL: FusionOptions =
        FusionOptions { elementwise: true, splats: true, reductions: true, in_place: true, ..FusionOptions::NONE };
}

impl Default for FusionOptions {
    /// [`FusionOptions::NONE`].
    fn default() -> Self {
        FusionOptions::NONE
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
                    || (opts.splats && op.is_splat())
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
        Step::ShardSlice { input, .. } | Step::Collective { input, .. } | Step::Start { input, .. } => vec![*input],
        Step::Done(_) | Step::Free(_) => vec![],
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
    let mut chains: Vec<FusedChain> = Vec::new();
    // The steps already in a chain (a chain that reaches across steps may
    // leave some inside its range to later chains).
    let mut claimed = vec![false; p.steps.len()];
    for i in 0..p.steps.len() {
        if claimed[i] {
            continue;
        }
        if let Some(c) = chain_at(p, i, &readers, &outputs, &claimed, opts) {
            c.members.iter().for_each(|&m| claimed[m] = true);
            chains.push(c);
        }
    }
    chains
}

/// The most compute steps in a row a chain reaches across
/// ([`FusionOptions::across`]).
pub const MAX_GAP: usize = 4;
/// The most inputs a chain that reaches across steps reads (each is one
/// kernel argument).
pub const MAX_INPUTS: usize = 16;

/// The longest valid chain starting at step `start`, if it has two or more
/// compute steps.
fn chain_at(
    p: &DeviceProgram,
    start: usize,
    readers: &[Vec<usize>],
    outputs: &HashSet<BufferId>,
    claimed: &[bool],
    opts: FusionOptions,
) -> Option<FusedChain> {
    let (op, ins, first_out) = fusible(&p.steps[start], opts)?;
    let shape = &p.ty(first_out).shape;
    // Operands have the chain's shape, but a splat's: rank 0 or none.
    let fits = |op: &Op, ins: &[BufferId]| {
        if op.is_splat() {
            ins.iter().all(|&b| p.ty(b).shape.is_empty())
        } else if matches!(op, Op::BroadcastInDim { .. }) {
            // An ordered broadcast (`fusible` checked): any operand shape.
            true
        } else if matches!(op, Op::Select) && opts.broadcasts {
            // A scalar predicate is spread over the branches, as a splat.
            let pred = &p.ty(ins[0]).shape;
            (pred.is_empty() || pred == shape) && ins[1..].iter().all(|&b| &p.ty(b).shape == shape)
        } else {
            ins.iter().all(|&b| &p.ty(b).shape == shape)
        }
    };
    if !fits(op, ins) {
        return None;
    }
    // Candidate members: consecutive fusible steps of one shape, skipping
    // frees, and perhaps a reduction of the last one's value to end them.
    // With `across`, a few compute steps in a row that read no member's
    // value are passed over: they run before the chain, which runs at its
    // last member.
    // With `float_kernels`: the chain's float class (`Class::Wide` or
    // `Class::Narrow`), set by the first float among its values.
    let mut class: Option<Class> = None;
    if !admits(p, ins, first_out, &mut class, opts) {
        return None;
    }
    let mut members = vec![start];
    let mut produced: HashSet<BufferId> = HashSet::from([first_out]);
    let mut read: HashSet<BufferId> = ins.iter().copied().collect();
    let mut gap = 0;
    let mut constants = usize::from(is_splat_constant(op));
    if read.len() + constants + CHAIN_OWN_BINDINGS > opts.max_bindings {
        return None;
    }
    for (k, s) in p.steps.iter().enumerate().skip(start + 1) {
        let free = !claimed[k];
        // The chain's inputs with this step's, and its bindings then
        // (see `FusionOptions::max_bindings`).
        let room = |op: &Op, ins: &[BufferId]| {
            let outside = read.union(&ins.iter().copied().collect()).filter(|b| !produced.contains(b)).count();
            let constants = constants + usize::from(is_splat_constant(op));
            (!opts.across || outside <= MAX_INPUTS) && outside + constants + CHAIN_OWN_BINDINGS <= opts.max_bindings
        };
        match (s, fusible(s, opts)) {
            (Step::Free(_), _) => continue,
            (_, Some((op, ins, out)))
                if free
                    && &p.ty(out).shape == shape
                    && fits(op, ins)
                    && room(op, ins)
                    && admits(p, ins, out, &mut class, opts) =>
            {
                members.push(k);
                constants += usize::from(is_splat_constant(op));
                produced.insert(out);
                read.extend(ins.iter().copied());
                gap = 0;
            }
            (Step::Compute { op: Op::Reduce { .. }, inputs, outputs }, _)
                if free
                    && opts.reductions
                    && inputs.len() == 1
                    && outputs.len() == 1
                    && writes(&p.steps[*members.last().expect("one")]) == Some(inputs[0]) =>
            {
                members.push(k);
                break;
            }
            (Step::Compute { inputs, .. }, _)
                if opts.across && gap < MAX_GAP && !inputs.iter().any(|b| produced.contains(b)) =>
            {
                gap += 1;
            }
            _ => break,
        }
    }
    // Longest prefix whose intermediates are read only by later members
    // (or, with kept values, by later members and steps after the chain).
    while members.len() >= 2 {
        let last = *members.last().expect("two or more");
        let float = |b: BufferId| !opts.float_kernels || p.ty(b).dtype.is_float();
        let valid = members[..members.len() - 1].iter().all(|&m| {
            let (_, _, out) = member(&p.steps[m], opts).expect("member");
            let later = |r: &usize| (members.contains(r) && *r > m) || (opts.kept && *r > last);
            let kept = escapes(out, last, readers, outputs);
            (opts.kept && opts.kept_outputs || !outputs.contains(&out))
                && readers[out.index()].iter().all(later)
                && (!kept || float(out))
        }) && writes(&p.steps[last]).is_some_and(float);
        if valid {
            return Some(build(p, &members, opts, readers, outputs));
        }
        members.pop();
    }
    None
}

/// Whether `op` is a splat `constant` (a backend may bind one buffer for it).
fn is_splat_constant(op: &Op) -> bool {
    matches!(op, Op::Constant(_)) && op.is_splat()
}

/// The float class of a value, for [`FusionOptions::float_kernels`].
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Class {
    /// `f64`.
    Wide,
    /// The other floats (`f32` and the half types).
    Narrow,
    /// `bool` (fits either).
    Flag,
}

/// The class of `d`; `None` for integers.
fn class_of(d: DType) -> Option<Class> {
    match d {
        DType::F64 => Some(Class::Wide),
        DType::Bool => Some(Class::Flag),
        d if d.is_float() => Some(Class::Narrow),
        _ => None,
    }
}

/// Whether a step reading `ins` and writing `out` may join a chain of
/// float class `class` (which it sets, if still open); always, without
/// [`FusionOptions::float_kernels`].
fn admits(p: &DeviceProgram, ins: &[BufferId], out: BufferId, class: &mut Option<Class>, opts: FusionOptions) -> bool {
    if !opts.float_kernels {
        return true;
    }
    for &b in ins.iter().chain([&out]) {
        match (class_of(p.ty(b).dtype), *class) {
            (None, _) => return false,
            (Some(Class::Flag), _) => {}
            (Some(c), None) => *class = Some(c),
            (Some(c), Some(k)) if c != k => return false,
            _ => {}
        }
    }
    true
}

/// Whether `b`, computed in a chain whose last member is step `last`, is
/// read after the chain or returned by the program (a kept value).
fn escapes(b: BufferId, last: usize, readers: &[Vec<usize>], outputs: &HashSet<BufferId>) -> bool {
    outputs.contains(&b) || readers[b.index()].iter().any(|&r| r > last)
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

fn build(
    p: &DeviceProgram,
    members: &[usize],
    opts: FusionOptions,
    readers: &[Vec<usize>],
    outputs: &HashSet<BufferId>,
) -> FusedChain {
    let last = members[members.len() - 1];
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
    // Values read after the chain, or program outputs, are kept.
    let kept: Vec<(usize, BufferId)> = produced
        .iter()
        .enumerate()
        .filter(|&(_, &b)| escapes(b, last, readers, outputs))
        .map(|(n, &b)| (n, b))
        .collect();
    let intermediates = produced.into_iter().filter(|&b| !escapes(b, last, readers, outputs)).collect();
    FusedChain { inputs, nodes, output, intermediates, kept, members: members.to_vec() }
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
        assert_eq!(c[0].steps(), 0..=3);
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
        assert_eq!(plan_fusion(&q)[0].steps(), 0..=2);
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
        assert_eq!((all[0].steps(), all[0].output), (0..=2, BufferId(5)));
        assert_eq!(all[0].inputs, vec![BufferId(0), BufferId(1), BufferId(2)]);
        assert_eq!((all[1].steps(), all[1].output), (4..=5, BufferId(7)));
        assert_eq!(all[1].intermediates, vec![BufferId(6)]);
        // Elementwise only: the broadcast and the reduction stay steps.
        let plain = plan_fusion(&p);
        assert_eq!(plain.len(), 1, "{plain:?}");
        assert_eq!(plain[0].steps(), 1..=2);
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
        assert_eq!((c.len(), c[0].steps(), c[0].inputs.clone()), (1, 0..=2, vec![BufferId(1), BufferId(0)]));
        assert_eq!(plan_fusion_with(&program(vec![1]), FusionOptions::ALL)[0].steps(), 1..=2);
        assert!(is_ordered_broadcast(&Op::BroadcastInDim { dims: vec![0, 2], shape: vec![2, 2, 2] }));
        assert!(!is_ordered_broadcast(&Op::BroadcastInDim { dims: vec![1, 0], shape: vec![2, 2] }));
    }

    /// With [`FusionOptions::kept`], values read after the chain (or
    /// program outputs) no longer end it: the chain writes them as well;
    /// without, the same program splits where they escape.
    #[test]
    fn kept_values_let_chains_go_on() {
        let add = Op::Binary(BinaryOp::Add);
        // %2 = add %0, %1; %3 = tanh %2; %4 = mul %3, %2;
        // %6 = neg %3 (a later reader of %3: in the real step, a backward op)
        let mut p = program(
            vec![
                compute(add, &[0, 1], 2),
                compute(Op::Unary(UnaryOp::Tanh), &[2], 3),
                compute(Op::Binary(BinaryOp::Mul), &[3, 2], 4),
                Step::Free(vec![BufferId(2)]),
                compute(Op::Reduce { op: ReduceOp::Sum, dims: vec![0] }, &[4], 5),
                compute(Op::Unary(UnaryOp::Neg), &[3], 6),
            ],
            &[5, 6],
        );
        // Without: steps 0..=2 would let %3 escape, 0..=1 %2 (read by the
        // mul), 1..=2 %3 again: nothing fuses.
        assert!(plan_fusion(&p).is_empty(), "{:?}", plan_fusion(&p));
        let kept = FusionOptions { kept: true, ..FusionOptions::ELEMENTWISE };
        let c = plan_fusion_with(&p, kept);
        assert_eq!(c.len(), 1, "{c:?}");
        assert_eq!((c[0].steps(), c[0].output), (0..=2, BufferId(4)));
        assert_eq!(c[0].kept, vec![(1, BufferId(3))]);
        assert_eq!(c[0].intermediates, vec![BufferId(2)]);
        // A program output inside the run is kept too when asked
        // (`kept_outputs`); otherwise it ends the chain.
        p.outputs.push(BufferId(2));
        let c = plan_fusion_with(&p, FusionOptions { kept_outputs: true, ..kept });
        assert_eq!(c[0].kept, vec![(0, BufferId(2)), (1, BufferId(3))]);
        assert!(c[0].intermediates.is_empty());
        assert!(plan_fusion_with(&p, kept).iter().all(|c| c.steps() != (0..=2)), "{:?}", plan_fusion_with(&p, kept));
    }

    /// With [`FusionOptions::across`], a running sum of squared norms is
    /// one chain of adds that reaches across each norm's own chain (which
    /// reads none of its values); the norms' chains are planned inside its
    /// range.
    #[test]
    fn chains_reach_across_independent_steps() {
        let t = |s: &[usize]| Buffer { ty: TensorType::new(DType::F32, s.to_vec()), name: None };
        let sq = |x: u32, out: u32| compute(Op::Binary(BinaryOp::Mul), &[x, x], out);
        let sum = |x: u32, out: u32| compute(Op::Reduce { op: ReduceOp::Sum, dims: vec![0] }, &[x], out);
        let add = |a: u32, b: u32, out: u32| compute(Op::Binary(BinaryOp::Add), &[a, b], out);
        // %3..%5 squares, %6..%8 their sums, %9 and %10 the running total.
        let mut buffers = vec![t(&[4]); 6];
        buffers.extend(vec![t(&[]); 5]);
        let p = DeviceProgram {
            name: "p".into(),
            mesh: vec![("x".into(), 1)].into(),
            buffers,
            inputs: vec![BufferId(0), BufferId(1), BufferId(2)],
            outputs: vec![BufferId(10)],
            steps: vec![
                sq(0, 3),
                sum(3, 6),
                sq(1, 4),
                sum(4, 7),
                add(6, 7, 9),
                sq(2, 5),
                Step::Free(vec![BufferId(6), BufferId(7)]),
                sum(5, 8),
                add(9, 8, 10),
            ],
        };
        let gpu = FusionOptions {
            splats: true,
            broadcasts: true,
            kept: true,
            kept_outputs: true,
            reductions: true,
            ..FusionOptions::ELEMENTWISE
        };
        let members = |o: FusionOptions| plan_fusion_with(&p, o).into_iter().map(|c| c.members).collect::<Vec<_>>();
        assert_eq!(members(gpu), vec![vec![0, 1], vec![2, 3], vec![5, 7]]);
        let across = members(FusionOptions { across: true, ..gpu });
        assert_eq!(across, vec![vec![0, 1], vec![2, 3], vec![4, 8], vec![5, 7]]);
        // Steps that read a chain's value are not reached across.
        let mut q = p.clone();
        q.steps[5] = compute(Op::Reshape { shape: vec![1] }, &[9], 5);
        q.buffers[5] = t(&[1]);
        let c = plan_fusion_with(&q, FusionOptions { across: true, ..gpu });
        assert!(c.iter().all(|c| !(c.members.contains(&4) && c.members.contains(&8))), "{c:?}");
    }

    /// With [`FusionOptions::float_kernels`] a chain keeps no `bool` and
    /// holds no integer: a comparison whose mask a later step reads starts
    /// no chain, and an integer conversion ends one.
    #[test]
    fn float_kernels_keep_floats_only() {
        let t = |d: DType| Buffer { ty: TensorType::new(d, vec![4]), name: None };
        let p = DeviceProgram {
            name: "p".into(),
            mesh: vec![("x".into(), 1)].into(),
            buffers: vec![
                t(DType::F32),
                t(DType::F32),
                t(DType::Bool),
                t(DType::F32),
                t(DType::F32),
                t(DType::Bool),
                t(DType::I32),
                t(DType::F32),
            ],
            inputs: vec![BufferId(0), BufferId(1)],
            outputs: vec![BufferId(5), BufferId(7)],
            steps: vec![
                compute(Op::Compare(weft_ir::CompareOp::Gt), &[0, 1], 2),
                compute(Op::Select, &[2, 0, 1], 3),
                compute(Op::Unary(UnaryOp::Neg), &[3], 4),
                compute(Op::Unary(UnaryOp::Not), &[2], 5),
                compute(Op::Convert { to: DType::I32 }, &[4], 6),
                compute(Op::Convert { to: DType::F32 }, &[6], 7),
            ],
        };
        let kept = FusionOptions { kept: true, kept_outputs: true, ..FusionOptions::ELEMENTWISE };
        let members = |o: FusionOptions| plan_fusion_with(&p, o).into_iter().map(|c| c.members).collect::<Vec<_>>();
        assert_eq!(members(kept), vec![vec![0, 1, 2, 3, 4, 5]]);
        assert_eq!(members(FusionOptions { float_kernels: true, ..kept }), vec![vec![1, 2]]);
    }

    /// A chain binds at most [`FusionOptions::max_bindings`] buffers (its
    /// inputs, a buffer per splat constant and its own two): a sum of ten
    /// inputs with a constant is one chain without a limit and splits
    /// where the next step would pass it.
    #[test]
    fn chains_bind_at_most_max_bindings() {
        let t = || Buffer { ty: TensorType::new(DType::F32, vec![4]), name: None };
        // Inputs %0..%9; %10 a constant; %11 = %0 * %10; %12.. add the rest.
        let mut steps = vec![
            compute(Op::Constant(weft_ir::Literal::splat(TensorType::new(DType::F32, vec![4]), 2.0)), &[], 10),
            compute(Op::Binary(BinaryOp::Mul), &[0, 10], 11),
        ];
        for k in 1..10u32 {
            steps.push(compute(Op::Binary(BinaryOp::Add), &[10 + k, k], 11 + k));
        }
        let p = DeviceProgram {
            name: "p".into(),
            mesh: vec![("x".into(), 1)].into(),
            buffers: vec![t(); 21],
            inputs: (0..10).map(BufferId).collect(),
            outputs: vec![BufferId(20)],
            steps,
        };
        let gpu = FusionOptions { splats: true, ..FusionOptions::ELEMENTWISE };
        let members = |o: FusionOptions| plan_fusion_with(&p, o).into_iter().map(|c| c.members).collect::<Vec<_>>();
        assert_eq!(members(gpu), vec![(0..11).collect::<Vec<_>>()]);
        // 1 constant + 2 own + inputs %0..%5 = 9 bindings: steps 0..=6; the
        // rest (reading the chain's result and %6..%9) another chain.
        assert_eq!(
            members(FusionOptions { max_bindings: 9, ..gpu }),
            vec![(0..7).collect::<Vec<_>>(), (7..11).collect()]
        );
        // A limit no step fits plans nothing.
        assert!(members(FusionOptions { max_bindings: 2, ..gpu }).is_empty());
    }
}

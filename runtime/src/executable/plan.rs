//! What an [`super::Executable`] works out once, before any run: which
//! steps run fused, where the program splits at collectives, each device's
//! shard-slice ops and each device's group and rank in every collective.

use crate::fusion::{plan_fusion_with, FusedChain, FusionOptions};
use std::collections::HashSet;
use std::ops::Range;
use weft_ir::device::{BufferId, Collective, DeviceProgram, Step};
use weft_ir::Op;

/// What a worker does at one step.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Action {
    /// Run the step.
    Run,
    /// Inside a fused chain: a member (skipped) or a free (after the chain).
    InChain,
    /// The last member of chain `k`: run the whole chain.
    Chain(usize),
}

/// A device's part in one collective step.
#[derive(Clone, Debug)]
pub(crate) struct Membership {
    /// The group's devices in rank order.
    pub group: Vec<usize>,
    /// This device's rank.
    pub rank: usize,
}

/// A stretch of steps every device runs on its own (starts of collectives
/// among them: they never wait), then (unless the program ends) the step
/// that waits for the group: a collective, or the `done` of one started
/// before.
#[derive(Clone, Debug)]
pub(crate) struct Segment {
    /// Steps before the wait.
    pub local: Range<usize>,
    /// The waiting step, if the segment ends with one.
    pub wait: Option<usize>,
}

/// The per-program, per-device facts a run needs.
pub(crate) struct Plan {
    pub actions: Vec<Action>,
    pub chains: Vec<FusedChain>,
    /// Per chain: the `free` steps it applies after it runs.
    pub chain_frees: Vec<Vec<usize>>,
    pub segments: Vec<Segment>,
    /// Per step: for a shard slice, the slice op of each device.
    pub slices: Vec<Option<Vec<Op>>>,
    /// Per step: for a collective or a start, each device's group and rank.
    pub members: Vec<Option<Vec<Membership>>>,
    /// Per step: for a `done`, the step that started its collective.
    pub started: Vec<Option<usize>>,
    /// Per step: a collective or a `reshape` that is the last reader of
    /// its input, which may therefore be handed over rather than copied.
    pub consumes: Vec<bool>,
    /// Per step: for a `free`, the buffers it releases — those neither
    /// fused away (they live only inside a chain and are never allocated)
    /// nor handed over to a consuming collective or a chain (decided here
    /// once, not per run).
    pub frees: Vec<Vec<BufferId>>,
    /// Per chain: the input (its index in [`FusedChain::inputs`]) whose
    /// last use the chain is and whose type is the chain's result type:
    /// it is handed over to the chain, which may write its result there
    /// (`w - lr * g` overwrites `w`).
    pub donors: Vec<Option<usize>>,
}

impl Plan {
    pub fn new(p: &DeviceProgram, fusion: FusionOptions) -> Plan {
        let chains = plan_fusion_with(p, fusion);
        let mut actions = vec![Action::Run; p.steps.len()];
        let mut fused_away = HashSet::new();
        // A chain's members run at its last; the `free` steps in its range
        // wait for it too (they may free what it reads). A `free` in the
        // ranges of several chains (chains that reach across steps can
        // overlap) waits for the one that runs last.
        let mut chain_frees: Vec<Vec<usize>> = vec![Vec::new(); chains.len()];
        for (k, c) in chains.iter().enumerate() {
            for &m in &c.members {
                actions[m] = Action::InChain;
            }
            actions[*c.steps().end()] = Action::Chain(k);
            fused_away.extend(c.intermediates.iter().copied());
        }
        for (i, step) in p.steps.iter().enumerate() {
            if !matches!(step, Step::Free(_)) {
                continue;
            }
            let latest =
                (0..chains.len()).filter(|&k| chains[k].steps().contains(&i)).max_by_key(|&k| *chains[k].steps().end());
            if let Some(k) = latest {
                actions[i] = Action::InChain;
                chain_frees[k].push(i);
            }
        }
        let n = p.num_devices();
        let mut segments = Vec::new();
        let mut slices = vec![None; p.steps.len()];
        let mut members = vec![None; p.steps.len()];
        let mut started = vec![None; p.steps.len()];
        let mut starts = std::collections::HashMap::new();
        let mut start = 0;
        for (i, step) in p.steps.iter().enumerate() {
            match step {
                Step::ShardSlice { input, dims, .. } => {
                    let shape = p.ty(*input).shape.as_slice();
                    slices[i] = Some((0..n).map(|d| shard_slice_op(p, d, shape, dims)).collect());
                }
                Step::Collective { op, .. } => {
                    members[i] = Some(memberships(p, op));
                    segments.push(Segment { local: start..i, wait: Some(i) });
                    start = i + 1;
                }
                Step::Start { op, output, .. } => {
                    members[i] = Some(memberships(p, op));
                    starts.insert(*output, i);
                }
                Step::Done(b) => {
                    started[i] = Some(starts[b]);
                    segments.push(Segment { local: start..i, wait: Some(i) });
                    start = i + 1;
                }
                _ => {}
            }
        }
        segments.push(Segment { local: start..p.steps.len(), wait: None });
        let mut last_read = vec![usize::MAX; p.buffers.len()];
        for (i, step) in p.steps.iter().enumerate() {
            match step {
                Step::Compute { inputs, .. } => inputs.iter().for_each(|b| last_read[b.index()] = i),
                Step::ShardSlice { input, .. } | Step::Collective { input, .. } | Step::Start { input, .. } => {
                    last_read[input.index()] = i
                }
                Step::Done(_) | Step::Free(_) => {}
            }
        }
        let mut consumes = vec![false; p.steps.len()];
        let mut consumed = HashSet::new();
        for (i, step) in p.steps.iter().enumerate() {
            let input = match step {
                Step::Collective { input, .. } | Step::Start { input, .. } => input,
                Step::Compute { op: Op::Reshape { .. }, inputs, .. } if actions[i] == Action::Run => &inputs[0],
                _ => continue,
            };
            if last_read[input.index()] == i && !p.outputs.contains(input) && !p.inputs.contains(input) {
                consumes[i] = true;
                consumed.insert(*input);
            }
        }
        let mut frees: Vec<Vec<BufferId>> = p
            .steps
            .iter()
            .map(|step| match step {
                Step::Free(bs) => {
                    bs.iter().copied().filter(|b| !fused_away.contains(b) && !consumed.contains(b)).collect()
                }
                _ => Vec::new(),
            })
            .collect();
        let donors = chains.iter().map(|c| if fusion.in_place { take_donor(p, c, &mut frees) } else { None }).collect();
        Plan { actions, chains, chain_frees, segments, slices, members, started, consumes, frees, donors }
    }
}

/// The input of chain `c` whose type is the result's and which is freed
/// inside the chain's steps or by the `free` steps right after them (its
/// last use is then the chain), if any; its free is then the chain's
/// (removed from `frees`).
fn take_donor(p: &DeviceProgram, c: &FusedChain, frees: &mut [Vec<BufferId>]) -> Option<usize> {
    let out = p.ty(c.output);
    let after = p.steps[c.steps().end() + 1..].iter().take_while(|s| matches!(s, Step::Free(_))).count();
    for (i, &b) in c.inputs.iter().enumerate() {
        if p.ty(b) != out {
            continue;
        }
        for step_frees in &mut frees[*c.steps().start()..=c.steps().end() + after] {
            if let Some(at) = step_frees.iter().position(|&f| f == b) {
                step_frees.remove(at);
                return Some(i);
            }
        }
    }
    None
}

/// Each device's group and rank in collective `op`.
fn memberships(p: &DeviceProgram, op: &Collective) -> Vec<Membership> {
    let groups = match op {
        Collective::CollectivePermute { .. } => vec![(0..p.num_devices()).collect()],
        Collective::AllGather { axes, .. }
        | Collective::AllReduce { axes, .. }
        | Collective::ReduceScatter { axes, .. }
        | Collective::AllToAll { axes, .. } => p.groups(axes),
    };
    let mut out: Vec<Option<Membership>> = vec![None; p.num_devices()];
    for g in groups {
        for (rank, &d) in g.iter().enumerate() {
            out[d] = Some(Membership { group: g.clone(), rank });
        }
    }
    out.into_iter().map(|m| m.expect("every device is in one group (verified program)")).collect()
}

/// The `slice` that takes device `d`'s block: along dimension `k`, the
/// block index is the device's coordinates on `dims[k]` linearised major
/// to minor.
pub fn shard_slice_op(p: &DeviceProgram, d: usize, shape: &[usize], dims: &[Vec<String>]) -> Op {
    let coords = p.coords(d);
    let mut start = Vec::with_capacity(shape.len());
    let mut limit = Vec::with_capacity(shape.len());
    for (k, axes) in dims.iter().enumerate() {
        let pos: Vec<usize> = axes.iter().map(|a| p.axis_index(a).expect("verified axis")).collect();
        let idx = p.rank_in(&coords, &pos);
        let size = shape[k] / p.group_size(axes);
        start.push(idx * size);
        limit.push((idx + 1) * size);
    }
    Op::Slice { start, limit, stride: vec![1; shape.len()] }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weft_ir::device::Buffer;
    use weft_ir::{BinaryOp, DType, TensorType};

    /// An f32 buffer of shape `s`.
    fn t(s: &[usize]) -> Buffer {
        Buffer { ty: TensorType::new(DType::F32, s.to_vec()), name: None }
    }

    /// `out = op(ins)`.
    fn c(op: Op, ins: &[u32], out: u32) -> Step {
        Step::Compute { op, inputs: ins.iter().map(|&b| BufferId(b)).collect(), outputs: vec![BufferId(out)] }
    }

    /// `w' = w - broadcast(lr) * g` with `w` freed right after: the chain
    /// takes `w` as its donor and the free is the chain's; `g`, still read
    /// afterwards, is not donated.
    #[test]
    fn a_chain_takes_over_an_input_it_reads_last() {
        let p = DeviceProgram {
            name: "p".into(),
            mesh: vec![("x".into(), 1)].into(),
            buffers: vec![t(&[]), t(&[4, 8]), t(&[4, 8]), t(&[4, 8]), t(&[4, 8]), t(&[4, 8]), t(&[4, 8])],
            inputs: vec![BufferId(0), BufferId(1), BufferId(2)],
            outputs: vec![BufferId(5), BufferId(6)],
            steps: vec![
                c(Op::BroadcastInDim { dims: vec![], shape: vec![4, 8] }, &[0], 3),
                c(Op::Binary(BinaryOp::Mul), &[3, 1], 4),
                c(Op::Binary(BinaryOp::Sub), &[2, 4], 5),
                Step::Free(vec![BufferId(0), BufferId(2), BufferId(3), BufferId(4)]),
                c(Op::Unary(weft_ir::UnaryOp::Neg), &[1], 6),
                Step::Free(vec![BufferId(1)]),
            ],
        };
        let plan = Plan::new(&p, FusionOptions::ALL);
        assert_eq!(plan.chains.len(), 1);
        assert_eq!(plan.chains[0].inputs, vec![BufferId(0), BufferId(1), BufferId(2)]);
        assert_eq!(plan.donors, vec![Some(2)], "w is donated");
        assert_eq!(plan.frees[3], vec![BufferId(0)], "only the scalar is still freed there");
        assert_eq!(plan.frees[5], vec![BufferId(1)]);
        // Without fusion nothing is donated and every free stays.
        let plain = Plan::new(&p, FusionOptions::NONE);
        assert!(plain.donors.is_empty());
        assert_eq!(plain.frees[3].len(), 4);
    }

    /// `y = reshape(exp(x))`, `z = reshape(y)` with `y` read again: the
    /// first reshape takes over its input (freed after it), the second
    /// reads `y`, which a later step still needs, and an input of the
    /// program is never taken.
    #[test]
    fn a_reshape_takes_over_an_input_it_reads_last() {
        let reshape = |s: &[usize]| Op::Reshape { shape: s.to_vec() };
        let p = DeviceProgram {
            name: "p".into(),
            mesh: vec![("x".into(), 1)].into(),
            buffers: vec![t(&[4, 8]), t(&[4, 8]), t(&[32]), t(&[2, 16]), t(&[32]), t(&[8, 4])],
            inputs: vec![BufferId(0)],
            outputs: vec![BufferId(3), BufferId(4), BufferId(5)],
            steps: vec![
                c(Op::Unary(weft_ir::UnaryOp::Exp), &[0], 1),
                c(reshape(&[32]), &[1], 2),
                Step::Free(vec![BufferId(1)]),
                c(reshape(&[2, 16]), &[2], 3),
                c(Op::Unary(weft_ir::UnaryOp::Neg), &[2], 4),
                Step::Free(vec![BufferId(2)]),
                c(reshape(&[8, 4]), &[0], 5),
            ],
        };
        let plan = Plan::new(&p, FusionOptions::NONE);
        assert_eq!(plan.consumes, vec![false, true, false, false, false, false, false]);
        assert!(plan.frees[2].is_empty(), "the reshape frees its input");
        assert_eq!(plan.frees[5], vec![BufferId(2)]);
    }
}

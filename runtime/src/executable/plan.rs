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

/// A stretch of steps every device runs on its own, then (unless the
/// program ends) the collective that closes it.
#[derive(Clone, Debug)]
pub(crate) struct Segment {
    /// Steps before the collective.
    pub local: Range<usize>,
    /// The collective step, if the segment ends with one.
    pub collective: Option<usize>,
}

/// The per-program, per-device facts a run needs.
pub(crate) struct Plan {
    pub actions: Vec<Action>,
    pub chains: Vec<FusedChain>,
    pub segments: Vec<Segment>,
    /// Per step: for a shard slice, the slice op of each device.
    pub slices: Vec<Option<Vec<Op>>>,
    /// Per step: for a collective, each device's group and rank.
    pub members: Vec<Option<Vec<Membership>>>,
    /// Per step: a collective that is the last reader of its input, which
    /// may therefore be handed over rather than copied.
    pub consumes: Vec<bool>,
    /// Per step: for a `free`, the buffers it releases — those neither
    /// fused away (they live only inside a chain and are never allocated)
    /// nor handed over to a consuming collective (decided here once, not
    /// per run).
    pub frees: Vec<Vec<BufferId>>,
}

impl Plan {
    pub fn new(p: &DeviceProgram, fusion: FusionOptions) -> Plan {
        let chains = plan_fusion_with(p, fusion);
        let mut actions = vec![Action::Run; p.steps.len()];
        let mut fused_away = HashSet::new();
        for (k, c) in chains.iter().enumerate() {
            for s in c.steps.clone() {
                actions[s] = Action::InChain;
            }
            actions[*c.steps.end()] = Action::Chain(k);
            fused_away.extend(c.intermediates.iter().copied());
        }
        let n = p.num_devices();
        let mut segments = Vec::new();
        let mut slices = vec![None; p.steps.len()];
        let mut members = vec![None; p.steps.len()];
        let mut start = 0;
        for (i, step) in p.steps.iter().enumerate() {
            match step {
                Step::ShardSlice { input, dims, .. } => {
                    let shape = p.ty(*input).shape.as_slice();
                    slices[i] = Some((0..n).map(|d| shard_slice_op(p, d, shape, dims)).collect());
                }
                Step::Collective { op, .. } => {
                    members[i] = Some(memberships(p, op));
                    segments.push(Segment { local: start..i, collective: Some(i) });
                    start = i + 1;
                }
                _ => {}
            }
        }
        segments.push(Segment { local: start..p.steps.len(), collective: None });
        let mut last_read = vec![usize::MAX; p.buffers.len()];
        for (i, step) in p.steps.iter().enumerate() {
            match step {
                Step::Compute { inputs, .. } => inputs.iter().for_each(|b| last_read[b.index()] = i),
                Step::ShardSlice { input, .. } | Step::Collective { input, .. } => last_read[input.index()] = i,
                Step::Free(_) => {}
            }
        }
        let mut consumes = vec![false; p.steps.len()];
        let mut consumed = HashSet::new();
        for (i, step) in p.steps.iter().enumerate() {
            if let Step::Collective { input, .. } = step {
                if last_read[input.index()] == i && !p.outputs.contains(input) && !p.inputs.contains(input) {
                    consumes[i] = true;
                    consumed.insert(*input);
                }
            }
        }
        let frees = p
            .steps
            .iter()
            .map(|step| match step {
                Step::Free(bs) => {
                    bs.iter().copied().filter(|b| !fused_away.contains(b) && !consumed.contains(b)).collect()
                }
                _ => Vec::new(),
            })
            .collect();
        Plan { actions, chains, segments, slices, members, consumes, frees }
    }
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

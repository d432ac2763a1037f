//! Clean-up passes over a lowered device program: forwarding identity
//! steps (a `convert` to the same dtype, a `reshape` to the same shape, an
//! identity `transpose`: each would copy a whole buffer for nothing),
//! folding transposes into the `dot_general`s that read them, fusing an all-reduce whose result is only shard-sliced into a
//! reduce-scatter, dropping buffers no step references, and freeing every
//! buffer after its last use.
//!
//! The fusion matters because reshards are lowered one at a time: a value
//! all-reduced for one user and then sliced for another (`unreduced ->
//! replicated -> split`) would move twice the bytes a reduce-scatter moves.
//! Frees make the peak of live bytes a static property of the program (all
//! devices run the same steps on blocks of the same sizes, so it is the same
//! on every device) and let executors reuse memory.

use weft_ir::device::{BufferId, Collective, DeviceProgram, Step};
use weft_ir::Op;

/// Whether a compute step returns its operand unchanged.
fn is_identity(p: &DeviceProgram, step: &Step) -> Option<(BufferId, BufferId)> {
    let Step::Compute { op, inputs, outputs } = step else { return None };
    if inputs.len() != 1 || outputs.len() != 1 || p.ty(inputs[0]) != p.ty(outputs[0]) {
        return None;
    }
    let identity = match op {
        Op::Convert { .. } | Op::Reshape { .. } => true,
        Op::Transpose { perm } => perm.iter().enumerate().all(|(i, &d)| i == d),
        _ => false,
    };
    identity.then_some((inputs[0], outputs[0]))
}

/// Removes identity steps, reading their operand wherever their result was
/// read (program outputs included). Runs before frees are inserted.
pub(crate) fn forward_identities(p: &mut DeviceProgram) {
    let mut alias: Vec<BufferId> = (0..p.buffers.len() as u32).map(BufferId).collect();
    let mut keep = Vec::with_capacity(p.steps.len());
    for step in std::mem::take(&mut p.steps) {
        let mut step = step;
        rename_reads(&mut step, &alias);
        if let Some((from, to)) = is_identity(p, &step) {
            alias[to.index()] = from;
            continue;
        }
        keep.push(step);
    }
    p.steps = keep;
    for o in &mut p.outputs {
        *o = alias[o.index()];
    }
}

/// Makes `step` read `alias[b]` wherever it read `b`.
pub(crate) fn rename_reads(step: &mut Step, alias: &[BufferId]) {
    match step {
        Step::Compute { inputs, .. } => inputs.iter_mut().for_each(|b| *b = alias[b.index()]),
        Step::ShardSlice { input, .. } | Step::Collective { input, .. } | Step::Start { input, .. } => {
            *input = alias[input.index()]
        }
        Step::Done(_) => {}
        Step::Free(bs) => bs.iter_mut().for_each(|b| *b = alias[b.index()]),
    }
}

/// Where each buffer lives in a program without `free` steps (a buffer is
/// live from the step that writes it, inputs from the start, to its last
/// reader, outputs to the end) and the bytes live at each step: what a
/// clean-up that makes a value live longer checks against the program's
/// peak.
pub(crate) struct Lifetimes {
    /// Last step reading each buffer (`usize::MAX` for an output, 0 for
    /// none).
    pub last: Vec<usize>,
    /// Bytes live at each step.
    live: Vec<usize>,
    /// The largest of `live` (and of the inputs' bytes).
    pub peak: usize,
}

impl Lifetimes {
    pub(crate) fn of(p: &DeviceProgram) -> Lifetimes {
        let n = p.steps.len();
        let read = last_reads(p);
        let mut last: Vec<usize> = read.iter().map(|r| r.unwrap_or(0)).collect();
        let mut def: Vec<Option<usize>> = vec![None; p.buffers.len()];
        // An input nothing reads is freed before the first step.
        for b in &p.inputs {
            def[b.index()] = read[b.index()].map(|_| 0);
        }
        for (i, s) in p.steps.iter().enumerate() {
            // From the first write: a started collective's result is held
            // from its start.
            for b in writes(s) {
                def[b.index()].get_or_insert(i);
                last[b.index()] = last[b.index()].max(i);
            }
        }
        // A difference array over steps: +bytes where a buffer starts,
        // -bytes after its end.
        let mut delta = vec![0i64; n + 1];
        let inputs: usize = p.inputs.iter().map(|b| p.buffers[b.index()].ty.size_bytes()).sum();
        for (b, buf) in p.buffers.iter().enumerate() {
            // A buffer no step writes and no input is (a removed step's) holds nothing.
            let Some(start) = def[b] else { continue };
            let bytes = buf.ty.size_bytes();
            let end = last[b].min(n.saturating_sub(1));
            if n > 0 && start <= end {
                delta[start] += bytes as i64;
                delta[end + 1] -= bytes as i64;
            }
        }
        let mut live = Vec::with_capacity(n);
        let mut at = 0i64;
        for d in &delta[..n] {
            at += d;
            live.push(at.max(0) as usize);
        }
        let peak = live.iter().copied().max().unwrap_or(0).max(inputs);
        Lifetimes { last, live, peak }
    }

    /// Whether `bytes` more live over steps `from..to` keeps every step at
    /// or below the peak (`to` past the last step counts to the end).
    pub(crate) fn fits(&self, bytes: usize, from: usize, to: usize) -> bool {
        let to = to.min(self.live.len());
        from >= to || self.live[from..to].iter().all(|&l| l + bytes <= self.peak)
    }

    /// Counts `bytes` more live over steps `from..to`.
    pub(crate) fn extend(&mut self, bytes: usize, from: usize, to: usize) {
        let to = to.min(self.live.len());
        for l in self.live.get_mut(from..to).unwrap_or(&mut []) {
            *l += bytes;
            self.peak = self.peak.max(*l);
        }
    }
}

/// Rewrites `transpose(transpose(x, p1), p2)` to `transpose(x, p)` with
/// `p[i] = p1[p2[i]]`, so no step reads a transpose's result through
/// another transpose (autodiff emits such pairs: `k` to heads-first, then
/// its transpose for `q @ kᵀ`; a gradient transposed back and forth). A
/// composition that is the identity becomes an identity `transpose`,
/// which [`forward_identities`] then removes; the inner transpose is
/// dropped by [`remove_dead_steps`] when nothing else reads it. Either
/// way [`fold_transposes_into_dots`] then sees the original operand.
///
/// Reading `x` later keeps it alive longer. A pair is composed only when
/// that costs no memory: the outer transpose is the inner result's one
/// reader (that result then dies instead, of the same size), or `x` is
/// read at or after the outer one anyway, or the bytes `x` adds until
/// then stay within the program's peak.
pub(crate) fn compose_transposes(p: &mut DeviceProgram) {
    let mut life = Lifetimes::of(p);
    let uses = use_counts(p);
    let mut transposed: Vec<Option<(BufferId, Vec<usize>)>> = vec![None; p.buffers.len()];
    for (i, s) in p.steps.iter_mut().enumerate() {
        let Step::Compute { op: Op::Transpose { perm }, inputs, outputs } = s else { continue };
        if inputs.len() != 1 || outputs.len() != 1 {
            continue;
        }
        if let Some((x, inner)) = &transposed[inputs[0].index()] {
            let last = life.last[x.index()];
            let bytes = p.buffers[x.index()].ty.size_bytes();
            // Read at step `i` now, `x` is live through it. Where the inner
            // result dies instead, its counted bytes already cover `x`'s.
            let compose = if uses[inputs[0].index()] == 1 || last >= i {
                true
            } else if life.fits(bytes, last + 1, i + 1) {
                life.extend(bytes, last + 1, i + 1);
                true
            } else {
                false
            };
            if compose {
                life.last[x.index()] = last.max(i);
                *perm = perm.iter().map(|&d| inner[d]).collect();
                inputs[0] = *x;
            }
        }
        transposed[outputs[0].index()] = Some((inputs[0], perm.clone()));
    }
}

/// Rewrites `dot_general(transpose(x), ..)` to read `x` directly, with
/// the dimension numbers mapped through the permutation, wherever the
/// result is unchanged: the operand's free dimensions must keep their
/// relative order (they give the result's dimension order). A transpose
/// left without readers is then dropped by [`remove_dead_steps`]. Backends
/// read a transposed operand through strides (the CPU's GEMM) or permute it
/// themselves, so this saves a copy of the whole operand.
pub(crate) fn fold_transposes_into_dots(p: &mut DeviceProgram) {
    let mut transposed: Vec<Option<(BufferId, Vec<usize>)>> = vec![None; p.buffers.len()];
    for s in &p.steps {
        if let Step::Compute { op: Op::Transpose { perm }, inputs, outputs } = s {
            if inputs.len() == 1 && outputs.len() == 1 && !p.outputs.contains(&outputs[0]) {
                transposed[outputs[0].index()] = Some((inputs[0], perm.clone()));
            }
        }
    }
    for s in &mut p.steps {
        let Step::Compute { op: Op::DotGeneral(dims), inputs, .. } = s else { continue };
        for side in 0..2 {
            let Some((x, perm)) = &transposed[inputs[side].index()] else { continue };
            let (batch, contract) =
                if side == 0 { (&dims.lhs_batch, &dims.lhs_contract) } else { (&dims.rhs_batch, &dims.rhs_contract) };
            let free: Vec<usize> = (0..perm.len()).filter(|d| !batch.contains(d) && !contract.contains(d)).collect();
            if free.windows(2).any(|w| perm[w[0]] > perm[w[1]]) {
                continue;
            }
            let map = |ds: &[usize]| ds.iter().map(|&d| perm[d]).collect::<Vec<_>>();
            let (new_batch, new_contract) = (map(batch), map(contract));
            if side == 0 {
                dims.lhs_batch = new_batch;
                dims.lhs_contract = new_contract;
            } else {
                dims.rhs_batch = new_batch;
                dims.rhs_contract = new_contract;
            }
            inputs[side] = *x;
        }
    }
}

/// Every buffer a step reads.
pub(crate) fn reads(step: &Step) -> Vec<BufferId> {
    match step {
        Step::Compute { inputs, .. } => inputs.clone(),
        Step::ShardSlice { input, .. } | Step::Collective { input, .. } | Step::Start { input, .. } => vec![*input],
        Step::Done(_) | Step::Free(_) => Vec::new(),
    }
}

/// Every buffer a step defines. A started collective's output counts as
/// written by both its start and its `done` (the later one is where it
/// becomes live), so the two live and die together.
pub(crate) fn writes(step: &Step) -> Vec<BufferId> {
    match step {
        Step::Compute { outputs, .. } => outputs.clone(),
        Step::ShardSlice { output, .. } | Step::Collective { output, .. } | Step::Start { output, .. } => {
            vec![*output]
        }
        Step::Done(b) => vec![*b],
        Step::Free(_) => Vec::new(),
    }
}

/// The last step that reads each buffer (`usize::MAX` for an output;
/// `None` for a buffer nothing reads).
pub(crate) fn last_reads(p: &DeviceProgram) -> Vec<Option<usize>> {
    let mut last = vec![None; p.buffers.len()];
    for (i, s) in p.steps.iter().enumerate() {
        for b in reads(s) {
            last[b.index()] = Some(i);
        }
    }
    for b in &p.outputs {
        last[b.index()] = Some(usize::MAX);
    }
    last
}

/// Number of reads of each buffer (steps and outputs).
pub(crate) fn use_counts(p: &DeviceProgram) -> Vec<usize> {
    let mut n = vec![0; p.buffers.len()];
    for s in &p.steps {
        for b in reads(s) {
            n[b.index()] += 1;
        }
    }
    for b in &p.outputs {
        n[b.index()] += 1;
    }
    n
}

/// `t = all_reduce(x) over A; y = shard_slice(t)` splitting one dimension
/// over exactly `A` (in order), with `t` used nowhere else, becomes
/// `y = reduce_scatter(x)` over `A` along that dimension, with the same
/// combining op (`sum`, `max` or `min`).
pub(crate) fn fuse_reduce_scatter(p: &mut DeviceProgram) {
    let uses = use_counts(p);
    let mut producer: Vec<Option<usize>> = vec![None; p.buffers.len()];
    for (i, s) in p.steps.iter().enumerate() {
        for b in writes(s) {
            producer[b.index()] = Some(i);
        }
    }
    let mut dead = vec![false; p.steps.len()];
    let mut fused = Vec::new();
    for (i, step) in p.steps.iter().enumerate() {
        let Step::ShardSlice { input, output, dims } = step else { continue };
        let split: Vec<usize> = (0..dims.len()).filter(|&d| !dims[d].is_empty()).collect();
        let (Some(j), [d]) = (producer[input.index()], split.as_slice()) else { continue };
        let Step::Collective { op: Collective::AllReduce { axes, op }, input: x, .. } = &p.steps[j] else {
            continue;
        };
        if uses[input.index()] != 1 || *axes != dims[*d] {
            continue;
        }
        let step = Step::Collective {
            op: Collective::ReduceScatter { dim: *d, axes: axes.clone(), op: *op },
            input: *x,
            output: *output,
        };
        fused.push((j, step));
        dead[i] = true;
    }
    for (j, step) in fused {
        p.steps[j] = step;
    }
    let mut k = 0;
    p.steps.retain(|_| {
        k += 1;
        !dead[k - 1]
    });
}

/// Drops steps whose outputs nothing reads (a value resharded at its
/// source leaves its original computation dead), until none is left.
pub(crate) fn remove_dead_steps(p: &mut DeviceProgram) {
    loop {
        let uses = use_counts(p);
        let before = p.steps.len();
        p.steps.retain(|s| matches!(s, Step::Free(_)) || writes(s).iter().any(|b| uses[b.index()] > 0));
        if p.steps.len() == before {
            return;
        }
    }
}

/// Drops buffers that are neither inputs nor written by a step, and
/// renumbers the rest in order of definition. (In a program that does not
/// verify, a buffer read but never defined keeps a number after the
/// defined ones, so the verifier still reports it.)
pub(crate) fn compact(p: &mut DeviceProgram) {
    let mut map: Vec<Option<BufferId>> = vec![None; p.buffers.len()];
    let mut order = Vec::new();
    let defined = p.inputs.iter().copied().chain(p.steps.iter().flat_map(writes));
    let read = p.steps.iter().flat_map(reads).chain(p.outputs.iter().copied());
    for b in defined.chain(read.collect::<Vec<_>>()) {
        if map[b.index()].is_none() {
            map[b.index()] = Some(BufferId(order.len() as u32));
            order.push(b);
        }
    }
    let m = |b: &mut BufferId| *b = map[b.index()].unwrap_or(*b);
    p.inputs.iter_mut().for_each(m);
    p.outputs.iter_mut().for_each(m);
    for s in &mut p.steps {
        match s {
            Step::Compute { inputs, outputs, .. } => inputs.iter_mut().chain(outputs.iter_mut()).for_each(m),
            Step::ShardSlice { input, output, .. }
            | Step::Collective { input, output, .. }
            | Step::Start { input, output, .. } => {
                m(input);
                m(output);
            }
            Step::Done(b) => m(b),
            Step::Free(bs) => bs.iter_mut().for_each(m),
        }
    }
    p.buffers = order.iter().map(|b| p.buffers[b.index()].clone()).collect();
}

/// Inserts a `free` after the last read of every buffer that is not an
/// output (unused inputs are freed first, unused results right after the
/// step that makes them). Existing `free` steps are replaced.
pub(crate) fn insert_frees(p: &mut DeviceProgram) {
    p.steps.retain(|s| !matches!(s, Step::Free(_)));
    let n = p.buffers.len();
    let mut last: Vec<Option<usize>> = vec![None; n];
    let mut def: Vec<Option<usize>> = vec![None; n];
    for (i, s) in p.steps.iter().enumerate() {
        for b in writes(s) {
            def[b.index()] = Some(i);
        }
        for b in reads(s) {
            last[b.index()] = Some(i);
        }
    }
    let mut is_output = vec![false; n];
    p.outputs.iter().for_each(|b| is_output[b.index()] = true);
    let mut at_start = Vec::new();
    let mut after: Vec<Vec<BufferId>> = vec![Vec::new(); p.steps.len()];
    for b in 0..n {
        if is_output[b] {
            continue;
        }
        let id = BufferId(b as u32);
        match (last[b], def[b]) {
            (Some(i), _) | (None, Some(i)) => after[i].push(id),
            (None, None) => at_start.push(id),
        }
    }
    let mut steps = Vec::with_capacity(p.steps.len() * 2);
    if !at_start.is_empty() {
        steps.push(Step::Free(at_start));
    }
    for (s, dying) in std::mem::take(&mut p.steps).into_iter().zip(after) {
        steps.push(s);
        if !dying.is_empty() {
            steps.push(Step::Free(dying));
        }
    }
    p.steps = steps;
}

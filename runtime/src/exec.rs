//! The executor: runs one device program on N logical devices.
//!
//! All devices advance together, step by step, in one thread: step `s`
//! runs on device 0, 1, ..., N-1 before step `s + 1` starts anywhere. That
//! is deterministic, needs no synchronisation, and makes collectives
//! trivial to stage (every contribution exists when the collective step is
//! reached). GPU backends queue their kernels asynchronously, so devices
//! still overlap wherever the hardware allows. Collectives go through the
//! host (see [`crate::collective`]) unless the backend offers a native path.
//!
//! Buffers are released at the program's `free` steps, so the backend's
//! allocator can reuse the memory; the executor counts live bytes per
//! device and reports the peak in [`DeviceStats`]. For backends that fuse
//! ([`Backend::fuses`]), chains of elementwise steps ([`crate::fusion`])
//! run as one call at the chain's last step; their intermediates are never
//! allocated (so the measured peak can be below the verifier's static one)
//! and frees inside a chain are applied right after it.

use crate::backend::Backend;
use crate::collective::{combine, groups, permute};
use crate::error::RuntimeError;
use crate::fusion::{plan_fusion, FusedChain};
use crate::verify::verify_program;
use std::collections::HashSet;
use weft_ir::device::{BufferId, Collective, DeviceProgram, Step};
use weft_ir::tensor::HostTensor;
use weft_ir::Op;

/// Memory accounting of one device over a run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceStats {
    /// The largest number of bytes held in live buffers at once (dense
    /// sizes of the program's buffer types, inputs included).
    pub peak_live_bytes: usize,
    /// Bytes still live at the end (the outputs, and any buffer the
    /// program never frees).
    pub final_live_bytes: usize,
}

/// The result of [`run_program_stats`].
#[derive(Debug)]
pub struct RunOutput {
    /// Per device, the output buffers in program order.
    pub outputs: Vec<Vec<HostTensor>>,
    /// Per device, memory accounting.
    pub stats: Vec<DeviceStats>,
    /// Chains of elementwise steps run fused (the same on every device).
    pub fused_chains: usize,
}

/// What the executor does at one step.
#[derive(Copy, Clone, PartialEq, Eq)]
enum Action {
    /// Run the step.
    Run,
    /// Inside a fused chain: a member (skipped) or a free (after the chain).
    InChain,
    /// The last member of chain `k`: run the whole chain.
    Chain(usize),
}

/// The live buffers of one device, with their byte count.
struct Slots<B: Backend> {
    bufs: Vec<Option<B::Buffer>>,
    live: usize,
    stats: DeviceStats,
}

impl<B: Backend> Slots<B> {
    fn get(&self, b: BufferId) -> &B::Buffer {
        self.bufs[b.index()].as_ref().unwrap_or_else(|| panic!("buffer %{} is not live (verified program)", b.0))
    }

    fn put(&mut self, p: &DeviceProgram, b: BufferId, buf: B::Buffer) {
        self.live += p.ty(b).size_bytes();
        self.stats.peak_live_bytes = self.stats.peak_live_bytes.max(self.live);
        self.bufs[b.index()] = Some(buf);
    }

    fn take(&mut self, p: &DeviceProgram, b: BufferId) -> B::Buffer {
        self.live -= p.ty(b).size_bytes();
        self.bufs[b.index()].take().unwrap_or_else(|| panic!("buffer %{} freed twice (verified program)", b.0))
    }
}

/// Runs `program` on `backends` (one per device of the mesh, in flat device
/// order) with `inputs[d]` the input buffers of device `d`, and returns
/// each device's outputs.
pub fn run_program<B: Backend>(
    program: &DeviceProgram,
    backends: &[B],
    inputs: Vec<Vec<HostTensor>>,
) -> Result<Vec<Vec<HostTensor>>, RuntimeError> {
    Ok(run_program_stats(program, backends, inputs)?.outputs)
}

/// [`run_program`], also returning per-device memory statistics.
pub fn run_program_stats<B: Backend>(
    program: &DeviceProgram,
    backends: &[B],
    inputs: Vec<Vec<HostTensor>>,
) -> Result<RunOutput, RuntimeError> {
    let n = program.num_devices();
    if backends.len() != n {
        let mesh: Vec<String> = program.mesh.iter().map(|(a, s)| format!("{a}={s}")).collect();
        return Err(RuntimeError::DeviceCount {
            program: program.name.clone(),
            mesh: mesh.join(" x "),
            needed: n,
            given: backends.len(),
        });
    }
    verify_program(program)?;
    check_inputs(program, &inputs)?;
    let mut slots: Vec<Slots<B>> = Vec::with_capacity(n);
    for (d, (backend, ins)) in backends.iter().zip(inputs).enumerate() {
        let mut s =
            Slots { bufs: (0..program.buffers.len()).map(|_| None).collect(), live: 0, stats: Default::default() };
        for (&b, t) in program.inputs.iter().zip(&ins) {
            let buf = backend.upload(t).map_err(|e| input_err(d, program, b, e))?;
            s.put(program, b, buf);
        }
        slots.push(s);
    }
    let chains = if backends.first().is_some_and(|b| b.fuses()) { plan_fusion(program) } else { Vec::new() };
    let mut actions = vec![Action::Run; program.steps.len()];
    let mut fused_away: HashSet<BufferId> = HashSet::new();
    for (k, c) in chains.iter().enumerate() {
        for s in c.steps.clone() {
            actions[s] = Action::InChain;
        }
        actions[*c.steps.end()] = Action::Chain(k);
        fused_away.extend(c.intermediates.iter().copied());
    }
    for (i, step) in program.steps.iter().enumerate() {
        match actions[i] {
            Action::Run => run_step(program, backends, &mut slots, i, step, &fused_away)?,
            Action::InChain => {}
            Action::Chain(k) => {
                let c = &chains[k];
                run_chain(program, backends, &mut slots, i, c)?;
                for s in c.steps.clone() {
                    if let step @ Step::Free(_) = &program.steps[s] {
                        run_step(program, backends, &mut slots, s, step, &fused_away)?;
                    }
                }
            }
        }
    }
    let mut outputs = Vec::with_capacity(n);
    let mut stats = Vec::with_capacity(n);
    for (d, (backend, s)) in backends.iter().zip(&mut slots).enumerate() {
        let outs = program
            .outputs
            .iter()
            .map(|&b| backend.download(s.get(b)))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| e.at_step(d, program.steps.len(), "download"))?;
        outputs.push(outs);
        s.stats.final_live_bytes = s.live;
        stats.push(s.stats.clone());
    }
    Ok(RunOutput { outputs, stats, fused_chains: chains.len() })
}

fn input_err(device: usize, p: &DeviceProgram, b: BufferId, e: RuntimeError) -> RuntimeError {
    let index = p.inputs.iter().position(|&x| x == b).unwrap_or(0);
    RuntimeError::Input { device, index, message: e.to_string() }
}

fn check_inputs(p: &DeviceProgram, inputs: &[Vec<HostTensor>]) -> Result<(), RuntimeError> {
    if inputs.len() != p.num_devices() {
        return Err(RuntimeError::Input {
            device: inputs.len().min(p.num_devices()),
            index: 0,
            message: format!("inputs were given for {} devices, the mesh has {}", inputs.len(), p.num_devices()),
        });
    }
    for (device, ins) in inputs.iter().enumerate() {
        if ins.len() != p.inputs.len() {
            return Err(RuntimeError::Input {
                device,
                index: ins.len().min(p.inputs.len()),
                message: format!("{} inputs given, the program takes {}", ins.len(), p.inputs.len()),
            });
        }
        for (index, (t, &b)) in ins.iter().zip(&p.inputs).enumerate() {
            if !t.has_type(p.ty(b)) {
                let name = p.buffers[b.index()].name.as_deref().map(|n| format!(" (%{n})")).unwrap_or_default();
                return Err(RuntimeError::Input {
                    device,
                    index,
                    message: format!("buffer %{}{name} is {}, given {}", b.0, p.ty(b), t.ty()),
                });
            }
        }
    }
    Ok(())
}

/// Runs a fused chain on every device (at step `i`, its last member).
fn run_chain<B: Backend>(
    p: &DeviceProgram,
    backends: &[B],
    slots: &mut [Slots<B>],
    i: usize,
    c: &FusedChain,
) -> Result<(), RuntimeError> {
    for (d, (backend, s)) in backends.iter().zip(slots.iter_mut()).enumerate() {
        let ins: Vec<&B::Buffer> = c.inputs.iter().map(|&b| s.get(b)).collect();
        let out = backend.compute_fused(c, &ins).map_err(|e| e.at_step(d, i, "fused elementwise chain"))?;
        s.put(p, c.output, out);
    }
    Ok(())
}

fn run_step<B: Backend>(
    p: &DeviceProgram,
    backends: &[B],
    slots: &mut [Slots<B>],
    i: usize,
    step: &Step,
    fused_away: &HashSet<BufferId>,
) -> Result<(), RuntimeError> {
    match step {
        Step::Compute { op, inputs, outputs } => {
            for (d, (backend, s)) in backends.iter().zip(slots.iter_mut()).enumerate() {
                let ins: Vec<&B::Buffer> = inputs.iter().map(|&b| s.get(b)).collect();
                let outs = backend.compute(op, &ins).map_err(|e| e.at_step(d, i, op.name()))?;
                assert_eq!(
                    outs.len(),
                    outputs.len(),
                    "backend {} returned the wrong number of results",
                    backend.name()
                );
                for (&o, buf) in outputs.iter().zip(outs) {
                    s.put(p, o, buf);
                }
            }
        }
        Step::ShardSlice { input, output, dims } => {
            for (d, (backend, s)) in backends.iter().zip(slots.iter_mut()).enumerate() {
                let op = shard_slice_op(p, d, p.ty(*input).shape.as_slice(), dims);
                let out = backend.compute(&op, &[s.get(*input)]).map_err(|e| e.at_step(d, i, "shard_slice"))?;
                s.put(p, *output, out.into_iter().next().expect("slice has one result"));
            }
        }
        Step::Collective { op, input, output } => run_collective(p, backends, slots, i, op, *input, *output)?,
        Step::Free(bs) => {
            for (backend, s) in backends.iter().zip(slots.iter_mut()) {
                for b in bs.iter().filter(|b| !fused_away.contains(b)) {
                    let buf = s.take(p, *b);
                    backend.free(buf);
                }
            }
        }
    }
    Ok(())
}

/// The `slice` that takes device `d`'s block: along dimension `k`, the
/// block index is the device's coordinates on `dims[k]` linearised major
/// to minor.
pub fn shard_slice_op(p: &DeviceProgram, d: usize, shape: &[usize], dims: &[Vec<String>]) -> Op {
    let coords = p.coords(d);
    let mut start = Vec::with_capacity(shape.len());
    let mut limit = Vec::with_capacity(shape.len());
    for (k, axes) in dims.iter().enumerate() {
        let (mut idx, mut count) = (0, 1);
        for a in axes {
            let pos = p.mesh.iter().position(|(n, _)| n == a).expect("verified axis");
            idx = idx * p.mesh[pos].1 + coords[pos];
            count *= p.mesh[pos].1;
        }
        let size = shape[k] / count;
        start.push(idx * size);
        limit.push((idx + 1) * size);
    }
    Op::Slice { start, limit, stride: vec![1; shape.len()] }
}

fn run_collective<B: Backend>(
    p: &DeviceProgram,
    backends: &[B],
    slots: &mut [Slots<B>],
    i: usize,
    op: &Collective,
    input: BufferId,
    output: BufferId,
) -> Result<(), RuntimeError> {
    let name = op.name();
    let download =
        |slots: &[Slots<B>], d: usize| backends[d].download(slots[d].get(input)).map_err(|e| e.at_step(d, i, name));
    if let Collective::CollectivePermute { pairs } = op {
        let ins: Vec<HostTensor> = (0..backends.len()).map(|d| download(slots, d)).collect::<Result<_, _>>()?;
        for (d, t) in permute(pairs, &ins).into_iter().enumerate() {
            let buf = backends[d].upload(&t).map_err(|e| e.at_step(d, i, name))?;
            slots[d].put(p, output, buf);
        }
        return Ok(());
    }
    let axes = match op {
        Collective::AllGather { axes, .. }
        | Collective::AllReduce { axes, .. }
        | Collective::ReduceScatter { axes, .. }
        | Collective::AllToAll { axes, .. } => axes,
        Collective::CollectivePermute { .. } => unreachable!("handled above"),
    };
    for group in groups(p, axes) {
        let members: Vec<(&B, &B::Buffer)> = group.iter().map(|&d| (&backends[d], slots[d].get(input))).collect();
        let outs = match B::native_collective(&members, op) {
            Some(r) => r.map_err(|e| e.at_step(group[0], i, name))?,
            None => {
                let blocks: Vec<HostTensor> = group.iter().map(|&d| download(slots, d)).collect::<Result<_, _>>()?;
                let results = combine(op, &blocks).map_err(|e| e.at_step(group[0], i, name))?;
                group
                    .iter()
                    .zip(&results)
                    .map(|(&d, t)| backends[d].upload(t).map_err(|e| e.at_step(d, i, name)))
                    .collect::<Result<Vec<_>, _>>()?
            }
        };
        for (&d, buf) in group.iter().zip(outs) {
            slots[d].put(p, output, buf);
        }
    }
    Ok(())
}

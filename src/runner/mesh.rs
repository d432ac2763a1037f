//! Mesh executors: the partitioned training step runs on one logical
//! device per mesh position.
//!
//! - `sim`: the reference device-program simulator (all devices in one
//!   thread, the interpreter's per-op semantics): the oracle for sharded
//!   runs. The state is kept as host blocks between steps.
//! - `cpu`, `wgpu`, `cuda`: a [`weft_runtime::Executable`], compiled once,
//!   with one worker thread per device. Every state leaf is donated to its
//!   new value, so the state stays resident on the devices: a step uploads
//!   only the batch's blocks and downloads only the metrics, and the state
//!   comes back to the host only for a checkpoint.
//!
//! Both compile the step through [`super::compile`] with its state pinned
//! (`compile_stable`), so each new state leaf comes out laid out as the
//! step takes it and nothing is re-laid out on the host.

use super::exec::{global_batch_rows, Executor, PARAMS};
use super::processes::Processes;
use super::{human, mesh_spec};
use crate::checkpoint::{CheckpointState, LeafData, ShardedLeaf};
use crate::data::BatchPart;
use crate::error::Result;
use std::collections::BTreeMap;
use std::ops::Range;
use std::time::Duration;
use weft_compiler::autoshard::AutoShardOptions;
use weft_compiler::partition::overlap::OverlapOptions;
use weft_compiler::partition::{shard_tensor, unshard_tensor, PartitionedFunction};
use weft_compiler::sharding::{local_shape, shard_offset, Mesh};
use weft_compiler::train::{Metrics, TrainStep, Tree};
use weft_ir::device::simulate;
use weft_ir::interp::eval_op;
use weft_ir::limits::MemoryLimit;
use weft_ir::tensor::HostTensor;
use weft_ir::Op;
use weft_runtime::{AnyBackend, DeviceMap, ExecOptions, Executable, TransferStats};

/// Simulated devices available in one process.
pub const MAX_SIMULATED_DEVICES: usize = 1024;

/// Where a mesh executor runs the device program.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum MeshBackend {
    /// The reference simulator (`--backend sim`).
    Simulator,
    /// Runtime devices of this kind, through an executable.
    Devices(weft_runtime::BackendKind),
}

enum Engine {
    Simulator { state: Vec<Vec<HostTensor>> },
    Devices { exe: Box<Executable<AnyBackend>>, map: DeviceMap, processes: Option<Processes> },
}

/// Runs the partitioned training step on the devices of a mesh.
pub struct MeshExecutor {
    pf: PartitionedFunction,
    mesh: Mesh,
    /// The devices whose blocks this process holds, ascending: every device
    /// of the mesh, unless the run has several processes.
    local: Vec<usize>,
    engine: Engine,
    phases: Vec<(&'static str, Duration)>,
}

impl MeshExecutor {
    /// Compiles `step` for `mesh` (state layouts pinned) and makes it ready
    /// to run on `backend`; `threads` is the number of worker threads
    /// (`None`: the backend's default, one per core for CPU devices).
    pub fn new(step: &TrainStep, mesh: &Mesh, backend: MeshBackend, threads: Option<usize>) -> Result<MeshExecutor> {
        MeshExecutor::with_limit(step, mesh, backend, threads, None, None, None)
    }

    /// [`MeshExecutor::new`], checking after compilation and before any
    /// device is opened that every device's static peak of live bytes,
    /// together, fits `limit` (all simulated devices share the host). With
    /// `auto`, the layouts are the auto-sharder's (an `autoshard` pass
    /// before `propagate`, state layouts pinned as for any strategy).
    pub fn with_limit(
        step: &TrainStep,
        mesh: &Mesh,
        backend: MeshBackend,
        threads: Option<usize>,
        limit: Option<&MemoryLimit>,
        auto: Option<&AutoShardOptions>,
        overlap: Option<OverlapOptions>,
    ) -> Result<MeshExecutor> {
        MeshExecutor::on_processes(step, mesh, backend, threads, limit, auto, overlap, None)
    }

    /// [`MeshExecutor::with_limit`] for one process of a multi-process run
    /// (`processes`): the executable runs this process's devices only, and
    /// the processes first check that they compiled the same program.
    #[allow(clippy::too_many_arguments)]
    pub fn on_processes(
        step: &TrainStep,
        mesh: &Mesh,
        backend: MeshBackend,
        threads: Option<usize>,
        limit: Option<&MemoryLimit>,
        auto: Option<&AutoShardOptions>,
        overlap: Option<OverlapOptions>,
        processes: Option<&Processes>,
    ) -> Result<MeshExecutor> {
        let ns = step.state.len();
        // The state layouts pinned; with `auto`, the auto-sharder chooses
        // them (and its memory budget holds for the partitioned program).
        let (pf, mut phases) =
            super::compile::compile(&step.module, "train_step", mesh, auto, overlap, Some(step.state.len()))?;
        pf.check_runnable(MAX_SIMULATED_DEVICES)?;
        if let Some(limit) = limit {
            let peak = pf.report().peak_live_bytes as u64;
            let n = mesh.num_devices() as u64;
            let what = format!(
                "the partitioned training step ({n} devices x {} peak live bytes each)",
                weft_ir::limits::human_bytes(peak)
            );
            limit.check(&what, peak.saturating_mul(n))?;
        }
        if let Some(path) = std::env::var_os("WEFT_DUMP_DEVICE_PROGRAM") {
            let text = weft_ir::device::print_program(&pf.program);
            std::fs::write(&path, text).map_err(|source| crate::error::Error::Io { path: path.into(), source })?;
        }
        let n = mesh.num_devices();
        let local: Vec<usize> = match processes {
            Some(p) => p.local_devices(n)?,
            None => (0..n).collect(),
        };
        let engine = match backend {
            MeshBackend::Simulator if processes.is_some() => {
                return Err(crate::error::Error::Usage(
                    "backend `sim` simulates the whole mesh in one process; run several processes on cpu, wgpu or cuda"
                        .into(),
                ));
            }
            MeshBackend::Simulator => Engine::Simulator { state: Vec::new() },
            MeshBackend::Devices(kind) => {
                let options = ExecOptions { donate: (0..ns).map(|i| (i, i)).collect(), threads, ..Default::default() };
                let opened = super::compile::open(&pf, kind, &local, processes, options)?;
                phases.extend(opened.phases);
                Engine::Devices { exe: Box::new(opened.exe), map: opened.map, processes: processes.cloned() }
            }
        };
        Ok(MeshExecutor { pf, mesh: mesh.clone(), local, engine, phases })
    }

    /// The partitioned program (for reports).
    pub fn partitioned(&self) -> &PartitionedFunction {
        &self.pf
    }

    /// Host transfers so far (`None` for the simulator, which has no devices).
    pub fn transfers(&self) -> Option<TransferStats> {
        match &self.engine {
            Engine::Simulator { .. } => None,
            Engine::Devices { exe, .. } => Some(exe.stats().transfers.clone()),
        }
    }

    /// Per device, the measured peak of live bytes in the last step
    /// (`None` for the simulator).
    pub fn measured_peaks(&self) -> Option<Vec<usize>> {
        match &self.engine {
            Engine::Simulator { .. } => None,
            Engine::Devices { exe, .. } => Some(exe.stats().devices.iter().map(|d| d.peak_live_bytes).collect()),
        }
    }

    /// Whether this process holds only some devices' blocks.
    fn is_partial(&self) -> bool {
        self.local.len() != self.mesh.num_devices()
    }

    /// This process's devices' blocks of the global `t` laid out as `s`.
    fn local_blocks(&self, t: &HostTensor, s: &weft_ir::TensorSharding) -> Result<Vec<HostTensor>> {
        Ok(keep_local(shard_tensor(t, s, &self.mesh)?, &self.local))
    }

    /// Runs the step on per-local-device batch blocks; returns the metrics.
    fn run_blocks(&mut self, step: &TrainStep, inputs: Vec<Vec<HostTensor>>) -> Result<Metrics> {
        let ns = step.state.len();
        let metric_outputs: Vec<Vec<HostTensor>> = match &mut self.engine {
            Engine::Simulator { state } => {
                let mut all = std::mem::take(state);
                for (s, b) in all.iter_mut().zip(inputs) {
                    s.extend(b);
                }
                let outs = simulate(&self.pf.program, all)?;
                let mut metrics = Vec::with_capacity(self.local.len());
                for mut o in outs {
                    metrics.push(o.split_off(ns));
                    state.push(o);
                }
                metrics
            }
            Engine::Devices { exe, .. } => exe.run(inputs)?,
        };
        let mut m = Metrics::new();
        for (k, (name, g)) in step.metrics.iter().zip(&self.pf.outputs[ns..]).enumerate() {
            let blocks: Vec<HostTensor> = metric_outputs.iter().map(|o| o[k].clone()).collect();
            let t = if blocks.len() == self.mesh.num_devices() {
                unshard_tensor(&blocks, &g.sharding, &self.mesh)?
            } else if g.sharding.is_replicated() {
                // Every device holds the whole (scalar) metric.
                blocks.into_iter().next().expect("a process owns at least one device")
            } else {
                return Err(crate::error::Error::Usage(format!(
                    "metric {name} is sharded ({}); a multi-process run needs replicated metrics",
                    g.sharding
                )));
            };
            m.insert(name.clone(), t.to_f64_vec()[0]);
        }
        Ok(m)
    }

    /// Where device `d`'s block of a tensor of type `ty` laid out as `s`
    /// starts in the global tensor, and the block's shape.
    fn block_region(
        &self,
        ty: &weft_ir::TensorType,
        s: &weft_ir::TensorSharding,
        d: usize,
    ) -> Result<(Vec<usize>, Vec<usize>)> {
        Ok((shard_offset(&ty.shape, s, &self.mesh, d)?, local_shape(&ty.shape, s, &self.mesh)?))
    }

    /// Places the state: per local device, every state leaf's block.
    fn place_state(&mut self, per_device: Vec<Vec<HostTensor>>) -> Result<()> {
        match &mut self.engine {
            Engine::Simulator { state } => *state = per_device,
            Engine::Devices { exe, .. } => exe.load_state(per_device)?,
        }
        Ok(())
    }

    /// Per local device, the blocks of every state leaf (in
    /// `TrainStep::state` order).
    fn state_blocks(&mut self) -> Result<Vec<Vec<HostTensor>>> {
        match &mut self.engine {
            Engine::Simulator { state } => Ok(state.clone()),
            Engine::Devices { exe, .. } => Ok(exe.read_state()?),
        }
    }

    /// [`MeshExecutor::state_blocks`] of the blocks `want[device][leaf]`
    /// names (over every device of the mesh), `None` for the others.
    fn state_blocks_where(&mut self, want: Vec<Vec<bool>>) -> Result<Vec<Vec<Option<HostTensor>>>> {
        match &mut self.engine {
            Engine::Simulator { state } => Ok(self
                .local
                .iter()
                .zip(state.iter())
                .map(|(&d, blocks)| blocks.iter().zip(&want[d]).map(|(t, &w)| w.then(|| t.clone())).collect())
                .collect()),
            Engine::Devices { exe, .. } => Ok(exe.read_state_where(want)?),
        }
    }
}

/// Keeps the blocks of the devices in `local` (ascending) of a list over
/// every device of the mesh.
fn keep_local<T>(all: Vec<T>, local: &[usize]) -> Vec<T> {
    if all.len() == local.len() {
        return all;
    }
    all.into_iter().enumerate().filter(|(d, _)| local.binary_search(d).is_ok()).map(|(_, t)| t).collect()
}

impl Executor for MeshExecutor {
    fn device_times(&self) -> Option<Vec<weft_runtime::DeviceTime>> {
        match &self.engine {
            Engine::Simulator { .. } => None,
            // This process's devices only: the others' times are measured
            // (and averaged) by their own processes.
            Engine::Devices { exe, .. } => Some(exe.local_devices().iter().map(|&d| exe.stats().times[d]).collect()),
        }
    }

    fn set_trace(&mut self, mode: Option<weft_runtime::TraceMode>) {
        if let Engine::Devices { exe, .. } = &mut self.engine {
            exe.set_trace(mode);
        }
    }

    fn take_trace(&mut self) -> Option<weft_runtime::Trace> {
        match &mut self.engine {
            Engine::Devices { exe, .. } => exe.take_trace(),
            Engine::Simulator { .. } => None,
        }
    }

    fn load(&mut self, step: &TrainStep, state: &Tree) -> Result<()> {
        step.check_state(state)?;
        let mut per_device: Vec<Vec<HostTensor>> = vec![Vec::new(); self.local.len()];
        for (leaf, g) in step.state.iter().zip(&self.pf.inputs) {
            for (k, blk) in self.local_blocks(&state[&leaf.name], &g.sharding)?.into_iter().enumerate() {
                per_device[k].push(blk);
            }
        }
        self.place_state(per_device)
    }

    fn load_blocks(&mut self, step: &TrainStep, state: &CheckpointState) -> Result<()> {
        // The restored blocks are placed as they are: no global tensor is
        // assembled for a sharded leaf.
        let mut per_device: Vec<Vec<HostTensor>> = vec![Vec::new(); self.local.len()];
        for (leaf, g) in step.state.iter().zip(&self.pf.inputs) {
            let missing = || crate::error::Error::Usage(format!("the restored state has no blocks of {}", leaf.name));
            let blocks = match state.leaves.get(&leaf.name).ok_or_else(missing)? {
                LeafData::Global(t) => self.local_blocks(t, &g.sharding)?,
                LeafData::Sharded(s) => {
                    self.local.iter().map(|d| s.shards.get(d).cloned().ok_or_else(missing)).collect::<Result<_>>()?
                }
            };
            for (k, blk) in blocks.into_iter().enumerate() {
                per_device[k].push(blk);
            }
        }
        self.place_state(per_device)
    }

    fn step(&mut self, step: &TrainStep, batch: &Tree) -> Result<Metrics> {
        step.check_batch(batch)?;
        let ns = step.state.len();
        let mut inputs: Vec<Vec<HostTensor>> = vec![Vec::with_capacity(step.batch.len()); self.local.len()];
        for ((name, _), g) in step.batch.iter().zip(&self.pf.inputs[ns..]) {
            let blocks = self.local_blocks(&batch[name], &g.sharding)?;
            for (k, blk) in blocks.into_iter().enumerate() {
                inputs[k].push(blk);
            }
        }
        self.run_blocks(step, inputs)
    }

    fn batch_part(&self, step: &TrainStep) -> Result<BatchPart> {
        let all = 0..global_batch_rows(step);
        if !self.is_partial() {
            return Ok(BatchPart::rows(all));
        }
        let ns = step.state.len();
        let mut span: Option<Range<usize>> = None;
        for ((_, ty), g) in step.batch.iter().zip(&self.pf.inputs[ns..]) {
            if !g.sharding.unreduced.is_empty() {
                return Ok(BatchPart::rows(all));
            }
            for &d in &self.local {
                let (start, local) = self.block_region(ty, &g.sharding, d)?;
                let (lo, hi) = (start[0], start[0] + local[0]);
                span = Some(match span {
                    Some(r) => r.start.min(lo)..r.end.max(hi),
                    None => lo..hi,
                });
            }
        }
        Ok(BatchPart::rows(span.unwrap_or(all)))
    }

    fn step_part(&mut self, step: &TrainStep, batch: &Tree, part: &BatchPart) -> Result<Metrics> {
        let usage = crate::error::Error::Usage;
        let Some(rows) = part.single() else {
            return Err(usage(format!("a step on a mesh takes one range of rows of every batch input, not {part}")));
        };
        if rows == (0..global_batch_rows(step)) {
            return self.step(step, batch);
        }
        let ns = step.state.len();
        let mut inputs: Vec<Vec<HostTensor>> = vec![Vec::with_capacity(step.batch.len()); self.local.len()];
        for ((name, ty), g) in step.batch.iter().zip(&self.pf.inputs[ns..]) {
            let mut want = ty.clone();
            want.shape[0] = rows.len();
            let t = batch.get(name).ok_or_else(|| usage(format!("the batch has no input `{name}`")))?;
            if t.ty() != want {
                return Err(usage(format!(
                    "batch input `{name}` is {}, but rows {}..{} of the global batch ({ty}) are {want}",
                    t.ty(),
                    rows.start,
                    rows.end
                )));
            }
            for (k, &d) in self.local.iter().enumerate() {
                let (mut start, local) = self.block_region(ty, &g.sharding, d)?;
                if !g.sharding.unreduced.is_empty() || start[0] < rows.start || start[0] + local[0] > rows.end {
                    return Err(usage(format!(
                        "device {d}'s block of `{name}` is not within rows {}..{} of the batch",
                        rows.start, rows.end
                    )));
                }
                start[0] -= rows.start;
                let blk = if start.iter().all(|&x| x == 0) && local == want.shape {
                    t.clone()
                } else {
                    let limit: Vec<usize> = start.iter().zip(&local).map(|(s, l)| s + l).collect();
                    let slice = Op::Slice { start, limit, stride: vec![1; local.len()] };
                    eval_op(&slice, &[t])?.remove(0)
                };
                inputs[k].push(blk);
            }
        }
        self.run_blocks(step, inputs)
    }

    fn checkpoint_state(&mut self, step: &TrainStep) -> Result<CheckpointState> {
        // One copy of each distinct block is read back (its lowest device's,
        // the one a save writes), not every replica, and moved into the
        // checkpoint: under dp a save reads one device's state, not eight.
        let spec = mesh_spec(&self.mesh);
        let layouts = step
            .state
            .iter()
            .zip(&self.pf.inputs)
            .map(|(leaf, g)| {
                crate::checkpoint::BlockLayout::new(&spec, &g.sharding, &leaf.ty.shape).map_err(|message| {
                    crate::checkpoint::CheckpointError::InvalidSharding {
                        leaf: leaf.name.clone(),
                        sharding: g.sharding.to_string(),
                        mesh: spec.to_string(),
                        message,
                    }
                })
            })
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let owners: Vec<Vec<usize>> = layouts.iter().map(|l| l.owners()).collect();
        let want: Vec<Vec<bool>> = (0..self.mesh.num_devices())
            .map(|d| layouts.iter().zip(&owners).map(|(l, o)| o[l.block_of(d)] == d).collect())
            .collect();
        let mut per_leaf: Vec<Vec<(usize, HostTensor)>> = step.state.iter().map(|_| Vec::new()).collect();
        let read = self.state_blocks_where(want)?;
        for (&device, blocks) in self.local.iter().zip(read) {
            for (leaf, t) in per_leaf.iter_mut().zip(blocks) {
                leaf.extend(t.map(|t| (device, t)));
            }
        }
        let mut cs = CheckpointState::new(spec);
        for ((leaf, g), blocks) in step.state.iter().zip(&self.pf.inputs).zip(per_leaf) {
            // A replicated leaf of a one-process run is device 0's block;
            // in a multi-process run every leaf is shards (a replicated
            // leaf's block is written by the process owning device 0).
            if g.sharding.is_replicated() && !self.is_partial() {
                let (_, first) = blocks.into_iter().next().expect("device 0 holds every replicated leaf");
                cs.insert_global(leaf.name.clone(), first);
            } else {
                let shards: BTreeMap<usize, HostTensor> = blocks.into_iter().collect();
                cs.insert_sharded(
                    leaf.name.clone(),
                    ShardedLeaf { ty: leaf.ty.clone(), sharding: g.sharding.clone(), shards },
                );
            }
        }
        Ok(cs)
    }

    fn state_layout(&self, step: &TrainStep) -> Vec<weft_ir::TensorSharding> {
        self.pf.inputs[..step.state.len()].iter().map(|g| g.sharding.clone()).collect()
    }

    fn global_state(&mut self, step: &TrainStep) -> Result<Tree> {
        if self.is_partial() {
            return Err(crate::error::Error::Usage(
                "the global state of a multi-process run is never assembled in one process".into(),
            ));
        }
        let blocks = self.state_blocks()?;
        let mut t = Tree::new();
        for (i, (leaf, g)) in step.state.iter().zip(&self.pf.inputs).enumerate() {
            let leaf_blocks: Vec<HostTensor> = blocks.iter().map(|s| s[i].clone()).collect();
            t.insert(leaf.name.clone(), unshard_tensor(&leaf_blocks, &g.sharding, &self.mesh)?);
        }
        Ok(t)
    }

    fn global_params(&mut self, step: &TrainStep) -> Result<Tree> {
        let leaves: Vec<usize> = (0..step.state.len()).filter(|&i| step.state[i].name.starts_with(PARAMS)).collect();
        let processes = match &self.engine {
            Engine::Devices { processes: Some(p), .. } if self.is_partial() => p.clone(),
            _ => return Ok(self.global_state(step)?.into_iter().filter(|(k, _)| k.starts_with(PARAMS)).collect()),
        };
        // Every process sends its devices' parameter blocks, in device
        // then leaf order; every process assembles the global parameters.
        let blocks = self.state_blocks()?;
        let mut mine = Vec::new();
        for device in &blocks {
            for &i in &leaves {
                mine.extend(device[i].to_bytes_le());
            }
        }
        let all = processes.all_gather(&mine, "the parameters for evaluation")?;
        let n = self.mesh.num_devices();
        let mut types = Vec::with_capacity(leaves.len());
        for &i in &leaves {
            let ty = &step.state[i].ty;
            types.push(weft_ir::TensorType::new(
                ty.dtype,
                local_shape(&ty.shape, &self.pf.inputs[i].sharding, &self.mesh)?,
            ));
        }
        let mut per_leaf: Vec<Vec<HostTensor>> = vec![Vec::with_capacity(n); leaves.len()];
        let mut read = vec![0usize; processes.size()];
        for (d, r) in processes.owners(n).into_iter().enumerate() {
            for (j, ty) in types.iter().enumerate() {
                let at = read[r];
                let bytes = all[r].get(at..at + ty.size_bytes()).ok_or_else(|| {
                    crate::error::Error::Usage(format!("process {r} sent too few parameter bytes for device {d}"))
                })?;
                per_leaf[j].push(HostTensor::from_bytes_le(ty, bytes)?);
                read[r] = at + ty.size_bytes();
            }
        }
        let mut t = Tree::new();
        for (&i, leaf_blocks) in leaves.iter().zip(per_leaf) {
            let name = step.state[i].name.clone();
            t.insert(name, unshard_tensor(&leaf_blocks, &self.pf.inputs[i].sharding, &self.mesh)?);
        }
        Ok(t)
    }

    fn device_program(&self) -> Option<&weft_ir::device::DeviceProgram> {
        Some(&self.pf.program)
    }

    fn compile_phases(&self) -> Vec<(&'static str, Duration)> {
        self.phases.clone()
    }

    fn describe(&self) -> String {
        let r = self.pf.report();
        let colls: Vec<String> = r
            .collectives
            .iter()
            .map(|(k, v)| match v.started {
                0 => format!("{} {k}", v.count),
                s => format!("{} {k} ({s} overlapped)", v.count),
            })
            .collect();
        let placement = match &self.engine {
            Engine::Simulator { .. } => format!(
                "backend sim: {} simulated devices in one thread (logical device d = mesh position d of {}, row-major)",
                self.mesh.num_devices(),
                self.mesh
            ),
            Engine::Devices { exe, map, processes } => {
                let local = &self.local;
                let owner = match processes {
                    Some(p) => format!(
                        "{}; process {} of {} on {} owns devices {}..={} ({} of {}, contiguous runs by rank), {}; ",
                        p.hosts().layout(),
                        p.rank(),
                        p.size(),
                        p.hosts().describe(p.rank()),
                        local[0],
                        local[local.len() - 1],
                        local.len(),
                        self.mesh.num_devices(),
                        p.reduction().describe()
                    ),
                    None => String::new(),
                };
                format!(
                    "{}\n{owner}mesh {} (logical device d = mesh position d), {} worker threads, state resident on \
                     the devices",
                    map.to_string().trim_end(),
                    self.mesh,
                    exe.threads()
                )
            }
        };
        format!(
            "{placement}; per device: {} params, {} optimizer state, {} peak live; per step: {}",
            human(r.param_bytes),
            human(r.optimizer_bytes),
            human(r.peak_live_bytes),
            if colls.is_empty() { "no collectives".to_string() } else { colls.join(", ") }
        )
    }
}

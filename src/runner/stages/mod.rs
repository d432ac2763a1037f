//! The pipeline driver: runs a training step cut into stages
//! ([`weft_compiler::stages`]) with one thread per stage, each executing
//! its stage program (receive, forward, send, ..., backward, send back) in
//! the schedule's order, activations and cotangents passed to the
//! neighbouring stages over channels.
//!
//! Each stage's functions are compiled for the sub-mesh of the other axes
//! (`data`, `model`) with the strategy's annotations and run as
//! executables on devices of their own, so PP composes with DP, TP and
//! FSDP: a stage is an SPMD program over its sub-mesh, the stages together
//! are MPMD (one position of the `stage` axis each). With the `interp`
//! backend each stage runs on the reference interpreter instead: the
//! oracle for the pipeline itself.
//!
//! Gradients are accumulated on the host in microbatch order
//! (`g0 + g1 + …`, f32 additions in place into the first microbatch's
//! gradients), the loss likewise, the global norm from every stage's
//! squares in parameter order, so a pipelined step equals the unpipelined
//! accumulating step up to the order of additions inside the backward
//! (bitwise where it is the same).
//!
//! Each stage thread also runs its stage's squares and optimizer update
//! after its last backward, so the stages' updates run concurrently. The
//! driver sums the squares in stage order into the global norm and hands it
//! to the stages whose update reads it (clipping by the global norm); a
//! stage whose update does not read it updates without waiting for the
//! other stages. Either way each stage's update is a function of its own
//! state, gradients and the norm: the result does not depend on the order
//! in which the threads run.
//!
//! With dynamic loss scaling the last stage's backward takes the scale,
//! each stage's squares also say whether its gradients are finite, every
//! stage's update receives the norm and the combined flag (and keeps its
//! old state when a gradient anywhere is not finite), the loss metric is
//! taken from the scaled backward's value and divided by the scale (so
//! the last stage's forward tasks compute nothing: its backward recomputes
//! the forward anyway), and
//! the driver updates the scale as the unpipelined step does
//! ([`weft_compiler::train::LossScaling::next`]).
//!
//! On a one-device sub-mesh the forward and backward executables hold the
//! stage's parameters on their device between runs (reloaded after each
//! update), so a task copies no parameter, and every stage function's
//! inputs and outputs are moved rather than cut into and assembled from
//! blocks.

use crate::data::BatchPart;
use crate::error::{Error, Result};
use crate::runner::Backend;
use std::collections::BTreeMap;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::time::Instant;
use weft_compiler::autoshard::AutoShardOptions;
use weft_compiler::partition::overlap::OverlapOptions;
use weft_compiler::partition::PartitionedFunction;
use weft_compiler::sharding::Mesh;
use weft_compiler::stages::{
    stage_program, Phase, StageBytes, StageFns, StageOp, StagePeak, StagedStep, Task, Trace, TraceEvent,
};
use weft_compiler::train::{Metrics, TrainStep, Tree};
use weft_ir::tensor::HostTensor;
use weft_ir::{DType, Function, Module};
use weft_runtime::{AnyBackend, ExecOptions, Executable};

/// One compiled stage function.
enum Compiled {
    /// The reference interpreter, unsharded.
    Interp(Module, String),
    /// The reference device-program simulator.
    Sim(Box<PartitionedFunction>),
    /// An executable on runtime devices; its first `usize` inputs (the
    /// stage's parameters) are held on the devices between runs.
    Devices(Box<PartitionedFunction>, Box<Executable<AnyBackend>>, usize),
    /// Run on this process's devices of a sub-mesh that spans processes
    /// (stages on processes, [`remote`]).
    Spanning(Box<remote::SpanningFunction>),
    /// Run by other processes only (the stage's first is named): never
    /// compiled here.
    Remote(usize),
}

impl Compiled {
    /// With `auto`, the auto-sharder picks the function's layouts on
    /// `mesh` (`--strategy auto`) before propagation. On runtime devices
    /// of a one-device mesh the first `resident` inputs are held on the
    /// device ([`Compiled::load`]) instead of passed to each run: the
    /// function also returns them unchanged and each such result replaces
    /// its input (donated), so no run copies them. Its devices are opened
    /// in `share` of the host's; with `span` (stages on processes), a
    /// sub-mesh over several processes runs as one SPMD program over them.
    #[allow(clippy::too_many_arguments)] // the function, where it runs, how it is compiled and held
    fn new(
        f: &Function,
        mesh: &Mesh,
        backend: Backend,
        auto: Option<&AutoShardOptions>,
        overlap: Option<OverlapOptions>,
        resident: usize,
        span: Option<(&remote::StageProcesses, usize)>,
        share: weft_runtime::HostShare,
    ) -> Result<Compiled> {
        let m = Module { functions: vec![f.clone()] };
        let kind = match backend {
            Backend::Runtime(kind) => Some(kind),
            Backend::Interp | Backend::Sim => None,
        };
        if backend == Backend::Interp {
            weft_ir::verify_module(&m)?;
            return Ok(Compiled::Interp(m, f.name.clone()));
        }
        let resident =
            if backend != Backend::Sim && mesh.num_devices() == 1 { resident.min(f.params.len()) } else { 0 };
        let n_out = f.results.len();
        let mut m = m;
        if resident > 0 {
            let g = &mut m.functions[0];
            if !g.result_shardings.is_empty() {
                g.result_shardings.extend((0..resident).map(|i| g.values[g.params[i].index()].sharding.clone()));
            }
            g.results.extend_from_slice(&g.params[..resident]);
        }
        let (pf, _) = crate::runner::compile::compile(&m, &f.name, mesh, auto, overlap, None)?;
        let Some(kind) = kind else { return Ok(Compiled::Sim(Box::new(pf))) };
        if let Some((p, s)) = span.filter(|(p, s)| p.processes_of(*s).len() > 1) {
            let options = ExecOptions { threads: Some(1), ..Default::default() };
            return Ok(Compiled::Spanning(Box::new(remote::SpanningFunction::open(pf, kind, p, s, share, options)?)));
        }
        let donate = (0..resident).map(|i| (i, n_out + i)).collect();
        let options = ExecOptions { threads: Some(1), donate, ..Default::default() };
        let all: Vec<usize> = (0..mesh.num_devices()).collect();
        let exe = crate::runner::compile::open_shared(&pf, kind, &all, None, share, options)?.exe;
        Ok(Compiled::Devices(Box::new(pf), Box::new(exe), resident))
    }

    /// How many leading inputs are held on the devices (not passed to
    /// [`Compiled::run`]).
    fn resident(&self) -> usize {
        match self {
            Compiled::Devices(_, _, r) => *r,
            _ => 0,
        }
    }

    /// Whether another process runs it.
    fn is_remote(&self) -> bool {
        matches!(self, Compiled::Remote(_))
    }

    /// Places the held inputs: the first [`Compiled::resident`] of
    /// `inputs` (copies; nothing when none is held).
    fn load(&mut self, inputs: &[HostTensor]) -> Result<()> {
        if let Compiled::Devices(_, exe, r) = self {
            if *r > 0 {
                exe.load_state(vec![inputs[..*r].to_vec()])?;
            }
        }
        Ok(())
    }

    /// The layout of input `i` on the sub-mesh (`None` on the interpreter).
    fn input_layout(&self, i: usize) -> Option<&weft_ir::TensorSharding> {
        match self {
            Compiled::Interp(..) | Compiled::Remote(_) => None,
            Compiled::Sim(pf) | Compiled::Devices(pf, ..) => pf.inputs.get(i).map(|g| &g.sharding),
            Compiled::Spanning(f) => f.function().inputs.get(i).map(|g| &g.sharding),
        }
    }

    /// The rows of input `i` (of `rows` rows) this process's devices read:
    /// every row, but on a sub-mesh spanning processes only its devices'
    /// blocks' rows, and none for another process's function.
    fn input_rows(&self, i: usize, rows: usize) -> Result<Vec<std::ops::Range<usize>>> {
        match self {
            Compiled::Remote(_) => Ok(Vec::new()),
            Compiled::Spanning(f) => f.local_rows(i),
            _ => Ok(std::iter::once(0..rows).collect()),
        }
    }

    /// Runs on whole host tensors: the inputs after the
    /// [`Compiled::resident`] ones. On a one-device sub-mesh the inputs
    /// are moved to the device and its outputs are the results (no block
    /// is cut or assembled, so nothing is copied on the way).
    fn run(&mut self, inputs: Vec<HostTensor>) -> Result<Vec<HostTensor>> {
        match self {
            Compiled::Interp(m, name) => Ok(weft_ir::interp::run(m, name, &inputs)?),
            Compiled::Remote(p) => Err(Error::Usage(format!("pipeline: a chunk of process {p} was run here"))),
            Compiled::Spanning(f) => f.run(inputs),
            Compiled::Sim(pf) => Ok(pf.run(&inputs, super::MAX_SIMULATED_DEVICES)?),
            Compiled::Devices(pf, exe, r) => {
                let one = pf.mesh.num_devices() == 1;
                if one {
                    check_inputs(pf, *r, &inputs)?;
                    let mut outs = exe.run(vec![inputs])?;
                    return Ok(outs.pop().unwrap_or_default());
                }
                let per = pf.shard_inputs(&inputs)?;
                Ok(pf.unshard_outputs(exe.run(per)?)?)
            }
        }
    }
}

/// The state leaf of optimizer slot `slot` (`opt.m`) of parameter `param`
/// (`params.h.0.w` → `opt.m.h.0.w`).
fn slot_leaf(slot: &str, param: &str) -> String {
    format!("{slot}.{}", param.strip_prefix("params.").unwrap_or(param))
}

/// Stage `s`'s share of the host's devices: its process's share (the
/// whole host in one process) divided evenly among the stages the process
/// runs, so that the stages' CPU devices split the cores rather than each
/// taking all of them, and on GPUs each stage gets its own devices.
fn stage_share(processes: Option<&remote::StageProcesses>, stages: usize, s: usize) -> weft_runtime::HostShare {
    let (base, here): (weft_runtime::HostShare, Vec<usize>) = match processes {
        Some(p) => (p.share(), (0..stages).filter(|&t| p.runs(t)).collect()),
        None => (weft_runtime::HostShare::ALONE, (0..stages).collect()),
    };
    let k = here.len().max(1);
    let j = here.iter().position(|&t| t == s).unwrap_or(0);
    weft_runtime::HostShare { index: base.index * k + j, of: base.of * k }
}

/// Checks the inputs after the first `held` of `pf` (their number and
/// types), as [`PartitionedFunction::shard_inputs`] checks them all.
fn check_inputs(pf: &PartitionedFunction, held: usize, inputs: &[HostTensor]) -> Result<()> {
    let want = &pf.inputs[held.min(pf.inputs.len())..];
    if inputs.len() != want.len() {
        let names: Vec<&str> = want.iter().map(|g| g.name.as_str()).collect();
        let message = format!(
            "@{} takes {} inputs ({}) besides the {held} held on its device, given {}",
            pf.program.name,
            want.len(),
            names.join(", "),
            inputs.len()
        );
        return Err(
            weft_ir::IrError::Input { name: format!("arg{}", held + inputs.len().min(want.len())), message }.into()
        );
    }
    for (g, t) in want.iter().zip(inputs) {
        if !t.has_type(&g.ty) {
            let message = format!("expected {}, given {}", g.ty, t.ty());
            return Err(weft_ir::IrError::Input { name: g.name.clone(), message }.into());
        }
    }
    Ok(())
}

/// A stage's compiled functions and state.
struct Stage {
    fns: StageFns,
    forward: Compiled,
    backward: Compiled,
    square: Compiled,
    update: Compiled,
    /// Parameters, then slots (slot-major), as `update` takes them.
    params: Vec<HostTensor>,
    slots: Vec<HostTensor>,
    /// Whether `update` reads its `norm` input (clipping by the global
    /// norm) or its `finite` input (loss scaling): the stage's update then
    /// waits for every stage's squares.
    update_waits: bool,
}

/// Whether `f` reads its parameter named `name` (an instruction's operand
/// or a result).
fn reads_param(f: &Function, name: &str) -> bool {
    let Some(i) = (0..f.params.len()).find(|&i| f.param_name(i) == name) else { return false };
    let v = f.params[i];
    f.results.contains(&v) || f.insts.iter().any(|inst| inst.operands.contains(&v))
}

/// What a stage sends the driver after its backwards.
#[derive(Debug)]
struct Squares {
    /// Σ g² per parameter.
    values: Vec<f32>,
    /// 1 when the stage's gradients are finite (always 1 without loss
    /// scaling).
    finite: f32,
}

/// What the driver sends the stages that wait for it.
#[derive(Clone, Copy, Debug)]
struct Norm {
    /// The global norm.
    norm: f32,
    /// 1 when every stage's gradients are finite.
    finite: f32,
}

/// What a stage thread sends to a neighbour: a microbatch and its tensors.
type Msg = (usize, Vec<HostTensor>);

/// Where a chunk sends in one direction: a neighbouring chunk in this
/// process, or the sending thread of a link to another process (in
/// microbatch order, which the link keeps).
enum Outbox {
    Local(Sender<Msg>),
    Remote(Sender<Vec<HostTensor>>),
}

impl Outbox {
    fn send(&self, m: usize, tensors: Vec<HostTensor>) -> std::result::Result<(), ()> {
        match self {
            Outbox::Local(tx) => tx.send((m, tensors)).map_err(|_| ()),
            Outbox::Remote(tx) => tx.send(tensors).map_err(|_| ()),
        }
    }
}

/// Where a chunk receives from in one direction: a neighbouring chunk in
/// this process, or another process (the link after chunk `boundary`,
/// messages of `types`).
enum Inbox {
    Local(Receiver<Msg>),
    Remote { peer: usize, boundary: usize, cotangents: bool, types: Vec<weft_ir::TensorType> },
}

/// A chunk's ends of one direction: to its neighbour, from its neighbour.
type Link = (Option<Outbox>, Option<Inbox>);

/// What a stage's run of one step produced.
struct StageRun {
    /// Per chunk of the stage: its gradients summed over the microbatches.
    grads: Vec<Vec<HostTensor>>,
    /// The learning rate its update used (once it has run).
    lr: f32,
    /// Per microbatch in order (the stage of the last chunk only): loss
    /// (scaled with loss scaling) and auxiliary metrics.
    outputs: Vec<Vec<HostTensor>>,
    events: Vec<TraceEvent>,
    /// The most bytes of activations the stage held between tasks
    /// (stashes, activations and cotangents waiting to be sent or used).
    held_peak: u64,
}

/// Bytes of host tensors.
fn bytes_of(ts: &[HostTensor]) -> u64 {
    ts.iter().map(|t| (t.len() * t.dtype().size_bytes()) as u64).sum()
}

/// Runs a [`StagedStep`] on one stage thread per stage.
pub struct PipelineExecutor {
    staged: StagedStep,
    stages: Vec<Stage>,
    step: HostTensor,
    /// The state's PRNG key (`rng`), when the model takes one.
    rng: Option<HostTensor>,
    /// With loss scaling: the scale and the good-step counter
    /// (`loss_scale.scale`, `loss_scale.good_steps`).
    loss_scale: Option<(f32, i32)>,
    mesh: Mesh,
    /// The mesh its checkpoints record: the whole mesh, stage axis included
    /// ([`PipelineExecutor::set_checkpoint_mesh`]; one device by default).
    checkpoint_mesh: crate::checkpoint::MeshSpec,
    backend: Backend,
    last_trace: Option<Trace>,
    compile_secs: f64,
    serial: bool,
    held_peaks: Vec<u64>,
    /// Stages on processes: which process runs each stage (`None`: all
    /// here).
    processes: Option<remote::StageProcesses>,
    /// Tracing (`--trace`): the mode, and the last traced step's tasks as
    /// trace spans.
    tracing: Option<weft_runtime::TraceMode>,
    traced: Option<weft_runtime::Trace>,
}

fn rows(t: &HostTensor, m: usize, k: usize) -> Result<HostTensor> {
    let ty = t.ty();
    let n = ty.shape.first().copied().unwrap_or(0);
    if k == 0 || n % k != 0 {
        return Err(weft_compiler::CompilerError::PipelineMicrobatches { microbatches: k, batch: n }.into());
    }
    let bytes = t.to_bytes_le();
    let per = bytes.len() / k;
    let mut shape = ty.shape.clone();
    shape[0] = n / k;
    Ok(HostTensor::from_bytes_le(&weft_ir::TensorType::new(ty.dtype, shape), &bytes[m * per..(m + 1) * per])?)
}

/// `acc += b` for f32 tensors of one shape, element by element in place
/// (IEEE single additions, as the IR's `add`).
fn add_into(acc: &mut HostTensor, b: &HostTensor) -> Result<()> {
    match (&mut *acc, b) {
        (HostTensor::F32(x), HostTensor::F32(y)) if x.shape() == y.shape() => {
            x.zip_mut_with(y, |p, q| *p += *q);
            Ok(())
        }
        _ => Err(Error::Usage(format!(
            "pipeline stages accumulate f32 gradients and losses of one shape, got {} and {}",
            acc.ty(),
            b.ty()
        ))),
    }
}

fn scalar_f32(t: &HostTensor) -> f32 {
    t.as_f32().and_then(|a| a.iter().next().copied()).unwrap_or(f32::NAN)
}

impl PipelineExecutor {
    /// Compiles every stage's functions for `sub_mesh` (the mesh without
    /// its stage axis) on `backend` (`interp`, `sim`, `cpu`, ...).
    pub fn new(staged: StagedStep, sub_mesh: &Mesh, backend: Backend) -> Result<PipelineExecutor> {
        PipelineExecutor::with_auto(staged, sub_mesh, backend, None, None)
    }

    /// [`PipelineExecutor::with_auto`] as one process of a job whose stages
    /// run on several processes ([`remote`]): only the chunks of this
    /// process's stages are compiled.
    pub fn on_processes(
        staged: StagedStep,
        sub_mesh: &Mesh,
        backend: Backend,
        auto: Option<&AutoShardOptions>,
        overlap: Option<OverlapOptions>,
        processes: remote::StageProcesses,
    ) -> Result<PipelineExecutor> {
        PipelineExecutor::build(staged, sub_mesh, backend, auto, overlap, Some(processes))
    }

    /// [`PipelineExecutor::new`]; with `auto` (`--strategy auto`), the
    /// auto-sharder picks the layouts of each stage function on
    /// `sub_mesh` under these options (machine model, memory budget per
    /// device). Each function takes and returns whole host tensors (the
    /// driver shards its inputs and gathers its outputs), so the four
    /// functions of a stage may choose different layouts. With `overlap`
    /// each stage function's collectives overlap its compute
    /// (`[overlap]`), as a whole-mesh step's do.
    pub fn with_auto(
        staged: StagedStep,
        sub_mesh: &Mesh,
        backend: Backend,
        auto: Option<&AutoShardOptions>,
        overlap: Option<OverlapOptions>,
    ) -> Result<PipelineExecutor> {
        PipelineExecutor::build(staged, sub_mesh, backend, auto, overlap, None)
    }

    fn build(
        staged: StagedStep,
        sub_mesh: &Mesh,
        backend: Backend,
        auto: Option<&AutoShardOptions>,
        overlap: Option<OverlapOptions>,
        processes: Option<remote::StageProcesses>,
    ) -> Result<PipelineExecutor> {
        let clock = Instant::now();
        let mut stages = Vec::with_capacity(staged.stages.len());
        let s_n = staged.config.stages;
        for (c, fns) in staged.stages.iter().enumerate() {
            let np = fns.params.len();
            let here = processes.as_ref().map_or(Ok(()), |p| match p.runs(c % s_n) {
                true => Ok(()),
                false => Err(p.first(c % s_n)),
            });
            let span = processes.as_ref().map(|p| (p, c % s_n));
            let share = stage_share(processes.as_ref(), s_n, c % s_n);
            let compile = |f: &Function, resident: usize| match here {
                Ok(()) => Compiled::new(f, sub_mesh, backend, auto, overlap, resident, span, share),
                Err(first) => Ok(Compiled::Remote(first)),
            };
            stages.push(Stage {
                update_waits: reads_param(&fns.update, "norm") || reads_param(&fns.update, "finite"),
                forward: compile(&fns.forward, np)?,
                backward: compile(&fns.backward, np)?,
                square: compile(&fns.square, 0)?,
                update: compile(&fns.update, 0)?,
                fns: fns.clone(),
                params: Vec::new(),
                slots: Vec::new(),
            });
        }
        Ok(PipelineExecutor {
            staged,
            stages,
            step: HostTensor::scalar(DType::I32, 0.0),
            rng: None,
            loss_scale: None,
            mesh: sub_mesh.clone(),
            checkpoint_mesh: crate::checkpoint::MeshSpec::single(),
            backend,
            last_trace: None,
            compile_secs: clock.elapsed().as_secs_f64(),
            serial: false,
            held_peaks: Vec::new(),
            processes,
            tracing: None,
            traced: None,
        })
    }

    /// With `serial`, one task runs at a time (the stages still follow
    /// the schedule): each task's duration on the trace is then its own,
    /// not shared with other stages' tasks on the same cores, for
    /// replaying the schedule as on one core per stage.
    pub fn set_serial(&mut self, serial: bool) {
        self.serial = serial;
    }

    /// The mesh its checkpoints record (the run's whole mesh, stage axis
    /// included). The state is saved as global tensors either way: the
    /// host holds every stage's leaves whole.
    pub fn set_checkpoint_mesh(&mut self, whole: &Mesh) {
        self.checkpoint_mesh = crate::runner::mesh_spec(whole);
    }

    /// Per chunk (a stage unless interleaved): each parameter's layout on
    /// the sub-mesh as the chunk's optimizer update takes it (where the parameters, their gradients
    /// and slots meet; replicated on the interpreter), by name.
    pub fn param_layouts(&self) -> Vec<Vec<(String, weft_ir::TensorSharding)>> {
        self.stages
            .iter()
            .map(|st| {
                let f = &st.fns.update;
                (st.fns.params.iter().enumerate())
                    .map(|(i, n)| {
                        let rank = f.ty(f.params[i]).rank();
                        let l = st.update.input_layout(i).cloned();
                        (n.clone(), l.unwrap_or_else(|| weft_ir::TensorSharding::replicated(rank)))
                    })
                    .collect()
            })
            .collect()
    }

    /// Whether this process runs stage `s` (always, in one process).
    pub fn runs_stage(&self, s: usize) -> bool {
        self.processes.as_ref().is_none_or(|p| p.runs(s))
    }

    /// The processes running each stage (process 0 alone in one process).
    pub fn stage_processes(&self) -> Vec<Vec<usize>> {
        (0..self.staged.config.stages)
            .map(|s| self.processes.as_ref().map_or(vec![0], |p| p.processes_of(s).to_vec()))
            .collect()
    }

    /// The cut step.
    pub fn staged(&self) -> &StagedStep {
        &self.staged
    }

    /// Seconds spent compiling the stage functions.
    pub fn compile_secs(&self) -> f64 {
        self.compile_secs
    }

    /// The last step's schedule trace on the executor's clock (seconds
    /// from the step's start).
    pub fn last_trace(&self) -> Option<&Trace> {
        self.last_trace.as_ref()
    }

    /// Per stage, measured in the last step: the most bytes of activations
    /// the stage (all its chunks) held between tasks (what [`StagePeak::activations`]
    /// predicts).
    pub fn held_peaks(&self) -> &[u64] {
        &self.held_peaks
    }

    /// Per stage: the buffers of its chunks' programs and their peak under
    /// the schedule (per device of the stage's sub-mesh for the
    /// transients).
    pub fn stage_memory(&self) -> Vec<(Vec<StageBytes>, StagePeak)> {
        let pc = &self.staged.config;
        (0..pc.stages)
            .map(|s| {
                let prog = stage_program(pc.schedule, pc.stages, pc.microbatches, s);
                let slots = self.staged.slots.len();
                let b: Vec<StageBytes> =
                    prog.own_chunks().into_iter().map(|c| stage_bytes(&self.stages[c], slots)).collect();
                let p = prog.peak(&b);
                (b, p)
            })
            .collect()
    }

    /// Loads the global state `state` (leaves by name).
    pub fn load_tree(&mut self, state: &Tree) -> Result<()> {
        let get = |n: &str| {
            state.get(n).cloned().ok_or_else(|| Error::Usage(format!("the pipeline state has no leaf `{n}`")))
        };
        for st in &mut self.stages {
            if st.forward.is_remote() {
                // Another process holds this chunk's state.
                st.params = Vec::new();
                st.slots = Vec::new();
                continue;
            }
            st.params = st.fns.params.iter().map(|n| get(n)).collect::<Result<_>>()?;
            st.forward.load(&st.params)?;
            st.backward.load(&st.params)?;
            st.slots = Vec::new();
            for slot in &self.staged.slots {
                for n in &st.fns.params {
                    st.slots.push(get(&slot_leaf(slot, n))?);
                }
            }
        }
        self.step = get("step")?;
        self.rng = state.get("rng").cloned();
        self.loss_scale = match self.staged.loss_scaling {
            Some(_) => {
                let scale = get("loss_scale.scale")?.to_f64_vec()[0] as f32;
                Some((scale, get("loss_scale.good_steps")?.to_f64_vec()[0] as i32))
            }
            None => None,
        };
        Ok(())
    }

    /// The global state (leaves by name). With stages on processes, the
    /// chunks of the other processes are gathered from them: every process
    /// calls this at the same point.
    pub fn gathered_tree(&self) -> Result<Tree> {
        let Some(p) = &self.processes else { return Ok(self.tree()) };
        // The chunks of the stages each process leads, in chunk order:
        // parameters, then slots.
        let s_n = self.staged.config.stages;
        let mine: Vec<u8> = (self.stages.iter().enumerate())
            .filter(|(c, _)| p.leads(c % s_n))
            .flat_map(|(_, st)| st.params.iter().chain(&st.slots).flat_map(|t| t.to_bytes_le()))
            .collect();
        let all = p.all_gather(&mine, "pipeline: gathering the state of every stage")?;
        let mut at = vec![0usize; all.len()];
        let mut t = self.tree();
        let np_all: Vec<usize> = self.stages.iter().map(|st| st.fns.params.len()).collect();
        for (c, st) in self.stages.iter().enumerate() {
            let owner = p.first(c % s_n);
            let types = remote::state_types(&self.staged, c);
            let len: usize = types.iter().map(|t| t.size_bytes()).sum();
            let bytes = all[owner]
                .get(at[owner]..at[owner] + len)
                .ok_or_else(|| Error::Usage(format!("pipeline: process {owner} sent a state short of chunk {c}'s")))?;
            at[owner] += len;
            if !st.forward.is_remote() {
                continue;
            }
            let leaves = remote::split(bytes, &types)?;
            let np = np_all[c];
            for (i, v) in leaves.into_iter().enumerate() {
                let n = &st.fns.params[i % np];
                let name = if i < np { n.clone() } else { slot_leaf(&self.staged.slots[i / np - 1], n) };
                t.insert(name, v);
            }
        }
        Ok(t)
    }

    /// The state this process holds (leaves by name): every leaf, unless
    /// stages run on processes ([`PipelineExecutor::gathered_tree`]).
    pub fn tree(&self) -> Tree {
        let mut t = Tree::new();
        for st in &self.stages {
            for (n, v) in st.fns.params.iter().zip(&st.params) {
                t.insert(n.clone(), v.clone());
            }
            let np = st.fns.params.len();
            if st.slots.is_empty() {
                continue;
            }
            for (q, slot) in self.staged.slots.iter().enumerate() {
                for (j, n) in st.fns.params.iter().enumerate() {
                    t.insert(slot_leaf(slot, n), st.slots[q * np + j].clone());
                }
            }
        }
        t.insert("step".into(), self.step.clone());
        if let Some(r) = &self.rng {
            t.insert("rng".into(), r.clone());
        }
        if let Some((scale, good)) = self.loss_scale {
            t.insert("loss_scale.scale".into(), HostTensor::from_f32(&[], vec![scale]).expect("a scalar"));
            t.insert("loss_scale.good_steps".into(), HostTensor::from_i32(&[], vec![good]).expect("a scalar"));
        }
        t
    }

    /// Runs one step on `batch` (the whole batch; it is cut into the
    /// configured microbatches).
    pub fn run_step(&mut self, batch: &Tree) -> Result<Metrics> {
        let pc = self.staged.config.clone();
        let (s_n, k) = (pc.stages, pc.microbatches);
        // Microbatch rows of every batch input, by name.
        let mut micro: BTreeMap<String, Vec<HostTensor>> = BTreeMap::new();
        for (name, t) in batch {
            micro.insert(name.clone(), (0..k).map(|m| rows(t, m, k)).collect::<Result<_>>()?);
        }
        if let Some(r) = &self.rng {
            // As the unpipelined step: fold_in(key, step), then the
            // microbatch index when there are several.
            let bits: Vec<u32> = r.to_f64_vec().iter().map(|&b| b as u32).collect();
            let key = weft_ir::prng::Key([bits[0], bits[1]]).fold_in(self.step.to_f64_vec()[0] as u32);
            let keys = (0..k)
                .map(|m| {
                    let km = if k > 1 { key.fold_in(m as u32) } else { key };
                    HostTensor::from_u32(&[2], km.0.to_vec())
                })
                .collect::<std::result::Result<_, _>>()?;
            micro.insert("rng".into(), keys);
        }
        // One channel per chunk boundary and direction: chunk c sends its
        // activations to chunk c + 1 and its input cotangents to c − 1;
        // across processes, a link of the process group (module `remote`).
        let chunks = self.stages.len();
        let procs = self.processes.clone();
        let here = |c: usize| procs.as_ref().is_none_or(|p| p.runs(c % s_n));
        let mut fwd: Vec<Link> = (0..chunks).map(|_| (None, None)).collect();
        let mut bwd: Vec<Link> = (0..chunks).map(|_| (None, None)).collect();
        let mut senders = Vec::new();
        for c in 0..chunks.saturating_sub(1) {
            let (from, to) = (c % s_n, (c + 1) % s_n);
            match &procs {
                _ if !here(c) && !here(c + 1) => {}
                Some(p) if here(c) && p.peer(from, to) != p.rank() => {
                    // Activations out to the next stage's process at our
                    // place; its cotangents back from it.
                    let peer = p.peer(from, to);
                    let (tx, rx) = channel();
                    senders.push(p.sender(peer, c, false, rx));
                    fwd[c].0 = Some(Outbox::Remote(tx));
                    let fns = &self.staged.stages[c];
                    let types = fns.act_out.iter().zip(&fns.act_out_float).filter(|(_, &f)| f).map(|(t, _)| t.clone());
                    bwd[c].1 = Some(Inbox::Remote { peer, boundary: c, cotangents: true, types: types.collect() });
                    if here(c + 1) {
                        receive_from_previous(p, c, &self.staged, &mut fwd, &mut bwd, &mut senders);
                    }
                }
                Some(p) if !here(c) => receive_from_previous(p, c, &self.staged, &mut fwd, &mut bwd, &mut senders),
                _ if here(c + 1) => {
                    let (tx, rx) = channel();
                    fwd[c].0 = Some(Outbox::Local(tx));
                    fwd[c + 1].1 = Some(Inbox::Local(rx));
                    let (tx, rx) = channel();
                    bwd[c + 1].0 = Some(Outbox::Local(tx));
                    bwd[c].1 = Some(Inbox::Local(rx));
                }
                _ => unreachable!("chunk {c} runs here and its peer is this process, so chunk {} runs here", c + 1),
            }
        }
        let start = Instant::now();
        let micro = &micro;
        let lock = std::sync::Mutex::new(());
        let serial = self.serial.then_some(&lock);
        let step = &self.step;
        if self.staged.loss_scaling.is_some() && self.loss_scale.is_none() {
            return Err(Error::Usage("the pipeline's loss scale was not loaded".into()));
        }
        let scale = self.loss_scale.map(|(s, _)| HostTensor::from_f32(&[], vec![s])).transpose()?;
        let scale = scale.as_ref();
        // Each chunk sends its squares (and finiteness flag); the chunks
        // whose update reads the global norm (or the flag) receive them.
        let (sq_tx, sq_rx): (Vec<_>, Vec<_>) = (0..chunks).map(|_| channel::<Squares>()).unzip();
        let (norm_tx, norm_rx): (Vec<_>, Vec<_>) = (0..chunks).map(|_| channel::<Norm>()).unzip();
        // Each stage thread gets its chunks (c ≡ s mod S) with their ends;
        // only the stages of this process run here.
        let mut per_stage: Vec<Vec<ChunkEnds>> = (0..s_n).map(|_| Vec::new()).collect();
        for (c, (((st, (f, b)), sq), nr)) in
            self.stages.iter_mut().zip(fwd.into_iter().zip(bwd)).zip(sq_tx).zip(norm_rx).enumerate()
        {
            if here(c) {
                per_stage[c % s_n].push(ChunkEnds { chunk: c, stage: st, fwd: f, bwd: b, squares: sq, norm: nr });
            }
        }
        let staged = &self.staged;
        let procs = procs.as_ref();
        let (runs, norm): (Vec<(usize, StageResult)>, Result<Option<Norm>>) = std::thread::scope(|sc| {
            let handles: Vec<_> = per_stage
                .into_iter()
                .enumerate()
                .filter(|(_, own)| !own.is_empty())
                .map(|(s, mut own)| {
                    let prog = stage_program(pc.schedule, s_n, k, s);
                    let handle = sc.spawn(move || {
                        let r = run_stage(s, &mut own, &prog.ops, micro, start, serial, scale, procs)
                            .and_then(|run| finish_stage(s, &mut own, run, step, scale, serial));
                        if let (Err(StageError::Own(e)), Some(p)) = (&r, procs) {
                            // The other processes wait for this stage's
                            // messages: stop the job now, with the cause.
                            p.fail(e);
                        }
                        r
                    });
                    (s, handle)
                })
                .collect();
            // The global norm from every chunk's squares, in parameter
            // order; finite when every chunk's gradients are.
            let mut local: Vec<Option<Squares>> = (0..chunks).map(|_| None).collect();
            let mut failed = false;
            for (c, rx) in sq_rx.iter().enumerate().filter(|(c, _)| here(*c)) {
                match rx.recv() {
                    Ok(sq) => local[c] = Some(sq),
                    Err(_) => failed = true,
                }
            }
            let norm = if failed { Ok(None) } else { global_norm(staged, procs, local) };
            if let Ok(Some(n)) = norm {
                for tx in &norm_tx {
                    // A chunk that does not wait for the norm has hung up.
                    let _ = tx.send(n);
                }
            }
            drop(norm_tx);
            let runs = handles
                .into_iter()
                .map(|(s, h)| {
                    let r = h
                        .join()
                        .unwrap_or_else(|_| Err(StageError::Own(Error::Usage("a stage thread panicked".into()))));
                    (s, r)
                })
                .collect();
            (runs, norm)
        });
        let (stage_ids, runs): (Vec<usize>, Vec<StageResult>) = runs.into_iter().unzip();
        // The senders end once the stages have dropped their ends; a
        // sender's failure (naming the process it could not reach) comes
        // before a stage's "the neighbour stopped".
        let sent: Vec<Result<()>> = senders
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(Error::Usage("a pipeline sender panicked".into()))))
            .collect();
        // The driver's own failure (gathering the squares, which names the
        // process it waited for) comes before the stages it stopped.
        let own = runs.iter().any(|r| matches!(r, Err(StageError::Own(_))));
        let norm = match norm {
            Err(e) if !own => return Err(e),
            n => n,
        };
        let runs = first_error_or_sender(runs, sent)?;
        // Every stage that ran sent its squares.
        let norm = norm?.ok_or_else(|| Error::Usage("pipeline: a stage sent no squares".into()))?;
        let (finite, norm) = (norm.finite == 1.0, norm.norm);
        let lr = runs.last().map_or(f32::NAN, |r| r.lr);
        self.step = HostTensor::from_i32(&[], vec![self.step.to_f64_vec()[0] as i32 + 1])?;
        // Loss and auxiliary metrics: summed in microbatch order, then the
        // mean, by the process running the last stage (sent to the others).
        let names: Vec<String> = std::iter::once("loss".to_string()).chain(self.staged.aux.iter().cloned()).collect();
        let last = stage_ids.iter().position(|&s| s == s_n - 1);
        let mut values = Vec::new();
        if let Some(i) = last {
            let outs = &runs[i].outputs;
            for j in 0..names.len() {
                let mut acc = outs[0][j].clone();
                for o in &outs[1..] {
                    add_into(&mut acc, &o[j])?;
                }
                let v = scalar_f32(&acc);
                let mut v = if k > 1 { v * (1.0 / k as f64) as f32 } else { v };
                if let (0, Some((scale, _))) = (j, self.loss_scale) {
                    v /= scale;
                }
                values.push(v);
            }
        }
        let mut events: Vec<TraceEvent> = runs.iter().flat_map(|r| r.events.iter().cloned()).collect();
        if let Some(p) = &self.processes {
            // The last stage's metrics to every process, and every
            // process's trace events to every process (each on its own
            // clock from its own step's start).
            // Only the events of the stages this process leads (the other
            // processes of a stage ran the same tasks).
            events.retain(|e| p.leads(e.stage));
            let mine = remote::encode_step(&values, &events);
            let all = p.all_gather(&mine, "pipeline: the loss of the last stage")?;
            let mut theirs = Vec::new();
            for (q, bytes) in all.iter().enumerate() {
                let (v, e) = remote::decode_step(bytes)?;
                if q == p.first(s_n - 1) {
                    values = v;
                }
                if q != p.rank() {
                    theirs.extend(e);
                }
            }
            events.extend(theirs);
            events.sort_by(|a, b| a.stage.cmp(&b.stage).then(a.start.total_cmp(&b.start)));
        }
        let mut metrics = Metrics::new();
        for (name, v) in names.iter().zip(values) {
            metrics.insert(name.clone(), v as f64);
        }
        metrics.insert("grad_norm".into(), norm as f64);
        metrics.insert("lr".into(), lr as f64);
        if let (Some(ls), Some((scale, good))) = (&self.staged.loss_scaling, self.loss_scale) {
            metrics.insert("skipped".into(), if finite { 0.0 } else { 1.0 });
            metrics.insert("loss_scale".into(), scale as f64);
            self.loss_scale = Some(ls.next(scale, good, finite));
        }
        // Stages of other processes: nothing measured here.
        self.held_peaks = vec![0; s_n];
        for (&s, r) in stage_ids.iter().zip(&runs) {
            self.held_peaks[s] = r.held_peak;
        }
        if let Some(mode) = self.tracing {
            self.traced = Some(task_spans(start, mode, &events));
        }
        self.last_trace = Some(Trace { stages: s_n, clock: "seconds".into(), events });
        Ok(metrics)
    }
}

/// A step's tasks as trace spans (`--trace`): one lane per stage, from the
/// step's `start`.
fn task_spans(start: Instant, mode: weft_runtime::TraceMode, events: &[TraceEvent]) -> weft_runtime::Trace {
    let ns = |s: f64| (s.max(0.0) * 1e9) as u64;
    let spans = events
        .iter()
        .map(|e| {
            let t = e.task;
            let phase = if t.phase == Phase::Forward { "forward" } else { "backward" };
            let name = if t.chunk == e.stage {
                format!("{}{}", t.phase.letter(), t.micro)
            } else {
                format!("{}{}/c{}", t.phase.letter(), t.micro, t.chunk)
            };
            weft_runtime::Span {
                device: e.stage,
                kind: weft_runtime::SpanKind::Task,
                name,
                step: None,
                start_ns: ns(e.start),
                dur_ns: ns(e.end).saturating_sub(ns(e.start)),
                bytes: 0,
                detail: format!("{phase} of chunk {} on microbatch {}", t.chunk, t.micro),
            }
        })
        .collect();
    weft_runtime::Trace { start, mode, spans }
}

/// The global norm and finiteness flag from the chunks' squares, summed
/// in chunk order (parameter order): `local[c]` holds the squares of each
/// chunk run here; with stages on processes, every process's are
/// gathered first (each sends `[finite, Σ g² …]` per chunk of its own, in
/// chunk order), so every process sums the same numbers in the same order.
fn global_norm(
    staged: &StagedStep,
    processes: Option<&remote::StageProcesses>,
    mut local: Vec<Option<Squares>>,
) -> Result<Option<Norm>> {
    if let Some(p) = processes {
        let s_n = staged.config.stages;
        let mine: Vec<f32> = (local.iter().enumerate())
            .filter(|(c, _)| p.leads(c % s_n))
            .flat_map(|(_, sq)| sq.iter().flat_map(|sq| std::iter::once(sq.finite).chain(sq.values.iter().copied())))
            .collect();
        let all = p.all_gather(&remote::f32_bytes(&mine), "pipeline: the squares of every stage")?;
        let mut all: Vec<std::collections::VecDeque<f32>> =
            all.iter().map(|b| remote::bytes_f32(b).into_iter().collect()).collect();
        for (c, slot) in local.iter_mut().enumerate() {
            let theirs = &mut all[p.first(c % s_n)];
            let n = staged.stages[c].params.len();
            if theirs.len() < 1 + n {
                return Err(Error::Usage(format!("pipeline: process {} sent too few squares", p.first(c % s_n))));
            }
            let finite = theirs.pop_front().expect("checked");
            let values: Vec<f32> = theirs.drain(..n).collect();
            if slot.is_none() {
                *slot = Some(Squares { values, finite });
            }
        }
    }
    let mut total = Norm { norm: 0.0, finite: 1.0 };
    for sq in &local {
        let Some(sq) = sq else { return Ok(None) };
        sq.values.iter().for_each(|x| total.norm += x);
        total.finite = total.finite.min(sq.finite);
    }
    Ok(Some(Norm { norm: total.norm.sqrt(), ..total }))
}

/// The buffers of a chunk's part of its stage's program, with `slots`
/// optimizer slots per parameter.
fn stage_bytes(st: &Stage, slots: usize) -> StageBytes {
    let f = &st.fns.forward;
    let bytes = |ts: &[weft_ir::TensorType], keep: Option<&[bool]>| -> u64 {
        ts.iter().enumerate().filter(|(i, _)| keep.is_none_or(|k| k[*i])).map(|(_, t)| t.size_bytes() as u64).sum()
    };
    let np = st.fns.params.len();
    let param_bytes: u64 = (0..np).map(|i| f.ty(f.params[i]).size_bytes() as u64).sum();
    let batch_bytes: u64 = (np..np + st.fns.batch.len()).map(|i| f.ty(f.params[i]).size_bytes() as u64).sum();
    // From the update's types: another process's chunk holds no slots here.
    let u = &st.fns.update;
    let slot_bytes: u64 = (np..np * (1 + slots)).map(|i| u.ty(u.params[i]).size_bytes() as u64).sum();
    let fwd_live = weft_compiler::memory::peak_live_bytes(f);
    let bwd_live = weft_compiler::memory::peak_live_bytes(&st.fns.backward);
    StageBytes {
        resident: 2 * param_bytes + slot_bytes,
        stash: batch_bytes + bytes(&st.fns.act_in, None),
        act_out: bytes(&st.fns.act_out, None),
        cot_out: bytes(&st.fns.act_out, Some(&st.fns.act_out_float)),
        cot_in: bytes(&st.fns.act_in, Some(&st.fns.act_in_float)),
        forward_transient: (fwd_live.peak - fwd_live.params) as u64,
        backward_transient: (bwd_live.peak - bwd_live.params) as u64,
    }
}

/// One chunk as its stage thread holds it during a step: its functions
/// and state, its links to the neighbouring chunks, and its ends of the
/// driver's squares and norm channels.
struct ChunkEnds<'a> {
    chunk: usize,
    stage: &'a mut Stage,
    /// To chunk `c + 1` (activations), from chunk `c − 1`.
    fwd: Link,
    /// To chunk `c − 1` (cotangents), from chunk `c + 1`.
    bwd: Link,
    squares: Sender<Squares>,
    norm: Receiver<Norm>,
}

/// A chunk's buffers during a step: stashes, activations and cotangents
/// by microbatch, and its gradients accumulated so far.
#[derive(Default)]
struct ChunkBuffers {
    stash: BTreeMap<usize, Vec<HostTensor>>,
    out_acts: BTreeMap<usize, Vec<HostTensor>>,
    cots: BTreeMap<usize, Vec<HostTensor>>,
    cot_in: BTreeMap<usize, Vec<HostTensor>>,
    grads: Option<Vec<HostTensor>>,
}

/// The links of chunk `c + 1` (run here) with chunk `c` on another
/// process: activations in from the previous stage's process at this
/// process's place, cotangents back out to it.
fn receive_from_previous(
    p: &remote::StageProcesses,
    c: usize,
    staged: &StagedStep,
    fwd: &mut [Link],
    bwd: &mut [Link],
    senders: &mut Vec<std::thread::JoinHandle<Result<()>>>,
) {
    let s_n = staged.config.stages;
    let peer = p.peer((c + 1) % s_n, c % s_n);
    let types = staged.stages[c + 1].act_in.clone();
    fwd[c + 1].1 = Some(Inbox::Remote { peer, boundary: c, cotangents: false, types });
    let (tx, rx) = channel();
    senders.push(p.sender(peer, c, true, rx));
    bwd[c + 1].0 = Some(Outbox::Remote(tx));
}

/// Microbatch `m`'s tensors from `inbox`: from a neighbouring chunk in
/// this process (`lost` names a neighbour that stopped), or from another
/// process through `procs` (its error, a timeout naming the process, is
/// this stage's own).
fn receive(
    inbox: &Inbox,
    m: usize,
    procs: Option<&remote::StageProcesses>,
    lost: &dyn Fn(&str) -> StageError,
    what: &str,
) -> std::result::Result<Vec<HostTensor>, StageError> {
    match inbox {
        Inbox::Local(rx) => {
            let (got, tensors) = rx.recv().map_err(|_| lost(what))?;
            debug_assert_eq!(got, m, "tensors arrive in microbatch order");
            Ok(tensors)
        }
        Inbox::Remote { peer, boundary, cotangents, types } => {
            let p = procs.expect("a remote link has processes");
            Ok(p.receive(*peer, *boundary, *cotangents, types)?)
        }
    }
}

/// Runs stage `s`'s program for one step over its chunks `own` (the ops
/// name their chunk).
#[allow(clippy::too_many_arguments)] // the stage, its chunks, the step's clocks and loss scale
fn run_stage(
    s: usize,
    own: &mut [ChunkEnds<'_>],
    ops: &[(usize, StageOp)],
    micro: &BTreeMap<String, Vec<HostTensor>>,
    start: Instant,
    serial: Option<&std::sync::Mutex<()>>,
    scale: Option<&HostTensor>,
    procs: Option<&remote::StageProcesses>,
) -> std::result::Result<StageRun, StageError> {
    let lost = |what: &str| {
        StageError::Stopped(Error::Usage(format!("pipeline stage {s}: the neighbouring stage stopped before {what}")))
    };
    let mut bufs: Vec<ChunkBuffers> = own.iter().map(|_| ChunkBuffers::default()).collect();
    let mut outputs = Vec::new();
    let mut events = Vec::new();
    let (mut held, mut held_peak) = (0u64, 0u64);
    let now = || start.elapsed().as_secs_f64();
    let index: BTreeMap<usize, usize> = own.iter().enumerate().map(|(i, ce)| (ce.chunk, i)).collect();
    for &(c, op) in ops {
        let i = index[&c];
        let (ce, buf) = (&mut own[i], &mut bufs[i]);
        let st = &mut *ce.stage;
        let np = st.fns.params.len();
        let last = ce.fwd.0.is_none();
        let n_lead = if last { st.fns.forward.results.len() } else { 1 };
        match op {
            StageOp::Recv(m) => {
                let mut inputs: Vec<HostTensor> = st.fns.batch.iter().map(|n| micro[n][m].clone()).collect();
                if let Some(inbox) = &ce.fwd.1 {
                    inputs.extend(receive(inbox, m, procs, &lost, "sending activations")?);
                }
                held += bytes_of(&inputs);
                held_peak = held_peak.max(held);
                buf.stash.insert(m, inputs);
            }
            StageOp::Forward(m) => {
                let _one = serial.map(|l| l.lock().unwrap_or_else(|p| p.into_inner()));
                let t0 = now();
                // With loss scaling the last chunk's metrics come from its
                // (scaled) backward, which recomputes the forward anyway:
                // its forward task has nothing to compute.
                let outs = if last && scale.is_some() {
                    Vec::new()
                } else {
                    let mut args = st.params[st.forward.resident()..].to_vec();
                    args.extend(buf.stash[&m].iter().cloned());
                    st.forward.run(args)?
                };
                let task = Task { phase: Phase::Forward, micro: m, chunk: c };
                events.push(TraceEvent { stage: s, task, start: t0, end: now() });
                if last {
                    if scale.is_none() {
                        outputs.push(outs);
                    }
                } else {
                    held += bytes_of(&outs);
                    held_peak = held_peak.max(held);
                    buf.out_acts.insert(m, outs);
                }
            }
            StageOp::Send(m) => {
                let acts = buf.out_acts.remove(&m).expect("sent after its forward");
                held -= bytes_of(&acts);
                ce.fwd.0.as_ref().expect("a next chunk").send(m, acts).map_err(|_| lost("receiving activations"))?;
            }
            StageOp::RecvCot(m) => {
                let inbox = ce.bwd.1.as_ref().expect("a next chunk");
                let cot = receive(inbox, m, procs, &lost, "sending cotangents")?;
                held += bytes_of(&cot);
                held_peak = held_peak.max(held);
                buf.cots.insert(m, cot);
            }
            StageOp::Backward(m) => {
                let _one = serial.map(|l| l.lock().unwrap_or_else(|p| p.into_inner()));
                let t0 = now();
                let mut args = st.params[st.backward.resident()..].to_vec();
                let (stashed, cot) =
                    (buf.stash.remove(&m).expect("backward after forward"), buf.cots.remove(&m).unwrap_or_default());
                held -= bytes_of(&stashed) + bytes_of(&cot);
                args.extend(stashed);
                args.extend(cot);
                if let (true, Some(sc)) = (last, scale) {
                    args.push(sc.clone());
                }
                let mut outs = st.backward.run(args)?;
                let task = Task { phase: Phase::Backward, micro: m, chunk: c };
                events.push(TraceEvent { stage: s, task, start: t0, end: now() });
                let rest = outs.split_off(n_lead);
                if last && scale.is_some() {
                    outputs.push(outs);
                }
                let (g, cot_in) = {
                    let mut rest = rest;
                    let cot_in = rest.split_off(np);
                    (rest, cot_in)
                };
                match buf.grads.as_mut() {
                    None => buf.grads = Some(g),
                    Some(acc) => {
                        for (a, b) in acc.iter_mut().zip(&g) {
                            add_into(a, b)?;
                        }
                    }
                }
                if ce.bwd.0.is_some() {
                    held += bytes_of(&cot_in);
                    held_peak = held_peak.max(held);
                    buf.cot_in.insert(m, cot_in);
                }
            }
            StageOp::SendCot(m) => {
                let cot = buf.cot_in.remove(&m).expect("sent after its backward");
                held -= bytes_of(&cot);
                ce.bwd.0.as_ref().expect("a previous chunk").send(m, cot).map_err(|_| lost("receiving cotangents"))?;
            }
        }
    }
    let grads = bufs.into_iter().map(|b| b.grads.unwrap_or_default()).collect();
    Ok(StageRun { grads, lr: f32::NAN, outputs, events, held_peak })
}

/// Why a stage thread stopped.
enum StageError {
    /// Its own error.
    Own(Error),
    /// Another thread stopped first (a neighbour or the driver hung up).
    Stopped(Error),
}

impl From<Error> for StageError {
    fn from(e: Error) -> StageError {
        StageError::Own(e)
    }
}

type StageResult = std::result::Result<StageRun, StageError>;

/// The runs, or the first stage's own error (the cause), else the first
/// error.
fn first_error(runs: Vec<StageResult>) -> Result<Vec<StageRun>> {
    if runs.iter().all(|r| r.is_ok()) {
        return Ok(runs.into_iter().filter_map(|r| r.ok()).collect());
    }
    let mut stopped = None;
    for r in runs {
        match r {
            Err(StageError::Own(e)) => return Err(e),
            Err(StageError::Stopped(e)) => {
                stopped.get_or_insert(e);
            }
            Ok(_) => {}
        }
    }
    Err(stopped.expect("some stage failed"))
}

/// [`first_error`], with a failed sender's error (naming the process it
/// could not reach) ranked after the stages' own errors and before
/// "the neighbouring stage stopped".
fn first_error_or_sender(runs: Vec<StageResult>, sent: Vec<Result<()>>) -> Result<Vec<StageRun>> {
    if !runs.iter().any(|r| matches!(r, Err(StageError::Own(_)))) {
        if let Some(Err(e)) = sent.into_iter().find(|r| r.is_err()) {
            return Err(e);
        }
    }
    first_error(runs)
}

/// After its last backward: each of the stage's chunks' squares (sent to
/// the driver for the global norm), then each chunk's optimizer update,
/// with the norm from the driver when the update reads it. Updates the
/// chunks' parameters and slots; the run's gradients are consumed.
fn finish_stage(
    s: usize,
    own: &mut [ChunkEnds<'_>],
    mut run: StageRun,
    step: &HostTensor,
    scale: Option<&HostTensor>,
    serial: Option<&std::sync::Mutex<()>>,
) -> StageResult {
    let stopped = || StageError::Stopped(Error::Usage(format!("pipeline stage {s}: another stage stopped")));
    let grads = std::mem::take(&mut run.grads);
    for (ce, g) in own.iter_mut().zip(&grads) {
        let mut sq = {
            let _one = serial.map(|l| l.lock().unwrap_or_else(|p| p.into_inner()));
            let mut args = g.clone();
            args.extend(scale.cloned());
            ce.stage.square.run(args)?
        };
        let finite = if scale.is_some() { scalar_f32(&sq.pop().expect("the finiteness flag")) } else { 1.0 };
        ce.squares.send(Squares { values: sq.iter().map(scalar_f32).collect(), finite }).map_err(|_| stopped())?;
    }
    for (ce, mut g) in own.iter_mut().zip(grads) {
        let st = &mut *ce.stage;
        // Not read by the update when it does not wait for it.
        let n = if st.update_waits {
            ce.norm.recv().map_err(|_| stopped())?
        } else {
            Norm { norm: f32::NAN, finite: f32::NAN }
        };
        let _one = serial.map(|l| l.lock().unwrap_or_else(|p| p.into_inner()));
        let mut args = st.params.clone();
        args.extend(st.slots.iter().cloned());
        args.push(step.clone());
        args.append(&mut g);
        args.push(HostTensor::from_f32(&[], vec![n.norm]).map_err(Error::from)?);
        if let Some(sc) = scale {
            args.push(sc.clone());
            args.push(HostTensor::from_f32(&[], vec![n.finite]).map_err(Error::from)?);
        }
        let mut out = st.update.run(args)?;
        run.lr = scalar_f32(&out.pop().expect("lr"));
        let np = st.params.len();
        st.slots = out.split_off(np);
        st.params = out;
        st.forward.load(&st.params)?;
        st.backward.load(&st.params)?;
    }
    Ok(run)
}

impl super::Executor for PipelineExecutor {
    fn load(&mut self, step: &TrainStep, state: &Tree) -> Result<()> {
        step.check_state(state)?;
        self.load_tree(state)
    }

    fn step(&mut self, _step: &TrainStep, batch: &Tree) -> Result<Metrics> {
        self.run_step(batch)
    }

    /// Every batch input's every row in one process. With stages on
    /// processes, only the inputs of this process's chunks, and of each
    /// microbatch only the rows of its devices' blocks.
    fn batch_part(&self, step: &TrainStep) -> Result<BatchPart> {
        let n = super::exec::global_batch_rows(step);
        if self.processes.is_none() {
            return Ok(BatchPart::whole(n));
        }
        let k = self.staged.config.microbatches;
        if k == 0 || n % k != 0 {
            return Err(weft_compiler::CompilerError::PipelineMicrobatches { microbatches: k, batch: n }.into());
        }
        let per = n / k;
        let (mut inputs, mut rows) = (std::collections::BTreeSet::new(), Vec::new());
        for st in self.stages.iter().filter(|st| !st.forward.is_remote()) {
            let np = st.fns.params.len();
            // The step's batch inputs only: a stage's `batch` also holds
            // its PRNG key (`rng`, with dropout), which is not read from data.
            let read = st.fns.batch.iter().enumerate().filter(|(_, name)| step.batch.iter().any(|(b, _)| b == *name));
            for (j, name) in read {
                inputs.insert(name.clone());
                for f in [&st.forward, &st.backward] {
                    for r in f.input_rows(np + j, per)? {
                        rows.extend((0..k).map(|m| m * per + r.start..m * per + r.end));
                    }
                }
            }
        }
        let every = step.batch.iter().all(|(name, _)| inputs.contains(name));
        Ok(BatchPart::new(rows, if every { None } else { Some(inputs) }))
    }

    /// The inputs of `part` spread back to whole tensors (zeros in the
    /// rows this process's devices do not read), then the step.
    fn step_part(&mut self, step: &TrainStep, batch: &Tree, part: &BatchPart) -> Result<Metrics> {
        let n = super::exec::global_batch_rows(step);
        if part.is_whole(n) {
            return self.run_step(batch);
        }
        let mut whole = Tree::new();
        for (name, _) in step.batch.iter().filter(|(name, _)| part.reads(name)) {
            let t = batch.get(name).ok_or_else(|| Error::Usage(format!("the batch part has no input `{name}`")))?;
            whole.insert(name.clone(), part.spread(t, n)?);
        }
        self.run_step(&whole)
    }

    fn checkpoint_state(&mut self, _step: &TrainStep) -> Result<crate::checkpoint::CheckpointState> {
        let mut cs = crate::checkpoint::CheckpointState::new(self.checkpoint_mesh.clone());
        for (name, t) in self.gathered_tree()? {
            cs.insert_global(name, t);
        }
        Ok(cs)
    }

    fn state_layout(&self, step: &TrainStep) -> Vec<weft_ir::TensorSharding> {
        step.state.iter().map(|l| weft_ir::TensorSharding::replicated(l.ty.rank())).collect()
    }

    fn global_state(&mut self, _step: &TrainStep) -> Result<Tree> {
        self.gathered_tree()
    }

    fn set_trace(&mut self, mode: Option<weft_runtime::TraceMode>) {
        self.tracing = mode;
    }

    fn take_trace(&mut self) -> Option<weft_runtime::Trace> {
        self.traced.take()
    }

    fn describe(&self) -> String {
        let pc = &self.staged.config;
        format!(
            "pipeline: {} stages x sub-mesh {} on backend {}, {} microbatches, schedule {}, split {:?}",
            pc.stages, self.mesh, self.backend, pc.microbatches, pc.schedule, self.staged.split.counts
        )
    }
}

pub mod remote;
pub mod session;
pub use session::{
    pipeline_executor, plan_report, prepare_pipeline, report, run_pipeline_session, train_cli, PipelineReport,
    PipelineRun,
};

#[cfg(test)]
mod tests;

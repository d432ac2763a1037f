//! The experiment runner behind `weft train CONFIG.toml`.
//!
//! It builds the model and its training step with the configured strategy,
//! picks an executor for the mesh and backend, initialises (or loads) the
//! state, and runs steps with a progress bar, writing one JSON object per
//! step to the metrics file and a run manifest (config, weft version and git
//! revision, mesh, device mapping, seed) beside the checkpoints.

mod backend;
pub mod boundary;
mod compile;
mod lowered;
pub use lowered::compile_config;
pub mod config;
pub mod data;
pub mod estimate;
mod exec;
mod mesh;
mod metrics;
pub mod preempt;
pub mod processes;
pub mod report;
mod session;
pub mod stages;
pub mod stragglers;
pub mod trace;
pub mod validate;
pub mod verdict;

pub use backend::Backend;
pub use config::{CheckpointConfig, ModelConfig, OptimizerConfig, RunConfig, TraceSection};
pub use exec::{Executor, InterpExecutor};
pub use mesh::{MeshBackend, MeshExecutor, MAX_SIMULATED_DEVICES};
pub use metrics::{read_metrics, MetricsWriter};
pub use session::{executor, run_model_on, run_session, run_session_on, Line};

use crate::checkpoint::MeshSpec;
use crate::error::{Error, Result};
use crate::models::Model;
use crate::strategy::{self, Strategy};
use std::path::PathBuf;
use weft_compiler::canonical_sums::{canonical_sums_in, SumChunks};
use weft_compiler::sharding::Mesh;
use weft_compiler::train::{build_train_step, Metrics, TrainStep, Tree};
use weft_ir::tensor::read_safetensors;

/// Command-line overrides of a config: the flags of `weft train` (their
/// help is these docs), each naming the config key it overrides where it
/// has one (`validate::KEYS` lists the pairs; a test keeps them equal).
#[derive(Clone, Debug, Default, clap::Args)]
pub struct Overrides {
    /// Number of steps.
    #[arg(long)]
    pub steps: Option<u64>,
    /// Device mesh, e.g. `data=2,model=4`.
    #[arg(long)]
    pub mesh: Option<String>,
    /// Parallelism strategy: none, dp, tp, fsdp, fsdp_tp, zero1, zero2, zero3 or auto.
    #[arg(long)]
    pub strategy: Option<String>,
    /// Execution backend: cpu (the runtime's CPU devices, default), wgpu,
    /// cuda, sim (the reference device-program simulator), interp (the
    /// unsharded interpreter, one device).
    #[arg(long)]
    pub backend: Option<String>,
    /// Worker threads for a runtime backend (default: one per core for cpu, one per device for GPUs)
    #[arg(long)]
    pub threads: Option<usize>,
    /// How a multi-process run sums across processes: deterministic
    /// (default; exchanged and folded in rank order, bitwise the
    /// one-process run) or fast (MPI's own reductions for f32/f64 sums,
    /// not bitwise reproducible).
    #[arg(long)]
    pub reduction: Option<String>,
    /// Run every collective where the partitioner put it, waiting for its
    /// result there (`[overlap] enabled = false`): no collective overlaps
    /// compute. The results are the same bits either way.
    #[arg(long)]
    pub no_overlap: bool,
    /// Seed.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Checkpoint directory.
    #[arg(long)]
    pub checkpoint_dir: Option<PathBuf>,
    /// Save a checkpoint every this many steps.
    #[arg(long)]
    pub checkpoint_every: Option<u64>,
    /// Metrics file (one JSON object per step).
    #[arg(long)]
    pub metrics: Option<PathBuf>,
    /// Initial parameters by leaf name (safetensors).
    #[arg(long)]
    pub init: Option<PathBuf>,
    /// A fixed batch by input name (safetensors).
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// The memory the run may use, e.g. `16GiB` (default: the
    /// WEFT_MEMORY_LIMIT environment variable, else the machine's memory).
    /// The run's estimated memory is checked against it before anything
    /// is allocated.
    #[arg(long)]
    pub memory_limit: Option<String>,
    /// Per-device memory budget for `--strategy auto`, e.g. `2GiB`: the
    /// auto-sharder's plan must fit it (an infeasible budget is an error
    /// before training starts).
    #[arg(long)]
    pub memory_budget: Option<String>,
    /// Sum in an order every mesh shares, so the metrics are bitwise the
    /// same on any mesh whose shard counts divide `sum_chunks` (default 8);
    /// slower (config key `mesh_invariant`).
    #[arg(long)]
    pub mesh_invariant: bool,
    /// Continue from the newest valid checkpoint. A checkpoint directory
    /// that does not exist or holds no valid checkpoint is an error.
    #[arg(long)]
    pub resume: bool,
    /// Like --resume, but start from step 0 (with a warning) when there is
    /// no valid checkpoint yet.
    #[arg(long, conflicts_with = "resume")]
    pub resume_or_start: bool,
    /// No progress bar (warnings and the run's description still print).
    #[arg(long, short)]
    pub quiet: bool,
    /// Write a step trace (Chrome trace-event JSON; opens in Perfetto) of
    /// the steps `--trace-steps` names.
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// The steps to trace: `N` or `A..B` (default: the run's second and
    /// third).
    #[arg(long)]
    pub trace_steps: Option<String>,
    /// In a trace, wait for the device after every op, so that a GPU's
    /// spans are its device times (slower).
    #[arg(long)]
    pub trace_sync: bool,
    /// What stops the run after its current step (`weft train` installs
    /// the signal handlers of [`preempt`]); none: it runs to the end.
    #[arg(skip)]
    pub preemption: Option<preempt::Preemption>,
}

impl Overrides {
    /// Applies the overrides to a config.
    pub fn apply(&self, mut c: RunConfig) -> RunConfig {
        if let Some(s) = self.steps {
            c.steps = s;
        }
        if let Some(m) = &self.mesh {
            c.mesh = Some(m.clone());
        }
        if let Some(s) = &self.strategy {
            c.strategy = Some(s.clone());
        }
        if let Some(b) = &self.backend {
            c.backend = Some(b.clone());
        }
        if let Some(t) = self.threads {
            c.threads = Some(t);
        }
        if let Some(r) = &self.reduction {
            c.reduction = Some(r.clone());
        }
        if self.no_overlap {
            let (prefetch, bucket) = c.overlap.take().map_or((None, None), |o| (o.prefetch, o.bucket));
            c.overlap = Some(config::OverlapSection { enabled: false, prefetch, bucket });
        }
        if let Some(s) = self.seed {
            c.seed = s;
        }
        if let Some(m) = &self.metrics {
            c.metrics = Some(m.clone());
        }
        if let Some(m) = &self.memory_limit {
            c.memory_limit = Some(m.clone());
        }
        if let Some(m) = &self.memory_budget {
            c.memory_budget = Some(m.clone());
        }
        c.mesh_invariant |= self.mesh_invariant;
        if let Some(d) = &self.checkpoint_dir {
            let every = c.checkpoint.as_ref().map(|k| k.every).unwrap_or(10);
            let keep_last = c.checkpoint.as_ref().map(|k| k.keep_last).unwrap_or(3);
            let keep_every = c.checkpoint.as_ref().and_then(|k| k.keep_every);
            let every_seconds = c.checkpoint.as_ref().and_then(|k| k.every_seconds);
            c.checkpoint = Some(CheckpointConfig { dir: d.clone(), every, keep_last, keep_every, every_seconds });
        }
        if let (Some(e), Some(k)) = (self.checkpoint_every, c.checkpoint.as_mut()) {
            k.every = e;
        }
        // `--trace-steps` or `--trace-sync` with no trace file leaves an
        // empty `trace.file`, which validation names.
        if self.trace.is_some() || self.trace_steps.is_some() || self.trace_sync {
            let t = c.trace.get_or_insert(TraceSection { file: PathBuf::new(), steps: None, sync: false });
            if let Some(f) = &self.trace {
                t.file = f.clone();
            }
            if let Some(s) = &self.trace_steps {
                t.steps = Some(s.clone());
            }
            t.sync |= self.trace_sync;
        }
        c
    }
}

/// A model with its training step, initial parameters and batch.
pub struct Prepared {
    /// The training step.
    pub step: TrainStep,
    /// Initial parameters.
    pub params: Tree,
    /// The (fixed) batch.
    pub batch: Tree,
    /// The strategy.
    pub strategy: Strategy,
    /// For `strategy = "auto"`: the auto-sharder's options (memory budget).
    pub auto: Option<weft_compiler::autoshard::AutoShardOptions>,
    /// The training configuration the step was built with (with the
    /// strategy's optimizer-state and gradient annotations).
    pub train_config: weft_compiler::train::TrainConfig,
    /// The options of the `overlap_collectives` pass (`[overlap]`), or
    /// `None` when it is off.
    pub overlap: Option<weft_compiler::partition::overlap::OverlapOptions>,
}

fn usage(e: impl std::fmt::Display) -> Error {
    Error::Usage(e.to_string())
}

/// Builds the training step and initial values of a (validated) config on
/// a mesh with axes `axes`, for the config's own model ([`prepare_model`]).
pub fn prepare(c: &RunConfig, axes: &[&str], ov: &Overrides) -> Result<Prepared> {
    prepare_model(c, &c.model.model()?, axes, ov)
}

/// Builds the training step of `model` and its initial values under a
/// (validated) config on a mesh with axes `axes`: the module annotated for
/// the strategy and `[shardings]` ([`strategy::annotated_module`]), the
/// step (with `micro_batches = k` the loss function takes one micro-batch
/// and the step the whole batch), the initial parameters (`--init`, else
/// the model's initialisation) and the fixed batch (`--data`, else the
/// model's synthetic batch). Every run prepares its step here.
pub fn prepare_model(c: &RunConfig, model: &Model, axes: &[&str], ov: &Overrides) -> Result<Prepared> {
    let strategy: Strategy = c.strategy.as_deref().unwrap_or("none").parse().map_err(usage)?;
    let auto = match strategy {
        Strategy::Auto => Some(weft_compiler::autoshard::AutoShardOptions {
            memory_budget: c.memory_budget.as_deref().map(weft_ir::limits::parse_bytes).transpose().map_err(usage)?,
            ..Default::default()
        }),
        _ => None,
    };
    let mut tc = c.train_config().map_err(usage)?;
    let k = c.optimizer.micro_batches.max(1);
    let rules = c.sharding_rules()?;
    let mut module = strategy::annotated_module(strategy, model, k, &rules, &mut tc, axes)?;
    if let Some(mesh) = c.mesh.as_deref().and_then(|m| weft_compiler::sharding::Mesh::parse(m).ok()) {
        strategy::fit_model_value_rules(&mut module, strategy, model, &rules, &mesh)?;
    }
    let mut step = build_train_step(&module, model.loss_fn(&module)?, &tc)?;
    if let Some(k) = c.mesh_invariant_chunks() {
        // Here rather than as a pass of the mesh pipeline: the unsharded
        // interpreter (`--backend interp`) must sum in the same order.
        step.module = canonical_sums_in(&step.module, "train_step", SumChunks::new(k)?)?;
    }
    let params = match &ov.init {
        Some(p) => read_safetensors(p)?,
        None => model.initial_params(&module, c.seed)?,
    };
    let batch = match &ov.data {
        Some(p) => read_safetensors(p)?,
        // With `[data]` the fixed batch is not trained on: a model that
        // cannot draw one (an integer input with no range) needs none.
        None => match model.synthetic_batch(&step.batch, k, c.seed) {
            Err(_) if c.data.is_some() => Tree::new(),
            b => b?,
        },
    };
    if !(batch.is_empty() && c.data.is_some()) {
        step.check_batch(&batch).map_err(|e| match &ov.data {
            Some(p) => Error::Usage(format!("--data {}: {e}", p.display())),
            None => Error::from(e),
        })?;
    }
    if let Some(p) = &ov.data {
        // Integer inputs with a range (token ids index the embedding and
        // the logits): out of range, they would read another row or nothing.
        for (name, &max) in &model.int_max {
            let Some(t) = batch.get(name) else { continue };
            if let Some(bad) = t.to_f64_vec().into_iter().find(|&t| !(t >= 0.0 && t < max as f64)) {
                return Err(Error::Usage(format!(
                    "--data {}: `{name}` holds {bad}, outside {}",
                    p.display(),
                    if matches!(name.as_str(), "tokens" | "targets") {
                        format!("the vocabulary 0..{max}")
                    } else {
                        format!("its range 0..{max} ([model.inputs])")
                    }
                )));
            }
        }
    }
    let overlap = config::OverlapSection::options(c.overlap.as_ref()).map_err(usage)?;
    Ok(Prepared { step, params, batch, strategy, auto, train_config: tc, overlap })
}

/// What a finished run reports.
#[derive(Clone, Debug)]
pub struct RunSummary {
    /// Metrics of every step run (not of steps restored from a checkpoint).
    pub metrics: Vec<(u64, Metrics)>,
    /// Steps per second.
    pub steps_per_sec: f64,
    /// Wall time of each step run, in seconds (the step alone: not the
    /// metrics file or checkpoints).
    pub step_secs: Vec<f64>,
    /// Wall time of each compile phase, in seconds (building the training
    /// step, then the executor's phases).
    pub compile_secs: Vec<(String, f64)>,
    /// With `[data]`: the validation metrics (`val_loss`, ...) by the
    /// number of completed steps they were evaluated after.
    pub evals: Vec<(u64, Metrics)>,
    /// With `[data]`: a 64-bit digest (sha256 prefix) of each step's batch,
    /// in step order: what the run read, comparable across runs and meshes.
    pub batch_digests: Vec<u64>,
    /// When the run stopped because its loss was not finite for
    /// `divergence_steps` steps in a row: the first and last of them.
    pub diverged: Option<(u64, u64)>,
    /// The steps (by number) that began while a checkpoint's files were
    /// being written in the background.
    pub saving: std::collections::BTreeSet<u64>,
    /// Per device of this process, where the steps after the first spent
    /// their time ([`verdict::Verdict`]).
    pub verdict: verdict::Verdict,
    /// The model and hardware FLOPs per step, the FLOP/s reached and the
    /// utilisation of the peak, as `run.json` keeps them
    /// ([`report::Utilisation::json`]); `None` before a step is timed.
    pub utilisation: Option<serde_json::Value>,
    /// In process 0 of a multi-process run: every process's step times
    /// and the straggler warnings, as `run.json` keeps them
    /// ([`stragglers::Stragglers::json`]).
    pub stragglers: Option<serde_json::Value>,
}

impl RunSummary {
    /// The line `weft train` ends with: the last step's loss and the rate,
    /// and with loss scaling the last scale and how many steps were
    /// skipped (`None` when no step ran).
    pub fn last_line(&self) -> Option<String> {
        let (s, m) = self.metrics.last()?;
        let mut line = format!("step {} loss {:.6} ({:.1} steps/s)", s + 1, m["loss"], self.steps_per_sec);
        if let Some(scale) = m.get("loss_scale") {
            let skipped = self.metrics.iter().filter(|(_, m)| m.get("skipped") == Some(&1.0)).count();
            line += &format!("; loss scale {scale}, {skipped} of {} steps skipped", self.metrics.len());
        }
        Some(line)
    }

    /// The median step time (seconds) of the steps after the first that
    /// began while a checkpoint was being written, and of the others, with
    /// their counts: what a background save costs the steps beside it.
    pub fn step_secs_while_saving(&self) -> [(Option<f64>, usize); 2] {
        let mut parts: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
        for ((s, _), t) in self.metrics.iter().zip(&self.step_secs).skip(1) {
            parts[usize::from(!self.saving.contains(s))].push(*t);
        }
        parts.map(|v| (median(&v), v.len()))
    }

    /// The steady-state step time in seconds: the median over the steps
    /// after the first (the first pays one-time costs), or the only step.
    pub fn steady_step_secs(&self) -> Option<f64> {
        let tail = if self.step_secs.len() > 1 { &self.step_secs[1..] } else { &self.step_secs[..] };
        median(tail)
    }
}

/// The median of the times a run reports (the upper one of an even
/// count); `None` for none.
pub(crate) fn median(v: &[f64]) -> Option<f64> {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied()
}

/// Runs steps on the executor's loaded state from step `first` until
/// `c.steps`; `on_step(next_step, time, executor)` runs after every step
/// with a finite loss (for the step boundary: checkpoints, stopping, step
/// times), `time` being the step's compute and its waiting for other
/// processes by `waited` (a running total of the time spent in exchanges,
/// read just before and after the step; none: no waiting). With a `feed`
/// (`[data]`), each step trains on the feed's next batch, of which the
/// feed read only the executor's [`Executor::batch_part`] (its wait is the
/// metric `data_wait_ms`) and the validation metrics evaluated before a
/// step join that step's line; the evaluation
/// after the last step is a line of its own at step `c.steps`. Without one,
/// every step trains on `prepared.batch`.
#[allow(clippy::too_many_arguments)] // each is one independent part of a run
pub fn run_steps(
    c: &RunConfig,
    prepared: &Prepared,
    exec: &mut dyn Executor,
    first: u64,
    mut metrics_out: Option<&mut MetricsWriter>,
    mut feed: Option<&mut data::Feed>,
    mut on_step: impl FnMut(u64, stragglers::StepTime, &mut dyn Executor) -> Result<()>,
    quiet: bool,
    mut trace: Option<&mut trace::TraceWriter>,
    waited: Option<&dyn Fn() -> std::time::Duration>,
) -> Result<RunSummary> {
    let total = c.steps;
    let bar = if quiet {
        indicatif::ProgressBar::hidden()
    } else {
        let b = indicatif::ProgressBar::new(total);
        b.set_style(
            indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} steps  {msg}  [{elapsed_precise}<{eta}]")
                .expect("valid template"),
        );
        b.set_position(first);
        b
    };
    let mut all = Vec::new();
    let mut step_secs = Vec::new();
    // Consecutive steps whose loss was not finite, from the first of them.
    let (mut nonfinite, mut diverged) = (None::<(u64, u64)>, None);
    let limit = c.divergence_steps.unwrap_or(DIVERGENCE_STEPS);
    let (mut evals, mut batch_digests) = (Vec::new(), Vec::new());
    let mut verdict = verdict::Verdict::default();
    // Exchanges of collectives started early run on the communicator's
    // own thread beside the compute: a step waits only where its devices
    // block on them, not for as long as the transport runs.
    let overlapped = exec.device_program().is_some_and(|p| p.starts_collectives());
    let start = std::time::Instant::now();
    for s in first..total {
        let traced = trace.as_deref().and_then(|t| t.mode_for(s));
        let t0 = std::time::Instant::now();
        let fed = match feed.as_deref_mut() {
            Some(f) => Some(f.next_batch()?),
            None => None,
        };
        let t1 = std::time::Instant::now();
        let val = match feed.as_deref_mut() {
            Some(f) => f.evaluate_at(s, total, &prepared.step, exec)?,
            None => None,
        };
        let evaluated = val.is_some();
        exec.set_trace(traced);
        let waited_before = waited.map(|w| w());
        let clock = std::time::Instant::now();
        // A feed reads only the part of the batch the executor's devices need.
        let mut m = match (&fed, feed.as_deref()) {
            (Some((b, _, _)), Some(f)) => exec.step_part(&prepared.step, b, f.part())?,
            _ => exec.step(&prepared.step, &prepared.batch)?,
        };
        let ran = std::time::Instant::now();
        let secs = (ran - clock).as_secs_f64();
        step_secs.push(secs);
        let times = exec.device_times();
        if s > first {
            if let Some(t) = &times {
                verdict.record(t);
            }
        }
        let waited_secs = match (waited, waited_before, &times) {
            (Some(_), Some(_), Some(t)) if overlapped => {
                t.iter().map(|d| d.communication).max().unwrap_or_default().as_secs_f64()
            }
            (Some(w), Some(before), _) => w().saturating_sub(before).as_secs_f64(),
            _ => 0.0,
        };
        if traced.is_some() {
            exec.set_trace(None);
        }
        if let Some((_, waited, digest)) = &fed {
            m.insert("data_wait_ms".into(), waited.as_secs_f64() * 1e3);
            batch_digests.push(*digest);
        }
        if let Some(v) = val {
            m.extend(v.clone());
            evals.push((s, v));
        }
        if let Some(w) = metrics_out.as_deref_mut() {
            w.write(s, &m)?;
        }
        let done = s + 1 - first;
        let rate = done as f64 / start.elapsed().as_secs_f64().max(1e-9);
        bar.set_message(format!("loss {:.6}  {:.1} steps/s", m["loss"], rate));
        bar.inc(1);
        let t2 = std::time::Instant::now();
        // A step whose loss is not finite is never checkpointed: the last
        // checkpoint stays one a run can resume from.
        let finite = m.get("loss").is_none_or(|l| l.is_finite());
        nonfinite = if finite { None } else { Some((nonfinite.map_or(s, |(f, _)| f), s)) };
        if finite {
            on_step(s + 1, stragglers::StepTime::of(secs, waited_secs), exec)?;
        }
        let t3 = std::time::Instant::now();
        if let (Some(t), Some(_)) = (trace.as_deref_mut(), traced) {
            let args = serde_json::json!({ "train_step": s, "loss": m.get("loss") });
            t.host("data wait", "data", t0, t1, serde_json::json!({ "train_step": s }));
            if evaluated {
                t.host("evaluate", "evaluate", t1, clock, serde_json::json!({ "train_step": s }));
            }
            t.host(&format!("step {s}"), "step", clock, ran, args);
            t.host("metrics", "metrics", ran, t2, serde_json::json!({ "train_step": s }));
            t.host("checkpoint", "checkpoint", t2, t3, serde_json::json!({ "train_step": s }));
            if let Some(d) = exec.take_trace() {
                t.devices(s, d);
            }
            if t.is_last(s) {
                t.write()?;
            }
        }
        all.push((s, m));
        if let Some((first, last)) = nonfinite.filter(|(f, l)| limit > 0 && l - f + 1 >= limit) {
            diverged = Some((first, last));
            break;
        }
    }
    if let Some(t) = trace {
        t.write()?;
    }
    if let (Some(f), true, None) = (feed, total > first, diverged) {
        if let Some(v) = f.evaluate_at(total, total, &prepared.step, exec)? {
            if let Some(w) = metrics_out {
                w.write(total, &v)?;
            }
            evals.push((total, v));
        }
    }
    bar.finish_and_clear();
    let secs = start.elapsed().as_secs_f64();
    let n = all.len() as u64;
    Ok(RunSummary {
        metrics: all,
        steps_per_sec: if secs > 0.0 { n as f64 / secs } else { 0.0 },
        step_secs,
        compile_secs: Vec::new(),
        evals,
        batch_digests,
        diverged,
        saving: Default::default(),
        verdict,
        utilisation: None,
        stragglers: None,
    })
}

/// Steps in a row with a non-finite loss that stop a run, by default
/// (`divergence_steps`).
pub const DIVERGENCE_STEPS: u64 = 3;

/// The checkpoint mesh description of a compiler mesh.
pub fn mesh_spec(mesh: &Mesh) -> MeshSpec {
    MeshSpec { axes: mesh.axes().iter().map(|a| (a.name.clone(), a.size)).collect() }
}

/// Bytes as `1.5 MiB` ([`weft_ir::limits::human_bytes`]).
pub fn human(b: usize) -> String {
    weft_ir::limits::human_bytes(b as u64)
}

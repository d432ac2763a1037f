//! One `weft train` session: executor, checkpoints, resume, manifest.

use super::mesh::{MeshBackend, MeshExecutor};
use super::processes::Processes;
use super::stragglers::Stragglers;
use super::Backend;
use super::{
    mesh_spec, prepare_model, run_steps, Executor, InterpExecutor, MetricsWriter, Overrides, RunConfig, RunSummary,
};
use crate::checkpoint::{CheckpointManager, CheckpointOptions, RestoreTarget, Retention};
use crate::checkpoint::{Manifest, MeshSpec};
use crate::error::{Error, Result};
use crate::models::Model;
use weft_compiler::sharding::Mesh;
use weft_ir::limits::MemoryLimit;
use weft_runtime::process::Reduction;

/// Errors before anything is built when `--resume` cannot resume: no
/// checkpoint directory configured, or (without `--resume-or-start`) one
/// that does not exist.
fn check_resumable(c: &RunConfig, ov: &Overrides) -> Result<()> {
    let Some(k) = &c.checkpoint else {
        return Err(Error::Resume("needs a checkpoint directory ([checkpoint] dir or --checkpoint-dir)".into()));
    };
    if k.dir.exists() && !k.dir.is_dir() {
        return Err(Error::Resume(format!(
            "the checkpoint directory {} is a file, not a directory; name a directory ([checkpoint] dir or \
             --checkpoint-dir)",
            k.dir.display()
        )));
    }
    if !ov.resume_or_start && !k.dir.is_dir() {
        return Err(Error::Resume(format!(
            "the checkpoint directory {} does not exist; pass --resume-or-start to start from step 0 when there is \
             no checkpoint yet",
            k.dir.display()
        )));
    }
    Ok(())
}

/// Warns when the checkpoint being resumed was saved on another mesh or
/// with other layouts (it is resharded on load).
fn warn_layout_changes(
    saved: &Manifest,
    spec: &MeshSpec,
    prepared: &super::Prepared,
    exec: &dyn Executor,
    log: &mut dyn FnMut(Line),
) {
    let fmt_mesh = |axes: &[(String, usize)]| {
        if axes.is_empty() {
            "one device".to_string()
        } else {
            axes.iter().map(|(n, s)| format!("{n}={s}")).collect::<Vec<_>>().join(",")
        }
    };
    if saved.mesh != spec.axes {
        log(Line::Warn(format!(
            "the checkpoint at step {} was saved on mesh {}; resharding it onto mesh {}",
            saved.step,
            fmt_mesh(&saved.mesh),
            fmt_mesh(&spec.axes)
        )));
    }
    let layouts = exec.state_layout(&prepared.step);
    let changed: Vec<&str> = prepared
        .step
        .state
        .iter()
        .zip(&layouts)
        .filter(|(l, now)| {
            let now: Vec<Vec<String>> = now.dims.iter().map(|d| d.axes.clone()).collect();
            saved.leaves.iter().find(|e| e.name == l.name).is_some_and(|e| e.sharding != now)
        })
        .map(|(l, _)| l.name.as_str())
        .collect();
    if !changed.is_empty() {
        let shown = changed.iter().take(3).copied().collect::<Vec<_>>().join(", ");
        let more = if changed.len() > 3 { format!(" and {} more", changed.len() - 3) } else { String::new() };
        log(Line::Warn(format!(
            "{} state leaves change layout on resume ({shown}{more}); they are resharded on load",
            changed.len()
        )));
    }
}

/// Builds the executor for `backend` on `mesh`: `interp` (the unsharded
/// interpreter, one device), `sim` (the reference device-program simulator)
/// or a runtime backend (`cpu`, `wgpu`, `cuda`) with `threads` workers.
pub fn executor(
    backend: Backend,
    mesh: &Mesh,
    prepared: &super::Prepared,
    threads: Option<usize>,
) -> Result<Box<dyn Executor>> {
    executor_with_limit(backend, mesh, prepared, threads, None, None)
}

/// [`executor`], checking the compiled program's memory against `limit`
/// before any device memory is allocated.
fn executor_with_limit(
    backend: Backend,
    mesh: &Mesh,
    prepared: &super::Prepared,
    threads: Option<usize>,
    limit: Option<&MemoryLimit>,
    processes: Option<&Processes>,
) -> Result<Box<dyn Executor>> {
    if let (Some(p), true) = (processes, backend.one_process()) {
        return Err(Error::Usage(format!(
            "backend `{backend}` runs in one process, but this run has {} processes; use cpu, wgpu or cuda",
            p.size()
        )));
    }
    let auto = prepared.auto.as_ref().map(|o| super::report::machine_model(backend, mesh, o));
    let auto = auto.as_ref();
    match backend {
        Backend::Interp => {
            if mesh.num_devices() != 1 {
                return Err(Error::Usage(format!(
                    "backend `interp` runs the unsharded program on one device, but the mesh {mesh} has {} devices",
                    mesh.num_devices()
                )));
            }
            Ok(Box::new(InterpExecutor::new(&prepared.step)?))
        }
        Backend::Sim => Ok(Box::new(MeshExecutor::with_limit(
            &prepared.step,
            mesh,
            MeshBackend::Simulator,
            None,
            limit,
            auto,
            prepared.overlap,
        )?)),
        Backend::Runtime(kind) => {
            // The kind's devices must be there (a named error if not).
            let kind = weft_runtime::select_backend(Some(kind.name()))?;
            let backend = MeshBackend::Devices(kind);
            Ok(Box::new(MeshExecutor::on_processes(
                &prepared.step,
                mesh,
                backend,
                threads,
                limit,
                auto,
                prepared.overlap,
                processes,
            )?))
        }
    }
}

/// A line a session reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Line {
    /// What the run does (mesh, devices, compile time, resumed step).
    Info(String),
    /// Something the user must see even with `-q`: checkpoints skipped as
    /// corrupt, a start from step 0, a layout change on resume.
    Warn(String),
}

/// Runs a whole session of the config's model; `log` receives the lines a
/// user sees.
pub fn run_session(c: &RunConfig, ov: &Overrides, log: &mut dyn FnMut(Line)) -> Result<RunSummary> {
    run_session_on(c, ov, None, log)
}

/// [`run_session`] as one process of a multi-process run (`processes`;
/// `None`: alone). Every process runs the same session on its own devices;
/// only process 0 reports lines and writes the metrics and run manifest,
/// and checkpoints are saved by all together ([`super::processes`]).
pub fn run_session_on(
    c: &RunConfig,
    ov: &Overrides,
    processes: Option<&Processes>,
    log: &mut dyn FnMut(Line),
) -> Result<RunSummary> {
    // The config's keys are checked before its model is read.
    super::validate::validate(c)?;
    run_model_on(c, &c.model.model()?, ov, processes, log)
}

/// Trains `model` under the config `c` (whose `[model]` table is not
/// read): the one engine behind `weft train` and [`crate::Trainer`], for
/// whole-mesh runs and `[pipeline]` runs alike.
pub fn run_model_on(
    c: &RunConfig,
    model: &Model,
    ov: &Overrides,
    processes: Option<&Processes>,
    log: &mut dyn FnMut(Line),
) -> Result<RunSummary> {
    if c.pipeline.is_some() {
        // `[pipeline]`: stages over the mesh's stage axis (specs/pipeline.md).
        return Ok(crate::runner::stages::run_pipeline_session(c, model, ov, processes, log)?.summary);
    }
    let first_process = processes.is_none_or(|p| p.is_first());
    let mut silent = |_: Line| {};
    let log: &mut dyn FnMut(Line) = if first_process { log } else { &mut silent };
    // Everything the user gave is checked before anything is built.
    let (mesh, limit) = preflight(c, model, ov)?;
    if let Some(p) = processes {
        let config = serde_json::to_vec(c).unwrap_or_default();
        p.check_same(&[("binary", &super::processes::binary_bytes()), ("config", &config)])?;
    }
    // The config's reduction mode, checked by `preflight` (and, being part
    // of the config, the same in every process).
    let reduction = c.reduction.as_deref().and_then(Reduction::from_name).unwrap_or_default();
    let with_mode = processes.map(|p| p.clone().with_reduction(reduction));
    let processes = with_mode.as_ref();
    if processes.is_none() && reduction == Reduction::Fast {
        log(Line::Info("reduction fast: this run has one process, so every sum folds in rank order".into()));
    }
    let axes: Vec<&str> = mesh.axes().iter().map(|a| a.name.as_str()).collect();
    let clock = std::time::Instant::now();
    let prepared = prepare_model(c, model, &axes, ov)?;
    if let Some(p) = processes {
        // The model is part of what every process must agree on.
        let text = weft_ir::text::print_module(&prepared.step.module);
        p.check_same(&[("model", text.as_bytes())])?;
    }
    let mut compile_secs = vec![("train step".to_string(), clock.elapsed().as_secs_f64())];
    // The dataset is opened and checked before the executor is compiled.
    let dataset = super::data::open_dataset(c, model, &prepared)?;
    let backend = Backend::of(c)?;
    let mut exec = executor_with_limit(backend, &mesh, &prepared, c.threads, limit.as_ref(), processes)?;
    compile_secs.extend(exec.compile_phases().into_iter().map(|(n, t)| (n.to_string(), t.as_secs_f64())));
    let sums = c.mesh_invariant_chunks().map(|k| format!(", mesh-invariant sums ({k} chunks)")).unwrap_or_default();
    log(Line::Info(format!(
        "weft train: {}, mesh {mesh} ({} devices), strategy {}, {} steps, seed {}{sums}",
        model.label,
        mesh.num_devices(),
        prepared.strategy,
        c.steps,
        c.seed
    )));
    log(Line::Info(exec.describe()));
    if prepared.strategy == crate::strategy::Strategy::Auto {
        let budget = c.memory_budget.as_deref().map(|b| format!(" under a memory budget of {b} per device"));
        let mut plan = format!("auto-sharding plan{}:", budget.unwrap_or_default());
        for (leaf, s) in prepared.step.state.iter().zip(exec.state_layout(&prepared.step)) {
            plan.push_str(&format!("\n  {} {s}", leaf.name));
        }
        log(Line::Info(plan));
    }
    // The cost model's price of this step, to set beside the measured one.
    let predicted = super::report::predict(&prepared, &mesh, backend, exec.device_program())?;
    log(Line::Info(super::report::predicted_line(&predicted)));
    log(Line::Info(super::report::classes_line(&predicted)));
    let built = Built {
        model,
        mesh: &mesh,
        prepared: &prepared,
        backend,
        dataset,
        compile_secs,
        predicted: Some(&predicted),
        processes,
    };
    train_built(c, ov, built, exec.as_mut(), log)
}

/// The checks of a run's config and flags before anything is built: the
/// config's keys and ranges (its mesh is returned), the memory estimate
/// against the memory limit (returned), `--data` beside `[data]`, and
/// whether `--resume` can resume.
pub(crate) fn preflight(c: &RunConfig, model: &Model, ov: &Overrides) -> Result<(Mesh, Option<MemoryLimit>)> {
    let mesh = super::validate::validate(c)?;
    let limit = super::estimate::memory_limit(c)?;
    super::estimate::check(c, model, limit.as_ref())?;
    super::data::check_flags(c, ov)?;
    if ov.resume || ov.resume_or_start {
        check_resumable(c, ov)?;
    }
    Ok((mesh, limit))
}

/// A run whose step and executor are built, ready to train
/// ([`train_built`]).
pub(crate) struct Built<'a> {
    /// The model trained.
    pub model: &'a Model,
    /// The run's whole mesh: the checkpoints' mesh.
    pub mesh: &'a Mesh,
    /// The model and its (unpipelined) training step: the state's leaves.
    pub prepared: &'a super::Prepared,
    /// The backend's name.
    pub backend: Backend,
    /// The `[data]` dataset, opened and checked.
    pub dataset: Option<crate::data::Dataset>,
    /// Wall time of each compile phase so far, in seconds.
    pub compile_secs: Vec<(String, f64)>,
    /// The cost model's price of the step, when it prices the executor's
    /// program (shown beside the measured step and in `run.json`).
    pub predicted: Option<&'a weft_compiler::autoshard::StepPrediction>,
    /// The processes of a multi-process run (`None`: alone).
    pub processes: Option<&'a Processes>,
}

/// Trains a built run on `exec`: opens the checkpoint directory, restores
/// the newest valid checkpoint (`--resume`, `--resume-or-start`; resharded
/// onto the executor's layout) or loads the initial state, feeds the
/// `[data]` batches or the fixed batch, writes the metrics, saves
/// checkpoints every `checkpoint.every` steps and at the end, and writes
/// `run.json`. Every executor trains through here, the pipeline's too.
pub(crate) fn train_built(
    c: &RunConfig,
    ov: &Overrides,
    built: Built<'_>,
    exec: &mut dyn Executor,
    log: &mut dyn FnMut(Line),
) -> Result<RunSummary> {
    let Built { model, mesh, prepared, backend, dataset, compile_secs, predicted, processes } = built;
    let first_process = processes.is_none_or(|p| p.is_first());
    let resume = ov.resume || ov.resume_or_start;
    let identity = dataset.as_ref().map(|d| d.identity.clone());
    if let (Some(d), Some(dc)) = (&dataset, &c.data) {
        log(Line::Info(d.describe(dc)));
    }

    let mut manager = match &c.checkpoint {
        Some(k) => {
            let opts = CheckpointOptions {
                retention: Retention { keep_last: Some(k.keep_last), keep_every: k.keep_every },
                ..Default::default()
            };
            // In a multi-process run the first process cleans up, alone.
            let m = match processes {
                // Every host must see the same directory: checked now, not
                // at the first save.
                Some(p) if !p.is_first() => {
                    p.barrier("opening the checkpoint directory")?;
                    p.check_shared_dir(&k.dir)?;
                    CheckpointManager::open_shared(&k.dir, opts)?
                }
                Some(p) => {
                    let m = CheckpointManager::open(&k.dir, opts);
                    p.barrier("opening the checkpoint directory")?;
                    let m = m?;
                    p.check_shared_dir(&k.dir)?;
                    m
                }
                None => CheckpointManager::open(&k.dir, opts)?,
            };
            for p in m.cleaned() {
                log(Line::Warn(format!("removed the unfinished checkpoint {}", p.display())));
            }
            Some(m)
        }
        None => None,
    };
    let spec = mesh_spec(mesh);
    let mut first = 0;
    let mut resumed = false;
    if resume {
        let m = manager.as_ref().ok_or_else(|| Error::Resume("needs a checkpoint directory".into()))?;
        let mut latest = m.latest_valid_step()?;
        if let Some(p) = processes {
            // Process 0's choice for all: another host's view of a shared
            // directory may lag (a restart moments after a commit).
            let mine = latest.step.map_or(u64::MAX, |s| s).to_le_bytes();
            let all = p.all_gather(&mine, "the step to resume")?;
            let first = u64::from_le_bytes(all[0][..8].try_into().expect("8 bytes"));
            latest.step = (first != u64::MAX).then_some(first);
        }
        for s in &latest.skipped {
            log(Line::Warn(format!("skipping the checkpoint at step {}: {}", s.step, s.error)));
        }
        match latest.step {
            Some(step) if step > c.steps => {
                return Err(Error::Resume(format!(
                    "the newest valid checkpoint in {} is at step {step}, past the run's {} steps; \
                     raise steps (--steps) to at least {step} to continue it",
                    m.root().display(),
                    c.steps
                )));
            }
            Some(step) => {
                let saved = m.validate(step)?;
                super::data::check_saved(&saved, identity.as_ref(), m.root())?;
                warn_layout_changes(&saved, &spec, prepared, exec, log);
                // Restore onto this run's mesh and layout, whatever the saved
                // one was (resharding on load).
                let mut target = RestoreTarget::new(spec.clone());
                for (l, s) in prepared.step.state.iter().zip(exec.state_layout(&prepared.step)) {
                    target.insert(l.name.clone(), l.ty.clone(), Some(s));
                }
                if identity.is_some() {
                    let replicated = Some(weft_ir::TensorSharding::replicated(1));
                    target.insert(super::data::IDENTITY_LEAF, super::data::identity_type(), replicated);
                }
                if let Some(p) = processes {
                    // Each process reads only the blocks its devices hold.
                    target = target.only_devices(p.local_devices(mesh.num_devices())?);
                }
                let mut restored = m.restore(Some(step), &target)?;
                // The data identity is checked apart; the rest is the state.
                let mut id_tree = weft_compiler::train::Tree::new();
                if let Some(crate::checkpoint::LeafData::Global(t)) =
                    restored.state.leaves.remove(super::data::IDENTITY_LEAF)
                {
                    id_tree.insert(super::data::IDENTITY_LEAF.to_string(), t);
                }
                super::data::check_restored(&mut id_tree, identity.as_ref(), step, m.root())?;
                exec.load_blocks(&prepared.step, &restored.state)?;
                first = step;
                resumed = true;
                log(Line::Info(format!("resuming from step {step}")));
            }
            None if ov.resume_or_start => {
                let why = if latest.skipped.is_empty() { "none yet" } else { "every one is corrupt" };
                log(Line::Warn(format!("no valid checkpoint in {} ({why}): starting from step 0", m.root().display())));
            }
            None => {
                let why = if latest.skipped.is_empty() {
                    "it holds none".to_string()
                } else {
                    format!("all {} are corrupt (see the warnings above)", latest.skipped.len())
                };
                return Err(Error::Resume(format!(
                    "no valid checkpoint in {}: {why}; pass --resume-or-start to start from step 0 when there \
                     is none",
                    m.root().display()
                )));
            }
        }
    }
    if !resumed {
        let initial = prepared.step.init_state(&prepared.params, c.seed, c.initial_loss_scale());
        let state = initial.map_err(|e| match &ov.init {
            Some(p) => Error::Usage(format!("--init {}: {e}", p.display())),
            None => Error::from(e),
        })?;
        exec.load(&prepared.step, &state)?;
    }
    log(Line::Info(format!(
        "compiled in {:.2} s ({})",
        compile_secs.iter().map(|(_, t)| t).sum::<f64>(),
        compile_secs.iter().map(|(n, t)| format!("{n} {:.0} ms", t * 1e3)).collect::<Vec<_>>().join(", ")
    )));
    let data_json = identity.as_ref().map(|i| i.to_json());
    let prediction = |m| predicted.map(|p| super::report::json(p, m)).unwrap_or(serde_json::Value::Null);
    // The metrics file first: a path that cannot be written is named as
    // given, before anything is written beside it.
    let mut writer = match &c.metrics {
        Some(_) if !first_process => None,
        Some(p) if resumed => Some(MetricsWriter::open_resume(p, first)?),
        Some(p) => Some(MetricsWriter::open(p, false)?),
        None => None,
    };
    if first_process {
        write_manifest(c, model, mesh, exec, backend, prepared, data_json.as_ref(), &prediction(None), None)?;
    }
    let mut feed = match dataset {
        Some(d) => Some(super::data::Feed::start(c, model, d, backend, first, exec.batch_part(&prepared.step)?)?),
        None => None,
    };
    let every = c.checkpoint.as_ref().map(|k| k.every).unwrap_or(u64::MAX);
    let every_seconds = c.checkpoint.as_ref().and_then(|k| k.every_seconds);
    let mut last_save = std::time::Instant::now();
    let total = c.steps;
    let mut trace = match &c.trace {
        Some(t) => {
            let steps = super::trace::parse_steps(t.steps.as_deref(), first, total)?;
            if steps.start < first || steps.end > total {
                return Err(crate::error::Error::Invalid {
                    key: "trace.steps (--trace-steps)".into(),
                    value: format!("{}..{}", steps.start, steps.end),
                    expected: format!("steps this run runs: within {first}..{total}"),
                });
            }
            let mut w = super::trace::TraceWriter::new(&t.file, steps, t.sync, processes.map(|p| p.rank()));
            if let Some(p) = predicted {
                w.set_prediction(p.compute, (p.total - p.compute).max(0.0));
            }
            Some(w)
        }
        None => None,
    };
    // Process 0 keeps every process's step times (`[stragglers]`).
    let mut stragglers =
        processes.filter(|p| p.is_first()).map(|p| Stragglers::new(p.size(), c.stragglers.clone().unwrap_or_default()));
    let host = |q: usize| processes.map(|p| p.hosts().name(q).to_string()).unwrap_or_default();
    let mut saving = std::collections::BTreeSet::new();
    let waited = processes.map(|p| move || p.waited());
    let mut summary = run_steps(
        c,
        prepared,
        exec,
        first,
        writer.as_mut(),
        feed.as_mut(),
        |next, time, ex| {
            // Asked to stop (by any process): this step's checkpoint, made
            // durable, is the run's last act. Time-based saves follow
            // process 0's clock; a multi-process save in flight commits
            // once every process has written its files.
            let local = super::boundary::Local {
                stop: ov.preemption.as_ref().is_some_and(super::preempt::Preemption::requested),
                save_due: every_seconds.filter(|_| manager.is_some()).map(|s| last_save.elapsed().as_secs_f64() >= s),
                written: manager.as_ref().and_then(CheckpointManager::across_written),
                time,
            };
            let boundary = super::boundary::agree(local, processes)?;
            if let Some(w) = stragglers.as_mut().and_then(|s| s.record(next - 1, &boundary.times, host)) {
                log(Line::Warn(w));
            }
            let stop = boundary.stop;
            if let Some(m) = manager.as_mut() {
                if boundary.commit {
                    m.wait()?;
                }
                if next % every == 0 || next == total || stop || boundary.save {
                    last_save = std::time::Instant::now();
                    let mut state = ex.checkpoint_state(&prepared.step)?;
                    if let Some(id) = &identity {
                        super::data::add_identity(&mut state, id);
                    }
                    match processes {
                        Some(p) => {
                            super::processes::own_replicated_leaves(&mut state, p.is_first());
                            m.save_across_async(next, state, p.group(), p.timeout())?;
                        }
                        None => {
                            m.save_async_owned(next, state)?;
                        }
                    }
                }
                if stop {
                    m.wait()?;
                }
            }
            if stop {
                return Err(crate::error::Error::Preempted { step: next, saved: manager.is_some() });
            }
            if manager.as_ref().is_some_and(CheckpointManager::writing) {
                saving.insert(next);
            }
            Ok(())
        },
        ov.quiet || !first_process,
        trace.as_mut(),
        waited.as_ref().map(|f| f as &dyn Fn() -> std::time::Duration),
    )?;
    summary.stragglers = stragglers.as_ref().map(|s| s.json(host));
    summary.saving = saving;
    if let Some(line) = stragglers.as_ref().and_then(|s| s.summary(host)) {
        log(Line::Info(line));
    }
    if let Some(t) = &trace {
        log(Line::Info(format!("trace written to {}", t.path().display())));
    }
    let mut last_checkpoint = None;
    if let Some(mut m) = manager {
        m.wait()?;
        if summary.diverged.is_some() {
            last_checkpoint = m.latest_step()?;
        }
        m.finish()?;
    }
    summary.compile_secs = compile_secs;
    if let Some(t) = summary.steady_step_secs() {
        let versus = predicted.map(|p| format!("; {}", super::report::versus(p, t))).unwrap_or_default();
        log(Line::Info(format!(
            "steady-state step {:.2} ms (median of {} steps after the first){versus}",
            t * 1e3,
            summary.step_secs.len().saturating_sub(1).max(1),
        )));
    }
    if let [(Some(busy), n), (Some(quiet), _)] = summary.step_secs_while_saving() {
        log(Line::Info(format!(
            "steps while a checkpoint was written in the background: median {:.2} ms ({n} steps), {:+.1}% against \
             the others",
            busy * 1e3,
            (busy / quiet - 1.0) * 100.0
        )));
    }
    if let Some(line) = summary.verdict.line() {
        let host = if backend.on_host() { "" } else { "; host times: the GPU runs ahead (--trace-sync times a step)" };
        log(Line::Info(format!("{line}{host}")));
    }
    let utilisation = match (predicted, summary.steady_step_secs()) {
        (Some(p), Some(step_s)) => {
            // One device: the partitioned program is the model's.
            let devices = mesh.num_devices();
            let model_flops = if devices == 1 { p.flops } else { super::report::model_flops(prepared, mesh)? };
            let hosts = processes.map_or(1, |p| p.hosts().distinct_of(0..p.size()).len());
            let peak = super::report::peak(backend, devices, hosts, c.peak_tflops);
            Some(super::report::Utilisation { model_flops, hardware_flops: p.flops * devices as f64, step_s, peak })
        }
        _ => None,
    };
    if let Some(u) = &utilisation {
        log(Line::Info(format!("utilisation: {}", u.line())));
    }
    summary.utilisation = utilisation.as_ref().map(super::report::Utilisation::json);
    if let Some(w) = super::data::wait_summary(&summary) {
        log(Line::Info(w));
    }
    let measured = prediction(summary.steady_step_secs());
    if first_process {
        write_manifest(c, model, mesh, exec, backend, prepared, data_json.as_ref(), &measured, Some(&summary))?;
    }
    if let Some((first, last)) = summary.diverged {
        let steps = last - first + 1;
        return Err(crate::error::Error::Diverged { steps, first, last, last_good: last_checkpoint });
    }
    Ok(summary)
}

#[allow(clippy::too_many_arguments)]
fn write_manifest(
    c: &RunConfig,
    model: &Model,
    mesh: &Mesh,
    exec: &dyn Executor,
    backend: Backend,
    prepared: &super::Prepared,
    data: Option<&serde_json::Value>,
    prediction: &serde_json::Value,
    summary: Option<&RunSummary>,
) -> Result<()> {
    // One run per checkpoint directory; without one, beside the metrics
    // file and named after it (two runs may share a metrics directory).
    let path = match (&c.checkpoint, &c.metrics) {
        (Some(k), _) => k.dir.join("run.json"),
        (None, Some(m)) => super::metrics::beside_metrics(m, "run.json"),
        (None, None) => return Ok(()),
    };
    let dir = path.parent().map(|p| p.to_path_buf()).unwrap_or_default();
    if !dir.as_os_str().is_empty() {
        std::fs::create_dir_all(&dir).map_err(|source| Error::Io { path: dir.clone(), source })?;
    }
    let mut manifest = serde_json::json!({
        "weft_version": env!("CARGO_PKG_VERSION"),
        "git_revision": env!("WEFT_GIT_REV"),
        "config": serde_json::to_value(c).unwrap_or_default(),
        "mesh": mesh.to_string(),
        "backend": backend.name(),
        "devices": exec.describe(),
        "strategy": prepared.strategy.name(),
        "model": model.label,
        "seed": c.seed,
        "steps": c.steps,
        "state_leaves": prepared.step.state.iter().zip(exec.state_layout(&prepared.step)).map(|(l, layout)| serde_json::json!({
            "name": l.name, "type": l.ty.to_string(),
            "sharding": l.sharding.as_ref().map(|s| s.to_string()),
            "layout": layout.to_string(),
        })).collect::<Vec<_>>(),
    });
    if let Some(d) = data {
        manifest["data"] = d.clone();
    }
    manifest["predicted_step"] = prediction.clone();
    if let Some(s) = summary {
        manifest["timings"] = serde_json::json!({
            "compile_s": s.compile_secs.iter().map(|(n, t)| (n.clone(), serde_json::json!(t))).collect::<serde_json::Map<_, _>>(),
            "steady_step_s": s.steady_step_secs(),
            "first_step_s": s.step_secs.first(),
            "steps_timed": s.step_secs.len(),
        });
        let [(busy, n), (quiet, m)] = s.step_secs_while_saving();
        manifest["timings"]["step_s_while_saving"] = serde_json::json!({ "median": busy, "steps": n });
        manifest["timings"]["step_s_otherwise"] = serde_json::json!({ "median": quiet, "steps": m });
        if data.is_some() {
            let waits: Vec<f64> = s.metrics.iter().filter_map(|(_, m)| m.get("data_wait_ms").copied()).collect();
            manifest["timings"]["data_wait_ms_total"] = serde_json::json!(waits.iter().sum::<f64>());
        }
        if let Some(st) = &s.stragglers {
            manifest["timings"]["processes"] = st.clone();
        }
        if let Some(u) = &s.utilisation {
            manifest["timings"]["utilisation"] = u.clone();
        }
        manifest["timings"]["devices"] = s.verdict.json();
    }
    let text = serde_json::to_string_pretty(&manifest).expect("a JSON value serializes");
    std::fs::write(&path, text + "\n").map_err(|source| Error::Io { path, source })
}

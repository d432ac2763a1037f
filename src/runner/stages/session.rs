//! A `weft train` run with `[pipeline]`: the step cut into stages over the
//! mesh's stage axis, run by the pipeline driver, with the split, each
//! stage's predicted time and memory, the predicted and measured bubble,
//! and the schedule traces (unit clock and executor clock) reported.

use super::PipelineExecutor;
use crate::error::{Error, Result};
use crate::models::Model;
use crate::runner::processes::Processes;
use crate::runner::session::{train_built, Built};
use crate::runner::{prepare_model, Backend, Executor, Line, Overrides, Prepared, RunConfig, RunSummary};
use weft_compiler::autoshard::AutoShardOptions;
use weft_compiler::sharding::Mesh;
use weft_compiler::stages::{build_stages, simulate, Phase, PipelineConfig, StagedStep, Trace};

/// A pipeline run's outcome.
pub struct PipelineRun {
    /// The steps, as any run reports them.
    pub summary: RunSummary,
    /// The report (split, predictions, traces).
    pub report: PipelineReport,
}

/// What `weft train` and the plan report show about a pipeline.
#[derive(Clone, Debug)]
pub struct PipelineReport {
    /// The configuration.
    pub config: PipelineConfig,
    /// Per chunk (a stage unless interleaved): its units by name.
    pub stage_units: Vec<Vec<String>>,
    /// Per chunk: predicted forward and backward time of one microbatch (s).
    pub predicted_times: Vec<(f64, f64)>,
    /// Per chunk: predicted memory per device (bytes, the split's model).
    pub predicted_memory: Vec<u64>,
    /// Per stage: the stage program's peak live bytes and peak activation
    /// bytes (per device).
    pub program_peaks: Vec<(u64, u64)>,
    /// Predicted step time (cost-model seconds) and bubble.
    pub predicted_step: f64,
    /// The bubble of the predicted trace.
    pub predicted_bubble: f64,
    /// The unit-cost trace (F = 1, B = 2).
    pub unit_trace: Trace,
    /// The last step's trace on the executor's clock.
    pub measured_trace: Option<Trace>,
    /// Seconds compiling the stage functions.
    pub compile_secs: f64,
}

impl PipelineReport {
    /// The report as text, one line per stage (per chunk, then per stage,
    /// when interleaved).
    pub fn text(&self) -> String {
        let pc = &self.config;
        let v = pc.schedule.virtual_stages();
        let mut out = format!(
            "pipeline: {} stages, {} microbatches, schedule {}, split {:?}{} ({})\n",
            pc.stages,
            pc.microbatches,
            pc.schedule,
            self.stage_units.iter().map(Vec::len).collect::<Vec<_>>(),
            if v > 1 { " layers per chunk" } else { "" },
            if pc.split.is_some() { "explicit" } else { "chosen by cost" }
        );
        let human = |b: u64| crate::runner::human(b as usize);
        for (c, units) in self.stage_units.iter().enumerate() {
            let (f, b) = self.predicted_times[c];
            let predicted = format!(
                "{}; predicted F {} B {} per microbatch, memory {}",
                units.join(", "),
                secs(f),
                secs(b),
                human(self.predicted_memory[c])
            );
            if v == 1 {
                let (peak, acts) = self.program_peaks[c];
                out.push_str(&format!(
                    "  stage {c}: {predicted}; program peak {} (activations {})\n",
                    human(peak),
                    human(acts)
                ));
            } else {
                out.push_str(&format!("  stage {} chunk {c}: {predicted}\n", c % pc.stages));
            }
        }
        if v > 1 {
            for (s, &(peak, acts)) in self.program_peaks.iter().enumerate() {
                out.push_str(&format!("  stage {s}: program peak {} (activations {})\n", human(peak), human(acts)));
            }
        }
        let formula = if v > 1 { "(S-1)/(V*M+S-1)" } else { "(S-1)/(M+S-1)" };
        out.push_str(&format!(
            "  predicted step {} and bubble {:.3} (unit clock {:.3}; {formula} = {:.3})",
            secs(self.predicted_step),
            self.predicted_bubble,
            self.unit_trace.bubble(),
            weft_compiler::stages::ideal_bubble(pc.schedule, pc.stages, pc.microbatches)
        ));
        if let Some(t) = &self.measured_trace {
            out.push_str(&format!("\n  measured: last step {} with bubble {:.3}", secs(t.makespan()), t.bubble()));
        }
        out
    }

    /// The report and both traces as JSON.
    pub fn json(&self) -> String {
        let split: Vec<usize> = self.stage_units.iter().map(Vec::len).collect();
        let s_n = self.config.stages.max(1);
        // Per chunk; a chunk's program peaks are its stage's.
        let stages: Vec<String> = (0..self.stage_units.len())
            .map(|c| {
                format!(
                    "{{\"on_stage\":{},\"units\":{:?},\"forward\":{},\"backward\":{},\"memory\":{},\"program_peak\":{},\"activation_peak\":{}}}",
                    c % s_n,
                    self.stage_units[c],
                    self.predicted_times[c].0,
                    self.predicted_times[c].1,
                    self.predicted_memory[c],
                    self.program_peaks[c % s_n].0,
                    self.program_peaks[c % s_n].1
                )
            })
            .collect();
        format!(
            "{{\"schedule\":\"{}\",\"virtual_stages\":{},\"stages\":{},\"microbatches\":{},\"split\":{split:?},\"predicted_step\":{},\"predicted_bubble\":{},\"stage\":[{}],\"unit_trace\":{},\"measured_trace\":{}}}\n",
            self.config.schedule.name(),
            self.config.schedule.virtual_stages(),
            self.config.stages,
            self.config.microbatches,
            self.predicted_step,
            self.predicted_bubble,
            stages.join(","),
            self.unit_trace.to_json(),
            self.measured_trace.as_ref().map(|t| t.to_json()).unwrap_or_else(|| "null".into())
        )
    }
}

fn secs(s: f64) -> String {
    if s >= 1.0 {
        format!("{s:.3} s")
    } else if s >= 1e-3 {
        format!("{:.3} ms", s * 1e3)
    } else {
        format!("{:.3} us", s * 1e6)
    }
}

fn usage(e: impl std::fmt::Display) -> Error {
    Error::Usage(e.to_string())
}

/// The pipeline configuration of a validated config's `[pipeline]`.
pub fn pipeline_config(c: &RunConfig) -> Result<PipelineConfig> {
    let p = c.pipeline.as_ref().ok_or_else(|| usage("the config has no [pipeline] table"))?;
    Ok(PipelineConfig {
        stages: p.stages,
        microbatches: p.microbatches,
        schedule: p.schedule()?,
        split: p.split.clone(),
        memory_budget: p.memory_budget.as_deref().map(weft_ir::limits::parse_bytes).transpose().map_err(usage)?,
    })
}

/// Builds the model (for microbatches of `batch / M` rows), the
/// unpipelined accumulating step (its state layout and initial state) and
/// the step cut into stages, for a config with `[pipeline]` on `mesh`.
pub fn prepare_pipeline(c: &RunConfig, mesh: &Mesh, ov: &Overrides) -> Result<(Prepared, StagedStep, Mesh)> {
    prepare_pipeline_model(c, &c.model.model()?, mesh, ov)
}

/// [`prepare_pipeline`] for `model`.
pub fn prepare_pipeline_model(
    c: &RunConfig,
    model: &Model,
    mesh: &Mesh,
    ov: &Overrides,
) -> Result<(Prepared, StagedStep, Mesh)> {
    let pc = pipeline_config(c)?;
    let axis = c.pipeline.as_ref().map(|p| p.axis.clone()).unwrap_or_else(|| "stage".into());
    let sub = crate::runner::validate::split_mesh(mesh, &axis, pc.stages)?;
    let axes: Vec<&str> = sub.axes().iter().map(|a| a.name.as_str()).collect();
    let mut c2 = c.clone();
    c2.optimizer.micro_batches = pc.microbatches;
    c2.pipeline = None;
    let prepared = prepare_model(&c2, model, &axes, ov)?;
    let tc = &prepared.train_config;
    // The auto-sharder's machine model for the backend; the stages share
    // the machine's cores as the devices of the whole mesh do.
    let opts = crate::runner::report::machine_model(Backend::of(c)?, mesh, &AutoShardOptions::default());
    let staged = build_stages(&prepared.step.module, tc, &pc, sub.num_devices(), &opts)?;
    Ok((prepared, staged, sub))
}

/// The report of a pipelined step before it runs.
pub fn report(exec: &PipelineExecutor) -> Result<PipelineReport> {
    let staged = exec.staged();
    let pc = staged.config.clone();
    let split = &staged.split;
    let stage_units = split.ranges().into_iter().map(|r| staged.unit_names[r].to_vec()).collect();
    let unit_trace =
        simulate(pc.schedule, pc.stages, pc.microbatches, &|_, p| if p == Phase::Forward { 1.0 } else { 2.0 })?;
    let program_peaks = exec.stage_memory().into_iter().map(|(_, p)| (p.total, p.activations)).collect();
    Ok(PipelineReport {
        config: pc,
        stage_units,
        predicted_times: split.times.clone(),
        predicted_memory: split.memory.clone(),
        program_peaks,
        predicted_step: split.step_time,
        predicted_bubble: split.bubble,
        unit_trace,
        measured_trace: exec.last_trace().cloned(),
        compile_secs: exec.compile_secs(),
    })
}

/// The executor of a config's stages (`staged`, on `sub`, the mesh
/// without the stage axis, of the whole mesh `mesh`) on its backend; with
/// `strategy = "auto"` each stage function's layouts are the
/// auto-sharder's, under the backend's machine model and the config's
/// `memory_budget`.
pub fn pipeline_executor(
    c: &RunConfig,
    prepared: &Prepared,
    staged: StagedStep,
    sub: &Mesh,
    mesh: &Mesh,
) -> Result<PipelineExecutor> {
    pipeline_executor_on(c, prepared, staged, sub, mesh, None)
}

/// [`pipeline_executor`] as one process of a multi-process job
/// (`processes`): this process compiles and runs only its own stages
/// ([`super::remote`]).
pub fn pipeline_executor_on(
    c: &RunConfig,
    prepared: &Prepared,
    staged: StagedStep,
    sub: &Mesh,
    mesh: &Mesh,
    processes: Option<&Processes>,
) -> Result<PipelineExecutor> {
    let backend = Backend::of(c)?;
    let auto = prepared.auto.as_ref().map(|o| crate::runner::report::machine_model(backend, mesh, o));
    let mut exec = match processes {
        None => PipelineExecutor::with_auto(staged, sub, backend, auto.as_ref(), prepared.overlap)?,
        Some(p) => {
            if backend.one_process() {
                return Err(Error::Usage(format!(
                    "backend `{backend}` runs in one process, but this run has {} processes; use cpu, wgpu or cuda",
                    p.size()
                )));
            }
            if c.reduction.as_deref() == Some("fast") {
                return Err(Error::Usage(
                    "reduction = \"fast\" is not supported with [pipeline] over several processes yet: the stages' \
                     sums across processes fold in rank order (remove it, or --reduction deterministic)"
                        .into(),
                ));
            }
            let axis = c.pipeline.as_ref().map_or("stage", |p| p.axis.as_str());
            let chunks = staged.stages.len();
            let stages = super::remote::StageProcesses::new(
                p.untimed_group().clone(),
                p.timeout(),
                p.host_share(),
                mesh,
                axis,
                chunks,
            )?;
            PipelineExecutor::on_processes(staged, sub, backend, auto.as_ref(), prepared.overlap, stages)?
        }
    };
    exec.set_checkpoint_mesh(mesh);
    Ok(exec)
}

/// `auto-sharding plan ...:` and, per stage, each parameter's layout.
fn auto_plan(c: &RunConfig, exec: &PipelineExecutor) -> String {
    let budget = c.memory_budget.as_deref().map(|b| format!(" under a memory budget of {b} per device"));
    let mut plan = format!("auto-sharding plan per stage{}:", budget.unwrap_or_default());
    let stages = exec.staged().config.stages;
    for (c, layouts) in exec.param_layouts().into_iter().enumerate() {
        let at = if exec.staged().stages.len() == stages {
            format!("stage {c}")
        } else {
            format!("stage {} chunk {c}", c % stages)
        };
        if !exec.runs_stage(c % stages) {
            plan.push_str(&format!("\n  {at}: on processes {:?}", exec.stage_processes()[c % stages]));
            continue;
        }
        for (name, l) in layouts {
            plan.push_str(&format!("\n  {at}: {name} {l}"));
        }
    }
    plan
}

/// Runs a config with `[pipeline]`: builds the stages, then trains them as
/// any run trains ([`crate::runner::session`]'s `train_built`): from the
/// initial state or the newest checkpoint (`--resume`), on the fixed batch
/// or the `[data]` batches, saving checkpoints as configured; writes the
/// metrics (`c.metrics`) and, beside them, `pipeline.json` (the report and
/// both traces). `log` receives the lines a user sees.
///
/// The checkpoints hold the unpipelined step's state leaves (`params.*`,
/// the optimizer slots, `step`, `rng`) as global tensors on the whole mesh,
/// so a pipelined run's checkpoint resumes a run without `[pipeline]` (or
/// with another split, stage count or schedule) of the same model and
/// optimizer, and the other way round, by resharding on load.
pub fn run_pipeline_session(
    c: &RunConfig,
    model: &Model,
    ov: &Overrides,
    processes: Option<&Processes>,
    log: &mut dyn FnMut(Line),
) -> Result<PipelineRun> {
    let first_process = processes.is_none_or(|p| p.is_first());
    let mut silent = |_: Line| {};
    let log: &mut dyn FnMut(Line) = if first_process { log } else { &mut silent };
    let c = ov.apply(c.clone());
    let (mesh, _limit) = crate::runner::session::preflight(&c, model, ov)?;
    if let Some(p) = processes {
        let config = serde_json::to_vec(&c).unwrap_or_default();
        p.check_same(&[("binary", &crate::runner::processes::binary_bytes()), ("config", &config)])?;
    }
    let clock = std::time::Instant::now();
    let (prepared, staged, sub) = prepare_pipeline_model(&c, model, &mesh, ov)?;
    if let Some(p) = processes {
        // The stage functions are part of what every process must agree on.
        let text: String = (staged.stages.iter())
            .flat_map(|f| [&f.forward, &f.backward, &f.square, &f.update])
            .map(|f| weft_ir::text::print_module(&weft_ir::Module { functions: vec![f.clone()] }))
            .collect();
        p.check_same(&[("model", text.as_bytes())])?;
    }
    let build_secs = clock.elapsed().as_secs_f64();
    // The dataset is opened and checked before the stages are compiled.
    let dataset = crate::runner::data::open_dataset(&c, model, &prepared)?;
    let backend = Backend::of(&c)?;
    let exec = pipeline_executor_on(&c, &prepared, staged, &sub, &mesh, processes)?;
    log(Line::Info(format!(
        "weft train: {}, mesh {mesh} ({} devices), strategy {}, {} steps, seed {}",
        model.label,
        mesh.num_devices(),
        prepared.strategy,
        c.steps,
        c.seed
    )));
    log(Line::Info(exec.describe()));
    if let Some(p) = processes {
        let of = exec.stage_processes();
        let stages: Vec<String> = (0..p.size())
            .map(|q| {
                let mine: Vec<String> =
                    of.iter().enumerate().filter(|(_, ps)| ps.contains(&q)).map(|(s, _)| s.to_string()).collect();
                format!("process {q}: stage {}", mine.join(", "))
            })
            .collect();
        log(Line::Info(format!(
            "{}; process {} of {} on {}; stages on processes: {}",
            p.hosts().layout(),
            p.rank(),
            p.size(),
            p.hosts().describe(p.rank()),
            stages.join("; ")
        )));
    }
    if prepared.auto.is_some() {
        log(Line::Info(auto_plan(&c, &exec)));
    }
    let built = Built {
        model,
        mesh: &mesh,
        prepared: &prepared,
        backend,
        dataset,
        compile_secs: vec![("build stages".into(), build_secs), ("compile stages".into(), exec.compile_secs())],
        predicted: None,
        processes,
    };
    let mut exec = exec;
    let summary = train_built(&c, ov, built, &mut exec, log)?;
    let report = report(&exec)?;
    if let (Some(p), true) = (&c.metrics, first_process) {
        let path = crate::runner::metrics::beside_metrics(p, "pipeline.json");
        std::fs::write(&path, report.json()).map_err(|source| Error::Io { path, source })?;
    }
    Ok(PipelineRun { summary, report })
}

/// `weft train` for a config with `[pipeline]`: runs it (alone, or as one
/// of the job's `processes`) and prints the pipeline report and the last
/// step's loss (the first process only). Returns the exit code.
pub fn train_cli(c: &RunConfig, ov: &Overrides, processes: Option<&Processes>) -> Result<i32> {
    super::super::validate::validate(c)?;
    let run = run_pipeline_session(c, &c.model.model()?, ov, processes, &mut |line| match line {
        Line::Info(l) => println!("{l}"),
        Line::Warn(l) => eprintln!("warning: {l}"),
    })?;
    if processes.is_some_and(|p| !p.is_first()) {
        return Ok(0);
    }
    println!("{}", run.report.text());
    match run.summary.last_line() {
        Some(line) => println!("{line}"),
        None => println!("nothing to do: the run is already at step {}", ov.steps.unwrap_or(c.steps)),
    }
    Ok(0)
}

/// The pipeline report of a config with `[pipeline]` without running a
/// step (the stage functions are cut and verified, not compiled for
/// devices): the split, each stage's predicted time and memory, the
/// stage programs' peaks and the predicted bubble. For plan reports
/// (`weft lower`).
pub fn plan_report(c: &RunConfig) -> Result<PipelineReport> {
    let mesh = super::super::validate::validate(c)?;
    let (_, staged, sub) = prepare_pipeline(c, &mesh, &Overrides::default())?;
    report(&PipelineExecutor::new(staged, &sub, Backend::Interp)?)
}

//! One `weft train` session: executor, checkpoints, resume, manifest.

use super::mesh::{MeshBackend, MeshExecutor};
use super::{mesh_spec, prepare, run_steps, Executor, InterpExecutor, MetricsWriter, Overrides, RunConfig, RunSummary};
use crate::checkpoint::{CheckpointManager, CheckpointOptions, RestoreTarget, Retention};
use crate::error::{Error, Result};
use weft_compiler::sharding::Mesh;

/// Builds the executor for `backend` on `mesh`: `interp` (the unsharded
/// interpreter, one device), `sim` (the reference device-program simulator)
/// or a runtime backend (`cpu`, `wgpu`, `cuda`) with `threads` workers.
pub fn executor(
    backend: &str,
    mesh: &Mesh,
    prepared: &super::Prepared,
    threads: Option<usize>,
) -> Result<Box<dyn Executor>> {
    match backend {
        "interp" => {
            if mesh.num_devices() != 1 {
                return Err(Error::Usage(format!(
                    "backend `interp` runs the unsharded program on one device, but the mesh {mesh} has {} devices",
                    mesh.num_devices()
                )));
            }
            Ok(Box::new(InterpExecutor::new(&prepared.step)?))
        }
        "sim" => Ok(Box::new(MeshExecutor::new(&prepared.step, mesh, MeshBackend::Simulator, None)?)),
        other => {
            let kind = weft_runtime::select_backend(Some(other))?;
            Ok(Box::new(MeshExecutor::new(&prepared.step, mesh, MeshBackend::Devices(kind), threads)?))
        }
    }
}

/// Runs a whole session; `log` receives the lines a user sees.
pub fn run_session(c: &RunConfig, ov: &Overrides, log: &mut dyn FnMut(String)) -> Result<RunSummary> {
    let mesh = Mesh::parse(c.mesh.as_deref().unwrap_or("data=1")).map_err(|e| Error::Usage(format!("mesh: {e}")))?;
    if c.threads == Some(0) {
        return Err(Error::Usage("threads = 0: a runtime backend needs at least 1 worker thread".into()));
    }
    let axes: Vec<&str> = mesh.axes().iter().map(|a| a.name.as_str()).collect();
    let clock = std::time::Instant::now();
    let prepared = prepare(c, &axes, ov)?;
    let mut compile_secs = vec![("train step".to_string(), clock.elapsed().as_secs_f64())];
    let backend = c.backend.clone().unwrap_or_else(|| default_backend().into());
    let mut exec = executor(&backend, &mesh, &prepared, c.threads)?;
    compile_secs.extend(exec.compile_phases().into_iter().map(|(n, t)| (n.to_string(), t.as_secs_f64())));
    log(format!(
        "weft train: mesh {mesh} ({} devices), strategy {}, {} steps, seed {}",
        mesh.num_devices(),
        prepared.strategy,
        c.steps,
        c.seed
    ));
    log(exec.describe());

    let mut manager = match &c.checkpoint {
        Some(k) if k.dir.as_os_str().is_empty() => {
            return Err(Error::Usage("[checkpoint] needs a `dir` (or pass --checkpoint-dir)".into()));
        }
        Some(k) => {
            let opts = CheckpointOptions {
                retention: Retention { keep_last: Some(k.keep_last.max(1)), keep_every: k.keep_every },
                ..Default::default()
            };
            let m = CheckpointManager::open(&k.dir, opts)?;
            for p in m.cleaned() {
                log(format!("removed the unfinished checkpoint {}", p.display()));
            }
            Some(m)
        }
        None => None,
    };
    let spec = mesh_spec(&mesh);
    let mut first = 0;
    let mut resumed = false;
    if ov.resume {
        let m = manager.as_ref().ok_or_else(|| Error::Usage("--resume needs a checkpoint directory".into()))?;
        let latest = m.latest_valid_step()?;
        for s in &latest.skipped {
            log(format!("skipping step {}: {}", s.step, s.error));
        }
        if let Some(step) = latest.step {
            // Restore onto this run's mesh and layout, whatever the saved
            // one was (resharding on load).
            let mut target = RestoreTarget::new(spec.clone());
            for (l, s) in prepared.step.state.iter().zip(exec.state_layout(&prepared.step)) {
                target.insert(l.name.clone(), l.ty.clone(), Some(s));
            }
            let restored = m.restore(Some(step), &target)?;
            let tree = restored.state.to_tree().map_err(|e| Error::Usage(format!("restoring step {step}: {e}")))?;
            exec.load(&prepared.step, &tree)?;
            first = step;
            resumed = true;
            log(format!("resuming from step {step}"));
        } else {
            log("no valid checkpoint: starting from step 0".into());
        }
    }
    if !resumed {
        let state = prepared.step.init_state(&prepared.params, c.seed, 1.0)?;
        exec.load(&prepared.step, &state)?;
    }
    log(format!(
        "compiled in {:.2} s ({})",
        compile_secs.iter().map(|(_, t)| t).sum::<f64>(),
        compile_secs.iter().map(|(n, t)| format!("{n} {:.0} ms", t * 1e3)).collect::<Vec<_>>().join(", ")
    ));
    write_manifest(c, &mesh, exec.as_ref(), &backend, &prepared, None)?;
    let mut writer = match &c.metrics {
        Some(p) if resumed => Some(MetricsWriter::open_resume(p, first)?),
        Some(p) => Some(MetricsWriter::open(p, false)?),
        None => None,
    };
    let every = c.checkpoint.as_ref().map(|k| k.every.max(1)).unwrap_or(u64::MAX);
    let total = c.steps;
    let mut summary = run_steps(
        c,
        &prepared,
        exec.as_mut(),
        first,
        writer.as_mut(),
        |next, ex| {
            if let Some(m) = manager.as_mut() {
                if next % every == 0 || next == total {
                    let state = ex.checkpoint_state(&prepared.step)?;
                    m.save_async(next, &state)?;
                }
            }
            Ok(())
        },
        ov.quiet,
    )?;
    if let Some(m) = manager {
        m.finish()?;
    }
    summary.compile_secs = compile_secs;
    if let Some(t) = summary.steady_step_secs() {
        log(format!(
            "steady-state step {:.2} ms (median of {} steps after the first)",
            t * 1e3,
            summary.step_secs.len().saturating_sub(1).max(1)
        ));
    }
    write_manifest(c, &mesh, exec.as_ref(), &backend, &prepared, Some(&summary))?;
    Ok(summary)
}

/// The backend used when none is configured.
pub fn default_backend() -> &'static str {
    "cpu"
}

fn write_manifest(
    c: &RunConfig,
    mesh: &Mesh,
    exec: &dyn Executor,
    backend: &str,
    prepared: &super::Prepared,
    summary: Option<&RunSummary>,
) -> Result<()> {
    let dir = match (&c.checkpoint, &c.metrics) {
        (Some(k), _) => k.dir.clone(),
        (None, Some(m)) => m.parent().map(|p| p.to_path_buf()).unwrap_or_default(),
        (None, None) => return Ok(()),
    };
    std::fs::create_dir_all(&dir).map_err(|source| Error::Io { path: dir.clone(), source })?;
    let mut manifest = serde_json::json!({
        "weft_version": env!("CARGO_PKG_VERSION"),
        "git_revision": env!("WEFT_GIT_REV"),
        "config": serde_json::to_value(c).unwrap_or_default(),
        "mesh": mesh.to_string(),
        "backend": backend,
        "devices": exec.describe(),
        "strategy": prepared.strategy.name(),
        "seed": c.seed,
        "steps": c.steps,
        "state_leaves": prepared.step.state.iter().map(|l| serde_json::json!({
            "name": l.name, "type": l.ty.to_string(),
            "sharding": l.sharding.as_ref().map(|s| s.to_string()),
        })).collect::<Vec<_>>(),
    });
    if let Some(s) = summary {
        manifest["timings"] = serde_json::json!({
            "compile_s": s.compile_secs.iter().map(|(n, t)| (n.clone(), serde_json::json!(t))).collect::<serde_json::Map<_, _>>(),
            "steady_step_s": s.steady_step_secs(),
            "first_step_s": s.step_secs.first(),
            "steps_timed": s.step_secs.len(),
        });
    }
    let path = dir.join("run.json");
    let text = serde_json::to_string_pretty(&manifest).expect("a JSON value serializes");
    std::fs::write(&path, text + "\n").map_err(|source| Error::Io { path, source })
}

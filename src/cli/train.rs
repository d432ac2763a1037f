//! `weft train CONFIG.toml [flags]`.

use crate::error::{read_to_string, Error, Result};
use crate::runner::{self, Executor, InterpExecutor, MetricsWriter, Overrides, RunConfig};
use std::path::Path;
use weft_compiler::sharding::Mesh;

/// Runs an experiment. Returns the exit code.
pub fn train(config: &Path, ov: &Overrides) -> Result<i32> {
    let text = read_to_string(config)?;
    let c = RunConfig::from_toml(&text).map_err(|e| Error::Usage(format!("{}: {e}", config.display())))?;
    let c = ov.apply(c);
    let mesh = Mesh::parse(c.mesh.as_deref().unwrap_or("data=1")).map_err(|e| Error::Usage(format!("mesh: {e}")))?;
    let axes: Vec<&str> = mesh.axes().iter().map(|a| a.name.as_str()).collect();
    let prepared = runner::prepare(&c, &axes, ov)?;
    let backend = c.backend.clone().unwrap_or_else(|| "interp".into());
    let mut exec: Box<dyn Executor> = match backend.as_str() {
        "interp" => Box::new(InterpExecutor::new(&prepared.step)?),
        other => return Err(Error::Usage(format!("backend `{other}` is not available (available: interp)"))),
    };
    if !ov.quiet {
        println!(
            "weft train: {} on mesh {mesh} ({} devices), strategy {}, {} steps, seed {}",
            config.display(),
            mesh.num_devices(),
            prepared.strategy,
            c.steps,
            c.seed
        );
        println!("{}", exec.describe());
    }
    let state = prepared.step.init_state(&prepared.params, c.seed, 1.0)?;
    let mut writer = match &c.metrics {
        Some(p) => Some(MetricsWriter::open(p, false)?),
        None => None,
    };
    let summary = runner::run_steps(&c, &prepared, exec.as_mut(), state, writer.as_mut(), |_, _| Ok(()), ov.quiet)?;
    if let Some((s, m)) = summary.metrics.last() {
        println!("step {} loss {:.6} ({:.1} steps/s)", s + 1, m["loss"], summary.steps_per_sec);
    }
    Ok(0)
}

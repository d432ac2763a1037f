//! `weft train CONFIG.toml [flags]`.

use crate::error::{Error, Result};
use crate::runner::preempt::{Preemption, PREEMPTED_EXIT};
use crate::runner::processes::{Launch, Processes};
use crate::runner::{run_session_on, Line, Overrides, RunConfig};
use std::path::Path;

/// Runs an experiment (as one process of a job when launched by `mpirun`
/// or `srun`). Returns the exit code.
pub fn train(config: &Path, ov: &Overrides) -> Result<i32> {
    let launch = Launch::from_environment()?;
    let processes = launch.processes.as_ref();
    // SIGTERM, SIGINT, SIGUSR1: stop after the current step, saved.
    let ov = &Overrides { preemption: Some(Preemption::install()?), ..ov.clone() };
    let result = train_on(config, ov, processes);
    if let Err(e @ Error::Preempted { .. }) = &result {
        // Every process agreed on the step: each exits, none aborts the job.
        if processes.is_none_or(|p| p.is_first()) {
            println!("{e}");
        }
        return Ok(PREEMPTED_EXIT);
    }
    if let (Err(e), Some(p)) = (&result, processes) {
        // One write per line, so that the lines of processes that fail
        // together do not interleave in the launcher's output.
        let line = format!("error: process {} of {}: {e}\n", p.rank(), p.size());
        let _ = std::io::Write::write_all(&mut std::io::stderr().lock(), line.as_bytes());
        // Stop the whole job: no process is left waiting for this one. The
        // code tells `weft launch` whether a restart may help.
        p.abort_all(e.exit_code());
    }
    result
}

fn train_on(config: &Path, ov: &Overrides, processes: Option<&Processes>) -> Result<i32> {
    let c = ov.apply(RunConfig::load(config)?);
    if c.pipeline.is_some() {
        // `[pipeline]`: stages over the mesh's stage axis (specs/pipeline.md),
        // on this process alone or on the job's processes.
        return crate::runner::stages::train_cli(&c, ov, processes);
    }
    // `-q` hides the progress bar only: what the run does goes to stdout
    // and warnings to stderr, always.
    let summary = run_session_on(&c, ov, processes, &mut |line| match line {
        Line::Info(l) => println!("{l}"),
        Line::Warn(l) => eprintln!("warning: {l}"),
    })?;
    if processes.is_some_and(|p| !p.is_first()) {
        return Ok(0);
    }
    match summary.last_line() {
        Some(line) => println!("{line}"),
        None => println!("nothing to do: the run is already at step {}", c.steps),
    }
    Ok(0)
}

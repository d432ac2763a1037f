//! `weft launch [flags] -- train CONFIG [flags]` (see [`crate::launch`]).

use crate::error::{Error, Result};
use crate::launch::{parse_hosts, resuming_args, supervise, LaunchPlan, Launcher};
use crate::runner::RunConfig;
use clap::Parser;
use std::time::Duration;

/// The flags of `weft launch`.
#[derive(clap::Args, Debug)]
pub struct LaunchArgs {
    /// Processes of the job (default: the slots of `--hosts`).
    #[arg(short = 'n', long = "processes")]
    pub processes: Option<usize>,
    /// The hosts and their slots, `h1:2,h2:2` (default: under `srun`, the
    /// allocation's nodes with `SLURM_NTASKS_PER_NODE` slots each; under
    /// `mpirun`, wherever it puts the processes, and no host is probed).
    #[arg(long)]
    pub hosts: Option<String>,
    /// Restarts at most (0 to 1000).
    #[arg(long, default_value_t = 3)]
    pub max_restarts: u32,
    /// Fewest processes a restart may run on when hosts are lost (default:
    /// the job's processes: it never shrinks).
    #[arg(long)]
    pub min_processes: Option<usize>,
    /// `auto` (`srun` inside a Slurm allocation, else `mpirun`), `mpirun`
    /// or `srun`.
    #[arg(long, default_value = "auto")]
    pub launcher: String,
    /// A flag for the launcher, before the program (repeatable):
    /// `--mpi-arg=--oversubscribe`.
    #[arg(long = "mpi-arg", allow_hyphen_values = true, value_name = "ARG")]
    pub launcher_args: Vec<String>,
    /// Seconds to wait before a restart (0 to 3600).
    #[arg(long, default_value_t = 5.0)]
    pub restart_delay: f64,
    /// Seconds a host may take to answer its probe before a restart (more
    /// than 0, at most 3600).
    #[arg(long, default_value_t = 60.0)]
    pub probe_timeout: f64,
    /// Seconds the launcher may outlive a rank's error before it is killed
    /// with its processes (more than 0, at most 3600).
    #[arg(long, default_value_t = 30.0)]
    pub exit_grace: f64,
    /// The job: `train CONFIG [flags]`, after `--`.
    #[arg(last = true, required = true, value_name = "train CONFIG [FLAGS]")]
    pub job: Vec<String>,
}

fn seconds(flag: &str, v: f64, zero_ok: bool) -> Result<Duration> {
    if v.is_finite() && (v > 0.0 || (zero_ok && v == 0.0)) && v <= 3600.0 {
        return Ok(Duration::from_secs_f64(v));
    }
    let low = if zero_ok { "[0" } else { "(0" };
    Err(Error::Usage(format!("{flag} {v}: expected seconds in {low}, 3600]")))
}

/// The nodes of the Slurm allocation (`scontrol show hostnames`) with
/// `SLURM_NTASKS_PER_NODE` slots each, so that a restart can leave a lost
/// node out; `None` outside an allocation or without `scontrol`.
fn slurm_hosts() -> Option<Vec<crate::launch::HostSlots>> {
    let list = std::env::var("SLURM_JOB_NODELIST").ok()?;
    let per = std::env::var("SLURM_NTASKS_PER_NODE").ok()?.split('(').next()?.trim().parse().ok()?;
    let o = std::process::Command::new("scontrol").args(["show", "hostnames", &list]).output().ok()?;
    let names: Vec<String> = String::from_utf8_lossy(&o.stdout).split_whitespace().map(String::from).collect();
    (o.status.success() && !names.is_empty())
        .then(|| names.into_iter().map(|name| crate::launch::HostSlots { name, slots: per }).collect())
}

/// Checks the flags and the job's config, then supervises the job.
pub fn launch(a: &LaunchArgs) -> Result<i32> {
    if a.job.first().map(String::as_str) != Some("train") {
        return Err(Error::Usage(format!(
            "weft launch runs `train CONFIG [flags]` after `--`, not `{}`",
            a.job.join(" ")
        )));
    }
    // The job's own flags, checked as `weft train` checks them.
    let cli = super::Cli::try_parse_from(std::iter::once("weft".to_string()).chain(a.job.iter().cloned()))
        .map_err(|e| Error::Usage(format!("the job `{}`: {}", a.job.join(" "), e.to_string().trim())))?;
    let super::Command::Train(train) = cli.command else { unreachable!("checked: the job is `train`") };
    let c = train.overrides.apply(RunConfig::load(&train.config)?);
    let mesh = crate::runner::validate::validate(&c)?;
    let devices = mesh.num_devices();
    let Some(k) = &c.checkpoint else {
        return Err(Error::Usage(
            "weft launch restarts a job from its checkpoints: the config needs [checkpoint] dir (or pass \
             --checkpoint-dir to train)"
                .into(),
        ));
    };
    let launcher = Launcher::parse(&a.launcher)?;
    let hosts = match (&a.hosts, launcher) {
        (Some(h), _) => parse_hosts(h)?,
        (None, Launcher::Srun) => slurm_hosts().unwrap_or_default(),
        (None, Launcher::Mpirun) => Vec::new(),
    };
    let slots: usize = hosts.iter().map(|h| h.slots).sum();
    let n = match (a.processes, hosts.is_empty()) {
        (Some(n), _) => n,
        (None, false) => slots,
        (None, true) => return Err(Error::Usage("weft launch needs -n PROCESSES or --hosts".into())),
    };
    if n == 0 || n > devices {
        return Err(Error::Usage(format!("-n {n}: expected 1 to the mesh's {devices} devices")));
    }
    if !hosts.is_empty() && n > slots {
        return Err(Error::Usage(format!("-n {n}: the hosts have {slots} slots")));
    }
    let min = a.min_processes.unwrap_or(n);
    if min == 0 || min > n {
        return Err(Error::Usage(format!("--min-processes {min}: expected 1 to -n {n}")));
    }
    if a.max_restarts > 1000 {
        return Err(Error::Usage(format!("--max-restarts {}: expected 0 to 1000", a.max_restarts)));
    }
    let plan = LaunchPlan {
        processes: n,
        hosts,
        max_restarts: a.max_restarts,
        min_processes: min,
        launcher,
        launcher_args: a.launcher_args.clone(),
        restart_delay: seconds("--restart-delay", a.restart_delay, true)?,
        probe_timeout: seconds("--probe-timeout", a.probe_timeout, false)?,
        exit_grace: seconds("--exit-grace", a.exit_grace, false)?,
        devices,
        checkpoint_dir: k.dir.clone(),
        train_args: resuming_args(&a.job),
    };
    let program = std::env::current_exe().map_err(|e| Error::Usage(format!("cannot find the weft binary: {e}")))?;
    supervise(&plan, &program, &mut |line| eprintln!("{line}"))
}

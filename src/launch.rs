//! `weft launch`: a training job that restarts itself.
//!
//! `weft launch -n P [--hosts H:N,...] [--max-restarts K] [--min-processes M]
//! -- train CONFIG [flags]` starts `weft train` as a job of `P` processes
//! through the MPI launcher (`mpirun`, or `srun` inside a Slurm
//! allocation) and watches it. When the job fails — a rank killed, a host
//! lost, a collective timeout — it starts it again with
//! `--resume-or-start`, so the job continues from its newest valid
//! checkpoint; resumes are bitwise, so the finished run's metrics are
//! those of an uninterrupted one. Before a restart on named hosts, each
//! host is probed through the launcher (a one-process job that runs
//! `true` there, within `--probe-timeout`); the job restarts on the hosts
//! that answer, on the most processes they have slots for that divide the
//! mesh, and not on fewer than `--min-processes`. It gives up after
//! `K` restarts, with the last cause. A launcher that outlives a rank's
//! error by `--exit-grace` (`mpirun` waits for the daemon of a host it
//! lost) is killed with everything it started.
//!
//! What is not restarted: a success; a usage error (exit 2: it would fail
//! the same way); a diverged run (exit [`crate::error::DIVERGED_EXIT`]: it
//! would diverge again from the same checkpoint); a preempted one (exit
//! [`PREEMPTED_EXIT`]: the cluster wants the job gone, and its own
//! requeue brings it back). A signal to `weft launch` (`SIGTERM`,
//! `SIGINT`, `SIGUSR1`) is relayed to the launcher as `SIGUSR1`, which
//! `mpirun` and `srun` pass to every rank: the ranks preempt (commit the
//! step in progress; a rank the cluster signalled itself ignores the
//! repeat) and the launch exits with their code; a second signal is
//! relayed as `SIGTERM`, which stops the job at once. A signal while the
//! job is down (between attempts) ends the launch with 75, no attempt
//! made. The launcher runs in a process group of its own, without
//! standard input, and gets `SIGTERM` if the launch dies.
//!
//! Every attempt is logged on standard error and appended to
//! `launch.jsonl` in the checkpoint directory: its processes and hosts,
//! how it ended, the cause (the job's first `error:` line, or the
//! launcher's report of a killed rank) and what the launch did next.

use crate::error::{Error, Result};
use crate::runner::preempt::PREEMPTED_EXIT;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The program that starts the job's processes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Launcher {
    /// Open MPI's or MPICH's `mpirun`.
    Mpirun,
    /// Slurm's `srun` (inside an allocation).
    Srun,
}

impl Launcher {
    /// `auto` (`srun` inside a Slurm allocation, else `mpirun`), `mpirun`
    /// or `srun`.
    pub fn parse(s: &str) -> Result<Launcher> {
        match s {
            "auto" if std::env::var_os("SLURM_JOB_ID").is_some() => Ok(Launcher::Srun),
            "auto" | "mpirun" => Ok(Launcher::Mpirun),
            "srun" => Ok(Launcher::Srun),
            _ => Err(Error::Usage(format!("--launcher {s}: expected auto, mpirun or srun"))),
        }
    }

    fn program(self) -> &'static str {
        match self {
            Launcher::Mpirun => "mpirun",
            Launcher::Srun => "srun",
        }
    }
}

/// A host and the processes it may run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostSlots {
    /// The host name.
    pub name: String,
    /// Its slots.
    pub slots: usize,
}

/// Parses `--hosts h1:2,h2:2` (a host without `:N` has one slot).
pub fn parse_hosts(s: &str) -> Result<Vec<HostSlots>> {
    let bad = |why: String| Error::Usage(format!("--hosts {s}: {why}"));
    let mut hosts: Vec<HostSlots> = Vec::new();
    for part in s.split(',') {
        let (name, slots) = match part.split_once(':') {
            Some((n, k)) => (n, k.parse::<usize>().map_err(|_| bad(format!("`{k}` is not a number of slots")))?),
            None => (part, 1),
        };
        if name.is_empty() || name.contains(char::is_whitespace) {
            return Err(bad(format!("`{part}` names no host (expected HOST or HOST:SLOTS)")));
        }
        if slots == 0 || slots > 4096 {
            return Err(bad(format!("{name} has {slots} slots; expected 1 to 4096")));
        }
        if hosts.iter().any(|h| h.name == name) {
            return Err(bad(format!("{name} is named twice")));
        }
        hosts.push(HostSlots { name: name.to_string(), slots });
    }
    Ok(hosts)
}

fn hosts_text(hosts: &[HostSlots]) -> String {
    hosts.iter().map(|h| format!("{}:{}", h.name, h.slots)).collect::<Vec<_>>().join(",")
}

/// What `weft launch` was asked to do.
#[derive(Clone, Debug)]
pub struct LaunchPlan {
    /// Processes of the first attempt.
    pub processes: usize,
    /// The hosts (none: wherever the launcher puts the processes).
    pub hosts: Vec<HostSlots>,
    /// Restarts at most.
    pub max_restarts: u32,
    /// Fewest processes a restart may use.
    pub min_processes: usize,
    /// The launcher.
    pub launcher: Launcher,
    /// Flags passed to the launcher before the program (`--mpi-arg`).
    pub launcher_args: Vec<String>,
    /// The pause before a restart.
    pub restart_delay: Duration,
    /// How long a host probe may take.
    pub probe_timeout: Duration,
    /// How long the launcher may outlive a rank's error before it is
    /// killed (Open MPI's `mpirun` waits for a lost host's daemon).
    pub exit_grace: Duration,
    /// The devices of the job's mesh (a process count must divide it).
    pub devices: usize,
    /// The job's checkpoint directory (`launch.jsonl` goes there).
    pub checkpoint_dir: PathBuf,
    /// `train CONFIG [flags]`, with `--resume-or-start` (and without
    /// `--resume`).
    pub train_args: Vec<String>,
}

/// `train CONFIG [flags]` as every attempt runs it: resuming, or starting
/// when there is no checkpoint yet.
pub fn resuming_args(args: &[String]) -> Vec<String> {
    let mut out: Vec<String> = args.iter().filter(|a| *a != "--resume").cloned().collect();
    if !out.iter().any(|a| a == "--resume-or-start") {
        out.push("--resume-or-start".into());
    }
    out
}

/// The most processes, at most `most` and at least `least`, that divide
/// `devices`.
pub fn processes_for(devices: usize, most: usize, least: usize) -> Option<usize> {
    (least.max(1)..=most.min(devices)).rev().find(|p| devices % p == 0)
}

/// The command that starts `program ARGS` as `n` processes on `hosts`
/// (all of them when empty: the launcher's own placement).
pub fn job_command(
    launcher: Launcher,
    launcher_args: &[String],
    n: usize,
    hosts: &[HostSlots],
    program: &Path,
    args: &[String],
) -> Command {
    let mut c = Command::new(launcher.program());
    match launcher {
        Launcher::Mpirun => {
            c.args(["-n", &n.to_string()]);
            if !hosts.is_empty() {
                c.args(["--host", &hosts_text(hosts)]);
            }
        }
        Launcher::Srun => {
            c.args(["--ntasks", &n.to_string(), "--kill-on-bad-exit=1"]);
            if !hosts.is_empty() {
                let names: Vec<&str> = hosts.iter().map(|h| h.name.as_str()).collect();
                c.args(["--nodes", &hosts.len().to_string(), "--nodelist", &names.join(",")]);
            }
        }
    }
    c.args(launcher_args).arg(program).args(args);
    c
}

/// How one attempt ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ended {
    /// The launcher's exit code (`None`: killed by a signal).
    pub code: Option<i32>,
    /// Why, in a line.
    pub cause: String,
}

impl Ended {
    /// Whether a restart may fix it.
    pub fn restartable(&self) -> bool {
        !matches!(self.code, Some(0) | Some(2) | Some(PREEMPTED_EXIT) | Some(crate::error::DIVERGED_EXIT))
    }
}

/// The cause of a failure from the job's standard error: the first line
/// of weft's own (`error: ...`), else the launcher's report of a rank
/// that died, else the exit status.
pub fn cause_of(stderr: &[String], status: &str) -> String {
    let weft = stderr.iter().find(|l| l.starts_with("error: "));
    let launcher = stderr.iter().find(|l| names_a_cause(l));
    match (weft, launcher) {
        (Some(l), _) => l.trim_start_matches("error: ").trim().to_string(),
        (None, Some(l)) => l.trim().to_string(),
        (None, None) => format!("the job {status}"),
    }
}

fn status_text(s: &ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (s.code(), s.signal()) {
        (Some(c), _) => format!("exited with code {c}"),
        (None, Some(sig)) => format!("was killed by signal {sig}"),
        _ => "ended".into(),
    }
}

/// Signals to `weft launch`, relayed to the running job.
struct Relay {
    count: Arc<std::sync::atomic::AtomicUsize>,
}

impl Relay {
    fn install() -> Result<Relay> {
        let count = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut signals = signal_hook::iterator::Signals::new(crate::runner::preempt::SIGNALS)
            .map_err(|e| Error::Usage(format!("cannot install the signal handlers: {e}")))?;
        let c = Arc::clone(&count);
        std::thread::spawn(move || {
            for _ in signals.forever() {
                c.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        });
        Ok(Relay { count })
    }

    fn received(&self) -> usize {
        self.count.load(std::sync::atomic::Ordering::SeqCst)
    }
}

fn send(child: &Child, sig: i32) {
    // SAFETY: kill(2) with the pid of a child not yet reaped (its exit
    // status is collected only after this): no other process has it.
    unsafe {
        libc::kill(child.id() as libc::pid_t, sig);
    }
}

/// Kills `child` and its process group (it leads one: [`spawn_group`]).
fn kill_group(child: &mut Child) {
    // SAFETY: as in `send`; the group is the child's own.
    unsafe {
        libc::kill(-(child.id() as libc::pid_t), libc::SIGKILL);
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// Starts `c` as the leader of a process group of its own, so that what
/// it starts can be killed with it (and a terminal's Ctrl-C reaches only
/// `weft launch`, which relays it).
fn spawn_group(c: &mut Command) -> std::io::Result<Child> {
    use std::os::unix::process::CommandExt;
    c.process_group(0).spawn()
}

/// Whether a line of the job's standard error may name the cause of a
/// failure ([`cause_of`]): such lines are kept however long the output.
fn names_a_cause(line: &str) -> bool {
    line.starts_with("error: ")
        || line.contains("exited on signal")
        || line.contains("noticed that process")
        || line.contains("srun: error:")
}

/// Runs one attempt: starts the job, passes its standard error through
/// (keeping the lines that name a cause), relays the signals that come
/// after `handled` of them, and returns how it ended and how many signals
/// have come in all.
fn attempt(mut c: Command, relay: &Relay, handled: usize, grace: Duration) -> Result<(Ended, usize)> {
    let program = c.get_program().to_string_lossy().into_owned();
    // No terminal input for a launcher in a background process group (it
    // would stop on SIGTTIN); a launch that dies takes the job with it.
    c.stdin(Stdio::null()).stderr(Stdio::piped());
    // SAFETY: the closure runs in the child between fork and exec and only
    // calls prctl(2), which is async-signal-safe.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut c, || {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
            Ok(())
        });
    }
    let mut child = spawn_group(&mut c).map_err(|e| {
        Error::Usage(format!("cannot start `{program}`: {e} (is the MPI launcher installed and on PATH?)"))
    })?;
    let lines = Arc::new(Mutex::new(Vec::new()));
    // When a rank first reported an error.
    let failed: Arc<Mutex<Option<Instant>>> = Arc::new(Mutex::new(None));
    let pipe = child.stderr.take().expect("piped");
    let (kept, failing) = (Arc::clone(&lines), Arc::clone(&failed));
    let reader = std::thread::spawn(move || {
        // Bytes, not text: a line that is not UTF-8 must not stop the
        // draining (the launcher would die of SIGPIPE).
        let mut pipe = std::io::BufReader::new(pipe);
        let mut buf = Vec::new();
        while pipe.read_until(b'\n', &mut buf).is_ok_and(|n| n > 0) {
            let line = String::from_utf8_lossy(&buf).trim_end_matches(['\n', '\r']).to_string();
            buf.clear();
            let _ = writeln!(std::io::stderr().lock(), "{line}");
            if line.starts_with("error: ") {
                failing.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert_with(Instant::now);
            }
            let mut k = kept.lock().unwrap_or_else(|p| p.into_inner());
            if k.len() < 4096 || names_a_cause(&line) {
                k.push(line);
            }
        }
    });
    let mut relayed = 0;
    let status = loop {
        if let Some(s) = child.try_wait().map_err(|e| Error::Usage(format!("waiting for `{program}`: {e}")))? {
            break s;
        }
        // A rank failed, and the launcher still waits (for a lost host's
        // daemon, say): the job is over.
        let since = *failed.lock().unwrap_or_else(|p| p.into_inner());
        if since.is_some_and(|t| t.elapsed() > grace) {
            kill_group(&mut child);
            continue;
        }
        let now = relay.received().saturating_sub(handled);
        if now > relayed {
            // The first: the ranks preempt (a rank signalled already
            // ignores a repeated SIGUSR1); any later one: stop now.
            send(&child, if relayed == 0 { libc::SIGUSR1 } else { libc::SIGTERM });
            relayed = now;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    // What the launcher started may hold the pipe open (a lost host's
    // daemon): the lines so far are enough after a moment.
    let t = Instant::now();
    while !reader.is_finished() && t.elapsed() < Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(20));
    }
    if !reader.is_finished() {
        kill_group(&mut child);
    }
    let lines = lines.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let text = status_text(&status);
    let cause = if status.success() { "finished".to_string() } else { cause_of(&lines, &text) };
    Ok((Ended { code: status.code(), cause }, handled + relayed))
}

/// Whether `host` answers: a one-process job that runs `true` there
/// ends well within `timeout`.
fn probe(plan: &LaunchPlan, host: &HostSlots) -> bool {
    let one = [HostSlots { name: host.name.clone(), slots: 1 }];
    let mut c = job_command(plan.launcher, &plan.launcher_args, 1, &one, Path::new("true"), &[]);
    let Ok(mut child) = spawn_group(c.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null())) else {
        return false;
    };
    let t = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(s)) => return s.success(),
            Ok(None) if t.elapsed() < plan.probe_timeout => std::thread::sleep(Duration::from_millis(100)),
            _ => {
                kill_group(&mut child);
                return false;
            }
        }
    }
}

fn append_log(dir: &Path, record: &serde_json::Value) {
    let path = dir.join("launch.jsonl");
    let _ = std::fs::create_dir_all(dir);
    if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(&path) {
        let _ = writeln!(f, "{record}");
    }
}

/// Runs the job until it finishes, is preempted, fails in a way a restart
/// cannot fix, or has been restarted `max_restarts` times (module docs).
/// `program` is the `weft` binary the ranks run. Returns the exit code
/// `weft launch` ends with.
pub fn supervise(plan: &LaunchPlan, program: &Path, log: &mut dyn FnMut(String)) -> Result<i32> {
    let relay = Relay::install()?;
    let mut hosts = plan.hosts.clone();
    let mut n = plan.processes;
    let mut restarts = 0u32;
    // Signals relayed (or seen between attempts) so far.
    let mut handled = 0;
    loop {
        let attempt_no = restarts + 1;
        let on = if hosts.is_empty() { String::new() } else { format!(" on {}", hosts_text(&hosts)) };
        log(format!("weft launch: attempt {attempt_no} ({n} processes{on})"));
        let started = std::time::SystemTime::now();
        let c = job_command(plan.launcher, &plan.launcher_args, n, &hosts, program, &plan.train_args);
        let (ended, seen) = attempt(c, &relay, handled, plan.exit_grace)?;
        let signalled = seen > handled;
        handled = seen;
        let mut record = serde_json::json!({
            "attempt": attempt_no,
            "processes": n,
            "hosts": hosts_text(&hosts),
            "started_unix_s": started.duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64()),
            "seconds": started.elapsed().map_or(0.0, |d| d.as_secs_f64()),
            "exit_code": ended.code,
            "cause": ended.cause,
        });
        let done = |record: &mut serde_json::Value, action: &str| {
            record["action"] = action.into();
            append_log(&plan.checkpoint_dir, record);
        };
        if ended.code == Some(0) {
            done(&mut record, "finished");
            log(format!("weft launch: the job finished after {restarts} restarts"));
            return Ok(0);
        }
        if signalled || !ended.restartable() {
            done(&mut record, "stopped");
            let why = if signalled { "it was signalled" } else { "a restart would not help" };
            log(format!("weft launch: the job ended ({}); not restarting: {why}", ended.cause));
            return Ok(ended.code.unwrap_or(1));
        }
        if restarts >= plan.max_restarts {
            done(&mut record, "gave up");
            return Err(Error::GaveUp { restarts, cause: ended.cause });
        }
        // Where the next attempt can run (every named host is probed: one
        // lost before may be back).
        if !plan.hosts.is_empty() {
            let live: Vec<HostSlots> = plan.hosts.iter().filter(|h| probe(plan, h)).cloned().collect();
            let lost: Vec<&str> = plan.hosts.iter().filter(|h| !live.contains(h)).map(|h| h.name.as_str()).collect();
            let slots: usize = live.iter().map(|h| h.slots).sum();
            let Some(next) = processes_for(plan.devices, slots.min(plan.processes), plan.min_processes) else {
                done(&mut record, "gave up");
                let cause = format!(
                    "{}; the hosts that answer ({}) have {slots} slots, and no process count from \
                     --min-processes {} up to them divides the mesh's {} devices",
                    ended.cause,
                    if live.is_empty() { "none".to_string() } else { hosts_text(&live) },
                    plan.min_processes,
                    plan.devices
                );
                return Err(Error::GaveUp { restarts, cause });
            };
            if !lost.is_empty() {
                log(format!("weft launch: lost host{} {}", if lost.len() == 1 { "" } else { "s" }, lost.join(", ")));
            }
            // All there: the job's processes; else the most that fit.
            n = if lost.is_empty() { plan.processes } else { next };
            hosts = live;
        }
        if relay.received() > handled {
            // Asked to stop while the job was down: no new attempt.
            done(&mut record, "stopped");
            log("weft launch: signalled between attempts; not restarting".into());
            return Ok(PREEMPTED_EXIT);
        }
        restarts += 1;
        record["restart"] = restarts.into();
        done(&mut record, "restart");
        log(format!(
            "weft launch: restart {restarts} of {} in {:.1} s on {n} processes: {}",
            plan.max_restarts,
            plan.restart_delay.as_secs_f64(),
            ended.cause
        ));
        let t = Instant::now();
        while t.elapsed() < plan.restart_delay && relay.received() == handled {
            std::thread::sleep(Duration::from_millis(20).min(plan.restart_delay));
        }
        if relay.received() > handled {
            log("weft launch: signalled before the restart; not restarting".into());
            return Ok(PREEMPTED_EXIT);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(c: &Command) -> Vec<String> {
        std::iter::once(c.get_program()).chain(c.get_args()).map(|a| a.to_string_lossy().into_owned()).collect()
    }

    #[test]
    fn hosts_parse_with_slots_and_bad_ones_are_named() {
        let h = parse_hosts("a:2,b:3,c").unwrap();
        assert_eq!(h.iter().map(|h| (h.name.as_str(), h.slots)).collect::<Vec<_>>(), [("a", 2), ("b", 3), ("c", 1)]);
        assert_eq!(hosts_text(&h), "a:2,b:3,c:1");
        for bad in ["a:0", "a:x", ":2", "a,a", "a:2,,b"] {
            let e = parse_hosts(bad).unwrap_err().to_string();
            assert!(e.starts_with(&format!("--hosts {bad}: ")), "{e}");
        }
    }

    #[test]
    fn process_counts_divide_the_mesh_within_the_bounds() {
        assert_eq!(processes_for(8, 4, 1), Some(4));
        assert_eq!(processes_for(8, 3, 1), Some(2));
        assert_eq!(processes_for(8, 3, 3), None);
        assert_eq!(processes_for(6, 6, 4), Some(6));
        assert_eq!(processes_for(6, 5, 4), None);
        assert_eq!(processes_for(2, 8, 1), Some(2), "never more processes than devices");
    }

    #[test]
    fn every_attempt_resumes_or_starts() {
        let a: Vec<String> = ["train", "c.toml", "--resume", "-q"].map(String::from).to_vec();
        assert_eq!(resuming_args(&a), ["train", "c.toml", "-q", "--resume-or-start"]);
        let b: Vec<String> = ["train", "c.toml", "--resume-or-start"].map(String::from).to_vec();
        assert_eq!(resuming_args(&b), b);
    }

    #[test]
    fn launcher_commands() {
        let hosts = parse_hosts("h1:2,h2:2").unwrap();
        let extra = vec!["--oversubscribe".to_string()];
        let train: Vec<String> = ["train", "c.toml"].map(String::from).to_vec();
        let c = job_command(Launcher::Mpirun, &extra, 4, &hosts, Path::new("/bin/weft"), &train);
        assert_eq!(
            args(&c),
            ["mpirun", "-n", "4", "--host", "h1:2,h2:2", "--oversubscribe", "/bin/weft", "train", "c.toml"]
        );
        let c = job_command(Launcher::Srun, &[], 2, &hosts[..1], Path::new("weft"), &train);
        assert_eq!(
            args(&c),
            [
                "srun",
                "--ntasks",
                "2",
                "--kill-on-bad-exit=1",
                "--nodes",
                "1",
                "--nodelist",
                "h1",
                "weft",
                "train",
                "c.toml"
            ]
        );
        let c = job_command(Launcher::Mpirun, &[], 2, &[], Path::new("weft"), &train);
        assert_eq!(args(&c), ["mpirun", "-n", "2", "weft", "train", "c.toml"]);
        assert!(Launcher::parse("pbs").is_err());
    }

    #[test]
    fn causes_come_from_weft_then_the_launcher_then_the_status() {
        let lines: Vec<String> = [
            "step 3",
            "mpirun noticed that process rank 1 with PID 0 on node vm exited on signal 9 (Killed).",
            "error: process 0 of 2: the step boundary: process 1 did not answer within 30 s",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(
            cause_of(&lines, "exited with code 1"),
            "process 0 of 2: the step boundary: process 1 did not answer within 30 s"
        );
        assert!(cause_of(&lines[..2], "x").starts_with("mpirun noticed"));
        assert_eq!(cause_of(&[], "exited with code 137"), "the job exited with code 137");
        let e = |code| Ended { code, cause: String::new() };
        assert!(e(Some(1)).restartable() && e(Some(137)).restartable() && e(None).restartable());
        assert!(!e(Some(0)).restartable() && !e(Some(2)).restartable() && !e(Some(75)).restartable());
        assert!(!e(Some(crate::error::DIVERGED_EXIT)).restartable());
    }
}

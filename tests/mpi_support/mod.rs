//! What the multi-process tests share: launching `weft train` alone or
//! under `mpirun`, skipping (or, under `CI=true`, failing) where MPI is
//! missing, and reading what the runs wrote.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The `weft` binary under test.
pub const WEFT: &str = env!("CARGO_BIN_EXE_weft");

/// The repository root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Fails `test` with `why` under `CI=true`; prints SKIPPED elsewhere.
pub fn skip(test: &str, why: &str) {
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{test}: {why}");
    }
    eprintln!("SKIPPED {test}: {why}");
}

/// `Some(mpirun)` when multi-process tests can run here.
pub fn mpirun_or_skip(test: &str) -> Option<PathBuf> {
    let why = if !cfg!(feature = "mpi") {
        "weft was built without the `mpi` feature (cargo test --features mpi)"
    } else if Command::new("mpirun").arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status().is_err() {
        "mpirun is not installed (apt-get install openmpi-bin libopenmpi-dev)"
    } else {
        return Some(PathBuf::from("mpirun"));
    };
    skip(test, why);
    None
}

/// `mpirun -n N` as root in a container, oversubscribing the 2 cores.
pub fn mpirun(n: usize) -> Command {
    let mut c = Command::new("mpirun");
    c.args(["--allow-run-as-root", "--oversubscribe", "-n", &n.to_string()]);
    c
}

/// Runs `weft train CONFIG ARGS -q` under `launcher` (`mpirun` with its
/// flags), or alone when `None`, with `env` set in every process.
pub fn train_under(launcher: Option<Command>, config: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
    let under_mpirun = launcher.is_some();
    let mut c = launcher.unwrap_or_else(|| Command::new(WEFT));
    for (k, v) in env {
        c.env(k, v);
        if under_mpirun {
            // mpirun's own flag, before the program: export to every rank.
            c.args(["-x", k]);
        }
    }
    if under_mpirun {
        c.arg(WEFT);
    }
    c.arg("train").arg(root().join(config)).args(args).arg("-q");
    c.output().expect("runs")
}

/// Runs `weft train CONFIG ARGS` on `n` processes (`n == 0`: no mpirun).
pub fn train(n: usize, config: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
    train_under((n > 0).then(|| mpirun(n)), config, args, env)
}

/// `--steps STEPS --mesh data=2,model=4 --strategy STRATEGY --metrics M
/// --checkpoint-dir K --checkpoint-every 3`.
pub fn train_args<'a>(strategy: &'a str, steps: &'a str, m: &'a Path, k: &'a Path) -> Vec<&'a str> {
    vec![
        "--steps",
        steps,
        "--mesh",
        "data=2,model=4",
        "--strategy",
        strategy,
        "--metrics",
        m.to_str().unwrap(),
        "--checkpoint-dir",
        k.to_str().unwrap(),
        "--checkpoint-every",
        "3",
    ]
}

/// Asserts that a run succeeded, showing its output when not.
pub fn ok(o: &Output, what: &str) {
    assert!(
        o.status.success(),
        "{what}: exit {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// A file's bytes.
pub fn read(p: &Path) -> Vec<u8> {
    std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Every file of a committed step, by name.
pub fn step_files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap())
        .map(|e| (e.file_name().to_string_lossy().into_owned(), read(&e.path())))
        .collect();
    v.sort();
    v
}

/// The pids of the weft processes `mpirun` (pid `parent`) started.
pub fn children(parent: u32) -> Vec<u32> {
    let out = Command::new("pgrep").args(["-P", &parent.to_string()]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).split_whitespace().filter_map(|s| s.parse().ok()).collect()
}

/// The pids of the `n` ranks `mpirun` (pid `parent`) starts, once all are
/// up (or whatever is up after 30 s).
pub fn started_ranks(parent: u32, n: usize) -> Vec<u32> {
    let t = Instant::now();
    let mut ranks = Vec::new();
    while ranks.len() < n && t.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(100));
        ranks = children(parent);
    }
    ranks
}

/// The MPI rank of the process `pid` (from its environment), if it has one.
pub fn rank_of(pid: u32) -> Option<usize> {
    let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    env.split(|&b| b == 0)
        .find_map(|v| v.strip_prefix(b"OMPI_COMM_WORLD_RANK="))
        .and_then(|r| std::str::from_utf8(r).ok()?.parse().ok())
}

/// Sends `sig` (`-KILL`, `-STOP`, ...) to `pid`.
pub fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill").args([sig, &pid.to_string()]).status();
}

/// Waits for `child` at most `limit`; kills it (and its processes) if it
/// is still running then.
pub fn wait_at_most(mut child: std::process::Child, limit: Duration) -> (Option<Output>, Duration) {
    let t = Instant::now();
    while t.elapsed() < limit {
        if child.try_wait().unwrap().is_some() {
            return (Some(child.wait_with_output().unwrap()), t.elapsed());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    for p in children(child.id()) {
        signal(p, "-KILL");
    }
    let _ = child.kill();
    let _ = child.wait();
    (None, t.elapsed())
}

//! Preemption at random moments (`runner::preempt`): `SIGTERM` sent ten
//! times at seeded random moments (a random step, then a random delay of
//! a step or two) — during steps and during the saves of a checkpoint
//! every other step — to one process, and to ranks of `mpirun -n 2`. Every run exits with code 75 within the bound, the step
//! in progress is the newest valid checkpoint, and `--resume` continues to
//! metrics bitwise equal to an uninterrupted run's.

mod mpi_support;

use mpi_support::{mpirun, mpirun_or_skip, rank_of, signal, started_ranks, wait_at_most, WEFT};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use weft::checkpoint::{CheckpointManager, CheckpointOptions};

/// Two devices (so that two processes can share the mesh), steps of a
/// few milliseconds.
const MLP: &str = "steps = 1\nseed = 3\nmesh = \"data=2\"\nstrategy = \"dp\"\n[model]\nkind = \"mlp\"\nlayers = 2\nd = 64\nh = 256\nbatch = 64\n[optimizer]\nkind = \"adamw\"\nlr = 1e-3\n";
/// The bound on the time from the signal to the exit.
const BOUND: Duration = Duration::from_secs(30);
/// Steps of the uninterrupted reference (more than any trial reaches).
const REFERENCE_STEPS: u64 = 1000;

/// The trials' moments: how many steps a run has written before the
/// signal (1 to 150), and a delay of 0 to 4 ms after that (a step of this
/// model takes 2 to 3 ms here, a save about as long), so that the signals
/// land mid-run on a machine of any speed. Xorshift from `WEFT_TEST_SEED`,
/// printed, so a failure reruns.
fn moments(n: usize) -> Vec<(usize, u64)> {
    let mut x: u64 = std::env::var("WEFT_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x0dd_c0ffee);
    eprintln!("signal moments from seed {x} (WEFT_TEST_SEED)");
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (1 + (x % 150) as usize, (x >> 20) % 5)
        })
        .collect()
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path).unwrap_or_default().lines().map(String::from).collect()
}

/// The uninterrupted run's metrics lines.
fn reference(dir: &Path) -> Vec<String> {
    let steps = REFERENCE_STEPS.to_string();
    let o = Command::new(WEFT)
        .current_dir(dir)
        .args(["train", "c.toml", "--steps", &steps, "-q", "--metrics", "whole.jsonl"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    lines(&dir.join("whole.jsonl"))
}

/// A run that saves every other step, its checkpoints in `trial/ck`.
fn run_args(trial: &Path) -> Vec<String> {
    let steps = REFERENCE_STEPS.to_string();
    let (m, k) = (trial.join("m.jsonl"), trial.join("ck"));
    ["train", "c.toml", "--steps", &steps, "--checkpoint-every", "2", "-q", "--metrics"]
        .into_iter()
        .map(String::from)
        .chain([m.display().to_string(), "--checkpoint-dir".into(), k.display().to_string()])
        .collect()
}

/// Waits until the run has written `steps` metrics lines, then `delay_ms`.
fn wait_for_steps(trial: &Path, (steps, delay_ms): (usize, u64), running: &mut dyn FnMut() -> bool) {
    let t = Instant::now();
    while lines(&trial.join("m.jsonl")).len() < steps {
        assert!(running(), "the run ended before the signal");
        assert!(t.elapsed() < Duration::from_secs(120), "the run wrote too few metrics");
        std::thread::sleep(Duration::from_millis(1));
    }
    std::thread::sleep(Duration::from_millis(delay_ms));
}

/// Checks a preempted trial: exit 75 within the bound, the step in
/// progress committed, and a resume to a few steps further bitwise the
/// reference.
fn check_trial(dir: &Path, trial: &Path, code: Option<i32>, waited: Duration, out: &str, whole: &[String]) {
    assert_eq!(code, Some(75), "{out}");
    assert!(waited < BOUND, "exited {waited:?} after the signal");
    let done = lines(&trial.join("m.jsonl")).len() as u64;
    assert!(out.contains(&format!("preempted: stopped after step {done}")), "{out}");
    let ck = CheckpointManager::open(trial.join("ck"), CheckpointOptions::default()).unwrap();
    assert_eq!(ck.latest_valid_step().unwrap().step, Some(done), "the step in progress is committed: {out}");
    let mut args = run_args(trial);
    let total = (done + 3).to_string();
    args[3] = total;
    let resumed = Command::new(WEFT).current_dir(dir).args(&args).arg("--resume").output().unwrap();
    assert!(resumed.status.success(), "{}", String::from_utf8_lossy(&resumed.stderr));
    let got = lines(&trial.join("m.jsonl"));
    assert_eq!(got.len() as u64, done + 3);
    assert!(got[..] == whole[..got.len()], "the resumed metrics differ from the uninterrupted run's");
}

#[test]
fn sigterm_at_random_moments_of_one_process() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    std::fs::write(d.join("c.toml"), MLP).unwrap();
    let whole = reference(d);
    for (i, after) in moments(10).into_iter().enumerate() {
        let trial = d.join(format!("one-{i}"));
        let mut child = Command::new(WEFT)
            .current_dir(d)
            .args(run_args(&trial))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        wait_for_steps(&trial, after, &mut || child.try_wait().unwrap().is_none());
        let t = Instant::now();
        signal(child.id(), "-TERM");
        let (out, waited) = wait_at_most(child, BOUND);
        let out = out.expect("the run exits");
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        check_trial(d, &trial, out.status.code(), waited.max(t.elapsed()), &format!("trial {i}: {text}"), &whole);
    }
}

#[test]
fn sigterm_at_random_moments_of_two_processes() {
    let Some(_) = mpirun_or_skip("sigterm_at_random_moments_of_two_processes") else { return };
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    std::fs::write(d.join("c.toml"), MLP).unwrap();
    let whole = reference(d);
    for (i, after) in moments(10).into_iter().enumerate() {
        let trial = d.join(format!("two-{i}"));
        let mut c = mpirun(2);
        let mut child = c
            .current_dir(d)
            .arg(WEFT)
            .args(run_args(&trial))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let ranks = started_ranks(child.id(), 2);
        assert_eq!(ranks.len(), 2, "mpirun started {ranks:?}");
        wait_for_steps(&trial, after, &mut || child.try_wait().unwrap().is_none());
        // As a cluster does: one rank, the other, or both (by the moment).
        let to: Vec<u32> = match after.0 % 3 {
            0 => ranks.clone(),
            r => ranks.iter().copied().filter(|&p| rank_of(p) == Some(r - 1)).collect(),
        };
        for p in to {
            signal(p, "-TERM");
        }
        let (out, waited) = wait_at_most(child, BOUND);
        let out = out.expect("the job exits");
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        check_trial(d, &trial, out.status.code(), waited, &format!("trial {i}: {text}"), &whole);
    }
}

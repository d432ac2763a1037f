//! Preemption (`runner::preempt`): `SIGTERM`, `SIGUSR1` or `SIGINT` sent to
//! `weft train` mid-run make it finish the step in progress, commit that
//! step's checkpoint and exit with code 75 within a bound; `--resume` then
//! continues to metrics bitwise equal to an uninterrupted run's. A second
//! signal during the save exits at once (130), and the newest valid
//! checkpoint still resumes.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use weft::checkpoint::{CheckpointManager, CheckpointOptions};

/// A small MLP whose steps take a few milliseconds: a run of many steps is
/// still going when the signal comes.
const MLP: &str = "steps = 1\nseed = 3\n[model]\nkind = \"mlp\"\nlayers = 2\nd = 64\nh = 256\nbatch = 64\n[optimizer]\nkind = \"adamw\"\nlr = 1e-3\n";
/// The bound on the time from the signal to the exit.
const BOUND: Duration = Duration::from_secs(30);

fn weft(dir: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_weft"));
    c.current_dir(dir).args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
    c
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path).unwrap_or_default().lines().map(String::from).collect()
}

/// Starts a long run and waits until it has written `at_least` metrics lines.
fn started(dir: &Path, every: &str, at_least: usize) -> Child {
    let args = ["train", "c.toml", "--steps", "100000", "--checkpoint-dir", "ck", "--checkpoint-every", every];
    let mut child = weft(dir, &[&args[..], &["-q", "--metrics", "m.jsonl"]].concat()).spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while lines(&dir.join("m.jsonl")).len() < at_least {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the run ended before the signal: {status}");
        }
        assert!(Instant::now() < deadline, "the run wrote no metrics");
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

fn signal(child: &Child, sig: &str) {
    let ok = Command::new("kill").args([&format!("-{sig}"), &child.id().to_string()]).status().unwrap();
    assert!(ok.success(), "kill -{sig}");
}

/// Waits for the exit (within [`BOUND`]); the exit code and stdout.
fn exited(mut child: Child) -> (Option<i32>, String) {
    let deadline = Instant::now() + BOUND;
    loop {
        if child.try_wait().unwrap().is_some() {
            let out = child.wait_with_output().unwrap();
            return (out.status.code(), String::from_utf8_lossy(&out.stdout).into_owned());
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("no exit within {BOUND:?} of the signal");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn newest_valid(dir: &Path) -> Option<u64> {
    CheckpointManager::open(dir.join("ck"), CheckpointOptions::default()).unwrap().latest_valid_step().unwrap().step
}

#[test]
fn a_signalled_run_commits_its_step_and_resumes_bitwise() {
    for sig in ["TERM", "USR1", "INT"] {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        std::fs::write(d.join("c.toml"), MLP).unwrap();
        // No step-count checkpoint would come for a long time.
        let child = started(d, "1000000", 5);
        signal(&child, sig);
        let (code, out) = exited(child);
        assert_eq!(code, Some(75), "SIG{sig}: {out}");
        let done = lines(&d.join("m.jsonl")).len() as u64;
        assert!(out.contains(&format!("preempted: stopped after step {done}")), "SIG{sig}: {out}");
        assert_eq!(newest_valid(d), Some(done), "SIG{sig}: the step in progress is committed");
        if sig != "TERM" {
            continue;
        }
        // Resumed to a few steps further, the metrics are an uninterrupted
        // run's, bit for bit.
        let total = (done + 4).to_string();
        let resumed = weft(
            d,
            &["train", "c.toml", "--steps", &total, "--checkpoint-dir", "ck", "--resume", "-q", "--metrics", "r.jsonl"],
        )
        .output()
        .unwrap();
        assert!(resumed.status.success(), "{}", String::from_utf8_lossy(&resumed.stderr));
        let whole = weft(d, &["train", "c.toml", "--steps", &total, "-q", "--metrics", "w.jsonl"]).output().unwrap();
        assert!(whole.status.success(), "{}", String::from_utf8_lossy(&whole.stderr));
        let mut joined = lines(&d.join("m.jsonl"));
        joined.extend(lines(&d.join("r.jsonl")));
        assert_eq!(joined, lines(&d.join("w.jsonl")));
    }
}

/// Two signals in a row: the run exits with 130 if the second came during
/// the preemption's save (75 if that save had already finished); either
/// way the newest valid checkpoint is whole and resumes.
#[test]
fn a_second_signal_aborts_and_the_last_checkpoint_stays_valid() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    std::fs::write(d.join("c.toml"), MLP).unwrap();
    let child = started(d, "2", 6);
    signal(&child, "TERM");
    signal(&child, "TERM");
    let (code, out) = exited(child);
    assert!(matches!(code, Some(75) | Some(130)), "{code:?}: {out}");
    let done = lines(&d.join("m.jsonl")).len() as u64;
    let newest = newest_valid(d).expect("the step-count checkpoints");
    assert!((2..=done).contains(&newest), "newest valid {newest}, {done} steps done");
    let total = (done + 2).to_string();
    let resumed =
        weft(d, &["train", "c.toml", "--steps", &total, "--checkpoint-dir", "ck", "--resume", "-q"]).output().unwrap();
    assert!(resumed.status.success(), "{}", String::from_utf8_lossy(&resumed.stderr));
}

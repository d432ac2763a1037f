//! `weft train` never loses work: killed with SIGKILL at random moments
//! (also during checkpoint saves) and resumed with `--resume` each time, a
//! run ends with metrics bitwise identical to an uninterrupted run's, and
//! after every kill the newest committed checkpoint validates and loads.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;
use weft::checkpoint::{latest_valid_step, restore, RestoreTarget};

const CONFIG: &str = r#"
steps = 120
seed = 7
strategy = "none"

[model]
kind = "mlp"
layers = 2
d = 16
h = 32
batch = 8

[optimizer]
kind = "adamw"
lr = 0.01

[checkpoint]
every = 3
keep_last = 2
"#;

#[path = "scratch_support/mod.rs"]
mod scratch_support;
use scratch_support::Scratch;

/// A fresh scratch directory, removed when the test ends.
fn dir(name: &str) -> Scratch {
    Scratch::new("resume", name)
}

/// `weft train` on `root`; `resume`: the resume flag to pass, if any.
fn train(root: &Path, resume: Option<&str>) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_weft"));
    c.arg("train")
        .arg(root.join("run.toml"))
        .arg("--checkpoint-dir")
        .arg(root.join("ckpt"))
        .arg("--metrics")
        .arg(root.join("metrics.jsonl"))
        .arg("-q")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(flag) = resume {
        c.arg(flag);
    }
    c
}

/// The newest valid checkpoint step under `root`, if any.
fn latest(root: &Path) -> Option<u64> {
    let ckpt = root.join("ckpt");
    if ckpt.exists() {
        latest_valid_step(&ckpt).unwrap().step
    } else {
        None
    }
}

/// A small deterministic generator for kill delays.
fn delays(seed: u64) -> impl Iterator<Item = u64> {
    let mut x = seed;
    std::iter::repeat_with(move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        20 + x % 180
    })
}

#[test]
fn killed_and_resumed_runs_equal_the_uninterrupted_run() {
    let full = dir("full");
    std::fs::write(full.join("run.toml"), CONFIG).unwrap();
    let out = train(&full, None).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let expected = std::fs::read(full.join("metrics.jsonl")).unwrap();
    assert_eq!(String::from_utf8_lossy(&expected).lines().count(), 120);

    let root = dir("killed");
    std::fs::write(root.join("run.toml"), CONFIG).unwrap();
    let mut kills = 0;
    let mut completed = 0;
    let mut resumes_seen = 0;
    let mut delay = delays(0x5EED);
    let mut fresh = true;
    for round in 0..400 {
        // The step the run must resume from (none: it starts from 0).
        let from = latest(&root);
        // A kill may come before the first checkpoint: --resume-or-start.
        let flag = if fresh { None } else { Some("--resume-or-start") };
        let mut child = train(&root, flag).spawn().unwrap();
        fresh = false;
        std::thread::sleep(Duration::from_millis(delay.next().unwrap()));
        let finished = child.try_wait().unwrap().is_some();
        if !finished {
            child.kill().unwrap(); // SIGKILL
            kills += 1;
        }
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        // Whatever it printed of where it started agrees with the checkpoints.
        if let Some(line) = stdout.lines().find(|l| l.starts_with("resuming from step ")) {
            assert_eq!(
                line,
                format!("resuming from step {}", from.expect("resumed without a checkpoint")),
                "round {round}"
            );
            resumes_seen += 1;
        }
        // The newest committed checkpoint validates and loads.
        let ckpt = root.join("ckpt");
        if ckpt.exists() {
            let latest = latest_valid_step(&ckpt).unwrap();
            assert!(latest.skipped.is_empty(), "round {round}: a committed step failed to validate: {latest}");
            if let Some(step) = latest.step {
                let manifest = weft::checkpoint::validate_step(&ckpt, step).unwrap();
                let target = RestoreTarget::from_manifest(&manifest).unwrap();
                restore(&ckpt, Some(step), &target, 1).unwrap();
            }
        }
        if finished {
            assert!(out.status.success(), "round {round}: the run failed: {}", String::from_utf8_lossy(&out.stderr));
            if let (Some(s), true) = (from, flag.is_some()) {
                assert!(stdout.contains(&format!("resuming from step {s}\n")), "round {round}: {stdout}");
            }
            // A completed (killed and resumed) run equals the uninterrupted one.
            let got = std::fs::read(root.join("metrics.jsonl")).unwrap();
            assert!(got == expected, "round {round}: the resumed run's metrics differ from the uninterrupted run's");
            completed += 1;
            if kills >= 20 {
                break;
            }
            // Start over to collect more kills.
            std::fs::remove_dir_all(root.join("ckpt")).unwrap();
            std::fs::remove_file(root.join("metrics.jsonl")).unwrap();
            fresh = true;
        }
    }
    assert!(kills >= 20, "only {kills} kills");
    assert!(completed >= 1);
    assert!(resumes_seen >= 1, "no run resumed from a checkpoint");
    // Finish the run if the last round was killed: --resume now resumes
    // from the newest checkpoint, and says from which step.
    let from = latest(&root);
    let flag = if from.is_some() { "--resume" } else { "--resume-or-start" };
    let out = train(&root, Some(flag)).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    if let Some(s) = from {
        let stdout = String::from_utf8_lossy(&out.stdout);
        let resumed = stdout.contains(&format!("resuming from step {s}\n"));
        assert!(resumed, "the final run did not resume from step {s}: {stdout}");
    }
    let got = std::fs::read(root.join("metrics.jsonl")).unwrap();
    assert!(got == expected, "the resumed run's metrics differ from the uninterrupted run's");
}

//! `weft train` never loses work: killed with SIGKILL at random moments
//! (also during checkpoint saves) and resumed with `--resume` each time, a
//! run ends with metrics bitwise identical to an uninterrupted run's, and
//! after every kill the newest committed checkpoint validates and loads.

use std::path::{Path, PathBuf};
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

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("weft-resume-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn train(root: &Path, resume: bool) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_weft"));
    c.arg("train")
        .arg(root.join("run.toml"))
        .arg("--checkpoint-dir")
        .arg(root.join("ckpt"))
        .arg("--metrics")
        .arg(root.join("metrics.jsonl"))
        .arg("-q")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if resume {
        c.arg("--resume");
    }
    c
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
    let out = train(&full, false).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let expected = std::fs::read(full.join("metrics.jsonl")).unwrap();
    assert_eq!(String::from_utf8_lossy(&expected).lines().count(), 120);

    let root = dir("killed");
    std::fs::write(root.join("run.toml"), CONFIG).unwrap();
    let mut kills = 0;
    let mut completed = 0;
    let mut delay = delays(0x5EED);
    let mut fresh = true;
    for round in 0..400 {
        let mut child = train(&root, !fresh).spawn().unwrap();
        fresh = false;
        std::thread::sleep(Duration::from_millis(delay.next().unwrap()));
        let finished = child.try_wait().unwrap().is_some();
        if !finished {
            child.kill().unwrap(); // SIGKILL
            kills += 1;
        }
        let status = child.wait().unwrap();
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
            assert!(status.success(), "round {round}: the run failed");
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
    // Finish the run if the last round was killed.
    let out = train(&root, true).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let got = std::fs::read(root.join("metrics.jsonl")).unwrap();
    assert!(got == expected, "the resumed run's metrics differ from the uninterrupted run's");
}

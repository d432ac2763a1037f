//! `[checkpoint] every_seconds`: besides every `every` steps, a run saves
//! at the first step boundary that many seconds after its last save; the
//! key is range-checked.

use std::path::Path;
use std::process::Command;
use weft::checkpoint::{CheckpointManager, CheckpointOptions};

fn run(dir: &Path, every_seconds: &str) -> std::process::Output {
    let config = format!(
        "steps = 12\nseed = 1\n[model]\nkind = \"mlp\"\nlayers = 1\nd = 16\nh = 32\nbatch = 8\n\
         [checkpoint]\ndir = \"ck\"\nevery = 1000000\nkeep_last = 1000\nevery_seconds = {every_seconds}\n"
    );
    std::fs::write(dir.join("c.toml"), config).unwrap();
    Command::new(env!("CARGO_BIN_EXE_weft")).current_dir(dir).args(["train", "c.toml", "-q"]).output().unwrap()
}

fn saved(dir: &Path) -> Vec<u64> {
    CheckpointManager::open(dir.join("ck"), CheckpointOptions::default()).unwrap().list_steps().unwrap()
}

#[test]
fn time_based_saves_come_between_the_step_counts() {
    // A microsecond: every step boundary is due.
    let tmp = tempfile::tempdir().unwrap();
    let o = run(tmp.path(), "1e-6");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(saved(tmp.path()), (1..=12).collect::<Vec<u64>>());
    // Thirty years: only the end.
    let tmp = tempfile::tempdir().unwrap();
    let o = run(tmp.path(), "1e9");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(saved(tmp.path()), vec![12]);
}

#[test]
fn every_seconds_out_of_range_is_a_named_error() {
    for bad in ["0", "-1", "nan", "inf", "2e9"] {
        let tmp = tempfile::tempdir().unwrap();
        let o = run(tmp.path(), bad);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{bad}: {err}");
        assert!(err.contains("checkpoint.every_seconds"), "{bad}: {err}");
        assert!(!tmp.path().join("ck").exists(), "{bad}: nothing is written");
    }
}

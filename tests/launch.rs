//! `weft launch` (`launch`): a job of two processes whose rank 1 is
//! SIGKILLed three times at random moments is restarted each time from
//! its newest checkpoint and finishes with metrics bitwise equal to an
//! uninterrupted run, every restart logged with its cause (a pipeline
//! whose stage process is killed too); with fewer
//! restarts allowed it gives up, naming the last cause; bad flags and a
//! job without checkpoints are named errors before anything starts.
//! (Losing a host for good is in `tests/multihost.rs`.)

mod mpi_support;

use mpi_support::{mpirun_or_skip, rank_of, signal, WEFT};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const CONFIG: &str = "steps = 600\nseed = 3\nmesh = \"data=2\"\nstrategy = \"dp\"\n\
[model]\nkind = \"mlp\"\nlayers = 2\nd = 128\nh = 512\nbatch = 128\n\
[optimizer]\nkind = \"adamw\"\nlr = 1e-3\n\
[checkpoint]\ndir = \"ck\"\nevery = 3\n";

fn launch(dir: &Path, restarts: &str) -> Child {
    Command::new(WEFT)
        .current_dir(dir)
        .args(["launch", "-n", "2", "--max-restarts", restarts, "--restart-delay", "0.2"])
        .args(["--mpi-arg=--allow-run-as-root", "--mpi-arg=--oversubscribe"])
        .args(["--", "train", "c.toml", "-q", "--metrics", "m.jsonl"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// The pid of rank 1 of the job running in `dir` (its `weft train`
/// processes run there), other than `not`.
fn rank_1(dir: &Path, not: &[u32]) -> Option<u32> {
    let o = Command::new("pgrep").args(["-x", "weft"]).output().ok()?;
    String::from_utf8_lossy(&o.stdout).split_whitespace().filter_map(|p| p.parse().ok()).find(|&p: &u32| {
        !not.contains(&p)
            && rank_of(p) == Some(1)
            && std::fs::read_link(format!("/proc/{p}/cwd")).is_ok_and(|c| c == dir)
    })
}

/// The kill moments: how many more steps each attempt runs before its
/// rank 1 is killed (1 to 40; xorshift from `seed`), so that the kills land
/// mid-run on a machine of any speed.
fn moments(seed: u64, n: usize) -> Vec<usize> {
    let mut x = seed;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            1 + (x % 40) as usize
        })
        .collect()
}

fn metrics_lines(dir: &Path) -> usize {
    std::fs::read_to_string(dir.join("m.jsonl")).map_or(0, |t| t.lines().count())
}

/// Kills rank 1 of each attempt once it has run `moments[k]` more steps
/// (by the metrics file) since it came up; returns the pids.
fn kill_rank_1(dir: &Path, launch: &mut Child, moments: &[usize]) -> Vec<u32> {
    let mut killed = Vec::new();
    for &more in moments {
        let t = Instant::now();
        let pid = loop {
            assert!(launch.try_wait().unwrap().is_none(), "the launch ended after {} kills", killed.len());
            if let Some(p) = rank_1(dir, &killed) {
                break p;
            }
            assert!(t.elapsed() < Duration::from_secs(120), "no rank 1 came up");
            std::thread::sleep(Duration::from_millis(10));
        };
        // A resumed attempt rewrites the metrics file to its checkpoint's
        // step first: count from what it holds once it trains.
        let start = metrics_lines(dir);
        let mut base = start;
        while metrics_lines(dir) < base + more {
            assert!(launch.try_wait().unwrap().is_none(), "the launch ended after {} kills", killed.len());
            assert!(t.elapsed() < Duration::from_secs(120), "the attempt made no progress");
            base = base.min(metrics_lines(dir));
            std::thread::sleep(Duration::from_millis(2));
        }
        signal(pid, "-KILL");
        killed.push(pid);
    }
    killed
}

fn finished(child: Child) -> Output {
    let out = child.wait_with_output().unwrap();
    eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    out
}

fn records(dir: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(dir.join("ck/launch.jsonl")).unwrap_or_default();
    text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

#[test]
fn a_rank_killed_three_times_is_restarted_and_the_job_ends_bitwise() {
    let Some(_) = mpirun_or_skip("a_rank_killed_three_times_is_restarted_and_the_job_ends_bitwise") else { return };
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().canonicalize().unwrap();
    std::fs::write(d.join("c.toml"), CONFIG).unwrap();
    let mut child = launch(&d, "5");
    let seed = std::env::var("WEFT_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x5eed_2026);
    eprintln!("kill moments from seed {seed} (WEFT_TEST_SEED)");
    kill_rank_1(&d, &mut child, &moments(seed, 3));
    let out = finished(child);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    for k in 1..=3 {
        assert!(err.contains(&format!("weft launch: restart {k} of 5 ")), "restart {k} is not logged: {err}");
    }
    assert!(err.contains("weft launch: the job finished after 3 restarts"), "{err}");
    let r = records(&d);
    assert_eq!(
        r.iter().map(|r| r["action"].as_str().unwrap()).collect::<Vec<_>>(),
        ["restart", "restart", "restart", "finished"]
    );
    for rec in &r[..3] {
        let cause = rec["cause"].as_str().unwrap();
        assert!(cause.contains("rank 1") && cause.contains("signal 9"), "{cause}");
    }
    // Bitwise the uninterrupted run (alone: the processes are bitwise one).
    assert_like_uninterrupted(&d);
}

/// Runs `c.toml` in `dir` uninterrupted, in one process, and asserts that
/// the restarted job's metrics (`m.jsonl`) are bitwise its own.
fn assert_like_uninterrupted(dir: &Path) {
    let whole = Command::new(WEFT)
        .current_dir(dir)
        .args(["train", "c.toml", "-q", "--metrics", "w.jsonl", "--checkpoint-dir", "ck-whole"])
        .output()
        .unwrap();
    assert!(whole.status.success(), "{}", String::from_utf8_lossy(&whole.stderr));
    let (m, w) = (std::fs::read(dir.join("m.jsonl")).unwrap(), std::fs::read(dir.join("w.jsonl")).unwrap());
    assert!(m == w, "the restarted job's metrics differ from the uninterrupted run");
}

#[test]
fn a_job_failing_more_often_than_allowed_gives_up_with_the_last_cause() {
    let Some(_) = mpirun_or_skip("a_job_failing_more_often_than_allowed_gives_up_with_the_last_cause") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().canonicalize().unwrap();
    std::fs::write(d.join("c.toml"), CONFIG).unwrap();
    let mut child = launch(&d, "1");
    kill_rank_1(&d, &mut child, &moments(7, 2));
    let out = finished(child);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("error: weft launch: gave up after 1 restarts: mpirun noticed that process rank 1"), "{err}");
    let r = records(&d);
    assert_eq!(r.iter().map(|r| r["action"].as_str().unwrap()).collect::<Vec<_>>(), ["restart", "gave up"]);
}

#[test]
fn bad_launches_are_named_before_anything_starts() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    std::fs::write(d.join("c.toml"), CONFIG).unwrap();
    let no_ck = CONFIG.split("[checkpoint]").next().unwrap();
    std::fs::write(d.join("plain.toml"), no_ck).unwrap();
    let cases: &[(&[&str], &str)] = &[
        (&["-n", "2", "--", "run", "x.weft"], "weft launch runs `train CONFIG [flags]` after `--`"),
        (&["-n", "2", "--", "train", "plain.toml"], "the config needs [checkpoint] dir"),
        (&["-n", "3", "--", "train", "c.toml"], "-n 3: expected 1 to the mesh's 2 devices"),
        (&["--", "train", "c.toml"], "needs -n PROCESSES or --hosts"),
        (&["--hosts", "a:2,a:1", "--", "train", "c.toml"], "--hosts a:2,a:1: a is named twice"),
        (&["-n", "2", "--min-processes", "3", "--", "train", "c.toml"], "--min-processes 3: expected 1 to -n 2"),
        (&["-n", "2", "--restart-delay", "-1", "--", "train", "c.toml"], "--restart-delay -1: expected seconds"),
        (&["-n", "2", "--launcher", "pbs", "--", "train", "c.toml"], "--launcher pbs: expected auto, mpirun or srun"),
        (&["-n", "2", "--", "train", "c.toml", "--steps", "0"], "steps (--steps) = 0"),
        (&["-n", "2", "--", "train", "c.toml", "--bogus"], "the job `train c.toml --bogus`"),
    ];
    for (args, want) in cases {
        let o = Command::new(WEFT).current_dir(d).arg("launch").args(*args).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: expected `{want}` in: {err}");
        assert!(!d.join("ck").exists(), "{args:?} started the job");
    }
}

#[test]
fn a_pipeline_whose_stage_process_is_killed_restarts_and_ends_bitwise() {
    // Stage 1 of a two-stage pipeline (one stage per process) is killed;
    // the restart resumes both stages from the newest checkpoint.
    let Some(_) = mpirun_or_skip("a_pipeline_whose_stage_process_is_killed_restarts_and_ends_bitwise") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().canonicalize().unwrap();
    let config = "steps = 150\nseed = 4\nmesh = \"stage=2\"\n\
[model]\nkind = \"gpt\"\nvocab = 64\nseq = 16\nd_model = 32\nheads = 4\nlayers = 2\nbatch = 8\n\
[optimizer]\nkind = \"adamw\"\nlr = 1e-3\n\
[pipeline]\nstages = 2\nmicrobatches = 4\n\
[checkpoint]\ndir = \"ck\"\nevery = 3\n";
    std::fs::write(d.join("c.toml"), config).unwrap();
    let mut child = launch(&d, "3");
    kill_rank_1(&d, &mut child, &[12]);
    let out = finished(child);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(err.contains("weft launch: the job finished after 1 restart"), "{err}");
    assert_like_uninterrupted(&d);
}

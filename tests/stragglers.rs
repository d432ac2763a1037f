//! Stragglers (`runner::stragglers`): a rank of `mpirun -n 2` slowed on
//! purpose (`SIGSTOP`/`SIGCONT` cycles through the whole run) is named by
//! process 0 in a warning, as the process the others waited for, and in
//! `run.json`'s per-process times.

mod mpi_support;

use mpi_support::{mpirun, mpirun_or_skip, rank_of, signal, started_ranks, wait_at_most, WEFT};
use std::process::Stdio;
use std::time::{Duration, Instant};

/// Steps of about 40 ms here: each holds two of the stopped windows of
/// rank 1 on a machine several times faster.
const CONFIG: &str = "steps = 60\nseed = 3\nmesh = \"data=2\"\nstrategy = \"dp\"\n\
[model]\nkind = \"mlp\"\nlayers = 2\nd = 256\nh = 1024\nbatch = 256\n\
[optimizer]\nkind = \"adamw\"\nlr = 1e-3\n\
[checkpoint]\ndir = \"ck\"\nevery = 1000\n\
[stragglers]\nratio = 1.3\nsteps = 5\n";

#[test]
fn a_slowed_rank_is_named_in_the_straggler_report() {
    let Some(_) = mpirun_or_skip("a_slowed_rank_is_named_in_the_straggler_report") else { return };
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    std::fs::write(d.join("c.toml"), CONFIG).unwrap();
    let mut c = mpirun(2);
    c.current_dir(d).arg(WEFT).args(["train", "c.toml", "-q", "--metrics", "m.jsonl"]);
    let child = c.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let ranks = started_ranks(child.id(), 2);
    let slow = *ranks.iter().find(|&&p| rank_of(p) == Some(1)).expect("rank 1 is up");
    // Stopped half of every 20 ms from its start to its end: rank 1's steps
    // take about twice as long as rank 0's.
    let stopper = std::thread::spawn(move || {
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(180) && std::path::Path::new(&format!("/proc/{slow}")).exists() {
            signal(slow, "-STOP");
            std::thread::sleep(Duration::from_millis(10));
            signal(slow, "-CONT");
            std::thread::sleep(Duration::from_millis(10));
        }
    });
    let (out, _) = wait_at_most(child, Duration::from_secs(180));
    stopper.join().unwrap();
    let out = out.expect("the run ends");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stderr.contains("warning: process 1 (host "), "no warning names process 1:\n{stderr}");
    assert!(stderr.contains("is a straggler"), "{stderr}");
    assert!(stdout.contains("processes: the others waited for process 1 (host "), "{stdout}");
    let run: serde_json::Value = serde_json::from_slice(&std::fs::read(d.join("ck/run.json")).unwrap()).unwrap();
    let p = &run["timings"]["processes"]["processes"];
    assert_eq!(p.as_array().map(Vec::len), Some(2), "{run}");
    let slowest = |q: usize| p[q]["slowest_steps"].as_u64().unwrap();
    assert!(slowest(1) > slowest(0), "{p}");
    let compute = |q: usize| p[q]["compute_ms"]["p50"].as_f64().unwrap();
    assert!(compute(1) > 1.3 * compute(0), "{p}");
    let wait = |q: usize| p[q]["wait_ms"]["p50"].as_f64().unwrap();
    assert!(wait(0) > wait(1), "rank 0 waits for rank 1: {p}");
    for q in 0..2 {
        assert_eq!(p[q]["steps"], 60, "{p}");
        assert!(p[q]["compute_ms"]["p99"].as_f64().unwrap() >= compute(q), "{p}");
    }
}

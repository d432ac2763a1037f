//! `mpirun -n P weft train ...`: the same run on 1, 2, 4 and 8 processes
//! gives bitwise the same metrics and checkpoint files under every
//! strategy; checkpoints move between process counts; mismatched ranks,
//! too many processes, a hung rank and a killed rank give named errors and
//! leave nothing behind, and the restarted job equals the uninterrupted one;
//! a `[data]` run reads in each process only the rows of the batch its
//! devices need and gives the one-process metrics, validation included;
//! `--reduction fast` (MPI's own sums) trains within rounding of the
//! deterministic default, which stays bitwise one process, and a bad mode
//! is a named error.
//!
//! Needs `mpirun` (Open MPI: `apt-get install openmpi-bin libopenmpi-dev
//! libclang-dev`) and a weft built with `--features mpi` (the README's test
//! command builds the tests so). Without them the tests fail under
//! `CI=true` and print SKIPPED elsewhere.

mod mpi_support;

use mpi_support::{
    mpirun, mpirun_or_skip, ok, read, root, signal, started_ranks, step_files, train, train_args, wait_at_most, WEFT,
};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

#[test]
fn metrics_and_checkpoints_are_bitwise_those_of_one_process() {
    let Some(_) = mpirun_or_skip("metrics_and_checkpoints_are_bitwise_those_of_one_process") else { return };
    let tmp = tempfile::tempdir().unwrap();
    let cases: &[(&str, &str, &[usize])] = &[
        ("examples/configs/mlp.toml", "dp", &[2, 4, 8]),
        ("examples/configs/mlp.toml", "tp", &[2, 8]),
        ("examples/configs/mlp.toml", "fsdp", &[2, 4, 8]),
        ("examples/configs/mlp.toml", "fsdp_tp", &[2, 8]),
        ("examples/configs/mlp.toml", "zero3", &[4]),
        ("examples/configs/gpt.toml", "tp", &[2, 8]),
        ("examples/configs/gpt.toml", "fsdp", &[8]),
        ("examples/configs/gpt.toml", "fsdp_tp", &[4]),
        ("examples/configs/gpt.toml", "zero1", &[2]),
        // A program model (examples/models/mlp.weft) with [shardings] rules.
        ("examples/configs/program.toml", "dp", &[2]),
        ("examples/configs/program.toml", "fsdp_tp", &[2]),
        // f16 with dynamic loss scaling: skipped steps and the scale too.
        ("examples/configs/gpt_f16.toml", "fsdp_tp", &[2, 4]),
        // Mixture of experts on data=2,expert=4: all-to-alls across processes.
        ("examples/configs/moe.toml", "dp", &[4]),
    ];
    let mut compared = 0;
    for (config, strategy, counts) in cases {
        let run = |n: usize| {
            let dir = tmp.path().join(format!("{}-{strategy}-{n}", config.replace('/', "_")));
            let (m, k) = (dir.join("metrics.jsonl"), dir.join("ckpt"));
            let o = train(n, config, &train_args(strategy, "6", &m, &k), &[]);
            ok(&o, &format!("{config} {strategy} on {n} processes"));
            (read(&m), step_files(&k.join("step_00000006")))
        };
        let (metrics, ckpt) = run(0);
        assert!(metrics.len() > 100, "{config}: metrics written");
        for &n in counts.iter() {
            let (m, c) = run(n);
            assert!(m == metrics, "{config} {strategy}: metrics on {n} processes differ from one process");
            assert!(c == ckpt, "{config} {strategy}: checkpoint files on {n} processes differ from one process");
            compared += 1;
        }
    }
    assert_eq!(compared, 21);
}

#[test]
fn mesh_invariant_runs_on_several_processes_equal_one_device() {
    let Some(_) = mpirun_or_skip("mesh_invariant_runs_on_several_processes_equal_one_device") else { return };
    let tmp = tempfile::tempdir().unwrap();
    let run = |n: usize, mesh: &str, strategy: &str| {
        let m = tmp.path().join(format!("{n}-{mesh}-{strategy}.jsonl"));
        let k = tmp.path().join(format!("{n}-{mesh}-{strategy}-ckpt"));
        let args = ["--steps", "4", "--mesh", mesh, "--strategy", strategy, "--mesh-invariant"];
        let files = ["--metrics", m.to_str().unwrap(), "--checkpoint-dir", k.to_str().unwrap()];
        let o = train(n, "examples/configs/gpt.toml", &[&args[..], &files[..]].concat(), &[]);
        ok(&o, &format!("{strategy} on {mesh}, {n} processes"));
        read(&m)
    };
    // One device in one process is the reference for every mesh and
    // process count (the GPT has dropout: its masks are mesh-invariant too).
    let one = run(0, "data=1", "none");
    assert!(one.len() > 100);
    for (n, mesh, strategy) in [(2, "data=2,model=4", "tp"), (4, "data=8", "dp"), (2, "data=2,model=2", "fsdp_tp")] {
        assert!(run(n, mesh, strategy) == one, "{strategy} on {mesh} over {n} processes differs from one device");
    }
}

#[test]
fn checkpoints_move_between_process_counts() {
    let Some(_) = mpirun_or_skip("checkpoints_move_between_process_counts") else { return };
    let tmp = tempfile::tempdir().unwrap();
    let config = "examples/configs/gpt.toml";
    let args = |m: &Path, k: &Path, steps: &str| {
        vec![
            "--steps".to_string(),
            steps.into(),
            "--strategy".into(),
            "fsdp_tp".into(),
            "--metrics".into(),
            m.to_str().unwrap().into(),
            "--checkpoint-dir".into(),
            k.to_str().unwrap().into(),
            "--checkpoint-every".into(),
            "4".into(),
        ]
    };
    let run = |n: usize, a: Vec<String>, extra: &[&str]| {
        let mut a: Vec<&str> = a.iter().map(|s| s.as_str()).collect();
        a.extend(extra);
        let o = train(n, config, &a, &[]);
        ok(&o, &format!("{a:?} on {n} processes"));
    };
    // The uninterrupted run, in one process.
    let (m0, k0) = (tmp.path().join("m0.jsonl"), tmp.path().join("k0"));
    run(0, args(&m0, &k0, "12"), &[]);
    // 8 processes save at 4 and 8; 2 processes resume; 1 process finishes.
    let (m1, k1) = (tmp.path().join("m1.jsonl"), tmp.path().join("k1"));
    run(8, args(&m1, &k1, "8"), &[]);
    run(2, args(&m1, &k1, "10"), &["--resume"]);
    std::fs::remove_dir_all(k1.join("step_00000010")).ok();
    run(0, args(&m1, &k1, "12"), &["--resume"]);
    // 1 process saves; 4 resume.
    let (m2, k2) = (tmp.path().join("m2.jsonl"), tmp.path().join("k2"));
    run(0, args(&m2, &k2, "4"), &[]);
    run(4, args(&m2, &k2, "12"), &["--resume"]);
    let all = read(&m0);
    assert!(read(&m1) == all, "8 -> 2 -> 1 processes: metrics differ from the uninterrupted run");
    assert!(read(&m2) == all, "1 -> 4 processes: metrics differ from the uninterrupted run");
    assert!(step_files(&k0.join("step_00000012")) == step_files(&k2.join("step_00000012")));
}

#[test]
fn mismatched_ranks_and_too_many_processes_are_named_errors() {
    let Some(_) = mpirun_or_skip("mismatched_ranks_and_too_many_processes_are_named_errors") else { return };
    let cfg = root().join("examples/configs/mlp.toml");
    // MPMD launch: rank 1 runs other flags.
    let o = Command::new("mpirun")
        .args(["--allow-run-as-root", "--oversubscribe", "-n", "1", WEFT, "train"])
        .arg(&cfg)
        .args(["--steps", "3", "-q", ":", "-n", "1", WEFT, "train"])
        .arg(&cfg)
        .args(["--steps", "4", "-q"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(err.contains("the processes run different config: processes [1] differ from process 0"), "{err}");
    // A collective timeout that is no number of seconds.
    for bad in ["soon", "-1", "0"] {
        let o = train(2, "examples/configs/mlp.toml", &["--steps", "2"], &[("WEFT_COLLECTIVE_TIMEOUT", bad)]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success());
        assert!(
            err.contains(&format!("WEFT_COLLECTIVE_TIMEOUT={bad}: expected a positive number of seconds")),
            "{err}"
        );
    }
    // Two devices, four processes.
    let o = train(4, "examples/configs/mlp.toml", &["--steps", "2", "--mesh", "data=2"], &[]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(err.contains("the mesh has 2 devices but the job has 4 processes"), "{err}");
}

/// Starts a 4-process run of `steps` steps saving every 5 steps.
fn start(dir: &Path, steps: &str, timeout: &str) -> std::process::Child {
    let (m, k) = (dir.join("metrics.jsonl"), dir.join("ckpt"));
    let mut c = mpirun(4);
    c.args(["-x", "WEFT_COLLECTIVE_TIMEOUT"]).env("WEFT_COLLECTIVE_TIMEOUT", timeout);
    c.arg(WEFT).arg("train").arg(root().join("examples/configs/gpt.toml"));
    c.args(["--steps", steps, "--strategy", "fsdp", "--checkpoint-every", "5", "-q"]);
    c.arg("--metrics").arg(&m).arg("--checkpoint-dir").arg(&k);
    c.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap()
}

#[test]
fn a_hung_rank_is_named_within_the_timeout() {
    let Some(_) = mpirun_or_skip("a_hung_rank_is_named_within_the_timeout") else { return };
    let tmp = tempfile::tempdir().unwrap();
    let child = start(tmp.path(), "100000", "10");
    let pid = child.id();
    // Let it get going, then stop rank 2.
    let ranks = started_ranks(pid, 4);
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(ranks.len(), 4, "mpirun started {ranks:?}");
    signal(ranks[2], "-STOP");
    let (out, waited) = wait_at_most(child, Duration::from_secs(60));
    signal(ranks[2], "-CONT");
    let out = out.expect("the job stopped by itself");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("for process(es) [2], which never sent"), "{err}");
    assert!(waited < Duration::from_secs(45), "stopped after {waited:?}");
    std::thread::sleep(Duration::from_millis(500));
    for p in ranks {
        assert!(!Path::new(&format!("/proc/{p}")).exists() || is_zombie(p), "rank pid {p} is left behind");
    }
}

fn is_zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| s.split_whitespace().nth(2) == Some("Z"))
}

#[test]
fn a_killed_rank_stops_the_job_and_the_restart_is_bitwise() {
    let Some(_) = mpirun_or_skip("a_killed_rank_stops_the_job_and_the_restart_is_bitwise") else { return };
    let tmp = tempfile::tempdir().unwrap();
    let steps = "30";
    // The uninterrupted run.
    let whole = tmp.path().join("whole");
    let o = train(
        0,
        "examples/configs/gpt.toml",
        &[
            "--steps",
            steps,
            "--strategy",
            "fsdp",
            "--checkpoint-every",
            "5",
            "--metrics",
            whole.join("metrics.jsonl").to_str().unwrap(),
            "--checkpoint-dir",
            whole.join("ckpt").to_str().unwrap(),
        ],
        &[],
    );
    ok(&o, "uninterrupted");
    // Kill a rank at a different moment each time (mid-step or mid-save,
    // whatever the moment meets).
    let mut interrupted = 0;
    for (round, (delay_ms, victim)) in [(900u64, 1usize), (1400, 3), (2100, 0)].into_iter().enumerate() {
        let dir = tmp.path().join(format!("killed{round}"));
        let child = start(&dir, steps, "20");
        let ranks = started_ranks(child.id(), 4);
        std::thread::sleep(Duration::from_millis(delay_ms));
        if let Some(&p) = ranks.get(victim) {
            signal(p, "-KILL");
        }
        let (out, _) = wait_at_most(child, Duration::from_secs(60));
        let out = out.expect("the job stopped by itself");
        let finished = out.status.success();
        if !finished {
            interrupted += 1;
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(err.contains(&format!("rank {victim}")), "mpirun's report names the killed rank: {err}");
        }
        std::thread::sleep(Duration::from_millis(300));
        for p in &ranks {
            assert!(!Path::new(&format!("/proc/{p}")).exists() || is_zombie(*p), "rank pid {p} is left behind");
        }
        // Restart from the newest committed checkpoint (every one validates).
        let o = Command::new(WEFT)
            .arg("train")
            .arg(root().join("examples/configs/gpt.toml"))
            .args(["--steps", steps, "--strategy", "fsdp", "--checkpoint-every", "5", "-q", "--resume-or-start"])
            .arg("--metrics")
            .arg(dir.join("metrics.jsonl"))
            .arg("--checkpoint-dir")
            .arg(dir.join("ckpt"))
            .output()
            .unwrap();
        ok(
            &o,
            &format!(
                "restart after round {round} (the killed job {})",
                if finished { "had finished" } else { "failed" }
            ),
        );
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(!stderr.contains("skipping the checkpoint"), "a committed checkpoint was corrupt: {stderr}");
        assert!(
            read(&dir.join("metrics.jsonl")) == read(&whole.join("metrics.jsonl")),
            "round {round}: the restarted job's metrics differ from the uninterrupted run"
        );
    }
    assert!(interrupted > 0, "no round killed a rank before the job finished");
}

/// A `[data]` run's metrics without the measured `data_wait_ms`, line by line.
fn data_metrics(p: &Path) -> Vec<String> {
    String::from_utf8(read(p))
        .unwrap()
        .lines()
        .map(|l| {
            let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
            v.as_object_mut().unwrap().remove("data_wait_ms");
            v.to_string()
        })
        .collect()
}

/// The `WEFT_DATA_TRACE` lines of a run (one per process), sorted.
fn data_trace(o: &Output) -> Vec<String> {
    let err = String::from_utf8_lossy(&o.stderr);
    let mut v: Vec<String> = err.lines().filter(|l| l.starts_with("weft data: read rows")).map(String::from).collect();
    v.sort();
    v
}

#[test]
fn data_runs_read_only_their_rows_and_equal_one_process() {
    let Some(_) = mpirun_or_skip("data_runs_read_only_their_rows_and_equal_one_process") else { return };
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    // A token stream: t_{i+1} = (3 t_i + 1 + noise) mod 32.
    let (mut x, mut t) = (0x1234_5678u64, 0u16);
    let mut bytes = Vec::new();
    for _ in 0..4000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        t = (3 * t + 1 + (x % 3 == 0) as u16) % 32;
        bytes.extend_from_slice(&t.to_le_bytes());
    }
    std::fs::write(d.join("train.bin"), &bytes[..6000]).unwrap();
    std::fs::write(d.join("val.bin"), &bytes[6000..]).unwrap();
    let config = d.join("data.toml");
    std::fs::write(
        &config,
        format!(
            "steps = 6\nseed = 5\n[model]\nkind = \"gpt\"\nvocab = 32\nseq = 8\nd_model = 16\nheads = 2\nlayers = 1\n\
             batch = 8\n[optimizer]\nkind = \"adamw\"\nlr = 0.01\n[data]\nsource = \"tokens\"\ntrain = \"{}\"\n\
             val = \"{}\"\neval_every = 3\neval_batches = 2\n",
            d.join("train.bin").display(),
            d.join("val.bin").display()
        ),
    )
    .unwrap();
    let rows = |r: &str, n: usize| format!("weft data: read rows {r} of every batch of 8: {n} rows in 6 steps");
    // (mesh, processes, the rows each process reads): a process reads the
    // span of its devices' blocks; processes whose devices share a data
    // coordinate read the same rows. The validation loss is evaluated with
    // the parameters gathered from every process (sharded under fsdp).
    let cases: &[(&str, usize, &[&str])] = &[
        ("data=4", 2, &["0..4", "4..8"]),
        ("data=4", 4, &["0..2", "2..4", "4..6", "6..8"]),
        ("data=2,model=2", 2, &["0..4", "4..8"]),
        ("data=2,model=2", 4, &["0..4", "0..4", "4..8", "4..8"]),
    ];
    let env = [("WEFT_DATA_TRACE", "1")];
    let run = |mesh: &str, n: usize| {
        let m = d.join(format!("{}-{n}.jsonl", mesh.replace([',', '='], "_")));
        let strategy = if mesh == "data=4" { "fsdp" } else { "dp" };
        let args = ["--mesh", mesh, "--strategy", strategy, "--metrics", m.to_str().unwrap()];
        let o = train(n, config.to_str().unwrap(), &args, &env);
        ok(&o, &format!("[data] on mesh {mesh}, {n} processes"));
        (data_metrics(&m), data_trace(&o))
    };
    for mesh in ["data=4", "data=2,model=2"] {
        let (one, trace) = run(mesh, 0);
        assert_eq!(one.len(), 7, "{mesh}: 6 steps and the final evaluation written");
        assert_eq!(one.iter().filter(|l| l.contains("val_loss")).count(), 3, "{mesh}: evaluated at 0, 3 and 6");
        assert_eq!(trace, [rows("0..8", 48)], "{mesh}: one process reads every row");
        for (_, n, spans) in cases.iter().filter(|c| c.0 == mesh) {
            let (m, trace) = run(mesh, *n);
            assert!(m == one, "{mesh}: [data] metrics on {n} processes differ from one process");
            let mut expect: Vec<String> = spans
                .iter()
                .map(|r| {
                    let (lo, hi) = r.split_once("..").unwrap();
                    rows(r, 6 * (hi.parse::<usize>().unwrap() - lo.parse::<usize>().unwrap()))
                })
                .collect();
            expect.sort();
            assert_eq!(trace, expect, "{mesh} on {n} processes: each process reads only its devices' rows");
        }
    }
}

/// Every number of every metrics line (`name@step` to value).
fn metric_values(p: &Path) -> Vec<(String, f64)> {
    let text = String::from_utf8(read(p)).unwrap();
    let mut out = Vec::new();
    for line in text.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let step = v["step"].as_u64().unwrap();
        for (k, x) in v.as_object().unwrap() {
            out.push((format!("{k}@{step}"), x.as_f64().unwrap()));
        }
    }
    out
}

#[test]
fn fast_reduction_trains_close_to_the_deterministic_run() {
    let Some(_) = mpirun_or_skip("fast_reduction_trains_close_to_the_deterministic_run") else { return };
    let tmp = tempfile::tempdir().unwrap();
    // Two devices per process, so the local fold and MPI's sum group the
    // four contributions differently from the rank-order fold; dp sums
    // gradients by all-reduce, fsdp and zero2 by reduce-scatter. Three
    // processes on 8 devices: uneven runs, groups over overlapping sets of
    // processes (communicators of subsets), and groups whose processes own
    // different numbers of members.
    let cases = [
        ("examples/configs/mlp.toml", "dp", "data=4", 2),
        ("examples/configs/mlp.toml", "fsdp", "data=4", 2),
        ("examples/configs/gpt.toml", "zero2", "data=4", 2),
        ("examples/configs/mlp.toml", "fsdp_tp", "data=2,model=4", 3),
    ];
    for (config, strategy, mesh, processes) in cases {
        let run = |n: usize, mode: Option<&str>| {
            let name = format!("{}-{strategy}-{n}-{}", config.replace('/', "_"), mode.unwrap_or("default"));
            let dir = tmp.path().join(name);
            let (m, k) = (dir.join("metrics.jsonl"), dir.join("ckpt"));
            let mut args =
                vec!["--steps", "8", "--mesh", mesh, "--strategy", strategy, "--metrics", m.to_str().unwrap()];
            args.extend(["--checkpoint-dir", k.to_str().unwrap()]);
            if let Some(mode) = mode {
                args.extend(["--reduction", mode]);
            }
            let o = train(n, config, &args, &[]);
            ok(&o, &format!("{config} {strategy} on {n} processes, reduction {mode:?}"));
            (m, String::from_utf8_lossy(&o.stdout).into_owned())
        };
        let (one, _) = run(0, None);
        // The default and the named deterministic mode: bitwise one process.
        for mode in [None, Some("deterministic")] {
            let (m, out) = run(processes, mode);
            assert!(out.contains("reductions deterministic"), "the banner names the mode:\n{out}");
            assert!(read(&m) == read(&one), "{config} {strategy}, reduction {mode:?}: not bitwise one process");
        }
        let (fast, out) = run(processes, Some("fast"));
        assert!(out.contains("reductions fast"), "the banner names the mode:\n{out}");
        let (want, got) = (metric_values(&one), metric_values(&fast));
        assert_eq!(want.len(), got.len(), "{config} {strategy}: the same metrics");
        let mut worst = 0f64;
        for ((k, a), (k2, b)) in want.iter().zip(&got) {
            assert_eq!(k, k2);
            let rel = (a - b).abs() / a.abs().max(b.abs()).max(1e-30);
            assert!(rel <= 1e-4, "{config} {strategy}: {k} is {b} in the fast mode, {a} in one process");
            worst = worst.max(rel);
        }
        eprintln!("{config} {strategy} on {mesh}, {processes} processes: fast mode within {worst:.2e} of one process");
    }
}

#[test]
fn a_bad_reduction_mode_is_a_named_error() {
    // No mpirun needed: the mode is checked before anything starts.
    let o = train(0, "examples/configs/mlp.toml", &["--steps", "2", "--reduction", "fastest"], &[]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(err.contains("reduction (--reduction) = `fastest`"), "{err}");
    assert!(err.contains("`deterministic`, `fast`"), "{err}");
    let tmp = tempfile::tempdir().unwrap();
    let cfg = tmp.path().join("quick.toml");
    let text = std::fs::read_to_string(root().join("examples/configs/mlp.toml")).unwrap();
    std::fs::write(&cfg, text.replacen("strategy = \"dp\"", "strategy = \"dp\"\nreduction = \"quick\"", 1)).unwrap();
    let o = train(0, cfg.to_str().unwrap(), &["--steps", "2"], &[]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(err.contains("reduction (--reduction) = `quick`"), "{err}");
}

/// A model defined in Rust (`examples/train_own_model.rs`, through
/// `weft::Trainer`) runs under `mpirun` like `weft train`: its metrics on
/// two processes are bitwise those of one.
#[test]
fn a_rust_trainer_under_mpirun_equals_one_process() {
    let Some(_) = mpirun_or_skip("a_rust_trainer_under_mpirun_equals_one_process") else { return };
    // `cargo test` builds the examples beside the binaries.
    let example = Path::new(WEFT).parent().unwrap().join("examples/train_own_model");
    assert!(example.exists(), "{} is built by cargo test", example.display());
    let tmp = tempfile::tempdir().unwrap();
    let run = |n: usize| {
        let m = tmp.path().join(format!("m{n}.jsonl"));
        let mut c = if n == 0 { Command::new(&example) } else { mpirun(n) };
        if n > 0 {
            c.arg(&example);
        }
        let o = c.args(["6", m.to_str().unwrap()]).output().expect("runs");
        ok(&o, &format!("the Rust example on {n} processes"));
        let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
        (read(&m), stdout)
    };
    let (one, out1) = run(0);
    let (two, out2) = run(2);
    assert_eq!(String::from_utf8_lossy(&one).lines().count(), 6);
    assert!(one == two, "the Rust trainer's metrics on 2 processes differ from one process");
    // Only the first process reports.
    assert_eq!(out1.matches("step   0").count(), 1, "{out1}");
    assert_eq!(out2.matches("step   0").count(), 1, "{out2}");
}

/// `SIGUSR1` (Slurm's `--signal`) to one rank of four: the ranks agree to
/// stop after the same step, the job exits with 75, that step's checkpoint
/// is committed, and resumed (on one process) the metrics are an
/// uninterrupted run's, bit for bit.
#[test]
fn a_signal_to_one_rank_stops_every_rank_after_the_same_step() {
    let Some(_) = mpirun_or_skip("a_signal_to_one_rank_stops_every_rank_after_the_same_step") else { return };
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("job");
    let child = start(&dir, "100000", "30");
    let ranks = started_ranks(child.id(), 4);
    assert_eq!(ranks.len(), 4, "mpirun started {ranks:?}");
    let metrics = dir.join("metrics.jsonl");
    let lines = |p: &Path| std::fs::read_to_string(p).unwrap_or_default().lines().count() as u64;
    let t = Instant::now();
    while lines(&metrics) < 3 && t.elapsed() < Duration::from_secs(120) {
        std::thread::sleep(Duration::from_millis(50));
    }
    signal(ranks[2], "-USR1");
    let (out, waited) = wait_at_most(child, Duration::from_secs(60));
    let out = out.expect("the job stopped by itself");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(75), "{stdout}\n{stderr}");
    assert!(waited < Duration::from_secs(45), "stopped after {waited:?}");
    let done = lines(&metrics);
    assert!(stdout.contains(&format!("preempted: stopped after step {done}")), "{stdout}");
    let ck = weft::checkpoint::CheckpointManager::open(dir.join("ckpt"), Default::default()).unwrap();
    assert_eq!(ck.latest_valid_step().unwrap().step, Some(done), "the agreed step is committed");
    let total = (done + 2).to_string();
    let resumed = Command::new(WEFT)
        .arg("train")
        .arg(root().join("examples/configs/gpt.toml"))
        .args(["--steps", &total, "--strategy", "fsdp", "--checkpoint-every", "5", "-q", "--resume"])
        .arg("--metrics")
        .arg(&metrics)
        .arg("--checkpoint-dir")
        .arg(dir.join("ckpt"))
        .output()
        .unwrap();
    ok(&resumed, "the resumed run");
    let whole = tmp.path().join("whole");
    let o = train(
        0,
        "examples/configs/gpt.toml",
        &["--steps", &total, "--strategy", "fsdp", "--metrics", whole.join("metrics.jsonl").to_str().unwrap()],
        &[],
    );
    ok(&o, "uninterrupted");
    assert!(
        read(&metrics) == read(&whole.join("metrics.jsonl")),
        "the resumed metrics differ from the uninterrupted run"
    );
}

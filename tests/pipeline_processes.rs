//! Pipeline stages on processes (`mpirun -n P weft train` with a
//! `[pipeline]` config): the metrics and checkpoint files equal the
//! one-process pipelined run's bitwise (GPT; GPipe, 1F1B and interleaved;
//! `stage=2`, `stage=4`, stages composed with tensor and data
//! parallelism inside each process, and stages whose sub-meshes span
//! processes: `data=2,stage=2` and `data=2,stage=2,model=2` on 4 and 2
//! processes); a checkpoint of a 4-process pipelined run resumes a
//! one-process run without `[pipeline]`, and back; stages on unequal
//! numbers of processes and `--reduction fast` are named errors; a stage
//! process that hangs is named by the others within the collective
//! timeout.
//!
//! Needs `mpirun` and a weft built with `--features mpi`, as
//! `tests/multiprocess.rs`: without them the tests fail under `CI=true`
//! and print SKIPPED elsewhere.

mod mpi_support;

use mpi_support::{
    mpirun, mpirun_or_skip, ok, read, root, signal, started_ranks, step_files, train, wait_at_most, WEFT,
};
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

const CONFIG: &str = "examples/configs/pipelined.toml";

/// `--steps 6 --metrics M --checkpoint-dir K --checkpoint-every 3` and
/// `extra` (whose `--steps` replaces the 6).
fn args<'a>(m: &'a Path, k: &'a Path, extra: &[&'a str]) -> Vec<&'a str> {
    let steps = if extra.contains(&"--steps") { vec![] } else { vec!["--steps", "6"] };
    let mut a = [steps, vec!["--checkpoint-every", "3"]].concat();
    a.extend(["--metrics", m.to_str().unwrap(), "--checkpoint-dir", k.to_str().unwrap()]);
    a.extend_from_slice(extra);
    a
}

/// `config` with its `[pipeline]` table set to `pipeline`, written into `dir`.
fn with_pipeline(dir: &Path, name: &str, pipeline: &str) -> String {
    let text = std::fs::read_to_string(root().join(CONFIG)).unwrap();
    let head = &text[..text.find("[pipeline]").unwrap()];
    let tail = &text[text.find("[checkpoint]").unwrap()..];
    let path = dir.join(name);
    std::fs::write(&path, format!("{head}{pipeline}\n{tail}")).unwrap();
    path.to_str().unwrap().to_string()
}

#[test]
fn stages_on_processes_equal_the_one_process_pipeline_bitwise() {
    let Some(_) = mpirun_or_skip("stages_on_processes_equal_the_one_process_pipeline_bitwise") else { return };
    let tmp = tempfile::tempdir().unwrap();
    let interleaved = "[pipeline]\nstages = 2\nmicrobatches = 8\nschedule = \"interleaved\"\nvirtual_stages = 2";
    let cases: &[(&str, &str, &[&str], usize)] = &[
        ("1f1b", "[pipeline]\nstages = 2\nmicrobatches = 4\nschedule = \"1f1b\"", &["--mesh", "stage=2"], 2),
        ("gpipe", "[pipeline]\nstages = 2\nmicrobatches = 4\nschedule = \"gpipe\"", &["--mesh", "stage=2"], 2),
        ("interleaved", interleaved, &["--mesh", "stage=2"], 2),
        // Four stages on four processes, and two stages per process.
        ("1f1b-4", "[pipeline]\nstages = 4\nmicrobatches = 4\nschedule = \"1f1b\"", &["--mesh", "stage=4"], 4),
        ("1f1b-4on2", "[pipeline]\nstages = 4\nmicrobatches = 4\nschedule = \"1f1b\"", &["--mesh", "stage=4"], 2),
        // Tensor and data parallelism inside each stage's process.
        (
            "tp",
            "[pipeline]\nstages = 2\nmicrobatches = 4\nschedule = \"1f1b\"",
            &["--mesh", "stage=2,model=2", "--strategy", "tp"],
            2,
        ),
        ("dp", interleaved, &["--mesh", "stage=2,data=2", "--strategy", "dp"], 2),
        // Stages whose sub-meshes span processes: data parallelism across
        // processes inside each stage (`data=2,stage=2` over 4 processes
        // puts stage 0 on processes 0 and 2), and 3D on 4 and 2 processes
        // (on 2, both stages span both processes).
        (
            "dp-4",
            "[pipeline]\nstages = 2\nmicrobatches = 4\nschedule = \"1f1b\"",
            &["--mesh", "data=2,stage=2", "--strategy", "dp"],
            4,
        ),
        (
            "gpipe-dp-4",
            "[pipeline]\nstages = 2\nmicrobatches = 4\nschedule = \"gpipe\"",
            &["--mesh", "data=2,stage=2", "--strategy", "dp"],
            4,
        ),
        (
            "3d-4",
            "[pipeline]\nstages = 2\nmicrobatches = 4\nschedule = \"1f1b\"",
            &["--mesh", "data=2,stage=2,model=2", "--strategy", "fsdp_tp"],
            4,
        ),
        (
            "3d-gpipe-4",
            "[pipeline]\nstages = 2\nmicrobatches = 4\nschedule = \"gpipe\"",
            &["--mesh", "data=2,stage=2,model=2", "--strategy", "fsdp_tp"],
            4,
        ),
        ("3d-2", interleaved, &["--mesh", "data=2,stage=2,model=2", "--strategy", "fsdp_tp"], 2),
        (
            "3d-8",
            "[pipeline]\nstages = 2\nmicrobatches = 4\nschedule = \"1f1b\"",
            &["--mesh", "data=2,stage=2,model=2", "--strategy", "fsdp_tp"],
            8,
        ),
    ];
    for (name, pipeline, extra, n) in cases {
        let config = with_pipeline(tmp.path(), &format!("{name}.toml"), pipeline);
        let run = |n: usize| {
            let dir = tmp.path().join(format!("{name}-{n}"));
            let (m, k) = (dir.join("metrics.jsonl"), dir.join("ckpt"));
            let o = train(n, &config, &args(&m, &k, extra), &[]);
            ok(&o, &format!("{name} on {n} processes"));
            let stdout = String::from_utf8_lossy(&o.stdout).to_string();
            (read(&m), step_files(&k.join("step_00000006")), stdout)
        };
        let (metrics, ckpt, _) = run(0);
        assert_eq!(String::from_utf8_lossy(&metrics).lines().count(), 6, "{name}");
        let (m, c, stdout) = run(*n);
        assert!(m == metrics, "{name}: metrics on {n} processes differ from one process");
        assert!(c == ckpt, "{name}: checkpoint files on {n} processes differ from one process");
        // The first process prints the report, with every stage's tasks in
        // the measured trace.
        assert!(stdout.contains("measured: last step"), "{name}: {stdout}");
        eprintln!("{name}: {n} processes bitwise equal to one ({} checkpoint files)", c.len());
    }
}

#[test]
fn checkpoints_cross_between_stages_on_processes_and_one_unpipelined_process() {
    let Some(_) = mpirun_or_skip("checkpoints_cross_between_stages_on_processes_and_one_unpipelined_process") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let pipelined = with_pipeline(tmp.path(), "p.toml", "[pipeline]\nstages = 2\nmicrobatches = 4");
    let plain = tmp.path().join("plain.toml").to_str().unwrap().to_string();
    // No [pipeline]: the same model with the same accumulation.
    let text = std::fs::read_to_string(root().join(CONFIG)).unwrap();
    let head = &text[..text.find("[pipeline]").unwrap()];
    let tail = &text[text.find("[checkpoint]").unwrap()..];
    let head = head.replace("[optimizer]\n", "[optimizer]\nmicro_batches = 4\n").replace("mesh = \"stage=2\"\n", "");
    std::fs::write(&plain, format!("{head}{tail}")).unwrap();
    let loss = |m: &Path| -> Vec<f64> {
        std::fs::read_to_string(m)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["loss"].as_f64().unwrap())
            .collect()
    };
    // A pipeline of 2 stages data parallel over 4 processes; the plain run
    // data parallel on one process.
    let p4: &[&str] = &["--mesh", "data=2,stage=2", "--strategy", "dp"];
    let p1: &[&str] = &["--mesh", "data=2", "--strategy", "dp"];
    for ((first, f_args, n_first), (then, t_args, n_then)) in
        [((&pipelined, p4, 4), (&plain, p1, 0)), ((&plain, p1, 0), (&pipelined, p4, 4))]
    {
        let dir = tmp.path().join(format!("{n_first}-{n_then}"));
        let (m, k) = (dir.join("metrics.jsonl"), dir.join("ckpt"));
        let o = train(n_first, first, &args(&m, &k, &[f_args, &["--steps", "3"]].concat()), &[]);
        ok(&o, "the first half");
        let o = train(n_then, then, &args(&m, &k, &[t_args, &["--resume"]].concat()), &[]);
        ok(&o, "the resumed half");
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(out.contains("resuming from step 3"), "{out}");
        // The whole run of the resuming kind, for comparison.
        let whole = tmp.path().join(format!("whole-{n_then}"));
        let o = train(n_then, then, &args(&whole.join("m.jsonl"), &whole.join("k"), t_args), &[]);
        ok(&o, "the uninterrupted run");
        let (got, want) = (loss(&m), loss(&whole.join("m.jsonl")));
        assert_eq!(got.len(), 6);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!((g - w).abs() <= 1e-5 * w.abs(), "step {i}: {g} vs {w} ({n_first} -> {n_then} processes)");
        }
    }
}

#[test]
fn stages_on_unequal_numbers_of_processes_and_fast_sums_are_named_errors() {
    let Some(_) = mpirun_or_skip("stages_on_unequal_numbers_of_processes_and_fast_sums_are_named_errors") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let config = with_pipeline(tmp.path(), "three.toml", "[pipeline]\nstages = 3\nmicrobatches = 4");
    let (m, k) = (tmp.path().join("m.jsonl"), tmp.path().join("k"));
    // stage=3,data=2 over 2 processes: stage 1 on both, stages 0 and 2 on one.
    let o = train(2, &config, &args(&m, &k, &["--mesh", "stage=3,data=2", "--strategy", "dp"]), &[]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("the stages run on different numbers of processes (stage 0: [0], stage 1: [0, 1]"), "{err}");
    let o = train(2, CONFIG, &args(&m, &k, &["--reduction", "fast"]), &[]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("reduction = \"fast\" is not supported with [pipeline] over several processes"), "{err}");
    assert!(!m.exists(), "nothing was trained");
}

#[test]
fn a_hung_stage_process_is_named_within_the_timeout() {
    let Some(_) = mpirun_or_skip("a_hung_stage_process_is_named_within_the_timeout") else { return };
    let tmp = tempfile::tempdir().unwrap();
    let mut c = mpirun(2);
    c.args(["-x", "WEFT_COLLECTIVE_TIMEOUT"]).env("WEFT_COLLECTIVE_TIMEOUT", "5");
    c.arg(WEFT).arg("train").arg(root().join(CONFIG)).args(["--steps", "100000", "-q"]);
    c.arg("--metrics").arg(tmp.path().join("m.jsonl")).arg("--checkpoint-dir").arg(tmp.path().join("k"));
    let child = c.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let ranks = started_ranks(child.id(), 2);
    assert_eq!(ranks.len(), 2, "mpirun started {ranks:?}");
    // Once steps are being written, both stages are training.
    let metrics = tmp.path().join("m.jsonl");
    let clock = std::time::Instant::now();
    while std::fs::read_to_string(&metrics).map_or(0, |m| m.lines().count()) < 3 {
        assert!(clock.elapsed() < Duration::from_secs(120), "no steps written");
        std::thread::sleep(Duration::from_millis(50));
    }
    // Stop the last stage: the first stage waits for its cotangents.
    signal(ranks[1], "-STOP");
    let (out, waited) = wait_at_most(child, Duration::from_secs(60));
    signal(ranks[1], "-CONT");
    let out = out.expect("the job stopped by itself");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    // Whatever process 0 was waiting in (a cotangent, the squares, the
    // step's boundary), its error names process 1.
    assert!(err.contains("process(es) [1]"), "{err}");
    assert!(waited < Duration::from_secs(45), "stopped after {waited:?}");
}

#[test]
fn data_and_loss_scaling_under_stages_on_processes_equal_one_process() {
    let Some(_) = mpirun_or_skip("data_and_loss_scaling_under_stages_on_processes_equal_one_process") else { return };
    let tmp = tempfile::tempdir().unwrap();
    let docs = tmp.path().join("docs");
    let o = std::process::Command::new(WEFT)
        .args(["data", "prepare"])
        .arg(root().join("README.md"))
        .arg(root().join("specs/pipeline.md"))
        .arg("-o")
        .arg(&docs)
        .output()
        .unwrap();
    ok(&o, "weft data prepare");
    let model = "steps = 6\nseed = 0\n[model]\nkind = \"gpt\"\nvocab = 256\nseq = 32\nd_model = 32\nheads = 4\nlayers = 2\nbatch = 8\n[optimizer]\nkind = \"adamw\"\nlr = 3e-3\n[pipeline]\nstages = 2\nmicrobatches = 4\n";
    let data = format!(
        "[data]\nsource = \"tokens\"\ntrain = \"{}\"\nval = \"{}\"\neval_every = 3\neval_batches = 2\n",
        docs.join("train.bin").display(),
        docs.join("val.bin").display()
    );
    let f16 = model.replace("batch = 8\n", "batch = 8\ncompute = \"f16\"\n")
        + "[loss_scaling]\ninitial_scale = 524288\nperiod = 2\n";
    // Without the metrics' wall times (`data_wait_ms`).
    let values = |m: &Path| -> Vec<serde_json::Value> {
        let text = std::fs::read_to_string(m).unwrap();
        let lines = text.lines().map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap());
        lines
            .map(|mut v| {
                v.as_object_mut().unwrap().remove("data_wait_ms");
                v
            })
            .collect()
    };
    // With dropout: the stages' PRNG key is an input of each stage's
    // functions, but not data.
    let four = format!("{model}{data}")
        .replace("stages = 2", "stages = 4")
        .replace("batch = 8\n", "batch = 8\ndropout = 0.1\n");
    let cases = [
        ("data", format!("{model}{data}"), "data=2,stage=2"),
        ("data-4", four, "stage=4"),
        ("f16", f16, "stage=2,data=2"),
    ];
    for (name, text, mesh) in cases {
        let config = tmp.path().join(format!("{name}.toml"));
        std::fs::write(&config, text).unwrap();
        let config = config.to_str().unwrap();
        let run = |n: usize| {
            let dir = tmp.path().join(format!("{name}-{n}"));
            let (m, k) = (dir.join("metrics.jsonl"), dir.join("ckpt"));
            let env = [("WEFT_DATA_TRACE", "1")];
            let o = train(n, config, &args(&m, &k, &["--mesh", mesh, "--strategy", "dp"]), &env);
            ok(&o, &format!("{name} on {n} processes"));
            let err = String::from_utf8_lossy(&o.stderr);
            let mut read: Vec<String> =
                err.lines().filter_map(|l| l.strip_prefix("weft data: read ")).map(String::from).collect();
            read.sort();
            (values(&m), step_files(&k.join("step_00000006")), read)
        };
        let (want, ckpt, read_one) = run(0);
        let (got, c, read_four) = run(4);
        assert_eq!(got, want, "{name}: metrics on 4 processes differ from one process");
        assert!(c == ckpt, "{name}: checkpoint files on 4 processes differ from one process");
        if name == "data" {
            assert!(want.iter().filter(|v| v.get("val_loss").is_some()).count() >= 2, "{name}: validation ran");
            // Each stage process reads only its stage's input, and of each
            // microbatch of 2 rows only its data coordinate's row (mesh
            // order: processes 0 and 2 run stage 0, 1 and 3 stage 1).
            let every = |what: &str| format!("{what} of every batch of 8: 24 rows in 6 steps");
            assert_eq!(read_one, ["rows 0..8 of every batch of 8: 48 rows in 6 steps"]);
            assert_eq!(
                read_four,
                [
                    every("rows 0..1, 2..3, 4..5, 6..7 (targets)"),
                    every("rows 0..1, 2..3, 4..5, 6..7 (tokens)"),
                    every("rows 1..2, 3..4, 5..6, 7..8 (targets)"),
                    every("rows 1..2, 3..4, 5..6, 7..8 (tokens)"),
                ]
            );
        } else if name == "data-4" {
            // Four stages on four processes: the first reads `tokens`, the
            // last `targets`, the middle ones nothing.
            let every = |what: &str, n: usize| format!("{what} of every batch of 8: {n} rows in 6 steps");
            let (nothing, targets, tokens) =
                (every("nothing", 0), every("rows 0..8 (targets)", 48), every("rows 0..8 (tokens)", 48));
            assert_eq!(read_four, [nothing.clone(), nothing, targets, tokens]);
        } else {
            let skipped: Vec<f64> = want.iter().map(|v| v["skipped"].as_f64().unwrap()).collect();
            assert!(skipped.contains(&1.0) && skipped.contains(&0.0), "{name}: skipped {skipped:?}");
        }
    }
}

//! Checkpoints and `[data]` under `[pipeline]`: a pipelined run stopped
//! and resumed equals the uninterrupted one bitwise (metrics file and
//! checkpoint files); a checkpoint saved by a pipelined run resumes a run
//! without `[pipeline]` and the other way round (the same named state
//! leaves, resharded on load); bad resumes are named errors; `[data]`
//! batches feed the pipeline's microbatches as they feed the unpipelined
//! accumulating step.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use weft::ir::tensor::{write_safetensors, HostTensor};
use weft::runner::{run_session, Line, Overrides, RunConfig, RunSummary};
use weft::Error;

/// The GPT with dropout (the state's `rng` matters) and AdamW (two slots).
const GPT: &str = r#"
seed = 7
mesh = "data=2,stage=2"
strategy = "dp"
[model]
kind = "gpt"
vocab = 32
seq = 8
d_model = 16
heads = 2
layers = 2
batch = 8
dropout = 0.1
[optimizer]
kind = "adamw"
lr = 0.01
"#;

const PIPELINE: &str = "[pipeline]\nstages = 2\nmicrobatches = 4\nschedule = \"1f1b\"\n";

#[path = "scratch_support/mod.rs"]
mod scratch_support;
use scratch_support::Scratch;

/// A fresh scratch directory, removed when the test ends.
fn dir(name: &str) -> Scratch {
    Scratch::new("pp-resume", name)
}

/// `model` with `steps`, metrics and checkpoints (every 2 steps) in `root`.
fn config(model: &str, root: &Path, steps: u64) -> RunConfig {
    let text = format!(
        "steps = {steps}\nmetrics = {:?}\n{model}\n[checkpoint]\ndir = {:?}\nevery = 2\nkeep_last = 10\n",
        root.join("metrics.jsonl").display().to_string(),
        root.join("ckpt").display().to_string()
    );
    RunConfig::from_toml(&text).unwrap()
}

fn run(c: &RunConfig, resume: bool) -> Result<RunSummary, Error> {
    let ov = Overrides { quiet: true, resume, ..Default::default() };
    run_session(c, &ov, &mut |_| {})
}

fn step_dir(root: &Path, step: u64) -> PathBuf {
    root.join("ckpt").join(format!("step_{step:08}"))
}

/// Every file of a checkpoint step, by name.
fn files(step: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    for e in std::fs::read_dir(step).unwrap() {
        let e = e.unwrap();
        out.insert(e.file_name().to_string_lossy().into_owned(), std::fs::read(e.path()).unwrap());
    }
    assert!(!out.is_empty(), "{} is empty", step.display());
    out
}

#[test]
fn a_pipelined_run_stopped_and_resumed_equals_the_uninterrupted_run_bitwise() {
    stopped_and_resumed(&format!("{GPT}{PIPELINE}"), &["params.wte", "opt.m.wte", "opt.v.wte", "step", "rng"]);
}

#[test]
fn loss_scaled_runs_stopped_and_resumed_equal_the_uninterrupted_runs_bitwise() {
    // f16 with dynamic loss scaling from 2^19, doubling after 2 good
    // steps: the scale changes during the run, so a resume that lost it
    // (or its counter) would diverge.
    let f16 = GPT.replace("batch = 8\n", "batch = 8\ncompute = \"f16\"\n");
    let scaling = "[loss_scaling]\ninitial_scale = 524288\nperiod = 2\n";
    let leaves = ["params.wte", "step", "loss_scale.scale", "loss_scale.good_steps"];
    let unpipelined = f16.replace("data=2,stage=2", "data=2");
    for model in [format!("{f16}{PIPELINE}{scaling}"), format!("{unpipelined}{scaling}")] {
        let metrics = stopped_and_resumed(&model, &leaves);
        let scales: Vec<&str> = metrics.lines().filter_map(|l| l.split("\"loss_scale\":").nth(1)).collect();
        assert!(metrics.contains("\"skipped\":1") && metrics.contains("\"skipped\":0"), "{metrics}");
        assert!(scales.windows(2).any(|w| w[0] != w[1]), "the scale never changed: {metrics}");
    }
}

/// Runs `model` for 6 steps; and for 5, drops the step-5 checkpoint and
/// resumes to 6: the metrics files and the final checkpoints are equal
/// byte for byte, and the checkpoint has `leaves`. Returns the metrics.
fn stopped_and_resumed(model: &str, leaves: &[&str]) -> String {
    let full = dir("full");
    run(&config(model, &full, 6), false).unwrap();

    // Stopped after step 5, whose checkpoint never committed (as when the
    // process is killed before it does): the resume starts at step 4 and
    // drops the metrics line of step 4 written after that checkpoint.
    let cut = dir("cut");
    run(&config(model, &cut, 5), false).unwrap();
    std::fs::remove_dir_all(step_dir(&cut, 5)).unwrap();
    assert_eq!(std::fs::read_to_string(cut.join("metrics.jsonl")).unwrap().lines().count(), 5);
    let mut lines = Vec::new();
    let ov = Overrides { quiet: true, resume: true, ..Default::default() };
    let resumed = run_session(&config(model, &cut, 6), &ov, &mut |l| lines.push(l)).unwrap();
    assert_eq!(resumed.metrics.iter().map(|(s, _)| *s).collect::<Vec<_>>(), vec![4, 5]);
    assert!(lines.contains(&Line::Info("resuming from step 4".into())), "{lines:?}");
    // Its own checkpoint: same mesh, same layouts, nothing to warn about.
    assert!(!lines.iter().any(|l| matches!(l, Line::Warn(_))), "{lines:?}");

    let want = std::fs::read(full.join("metrics.jsonl")).unwrap();
    assert_eq!(String::from_utf8_lossy(&want).lines().count(), 6);
    assert!(std::fs::read(cut.join("metrics.jsonl")).unwrap() == want, "the resumed run's metrics differ");
    let (a, b) = (files(&step_dir(&full, 6)), files(&step_dir(&cut, 6)));
    assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>());
    for (name, bytes) in &a {
        assert!(b[name] == *bytes, "the final checkpoint's {name} differs");
    }
    // The state's leaves are the unpipelined step's, on the whole mesh.
    let manifest = weft::checkpoint::validate_step(&full.join("ckpt"), 6).unwrap();
    let names: Vec<&str> = manifest.leaves.iter().map(|l| l.name.as_str()).collect();
    for leaf in leaves {
        assert!(names.contains(leaf), "no leaf {leaf} in {names:?}");
    }
    let mesh_of = RunConfig::from_toml(&format!("steps = 1\n{model}")).unwrap().mesh.unwrap();
    let axes: Vec<(String, usize)> = (mesh_of.split(','))
        .map(|a| a.split_once('=').map(|(n, k)| (n.to_string(), k.parse().unwrap())).unwrap())
        .collect();
    assert_eq!(manifest.mesh, axes);
    String::from_utf8(want).unwrap()
}

/// Relative difference.
fn rel(a: f64, b: f64) -> f64 {
    (a - b).abs() / b.abs().max(1e-30)
}

/// Runs `first` for steps 0..3 (checkpoint at 3), then `second` resumed
/// from it for steps 3..6; returns the resumed steps' metrics.
fn handed_over(first: &str, second: &str, name: &str) -> Vec<(u64, weft_compiler::train::Metrics)> {
    let root = dir(name);
    run(&config(first, &root, 3), false).unwrap();
    let resumed = run(&config(second, &root, 6), true).unwrap();
    assert_eq!(resumed.metrics.first().map(|(s, _)| *s), Some(3));
    resumed.metrics
}

#[test]
fn checkpoints_cross_between_pipelined_and_unpipelined_runs() {
    // The unpipelined run with the same accumulation (4 microbatches) on
    // the mesh without the stage axis.
    let plain = GPT.replace("mesh = \"data=2,stage=2\"", "mesh = \"data=2\"") + "micro_batches = 4\n"; // appended to [optimizer]
    let piped = format!("{GPT}{PIPELINE}");
    let root = dir("plain");
    let want = run(&config(&plain, &root, 6), false).unwrap().metrics;
    // The pipelined step equals the unpipelined one to 1e-6 (its
    // gradients are reduced over `data` per microbatch, then summed: the
    // same numbers added in another order; tests/pipeline.rs), so a run
    // handed over between them matches to that tolerance, not bitwise.
    for (first, second, what) in
        [(&piped, &plain, "pipelined, then unpipelined"), (&plain, &piped, "unpipelined, then pipelined")]
    {
        let got = handed_over(first, second, "cross");
        assert_eq!(got.len(), 3, "{what}");
        for (s, m) in &got {
            let w = &want[*s as usize].1;
            for key in ["loss", "grad_norm", "lr"] {
                assert!(rel(m[key], w[key]) <= 1e-5, "{what}: step {s}: {key} {} vs {}", m[key], w[key]);
            }
        }
    }
    // Another stage count and schedule resume it too, and a pipelined
    // run resumed by the same pipeline is bitwise its own continuation.
    let four = format!("{}{}", GPT.replace("data=2,stage=2", "stage=4"), PIPELINE)
        .replace("stages = 2", "stages = 4")
        .replace("\"1f1b\"", "\"gpipe\"")
        .replace("strategy = \"dp\"", "strategy = \"none\"");
    let got = handed_over(&piped, &four, "restage");
    for (s, m) in &got {
        assert!(rel(m["loss"], want[*s as usize].1["loss"]) <= 1e-5, "S=4 gpipe: step {s}");
    }
}

#[test]
fn bad_resumes_under_a_pipeline_are_named_errors() {
    let model = format!("{GPT}{PIPELINE}");
    // No checkpoint directory yet.
    let root = dir("missing");
    let e = run(&config(&model, &root, 4), true).unwrap_err();
    assert!(matches!(e, Error::Resume(_)), "{e}");
    // Past --steps.
    run(&config(&model, &root, 4), false).unwrap();
    let e = run(&config(&model, &root, 3), true).unwrap_err();
    assert!(matches!(&e, Error::Resume(m) if m.contains("past the run's 3 steps")), "{e}");
    // Every checkpoint corrupt: a flipped byte in each step's data files.
    for step in [2, 4] {
        for e in std::fs::read_dir(step_dir(&root, step)).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "safetensors") {
                let mut bytes = std::fs::read(&p).unwrap();
                let n = bytes.len();
                bytes[n - 1] ^= 0xff;
                std::fs::write(&p, bytes).unwrap();
            }
        }
    }
    let e = run(&config(&model, &root, 6), true).unwrap_err();
    assert!(matches!(&e, Error::Resume(m) if m.contains("corrupt")), "{e}");
    // A checkpoint of another model (wider layers): its leaves do not fit.
    let other = dir("other");
    run(&config(&model, &other, 2), false).unwrap();
    let wider = model.replace("d_model = 16", "d_model = 32");
    let e = run(&config(&wider, &other, 4), true).unwrap_err();
    assert!(matches!(e, Error::Checkpoint(_)), "{e:?}");
}

/// An MLP table of `n` examples (x: f32[n, 16], y: a fixed function of x).
fn mlp_table(path: &Path, n: usize) {
    let xs: Vec<f32> = (0..n * 16).map(|i| ((i * 29 % 97) as f32 / 48.0) - 1.0).collect();
    let ys: Vec<f32> = (0..n * 16).map(|i| (0.5 * xs[i] + xs[(i / 16) * 16 + (i + 3) % 16]).sin()).collect();
    let t = BTreeMap::from([
        ("x".to_string(), HostTensor::from_f32(&[n, 16], xs).unwrap()),
        ("y".to_string(), HostTensor::from_f32(&[n, 16], ys).unwrap()),
    ]);
    write_safetensors(path, &t).unwrap();
}

fn mlp_with_data(d: &Path, mesh: &str, tail: &str) -> RunConfig {
    let text = format!(
        r#"
steps = 6
seed = 4
mesh = "{mesh}"
[model]
kind = "mlp"
layers = 4
d = 16
h = 32
batch = 16
[optimizer]
kind = "sgd"
lr = 0.05
momentum = 0.9
{tail}
[data]
source = "table"
train = "{0}/train.safetensors"
val = "{0}/val.safetensors"
eval_every = 2
eval_batches = 2
"#,
        d.display()
    );
    RunConfig::from_toml(&text).unwrap()
}

/// Every metric but the measured wait, by step.
fn metrics_of(s: &RunSummary) -> Vec<(u64, BTreeMap<String, f64>)> {
    let all = s.metrics.iter().chain(&s.evals);
    all.map(|(step, m)| (*step, m.iter().filter(|(k, _)| *k != "data_wait_ms").map(|(k, v)| (k.clone(), *v)).collect()))
        .collect()
}

#[test]
fn data_batches_feed_the_pipeline_as_they_feed_the_unpipelined_step() {
    let d = dir("data");
    mlp_table(&d.join("train.safetensors"), 40); // not a multiple of 16: batches cross epochs
    mlp_table(&d.join("val.safetensors"), 32);
    let quiet = Overrides { quiet: true, ..Default::default() };
    let want = run_session(&mlp_with_data(&d, "data=1", "micro_batches = 4"), &quiet, &mut |_| {}).unwrap();
    for schedule in ["gpipe", "1f1b"] {
        let tail = format!("[pipeline]\nstages = 2\nmicrobatches = 4\nschedule = \"{schedule}\"");
        let got = run_session(&mlp_with_data(&d, "stage=2", &tail), &quiet, &mut |_| {}).unwrap();
        // The same batches, read in the same order.
        assert_eq!(got.batch_digests, want.batch_digests, "{schedule}");
        assert_eq!(got.batch_digests.len(), 6);
        // On one device per stage the pipelined MLP step adds the same
        // numbers in the same order as the unpipelined accumulating step
        // (tests/pipeline.rs finds its parameters bitwise equal), so the
        // losses, norms and validation metrics are bitwise equal.
        assert_eq!(metrics_of(&got), metrics_of(&want), "{schedule}");
        assert!(got.evals.iter().any(|(_, m)| m.contains_key("val_loss")), "{schedule}: no validation");
    }
}

#[test]
fn a_pipelined_run_with_data_resumes_mid_epoch_bitwise() {
    let d = dir("data-resume");
    mlp_table(&d.join("train.safetensors"), 40);
    mlp_table(&d.join("val.safetensors"), 32);
    let tail = "[pipeline]\nstages = 2\nmicrobatches = 4\nschedule = \"1f1b\"";
    let with_ckpt = |root: &Path, steps: u64| {
        let mut c = mlp_with_data(&d, "data=2,stage=2", tail);
        c.strategy = Some("dp".into());
        c.steps = steps;
        c.checkpoint = Some(weft::runner::CheckpointConfig {
            dir: root.join("ckpt"),
            every: 2,
            keep_last: 10,
            keep_every: None,
            every_seconds: None,
        });
        c
    };
    let full = dir("data-full");
    let want = run(&with_ckpt(&full, 6), false).unwrap();
    let cut = dir("data-cut");
    run(&with_ckpt(&cut, 3), false).unwrap(); // 3 batches of 16 of 40 rows: mid-epoch
    let got = run(&with_ckpt(&cut, 6), true).unwrap();
    assert_eq!(got.batch_digests, want.batch_digests[3..].to_vec());
    let tail_of = |s: &RunSummary| metrics_of(s).into_iter().filter(|(step, _)| *step >= 3).collect::<Vec<_>>();
    assert_eq!(tail_of(&got), tail_of(&want));
    let (a, b) = (files(&step_dir(&full, 6)), files(&step_dir(&cut, 6)));
    for (name, bytes) in &a {
        assert!(b[name] == *bytes, "the final checkpoint's {name} differs");
    }
    // The data identity travels with the pipeline's checkpoint: another
    // seed (another order) is refused.
    let mut other = with_ckpt(&cut, 8);
    other.seed = 5;
    let e = run(&other, true).unwrap_err();
    assert!(matches!(e, Error::DataChanged(_)), "{e}");
}

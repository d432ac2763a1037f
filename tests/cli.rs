//! The `weft` command line: `check` prints canonical text or located errors
//! with a non-zero exit; `run` executes a function on safetensors inputs.

use std::collections::BTreeMap;
use std::process::Command;
use weft_ir::tensor::{read_safetensors, write_safetensors, HostTensor};

fn weft(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_weft")).args(args).output().expect("weft runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

#[path = "scratch_support/mod.rs"]
mod scratch_support;

/// A fresh scratch directory, removed when the test ends.
fn temp_dir(name: &str) -> scratch_support::Scratch {
    scratch_support::Scratch::new("cli", name)
}

const PROGRAM: &str = "func @main(%x: f32[2,3], %w: f32[3,2]) -> (f32[2,2]) {
  %y = dot_general %x, %w {lhs_contract = [1], rhs_contract = [0]}
  %out = tanh %y
  return %out
}
";

#[test]
fn check_prints_the_canonical_typed_program() {
    let dir = temp_dir("check");
    let p = dir.join("a.weft");
    std::fs::write(&p, PROGRAM).unwrap();
    let (code, stdout, _) = weft(&["check", p.to_str().unwrap()]);
    assert_eq!(code, 0);
    assert!(stdout.contains("%y = dot_general %x, %w {lhs_contract = [1], rhs_contract = [0]} : f32[2,2]"), "{stdout}");
    assert!(stdout.contains("%out = tanh %y : f32[2,2]"), "{stdout}");
}

#[test]
fn check_reports_errors_with_line_column_and_caret() {
    let dir = temp_dir("check-err");
    let p = dir.join("bad.weft");
    std::fs::write(&p, PROGRAM.replace("  return", "  %z = exp %y : f32[9]\n  return")).unwrap();
    let (code, _, stderr) = weft(&["check", p.to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(
        stderr.contains("bad.weft:4:3: error: in @main: `%z = exp`: is annotated f32[9] but `exp` gives f32[2,2]"),
        "{stderr}"
    );
    assert!(stderr.contains("4 |   %z = exp %y : f32[9]"), "{stderr}");
    let (code, _, stderr) = weft(&["check", dir.join("missing.weft").to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(stderr.contains("missing.weft"), "{stderr}");
}

#[test]
fn run_executes_on_safetensors_inputs() {
    let dir = temp_dir("run");
    let p = dir.join("a.weft");
    std::fs::write(&p, PROGRAM).unwrap();
    let inputs = dir.join("in.safetensors");
    let output = dir.join("out.safetensors");
    let x = HostTensor::from_f32(&[2, 3], vec![1.0, 0.0, -1.0, 0.5, 0.5, 0.5]).unwrap();
    let w = HostTensor::from_f32(&[3, 2], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
    write_safetensors(&inputs, &BTreeMap::from([("x".to_string(), x), ("w".to_string(), w)])).unwrap();
    let (code, stdout, stderr) =
        weft(&["run", p.to_str().unwrap(), "--inputs", inputs.to_str().unwrap(), "--output", output.to_str().unwrap()]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("out: f32[2,2]"), "{stdout}");
    let out = read_safetensors(&output).unwrap();
    // x @ w = [[-4, -4], [4.5, 6]]
    let expected: Vec<f64> = [-4.0f64, -4.0, 4.5, 6.0].iter().map(|v| (*v as f32).tanh() as f64).collect();
    let got = out["out"].to_f64_vec();
    assert_eq!(got.len(), expected.len(), "{got:?} vs {expected:?}");
    for (g, e) in got.iter().zip(&expected) {
        assert!((g - e).abs() < 1e-6, "{got:?} vs {expected:?}");
    }
    // A missing input names the parameter.
    write_safetensors(
        &inputs,
        &BTreeMap::from([(
            "x".to_string(),
            HostTensor::zeros(&weft_ir::TensorType::new(weft_ir::DType::F32, vec![2, 3])),
        )]),
    )
    .unwrap();
    let (code, _, stderr) = weft(&["run", p.to_str().unwrap(), "--inputs", inputs.to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(stderr.contains("`w`"), "{stderr}");
}

#[test]
fn shard_annotates_explains_and_draws() {
    let dir = temp_dir("shard");
    let p = dir.join("mlp.weft");
    std::fs::write(
        &p,
        "func @main(%x: f32[8,16] {sharding = [{data}, {}]}, %w1: f32[16,32] {sharding = [{}, {model}]}, %w2: f32[32,16]) -> (f32[8,16]) {
  %h = dot_general %x, %w1 {lhs_contract = [1], rhs_contract = [0]}
  %o = dot_general %h, %w2 {lhs_contract = [1], rhs_contract = [0]}
  return %o
}
",
    )
    .unwrap();
    let (code, stdout, stderr) =
        weft(&["shard", p.to_str().unwrap(), "--mesh", "data=2,model=4", "--explain", "%w2", "--show", "%h"]);
    assert_eq!(code, 0, "{stderr}");
    // Backward propagation gives the unannotated %w2 its sharding (Shardy's @simple case).
    assert!(stdout.contains("%w2: f32[32,16] {sharding = [{model}, {}]}"), "{stdout}");
    assert!(stdout.contains("unreduced = {model}"), "{stdout}");
    assert!(stdout.contains("all-reduce{model}"), "{stdout}");
    assert!(stdout.contains("backward through `%o = dot_general`"), "{stdout}");
    assert!(stdout.contains("dev 7 [4:8, 24:32]"), "{stdout}");
    // An unknown axis is an error naming it.
    let (code, _, stderr) = weft(&["shard", p.to_str().unwrap(), "--mesh", "data=2,mdl=4"]);
    assert_eq!(code, 1);
    assert!(stderr.contains("model"), "{stderr}");
}

#[test]
fn plot_marks_a_diverged_run_instead_of_hanging() {
    let dir = tempfile::tempdir().unwrap();
    let metrics = dir.path().join("m.jsonl");
    // What `weft train` writes when a run diverges: non-finite values as strings.
    std::fs::write(&metrics, "{\"step\":0,\"loss\":2.5}\n{\"step\":1,\"loss\":1.5}\n{\"step\":2,\"loss\":\"inf\"}\n{\"step\":3,\"loss\":\"NaN\"}\n").unwrap();
    let svg = dir.path().join("loss.svg");
    let (code, _, err) = weft(&["plot", metrics.to_str().unwrap(), "-o", svg.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.contains("non-finite (diverged)"), "the divergence is marked in the legend");
    // Nothing finite at all is a named error, not an empty chart.
    std::fs::write(&metrics, "{\"step\":0,\"loss\":\"inf\"}\n").unwrap();
    let (code, _, err) = weft(&["plot", metrics.to_str().unwrap(), "-o", svg.to_str().unwrap()]);
    assert_ne!(code, 0);
    assert!(err.contains("no finite `loss` values"), "{err}");
}

#[test]
fn plot_draws_where_each_device_step_went_from_run_json() {
    let d = temp_dir("split");
    let config = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/configs/gpt.toml");
    let ck = d.join("ckpt");
    let args = ["train", config, "--steps", "3", "-q", "--mesh", "data=4", "--strategy", "dp", "--checkpoint-dir"];
    let (code, _, err) = weft(&[&args[..], &[ck.to_str().unwrap()]].concat());
    assert_eq!(code, 0, "{err}");
    let svg = d.join("split.svg");
    let (code, _, err) = weft(&["plot", ck.join("run.json").to_str().unwrap(), "-o", svg.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let text = std::fs::read_to_string(&svg).unwrap();
    for want in ["device 0", "device 3", "compute", "communication, exposed", "idle", "in flight behind compute"] {
        assert!(text.contains(want), "the chart shows {want}");
    }
    // A run.json whose timings have no devices is a named error.
    std::fs::write(d.join("bare.json"), "{\"timings\": {}}").unwrap();
    let (code, _, err) = weft(&["plot", d.join("bare.json").to_str().unwrap(), "-o", svg.to_str().unwrap()]);
    assert_ne!(code, 0);
    assert!(err.contains("no per-device times (`timings.devices`)"), "{err}");
}

#[test]
fn train_ends_with_the_loss_scale_and_the_skipped_steps() {
    // The example's first two steps overflow at 2^20 and 2^19 (f16).
    let d = temp_dir("f16");
    let m = d.join("metrics.jsonl");
    let config = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/configs/gpt_f16.toml");
    let args = ["train", config, "--steps", "3", "-q", "--metrics", m.to_str().unwrap(), "--checkpoint-dir"];
    let (code, out, err) = weft(&[&args[..], &[d.join("ckpt").to_str().unwrap()]].concat());
    assert_eq!(code, 0, "{err}");
    let last = out.lines().last().unwrap_or_default();
    assert!(last.starts_with("step 3 loss ") && last.ends_with("; loss scale 262144, 2 of 3 steps skipped"), "{out}");
    // Without loss scaling the line has no such tail.
    let plain = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/configs/mlp.toml");
    let (code, out, err) = weft(&[
        "train",
        plain,
        "--steps",
        "1",
        "-q",
        "--metrics",
        d.join("m2.jsonl").to_str().unwrap(),
        "--checkpoint-dir",
        d.join("ck2").to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.lines().last().is_some_and(|l| l.starts_with("step 1 loss ") && !l.contains("loss scale")), "{out}");
    let _ = std::fs::remove_dir_all(&d);
}

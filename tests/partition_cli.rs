//! `weft lower FILE --mesh ... [--func NAME]` prints the device program and
//! a summary; the mesh may come from the file's first-line comment; bad
//! meshes and missing ones are clear errors.

use std::process::Command;

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

/// `text` written to `name` in a scratch directory (removed when the
/// returned guard drops), and the file's path.
fn file(name: &str, text: &str) -> (scratch_support::Scratch, String) {
    let d = scratch_support::Scratch::new("lower", name);
    let p = d.join(name);
    std::fs::write(&p, text).unwrap();
    let p = p.to_str().unwrap().to_string();
    (d, p)
}

const TWO: &str = "// mesh: data=2
func @helper(%x: f32[8]) -> (f32[8]) {
  %y = neg %x
  return %y
}

func @loss(%x: f32[8,4] {sharding = [{data}, {}]}) -> (f32[]) {
  %s = reduce_sum %x {dims = [0, 1]}
  return %s
}
";

#[test]
fn lower_prints_the_program_and_summary() {
    let (_d, p) = file("two.weft", TWO);
    let (code, out, err) = weft(&["lower", &p, "--func", "loss"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("device_program @loss mesh [data=2] {\n  input %0 : f32[4,4]  // x\n"), "{out}");
    assert!(out.contains("all_reduce %1 {axes = [data], op = sum} : f32[]"), "{out}");
    assert!(out.contains("collectives (bytes sent per device):\n  all_reduce: 1 (4 bytes)\n"), "{out}");
    assert!(out.contains("per device: peak live 68 bytes\n"), "{out}");
    // --mesh overrides the comment.
    let (code, out, _) = weft(&["lower", &p, "--func", "loss", "--mesh", "data=4,model=2"]);
    assert_eq!(code, 0);
    assert!(out.contains("input %0 : f32[2,4]  // x"), "{out}");
    assert!(out.contains("devices: 8"), "{out}");
}

#[test]
fn lower_reports_bad_usage_and_bad_meshes() {
    let (_d, p) = file("usage.weft", TWO);
    let (code, _, err) = weft(&["lower", &p]);
    assert_eq!(code, 2);
    assert!(err.contains("several functions (@helper, @loss); choose one with --func"), "{err}");
    let (code, _, err) = weft(&["lower", &p, "--func", "loss", "--mesh", "data=0"]);
    assert_eq!(code, 1);
    assert!(err.contains("invalid mesh `data=0`: axis `data` has size 0"), "{err}");
    let (code, _, err) = weft(&["lower", &p, "--func", "loss", "--mesh", "data=3"]);
    assert_eq!(code, 1);
    assert!(err.contains("not divisible by 3"), "{err}");
}

#[test]
fn lower_compiles_a_training_configs_whole_step() {
    let moe = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/configs/moe.toml");
    let (code, out, err) = weft(&["lower", moe]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("device_program @train_step mesh [data=2, expert=4] {"), "{}", &out[..200]);
    assert!(out.contains("summary (one training step):\ndevices: 8\n"), "{out}");
    // The mixture-of-experts blocks exchange their tokens by all-to-all:
    // two each way per step (forward and backward).
    let line = out.lines().find(|l| l.trim_start().starts_with("all_to_all:")).expect("all-to-alls");
    assert!(line.trim_start().starts_with("all_to_all: 4 ("), "{line}");
    // --explain says why each exchange is there.
    let (code, out, err) = weft(&["lower", moe, "--explain"]);
    assert_eq!(code, 0, "{err}");
    let why = out.split_once("\nexchanges (").expect("an exchanges section").1;
    let a2a = why.lines().find(|l| l.contains("all-to-all{expert}")).expect("an all-to-all explained");
    assert!(a2a.contains(" = reshard ") && a2a.contains("must be") && a2a.contains("for its rule"), "{a2a}");
    // --mesh overrides the config's.
    let (code, out, err) = weft(&["lower", moe, "--mesh", "data=8"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("device_program @train_step mesh [data=8] {") && !out.contains("all_to_all"), "{out}");
}

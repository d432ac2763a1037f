//! The experiment runner: strategies change the communication, never the
//! mathematics; runs are reproducible; checkpoints move between meshes.

use weft::runner::{run_session, Overrides, RunConfig};

const MLP: &str = r#"
steps = 5
seed = 3

[model]
kind = "mlp"
layers = 2
d = 16
h = 32
batch = 8

[optimizer]
kind = "sgd"
lr = 0.01
"#;

fn run(config: &str, mesh: &str, strategy: &str, backend: &str, ov: Overrides) -> Vec<(u64, f64)> {
    let mut c = RunConfig::from_toml(config).unwrap();
    c.mesh = Some(mesh.into());
    c.strategy = Some(strategy.into());
    c.backend = Some(backend.into());
    let c = ov.apply(c);
    let s = run_session(&c, &Overrides { quiet: true, ..ov }, &mut |_| {}).unwrap();
    s.metrics.iter().map(|(step, m)| (*step, m["loss"])).collect()
}

fn close(a: &[(u64, f64)], b: &[(u64, f64)], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: step counts");
    assert!(!b.is_empty(), "{what}: no steps to compare");
    for ((s, x), (t, y)) in a.iter().zip(b) {
        assert_eq!(s, t, "{what}: step numbers");
        assert!((x - y).abs() <= 1e-5 * y.abs(), "{what}: step {s}: loss {x} vs {y}");
    }
}

#[test]
fn mlp_strategies_match_the_unsharded_run() {
    let reference = run(MLP, "data=1", "none", "interp", Overrides::default());
    for (mesh, strategy) in [
        ("data=8", "dp"),
        ("model=4", "tp"),
        ("data=2,model=4", "tp"),
        ("data=8", "fsdp"),
        ("data=2,model=2", "fsdp_tp"),
        ("data=4", "zero1"),
        ("data=4", "zero2"),
        ("data=4", "zero3"),
    ] {
        let got = run(MLP, mesh, strategy, "cpu", Overrides::default());
        close(&got, &reference, &format!("{strategy} on {mesh}"));
    }
}

#[test]
fn same_config_and_seed_give_bitwise_identical_metrics() {
    let a = run(MLP, "data=2,model=2", "fsdp_tp", "cpu", Overrides::default());
    let b = run(MLP, "data=2,model=2", "fsdp_tp", "cpu", Overrides::default());
    assert_eq!(a, b);
    let c = run(MLP, "data=2,model=2", "fsdp_tp", "cpu", Overrides { seed: Some(4), ..Default::default() });
    assert_ne!(a, c, "another seed must give another run");
}

#[test]
fn a_checkpoint_saved_on_one_mesh_resumes_on_another() {
    let dir = std::env::temp_dir().join(format!("weft-runner-reshard-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let ov = |steps, resume| Overrides {
        steps: Some(steps),
        checkpoint_dir: Some(dir.join("ckpt")),
        checkpoint_every: Some(3),
        resume,
        ..Default::default()
    };
    let reference = run(MLP, "data=1", "none", "interp", Overrides { steps: Some(6), ..Default::default() });
    // Saved on data=2,model=4 under FSDP+TP ...
    let first = run(MLP, "data=2,model=4", "fsdp_tp", "cpu", ov(3, false));
    // ... resumed on data=8 (data parallel) and on a single device.
    let second = run(MLP, "data=8", "dp", "cpu", ov(6, true));
    // The second run resumed: it starts at the checkpoint's step.
    assert_eq!(first.iter().map(|m| m.0).collect::<Vec<_>>(), vec![0, 1, 2]);
    assert_eq!(second.iter().map(|m| m.0).collect::<Vec<_>>(), vec![3, 4, 5], "the resumed run must start at step 3");
    let mut all = first.clone();
    all.extend(second);
    close(&all, &reference, "fsdp_tp on data=2,model=4 then dp on data=8");
    let single = run(MLP, "data=1", "none", "interp", Overrides { steps: Some(6), ..ov(6, true) });
    assert!(single.is_empty(), "already at step 6");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The utilisation a run reports (`run.json` `timings.utilisation`): the
/// model's FLOPs per step do not depend on the layout; the partitioned
/// program's (the hardware's) are at least as many; MFU is model FLOP/s
/// over the peak, a declared `peak_tflops` per device included. And each
/// device's verdict (`timings.devices`): compute on every device,
/// communication on those of a split mesh.
#[test]
fn model_flops_do_not_depend_on_the_layout_and_mfu_is_over_the_peak() {
    let summary = |mesh: &str, strategy: &str, peak: Option<f64>| {
        let mut c = RunConfig::from_toml(MLP).unwrap();
        (c.mesh, c.strategy, c.peak_tflops) = (Some(mesh.into()), Some(strategy.into()), peak);
        let s = run_session(&c, &Overrides { quiet: true, ..Default::default() }, &mut |_| {}).unwrap();
        // Where each device's steps went: every device computed, and the
        // devices of a split mesh communicated.
        let per = s.verdict.per_device();
        assert_eq!(per.len(), mesh.split([',', '=']).filter_map(|x| x.parse::<usize>().ok()).product::<usize>());
        for ([compute, comm, idle, hidden], _) in &per {
            assert!(*compute > 0.0 && *comm >= 0.0 && *idle >= 0.0 && *hidden >= 0.0, "{per:?}");
            assert_eq!(*comm > 0.0, strategy != "none", "{mesh} {strategy}: {per:?}");
        }
        s.utilisation.expect("a timed run reports its utilisation")
    };
    let one = summary("data=1", "none", None);
    let split = summary("data=2,model=4", "fsdp_tp", None);
    let f = |u: &serde_json::Value, k: &str| u[k].as_f64().unwrap_or_else(|| panic!("{k} in {u}"));
    // The MLP's products: forward 2·B·d·h per matrix, backward twice that.
    let gemm = 6.0 * 8.0 * (2.0 * 2.0 * 16.0 * 32.0);
    assert!(f(&one, "model_flops_per_step") >= gemm && f(&one, "model_flops_per_step") < 2.0 * gemm, "{one}");
    assert_eq!(f(&one, "model_flops_per_step"), f(&one, "hardware_flops_per_step"), "one device: {one}");
    assert_eq!(f(&split, "model_flops_per_step"), f(&one, "model_flops_per_step"), "{split}");
    assert!(f(&split, "hardware_flops_per_step") >= f(&split, "model_flops_per_step"), "{split}");
    let mfu = f(&split, "model_flops_per_s") / f(&split, "peak_flops_per_s");
    assert!((f(&split, "mfu") - mfu).abs() <= 1e-12 * mfu, "{split}");
    assert!(f(&split, "hfu") >= f(&split, "mfu"), "{split}");
    let declared = summary("data=2", "dp", Some(2.5));
    assert_eq!(f(&declared, "peak_flops_per_s"), 2.5e12 * 2.0, "{declared}");
}

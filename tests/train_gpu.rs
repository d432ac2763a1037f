//! The MLP and GPT training steps on 8 logical wgpu devices (lavapipe when
//! there is no GPU) under DP, TP and FSDP match the CPU backend's run.
//! Without a Vulkan device these tests print that they skipped — except
//! under `CI=true`, where a missing device is a failure.

use weft::runner::{run_session, Overrides, RunConfig};
use weft_runtime::{available_backends, BackendKind};

fn wgpu_or_skip(test: &str) -> bool {
    if available_backends().contains(&BackendKind::Wgpu) {
        return true;
    }
    let msg = format!("{test}: SKIPPED: no Vulkan device (install mesa-vulkan-drivers and libvulkan1)");
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("{msg} — a missing device is a failure in CI");
    }
    eprintln!("{msg}");
    false
}

fn losses(config: &str, mesh: &str, strategy: &str, backend: &str) -> Vec<f64> {
    let mut c = RunConfig::from_toml(config).unwrap();
    c.mesh = Some(mesh.into());
    c.strategy = Some(strategy.into());
    c.backend = Some(backend.into());
    let s = run_session(&c, &Overrides { quiet: true, ..Default::default() }, &mut |_| {}).unwrap();
    s.metrics.iter().map(|(_, m)| m["loss"]).collect()
}

fn check(config: &str, cases: &[(&str, &str)]) {
    for (mesh, strategy) in cases {
        let cpu = losses(config, mesh, strategy, "cpu");
        let gpu = losses(config, mesh, strategy, "wgpu");
        assert_eq!(cpu.len(), gpu.len());
        for (s, (a, b)) in gpu.iter().zip(&cpu).enumerate() {
            assert!((a - b).abs() <= 1e-5 * b.abs(), "{strategy} on {mesh}, step {s}: wgpu loss {a} vs cpu {b}");
        }
    }
}

const CASES: [(&str, &str); 3] = [("data=8", "dp"), ("data=2,model=4", "tp"), ("data=8", "fsdp")];

#[test]
fn mlp_on_8_wgpu_devices_matches_cpu() {
    if !wgpu_or_skip("mlp_on_8_wgpu_devices_matches_cpu") {
        return;
    }
    let config = "steps = 3\nseed = 1\n[model]\nkind = \"mlp\"\nlayers = 2\nd = 16\nh = 32\nbatch = 16\n[optimizer]\nkind = \"sgd\"\nlr = 0.01\n";
    check(config, &CASES);
}

#[test]
fn gpt_on_8_wgpu_devices_matches_cpu() {
    if !wgpu_or_skip("gpt_on_8_wgpu_devices_matches_cpu") {
        return;
    }
    let config = "steps = 2\nseed = 1\n[model]\nkind = \"gpt\"\nvocab = 16\nseq = 8\nd_model = 16\nheads = 4\nlayers = 1\nbatch = 8\n[optimizer]\nkind = \"adamw\"\nlr = 0.003\n";
    check(config, &CASES);
}

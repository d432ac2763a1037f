//! Gradient accumulation through `weft train`: `micro_batches = k` in
//! `[optimizer]` runs the step on k micro-batches of `batch / k` rows and
//! equals the full-batch step, for both models and every strategy.

use weft::runner::{run_session, Overrides, RunConfig};

const MLP: &str = r#"
steps = 3
seed = 11
[model]
kind = "mlp"
layers = 2
d = 16
h = 32
batch = 8
[optimizer]
kind = "sgd"
lr = 0.05
momentum = 0.9
"#;

const GPT: &str = r#"
steps = 3
seed = 12
[model]
kind = "gpt"
vocab = 32
seq = 8
d_model = 16
heads = 2
layers = 2
batch = 8
[optimizer]
kind = "adamw"
lr = 0.01
"#;

/// Per step: (step, loss, grad_norm).
fn run(config: &str, mesh: &str, strategy: &str, micro_batches: usize) -> Vec<(u64, f64, f64)> {
    let mut c = RunConfig::from_toml(config).unwrap();
    c.mesh = Some(mesh.into());
    c.strategy = Some(strategy.into());
    c.optimizer.micro_batches = micro_batches;
    let s = run_session(&c, &Overrides { quiet: true, ..Default::default() }, &mut |_| {})
        .unwrap_or_else(|e| panic!("{strategy} on {mesh} with {micro_batches} micro-batches: {e}"));
    s.metrics.iter().map(|(step, m)| (*step, m["loss"], m["grad_norm"])).collect()
}

fn assert_equal(full: &[(u64, f64, f64)], acc: &[(u64, f64, f64)], what: &str) {
    assert_eq!(full.len(), 3, "{what}: the full-batch run has {} steps", full.len());
    assert_eq!(acc.len(), full.len(), "{what}: {} accumulated steps vs {} full-batch steps", acc.len(), full.len());
    for (a, f) in acc.iter().zip(full) {
        assert_eq!(a.0, f.0, "{what}: step numbers differ");
        let rel = |x: f64, y: f64| (x - y).abs() / y.abs().max(1e-30);
        assert!(rel(a.1, f.1) <= 1e-6, "{what}: step {}: loss {} vs full-batch {}", f.0, a.1, f.1);
        assert!(rel(a.2, f.2) <= 1e-6, "{what}: step {}: grad_norm {} vs full-batch {}", f.0, a.2, f.2);
    }
    // The runs trained: the loss moved.
    assert!(full[0].1 != full[2].1, "{what}: the loss did not change");
}

const CASES: [(&str, &str); 9] = [
    ("data=1", "none"),
    ("data=2", "dp"),
    ("data=2", "fsdp"),
    ("data=2,model=2", "tp"),
    ("data=2,model=2", "fsdp"),
    ("data=2,model=2", "fsdp_tp"),
    ("data=2,model=2", "zero1"),
    ("data=2,model=2", "zero2"),
    ("data=2,model=2", "zero3"),
];

#[test]
fn mlp_accumulated_steps_equal_full_batch_steps_under_every_strategy() {
    for (mesh, strategy) in CASES {
        let full = run(MLP, mesh, strategy, 1);
        for k in [2, 4] {
            assert_equal(&full, &run(MLP, mesh, strategy, k), &format!("mlp {strategy} on {mesh}, k = {k}"));
        }
    }
}

#[test]
fn gpt_accumulated_steps_equal_full_batch_steps_under_every_strategy() {
    for (mesh, strategy) in CASES {
        let full = run(GPT, mesh, strategy, 1);
        assert_equal(&full, &run(GPT, mesh, strategy, 2), &format!("gpt {strategy} on {mesh}, k = 2"));
    }
}

#[test]
fn the_model_is_built_for_micro_batches() {
    // Equality with the full batch alone would also hold if `micro_batches`
    // were ignored: the loss the step accumulates must take `batch / k` rows.
    for (config, input, k) in [(MLP, "x", 2usize), (MLP, "x", 4), (GPT, "tokens", 2)] {
        let mut c = RunConfig::from_toml(config).unwrap();
        c.optimizer.micro_batches = k;
        let p = weft::runner::prepare(&c, &["data"], &Overrides::default()).unwrap();
        let loss = p.step.module.function("loss").expect("models define @loss");
        let x = loss.value_by_name(input).unwrap_or_else(|| panic!("@loss has %{input}"));
        assert_eq!(loss.value(x).ty.shape[0], 8 / k, "{input} with {k} micro-batches");
    }
}

#[test]
fn micro_batches_that_do_not_divide_the_batch_are_a_named_error() {
    let mut c = RunConfig::from_toml(MLP).unwrap();
    c.optimizer.micro_batches = 3;
    let e = run_session(&c, &Overrides { quiet: true, ..Default::default() }, &mut |_| {}).unwrap_err();
    assert!(matches!(&e, weft::Error::Invalid { key, .. } if key == "optimizer.micro_batches"), "{e:?}");
    assert!(e.to_string().contains("must divide model.batch = 8"), "{e}");
}

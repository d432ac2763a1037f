//! The mixture-of-experts GPT end to end (`examples/configs/moe.toml`):
//! on `data=2,expert=4` it equals the interpreter on one device, its
//! tokens reach their experts by all-to-all, a checkpoint resumes onto
//! another expert-axis size, and on text its load-balancing loss and the
//! share of dropped tokens fall.

use std::path::PathBuf;
use weft::runner::{run_session, Overrides, RunConfig, RunSummary};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn example() -> RunConfig {
    RunConfig::from_toml(&std::fs::read_to_string(root().join("examples/configs/moe.toml")).unwrap()).unwrap()
}

/// Runs `c` with `ov` (quiet, metrics file off); the summary and the lines
/// the run printed.
fn run(c: &RunConfig, ov: Overrides) -> (RunSummary, Vec<String>) {
    let c = RunConfig { metrics: None, ..ov.apply(c.clone()) };
    let mut lines = Vec::new();
    let s = run_session(&c, &Overrides { quiet: true, ..ov }, &mut |l| lines.push(format!("{l:?}"))).unwrap();
    (s, lines)
}

fn metric(s: &RunSummary, name: &str) -> Vec<f64> {
    s.metrics.iter().map(|(_, m)| m[name]).collect()
}

fn close(a: &[f64], b: &[f64], rel: f64, what: &str) {
    assert_eq!(a.len(), b.len(), "{what}");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!((x - y).abs() <= rel * y.abs().max(1e-3), "{what} at step {i}: {x} vs {y}");
    }
}

#[test]
fn expert_parallel_steps_equal_the_interpreter_on_one_device_and_exchange_tokens_by_all_to_all() {
    let tmp = tempfile::tempdir().unwrap();
    let ck = |n: &str| Some(tmp.path().join(n));
    let ov = Overrides { steps: Some(10), checkpoint_dir: ck("ep"), ..Default::default() };
    let (ep, lines) = run(&example(), ov);
    let one = Overrides {
        steps: Some(10),
        mesh: Some("data=1".into()),
        strategy: Some("none".into()),
        backend: Some("interp".into()),
        checkpoint_dir: ck("one"),
        ..Default::default()
    };
    let (oracle, _) = run(&example(), one);
    for m in ["loss", "aux_loss", "moe_dropped", "moe_load_0", "moe_load_3"] {
        close(&metric(&ep, m), &metric(&oracle, m), 1e-5, m);
    }
    // Some assignments are over capacity, and the load is reported.
    assert!(metric(&ep, "moe_dropped").iter().any(|&d| d > 0.0));
    let load: f64 = (0..4).map(|e| metric(&ep, &format!("moe_load_{e}"))[0]).sum();
    assert!((load - 1.0).abs() < 1e-6, "the loads are shares: {load}");
    let plan = lines.iter().find(|l| l.contains("per step:")).expect("the plan line");
    assert!(plan.contains("all_to_all"), "{plan}");
    // Expert, data and tensor parallelism together (the experts' hidden
    // units over `model`).
    let ov = Overrides {
        steps: Some(10),
        mesh: Some("data=2,expert=2,model=2".into()),
        strategy: Some("tp".into()),
        checkpoint_dir: ck("ep_tp"),
        ..Default::default()
    };
    // (The example's experts are so small that with half the devices per
    // expert group the partitioner gathers their weights instead of moving
    // the tokens; the result is the same.)
    let (ep_tp, _) = run(&example(), ov);
    for m in ["loss", "aux_loss", "moe_dropped"] {
        close(&metric(&ep_tp, m), &metric(&oracle, m), 1e-5, m);
    }
}

#[test]
fn a_checkpoint_resumes_onto_another_expert_axis_size() {
    let tmp = tempfile::tempdir().unwrap();
    let base = example();
    let full = Overrides { steps: Some(10), checkpoint_dir: Some(tmp.path().join("full")), ..Default::default() };
    let (whole, _) = run(&base, full);
    let dir = Some(tmp.path().join("cut"));
    let first =
        Overrides { steps: Some(5), checkpoint_dir: dir.clone(), checkpoint_every: Some(5), ..Default::default() };
    run(&base, first);
    let rest = Overrides {
        steps: Some(10),
        mesh: Some("data=2,expert=2".into()),
        checkpoint_dir: dir,
        resume: true,
        ..Default::default()
    };
    let (resumed, _) = run(&base, rest);
    assert_eq!(resumed.metrics.first().map(|(s, _)| *s), Some(5), "resumed at step 5");
    close(&metric(&resumed, "loss"), &metric(&whole, "loss")[5..], 1e-5, "loss after the resume");
}

#[test]
fn on_text_the_load_balancing_loss_and_the_dropped_share_fall() {
    let tmp = tempfile::tempdir().unwrap();
    let texts: Vec<PathBuf> =
        ["specs/training.md", "specs/ir.md", "README.md"].iter().map(|p| root().join(p)).collect();
    let data = tmp.path().join("docs");
    weft::data::prepare::prepare(&texts, &data, 0.1, &weft::data::tokenize::Tokenizer::Bytes).unwrap();
    // The example's model on bytes of text, with the load-balancing loss
    // weighted 1 (at Switch's 0.01 the router, which starts near uniform,
    // drifts as the experts specialise: 1.02 -> 1.10 over these steps).
    let text = format!(
        r#"steps = 60
seed = 0
mesh = "data=2,expert=4"
strategy = "dp"
[model]
kind = "gpt"
vocab = 256
seq = 16
d_model = 32
heads = 4
layers = 2
batch = 16
experts = 4
top_k = 2
capacity_factor = 1.25
moe_every = 2
aux_loss_weight = 1.0
[optimizer]
kind = "adamw"
lr = 3e-3
[data]
source = "tokens"
train = "{}/train.bin"
"#,
        data.display()
    );
    let c = RunConfig::from_toml(&text).unwrap();
    let ov = Overrides { steps: Some(60), checkpoint_dir: Some(tmp.path().join("ck")), ..Default::default() };
    let (s, _) = run(&c, ov);
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let (loss, aux, dropped) = (metric(&s, "loss"), metric(&s, "aux_loss"), metric(&s, "moe_dropped"));
    eprintln!(
        "loss {:.4} -> {:.4}, aux loss {:.4} -> {:.4}, dropped {:.4} -> {:.4}",
        mean(&loss[..10]),
        mean(&loss[50..]),
        mean(&aux[..10]),
        mean(&aux[50..]),
        mean(&dropped[..10]),
        mean(&dropped[50..])
    );
    assert!(mean(&loss[50..]) < 0.8 * mean(&loss[..10]), "the loss falls: {loss:?}");
    assert!(mean(&aux[50..]) < mean(&aux[..10]), "the load-balancing loss falls: {aux:?}");
    assert!(mean(&dropped[50..]) < 0.75 * mean(&dropped[..10]), "fewer assignments are dropped: {dropped:?}");
    // Switch's loss is 1 for a uniform load and at most the expert count.
    assert!(aux.iter().all(|&a| (0.99..=4.0).contains(&a)), "{aux:?}");
}

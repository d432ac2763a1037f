//! Pipeline parallelism: the pipelined step (stages on a mesh axis, GPipe
//! or 1F1B) equals the unpipelined step with the same microbatch
//! accumulation, for the MLP and the GPT, S = 2 and 4, M = 1, 4, 8, both
//! schedules, also composed with DP, TP and FSDP (3D); its memory follows
//! the schedule; bad inputs are named errors.

use weft::runner::stages::{pipeline_executor, prepare_pipeline};
use weft::runner::{executor, prepare, Executor, Overrides, RunConfig};
use weft_compiler::sharding::Mesh;
use weft_compiler::train::{Metrics, Tree};

const MLP: &str = r#"
steps = 3
seed = 11
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
clip = 0.5
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

/// The unpipelined step with `m` microbatches on `mesh`: per-step metrics
/// (the config's `steps`) and the final state.
fn reference(config: &str, mesh: &str, strategy: &str, m: usize) -> (Vec<Metrics>, Tree) {
    let mut c = RunConfig::from_toml(config).unwrap();
    c.optimizer.micro_batches = m;
    c.strategy = Some(strategy.into());
    let mesh = Mesh::parse(mesh).unwrap();
    let axes: Vec<&str> = mesh.axes().iter().map(|a| a.name.as_str()).collect();
    let p = prepare(&c, &axes, &Overrides::default()).unwrap();
    let mut exec = executor(weft::runner::Backend::DEFAULT, &mesh, &p, None).unwrap();
    let state = p.step.init_state(&p.params, c.seed, c.initial_loss_scale()).unwrap();
    exec.load(&p.step, &state).unwrap();
    let metrics = (0..c.steps).map(|_| exec.step(&p.step, &p.batch).unwrap()).collect();
    (metrics, exec.global_state(&p.step).unwrap())
}

fn pipelined(config: &str, mesh: &str, strategy: &str, s: usize, m: usize, schedule: &str) -> (Vec<Metrics>, Tree) {
    let mut c = RunConfig::from_toml(config).unwrap();
    c.strategy = Some(strategy.into());
    c.mesh = Some(mesh.into());
    // `interleaved` runs 2 chunks per stage.
    let v = if schedule == "interleaved" { 2 } else { 1 };
    c.pipeline = Some(
        toml::from_str(&format!("stages = {s}\nmicrobatches = {m}\nschedule = \"{schedule}\"\nvirtual_stages = {v}"))
            .unwrap(),
    );
    let mesh = weft::runner::validate::validate(&c).unwrap();
    let (p, staged, sub) = prepare_pipeline(&c, &mesh, &Overrides::default()).unwrap();
    assert_eq!(staged.stages.len(), s * v);
    let mut exec = pipeline_executor(&c, &p, staged, &sub, &mesh).unwrap();
    let state = p.step.init_state(&p.params, c.seed, c.initial_loss_scale()).unwrap();
    exec.load(&p.step, &state).unwrap();
    let metrics = (0..c.steps).map(|_| exec.step(&p.step, &p.batch).unwrap()).collect();
    if strategy == "auto" {
        // The auto-sharder laid out some parameter over the sub-mesh.
        let layouts = exec.param_layouts();
        let sharded = layouts.iter().flatten().filter(|(_, l)| !l.is_replicated()).count();
        eprintln!("auto on {mesh}: {sharded} stage parameters sharded: {layouts:?}");
        assert!(sharded > 0, "auto on {mesh}: every parameter replicated");
    }
    (metrics, exec.global_state(&p.step).unwrap())
}

/// Compares, returns how many state leaves are bitwise equal.
fn assert_equivalent(want: &(Vec<Metrics>, Tree), got: &(Vec<Metrics>, Tree), what: &str) -> usize {
    assert_within(want, got, what, 1.0)
}

/// [`assert_equivalent`] with every tolerance multiplied by `loose`.
fn assert_within(want: &(Vec<Metrics>, Tree), got: &(Vec<Metrics>, Tree), what: &str, loose: f64) -> usize {
    let rel = |x: f64, y: f64| (x - y).abs() / y.abs().max(1e-30);
    for (i, (w, g)) in want.0.iter().zip(&got.0).enumerate() {
        for key in ["loss", "grad_norm", "lr"] {
            // A skipped step's norm is not finite in both (NaN or ∞).
            let same = g[key] == w[key] || (g[key].is_nan() && w[key].is_nan()) || rel(g[key], w[key]) <= 1e-6 * loose;
            assert!(same, "{what}: step {i}: {key} {} vs unpipelined {}", g[key], w[key]);
        }
    }
    assert!(want.0[0]["loss"] != want.0[want.0.len() - 1]["loss"], "{what}: the loss did not change");
    assert_eq!(want.1.keys().collect::<Vec<_>>(), got.1.keys().collect::<Vec<_>>(), "{what}: state leaves");
    let mut bitwise = 0;
    for (name, w) in &want.1 {
        let g = &got.1[name];
        let scale = w.to_f64_vec().iter().fold(0.0f64, |a, x| a.max(x.abs())).max(1e-30);
        let diff = g.max_abs_diff(w) / scale;
        // Parameters to 1e-6; optimizer slots (Adam's moments of gradients
        // that are sums in another order, e.g. a bias's gradient of ~1e-4)
        // to 1e-5.
        let tol = loose * if name.starts_with("params.") { 1e-6 } else { 1e-5 };
        assert!(diff <= tol, "{what}: leaf {name} differs by {diff} (relative to its largest element)");
        bitwise += usize::from(g.bitwise_eq(w));
    }
    bitwise
}

#[test]
fn mlp_pipelined_steps_equal_unpipelined_accumulation() {
    for m in [1, 4, 8] {
        let want = reference(MLP, "data=1", "none", m);
        for s in [2, 4] {
            for schedule in ["gpipe", "1f1b"] {
                let got = pipelined(MLP, &format!("stage={s}"), "none", s, m, schedule);
                let what = format!("mlp S={s} M={m} {schedule}");
                let bitwise = assert_equivalent(&want, &got, &what);
                eprintln!("{what}: {bitwise}/{} leaves bitwise equal", want.1.len());
            }
        }
    }
}

#[test]
fn gpt_pipelined_steps_equal_unpipelined_accumulation() {
    for m in [1, 4, 8] {
        let want = reference(GPT, "data=1", "none", m);
        for s in [2, 4] {
            for schedule in ["gpipe", "1f1b"] {
                let got = pipelined(GPT, &format!("stage={s}"), "none", s, m, schedule);
                let what = format!("gpt S={s} M={m} {schedule}");
                let bitwise = assert_equivalent(&want, &got, &what);
                eprintln!("{what}: {bitwise}/{} leaves bitwise equal", want.1.len());
            }
        }
    }
}

#[test]
fn interleaved_pipelines_equal_unpipelined_accumulation() {
    // Two chunks per stage: the MLP (8 layers for S = 4) and the GPT (4
    // units: embedding, 2 blocks, head), also tied, with loss scaling,
    // and composed with data parallelism and with FSDP x TP in 3D.
    let mlp8 = MLP.replace("layers = 4", "layers = 8");
    for (config, name, stages, ms) in
        [(MLP, "mlp", 2, &[2, 4, 8][..]), (mlp8.as_str(), "mlp8", 4, &[4, 8]), (GPT, "gpt", 2, &[2, 4, 8])]
    {
        for &m in ms {
            let want = reference(config, "data=1", "none", m);
            let got = pipelined(config, &format!("stage={stages}"), "none", stages, m, "interleaved");
            let what = format!("{name} S={stages} V=2 M={m} interleaved");
            let bitwise = assert_equivalent(&want, &got, &what);
            eprintln!("{what}: {bitwise}/{} leaves bitwise equal", want.1.len());
            // One device per stage: the same additions in the same order.
            assert_eq!(bitwise, want.1.len(), "{what}: every leaf bitwise equal");
            for (i, (w, g)) in want.0.iter().zip(&got.0).enumerate() {
                assert_eq!(w["loss"].to_bits(), g["loss"].to_bits(), "{what}: step {i} loss");
            }
        }
    }
    let tied = GPT.replace("batch = 8\n", "batch = 8\ntie_embeddings = true\n");
    let want = reference(&tied, "data=1", "none", 4);
    let got = pipelined(&tied, "stage=2", "none", 2, 4, "interleaved");
    assert_equivalent(&want, &got, "tied gpt S=2 V=2 M=4 interleaved");
    let scaled = GPT.replace("steps = 3\n", "steps = 8\n").replace("batch = 8\n", "batch = 8\ncompute = \"f16\"\n")
        + "[loss_scaling]\ninitial_scale = 524288\nperiod = 2\n";
    let want = reference(&scaled, "data=1", "none", 4);
    let got = pipelined(&scaled, "stage=2", "none", 2, 4, "interleaved");
    assert_equivalent(&want, &got, "f16 gpt, loss scaling, S=2 V=2 M=4 interleaved");
    for (i, (w, g)) in want.0.iter().zip(&got.0).enumerate() {
        assert_eq!(g["skipped"].to_bits(), w["skipped"].to_bits(), "step {i}: skipped");
    }
    let gpt = gpt_sgd();
    for (mesh, sub, strategy) in
        [("data=2,stage=2", "data=2", "dp"), ("data=2,stage=2,model=2", "data=2,model=2", "fsdp_tp")]
    {
        let want = reference(&gpt, sub, strategy, 4);
        let got = pipelined(&gpt, mesh, strategy, 2, 4, "interleaved");
        let what = format!("gpt {strategy} on {mesh}, interleaved");
        let bitwise = assert_equivalent(&want, &got, &what);
        eprintln!("{what}: {bitwise}/{} leaves bitwise equal", want.1.len());
    }
}

/// Sharded over `data`, each microbatch's gradient is reduced across
/// devices before the microbatches are summed (the unpipelined step sums
/// first, then reduces once): the same numbers added in another order.
/// AdamW divides by `sqrt(v)`, which turns the last-bit differences of a
/// near-zero gradient into visible ones, so the compositions train the GPT
/// with SGD.
fn gpt_sgd() -> String {
    GPT.replace("kind = \"adamw\"", "kind = \"sgd\"\nmomentum = 0.9")
}

#[test]
fn pipelines_compose_with_data_tensor_and_fsdp_parallelism() {
    let gpt = gpt_sgd();
    for (config, name) in [(MLP, "mlp"), (gpt.as_str(), "gpt")] {
        for (mesh, sub, strategy) in [
            ("data=2,stage=2", "data=2", "dp"),
            ("stage=2,model=2", "model=2", "tp"),
            ("data=2,stage=2", "data=2", "fsdp"),
            ("data=2,stage=2,model=2", "data=2,model=2", "fsdp_tp"),
            ("data=2,stage=2,model=2", "data=2,model=2", "tp"),
        ] {
            let want = reference(config, sub, strategy, 4);
            for schedule in ["gpipe", "1f1b"] {
                let got = pipelined(config, mesh, strategy, 2, 4, schedule);
                let what = format!("{name} {strategy} on {mesh}, {schedule}");
                let bitwise = assert_equivalent(&want, &got, &what);
                eprintln!("{what}: {bitwise}/{} leaves bitwise equal", want.1.len());
            }
        }
    }
}

#[test]
fn gpt_with_dropout_pipelined_equals_unpipelined() {
    // The stages draw the same dropout masks: each gets the microbatch's key.
    let gpt = GPT.replace("batch = 8\n", "batch = 8\ndropout = 0.1\n");
    for m in [1, 4] {
        let want = reference(&gpt, "data=1", "none", m);
        for schedule in ["gpipe", "1f1b"] {
            let got = pipelined(&gpt, "stage=2", "none", 2, m, schedule);
            let what = format!("gpt with dropout S=2 M={m} {schedule}");
            let bitwise = assert_equivalent(&want, &got, &what);
            eprintln!("{what}: {bitwise}/{} leaves bitwise equal", want.1.len());
        }
    }
    // Dropout is on: the loss differs from the run without it.
    assert_ne!(reference(&gpt, "data=1", "none", 1).0[0]["loss"], reference(GPT, "data=1", "none", 1).0[0]["loss"]);
}

#[test]
fn gpt_with_tied_embeddings_pipelined_equals_unpipelined() {
    // The unembedding is `wte` transposed: stage 0's parameter is used on
    // the last stage, sent there with the activations, and its gradient
    // from the head comes back as a cotangent into stage 0's backward.
    let gpt = GPT.replace("batch = 8\n", "batch = 8\ntie_embeddings = true\n");
    for m in [1, 4] {
        let want = reference(&gpt, "data=1", "none", m);
        assert!(!want.1.contains_key("params.lm_head") && want.1.contains_key("params.wte"));
        for s in [2, 4] {
            for schedule in ["gpipe", "1f1b"] {
                let got = pipelined(&gpt, &format!("stage={s}"), "none", s, m, schedule);
                let what = format!("tied gpt S={s} M={m} {schedule}");
                let bitwise = assert_equivalent(&want, &got, &what);
                eprintln!("{what}: {bitwise}/{} leaves bitwise equal", want.1.len());
            }
        }
    }
    // Composed with data and tensor parallelism on a 3D mesh.
    let sgd = gpt_sgd().replace("batch = 8\n", "batch = 8\ntie_embeddings = true\n");
    let want = reference(&sgd, "data=2,model=2", "fsdp_tp", 4);
    let got = pipelined(&sgd, "data=2,stage=2,model=2", "fsdp_tp", 2, 4, "1f1b");
    assert_equivalent(&want, &got, "tied gpt fsdp_tp on data=2,stage=2,model=2");
    // Tying changes the model: the first loss differs from the untied one.
    assert_ne!(want.0[0]["loss"], reference(&gpt_sgd(), "data=2,model=2", "fsdp_tp", 4).0[0]["loss"]);
}

#[test]
fn f16_gpt_with_dynamic_loss_scaling_pipelined_equals_unpipelined() {
    // f16 activations overflow at the initial scale 2^19: the first steps
    // are skipped (no stage updates) and halve the scale; then good steps
    // double it every 2. The skip decision is global: one stage's
    // non-finite gradients stop every stage's update.
    let gpt = GPT.replace("steps = 3\n", "steps = 8\n").replace("batch = 8\n", "batch = 8\ncompute = \"f16\"\n")
        + "[loss_scaling]\ninitial_scale = 524288\nperiod = 2\n";
    let check = |want: &(Vec<Metrics>, Tree), got: &(Vec<Metrics>, Tree), what: &str, loose: f64| {
        let bitwise = assert_within(want, got, what, loose);
        for (i, (w, g)) in want.0.iter().zip(&got.0).enumerate() {
            for key in ["skipped", "loss_scale"] {
                assert_eq!(g[key].to_bits(), w[key].to_bits(), "{what}: step {i}: {key}");
            }
        }
        for leaf in ["loss_scale.scale", "loss_scale.good_steps"] {
            assert!(got.1[leaf].bitwise_eq(&want.1[leaf]), "{what}: {leaf}");
        }
        eprintln!("{what}: {bitwise}/{} leaves bitwise equal", want.1.len());
    };
    let want = reference(&gpt, "data=1", "none", 4);
    let skipped: Vec<f64> = want.0.iter().map(|m| m["skipped"]).collect();
    let scales: Vec<f64> = want.0.iter().map(|m| m["loss_scale"]).collect();
    eprintln!("skipped {skipped:?}, scales {scales:?}");
    assert!(skipped.contains(&1.0) && skipped.contains(&0.0), "skipped {skipped:?}");
    assert!(scales.windows(2).any(|w| w[1] > w[0]), "the scale never grew: {scales:?}");
    for s in [2, 4] {
        for schedule in ["gpipe", "1f1b"] {
            let got = pipelined(&gpt, &format!("stage={s}"), "none", s, 4, schedule);
            check(&want, &got, &format!("f16 gpt, loss scaling, S={s} M=4 {schedule}"), 1.0);
        }
    }
    let sgd = gpt.replace("kind = \"adamw\"", "kind = \"sgd\"\nmomentum = 0.9\nclip = 1.0");
    let want = reference(&sgd, "data=2,model=2", "fsdp_tp", 4);
    let got = pipelined(&sgd, "data=2,stage=2,model=2", "fsdp_tp", 2, 4, "1f1b");
    // Sharded f16 partial sums round in another order than the whole
    // step's (f16 has 11 bits): to f16 precision, same skips and scales.
    check(&want, &got, "f16 gpt, loss scaling, clipped, fsdp_tp on data=2,stage=2,model=2", 1e3);
}

#[test]
fn pipelines_compose_with_auto_sharding() {
    // `strategy = "auto"`: the auto-sharder lays out each stage function on
    // the sub-mesh; the step is still the unpipelined accumulating step.
    // A memory budget per device below the replicated stage functions'
    // needs makes it shard (unbounded, these tiny stages stay replicated:
    // the per-op overhead outweighs their compute).
    let gpt = gpt_sgd();
    for (config, name, budget) in [(MLP, "mlp", "16KiB"), (gpt.as_str(), "gpt", "64KiB")] {
        let want = reference(config, "data=1", "none", 4);
        let config = format!("memory_budget = \"{budget}\"\n{config}");
        for (mesh, schedule) in [("data=2,stage=2", "1f1b"), ("stage=2,model=2", "gpipe")] {
            let got = pipelined(&config, mesh, "auto", 2, 4, schedule);
            let what = format!("{name} auto on {mesh}, {schedule}");
            let bitwise = assert_equivalent(&want, &got, &what);
            eprintln!("{what}: {bitwise}/{} leaves bitwise equal", want.1.len());
        }
    }
    // `weft train` prints the plan per stage.
    let mut c = RunConfig::from_toml(MLP).unwrap();
    c.strategy = Some("auto".into());
    c.mesh = Some("data=2,stage=2".into());
    c.pipeline = Some(toml::from_str("stages = 2\nmicrobatches = 2").unwrap());
    let mut lines = Vec::new();
    let quiet = Overrides { quiet: true, ..Default::default() };
    weft::runner::run_session(&c, &quiet, &mut |l| lines.push(l)).unwrap();
    let plan = lines.iter().find_map(|l| match l {
        weft::runner::Line::Info(t) if t.starts_with("auto-sharding plan per stage") => Some(t.clone()),
        _ => None,
    });
    let plan = plan.expect("no auto-sharding plan line");
    assert!(plan.contains("stage 0: params.") && plan.contains("stage 1: params."), "{plan}");
}

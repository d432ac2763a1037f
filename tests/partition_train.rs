//! Issue "SPMD partitioner": the residual MLP and GPT training steps under
//! data parallelism, Megatron tensor parallelism, FSDP, FSDP+TP and
//! ZeRO-1/2/3 on 8 simulated devices, annotated by `weft::strategy` (what
//! `weft train --strategy` uses). Every strategy is annotations only
//! (parameter and batch shardings, `TrainConfig::state_shardings` and
//! `grad_shardings`); five training steps must match the unsharded
//! interpreter to 1e-5 relative, the collectives must be the strategy's
//! (DP: all-reduces only; FSDP: parameter all-gathers and gradient
//! reduce-scatters, no gradient all-reduce), and each device must hold
//! exactly its share of the parameters and optimizer state.

use std::collections::BTreeMap;
use weft::compiler::partition::{compile, PartitionedFunction};
use weft::compiler::sharding::{Mesh, PropagateOptions};
use weft::compiler::train::{build_train_step, Optimizer, Schedule, TrainConfig, TrainStep, Tree};
use weft::models::{gpt, mlp};
use weft::strategy::{self, Strategy};
use weft_ir::device::{Collective, Step};
use weft_ir::interp::Interpreter;
use weft_ir::tensor::check_close;

/// One strategy of `weft::strategy` (the annotations `weft train
/// --strategy` uses) on its mesh, with the shards each device must hold.
struct Case {
    strategy: Strategy,
    mesh: &'static str,
    /// Expected shards of the parameters and of the optimizer state (0:
    /// mixed, each leaf by its own number of blocks).
    param_shards: usize,
    state_shards: usize,
}

fn cases() -> Vec<Case> {
    let c = |strategy, mesh, param_shards, state_shards| Case { strategy, mesh, param_shards, state_shards };
    vec![
        c(Strategy::DataParallel, "data=8", 1, 1),
        c(Strategy::TensorParallel, "data=2,model=4", 0, 0),
        c(Strategy::Fsdp, "data=8", 8, 8),
        c(Strategy::FsdpTp, "data=2,model=4", 0, 0),
        c(Strategy::Zero1, "data=8", 1, 8),
        c(Strategy::Zero2, "data=8", 1, 8),
        c(Strategy::Zero3, "data=8", 8, 8),
    ]
}

/// A model: its parameters, batch inputs, builder, initial values and batch.
trait Model {
    /// The model as the runner sees it.
    fn model(&self) -> weft::Model;
    fn init(&self) -> Tree;
    fn batch(&self) -> Tree;
}

struct Mlp(mlp::MlpConfig);
struct Gpt(gpt::GptConfig);

impl Model for Mlp {
    fn model(&self) -> weft::Model {
        weft::Model::mlp(&self.0)
    }
    fn init(&self) -> Tree {
        mlp::init(&self.0, 3)
    }
    fn batch(&self) -> Tree {
        mlp::synthetic_batch(&self.0, 4)
    }
}

impl Model for Gpt {
    fn model(&self) -> weft::Model {
        weft::Model::gpt(&self.0)
    }
    fn init(&self) -> Tree {
        gpt::init(&self.0, 5)
    }
    fn batch(&self) -> Tree {
        gpt::synthetic_batch(&self.0, 6)
    }
}

/// Builds the training step of `model` under strategy `st` on a mesh with
/// axes `axes`, annotated by `weft::strategy::annotated_module`.
fn train_step(model: &dyn Model, st: Strategy, axes: &[&str]) -> TrainStep {
    let mut cfg = TrainConfig {
        optimizer: Optimizer::Sgd { momentum: 0.9, nesterov: false },
        schedule: Schedule::Constant(0.05),
        ..Default::default()
    };
    let m = strategy::annotated_module(st, &model.model(), 1, &Default::default(), &mut cfg, axes).unwrap();
    build_train_step(&m, m.function("loss").unwrap(), &cfg).unwrap()
}

fn run_steps(ts: &TrainStep, pf: Option<&PartitionedFunction>, params: &Tree, batch: &Tree) -> Vec<(Tree, f64)> {
    let interp = Interpreter::new(&ts.module).unwrap();
    let mut state = ts.init_state(params, 0, 1.0).unwrap();
    let mut out = Vec::new();
    for _ in 0..5 {
        let args = ts.arguments(&state, batch).unwrap();
        let results = match pf {
            Some(pf) => pf.run(&args, 8).unwrap(),
            None => interp.run_owned("train_step", args).unwrap(),
        };
        let (s, metrics) = ts.split_results(results);
        state = s;
        out.push((state.clone(), metrics["loss"]));
    }
    out
}

/// Bytes of the state leaves with this prefix, per device, as the program
/// sees them.
fn expected_share(ts: &TrainStep, prefix: &str, shards: usize, pf: &PartitionedFunction) -> usize {
    let total: usize = ts.state.iter().filter(|l| l.name.starts_with(prefix)).map(|l| l.ty.size_bytes()).sum();
    if let Some(share) = total.checked_div(shards) {
        return share;
    }
    // Mixed strategies: each leaf divided by its own number of blocks.
    pf.inputs
        .iter()
        .filter(|g| g.name.starts_with(prefix))
        .map(|g| {
            let blocks: usize = g.sharding.axes().map(|a| pf.mesh.axis(a).unwrap().size).product();
            g.ty.size_bytes() / blocks
        })
        .sum()
}

/// Per collective kind, the element counts of the buffers it sends.
fn collective_inputs(pf: &PartitionedFunction) -> BTreeMap<&'static str, Vec<usize>> {
    let mut m: BTreeMap<&'static str, Vec<usize>> = BTreeMap::new();
    for s in &pf.program.steps {
        if let Step::Collective { op, input, .. } = s {
            m.entry(op.name()).or_default().push(pf.program.ty(*input).num_elements());
        }
    }
    let _ = Collective::AllReduce { axes: vec![], op: weft_ir::ReduceOp::Sum };
    m
}

fn check_model(model: &dyn Model, label: &str) -> Vec<String> {
    let params = model.init();
    let batch = model.batch();
    let base = train_step(model, Strategy::None, &[]);
    let want = run_steps(&base, None, &params, &batch);
    let n_params = params.len();
    let mut failures = Vec::new();
    for st in cases() {
        let mesh = Mesh::parse(st.mesh).unwrap();
        let axes: Vec<&str> = mesh.axes().iter().map(|a| a.name.as_str()).collect();
        let ts = train_step(model, st.strategy, &axes);
        let pf = compile(&ts.module, "train_step", &mesh, &PropagateOptions::default()).unwrap();
        let got = run_steps(&ts, Some(&pf), &params, &batch);
        let tag = format!("{label} {}", st.strategy);
        if got.len() != want.len() {
            failures.push(format!("{tag}: {} steps vs {} unsharded", got.len(), want.len()));
        }
        for (k, ((gs, gl), (ws, wl))) in got.iter().zip(&want).enumerate() {
            if (gl - wl).abs() > 1e-5 * wl.abs() {
                failures.push(format!("{tag}: step {k} loss {gl} vs {wl}"));
            }
            for (name, w) in ws {
                let scale = w.to_f64_vec().iter().fold(0.0f64, |m, v| m.max(v.abs()));
                if let Err(e) = check_close(&gs[name], w, 1e-5, 1e-5 * scale) {
                    failures.push(format!("{tag}: step {k} {name}: {e}"));
                }
            }
        }
        if std::env::var("SHOW").is_ok_and(|v| tag.ends_with(&v)) {
            println!("{}", weft_ir::device::print_program(&pf.program));
        }
        let r = pf.report();
        let inputs = collective_inputs(&pf);
        println!(
            "{tag} on ({}): {:?}; params {} B, optimizer {} B, peak {} B per device",
            st.mesh,
            r.collectives.iter().map(|(k, s)| format!("{k} x{}", s.count)).collect::<Vec<_>>(),
            r.param_bytes,
            r.optimizer_bytes,
            r.peak_live_bytes
        );
        let want_p = expected_share(&ts, "params.", st.param_shards, &pf);
        let want_o = expected_share(&ts, "opt.", st.state_shards, &pf);
        if (r.param_bytes, r.optimizer_bytes) != (want_p, want_o) {
            failures.push(format!(
                "{tag}: per-device parameter/optimizer bytes {:?}, want {:?}",
                (r.param_bytes, r.optimizer_bytes),
                (want_p, want_o)
            ));
        }
        // Gradients are tensors; the loss, norms and metrics are scalars.
        let big_all_reduces = inputs.get("all_reduce").map_or(0, |v| v.iter().filter(|&&n| n > 1).count());
        match st.strategy {
            Strategy::DataParallel => {
                if r.count("all_gather") + r.count("reduce_scatter") + r.count("all_to_all") > 0 {
                    failures.push(format!("{tag}: DP should only all-reduce: {:?}", r.collectives));
                }
                if big_all_reduces < n_params {
                    failures.push(format!("{tag}: DP all-reduces every gradient: {:?}", inputs));
                }
            }
            Strategy::Fsdp | Strategy::Zero3
                if r.count("all_gather") < n_params || r.count("reduce_scatter") < n_params || big_all_reduces > 0 =>
            {
                failures.push(format!(
                    "{tag}: FSDP all-gathers parameters and reduce-scatters gradients, never all-reduces them: \
                     {inputs:?}"
                ));
            }
            // A broadcast parameter (a layer-norm gain) sharded like its
            // FSDP shard meets batch-sharded activations: propagation must
            // reshard the small parameter, not all-to-all the activations.
            // (Under fsdp_tp the GPT's residual stream is split by position
            // over `model`, sequence parallelism, and meets split features
            // by all-to-all in the backward pass.)
            Strategy::Fsdp | Strategy::Zero3 if r.count("all_to_all") > 0 => {
                failures.push(format!("{tag}: no activation all-to-alls under FSDP: {:?}", r.collectives));
            }
            Strategy::FsdpTp if label != "GPT" && r.count("all_to_all") > 0 => {
                failures.push(format!("{tag}: no activation all-to-alls under FSDP: {:?}", r.collectives));
            }
            // Sequence parallelism: the partial sums of the GPT's two
            // row-parallel layers in each of its two blocks are
            // reduce-scattered by position (the MLP all-reduces them).
            // (Under fsdp_tp every gradient is reduce-scattered over `data`
            // anyway, so only tp tells.)
            Strategy::TensorParallel if label == "GPT" && r.count("reduce_scatter") < 4 => {
                failures.push(format!("{tag}: the residual stream is reduce-scattered: {:?}", r.collectives));
            }
            Strategy::Zero2 if r.count("reduce_scatter") < n_params || big_all_reduces > 0 => {
                failures.push(format!("{tag}: ZeRO-2 reduce-scatters gradients: {inputs:?}"));
            }
            _ => {}
        }
    }
    failures
}

#[test]
fn mlp_training_matches_under_every_strategy() {
    let cfg = mlp::MlpConfig { layers: 2, d: 8, h: 16, batch: 64, ..Default::default() };
    let failures = check_model(&Mlp(cfg), "MLP");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn gpt_training_matches_under_every_strategy() {
    let cfg = gpt::GptConfig { vocab: 32, seq: 16, d_model: 16, heads: 2, layers: 2, batch: 16, ..Default::default() };
    let failures = check_model(&Gpt(cfg), "GPT");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

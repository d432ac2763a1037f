//! Benchmark: the SPMD partitioner.
//!
//! 1. Lowering time of a 32-layer GPT training step (small widths): call
//!    inlining, sharding propagation and partitioning, each timed, on a
//!    `data=2,model=4` mesh with Megatron annotations.
//! 2. CPU time of one MLP training step under each strategy on 8 simulated
//!    devices (the reference simulator: every device's ops run in turn on
//!    this machine, plus sharding the inputs and assembling the outputs),
//!    next to the unsharded interpreter.
//!
//! Run with `cargo bench --bench partition`; results go in BENCHMARKS.md.

use std::time::{Duration, Instant};
use weft::compiler::inline_calls;
use weft::compiler::partition::partition_function;
use weft::compiler::sharding::{propagate, Mesh, PropagateOptions};
use weft::compiler::train::{build_train_step, Optimizer, Schedule, TrainConfig, TrainStep};
use weft::models::{gpt, mlp, Shardings};
use weft_ir::interp::Interpreter;
use weft_ir::{DimSharding, TensorSharding};

fn sh(dims: &[&[&str]]) -> TensorSharding {
    TensorSharding { dims: dims.iter().map(|d| DimSharding::closed(d)).collect(), unreduced: vec![] }
}

fn megatron(name: &str, rank: usize) -> TensorSharding {
    let col = name.ends_with("w1") || name.ends_with("wqkv") || name.ends_with("b1");
    let row = name.ends_with("w2") || name.ends_with("wo");
    match (rank, col, row) {
        (2, true, _) => sh(&[&[], &["model"]]),
        (2, _, true) => sh(&[&["model"], &[]]),
        (1, true, _) => sh(&[&["model"]]),
        _ => sh(&vec![&[][..]; rank]),
    }
}

fn fsdp(_: &str, rank: usize) -> TensorSharding {
    let mut d: Vec<&[&str]> = vec![&[]; rank];
    d[0] = &["data"];
    sh(&d)
}

fn replicated(_: &str, rank: usize) -> TensorSharding {
    sh(&vec![&[][..]; rank])
}

/// FSDP over `data` on the dimension Megatron leaves unsplit.
fn fsdp_tp(name: &str, rank: usize) -> TensorSharding {
    let m = megatron(name, rank);
    let mut dims: Vec<Vec<String>> = m.dims.iter().map(|d| d.axes.clone()).collect();
    if let Some(i) = dims.iter().position(|d| d.is_empty()) {
        dims[i] = vec!["data".into()];
    }
    TensorSharding { dims: dims.into_iter().map(|axes| DimSharding { axes, open: false }).collect(), unreduced: vec![] }
}

/// A parameter sharding rule: parameter name and rank to sharding.
type Rule = fn(&str, usize) -> TensorSharding;

/// Splits every batch input of @train_step over `data` on dimension 0.
fn shard_batch(ts: &mut TrainStep) {
    let f = ts.module.function_mut("train_step").unwrap();
    for (name, t) in &ts.batch {
        let p = f.params[(0..f.params.len()).position(|i| &f.param_name(i) == name).unwrap()];
        let mut dims: Vec<&[&str]> = vec![&[]; t.rank()];
        dims[0] = &["data"];
        f.values[p.index()].sharding = Some(sh(&dims));
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn gpt_lowering() {
    let cfg = gpt::GptConfig { vocab: 64, seq: 16, d_model: 32, heads: 4, layers: 32, batch: 8, ..Default::default() };
    let shardings: Shardings =
        gpt::param_shapes(&cfg).into_iter().map(|(n, s)| (n.clone(), megatron(&n, s.len()))).collect();
    let m = gpt::build(&cfg, &shardings).unwrap();
    let tc = TrainConfig { optimizer: Optimizer::adamw(), schedule: Schedule::Constant(1e-3), ..Default::default() };
    let mut ts = build_train_step(&m, m.function("loss").unwrap(), &tc).unwrap();
    shard_batch(&mut ts);
    let mesh = Mesh::parse("data=2,model=4").unwrap();
    let (mut t_inline, mut t_prop, mut t_part) = (vec![], vec![], vec![]);
    let mut summary = String::new();
    for _ in 0..3 {
        let t0 = Instant::now();
        let f = inline_calls(&ts.module, "train_step").unwrap();
        let t1 = Instant::now();
        let sf = propagate(&f, &mesh, &PropagateOptions::default()).unwrap();
        let t2 = Instant::now();
        let pf = partition_function(&sf, &mesh).unwrap();
        let t3 = Instant::now();
        t_inline.push(t1 - t0);
        t_prop.push(t2 - t1);
        t_part.push(t3 - t2);
        let r = pf.report();
        summary = format!(
            "{} instructions -> {} device steps ({} compute, {} collectives: {})",
            f.insts.len(),
            pf.program.steps.len(),
            r.compute_steps,
            r.total_collectives(),
            r.collectives.iter().map(|(k, s)| format!("{k} x{}", s.count)).collect::<Vec<_>>().join(", ")
        );
    }
    println!("GPT-32 training step (C=32, Megatron on data=2,model=4): {summary}");
    println!(
        "  lowering (median of 3): inline {:?}, propagate {:?}, partition {:?}",
        median(t_inline),
        median(t_prop),
        median(t_part)
    );
}

fn mlp_step_times() {
    let cfg = mlp::MlpConfig { layers: 4, d: 64, h: 128, batch: 256, ..Default::default() };
    // (name, mesh, parameter rule, optimizer state over data, gradients over data)
    let strategies: [(&str, &str, Rule, bool, bool); 7] = [
        ("DP", "data=8", replicated, false, false),
        ("Megatron", "data=2,model=4", megatron, false, false),
        ("FSDP", "data=8", fsdp, false, false),
        ("FSDP+TP", "data=2,model=4", fsdp_tp, false, false),
        ("ZeRO-1", "data=8", replicated, true, false),
        ("ZeRO-2", "data=8", replicated, true, true),
        ("ZeRO-3", "data=8", fsdp, true, true),
    ];
    let params = mlp::init(&cfg, 0);
    let batch = mlp::synthetic_batch(&cfg, 1);
    let base = mlp::build(&cfg, &Shardings::new()).unwrap();
    let tc0 = TrainConfig {
        optimizer: Optimizer::Sgd { momentum: 0.9, nesterov: false },
        schedule: Schedule::Constant(0.01),
        ..Default::default()
    };
    let ts0 = build_train_step(&base, base.function("loss").unwrap(), &tc0).unwrap();
    let interp = Interpreter::new(&ts0.module).unwrap();
    let state = ts0.init_state(&params, 0, 1.0).unwrap();
    let args = ts0.arguments(&state, &batch).unwrap();
    let times: Vec<Duration> = (0..5)
        .map(|_| {
            let t = Instant::now();
            interp.run("train_step", &args).unwrap();
            t.elapsed()
        })
        .collect();
    println!("MLP training step (4 layers, D=64, H=128, B=256), CPU, median of 5:");
    println!("  unsharded interpreter: {:?}", median(times));
    for (name, mesh, rule, shard_state, shard_grads) in strategies {
        let mut sh_map = Shardings::new();
        let mut tc = tc0.clone();
        for n in mlp::param_names(&cfg) {
            sh_map.insert(n.clone(), rule(&n, 2));
            if shard_state {
                tc.state_shardings.insert(format!("opt.mu.{}", &n["params.".len()..]), fsdp(&n, 2));
            }
            if shard_grads {
                tc.grad_shardings.insert(n.clone(), fsdp(&n, 2));
            }
        }
        let m = mlp::build(&cfg, &sh_map).unwrap();
        let mut ts = build_train_step(&m, m.function("loss").unwrap(), &tc).unwrap();
        shard_batch(&mut ts);
        let mesh = Mesh::parse(mesh).unwrap();
        let t = Instant::now();
        let pf =
            weft::compiler::partition::compile(&ts.module, "train_step", &mesh, &PropagateOptions::default()).unwrap();
        let lower = t.elapsed();
        let times: Vec<Duration> = (0..5)
            .map(|_| {
                let t = Instant::now();
                pf.run(&args, 8).unwrap();
                t.elapsed()
            })
            .collect();
        let r = pf.report();
        println!(
            "  {name:<9} ({mesh}): step {:?} on 8 simulated devices (lowering {lower:?}); {}; peak {} B/device",
            median(times),
            r.collectives.iter().map(|(k, s)| format!("{k} x{}", s.count)).collect::<Vec<_>>().join(", "),
            r.peak_live_bytes
        );
    }
}

fn main() {
    gpt_lowering();
    mlp_step_times();
}

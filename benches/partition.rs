//! Benchmark: the SPMD partitioner.
//!
//! 1. Lowering time of a 32-layer GPT training step (small widths): call
//!    inlining, sharding propagation and partitioning, each timed, on a
//!    `data=2,model=4` mesh with Megatron annotations (`weft::strategy`).
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
use weft::strategy::{self, Strategy};
use weft_ir::interp::Interpreter;

/// The training step of `module` (its `@loss`) under the annotations of
/// `weft::strategy` (what `weft train --strategy` uses).
fn step_under(model: &weft::Model, st: Strategy, mesh: &Mesh, mut tc: TrainConfig) -> TrainStep {
    let axes: Vec<&str> = mesh.axes().iter().map(|a| a.name.as_str()).collect();
    let m = strategy::annotated_module(st, model, 1, &Default::default(), &mut tc, &axes).unwrap();
    build_train_step(&m, m.function("loss").unwrap(), &tc).unwrap()
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn gpt_lowering() {
    let cfg = gpt::GptConfig { vocab: 64, seq: 16, d_model: 32, heads: 4, layers: 32, batch: 8, ..Default::default() };
    let tc = TrainConfig { optimizer: Optimizer::adamw(), schedule: Schedule::Constant(1e-3), ..Default::default() };
    let mesh = Mesh::parse("data=2,model=4").unwrap();
    let ts = step_under(&weft::Model::gpt(&cfg), Strategy::TensorParallel, &mesh, tc);
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
    let strategies = [
        (Strategy::DataParallel, "data=8"),
        (Strategy::TensorParallel, "data=2,model=4"),
        (Strategy::Fsdp, "data=8"),
        (Strategy::FsdpTp, "data=2,model=4"),
        (Strategy::Zero1, "data=8"),
        (Strategy::Zero2, "data=8"),
        (Strategy::Zero3, "data=8"),
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
    let model = weft::Model::mlp(&cfg);
    for (st, mesh) in strategies {
        let mesh = Mesh::parse(mesh).unwrap();
        let ts = step_under(&model, st, &mesh, tc0.clone());
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
            "  {:<9} ({mesh}): step {:?} on 8 simulated devices (lowering {lower:?}); {}; peak {} B/device",
            st.to_string(),
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

//! Per-pass compile times of `weft_compiler::pipeline` for two training
//! steps under Megatron annotations on `data=2,model=4`: the 4-layer
//! residual MLP and a 32-layer GPT (small widths), median of 3 runs.
//!
//! `cargo run --release --example pipeline_passes`

use std::time::Duration;
use weft::compiler::pipeline::{format_pass_times, PassTimes, Pipeline};
use weft::compiler::sharding::{Mesh, PropagateOptions};
use weft::compiler::train::{build_train_step, Optimizer, Schedule, TrainConfig};
use weft::models::{gpt, mlp};
use weft::strategy::{self, Strategy};

fn times(name: &str, model: &weft::Model) {
    let mesh = Mesh::parse("data=2,model=4").unwrap();
    let mut tc =
        TrainConfig { optimizer: Optimizer::adamw(), schedule: Schedule::Constant(1e-3), ..Default::default() };
    let axes = ["data", "model"];
    let m = strategy::annotated_module(Strategy::TensorParallel, model, 1, &Default::default(), &mut tc, &axes)
        .expect("the built-in models have tensor-parallel rules");
    let ts = build_train_step(&m, m.function("loss").unwrap(), &tc).unwrap();
    let mut pipeline = Pipeline::standard(&mesh, &PropagateOptions::default());
    pipeline.verify = false;
    let mut runs: Vec<PassTimes> = Vec::new();
    let mut steps = 0;
    for _ in 0..3 {
        let (p, t) = pipeline.run(&ts.module, "train_step", &mut |_, _| {}).unwrap();
        steps = p.into_partitioned().unwrap().program.steps.len();
        runs.push(t);
    }
    println!("{name} (Megatron on {mesh}, {steps} device steps), median of 3:");
    let median: PassTimes = (0..runs[0].len())
        .map(|i| {
            let mut v: Vec<Duration> = runs.iter().map(|r| r[i].1).collect();
            v.sort();
            (runs[0][i].0, v[1])
        })
        .collect();
    print!("{}", format_pass_times(&median, "  "));
}

fn main() {
    let mcfg = mlp::MlpConfig { layers: 4, d: 64, h: 128, batch: 256, ..Default::default() };
    times("MLP-4 training step", &weft::Model::mlp(&mcfg));
    let gcfg = gpt::GptConfig { vocab: 64, seq: 16, d_model: 32, heads: 4, layers: 32, batch: 8, ..Default::default() };
    times("GPT-32 training step", &weft::Model::gpt(&gcfg));
}

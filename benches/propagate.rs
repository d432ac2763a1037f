//! Benchmark: sharding propagation for the GPT training step (forward,
//! backward, AdamW) at 2, 8 and 32 layers, data and tensor parallel
//! annotations on mesh data=2,model=4.
//!
//! Target (issue "Meshes, partition specs and sharding propagation"):
//! under 200 ms at 32 layers, growing about linearly with op count. Run
//! with `cargo bench --bench propagate`; results go in BENCHMARKS.md.

use std::time::{Duration, Instant};
use weft::compiler::sharding::{propagate, Mesh, PropagateOptions};
use weft::compiler::train::{build_train_step, Optimizer, TrainConfig};
use weft::models::{gpt, Shardings};
use weft_ir::TensorSharding;

fn main() {
    let mesh = Mesh::parse("data=2,model=4").expect("mesh");
    println!("layers | instructions | e-graph nodes / classes | visits | median | min | per instruction");
    for layers in [2usize, 8, 32] {
        let cfg = gpt::GptConfig { vocab: 64, seq: 16, d_model: 32, heads: 4, layers, batch: 8, ..Default::default() };
        // Megatron-style tensor parallelism on the blocks, data parallel batch.
        let mut sh = Shardings::new();
        sh.insert("tokens".into(), TensorSharding::new(&[&["data"], &[]]));
        sh.insert("targets".into(), TensorSharding::new(&[&["data"], &[]]));
        for i in 0..layers {
            sh.insert(format!("params.h.{i}.attn.wqkv"), TensorSharding::new(&[&[], &[], &["model"]]));
            sh.insert(format!("params.h.{i}.attn.wo"), TensorSharding::new(&[&["model"], &[]]));
            sh.insert(format!("params.h.{i}.mlp.w1"), TensorSharding::new(&[&[], &["model"]]));
            sh.insert(format!("params.h.{i}.mlp.w2"), TensorSharding::new(&[&["model"], &[]]));
        }
        let m = gpt::build(&cfg, &sh).expect("model");
        let tc = TrainConfig { optimizer: Optimizer::adamw(), ..Default::default() };
        let ts = build_train_step(&m, m.function("loss").expect("loss"), &tc).expect("train step");
        let f = weft::compiler::inline_calls(&ts.module, "train_step").expect("inline");
        let mut times = Vec::new();
        let mut last = None;
        let deadline = Instant::now() + Duration::from_secs(10);
        while times.len() < 3 || (Instant::now() < deadline && times.len() < 20) {
            let start = Instant::now();
            let sf = propagate(&f, &mesh, &PropagateOptions::default()).expect("propagation");
            times.push(start.elapsed());
            last = Some(sf);
        }
        times.sort();
        let sf = last.expect("ran");
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        println!(
            "{layers:6} | {:12} | {:>11} / {:<9} | {:6} | {:7.1} ms | {:7.1} ms | {:.2} us",
            f.insts.len(),
            sf.stats.egraph_nodes,
            sf.stats.egraph_classes,
            sf.stats.visits,
            ms(times[times.len() / 2]),
            ms(times[0]),
            ms(times[times.len() / 2]) * 1e3 / f.insts.len() as f64
        );
    }
}

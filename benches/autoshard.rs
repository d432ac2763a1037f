//! Benchmark: auto-sharding training steps.
//!
//! - the 4-layer residual MLP training step (AdamW) on mesh data=2,model=4
//!   (target: < 100 ms);
//! - the 32-layer GPT training step (AdamW) on the same mesh (target: < 2 s).
//!
//! Run with `cargo bench --bench autoshard`; prints, per case, the median
//! and minimum time of `auto_shard`, the e-graph size, the extraction's
//! state counts and the plan's step time and memory. Results go in
//! BENCHMARKS.md.

use std::time::{Duration, Instant};
use weft::compiler::autoshard::{auto_shard, fmt_bytes, AutoShardOptions, AutoShardPlan};
use weft::compiler::sharding::Mesh;
use weft::compiler::train::{build_train_step, Optimizer, TrainConfig};
use weft::ir::{DType, Function, Module};
use weft::models::{gpt, mlp, Shardings};

fn train_step(m: &Module, loss: &Function) -> Function {
    let cfg = TrainConfig { optimizer: Optimizer::adamw(), ..TrainConfig::default() };
    build_train_step(m, loss, &cfg).expect("train step builds").function().clone()
}

fn time(name: &str, f: &Function, mesh: &Mesh, opts: &AutoShardOptions, min_runs: usize) -> AutoShardPlan {
    let mut times = Vec::new();
    let mut plan = None;
    let deadline = Instant::now() + Duration::from_secs(20);
    while times.len() < min_runs || (Instant::now() < deadline && times.len() < 20) {
        let t = Instant::now();
        let p = auto_shard(f, mesh, opts).unwrap_or_else(|e| panic!("{name}: {e}"));
        times.push(t.elapsed());
        plan = Some(p);
    }
    times.sort();
    let p = plan.expect("at least one run");
    let s = &p.search;
    println!(
        "{name}: {} instructions; median {:.1} ms, min {:.1} ms over {} runs",
        f.insts.len(),
        times[times.len() / 2].as_secs_f64() * 1e3,
        times[0].as_secs_f64() * 1e3,
        times.len()
    );
    println!(
        "  e-graph: {} e-nodes, {} e-classes, {} iterations ({}); extraction: {} partial plans max (beam {}), {}",
        s.egraph.nodes,
        s.egraph.classes,
        s.egraph.iterations,
        s.egraph.stop,
        s.max_states,
        s.beam_width,
        if s.exact { "exact" } else { "beam-limited" }
    );
    println!(
        "  plan: step time {:.3} ms (compute {:.3} ms, communication {:.3} ms), peak {} per device",
        p.cost.total * 1e3,
        p.cost.compute * 1e3,
        p.cost.communication * 1e3,
        fmt_bytes(p.memory.peak)
    );
    p
}

fn main() {
    let mesh = Mesh::parse("data=2,model=4").expect("mesh");
    let mut opts = AutoShardOptions::default();
    if let Some(b) = std::env::var("WEFT_BEAM").ok().and_then(|b| b.parse().ok()) {
        opts.limits.beam_width = b;
    }

    let cfg = mlp::MlpConfig { layers: 4, d: 256, h: 1024, batch: 256, compute: DType::F32 };
    let m = mlp::build(&cfg, &Shardings::new()).expect("mlp");
    let f = train_step(&m, m.function("loss").expect("loss"));
    let p = time("residual MLP, 4 layers (D=256, H=1024, batch 256)", &f, &mesh, &opts, 5);
    if std::env::var_os("WEFT_BENCH_REPORT").is_some() {
        println!("{}", p.report());
    }

    if std::env::var_os("WEFT_SKIP_GPT").is_some() {
        return;
    }
    let gc = gpt::GptConfig { layers: 32, vocab: 256, seq: 64, d_model: 128, heads: 4, batch: 8, ..Default::default() };
    let m = gpt::build(&gc, &Shardings::new()).expect("gpt");
    let loss = weft::compiler::inline_calls(&m, "loss").expect("inline");
    let f = train_step(&Module { functions: vec![loss.clone()] }, &loss);
    let p = time("GPT, 32 layers (d_model 128, 4 heads, seq 64, batch 8)", &f, &mesh, &opts, 1);
    if std::env::var_os("WEFT_BENCH_REPORT").is_some() {
        println!("{}", p.report());
    }
}

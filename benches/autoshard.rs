//! Benchmark: auto-sharding training steps.
//!
//! - the 4-layer residual MLP training step (AdamW; D=1024, H=4096, batch
//!   1024) on mesh data=2,model=4 (target: < 100 ms);
//! - the 32-layer GPT training step (AdamW; d_model 1024, 16 heads, seq 512,
//!   batch 16, vocab 8192) on the same mesh (target: < 2 s).
//!
//! The search does not depend on tensor sizes except through divisibility;
//! the sizes only make the chosen plans meaningful. `WEFT_BEAM=n` overrides
//! the beam width, `WEFT_SKIP_GPT=1` runs the MLP only and
//! `WEFT_BENCH_REPORT=1` prints the plans' reports.
//!
//! Run with `cargo bench --bench autoshard`; prints, per case, the median
//! and minimum time of `auto_shard`, the e-graph size, the extraction's
//! state counts and the plan's step time and memory. Results go in
//! BENCHMARKS.md.

/// The allocator the `weft` CLI uses (src/main.rs), so the times are what
/// `weft shard --auto` spends.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

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
    println!("  phases of the last run: {}", p.timings());
    p
}

fn main() {
    let mesh = Mesh::parse("data=2,model=4").expect("mesh");
    let mut opts = AutoShardOptions::default();
    if let Some(b) = std::env::var("WEFT_BEAM").ok().and_then(|b| b.parse().ok()) {
        opts.limits.beam_width = b;
    }

    let cfg = mlp::MlpConfig { layers: 4, d: 1024, h: 4096, batch: 1024, compute: DType::F32 };
    let m = mlp::build(&cfg, &Shardings::new()).expect("mlp");
    let f = train_step(&m, m.function("loss").expect("loss"));
    let p = time("residual MLP, 4 layers (D=1024, H=4096, batch 1024)", &f, &mesh, &opts, 5);
    if std::env::var_os("WEFT_BENCH_REPORT").is_some() {
        println!("{}", p.report());
    }

    if std::env::var_os("WEFT_SKIP_GPT").is_some() {
        return;
    }
    let gc =
        gpt::GptConfig { layers: 32, vocab: 8192, seq: 512, d_model: 1024, heads: 16, batch: 16, ..Default::default() };
    let m = gpt::build(&gc, &Shardings::new()).expect("gpt");
    let loss = weft::compiler::inline_calls(&m, "loss").expect("inline");
    let f = train_step(&Module { functions: vec![loss.clone()] }, &loss);
    let p = time("GPT, 32 layers (d_model 1024, 16 heads, seq 512, batch 16, vocab 8192)", &f, &mesh, &opts, 3);
    if std::env::var_os("WEFT_BENCH_REPORT").is_some() {
        println!("{}", p.report());
    }
}

//! An auto-sharding plan runs: the residual MLP training step, planned by
//! `auto_shard` on `data=2,model=2` (with a large batch, and under a memory
//! budget), partitioned and executed on simulated devices, equals the
//! unsharded interpreter.

use weft::compiler::autoshard::{auto_shard, AutoShardOptions};
use weft::compiler::partition::partition_function;
use weft::compiler::sharding::Mesh;
use weft::compiler::train::{build_train_step, TrainConfig};
use weft::models::{mlp, Shardings};
use weft_ir::interp::Interpreter;

fn check(budget: Option<u64>) {
    let cfg = mlp::MlpConfig { layers: 2, d: 16, h: 32, batch: 64, ..Default::default() };
    let m = mlp::build(&cfg, &Shardings::new()).unwrap();
    let ts = build_train_step(&m, m.function("loss").unwrap(), &TrainConfig::default()).unwrap();
    let f = weft::compiler::inline_calls(&ts.module, "train_step").unwrap();
    let mesh = Mesh::parse("data=2,model=2").unwrap();
    let plan = auto_shard(&f, &mesh, &AutoShardOptions { memory_budget: budget, ..Default::default() }).unwrap();
    if let Some(b) = budget {
        assert!(plan.memory.peak as u64 <= b, "plan peak {} over budget {b}", plan.memory.peak);
    }
    let sf = plan.to_sharded().unwrap();
    let pf = partition_function(&sf, &mesh).unwrap();
    let state = ts.init_state(&mlp::init(&cfg, 1), 0, 1.0).unwrap();
    let args = ts.arguments(&state, &mlp::synthetic_batch(&cfg, 2)).unwrap();
    let got = pf.run(&args, 8).unwrap();
    let want = Interpreter::new(&ts.module).unwrap().run("train_step", &args).unwrap();
    assert_eq!(got.len(), want.len());
    for (k, (g, w)) in got.iter().zip(&want).enumerate() {
        let d = g.max_rel_diff(w);
        assert!(d <= 1e-5, "result {k} differs by {d} (budget {budget:?})");
    }
}

#[test]
fn auto_plan_without_budget_runs_like_the_unsharded_step() {
    check(None);
}

#[test]
fn auto_plan_under_a_memory_budget_runs_like_the_unsharded_step() {
    // Three copies of the parameters' bytes (parameters, gradients, new
    // parameters) plus 1 KiB for the step's scalars and small values: well
    // under the replicated step's peak, so the plan must shard.
    let cfg = mlp::MlpConfig { layers: 2, d: 16, h: 32, batch: 64, ..Default::default() };
    let params = 2 * 2 * cfg.d * cfg.h * 4;
    let budget = (params as u64) * 3 + 1024;
    let m = mlp::build(&cfg, &Shardings::new()).unwrap();
    let ts = build_train_step(&m, m.function("loss").unwrap(), &TrainConfig::default()).unwrap();
    let f = weft::compiler::inline_calls(&ts.module, "train_step").unwrap();
    let replicated = weft::compiler::memory::peak_live_bytes(&f).peak as u64;
    assert!(budget < replicated / 2, "budget {budget} B does not force sharding (replicated peak {replicated} B)");
    check(Some(budget));
}

//! Define your own model in Rust and train it on 8 CPU devices, with the
//! engine behind `weft train`: the residual MLP of
//! `examples/models/mlp.weft`, written with the builder, data- and
//! tensor-parallel on `data=2,model=4` by sharding rules.
//!
//! `cargo run --release --example train_own_model`

use weft::ir::builder::FunctionBuilder;
use weft::ir::{DType, Module};
use weft::runner::Line;
use weft::Trainer;

/// The model: two residual layers `h + relu(h @ w_up + b_up) @ w_down`, the
/// mean squared error as the loss and the mean absolute error as a metric.
pub fn module() -> weft::Result<Module> {
    let (batch, d, h) = (32, 16, 64);
    let f = FunctionBuilder::new("loss");
    let layers: Vec<_> = (0..2)
        .map(|i| {
            let p = |name: &str, shape: &[usize]| f.param(&format!("params.l{i}.{name}"), DType::F32, shape);
            (p("w_up", &[d, h]), p("b_up", &[h]), p("w_down", &[h, d]))
        })
        .collect();
    let x = f.param("x", DType::F32, &[batch, d]);
    let y = f.param("y", DType::F32, &[batch, d]);
    let mut hidden = x;
    for (w_up, b_up, w_down) in layers {
        let up = f.add(f.matmul(hidden, w_up), f.broadcast_to(b_up, &[batch, h]));
        hidden = f.add(hidden, f.matmul(f.relu(up), w_down));
    }
    let err = f.sub(hidden, y);
    let loss = f.mean_all(f.mul(err, err));
    let mae = f.name(f.mean_all(f.abs(err)), "mae");
    f.set_results(&[loss, mae]);
    Ok(Module { functions: vec![f.finish()?] })
}

/// The trainer: initialisation and sharding rules, optimizer and mesh, as
/// a config file's keys; metrics to `metrics` when given.
pub fn trainer_with_metrics(steps: u64, metrics: Option<&str>) -> weft::Result<Trainer> {
    let metrics = metrics.map(|m| format!("metrics = \"{m}\"\n")).unwrap_or_default();
    Trainer::new("residual-mlp", module()?)?.init(&[("params.*.b_up", "zeros"), ("params.*", "fan_in")])?.options(
        &format!(
            r#"
steps = {steps}
mesh = "data=2,model=4"
strategy = "fsdp_tp"
{metrics}
[shardings]
"params.*.w_up" = "[{{}}, {{model}}]"
"params.*.b_up" = "[{{model}}]"
"params.*.w_down" = "[{{model}}, {{}}]"

[optimizer]
kind = "adamw"
lr = 3e-3
"#
        ),
    )
}

/// [`trainer_with_metrics`] without a metrics file.
pub fn trainer(steps: u64) -> weft::Result<Trainer> {
    trainer_with_metrics(steps, None)
}

/// `train_own_model [STEPS] [METRICS.jsonl]` (also under `mpirun`: each
/// process runs its share of the 8 devices).
#[allow(dead_code)] // the tests include this file for `module` and `trainer`
fn main() -> weft::Result<()> {
    let mut args = std::env::args().skip(1);
    let steps = args.next().map(|s| s.parse().map_err(|e| weft::Error::Usage(format!("steps: {e}")))).transpose()?;
    let metrics = args.next();
    // Only the first process of an `mpirun` job is given lines to report.
    let mut reporting = false;
    let summary = trainer_with_metrics(steps.unwrap_or(50), metrics.as_deref())?.run(&mut |line| {
        reporting = true;
        match line {
            Line::Info(l) => println!("{l}"),
            Line::Warn(l) => eprintln!("warning: {l}"),
        }
    })?;
    if reporting {
        for (step, m) in summary.metrics.iter().step_by(10) {
            println!("step {step:3}  loss {:.6}  mae {:.4}", m["loss"], m["mae"]);
        }
        println!("{}", summary.last_line().unwrap_or_default());
    }
    Ok(())
}

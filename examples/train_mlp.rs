//! Trains the residual MLP on a fixed synthetic batch with the reference
//! interpreter, printing the loss every 10 steps.
//!
//! `cargo run --release --example train_mlp -- [steps] [layers]`

use weft::compiler::train::{build_train_step, Optimizer, Schedule, TrainConfig};
use weft::models::{mlp, Shardings};
use weft_ir::interp::Interpreter;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let steps: usize = args.next().map(|s| s.parse()).transpose()?.unwrap_or(200);
    let layers: usize = args.next().map(|s| s.parse()).transpose()?.unwrap_or(4);
    let cfg = mlp::MlpConfig { layers, d: 64, h: 256, batch: 32, ..Default::default() };
    let m = mlp::build(&cfg, &Shardings::new())?;
    let tc = TrainConfig { optimizer: Optimizer::adamw(), schedule: Schedule::Constant(3e-3), ..Default::default() };
    let step = build_train_step(&m, m.function("loss").expect("@loss"), &tc)?;
    println!(
        "residual MLP: {layers} layers, D={} H={} batch={}; train_step has {} instructions",
        cfg.d,
        cfg.h,
        cfg.batch,
        step.function().insts.len()
    );
    let interp = Interpreter::new(&step.module)?;
    let batch = mlp::synthetic_batch(&cfg, 0);
    let mut state = step.init_state(&mlp::init(&cfg, 0), 0, 1.0)?;
    let start = std::time::Instant::now();
    for i in 0..steps {
        let (next, metrics) = step.run_interp(&interp, &state, &batch)?;
        state = next;
        if i % 10 == 0 || i + 1 == steps {
            println!("step {i:4}  loss {:.6}  grad_norm {:.4}", metrics["loss"], metrics["grad_norm"]);
        }
    }
    let secs = start.elapsed().as_secs_f64();
    println!("{steps} steps in {secs:.2} s ({:.1} steps/s)", steps as f64 / secs);
    Ok(())
}

use weft::compiler::train::{build_train_step, TrainConfig, Optimizer};
use weft::models::{gpt, mlp, Shardings};
fn main() {
    let cfg = mlp::MlpConfig { layers: 4, d: 256, h: 1024, batch: 256, compute: weft::ir::DType::F32 };
    let m = mlp::build(&cfg, &Shardings::new()).unwrap();
    let step = build_train_step(&m, m.function("loss").unwrap(), &TrainConfig { optimizer: Optimizer::adamw(), ..Default::default() }).unwrap();
    let f = step.function();
    println!("mlp4: {} insts {} values", f.insts.len(), f.values.len());
    let gc = gpt::GptConfig { layers: 32, vocab: 256, seq: 64, d_model: 128, heads: 4, batch: 8, ..Default::default() };
    let m = gpt::build(&gc, &Shardings::new()).unwrap();
    let lf = weft::compiler::inline_calls(&m, "loss").unwrap();
    let m2 = weft::ir::Module { functions: vec![lf.clone()] };
    let t = std::time::Instant::now();
    let step = build_train_step(&m2, &lf, &TrainConfig { optimizer: Optimizer::adamw(), ..Default::default() }).unwrap();
    let f = step.function();
    println!("gpt32: {} insts {} values ({:?})", f.insts.len(), f.values.len(), t.elapsed());
    let mut counts = std::collections::BTreeMap::new();
    for i in &f.insts { *counts.entry(i.op.name()).or_insert(0) += 1; }
    println!("{:?}", counts);
}

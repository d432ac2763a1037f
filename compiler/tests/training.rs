//! Sharding a training step: the loss and its gradients (built by
//! `autodiff::value_and_grad`) under the classic strategies, annotating only
//! the parameters. Gradients must come out sharded like their primals (JAX
//! reference), with the communication Alpa's solver finds optimal for the
//! 2-layer MLP: data parallel all-reduces the weight gradients, Megatron
//! all-reduces one activation.
mod common;
use common::*;
use std::time::Instant;
use weft_compiler::autodiff::{value_and_grad, GradOptions};
use weft_compiler::sharding::{fmt_sharding, propagate, PropagateOptions, ShardedFunction};
use weft_ir::{BinaryOp, DType, DotDims, Function, Literal, Module, Op, ReduceOp, TensorType};

/// Alpa's 2-layer MLP: `loss = sum((relu(x@w1)@w2 - y)^2)`.
fn mlp(batch: usize, hidden: usize, x: Option<&str>, w1: Option<&str>, w2: Option<&str>) -> Function {
    let mut b = B::new("mlp");
    let xv = b.param("x", &[batch, hidden], x);
    let yv = b.param("y", &[batch, hidden], None);
    let w1v = b.param("w1", &[hidden, hidden], w1);
    let w2v = b.param("w2", &[hidden, hidden], w2);
    let h = b.op(Op::DotGeneral(DotDims::matmul()), &[xv, w1v]);
    let zero = b.op(Op::Constant(Literal::splat(TensorType::new(DType::F32, vec![batch, hidden]), 0.0)), &[]);
    let a = b.op(Op::Binary(BinaryOp::Max), &[h, zero]);
    let o = b.op(Op::DotGeneral(DotDims::matmul()), &[a, w2v]);
    let d = b.op(Op::Binary(BinaryOp::Sub), &[o, yv]);
    let sq = b.op(Op::Binary(BinaryOp::Mul), &[d, d]);
    let loss = b.op(Op::Reduce { op: ReduceOp::Sum, dims: vec![0, 1] }, &[sq]);
    b.ret(&[loss], &[None]);
    b.f
}

fn grads(f: &Function, wrt: &[&str]) -> Function {
    let m = Module { functions: vec![f.clone()] };
    value_and_grad(&m, f, wrt, &GradOptions::default()).expect("differentiable")
}

fn result_shardings(out: &ShardedFunction) -> Vec<String> {
    out.function.result_shardings.iter().map(|s| fmt_sharding(s.as_ref().unwrap())).collect()
}

fn count(out: &ShardedFunction, what: &str) -> usize {
    collectives(out).iter().filter(|c| c.starts_with(what)).count()
}

#[test]
fn data_parallel_all_reduces_weight_gradients() {
    let f = grads(&mlp(64, 16, Some("[{data}, {}]"), None, None), &["w1", "w2"]);
    let out = shard(&f, &mesh("data=4"));
    assert_eq!(result_shardings(&out), vec!["[]", "[{}, {}]", "[{}, {}]"]);
    // The two weight gradients and the loss.
    assert_eq!(count(&out, "all-reduce{data}"), 3, "{:?}\n{}", collectives(&out), dump(&out.function));
    assert_eq!(collectives(&out).len(), 3);
}

#[test]
fn megatron_all_reduces_one_activation() {
    let f = grads(&mlp(16, 64, None, Some("[{}, {model}]"), Some("[{model}, {}]")), &["w1", "w2"]);
    let out = shard(&f, &mesh("model=4"));
    // Gradients are sharded like their primals.
    assert_eq!(result_shardings(&out), vec!["[]", "[{}, {model}]", "[{model}, {}]"]);
    assert_eq!(collectives(&out), vec!["all-reduce{model}"], "{}", dump(&out.function));
}

// Alpa's forced ZeRO-3: weights all-gathered for use, gradients
// reduce-scattered into the weights' sharding, no gradient all-reduce.
#[test]
fn fsdp_gradients_are_sharded_like_their_weights() {
    let f = grads(&mlp(64, 16, Some("[{data}, {}]"), Some("[{data}, {}]"), Some("[{data}, {}]")), &["w1", "w2"]);
    let out = shard(&f, &mesh("data=4"));
    assert_eq!(result_shardings(&out), vec!["[]", "[{data}, {}]", "[{data}, {}]"]);
    assert_eq!(count(&out, "all-gather{data}"), 2, "{:?}\n{}", collectives(&out), dump(&out.function));
    assert_eq!(count(&out, "reduce-scatter{data}"), 2, "{:?}", collectives(&out));
    assert_eq!(count(&out, "all-reduce"), 1, "only the loss: {:?}", collectives(&out));
    assert_eq!(collectives(&out).len(), 5);
}

/// A 32-layer residual MLP training step (forward and backward).
#[test]
fn deep_training_step_scales() {
    let layers = 32;
    let mut b = B::new("deep");
    let x = b.param("x", &[64, 32], Some("[{data}, {}]"));
    let ws: Vec<_> = (0..layers)
        .map(|l| {
            (
                b.param(&format!("w1_{l}"), &[32, 128], Some("[{}, {model}]")),
                b.param(&format!("w2_{l}"), &[128, 32], Some("[{model}, {}]")),
            )
        })
        .collect();
    let mut h = x;
    for (w1, w2) in ws {
        let t = b.op(Op::DotGeneral(DotDims::matmul()), &[h, w1]);
        let a = b.op(Op::Unary(weft_ir::UnaryOp::Tanh), &[t]);
        let o = b.op(Op::DotGeneral(DotDims::matmul()), &[a, w2]);
        h = b.op(Op::Binary(BinaryOp::Add), &[h, o]);
    }
    let sq = b.op(Op::Binary(BinaryOp::Mul), &[h, h]);
    let loss = b.op(Op::Reduce { op: ReduceOp::Sum, dims: vec![0, 1] }, &[sq]);
    b.ret(&[loss], &[None]);
    let names: Vec<String> = (0..layers).flat_map(|l| [format!("w1_{l}"), format!("w2_{l}")]).collect();
    let wrt: Vec<&str> = names.iter().map(String::as_str).collect();
    let f = grads(&b.f, &wrt);
    let t0 = Instant::now();
    let out = propagate(&f, &mesh("data=2,model=2"), &PropagateOptions::default()).unwrap();
    println!("{} instructions in {:?}, {} visits", f.insts.len(), t0.elapsed(), out.stats.visits);
    out.check().unwrap();
    assert!(out.stats.converged);
    // Every gradient is sharded over model like its weight (and returned reduced over data).
    for (k, s) in result_shardings(&out).iter().enumerate().skip(1) {
        let want = if k % 2 == 1 { "[{}, {model}]" } else { "[{model}, {}]" };
        assert_eq!(s, want, "gradient {k}");
    }
}

#[test]
fn batch_annotations_reach_the_train_step() {
    use weft_compiler::train::{build_train_step, TrainConfig};
    use weft_ir::builder::FunctionBuilder;
    use weft_ir::{DType, Module, TensorSharding};
    let f = FunctionBuilder::new("loss");
    let w = f.param("params.w", DType::F32, &[4, 4]);
    let x = f.param_sharded("x", DType::F32, &[8, 4], TensorSharding::new(&[&["data"], &[]]));
    f.set_results(&[f.sum_all(f.matmul(x, w))]);
    let m = Module { functions: vec![f.finish().unwrap()] };
    let ts = build_train_step(&m, m.function("loss").unwrap(), &TrainConfig::default()).unwrap();
    let step = ts.function();
    let xv = step.value_by_name("x").unwrap();
    assert_eq!(step.value(xv).sharding, Some(TensorSharding::new(&[&["data"], &[]])));
}

//! A GPT-style transformer forward pass built by hand (layer norm,
//! multi-head attention with reshapes and transposes, softmax, MLP,
//! residuals) under data parallel + Megatron tensor parallel annotations on
//! the inputs and weights only. Megatron needs exactly two all-reduces per
//! layer (after the attention output projection and after the MLP); the
//! scale test checks propagation stays roughly linear.
mod common;
use common::*;
use std::time::Instant;
use weft_compiler::sharding::{propagate, PropagateOptions};
use weft_ir::{BinaryOp, DType, DotDims, Function, Literal, Op, ReduceOp, UnaryOp, ValueId};

const B_: usize = 8;
const T: usize = 16;
const D: usize = 64;
const NH: usize = 4;
const HD: usize = 16;
const F: usize = 256;

fn bcast(b: &mut B, v: ValueId, dims: &[usize], shape: &[usize]) -> ValueId {
    b.op(Op::BroadcastInDim { dims: dims.to_vec(), shape: shape.to_vec() }, &[v])
}

fn layer_norm(b: &mut B, x: ValueId) -> ValueId {
    let mean = b.op(Op::Reduce { op: ReduceOp::Sum, dims: vec![2] }, &[x]);
    let mb = bcast(b, mean, &[0, 1], &[B_, T, D]);
    let xc = b.op(Op::Binary(BinaryOp::Sub), &[x, mb]);
    let sq = b.op(Op::Binary(BinaryOp::Mul), &[xc, xc]);
    let var = b.op(Op::Reduce { op: ReduceOp::Sum, dims: vec![2] }, &[sq]);
    let vb = bcast(b, var, &[0, 1], &[B_, T, D]);
    let r = b.op(Op::Unary(UnaryOp::Rsqrt), &[vb]);
    b.op(Op::Binary(BinaryOp::Mul), &[xc, r])
}

fn proj(b: &mut B, x: ValueId, w: ValueId) -> ValueId {
    let dims = DotDims { lhs_batch: vec![], rhs_batch: vec![], lhs_contract: vec![2], rhs_contract: vec![0] };
    b.op(Op::DotGeneral(dims), &[x, w])
}

fn heads(b: &mut B, x: ValueId) -> ValueId {
    let r = b.op(Op::Reshape { shape: vec![B_, T, NH, HD] }, &[x]);
    b.op(Op::Transpose { perm: vec![0, 2, 1, 3] }, &[r])
}

/// One layer's weights (parameters must precede instructions).
fn weights(b: &mut B, l: usize) -> [ValueId; 6] {
    let mut w = |name: &str, shape: &[usize], s: &str| b.param(&format!("l{l}.{name}"), shape, Some(s));
    [
        w("wq", &[D, D], "[{}, {model}]"),
        w("wk", &[D, D], "[{}, {model}]"),
        w("wv", &[D, D], "[{}, {model}]"),
        w("wo", &[D, D], "[{model}, {}]"),
        w("w1", &[D, F], "[{}, {model}]"),
        w("w2", &[F, D], "[{model}, {}]"),
    ]
}

fn layer(b: &mut B, x: ValueId, [wq, wk, wv, wo, w1, w2]: [ValueId; 6]) -> ValueId {
    let ln = layer_norm(b, x);
    let (q, k, v) = (proj(b, ln, wq), proj(b, ln, wk), proj(b, ln, wv));
    let (q, k, v) = (heads(b, q), heads(b, k), heads(b, v));
    let qk = DotDims { lhs_batch: vec![0, 1], rhs_batch: vec![0, 1], lhs_contract: vec![3], rhs_contract: vec![3] };
    let s = b.op(Op::DotGeneral(qk), &[q, k]);
    let m = b.op(Op::Reduce { op: ReduceOp::Max, dims: vec![3] }, &[s]);
    let mb = bcast(b, m, &[0, 1, 2], &[B_, NH, T, T]);
    let e = b.op(Op::Binary(BinaryOp::Sub), &[s, mb]);
    let e = b.op(Op::Unary(UnaryOp::Exp), &[e]);
    let z = b.op(Op::Reduce { op: ReduceOp::Sum, dims: vec![3] }, &[e]);
    let zb = bcast(b, z, &[0, 1, 2], &[B_, NH, T, T]);
    let p = b.op(Op::Binary(BinaryOp::Div), &[e, zb]);
    let pv = DotDims { lhs_batch: vec![0, 1], rhs_batch: vec![0, 1], lhs_contract: vec![3], rhs_contract: vec![2] };
    let o = b.op(Op::DotGeneral(pv), &[p, v]);
    let o = b.op(Op::Transpose { perm: vec![0, 2, 1, 3] }, &[o]);
    let o = b.op(Op::Reshape { shape: vec![B_, T, D] }, &[o]);
    let o = proj(b, o, wo);
    let x = b.op(Op::Binary(BinaryOp::Add), &[x, o]);
    let ln = layer_norm(b, x);
    let h = proj(b, ln, w1);
    let zero = b.op(Op::Constant(Literal::scalar(DType::F32, 0.0)), &[]);
    let zero = bcast(b, zero, &[], &[B_, T, F]);
    let a = b.op(Op::Binary(BinaryOp::Max), &[h, zero]);
    let o = proj(b, a, w2);
    b.op(Op::Binary(BinaryOp::Add), &[x, o])
}

fn gpt(layers: usize) -> Function {
    let mut b = B::new("gpt");
    let mut x = b.param("tokens", &[B_, T, D], Some("[{data}, {}, {}]"));
    let ws: Vec<[ValueId; 6]> = (0..layers).map(|l| weights(&mut b, l)).collect();
    for w in ws {
        x = layer(&mut b, x, w);
    }
    let s = b.op(Op::Reduce { op: ReduceOp::Sum, dims: vec![0, 1, 2] }, &[x]);
    b.ret(&[s], &[None]);
    b.f
}

#[test]
fn megatron_attention_and_mlp() {
    let f = gpt(4);
    let out = shard(&f, &mesh("data=2,model=2"));
    let colls = collectives(&out);
    let model_ar = colls.iter().filter(|c| *c == "all-reduce{model}").count();
    assert_eq!(model_ar, 2 * 4, "{colls:?}\n{}", dump(&out.function));
    // Plus the final loss reduction over the batch shards; nothing else.
    assert_eq!(colls.len(), 2 * 4 + 1, "{colls:?}");
    assert_eq!(colls.last().map(String::as_str), Some("all-reduce{data}"));
    // Attention scores are split over batch (data) and heads (model).
    let scores = out.function.insts.iter().find(|i| out.function.ty(i.results[0]).shape == vec![B_, NH, T, T]).unwrap();
    let sh = out.function.value(scores.results[0]).sharding.clone().unwrap();
    assert_eq!(weft_compiler::sharding::fmt_sharding(&sh), "[{data}, {model}, {}, {}]");
}

#[test]
fn scales_roughly_linearly() {
    let m = mesh("data=2,model=2");
    let small = gpt(8);
    let big = gpt(96);
    let t0 = Instant::now();
    let a = propagate(&small, &m, &PropagateOptions::default()).unwrap();
    let t_small = t0.elapsed();
    let t0 = Instant::now();
    let c = propagate(&big, &m, &PropagateOptions::default()).unwrap();
    let t_big = t0.elapsed();
    println!("{} insts: {t_small:?}; {} insts: {t_big:?}", small.insts.len(), big.insts.len());
    assert!(a.stats.converged && c.stats.converged);
    // Visits grow linearly with the program (about 3 per instruction here).
    let per_inst =
        |s: &weft_compiler::sharding::ShardedFunction, f: &Function| s.stats.visits as f64 / f.insts.len() as f64;
    assert!(per_inst(&c, &big) < 6.0, "{} visits per instruction", per_inst(&c, &big));
    assert!((per_inst(&c, &big) - per_inst(&a, &small)).abs() < 1.0);
    c.check().unwrap();
}

//! A residual MLP forward pass and loss, built with the core API, under the
//! four classic strategies (data parallel, Megatron tensor parallel, FSDP,
//! FSDP+TP), each with only the parameters annotated. Shapes: batch 16,
//! model 8, hidden 32; mesh data=2, model=2.
mod common;
use common::*;
use weft_compiler::sharding::{propagate, PropagateOptions, ShardedFunction};
use weft_ir::{BinaryOp, DType, DotDims, Function, Literal, Op, ReduceOp, TensorType, ValueId};

struct Mlp {
    f: Function,
    h: ValueId,
    o: ValueId,
    loss: ValueId,
}

/// `h = x@w1; a = max(h, 0); o = a@w2; r = x + o; loss = sum((r - y)^2) / n`.
fn mlp(x: Option<&str>, w1: Option<&str>, w2: Option<&str>) -> Mlp {
    let mut b = B::new("mlp");
    let xv = b.param("x", &[16, 8], x);
    let yv = b.param("y", &[16, 8], None);
    let w1v = b.param("w1", &[8, 32], w1);
    let w2v = b.param("w2", &[32, 8], w2);
    let h = b.named(Some("h"), Op::DotGeneral(DotDims::matmul()), &[xv, w1v]);
    let zero = b.op(Op::Constant(Literal::splat(TensorType::new(DType::F32, vec![16, 32]), 0.0)), &[]);
    let a = b.named(Some("a"), Op::Binary(BinaryOp::Max), &[h, zero]);
    let o = b.named(Some("o"), Op::DotGeneral(DotDims::matmul()), &[a, w2v]);
    let r = b.named(Some("r"), Op::Binary(BinaryOp::Add), &[xv, o]);
    let d = b.op(Op::Binary(BinaryOp::Sub), &[r, yv]);
    let sq = b.op(Op::Binary(BinaryOp::Mul), &[d, d]);
    let s = b.op(Op::Reduce { op: ReduceOp::Sum, dims: vec![0, 1] }, &[sq]);
    let n = b.op(Op::Constant(Literal::scalar(DType::F32, 1.0 / 128.0)), &[]);
    let loss = b.named(Some("loss"), Op::Binary(BinaryOp::Mul), &[s, n]);
    b.ret(&[loss], &[None]);
    Mlp { f: b.f, h, o, loss }
}

fn run(m: &Mlp) -> ShardedFunction {
    shard(&m.f, &mesh("data=2,model=2"))
}

fn by_name(out: &ShardedFunction, name: &str) -> String {
    weft_compiler::sharding::fmt_sharding(out.sharding_of(name).expect("named value"))
}

#[test]
fn data_parallel() {
    let m = mlp(Some("[{data}, {}]"), None, None);
    let out = run(&m);
    assert_eq!(fin(&out, m.h), "[{data}, {}]");
    assert_eq!(by_name(&out, "y"), "[{data}, {}]", "the target gets the batch sharding backward");
    assert_eq!(by_name(&out, "w1"), "[{}, {}]");
    assert_eq!(fin(&out, m.o), "[{data}, {}]");
    assert_eq!(fin(&out, m.loss), "[]");
    // One all-reduce: the partial loss sum over the batch shards.
    assert_eq!(collectives(&out), vec!["all-reduce{data}"], "{}", dump(&out.function));
}

#[test]
fn megatron_tensor_parallel() {
    let m = mlp(None, Some("[{}, {model}]"), Some("[{model}, {}]"));
    let out = run(&m);
    assert_eq!(fin(&out, m.h), "[{}, {model}]");
    assert_eq!(by_name(&out, "a"), "[{}, {model}]");
    assert_eq!(fin(&out, m.o), "[{}, {}] unreduced {model}");
    assert_eq!(by_name(&out, "x"), "[{}, {}]");
    // Megatron: exactly one all-reduce of the activations.
    assert_eq!(collectives(&out), vec!["all-reduce{model}"], "{}", dump(&out.function));
    assert_eq!(out.reshards[0].source, m.o);
}

#[test]
fn fsdp_gathers_weights() {
    let m = mlp(Some("[{data}, {}]"), Some("[{data}, {}]"), Some("[{data}, {}]"));
    let out = run(&m);
    assert_eq!(fin(&out, m.h), "[{data}, {}]");
    assert_eq!(fin(&out, m.o), "[{data}, {}]");
    assert_eq!(
        collectives(&out),
        vec!["all-gather{data} dim 0", "all-gather{data} dim 0", "all-reduce{data}"],
        "{}",
        dump(&out.function)
    );
    let gathered: Vec<ValueId> = out.reshards.iter().take(2).map(|r| r.source).collect();
    assert_eq!(gathered, vec![out.source.params[2], out.source.params[3]]);
}

#[test]
fn fsdp_plus_tensor_parallel() {
    let m = mlp(Some("[{data}, {}]"), Some("[{data}, {model}]"), Some("[{model}, {data}]"));
    let out = run(&m);
    assert_eq!(fin(&out, m.h), "[{data}, {model}]");
    assert_eq!(fin(&out, m.o), "[{data}, {}] unreduced {model}");
    assert_eq!(
        collectives(&out),
        vec!["all-gather{data} dim 0", "all-gather{data} dim 1", "all-reduce{model}", "all-reduce{data}"],
        "{}",
        dump(&out.function)
    );
}

#[test]
fn names_ids_and_mapping() {
    let m = mlp(Some("[{data}, {}]"), Some("[{data}, {}]"), Some("[{data}, {}]"));
    let out = run(&m);
    let f = &out.function;
    // Every value annotated and closed; ids in definition order.
    for (i, v) in f.values.iter().enumerate() {
        let s = v.sharding.as_ref().unwrap_or_else(|| panic!("%{i} has no sharding"));
        assert!(s.dims.iter().all(|d| !d.open));
    }
    weft_ir::verify_function(&weft_ir::Module::new(), f).expect("output verifies");
    for name in ["x", "y", "w1", "w2", "h", "a", "o", "r", "loss"] {
        let old = out.source.value_by_name(name).unwrap();
        assert_eq!(f.value_by_name(name), Some(out.new_id(old)), "{name}");
    }
    assert_eq!(f.result_shardings, vec![Some(s("[]"))]);
}

#[test]
fn propagation_is_deterministic() {
    for (x, w1, w2) in [
        (Some("[{data}, {}]"), None, None),
        (None, Some("[{}, {model}]"), Some("[{model}, {}]")),
        (Some("[{data}, {}]"), Some("[{data}, {model}]"), Some("[{model}, {data}]")),
    ] {
        let m = mlp(x, w1, w2);
        let a = propagate(&m.f, &mesh("data=2,model=2"), &PropagateOptions::default()).unwrap();
        let b = propagate(&m.f, &mesh("data=2,model=2"), &PropagateOptions::default()).unwrap();
        assert_eq!(a.function, b.function);
        assert_eq!(a.shardings, b.shardings);
        assert_eq!(a.origins, b.origins);
        assert_eq!(a.resolutions, b.resolutions);
        assert_eq!(a.notes, b.notes);
        assert_eq!(a.reshards, b.reshards);
        assert_eq!(a.stats, b.stats);
        assert!(a.stats.converged);
    }
}

#[test]
fn explanation_chains_reach_the_annotations() {
    let m = mlp(None, Some("[{}, {model}]"), Some("[{model}, {}]"));
    let out = run(&m);
    let text = out.explain_text(m.h);
    assert_eq!(
        text,
        "%w1: [{}, {model}] <- user annotation on parameter 2\n\
         %h: [{}, {model}] (dim 1) <- forward through `%h = dot_general` from %w1\n"
    );
    let steps = out.explain(out.source.value_by_name("a").unwrap());
    assert_eq!(steps.len(), 3);
    assert!(steps[2].detail.starts_with("forward through `%a = max` from %h"), "{}", steps[2]);
    let x = out.source.value_by_name("x").unwrap();
    assert_eq!(out.explain_text(x), "%x: [{}, {}] <- no annotation reaches it: not split\n");
}

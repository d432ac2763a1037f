//! Composite helpers build verified IR with the expected types, expand into
//! the expected primitives, and compose into whole models.

use weft_ir::builder::{FunctionBuilder, ModuleBuilder, Value};
use weft_ir::DType::{F32, I32, U32};
use weft_ir::{Function, Op};

fn finish(f: FunctionBuilder, expected: &[(Value, &str)]) -> Function {
    for (i, (v, want)) in expected.iter().enumerate() {
        assert_eq!(f.ty(*v).to_string(), *want, "value {i}");
    }
    f.set_results(&expected.iter().map(|(v, _)| *v).collect::<Vec<_>>());
    f.finish().unwrap_or_else(|e| panic!("{e}"))
}

fn op_names(func: &Function) -> Vec<&'static str> {
    func.insts.iter().map(|i| i.op.name()).collect()
}

#[test]
fn activations_and_reductions() {
    let f = FunctionBuilder::new("a");
    let x = f.param("x", F32, &[4, 5, 6]);
    let out = vec![
        (f.relu(x), "f32[4,5,6]"),
        (f.gelu(x), "f32[4,5,6]"),
        (f.sigmoid(x), "f32[4,5,6]"),
        (f.silu(x), "f32[4,5,6]"),
        (f.softplus(x), "f32[4,5,6]"),
        (f.softmax(x, -1), "f32[4,5,6]"),
        (f.log_softmax(x, 1), "f32[4,5,6]"),
        (f.logsumexp(x, &[0, -1], false), "f32[5]"),
        (f.logsumexp(x, &[1], true), "f32[4,1,6]"),
        (f.sum(x, &[-1, 0], false), "f32[5]"),
        (f.sum(x, &[1], true), "f32[4,1,6]"),
        (f.max(x, &[2], false), "f32[4,5]"),
        (f.min(x, &[0], true), "f32[1,5,6]"),
        (f.mean(x, &[0, 1], false), "f32[6]"),
        (f.sum_all(x), "f32[]"),
        (f.mean_all(x), "f32[]"),
        (f.variance(x, &[-1], true), "f32[4,5,1]"),
        (f.argmax(x, -1), "i32[4,5]"),
        (f.argmin(x, 0), "i32[5,6]"),
    ];
    let func = finish(f, &out);
    let names = op_names(&func);
    assert!(names.contains(&"logistic") && names.contains(&"tanh") && names.contains(&"log1p"));
}

#[test]
fn softmax_is_max_shifted() {
    let f = FunctionBuilder::new("s");
    let x = f.param("x", F32, &[2, 3]);
    let y = f.softmax(x, -1);
    let func = finish(f, &[(y, "f32[2,3]")]);
    let names = op_names(&func);
    let (m, e) = (names.iter().position(|&n| n == "reduce_max"), names.iter().position(|&n| n == "exp"));
    assert!(m.unwrap() < e.unwrap(), "{names:?}");
    assert!(names.contains(&"is_finite"), "the shift guards against -inf rows: {names:?}");
    assert_eq!(names.last(), Some(&"div"));
}

#[test]
fn normalization() {
    let f = FunctionBuilder::new("n");
    let x = f.param("x", F32, &[2, 3, 8]);
    let g = f.param("g", F32, &[8]);
    let b = f.param("b", F32, &[8]);
    let g3 = f.param("g3", F32, &[3]);
    let out = vec![
        (f.layer_norm(x, Some(g), Some(b), -1, 1e-5), "f32[2,3,8]"),
        (f.layer_norm(x, None, None, 2, 1e-5), "f32[2,3,8]"),
        (f.layer_norm(x, Some(g3), None, 1, 1e-5), "f32[2,3,8]"),
        (f.rms_norm(x, Some(g), -1, 1e-6), "f32[2,3,8]"),
    ];
    let func = finish(f, &out);
    // gamma over axis 1 is laid along dimension 1.
    assert!(func.insts.iter().any(|i| i.op == Op::BroadcastInDim { dims: vec![1], shape: vec![2, 3, 8] }));
}

#[test]
fn matmul_follows_numpy() {
    let cases: &[(&[usize], &[usize], &str)] = &[
        (&[3], &[3], "f32[]"),
        (&[2, 3], &[3], "f32[2]"),
        (&[3], &[3, 4], "f32[4]"),
        (&[2, 3], &[3, 4], "f32[2,4]"),
        (&[5, 2, 3], &[3, 4], "f32[5,2,4]"),
        (&[2, 3], &[5, 3, 4], "f32[5,2,4]"),
        (&[3], &[5, 3, 4], "f32[5,4]"),
        (&[5, 2, 3], &[3], "f32[5,2]"),
        (&[5, 2, 3], &[5, 3, 4], "f32[5,2,4]"),
        (&[6, 1, 2, 3], &[5, 3, 4], "f32[6,5,2,4]"),
    ];
    for (a, b, want) in cases {
        let f = FunctionBuilder::new("mm");
        let x = f.param("a", F32, a);
        let y = f.param("b", F32, b);
        let z = f.matmul(x, y);
        let func = finish(f, &[(z, want)]);
        let dots = func.insts.iter().filter(|i| matches!(i.op, Op::DotGeneral(_))).count();
        assert_eq!(dots, 1, "{a:?} @ {b:?}");
        if b.len() == 2 || b.len() == 1 {
            assert_eq!(func.insts.len(), 1, "a weight or vector rhs is contracted directly: {a:?} @ {b:?}");
        }
    }
}

#[test]
fn linear_one_hot_embedding_mask() {
    let f = FunctionBuilder::new("l");
    let x = f.param("x", F32, &[4, 7, 16]);
    let w = f.param("w", F32, &[16, 8]);
    let b = f.param("b", F32, &[8]);
    let ids = f.param("ids", I32, &[4, 7]);
    let uids = f.param("uids", U32, &[3]);
    let table = f.param("table", F32, &[50, 16]);
    let out = vec![
        (f.linear(x, w, Some(b)), "f32[4,7,8]"),
        (f.linear(x, w, None), "f32[4,7,8]"),
        (f.one_hot(ids, 10, F32), "f32[4,7,10]"),
        (f.one_hot(uids, 4, I32), "i32[3,4]"),
        (f.embedding(ids, table), "f32[4,7,16]"),
        (f.causal_mask(5), "bool[5,5]"),
    ];
    let func = finish(f, &out);
    let names = op_names(&func);
    for n in ["iota", "eq", "convert", "dot_general", "ge"] {
        assert!(names.contains(&n), "{n} missing from {names:?}");
    }
}

#[test]
fn attention_and_clip() {
    let f = FunctionBuilder::new("att");
    let q = f.param("q", F32, &[2, 4, 8, 16]);
    let k = f.param("k", F32, &[2, 4, 8, 16]);
    let v = f.param("v", F32, &[2, 4, 8, 32]);
    let k2 = f.param("k2", F32, &[2, 4, 5, 16]);
    let v2 = f.param("v2", F32, &[2, 4, 5, 32]);
    let out = vec![
        (f.dot_product_attention(q, k, v, true), "f32[2,4,8,32]"),
        (f.dot_product_attention(q, k2, v2, false), "f32[2,4,8,32]"),
        (f.clip(q, -1.0, 1.0), "f32[2,4,8,16]"),
    ];
    let func = finish(f, &out);
    let selects = func.insts.iter().filter(|i| i.op == Op::Select).count();
    // softmax's guarded shift uses one select each; the causal mask adds one.
    assert_eq!(selects, 3);
}

#[test]
fn losses_and_metrics() {
    let f = FunctionBuilder::new("loss");
    let logits = f.param("logits", F32, &[8, 10]);
    let labels = f.param("labels", I32, &[8]);
    let seq_logits = f.param("seq_logits", F32, &[2, 5, 10]);
    let seq_labels = f.param("seq_labels", I32, &[2, 5]);
    let pred = f.param("pred", F32, &[8, 3]);
    let target = f.param("target", F32, &[8, 3]);
    let out = vec![
        (f.softmax_cross_entropy(logits, labels), "f32[]"),
        (f.softmax_cross_entropy(seq_logits, seq_labels), "f32[]"),
        (f.mse(pred, target), "f32[]"),
        (f.accuracy(logits, labels), "f32[]"),
    ];
    finish(f, &out);
}

/// The residual MLP of the training-parity reference case, as a model
/// author would write it.
#[test]
fn residual_mlp_model() {
    let (batch, hidden, layers) = (16, 32, 2);
    let f = FunctionBuilder::new("residual_mlp");
    let x = f.param("x", F32, &[batch, hidden]);
    let y = f.param("y", F32, &[batch, hidden]);
    let mut h = x;
    for l in 0..layers {
        let w1 = f.param(&format!("params.layers.{l}.w1"), F32, &[hidden, hidden]);
        let w2 = f.param(&format!("params.layers.{l}.w2"), F32, &[hidden, hidden]);
        h = f.add(h, f.matmul(f.relu(f.matmul(h, w1)), w2));
    }
    let loss = f.name(f.mse(h, y), "loss");
    let func = finish(f, &[(loss, "f32[]")]);
    assert_eq!(func.params.len(), 2 + 2 * layers);
}

/// One pre-norm GPT block (causal self-attention + MLP) calling a helper
/// function through a module.
#[test]
fn gpt_block_module() {
    let (b, t, d, heads, vocab) = (2, 8, 16, 2, 32);
    let hd = d / heads;
    let mut mb = ModuleBuilder::new();
    mb.define("mlp", |f| {
        let x = f.param("x", F32, &[b, t, d]);
        let w1 = f.param("w1", F32, &[d, 4 * d]);
        let w2 = f.param("w2", F32, &[4 * d, d]);
        vec![f.linear(f.gelu(f.linear(x, w1, None)), w2, None)]
    });
    mb.define("gpt", |f| {
        let ids = f.param("ids", I32, &[b, t]);
        let targets = f.param("targets", I32, &[b, t]);
        let wte = f.param("wte", F32, &[vocab, d]);
        let wqkv = f.param("wqkv", F32, &[d, 3 * d]);
        let wo = f.param("wo", F32, &[d, d]);
        let (g, beta) = (f.param("ln.g", F32, &[d]), f.param("ln.b", F32, &[d]));
        let (w1, w2) = (f.param("w1", F32, &[d, 4 * d]), f.param("w2", F32, &[4 * d, d]));
        let x = f.embedding(ids, wte);
        let h = f.layer_norm(x, Some(g), Some(beta), -1, 1e-5);
        let qkv = f.linear(h, wqkv, None);
        let heads_of = |v: Value| f.transpose(f.reshape(v, &[b, t, heads, hd]), &[0, 2, 1, 3]);
        let [q, k, v] = <[Value; 3]>::try_from(f.split(qkv, -1, 3)).unwrap();
        let (q, k, v) = (heads_of(q), heads_of(k), heads_of(v));
        let scores = f.mul_scalar(f.matmul(q, f.swap_axes(k, -1, -2)), 1.0 / (hd as f64).sqrt());
        let scores = f.masked_fill(scores, f.not(f.causal_mask(t)), f64::NEG_INFINITY);
        let att = f.matmul(f.softmax(scores, -1), v);
        let att = f.reshape(f.transpose(att, &[0, 2, 1, 3]), &[b, t, d]);
        let x = f.add(x, f.linear(att, wo, None));
        let [m] = f.call_n("mlp", &[f.layer_norm(x, None, None, -1, 1e-5), w1, w2]);
        let x = f.add(x, m);
        let logits = f.matmul(x, f.transpose(wte, &[1, 0]));
        assert_eq!(f.ty(logits).to_string(), "f32[2,8,32]");
        vec![f.softmax_cross_entropy(logits, targets), f.accuracy(logits, targets)]
    });
    let m = mb.finish().unwrap_or_else(|e| panic!("{e}"));
    // What the builder makes prints and parses back to the same module.
    let text = weft_ir::text::print_module(&m);
    let parsed = weft_ir::text::parse_and_verify(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(weft_ir::text::print_module(&parsed), text);
    let gpt = m.function("gpt").unwrap();
    assert_eq!(gpt.result_types().iter().map(|t| t.to_string()).collect::<Vec<_>>(), ["f32[]", "f32[]"]);
    assert!(gpt.insts.iter().any(|i| i.op == Op::Call { callee: "mlp".into(), remat: false }));
}

//! Sticky builder errors: the first error is reported by `finish` with the
//! op name and this file's `file:line`; later calls return placeholders and
//! add nothing; no method panics on bad input.

use weft_ir::builder::{FunctionBuilder, ModuleBuilder, Value};
use weft_ir::DType::{Bool, F32, I32};
use weft_ir::{DotDims, IrError, Literal, ReduceOp, TensorSharding, TensorType, UnaryOp};

fn err(f: FunctionBuilder) -> String {
    match f.finish() {
        Err(IrError::Builder(m)) => m,
        other => panic!("expected a builder error, got {other:?}"),
    }
}

fn at(line: u32) -> String {
    format!("builder_errors.rs:{line}:")
}

#[test]
fn first_error_is_sticky_and_located() {
    let f = FunctionBuilder::new("f");
    let x = f.param("x", F32, &[3]);
    let y = f.param("y", F32, &[4]);
    let line = line!() + 1;
    let z = f.add(x, y);
    assert!(z.is_placeholder());
    let w = f.reshape(x, &[7]); // a second mistake: not recorded
    assert!(w.is_placeholder());
    let ok = f.exp(x); // even valid calls return placeholders now
    assert!(ok.is_placeholder());
    f.set_results(&[ok]);
    let m = err(f);
    assert!(m.contains("`add`"), "{m}");
    assert!(m.contains(&at(line)), "{m}");
    assert!(m.contains("f32[3] and f32[4] cannot be broadcast"), "{m}");
    assert!(m.starts_with("@f: "), "{m}");
    assert!(!m.contains("reshape"), "{m}");
}

#[test]
fn primitive_errors_come_from_infer() {
    let f = FunctionBuilder::new("f");
    let x = f.param("x", F32, &[2, 3]);
    let line = line!() + 1;
    f.transpose(x, &[0, 0]);
    let m = err(f);
    assert!(m.contains("`transpose`") && m.contains(&at(line)) && m.contains("not a permutation"), "{m}");
}

#[test]
fn composite_errors_name_the_composite() {
    let f = FunctionBuilder::new("f");
    let i = f.param("i", I32, &[2, 3]);
    let line = line!() + 1;
    f.softmax(i, -1);
    let m = err(f);
    assert!(m.contains("`softmax` at") && m.contains(&at(line)) && m.contains("float"), "{m}");

    // An inner primitive failing inside a composite names both.
    let f = FunctionBuilder::new("f");
    let a = f.param("a", F32, &[2, 3]);
    let b = f.param("b", I32, &[3, 4]);
    let line = line!() + 1;
    f.matmul(a, b);
    let m = err(f);
    assert!(m.contains("`dot_general` in `matmul`") && m.contains(&at(line)), "{m}");

    // Nested composites report the outermost one.
    let f = FunctionBuilder::new("f");
    let ids = f.param("ids", F32, &[4]);
    let table = f.param("table", F32, &[10, 3]);
    let line = line!() + 1;
    f.embedding(ids, table);
    let m = err(f);
    assert!(m.contains("`gather` in `embedding`") && m.contains(&at(line)), "{m}");
}

#[test]
fn composite_input_checks() {
    type Build = Box<dyn Fn(&FunctionBuilder, Value) -> Value>;
    let cases: Vec<(&str, Build)> = vec![
        ("axis 2 is out of range", Box::new(|f, x| f.softmax(x, 2))),
        ("name a dimension of f32[2,3] twice", Box::new(|f, x| f.sum(x, &[1, -1], false))),
        ("gamma must be f32[3]", Box::new(|f, x| f.layer_norm(x, Some(f.zeros(F32, &[2])), None, -1, 1e-5))),
        ("needs x[..., in] and w[in, out]", Box::new(|f, x| f.linear(x, f.zeros(F32, &[2, 3]), None))),
        ("bias must be [5]", Box::new(|f, x| f.linear(x, f.zeros(F32, &[3, 5]), Some(f.zeros(F32, &[3]))))),
        ("contracting extents differ", Box::new(|f, x| f.matmul(x, x))),
        ("cannot broadcast f32[2,3] to shape [3]", Box::new(|f, x| f.broadcast_to(x, &[3]))),
        ("cannot be split into 2", Box::new(|f, x| f.split(x, 1, 2)[0])),
        ("extent 2, not 1", Box::new(|f, x| f.squeeze(x, &[0]))),
        ("labels must be i32 or u32", Box::new(|f, x| f.one_hot(x, 3, F32))),
        ("same leading shape", Box::new(|f, x| f.softmax_cross_entropy(x, f.zeros(I32, &[3])))),
        ("predicate must be bool", Box::new(|f, x| f.select(x, x, x))),
        ("different dtypes", Box::new(|f, x| f.mul(x, f.zeros(I32, &[3])))),
        ("the key must be u32[2], got f32[2,3]", Box::new(|f, x| f.random_uniform(x, F32, &[2]))),
        ("the rate 1 is outside [0, 1)", Box::new(|f, x| f.dropout(x, f.zeros(weft_ir::DType::U32, &[2]), 1.0))),
        (
            "needs a float dtype, got i32",
            Box::new(|f, _| f.random_normal(f.zeros(weft_ir::DType::U32, &[2]), I32, &[2])),
        ),
        (
            "(causal T == T')",
            Box::new(|f, x| f.dot_product_attention(x, f.zeros(F32, &[4, 3]), f.zeros(F32, &[4, 3]), true)),
        ),
        (
            "dense constant of type f32[2] needs 2 values",
            Box::new(|f, _| f.dense(TensorType::new(F32, vec![2]), vec![1.0])),
        ),
    ];
    for (want, build) in cases {
        let f = FunctionBuilder::new("f");
        let x = f.param("x", F32, &[2, 3]);
        assert!(build(&f, x).is_placeholder(), "{want}");
        let m = err(f);
        assert!(m.contains(want), "expected `{want}` in: {m}");
    }
}

#[test]
fn names_shardings_and_results() {
    let f = FunctionBuilder::new("f");
    f.param("x", F32, &[2]);
    let line = line!() + 1;
    f.param("x", F32, &[2]);
    let m = err(f);
    assert!(m.contains("`param`") && m.contains("`%x` is already used") && m.contains(&at(line)), "{m}");

    let f = FunctionBuilder::new("f");
    let x = f.param("x", F32, &[2]);
    f.name(x, "12");
    assert!(err(f).contains("`12` is not a valid value name"));

    let f = FunctionBuilder::new("f");
    f.param_sharded("x", F32, &[2], TensorSharding::new(&[&["a"], &["b"]]));
    assert!(err(f).contains("has rank 2 but its type is f32[2]"));

    let f = FunctionBuilder::new("f");
    let x = f.param("x", F32, &[2]);
    f.set_results(&[x]);
    f.set_result_shardings(&[None, None]);
    assert!(err(f).contains("2 result shardings for 1 results"));

    let f = FunctionBuilder::new("f");
    f.param("x", F32, &[2]);
    assert!(err(f).contains("no results were set"));

    let f = FunctionBuilder::new("bad name");
    assert!(err(f).contains("not a valid function name"));
}

#[test]
fn values_of_another_builder_are_rejected() {
    let g = FunctionBuilder::new("g");
    let foreign = g.param("x", F32, &[2]);
    let f = FunctionBuilder::new("f");
    let x = f.param("x", F32, &[2]);
    let line = line!() + 1;
    f.add(x, foreign);
    let m = err(f);
    assert!(m.contains("another function builder") && m.contains(&at(line)), "{m}");
}

#[test]
fn calls_and_modules() {
    let mut mb = ModuleBuilder::new();
    mb.define("g", |f| {
        let x = f.param("x", F32, &[2]);
        vec![f.exp(x), f.neg(x)]
    });
    let f = mb.function("f");
    let x = f.param("x", F32, &[2]);
    let line = line!() + 1;
    let [a] = f.call_n("g", &[x]);
    assert!(a.is_placeholder());
    let m = err(f);
    assert!(m.contains("`call` at") && m.contains(&at(line)) && m.contains("@g returns 2 result(s), not 1"), "{m}");

    let f = mb.function("f");
    let i = f.param("i", I32, &[2]);
    let r = f.call("g", &[i]);
    assert_eq!(r.len(), 2, "one placeholder per callee result");
    assert!(err(f).contains("argument 0 of @g must be f32[2], got i32[2]"));

    let f = mb.function("f");
    f.call("nope", &[]);
    assert!(err(f).contains("call to unknown function @nope"));

    // A failing function makes the module fail; later functions are ignored.
    let mut mb2 = ModuleBuilder::new();
    mb2.define("h", |f| vec![f.sqrt(f.param("i", I32, &[]))]);
    mb2.define("k", |f| vec![f.param("x", F32, &[])]);
    let e = mb2.finish().unwrap_err().to_string();
    assert!(e.contains("@h: `sqrt`") && e.contains("builder_errors.rs"), "{e}");

    let line = line!() + 1;
    mb.define("g", |f| vec![f.param("x", F32, &[])]);
    let e = mb.finish().unwrap_err().to_string();
    assert!(e.contains("@g: a function of that name was already added") && e.contains(&at(line)), "{e}");
}

/// Calls every method with the given inputs; must never panic.
fn exercise(f: &FunctionBuilder, x: Value, i: Value, p: Value) {
    let s = TensorSharding::new(&[&["d"], &[]]);
    let _ = (f.ty(x), f.shape(x), f.dtype(x), f.rank(x), f.name(x, "xx"));
    let _ = (f.constant(Literal::scalar(F32, 1.0)), f.scalar(F32, 1.0), f.full(F32, &[2], 1.0), f.zeros(F32, &[1]));
    let _ = (f.ones(F32, &[1]), f.full_like(x, 2.0), f.zeros_like(x), f.ones_like(x), f.iota(I32, &[2], 0));
    let _ = (f.dense(TensorType::new(F32, vec![1]), vec![1.0]), f.arange(F32, 3), f.unary(UnaryOp::Exp, x));
    let _ = (f.neg(x), f.exp(x), f.not(p), f.is_finite(x), f.add(x, x), f.maximum(x, i), f.lt(x, x));
    let _ = (f.add_scalar(x, 1.0), f.rsub_scalar(1.0, x), f.square(x), f.select(p, x, x), f.masked_fill(x, p, 0.0));
    let _ = (f.convert(x, I32), f.broadcast_in_dim(x, &[2], &[0]), f.broadcast_to(x, &[4, 2, 3]), f.reshape(x, &[6]));
    let _ = (f.transpose(x, &[1, 0]), f.swap_axes(x, 0, 1), f.expand_dims(x, -1), f.squeeze(x, &[]));
    let _ = (f.slice(x, &[0, 0], &[1, 1]), f.slice_axis(x, 1, 0, 1), f.split(x, 0, 2), f.concatenate(&[x, x], 0));
    let _ = (f.pad(x, f.scalar(F32, 0.0), &[1, 1], &[0, 0], &[0, 0]), f.sharding_constraint(x, s.clone()));
    let _ = (f.reshard(x, s), f.dot_general(x, x, DotDims::matmul()), f.reduce(ReduceOp::Sum, x, &[0]));
    let _ = (f.sum(x, &[-1], true), f.max(x, &[0], false), f.mean(x, &[1], true), f.sum_all(x), f.mean_all(x));
    let _ = (f.variance(x, &[0], false), f.logsumexp(x, &[-1], false), f.argmax(x, -1), f.argmin(x, 0));
    let _ = (f.relu(x), f.gelu(x), f.sigmoid(x), f.silu(x), f.softplus(x), f.softmax(x, -1), f.log_softmax(x, 0));
    let _ = (f.layer_norm(x, Some(x), Some(x), -1, 1e-5), f.rms_norm(x, Some(x), 0, 1e-5), f.matmul(x, x));
    let _ = (f.linear(x, x, Some(x)), f.one_hot(i, 3, F32), f.embedding(i, x), f.causal_mask(3));
    let _ = (f.dot_product_attention(x, x, x, true), f.clip(x, 0.0, 1.0));
    let _ = (f.fold_in(i, i), f.split_key(i, 2), f.random_bits(i, &[2]), f.random_uniform(i, F32, &[2]));
    let _ = (f.random_normal(x, F32, &[1]), f.bernoulli(i, 0.5, &[3]), f.dropout(x, i, 0.5));
    let _ = (
        f.softmax_cross_entropy(x, i),
        f.mse(x, x),
        f.accuracy(x, i),
        f.call("g", &[x]),
        f.emit(weft_ir::Op::Select, &[p, x, i]),
    );
    let _: [Value; 2] = f.call_n("g", &[x]);
    f.set_results(&[x, i]);
    f.set_result_shardings(&[None]);
}

#[test]
fn nothing_panics_on_bad_inputs() {
    let inputs: &[(TensorType, TensorType, TensorType)] = &[
        (TensorType::scalar(F32), TensorType::scalar(I32), TensorType::scalar(Bool)),
        (TensorType::scalar(Bool), TensorType::scalar(Bool), TensorType::scalar(F32)),
        (TensorType::new(I32, vec![0, 3]), TensorType::new(F32, vec![5]), TensorType::new(Bool, vec![2, 2, 2])),
        (TensorType::new(F32, vec![2, 3]), TensorType::new(I32, vec![2]), TensorType::new(Bool, vec![2, 3])),
    ];
    for (tx, ti, tp) in inputs {
        let f = FunctionBuilder::new("f");
        let x = f.param("x", tx.dtype, &tx.shape);
        let i = f.param("i", ti.dtype, &ti.shape);
        let p = f.param("p", tp.dtype, &tp.shape);
        exercise(&f, x, i, p);
        assert!(f.finish().is_err());
    }
    // Placeholders after an error, and values of another builder.
    let f = FunctionBuilder::new("f");
    let x = f.param("x", F32, &[2, 3]);
    let line = line!() + 1;
    let bad = f.reshape(x, &[5]);
    exercise(&f, bad, bad, bad);
    let m = err(f);
    assert!(m.contains("`reshape`") && m.contains(&at(line)), "{m}");
    let g = FunctionBuilder::new("g");
    let f = FunctionBuilder::new("f");
    let y = g.param("y", F32, &[2, 3]);
    exercise(&f, y, y, y);
    assert!(err(f).contains("another function builder"));
}

//! Call inlining before propagation.
mod common;
use common::*;
use weft_compiler::inline_calls;
use weft_ir::{BinaryOp, DotDims, Function, Module, Op, TensorType, ValueId};

/// `@layer(h, w) = max(h @ w, h)`, with a named intermediate `t`.
fn layer() -> Function {
    let mut b = B::new("layer");
    let h = b.param("h", &[8, 8], Some("[{y}, {}]"));
    let w = b.param("w", &[8, 8], None);
    let t = b.named(Some("t"), Op::DotGeneral(DotDims::matmul()), &[h, w]);
    let r = b.op(Op::Binary(BinaryOp::Max), &[t, h]);
    b.ret(&[r], &[None]);
    b.f
}

fn call(b: &mut B, callee: &str, args: &[ValueId], name: Option<&str>) -> ValueId {
    let ty: TensorType = b.f.ty(args[0]).clone();
    let id = b.f.add_inst(
        Op::Call { callee: callee.into(), remat: false },
        args.to_vec(),
        vec![(ty, name.map(str::to_string))],
        None,
    );
    b.f.insts[id.index()].results[0]
}

#[test]
fn nested_calls_are_flattened_with_prefixed_names() {
    let mut b = B::new("outer");
    let h = b.param("h", &[8, 8], None);
    let w = b.param("w", &[8, 8], None);
    let a = call(&mut b, "layer", &[h, w], None);
    let c = call(&mut b, "layer", &[a, w], None);
    b.ret(&[c], &[None]);
    let outer = b.f;

    let mut b = B::new("main");
    let x = b.param("x", &[8, 8], Some("[{x}, {}]"));
    let w1 = b.param("w1", &[8, 8], None);
    let a = call(&mut b, "outer", &[x, w1], Some("a"));
    let c = call(&mut b, "layer", &[a, w1], Some("c"));
    b.f.values[c.index()].sharding = Some(s("[{x}, {y}]"));
    b.ret(&[c], &[None]);
    let m = Module { functions: vec![b.f, outer, layer()] };
    weft_ir::verify_module(&m).unwrap();

    let f = inline_calls(&m, "main").unwrap();
    weft_ir::verify_function(&Module::new(), &f).unwrap();
    assert!(f.insts.iter().all(|i| !matches!(i.op, Op::Call { .. })));
    assert_eq!(f.insts.len(), 3 * 2 + 1);
    let names: Vec<&str> = f.values.iter().filter_map(|v| v.name.as_deref()).collect();
    assert_eq!(names, vec!["x", "w1", "outer.1.layer.2.t", "outer.1.layer.3.t", "a", "layer.4.t", "c"]);
    // The annotated call result became a constraint producing `%c`.
    let last = f.insts.last().unwrap();
    assert_eq!(last.op, Op::ShardingConstraint { sharding: s("[{x}, {y}]") });
    assert_eq!(f.value_by_name("c"), Some(last.results[0]));
    // Parameter annotations of callees are dropped; the entry's are kept.
    assert_eq!(f.value(f.params[0]).sharding, Some(s("[{x}, {}]")));

    let out = shard(&f, &mesh("x=2,y=2"));
    // x's split reaches `a` forward (user phase); the constraint's y then
    // reaches its still-open dimension 1 backward through the max.
    assert_eq!(fin(&out, f.value_by_name("a").unwrap()), "[{x}, {y}]");
}

#[test]
fn a_callee_returning_its_argument() {
    let mut b = B::new("id");
    let p = b.param("p", &[4], None);
    b.ret(&[p], &[None]);
    let id = b.f;
    let mut b = B::new("main");
    let x = b.param("x", &[4], None);
    let r = call(&mut b, "id", &[x], Some("r"));
    let n = b.op(Op::Unary(weft_ir::UnaryOp::Neg), &[r]);
    b.ret(&[n], &[None]);
    let m = Module { functions: vec![b.f, id] };
    let f = inline_calls(&m, "main").unwrap();
    assert_eq!(f.insts.len(), 1);
    assert_eq!(f.insts[0].operands, vec![f.params[0]]);
    weft_ir::verify_function(&Module::new(), &f).unwrap();
}

/// An annotation on a value inside a callee becomes a constraint after it
/// at every call site (so autodiff constrains its cotangent too), while the
/// entry function's own annotated values stay annotated in place.
#[test]
fn a_callee_values_annotation_becomes_a_constraint() {
    let mut l = layer();
    let t = l.value_by_name("t").unwrap();
    l.values[t.index()].sharding = Some(s("[{}, {y}]"));
    let mut b = B::new("main");
    let x = b.param("x", &[8, 8], None);
    let w = b.param("w", &[8, 8], None);
    let top = b.named(Some("top"), Op::Binary(BinaryOp::Add), &[x, w]);
    b.f.values[top.index()].sharding = Some(s("[{y}, {}]"));
    let a = call(&mut b, "layer", &[top, w], None);
    let c = call(&mut b, "layer", &[a, w], None);
    b.ret(&[c], &[None]);
    let m = Module { functions: vec![b.f, l] };
    weft_ir::verify_module(&m).unwrap();
    let f = inline_calls(&m, "main").unwrap();
    weft_ir::verify_function(&Module::new(), &f).unwrap();
    let ops: Vec<&str> = f.insts.iter().map(|i| i.op.name()).collect();
    assert_eq!(
        ops,
        ["add", "dot_general", "sharding_constraint", "max", "dot_general", "sharding_constraint", "max"],
        "one constraint per call, right after the annotated value"
    );
    for (k, name) in ["layer.1.t", "layer.2.t"].into_iter().enumerate() {
        let t = f.value_by_name(name).unwrap();
        assert_eq!(f.value(t).sharding, None, "the annotation moved to the constraint");
        let constraint = &f.insts[2 + 3 * k];
        assert_eq!(constraint.operands, vec![t]);
        assert_eq!(constraint.op, Op::ShardingConstraint { sharding: s("[{}, {y}]") });
        // The max reads the constrained value.
        assert_eq!(f.insts[3 + 3 * k].operands[0], constraint.results[0]);
    }
    let top = f.value_by_name("top").unwrap();
    assert_eq!(f.value(top).sharding, Some(s("[{y}, {}]")), "the entry's own annotation stays");
}

//! Every user mistake is a `CompilerError` naming the value, dimension,
//! axes and sizes (and source position when there is one).
mod common;
use common::*;
use weft_compiler::sharding::{propagate, ConflictPolicy, PropagateOptions};
use weft_compiler::{inline_calls, CompilerError};
use weft_ir::{BinaryOp, Loc, Module, Op, UnaryOp};

fn err(b: &B) -> CompilerError {
    propagate(&b.f, &mesh("data=2,model=4"), &PropagateOptions::default()).unwrap_err()
}

#[test]
fn bad_parameter_annotations() {
    let mut b = B::new("f");
    let x = b.param("x", &[8, 6], Some("[{data}, {model}]"));
    b.ret(&[x], &[None]);
    b.f.loc = Some(Loc { line: 3, col: 1 });
    let e = err(&b);
    let text = e.to_string();
    assert!(matches!(e, CompilerError::NotDivisible { dim: 1, extent: 6, product: 4, .. }), "{text}");
    assert!(text.starts_with("3:1: in @f: parameter %x: sharding [{data}, {model}] splits dimension 1"), "{text}");

    let mut b = B::new("f");
    let x = b.param("x", &[8, 8], Some("[{dta}, {}]"));
    b.ret(&[x], &[None]);
    let text = err(&b).to_string();
    assert!(text.contains("names mesh axis `dta`, but the mesh is (data=2,model=4); did you mean `data`?"), "{text}");

    let mut b = B::new("f");
    let x = b.param("x", &[8, 8], Some("[{data}, {}]"));
    b.f.values[x.index()].sharding = Some(s("[{data}, {}]"));
    b.f.values[x.index()].sharding.as_mut().unwrap().unreduced.push("data".into());
    b.ret(&[x], &[None]);
    // The IR verifier rejects an axis used twice before the mesh is consulted.
    assert!(matches!(err(&b), CompilerError::Ir(_)));
}

#[test]
fn bad_result_and_constraint_annotations() {
    let mut b = B::new("f");
    let x = b.param("x", &[4, 8], None);
    let n = b.op(Op::Unary(UnaryOp::Neg), &[x]);
    b.ret(&[n], &[Some("[{model, data}, {}]")]);
    b.f.return_loc = Some(Loc { line: 9, col: 3 });
    let text = err(&b).to_string();
    assert!(text.starts_with("9:3: in @f: result 0 (%1)"), "{text}");
    assert!(text.contains("axes [model, data] of sizes [4, 2] (product 8), but 4 is not divisible by 8"), "{text}");

    let mut b = B::new("f");
    let x = b.param("x", &[8, 8], None);
    let c = b.op(Op::ShardingConstraint { sharding: s("[{modl}, {}]") }, &[x]);
    b.ret(&[c], &[None]);
    let e = err(&b);
    assert!(matches!(&e, CompilerError::UnknownAxis { suggestion: Some(m), .. } if m == "model"), "{e}");
    assert!(e.to_string().contains("`%1 = sharding_constraint`"), "{e}");
}

#[test]
fn calls_must_be_inlined() {
    let mut b = B::new("g");
    let x = b.param("x", &[4], None);
    b.ret(&[x], &[None]);
    let g = b.f;
    let mut b = B::new("f");
    let x = b.param("x", &[4], None);
    let id =
        b.f.add_inst(Op::Call { callee: "g".into(), remat: false }, vec![x], vec![(b.f.ty(x).clone(), None)], None);
    let r = b.f.insts[id.index()].results[0];
    b.ret(&[r], &[None]);
    let e = err(&b);
    assert!(matches!(e, CompilerError::CallNotInlined { ref callee, .. } if callee == "g"), "{e}");
    let module = Module { functions: vec![b.f.clone(), g] };
    assert!(inline_calls(&module, "f").is_ok());
    assert!(matches!(inline_calls(&module, "nope"), Err(CompilerError::UnknownFunction { .. })));
}

// A parameter annotated [{x},{}] flowing elementwise into a result annotated
// [{y},{}]: by default the result keeps its annotation, the parameter is
// resharded and the conflict recorded; under the strict policy it is an
// error naming both annotations.
#[test]
fn conflicting_user_annotations() {
    let m = mesh("x=2,y=2");
    let mut b = B::new("f");
    let p = b.param("p", &[8, 8], Some("[{x}, {}]"));
    let n = b.op(Op::Unary(UnaryOp::Neg), &[p]);
    b.ret(&[n], &[Some("[{y}, {}]")]);
    b.f.loc = Some(Loc { line: 1, col: 1 });
    b.f.return_loc = Some(Loc { line: 4, col: 3 });
    let out = shard(&b.f, &m);
    assert_eq!(fin(&out, n), "[{y}, {}]");
    assert_eq!(collectives(&out), ["collective-permute{x, y} dim 0"]);
    assert!(out.resolutions.iter().any(|r| r.user_conflict));

    let strict = PropagateOptions { conflict_policy: ConflictPolicy::Error, ..Default::default() };
    let e = propagate(&b.f, &m, &strict).unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, CompilerError::ConflictingAnnotations { .. }));
    assert!(text.contains("1:1: in @f: parameter %p is [{x}, {}]"), "{text}");
    assert!(text.contains("4:3: in @f: result 0 (%1) is [{y}, {}]"), "{text}");
    assert!(text.contains("`%1 = neg`"), "{text}");

    // The same value annotated twice.
    let mut b = B::new("f");
    let p = b.param("p", &[8, 8], Some("[{x}, {}]"));
    b.ret(&[p], &[Some("[{y}, {}]")]);
    let out = shard(&b.f, &m);
    assert_eq!(out.function.result_shardings[0], Some(s("[{y}, {}]")));
    assert_eq!(out.num_reshards(), 1);
    assert!(out.notes[0].contains("parameter %p is [{x}, {}]"), "{:?}", out.notes);
    let e = propagate(&b.f, &m, &strict).unwrap_err();
    assert!(e.to_string().contains("both annotate the same value"), "{e}");
}

#[test]
fn ill_formed_programs_are_ir_errors() {
    let mut b = B::new("f");
    let x = b.param("x", &[4], None);
    let y = b.param("y", &[4], None);
    let s = b.op(Op::Binary(BinaryOp::Add), &[x, y]);
    b.f.insts[0].operands[1] = weft_ir::ValueId(7);
    b.ret(&[s], &[None]);
    assert!(matches!(err(&b), CompilerError::Ir(_)));
}

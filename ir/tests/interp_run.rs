//! Running functions: calls, identity sharding ops, results, inputs by
//! position and by name, and the errors for bad inputs and bad modules.

mod interp_util;

use interp_util::*;
use std::collections::BTreeMap;
use weft_ir::interp::{self, Interpreter};
use weft_ir::tensor::HostTensor;
use weft_ir::{BinaryOp, DType, DotDims, IrError, Literal, Module, Op, ReduceOp, TensorSharding, TensorType, UnaryOp};

fn f32ty(shape: &[usize]) -> TensorType {
    TensorType::new(DType::F32, shape.to_vec())
}

/// @double(x) = (x + x, x); @main(a, b) = (double(a).0 * b, double(a).1).
fn call_module() -> Module {
    let mut m = Module::new();
    let mut d = FnBuilder::new("double");
    let x = d.param("x", f32ty(&[2]));
    let s = d.op(Op::Binary(BinaryOp::Add), &[x, x]);
    m.functions.push(d.finish(&[s, x]));
    let mut b = FnBuilder::new("main");
    let a = b.param("a", f32ty(&[2]));
    let w = b.param("b", f32ty(&[2]));
    let r = b.call(&m, "double", &[a]);
    let p = b.op(Op::Binary(BinaryOp::Mul), &[r[0], w]);
    m.functions.push(b.finish(&[p, r[1]]));
    m
}

#[test]
fn call_runs_the_callee() {
    let m = call_module();
    let out = interp::run(&m, "main", &[f32t(&[2], &[1.0, 2.0]), f32t(&[2], &[10.0, -1.0])]).unwrap();
    assert_eq!(out.len(), 2);
    assert_bits(&out[0], &f32t(&[2], &[20.0, -4.0]));
    assert_bits(&out[1], &f32t(&[2], &[1.0, 2.0]));
    let out = interp::run(&m, "double", &[f32t(&[2], &[3.0, 4.0])]).unwrap();
    assert_bits(&out[0], &f32t(&[2], &[6.0, 8.0]));
}

#[test]
fn sharding_ops_are_identities_and_results_may_repeat() {
    let mut b = FnBuilder::new("main");
    let x = b.param("x", f32ty(&[2, 2]));
    let c = b.op(Op::ShardingConstraint { sharding: TensorSharding::new(&[&["data"], &[]]) }, &[x]);
    let r = b.op(Op::Reshard { to: TensorSharding::replicated(2) }, &[c]);
    let n = b.op(Op::Unary(UnaryOp::Neg), &[r]);
    let m = Module { functions: vec![b.finish(&[r, n, r, x])] };
    let input = f32t(&[2, 2], &[1.0, 2.0, 3.0, 4.0]);
    let out = interp::run(&m, "main", std::slice::from_ref(&input)).unwrap();
    assert_eq!(out.len(), 4);
    assert_bits(&out[0], &input);
    assert_bits(&out[1], &f32t(&[2, 2], &[-1.0, -2.0, -3.0, -4.0]));
    assert_bits(&out[2], &input);
    assert_bits(&out[3], &input);
}

#[test]
fn interpreter_reuse_and_owned_inputs() {
    // A tiny regression step: loss = sum((x @ w - y)^2), run many times.
    let mut b = FnBuilder::new("loss");
    let x = b.param("x", f32ty(&[4, 3]));
    let w = b.param("w", f32ty(&[3, 1]));
    let y = b.param("y", f32ty(&[4, 1]));
    let p = b.op(Op::DotGeneral(DotDims::matmul()), &[x, w]);
    let d = b.op(Op::Binary(BinaryOp::Sub), &[p, y]);
    let sq = b.op(Op::Binary(BinaryOp::Mul), &[d, d]);
    let flat = b.op(Op::Reshape { shape: vec![4] }, &[sq]);
    let l = b.op(Op::Reduce { op: ReduceOp::Sum, dims: vec![0] }, &[flat]);
    let m = Module { functions: vec![b.finish(&[l])] };
    let it = Interpreter::new(&m).unwrap();
    let xs = f32t(&[4, 3], &[1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0]);
    let ws = f32t(&[3, 1], &[1.0, 2.0, 3.0]);
    // x @ w = [1, 2, 3, 6]; minus y = [0, 0, 0, 1] -> [1, 2, 3, 5]; squares sum to 39.
    let ys = f32t(&[4, 1], &[0.0, 0.0, 0.0, 1.0]);
    for _ in 0..200 {
        let out = it.run("loss", &[xs.clone(), ws.clone(), ys.clone()]).unwrap();
        assert_bits(&out[0], &f32t(&[], &[39.0]));
    }
    let out = it.run_owned("loss", vec![xs, ws, ys]).unwrap();
    assert_bits(&out[0], &f32t(&[], &[39.0]));
}

#[test]
fn constants_literals() {
    let mut b = FnBuilder::new("main");
    let c = b.op(Op::Constant(Literal::dense(TensorType::new(DType::I32, vec![2]), vec![3.0, -4.0]).unwrap()), &[]);
    let s = b.op(Op::Constant(Literal::splat(TensorType::new(DType::BF16, vec![2]), 1.0 + 2f64.powi(-8))), &[]);
    let m = Module { functions: vec![b.finish(&[c, s])] };
    let out = interp::run(&m, "main", &[]).unwrap();
    assert_bits(&out[0], &i32t(&[2], &[3, -4]));
    assert_bits(&out[1], &t(DType::BF16, &[2], &[1.0, 1.0]));
}

fn named_module() -> Module {
    let mut b = FnBuilder::new("f");
    let x = b.param("x", f32ty(&[2]));
    let y = b.param("y", f32ty(&[2]));
    let s = b.op(Op::Binary(BinaryOp::Sub), &[x, y]);
    Module { functions: vec![b.finish(&[s])] }
}

fn input_error(r: Result<Vec<HostTensor>, IrError>) -> (String, String) {
    match r {
        Err(IrError::Input { name, message }) => (name, message),
        other => panic!("expected an input error, got {other:?}"),
    }
}

#[test]
fn run_named_by_parameter_name() {
    let m = named_module();
    let mut inputs = BTreeMap::new();
    inputs.insert("y".to_string(), f32t(&[2], &[1.0, 1.0]));
    inputs.insert("x".to_string(), f32t(&[2], &[5.0, 7.0]));
    let out = interp::run_named(&m, "f", &inputs).unwrap();
    assert_bits(&out[0], &f32t(&[2], &[4.0, 6.0]));
}

#[test]
fn run_named_errors_name_the_parameter() {
    let m = named_module();
    let mut inputs = BTreeMap::new();
    inputs.insert("x".to_string(), f32t(&[2], &[5.0, 7.0]));
    let (name, msg) = input_error(interp::run_named(&m, "f", &inputs));
    assert_eq!(name, "y");
    assert!(msg.contains("missing") && msg.contains("f32[2]"), "{msg}");

    inputs.insert("y".to_string(), f32t(&[3], &[1.0, 2.0, 3.0]));
    let (name, msg) = input_error(interp::run_named(&m, "f", &inputs));
    assert_eq!(name, "y");
    assert!(msg.contains("expected f32[2], given f32[3]"), "{msg}");

    inputs.insert("y".to_string(), t(DType::F64, &[2], &[1.0, 2.0]));
    let (_, msg) = input_error(interp::run_named(&m, "f", &inputs));
    assert!(msg.contains("expected f32[2], given f64[2]"), "{msg}");

    inputs.insert("y".to_string(), f32t(&[2], &[1.0, 2.0]));
    inputs.insert("z".to_string(), f32t(&[2], &[1.0, 2.0]));
    let (name, msg) = input_error(interp::run_named(&m, "f", &inputs));
    assert_eq!(name, "z");
    assert!(msg.contains("no parameter"), "{msg}");
}

#[test]
fn unnamed_parameters_are_arg_i() {
    let mut m = Module::new();
    let mut f = weft_ir::Function::new("g");
    let p = f.add_param(None, f32ty(&[1]));
    f.results = vec![p];
    m.functions.push(f);
    let mut inputs = BTreeMap::new();
    inputs.insert("arg0".to_string(), f32t(&[1], &[2.5]));
    assert_bits(&interp::run_named(&m, "g", &inputs).unwrap()[0], &f32t(&[1], &[2.5]));
}

#[test]
fn positional_input_errors() {
    let m = named_module();
    let two = f32t(&[2], &[1.0, 2.0]);
    let (name, msg) = input_error(interp::run(&m, "f", std::slice::from_ref(&two)));
    assert_eq!(name, "y");
    assert!(msg.contains("missing"), "{msg}");
    let (name, msg) = input_error(interp::run(&m, "f", &[two.clone(), two.clone(), two.clone()]));
    assert_eq!(name, "arg2");
    assert!(msg.contains("takes 2 inputs, given 3"), "{msg}");
    let (name, msg) = input_error(interp::run(&m, "f", &[two.clone(), i32t(&[2], &[1, 2])]));
    assert_eq!(name, "y");
    assert!(msg.contains("expected f32[2], given i32[2]"), "{msg}");
}

#[test]
fn unknown_function_and_unverified_module() {
    let m = named_module();
    match interp::run(&m, "nope", &[]) {
        Err(IrError::Interp(d)) => assert_eq!(d.func, "nope"),
        other => panic!("expected an interp error, got {other:?}"),
    }
    // An instruction whose declared type disagrees with inference fails verification.
    let mut bad = named_module();
    let f = &mut bad.functions[0];
    let r = f.results[0];
    f.values[r.index()].ty = f32ty(&[3]);
    assert!(matches!(interp::run(&bad, "f", &[]), Err(IrError::Verify(_))));
    // Trusting it anyway reports the mismatch instead of returning a wrong value.
    let two = f32t(&[2], &[1.0, 2.0]);
    match Interpreter::from_verified(&bad).run("f", &[two.clone(), two]) {
        Err(IrError::Interp(d)) => assert!(d.message.contains("declared f32[3]"), "{}", d.message),
        other => panic!("expected an interp error, got {other:?}"),
    }
}

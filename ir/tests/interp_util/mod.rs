//! Shared helpers for the interpreter tests: a tiny function builder over
//! the core API (result types from `weft_ir::infer`) and tensor shorthands.
#![allow(dead_code)]

use weft_ir::interp;
use weft_ir::tensor::HostTensor;
use weft_ir::{infer, DType, Function, Module, NoFunctions, Op, SignatureLookup, TensorType, ValueId};

/// Builds one function instruction by instruction.
pub struct FnBuilder {
    pub f: Function,
}

impl FnBuilder {
    pub fn new(name: &str) -> FnBuilder {
        FnBuilder { f: Function::new(name) }
    }

    pub fn param(&mut self, name: &str, ty: TensorType) -> ValueId {
        self.f.add_param(Some(name.to_string()), ty)
    }

    /// Adds `op` with results typed by `infer`, returning all results.
    pub fn ops(&mut self, op: Op, operands: &[ValueId], funcs: &dyn SignatureLookup) -> Vec<ValueId> {
        let types: Vec<&TensorType> = operands.iter().map(|&v| self.f.ty(v)).collect();
        let results = infer(&op, &types, funcs).unwrap_or_else(|e| panic!("test program is ill-typed: {e}"));
        let first = self.f.next_value_id().0;
        let n = results.len() as u32;
        self.f.add_inst(op, operands.to_vec(), results.into_iter().map(|t| (t, None)).collect(), None);
        (first..first + n).map(ValueId).collect()
    }

    /// Adds a single-result op.
    pub fn op(&mut self, op: Op, operands: &[ValueId]) -> ValueId {
        self.ops(op, operands, &NoFunctions)[0]
    }

    /// Adds a call of `callee` (which must already be in `m`).
    pub fn call(&mut self, m: &Module, callee: &str, operands: &[ValueId]) -> Vec<ValueId> {
        self.ops(Op::Call { callee: callee.to_string(), remat: false }, operands, m)
    }

    pub fn finish(mut self, results: &[ValueId]) -> Function {
        self.f.results = results.to_vec();
        self.f
    }
}

/// A module with one function applying `op` to parameters of the inputs' types.
pub fn single_op_module(op: Op, inputs: &[&HostTensor]) -> Module {
    let mut b = FnBuilder::new("main");
    let params: Vec<ValueId> = inputs.iter().enumerate().map(|(i, t)| b.param(&format!("x{i}"), t.ty())).collect();
    let r = b.op(op, &params);
    Module { functions: vec![b.finish(&[r])] }
}

/// Runs `op` on `inputs` through the interpreter and returns its result.
pub fn run_op(op: Op, inputs: &[&HostTensor]) -> HostTensor {
    let m = single_op_module(op, inputs);
    let args: Vec<HostTensor> = inputs.iter().map(|t| (*t).clone()).collect();
    let mut out = interp::run(&m, "main", &args).unwrap_or_else(|e| panic!("run failed: {e}"));
    assert_eq!(out.len(), 1);
    out.pop().unwrap()
}

/// A tensor of any dtype from values (rounded to the dtype).
pub fn t(dtype: DType, shape: &[usize], values: &[f64]) -> HostTensor {
    HostTensor::from_values(&TensorType::new(dtype, shape.to_vec()), values).unwrap()
}

pub fn f32t(shape: &[usize], v: &[f32]) -> HostTensor {
    HostTensor::from_f32(shape, v.to_vec()).unwrap()
}

pub fn f64t(shape: &[usize], v: &[f64]) -> HostTensor {
    HostTensor::from_f64(shape, v.to_vec()).unwrap()
}

pub fn i32t(shape: &[usize], v: &[i32]) -> HostTensor {
    HostTensor::from_i32(shape, v.to_vec()).unwrap()
}

pub fn u32t(shape: &[usize], v: &[u32]) -> HostTensor {
    HostTensor::from_u32(shape, v.to_vec()).unwrap()
}

pub fn boolt(shape: &[usize], v: &[bool]) -> HostTensor {
    HostTensor::from_bool(shape, v.to_vec()).unwrap()
}

pub fn scalar(d: DType, v: f64) -> HostTensor {
    HostTensor::scalar(d, v)
}

/// Asserts bit-exact equality (dtype, shape and every bit).
#[track_caller]
pub fn assert_bits(actual: &HostTensor, expected: &HostTensor) {
    assert!(actual.bitwise_eq(expected), "not bitwise equal:\n  actual:   {actual}\n  expected: {expected}");
}

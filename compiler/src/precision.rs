//! Changing the precision of a whole program.
//!
//! [`retype_floats`] rewrites every value of one float dtype to another
//! (constants, iotas, converts and parameters included). Its main use is
//! [`promote_to_f64`]: gradient checks against finite differences need
//! f64 end to end, while models are written in f32.

use std::collections::HashMap;
use weft_ir::{infer, DType, Function, Literal, LiteralData, Module, Op, TensorType, ValueId};

fn map_dtype(d: DType, from: DType, to: DType) -> DType {
    if d == from {
        to
    } else {
        d
    }
}

fn map_type(t: &TensorType, from: DType, to: DType) -> TensorType {
    t.with_dtype(map_dtype(t.dtype, from, to))
}

/// Every function of `m` with dtype `from` replaced by `to`.
pub fn retype_floats(m: &Module, from: DType, to: DType) -> Module {
    let mut out = Module::new();
    for f in &m.functions {
        let g = retype_function(&out, f, from, to);
        out.functions.push(g);
    }
    // Callees may come after callers: retype again against the full module.
    let full = out.clone();
    Module { functions: m.functions.iter().map(|f| retype_function(&full, f, from, to)).collect() }
}

fn retype_function(m: &Module, f: &Function, from: DType, to: DType) -> Function {
    let mut g = Function::new(f.name.clone());
    let mut map: HashMap<ValueId, ValueId> = HashMap::new();
    for &p in &f.params {
        let v = f.value(p);
        let np = g.add_param(v.name.clone(), map_type(&v.ty, from, to));
        g.values[np.index()].sharding = v.sharding.clone();
        map.insert(p, np);
    }
    for inst in &f.insts {
        let op = match &inst.op {
            Op::Constant(l) => {
                let ty = map_type(&l.ty, from, to);
                let data = match &l.data {
                    LiteralData::Splat(v) => LiteralData::Splat(ty.dtype.round(*v)),
                    LiteralData::Dense(vs) => LiteralData::Dense(vs.iter().map(|v| ty.dtype.round(*v)).collect()),
                };
                Op::Constant(Literal { ty, data })
            }
            Op::Iota { dim, ty } => Op::Iota { dim: *dim, ty: map_type(ty, from, to) },
            Op::Convert { to: d } => Op::Convert { to: map_dtype(*d, from, to) },
            other => other.clone(),
        };
        let ops: Vec<ValueId> = inst.operands.iter().map(|o| map[o]).collect();
        let tys: Vec<TensorType> = ops.iter().map(|&o| g.ty(o).clone()).collect();
        let refs: Vec<&TensorType> = tys.iter().collect();
        let results = match infer(&op, &refs, m) {
            Ok(r) => r,
            // A callee not retyped yet (first pass): keep mapped declared types.
            Err(_) => inst.results.iter().map(|&r| map_type(f.ty(r), from, to)).collect(),
        };
        let ni = g.add_inst(
            op,
            ops,
            results.into_iter().zip(&inst.results).map(|(t, &r)| (t, f.value(r).name.clone())).collect(),
            inst.loc,
        );
        for (k, &r) in inst.results.iter().enumerate() {
            let nr = g.insts[ni.index()].results[k];
            g.values[nr.index()].sharding = f.value(r).sharding.clone();
            map.insert(r, nr);
        }
    }
    g.results = f.results.iter().map(|r| map[r]).collect();
    g.result_shardings = f.result_shardings.clone();
    g
}

/// Every f32 (and bf16/f16) value of `m` promoted to f64.
pub fn promote_to_f64(m: &Module) -> Module {
    let m = retype_floats(m, DType::F32, DType::F64);
    let m = retype_floats(&m, DType::BF16, DType::F64);
    retype_floats(&m, DType::F16, DType::F64)
}

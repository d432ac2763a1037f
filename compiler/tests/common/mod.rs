//! Helpers shared by the integration tests: build programs with the core
//! API (`Function::add_param` / `add_inst` + `weft_ir::infer`) and write
//! shardings compactly.
#![allow(dead_code)]

use weft_compiler::sharding::{check_locally_computable, propagate, Mesh, PropagateOptions, ShardedFunction};
use weft_ir::{infer, DType, DimSharding, Function, NoFunctions, Op, TensorSharding, TensorType, ValueId};

/// A function under construction.
pub struct B {
    pub f: Function,
}

impl B {
    pub fn new(name: &str) -> B {
        B { f: Function::new(name) }
    }

    pub fn param(&mut self, name: &str, shape: &[usize], sharding: Option<&str>) -> ValueId {
        let v = self.f.add_param(Some(name.to_string()), TensorType::new(DType::F32, shape.to_vec()));
        self.f.values[v.index()].sharding = sharding.map(s);
        v
    }

    /// Adds `op` on `operands`; the result type comes from `weft_ir::infer`.
    pub fn op(&mut self, op: Op, operands: &[ValueId]) -> ValueId {
        self.named(None, op, operands)
    }

    pub fn named(&mut self, name: Option<&str>, op: Op, operands: &[ValueId]) -> ValueId {
        let tys: Vec<&TensorType> = operands.iter().map(|&o| self.f.ty(o)).collect();
        let res = infer(&op, &tys, &NoFunctions).unwrap_or_else(|e| panic!("test program is ill-typed: {e}"));
        let results = res.into_iter().map(|t| (t, name.map(str::to_string))).collect();
        let id = self.f.add_inst(op, operands.to_vec(), results, None);
        self.f.insts[id.index()].results[0]
    }

    pub fn ret(&mut self, vals: &[ValueId], shardings: &[Option<&str>]) {
        self.f.results = vals.to_vec();
        self.f.result_shardings = shardings.iter().map(|x| x.map(s)).collect();
    }
}

/// Parses `[{x, y}, {?}, {}]` with an optional ` unreduced {a, b}` suffix.
pub fn s(text: &str) -> TensorSharding {
    let (dims, unreduced) = match text.split_once(" unreduced ") {
        Some((d, u)) => (d, u.trim().trim_start_matches('{').trim_end_matches('}')),
        None => (text, ""),
    };
    let inner = dims.trim().strip_prefix('[').and_then(|x| x.strip_suffix(']')).expect("[...]");
    let mut out = Vec::new();
    for part in inner.split('}').map(str::trim).filter(|p| !p.is_empty()) {
        let body = part.trim_start_matches(',').trim().trim_start_matches('{');
        let items: Vec<&str> = body.split(',').map(str::trim).filter(|x| !x.is_empty()).collect();
        let open = items.contains(&"?");
        let axes: Vec<String> = items.iter().filter(|x| **x != "?").map(|x| x.to_string()).collect();
        out.push(DimSharding { axes, open });
    }
    let unreduced = unreduced.split(',').map(str::trim).filter(|x| !x.is_empty()).map(str::to_string).collect();
    TensorSharding { dims: out, unreduced }
}

pub fn mesh(text: &str) -> Mesh {
    Mesh::parse(text).expect("valid mesh")
}

/// Propagates with default options and checks the output is locally computable.
pub fn shard(f: &Function, m: &Mesh) -> ShardedFunction {
    let out = propagate(f, m, &PropagateOptions::default()).unwrap_or_else(|e| panic!("propagation failed: {e}"));
    if let Err(e) = check_locally_computable(&out.function, m) {
        panic!("output not locally computable: {e}\n{}", dump(&out.function));
    }
    out
}

/// The final sharding of original value `v`, printed with unreduced axes.
pub fn fin(out: &ShardedFunction, v: ValueId) -> String {
    weft_compiler::sharding::fmt_sharding(out.sharding(v))
}

/// Collectives of every inserted reshard, in order.
pub fn collectives(out: &ShardedFunction) -> Vec<String> {
    out.reshards.iter().flat_map(|r| r.collectives.clone()).collect()
}

/// A compact listing of a function for failure messages.
pub fn dump(f: &Function) -> String {
    let show = |v: ValueId| {
        let d = f.value(v);
        let sh = d.sharding.as_ref().map(weft_compiler::sharding::fmt_sharding).unwrap_or_default();
        format!("{}: {} {sh}", f.value_ref(v), d.ty)
    };
    let mut out = String::new();
    for &p in &f.params {
        out += &format!("param {}\n", show(p));
    }
    for inst in &f.insts {
        let ops: Vec<String> = inst.operands.iter().map(|&o| f.value_ref(o)).collect();
        out += &format!("{} = {} {}\n", show(inst.results[0]), inst.op.name(), ops.join(", "));
    }
    let rs: Vec<String> = f.results.iter().map(|&r| f.value_ref(r)).collect();
    out += &format!("return {}\n", rs.join(", "));
    out
}

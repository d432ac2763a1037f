//! Dead-code elimination with id compaction.
//!
//! Removes instructions none of whose results reach a function result, and
//! renumbers the surviving values so ids stay dense and in definition order
//! (an IR invariant). Parameters are always kept, even if unused, because
//! they are the function's interface.

use std::collections::HashMap;
use weft_ir::{Function, ValueId};

/// Returns `f` without dead instructions.
pub fn dce(f: &Function) -> Function {
    let mut live = vec![false; f.values.len()];
    for &r in &f.results {
        live[r.index()] = true;
    }
    let mut keep = vec![false; f.insts.len()];
    for (i, inst) in f.insts.iter().enumerate().rev() {
        if inst.results.iter().any(|r| live[r.index()]) {
            keep[i] = true;
            for o in &inst.operands {
                live[o.index()] = true;
            }
        }
    }
    rebuild(f, |i| keep[i])
}

/// Rebuilds `f` keeping the instructions for which `keep(index)` is true,
/// renumbering values densely. Kept instructions must not use values of
/// dropped ones.
pub fn rebuild(f: &Function, keep: impl Fn(usize) -> bool) -> Function {
    let mut out = Function::new(f.name.clone());
    out.loc = f.loc;
    out.return_loc = f.return_loc;
    let mut map: HashMap<ValueId, ValueId> = HashMap::new();
    for &p in &f.params {
        let v = f.value(p);
        let np = out.add_param(v.name.clone(), v.ty.clone());
        out.values[np.index()].sharding = v.sharding.clone();
        map.insert(p, np);
    }
    for (i, inst) in f.insts.iter().enumerate() {
        if !keep(i) {
            continue;
        }
        let ops = inst
            .operands
            .iter()
            .map(|o| *map.get(o).unwrap_or_else(|| panic!("kept instruction {i} uses dropped value {o}")))
            .collect();
        let results = inst.results.iter().map(|&r| (f.ty(r).clone(), f.value(r).name.clone())).collect();
        let ni = out.add_inst(inst.op.clone(), ops, results, inst.loc);
        for (k, &r) in inst.results.iter().enumerate() {
            let nr = out.insts[ni.index()].results[k];
            out.values[nr.index()].sharding = f.value(r).sharding.clone();
            map.insert(r, nr);
        }
    }
    out.results = f.results.iter().map(|r| map[r]).collect();
    out.result_shardings = f.result_shardings.clone();
    out
}

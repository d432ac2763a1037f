//! Inlining calls before differentiation, remembering rematerialised ones.
//!
//! Autodiff works on straight-line code, so every `call` is inlined first.
//! A call marked `remat` becomes a *region*: the range of inlined
//! instructions whose activations the backward pass recomputes instead of
//! keeping (see the module docs of [`super`]). Nested remat calls belong to
//! the outermost region.

use crate::CompilerError;
use std::collections::HashMap;
use std::ops::Range;
use weft_ir::{Function, Module, Op, ValueId};

/// `f` with every call inlined, and the instruction ranges of remat calls.
pub(super) fn inline_with_regions(m: &Module, f: &Function) -> Result<(Function, Vec<Range<usize>>), CompilerError> {
    let mut out = Function::new(f.name.clone());
    out.loc = f.loc;
    out.return_loc = f.return_loc;
    let mut map = HashMap::new();
    for &p in &f.params {
        let v = f.value(p);
        let np = out.add_param(v.name.clone(), v.ty.clone());
        out.values[np.index()].sharding = v.sharding.clone();
        map.insert(p, np);
    }
    let mut regions = Vec::new();
    copy_body(m, f, &mut out, &mut map, true, false, &mut regions, 0)?;
    out.results = f.results.iter().map(|r| map[r]).collect();
    out.result_shardings = f.result_shardings.clone();
    Ok((out, regions))
}

#[allow(clippy::too_many_arguments)]
fn copy_body(
    m: &Module,
    f: &Function,
    out: &mut Function,
    map: &mut HashMap<ValueId, ValueId>,
    keep_names: bool,
    in_region: bool,
    regions: &mut Vec<Range<usize>>,
    depth: usize,
) -> Result<(), CompilerError> {
    if depth > 64 {
        return Err(CompilerError::Autodiff { func: f.name.clone(), message: "calls nested more than 64 deep".into() });
    }
    for inst in &f.insts {
        let ops: Vec<ValueId> = inst.operands.iter().map(|o| map[o]).collect();
        if let Op::Call { callee, remat } = &inst.op {
            let g = m.function(callee).ok_or_else(|| CompilerError::Autodiff {
                func: f.name.clone(),
                message: format!("call to unknown function @{callee}"),
            })?;
            let mut inner: HashMap<ValueId, ValueId> = g.params.iter().copied().zip(ops).collect();
            let start = out.insts.len();
            copy_body(m, g, out, &mut inner, false, in_region || *remat, regions, depth + 1)?;
            if *remat && !in_region && out.insts.len() > start {
                regions.push(start..out.insts.len());
            }
            for (&r, gr) in inst.results.iter().zip(&g.results) {
                let v = inner[gr];
                map.insert(r, v);
                if keep_names && out.values[v.index()].name.is_none() {
                    if let Some(n) = &f.value(r).name {
                        if out.value_by_name(n).is_none() {
                            out.values[v.index()].name = Some(n.clone());
                        }
                    }
                }
            }
            continue;
        }
        let results = inst
            .results
            .iter()
            .map(|&r| (f.ty(r).clone(), if keep_names { f.value(r).name.clone() } else { None }))
            .collect();
        let ni = out.add_inst(inst.op.clone(), ops, results, inst.loc);
        for (k, &r) in inst.results.iter().enumerate() {
            let nr = out.insts[ni.index()].results[k];
            out.values[nr.index()].sharding = f.value(r).sharding.clone();
            map.insert(r, nr);
        }
    }
    Ok(())
}

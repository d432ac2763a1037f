//! Reverse-mode automatic differentiation as an IR-to-IR transform.
//!
//! [`value_and_grad`] takes a verified function whose first result is a
//! scalar float loss and returns a new function with the same parameters
//! that returns the original results followed by the gradient of the loss
//! with respect to each requested parameter. It works like JAX's
//! linearize-then-transpose, fused into one pass over straight-line code:
//!
//! 1. the forward instructions are copied unchanged;
//! 2. an *activity analysis* marks the values that depend differentiably on
//!    a requested parameter (only those get cotangents, so e.g. the integer
//!    label path and masks cost nothing);
//! 3. instructions are visited in reverse and each active one emits its
//!    vector-Jacobian product (one rule per op, in `vjp.rs`), accumulating cotangents by addition;
//! 4. dead forward values are removed by [`crate::dce`].
//!
//! Calls are inlined first. A call marked `remat` (like `jax.checkpoint`)
//! becomes a region whose activations are *recomputed*: when the reverse
//! sweep reaches the region, it re-emits the region's forward instructions
//! and feeds the recomputed values to the region's VJP rules, so the forward
//! copies of the region's intermediates die as soon as the region's outputs
//! are computed. Gradients of gradients are not supported.

mod vjp;

use crate::dce::dce;
use crate::emit::Emitter;
use crate::CompilerError;
use std::collections::HashMap;
use weft_ir::{Function, Module, Op, UnaryOp, ValueId};

/// Options for [`value_and_grad`].
#[derive(Clone, Debug, Default)]
pub struct GradOptions {
    /// Name of the produced function (default: `<name>_value_and_grad`).
    pub name: Option<String>,
    /// Prefix for the names given to the gradient results: the gradient of
    /// parameter `p` is named `<prefix><p>` (default: `grad.`).
    pub grad_prefix: Option<String>,
}

/// Builds `value_and_grad(f)` with respect to the parameters named in `wrt`.
///
/// The result function has `f`'s parameters; its results are `f`'s results
/// followed by one gradient per entry of `wrt`, each with its parameter's type.
pub fn value_and_grad(m: &Module, f: &Function, wrt: &[&str], opts: &GradOptions) -> Result<Function, CompilerError> {
    let loss = *f.results.first().ok_or_else(|| CompilerError::Autodiff {
        func: f.name.clone(),
        message: "the function has no results; its first result must be the scalar loss".into(),
    })?;
    let loss_ty = f.ty(loss);
    if loss_ty.rank() != 0 || !loss_ty.dtype.is_float() {
        return Err(CompilerError::Autodiff {
            func: f.name.clone(),
            message: format!("the first result (the loss) must be a float scalar, got {loss_ty}"),
        });
    }
    let mut wrt_params = Vec::with_capacity(wrt.len());
    for &name in wrt {
        let pos = (0..f.params.len()).find(|&i| f.param_name(i) == name).ok_or_else(|| {
            let names: Vec<String> = (0..f.params.len()).map(|i| f.param_name(i)).collect();
            CompilerError::Autodiff {
                func: f.name.clone(),
                message: format!(
                    "cannot differentiate with respect to `{name}`: no such parameter (parameters: {})",
                    names.join(", ")
                ),
            }
        })?;
        let t = f.ty(f.params[pos]);
        if !t.dtype.is_float() {
            return Err(CompilerError::Autodiff {
                func: f.name.clone(),
                message: format!("cannot differentiate with respect to `{name}`: it is {t}, not a float tensor"),
            });
        }
        wrt_params.push(f.params[pos]);
    }
    let crate::inline::Inlined { function: flat, remat_regions: regions } = crate::inline::inline_function(m, f)?;
    let wrt_params: Vec<ValueId> =
        wrt_params.iter().map(|p| flat.params[f.params.iter().position(|q| q == p).expect("param")]).collect();
    let loss = flat.results[0];
    let f = &flat;
    let mut region_of = vec![None; f.insts.len()];
    for (r, range) in regions.iter().enumerate() {
        for i in range.clone() {
            region_of[i] = Some(r);
        }
    }

    let name = opts.name.clone().unwrap_or_else(|| format!("{}_value_and_grad", f.name));
    let mut e = Emitter::with_module(name, m);
    // 1. Copy parameters and forward instructions.
    let mut map: HashMap<ValueId, ValueId> = HashMap::new();
    for (i, &p) in f.params.iter().enumerate() {
        let v = f.value(p);
        let np = e.f.add_param(v.name.clone(), v.ty.clone());
        e.f.values[np.index()].sharding = v.sharding.clone();
        map.insert(p, np);
        debug_assert_eq!(e.f.params.len(), i + 1);
    }
    for inst in &f.insts {
        let ops: Vec<ValueId> = inst.operands.iter().map(|o| map[o]).collect();
        let results: Vec<_> = inst.results.iter().map(|&r| (f.ty(r).clone(), f.value(r).name.clone())).collect();
        let ni = e.f.add_inst(inst.op.clone(), ops, results, inst.loc);
        for (k, &r) in inst.results.iter().enumerate() {
            let nr = e.f.insts[ni.index()].results[k];
            e.f.values[nr.index()].sharding = f.value(r).sharding.clone();
            map.insert(r, nr);
        }
    }

    // 2. Activity analysis (on the original ids).
    let active = activity(f, &wrt_params);

    // 3. Reverse sweep.
    let mut cot: HashMap<ValueId, ValueId> = HashMap::new();
    let seed = e.full(loss_ty, 1.0);
    cot.insert(loss, seed);
    // Recomputed values of the remat region being differentiated.
    let mut recomputed: Option<(usize, HashMap<ValueId, ValueId>)> = None;
    for (i, inst) in f.insts.iter().enumerate().rev() {
        let r = inst.results[0];
        let Some(&g) = cot.get(&r) else { continue };
        if !active[r.index()] {
            continue;
        }
        if let Some(reg) = region_of[i] {
            if recomputed.as_ref().map(|(k, _)| *k) != Some(reg) {
                recomputed = Some((reg, recompute(&mut e, f, regions[reg].clone(), &map)));
            }
        }
        let rmap = match (region_of[i], &recomputed) {
            (Some(reg), Some((k, rm))) if reg == *k => Some(rm),
            _ => None,
        };
        let lookup = |v: &ValueId| rmap.and_then(|rm| rm.get(v)).copied().unwrap_or(map[v]);
        let operands: Vec<ValueId> = inst.operands.iter().map(lookup).collect();
        let result = lookup(&r);
        let contributions = vjp::vjp(&mut e, &inst.op, &operands, result, g);
        for (k, c) in contributions.into_iter().enumerate() {
            let (Some(c), o) = (c, inst.operands[k]) else { continue };
            if !active[o.index()] {
                continue;
            }
            let acc = match cot.get(&o) {
                Some(&prev) => e.add(prev, c),
                None => c,
            };
            cot.insert(o, acc);
        }
    }

    // Results: the original results, then the gradients.
    let prefix = opts.grad_prefix.clone().unwrap_or_else(|| "grad.".into());
    e.f.results = f.results.iter().map(|r| map[r]).collect();
    for (&p, &name) in wrt_params.iter().zip(wrt) {
        let g = match cot.get(&p) {
            Some(&g) => g,
            None => {
                let t = f.ty(p).clone();
                e.full(&t, 0.0)
            }
        };
        // Give the gradient a name (copying it if it already has one, e.g.
        // when the gradient is a parameter-independent constant or a value
        // that is also used elsewhere).
        let gname = format!("{prefix}{name}");
        let g = if e.f.values[g.index()].name.is_none() && !e.f.results.contains(&g) {
            g
        } else {
            let t = e.ty(g);
            let zero = e.full(&t, 0.0);
            e.add(g, zero)
        };
        if e.f.value_by_name(&gname).is_none() {
            e.f.values[g.index()].name = Some(gname);
        }
        e.f.results.push(g);
    }
    if !f.result_shardings.is_empty() {
        e.f.result_shardings = f.result_shardings.clone();
        for &p in &wrt_params {
            e.f.result_shardings.push(f.value(p).sharding.clone());
        }
    }
    Ok(dce(&e.f))
}

/// Re-emits the forward instructions of a remat region; values defined
/// outside it come from the forward copies in `map`.
fn recompute(
    e: &mut Emitter<'_>,
    f: &Function,
    range: std::ops::Range<usize>,
    map: &HashMap<ValueId, ValueId>,
) -> HashMap<ValueId, ValueId> {
    let mut rmap = HashMap::new();
    for inst in &f.insts[range] {
        let ops: Vec<ValueId> = inst.operands.iter().map(|o| rmap.get(o).copied().unwrap_or(map[o])).collect();
        let results = e.op_multi(inst.op.clone(), &ops);
        for (&r, nr) in inst.results.iter().zip(results) {
            e.f.values[nr.index()].sharding = f.value(r).sharding.clone();
            rmap.insert(r, nr);
        }
    }
    rmap
}

/// Marks values that depend differentiably on any of `wrt`.
fn activity(f: &Function, wrt: &[ValueId]) -> Vec<bool> {
    let mut active = vec![false; f.values.len()];
    for &p in wrt {
        active[p.index()] = true;
    }
    for inst in &f.insts {
        if !differentiable(&inst.op) {
            continue;
        }
        let any = inst.operands.iter().any(|o| active[o.index()]);
        for &r in &inst.results {
            active[r.index()] = any && f.ty(r).dtype.is_float();
        }
    }
    active
}

/// Whether gradients flow through `op` at all.
fn differentiable(op: &Op) -> bool {
    match op {
        Op::Constant(_) | Op::Iota { .. } | Op::Compare(_) | Op::Call { .. } => false,
        Op::Unary(u) => !matches!(u, UnaryOp::Sign | UnaryOp::Floor | UnaryOp::Not | UnaryOp::IsFinite),
        Op::Binary(b) => !matches!(
            b,
            weft_ir::BinaryOp::And
                | weft_ir::BinaryOp::Or
                | weft_ir::BinaryOp::Xor
                | weft_ir::BinaryOp::ShiftLeft
                | weft_ir::BinaryOp::ShiftRightLogical
        ),
        _ => true,
    }
}

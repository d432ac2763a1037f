//! The verifier: checks every invariant of a module and reports all
//! violations, each with its function, instruction and source position.
//!
//! Invariants checked:
//! 1. Function names are valid identifiers and unique in the module.
//! 2. Every value in a function's arena is defined exactly once, by a
//!    parameter or an instruction result, and its recorded definition
//!    (`ValueDef`) points back at that definer.
//! 3. Value ids are assigned in definition order: parameters are `%0..%n`,
//!    then each instruction's results follow consecutively. (This is what
//!    makes `%N` in the text format mean arena index N.)
//! 4. Value names, where present, are valid identifiers that are not all
//!    digits, and are unique within their function.
//! 5. Every operand is a value defined earlier in the function (SSA
//!    dominance in straight-line code); no use before definition.
//! 6. Every instruction has the arity its op requires, its attributes are
//!    consistent with its operand types, and its declared result types equal
//!    the types [`crate::infer()`] derives (this covers dimension numbers in
//!    range, matching extents, dtype rules, shapes that match annotations).
//! 7. Every `call` names a function of the module with a matching
//!    signature, and the call graph has no cycles (no recursion) and no
//!    chain of nested calls longer than [`MAX_CALL_DEPTH`].
//! 8. Every function result is a value of the function; `result_shardings`
//!    is empty or has one entry per result.
//! 9. Every value's type occupies at most
//!    [`MAX_TENSOR_BYTES`](crate::types::MAX_TENSOR_BYTES).
//! 10. Every sharding annotation (on a value, a result, or a
//!     `sharding_constraint`/`reshard` op) has the rank of its tensor and
//!     names no mesh axis twice. (Whether the axes exist and divide the
//!     dimensions depends on the mesh, and is checked by the compiler.)

use crate::callgraph::{CallGraph, MAX_CALL_DEPTH};
use crate::infer::SignatureLookup;
use crate::{infer, Diagnostic, Function, InstId, IrError, Module, Op, ValueDef, ValueId};
use std::collections::{HashMap, HashSet};

/// Whether `s` is a valid identifier for functions and values:
/// `[A-Za-z_][A-Za-z0-9_.]*`.
pub fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    match chars.next() {
        Some(c) if c.is_ascii_alphabetic() || c == '_' => {}
        _ => return false,
    }
    chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
}

/// Whether `s` is a valid value name: `[A-Za-z0-9_.]+` but not all digits
/// (all-digit names are ids: `%3`).
pub fn is_value_name(s: &str) -> bool {
    !s.is_empty()
        && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
        && !s.chars().all(|c| c.is_ascii_digit())
}

/// Verifies a whole module. Returns every problem found.
pub fn verify_module(m: &Module) -> Result<(), IrError> {
    let mut diags = Vec::new();
    let mut names = HashSet::new();
    // Calls look their callee up by name: through an index, so a module of
    // n functions verifies in time linear in n, not quadratic.
    let sigs = crate::infer::ModuleIndex::new(m);
    for f in &m.functions {
        if !is_identifier(&f.name) {
            diags.push(diag(f, f.loc, "", format!("`{}` is not a valid function name", f.name)));
        }
        if !names.insert(f.name.as_str()) {
            diags.push(diag(f, f.loc, "", format!("function @{} is defined more than once", f.name)));
        }
        check_function(&sigs, f, &mut diags);
    }
    check_call_cycles(m, &mut diags);
    if diags.is_empty() {
        Ok(())
    } else {
        Err(IrError::Verify(diags))
    }
}

/// Verifies one function on its own (calls are checked against `m`).
pub fn verify_function(m: &Module, f: &Function) -> Result<(), IrError> {
    let mut diags = Vec::new();
    check_function(m, f, &mut diags);
    if diags.is_empty() {
        Ok(())
    } else {
        Err(IrError::Verify(diags))
    }
}

fn diag(f: &Function, loc: Option<crate::Loc>, subject: impl Into<String>, message: String) -> Diagnostic {
    Diagnostic { func: f.name.clone(), loc, subject: subject.into(), message }
}

/// How an instruction is named in diagnostics: `%3 = add` or `call`.
pub fn inst_subject(f: &Function, inst: InstId) -> String {
    let i = &f.insts[inst.index()];
    let results: Vec<String> = i.results.iter().map(|&r| f.value_ref(r)).collect();
    if results.is_empty() {
        format!("`{}` ({inst})", i.op.name())
    } else {
        format!("`{} = {}`", results.join(", "), i.op.name())
    }
}

fn check_function(m: &dyn SignatureLookup, f: &Function, diags: &mut Vec<Diagnostic>) {
    let n = f.values.len();
    let mut defined_by: Vec<Option<ValueDef>> = vec![None; n];
    let mut next = 0usize;
    let mut structural_ok = true;

    // Every type must be addressable (its size computable without overflow).
    for (i, v) in f.values.iter().enumerate() {
        if v.ty.checked_size_bytes().is_none() {
            diags.push(diag(
                f,
                f.loc,
                format!("value %{i}"),
                format!(
                    "type {} has too many elements (a tensor may have at most {} bytes)",
                    v.ty,
                    crate::types::MAX_TENSOR_BYTES
                ),
            ));
        }
    }

    // Invariants 2 and 3 for parameters.
    for (pos, &p) in f.params.iter().enumerate() {
        let subject = format!("parameter {pos}");
        if p.index() >= n {
            diags.push(diag(f, f.loc, subject, format!("{p} is not in the value arena")));
            structural_ok = false;
            continue;
        }
        if p.index() != next {
            diags.push(diag(
                f,
                f.loc,
                subject.clone(),
                format!("is {p} but ids must be in definition order (expected %{next})"),
            ));
        }
        next = p.index() + 1;
        if defined_by[p.index()].is_some() {
            diags.push(diag(f, f.loc, subject.clone(), format!("{p} is defined twice")));
        }
        defined_by[p.index()] = Some(ValueDef::Param(pos as u32));
        if f.values[p.index()].def != ValueDef::Param(pos as u32) {
            diags.push(diag(
                f,
                f.loc,
                subject,
                format!("{p} records the wrong definition {:?}", f.values[p.index()].def),
            ));
        }
    }

    // Walk instructions: definitions, dominance, types.
    for (id, inst) in f.iter_insts() {
        // Built only when a problem is reported: formatting it for every
        // instruction would dominate the verifier's time.
        let subject = || inst_subject(f, id);
        for (k, &o) in inst.operands.iter().enumerate() {
            if o.index() >= n {
                diags.push(diag(f, inst.loc, subject(), format!("operand {k} ({o}) is not a value of this function")));
                structural_ok = false;
            } else if defined_by[o.index()].is_none() {
                diags.push(diag(
                    f,
                    inst.loc,
                    subject(),
                    format!("operand {k} ({}) is used before it is defined", f.value_ref(o)),
                ));
                structural_ok = false;
            }
        }
        for (index, &r) in inst.results.iter().enumerate() {
            if r.index() >= n {
                diags.push(diag(f, inst.loc, subject(), format!("result {r} is not in the value arena")));
                structural_ok = false;
                continue;
            }
            if r.index() != next {
                diags.push(diag(
                    f,
                    inst.loc,
                    subject(),
                    format!("result {r} breaks definition order (expected %{next})"),
                ));
            }
            next = r.index() + 1;
            let def = ValueDef::Inst { inst: id, index: index as u32 };
            if defined_by[r.index()].is_some() {
                diags.push(diag(f, inst.loc, subject(), format!("{} is defined more than once", f.value_ref(r))));
            }
            defined_by[r.index()] = Some(def);
            if f.values[r.index()].def != def {
                diags.push(diag(f, inst.loc, subject(), format!("{r} records the wrong definition")));
            }
        }
        if !structural_ok {
            continue;
        }
        check_types(m, f, id, diags);
    }

    // Invariant 2: no orphan values.
    for (i, d) in defined_by.iter().enumerate() {
        if d.is_none() {
            diags.push(diag(f, f.loc, "", format!("%{i} is never defined")));
        }
    }

    // Invariant 4: names.
    let mut seen: HashMap<&str, ValueId> = HashMap::new();
    for (i, v) in f.values.iter().enumerate() {
        if let Some(name) = &v.name {
            let id = ValueId(i as u32);
            let loc = def_loc(f, v.def);
            if !is_value_name(name) {
                diags.push(diag(f, loc, "", format!("`%{name}` is not a valid value name")));
            }
            if let Some(prev) = seen.insert(name.as_str(), id) {
                diags.push(diag(f, loc, "", format!("duplicate value name `%{name}` (defined as {prev} and as {id})")));
            }
        }
    }

    // Invariant 8.
    for (k, &r) in f.results.iter().enumerate() {
        if r.index() >= n {
            diags.push(diag(f, f.return_loc, "return", format!("result {k} ({r}) is not a value of this function")));
        }
    }
    if !f.result_shardings.is_empty() && f.result_shardings.len() != f.results.len() {
        diags.push(diag(
            f,
            f.return_loc,
            "return",
            format!("{} result shardings for {} results", f.result_shardings.len(), f.results.len()),
        ));
    }

    // Invariant 9.
    for (i, v) in f.values.iter().enumerate() {
        if let Some(s) = &v.sharding {
            let subject = f.value_ref(ValueId(i as u32));
            check_sharding(f, def_loc(f, v.def), &subject, s, v.ty.rank(), diags);
        }
    }
    for (k, s) in f.result_shardings.iter().enumerate() {
        if let (Some(s), Some(&r)) = (s, f.results.get(k)) {
            if r.index() < n {
                check_sharding(f, f.return_loc, &format!("result {k}"), s, f.ty(r).rank(), diags);
            }
        }
    }
    for (id, inst) in f.iter_insts() {
        if let Op::ShardingConstraint { sharding: s } | Op::Reshard { to: s } = &inst.op {
            check_sharding(f, inst.loc, &inst_subject(f, id), s, s.rank(), diags);
        }
    }
}

fn check_sharding(
    f: &Function,
    loc: Option<crate::Loc>,
    subject: &str,
    s: &crate::TensorSharding,
    rank: usize,
    diags: &mut Vec<Diagnostic>,
) {
    if s.rank() != rank {
        diags.push(diag(
            f,
            loc,
            subject,
            format!("sharding {s} has {} dimensions but the tensor has rank {rank}", s.rank()),
        ));
    }
    let mut seen = HashSet::new();
    for a in s.axes() {
        if !seen.insert(a) {
            diags.push(diag(f, loc, subject, format!("sharding {s} uses mesh axis `{a}` more than once")));
        }
    }
}

fn def_loc(f: &Function, def: ValueDef) -> Option<crate::Loc> {
    match def {
        ValueDef::Param(_) => f.loc,
        ValueDef::Inst { inst, .. } => f.insts.get(inst.index()).and_then(|i| i.loc),
    }
}

fn check_types(m: &dyn SignatureLookup, f: &Function, id: InstId, diags: &mut Vec<Diagnostic>) {
    let subject = || inst_subject(f, id);
    let inst = f.inst(id);
    let tys: Vec<&crate::TensorType> = inst.operands.iter().map(|&o| f.ty(o)).collect();
    match infer(&inst.op, &tys, m) {
        Err(msg) => diags.push(diag(f, inst.loc, subject(), msg)),
        Ok(expected) => {
            if expected.len() != inst.results.len() {
                diags.push(diag(
                    f,
                    inst.loc,
                    subject(),
                    format!(
                        "`{}` produces {} results but {} are bound",
                        inst.op.name(),
                        expected.len(),
                        inst.results.len()
                    ),
                ));
                return;
            }
            for (k, (e, &r)) in expected.iter().zip(&inst.results).enumerate() {
                let declared = f.ty(r);
                if declared != e {
                    let which = if inst.results.len() > 1 { format!("result {k} ") } else { String::new() };
                    diags.push(diag(
                        f,
                        inst.loc,
                        subject(),
                        format!("{which}is annotated {declared} but `{}` gives {e}", inst.op.name()),
                    ));
                }
            }
        }
    }
}

fn check_call_cycles(m: &Module, diags: &mut Vec<Diagnostic>) {
    // Explicit worklists (crate::callgraph): a chain of thousands of
    // functions must not overflow the verifier's stack.
    let g = CallGraph::new(m);
    let cycles = g.find_cycles();
    for cycle in &cycles {
        let f = &m.functions[cycle[0]];
        let names: Vec<String> = cycle.iter().map(|&i| format!("@{}", g.name(i))).collect();
        diags.push(diag(f, f.loc, "", format!("recursive calls are not allowed: {}", names.join(" -> "))));
    }
    if !cycles.is_empty() {
        return;
    }
    let Some(depths) = g.depths() else { return };
    // Report the outermost too-deep function only (its callees are deep too).
    if let Some(i) = (0..depths.len()).filter(|&i| depths[i] > MAX_CALL_DEPTH).max_by_key(|&i| depths[i]) {
        let f = &m.functions[i];
        diags.push(diag(
            f,
            f.loc,
            "",
            format!("calls nested {} deep, more than the limit of {MAX_CALL_DEPTH}: {}", depths[i], g.deepest_chain(i)),
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{BinaryOp, DType, TensorType};

    fn f32s(s: &[usize]) -> TensorType {
        TensorType::new(DType::F32, s.to_vec())
    }

    #[test]
    fn accepts_well_typed_function() {
        let mut f = Function::new("f");
        let x = f.add_param(Some("x".into()), f32s(&[2]));
        let i = f.add_inst(Op::Binary(BinaryOp::Add), vec![x, x], vec![(f32s(&[2]), None)], None);
        f.results = f.insts[i.index()].results.clone();
        let m = Module { functions: vec![f] };
        verify_module(&m).unwrap();
    }

    #[test]
    fn reports_every_error() {
        let mut f = Function::new("f");
        let x = f.add_param(Some("x".into()), f32s(&[2]));
        let _ = f.add_inst(Op::Binary(BinaryOp::Add), vec![x, x], vec![(f32s(&[3]), Some("x".into()))], None);
        f.add_inst(Op::Unary(crate::UnaryOp::Exp), vec![ValueId(9)], vec![(f32s(&[2]), None)], None);
        let m = Module { functions: vec![f.clone(), f] };
        let IrError::Verify(d) = verify_module(&m).unwrap_err() else { panic!() };
        let text: Vec<String> = d.iter().map(|d| d.to_string()).collect();
        let all = text.join("\n");
        assert!(all.contains("is annotated f32[3] but `add` gives f32[2]"), "{all}");
        assert!(all.contains("duplicate value name `%x`"), "{all}");
        assert!(all.contains("operand 0 (%9) is not a value"), "{all}");
        assert!(all.contains("defined more than once"), "{all}");
    }

    #[test]
    fn rejects_recursion() {
        let mut f = Function::new("f");
        let x = f.add_param(None, f32s(&[]));
        let i = f.add_inst(Op::Call { callee: "f".into(), remat: false }, vec![x], vec![(f32s(&[]), None)], None);
        f.results = f.insts[i.index()].results.clone();
        let m = Module { functions: vec![f] };
        let e = verify_module(&m).unwrap_err().to_string();
        assert!(e.contains("recursive calls are not allowed: @f -> @f"), "{e}");
    }

    #[test]
    fn names() {
        assert!(is_identifier("params.layers.0.w1"));
        assert!(!is_identifier("0x"));
        assert!(is_value_name("0x"));
        assert!(!is_value_name("12"));
    }
}

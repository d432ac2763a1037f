//! The canonical printer.
//!
//! There is exactly one text for every module: two-space indentation, `, `
//! between list items, attributes in a fixed order with defaults left out,
//! every result type printed (even where the parser could infer it), one
//! blank line between functions and a final newline. Together with the
//! parser's rules this makes print -> parse -> print byte-identical.
//!
//! The printer never panics: ids outside the arena (an invalid module the
//! verifier would reject) print as `%N` with type `<invalid>`.

use super::literal::format_literal;
use crate::{Function, Op, TensorSharding, ValueId};
use std::fmt::Write;

/// Prints a module: its functions, separated by one blank line.
pub fn print_module(m: &crate::Module) -> String {
    m.functions.iter().map(print_function).collect::<Vec<_>>().join("\n")
}

/// Prints one function, ending with a newline.
pub fn print_function(f: &Function) -> String {
    let mut out = String::new();
    let params: Vec<String> =
        f.params.iter().map(|&p| format!("{}: {}", f.value_ref(p), typed(f, p, sharding_of(f, p)))).collect();
    let results: Vec<String> = f
        .results
        .iter()
        .enumerate()
        .map(|(k, &r)| typed(f, r, f.result_shardings.get(k).and_then(|s| s.as_ref())))
        .collect();
    let _ = writeln!(out, "func @{}({}) -> ({}) {{", f.name, params.join(", "), results.join(", "));
    for inst in &f.insts {
        out.push_str("  ");
        if !inst.results.is_empty() {
            out.push_str(&refs(f, &inst.results));
            out.push_str(" = ");
        }
        out.push_str(inst.op.name());
        match &inst.op {
            Op::Constant(lit) => {
                out.push(' ');
                out.push_str(&format_literal(lit));
            }
            Op::Call { callee, .. } => {
                let _ = write!(out, " @{callee}({})", refs(f, &inst.operands));
            }
            _ if !inst.operands.is_empty() => {
                out.push(' ');
                out.push_str(&refs(f, &inst.operands));
            }
            _ => {}
        }
        let attrs = op_attrs(&inst.op);
        if !attrs.is_empty() {
            let _ = write!(out, " {{{}}}", attrs.join(", "));
        }
        if !inst.results.is_empty() {
            let types: Vec<String> = inst.results.iter().map(|&r| typed(f, r, sharding_of(f, r))).collect();
            let _ = write!(out, " : {}", types.join(", "));
        }
        out.push('\n');
    }
    out.push_str("  return");
    if !f.results.is_empty() {
        out.push(' ');
        out.push_str(&refs(f, &f.results));
    }
    out.push_str("\n}\n");
    out
}

fn refs(f: &Function, vs: &[ValueId]) -> String {
    vs.iter().map(|&v| f.value_ref(v)).collect::<Vec<_>>().join(", ")
}

fn sharding_of(f: &Function, v: ValueId) -> Option<&TensorSharding> {
    f.values.get(v.index()).and_then(|d| d.sharding.as_ref())
}

/// `f32[8,4]` with its value annotation, if any.
fn typed(f: &Function, v: ValueId, sharding: Option<&TensorSharding>) -> String {
    let mut s = match f.values.get(v.index()) {
        Some(d) => d.ty.to_string(),
        None => "<invalid>".to_string(),
    };
    if let Some(sh) = sharding {
        let _ = write!(s, " {{{}}}", sharding_entries(sh));
    }
    s
}

/// `sharding = [...]` and, if any axis is unreduced, `unreduced = {...}`.
fn sharding_entries(s: &TensorSharding) -> String {
    let mut out = format!("sharding = {s}");
    if !s.unreduced.is_empty() {
        let _ = write!(out, ", unreduced = {{{}}}", s.unreduced.join(", "));
    }
    out
}

fn list<T: ToString>(v: &[T]) -> String {
    format!("[{}]", v.iter().map(T::to_string).collect::<Vec<_>>().join(", "))
}

/// The op's attribute entries in canonical order, defaults omitted.
pub(crate) fn op_attrs(op: &Op) -> Vec<String> {
    let mut a = Vec::new();
    match op {
        Op::Iota { dim, .. } => a.push(format!("dim = {dim}")),
        Op::BroadcastInDim { dims, .. } | Op::Reduce { dims, .. } => a.push(format!("dims = {}", list(dims))),
        Op::Transpose { perm } => a.push(format!("perm = {}", list(perm))),
        Op::Slice { start, limit, stride } => {
            a.push(format!("start = {}", list(start)));
            a.push(format!("limit = {}", list(limit)));
            if stride.iter().any(|&s| s != 1) || stride.len() != start.len() {
                a.push(format!("stride = {}", list(stride)));
            }
        }
        Op::Concatenate { dim } => a.push(format!("dim = {dim}")),
        Op::Pad { low, high, interior } => {
            a.push(format!("low = {}", list(low)));
            a.push(format!("high = {}", list(high)));
            if interior.iter().any(|&i| i != 0) || interior.len() != low.len() {
                a.push(format!("interior = {}", list(interior)));
            }
        }
        Op::DotGeneral(d) => {
            if !d.lhs_batch.is_empty() || !d.rhs_batch.is_empty() {
                a.push(format!("lhs_batch = {}", list(&d.lhs_batch)));
                a.push(format!("rhs_batch = {}", list(&d.rhs_batch)));
            }
            a.push(format!("lhs_contract = {}", list(&d.lhs_contract)));
            a.push(format!("rhs_contract = {}", list(&d.rhs_contract)));
        }
        Op::ShardingConstraint { sharding: s } | Op::Reshard { to: s } => a.push(sharding_entries(s)),
        Op::Call { remat: true, .. } => a.push("remat = true".to_string()),
        Op::Index(i) => a.extend(i.attrs().into_iter().map(|(n, v)| format!("{n} = {v}"))),
        Op::Constant(_)
        | Op::Unary(_)
        | Op::Binary(_)
        | Op::Compare(_)
        | Op::Select
        | Op::Convert { .. }
        | Op::Reshape { .. }
        | Op::Call { remat: false, .. } => {}
    }
    a
}

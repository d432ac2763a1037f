//! The text form of a device program.
//!
//! Device programs are read by people (the `weft lower` command, golden
//! tests, debugging a partitioner decision), so the printer shows exactly
//! what a device executes: one line per step, compute steps in the IR's own
//! syntax (same mnemonics and attributes, local types), collectives with
//! their axes, and `free` lines where buffers die. The grammar is written in
//! `specs/device-program.md`. The printer never panics: a buffer id outside
//! the arena prints with type `<invalid>`.

use super::{BufferId, Collective, DeviceProgram, Step};
use crate::text::{format_literal, op_attrs};
use crate::{Op, ReduceOp};
use std::fmt::Write;

/// Prints `program`, ending with a newline.
pub fn print_program(p: &DeviceProgram) -> String {
    let mut out = String::new();
    let mesh: Vec<String> = p.mesh.axes.iter().map(|(a, n)| format!("{a}={n}")).collect();
    let _ = writeln!(out, "device_program @{} mesh [{}] {{", p.name, mesh.join(", "));
    for &b in &p.inputs {
        let _ = writeln!(out, "  input {} : {}{}", buf(b), ty(p, b), name_comment(p, b));
    }
    for step in &p.steps {
        out.push_str("  ");
        out.push_str(&print_step(p, step));
        out.push('\n');
    }
    out.push_str("  return");
    if !p.outputs.is_empty() {
        let _ = write!(out, " {}", list_bufs(&p.outputs));
    }
    out.push_str("\n}\n");
    out
}

impl std::fmt::Display for DeviceProgram {
    /// The text form ([`print_program`]).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&print_program(self))
    }
}

/// Prints one step (without indentation or newline).
pub fn print_step(p: &DeviceProgram, step: &Step) -> String {
    match step {
        Step::Compute { op, inputs, outputs } => {
            let mut s = format!("{} = {}", list_bufs(outputs), op.name());
            if let Op::Constant(lit) = op {
                let _ = write!(s, " {}", format_literal(lit));
            } else if !inputs.is_empty() {
                let _ = write!(s, " {}", list_bufs(inputs));
            }
            let attrs = op_attrs(op);
            if !attrs.is_empty() {
                let _ = write!(s, " {{{}}}", attrs.join(", "));
            }
            let types: Vec<String> = outputs.iter().map(|&b| ty(p, b)).collect();
            let _ = write!(s, " : {}", types.join(", "));
            if let [one] = outputs.as_slice() {
                s.push_str(&name_comment(p, *one));
            }
            s
        }
        Step::ShardSlice { input, output, dims } => {
            let dims: Vec<String> = dims.iter().map(|d| format!("{{{}}}", d.join(", "))).collect();
            format!(
                "{} = shard_slice {} {{dims = [{}]}} : {}{}",
                buf(*output),
                buf(*input),
                dims.join(", "),
                ty(p, *output),
                name_comment(p, *output)
            )
        }
        Step::Collective { op, input, output } | Step::Start { op, input, output } => format!(
            "{} = {} {} {{{}}} : {}{}",
            buf(*output),
            if matches!(step, Step::Start { .. }) { op.start_name() } else { op.name() },
            buf(*input),
            collective_attrs(op),
            ty(p, *output),
            name_comment(p, *output)
        ),
        Step::Done(b) => format!("done {}", buf(*b)),
        Step::Free(bs) => format!("free {}", list_bufs(bs)),
    }
}

/// The attribute entries of a collective, e.g. `dim = 0, axes = [data]`.
pub fn collective_attrs(c: &Collective) -> String {
    let axes = |a: &[String]| format!("axes = [{}]", a.join(", "));
    match c {
        Collective::AllGather { dim, axes: a } => format!("dim = {dim}, {}", axes(a)),
        Collective::AllReduce { axes: a, op } => format!("{}, op = {}", axes(a), reduce_name(*op)),
        Collective::ReduceScatter { dim, axes: a, op } => {
            format!("dim = {dim}, {}, op = {}", axes(a), reduce_name(*op))
        }
        Collective::AllToAll { split_dim, concat_dim, axes: a } => {
            format!("split_dim = {split_dim}, concat_dim = {concat_dim}, {}", axes(a))
        }
        Collective::CollectivePermute { pairs } => {
            let ps: Vec<String> = pairs.iter().map(|(s, t)| format!("({s}, {t})")).collect();
            format!("pairs = [{}]", ps.join(", "))
        }
    }
}

/// The text form of a collective's reduction (`sum`, `max`, `min`).
pub(crate) fn reduce_name(op: ReduceOp) -> &'static str {
    match op {
        ReduceOp::Sum => "sum",
        ReduceOp::Max => "max",
        ReduceOp::Min => "min",
    }
}

fn buf(b: BufferId) -> String {
    format!("%{}", b.0)
}

fn list_bufs(bs: &[BufferId]) -> String {
    bs.iter().map(|&b| buf(b)).collect::<Vec<_>>().join(", ")
}

fn ty(p: &DeviceProgram, b: BufferId) -> String {
    p.buffers.get(b.index()).map(|x| x.ty.to_string()).unwrap_or_else(|| "<invalid>".into())
}

fn name_comment(p: &DeviceProgram, b: BufferId) -> String {
    match p.buffers.get(b.index()).and_then(|x| x.name.as_deref()) {
        Some(n) => format!("  // {n}"),
        None => String::new(),
    }
}

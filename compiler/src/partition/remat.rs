//! `rematerialize`: values that cost next to nothing to compute are
//! recomputed where they are read instead of being stored once and read
//! back from memory.
//!
//! Why: a training step's backward pass reads values of its forward pass.
//! Autodiff keeps every intermediate a derivative needs: for GELU
//! `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))` that is `x`, `x²`, `tanh`,
//! `0.5·x` and `1 + tanh`, and the splat constants `0.044715`, `0.7978846`
//! and `0.5` as tensors of the activation's shape. Each is written to
//! memory in the forward pass, kept alive across the layers above it, and
//! read back in the backward pass; a value that outlives its forward chain
//! also makes the fused loop that computes it write it out. Only `x` and
//! `tanh` are worth keeping: the rest are one multiply or add of values the
//! backward pass holds anyway. XLA's fusion duplicates such cheap producers
//! into each consumer for the same reason.
//!
//! Two rules, in this order:
//! 1. **Cheap values read after a break.** A value computed by a cheap
//!    elementwise op ([`is_cheap`]: add, sub, mul, neg, abs, max, min,
//!    select, compare, convert) is recomputed right before each elementwise
//!    reader that sits after a step no fused loop crosses (a product, a
//!    reduction, a collective; [`breaks_chains`]), provided each of its
//!    operands is a splat or is read at or after that reader anyway (so no
//!    value lives longer than before). Where every reader gets a copy and
//!    the value is no output, it is no longer computed where it was.
//! 2. **Splats per reader.** A splat (a splat `constant`, a
//!    `broadcast_in_dim` of a rank-0 value; [`Op::is_splat`]) is recomputed
//!    right before each elementwise reader of its shape. Other readers (a
//!    product, a reduction) and the program's outputs keep the stored
//!    original, which is dropped when none is left.
//!
//! A copy sits just before its one reader, so a backend that fuses
//! elementwise steps takes it into the reader's loop and never stores it.
//! Values are unchanged: a copy computes the same elements from the same
//! operands.

use weft_ir::device::{Buffer, BufferId, DeviceProgram, Step};
use weft_ir::{BinaryOp, Op, UnaryOp};

use super::liveness::{last_reads, reads};

/// Recomputes cheap values and splats at their readers (see the module
/// docs). Runs before frees are inserted.
pub(crate) fn rematerialize(p: &mut DeviceProgram) {
    recompute_cheap_values(p);
    recompute_splats(p);
}

/// Whether `op` is cheap enough to compute again instead of reading a
/// stored value: one arithmetic or logic instruction per element.
fn is_cheap(op: &Op) -> bool {
    match op {
        Op::Unary(u) => matches!(u, UnaryOp::Neg | UnaryOp::Abs),
        Op::Binary(b) => matches!(b, BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul | BinaryOp::Max | BinaryOp::Min),
        Op::Select | Op::Compare(_) | Op::Convert { .. } => true,
        _ => false,
    }
}

/// Whether a fused elementwise loop ends at step `s`: anything but an
/// elementwise op, a splat, a broadcast or a free.
fn breaks_chains(s: &Step) -> bool {
    match s {
        Step::Compute { op, .. } => !(op.is_elementwise() || op.is_splat() || matches!(op, Op::BroadcastInDim { .. })),
        Step::Free(_) => false,
        _ => true,
    }
}

/// Whether step `s` is an elementwise step of `b`'s shape (one that takes
/// a copy of `b` into its loop).
fn elementwise_reader(p: &DeviceProgram, s: &Step, b: BufferId) -> bool {
    match s {
        Step::Compute { op, outputs, .. } => {
            op.is_elementwise() && outputs.len() == 1 && p.ty(outputs[0]).shape == p.ty(b).shape
        }
        _ => false,
    }
}

/// For every buffer, the step that writes it with a single-output compute
/// step whose op `pick` accepts.
fn producers(p: &DeviceProgram, pick: impl Fn(&Op) -> bool) -> Vec<Option<usize>> {
    let mut of = vec![None; p.buffers.len()];
    for (i, s) in p.steps.iter().enumerate() {
        if let Step::Compute { op, outputs, .. } = s {
            if outputs.len() == 1 && pick(op) {
                of[outputs[0].index()] = Some(i);
            }
        }
    }
    of
}

/// A fresh buffer of `b`'s type.
fn copy_of(p: &mut DeviceProgram, b: BufferId) -> BufferId {
    let copy = BufferId(p.buffers.len() as u32);
    p.buffers.push(Buffer { ty: p.ty(b).clone(), name: None });
    copy
}

/// Rebuilds the steps: before step `i`, the copies `plan[i]` names (a
/// buffer the step reads, and the step that writes it) are computed into
/// fresh buffers that the step then reads; steps `drop` marks are left out.
fn rebuild(p: &mut DeviceProgram, drop: &[bool], plan: &[Vec<(BufferId, usize)>]) {
    let old = std::mem::take(&mut p.steps);
    let mut steps = Vec::with_capacity(old.len());
    for (i, s) in old.iter().enumerate() {
        if drop[i] {
            continue;
        }
        let mut s = s.clone();
        let mut renamed: Vec<(BufferId, BufferId)> = Vec::new();
        for &(b, w) in &plan[i] {
            if renamed.iter().any(|&(from, _)| from == b) {
                continue;
            }
            let Step::Compute { op, inputs, .. } = &old[w] else { unreachable!("a producer is a compute step") };
            let copy = copy_of(p, b);
            steps.push(Step::Compute { op: op.clone(), inputs: inputs.clone(), outputs: vec![copy] });
            renamed.push((b, copy));
        }
        if let Step::Compute { inputs, .. } = &mut s {
            for x in inputs.iter_mut() {
                if let Some(&(_, copy)) = renamed.iter().find(|&&(from, _)| from == *x) {
                    *x = copy;
                }
            }
        }
        steps.push(s);
    }
    p.steps = steps;
}

/// Rule 1 of the module docs.
fn recompute_cheap_values(p: &mut DeviceProgram) {
    let cheap = producers(p, is_cheap);
    let splat = producers(p, Op::is_splat);
    // The last step that reads each buffer (program outputs: past the end).
    let last_read: Vec<usize> = last_reads(p).into_iter().map(|r| r.unwrap_or(0)).collect();
    // How many chain breaks come before each step.
    let mut breaks = Vec::with_capacity(p.steps.len());
    let mut n = 0usize;
    for s in &p.steps {
        breaks.push(n);
        n += usize::from(breaks_chains(s));
    }
    let copies_for = |r: usize, s: &Step| {
        reads(s)
            .into_iter()
            .filter_map(|b| {
                let w = cheap[b.index()]?;
                let Step::Compute { inputs, .. } = &p.steps[w] else { return None };
                let alive = |o: &BufferId| splat[o.index()].is_some() || last_read[o.index()] >= r;
                (breaks[r] > breaks[w] && elementwise_reader(p, s, b) && inputs.iter().all(alive)).then_some((b, w))
            })
            .collect()
    };
    let plan: Vec<Vec<(BufferId, usize)>> = p.steps.iter().enumerate().map(|(i, s)| copies_for(i, s)).collect();
    // A value every reader of which gets a copy (and that is no output)
    // is no longer computed where it was.
    let mut stays = vec![false; p.buffers.len()];
    let mut copied = vec![false; p.buffers.len()];
    for o in &p.outputs {
        stays[o.index()] = true;
    }
    for (s, copies) in p.steps.iter().zip(&plan) {
        for b in reads(s) {
            if !copies.iter().any(|&(c, _)| c == b) {
                stays[b.index()] = true;
            }
        }
        for &(b, w) in copies {
            copied[b.index()] = true;
            // The copy reads the value's operands.
            reads(&p.steps[w]).into_iter().for_each(|o| stays[o.index()] = true);
        }
    }
    let drop: Vec<bool> = (p.steps.iter())
        .map(|s| match s {
            Step::Compute { outputs, .. } if outputs.len() == 1 => {
                copied[outputs[0].index()] && !stays[outputs[0].index()]
            }
            _ => false,
        })
        .collect();
    rebuild(p, &drop, &plan);
}

/// Rule 2 of the module docs.
fn recompute_splats(p: &mut DeviceProgram) {
    let splat = producers(p, Op::is_splat);
    // Splats some step still reads as stored (or the program returns).
    let mut stays = vec![false; p.buffers.len()];
    for o in &p.outputs {
        stays[o.index()] = true;
    }
    for s in &p.steps {
        for b in reads(s) {
            if splat[b.index()].is_some() && !elementwise_reader(p, s, b) {
                stays[b.index()] = true;
            }
        }
    }
    let drop: Vec<bool> = (p.steps.iter())
        .map(|s| match s {
            Step::Compute { op, outputs, .. } if op.is_splat() && outputs.len() == 1 => !stays[outputs[0].index()],
            _ => false,
        })
        .collect();
    let plan: Vec<Vec<(BufferId, usize)>> = (p.steps.iter())
        .map(|s| {
            (reads(s).into_iter())
                .filter_map(|b| splat[b.index()].filter(|_| elementwise_reader(p, s, b)).map(|w| (b, w)))
                .collect()
        })
        .collect();
    rebuild(p, &drop, &plan);
}

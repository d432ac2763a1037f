//! `cse`: a compute step that repeats an
//! earlier one (the same op and attributes on the same operands, with the
//! same result type) reads the earlier result instead of computing it
//! again.
//!
//! Why: a training step is emitted per parameter and per layer, and
//! autodiff emits the backward pass apart from the forward one, so the same
//! value is often computed many times. AdamW's bias corrections
//! `1 − β₁ᵗ` and `1 − β₂ᵗ` are one scalar chain each, repeated for every
//! parameter (65 copies of a 16-op chain in a 6-layer GPT: 65 kernel
//! launches on a GPU where one does); a causal mask is built again in every
//! layer. Every op of the IR is a pure function of its operands, so a
//! repeat gives the same bits and dropping it changes no result.
//!
//! **Memory.** Reading the earlier result keeps it alive until the last
//! reader of the repeat. A repeat is merged only when that costs nothing
//! or little:
//! - the earlier result is still live where the repeat is computed (a
//!   later step reads it, or it is an output): the merged value then lives
//!   within the union of the two lifetimes, so no step holds more bytes
//!   than before; or
//! - the result is at most [`SMALL_BYTES`] (scalars, a norm's gains, a
//!   small mask): each merged value holds at most that much longer.
//!
//! A `shard_slice` (a device's block of a replicated value: local, no
//! communication) merges like a compute step. Splats (a splat constant, a scalar broadcast) merge too, so that the
//! steps reading equal constants are seen to be equal; `rematerialize`,
//! which runs later, recomputes a splat right before each elementwise
//! reader again, where it costs nothing. A repeat that is a program output is kept (outputs stay distinct
//! buffers). Collectives are never merged. Steps are visited in order and
//! a merged repeat's readers read the earlier value, so chains of repeats
//! (a whole repeated expression) merge step by step.

use std::collections::HashMap;
use weft_ir::device::{BufferId, DeviceProgram, Step};
use weft_ir::Op;

use super::liveness::{reads, rename_reads};

/// Largest result (bytes per device) merged when the earlier result is
/// no longer live at the repeat: 256 KiB, a `[256, 256]` `i32` causal-mask
/// index.
pub const SMALL_BYTES: usize = 256 * 1024;

/// Whether a step's result may be merged with an earlier equal one.
fn mergeable(op: &Op) -> bool {
    !matches!(op, Op::Call { .. } | Op::ShardingConstraint { .. } | Op::Reshard { .. })
}

/// Merges repeated compute steps into their first occurrence; see the
/// module docs. Runs before frees are inserted.
pub(crate) fn eliminate_common_subexpressions(p: &mut DeviceProgram) {
    let n = p.buffers.len();
    // Last step reading each buffer (`usize::MAX` for an output).
    let mut last_use = vec![0usize; n];
    for (i, s) in p.steps.iter().enumerate() {
        for b in reads(s) {
            last_use[b.index()] = last_use[b.index()].max(i);
        }
    }
    let mut is_output = vec![false; n];
    for b in &p.outputs {
        last_use[b.index()] = usize::MAX;
        is_output[b.index()] = true;
    }
    let mut alias: Vec<BufferId> = (0..n as u32).map(BufferId).collect();
    // Candidates by a key of op, operands and result type; `==` on the op
    // decides (the key is only a hash).
    let mut first: HashMap<String, Vec<(Option<Op>, BufferId)>> = HashMap::new();
    let mut keep = Vec::with_capacity(p.steps.len());

    for (i, step) in std::mem::take(&mut p.steps).into_iter().enumerate() {
        let mut step = step;
        rename_reads(&mut step, &alias);
        // A step that may merge: its key, its result, and what decides
        // equality beyond the key (the op; a shard slice's is in the key).
        let (key, out, op) = match &step {
            Step::Compute { op, inputs, outputs } if outputs.len() == 1 && mergeable(op) => {
                (format!("{op:?} {inputs:?}"), outputs[0], Some(op.clone()))
            }
            Step::ShardSlice { input, output, dims } => (format!("shard_slice {dims:?} {input:?}"), *output, None),
            _ => {
                keep.push(step);
                continue;
            }
        };
        let ty = &p.buffers[out.index()].ty;
        let key = format!("{key} {ty:?}");
        let earlier = first.get(&key).and_then(|v| v.iter().find(|(o, _)| *o == op)).map(|&(_, b)| b);
        match earlier {
            Some(e)
                if !is_output[out.index()]
                    && p.buffers[e.index()].ty == *ty
                    && (last_use[e.index()] > i || ty.size_bytes() <= SMALL_BYTES) =>
            {
                alias[out.index()] = e;
                last_use[e.index()] = last_use[e.index()].max(last_use[out.index()]);
            }
            _ => {
                first.entry(key).or_default().push((op, out));
                keep.push(step);
            }
        }
    }
    p.steps = keep;
}

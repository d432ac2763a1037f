//! `cse`: a compute step that repeats an earlier one (the same op and
//! attributes on the same operands, with the same result type) reads the
//! earlier result instead of computing it again.
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
//! - keeping it alive from its last reader to the repeat keeps every step
//!   in between at or below the program's peak of live bytes; or
//! - the result is at most [`SMALL_BYTES`] (scalars, a norm's gains, a
//!   small mask) and the bytes merged this way stay within
//!   [`SMALL_BUDGET`] in all: the peak grows by at most that.
//!
//! Dead steps are removed first, so a read by a step nothing needs (a
//! transpose folded into its dots) does not count as keeping a value
//! alive. Dense constants of more than [`DENSE_LIMIT`] elements are not
//! compared.
//!
//! A `shard_slice` (a device's block of a replicated value: local, no
//! communication) merges like a compute step. Splats (a splat constant, a
//! scalar broadcast) merge too, so that the steps reading equal constants
//! are seen to be equal; `rematerialize`, which runs later, recomputes a
//! splat right before each elementwise reader again, where it costs
//! nothing. A repeat that is a program output is kept (outputs stay
//! distinct buffers). Collectives are never merged. Steps are visited in order and
//! a merged repeat's readers read the earlier value, so chains of repeats
//! (a whole repeated expression) merge step by step.

use std::collections::HashMap;
use weft_ir::device::{BufferId, DeviceProgram, Step};
use weft_ir::{LiteralData, Op};

use super::liveness::{remove_dead_steps, rename_reads, Lifetimes};

/// Largest result (bytes per device) merged when the earlier result is
/// no longer live at the repeat and the peak would grow: 256 KiB, a
/// `[256, 256]` `i32` causal-mask index.
pub const SMALL_BYTES: usize = 256 * 1024;

/// The most bytes per device merged under [`SMALL_BYTES`] in one program.
pub const SMALL_BUDGET: usize = 1024 * 1024;

/// Dense constants of more elements are never merged (nor printed into a
/// key).
pub const DENSE_LIMIT: usize = 1024;

/// Whether a step's result may be merged with an earlier equal one.
fn mergeable(op: &Op) -> bool {
    match op {
        Op::Call { .. } | Op::ShardingConstraint { .. } | Op::Reshard { .. } => false,
        Op::Constant(l) => !matches!(l.data, LiteralData::Dense(_)) || l.ty.num_elements() <= DENSE_LIMIT,
        _ => true,
    }
}

/// Merges repeated compute steps into their first occurrence; see the
/// module docs. Runs before frees are inserted.
pub(crate) fn eliminate_common_subexpressions(p: &mut DeviceProgram) {
    remove_dead_steps(p);
    let n = p.buffers.len();
    let mut life = Lifetimes::of(p);
    let mut is_output = vec![false; n];
    for b in &p.outputs {
        is_output[b.index()] = true;
    }
    let mut alias: Vec<BufferId> = (0..n as u32).map(BufferId).collect();
    // Candidates by a key of op, operands and result type; `==` on the op
    // decides (the key is only a hash).
    let mut first: HashMap<String, Vec<(Option<Op>, BufferId)>> = HashMap::new();
    let mut small_left = SMALL_BUDGET;
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
        let bytes = ty.size_bytes();
        let key = format!("{key} {ty:?}");
        // The newest equal result whose merge memory allows, its last
        // reader, and whether it takes the small budget.
        let merge = (!is_output[out.index()])
            .then(|| first.get(&key))
            .flatten()
            .into_iter()
            .flat_map(|v| v.iter().rev())
            .filter(|(o, e)| *o == op && p.buffers[e.index()].ty == *ty)
            .find_map(|&(_, e)| {
                let last = life.last[e.index()];
                // At step `i` the earlier value takes the repeat's place.
                if last >= i || life.fits(bytes, last + 1, i) {
                    Some((e, last, false))
                } else {
                    (bytes <= SMALL_BYTES && bytes <= small_left).then_some((e, last, true))
                }
            });
        match merge {
            Some((e, last, small)) => {
                if last < i {
                    life.extend(bytes, last + 1, i);
                }
                if small {
                    small_left -= bytes;
                }
                alias[out.index()] = e;
                life.last[e.index()] = last.max(life.last[out.index()]);
            }
            None => {
                first.entry(key).or_default().push((op, out));
                keep.push(step);
            }
        }
    }
    p.steps = keep;
}

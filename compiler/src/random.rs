//! PRNG helpers for transforms, over [`weft_ir::prng_emit`].

use crate::emit::Emitter;
use weft_ir::ValueId;

/// `fold_in(key, data)` for a `u32[2]` key and a u32 scalar.
pub fn fold_in(e: &mut Emitter<'_>, key: ValueId, data: ValueId) -> ValueId {
    weft_ir::prng_emit::fold_in(&mut e.f, key, data)
}

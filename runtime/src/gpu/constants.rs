//! Constants computed once per logical device.
//!
//! A training step's device program spells out its constants: a GPT step
//! has about 900 splat `constant`s (`1e-5`, `0.125`, `-inf` masks, the
//! optimizer's scalars) and a few `iota`s, and every step computed each of
//! them again - an upload of the value and a fill kernel, about half of
//! the step's kernel launches. On a GPU those launches, not the
//! arithmetic, set the step time. A constant's value depends only on the
//! op and its type, and a CubeCL buffer is never written after the kernel
//! that makes it (every op, fused chain and collective writes a fresh
//! buffer), so the first result can be handed out again: the cache keeps
//! it, keyed by the op's attributes and result type.
//!
//! The cache keeps every small constant (at most [`SMALL`] bytes: a
//! program has a bounded number of distinct ones, and they are most of
//! its launches) and larger ones while they total at most [`LIMIT`] bytes
//! per logical device; beyond that a large constant is computed afresh
//! each time, as before (same values either way, so results never depend
//! on what is cached). Before small constants were kept apart, a GPT
//! step's few large masks filled the budget during the first step and
//! its scalars were computed again on every step. That memory is outside
//! the executor's per-device accounting of live buffers (`specs/runtime.md`
//! §5 says so).

use super::{CubeBuffer, CubeclBackend, Storage};
use crate::error::RuntimeError;
use cubecl::prelude::Runtime;
use std::collections::HashMap;
use std::sync::Mutex;
use weft_ir::{LiteralData, Op, TensorType};

/// The most bytes of large constants kept per logical device.
pub const LIMIT: usize = 128 << 20;
/// Constants of at most this many bytes are always kept.
pub const SMALL: usize = 64 << 10;

/// What identifies a cached constant: the splat value's bits (every NaN
/// payload its own) or the iota's dimension, and the result type.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Key {
    Splat(u64, TensorType),
    Iota(usize, TensorType),
}

impl Key {
    /// The bytes of the value on the device.
    fn bytes(&self) -> usize {
        let (Key::Splat(_, ty) | Key::Iota(_, ty)) = self;
        ty.num_elements().max(1) * Storage::of(ty.dtype).size()
    }

    fn of(op: &Op, ty: &TensorType) -> Option<Key> {
        match op {
            Op::Constant(l) => match l.data {
                LiteralData::Splat(v) => Some(Key::Splat(v.to_bits(), ty.clone())),
                LiteralData::Dense(_) => None,
            },
            Op::Iota { dim, .. } => Some(Key::Iota(*dim, ty.clone())),
            _ => None,
        }
    }
}

/// The constants of one logical device (see the module documentation).
pub(super) struct ConstantCache<R: Runtime> {
    inner: Mutex<(HashMap<Key, CubeBuffer<R>>, usize)>,
}

impl<R: Runtime> Default for ConstantCache<R> {
    fn default() -> Self {
        ConstantCache { inner: Mutex::new((HashMap::new(), 0)) }
    }
}

impl<R: Runtime> ConstantCache<R> {
    /// The value of `op` (a `constant` or an `iota`) with result type `ty`:
    /// the kept buffer, or `make`'s (kept when it is a splat constant or an
    /// iota that is small or fits under [`LIMIT`]; a dense constant is
    /// always `make`'s).
    pub(super) fn get_or(
        &self,
        be: &CubeclBackend<R>,
        op: &Op,
        ty: &TensorType,
        make: impl FnOnce(&CubeclBackend<R>) -> Result<CubeBuffer<R>, RuntimeError>,
    ) -> Result<CubeBuffer<R>, RuntimeError> {
        let Some(key) = Key::of(op, ty) else { return make(be) };
        if let Some(b) = self.lock().0.get(&key) {
            return Ok(b.clone());
        }
        let b = make(be)?;
        let bytes = key.bytes();
        let mut inner = self.lock();
        if let Some(used) = admit(bytes, inner.1) {
            inner.1 = used;
            inner.0.insert(key, b.clone());
        }
        Ok(b)
    }

    /// How many constants are kept, and their bytes.
    pub(super) fn stats(&self) -> (usize, usize) {
        let inner = self.lock();
        (inner.0.len(), inner.0.keys().map(|k| k.bytes()).sum())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (HashMap<Key, CubeBuffer<R>>, usize)> {
        // A panic while holding the lock leaves a consistent map (inserts
        // are single calls), so a poisoned lock is still usable.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Whether a constant of `bytes` is kept when large constants already kept
/// take `large` bytes, and their bytes then: small ones always, large ones
/// while they fit under [`LIMIT`].
fn admit(bytes: usize, large: usize) -> Option<usize> {
    if bytes <= SMALL {
        Some(large)
    } else if large + bytes <= LIMIT {
        Some(large + bytes)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_constants_are_kept_after_large_ones_fill_the_budget() {
        assert_eq!(admit(LIMIT, 0), Some(LIMIT));
        assert_eq!(admit(SMALL + 1, LIMIT), None, "the budget is full");
        assert_eq!(admit(4, LIMIT), Some(LIMIT), "a scalar is kept anyway");
        assert_eq!(admit(SMALL, LIMIT), Some(LIMIT));
    }
}

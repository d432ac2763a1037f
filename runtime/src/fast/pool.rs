//! Reuse of freed `f32` storage.
//!
//! A training step allocates and frees the same buffer sizes every step.
//! Large allocations go straight to the operating system, which hands back
//! fresh pages that the kernel zeroes on first touch: a profile of the TP
//! step showed a fifth of the time in page clearing. The pool keeps the
//! storage of every freed `f32` buffer, by length, and hands it out again,
//! so in the steady state a step runs on the memory the previous one freed.
//! The pool holds at most [`MAX_PER_LENGTH`] buffers of each length, so it
//! stays bounded even where storage enters it from outside (the results of
//! host-staged collectives).

use std::collections::HashMap;
use weft_ir::tensor::HostTensor;

/// Buffers shorter than this are left to the allocator.
const MIN_POOLED: usize = 1 << 12;

/// At most this many free buffers of one length are kept: storage that
/// enters the pool faster than steps take it (the results of host-staged
/// collectives are allocated outside it) is returned to the allocator.
const MAX_PER_LENGTH: usize = 8;

/// Freed `f32` storage by length.
#[derive(Clone, Debug, Default)]
pub(crate) struct Pool {
    free: HashMap<usize, Vec<Vec<f32>>>,
}

impl Pool {
    /// Storage for `len` elements; its contents are unspecified (every
    /// caller overwrites all of it).
    pub fn take(&mut self, len: usize) -> Vec<f32> {
        match self.free.get_mut(&len).and_then(Vec::pop) {
            Some(v) => v,
            None => vec![0.0; len],
        }
    }

    /// Keeps the storage of a freed buffer.
    pub fn give(&mut self, t: HostTensor) {
        if let HostTensor::F32(a) = t {
            if a.len() >= MIN_POOLED && a.is_standard_layout() {
                let len = a.len();
                let (v, offset) = a.into_raw_vec_and_offset();
                let bucket = self.free.entry(len).or_default();
                if offset.unwrap_or(0) == 0 && v.len() == len && bucket.len() < MAX_PER_LENGTH {
                    bucket.push(v);
                }
            }
        }
    }
}

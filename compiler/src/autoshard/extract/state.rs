//! Partial plans: the per-value words the search keeps, their hashing,
//! and what one extension step records.

use super::super::persist::PArray;
use super::MatRec;
use std::rc::Rc;

#[derive(Clone)]
pub(super) struct Trace {
    pub(super) prev: Option<Rc<Trace>>,
    pub(super) opt: u32,
    pub(super) combo: u32,
}

/// A partial plan. `mats` holds, per value, the bit set of its classes
/// available (low 58 bits) and its home class + 1 (top 6 bits); zero when
/// the value is not live.
#[derive(Clone)]
pub(super) struct State {
    pub(super) cost: f64,
    /// Cost of the base plan's future from here (see [`Ctx::future`]).
    pub(super) fut: f64,
    pub(super) peak: f64,
    pub(super) live: f64,
    pub(super) hash: u64,
    pub(super) mats: PArray,
    pub(super) homes: PArray,
    pub(super) trace: Option<Rc<Trace>>,
}

pub(super) const MASK: u64 = (1 << 58) - 1;

/// Assumed future cost of a use the base plan cannot serve.
pub(super) const UNREACHABLE: f64 = 1e30;

/// What an extension step reads of a partial plan: its totals and, per
/// value, its word (see [`State`]), per parameter its class + 1.
pub(super) trait View {
    fn head(&self) -> (f64, f64, f64, f64, u64);
    fn mat(&self, v: usize) -> u64;
    fn home(&self, p: usize) -> u64;
}

impl View for State {
    fn head(&self) -> (f64, f64, f64, f64, u64) {
        (self.cost, self.fut, self.peak, self.live, self.hash)
    }
    fn mat(&self, v: usize) -> u64 {
        self.mats.get(v)
    }
    fn home(&self, p: usize) -> u64 {
        self.homes.get(p)
    }
}

/// A partial plan in flat tables, for following one given plan.
pub(super) struct Flat {
    pub(super) head: (f64, f64, f64, f64, u64),
    pub(super) mats: Vec<u64>,
    pub(super) homes: Vec<u64>,
}

impl View for Flat {
    fn head(&self) -> (f64, f64, f64, f64, u64) {
        self.head
    }
    fn mat(&self, v: usize) -> u64 {
        self.mats[v]
    }
    fn home(&self, p: usize) -> u64 {
        self.homes[p]
    }
}

/// The indices of the set bits of `mask`, lowest first.
pub(super) fn bits(mut mask: u64) -> impl Iterator<Item = usize> {
    std::iter::from_fn(move || {
        (mask != 0).then(|| {
            let b = mask.trailing_zeros() as usize;
            mask &= mask - 1;
            b
        })
    })
}

pub(super) fn enc(mask: u64, home: u8) -> u64 {
    mask | ((home as u64 + 1) << 58)
}

pub(super) fn home_bit(e: u64) -> u64 {
    1 << ((e >> 58) - 1)
}

#[derive(Clone, Copy)]
pub(super) struct Outcome {
    pub(super) cost: f64,
    pub(super) fut: f64,
    pub(super) peak: f64,
    pub(super) live: f64,
    pub(super) hash: u64,
}

/// Events of one step, recorded when a candidate is materialised.
#[derive(Default)]
pub(super) struct Rec {
    /// Per changed value, its word while the instruction runs and after.
    pub(super) during: Vec<(u32, u64)>,
    pub(super) mats: Vec<(u32, u64)>,
    pub(super) homes: Vec<(usize, u8)>,
    pub(super) made: Vec<MatRec>,
    pub(super) result_classes: Vec<u8>,
}

pub(super) fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

pub(super) fn zv(v: u32, word: u64) -> u64 {
    if word == 0 {
        0
    } else {
        mix(mix(v as u64) ^ word)
    }
}

pub(super) fn zp(p: usize, ci: u8) -> u64 {
    mix(mix(p as u64 ^ 0xA5A5_0000_0000) ^ ci as u64)
}

//! Which examples a step reads: a pure function of (seed, epoch, step).
//!
//! Every choice is drawn from weft's Threefry-2x32 (`weft_ir::prng`), keyed
//! by the run's seed and a per-purpose tag and indexed by the *global* row
//! (`step * batch + row`), never by a device, a process or a queue. So a
//! batch is the same on any mesh, with any prefetch depth, and a resumed run
//! draws exactly what the uninterrupted one drew: the data position is
//! derived from the step counter that the checkpoint already holds.
//!
//! - Token streams: row `r` is the window of `seq + 1` tokens starting at
//!   `uniform(0 .. n - seq)` from the 64 random bits of counter `r`
//!   (shuffled), or at `(r mod (n - 1) / seq) * seq` (in order).
//! - Tables: the example stream is epoch 0's permutation, then epoch 1's,
//!   ...; position `p = step * batch + row` is example `perm_e[p mod N]` of
//!   epoch `e = p / N` (a batch may straddle two epochs, so every example
//!   appears exactly once per epoch). Each epoch's permutation is a
//!   Fisher–Yates shuffle driven by `fold_in(fold_in(key, hi(e)), lo(e))`.

use std::sync::{Arc, Mutex};
use weft_ir::prng::Key;

/// Tag of the training windows' key.
const TAG_WINDOWS: u32 = 0xDA7A_0001;
/// Tag of the per-epoch permutations' key.
const TAG_EPOCHS: u32 = 0xDA7A_0002;

/// Maps 64 random bits to `0..n` (`n >= 1`) by the multiply-shift method:
/// the bias is below `n / 2^64`, far under anything a test can see.
pub fn below(bits: u64, n: u64) -> u64 {
    ((u128::from(bits) * u128::from(n)) >> 64) as u64
}

/// The key of the training windows of a run with `seed`.
fn windows_key(seed: u64) -> Key {
    Key::from_seed(seed).fold_in(TAG_WINDOWS)
}

/// The key of the per-epoch permutations of a run with `seed`.
fn epochs_key(seed: u64) -> Key {
    Key::from_seed(seed).fold_in(TAG_EPOCHS)
}

/// Epoch `epoch`'s permutation of `0..n` (Fisher–Yates over Threefry bits).
pub fn permutation(seed: u64, epoch: u64, n: usize) -> Vec<u64> {
    permutation_under(epochs_key(seed), epoch, n)
}

fn permutation_under(epochs: Key, epoch: u64, n: usize) -> Vec<u64> {
    let key = epochs.fold_in((epoch >> 32) as u32).fold_in(epoch as u32);
    let mut p: Vec<u64> = (0..n as u64).collect();
    for i in (1..n).rev() {
        let j = below(key.bits64_at(i as u64), i as u64 + 1) as usize;
        p.swap(i, j);
    }
    p
}

/// How rows map to examples.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    /// Random windows / a permutation per epoch.
    Shuffled,
    /// The stream in order (windows side by side, examples by index).
    Sequential,
}

/// The examples of a split: `examples(step, rows)` gives, per row, the
/// example index (tables) or window start (token streams).
pub struct Sampler {
    /// The run's window and permutation keys (derived from the seed once).
    windows: Key,
    epochs_key: Key,
    order: Order,
    batch: usize,
    kind: Kind,
    /// The permutations of the last two epochs used (a batch may straddle
    /// two), so an epoch is shuffled once, not once per step.
    epochs: Mutex<Vec<(u64, Arc<Vec<u64>>)>>,
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    /// A token stream of `tokens` tokens read in windows of `seq + 1`.
    Windows { tokens: u64, seq: u64 },
    /// A table of `examples` rows.
    Table { examples: u64 },
}

impl Sampler {
    /// Windows of `seq + 1` tokens over a stream of `tokens` (> `seq`).
    pub fn windows(seed: u64, order: Order, batch: usize, tokens: u64, seq: usize) -> Sampler {
        Sampler::new(seed, order, batch, Kind::Windows { tokens, seq: seq as u64 })
    }

    /// Examples of a table of `examples` (>= 1) rows.
    pub fn table(seed: u64, order: Order, batch: usize, examples: u64) -> Sampler {
        Sampler::new(seed, order, batch, Kind::Table { examples })
    }

    fn new(seed: u64, order: Order, batch: usize, kind: Kind) -> Sampler {
        Sampler {
            windows: windows_key(seed),
            epochs_key: epochs_key(seed),
            order,
            batch,
            kind,
            epochs: Mutex::new(Vec::new()),
        }
    }

    /// Rows in the global batch.
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// Examples (tables) per epoch, or windows that tile the stream once
    /// (token streams): how many rows one epoch has.
    pub fn epoch_rows(&self) -> u64 {
        match self.kind {
            Kind::Windows { tokens, seq } => ((tokens - 1) / seq).max(1),
            Kind::Table { examples } => examples,
        }
    }

    /// Per row of `rows` (of the global batch) of step `step`: the example
    /// index or window start.
    pub fn examples(&self, step: u64, rows: std::ops::Range<usize>) -> Vec<u64> {
        let base = step.saturating_mul(self.batch as u64);
        rows.map(|r| self.example(base.saturating_add(r as u64))).collect()
    }

    fn example(&self, pos: u64) -> u64 {
        match (self.kind, self.order) {
            // The window start of global row `pos`: uniform over the valid starts.
            (Kind::Windows { tokens, seq }, Order::Shuffled) => below(self.windows.bits64_at(pos), tokens - seq),
            (Kind::Windows { seq, .. }, Order::Sequential) => (pos % self.epoch_rows()) * seq,
            (Kind::Table { examples }, Order::Sequential) => pos % examples,
            (Kind::Table { examples }, Order::Shuffled) => {
                let perm = self.epoch(pos / examples, examples as usize);
                perm[(pos % examples) as usize]
            }
        }
    }

    fn epoch(&self, epoch: u64, n: usize) -> Arc<Vec<u64>> {
        let mut cache = self.epochs.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, p)) = cache.iter().find(|(e, _)| *e == epoch) {
            return p.clone();
        }
        let p = Arc::new(permutation_under(self.epochs_key, epoch, n));
        if cache.len() == 2 {
            cache.remove(0);
        }
        cache.push((epoch, p.clone()));
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permutations_differ_by_epoch_and_seed_and_are_permutations() {
        let a = permutation(1, 0, 100);
        let mut s = a.clone();
        s.sort();
        assert_eq!(s, (0..100).collect::<Vec<_>>());
        assert_ne!(a, permutation(1, 1, 100));
        assert_ne!(a, permutation(2, 0, 100));
        assert_eq!(a, permutation(1, 0, 100));
    }

    #[test]
    fn below_stays_in_range() {
        for n in [1u64, 2, 3, 1000, u64::MAX] {
            assert!(below(u64::MAX, n) < n);
            assert_eq!(below(0, n), 0);
        }
    }
}

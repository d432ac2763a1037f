//! Which old steps to delete after a save.
//!
//! Keeping only the last few checkpoints bounds disk use; keeping every
//! K-th step as well preserves a sparse history (for evaluation or for
//! going back past a divergence). Deletion itself is crash-safe
//! ([`super::fsutil::delete_step`]).

/// A retention policy, applied after every committed save.
///
/// Only steps up to the one just saved are considered: steps newer than it
/// belong to an abandoned run (one resumed from an older step) and are left
/// until the resumed run overwrites them. Among those, the newest
/// `keep_last` are kept (the one just saved always is), and so is every
/// step divisible by `keep_every`.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Retention {
    /// Keep this many newest steps (at least 1); `None` keeps every step.
    pub keep_last: Option<usize>,
    /// Also keep every step that is a multiple of this (if non-zero).
    pub keep_every: Option<u64>,
}

impl Retention {
    /// Keeps everything.
    pub fn keep_all() -> Retention {
        Retention::default()
    }

    /// Keeps the newest `n` steps and every multiple of `every` (if given).
    pub fn last(n: usize, every: Option<u64>) -> Retention {
        Retention { keep_last: Some(n), keep_every: every }
    }

    /// The steps of `committed` to delete after saving `saved`.
    pub fn to_delete(&self, committed: &[u64], saved: u64) -> Vec<u64> {
        let Some(n) = self.keep_last else { return Vec::new() };
        let mut older: Vec<u64> = committed.iter().copied().filter(|&s| s < saved).collect();
        older.sort_unstable();
        let keep_recent = n.max(1) - 1; // the saved step is one of the newest n
        let cut = older.len().saturating_sub(keep_recent);
        older[..cut].iter().copied().filter(|&s| !matches!(self.keep_every, Some(k) if k > 0 && s % k == 0)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_last_n_and_every_kth() {
        let steps: Vec<u64> = (1..=10).map(|s| s * 10).collect();
        assert_eq!(Retention::keep_all().to_delete(&steps, 100), Vec::<u64>::new());
        assert_eq!(Retention::last(3, None).to_delete(&steps, 100), vec![10, 20, 30, 40, 50, 60, 70]);
        assert_eq!(Retention::last(2, Some(40)).to_delete(&steps, 100), vec![10, 20, 30, 50, 60, 70]);
        assert_eq!(Retention::last(0, None).to_delete(&[5], 5), Vec::<u64>::new());
    }

    #[test]
    fn never_touches_newer_steps_of_an_abandoned_run() {
        // Resumed from 20 (30 was corrupt); saving 25 keeps 30 and the newest older one.
        assert_eq!(Retention::last(2, None).to_delete(&[10, 20, 25, 30], 25), vec![10]);
    }
}

//! The future a partial plan is ranked with: the base plan's cost of
//! serving each live value's remaining uses from what the partial plan
//! holds.

use super::ctx::{Ctx, RootTarget};
use super::state::{View, MASK, UNREACHABLE};
use smallvec::SmallVec;

impl Ctx<'_> {
    /// The base plan's cost of serving value `u`'s uses after `step` (and
    /// its return, when the layout it is returned in is known) from the
    /// classes in `mask`: the future the ranking assumes.
    pub(super) fn future(&mut self, u: u32, mask: u64, step: usize, homes: &dyn Fn(usize) -> Option<u8>) -> f64 {
        let Some(base) = self.base.as_ref() else { return 0.0 };
        if mask == 0 {
            return 0.0;
        }
        let list = &base.targets[u as usize];
        let start = list.partition_point(|&(j, _)| j <= step);
        let root = match base.root[u as usize] {
            Some(RootTarget::Fixed(t)) => Some(t),
            Some(RootTarget::Alias(i, p)) => homes(p).and_then(|h| self.s.alias_class[i].get(&h).copied()),
            None => None,
        };
        if start == list.len() && root.is_none() {
            return 0.0;
        }
        let key = (base.suffix[u as usize][start], mask, root.map_or(0, |t| t as u16 + 1));
        if let Some(&c) = self.fut_memo.get(&key) {
            return c;
        }
        let mut have = mask;
        let mut total = 0.0;
        let targets = list[start..].iter().map(|&(_, t)| t).chain(root);
        for t in targets {
            match self.paths.get(self.p, u, have, t) {
                Some((c, add)) => {
                    total += c;
                    have |= add;
                }
                None => {
                    // Unreachable (a limit cut the e-graph): a large finite
                    // penalty keeps the ranking's sums exact.
                    total = UNREACHABLE;
                    break;
                }
            }
        }
        self.fut_memo.insert(key, total);
        total
    }

    /// Change of the assumed future when `st` takes the step recorded in
    /// `over` (the values it touches, and those the base plan uses at this
    /// step, whose remaining uses shrink).
    pub(super) fn future_delta(
        &mut self,
        st: &dyn View,
        step: usize,
        over: &[(u32, u64)],
        new_homes: &[(usize, u8)],
    ) -> f64 {
        if self.base.is_none() {
            return 0.0;
        }
        let mut vals: SmallVec<[u32; 16]> = over.iter().map(|e| e.0).collect();
        vals.extend(self.base.as_ref().expect("base").used_at[step].iter().copied());
        vals.sort_unstable();
        vals.dedup();
        let old_home = |p: usize| st.home(p).checked_sub(1).map(|c| c as u8);
        let new_home = |p: usize| new_homes.iter().find(|h| h.0 == p).map(|h| h.1).or_else(|| old_home(p));
        let mut delta = 0.0;
        for u in vals {
            let before = st.mat(u as usize) & MASK;
            let after = over.iter().rev().find(|e| e.0 == u).map_or(before, |e| e.1 & MASK);
            delta += self.future(u, after, step, &new_home) - self.future(u, before, step.wrapping_sub(1), &old_home);
        }
        delta
    }
}

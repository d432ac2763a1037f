//! One extension step of a partial plan: materialising operands through
//! the cheapest reshard paths, the instruction's result, parameter
//! layouts, and freeing what dies ([`Ctx::eval`]).

use super::super::problem::{Opt, Paths, Problem};
use super::super::seeds::Choice;
use super::super::space::ResultReq;
use super::state::{bits, enc, home_bit, zp, zv, Outcome, Rec, State, Trace, View, MASK};
use super::{MatRec, Objective, Sched};
use rustc_hash::FxHashMap as HashMap;
use smallvec::SmallVec;
use std::rc::Rc;

pub(super) struct Ctx<'a> {
    pub(super) p: &'a Problem,
    pub(super) s: &'a Sched,
    pub(super) obj: Objective,
    pub(super) budget: Option<f64>,
    /// Shared by every search and evaluation of one extraction (routes
    /// depend on the problem only).
    pub(super) paths: &'a mut Paths,
    pub(super) base: Option<Base>,
    /// (remaining targets' number, available classes, return target + 1)
    /// -> future (see [`Base::suffix`]).
    pub(super) fut_memo: HashMap<(u32, u64, u16), f64>,
}

/// How a result's return layout is known for the assumed future.
#[derive(Clone, Copy)]
pub(super) enum RootTarget {
    Fixed(u8),
    /// (result position, parameter position).
    Alias(usize, usize),
}

/// The base plan the ranking assumes for the future: per value, the
/// classes its uses need, by step.
pub(super) struct Base {
    pub(super) targets: Vec<Vec<(usize, u8)>>,
    /// Per value, for each position in `targets`: a number for the value's
    /// route graph ([`super::super::problem::Problem::graph_of`]) and the
    /// targets from that position on. Equal numbers have equal futures, so
    /// the future is memoised by this number: the values of repeated layers
    /// share entries, which keeps the memo small enough to stay in cache.
    pub(super) suffix: Vec<Vec<u32>>,
    pub(super) used_at: Vec<Vec<u32>>,
    pub(super) root: Vec<Option<RootTarget>>,
}

impl Base {
    pub(super) fn new(p: &Problem, s: &Sched, c: &Choice) -> Base {
        let n = s.inst_value.len();
        let mut targets = vec![Vec::new(); p.classes.len()];
        let mut used_at = vec![Vec::new(); n + 1];
        for (k, o) in c.options.iter().enumerate() {
            if let Some(oi) = o {
                for &(u, t) in &p.options[k][*oi].children {
                    if !s.deferred[u as usize] {
                        targets[u as usize].push((k, t));
                        used_at[k].push(u);
                    }
                }
            }
        }
        // Suffixes as cons cells: (target, next suffix), the empty suffix
        // of graph `g` being (g, END).
        const END: u32 = u32::MAX;
        let mut cells: HashMap<(u32, u32), u32> = HashMap::default();
        let mut intern = |key: (u32, u32)| {
            let next = cells.len() as u32;
            *cells.entry(key).or_insert(next)
        };
        let suffix = targets
            .iter()
            .enumerate()
            .map(|(u, list): (usize, &Vec<(usize, u8)>)| {
                let mut ids = vec![0; list.len() + 1];
                ids[list.len()] = intern((p.graph_of[u], END));
                for k in (0..list.len()).rev() {
                    ids[k] = intern((ids[k + 1], list[k].1 as u32));
                }
                ids
            })
            .collect();
        let mut root = vec![None; p.classes.len()];
        for (i, (r, req)) in s.results.iter().enumerate() {
            root[*r as usize] = match req {
                ResultReq::Fixed(_) => s.fixed_class[i].map(RootTarget::Fixed),
                ResultReq::Alias(p) => Some(RootTarget::Alias(i, *p)),
                ResultReq::Reduced => None,
            };
        }
        Base { targets, suffix, used_at, root }
    }
}

impl Ctx<'_> {
    pub(super) fn bytes(&self, v: u32, mask: u64) -> f64 {
        let cs = &self.p.classes[v as usize];
        bits(mask & MASK).map(|i| cs[i].bytes).sum()
    }

    /// Drops the classes of a word that other available classes give for
    /// free (local slices): recreating them later costs nothing, so
    /// keeping them would only hold memory and split equivalent partial
    /// plans. The home class is kept.
    pub(super) fn canonical(&self, v: u32, word: u64) -> u64 {
        let mask = word & MASK;
        let free = &self.p.free_from[v as usize];
        let mut redundant = 0u64;
        for b in bits(mask) {
            redundant |= free[b] & mask;
        }
        (word & !MASK) | (mask & !(redundant & !home_bit(word)))
    }

    /// Decodes `combo` into one class per parameter first used at `step`.
    pub(super) fn combo(&self, step: usize, mut combo: usize) -> SmallVec<[(usize, u8); 4]> {
        self.s.first_used_at[step]
            .iter()
            .map(|&p| {
                let ch = &self.s.home_choices[p];
                let c = ch[combo % ch.len()];
                combo /= ch.len();
                (p, c)
            })
            .collect()
    }

    /// The combination index of the parameter layouts `homes`.
    pub(super) fn combo_of(&self, step: usize, homes: &[Option<u8>]) -> Option<usize> {
        let mut combo = 0;
        let mut radix = 1;
        for &p in &self.s.first_used_at[step] {
            let ch = &self.s.home_choices[p];
            let digit = ch.iter().position(|&c| Some(c) == homes[p])?;
            combo += digit * radix;
            radix *= ch.len();
        }
        Some(combo)
    }

    pub(super) fn combos(&self, step: usize) -> usize {
        self.s.first_used_at[step].iter().map(|&p| self.s.home_choices[p].len()).product()
    }

    /// Evaluates one extension of `st`: at instruction `step` with option
    /// `opt` (or the return when `opt` is `None`) and parameter layouts
    /// `combo`. Records its events in `rec` when given.
    pub(super) fn eval(
        &mut self,
        st: &dyn View,
        step: usize,
        opt: Option<&Opt>,
        combo: usize,
        mut rec: Option<&mut Rec>,
    ) -> Option<Outcome> {
        let mut over: SmallVec<[(u32, u64); 12]> = SmallVec::new();
        let get = |over: &SmallVec<[(u32, u64); 12]>, v: u32| {
            over.iter().rev().find(|e| e.0 == v).map(|e| e.1).unwrap_or_else(|| st.mat(v as usize))
        };
        let (st_cost, st_fut, st_peak, st_live, st_hash) = st.head();
        let (mut cost, mut live, mut retro, mut hash) = (st_cost, st_live, 0.0, st_hash);
        let mut homes: SmallVec<[(usize, u8); 4]> = SmallVec::new();
        for (p, ci) in self.combo(step, combo) {
            let v = self.s.param_value[p];
            let w = enc(1 << ci, ci);
            let b = self.bytes(v, 1 << ci);
            live += b;
            retro += b;
            hash ^= zp(p, ci) ^ zv(v, get(&over, v)) ^ zv(v, w);
            over.push((v, w));
            homes.push((p, ci));
        }
        let home_of = |homes: &SmallVec<[(usize, u8); 4]>, p: usize| {
            homes.iter().find(|h| h.0 == p).map(|h| h.1).or_else(|| st.home(p).checked_sub(1).map(|c| c as u8))
        };
        let mut need: SmallVec<[(u32, Option<u8>); 4]> = SmallVec::new();
        match opt {
            Some(o) => need.extend(o.children.iter().map(|&(u, t)| (u, Some(t)))),
            None => {
                for (i, (r, req)) in self.s.results.iter().enumerate() {
                    let t = match req {
                        ResultReq::Fixed(_) => Some(self.s.fixed_class[i].expect("fixed result class")),
                        ResultReq::Alias(p) => {
                            let h = home_of(&homes, *p)?;
                            Some(*self.s.alias_class[i].get(&h)?)
                        }
                        ResultReq::Reduced => None,
                    };
                    need.push((*r, t));
                }
            }
        }
        let mut result_classes: SmallVec<[u8; 4]> = SmallVec::new();
        for (u, t) in need {
            if self.s.deferred[u as usize] {
                result_classes.push(0);
                continue;
            }
            let w = get(&over, u);
            debug_assert!(w != 0, "value %{u} is used before it is available");
            let m = w & MASK;
            let t = match t {
                Some(t) => t,
                None => {
                    // Any reduced class: the cheapest to reach.
                    let cs = &self.p.classes[u as usize];
                    let mut best: Option<(f64, u8)> = None;
                    for (i, c) in cs.iter().enumerate() {
                        if c.reduced {
                            if let Some((cst, _)) = self.paths.get(self.p, u, m, i as u8) {
                                if best.is_none_or(|b| cst < b.0) {
                                    best = Some((cst, i as u8));
                                }
                            }
                        }
                    }
                    best?.1
                }
            };
            result_classes.push(t);
            if m & (1 << t) != 0 {
                continue;
            }
            let (c, add) = self.paths.get(self.p, u, m, t)?;
            cost += c;
            live += self.bytes(u, add & !m);
            hash ^= zv(u, w) ^ zv(u, w | add);
            over.push((u, w | add));
            if let Some(r) = rec.as_deref_mut() {
                r.made.push(MatRec { step, value: u, target: t, have: m });
            }
        }
        if let Some(o) = opt {
            cost += o.compute;
            let v = self.s.inst_value[step];
            let w = enc(1 << o.class, o.class);
            live += self.bytes(v, 1 << o.class);
            hash ^= zv(v, get(&over, v)) ^ zv(v, w);
            over.push((v, w));
        }
        let peak = (st_peak + retro).max(live);
        let during = rec.is_some().then(|| over.to_vec());
        // After the instruction: free the values it used last, and copies
        // that have become free to recreate.
        let released: &[u32] = if opt.is_some() { &self.s.releases[step] } else { &[] };
        let mut touched: SmallVec<[u32; 12]> = over.iter().map(|e| e.0).collect();
        touched.sort_unstable();
        touched.dedup();
        for u in touched {
            let w = get(&over, u);
            let nw = if released.binary_search(&u).is_ok() { 0 } else { self.canonical(u, w) };
            if nw != w {
                live -= self.bytes(u, (w & !nw) & MASK);
                hash ^= zv(u, w) ^ zv(u, nw);
                over.push((u, nw));
            }
        }
        for &u in released {
            let w = get(&over, u);
            if w != 0 {
                live -= self.bytes(u, w & MASK);
                hash ^= zv(u, w);
                over.push((u, 0));
            }
        }
        let undecided = self.s.undecided_after.get(step).copied().unwrap_or(0.0);
        if self.obj == Objective::Time && self.budget.is_some_and(|b| peak + undecided > b * (1.0 + 1e-12)) {
            return None;
        }
        let fut = if opt.is_none() { 0.0 } else { st_fut + self.future_delta(st, step, &over, &homes) };
        if let Some(r) = rec {
            r.during = during.unwrap_or_default();
            r.mats = over.to_vec();
            r.homes = homes.to_vec();
            r.result_classes = result_classes.to_vec();
        }
        Some(Outcome { cost, fut, peak, live, hash })
    }

    pub(super) fn key(&self, o: &Outcome, step: usize) -> (f64, f64) {
        match self.obj {
            Objective::Time => (o.cost + o.fut, o.peak),
            Objective::Memory => (o.peak + self.s.undecided_after.get(step).copied().unwrap_or(0.0), o.cost + o.fut),
        }
    }

    pub(super) fn apply(
        &mut self,
        st: &State,
        step: usize,
        opt: Option<&Opt>,
        oi: usize,
        combo: usize,
    ) -> (State, Rec) {
        let mut rec = Rec::default();
        let o = self.eval(st, step, opt, combo, Some(&mut rec)).expect("a kept candidate evaluates again");
        let mut mats = st.mats.clone();
        for &(v, m) in &rec.mats {
            mats = mats.set(v as usize, m);
        }
        let mut homes = st.homes.clone();
        for &(p, ci) in &rec.homes {
            homes = homes.set(p, ci as u64 + 1);
        }
        let trace = Some(Rc::new(Trace { prev: st.trace.clone(), opt: oi as u32, combo: combo as u32 }));
        (State { cost: o.cost, fut: o.fut, peak: o.peak, live: o.live, hash: o.hash, mats, homes, trace }, rec)
    }
}

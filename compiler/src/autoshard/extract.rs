//! Extraction: choosing, for every instruction, one `Compute` e-node, for
//! every parameter one `Input` e-node, and the reshard e-nodes that bring
//! each operand into the layout its user needs, minimising step time under
//! a hard per-device memory budget.
//!
//! # Why an extractor of our own
//!
//! egg's `LpExtractor` (CBC) and `good_lp` models express the DAG cost and
//! a memory constraint at each program point, but the memory of a plan is
//! the peak over the schedule of the bytes of the values live at each
//! point, which needs one constraint per point and one variable per
//! (value, layout): tens of thousands of binaries on a 20,000-instruction
//! training step, far from the targets here (and CBC is a system library).
//! Instead the e-graph is extracted by dynamic programming **along the
//! program's schedule**: a partial plan is the set of e-classes
//! materialised so far for every live value (a bit set per value) plus the
//! parameters' chosen layouts; extending it by one instruction picks one of
//! its `Compute` nodes, materialises its operands' classes through the
//! cheapest reshard path from what the value already has (so a class shared
//! by several users is paid once: a DAG cost, not a tree cost), and frees
//! the values whose last use it is. Two partial plans with the same live
//! classes have the same future, so only the cheaper is kept (exact
//! dominance). Memory is tracked exactly along the way — a parameter costs
//! its bytes from the start of the program, retroactively when its layout
//! is chosen at its first use, and parameters not yet chosen are counted at
//! their smallest size — so the budget prunes partial plans as a hard
//! constraint, never as a penalty.
//!
//! The DP is exact (optimal over the e-graph's alternatives) whenever the
//! number of distinct partial plans never exceeds
//! [`super::SearchLimits::beam_width`]; otherwise the cheapest are kept (a
//! beam search) and the plan is reported as not proven optimal. Everything
//! is ordered deterministically (candidates in generation order, stable
//! sorts, hashes from fixed seeds), so the same input gives the same plan.

use super::persist::PArray;
use super::problem::{Opt, Paths, Problem};
use super::seeds::Choice;
use super::space::ResultReq;
use rustc_hash::FxHashMap as HashMap;
use smallvec::SmallVec;
use std::rc::Rc;

/// What the extraction minimises.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Objective {
    /// Step time, under the memory budget.
    Time,
    /// Peak memory per device (then step time): to report the smallest
    /// reachable footprint when a budget is infeasible.
    Memory,
}

/// The program's schedule as the extractor needs it.
#[derive(Clone, Debug)]
pub struct Sched {
    /// Value of each parameter position.
    pub param_value: Vec<u32>,
    /// Result value of each instruction.
    pub inst_value: Vec<u32>,
    /// Parameters first used at each step (instruction index; `n` = the
    /// return).
    pub first_used_at: Vec<Vec<usize>>,
    /// Values whose last use is each instruction.
    pub releases: Vec<Vec<u32>>,
    /// Values fused into their users (not tracked).
    pub deferred: Vec<bool>,
    /// Function results and what they need.
    pub results: Vec<(u32, ResultReq)>,
    /// Classes each parameter can arrive in.
    pub home_choices: Vec<Vec<u8>>,
    /// For each result aliased to a parameter: the result's class for each
    /// class of the parameter (same layout).
    pub alias_class: Vec<HashMap<u8, u8>>,
    /// For each result with a fixed layout: its class.
    pub fixed_class: Vec<Option<u8>>,
    /// Sum of the smallest sizes of parameters first used after each step.
    pub undecided_after: Vec<f64>,
}

/// One materialisation of a class (replayed from the chosen plan).
#[derive(Clone, Debug)]
pub struct MatRec {
    /// Step (instruction index, or the number of instructions for the return).
    pub step: usize,
    /// The value.
    pub value: u32,
    /// The class made available.
    pub target: u8,
    /// Classes of the value available before.
    pub have: u64,
}

/// The chosen plan.
#[derive(Clone, Debug)]
pub struct Extraction {
    /// Chosen option (index into `Problem::options[i]`) of each
    /// instruction; `None` for deferred ones.
    pub options: Vec<Option<usize>>,
    /// Chosen class of each parameter (`None`: unused).
    pub homes: Vec<Option<u8>>,
    /// Every class materialised by a reshard path, in order.
    pub mats: Vec<MatRec>,
    /// The class each function result is returned in.
    pub result_classes: Vec<u8>,
    /// When each (value, class) is held by the search: (value, class,
    /// first step, last step), steps being instruction indices (the number
    /// of instructions for the return).
    pub held: Vec<(u32, u8, usize, usize)>,
    /// Step time of the plan.
    pub cost: f64,
    /// Peak bytes per device as tracked by the search (copies held until
    /// they become free to recreate or the value dies; `plan.rs` frees
    /// them after their last use).
    pub peak: f64,
    /// Whether no partial plan was ever dropped (optimal over the e-graph).
    pub exact: bool,
    /// Largest number of distinct partial plans at one step.
    pub max_states: usize,
    /// Steps at which the beam dropped partial plans.
    pub truncated_steps: usize,
}

#[derive(Clone)]
struct Trace {
    prev: Option<Rc<Trace>>,
    opt: u32,
    combo: u32,
}

/// A partial plan. `mats` holds, per value, the bit set of its classes
/// available (low 58 bits) and its home class + 1 (top 6 bits); zero when
/// the value is not live.
#[derive(Clone)]
struct State {
    cost: f64,
    /// Cost of the base plan's future from here (see [`Ctx::future`]).
    fut: f64,
    peak: f64,
    live: f64,
    hash: u64,
    mats: PArray,
    homes: PArray,
    trace: Option<Rc<Trace>>,
}

const MASK: u64 = (1 << 58) - 1;

/// Assumed future cost of a use the base plan cannot serve.
const UNREACHABLE: f64 = 1e30;

/// What an extension step reads of a partial plan: its totals and, per
/// value, its word (see [`State`]), per parameter its class + 1.
trait View {
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
struct Flat {
    head: (f64, f64, f64, f64, u64),
    mats: Vec<u64>,
    homes: Vec<u64>,
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

fn enc(mask: u64, home: u8) -> u64 {
    mask | ((home as u64 + 1) << 58)
}

fn home_bit(e: u64) -> u64 {
    1 << ((e >> 58) - 1)
}

#[derive(Clone, Copy)]
struct Outcome {
    cost: f64,
    fut: f64,
    peak: f64,
    live: f64,
    hash: u64,
}

/// Events of one step, recorded when a candidate is materialised.
#[derive(Default)]
struct Rec {
    /// Per changed value, its word while the instruction runs and after.
    during: Vec<(u32, u64)>,
    mats: Vec<(u32, u64)>,
    homes: Vec<(usize, u8)>,
    made: Vec<MatRec>,
    result_classes: Vec<u8>,
}

fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

fn zv(v: u32, word: u64) -> u64 {
    if word == 0 {
        0
    } else {
        mix(mix(v as u64) ^ word)
    }
}

fn zp(p: usize, ci: u8) -> u64 {
    mix(mix(p as u64 ^ 0xA5A5_0000_0000) ^ ci as u64)
}

struct Ctx<'a> {
    p: &'a Problem,
    s: &'a Sched,
    obj: Objective,
    budget: Option<f64>,
    paths: Paths,
    base: Option<Base>,
    fut_memo: HashMap<(u32, u64, u32, u16), f64>,
}

/// How a result's return layout is known for the assumed future.
#[derive(Clone, Copy)]
enum RootTarget {
    Fixed(u8),
    /// (result position, parameter position).
    Alias(usize, usize),
}

/// The base plan the ranking assumes for the future: per value, the
/// classes its uses need, by step.
struct Base {
    targets: Vec<Vec<(usize, u8)>>,
    used_at: Vec<Vec<u32>>,
    root: Vec<Option<RootTarget>>,
}

impl Base {
    fn new(p: &Problem, s: &Sched, c: &Choice) -> Base {
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
        let mut root = vec![None; p.classes.len()];
        for (i, (r, req)) in s.results.iter().enumerate() {
            root[*r as usize] = match req {
                ResultReq::Fixed(_) => s.fixed_class[i].map(RootTarget::Fixed),
                ResultReq::Alias(p) => Some(RootTarget::Alias(i, *p)),
                ResultReq::Reduced => None,
            };
        }
        Base { targets, used_at, root }
    }
}

impl Ctx<'_> {
    fn bytes(&self, v: u32, mask: u64) -> f64 {
        let cs = &self.p.classes[v as usize];
        (0..cs.len()).filter(|i| mask & (1 << i) != 0).map(|i| cs[i].bytes).sum()
    }

    /// Drops the classes of a word that other available classes give for
    /// free (local slices): recreating them later costs nothing, so
    /// keeping them would only hold memory and split equivalent partial
    /// plans. The home class is kept.
    fn canonical(&self, v: u32, word: u64) -> u64 {
        let mask = word & MASK;
        let free = &self.p.free_from[v as usize];
        let mut redundant = 0u64;
        for (b, f) in free.iter().enumerate() {
            if mask & (1 << b) != 0 {
                redundant |= f & mask;
            }
        }
        (word & !MASK) | (mask & !(redundant & !home_bit(word)))
    }

    /// Decodes `combo` into one class per parameter first used at `step`.
    fn combo(&self, step: usize, mut combo: usize) -> SmallVec<[(usize, u8); 4]> {
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
    fn combo_of(&self, step: usize, homes: &[Option<u8>]) -> Option<usize> {
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

    fn combos(&self, step: usize) -> usize {
        self.s.first_used_at[step].iter().map(|&p| self.s.home_choices[p].len()).product()
    }

    /// Evaluates one extension of `st`: at instruction `step` with option
    /// `opt` (or the return when `opt` is `None`) and parameter layouts
    /// `combo`. Records its events in `rec` when given.
    fn eval(
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

    fn key(&self, o: &Outcome, step: usize) -> (f64, f64) {
        match self.obj {
            Objective::Time => (o.cost + o.fut, o.peak),
            Objective::Memory => (o.peak + self.s.undecided_after.get(step).copied().unwrap_or(0.0), o.cost + o.fut),
        }
    }

    /// The base plan's cost of serving value `u`'s uses after `step` (and
    /// its return, when the layout it is returned in is known) from the
    /// classes in `mask`: the future the ranking assumes.
    fn future(&mut self, u: u32, mask: u64, step: usize, homes: &dyn Fn(usize) -> Option<u8>) -> f64 {
        let Some(base) = &self.base else { return 0.0 };
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
        let key = (u, mask, start as u32, root.map_or(0, |t| t as u16 + 1));
        if let Some(&c) = self.fut_memo.get(&key) {
            return c;
        }
        let mut have = mask;
        let mut total = 0.0;
        let targets: Vec<u8> = list[start..].iter().map(|&(_, t)| t).chain(root).collect();
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
    fn future_delta(&mut self, st: &dyn View, step: usize, over: &[(u32, u64)], new_homes: &[(usize, u8)]) -> f64 {
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

    fn apply(&mut self, st: &State, step: usize, opt: Option<&Opt>, oi: usize, combo: usize) -> (State, Rec) {
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

/// A candidate extension: (ranking key, state index, option index, combo,
/// outcome).
type Cand = ((f64, f64), usize, usize, usize, Outcome);

/// How to run the search.
#[derive(Clone, Debug)]
pub struct Config<'a> {
    /// What to minimise.
    pub obj: Objective,
    /// Per-device memory budget (hard).
    pub budget: Option<f64>,
    /// Partial plans kept per step.
    pub beam: usize,
    /// A complete plan whose future the ranking assumes (see the module
    /// doc of [`super::seeds`]); `None` ranks by the cost so far.
    pub base: Option<&'a Choice>,
    /// Only follow `base` (evaluate it).
    pub fixed: bool,
}

/// Extracts the best plan from `p` along schedule `s`, or `None` when no
/// plan fits the budget (or, with a beam, none was found).
///
/// With a base plan, every partial plan is ranked by the exact cost of
/// the complete plan made of it and the base plan's remaining choices, so
/// the partial plan that follows the base has the base's cost at every
/// step and the result is never worse than the base (when the base fits
/// the budget).
pub fn search(p: &Problem, s: &Sched, cfg: &Config<'_>) -> Option<Extraction> {
    let n = s.inst_value.len();
    let nv = p.classes.len();
    let base = cfg.base.map(|c| Base::new(p, s, c));
    let mut cx =
        Ctx { p, s, obj: cfg.obj, budget: cfg.budget, paths: Paths::default(), base, fut_memo: HashMap::default() };
    let mut init = State {
        cost: 0.0,
        fut: 0.0,
        peak: 0.0,
        live: 0.0,
        hash: 0,
        mats: PArray::new(nv),
        homes: PArray::new(s.param_value.len()),
        trace: None,
    };
    init.fut = 0.0;
    let mut states = vec![init];
    let (mut exact, mut max_states, mut truncated_steps) = (true, 1, 0);
    for step in 0..=n {
        let is_return = step == n;
        if !is_return && s.deferred[s.inst_value[step] as usize] && s.first_used_at[step].is_empty() {
            // Fused into users: nothing to decide, nothing to free but
            // values whose last use it is (they are deferred too).
            continue;
        }
        let option_ids: Vec<usize> = match (cfg.fixed, cfg.base) {
            _ if is_return => vec![0],
            (true, Some(b)) => b.options[step].into_iter().collect(),
            _ => (0..p.options[step].len()).collect(),
        };
        let combo_ids: Vec<usize> = match (cfg.fixed, cfg.base) {
            (true, Some(b)) => vec![cx.combo_of(step, &b.homes)?],
            _ => (0..cx.combos(step)).collect(),
        };
        let opt_of = |oi: usize| if is_return { None } else { Some(&p.options[step][oi]) };
        // (key, state index, option index, combo, outcome)
        let mut cands: Vec<Cand> = Vec::new();
        // Partial plans with the same live classes have the same future.
        // Without a budget the cheaper one dominates; with one, a plan
        // dominates only if it is no worse in both time and peak memory
        // (the other may leave room for a larger layout later).
        let pareto = cfg.budget.is_some() && cfg.obj == Objective::Time;
        let mut same: HashMap<u64, Vec<usize>> = HashMap::default();
        let mut dead: Vec<bool> = Vec::new();
        for (si, st) in states.iter().enumerate() {
            for &oi in &option_ids {
                for &combo in &combo_ids {
                    let Some(o) = cx.eval(st, step, opt_of(oi), combo, None) else { continue };
                    let key = cx.key(&o, step);
                    let group = same.entry(o.hash).or_default();
                    let dominated = |a: &Outcome, ka: (f64, f64), b: &Outcome, kb: (f64, f64)| {
                        if pareto {
                            a.cost <= b.cost && a.peak <= b.peak
                        } else {
                            ka <= kb
                        }
                    };
                    if group.iter().any(|&j| dominated(&cands[j].4, cands[j].0, &o, key)) {
                        continue;
                    }
                    for &j in group.iter() {
                        if dominated(&o, key, &cands[j].4, cands[j].0) {
                            dead[j] = true;
                        }
                    }
                    group.retain(|&j| !dead[j]);
                    group.push(cands.len());
                    cands.push((key, si, oi, combo, o));
                    dead.push(false);
                }
            }
        }
        let mut cands: Vec<_> = cands.into_iter().zip(dead).filter(|(_, d)| !d).map(|(c, _)| c).collect();
        if cands.is_empty() {
            return None;
        }
        max_states = max_states.max(cands.len());
        cands.sort_by(|a, b| a.0 .0.total_cmp(&b.0 .0).then(a.0 .1.total_cmp(&b.0 .1)));
        if cands.len() > cfg.beam {
            cands.truncate(cfg.beam);
            exact = false;
            truncated_steps += 1;
        }
        states =
            cands.iter().map(|&(_, si, oi, combo, _)| cx.apply(&states[si], step, opt_of(oi), oi, combo).0).collect();
    }
    // The states left are complete plans, best first.
    let best = states.into_iter().next()?;
    Some(replay(&mut cx, &best, exact, max_states, truncated_steps))
}

/// Follows plan `c` along the schedule: its step time and the peak memory
/// the search tracks for it (`None` if it is not a plan of `p`).
pub fn evaluate(p: &Problem, s: &Sched, c: &Choice) -> Option<(f64, f64)> {
    let n = s.inst_value.len();
    let mut cx = Ctx {
        p,
        s,
        obj: Objective::Time,
        budget: None,
        paths: Paths::default(),
        base: None,
        fut_memo: HashMap::default(),
    };
    let mut st =
        Flat { head: (0.0, 0.0, 0.0, 0.0, 0), mats: vec![0; p.classes.len()], homes: vec![0; s.param_value.len()] };
    for step in 0..=n {
        if step < n && s.deferred[s.inst_value[step] as usize] && s.first_used_at[step].is_empty() {
            continue;
        }
        let opt = if step == n { None } else { Some(&p.options[step][c.options[step]?]) };
        let combo = cx.combo_of(step, &c.homes)?;
        let mut rec = Rec::default();
        let o = cx.eval(&st, step, opt, combo, Some(&mut rec))?;
        for (v, w) in rec.mats {
            st.mats[v as usize] = w;
        }
        for (q, ci) in rec.homes {
            st.homes[q] = ci as u64 + 1;
        }
        st.head = (o.cost, o.fut, o.peak, o.live, o.hash);
    }
    Some((st.head.0, st.head.2))
}

impl Extraction {
    /// The plan as a [`Choice`] (to seed another search).
    pub fn choice(&self) -> Choice {
        Choice { options: self.options.clone(), homes: self.homes.clone() }
    }
}

/// Re-runs the chosen plan from the start to record what it does.
fn replay(cx: &mut Ctx<'_>, last: &State, exact: bool, max_states: usize, truncated_steps: usize) -> Extraction {
    let n = cx.s.inst_value.len();
    let mut path = Vec::new();
    let mut t = last.trace.clone();
    while let Some(node) = t {
        path.push((node.opt as usize, node.combo as usize));
        t = node.prev.clone();
    }
    path.reverse();
    let steps: Vec<usize> = (0..=n)
        .filter(|&k| k == n || !cx.s.deferred[cx.s.inst_value[k] as usize] || !cx.s.first_used_at[k].is_empty())
        .collect();
    assert_eq!(steps.len(), path.len(), "the trace covers every decided step");
    let mut st = State {
        cost: 0.0,
        fut: 0.0,
        peak: 0.0,
        live: 0.0,
        hash: 0,
        mats: PArray::new(cx.p.classes.len()),
        homes: PArray::new(cx.s.param_value.len()),
        trace: None,
    };
    let mut out = Extraction {
        options: vec![None; n],
        homes: vec![None; cx.s.param_value.len()],
        mats: Vec::new(),
        result_classes: Vec::new(),
        held: Vec::new(),
        cost: 0.0,
        peak: 0.0,
        exact,
        max_states,
        truncated_steps,
    };
    // Open holding intervals: (value, class) -> first step.
    let mut open: std::collections::BTreeMap<(u32, u8), usize> = std::collections::BTreeMap::new();
    for (&step, &(oi, combo)) in steps.iter().zip(&path) {
        let opt = if step == n { None } else { Some(&cx.p.options[step][oi]) };
        let (next, rec) = cx.apply(&st, step, opt, oi, combo);
        out.mats.extend(rec.made.iter().cloned());
        for &(p, ci) in &rec.homes {
            out.homes[p] = Some(ci);
        }
        if step == n {
            out.result_classes = rec.result_classes.clone();
        } else {
            out.options[step] = Some(oi);
        }
        for &(v, w) in &rec.during {
            for c in (0..58u8).filter(|c| w & MASK & (1 << c) != 0) {
                open.entry((v, c)).or_insert(step);
            }
        }
        let mut after: std::collections::BTreeMap<u32, u64> = std::collections::BTreeMap::new();
        for &(v, w) in &rec.mats {
            after.insert(v, w & MASK);
        }
        for (&v, &m) in &after {
            let gone: Vec<(u32, u8)> =
                open.range((v, 0)..=(v, u8::MAX)).map(|(&k, _)| k).filter(|k| m & (1 << k.1) == 0).collect();
            for k in gone {
                let start = open.remove(&k).expect("open interval");
                out.held.push((k.0, k.1, start, step));
            }
        }
        st = next;
    }
    for ((v, c), start) in open {
        out.held.push((v, c, start, n));
    }
    out.held.sort_unstable();
    out.cost = st.cost;
    out.peak = st.peak;
    out
}

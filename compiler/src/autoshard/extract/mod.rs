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

mod ctx;
mod future;
mod replay;
mod state;

use super::persist::PArray;
use super::problem::{Paths, Problem};
use super::seeds::Choice;
use super::space::ResultReq;
use ctx::{Base, Ctx};
use replay::replay;
use rustc_hash::FxHashMap as HashMap;
use state::{Flat, Outcome, Rec, State};

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
pub fn search(p: &Problem, s: &Sched, cfg: &Config<'_>, paths: &mut Paths) -> Option<Extraction> {
    let n = s.inst_value.len();
    let nv = p.classes.len();
    let base = cfg.base.map(|c| Base::new(p, s, c));
    let mut cx = Ctx { p, s, obj: cfg.obj, budget: cfg.budget, paths, base, fut_memo: HashMap::default() };
    let init = State {
        cost: 0.0,
        fut: 0.0,
        peak: 0.0,
        live: 0.0,
        hash: 0,
        mats: PArray::new(nv),
        homes: PArray::new(s.param_value.len()),
        trace: None,
    };
    let mut states = vec![init];
    let (mut exact, mut max_states, mut truncated_steps) = (true, 1, 0);
    // Buffers reused across steps: the candidates, whether each is
    // dominated, and the candidates of each live-class hash as chains
    // (`first[hash]` then `next[j]`) rather than one vector per hash.
    let mut cands: Vec<Cand> = Vec::new();
    let mut dead: Vec<bool> = Vec::new();
    let mut next: Vec<u32> = Vec::new();
    let mut first: HashMap<u64, u32> = HashMap::default();
    // Partial plans with the same live classes have the same future.
    // Without a budget the cheaper one dominates; with one, a plan
    // dominates only if it is no worse in both time and peak memory
    // (the other may leave room for a larger layout later).
    let pareto = cfg.budget.is_some() && cfg.obj == Objective::Time;
    let dominates = |ka: (f64, f64), a: &Outcome, kb: (f64, f64), b: &Outcome| {
        if pareto {
            a.cost <= b.cost && a.peak <= b.peak
        } else {
            ka <= kb
        }
    };
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
        cands.clear();
        dead.clear();
        next.clear();
        first.clear();
        for (si, st) in states.iter().enumerate() {
            for &oi in &option_ids {
                for &combo in &combo_ids {
                    let Some(o) = cx.eval(st, step, opt_of(oi), combo, None) else { continue };
                    let key = cx.key(&o, step);
                    const END: u32 = u32::MAX;
                    let head = first.get(&o.hash).copied().unwrap_or(END);
                    let mut j = head;
                    let mut beaten = false;
                    while j != END {
                        let c = &cands[j as usize];
                        if !dead[j as usize] && dominates(c.0, &c.4, key, &o) {
                            beaten = true;
                            break;
                        }
                        j = next[j as usize];
                    }
                    if beaten {
                        continue;
                    }
                    let mut j = head;
                    while j != END {
                        let c = &cands[j as usize];
                        if !dead[j as usize] && dominates(key, &o, c.0, &c.4) {
                            dead[j as usize] = true;
                        }
                        j = next[j as usize];
                    }
                    first.insert(o.hash, cands.len() as u32);
                    next.push(head);
                    cands.push((key, si, oi, combo, o));
                    dead.push(false);
                }
            }
        }
        let mut kept: Vec<Cand> = cands.drain(..).zip(&dead).filter(|(_, d)| !**d).map(|(c, _)| c).collect();
        if kept.is_empty() {
            return None;
        }
        max_states = max_states.max(kept.len());
        // The best `beam` in (key, generation order): what a stable sort
        // then truncation keeps, without sorting the rest.
        let order = |a: &Cand, b: &Cand| a.0 .0.total_cmp(&b.0 .0).then(a.0 .1.total_cmp(&b.0 .1));
        if kept.len() > cfg.beam {
            let mut top: Vec<usize> = (0..kept.len()).collect();
            top.select_nth_unstable_by(cfg.beam - 1, |&a, &b| order(&kept[a], &kept[b]).then(a.cmp(&b)));
            top.truncate(cfg.beam);
            top.sort_unstable();
            kept = top.into_iter().map(|i| kept[i]).collect();
            exact = false;
            truncated_steps += 1;
        }
        kept.sort_by(order);
        states =
            kept.iter().map(|&(_, si, oi, combo, _)| cx.apply(&states[si], step, opt_of(oi), oi, combo).0).collect();
    }
    // The states left are complete plans, best first.
    let best = states.into_iter().next()?;
    Some(replay(&mut cx, &best, exact, max_states, truncated_steps))
}

/// Follows plan `c` along the schedule: its step time and the peak memory
/// the search tracks for it (`None` if it is not a plan of `p`).
pub fn evaluate(p: &Problem, s: &Sched, c: &Choice, paths: &mut Paths) -> Option<(f64, f64)> {
    let n = s.inst_value.len();
    let mut cx = Ctx { p, s, obj: Objective::Time, budget: None, paths, base: None, fut_memo: HashMap::default() };
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

//! The rewrites that fill the e-graph with alternatives, and the runner.
//!
//! Each rule is a named [`egg::Rewrite`] with a searcher and an applier
//! that read the layout analysis (the rules are conditional on layouts,
//! which patterns cannot express):
//!
//! - `sharded-forms`: an instruction computed one way can be computed under
//!   every strategy its factor rule allows ([`super::space`]); the new
//!   `Compute` node's children are its operands in the layouts the strategy
//!   needs, reached from the replicated layout by plain reshard chains.
//! - `input-layouts`: a parameter may arrive in any layout its annotation
//!   allows.
//! - `gather-to-replicated`: every layout a value can be produced in can be
//!   brought back to the replicated one (all-reduce, all-gather), so any
//!   layout can reach any other.
//! - `all-reduce-slice-is-reduce-scatter`: an all-reduce over axes `A`
//!   followed by a local slice of dimension `d` over `A` is a
//!   reduce-scatter of `d` over `A` (over a subset `S`: a reduce-scatter
//!   over `S`, then an all-reduce over `A \ S`).
//! - `all-gather-slice-is-identity`: gathering a dimension and slicing it
//!   back the same way is the value itself.
//! - `reshard-chain-collapse`: a reshard step (or an earlier collapsed
//!   reshard) followed by a collective, from a produced layout to a needed
//!   one, collapses into one direct reshard (`plan_reshard`: all-to-all,
//!   reduce-scatter, permute, at most two collectives) when that is cheaper
//!   than the chain. Iterating collapses longer chains; each (value, from,
//!   to) is considered once. "Needed" means needed by a non-element-wise
//!   instruction: element-wise chains (the optimizer update of every
//!   parameter) keep one layout in any sensible plan, and shortcuts into
//!   their operands would be most of the e-graph; they are still reachable
//!   through the replicated layout.
//!
//! There is no commutativity or associativity: the program's algebra is
//! not rewritten, only how each value is laid out and communicated. The
//! runner stops at a saturation, an iteration limit or a node limit (never
//! a time limit), and the report says which.

use super::cost::CollKind;
use super::lang::LayoutAnalysis;
use super::lang::{
    add_step, move_cost, reach, AxisList, CollKey, ComputeKey, InputKey, ReshardKey, ShardGraph, ShardLang,
};
use super::options::SearchLimits;
use egg::{
    Applier, Id, PatternAst, Rewrite, Runner, SearchMatches, Searcher, SimpleScheduler, StopReason, Subst, Symbol, Var,
};
use std::collections::BTreeMap;
use std::time::Duration;

fn var(name: &str) -> Var {
    name.parse().expect("valid variable name")
}

/// Classes (sorted by id) and, per class, the substitutions found.
fn matches_in(g: &ShardGraph, mut found: impl FnMut(Id) -> Vec<Subst>) -> Vec<SearchMatches<'static, ShardLang>> {
    // The e-graph does not change while rules search it: every rule of an
    // iteration shares one sorted list of classes.
    let size = (g.total_size(), g.number_of_classes());
    let mut cache = g.analysis.sorted_classes.borrow_mut();
    if cache.0 != size {
        let mut ids: Vec<Id> = g.classes().map(|c| c.id).collect();
        ids.sort_unstable();
        *cache = (size, ids);
    }
    let ids = cache.1.clone();
    drop(cache);
    ids.into_iter()
        .filter_map(|id| {
            let substs = found(id);
            (!substs.is_empty()).then_some(SearchMatches { eclass: id, substs, ast: None })
        })
        .collect()
}

fn subst1(v: Var, id: Id) -> Subst {
    let mut s = Subst::default();
    s.insert(v, id);
    s
}

/// Which class-level condition a [`ClassRule`] looks for.
#[derive(Clone, Copy)]
enum ClassCond {
    UnexpandedCompute,
    UnexpandedInput,
    UngatheredHome,
}

/// Searcher and applier of the three rules that act on a whole class.
struct ClassRule {
    cond: ClassCond,
    c: Var,
}

fn is_home(n: &ShardLang) -> bool {
    matches!(n, ShardLang::Compute(..) | ShardLang::Input(_))
}

impl Searcher<ShardLang, LayoutAnalysis> for ClassRule {
    fn search_eclass_with_limit(&self, g: &ShardGraph, id: Id, _limit: usize) -> Option<SearchMatches<'_, ShardLang>> {
        let a = &g.analysis;
        let class = &g[id];
        let hit = match self.cond {
            ClassCond::UnexpandedCompute => {
                class.nodes.iter().any(|n| matches!(n, ShardLang::Compute(k, _) if !a.expanded[k.inst as usize]))
            }
            ClassCond::UnexpandedInput => {
                class.nodes.iter().any(|n| matches!(n, ShardLang::Input(k) if !a.inputs_expanded[k.param as usize]))
            }
            ClassCond::UngatheredHome => {
                class.data.layout != 0
                    && class.nodes.iter().any(is_home)
                    && !a.gathered.contains(&(class.data.value, class.data.layout))
            }
        };
        hit.then(|| SearchMatches { eclass: id, substs: vec![subst1(self.c, id)], ast: None })
    }

    fn search_with_limit(&self, g: &ShardGraph, limit: usize) -> Vec<SearchMatches<'_, ShardLang>> {
        matches_in(g, |id| self.search_eclass_with_limit(g, id, limit).map(|m| m.substs).unwrap_or_default())
    }

    fn vars(&self) -> Vec<Var> {
        vec![self.c]
    }
}

impl Applier<ShardLang, LayoutAnalysis> for ClassRule {
    fn apply_one(
        &self,
        g: &mut ShardGraph,
        id: Id,
        _s: &Subst,
        _p: Option<&PatternAst<ShardLang>>,
        _r: Symbol,
    ) -> Vec<Id> {
        let id = g.find(id);
        let nodes = g[id].nodes.clone();
        let mut out = Vec::new();
        match self.cond {
            ClassCond::UnexpandedCompute => {
                for n in nodes {
                    let ShardLang::Compute(k, children) = n else { continue };
                    let inst = k.inst as usize;
                    if g.analysis.expanded[inst] {
                        continue;
                    }
                    g.analysis.expanded[inst] = true;
                    // Every operand's replicated class is the hub its
                    // required layouts are reached from.
                    let hubs: Vec<Id> = children.iter().map(|&c| reach(g, c, 0)).collect();
                    for s in 0..g.analysis.space.strategies[inst].len() {
                        let req = g.analysis.space.strategies[inst][s].operands.clone();
                        if !g.analysis.space.elementwise[inst] {
                            for (&h, &l) in hubs.iter().zip(&req) {
                                let v = g[h].data.value;
                                g.analysis.required.insert((v, l));
                            }
                        }
                        let ch: Box<[Id]> = hubs.iter().zip(&req).map(|(&h, &l)| reach(g, h, l)).collect();
                        let key = ComputeKey { inst: k.inst, strategy: s as u16 };
                        out.push(g.add(ShardLang::Compute(key, ch)));
                    }
                }
            }
            ClassCond::UnexpandedInput => {
                for n in nodes {
                    let ShardLang::Input(k) = n else { continue };
                    if g.analysis.inputs_expanded[k.param as usize] {
                        continue;
                    }
                    g.analysis.inputs_expanded[k.param as usize] = true;
                    for l in g.analysis.space.param_layouts[k.param as usize].clone() {
                        out.push(g.add(ShardLang::Input(InputKey { param: k.param, layout: l })));
                    }
                }
            }
            ClassCond::UngatheredHome => {
                let info = g[id].data;
                g.analysis.gathered.insert((info.value, info.layout));
                out.push(reach(g, id, 0));
            }
        }
        out
    }
}

/// Which two-step pattern a [`PairRule`] looks for.
#[derive(Clone, Copy, PartialEq)]
enum PairCond {
    AllReduceSlice,
    GatherSlice,
    ChainCollapse,
}

/// Searcher and applier of the rules on two consecutive reshard steps:
/// `?x` is the matched class (step 2's result), `?y` step 1's input.
struct PairRule {
    cond: PairCond,
    x: Var,
    y: Var,
    /// For `AllReduceSlice`: the slice's axes and dimension, the all-reduce's axes.
    tag: Var,
}

fn coll(n: &ShardLang) -> Option<(&CollKey, Id)> {
    match n {
        ShardLang::Collective(k, ch) => Some((k, ch[0])),
        _ => None,
    }
}

impl PairRule {
    fn find(&self, g: &ShardGraph, id: Id) -> Vec<Subst> {
        let mut out = Vec::new();
        let xinfo = g[id].data;
        for n2 in &g[id].nodes {
            match self.cond {
                PairCond::AllReduceSlice | PairCond::GatherSlice => {
                    let Some((k2, c)) = coll(n2) else { continue };
                    if k2.kind != CollKind::LocalSlice {
                        continue;
                    }
                    for n1 in &g[c].nodes {
                        let Some((k1, y)) = coll(n1) else { continue };
                        let s2 = k2.axes.to_vec();
                        let ok = match self.cond {
                            PairCond::AllReduceSlice => {
                                k1.kind == CollKind::AllReduce && s2.iter().all(|a| k1.axes.to_vec().contains(a))
                            }
                            _ => k1.kind == CollKind::AllGather && k1.axes == k2.axes && k1.dim == k2.dim,
                        };
                        if ok {
                            let mut s = subst1(self.x, id);
                            s.insert(self.y, y);
                            // Remember which step 1 (its class id is not
                            // enough): encode it through its own class.
                            s.insert(self.tag, c);
                            out.push(s);
                        }
                    }
                }
                PairCond::ChainCollapse => {
                    // Only shortcuts from where a value is produced to
                    // where it is needed matter to the extraction; each
                    // (value, from, to) is considered once, so the rule
                    // saturates.
                    if !g.analysis.required.contains(&(xinfo.value, xinfo.layout)) {
                        break;
                    }
                    let Some((_, c)) = coll(n2) else { continue };
                    for n1 in &g[c].nodes {
                        let y = match n1 {
                            ShardLang::Collective(_, ch) | ShardLang::Reshard(_, ch) => ch[0],
                            _ => continue,
                        };
                        let yinfo = g[y].data;
                        if yinfo.layout == xinfo.layout || !g[y].nodes.iter().any(is_home) {
                            continue;
                        }
                        if !g.analysis.collapsed.borrow_mut().insert((xinfo.value, yinfo.layout, xinfo.layout)) {
                            continue;
                        }
                        let chain = move_cost(g, n2).unwrap_or(0.0) + move_cost(g, n1).unwrap_or(0.0);
                        let (direct, steps) = g.analysis.direct_plan(xinfo.value, yinfo.layout, xinfo.layout);
                        if steps > 2 {
                            continue;
                        }
                        if direct < chain * (1.0 - 1e-12) {
                            let mut s = subst1(self.x, id);
                            s.insert(self.y, y);
                            s.insert(self.tag, c);
                            out.push(s);
                        }
                    }
                }
            }
        }
        out
    }
}

impl Searcher<ShardLang, LayoutAnalysis> for PairRule {
    fn search_eclass_with_limit(&self, g: &ShardGraph, id: Id, _limit: usize) -> Option<SearchMatches<'_, ShardLang>> {
        let substs = self.find(g, id);
        (!substs.is_empty()).then_some(SearchMatches { eclass: id, substs, ast: None })
    }

    fn search_with_limit(&self, g: &ShardGraph, _limit: usize) -> Vec<SearchMatches<'_, ShardLang>> {
        matches_in(g, |id| self.find(g, id))
    }

    fn vars(&self) -> Vec<Var> {
        vec![self.x, self.y, self.tag]
    }
}

impl Applier<ShardLang, LayoutAnalysis> for PairRule {
    fn apply_one(
        &self,
        g: &mut ShardGraph,
        id: Id,
        s: &Subst,
        _p: Option<&PatternAst<ShardLang>>,
        _r: Symbol,
    ) -> Vec<Id> {
        let (x, y) = (g.find(id), g.find(s[self.y]));
        match self.cond {
            PairCond::GatherSlice => {
                if g.union(x, y) {
                    vec![g.find(x)]
                } else {
                    vec![]
                }
            }
            PairCond::ChainCollapse => {
                let to = g[x].data.layout;
                let before = g.total_size();
                let n = g.add(ShardLang::Reshard(ReshardKey { to }, [y]));
                if g.total_size() > before {
                    vec![g.find(n)]
                } else {
                    vec![]
                }
            }
            PairCond::AllReduceSlice => {
                // Recover the slice (x's node on the matched step-1 class)
                // and the all-reduce (on y) from the graph.
                let mid = g.find(s[self.tag]);
                let slice = g[x].nodes.iter().find_map(|n| match coll(n) {
                    Some((k, c)) if k.kind == CollKind::LocalSlice && g.find(c) == mid => Some(*k),
                    _ => None,
                });
                let reduce = g[mid].nodes.iter().find_map(|n| match coll(n) {
                    Some((k, c)) if k.kind == CollKind::AllReduce && g.find(c) == y => Some(*k),
                    _ => None,
                });
                let (Some(sl), Some(ar)) = (slice, reduce) else { return vec![] };
                let scatter = sl.axes.to_vec();
                let rest: Vec<usize> = ar.axes.to_vec().into_iter().filter(|a| !scatter.contains(a)).collect();
                let before = g.total_size();
                let rs = CollKey { kind: CollKind::ReduceScatter, axes: sl.axes, dim: sl.dim, dim2: 0 };
                let mut cur = add_step(g, y, rs);
                if !rest.is_empty() {
                    cur = add_step(
                        g,
                        cur,
                        CollKey { kind: CollKind::AllReduce, axes: AxisList::new(&rest), dim: 0, dim2: 0 },
                    );
                }
                debug_assert_eq!(g.find(cur), g.find(x), "reduce-scatter rewrite changed the layout");
                if g.total_size() > before {
                    vec![g.find(cur)]
                } else {
                    vec![]
                }
            }
        }
    }
}

/// The rules, in the order the runner applies them.
pub fn rules() -> Vec<Rewrite<ShardLang, LayoutAnalysis>> {
    let c = var("?c");
    let class =
        |name: &str, cond| Rewrite::new(name, ClassRule { cond, c }, ClassRule { cond, c }).expect("valid rule");
    let (x, y, t) = (var("?x"), var("?y"), var("?t"));
    let pair = |name: &str, cond| {
        Rewrite::new(name, PairRule { cond, x, y, tag: t }, PairRule { cond, x, y, tag: t }).expect("valid rule")
    };
    vec![
        class("sharded-forms", ClassCond::UnexpandedCompute),
        class("input-layouts", ClassCond::UnexpandedInput),
        class("gather-to-replicated", ClassCond::UngatheredHome),
        pair("all-reduce-slice-is-reduce-scatter", PairCond::AllReduceSlice),
        pair("all-gather-slice-is-identity", PairCond::GatherSlice),
        pair("reshard-chain-collapse", PairCond::ChainCollapse),
    ]
}

/// What the e-graph search did.
#[derive(Clone, Debug, PartialEq)]
pub struct EGraphReport {
    /// Iterations run.
    pub iterations: usize,
    /// Why the runner stopped.
    pub stop: String,
    /// Whether a limit cut the search (not saturated).
    pub cut: bool,
    /// E-nodes at the end.
    pub nodes: usize,
    /// E-classes at the end.
    pub classes: usize,
    /// Applications per rule, over all iterations.
    pub applied: BTreeMap<String, usize>,
    /// Instructions whose sharded forms were not added (limit reached).
    pub unexpanded: usize,
}

/// Runs the rules on `runner`'s e-graph under `limits`.
pub fn saturate(runner: Runner<ShardLang, LayoutAnalysis>, limits: &SearchLimits) -> (ShardGraph, EGraphReport) {
    let rules = rules();
    let runner = runner
        .with_iter_limit(limits.iterations)
        .with_node_limit(limits.nodes)
        .with_time_limit(Duration::MAX)
        .with_scheduler(SimpleScheduler)
        .run(&rules);
    let mut applied = BTreeMap::new();
    for it in &runner.iterations {
        for (name, n) in &it.applied {
            *applied.entry(name.to_string()).or_insert(0) += n;
        }
    }
    let (stop, cut) = match &runner.stop_reason {
        Some(StopReason::Saturated) => ("saturated".to_string(), false),
        Some(StopReason::IterationLimit(n)) => (format!("iteration limit ({n}) reached"), true),
        Some(StopReason::NodeLimit(n)) => (format!("node limit ({n}) reached"), true),
        Some(other) => (format!("{other:?}"), true),
        None => ("not run".into(), true),
    };
    let mut g = runner.egraph;
    g.rebuild();
    let unexpanded = g
        .analysis
        .expanded
        .iter()
        .enumerate()
        .filter(|&(i, &e)| !e && g.analysis.space.strategies[i].len() > 1)
        .count();
    let report = EGraphReport {
        iterations: runner.iterations.len(),
        stop,
        cut,
        nodes: g.total_size(),
        classes: g.number_of_classes(),
        applied,
        unexpanded,
    };
    (g, report)
}

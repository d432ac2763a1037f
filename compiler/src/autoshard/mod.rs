//! Auto-sharding: choosing the sharding of every value left open, so that
//! the step time is minimal within a per-device memory budget — what Alpa
//! does with an integer program, done here with an e-graph.
//!
//! 1. **Alternatives** ([`space`], [`lang`], [`rewrites`]): an `egg`
//!    e-graph whose e-classes are (value, layout) pairs. Named rewrites add
//!    every sharded form of each instruction that its factor rule allows
//!    (the same rules propagation uses), every layout a parameter may
//!    arrive in, the reshards between layouts, and the algebra of
//!    collectives (an all-reduce then a slice is a reduce-scatter, a gather
//!    then the same slice is the identity, chains of reshards collapse into
//!    one when cheaper). Limits are iteration and node counts.
//! 2. **Costs** ([`cost`]): compute time from FLOPs per device, an
//!    alpha-beta model per mesh axis for every collective, and bytes per
//!    device for memory.
//! 3. **Extraction** ([`extract`]): a dynamic program along the schedule
//!    that counts every shared e-class once (a DAG cost) and enforces the
//!    memory budget as a hard constraint; exact when its state count stays
//!    within the beam width, which the report states.
//!
//! The result is an [`AutoShardPlan`]: the sharding of every value, the
//! collectives and their cost, the memory per device, the alternatives
//! considered for any value ([`AutoShardPlan::explain`]), a printable
//! report, and the program annotated with the plan
//! ([`AutoShardPlan::apply`]) ready for `propagate` and the SPMD
//! partitioner. The formulation and the cost model are in
//! `specs/sharding.md` ("Auto-sharding").

pub mod apply;
pub mod build;
pub mod cost;
pub mod explain;
pub mod extract;
pub mod lang;
pub mod options;
pub mod persist;
pub mod plan;
pub mod predict;
pub mod problem;
pub mod rewrites;
pub mod seeds;
pub mod space;

pub use cost::{CollKind, CostModel};
pub use explain::Alternative;
pub use options::{fmt_bytes, parse_memory_budget, AliasPolicy, AutoShardOptions, SearchLimits};
pub use plan::{AutoShardPlan, CommStats, CostBreakdown, MemoryKind, MemoryReport, PlannedCollective, SearchReport};
pub use predict::{predict_program, spearman, OpClass, StepPrediction};
pub use rewrites::EGraphReport;

use crate::error::{CompilerError, Result};
use crate::sharding::Mesh;
use extract::{search, Config, Extraction, Objective};
use lang::LayoutAnalysis;
use plan::PlanData;
use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use seeds::Choice;
use std::cell::RefCell;
use weft_ir::{Function, Module};

/// Chooses shardings for `f` (calls inlined) on `mesh`: every value not
/// fixed by an annotation gets the layout that minimises the step time
/// within `opts.memory_budget`. Errors: an ill-formed program, calls, an
/// annotation invalid on the mesh, or
/// [`CompilerError::MemoryBudgetInfeasible`] (with the smallest reachable
/// peak and what dominates it) when no plan fits the budget.
pub fn auto_shard(f: &Function, mesh: &Mesh, opts: &AutoShardOptions) -> Result<AutoShardPlan> {
    crate::inline::check_call_free(f)?;
    auto_shard_call_free(f, mesh, opts)
}

/// [`auto_shard`] for a function known to be call-free (no re-check): the
/// pipeline's `autoshard` pass.
pub fn auto_shard_inlined(
    f: &crate::inline::InlinedFunction,
    mesh: &Mesh,
    opts: &AutoShardOptions,
) -> Result<AutoShardPlan> {
    auto_shard_call_free(f.function(), mesh, opts)
}

fn auto_shard_call_free(f: &Function, mesh: &Mesh, opts: &AutoShardOptions) -> Result<AutoShardPlan> {
    weft_ir::verify_function(&Module::new(), f)?;
    if mesh.axes().len() > 15 {
        return Err(CompilerError::Unsupported(format!("auto-sharding supports meshes of at most 15 axes ({mesh})")));
    }
    let mut clock = Clock::start();
    let space = space::build_space(f, mesh, opts)?;
    clock.lap("space");
    let (mut g, egraph) = saturated(f, mesh, opts, space);
    clock.lap("e-graph");
    let problem = problem::build_problem(&g, f.values.len(), f.insts.len());
    let sched = build::schedule(f, &g.analysis.space, &problem);
    let space = std::mem::take(&mut g.analysis.space);
    let cost = g.analysis.cost.clone();
    // The e-graph is large (hundreds of thousands of e-nodes on a big
    // training step) and no longer needed: free it off the critical path.
    std::thread::spawn(move || drop(g));
    clock.lap("problem");
    // The beam is narrowed on long programs so that a round stays within
    // `work` partial plans in all.
    let beam = opts.limits.beam_width.max(1).min((opts.limits.work / f.insts.len().max(1)).max(4));
    let budget = opts.memory_budget.map(|b| b as f64);
    let chosen =
        choose(f, mesh, &space, &problem, &sched, budget, beam, opts.limits.rounds, opts.limits.work, &mut clock);
    clock.lap("extraction");
    let make = move |x: extract::Extraction, problem: problem::Problem, mut clock: Clock| {
        let search = SearchReport {
            egraph,
            exact: x.exact,
            max_states: x.max_states,
            truncated_steps: x.truncated_steps,
            beam_width: beam,
            dropped_classes: problem.dropped_classes,
            phases: Vec::new(),
        };
        let data = PlanData { space, problem, extraction: x, cost };
        let mut plan = AutoShardPlan::build(f, mesh, data, search, opts.memory_budget);
        clock.lap("plan");
        plan.search.phases = clock.phases;
        plan
    };
    let x = match chosen {
        Ok(x) => return Ok(make(x, problem, clock)),
        // Nothing fits: report the smallest footprint found and what fills it.
        Err(x) => x,
    };
    let peak = x.peak.max(0.0);
    let plan = make(x, problem, clock);
    let exact = plan.search.exact && !plan.search.egraph.cut;
    let dominant = plan
        .memory
        .live_at_peak
        .iter()
        .take(8)
        .map(|(v, s, b)| {
            format!(
                "  {} {} as {}: {} per device",
                f.value_ref(*v),
                f.ty(*v),
                crate::sharding::fmt_sharding(s),
                fmt_bytes(*b)
            )
        })
        .collect();
    Err(CompilerError::MemoryBudgetInfeasible {
        func: f.name.clone(),
        budget: opts.memory_budget.unwrap_or(0),
        // The peak the search enforces (copies held while their value
        // lives): a budget of at least this is met.
        minimum: peak.ceil() as u64,
        proven: exact,
        dominant,
    })
}

/// The saturated e-graph of `f` over `space`, and what the runner did.
fn saturated(
    f: &Function,
    mesh: &Mesh,
    opts: &AutoShardOptions,
    space: space::Space,
) -> (lang::ShardGraph, rewrites::EGraphReport) {
    let analysis = LayoutAnalysis {
        space,
        types: f.values.iter().map(|v| v.ty.clone()).collect(),
        type_numbers: {
            let mut numbers: HashMap<&weft_ir::TensorType, u32> = HashMap::default();
            f.values
                .iter()
                .map(|v| {
                    let next = numbers.len() as u32;
                    *numbers.entry(&v.ty).or_insert(next)
                })
                .collect()
        },
        param_values: f.params.iter().map(|p| p.0).collect(),
        inst_values: f.insts.iter().map(|i| i.results[0].0).collect(),
        cost: CostModel::new(mesh, opts),
        class_of: HashMap::default(),
        info: Vec::new(),
        expanded: vec![false; f.insts.len()],
        inputs_expanded: vec![false; f.params.len()],
        gathered: HashSet::default(),
        required: HashSet::default(),
        direct: Default::default(),
        steps: Default::default(),
        reached: HashMap::default(),
        stepped: HashMap::default(),
        chains: HashMap::default(),
        collapsed: Default::default(),
        dirty: Default::default(),
        needs_rebuild: false,
        homes: HashSet::default(),
        new_homes: Default::default(),
        found: RefCell::new((0..rewrites::N_RULES).map(|_| Vec::new()).collect()),
    };
    let mut g = egg::EGraph::new(analysis);
    build::load(&mut g, f);
    rewrites::saturate(g, &opts.limits)
}

/// Wall time per phase of [`auto_shard`] (see [`SearchReport::phases`]).
struct Clock {
    last: std::time::Instant,
    phases: Vec<(&'static str, std::time::Duration)>,
}

impl Clock {
    fn start() -> Clock {
        Clock { last: std::time::Instant::now(), phases: Vec::new() }
    }

    fn lap(&mut self, name: &'static str) {
        let now = std::time::Instant::now();
        self.phases.push((name, now - self.last));
        self.last = now;
    }
}

/// Runs the extraction: evaluates the whole-program starting plans
/// ([`seeds::candidates`]), then improves the best one that fits with
/// base-guided searches until a round gains nothing (at most `rounds`).
/// Returns the best plan within the budget, or else the plan of smallest
/// peak memory found (for the error).
#[allow(clippy::too_many_arguments)]
fn choose(
    f: &Function,
    mesh: &Mesh,
    space: &space::Space,
    problem: &problem::Problem,
    sched: &extract::Sched,
    budget: Option<f64>,
    beam: usize,
    rounds: usize,
    work: usize,
    clock: &mut Clock,
) -> Result<Extraction, Extraction> {
    // Routes inside a value depend on the problem only: one memo serves
    // every evaluation and search below.
    let mut paths = problem::Paths::default();
    let max_seeds = (work / f.insts.len().max(1)).clamp(9, 64);
    let seeds: Vec<(Choice, (f64, f64))> = seeds::candidates(f, space, problem, mesh, max_seeds)
        .into_iter()
        .filter_map(|c| extract::evaluate(problem, sched, &c, &mut paths).map(|x| (c, x)))
        .collect();
    clock.lap("seeds");
    let fits_peak = |peak: f64| budget.is_none_or(|b| peak <= b * (1.0 + 1e-12));
    let fits = |x: &Extraction| fits_peak(x.peak);
    let by_cost = |a: &&(Choice, (f64, f64)), b: &&(Choice, (f64, f64))| a.1 .0.total_cmp(&b.1 .0);
    let best_seed = seeds.iter().filter(|s| fits_peak(s.1 .1)).min_by(by_cost);
    // The base's cost, while it is a seed (already evaluated).
    let mut base_cost = best_seed.map(|s| s.1 .0);
    let mut base: Option<Choice> = best_seed.map(|s| s.0.clone());
    if base.is_none() {
        // The smallest-memory plan: a memory-first search from the leanest
        // seed. If it fits, it is the base; otherwise nothing fits.
        let lean = seeds.iter().min_by(|a, b| a.1 .1.total_cmp(&b.1 .1)).map(|s| s.0.clone());
        let cfg = Config { obj: Objective::Memory, budget: None, beam, base: lean.as_ref(), fixed: false };
        let min_memory = search(problem, sched, &cfg, &mut paths).expect("without a budget every program has a plan");
        if !fits(&min_memory) {
            return Err(min_memory);
        }
        base = Some(min_memory.choice());
    }
    let mut base = base.expect("a base plan that fits");
    // On small programs (a wide beam) an unguided search is affordable
    // and may find plans far from every seed.
    if beam >= 1024 {
        let cfg = Config { obj: Objective::Time, budget, beam, base: None, fixed: false };
        if let Some(x) = search(problem, sched, &cfg, &mut paths) {
            let current = base_cost.or_else(|| extract::evaluate(problem, sched, &base, &mut paths).map(|b| b.0));
            if current.is_none_or(|b| x.cost < b) {
                base = x.choice();
                base_cost = None;
            }
        }
    }
    let mut best: Option<Extraction> = None;
    let mut best_cost = match base_cost {
        Some(c) => c,
        None => extract::evaluate(problem, sched, &base, &mut paths).map_or(f64::INFINITY, |x| x.0),
    };
    let mut exact = false;
    for _ in 0..rounds.max(1) {
        let cfg = Config { obj: Objective::Time, budget, beam, base: Some(&base), fixed: false };
        let Some(x) = search(problem, sched, &cfg, &mut paths) else { break };
        exact |= x.exact;
        let better = x.cost < best_cost * (1.0 - 1e-12);
        if better || best.is_none() {
            best_cost = best_cost.min(x.cost);
            base = x.choice();
            best = Some(x);
        }
        if !better {
            break;
        }
    }
    if best.is_none() {
        let cfg = Config { obj: Objective::Time, budget: None, beam: 1, base: Some(&base), fixed: true };
        best = search(problem, sched, &cfg, &mut paths);
    }
    let mut best = best.expect("the base plan fits the budget");
    best.exact = exact;
    Ok(best)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::{build_train_step, Optimizer, TrainConfig};
    use egg::Language;
    use weft_ir::builder::FunctionBuilder;
    use weft_ir::DType;

    /// A two-layer residual MLP training step (AdamW).
    fn train_step() -> Function {
        let f = FunctionBuilder::new("loss");
        let x = f.param("x", DType::F32, &[64, 32]);
        let y = f.param("y", DType::F32, &[64, 32]);
        let mut h = x;
        for i in 0..2 {
            let w1 = f.param(&format!("params.w1.{i}"), DType::F32, &[32, 128]);
            let w2 = f.param(&format!("params.w2.{i}"), DType::F32, &[128, 32]);
            h = f.add(h, f.matmul(f.relu(f.matmul(h, w1)), w2));
        }
        let d = f.sub(h, y);
        f.set_results(&[f.mean_all(f.mul(d, d))]);
        let m = Module { functions: vec![f.finish().unwrap()] };
        let cfg = TrainConfig { optimizer: Optimizer::adamw(), ..TrainConfig::default() };
        build_train_step(&m, m.function("loss").unwrap(), &cfg).unwrap().function().clone()
    }

    /// The runner never rebuilds (see `rewrites::saturate`): the saturated
    /// e-graph must already be what a rebuild would make of it — the same
    /// classes, and in each the same e-nodes, with canonical children.
    #[test]
    fn saturated_egraph_needs_no_rebuild() {
        let f = train_step();
        let mesh = Mesh::parse("data=2,model=4").unwrap();
        let opts = AutoShardOptions::default();
        let space = space::build_space(&f, &mesh, &opts).unwrap();
        let (mut g, report) = saturated(&f, &mesh, &opts, space);
        assert_eq!(report.stop, "saturated");
        assert!(report.applied.get("reshard-chain-collapse").is_some_and(|&n| n > 0), "{:?}", report.applied);
        let snapshot = |g: &lang::ShardGraph| {
            let mut classes: Vec<(egg::Id, Vec<lang::ShardLang>)> = g
                .classes()
                .map(|c| {
                    let mut nodes = c.nodes.clone();
                    nodes.sort();
                    (c.id, nodes)
                })
                .collect();
            classes.sort();
            (g.total_size(), classes)
        };
        let before = snapshot(&g);
        for (_, nodes) in &before.1 {
            for n in nodes {
                for &c in n.children() {
                    assert_eq!(g.find(c), c, "child {c} of {n:?} is not canonical");
                }
            }
        }
        g.rebuild();
        assert!(before == snapshot(&g), "a rebuild changed the saturated e-graph");
    }
}

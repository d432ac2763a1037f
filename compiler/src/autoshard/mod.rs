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
pub mod problem;
pub mod rewrites;
pub mod space;

pub use cost::{CollKind, CostModel};
pub use explain::Alternative;
pub use options::{fmt_bytes, parse_memory_budget, AliasPolicy, AutoShardOptions, SearchLimits};
pub use plan::{AutoShardPlan, CommStats, CostBreakdown, MemoryKind, MemoryReport, PlannedCollective, SearchReport};
pub use rewrites::EGraphReport;

use crate::error::{CompilerError, Result};
use crate::sharding::Mesh;
use extract::{extract, Objective};
use lang::LayoutAnalysis;
use plan::PlanData;
use std::collections::{HashMap, HashSet};
use weft_ir::{Function, Module};

/// Chooses shardings for `f` (calls inlined) on `mesh`: every value not
/// fixed by an annotation gets the layout that minimises the step time
/// within `opts.memory_budget`. Errors: an ill-formed program, calls, an
/// annotation invalid on the mesh, or
/// [`CompilerError::MemoryBudgetInfeasible`] (with the smallest reachable
/// peak and what dominates it) when no plan fits the budget.
pub fn auto_shard(f: &Function, mesh: &Mesh, opts: &AutoShardOptions) -> Result<AutoShardPlan> {
    for (id, inst) in f.iter_insts() {
        if let weft_ir::Op::Call { callee, .. } = &inst.op {
            let site = crate::Site::new(&f.name, weft_ir::verify::inst_subject(f, id), inst.loc);
            return Err(CompilerError::CallNotInlined { site, callee: callee.clone() });
        }
    }
    weft_ir::verify_function(&Module::new(), f)?;
    if mesh.axes().len() > 15 {
        return Err(CompilerError::Unsupported(format!("auto-sharding supports meshes of at most 15 axes ({mesh})")));
    }
    let space = space::build_space(f, mesh, opts)?;
    let analysis = LayoutAnalysis {
        space,
        types: f.values.iter().map(|v| v.ty.clone()).collect(),
        param_values: f.params.iter().map(|p| p.0).collect(),
        inst_values: f.insts.iter().map(|i| i.results[0].0).collect(),
        cost: CostModel::new(mesh, opts),
        class_of: HashMap::new(),
        expanded: vec![false; f.insts.len()],
        inputs_expanded: vec![false; f.params.len()],
        gathered: HashSet::new(),
    };
    let mut runner = egg::Runner::new(analysis);
    build::load(&mut runner.egraph, f);
    let (g, egraph) = rewrites::saturate(runner, &opts.limits);
    let problem = problem::build_problem(&g, f.values.len(), f.insts.len());
    let sched = build::schedule(f, &g.analysis.space, &problem);
    let LayoutAnalysis { space, cost, .. } = g.analysis;
    let beam = opts.limits.beam_width.max(1);
    let budget = opts.memory_budget.map(|b| b as f64);
    let make = |x: extract::Extraction, problem: problem::Problem| {
        let search = SearchReport {
            egraph: egraph.clone(),
            exact: x.exact,
            max_states: x.max_states,
            truncated_steps: x.truncated_steps,
            beam_width: beam,
            dropped_classes: problem.dropped_classes,
        };
        let data = PlanData { space: space.clone(), problem, extraction: x, cost: cost.clone() };
        AutoShardPlan::build(f, mesh, data, search, opts.memory_budget)
    };
    if let Some(x) = extract(&problem, &sched, Objective::Time, budget, beam) {
        return Ok(make(x, problem));
    }
    // Nothing fits: find the smallest footprint to say how far off it is.
    let x = extract(&problem, &sched, Objective::Memory, None, beam)
        .expect("without a budget every program has a plan (its initial form)");
    let exact = x.exact && !egraph.cut;
    let plan = make(x, problem);
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
        minimum: plan.memory.peak.ceil() as u64,
        proven: exact,
        dominant,
    })
}

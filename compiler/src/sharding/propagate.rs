//! Sharding propagation: from a few annotations to a sharding for every value.
//!
//! The program is loaded into an e-graph ([`ProgramGraph`]) whose e-class
//! data starts as the annotations ([`super::seed`]). Propagation then visits
//! instructions from a worklist (lowest index first) and runs one
//! [`step`] through each: information flows forward (operands to result)
//! and backward (result to operands, and between operands, so unannotated
//! parameters get shardings from their users). Whenever a value's facts
//! change, its users (the e-class parents) and its definer are queued
//! again. This runs once per priority level, strongest first, as Shardy's
//! user-priority propagation does: everything user annotations imply is
//! settled before constraints get a say. Facts only grow and the number of
//! visits is capped ([`PropagateOptions::max_visits_per_inst`]), so the
//! result is deterministic and the work roughly linear in program size.
//! Finally [`super::materialize`] closes every sharding and inserts the
//! reshards that make every instruction locally computable.

use super::egraph::{Priority, ProgramGraph};
use super::explain::{Origin, Resolution};
use super::materialize::materialize;
use super::mesh::Mesh;
use super::rules::{rule_for, OpRule};
use super::seed::{seed, value_subject, Seeds};
use super::sharded::{PropagationStats, ShardedFunction};
use super::step::step;
use crate::error::{CompilerError, Result, Site};
use std::collections::{BTreeMap, BTreeSet};
use weft_ir::{Function, InstId, Module, Op, TensorType, ValueId};

/// What to do when two user annotations contradict each other.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default)]
pub enum ConflictPolicy {
    /// Keep the stronger one (see `specs/sharding.md`), reshard the other
    /// value, and record why (GSPMD/Shardy behaviour).
    #[default]
    Reshard,
    /// Report [`CompilerError::ConflictingAnnotations`] (JAX explicit-mode
    /// behaviour).
    Error,
}

/// Options of [`propagate`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PropagateOptions {
    /// Visits allowed per instruction, over all priority levels; when the
    /// budget runs out propagation stops where it is (deterministically)
    /// and [`PropagationStats::converged`] is false.
    pub max_visits_per_inst: usize,
    /// What to do with contradicting user annotations.
    pub conflict_policy: ConflictPolicy,
}

impl Default for PropagateOptions {
    fn default() -> Self {
        PropagateOptions { max_visits_per_inst: 32, conflict_policy: ConflictPolicy::Reshard }
    }
}

/// Propagates shardings through `f` (calls inlined, see
/// [`crate::inline_calls`]) on `mesh`, and returns the fully annotated
/// program with reshards inserted, and why every value is sharded as it is.
pub fn propagate(f: &Function, mesh: &Mesh, options: &PropagateOptions) -> Result<ShardedFunction> {
    crate::inline::check_call_free(f)?;
    propagate_call_free(f, mesh, options)
}

/// [`propagate`] for a function known to be call-free (no re-check).
pub fn propagate_inlined(
    f: &crate::inline::InlinedFunction,
    mesh: &Mesh,
    options: &PropagateOptions,
) -> Result<ShardedFunction> {
    propagate_call_free(f.function(), mesh, options)
}

fn propagate_call_free(f: &Function, mesh: &Mesh, options: &PropagateOptions) -> Result<ShardedFunction> {
    weft_ir::verify_function(&Module::new(), f)?;
    let seeds = seed(f, mesh)?;
    let rules: Vec<OpRule> = f
        .insts
        .iter()
        .map(|inst| {
            let ops: Vec<&TensorType> = inst.operands.iter().map(|&o| f.ty(o)).collect();
            let res: Vec<&TensorType> = inst.results.iter().map(|&r| f.ty(r)).collect();
            rule_for(&inst.op, &ops, &res).expect("calls were rejected above")
        })
        .collect();
    let mut g = ProgramGraph::build(f, seeds.facts.clone(), rules);
    let (mut stats, resolutions) = run(f, mesh, &mut g, options);
    stats.egraph_nodes = g.egraph.total_number_of_nodes();
    stats.egraph_classes = g.egraph.number_of_classes();
    if options.conflict_policy == ConflictPolicy::Error {
        check_conflicts(f, &g, &seeds, &resolutions)?;
    }
    Ok(materialize(f, mesh, &g, &seeds, resolutions, stats))
}

/// Bytes the partitioner moves to reshard each value (indexed by value
/// id): its size, except that a `broadcast_in_dim` result is resharded
/// through its operand when that is smaller (the partitioner reshards the
/// operand and broadcasts locally: gathering a `[C]` gain rather than
/// all-to-all'ing its `[B,T,C]` broadcast).
fn reshard_bytes(f: &Function) -> Vec<f64> {
    let mut out: Vec<f64> = f.values.iter().map(|v| v.ty.size_bytes() as f64).collect();
    for inst in &f.insts {
        if let Op::BroadcastInDim { .. } = inst.op {
            let r = inst.results[0].index();
            out[r] = out[r].min(out[inst.operands[0].index()]);
        }
    }
    out
}

fn run(
    f: &Function,
    mesh: &Mesh,
    g: &mut ProgramGraph,
    options: &PropagateOptions,
) -> (PropagationStats, Vec<Resolution>) {
    let n = f.insts.len();
    let limit = options.max_visits_per_inst.saturating_mul(n);
    let moves = reshard_bytes(f);
    let mut stats = PropagationStats { visits: 0, converged: true, ..Default::default() };
    let mut resolutions: BTreeMap<(u32, String, ValueId), Resolution> = BTreeMap::new();
    'phases: for phase in [Priority::User, Priority::Constraint] {
        let mut queue: BTreeSet<usize> = (0..n).collect();
        while let Some(i) = queue.pop_first() {
            if stats.visits >= limit {
                stats.converged = false;
                break 'phases;
            }
            stats.visits += 1;
            let inst = &f.insts[i];
            let values: Vec<ValueId> = inst.operands.iter().chain(&inst.results).copied().collect();
            let outcome = {
                let facts: Vec<_> = values.iter().map(|&v| g.facts(v)).collect();
                step(InstId(i as u32), &g.rules[i], &facts, &moves, mesh, phase)
            };
            for (t, d, fact) in outcome.updates {
                // A value used twice by one instruction gets one update per
                // use; keep only those that still extend what it has.
                let v = values[t];
                let mut facts = g.facts(v).clone();
                let cur = &facts.dims[d];
                if fact.axes.len() <= cur.axes.len()
                    || !fact.axes.starts_with(&cur.axes)
                    || facts.axis_mask() & fact.axes[cur.axes.len()..].iter().fold(0, |m, &a| m | (1 << a)) != 0
                {
                    continue;
                }
                facts.dims[d] = fact;
                g.set_facts(v, facts);
                queue.extend(g.users(v).into_iter().filter(|&u| u != i));
                queue.extend(g.definer(v).filter(|&d| d != i));
            }
            for r in outcome.resolutions {
                resolutions.insert((r.inst.0, r.factor.clone(), r.rejected.0), r);
            }
        }
    }
    (stats, resolutions.into_values().collect())
}

/// The user annotation a value's sharding derives from, following origins.
fn root_annotation(g: &ProgramGraph, seeds: &Seeds, v: ValueId) -> Option<ValueId> {
    let mut seen = BTreeSet::new();
    let mut stack = vec![v];
    while let Some(v) = stack.pop() {
        if !seen.insert(v) {
            continue;
        }
        if seeds.direct[v.index()].as_ref().is_some_and(|d| d.prio == Priority::User) {
            return Some(v);
        }
        for d in &g.facts(v).dims {
            if let Origin::Forward { from, .. } | Origin::Backward { from, .. } = d.origin {
                stack.push(from);
            }
        }
    }
    None
}

fn check_conflicts(f: &Function, g: &ProgramGraph, seeds: &Seeds, resolutions: &[Resolution]) -> Result<()> {
    if let Some(c) = seeds.conflicts.iter().find(|c| c.kept.prio == Priority::User && c.other.prio == Priority::User) {
        return Err(CompilerError::ConflictingAnnotations {
            first: c.kept.site.clone(),
            first_sharding: super::spec::fmt_sharding(&c.kept.sharding),
            second: c.other.site.clone(),
            second_sharding: super::spec::fmt_sharding(&c.other.sharding),
            detail: "both annotate the same value".into(),
        });
    }
    if let Some(r) = resolutions.iter().find(|r| r.user_conflict) {
        let a = root_annotation(g, seeds, r.chosen.0).unwrap_or(r.chosen.0);
        let b = root_annotation(g, seeds, r.rejected.0).unwrap_or(r.rejected.0);
        let describe = |v: ValueId| match &seeds.direct[v.index()] {
            Some(d) => (d.site.clone(), super::spec::fmt_sharding(&d.sharding)),
            None => (Site::new(&f.name, value_subject(f, v), None), "(propagated)".into()),
        };
        let ((first, first_sharding), (second, second_sharding)) = (describe(a), describe(b));
        let subject = weft_ir::verify::inst_subject(f, r.inst);
        let loc = f.insts[r.inst.index()].loc.map(|l| format!(" at {l}")).unwrap_or_default();
        return Err(CompilerError::ConflictingAnnotations {
            first,
            first_sharding,
            second,
            second_sharding,
            detail: format!(
                "they meet at {subject}{loc} (rule {}), where factor {} would be {{{}}} from {} but {{{}}} from {}",
                r.rule,
                r.factor,
                r.chosen.1.join(", "),
                f.value_ref(r.chosen.0),
                r.rejected.1.join(", "),
                f.value_ref(r.rejected.0)
            ),
        });
    }
    Ok(())
}

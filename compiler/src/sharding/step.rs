//! One propagation step: move factor shardings through one instruction.
//!
//! Given the facts about an instruction's operands and result, every tensor
//! whose dimension carries information of the current phase's priority
//! *proposes* axes for the factors of that dimension (via
//! [`super::project::project`]). Need-replication factors propagate too
//! (the concatenation of two `P('x','y')` tensors is `P('x','y')`, as in
//! JAX): the instruction itself computes them unsplit and the result is
//! resharded, which [`super::materialize`] arranges. Proposals are taken strongest first (see
//! `rank`): a factor takes the first proposal's axes, later proposals that
//! extend it add axes (the more sharded compatible choice wins, as in
//! Shardy), and an axis already given to another factor is not given twice.
//! Every proposal that loses is recorded as a [`Resolution`]. Then each
//! tensor's open dimensions are refined to what the factors say, when that
//! only adds axes after the ones it has: facts only ever grow, so
//! propagation reaches a fixed point and its result does not depend on how
//! long anything took.

use super::egraph::{DimFact, Priority, ValueFacts};
use super::explain::{Origin, Resolution};
use super::mesh::Mesh;
use super::project::{dim_axes, project, Projection};
use super::rules::{factor_name, FactorKind, OpRule};
use std::cmp::Ordering;
use weft_ir::InstId;

/// What one step changed.
#[derive(Debug, Default)]
pub struct StepOutcome {
    /// Refined dimensions: (tensor index counting operands then the result,
    /// dimension, new fact). Each only adds axes after the current ones.
    pub updates: Vec<(usize, usize, DimFact)>,
    /// Conflicts settled, keyed by factor.
    pub resolutions: Vec<Resolution>,
}

#[derive(Clone, Debug)]
struct Proposal {
    factor: usize,
    axes: Vec<usize>,
    tensor: usize,
    prio: Priority,
    fixed: bool,
    cost: f64,
}

/// The order in which proposals are taken: stronger priority, then less
/// communication, then fixed (annotated, closed) before propagated, then
/// lower value id, then lower factor index.
fn rank(a: &Proposal, b: &Proposal, ts: &[&ValueFacts]) -> Ordering {
    a.prio
        .cmp(&b.prio)
        .then(a.cost.total_cmp(&b.cost))
        .then(b.fixed.cmp(&a.fixed))
        .then(ts[a.tensor].value.cmp(&ts[b.tensor].value))
        .then(a.factor.cmp(&b.factor))
}

fn mask(axes: &[usize]) -> u64 {
    axes.iter().fold(0, |m, &a| m | (1 << a))
}

fn compatible(a: &[usize], b: &[usize]) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

/// Estimated bytes to reshard if factor `p.factor` takes `p.axes`: every
/// other tensor whose axes for the factor are incompatible, or that uses
/// one of the axes elsewhere, must be resharded (`moves`: bytes that moves,
/// per value id; a broadcast is resharded through its operand); a sharded
/// reduction factor
/// leaves a partial result to all-reduce (twice the result's bytes), and so
/// does a sharded combined (max/min) reduction factor.
fn cost(p: &Proposal, rule: &OpRule, ts: &[&ValueFacts], proj: &[Projection], moves: &[f64]) -> f64 {
    let m = mask(&p.axes);
    let mut total = 0.0;
    for (t, facts) in ts.iter().enumerate() {
        if t == p.tensor {
            continue;
        }
        let own = proj[t].axes(p.factor);
        let incompatible = !own.is_empty() && !compatible(own, &p.axes);
        let elsewhere = facts.axis_mask() & !mask(own) & m != 0;
        if incompatible || elsewhere {
            total += moves[facts.value.index()];
        }
    }
    if matches!(rule.factors[p.factor].kind, FactorKind::Reduction | FactorKind::CombinedReduction) {
        total += 2.0 * ts.last().map(|r| r.bytes()).unwrap_or(0.0);
    }
    total
}

fn reason(win: &Proposal, lose: &Proposal, ts: &[&ValueFacts]) -> String {
    let name = |p: Priority| match p {
        Priority::User => "a user annotation",
        Priority::Constraint => "a sharding_constraint",
    };
    if win.prio != lose.prio {
        format!("{} (or what propagated from it) outranks {}", name(win.prio), name(lose.prio))
    } else if win.cost < lose.cost {
        format!("less communication (~{} vs ~{} bytes to reshard)", win.cost, lose.cost)
    } else if win.fixed != lose.fixed {
        "equal communication; an annotated (closed) sharding outranks a propagated one".into()
    } else {
        format!("tie broken by lower value id ({} before {})", ts[win.tensor].value, ts[lose.tensor].value)
    }
}

/// Runs one propagation step through instruction `inst` with rule `rule`
/// over `ts` (operand facts, then the result's), using only information of
/// priority `phase` or stronger.
pub fn step(
    inst: InstId,
    rule: &OpRule,
    ts: &[&ValueFacts],
    moves: &[f64],
    mesh: &Mesh,
    phase: Priority,
) -> StepOutcome {
    let proj: Vec<Projection> = ts
        .iter()
        .enumerate()
        .map(|(t, f)| {
            let dims: Vec<&[usize]> = f.dims.iter().map(|d| d.axes.as_slice()).collect();
            project(rule.tensor(t), &dims, rule, mesh)
        })
        .collect();
    let mut props = Vec::new();
    for (t, facts) in ts.iter().enumerate() {
        for (d, fs) in rule.tensor(t).iter().enumerate() {
            let df = &facts.dims[d];
            let Some(prio) = df.prio.filter(|&p| p <= phase) else { continue };
            for &f in fs {
                let axes = proj[t].axes(f);
                if !axes.is_empty() {
                    props.push(Proposal {
                        factor: f,
                        axes: axes.to_vec(),
                        tensor: t,
                        prio,
                        fixed: !df.open,
                        cost: 0.0,
                    });
                }
            }
        }
    }
    if props.is_empty() {
        return StepOutcome::default();
    }
    let costs: Vec<f64> = props.iter().map(|p| cost(p, rule, ts, &proj, moves)).collect();
    for (p, c) in props.iter_mut().zip(costs) {
        p.cost = c;
    }
    props.sort_by(|a, b| rank(a, b, ts));

    let nf = rule.factors.len();
    let mut m: Vec<Vec<usize>> = vec![Vec::new(); nf];
    let mut owner: Vec<Option<usize>> = vec![None; nf]; // proposal that decided each factor
    let mut axis_src: Vec<Option<usize>> = vec![None; mesh.axes().len()]; // proposal that placed each axis
    let mut used = 0u64;
    let mut out = StepOutcome::default();
    for (pi, p) in props.iter().enumerate() {
        let f = p.factor;
        let start = match owner[f] {
            None => 0,
            Some(_) if p.axes.starts_with(&m[f]) => m[f].len(),
            Some(_) if m[f].starts_with(&p.axes) => continue,
            Some(o) => {
                out.resolutions.push(resolution(inst, rule, &props[o], p, ts, mesh, &m[f]));
                continue;
            }
        };
        owner[f].get_or_insert(pi);
        for &a in &p.axes[start..] {
            if used & (1 << a) != 0 {
                let w = axis_src[a].map(|s| &props[s]).unwrap_or(p);
                out.resolutions.push(resolution(inst, rule, w, p, ts, mesh, &[a]));
                break;
            }
            used |= 1 << a;
            axis_src[a] = Some(pi);
            m[f].push(a);
        }
    }

    let result = ts.len() - 1;
    for (t, facts) in ts.iter().enumerate() {
        let mut used_t = facts.axis_mask();
        for (d, fs) in rule.tensor(t).iter().enumerate() {
            let df = &facts.dims[d];
            let want = merged_axes(fs, &m, rule, mesh);
            if !df.open || want.len() <= df.axes.len() || !want.starts_with(&df.axes) {
                continue;
            }
            let mut axes = df.axes.clone();
            let extent = facts.ty.shape[d];
            for &a in &want[df.axes.len()..] {
                if used_t & (1 << a) != 0 || extent % (mesh.product(&axes) * mesh.size(a)) != 0 {
                    break;
                }
                used_t |= 1 << a;
                axes.push(a);
            }
            let Some(src) = axes.get(df.axes.len()).and_then(|&a| axis_src[a]) else { continue };
            let from = ts[props[src].tensor].value;
            let origin = if t == result { Origin::Forward { inst, from } } else { Origin::Backward { inst, from } };
            out.updates.push((t, d, DimFact { axes, open: true, prio: Some(props[src].prio), origin }));
        }
    }
    out
}

/// The axes a dimension made of factors `fs` gets from the factor
/// shardings `m`. Normally [`dim_axes`]: the factors' axes up to the first
/// factor that is not fully split. When that drops the axes of a later
/// factor (a reshape merging `[{x}, {y}]` into one dimension, `x` not
/// splitting the major part whole), the dimension takes all of them, in
/// order, if the first partly split factor can hold them: `{x, y}`. The
/// operand then reaches the layout the merged dimension needs with one
/// all-to-all (moving `y` from the minor part to the major one) instead of
/// gathering `y`, and the result stays split over both axes, as in JAX.
fn merged_axes(fs: &[usize], m: &[Vec<usize>], rule: &OpRule, mesh: &Mesh) -> Vec<usize> {
    let (axes, exact) = dim_axes(fs, m, rule, mesh);
    if exact {
        return axes;
    }
    let all: Vec<usize> = fs.iter().flat_map(|&f| m[f].iter().copied()).collect();
    let single =
        OpRule { factors: rule.factors.clone(), operands: vec![], results: vec![vec![fs.to_vec()]], kind: rule.kind };
    if project(&single.results[0], &[&all], &single, mesh).exact() {
        all
    } else {
        axes
    }
}

fn resolution(
    inst: InstId,
    rule: &OpRule,
    win: &Proposal,
    lose: &Proposal,
    ts: &[&ValueFacts],
    mesh: &Mesh,
    kept: &[usize],
) -> Resolution {
    let names = |axes: &[usize]| axes.iter().map(|&a| mesh.name(a).to_string()).collect::<Vec<_>>();
    let factor = if win.factor == lose.factor {
        factor_name(lose.factor)
    } else {
        format!(
            "{} (axis {{{}}} already on factor {})",
            factor_name(lose.factor),
            names(kept).join(", "),
            factor_name(win.factor)
        )
    };
    Resolution {
        inst,
        rule: rule.to_string(),
        factor,
        chosen: (ts[win.tensor].value, names(&win.axes)),
        rejected: (ts[lose.tensor].value, names(&lose.axes)),
        reason: reason(win, lose, ts),
        // The same factor wanted two ways, or one axis wanted by two result
        // dimensions: what JAX's explicit mode rejects. (An axis moving
        // between a result factor and a contracting one is an all-gather
        // JAX accepts.)
        user_conflict: win.prio == Priority::User
            && lose.prio == Priority::User
            && win.tensor != lose.tensor
            && (win.factor == lose.factor || (rule.in_result(win.factor) && rule.in_result(lose.factor))),
    }
}

//! From propagated facts to a fully annotated program with explicit reshards.
//!
//! Instructions are re-emitted in program order into a new function. For
//! each one, the factor shardings are fixed: factors of the result take the
//! result's propagated sharding; factors only the operands have (contracting
//! and reduced dimensions) take the operands' common sharding, or, when the
//! operands disagree, the option with the least estimated communication
//! (operand reshards plus the all-reduce a partial result will need; ties
//! go to the earliest operand's). Need-replication factors are unsplit.
//! Combined (`max`/`min`) reduction factors are chosen like reduction
//! factors, costing the all-reduce of the result their lowering emits.
//! Every operand whose sharding differs from what those factors require is
//! resharded first (one `reshard` per value and target, reused by later
//! users), operands are always reduced, and the result is exactly what the
//! factors give, unreduced over the axes of sharded reduction factors. When
//! that differs from the value's propagated sharding (an annotation the op
//! cannot produce directly), the instruction computes into a fresh value
//! and a `reshard` produces the original one. Function results are reduced
//! unless annotated otherwise.

use super::egraph::{ProgramGraph, ValueFacts};
use super::explain::Resolution;
use super::mesh::Mesh;
use super::project::{make_expressible, project, tensor_axes, Projection};
use super::reshard::{all_reduce_cost, plan_reshard};
use super::rules::{factor_name, FactorKind, OpRule, RuleKind, TensorFactors};
use super::seed::Seeds;
use super::sharded::PropagationStats;
use super::sharded::{ReshardRecord, ShardedFunction};
use super::spec::{fmt_sharding, DimAxes, MeshSharding};
use std::collections::HashMap;
use weft_ir::{Function, InstId, Loc, Op, TensorType, ValueId};

struct Emitter<'a> {
    f: &'a Function,
    mesh: &'a Mesh,
    out: Function,
    cur: Vec<MeshSharding>,
    source_of: Vec<ValueId>,
    cache: HashMap<(ValueId, MeshSharding), ValueId>,
    reshards: Vec<ReshardRecord>,
    notes: Vec<String>,
}

fn target(facts: &ValueFacts) -> MeshSharding {
    MeshSharding {
        dims: facts.dims.iter().map(|d| DimAxes { axes: d.axes.clone(), open: false }).collect(),
        unreduced: facts.unreduced.clone().unwrap_or_default(),
    }
}

fn required(tf: &TensorFactors, m: &[Vec<usize>], rule: &OpRule, mesh: &Mesh) -> MeshSharding {
    MeshSharding::from_axes(tensor_axes(tf, m, rule, mesh), vec![])
}

fn natural(rule: &OpRule, m: &[Vec<usize>], mesh: &Mesh) -> MeshSharding {
    let red = (0..rule.factors.len()).filter(|&f| rule.factors[f].kind == FactorKind::Reduction);
    MeshSharding::from_axes(tensor_axes(&rule.results[0], m, rule, mesh), red.flat_map(|f| m[f].clone()).collect())
}

/// The pending-sum axes of `nat` a value sharded as `want` keeps: those its
/// dimensions do not use (an axis that also splits a dimension of the value
/// is reduce-scattered into it).
fn kept_unreduced(nat: &MeshSharding, want: &MeshSharding) -> Vec<usize> {
    let used = want.dims.iter().fold(0u64, |m, d| m | mask(&d.axes));
    nat.unreduced.iter().copied().filter(|&a| used & (1 << a) == 0).collect()
}

fn mask(axes: &[usize]) -> u64 {
    axes.iter().fold(0, |m, &a| m | (1 << a))
}

impl Emitter<'_> {
    fn emit(
        &mut self,
        op: Op,
        operands: Vec<ValueId>,
        result: (TensorType, Option<String>),
        s: MeshSharding,
        loc: Option<Loc>,
        source: ValueId,
    ) -> ValueId {
        let inst = self.out.add_inst(op, operands, vec![result], loc);
        let v = self.out.insts[inst.index()].results[0];
        self.out.values[v.index()].sharding = Some(s.to_ir(self.mesh));
        self.cur.push(s);
        self.source_of.push(source);
        v
    }

    /// `v` (new id) with sharding `want`, resharding it if needed.
    fn ensure(&mut self, v: ValueId, want: &MeshSharding, user: Option<InstId>, why: &dyn Fn() -> String) -> ValueId {
        if self.cur[v.index()] == *want {
            return v;
        }
        if let Some(&r) = self.cache.get(&(v, want.clone())) {
            return r;
        }
        let ty = self.out.ty(v).clone();
        let from = self.cur[v.index()].clone();
        let plan = plan_reshard(&ty, &from, want, self.mesh);
        let loc = user.and_then(|u| self.f.insts[u.index()].loc).or(self.f.return_loc);
        let source = self.source_of[v.index()];
        let r = self.emit(Op::Reshard { to: want.to_ir(self.mesh) }, vec![v], (ty, None), want.clone(), loc, source);
        self.reshards.push(ReshardRecord {
            value: r,
            source,
            user,
            from: from.to_ir(self.mesh),
            to: want.to_ir(self.mesh),
            collectives: plan.describe(self.mesh),
            cost: plan.cost,
            why: why(),
        });
        self.cache.insert((v, want.clone()), r);
        r
    }

    fn projections(&self, rule: &OpRule, ops: &[ValueId]) -> Vec<Projection> {
        ops.iter()
            .enumerate()
            .map(|(i, &o)| {
                let dims: Vec<&[usize]> = self.cur[o.index()].dims.iter().map(|d| d.axes.as_slice()).collect();
                project(&rule.operands[i], &dims, rule, self.mesh)
            })
            .collect()
    }

    /// Communication of computing the instruction with factor shardings `m`
    /// when the value must end up with dimensions `want` (and unreduced
    /// axes `want.unreduced` if `fixed_unreduced`): operand reshards, the
    /// reshard of the result if it does not come out as wanted, the
    /// all-reduce a partial result will need, and the max/min all-reduce of
    /// a split combined reduction.
    fn option_cost(
        &self,
        rule: &OpRule,
        m: &[Vec<usize>],
        ops: &[ValueId],
        want: &MeshSharding,
        fixed_unreduced: bool,
        ty: &TensorType,
    ) -> f64 {
        let mut cost = 0.0;
        for (i, &o) in ops.iter().enumerate() {
            let req = required(&rule.operands[i], m, rule, self.mesh);
            cost += plan_reshard(self.out.ty(o), &self.cur[o.index()], &req, self.mesh).cost;
        }
        let nat = natural(rule, m, self.mesh);
        let combined: Vec<usize> = (0..rule.factors.len())
            .filter(|&f| rule.factors[f].kind == FactorKind::CombinedReduction)
            .flat_map(|f| m[f].clone())
            .collect();
        if !combined.is_empty() {
            let local: usize = nat.local_shape(&ty.shape, self.mesh).iter().product();
            cost += all_reduce_cost((local * ty.dtype.size_bytes()) as f64, &combined, self.mesh);
        }
        let mut fin = want.clone();
        if !fixed_unreduced {
            fin.unreduced = kept_unreduced(&nat, want);
            let local: usize = fin.local_shape(&ty.shape, self.mesh).iter().product();
            cost += all_reduce_cost((local * ty.dtype.size_bytes()) as f64, &nat.unreduced, self.mesh);
        }
        if nat != fin {
            cost += plan_reshard(ty, &nat, &fin, self.mesh).cost;
        }
        cost
    }

    /// Fixes every factor's sharding for instruction `id` whose value must
    /// end up as `want` (see the module doc).
    fn choose(
        &mut self,
        id: InstId,
        rule: &OpRule,
        ops: &[ValueId],
        want: &MeshSharding,
        fixed_unreduced: bool,
        ty: &TensorType,
    ) -> Vec<Vec<usize>> {
        let nf = rule.factors.len();
        let dims: Vec<&[usize]> = want.dims.iter().map(|d| d.axes.as_slice()).collect();
        let rp = project(&rule.results[0], &dims, rule, self.mesh);
        let mut m = vec![Vec::new(); nf];
        for (f, slot) in m.iter_mut().enumerate() {
            if rule.in_result(f) && rule.factors[f].kind != FactorKind::NeedReplication {
                *slot = rp.axes(f).to_vec();
            }
        }
        let proj = self.projections(rule, ops);
        for f in 0..nf {
            if rule.in_result(f) || rule.factors[f].kind == FactorKind::NeedReplication {
                continue;
            }
            let used = m.iter().fold(0, |u, a| u | mask(a));
            let mut cands: Vec<Vec<usize>> = Vec::new();
            for p in proj.iter().filter(|p| p.factors[f].is_some()) {
                if !cands.iter().any(|c| c == p.axes(f)) {
                    cands.push(p.axes(f).to_vec());
                }
            }
            if cands.len() <= 1 && cands.first().is_none_or(|c| mask(c) & used == 0) {
                m[f] = cands.pop().unwrap_or_default();
                continue;
            }
            // Options: each operand's axes (taking them from result factors
            // that have them), the same without axes already used, unsplit.
            for c in cands.clone() {
                let t: Vec<usize> = c.iter().copied().take_while(|&a| used & (1 << a) == 0).collect();
                if !cands.contains(&t) {
                    cands.push(t);
                }
            }
            if !cands.contains(&Vec::new()) {
                cands.push(Vec::new());
            }
            let trials: Vec<(Vec<Vec<usize>>, f64)> = cands
                .iter()
                .map(|c| {
                    let mut trial = m.clone();
                    for g in (0..nf).filter(|&g| g != f) {
                        if let Some(cut) = trial[g].iter().position(|a| c.contains(a)) {
                            trial[g].truncate(cut);
                        }
                    }
                    trial[f] = c.clone();
                    make_expressible(&mut trial, rule, self.mesh);
                    let cost = self.option_cost(rule, &trial, ops, want, fixed_unreduced, ty);
                    (trial, cost)
                })
                .collect();
            let best = (0..trials.len()).fold(0, |b, i| if trials[i].1 < trials[b].1 { i } else { b });
            let names = |c: &[usize]| c.iter().map(|&a| self.mesh.name(a)).collect::<Vec<_>>().join(", ");
            let options: Vec<String> =
                cands.iter().zip(&trials).map(|(c, t)| format!("{{{}}} costs ~{}", names(c), t.1)).collect();
            self.notes.push(format!(
                "{} (rule {rule}): factor {} could be split several ways; chose {{{}}}, the least communication ({})",
                weft_ir::verify::inst_subject(self.f, id),
                factor_name(f),
                names(&cands[best]),
                options.join("; ")
            ));
            m = trials.into_iter().nth(best).expect("best is an index of trials").0;
        }
        make_expressible(&mut m, rule, self.mesh);
        m
    }
}

/// Builds the sharded function from the propagated facts in `g`.
pub fn materialize(
    f: &Function,
    mesh: &Mesh,
    g: &ProgramGraph,
    seeds: &Seeds,
    resolutions: Vec<Resolution>,
    stats: PropagationStats,
) -> ShardedFunction {
    let mut out = Function::new(f.name.clone());
    (out.loc, out.return_loc) = (f.loc, f.return_loc);
    let mut e = Emitter {
        f,
        mesh,
        out,
        cur: Vec::new(),
        source_of: Vec::new(),
        cache: HashMap::new(),
        reshards: Vec::new(),
        notes: seeds.conflicts.iter().map(|c| c.describe()).collect(),
    };
    let mut map = vec![ValueId(u32::MAX); f.values.len()];
    let mut finals: Vec<MeshSharding> = f.values.iter().map(|v| MeshSharding::replicated(v.ty.rank())).collect();
    for &p in &f.params {
        let s = target(g.facts(p));
        let np = e.out.add_param(f.value(p).name.clone(), f.ty(p).clone());
        e.out.values[np.index()].sharding = Some(s.to_ir(mesh));
        e.cur.push(s.clone());
        e.source_of.push(p);
        (map[p.index()], finals[p.index()]) = (np, s);
    }
    for (id, inst) in f.iter_insts() {
        let rule = &g.rules[id.index()];
        let r = inst.results[0];
        let facts = g.facts(r);
        let (ty, name) = (f.ty(r).clone(), f.value(r).name.clone());
        let ops: Vec<ValueId> = inst.operands.iter().map(|o| map[o.index()]).collect();
        // Formatted only when a reshard needs explaining.
        let subject = || weft_ir::verify::inst_subject(f, id);
        let new = match rule.kind {
            RuleKind::Reshard => {
                let s = target(facts);
                finals[r.index()] = s.clone();
                e.emit(Op::Reshard { to: s.to_ir(mesh) }, ops, (ty, name), s, inst.loc, r)
            }
            RuleKind::Identity => {
                let s = target(facts);
                let why = || {
                    format!(
                        "{} is an identity whose operand must already be {}",
                        subject(),
                        fmt_sharding(&s.to_ir(mesh))
                    )
                };
                let o = e.ensure(ops[0], &s, Some(id), &why);
                finals[r.index()] = s.clone();
                e.emit(Op::ShardingConstraint { sharding: s.to_ir(mesh) }, vec![o], (ty, name), s, inst.loc, r)
            }
            RuleKind::Compute => {
                let mut want = target(facts);
                let m = e.choose(id, rule, &ops, &want, facts.unreduced.is_some(), &ty);
                let mut new_ops = Vec::with_capacity(ops.len());
                for (i, &o) in ops.iter().enumerate() {
                    let req = required(&rule.operands[i], &m, rule, mesh);
                    let why = || {
                        format!(
                            "operand {i} of {} must be {} for its rule {rule}",
                            subject(),
                            fmt_sharding(&req.to_ir(mesh))
                        )
                    };
                    new_ops.push(e.ensure(o, &req, Some(id), &why));
                }
                let nat = natural(rule, &m, mesh);
                if facts.unreduced.is_none() {
                    want.unreduced = kept_unreduced(&nat, &want);
                }
                finals[r.index()] = want.clone();
                if nat == want {
                    e.emit(inst.op.clone(), new_ops, (ty, name), want, inst.loc, r)
                } else {
                    let tmp = e.emit(inst.op.clone(), new_ops, (ty.clone(), None), nat.clone(), inst.loc, r);
                    let why = || {
                        format!(
                            "{} computes {} locally but the value is {}",
                            subject(),
                            fmt_sharding(&nat.to_ir(mesh)),
                            fmt_sharding(&want.to_ir(mesh))
                        )
                    };
                    let v = e.ensure(tmp, &want, Some(id), &why);
                    e.out.values[v.index()].name = name;
                    v
                }
            }
        };
        map[r.index()] = new;
    }
    for (k, &r) in f.results.iter().enumerate() {
        let fin = &finals[r.index()];
        let req = match seeds.results.get(k).cloned().flatten() {
            Some(mut a) => {
                // Open dimensions of the annotation take what propagation
                // added, where that does not reuse an axis.
                let mut used = a.axis_mask();
                for (d, fd) in a.dims.iter_mut().zip(&fin.dims) {
                    if d.open && fd.axes.starts_with(&d.axes) {
                        for &x in &fd.axes[d.axes.len()..] {
                            if used & (1 << x) != 0 {
                                break;
                            }
                            used |= 1 << x;
                            d.axes.push(x);
                        }
                    }
                    d.open = false;
                }
                a
            }
            None => MeshSharding { unreduced: vec![], ..fin.clone() },
        };
        let why = || format!("result {k} must be returned as {}", fmt_sharding(&req.to_ir(mesh)));
        let v = e.ensure(map[r.index()], &req, None, &why);
        e.out.results.push(v);
        e.out.result_shardings.push(Some(req.to_ir(mesh)));
    }
    ShardedFunction {
        function: e.out,
        value_map: map,
        shardings: finals.iter().map(|s| s.to_ir(mesh)).collect(),
        origins: f
            .values
            .iter()
            .enumerate()
            .map(|(i, _)| g.facts(ValueId(i as u32)).dims.iter().map(|d| d.origin).collect())
            .collect(),
        resolutions,
        notes: e.notes,
        reshards: e.reshards,
        stats,
        source: f.clone(),
        mesh: mesh.clone(),
    }
}

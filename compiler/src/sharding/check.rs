//! The contract between propagation and the SPMD partitioner.
//!
//! [`check_locally_computable`] accepts a function only if every value has a
//! closed sharding valid on the mesh and every instruction other than
//! `reshard` can be computed by each device from its own operand blocks,
//! with no communication: seen through the instruction's rule, all tensors
//! shard every factor the same way (exactly: a replicated operand of a
//! sharded result is a reshard too, a local slice); need-replication
//! factors and factors missing from the result (other than reduction ones)
//! are unsplit; operands are reduced; and the result is unreduced over
//! exactly the axes of the sharded reduction factors. `sharding_constraint`
//! must not change the sharding at all. The partitioner relies on this.

use super::mesh::Mesh;
use super::project::project;
use super::rules::{factor_name, rule_for, FactorKind, RuleKind};
use super::spec::{fmt_sharding, MeshSharding};
use crate::error::{CompilerError, Result, Site};
use weft_ir::{Function, Op, TensorType, ValueId};

fn resolved(f: &Function, mesh: &Mesh, v: ValueId, problems: &mut Vec<String>) -> Option<MeshSharding> {
    let data = f.value(v);
    let Some(s) = &data.sharding else {
        problems.push(format!("in @{}: {} has no sharding", f.name, f.value_ref(v)));
        return None;
    };
    let site = Site::new(&f.name, f.value_ref(v), None);
    match MeshSharding::resolve(s, &data.ty, mesh, &site) {
        Err(e) => {
            problems.push(e.to_string());
            None
        }
        Ok(ms) if ms.dims.iter().any(|d| d.open) => {
            problems.push(format!("in @{}: {} has an open sharding {}", f.name, f.value_ref(v), fmt_sharding(s)));
            None
        }
        Ok(ms) => Some(ms),
    }
}

/// Checks that every instruction of `f` is locally computable on `mesh`
/// given its operands' shardings (see the module doc); lists every problem.
pub fn check_locally_computable(f: &Function, mesh: &Mesh) -> Result<()> {
    let mut problems = Vec::new();
    let shardings: Vec<Option<MeshSharding>> =
        (0..f.values.len()).map(|i| resolved(f, mesh, ValueId(i as u32), &mut problems)).collect();
    for (id, inst) in f.iter_insts() {
        let subject = format!("in @{}: {}", f.name, weft_ir::verify::inst_subject(f, id));
        let mut bad = |msg: String| problems.push(format!("{subject}: {msg}"));
        let all: Vec<ValueId> = inst.operands.iter().chain(&inst.results).copied().collect();
        let Some(ss) = all.iter().map(|v| shardings[v.index()].clone()).collect::<Option<Vec<_>>>() else { continue };
        let ops: Vec<&TensorType> = inst.operands.iter().map(|&o| f.ty(o)).collect();
        let res: Vec<&TensorType> = inst.results.iter().map(|&r| f.ty(r)).collect();
        let Some(rule) = rule_for(&inst.op, &ops, &res) else {
            bad("calls must be inlined".into());
            continue;
        };
        let result = ss.last().expect("one result");
        match rule.kind {
            RuleKind::Reshard => {
                if let Op::Reshard { to } = &inst.op {
                    if Some(to) != f.value(inst.results[0]).sharding.as_ref() {
                        bad(format!("result is not sharded as the reshard's target {}", fmt_sharding(to)));
                    }
                }
                continue;
            }
            RuleKind::Identity => {
                if ss[0] != *result {
                    bad(format!(
                        "operand is {} but the result is {}",
                        fmt_sharding(&ss[0].to_ir(mesh)),
                        fmt_sharding(&result.to_ir(mesh))
                    ));
                }
                continue;
            }
            RuleKind::Compute => {}
        }
        let proj: Vec<_> = ss
            .iter()
            .enumerate()
            .map(|(t, s)| {
                let dims: Vec<&[usize]> = s.dims.iter().map(|d| d.axes.as_slice()).collect();
                project(rule.tensor(t), &dims, &rule, mesh)
            })
            .collect();
        for (t, p) in proj.iter().enumerate() {
            for (d, left) in p.leftover.iter().enumerate().filter(|(_, l)| !l.is_empty()) {
                let names: Vec<&str> = left.iter().map(|&a| mesh.name(a)).collect();
                bad(format!(
                    "{} dimension {d}: axes {{{}}} do not fit the factors of {rule}",
                    f.value_ref(all[t]),
                    names.join(", ")
                ));
            }
        }
        for (i, s) in ss[..inst.operands.len()].iter().enumerate() {
            if !s.unreduced.is_empty() {
                bad(format!("operand {i} ({}) is unreduced", f.value_ref(inst.operands[i])));
            }
        }
        let nops = inst.operands.len();
        let mut red = Vec::new();
        for (fi, factor) in rule.factors.iter().enumerate() {
            let holders: Vec<usize> = (0..proj.len()).filter(|&t| proj[t].factors[fi].is_some()).collect();
            let name = factor_name(fi);
            let axes = |t: usize| proj[t].axes(fi);
            if factor.kind == FactorKind::NeedReplication {
                for &t in holders.iter().filter(|&&t| !axes(t).is_empty()) {
                    bad(format!("factor {name} of {rule} needs replication but {} splits it", f.value_ref(all[t])));
                }
                continue;
            }
            let reference = if rule.in_result(fi) { Some(nops) } else { holders.first().copied() };
            let Some(reference) = reference else { continue };
            for &t in &holders {
                if axes(t) != axes(reference) {
                    bad(format!(
                        "factor {name} of {rule} is split {:?} in {} but {:?} in {}",
                        axes(t).iter().map(|&a| mesh.name(a)).collect::<Vec<_>>(),
                        f.value_ref(all[t]),
                        axes(reference).iter().map(|&a| mesh.name(a)).collect::<Vec<_>>(),
                        f.value_ref(all[reference]),
                    ));
                }
            }
            if !rule.in_result(fi) {
                if factor.kind == FactorKind::Reduction {
                    red.extend_from_slice(axes(reference));
                } else if factor.kind != FactorKind::CombinedReduction && !axes(reference).is_empty() {
                    bad(format!("factor {name} of {rule} is not in the result but is split"));
                }
            }
        }
        red.sort_unstable();
        if result.unreduced != red {
            let names = |v: &[usize]| v.iter().map(|&a| mesh.name(a)).collect::<Vec<_>>().join(", ");
            bad(format!(
                "result is unreduced over {{{}}} but the sharded reduction factors give {{{}}}",
                names(&result.unreduced),
                names(&red)
            ));
        }
    }
    for (k, (&r, s)) in f.results.iter().zip(&f.result_shardings).enumerate() {
        if let Some(s) = s {
            if f.value(r).sharding.as_ref() != Some(s) {
                problems.push(format!(
                    "in @{}: result {k} is annotated {} but its value is not",
                    f.name,
                    fmt_sharding(s)
                ));
            }
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(CompilerError::NotLocallyComputable { problems })
    }
}

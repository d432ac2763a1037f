//! The starting point of propagation: every annotation, checked and placed.
//!
//! Annotations come from parameters (user, like `jit(in_shardings=...)`),
//! function results (user, `out_shardings`), `sharding_constraint` and
//! `reshard` instructions, and sharding annotations on instruction results
//! (both constraint priority). Each is checked against the mesh (errors name
//! the value and its source position) and becomes the initial
//! [`ValueFacts`] of its value: closed dimensions are fixed, open ones may
//! be refined. When one value carries two annotations that disagree, the
//! first in this order is kept for propagation and the disagreement is
//! recorded: the value is resharded before it is returned.

use super::egraph::{DimFact, Priority, ValueFacts};
use super::explain::{Annotation, AnnotationKind, Origin};
use super::mesh::Mesh;
use super::spec::{fmt_sharding, MeshSharding};
use crate::error::{Result, Site};
use weft_ir::{Function, Op, TensorSharding, ValueDef, ValueId};

/// A direct annotation on a value: where it was written and what it says.
#[derive(Clone, Debug, PartialEq)]
pub struct Direct {
    /// What kind of annotation, and its position.
    pub annotation: Annotation,
    /// Its priority.
    pub prio: Priority,
    /// Where it is, for error messages.
    pub site: Site,
    /// The sharding as written.
    pub sharding: TensorSharding,
}

/// Two annotations on the same value that disagree.
#[derive(Clone, Debug, PartialEq)]
pub struct SeedConflict {
    /// The annotation kept for propagation.
    pub kept: Direct,
    /// The one that lost (the value is resharded to it where it applies).
    pub other: Direct,
}

/// Initial facts and everything else read from the annotations.
#[derive(Clone, Debug)]
pub struct Seeds {
    /// Initial facts, one per value.
    pub facts: Vec<ValueFacts>,
    /// The direct annotation kept for each value, if any.
    pub direct: Vec<Option<Direct>>,
    /// The checked `out_shardings` of each function result.
    pub results: Vec<Option<MeshSharding>>,
    /// Annotations that disagreed.
    pub conflicts: Vec<SeedConflict>,
}

/// How a value is named in error messages.
pub fn value_subject(f: &Function, v: ValueId) -> String {
    match f.value(v).def {
        ValueDef::Param(i) => format!("parameter {}", f.value_ref(f.params[i as usize])),
        ValueDef::Inst { inst, .. } => format!("value {} ({})", f.value_ref(v), weft_ir::verify::inst_subject(f, inst)),
    }
}

fn facts_from(v: ValueId, f: &Function, s: &MeshSharding, d: &Direct) -> ValueFacts {
    let dims = s
        .dims
        .iter()
        .map(|x| DimFact {
            axes: x.axes.clone(),
            open: x.open,
            prio: Some(d.prio),
            origin: Origin::Annotation(d.annotation),
        })
        .collect();
    ValueFacts { value: v, ty: f.ty(v).clone(), dims, unreduced: Some(s.unreduced.clone()) }
}

/// Reads and checks every annotation of `f` against `mesh`.
pub fn seed(f: &Function, mesh: &Mesh) -> Result<Seeds> {
    let n = f.values.len();
    let mut seeds = Seeds {
        facts: (0..n).map(|i| ValueFacts::unknown(ValueId(i as u32), f.values[i].ty.clone())).collect(),
        direct: vec![None; n],
        results: Vec::new(),
        conflicts: Vec::new(),
    };
    let place = |seeds: &mut Seeds, v: ValueId, s: &TensorSharding, d: Direct| -> Result<()> {
        let ms = MeshSharding::resolve(s, f.ty(v), mesh, &d.site)?;
        match seeds.direct[v.index()].take() {
            Some(kept)
                if kept.prio < d.prio || (kept.prio == d.prio && kept.annotation.kind != AnnotationKind::Value) =>
            {
                if kept.sharding != d.sharding {
                    seeds.conflicts.push(SeedConflict { kept: kept.clone(), other: d });
                }
                seeds.direct[v.index()] = Some(kept);
            }
            previous => {
                if let Some(p) = previous.filter(|p| p.sharding != d.sharding) {
                    seeds.conflicts.push(SeedConflict { kept: d.clone(), other: p });
                }
                seeds.facts[v.index()] = facts_from(v, f, &ms, &d);
                seeds.direct[v.index()] = Some(d);
            }
        }
        Ok(())
    };
    for (i, &p) in f.params.iter().enumerate() {
        if let Some(s) = &f.value(p).sharding {
            let annotation = Annotation { kind: AnnotationKind::Param(i), loc: f.loc };
            let site = Site::new(&f.name, value_subject(f, p), f.loc);
            place(&mut seeds, p, s, Direct { annotation, prio: Priority::User, site, sharding: s.clone() })?;
        }
    }
    for (id, inst) in f.iter_insts() {
        let r = inst.results[0];
        let site = Site::new(&f.name, value_subject(f, r), inst.loc);
        let op_sharding = match &inst.op {
            Op::ShardingConstraint { sharding } => Some((sharding, AnnotationKind::Constraint)),
            Op::Reshard { to } => Some((to, AnnotationKind::Reshard)),
            _ => None,
        };
        if let Some((s, kind)) = op_sharding {
            let annotation = Annotation { kind, loc: inst.loc };
            let site = Site::new(&f.name, weft_ir::verify::inst_subject(f, id), inst.loc);
            place(&mut seeds, r, s, Direct { annotation, prio: Priority::Constraint, site, sharding: s.clone() })?;
        }
        for &v in &inst.results {
            if let Some(s) = &f.value(v).sharding {
                let annotation = Annotation { kind: AnnotationKind::Value, loc: inst.loc };
                let d = Direct { annotation, prio: Priority::Constraint, site: site.clone(), sharding: s.clone() };
                place(&mut seeds, v, s, d)?;
            }
        }
    }
    for (k, &r) in f.results.iter().enumerate() {
        let Some(Some(s)) = f.result_shardings.get(k) else {
            seeds.results.push(None);
            continue;
        };
        let annotation = Annotation { kind: AnnotationKind::Result(k), loc: f.return_loc };
        let site = Site::new(&f.name, format!("result {k} ({})", f.value_ref(r)), f.return_loc);
        let d = Direct { annotation, prio: Priority::User, site: site.clone(), sharding: s.clone() };
        seeds.results.push(Some(MeshSharding::resolve(s, f.ty(r), mesh, &site)?));
        place(&mut seeds, r, s, d)?;
    }
    Ok(seeds)
}

impl SeedConflict {
    /// A one-line description.
    pub fn describe(&self) -> String {
        format!(
            "{} is {} but {} is {}; the first is kept and the value resharded where the second applies",
            self.kept.site,
            fmt_sharding(&self.kept.sharding),
            self.other.site,
            fmt_sharding(&self.other.sharding)
        )
    }
}

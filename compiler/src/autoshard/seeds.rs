//! Whole-program starting plans for the extractor.
//!
//! Every factor of every instruction is linked to the tensor dimensions it
//! indexes (operands and result), so the program's dimensions fall into
//! *dimension classes* (a union-find): the batch dimension of every
//! activation and gradient is one class, the hidden dimension of one layer
//! (its weights' columns, its activations' features) another. Splitting a
//! mesh axis over one class everywhere is a consistent global strategy:
//! data parallelism is the data axis on the batch class, Megatron the model
//! axis on the hidden classes. Classes that play the same role (same
//! extent, same multiset of (op, tensor, dimension) occurrences — the
//! hidden class of each layer) form a *group*, and a starting plan assigns
//! each mesh axis to one group or to none. The best such plan (exact cost
//! and memory, see [`super::extract::evaluate`]) seeds the extraction,
//! which then improves it choice by choice.

use super::problem::Problem;
use super::space::Space;
use crate::sharding::rules::FactorKind;
use crate::sharding::Mesh;
use rustc_hash::FxHashMap as HashMap;
use std::collections::BTreeMap;
use weft_ir::Function;

/// A complete choice: an option per instruction and a class per parameter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Choice {
    /// Option index per instruction (`None` for deferred ones).
    pub options: Vec<Option<usize>>,
    /// Class per parameter (`None` when unused).
    pub homes: Vec<Option<u8>>,
}

struct Dsu(Vec<usize>);

impl Dsu {
    fn find(&mut self, x: usize) -> usize {
        let mut r = x;
        while self.0[r] != r {
            r = self.0[r];
        }
        let mut y = x;
        while self.0[y] != r {
            let next = self.0[y];
            self.0[y] = r;
            y = next;
        }
        r
    }

    fn union(&mut self, a: usize, b: usize) {
        let (a, b) = (self.find(a), self.find(b));
        if a != b {
            self.0[a.max(b)] = a.min(b);
        }
    }
}

fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// The dimension groups of `f`, largest first, at most `limit`; each group
/// is the set of class roots it contains, and `slot_class` maps (value,
/// dimension) slots to class roots.
struct Groups {
    offset: Vec<usize>,
    slot_class: Vec<usize>,
    /// Per instruction and factor, the class root (`None`: not linked).
    factor_class: Vec<Vec<Option<usize>>>,
    groups: Vec<Vec<usize>>,
}

fn groups(f: &Function, space: &Space, limit: usize) -> Groups {
    let mut offset = Vec::with_capacity(f.values.len() + 1);
    let mut n = 0;
    for v in &f.values {
        offset.push(n);
        n += v.ty.rank();
    }
    offset.push(n);
    let mut dsu = Dsu((0..n).collect());
    let mut links: Vec<Vec<Option<usize>>> = Vec::with_capacity(f.insts.len());
    let mut occ_sig: Vec<(usize, u64)> = Vec::new();
    for (k, inst) in f.insts.iter().enumerate() {
        let rule = &space.rules[k];
        let nops = rule.operands.len();
        let mut per = vec![None; rule.factors.len()];
        for (fi, fac) in rule.factors.iter().enumerate() {
            if matches!(fac.kind, FactorKind::NeedReplication | FactorKind::CombinedReduction) || fac.size <= 1 {
                continue;
            }
            let mut first: Option<usize> = None;
            for (t, d) in rule.occurrences(fi) {
                if rule.tensor(t)[d].first() != Some(&fi) {
                    continue;
                }
                let v = if t < nops { inst.operands[t] } else { inst.results[0] };
                let slot = offset[v.index()] + d;
                match first {
                    None => first = Some(slot),
                    Some(s) => dsu.union(s, slot),
                }
                let name = inst.op.name().bytes().fold(0u64, |a, b| mix(a ^ b as u64));
                let tag = mix(name ^ mix((t as u64) << 8 | d as u64 | (fac.kind as u64) << 16));
                occ_sig.push((slot, tag));
            }
            per[fi] = first;
        }
        links.push(per);
    }
    let slot_class: Vec<usize> = (0..n).map(|s| dsu.find(s)).collect();
    let factor_class = links.iter().map(|per| per.iter().map(|s| s.map(|s| slot_class[s])).collect()).collect();
    // Signature, extent and weight of each class.
    let mut sig: BTreeMap<usize, Vec<u64>> = BTreeMap::new();
    for (slot, tag) in occ_sig {
        sig.entry(slot_class[slot]).or_default().push(tag);
    }
    let mut extent: HashMap<usize, usize> = HashMap::default();
    let mut weight: BTreeMap<usize, f64> = BTreeMap::new();
    for (v, val) in f.values.iter().enumerate() {
        for d in 0..val.ty.rank() {
            let c = slot_class[offset[v] + d];
            extent.entry(c).or_insert(val.ty.shape[d]);
            *weight.entry(c).or_insert(0.0) += val.ty.size_bytes() as f64;
        }
    }
    let mut by_key: BTreeMap<(usize, u64), (f64, Vec<usize>)> = BTreeMap::new();
    for (c, mut tags) in sig {
        tags.sort_unstable();
        let h = tags.iter().fold(0u64, |a, &t| mix(a ^ t));
        let e = by_key.entry((extent[&c], h)).or_insert((0.0, Vec::new()));
        e.0 += weight.get(&c).copied().unwrap_or(0.0);
        e.1.push(c);
    }
    let mut list: Vec<(f64, Vec<usize>)> = by_key.into_values().collect();
    list.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    list.truncate(limit);
    Groups { offset, slot_class, factor_class, groups: list.into_iter().map(|g| g.1).collect() }
}

/// The group of every dimension class an instruction factor or a
/// parameter dimension belongs to (`None`: in no group), looked up once for
/// all the starting plans.
struct GroupOf {
    /// Per instruction and factor.
    factor: Vec<Vec<Option<usize>>>,
    /// Per parameter (by position) and dimension.
    param: Vec<Vec<Option<usize>>>,
    /// Per instruction and strategy, [`axes_key`] of its factor axes: most
    /// strategies are told apart without comparing nested vectors.
    strategy_key: Vec<Vec<u64>>,
}

/// A hash of factor axes lists.
fn axes_key(m: &[Vec<usize>]) -> u64 {
    m.iter().fold(0, |h, axes| mix(h ^ axes.iter().fold(axes.len() as u64, |a, &x| mix(a ^ x as u64))))
}

impl GroupOf {
    fn new(f: &Function, space: &Space, g: &Groups) -> GroupOf {
        let group_of_class: HashMap<usize, usize> =
            g.groups.iter().enumerate().flat_map(|(gi, cs)| cs.iter().map(move |&c| (c, gi))).collect();
        let of = |c: Option<usize>| c.and_then(|c| group_of_class.get(&c).copied());
        let factor = g.factor_class.iter().map(|per| per.iter().map(|&c| of(c)).collect()).collect();
        let param = f
            .params
            .iter()
            .map(|pv| (0..f.ty(*pv).rank()).map(|d| of(Some(g.slot_class[g.offset[pv.index()] + d]))).collect())
            .collect();
        let strategy_key =
            space.strategies.iter().map(|ss| ss.iter().map(|s| axes_key(&s.factor_axes)).collect()).collect();
        GroupOf { factor, param, strategy_key }
    }
}

/// The choices where, for each assignment, mesh axis `i` is split over
/// group `assign[i]` (or nowhere): every instruction takes the strategy
/// that gives each axis to its factor in that group (when its e-graph
/// holds it; otherwise its replicated one), every parameter the matching
/// layout.
///
/// One pass over the program serves every assignment: each instruction's
/// rule, groups and options are read once for all of them (on a large
/// program the per-instruction tables do not fit in cache).
fn induced(
    f: &Function,
    space: &Space,
    p: &Problem,
    mesh: &Mesh,
    g: &GroupOf,
    axes: &[usize],
    assigns: &[Vec<Option<usize>>],
) -> Vec<Choice> {
    let mut out: Vec<Choice> = assigns
        .iter()
        .map(|_| Choice { options: Vec::with_capacity(f.insts.len()), homes: Vec::with_capacity(f.params.len()) })
        .collect();
    // Axes per factor (reused across instructions).
    let mut m: Vec<Vec<usize>> = Vec::new();
    for (k, inst) in f.insts.iter().enumerate() {
        if space.deferred[inst.results[0].index()] {
            out.iter_mut().for_each(|c| c.options.push(None));
            continue;
        }
        let rule = &space.rules[k];
        let opts = &p.options[k];
        let repl = opts.iter().position(|o| space.strategies[k][o.strategy as usize].split == 1);
        let fallback = repl.or(if opts.is_empty() { None } else { Some(0) });
        for (assign, choice) in assigns.iter().zip(&mut out) {
            m.iter_mut().for_each(Vec::clear);
            m.resize_with(rule.factors.len(), Vec::new);
            for (i, &a) in axes.iter().enumerate() {
                let Some(gi) = assign[i] else { continue };
                if let Some(fi) = g.factor[k].iter().position(|&x| x == Some(gi)) {
                    if rule.factors[fi].size % (mesh.product(&m[fi]) * mesh.size(a)) == 0 {
                        m[fi].push(a);
                    }
                }
            }
            let key = axes_key(&m);
            let want = opts.iter().position(|o| {
                g.strategy_key[k][o.strategy as usize] == key
                    && space.strategies[k][o.strategy as usize].factor_axes == m
            });
            choice.options.push(want.or(fallback));
        }
    }
    for (pi, &pv) in f.params.iter().enumerate() {
        let rank = f.ty(pv).rank();
        let cs = &p.classes[pv.index()];
        let any_input = cs.iter().position(|c| c.input);
        for (assign, choice) in assigns.iter().zip(&mut out) {
            let mut dims: Vec<Vec<usize>> = vec![Vec::new(); rank];
            for (i, &a) in axes.iter().enumerate() {
                let Some(gi) = assign[i] else { continue };
                if let Some(d) = g.param[pi].iter().position(|&x| x == Some(gi)) {
                    if f.ty(pv).shape[d] % (mesh.product(&dims[d]) * mesh.size(a)) == 0 {
                        dims[d].push(a);
                    }
                }
            }
            let want = crate::sharding::MeshSharding::from_axes(dims, vec![]);
            let home = cs.iter().position(|c| c.input && space.layouts.get(pv.0, c.layout) == &want);
            choice.homes.push(home.or(any_input).map(|c| c as u8));
        }
    }
    out
}

/// Starting plans: each mesh axis (of size > 1) over one of the largest
/// dimension groups or nowhere, all combinations, with as many groups as
/// keep their number within `max`. The first is the all-replicated plan.
pub fn candidates(f: &Function, space: &Space, p: &Problem, mesh: &Mesh, max: usize) -> Vec<Choice> {
    let axes = super::space::usable_axes(mesh);
    // The most groups per axis such that all combinations fit in `max`.
    // (With no axis to split there is one plan, the replicated one.)
    let mut per_axis = 1;
    while !axes.is_empty() && (per_axis + 2usize).pow(axes.len() as u32) <= max {
        per_axis += 1;
    }
    let g = groups(f, space, per_axis);
    let choices = g.groups.len() + 1;
    let group_of = GroupOf::new(f, space, &g);
    let total = choices.pow(axes.len() as u32).min(4096);
    let assigns: Vec<Vec<Option<usize>>> = (0..total)
        .map(|code| {
            let mut c = code;
            axes.iter()
                .map(|_| {
                    let x = c % choices;
                    c /= choices;
                    (x > 0).then(|| x - 1)
                })
                .collect()
        })
        .collect();
    let mut out: Vec<Choice> = Vec::new();
    for ch in induced(f, space, p, mesh, &group_of, &axes, &assigns) {
        if !out.contains(&ch) {
            out.push(ch);
        }
    }
    out
}

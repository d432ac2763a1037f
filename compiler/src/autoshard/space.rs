//! The search space: candidate layouts of every value and the sharded forms
//! ("strategies") of every instruction, derived from the per-op factor rules
//! of [`crate::sharding::rules`].
//!
//! A strategy assigns each mesh axis (of size > 1) to at most one factor of
//! the instruction's rule, never to a need-replication factor, with every
//! factor divisible by the product of its axes (listed in mesh order). That
//! fixes the layout every operand must have (reduced), the layout the
//! result comes out in (unreduced over the axes of split reduction
//! factors), and how many devices share the work. This is the space Alpa
//! enumerates per HLO op, generated from the same rules propagation uses,
//! so every strategy is locally computable by construction
//! (`check_locally_computable` accepts it). User annotations restrict it:
//! an annotated value (parameter, `sharding_constraint`, `reshard`,
//! instruction result) only takes layouts matching the annotation; an
//! annotated function result is resharded to it at the end.

use super::options::{AliasPolicy, AutoShardOptions};
use crate::error::{CompilerError, Result, Site};
use crate::sharding::project::tensor_axes;
use crate::sharding::rules::{rule_for, FactorKind, OpRule};
use crate::sharding::seed::value_subject;
use crate::sharding::{Mesh, MeshSharding};
use weft_ir::{Function, Op, TensorSharding, TensorType, ValueDef, ValueId};

/// Interned layouts (closed [`MeshSharding`]s) per value; index 0 of every
/// value is the replicated, reduced layout.
///
/// Every distinct layout has one table-wide number, and a value's layouts
/// are a list of numbers: equal layouts of different values share their
/// number, so what depends only on the type and the layouts (reshard
/// costs, the layout a collective step leads to, the sharded forms of an
/// instruction) is computed once for every value of that type — the 32
/// layers of a GPT share it.
#[derive(Clone, Debug, Default)]
pub struct LayoutTable {
    /// The layout numbers of each value, by index.
    per_value: Vec<Vec<u32>>,
    /// The numbers of the distinct layouts by fingerprint.
    numbers: rustc_hash::FxHashMap<u64, Vec<u32>>,
    /// The layout of each number.
    numbered: Vec<MeshSharding>,
}

/// A hash of a layout, the same on every run and machine.
fn fingerprint(l: &MeshSharding) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = rustc_hash::FxHasher::default();
    l.hash(&mut h);
    h.finish()
}

impl LayoutTable {
    /// A table with the replicated layout of each of `ranks.len()` values.
    pub fn new(ranks: &[usize]) -> LayoutTable {
        let mut t = LayoutTable::default();
        for (v, &r) in ranks.iter().enumerate() {
            t.per_value.push(Vec::new());
            t.intern(v as u32, MeshSharding::replicated(r));
        }
        t
    }

    /// The table-wide number of `layout`, adding it if new.
    pub fn number_of(&mut self, layout: MeshSharding) -> u32 {
        let same = self.numbers.entry(fingerprint(&layout)).or_default();
        match same.iter().find(|&&n| self.numbered[n as usize] == layout) {
            Some(&n) => n,
            None => {
                let n = u32::try_from(self.numbered.len()).expect("fewer than 2^32 layouts");
                same.push(n);
                self.numbered.push(layout);
                n
            }
        }
    }

    /// The index of `layout` for value `v`, adding it if new.
    pub fn intern(&mut self, v: u32, layout: MeshSharding) -> u16 {
        let n = self.number_of(layout);
        self.intern_number(v, n)
    }

    /// The index for value `v` of the layout numbered `n`, adding it if
    /// new. A value has a few dozen layouts at most: a scan beats a map.
    pub fn intern_number(&mut self, v: u32, n: u32) -> u16 {
        let list = &mut self.per_value[v as usize];
        match list.iter().position(|&m| m == n) {
            Some(i) => i as u16,
            None => {
                let i = u16::try_from(list.len()).expect("fewer than 65536 layouts per value");
                list.push(n);
                i
            }
        }
    }

    /// The layout numbered `n`.
    pub fn numbered(&self, n: u32) -> &MeshSharding {
        &self.numbered[n as usize]
    }

    /// The table-wide number of layout `i` of value `v`.
    pub fn number(&self, v: u32, i: u16) -> u32 {
        self.per_value[v as usize][i as usize]
    }

    /// Layout `i` of value `v`.
    pub fn get(&self, v: u32, i: u16) -> &MeshSharding {
        &self.numbered[self.number(v, i) as usize]
    }

    /// All layouts of value `v`, by index.
    pub fn of(&self, v: u32) -> impl Iterator<Item = &MeshSharding> + '_ {
        self.per_value[v as usize].iter().map(|&n| &self.numbered[n as usize])
    }

    /// The index of `layout` for value `v`, if it has it.
    pub fn find(&self, v: u32, layout: &MeshSharding) -> Option<u16> {
        self.of(v).position(|l| l == layout).map(|i| i as u16)
    }
}

/// One sharded form of an instruction.
#[derive(Clone, Debug)]
pub struct Strategy {
    /// Axes of each factor of the rule, in mesh order.
    pub factor_axes: Vec<Vec<usize>>,
    /// Layout index of the result.
    pub result: u16,
    /// Required (reduced) layout index of each operand.
    pub operands: Vec<u16>,
    /// Number of devices sharing the work (product of the axes used).
    pub split: usize,
}

/// How a function result must come out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ResultReq {
    /// Reduced, any layout.
    Reduced,
    /// Exactly this layout (an annotation).
    Fixed(u16),
    /// The layout chosen for parameter `param` (a position): state carried
    /// across steps.
    Alias(usize),
}

/// The search space of one function on one mesh.
#[derive(Clone, Debug, Default)]
pub struct Space {
    /// Interned layouts.
    pub layouts: LayoutTable,
    /// The rule of each instruction.
    pub rules: Vec<OpRule>,
    /// Strategies of each instruction (only the replicated one for deferred
    /// values: users slice them locally).
    pub strategies: Vec<Vec<Strategy>>,
    /// Allowed home layouts of each parameter (by position).
    pub param_layouts: Vec<Vec<u16>>,
    /// What each function result needs.
    pub results: Vec<ResultReq>,
    /// Values computed from constants only: free in any layout, fused into
    /// their users (not part of the search).
    pub deferred: Vec<bool>,
    /// Floating-point operations of each instruction (unsharded).
    pub flops: Vec<f64>,
    /// Whether each instruction is element-wise (its operands take its
    /// result's layout).
    pub elementwise: Vec<bool>,
}

/// Mesh axes worth splitting over (size > 1).
pub fn usable_axes(mesh: &Mesh) -> Vec<usize> {
    (0..mesh.axes().len()).filter(|&a| mesh.size(a) > 1).collect()
}

/// Every layout of a tensor of shape `shape`: each usable axis splits at
/// most one dimension (axes in mesh order), dimensions divisible.
pub fn enumerate_layouts(shape: &[usize], mesh: &Mesh) -> Vec<MeshSharding> {
    let axes = usable_axes(mesh);
    let mut out = Vec::new();
    let mut dims: Vec<Vec<usize>> = vec![Vec::new(); shape.len()];
    fn rec(
        i: usize,
        axes: &[usize],
        shape: &[usize],
        mesh: &Mesh,
        dims: &mut Vec<Vec<usize>>,
        out: &mut Vec<MeshSharding>,
    ) {
        if i == axes.len() {
            out.push(MeshSharding::from_axes(dims.clone(), vec![]));
            return;
        }
        rec(i + 1, axes, shape, mesh, dims, out);
        for d in 0..shape.len() {
            if shape[d] % (mesh.product(&dims[d]) * mesh.size(axes[i])) == 0 {
                dims[d].push(axes[i]);
                rec(i + 1, axes, shape, mesh, dims, out);
                dims[d].pop();
            }
        }
    }
    rec(0, &axes, shape, mesh, &mut dims, &mut out);
    out
}

/// Whether `layout` satisfies annotation `ann` (resolved): closed
/// dimensions exactly, open ones as a prefix; unreduced axes equal.
pub fn matches(layout: &MeshSharding, ann: &MeshSharding) -> bool {
    layout.dims.len() == ann.dims.len()
        && layout.unreduced == ann.unreduced
        && layout
            .dims
            .iter()
            .zip(&ann.dims)
            .all(|(l, a)| if a.open { l.axes.starts_with(&a.axes) } else { l.axes == a.axes })
}

/// All strategies of instruction rule `rule` on `mesh`.
pub fn enumerate_strategies(rule: &OpRule, mesh: &Mesh, shard_every: bool) -> Vec<Vec<Vec<usize>>> {
    let axes = usable_axes(mesh);
    let mut out = Vec::new();
    let mut m: Vec<Vec<usize>> = vec![Vec::new(); rule.factors.len()];
    #[allow(clippy::too_many_arguments)]
    fn rec(
        i: usize,
        axes: &[usize],
        rule: &OpRule,
        mesh: &Mesh,
        every: bool,
        m: &mut Vec<Vec<usize>>,
        out: &mut Vec<Vec<Vec<usize>>>,
    ) {
        if i == axes.len() {
            out.push(m.clone());
            return;
        }
        if !every {
            rec(i + 1, axes, rule, mesh, every, m, out);
        }
        for f in 0..rule.factors.len() {
            let fac = rule.factors[f];
            // Combined (max/min) reductions are left to propagation: the
            // search keeps them unsplit, as before they could be split.
            let splittable = !matches!(fac.kind, FactorKind::NeedReplication | FactorKind::CombinedReduction);
            if splittable && fac.size % (mesh.product(&m[f]) * mesh.size(axes[i])) == 0 {
                m[f].push(axes[i]);
                rec(i + 1, axes, rule, mesh, every, m, out);
                m[f].pop();
            }
        }
    }
    rec(0, &axes, rule, mesh, shard_every, &mut m, &mut out);
    out
}

/// The layouts a factor assignment gives each tensor of the rule, or `None`
/// if some tensor cannot express it (axes of a factor following one that
/// is not fully split in the same dimension).
fn tensor_layouts(rule: &OpRule, m: &[Vec<usize>], mesh: &Mesh) -> Option<(Vec<MeshSharding>, MeshSharding)> {
    let layout_of = |tf: &Vec<Vec<usize>>| -> Option<Vec<Vec<usize>>> {
        let dims = tensor_axes(tf, m, rule, mesh);
        let want: usize = tf.iter().flatten().map(|&f| m[f].len()).sum();
        (dims.iter().map(Vec::len).sum::<usize>() == want).then_some(dims)
    };
    let ops = rule
        .operands
        .iter()
        .map(|tf| layout_of(tf).map(|d| MeshSharding::from_axes(d, vec![])))
        .collect::<Option<Vec<_>>>()?;
    let red: Vec<usize> = (0..rule.factors.len())
        .filter(|&f| rule.factors[f].kind == FactorKind::Reduction)
        .flat_map(|f| m[f].clone())
        .collect();
    let res = MeshSharding::from_axes(layout_of(&rule.results[0])?, red);
    Some((ops, res))
}

/// Floating-point operations of one instruction (unsharded): `2·Π factor
/// sizes` for `dot_general`, one per element read for reductions, one per
/// result element for element-wise ops, one per update of a `scatter_add`
/// and per element of a `cumsum` or `top_k`; data movement (broadcast,
/// reshape, transpose, slice, pad, concatenate, gather) and constants count
/// zero.
pub fn inst_flops(op: &Op, rule: &OpRule, operands: &[&TensorType], result: &TensorType) -> f64 {
    match op {
        Op::DotGeneral(_) => 2.0 * rule.factors.iter().map(|f| f.size as f64).product::<f64>(),
        Op::Reduce { .. } => operands[0].num_elements() as f64,
        Op::Unary(_) | Op::Binary(_) | Op::Compare(_) | Op::Select | Op::Convert { .. } => result.num_elements() as f64,
        // A scatter adds every update; a scan adds once per element; a
        // top-k compares every element (a gather only moves data).
        Op::Index(weft_ir::IndexOp::ScatterAdd { .. }) => operands[1].num_elements() as f64,
        Op::Index(weft_ir::IndexOp::Cumsum { .. } | weft_ir::IndexOp::TopK { .. }) => operands[0].num_elements() as f64,
        _ => 0.0,
    }
}

fn annotation(f: &Function, v: ValueId, s: &TensorSharding, mesh: &Mesh) -> Result<MeshSharding> {
    let site = Site::new(&f.name, value_subject(f, v), None);
    MeshSharding::resolve(s, f.ty(v), mesh, &site)
}

/// Builds the search space of `f` on `mesh`.
pub fn build_space(f: &Function, mesh: &Mesh, opts: &AutoShardOptions) -> Result<Space> {
    let ranks: Vec<usize> = f.values.iter().map(|v| v.ty.rank()).collect();
    let mut layouts = LayoutTable::new(&ranks);
    // Annotations restricting each value's own layout.
    let mut ann: Vec<Option<MeshSharding>> = vec![None; f.values.len()];
    for (i, v) in f.values.iter().enumerate() {
        if let Some(s) = &v.sharding {
            ann[i] = Some(annotation(f, ValueId(i as u32), s, mesh)?);
        }
    }
    for inst in &f.insts {
        if let Op::ShardingConstraint { sharding: s } | Op::Reshard { to: s } = &inst.op {
            let r = inst.results[0];
            ann[r.index()] = Some(annotation(f, r, s, mesh)?);
        }
    }
    let result_set: Vec<bool> = {
        let mut s = vec![false; f.values.len()];
        f.results.iter().for_each(|r| s[r.index()] = true);
        s
    };
    let mut deferred = vec![false; f.values.len()];
    let (mut rules, mut strategies, mut flops) = (Vec::new(), Vec::new(), Vec::new());
    // (factor axes, operand layout numbers, result layout number)
    type Form = (Vec<Vec<usize>>, Vec<u32>, u32);
    let mut forms_memo: rustc_hash::FxHashMap<(OpRule, bool, bool), Vec<Form>> = Default::default();
    let elementwise: Vec<bool> = f
        .insts
        .iter()
        .map(|i| matches!(i.op, Op::Unary(_) | Op::Binary(_) | Op::Compare(_) | Op::Select | Op::Convert { .. }))
        .collect();
    for (id, inst) in f.iter_insts() {
        // Every op but a call has one result and a rule.
        if matches!(inst.op, Op::Call { .. }) {
            return Err(crate::inline::call_not_inlined(f, id));
        }
        let r = inst.results[0];
        let ops: Vec<&TensorType> = inst.operands.iter().map(|&o| f.ty(o)).collect();
        let rule = rule_for(&inst.op, &ops, &[f.ty(r)]).ok_or_else(|| crate::inline::call_not_inlined(f, id))?;
        flops.push(inst_flops(&inst.op, &rule, &ops, f.ty(r)));
        let from_constants = match inst.op {
            Op::Constant(_) | Op::Iota { .. } => true,
            Op::Unary(_)
            | Op::Binary(_)
            | Op::Compare(_)
            | Op::Select
            | Op::Convert { .. }
            | Op::BroadcastInDim { .. } => inst.operands.iter().all(|o| deferred[o.index()]),
            _ => false,
        };
        deferred[r.index()] = from_constants && !result_set[r.index()] && ann[r.index()].is_none();
        let mut list = Vec::new();
        {
            let every = opts.shard_every_dot && matches!(inst.op, Op::DotGeneral(_)) && !deferred[r.index()];
            // Instructions of the same rule (every layer of a model) have
            // the same sharded forms: they are enumerated once.
            let key = (rule.clone(), deferred[r.index()], every);
            let sharded = forms_memo.entry(key).or_insert_with(|| {
                let forms = if deferred[r.index()] {
                    vec![vec![Vec::new(); rule.factors.len()]]
                } else {
                    enumerate_strategies(&rule, mesh, every)
                };
                let mut out = Vec::new();
                for m in forms {
                    // Rank-0 operands are always replicated; others per factors.
                    let Some((op_l, res_l)) = tensor_layouts(&rule, &m, mesh) else { continue };
                    let ops = op_l.into_iter().map(|l| layouts.number_of(l)).collect();
                    out.push((m, ops, layouts.number_of(res_l)));
                }
                out
            });
            for (m, op_n, res_n) in sharded.iter() {
                if ann[r.index()].as_ref().is_some_and(|a| !matches(layouts.numbered(*res_n), a)) {
                    continue;
                }
                let operands =
                    inst.operands.iter().zip(op_n).map(|(&o, &n)| layouts.intern_number(o.0, n)).collect::<Vec<_>>();
                let used = m.iter().flatten().fold(0u64, |acc, &a| acc | (1 << a));
                let split = (0..mesh.axes().len()).filter(|a| used & (1 << a) != 0).map(|a| mesh.size(a)).product();
                let result = layouts.intern_number(r.0, *res_n);
                list.push(Strategy { factor_axes: m.clone(), result, operands, split });
            }
            if list.is_empty() {
                let site = Site::new(&f.name, value_subject(f, r), inst.loc);
                return Err(CompilerError::Unsupported(format!(
                    "{site}: no sharded form of this instruction satisfies its annotation"
                )));
            }
        }
        rules.push(rule);
        strategies.push(list);
    }
    let mut param_layouts = Vec::new();
    for &p in &f.params {
        let all = enumerate_layouts(&f.ty(p).shape, mesh);
        let mut ok: Vec<u16> = Vec::new();
        match &ann[p.index()] {
            Some(a) if a.dims.iter().all(|d| !d.open) => ok.push(layouts.intern(p.0, a.closed())),
            Some(a) => ok.extend(all.into_iter().filter(|l| matches(l, a)).map(|l| layouts.intern(p.0, l))),
            None => ok.extend(all.into_iter().map(|l| layouts.intern(p.0, l))),
        }
        if ok.is_empty() {
            let site = Site::new(&f.name, value_subject(f, p), f.loc);
            return Err(CompilerError::Unsupported(format!("{site}: no layout satisfies the annotation")));
        }
        param_layouts.push(ok);
    }
    let results = result_reqs(f, mesh, opts, &mut layouts)?;
    Ok(Space { layouts, rules, strategies, param_layouts, results, deferred, flops, elementwise })
}

fn result_reqs(
    f: &Function,
    mesh: &Mesh,
    opts: &AutoShardOptions,
    layouts: &mut LayoutTable,
) -> Result<Vec<ResultReq>> {
    let mut out = Vec::new();
    for (k, &r) in f.results.iter().enumerate() {
        if let Some(Some(s)) = f.result_shardings.get(k) {
            let site = Site::new(&f.name, format!("result {k} ({})", f.value_ref(r)), f.return_loc);
            let l = MeshSharding::resolve(s, f.ty(r), mesh, &site)?;
            out.push(ResultReq::Fixed(layouts.intern(r.0, l.closed())));
            continue;
        }
        let mut req = ResultReq::Reduced;
        match &opts.aliases {
            AliasPolicy::None => {}
            AliasPolicy::ByName => {
                if let ValueDef::Param(i) = f.value(r).def {
                    req = ResultReq::Alias(i as usize);
                } else if let Some(name) = f.value(r).name.as_deref().and_then(|n| n.strip_prefix("new.")) {
                    if let Some(p) = f.params.iter().position(|&p| f.value(p).name.as_deref() == Some(name)) {
                        if f.ty(f.params[p]) == f.ty(r) {
                            req = ResultReq::Alias(p);
                        }
                    }
                }
            }
            AliasPolicy::Explicit(pairs) => {
                if let Some(&(p, _)) = pairs.iter().find(|&&(_, res)| res == k) {
                    if p >= f.params.len() || f.ty(f.params[p]) != f.ty(r) {
                        return Err(CompilerError::Unsupported(format!(
                            "alias of result {k} to parameter {p}: no such parameter of the same type"
                        )));
                    }
                    req = ResultReq::Alias(p);
                }
            }
        }
        out.push(req);
    }
    Ok(out)
}

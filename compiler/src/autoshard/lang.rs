//! The e-graph of alternatives: language, e-class analysis and reshard
//! chains.
//!
//! An e-class is one value *in one layout* (the analysis data
//! [`ClassInfo`] is the pair); its e-nodes are the ways to obtain it:
//! `Input` (a parameter arriving in that layout), `Compute` (an
//! instruction under one strategy, children: its operands in the layouts
//! the strategy needs), `Collective` (one collective applied to the value
//! in another layout) and `Reshard` (a fused multi-step reshard from
//! another layout). Two e-classes holding the same value in the same
//! layout are the same thing, so the analysis unions them as soon as they
//! appear ([`LayoutAnalysis::modify`]): that is what makes the alternatives
//! of different instructions meet (one instruction's result layout is
//! another's required operand layout).

use super::cost::{CollKind, CostModel};
use super::space::Space;
use egg::{Analysis, DidMerge, EGraph, Id};
use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use std::cell::RefCell;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use weft_ir::TensorType;

/// Up to 16 mesh axis indices (each below 15), in order, packed in a `u64`.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct AxisList(pub u64);

impl AxisList {
    /// The set of axes, as a bit set.
    pub fn mask(self) -> u32 {
        let mut m = 0;
        let mut x = self.0;
        while x != 0 {
            m |= 1 << ((x & 15) - 1);
            x >>= 4;
        }
        m
    }

    /// Packs `axes` (at most 16, each < 15).
    pub fn new(axes: &[usize]) -> AxisList {
        assert!(axes.len() <= 16 && axes.iter().all(|&a| a < 15), "axis list too long for a key: {axes:?}");
        AxisList(axes.iter().rev().fold(0u64, |acc, &a| (acc << 4) | (a as u64 + 1)))
    }

    /// The axes, in order.
    pub fn to_vec(self) -> Vec<usize> {
        let mut out = Vec::new();
        let mut x = self.0;
        while x != 0 {
            out.push((x & 15) as usize - 1);
            x >>= 4;
        }
        out
    }
}

fn parse_num<T: FromStr>(s: &str, what: &str) -> Result<T, String> {
    s.parse().map_err(|_| format!("`{s}` is not a {what}"))
}

/// A parameter arriving in a layout.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct InputKey {
    /// Parameter position.
    pub param: u32,
    /// Layout index.
    pub layout: u16,
}

/// An instruction under one strategy.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ComputeKey {
    /// Instruction index.
    pub inst: u32,
    /// Strategy index.
    pub strategy: u16,
}

/// One collective step.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CollKey {
    /// What it does.
    pub kind: CollKind,
    /// Mesh axes involved.
    pub axes: AxisList,
    /// The dimension (the source dimension of an all-to-all).
    pub dim: u8,
    /// The target dimension of an all-to-all.
    pub dim2: u8,
}

/// A fused reshard to layout `to` of the child's value.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ReshardKey {
    /// Target layout index.
    pub to: u16,
}

impl fmt::Display for InputKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "input#{}@{}", self.param, self.layout)
    }
}
impl FromStr for InputKey {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (p, l) = s.strip_prefix("input#").and_then(|r| r.split_once('@')).ok_or("not an input key")?;
        Ok(InputKey { param: parse_num(p, "parameter")?, layout: parse_num(l, "layout")? })
    }
}
impl fmt::Display for ComputeKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "op#{}/{}", self.inst, self.strategy)
    }
}
impl FromStr for ComputeKey {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (i, st) = s.strip_prefix("op#").and_then(|r| r.split_once('/')).ok_or("not a compute key")?;
        Ok(ComputeKey { inst: parse_num(i, "instruction")?, strategy: parse_num(st, "strategy")? })
    }
}
impl fmt::Display for CollKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{:x}:{}:{}", self.kind.name(), self.axes.0, self.dim, self.dim2)
    }
}
impl FromStr for CollKey {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let parts: Vec<&str> = s.split(':').collect();
        let [name, axes, dim, dim2] = parts[..] else { return Err("not a collective key".into()) };
        let kinds = [
            CollKind::AllReduce,
            CollKind::AllGather,
            CollKind::ReduceScatter,
            CollKind::AllToAll,
            CollKind::Permute,
            CollKind::LocalSlice,
            CollKind::LocalUnreduce,
        ];
        let kind = kinds.into_iter().find(|k| k.name() == name).ok_or("unknown collective")?;
        let axes = AxisList(u64::from_str_radix(axes, 16).map_err(|_| "bad axes")?);
        Ok(CollKey { kind, axes, dim: parse_num(dim, "dimension")?, dim2: parse_num(dim2, "dimension")? })
    }
}
impl fmt::Display for ReshardKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "reshard@{}", self.to)
    }
}
impl FromStr for ReshardKey {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(ReshardKey { to: parse_num(s.strip_prefix("reshard@").ok_or("not a reshard key")?, "layout")? })
    }
}

impl ShardLang {
    /// Whether the node produces its value (`Compute`, `Input`) rather
    /// than moving it from another layout.
    pub fn is_home(&self) -> bool {
        matches!(self, ShardLang::Compute(..) | ShardLang::Input(_))
    }
}

egg::define_language! {
    /// Ways to obtain a value in a layout (see the module doc). Variants:
    /// `Input`, `Compute`, `Collective` (one child), `Reshard` (one child).
    #[allow(missing_docs)]
    pub enum ShardLang {
        Input(InputKey),
        Compute(ComputeKey, Box<[Id]>),
        Collective(CollKey, [Id; 1]),
        Reshard(ReshardKey, [Id; 1]),
    }
}

/// The analysis data: which value, in which layout.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct ClassInfo {
    /// Value id (in the source function).
    pub value: u32,
    /// Layout index (see [`super::space::LayoutTable`]).
    pub layout: u16,
}

/// (type number, from layout, to layout) -> (cost, communicating
/// collectives), layouts by their table-wide numbers
/// ([`super::space::LayoutTable::number`]).
pub type DirectCosts = HashMap<(u32, u32, u32), (f64, usize)>;

/// (type number, layout's table-wide number, step) -> cost of the step.
pub type StepCosts = HashMap<(u32, u32, CollKey), f64>;

/// The e-class analysis: the search space (whose layout table grows as
/// collectives create layouts), the class of each (value, layout), and the
/// bookkeeping of which rewrites already ran where.
pub struct LayoutAnalysis {
    /// The search space.
    pub space: Space,
    /// Types of all values.
    pub types: Vec<TensorType>,
    /// A number per distinct type, for each value: costs are memoised by
    /// type, not by value.
    pub type_numbers: Vec<u32>,
    /// The value of each parameter position.
    pub param_values: Vec<u32>,
    /// The result value of each instruction.
    pub inst_values: Vec<u32>,
    /// The cost model.
    pub cost: CostModel,
    /// The e-class of each (value, layout) seen so far.
    pub class_of: HashMap<(u32, u16), Id>,
    /// The (value, layout) of every e-class id ever made, by id. A union
    /// only ever joins classes of one pair ([`Self::merge`] checks it), so
    /// this is also the pair of the class any id now belongs to: read it
    /// instead of looking the class up ([`info`]).
    pub info: Vec<ClassInfo>,
    /// Instructions whose sharded forms were added.
    pub expanded: Vec<bool>,
    /// Parameters whose layouts were added.
    pub inputs_expanded: Vec<bool>,
    /// (value, layout) classes already linked back to the replicated layout.
    pub gathered: HashSet<(u32, u16)>,
    /// (value, layout) pairs some `Compute` node needs as an operand.
    pub required: HashSet<(u32, u16)>,
    /// Cost and number of communicating collectives of the direct reshard
    /// of a value between two layouts.
    pub direct: RefCell<DirectCosts>,
    /// Cost of one collective step on a value in a layout.
    pub steps: RefCell<StepCosts>,
    /// Chains already built by [`reach`]: (value, from, to) -> class.
    pub reached: HashMap<(u32, u16, u16), Id>,
    /// Layouts produced by a collective step, by table-wide layout numbers
    /// (a step's effect does not depend on the value): (layout, step) ->
    /// layout.
    pub stepped: HashMap<(u32, CollKey), u32>,
    /// The plain chains of [`reach`] between two layouts, by table-wide
    /// numbers.
    pub chains: HashMap<(u32, u32), Arc<[CollKey]>>,
    /// (value, from, to) reshard shortcuts already considered.
    pub collapsed: RefCell<HashSet<(u32, u16, u16)>>,
    /// Classes created or changed since the rules last searched (see
    /// [`super::rewrites`]: searches are incremental).
    pub dirty: RefCell<Vec<Id>>,
    /// Whether a rule unioned two classes that both existed before, so the
    /// e-graph needs a rebuild (see [`super::rewrites::saturate`]).
    pub needs_rebuild: bool,

    /// (value, layout) pairs that have a `Compute` or `Input` node (a place
    /// the value can be produced in).
    pub homes: HashSet<(u32, u16)>,
    /// Classes that became homes since the rules last searched.
    pub new_homes: RefCell<Vec<Id>>,
    /// The matches of each rule found in the current iteration, taken by
    /// the rules as they search (see [`super::rewrites`]).
    pub found: RefCell<Vec<Vec<egg::SearchMatches<'static, ShardLang>>>>,
}

impl LayoutAnalysis {
    /// Records that some `Compute` node needs value `v` in layout `l`, and
    /// marks that class (if it exists) for the rules to search again: the
    /// chain-collapse rule reads this set.
    pub fn require(&mut self, v: u32, l: u16) {
        if self.required.insert((v, l)) {
            if let Some(&id) = self.class_of.get(&(v, l)) {
                self.dirty.get_mut().push(id);
            }
        }
    }

    /// Cost of resharding value `v` from layout `from` to `to` in one go
    /// (`plan_reshard`), memoised.
    pub fn direct_cost(&self, v: u32, from: u16, to: u16) -> f64 {
        self.direct_plan(v, from, to).0
    }

    /// Cost and number of communicating collectives of the direct reshard.
    pub fn direct_plan(&self, v: u32, from: u16, to: u16) -> (f64, usize) {
        let layouts = &self.space.layouts;
        let key = (self.type_numbers[v as usize], layouts.number(v, from), layouts.number(v, to));
        if let Some(&c) = self.direct.borrow().get(&key) {
            return c;
        }
        let ty = &self.types[v as usize];
        let steps = self.cost.reshard(ty, layouts.get(v, from), layouts.get(v, to));
        let c = (steps.iter().map(|s| s.cost).sum(), steps.iter().filter(|s| s.kind.communicates()).count());
        self.direct.borrow_mut().insert(key, c);
        c
    }

    /// Cost of collective step `k` on value `v` in layout `l`, memoised.
    pub fn step_cost(&self, v: u32, l: u16, k: &CollKey) -> f64 {
        let key = (self.type_numbers[v as usize], self.space.layouts.number(v, l), *k);
        if let Some(&c) = self.steps.borrow().get(&key) {
            return c;
        }
        let ty = &self.types[v as usize];
        let axes = k.axes.to_vec();
        let mut bytes = self.cost.local_bytes(ty, self.space.layouts.get(v, l));
        if k.kind == CollKind::AllGather {
            bytes *= self.cost.mesh().product(&axes) as f64;
        }
        let c = self.cost.collective(k.kind, &axes, bytes);
        self.steps.borrow_mut().insert(key, c);
        c
    }
}

/// The e-graph type.
pub type ShardGraph = EGraph<ShardLang, LayoutAnalysis>;

/// The (value, layout) of the class of `id` (see [`LayoutAnalysis::info`]).
pub fn info(g: &ShardGraph, id: Id) -> ClassInfo {
    g.analysis.info[usize::from(id)]
}

/// Applies one collective step to a layout; `None` if it does not apply.
pub fn apply_step(l: &crate::sharding::MeshSharding, k: &CollKey) -> Option<crate::sharding::MeshSharding> {
    let axes = k.axes.to_vec();
    let mut out = l.clone();
    let (d, d2) = (k.dim as usize, k.dim2 as usize);
    let remove = |v: &mut Vec<usize>| -> Option<()> {
        for a in &axes {
            let i = v.iter().position(|x| x == a)?;
            v.remove(i);
        }
        Some(())
    };
    match k.kind {
        CollKind::AllReduce => remove(&mut out.unreduced)?,
        CollKind::AllGather => remove(&mut out.dims.get_mut(d)?.axes)?,
        CollKind::LocalSlice => out.dims.get_mut(d)?.axes.extend(&axes),
        CollKind::ReduceScatter => {
            remove(&mut out.unreduced)?;
            out.dims.get_mut(d)?.axes.extend(&axes);
        }
        CollKind::AllToAll => {
            remove(&mut out.dims.get_mut(d)?.axes)?;
            out.dims.get_mut(d2)?.axes.extend(&axes);
        }
        CollKind::LocalUnreduce => {
            out.unreduced.extend(&axes);
            out.unreduced.sort_unstable();
        }
        CollKind::Permute => return None,
    }
    Some(out)
}

impl Analysis<ShardLang> for LayoutAnalysis {
    type Data = ClassInfo;

    fn make(egraph: &mut ShardGraph, enode: &ShardLang, id: Id) -> ClassInfo {
        let info = Self::info_of(egraph, enode);
        let a = &mut egraph.analysis;
        assert_eq!(usize::from(id), a.info.len(), "e-class ids are not dense");
        a.info.push(info);
        // A class gains home nodes only when it is made (unions join
        // classes of one pair, whose home status is already recorded).
        if enode.is_home() && a.homes.insert((info.value, info.layout)) {
            a.new_homes.get_mut().push(id);
        }
        info
    }

    /// During a rebuild: the pair of an existing class, recorded nothing.
    fn remake(egraph: &mut ShardGraph, enode: &ShardLang, _id: Id) -> ClassInfo {
        Self::info_of(egraph, enode)
    }

    fn merge(&mut self, a: &mut ClassInfo, b: ClassInfo) -> DidMerge {
        assert_eq!(*a, b, "e-classes of different values or layouts were merged");
        DidMerge(false, false)
    }

    /// Keeps one e-class per (value, layout): a class whose pair already
    /// has one is unioned with it.
    fn modify(egraph: &mut ShardGraph, id: Id) {
        let a = &mut egraph.analysis;
        a.dirty.get_mut().push(id);
        let info = a.info[usize::from(id)];
        let other = match a.class_of.entry((info.value, info.layout)) {
            std::collections::hash_map::Entry::Occupied(o) => *o.get(),
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(id);
                return;
            }
        };
        let (a, b) = (egraph.find(other), egraph.find(id));
        if a != b {
            egraph.union(a, b);
            // What lets the runner skip rebuilding (see `saturate`).
            assert_eq!(egraph.find(b), a, "e-class {a} of %{} lost its root to the new class {b}", info.value);
        }
    }
}

impl LayoutAnalysis {
    /// The (value, layout) a new e-node produces.
    fn info_of(egraph: &mut ShardGraph, enode: &ShardLang) -> ClassInfo {
        let a = &egraph.analysis;
        match enode {
            ShardLang::Input(k) => ClassInfo { value: a.param_values[k.param as usize], layout: k.layout },
            ShardLang::Compute(k, _) => {
                let s = &a.space.strategies[k.inst as usize][k.strategy as usize];
                ClassInfo { value: a.inst_values[k.inst as usize], layout: s.result }
            }
            ShardLang::Reshard(k, ch) => ClassInfo { value: a.info[usize::from(ch[0])].value, layout: k.to },
            ShardLang::Collective(k, ch) => {
                let c = a.info[usize::from(ch[0])];
                let a = &mut egraph.analysis;
                let from = a.space.layouts.number(c.value, c.layout);
                let to = match a.stepped.get(&(from, *k)) {
                    Some(&to) => to,
                    None => {
                        let l = a.space.layouts.get(c.value, c.layout);
                        let to = apply_step(l, k).unwrap_or_else(|| {
                            panic!("collective {k} does not apply to layout {l:?} of value %{}", c.value)
                        });
                        let to = a.space.layouts.number_of(to);
                        a.stepped.insert((from, *k), to);
                        to
                    }
                };
                ClassInfo { value: c.value, layout: a.space.layouts.intern_number(c.value, to) }
            }
        }
    }
}

/// Adds one collective step on `from`, returning the class it produces.
pub fn add_step(g: &mut ShardGraph, from: Id, key: CollKey) -> Id {
    let id = g.add(ShardLang::Collective(key, [from]));
    g.find(id)
}

/// Returns the class of `from`'s value in layout `to`, adding the plain
/// chain of collectives that reaches it if needed: first all-reduce the
/// pending sums `to` does not keep, all-gather (per dimension) the axes
/// after the common prefix, then slice (per dimension) to `to`'s axes and
/// locally unreduce. Every intermediate layout is valid (prefixes of
/// `from`'s dimensions, then of `to`'s). Cheaper direct forms are added by
/// the collective rewrites.
pub fn reach(g: &mut ShardGraph, from: Id, to: u16) -> Id {
    let info = info(g, from);
    if info.layout == to {
        return g.find(from);
    }
    if let Some(&id) = g.analysis.reached.get(&(info.value, info.layout, to)) {
        return g.find(id);
    }
    let out = build_chain(g, from, to);
    g.analysis.reached.insert((info.value, info.layout, to), out);
    out
}

/// [`reach`] without its memo, for a caller that asks for each (value,
/// from, to) once (`gather-to-replicated`: one chain back per produced
/// layout; memoising those would only fill the table).
pub fn build_chain(g: &mut ShardGraph, from: Id, to: u16) -> Id {
    let info = info(g, from);
    if info.layout == to {
        return g.find(from);
    }
    let layouts = &g.analysis.space.layouts;
    let key = (layouts.number(info.value, info.layout), layouts.number(info.value, to));
    let keys = match g.analysis.chains.get(&key) {
        Some(keys) => keys.clone(),
        None => {
            let keys: Arc<[CollKey]> = chain_steps(layouts.numbered(key.0), layouts.numbered(key.1)).into();
            g.analysis.chains.insert(key, keys.clone());
            keys
        }
    };
    let mut cur = g.find(from);
    for &k in keys.iter() {
        cur = add_step(g, cur, k);
    }
    let got = self::info(g, cur);
    debug_assert_eq!((got.value, got.layout), (info.value, to), "reshard chain missed its target");
    g.find(cur)
}

/// The steps of the plain chain from layout `f` to `t` (see [`reach`]).
fn chain_steps(f: &crate::sharding::MeshSharding, t: &crate::sharding::MeshSharding) -> Vec<CollKey> {
    let mut out = Vec::new();
    let drop: Vec<usize> = f.unreduced.iter().copied().filter(|a| !t.unreduced.contains(a)).collect();
    if !drop.is_empty() {
        out.push(CollKey { kind: CollKind::AllReduce, axes: AxisList::new(&drop), dim: 0, dim2: 0 });
    }
    let prefix: Vec<usize> = f
        .dims
        .iter()
        .zip(&t.dims)
        .map(|(a, b)| a.axes.iter().zip(&b.axes).take_while(|(x, y)| x == y).count())
        .collect();
    for (d, p) in prefix.iter().enumerate() {
        if f.dims[d].axes.len() > *p {
            let axes = AxisList::new(&f.dims[d].axes[*p..]);
            out.push(CollKey { kind: CollKind::AllGather, axes, dim: d as u8, dim2: 0 });
        }
    }
    for (d, p) in prefix.iter().enumerate() {
        if t.dims[d].axes.len() > *p {
            let axes = AxisList::new(&t.dims[d].axes[*p..]);
            out.push(CollKey { kind: CollKind::LocalSlice, axes, dim: d as u8, dim2: 0 });
        }
    }
    let add: Vec<usize> = t.unreduced.iter().copied().filter(|a| !f.unreduced.contains(a)).collect();
    if !add.is_empty() {
        out.push(CollKey { kind: CollKind::LocalUnreduce, axes: AxisList::new(&add), dim: 0, dim2: 0 });
    }
    out
}

/// Cost of one e-node that moves data within a value (collective or fused
/// reshard), given the layout of its child; `None` for other nodes.
pub fn move_cost(g: &ShardGraph, node: &ShardLang) -> Option<f64> {
    let a = &g.analysis;
    match node {
        ShardLang::Collective(k, ch) => {
            let c = info(g, ch[0]);
            Some(a.step_cost(c.value, c.layout, k))
        }
        ShardLang::Reshard(k, ch) => {
            let c = info(g, ch[0]);
            Some(a.direct_cost(c.value, c.layout, k.to))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip() {
        let l = AxisList::new(&[2, 0, 1]);
        assert_eq!(l.to_vec(), vec![2, 0, 1]);
        let k = CollKey { kind: CollKind::ReduceScatter, axes: l, dim: 1, dim2: 0 };
        assert_eq!(k.to_string().parse::<CollKey>().unwrap(), k);
        let c = ComputeKey { inst: 12, strategy: 3 };
        assert_eq!(c.to_string().parse::<ComputeKey>().unwrap(), c);
        let i = InputKey { param: 1, layout: 4 };
        assert_eq!(i.to_string().parse::<InputKey>().unwrap(), i);
        assert_eq!("reshard@7".parse::<ReshardKey>().unwrap(), ReshardKey { to: 7 });
    }
}

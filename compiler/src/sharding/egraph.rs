//! The program as an e-graph, and what is known about each value's sharding.
//!
//! Propagation runs on an [`egg::EGraph`]: every parameter is a leaf e-node,
//! every instruction one e-node whose children are its operands' e-classes,
//! so each e-class is one value of the program and its users are the e-class
//! parents. The e-class analysis data ([`ValueFacts`]) is the propagation
//! state: the value's type and, per dimension, the axes known so far, whether
//! more may be added, with what priority and where they came from.
//! Propagation reads and writes exactly this data. Instruction keys carry
//! the instruction index, so two identical instructions stay two e-classes
//! (two values that may be sharded differently); later stages (auto-sharding
//! with cost-based extraction) can add alternative e-nodes to a class and
//! rely on [`Analysis::merge`], which joins two facts in the same lattice
//! propagation climbs.

use super::explain::Origin;
use super::rules::OpRule;
use egg::{Analysis, DidMerge, EGraph, Id};
use std::fmt;
use std::str::FromStr;
use weft_ir::{TensorType, ValueId};

/// Key of a parameter leaf: the parameter's position.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ParamKey(pub u32);

/// Key of an instruction e-node: its index in program order and mnemonic.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct InstKey {
    /// Index of the instruction in the function.
    pub inst: u32,
    /// The op's mnemonic (for display).
    pub op: String,
}

impl fmt::Display for ParamKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "param#{}", self.0)
    }
}

impl FromStr for ParamKey {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let n = s.strip_prefix("param#").ok_or_else(|| format!("`{s}` is not a parameter key"))?;
        n.parse().map(ParamKey).map_err(|_| format!("`{s}` is not a parameter key"))
    }
}

impl fmt::Display for InstKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}#{}", self.op, self.inst)
    }
}

impl FromStr for InstKey {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (op, n) = s.rsplit_once('#').ok_or_else(|| format!("`{s}` is not an instruction key"))?;
        if op == "param" || op.is_empty() {
            return Err(format!("`{s}` is not an instruction key"));
        }
        Ok(InstKey { inst: n.parse().map_err(|_| format!("`{s}` is not an instruction key"))?, op: op.to_string() })
    }
}

egg::define_language! {
    /// The e-graph language of a program: parameter leaves and one e-node
    /// per instruction (children: the operands' e-classes). Variants:
    /// `Param` (a function parameter) and `Inst` (an instruction).
    #[allow(missing_docs)]
    pub enum ProgramLang {
        Param(ParamKey),
        Inst(InstKey, Box<[Id]>),
    }
}

/// How strongly a sharding was asked for; lower is stronger.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Priority {
    /// A user annotation on a parameter or function result (`jit`'s
    /// `in_shardings`/`out_shardings`), or propagated from one.
    User,
    /// A `sharding_constraint`, a `reshard`, or an annotation on an
    /// instruction result, or propagated from one.
    Constraint,
}

/// What is known about one dimension of a value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DimFact {
    /// Mesh axis indices, major to minor.
    pub axes: Vec<usize>,
    /// Whether axes may still be added.
    pub open: bool,
    /// Priority of the information (`None` while nothing is known).
    pub prio: Option<Priority>,
    /// Where the last axes came from.
    pub origin: Origin,
}

/// The e-class analysis data: what is known about a value's sharding.
#[derive(Clone, Debug, PartialEq)]
pub struct ValueFacts {
    /// The value (in the original function).
    pub value: ValueId,
    /// Its type.
    pub ty: TensorType,
    /// One entry per dimension.
    pub dims: Vec<DimFact>,
    /// Unreduced axes fixed by an annotation; `None` means the defining
    /// instruction decides (reduction factors sharded -> unreduced).
    pub unreduced: Option<Vec<usize>>,
}

impl ValueFacts {
    /// Facts about a value nothing is known about: open, unsplit dims.
    pub fn unknown(value: ValueId, ty: TensorType) -> ValueFacts {
        let dims = vec![DimFact { axes: vec![], open: true, prio: None, origin: Origin::None }; ty.rank()];
        ValueFacts { value, ty, dims, unreduced: None }
    }

    /// Bit mask of the axes used by the dimensions and unreduced axes.
    pub fn axis_mask(&self) -> u64 {
        let dims = self.dims.iter().flat_map(|d| d.axes.iter());
        dims.chain(self.unreduced.iter().flatten()).fold(0, |m, &a| m | (1 << a))
    }

    /// Size in bytes of the global value.
    pub fn bytes(&self) -> f64 {
        self.ty.size_bytes() as f64
    }
}

/// The e-class analysis: builds initial facts from the program's
/// annotations (prepared by the caller, one per value) and joins facts.
#[derive(Clone, Debug, Default)]
pub struct ShardingAnalysis {
    /// Initial facts, indexed by value id.
    pub seeds: Vec<ValueFacts>,
    /// The value of each parameter position.
    pub param_values: Vec<ValueId>,
    /// The (single) result value of each instruction.
    pub inst_values: Vec<ValueId>,
}

impl Analysis<ProgramLang> for ShardingAnalysis {
    type Data = ValueFacts;

    fn make(egraph: &mut EGraph<ProgramLang, Self>, enode: &ProgramLang, _id: Id) -> ValueFacts {
        let a = &egraph.analysis;
        let v = match enode {
            ProgramLang::Param(k) => a.param_values[k.0 as usize],
            ProgramLang::Inst(k, _) => a.inst_values[k.inst as usize],
        };
        a.seeds[v.index()].clone()
    }

    /// Joins two facts about the same value: per dimension, an open one
    /// whose axes are a prefix of the other's takes the other's; otherwise
    /// the stronger priority wins (ties keep `a`).
    fn merge(&mut self, a: &mut ValueFacts, b: ValueFacts) -> DidMerge {
        let (mut ca, mut cb) = (false, false);
        for (x, y) in a.dims.iter_mut().zip(b.dims) {
            if x.axes == y.axes {
                continue;
            }
            let x_prefix = y.axes.starts_with(&x.axes);
            let y_prefix = x.axes.starts_with(&y.axes);
            if (x_prefix && x.open) || (!y_prefix && rank(&y) < rank(x)) {
                *x = y;
                ca = true;
            } else {
                cb = true;
            }
        }
        if a.unreduced.is_none() && b.unreduced.is_some() {
            a.unreduced = b.unreduced;
            ca = true;
        }
        DidMerge(ca, cb)
    }
}

fn rank(d: &DimFact) -> (u8, bool) {
    (d.prio.map(|p| p as u8).unwrap_or(2), d.open)
}

/// A program loaded into an e-graph.
pub struct ProgramGraph {
    /// The e-graph; its analysis data is the propagation state.
    pub egraph: EGraph<ProgramLang, ShardingAnalysis>,
    /// The e-class of each value.
    pub value_class: Vec<Id>,
    /// The rule of each instruction.
    pub rules: Vec<OpRule>,
}

impl ProgramGraph {
    /// Loads a function (with one result per instruction, calls inlined)
    /// whose initial facts are `seeds` (one per value) and rules `rules`
    /// (one per instruction).
    pub fn build(f: &weft_ir::Function, seeds: Vec<ValueFacts>, rules: Vec<OpRule>) -> ProgramGraph {
        let inst_values = f.insts.iter().map(|i| i.results[0]).collect();
        let analysis = ShardingAnalysis { seeds, param_values: f.params.clone(), inst_values };
        let mut egraph = EGraph::new(analysis);
        let mut value_class = vec![Id::from(0usize); f.values.len()];
        for (i, &p) in f.params.iter().enumerate() {
            value_class[p.index()] = egraph.add(ProgramLang::Param(ParamKey(i as u32)));
        }
        for (id, inst) in f.iter_insts() {
            let children: Box<[Id]> = inst.operands.iter().map(|o| value_class[o.index()]).collect();
            let key = InstKey { inst: id.0, op: inst.op.name().to_string() };
            value_class[inst.results[0].index()] = egraph.add(ProgramLang::Inst(key, children));
        }
        egraph.rebuild();
        ProgramGraph { egraph, value_class, rules }
    }

    /// The facts about a value.
    pub fn facts(&self, v: ValueId) -> &ValueFacts {
        &self.egraph[self.value_class[v.index()]].data
    }

    /// Replaces the facts about a value.
    pub fn set_facts(&mut self, v: ValueId, facts: ValueFacts) {
        let c = self.value_class[v.index()];
        self.egraph[c].data = facts;
    }

    /// The instructions using a value (its e-class parents), in order.
    pub fn users(&self, v: ValueId) -> Vec<usize> {
        let class = &self.egraph[self.value_class[v.index()]];
        let mut out: Vec<usize> = class
            .parents()
            .filter_map(|p| match self.egraph.id_to_node(p) {
                ProgramLang::Inst(k, _) => Some(k.inst as usize),
                ProgramLang::Param(_) => None,
            })
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    /// The instruction defining a value, if it is not a parameter.
    pub fn definer(&self, v: ValueId) -> Option<usize> {
        match self.egraph[self.value_class[v.index()]].nodes.first() {
            Some(ProgramLang::Inst(k, _)) => Some(k.inst as usize),
            _ => None,
        }
    }
}

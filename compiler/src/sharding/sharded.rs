//! The result of propagation: the annotated program and its explanations.

use super::explain::{explain_chain, render_grid, Origin, Resolution, Step};
use super::mesh::Mesh;
use super::spec::MeshSharding;
use crate::error::{CompilerError, Result, Site};
use weft_ir::{Function, InstId, TensorSharding, ValueId};

/// Counters from one propagation.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct PropagationStats {
    /// Instruction visits performed.
    pub visits: usize,
    /// Whether a fixed point was reached within the visit budget.
    pub converged: bool,
    /// E-nodes in the propagation e-graph.
    pub egraph_nodes: usize,
    /// E-classes in the propagation e-graph.
    pub egraph_classes: usize,
}

/// A `reshard` that propagation inserted, and why.
#[derive(Clone, Debug, PartialEq)]
pub struct ReshardRecord {
    /// The reshard's result in the new function.
    pub value: ValueId,
    /// The original value being resharded.
    pub source: ValueId,
    /// The original instruction that needed it (`None`: a function result).
    pub user: Option<InstId>,
    /// The sharding it had.
    pub from: TensorSharding,
    /// The sharding it gets.
    pub to: TensorSharding,
    /// The collectives that implement it (see [`super::plan_reshard`]).
    pub collectives: Vec<String>,
    /// Their estimated cost.
    pub cost: f64,
    /// Why it is needed.
    pub why: String,
}

/// A fully sharded program: every value annotated with a closed sharding
/// and `reshard`s inserted so that every instruction is locally computable.
#[derive(Clone, Debug)]
pub struct ShardedFunction {
    /// The annotated program (ids in definition order, names kept).
    pub function: Function,
    /// For each value of the original function, the value of `function`
    /// that carries it with its final sharding.
    pub value_map: Vec<ValueId>,
    /// Final sharding of each original value.
    pub shardings: Vec<TensorSharding>,
    /// Per original value and dimension, where the sharding came from.
    pub origins: Vec<Vec<Origin>>,
    /// Every conflict settled by propagation, and how.
    pub resolutions: Vec<Resolution>,
    /// Other decisions: annotation conflicts on one value, factor choices
    /// made when inserting reshards.
    pub notes: Vec<String>,
    /// Every reshard inserted.
    pub reshards: Vec<ReshardRecord>,
    /// Propagation counters.
    pub stats: PropagationStats,
    /// The original function.
    pub source: Function,
    /// The mesh.
    pub mesh: Mesh,
}

impl ShardedFunction {
    /// The new id of original value `v`.
    pub fn new_id(&self, v: ValueId) -> ValueId {
        self.value_map[v.index()]
    }

    /// The final sharding of original value `v`.
    pub fn sharding(&self, v: ValueId) -> &TensorSharding {
        &self.shardings[v.index()]
    }

    /// The final sharding of the original value named `name`.
    pub fn sharding_of(&self, name: &str) -> Option<&TensorSharding> {
        self.source.value_by_name(name).map(|v| self.sharding(v))
    }

    /// Why original value `v` is sharded as it is: from the annotations it
    /// derives from to `v`.
    pub fn explain(&self, v: ValueId) -> Vec<Step> {
        explain_chain(&self.source, &self.origins, &self.shardings, v)
    }

    /// [`ShardedFunction::explain`] as text, one step per line.
    pub fn explain_text(&self, v: ValueId) -> String {
        self.explain(v).iter().map(|s| format!("{s}\n")).collect()
    }

    /// Draws the device grid of original value `v` (rank 0 to 2).
    pub fn render(&self, v: ValueId) -> Result<String> {
        let site = Site::new(&self.source.name, self.source.value_ref(v), None);
        let s = MeshSharding::resolve(self.sharding(v), self.source.ty(v), &self.mesh, &site)?;
        render_grid(self.source.ty(v), &s, &self.mesh)
    }

    /// The reshard's operand as the printed (new) function names it, e.g.
    /// `%4`: an unnamed original value has another id there, so
    /// `source.value_ref(r.source)` would name a different printed value.
    pub fn reshard_operand(&self, r: &ReshardRecord) -> String {
        match self.function.value(r.value).def {
            weft_ir::ValueDef::Inst { inst, .. } => match self.function.inst(inst).operands.first() {
                Some(&v) => self.function.value_ref(v),
                None => self.source.value_ref(r.source),
            },
            _ => self.source.value_ref(r.source),
        }
    }

    /// One line per reshard propagation inserted: `%9 = reshard %4 from
    /// [{data}, {}] to [{}, {expert}]: all_to_all(...) (why it is needed)`.
    /// `weft shard` and `weft lower --explain` print these.
    pub fn reshard_lines(&self) -> Vec<String> {
        self.reshards
            .iter()
            .map(|r| {
                format!(
                    "{} = reshard {} from {} to {}: {} ({})",
                    self.function.value_ref(r.value),
                    self.reshard_operand(r),
                    super::spec::fmt_sharding(&r.from),
                    super::spec::fmt_sharding(&r.to),
                    if r.collectives.is_empty() { "no communication".to_string() } else { r.collectives.join(", ") },
                    r.why
                )
            })
            .collect()
    }

    /// Number of `reshard` instructions in the new function.
    pub fn num_reshards(&self) -> usize {
        self.function.insts.iter().filter(|i| matches!(i.op, weft_ir::Op::Reshard { .. })).count()
    }

    /// Checks the new function with [`super::check_locally_computable`].
    pub fn check(&self) -> Result<(), CompilerError> {
        super::check::check_locally_computable(&self.function, &self.mesh)
    }
}

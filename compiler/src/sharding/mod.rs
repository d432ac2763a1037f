//! Sharding: meshes, what a sharding means, per-op rules, propagation on an
//! e-graph, explanations and the local-computability contract.
//!
//! Users declare a [`Mesh`] and annotate a few values (parameters, results,
//! `sharding_constraint`s); [`propagate()`] gives every value a sharding the
//! way GSPMD/Shardy do for JAX, inserts `reshard`s where an operand is not
//! sharded as its user needs, and explains every choice. The pieces are
//! split so later stages can reuse them: [`rules`] (op semantics as factor
//! data), [`project`] (tensor <-> factor shardings), [`step`] (one
//! propagation step), [`reshard`] (collectives and their cost), [`check`]
//! (what the SPMD partitioner may assume). The semantics are written in
//! `specs/sharding.md`.

pub mod check;
pub mod egraph;
pub mod explain;
pub mod materialize;
pub mod mesh;
pub mod project;
pub mod propagate;
pub mod reshard;
pub mod rules;
pub mod seed;
pub mod sharded;
pub mod spec;
pub mod step;

pub use check::check_locally_computable;
pub use egraph::{DimFact, Priority, ProgramGraph, ProgramLang, ShardingAnalysis, ValueFacts};
pub use explain::{explain_chain, render_grid, Annotation, AnnotationKind, Origin, Resolution, Step};
pub use mesh::{Mesh, MeshAxis};
pub use propagate::{propagate, propagate_inlined, ConflictPolicy, PropagateOptions};
pub use reshard::{plan_reshard, Collective, ReshardPlan};
pub use rules::{rule_for, Factor, FactorKind, OpRule, RuleKind};
pub use sharded::{ReshardRecord, ShardedFunction};
pub use spec::{fmt_sharding, local_shape, shard_index, shard_offset, DimAxes, MeshSharding};

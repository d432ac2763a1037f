//! # weft-compiler
//!
//! Transformations over weft's IR: automatic differentiation and training
//! steps, sharding propagation on an e-graph, auto-sharding and the SPMD
//! partitioner.
//!
//! Sharding: [`sharding`] has device meshes, the meaning of a sharding on a
//! mesh, per-op sharding rules in Shardy's factor notation, propagation of
//! shardings on an `egg` e-graph with explanations, and the
//! local-computability check the partitioner relies on; [`inline_calls`]
//! flattens calls before propagation. [`partition`] lowers a sharded
//! function to the program each device runs, with explicit collectives, and
//! runs it on a simulated mesh. [`pipeline`] is the whole compile as a list
//! of named passes (inline, annotate, autoshard, propagate, partition,
//! clean-ups), verified between passes in debug builds and timed per pass. Every error is a [`CompilerError`].
#![warn(missing_docs)]
// Errors carry sites, shardings and sizes so they can be read without the
// program at hand; they are returned on cold paths only.
#![allow(clippy::result_large_err)]

pub mod autodiff;
pub mod autoshard;
pub mod canonical_sums;
pub mod dce;
pub mod emit;
pub mod error;
pub mod inline;
pub mod memory;
pub mod partition;
pub mod pipeline;
pub mod precision;
pub mod random;
pub mod sharding;
pub mod stages;
pub mod train;

pub use error::{CompilerError, Site};
pub use inline::{inline, inline_calls, InlinedFunction};

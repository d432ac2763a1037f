//! # weft-compiler
//!
//! Transformations over weft's IR: automatic differentiation and training
//! steps, sharding propagation on an e-graph, auto-sharding and the SPMD
//! partitioner.
#![warn(missing_docs)]

pub mod autodiff;
pub mod dce;
pub mod emit;
pub mod error;
pub mod memory;
pub mod precision;
pub mod random;
pub mod train;

pub use error::CompilerError;

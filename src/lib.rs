//! # weft
//!
//! The facade crate: re-exports the IR, compiler and runtime crates, and
//! hosts the `weft` command-line tool's implementation ([`cli`]).
#![warn(missing_docs)]

pub mod checkpoint;
pub mod cli;
pub mod data;
pub mod diagnostics;
pub mod error;
pub mod launch;
pub mod models;
pub mod runner;
pub mod strategy;
pub mod trainer;

pub use error::{Error, Result};
pub use models::Model;
pub use trainer::Trainer;
pub use weft_compiler as compiler;
pub use weft_ir as ir;
pub use weft_runtime as runtime;

//! # weft
//!
//! The facade crate: re-exports the IR, compiler and runtime crates and hosts
//! the `weft` command-line tool.
#![warn(missing_docs)]

pub use weft_compiler as compiler;
pub use weft_ir as ir;
pub use weft_runtime as runtime;

//! # weft-ir
//!
//! The functional tensor IR everything in weft stands on: element types and
//! static tensor types, a closed [`Op`] enum with typed attributes, modules of
//! straight-line SSA functions stored in arenas with typed ids, one
//! type-inference `match` ([`infer()`]), a verifier that reports every problem
//! with its location ([`verify_module`]), a text format that round-trips
//! exactly ([`text`]), an ergonomic [`builder`] with composite helpers, and the
//! reference interpreter ([`interp`]) that is the oracle for every later stage.
//!
//! The contract is written in `specs/ir.md`.
#![warn(missing_docs)]

pub mod builder;
pub mod callgraph;
pub mod device;
pub mod dtype;
pub mod error;
pub mod func;
pub mod indexing;
pub mod infer;
pub mod interp;
pub mod limits;
pub mod literal;
pub mod mesh;
pub mod op;
pub mod prng;
pub mod prng_emit;
pub mod sharding;
pub mod tensor;
pub mod text;
pub mod types;
pub mod verify;

pub use dtype::DType;
pub use error::{Diagnostic, IrError, ParseError, Result};
pub use func::{Function, Inst, InstId, Loc, Module, Signature, ValueData, ValueDef, ValueId};
pub use indexing::IndexOp;
pub use infer::{infer, NoFunctions, SignatureLookup};
pub use literal::{Literal, LiteralData};
pub use op::{BinaryOp, CompareOp, DotDims, MatmulLayout, Op, ReduceOp, UnaryOp};
pub use sharding::{DimSharding, TensorSharding};
pub use types::{Shape, TensorType};
pub use verify::{verify_function, verify_module};

//! The syntax tree the parser builds before it resolves names.
//!
//! Parsing is two-phase so that a call may name a function defined later in
//! the file: first every function is read into this tree (ops are already
//! built, since their attributes never depend on operand types), then
//! [`super::build`] resolves value names to ids in definition order and
//! infers omitted result types, using the headers for callee signatures.

use crate::{Loc, Op, TensorSharding, TensorType};

/// A `%name` or `%N` as written (without the `%`).
#[derive(Clone, Debug)]
pub(crate) struct Name {
    /// The text after `%`.
    pub text: String,
    /// Where the `%` is.
    pub loc: Loc,
}

/// A type with its optional value annotation `{sharding = ...}`.
#[derive(Clone, Debug)]
pub(crate) struct TypeAnn {
    /// The type.
    pub ty: TensorType,
    /// Where the type starts.
    pub loc: Loc,
    /// The annotated sharding, if any.
    pub sharding: Option<TensorSharding>,
}

/// One parameter of a function header.
#[derive(Clone, Debug)]
pub(crate) struct ParamAst {
    /// Its name or id.
    pub name: Name,
    /// Its type and sharding.
    pub ty: TypeAnn,
}

/// One instruction.
#[derive(Clone, Debug)]
pub(crate) struct InstAst {
    /// Where the instruction starts.
    pub loc: Loc,
    /// The values it defines.
    pub results: Vec<Name>,
    /// The op, with attributes.
    pub op: Op,
    /// The operands as written.
    pub operands: Vec<Name>,
    /// The result types, when annotated.
    pub types: Option<Vec<TypeAnn>>,
}

/// One function.
#[derive(Clone, Debug)]
pub(crate) struct FuncAst {
    /// Its name (without `@`).
    pub name: String,
    /// Where `func` is.
    pub loc: Loc,
    /// Parameters.
    pub params: Vec<ParamAst>,
    /// Result types from the header.
    pub results: Vec<TypeAnn>,
    /// Instructions in order.
    pub body: Vec<InstAst>,
    /// The values after `return`.
    pub ret: Vec<Name>,
    /// Where `return` is.
    pub ret_loc: Loc,
}

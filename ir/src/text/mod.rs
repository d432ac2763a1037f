//! The text format: a canonical printer and a parser that round-trip exactly.
//!
//! Text is how programs are written by hand, stored as golden test
//! expectations and shown in diagnostics, so it has to be both pleasant and
//! exact: [`print_module`] produces one canonical text per module, and
//! [`parse_module`] reads it back to the same module (same value ids, names,
//! types, constants bit for bit, shardings), so print -> parse -> print is
//! byte-identical. Hand-written input may omit the result types of ops whose
//! type follows from their operands; the parser infers them with
//! [`crate::infer()`]. The grammar and every op are specified in `specs/ir.md`.
//!
//! The parser reports the first problem with its line and column and what it
//! expected; it never panics. It does not verify: a program whose annotated
//! types disagree with inference parses as written, and [`crate::verify_module`]
//! (or [`parse_and_verify`]) reports it.
//!
//! ```
//! use weft_ir::text::{parse_module, print_module};
//!
//! let src = "
//! // Omitted result types are inferred.
//! func @scale(%x: f32[2,3], %s: f32[]) -> (f32[2,3]) {
//!   %b = broadcast_in_dim %s {dims = []} : f32[2,3]
//!   %y = mul %x, %b
//!   return %y
//! }
//! ";
//! let m = parse_module(src).unwrap();
//! let text = print_module(&m);
//! assert_eq!(
//!     text,
//!     "func @scale(%x: f32[2,3], %s: f32[]) -> (f32[2,3]) {\n  \
//!        %b = broadcast_in_dim %s {dims = []} : f32[2,3]\n  \
//!        %y = mul %x, %b : f32[2,3]\n  \
//!        return %y\n}\n"
//! );
//! assert_eq!(print_module(&parse_module(&text).unwrap()), text);
//!
//! let err = parse_module("func @f(%x: f32[]) -> (f32[]) {\n  %y = ad %x, %x\n  return %y\n}").unwrap_err();
//! assert_eq!(err.to_string(), "parse error at 2:8: unknown op `ad`; did you mean `add`?");
//! ```

pub(crate) mod ast;
pub(crate) mod attrs;
mod build;
// The lexer and the parser's cursor are shared with the device-program parser.
pub(crate) mod lexer;
mod literal;
mod ops;
mod printer;
pub(crate) mod syntax;

pub use printer::{print_function, print_module};
// For the device-program printer, which prints compute ops the same way.
pub(crate) use literal::format_literal;
pub(crate) use printer::op_attrs;

use crate::{Function, IrError, Module, ParseError};

/// Parses a module. Result types left out of instructions are inferred; the
/// module is not verified (see [`parse_and_verify`]).
pub fn parse_module(text: &str) -> Result<Module, IrError> {
    let toks = lexer::lex(text).map_err(IrError::Parse)?;
    let funcs = syntax::Parser::new(toks).module().map_err(IrError::Parse)?;
    build::build_module(funcs).map_err(IrError::Parse)
}

/// Parses text holding exactly one function. Calls in it can only be
/// inferred if they are recursive; annotate their result types otherwise.
pub fn parse_function(text: &str) -> Result<Function, IrError> {
    let mut m = parse_module(text)?;
    if m.functions.len() != 1 {
        let loc = m.functions.get(1).and_then(|f| f.loc).unwrap_or(crate::Loc { line: 1, col: 1 });
        let message = format!("expected exactly one function, found {}", m.functions.len());
        return Err(IrError::Parse(ParseError { loc, message }));
    }
    Ok(m.functions.remove(0))
}

/// Parses a sharding written as a value annotation writes it:
/// `[{data}, {model}]`, `[{data, model}, {?}]`, `[]` for a scalar.
///
/// ```
/// let s = weft_ir::text::parse_sharding("[{data}, {}]").unwrap();
/// assert_eq!(s.to_string(), "[{data}, {}]");
/// assert!(weft_ir::text::parse_sharding("[{data}").is_err());
/// ```
pub fn parse_sharding(text: &str) -> Result<crate::TensorSharding, IrError> {
    let toks = lexer::lex(text).map_err(IrError::Parse)?;
    syntax::Parser::new(toks).sharding_alone().map_err(IrError::Parse)
}

/// Parses a module and runs the verifier on it.
pub fn parse_and_verify(text: &str) -> Result<Module, IrError> {
    let m = parse_module(text)?;
    crate::verify_module(&m)?;
    Ok(m)
}

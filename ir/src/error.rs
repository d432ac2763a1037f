//! The `ir` crate's error type.
//!
//! Every user mistake (malformed text, ill-typed program, wrong inputs) is an
//! [`IrError`] with enough context to find it: a line and column for text, a
//! function, instruction and op for programs, a parameter name for inputs.
//! Broken internal invariants (an id out of its arena) panic instead.

use crate::Loc;
use std::fmt;

/// A problem found in a program, with where it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Diagnostic {
    /// The function it is in.
    pub func: String,
    /// The source position, when the program came from text.
    pub loc: Option<Loc>,
    /// What it is about, e.g. ``%3 = `add` `` or `parameter %x`.
    pub subject: String,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(loc) = self.loc {
            write!(f, "{loc}: ")?;
        }
        write!(f, "in @{}: ", self.func)?;
        if !self.subject.is_empty() {
            write!(f, "{}: ", self.subject)?;
        }
        f.write_str(&self.message)
    }
}

/// A parse error at a position in the text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseError {
    /// Where.
    pub loc: Loc,
    /// What was wrong, usually "expected X, found Y".
    pub message: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.loc, self.message)
    }
}

/// Every error the `ir` crate reports.
#[derive(Debug, thiserror::Error)]
pub enum IrError {
    /// The text is not a well-formed program.
    #[error("parse error at {0}")]
    Parse(ParseError),
    /// The program is ill-formed; all problems found are listed.
    #[error("{} error{} in program:\n{}", .0.len(), if .0.len() == 1 { "" } else { "s" }, join_lines(.0))]
    Verify(Vec<Diagnostic>),
    /// The builder was asked for something ill-typed.
    #[error("builder: {0}")]
    Builder(String),
    /// Inputs given to the interpreter do not match the function.
    #[error("input `{name}`: {message}")]
    Input {
        /// The parameter (or tensor) name.
        name: String,
        /// What is wrong with it.
        message: String,
    },
    /// The interpreter could not execute an instruction.
    #[error("{0}")]
    Interp(Diagnostic),
    /// A host tensor operation or conversion failed.
    #[error("tensor: {0}")]
    Tensor(String),
    /// Something would need more memory than the limit
    /// ([`crate::limits::MemoryLimit`]); checked before allocating.
    #[error(
        "{what} needs {} ({need} bytes), more than the memory limit of {} ({limit} bytes, from {limit_source}); \
         set WEFT_MEMORY_LIMIT (or --memory-limit / memory_limit for weft run and weft train) to change it",
        crate::limits::human_bytes(*need), crate::limits::human_bytes(*limit)
    )]
    TooLarge {
        /// What needs the memory.
        what: String,
        /// Bytes needed (an estimate, at least this much).
        need: u64,
        /// The limit in bytes.
        limit: u64,
        /// Where the limit comes from.
        limit_source: String,
    },
    /// Reading or writing a tensor file failed.
    #[error("tensor file {path}: {message}")]
    TensorFile {
        /// The file.
        path: String,
        /// What went wrong.
        message: String,
    },
}

fn join_lines(d: &[Diagnostic]) -> String {
    d.iter().map(|d| format!("  {d}")).collect::<Vec<_>>().join("\n")
}

/// Result with [`IrError`].
pub type Result<T, E = IrError> = std::result::Result<T, E>;

//! `weft lower FILE --mesh data=2,model=4 [--func NAME]`: propagate
//! shardings and partition one function, then print the program every
//! device runs and a summary of its communication and memory per device.
//!
//! The mesh may also come from the file itself, in a comment on its first
//! line (`// mesh: x=2,y=2`), so an example program carries the mesh it was
//! written for; `--mesh` wins when both are given.

use super::check::load;
use super::run::pick_function;
use crate::diagnostics::render_ir_error;
use crate::error::{read_to_string, Error, Result};
use std::path::Path;
use weft_compiler::partition::compile;
use weft_compiler::sharding::{Mesh, PropagateOptions};
use weft_compiler::CompilerError;

/// The mesh named in a `// mesh: ...` comment on the first line, if any.
pub fn mesh_comment(source: &str) -> Option<&str> {
    source.lines().next()?.trim().strip_prefix("//")?.trim().strip_prefix("mesh:").map(str::trim)
}

/// What lowering a program can fail with: a problem in the text (rendered
/// with its position by the caller) or in the compilation.
pub enum LowerError {
    /// The program does not parse or verify.
    Ir(weft_ir::IrError),
    /// No mesh, or no such function.
    Usage(Error),
    /// Propagation or partitioning failed.
    Compiler(Box<CompilerError>),
}

/// Parses `source`, picks the function, lowers it on the mesh (`mesh`, or
/// the file's mesh comment) and returns the device program followed by the
/// summary.
pub fn lower_source(source: &str, mesh: Option<&str>, func: Option<&str>) -> Result<String, LowerError> {
    let m = load(source).map_err(LowerError::Ir)?;
    let spec = mesh.or_else(|| mesh_comment(source)).ok_or_else(|| {
        LowerError::Usage(Error::Usage(
            "no mesh: pass --mesh (e.g. --mesh data=2,model=4) or start the file with \
                                        `// mesh: data=2,model=4`"
                .into(),
        ))
    })?;
    let mesh = Mesh::parse(spec).map_err(|e| LowerError::Compiler(Box::new(e)))?;
    let f = pick_function(&m, func).map_err(LowerError::Usage)?;
    let pf =
        compile(&m, &f.name, &mesh, &PropagateOptions::default()).map_err(|e| LowerError::Compiler(Box::new(e)))?;
    let mut out = weft_ir::device::print_program(&pf.program);
    out.push_str("\nsummary:\n");
    out.push_str(&pf.report().to_string());
    Ok(out)
}

/// Runs `weft lower`; returns the exit code.
pub fn lower(file: &Path, mesh: Option<&str>, func: Option<&str>) -> Result<i32> {
    let source = read_to_string(file)?;
    let path = file.display().to_string();
    match lower_source(&source, mesh, func) {
        Ok(text) => {
            print!("{text}");
            Ok(0)
        }
        Err(LowerError::Ir(e)) => {
            eprint!("{}", render_ir_error(&path, &source, &e));
            Ok(1)
        }
        Err(LowerError::Usage(e)) => Err(e),
        Err(LowerError::Compiler(e)) => {
            eprintln!("{path}: error: {e}");
            Ok(1)
        }
    }
}

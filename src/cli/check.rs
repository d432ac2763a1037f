//! `weft check FILE`.

use crate::diagnostics::render_ir_error;
use crate::error::{read_to_string, Result};
use std::path::Path;

/// Parses and verifies `file`; prints the canonical program on success or
/// the rendered errors on failure. Returns the exit code.
pub fn check(file: &Path) -> Result<i32> {
    let source = read_to_string(file)?;
    let path = file.display().to_string();
    match load(&source) {
        Ok(m) => {
            print!("{}", weft_ir::text::print_module(&m));
            Ok(0)
        }
        Err(e) => {
            eprint!("{}", render_ir_error(&path, &source, &e));
            Ok(1)
        }
    }
}

/// Reads, parses and verifies `file`. On a problem in the program, prints
/// the rendered errors and returns `None` (the command then exits with 1).
pub fn load_or_report(file: &Path) -> Result<Option<(weft_ir::Module, String)>> {
    let source = read_to_string(file)?;
    match load(&source) {
        Ok(m) => Ok(Some((m, source))),
        Err(e) => {
            eprint!("{}", render_ir_error(&file.display().to_string(), &source, &e));
            Ok(None)
        }
    }
}

/// Parses and verifies a module.
pub fn load(source: &str) -> weft_ir::Result<weft_ir::Module> {
    let m = weft_ir::text::parse_module(source)?;
    weft_ir::verify_module(&m)?;
    Ok(m)
}

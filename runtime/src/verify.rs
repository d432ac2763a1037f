//! Checks a device program before anything runs.
//!
//! Running a malformed program on N devices would fail late and far from
//! the cause (a shape mismatch deep inside a kernel, a collective waiting
//! on a buffer that was freed). The checks themselves are the IR's one
//! device-program verifier ([`weft_ir::device::verify_program`]: every
//! buffer defined once before use and not used after its free, every
//! step's types, mesh axes and divisibility, outputs live at the end); this
//! module only turns its diagnostics into a [`RuntimeError`] that names
//! the first offending step, and measures what the executor needs to know
//! of a valid program: its peak of live bytes.

use crate::error::RuntimeError;
use weft_ir::device::DeviceProgram;
use weft_ir::IrError;

/// What verification learns about a program.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProgramInfo {
    /// The largest number of bytes live at once on one device (inputs
    /// included), counting each buffer at its dense size.
    pub peak_live_bytes: usize,
}

/// Verifies `program` with the IR's verifier; returns its peak of live bytes.
pub fn verify_program(program: &DeviceProgram) -> Result<ProgramInfo, RuntimeError> {
    weft_ir::device::verify_program(program).map_err(|e| invalid(program, e))?;
    Ok(ProgramInfo { peak_live_bytes: program.peak_live_bytes() })
}

/// The first problem the verifier found, with its step.
fn invalid(p: &DeviceProgram, e: IrError) -> RuntimeError {
    let (step, message) = match &e {
        IrError::Verify(diags) if !diags.is_empty() => {
            let d = &diags[0];
            let step = d.subject.strip_prefix("step ").and_then(|r| r.split(' ').next()).and_then(|n| n.parse().ok());
            let more =
                if diags.len() > 1 { format!(" (and {} more problems)", diags.len() - 1) } else { String::new() };
            (step, format!("{}: {}{more}", d.subject, d.message))
        }
        other => (None, other.to_string()),
    };
    RuntimeError::InvalidProgram { program: p.name.clone(), step, message }
}

//! The `weft` command-line tool: one subcommand per pipeline stage.
//!
//! Each subcommand is a thin layer over the library: parse arguments, call
//! the stage, print its result or a rendered error, and return an exit code
//! (0 success, 1 a problem in the user's program or data, 2 bad usage).

mod check;
pub mod lower;
mod run;

use clap::{Parser, Subcommand};
use std::path::PathBuf;

/// weft: compiler-driven sharding for tensor programs.
#[derive(Parser, Debug)]
#[command(name = "weft", version, about, long_about = None)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Parse and verify a program; print it canonically with every type, or
    /// every error with its line and column.
    Check {
        /// The program, in weft's text format (`specs/ir.md`).
        file: PathBuf,
    },
    /// Execute a function on the CPU reference interpreter.
    Run {
        /// The program, in weft's text format.
        file: PathBuf,
        /// Inputs by parameter name, as a safetensors file.
        #[arg(long)]
        inputs: Option<PathBuf>,
        /// Where to write the results (named by result value name, or `out{i}`).
        #[arg(long)]
        output: Option<PathBuf>,
        /// The function to run (default: `main`, else the module's only function).
        #[arg(long = "func")]
        func: Option<String>,
    },
    /// Propagate shardings and partition a function for a device mesh;
    /// print the program each device runs and a summary (collectives by
    /// kind with bytes per device, peak live bytes, parameter and optimizer
    /// bytes per device).
    Lower {
        /// The program, in weft's text format.
        file: PathBuf,
        /// The device mesh, e.g. `data=2,model=4` (default: the file's
        /// first-line comment `// mesh: ...`).
        #[arg(long)]
        mesh: Option<String>,
        /// The function to lower (default: `main`, else the module's only function).
        #[arg(long = "func")]
        func: Option<String>,
    },
}

/// Runs the CLI on the process arguments and returns the exit code.
pub fn main() -> i32 {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Check { file } => check::check(&file),
        Command::Run { file, inputs, output, func } => {
            run::run(&file, inputs.as_deref(), output.as_deref(), func.as_deref())
        }
        Command::Lower { file, mesh, func } => lower::lower(&file, mesh.as_deref(), func.as_deref()),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            match e {
                crate::Error::Usage(_) => 2,
                _ => 1,
            }
        }
    }
}

//! The `weft` command-line tool: one subcommand per pipeline stage.
//!
//! Each subcommand is a thin layer over the library: parse arguments, call
//! the stage, print its result or a rendered error, and return an exit code
//! (0 success, 1 a problem in the user's program or data or a failure, 2
//! bad usage, 65 a diverged run, 75 a preempted one: [`crate::Error::exit_code`]).

mod check;
mod compare;
mod data;
mod launch;
pub mod lower;
mod model;
mod plot;
mod run;
mod shard;
mod train;

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
    #[command(allow_negative_numbers = true)]
    Check {
        /// The program, in weft's text format (`specs/ir.md`).
        file: PathBuf,
    },
    /// Execute a function on the CPU reference interpreter.
    #[command(allow_negative_numbers = true)]
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
        /// The memory the program may use, e.g. `16GiB` (default: the
        /// WEFT_MEMORY_LIMIT environment variable, else the machine's
        /// memory); its peak of live tensors is checked before it runs.
        #[arg(long)]
        memory_limit: Option<String>,
    },
    /// Propagate shardings over a mesh: print the program with every value's
    /// sharding and the reshards inserted, and explain or draw values.
    #[command(allow_negative_numbers = true)]
    Shard {
        /// The program, in weft's text format.
        file: PathBuf,
        /// The device mesh, e.g. `data=2,model=4`.
        #[arg(long)]
        mesh: String,
        /// The function (default: `main`, else the module's only function).
        #[arg(long = "func")]
        func: Option<String>,
        /// Explain where a value's sharding comes from (`%h1`, `%3`); repeatable.
        #[arg(long)]
        explain: Vec<String>,
        /// Draw which device holds which block of a value; repeatable.
        #[arg(long)]
        show: Vec<String>,
        /// Choose the shardings of open values by auto-sharding (e-graph
        /// alternatives, cost model, extraction) and print the plan.
        #[arg(long)]
        auto: bool,
        /// Per-device memory budget for --auto, e.g. `2GiB`.
        #[arg(long)]
        memory_budget: Option<String>,
    },
    /// Run an experiment from a TOML config: build the model's training
    /// step, shard it over the mesh, train, checkpoint and log metrics.
    #[command(allow_negative_numbers = true)]
    Train(Box<TrainArgs>),
    /// Run `weft train` as a job of several processes (`mpirun`, or `srun`
    /// under Slurm) that restarts itself from its checkpoints when it
    /// fails: `weft launch -n 4 --max-restarts 5 -- train CONFIG [flags]`.
    #[command(allow_negative_numbers = true)]
    Launch(Box<launch::LaunchArgs>),
    /// Write a config's model as a program to edit (`-o model.weft`) and,
    /// beside it (`model.toml`), the config that trains that program: its
    /// initialisation, input ranges and tensor-parallel rules as tables.
    #[command(allow_negative_numbers = true)]
    Model {
        /// The training config.
        config: PathBuf,
        /// Where to write the program.
        #[arg(short, long)]
        output: PathBuf,
    },
    /// Train one config under every strategy (the named ones and `auto`)
    /// and print the cost model's predicted step time next to the measured
    /// one, with their rank correlation.
    #[command(allow_negative_numbers = true)]
    CompareStrategies(compare::CompareArgs),
    /// Draw metric curves of one or more runs into an SVG.
    #[command(allow_negative_numbers = true)]
    Plot {
        /// Metrics files (JSONL); or one `pipeline.json` (the schedule's
        /// timeline) or one `run.json` (where each device's step went).
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// The SVG to write.
        #[arg(short, long)]
        output: PathBuf,
        /// Which metrics (repeatable). Default: `loss`, and `val_loss`
        /// where a file has it (a run with a validation split).
        #[arg(long)]
        metric: Vec<String>,
        /// Logarithmic y axis.
        #[arg(long)]
        log: bool,
    },
    /// Dataset tools (`weft data prepare`).
    Data {
        /// What to do.
        #[command(subcommand)]
        command: DataCommand,
    },
    /// Propagate shardings and partition a function for a device mesh;
    /// print the program each device runs and a summary (collectives by
    /// kind with bytes per device, peak live bytes, parameter and optimizer
    /// bytes per device).
    #[command(allow_negative_numbers = true)]
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
        /// Print the program's text after this compiler pass (`inline`,
        /// `propagate`, `partition`, a clean-up, or `all`) to stderr.
        #[arg(long = "dump-after")]
        dump_after: Option<String>,
        /// Write the dumps to DIR/NN-PASS.txt (every pass unless
        /// --dump-after names one).
        #[arg(long = "dump-dir")]
        dump_dir: Option<PathBuf>,
        /// Print each compiler pass's wall time to stderr.
        #[arg(long = "time-passes")]
        time_passes: bool,
        /// After the summary, list every reshard propagation inserted: the
        /// value, its sharding before and after, the collectives that carry
        /// it out, and why it is needed.
        #[arg(long)]
        explain: bool,
    },
}

/// `weft data` subcommands.
#[derive(Subcommand, Debug)]
pub enum DataCommand {
    /// Turn text files into train/validation token files for a `[data]`
    /// table: a byte-level vocabulary (256 ids) or a Hugging Face
    /// `--tokenizer tokenizer.json`, u16 token files (u32 past 65536 ids)
    /// in nanoGPT's layout, the last `--val-fraction` of each file's tokens
    /// held out for validation, and meta.json (vocabulary size, dtype,
    /// tokenizer, sources and their sha256).
    #[command(allow_negative_numbers = true)]
    Prepare {
        /// Text files, in order.
        #[arg(required = true)]
        texts: Vec<PathBuf>,
        /// Output directory (train.bin, val.bin, meta.json).
        #[arg(short, long)]
        output: PathBuf,
        /// Fraction of each file for validation, in (0, 1).
        #[arg(long, default_value_t = 0.1)]
        val_fraction: f64,
        /// A Hugging Face `tokenizer.json` (default: bytes, 256 ids).
        #[arg(long)]
        tokenizer: Option<PathBuf>,
    },
}

/// Arguments of `weft train`: the config and the flags that override it
/// (declared once, as [`crate::runner::Overrides`]).
#[derive(clap::Args, Debug)]
pub struct TrainArgs {
    /// The experiment config.
    pub config: PathBuf,
    /// The flags.
    #[command(flatten)]
    pub overrides: crate::runner::Overrides,
}

/// Runs the CLI on the process arguments and returns the exit code.
pub fn main() -> i32 {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Check { file } => check::check(&file),
        Command::Run { file, inputs, output, func, memory_limit } => {
            run::run(&file, inputs.as_deref(), output.as_deref(), func.as_deref(), memory_limit.as_deref())
        }
        Command::Shard { file, mesh, func, explain, show, auto, memory_budget } => {
            shard::shard(&file, &mesh, &shard::ShardArgs { func, explain, show, auto, memory_budget })
        }
        Command::Train(args) => train::train(&args.config, &args.overrides),
        Command::Launch(args) => launch::launch(&args),
        Command::CompareStrategies(args) => compare::compare(&args),
        Command::Model { config, output } => model::model(&config, &output),
        Command::Plot { files, output, metric, log } => plot::plot(&files, &output, &metric, log),
        Command::Data { command: DataCommand::Prepare { texts, output, val_fraction, tokenizer } } => {
            data::prepare_cmd(&texts, &output, val_fraction, tokenizer.as_deref())
        }
        Command::Lower { file, mesh, func, dump_after, dump_dir, time_passes, explain } => {
            let opts = lower::LowerOptions { dump_after, dump_dir, time_passes, explain };
            lower::lower(&file, mesh.as_deref(), func.as_deref(), &opts)
        }
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            e.exit_code()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    /// The config keys' table, the `weft train` flags and their help agree:
    /// every key's flag exists, and the strategy help lists every strategy.
    #[test]
    fn train_flags_match_the_key_table() {
        let mut cli = Cli::command();
        let train = cli.find_subcommand_mut("train").expect("weft train");
        let flags: Vec<String> = train.get_arguments().filter_map(|a| a.get_long().map(|l| format!("--{l}"))).collect();
        for k in crate::runner::validate::KEYS {
            if let Some(f) = k.flag {
                assert!(flags.iter().any(|x| x == f), "{} names the flag {f}, which weft train lacks", k.key);
            }
        }
        let help = train.render_long_help().to_string();
        for s in crate::strategy::Strategy::ALL {
            assert!(help.contains(s.name()), "weft train --help omits the strategy `{s}`");
        }
    }
}

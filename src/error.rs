//! The facade crate's error: one enum wrapping each crate's own, plus the
//! command-line tool's usage and file errors.

use std::path::PathBuf;

/// Every error the `weft` facade and CLI report.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An error from the IR crate (parse, verify, interpret, tensor files).
    #[error(transparent)]
    Ir(#[from] weft_ir::IrError),
    /// An error from the compiler (sharding, autodiff, partitioning). Boxed:
    /// it is the largest of these (its sites carry names and text), and every
    /// `Result` of the facade would otherwise be that large.
    #[error(transparent)]
    Compiler(Box<weft_compiler::CompilerError>),
    /// A signal asked the run to stop (`runner::preempt`): it stopped after
    /// step `step`, whose checkpoint (if the run has a checkpoint
    /// directory) is committed.
    #[error(
        "preempted: stopped after step {step}{}",
        match saved { true => "; its checkpoint is committed (run again with --resume to continue)", false => "; the run has no checkpoint directory, so nothing was saved" }
    )]
    Preempted {
        /// The steps done.
        step: u64,
        /// Whether a checkpoint of that step was committed.
        saved: bool,
    },
    /// The loss was not finite for `steps` steps in a row: the run stopped
    /// at `last`, without saving the non-finite state.
    #[error(
        "the run diverged: the loss was not finite for {steps} steps in a row (steps {first} to {last}); it stopped \
         there{}. Lower optimizer.lr, set optimizer.clip, or use [loss_scaling] for f16; `divergence_steps = 0` \
         runs on regardless",
        match last_good { Some(g) => format!(", and its last checkpoint is the one of step {g}, whose loss was finite"), None => String::new() }
    )]
    Diverged {
        /// Consecutive non-finite steps that stopped it.
        steps: u64,
        /// The first of them.
        first: u64,
        /// The last.
        last: u64,
        /// The newest checkpoint saved, if any.
        last_good: Option<u64>,
    },
    /// A checkpoint could not be saved or restored.
    #[error(transparent)]
    Checkpoint(#[from] crate::checkpoint::CheckpointError),
    /// An error from the runtime (devices, kernels, execution).
    #[error(transparent)]
    Runtime(#[from] weft_runtime::RuntimeError),
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A config key or command-line flag has a value outside its valid
    /// range (every range is listed in `specs/training.md`).
    #[error("{key} = {value}: {expected}")]
    Invalid {
        /// The config key, with its flag where there is one
        /// (`steps (--steps)`, `model.d`).
        key: String,
        /// The value given.
        value: String,
        /// The valid range, and why where it is not obvious.
        expected: String,
    },
    /// `--resume` cannot resume: no checkpoint directory or no valid
    /// checkpoint in it, or the checkpoint is past the configured steps.
    #[error("--resume: {0}")]
    Resume(String),
    /// A dataset file is missing, truncated, or does not fit the model
    /// (dtype, shape, token ids, too few examples).
    #[error("{}: {message}", path.display())]
    Data {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
    /// `--resume` onto data other than the data the checkpoint was trained
    /// on (other files, contents, seed or order).
    #[error("--resume: {0}")]
    DataChanged(String),
    /// A model breaks the contract of a trainable program (no loss
    /// function, a non-scalar loss, an uncovered parameter, a pattern that
    /// matches nothing, an init file that does not fit).
    #[error("{what}: {message}")]
    Model {
        /// The program, file or config table at fault (with the line where
        /// there is one).
        what: String,
        /// What is wrong.
        message: String,
    },
    /// The command line asked for something that does not exist or fit.
    #[error("{0}")]
    Usage(String),
    /// Launched as several processes (`mpirun -n N`) by a weft built
    /// without MPI support.
    #[error(
        "launched as {processes} processes, but this weft was built without MPI support; build it with \
         `cargo build --release --features mpi` (needs libopenmpi-dev and libclang-dev), or run one process"
    )]
    NoMpi {
        /// Processes the launcher started.
        processes: usize,
    },
    /// The processes of a multi-process run disagree (other binaries,
    /// configs or programs).
    #[error(
        "the processes run different {what}: processes {processes:?} differ from process 0; every process must run \
         the same weft binary with the same config and flags"
    )]
    ProcessMismatch {
        /// What differs (`binary`, `config`, `program`).
        what: String,
        /// The processes whose copy differs from process 0's.
        processes: Vec<usize>,
    },
    /// A directory every process of a multi-process run must share (the
    /// checkpoint root) is not the same directory on every host.
    #[error(
        "{} is not one directory shared by every process: process 0 (host {writer}) wrote a file there \
         that processes {processes:?} ({hosts}) do not see; put it on a file system every host mounts \
         (NFS, Lustre, ...) or run on one host",
        dir.display()
    )]
    NotShared {
        /// The directory.
        dir: PathBuf,
        /// The host of process 0.
        writer: String,
        /// The processes that do not see process 0's file.
        processes: Vec<usize>,
        /// Their hosts: "host b", "hosts b, c".
        hosts: String,
    },
    /// `weft launch` restarted the job as often as it may, and it failed
    /// again (or could not be restarted: too few processes left).
    #[error("weft launch: gave up after {restarts} restarts: {cause}")]
    GaveUp {
        /// Restarts made.
        restarts: u32,
        /// Why the last attempt failed, and why no other is made.
        cause: String,
    },
}

impl From<weft_compiler::CompilerError> for Error {
    fn from(e: weft_compiler::CompilerError) -> Error {
        Error::Compiler(Box::new(e))
    }
}

/// The exit code of a run that diverged (`EX_DATAERR`): `weft launch`
/// does not restart it, since it would diverge again.
pub const DIVERGED_EXIT: i32 = 65;

impl Error {
    /// The exit code of the command that failed with this error: 2 bad
    /// usage, [`DIVERGED_EXIT`] a diverged run, 1 anything else (a problem
    /// in the program or data, or a failure a restart may fix).
    pub fn exit_code(&self) -> i32 {
        match self {
            Error::Usage(_) | Error::Invalid { .. } => 2,
            Error::Diverged { .. } => DIVERGED_EXIT,
            _ => 1,
        }
    }
}

/// Result with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Reads a file to a string, naming the file in the error.
pub fn read_to_string(path: &std::path::Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|source| Error::Io { path: path.to_path_buf(), source })
}

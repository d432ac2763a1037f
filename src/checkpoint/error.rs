//! The checkpoint library's one error type.
//!
//! A checkpoint error must let a person find the broken thing without a
//! debugger: every variant names the step, and where it applies the file
//! and the leaves involved. The variants are split by what a caller may do
//! about them: a damaged or incomplete checkpoint (`Corrupt`, `Manifest*`)
//! means "fall back to an older step" (see
//! [`latest_valid_step`](super::latest_valid_step)), a mismatch with the
//! requested target (`LeafSet`, `LeafMismatch`, `TopologyMismatch`) means
//! "the program changed", and invalid input to a save (`InvalidState`,
//! `InvalidSharding`) is a bug in the caller.

use std::path::PathBuf;

/// Every error the checkpoint library reports.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// A file-system operation failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done (`"create directory"`, `"write"`, ...).
        op: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A restore asked for the latest step, but none is committed.
    #[error("no committed checkpoint in {root}")]
    NoCheckpoint {
        /// The checkpoint root directory.
        root: PathBuf,
    },
    /// A restore asked for a step that is not committed.
    #[error("step {step} is not a committed checkpoint in {root} (committed: {committed:?})")]
    StepNotFound {
        /// The checkpoint root directory.
        root: PathBuf,
        /// The step asked for.
        step: u64,
        /// The steps that are committed.
        committed: Vec<u64>,
    },
    /// A committed step has no readable manifest (or no manifest checksum).
    #[error("step {step}: manifest {path} is missing")]
    ManifestMissing {
        /// The step.
        step: u64,
        /// The missing file.
        path: PathBuf,
    },
    /// A manifest exists but is not a valid manifest: its checksum does not
    /// match, it is not the expected JSON, or it contradicts itself.
    #[error("step {step}: manifest {path} is malformed: {message}")]
    ManifestMalformed {
        /// The step.
        step: u64,
        /// The manifest file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// A shard file is missing, truncated, fails its sha256, or its content
    /// contradicts the manifest. Nothing from it is loaded.
    #[error("step {step}: file {file} (leaves: {}) is corrupt: {message}", .leaves.join(", "))]
    Corrupt {
        /// The step.
        step: u64,
        /// The shard file.
        file: PathBuf,
        /// The leaves with data in that file.
        leaves: Vec<String>,
        /// What is wrong (e.g. `sha256 mismatch`, `truncated: 10 of 64 bytes`).
        message: String,
    },
    /// The checkpoint's leaves are not the leaves the restore target asks for.
    #[error("step {step}: leaf set differs from the target: {}", leaf_set(.missing, .unexpected))]
    LeafSet {
        /// The step.
        step: u64,
        /// Leaves the target asks for that the checkpoint lacks.
        missing: Vec<String>,
        /// Leaves in the checkpoint that the target does not ask for.
        unexpected: Vec<String>,
    },
    /// A leaf's saved type differs from the requested one.
    #[error("step {step}: leaf `{leaf}`: {message}")]
    LeafMismatch {
        /// The step.
        step: u64,
        /// The leaf.
        leaf: String,
        /// What differs (e.g. `saved f32[8,4], target f32[8,8]`).
        message: String,
    },
    /// Restoring onto a different mesh without saying how to shard the leaf
    /// there (as Orbax: give the target a sharding to reshard on load).
    #[error(
        "step {step}: leaf `{leaf}`: topology mismatch: saved on mesh {saved} but restoring onto mesh {target} \
         without a target sharding"
    )]
    TopologyMismatch {
        /// The step.
        step: u64,
        /// The leaf without a target sharding.
        leaf: String,
        /// The mesh it was saved on, e.g. `{x=2, y=2}`.
        saved: String,
        /// The target mesh.
        target: String,
    },
    /// A sharding does not fit the mesh or the tensor shape (unknown or
    /// repeated axis, wrong rank, a dimension not divisible by its blocks,
    /// unreduced axes).
    #[error("leaf `{leaf}`: sharding {sharding} on mesh {mesh}: {message}")]
    InvalidSharding {
        /// The leaf.
        leaf: String,
        /// The sharding, printed.
        sharding: String,
        /// The mesh, printed.
        mesh: String,
        /// What is wrong.
        message: String,
    },
    /// The state given to a save is inconsistent (a missing shard, a shard
    /// of the wrong shape or dtype, a device outside the mesh).
    #[error("step {step}: leaf `{leaf}`: {message}")]
    InvalidState {
        /// The step being saved.
        step: u64,
        /// The leaf.
        leaf: String,
        /// What is wrong.
        message: String,
    },
    /// A background (async) save failed; `source` says how.
    #[error("async save of step {step} failed: {source}")]
    AsyncSave {
        /// The step whose save failed.
        step: u64,
        /// The error of the writer thread.
        source: Box<CheckpointError>,
    },
    /// The background writer thread panicked (a bug in this library).
    #[error("async save of step {step}: writer thread panicked: {message}")]
    WriterPanicked {
        /// The step being saved.
        step: u64,
        /// The panic message.
        message: String,
    },
}

fn leaf_set(missing: &[String], unexpected: &[String]) -> String {
    let mut parts = Vec::new();
    if !missing.is_empty() {
        parts.push(format!("missing from the checkpoint: {}", missing.join(", ")));
    }
    if !unexpected.is_empty() {
        parts.push(format!("not in the target: {}", unexpected.join(", ")));
    }
    parts.join("; ")
}

/// Result with [`CheckpointError`].
pub type Result<T, E = CheckpointError> = std::result::Result<T, E>;

/// Wraps an I/O error with the operation and path (for `map_err`).
pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> CheckpointError {
    let path = path.into();
    move |source| CheckpointError::Io { op, path, source }
}

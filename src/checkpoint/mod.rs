//! Pure-state checkpoints: saving and restoring a training state tree.
//!
//! weft's training state is a pure value, a tree of named tensor leaves
//! (`params.layers.0.w1`, `opt.m.layers.0.w1`, `step`, `rng`, ...), so a
//! checkpoint is just that tree written down, and resuming from it must give
//! bit-for-bit the run that never stopped. This module is built around two
//! promises:
//!
//! - **Never lose work.** A step is written into a hidden temporary
//!   directory, every file and the directory fsynced, and committed by one
//!   rename; deletions (retention) rename first. A crash at any moment
//!   leaves only complete steps visible (tested by killing a writer process
//!   at random moments, with the reusable harness in [`crash`]). Async saves
//!   ([`CheckpointManager::save_async`]) never drop an error.
//! - **Never load wrong data.** Every file has its sha256 in the manifest
//!   (the manifest has its own), every shard must be exactly the block its
//!   sharding gives, and a restore checks the leaf set, types and mesh
//!   against what the program asks for. Errors name the step, file and
//!   leaves ([`CheckpointError`]).
//!
//! Sharded states are saved as one copy of each distinct block
//! ([`BlockLayout`]) in safetensors files readable by other tools, and can
//! be restored onto another mesh or sharding (resharding on load). The
//! format is specified in `specs/checkpoint.md`.

mod across;
mod commit;
pub mod crash;
mod error;
mod fsutil;
mod manager;
mod manifest;
mod mesh;
mod par;
mod read;
mod region;
mod retention;
mod state;
mod write;

pub use commit::CheckpointOptions;
pub use error::{CheckpointError, Result};
pub use fsutil::step_dir_name;
pub use manager::CheckpointManager;
pub use manifest::{FileEntry, LeafEntry, Manifest, ShardEntry, FORMAT, MANIFEST, MANIFEST_SHA, VERSION};
pub use mesh::{BlockLayout, MeshSpec};
pub use read::{latest_valid_step, list_steps, restore, validate_step, LatestValid, Restored, SkippedStep};
pub use region::copy_region;
pub use retention::Retention;
pub use state::{CheckpointState, LeafData, RestoreTarget, ShardedLeaf, TargetLeaf};
pub use write::CommitInfo;

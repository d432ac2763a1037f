//! A save's options, and its last act: the commit, then retention.
//!
//! Both kinds of save end here: one process's ([`commit_and_retain`], the
//! manager's writer) and several processes' ([`commit_and_retain_written`],
//! process 0 of [`super::across`], once every process's files are
//! durable). Retention runs only after a commit, so a crash never deletes
//! a step before its successor is committed.

use super::error::Result;
use super::fsutil;
use super::manifest::FileEntry;
use super::retention::Retention;
use super::write::{self, CommitInfo, Snapshot};
use std::path::Path;

/// How a manager saves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckpointOptions {
    /// Which old steps to delete after each save.
    pub retention: Retention,
    /// Shard files are cut at about this size (a block larger than it gets
    /// a file of its own); bounds the memory a save needs per file.
    pub max_file_bytes: u64,
    /// Threads used to write or read shard files.
    pub threads: usize,
}

impl Default for CheckpointOptions {
    /// Keep everything, 128 MiB files, one thread per core.
    fn default() -> Self {
        CheckpointOptions {
            retention: Retention::keep_all(),
            max_file_bytes: 128 << 20,
            threads: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        }
    }
}

/// Writes and commits a snapshot, then applies the retention policy.
pub(crate) fn commit_and_retain(root: &Path, options: &CheckpointOptions, snap: &Snapshot<'_>) -> Result<CommitInfo> {
    let info = write::write(root, snap, options.threads)?;
    retain(root, options, snap, info)
}

/// Commits a snapshot whose `files` are written in `tmp` (by every process
/// of a multi-process save), then applies the retention policy.
pub(crate) fn commit_and_retain_written(
    root: &Path,
    options: &CheckpointOptions,
    snap: &Snapshot<'_>,
    tmp: &Path,
    files: Vec<FileEntry>,
) -> Result<CommitInfo> {
    let info = write::commit_written(root, snap, tmp, files)?;
    retain(root, options, snap, info)
}

fn retain(root: &Path, options: &CheckpointOptions, snap: &Snapshot<'_>, mut info: CommitInfo) -> Result<CommitInfo> {
    let committed = fsutil::list_steps(root)?;
    for step in options.retention.to_delete(&committed, snap.step) {
        fsutil::delete_step(root, step)?;
        info.deleted.push(step);
    }
    Ok(info)
}

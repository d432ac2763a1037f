//! Saving one checkpoint from several processes (a multi-process run).
//!
//! Each process holds only its devices' blocks. The save is the
//! single-process save split at its commit point: process 0 creates the
//! hidden temporary directory and tells the others its name; every process
//! writes and fsyncs the files of the blocks whose lowest device it owns
//! ([`super::write::prepare_part`]: every process plans the same manifest);
//! the file entries (sizes, sha256) are gathered; only when every process
//! reports its files durable does process 0 write the manifest and commit
//! the directory with one rename, then apply retention; finally every
//! process learns the outcome. A process that dies at any point leaves an
//! uncommitted hidden directory (removed when the checkpoint root is next
//! opened), never a committed step with missing files. The checkpoint root
//! must be one directory every process sees (one host, or a shared file
//! system).
//!
//! The save is split in two so that training goes on while the files are
//! written ([`begin`], then [`AcrossSave::finish`]): `begin` plans the save,
//! exchanges the directory's name and hands this process's blocks to a
//! writer thread; `finish`, called by every process at the same step
//! boundary once all report their files written (the runner's boundary
//! exchange) or when a save must be complete, gathers the file entries
//! and commits. The writer thread never talks to the other processes: all
//! exchanges stay on the training loop's thread, in the same order in
//! every process, so they cannot interleave with a step's collectives.

use super::commit::{commit_and_retain_written, CheckpointOptions};
use super::error::{CheckpointError, Result};
use super::fsutil;
use super::manifest::FileEntry;
use super::state::CheckpointState;
use super::write::{self, CommitInfo, Snapshot};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;
use weft_runtime::ProcessGroup;

/// What went wrong in another process, as that process reported it.
fn remote(step: u64, rank: usize, message: String) -> CheckpointError {
    CheckpointError::InvalidState { step, leaf: String::new(), message: format!("process {rank}: {message}") }
}

fn gather(group: &dyn ProcessGroup, timeout: Duration, step: u64, bytes: Vec<u8>, what: &str) -> Result<Vec<Vec<u8>>> {
    group
        .all_gather(&bytes, timeout, &format!("{what} of checkpoint step {step}"))
        .map_err(|e| CheckpointError::InvalidState { step, leaf: String::new(), message: e.to_string() })
}

/// A multi-process save whose files this process is writing in the
/// background ([`begin`]); it commits with [`AcrossSave::finish`].
pub(crate) struct AcrossSave {
    step: u64,
    /// The hidden directory every process writes into.
    dir: PathBuf,
    /// The plan (its manifest; the files are the writer's).
    snap: Snapshot<'static>,
    writer: JoinHandle<std::result::Result<Vec<FileEntry>, String>>,
    /// The writer's thread id (0 until it has started).
    tid: Arc<std::sync::atomic::AtomicI32>,
    group: Arc<dyn ProcessGroup>,
    timeout: Duration,
}

/// Starts saving `state` (this process's blocks) as `step` together with
/// the other processes of `group`, which call this at the same point: the
/// plan and the directory are agreed on now (an invalid state is an error
/// in every process), and this process's files are written by a thread
/// that owns `state`. See the module docs.
pub(crate) fn begin(
    root: &Path,
    options: &CheckpointOptions,
    step: u64,
    state: CheckpointState,
    group: Arc<dyn ProcessGroup>,
    timeout: Duration,
) -> Result<AcrossSave> {
    let first = group.rank() == 0;
    // Plan (the same manifest everywhere) before anything is created.
    let planned = write::prepare_part(step, &state, options.max_file_bytes, true);
    // Process 0 creates the temporary directory and names it.
    let tmp = if first && planned.is_ok() { Some(fsutil::create_temp_dir(root, step)) } else { None };
    let name = match &tmp {
        Some(Ok(dir)) => Ok(dir.to_string_lossy().into_owned()),
        Some(Err(e)) => Err(e.to_string()),
        None => match &planned {
            Err(e) => Err(e.to_string()),
            Ok(_) => Ok(String::new()),
        },
    };
    let names = gather(group.as_ref(), timeout, step, serde_json::to_vec(&name).expect("serializes"), "the directory")?;
    let mut dir: Option<PathBuf> = None;
    for (rank, bytes) in names.iter().enumerate() {
        let r: std::result::Result<String, String> = serde_json::from_slice(bytes).unwrap_or(Err("garbled".into()));
        match r {
            Err(m) => return Err(remote(step, rank, m)),
            Ok(p) if rank == 0 => dir = Some(PathBuf::from(p)),
            Ok(_) => {}
        }
    }
    let dir = dir.expect("process 0 answered");
    let manifest = planned?.manifest;
    let snap = Snapshot { step, manifest, files: Vec::new() };
    let into = dir.clone();
    let max_file_bytes = options.max_file_bytes;
    let tid = Arc::new(std::sync::atomic::AtomicI32::new(0));
    let tid_of_writer = Arc::clone(&tid);
    let writer = std::thread::Builder::new()
        .name(format!("checkpoint-step-{step}"))
        .spawn(move || {
            tid_of_writer.store(fsutil::background_priority(), std::sync::atomic::Ordering::SeqCst);
            // The same plan again, over the state this thread owns (planning
            // is metadata only; the blocks are not copied once more).
            let plan = write::prepare_part(step, &state, max_file_bytes, true).map_err(|e| e.to_string())?;
            plan.files.iter().map(|f| write::write_file(&into, f, step).map_err(|e| e.to_string())).collect()
        })
        .map_err(|e| remote(step, group.rank(), format!("cannot start the writer thread: {e}")))?;
    Ok(AcrossSave { step, dir, snap, writer, tid, group, timeout })
}

impl AcrossSave {
    /// The step being saved.
    pub(crate) fn step(&self) -> u64 {
        self.step
    }

    /// Whether this process's files are written (or their writing failed):
    /// [`AcrossSave::finish`] would not wait for this process's disk.
    pub(crate) fn written(&self) -> bool {
        self.writer.is_finished()
    }

    /// Waits for this process's files, then, with every other process
    /// (which call this at the same point), gathers the file entries;
    /// process 0 commits once every file is durable and every process
    /// learns the outcome.
    pub(crate) fn finish(self, root: &Path, options: &CheckpointOptions) -> Result<CommitInfo> {
        let AcrossSave { step, dir, snap, writer, tid, group, timeout } = self;
        let group = group.as_ref();
        let first = group.rank() == 0;
        // Awaited now: the writer is no longer background work.
        if !writer.is_finished() {
            fsutil::normal_priority(tid.load(std::sync::atomic::Ordering::SeqCst));
        }
        let written = writer.join().unwrap_or_else(|_| Err("the writer thread panicked".into()));
        let mine = written.as_ref().map(|v| v.len()).unwrap_or(0);
        let bytes_mine: u64 = written.as_ref().map(|v| v.iter().map(|f| f.bytes).sum()).unwrap_or(0);
        let all = gather(group, timeout, step, serde_json::to_vec(&written).expect("serializes"), "the shard files")?;
        let mut files = Vec::new();
        let mut failure = None;
        for (rank, bytes) in all.iter().enumerate() {
            let r: std::result::Result<Vec<FileEntry>, String> =
                serde_json::from_slice(bytes).unwrap_or(Err("garbled file list".into()));
            match r {
                Ok(f) => files.extend(f),
                Err(m) => {
                    failure.get_or_insert(remote(step, rank, m));
                }
            }
        }
        // Process 0 commits once every file is durable.
        let outcome: std::result::Result<CommitInfo, String> = if first {
            match failure {
                Some(e) => {
                    let _ = std::fs::remove_dir_all(&dir);
                    Err(e.to_string())
                }
                None => commit_and_retain_written(root, options, &snap, &dir, files).map_err(|e| e.to_string()),
            }
        } else {
            Err(String::new())
        };
        let said = match &outcome {
            Ok(info) => Ok(info.deleted.clone()),
            Err(m) => Err(m.clone()),
        };
        let told = gather(group, timeout, step, serde_json::to_vec(&said).expect("serializes"), "the commit")?;
        let verdict: std::result::Result<Vec<u64>, String> =
            serde_json::from_slice(&told[0]).unwrap_or(Err("garbled commit outcome".into()));
        match (outcome, verdict) {
            (Ok(info), _) => Ok(info),
            (Err(_), Ok(deleted)) => Ok(CommitInfo {
                step,
                path: root.join(fsutil::step_dir_name(step)),
                bytes: bytes_mine,
                files: mine,
                deleted,
            }),
            (Err(_), Err(m)) => Err(remote(step, 0, m)),
        }
    }

    /// Leaves the save uncommitted, with no exchange and without waiting
    /// for the writer (the job is failing, and its error must not wait for
    /// a disk): the hidden directory is removed when the root is next
    /// opened.
    pub(crate) fn abandon(self) {
        drop(self.writer);
    }
}

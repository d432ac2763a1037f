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

use super::error::{CheckpointError, Result};
use super::fsutil;
use super::manager::{commit_and_retain_written, CheckpointOptions};
use super::manifest::FileEntry;
use super::state::CheckpointState;
use super::write::{self, CommitInfo};
use std::path::{Path, PathBuf};
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

/// Saves `state` (this process's blocks) as `step` together with the other
/// processes of `group`; see the module docs.
pub(crate) fn save_across(
    root: &Path,
    options: &CheckpointOptions,
    step: u64,
    state: &CheckpointState,
    group: &dyn ProcessGroup,
    timeout: Duration,
) -> Result<CommitInfo> {
    let first = group.rank() == 0;
    // Plan (the same manifest everywhere) before anything is created.
    let planned = write::prepare_part(step, state, options.max_file_bytes, true);
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
    let names = gather(group, timeout, step, serde_json::to_vec(&name).expect("serializes"), "the directory")?;
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
    let snap = planned?;
    // Every process writes its files.
    let mut written: std::result::Result<Vec<FileEntry>, String> = Ok(Vec::new());
    for plan in &snap.files {
        match write::write_file(&dir, plan, step) {
            Ok(e) => written.as_mut().expect("still ok").push(e),
            Err(e) => {
                written = Err(e.to_string());
                break;
            }
        }
    }
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

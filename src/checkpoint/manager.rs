//! The checkpoint manager: saves (sync or in the background), retention,
//! and the reading functions bound to one root directory.
//!
//! A training loop should not wait for the disk, so [`CheckpointManager::save_async`]
//! copies the leaves it needs and returns; a background thread writes and
//! commits. Only one save is in flight: the next save waits for it first.
//! Its result is never lost: an error surfaces at the next save, at
//! [`CheckpointManager::wait`], at [`CheckpointManager::finish`], or (if
//! never collected) as a panic when the manager is dropped.
//!
//! One manager (one process) writes to a root at a time: opening a manager
//! removes leftovers of interrupted saves, which would break a concurrent
//! writer's save (never a committed step).

use super::across::AcrossSave;
use super::commit::{commit_and_retain, CheckpointOptions};
use super::error::{io, CheckpointError, Result};
use super::fsutil;
use super::manifest::Manifest;
use super::read::{self, LatestValid, Restored};
use super::state::{CheckpointState, RestoreTarget};
use super::write::{self, CommitInfo};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;
use weft_runtime::ProcessGroup;

/// The save in flight.
enum InFlight {
    /// One process's save: its thread writes and commits.
    Alone { step: u64, handle: JoinHandle<Result<CommitInfo>> },
    /// A multi-process save: its thread writes this process's files; the
    /// commit is a collective of the processes ([`AcrossSave::finish`]).
    Across(Box<AcrossSave>),
}

impl InFlight {
    fn step(&self) -> u64 {
        match self {
            InFlight::Alone { step, .. } => *step,
            InFlight::Across(a) => a.step(),
        }
    }
}

/// Saves and restores the checkpoints of one root directory.
pub struct CheckpointManager {
    root: PathBuf,
    options: CheckpointOptions,
    in_flight: Option<InFlight>,
    cleaned: Vec<PathBuf>,
}

impl CheckpointManager {
    /// Opens (creating it if needed) the checkpoint root and cleans up
    /// leftovers of interrupted saves and deletions.
    pub fn open(root: impl Into<PathBuf>, options: CheckpointOptions) -> Result<CheckpointManager> {
        let root = root.into();
        if root.exists() && !root.is_dir() {
            let e = std::io::Error::other("it is a file, not a directory");
            return Err(io("use as the checkpoint directory", &root)(e));
        }
        if !root.is_dir() {
            std::fs::create_dir_all(&root).map_err(io("create directory", &root))?;
            // Make the new root itself durable.
            if let Some(parent) = root.parent().filter(|p| !p.as_os_str().is_empty()) {
                fsutil::sync_dir(parent)?;
            }
        }
        let cleaned = fsutil::cleanup(&root)?;
        Ok(CheckpointManager { root, options, in_flight: None, cleaned })
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The leftovers [`CheckpointManager::open`] removed (or, for a replaced
    /// step whose replacement never committed, restored).
    pub fn cleaned(&self) -> &[PathBuf] {
        &self.cleaned
    }

    /// The step of the save in flight, if any.
    pub fn in_flight(&self) -> Option<u64> {
        self.in_flight.as_ref().map(InFlight::step)
    }

    /// Saves `state` as `step` and returns when it is committed (after
    /// waiting for a save in flight, whose error it returns instead).
    /// Saving a step that exists replaces it atomically.
    pub fn save(&mut self, step: u64, state: &CheckpointState) -> Result<CommitInfo> {
        self.wait()?;
        let snap = write::prepare(step, state, self.options.max_file_bytes)?;
        commit_and_retain(&self.root, &self.options, &snap)
    }

    /// Starts saving `state` as `step` in the background and returns once
    /// the needed leaves are copied. Waits for a save in flight first and
    /// returns its commit (or, if it failed, its error, without starting
    /// this save). Invalid input (see [`CheckpointError::InvalidState`]) is
    /// reported here, before anything is copied.
    pub fn save_async(&mut self, step: u64, state: &CheckpointState) -> Result<Option<CommitInfo>> {
        let previous = self.wait()?;
        let snap = write::prepare(step, state, self.options.max_file_bytes)?.into_owned();
        self.start_writer(step, move |root, options| commit_and_retain(root, options, &snap))?;
        Ok(previous)
    }

    /// Starts the background thread of a one-process save of `step`,
    /// which runs `write` at idle priority.
    fn start_writer(
        &mut self,
        step: u64,
        write: impl FnOnce(&Path, &CheckpointOptions) -> Result<CommitInfo> + Send + 'static,
    ) -> Result<()> {
        let (root, options) = (self.root.clone(), self.options.clone());
        let handle = std::thread::Builder::new()
            .name(format!("checkpoint-step-{step}"))
            .spawn(move || {
                fsutil::background_priority();
                write(&root, &options)
            })
            .map_err(io("spawn writer thread for", &self.root))?;
        self.in_flight = Some(InFlight::Alone { step, handle });
        Ok(())
    }

    /// [`CheckpointManager::save_async`] of a state the caller gives up:
    /// the writer thread takes it as it is, so nothing is copied (a run's
    /// state was just read off its devices for this save). Invalid input
    /// is reported here, as there.
    pub fn save_async_owned(&mut self, step: u64, state: CheckpointState) -> Result<Option<CommitInfo>> {
        let previous = self.wait()?;
        // Validated and planned here (metadata only), planned again by the
        // thread over the state it owns.
        write::prepare(step, &state, self.options.max_file_bytes)?;
        self.start_writer(step, move |root, options| {
            let snap = write::prepare(step, &state, options.max_file_bytes)?;
            commit_and_retain(root, options, &snap)
        })?;
        Ok(previous)
    }

    /// Starts saving `state` — this process's devices' blocks — as `step`
    /// together with every other process of `group` (which call this at
    /// the same point) and returns once a thread owns the blocks; the save
    /// commits at a later [`CheckpointManager::wait`], which every process
    /// calls at the same point (the runner: at the first step boundary at
    /// which every process reports [`CheckpointManager::across_written`]).
    /// Waits for a save in flight first and returns its commit.
    pub fn save_across_async(
        &mut self,
        step: u64,
        state: CheckpointState,
        group: &Arc<dyn ProcessGroup>,
        timeout: Duration,
    ) -> Result<Option<CommitInfo>> {
        let previous = self.wait()?;
        let save = super::across::begin(&self.root, &self.options, step, state, Arc::clone(group), timeout)?;
        self.in_flight = Some(InFlight::Across(Box::new(save)));
        Ok(previous)
    }

    /// Whether a save's files are being written now (by its thread; a
    /// finished save waiting for its commit is not).
    pub fn writing(&self) -> bool {
        match &self.in_flight {
            Some(InFlight::Alone { handle, .. }) => !handle.is_finished(),
            Some(InFlight::Across(a)) => !a.written(),
            None => false,
        }
    }

    /// With a multi-process save in flight: whether this process has
    /// written its files (so that committing it would not wait for this
    /// process). `None` without one.
    pub fn across_written(&self) -> Option<bool> {
        match &self.in_flight {
            Some(InFlight::Across(a)) => Some(a.written()),
            _ => None,
        }
    }

    /// Opens the checkpoint root as a process other than the first of a
    /// multi-process run: no clean-up (the first process cleans up, alone,
    /// before the others open it).
    pub fn open_shared(root: impl Into<PathBuf>, options: CheckpointOptions) -> Result<CheckpointManager> {
        Ok(CheckpointManager { root: root.into(), options, in_flight: None, cleaned: Vec::new() })
    }

    /// Waits for the save in flight, if any, and returns its commit or
    /// error. A multi-process save is committed here, together with the
    /// other processes (a collective: all call it at the same point).
    pub fn wait(&mut self) -> Result<Option<CommitInfo>> {
        let (step, done) = match self.in_flight.take() {
            None => return Ok(None),
            Some(InFlight::Across(save)) => (save.step(), Ok(save.finish(&self.root, &self.options))),
            Some(InFlight::Alone { step, handle }) => (step, handle.join()),
        };
        match done {
            Ok(Ok(info)) => Ok(Some(info)),
            Ok(Err(e)) => Err(CheckpointError::AsyncSave { step, source: Box::new(e) }),
            Err(panic) => {
                let message = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                Err(CheckpointError::WriterPanicked { step, message })
            }
        }
    }

    /// Waits for the save in flight and closes the manager.
    pub fn finish(mut self) -> Result<Option<CommitInfo>> {
        self.wait()
    }

    /// The committed steps, ascending.
    pub fn list_steps(&self) -> Result<Vec<u64>> {
        read::list_steps(&self.root)
    }

    /// The newest committed step, if any (not validated).
    pub fn latest_step(&self) -> Result<Option<u64>> {
        Ok(self.list_steps()?.last().copied())
    }

    /// The newest step that fully validates, and the newer ones skipped.
    pub fn latest_valid_step(&self) -> Result<LatestValid> {
        read::latest_valid_step(&self.root)
    }

    /// Fully validates a committed step; returns its manifest.
    pub fn validate(&self, step: u64) -> Result<Manifest> {
        read::validate_step(&self.root, step)
    }

    /// Restores `step` (the newest committed if `None`) onto `target`; see
    /// [`read::restore`]. A save in flight is not waited for.
    pub fn restore(&self, step: Option<u64>, target: &RestoreTarget) -> Result<Restored> {
        read::restore(&self.root, step, target, self.options.threads)
    }
}

impl Drop for CheckpointManager {
    /// Waits for a save in flight. An error nobody collected panics (or,
    /// while already panicking, is printed): it is never silently lost. A
    /// multi-process save still in flight is left uncommitted (committing
    /// takes every process, and a manager dropped early is a failing
    /// job's): its hidden directory goes when the root is next opened.
    fn drop(&mut self) {
        if let Some(InFlight::Across(save)) = self.in_flight.take_if(|f| matches!(f, InFlight::Across(_))) {
            save.abandon();
            return;
        }
        if let Err(e) = self.wait() {
            if std::thread::panicking() {
                eprintln!("checkpoint: {e}");
            } else {
                panic!("checkpoint: {e} (call wait() or finish() to handle save errors)");
            }
        }
    }
}

//! Prefetching: a background thread reads and converts the batches of the
//! coming steps into a bounded queue, so reading overlaps the step.
//!
//! The queue holds at most `depth` ready batches (the thread blocks when it
//! is full: memory stays bounded). Each batch is the part of the global
//! batch the caller's devices need (all of it in one process; see
//! [`super::Split::part`]). Batches are produced strictly in step
//! order and each is a pure function of its step,
//! so what the training loop receives does not depend on the depth or on
//! timing; only how long it waits does. Depth 0 reads each batch in the
//! loop itself (no thread). A read error is passed through the queue and
//! returned for the step that needed the batch.

use super::{batch_digest, BatchPart, Split};
use crate::error::Result;
use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use weft_compiler::train::Tree;

/// A batch as read, with its [`batch_digest`].
type Read = (Tree, u64);

/// The batches of steps `first..end` of a split, in order.
pub struct Prefetcher {
    split: Arc<Split>,
    part: BatchPart,
    next: u64,
    end: u64,
    rx: Option<Receiver<(u64, Result<Read>)>>,
    thread: Option<JoinHandle<()>>,
}

impl Prefetcher {
    /// Starts reading part `part` of the batches of steps `first..end`
    /// with `depth` batches read ahead.
    pub fn new(split: Arc<Split>, part: BatchPart, first: u64, end: u64, depth: usize) -> Result<Prefetcher> {
        let (rx, thread) = if depth == 0 || first >= end {
            (None, None)
        } else {
            let (tx, rx) = sync_channel(depth);
            let s = split.clone();
            let p = part.clone();
            let thread = std::thread::Builder::new()
                .name("weft-data-prefetch".into())
                .spawn(move || {
                    for step in first..end {
                        let b = read(&s, &p, step);
                        let failed = b.is_err();
                        // The receiver is gone: the run stopped.
                        if tx.send((step, b)).is_err() || failed {
                            break;
                        }
                    }
                })
                .map_err(|source| crate::error::Error::Io { path: "weft-data-prefetch thread".into(), source })?;
            (Some(rx), Some(thread))
        };
        Ok(Prefetcher { split, part, next: first, end, rx, thread })
    }

    /// The part of each global batch this prefetcher reads.
    pub fn part(&self) -> &BatchPart {
        &self.part
    }

    /// The split it reads.
    pub fn split(&self) -> &Split {
        &self.split
    }

    /// The next step's batch, how long the caller waited for it (with
    /// depth 0: the time to read it) and its [`batch_digest`].
    pub fn next_batch(&mut self) -> Result<(u64, Tree, Duration, u64)> {
        let clock = Instant::now();
        let step = self.next;
        assert!(step < self.end, "the prefetcher was asked for step {step}, past its end {}", self.end);
        let (batch, digest) = match &self.rx {
            None => read(&self.split, &self.part, step)?,
            Some(rx) => match rx.recv() {
                Ok((s, b)) => {
                    debug_assert_eq!(s, step, "batches arrive in step order");
                    b?
                }
                Err(_) => {
                    return Err(crate::error::Error::Usage(format!(
                        "the data prefetch thread stopped before step {step}"
                    )))
                }
            },
        };
        self.next += 1;
        Ok((step, batch, clock.elapsed(), digest))
    }
}

/// Part `part` of step `step`'s batch and its digest (hashed by the
/// reader, not the loop).
fn read(split: &Split, part: &BatchPart, step: u64) -> Result<Read> {
    let b = split.part(step, part)?;
    let digest = batch_digest(&b);
    Ok((b, digest))
}

impl Drop for Prefetcher {
    fn drop(&mut self) {
        // Dropping the receiver unblocks a thread waiting to send.
        self.rx = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

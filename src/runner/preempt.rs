//! Preemption: a run told to stop by its cluster keeps its last step.
//!
//! `SIGTERM` (what Slurm, Kubernetes and `mpirun` send first), `SIGINT`
//! (Ctrl-C) and `SIGUSR1` (what Slurm's `--signal` sends ahead of a job's
//! time limit) set a flag; the training loop reads it at each step
//! boundary, commits a checkpoint of the step it just finished, waits until
//! that checkpoint is durable and stops with [`crate::Error::Preempted`],
//! which `weft train` turns into exit code [`PREEMPTED_EXIT`]. A `SIGTERM`
//! or `SIGINT` while that is under way exits at once with [`ABORTED_EXIT`]
//! (a repeated `SIGUSR1` is ignored):
//! saves are atomic, so the previous checkpoint is still the newest valid
//! one. Under several processes the processes agree each step on whether
//! any was signalled ([`super::boundary`]), so they all stop after the
//! same step.
//!
//! The handlers are process-wide (signals are), so only the command-line
//! tool installs them ([`Preemption::install`]); the library's training
//! loop reads the flag through the [`Preemption`] it is handed, and tests
//! hand it one they set themselves ([`Preemption::request`]).

use crate::error::{Error, Result};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// `weft train`'s exit code after a preemption that committed the step in
/// progress (`EX_TEMPFAIL`: run again to continue, as Slurm's
/// `--requeue` does).
pub const PREEMPTED_EXIT: i32 = 75;
/// The exit code of a second signal during a preemption's save (128 +
/// `SIGINT`, what a shell reports for an interrupted command).
pub const ABORTED_EXIT: i32 = 130;

/// The signals that preempt a run.
pub const SIGNALS: [i32; 3] = [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT, signal_hook::consts::SIGUSR1];

/// Whether this process has been asked to stop. The default is a flag no
/// signal sets: [`Preemption::request`] sets it (tests, and callers with
/// their own notion of a deadline).
#[derive(Clone, Debug, Default)]
pub struct Preemption {
    flag: Arc<AtomicBool>,
}

impl Preemption {
    /// Installs the handlers of [`SIGNALS`]: the first sets the flag; a
    /// `SIGTERM` or `SIGINT` after it exits the process with
    /// [`ABORTED_EXIT`]. A repeated `SIGUSR1` changes nothing: it is a
    /// notice to stop soon, which a cluster and `weft launch` may both
    /// deliver (Slurm signals every process of a job, and the launch
    /// relays what it gets).
    pub fn install() -> Result<Preemption> {
        let p = Preemption::default();
        for sig in SIGNALS {
            let installed = if sig == signal_hook::consts::SIGUSR1 {
                signal_hook::flag::register(sig, Arc::clone(&p.flag)).map(|_| ())
            } else {
                // Registered first, so the first signal finds the flag unset.
                signal_hook::flag::register_conditional_shutdown(sig, ABORTED_EXIT, Arc::clone(&p.flag))
                    .and_then(|_| signal_hook::flag::register(sig, Arc::clone(&p.flag)))
                    .map(|_| ())
            };
            installed.map_err(|e| Error::Usage(format!("cannot install the handler of signal {sig}: {e}")))?;
        }
        Ok(p)
    }

    /// Asks the run to stop after its current step.
    pub fn request(&self) {
        self.flag.store(true, Ordering::SeqCst);
    }

    /// Whether this process was asked to stop.
    pub fn requested(&self) -> bool {
        self.flag.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_flag_is_set_by_request_only() {
        let p = Preemption::default();
        assert!(!p.requested());
        let q = p.clone();
        q.request();
        assert!(p.requested(), "clones share the flag");
    }
}

//! The step boundary: what the processes of a job agree on after a step.
//!
//! Several processes must take the same decisions at the same step, or
//! their collectives stop matching: whether to stop (any process was
//! signalled, [`super::preempt`]), whether to save by time (process 0's
//! clock, `checkpoint.every_seconds`), and whether the save in flight can
//! be committed (every process has written its files,
//! [`crate::checkpoint::CheckpointManager::across_written`]). One small
//! exchange after every step carries those flags together with the step's
//! compute and waiting times, from which process 0 reports stragglers
//! ([`super::stragglers`]). A process alone decides by itself and
//! exchanges nothing.

use super::processes::Processes;
use super::stragglers::StepTime;
use crate::error::{Error, Result};

/// What this process brings to a step boundary.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Local {
    /// This process was asked to stop.
    pub stop: bool,
    /// Time-based saves are on (`Some`), and this process's clock says one
    /// is due (only process 0's clock counts).
    pub save_due: Option<bool>,
    /// A multi-process save is in flight (`Some`), and this process has
    /// written its files.
    pub written: Option<bool>,
    /// The step's compute and waiting times.
    pub time: StepTime,
}

/// What every process of a job does at a step boundary.
#[derive(Clone, Debug, PartialEq)]
pub struct Boundary {
    /// Stop after this step (some process was asked to).
    pub stop: bool,
    /// Save this step because time has passed.
    pub save: bool,
    /// Commit the save in flight now (every process has written its files).
    pub commit: bool,
    /// Every process's step times, in rank order (this one's alone when
    /// there is one process).
    pub times: Vec<StepTime>,
}

/// Bytes of one process's message: three flags and two `f64` times.
const MESSAGE: usize = 3 + 16;

fn encode(l: &Local) -> Vec<u8> {
    // `written`: 2 when no save is in flight.
    let mut b = vec![l.stop as u8, (l.save_due == Some(true)) as u8, l.written.map_or(2, |w| w as u8)];
    b.extend_from_slice(&l.time.compute_ms.to_le_bytes());
    b.extend_from_slice(&l.time.wait_ms.to_le_bytes());
    b
}

fn time_of(b: &[u8]) -> StepTime {
    let f = |r: std::ops::Range<usize>| f64::from_le_bytes(b[r].try_into().expect("8 bytes"));
    StepTime { compute_ms: f(3..11), wait_ms: f(11..19) }
}

/// The boundary every process agrees on: one exchange of
/// [`MESSAGE`] bytes per process under several processes.
pub fn agree(local: Local, processes: Option<&Processes>) -> Result<Boundary> {
    let Some(p) = processes else {
        return Ok(Boundary {
            stop: local.stop,
            save: local.save_due == Some(true),
            commit: local.written == Some(true),
            times: vec![local.time],
        });
    };
    let all = p.all_gather(&encode(&local), "the step boundary")?;
    if let Some(q) = all.iter().position(|b| b.len() != MESSAGE) {
        return Err(Error::Usage(format!("process {q} sent a step boundary of {} bytes", all[q].len())));
    }
    Ok(Boundary {
        stop: all.iter().any(|b| b[0] == 1),
        save: all[0][1] == 1,
        commit: all.iter().all(|b| b[2] == 1),
        times: all.iter().map(|b| time_of(b)).collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use weft_runtime::ProcessGroup;

    #[test]
    fn alone_the_boundary_is_this_process_decision() {
        let t = StepTime { compute_ms: 3.0, wait_ms: 0.5 };
        let b = agree(Local { stop: true, save_due: Some(true), written: None, time: t }, None).unwrap();
        assert_eq!(b, Boundary { stop: true, save: true, commit: false, times: vec![t] });
        let b = agree(Local { written: Some(true), ..Local::default() }, None).unwrap();
        assert!(b.commit && !b.stop && !b.save);
    }

    #[test]
    fn processes_stop_if_any_saves_by_process_0_and_commit_when_all_have_written() {
        let groups = weft_runtime::ThreadGroup::new(3);
        let locals = [
            Local {
                save_due: Some(false),
                written: Some(true),
                time: StepTime { compute_ms: 1.0, wait_ms: 2.0 },
                ..Default::default()
            },
            Local {
                stop: true,
                save_due: Some(true),
                written: Some(true),
                time: StepTime { compute_ms: 3.0, wait_ms: 0.0 },
            },
            Local {
                save_due: Some(true),
                written: Some(false),
                time: StepTime { compute_ms: 2.0, wait_ms: 1.0 },
                ..Default::default()
            },
        ];
        let out: Vec<Boundary> = std::thread::scope(|s| {
            let handles: Vec<_> = groups
                .into_iter()
                .zip(locals)
                .map(|(g, l)| {
                    s.spawn(move || {
                        let g: Arc<dyn ProcessGroup> = Arc::new(g);
                        let p = Processes::join(g, std::time::Duration::from_secs(20)).unwrap();
                        agree(l, Some(&p)).unwrap()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for b in &out {
            assert!(b.stop, "process 1 was asked to stop");
            assert!(!b.save, "process 0's clock decides");
            assert!(!b.commit, "process 2 has not written");
            assert_eq!(b.times.iter().map(|t| t.compute_ms).collect::<Vec<_>>(), [1.0, 3.0, 2.0]);
        }
        assert_eq!(out[0], out[2]);
    }
}

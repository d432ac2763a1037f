//! Processes: one SPMD program run by several cooperating processes.
//!
//! A mesh of `n` devices can be spread over `P` processes (`mpirun -n P`):
//! process `p` owns the contiguous run of devices
//! [`devices_of_process`]`(n, P, p)` and runs them with an
//! [`crate::Executable`] built over those devices only. Collectives whose
//! groups cross a process boundary go through a [`ProcessGroup`]: the
//! transport between processes (MPI with the `mpi` feature, [`MpiGroup`];
//! threads in one process for tests, [`ThreadGroup`]). [`ProcessComm`] is
//! the [`crate::Communicator`] that joins the two: the devices of this
//! process meet in memory, and once all of them have contributed to a
//! step, one exchange with the other processes gives every process the
//! contributions of every member of its groups.
//!
//! Why exchange contributions rather than call MPI's reductions: the
//! result of a reduction is then folded here, left to right in rank order
//! with the interpreter's arithmetic ([`crate::collective::combine`]), so
//! a run on `P` processes is bitwise the run on one process. MPI's own
//! reductions choose their order by algorithm and message size.
//!
//! The fast mode ([`Reduction::Fast`], opt-in) trades that for speed: a
//! sum of `f32` or `f64` that crosses processes folds this process's
//! devices first (in rank order), then hands the partial sums to the
//! transport's own reduction (MPI's `MPI_Iallreduce` or
//! `MPI_Ireduce_scatter(_block)` with `MPI_SUM`), whose order is MPI's
//! choice: not bitwise the one-process run, nor reproducible from one
//! process count, message size or MPI version to another. See
//! [`Reduction`] for what it still guarantees.
//!
//! Why point-to-point with a deadline rather than blocking collectives: a
//! process that died or hangs must not hang the others. Every receive is
//! polled against a deadline; the error names the process (and so the
//! devices) that never sent, and the step and collective being waited in.
//!
//! Ordering: every process runs the same program, so exchanges happen in
//! the same order everywhere (step by step) and each pair of processes
//! matches messages by tag; a process exchanges only once every one of its
//! devices has contributed, which needs no more than every worker reaching
//! the step (a worker contributes for all its devices before it receives).

mod comm;
mod direct;
mod fast;
mod hosts;
#[cfg(feature = "mpi")]
mod mpi;
mod threads;
mod timed;

pub use comm::{Background, ProcessComm, COLLECTIVE_TAGS};
pub use fast::{NativeType, Reduction};
pub use hosts::{this_host_name, Hosts};
#[cfg(feature = "mpi")]
pub use mpi::{MpiGroup, MpiSession};
pub use threads::ThreadGroup;
pub use timed::TimedGroup;

use crate::error::RuntimeError;
use std::time::Duration;

/// First tag of control messages (barriers, gathers); collective
/// exchanges use tags below it (two per step).
const CONTROL_TAG: u32 = 30_000;

/// How processes exchange bytes: the transport under [`ProcessComm`] and
/// the checkpoint and start-up protocols.
pub trait ProcessGroup: Send + Sync {
    /// This process's rank, `0..size`.
    fn rank(&self) -> usize;

    /// The number of processes.
    fn size(&self) -> usize;

    /// The name of the host this process runs on: processes with the same
    /// name share a machine and its devices ([`Hosts`]). By default the
    /// machine's host name ([`this_host_name`]).
    fn host_name(&self) -> String {
        this_host_name()
    }

    /// Sends each `(peer, bytes)` of `sends` as one message and receives
    /// into each `(peer, buffer)` of `receives` one message of exactly the
    /// buffer's length, all with `tag`. Messages between two processes
    /// match in the order they are listed on each side (MPI's
    /// non-overtaking order), so one exchange may carry several segments
    /// per peer, each straight from or into tensor memory. Waits at most
    /// `timeout`; `what` names the exchange in the error
    /// ([`RuntimeError::ProcessTimeout`], naming the peers that never
    /// sent).
    ///
    /// # Safety
    ///
    /// On an error, requests may still be in flight (a peer that never
    /// answered): the transport may go on reading `sends` and writing
    /// `receives`. The caller must then neither free nor reuse any of
    /// those buffers, but leak them (the job is stopping).
    unsafe fn exchange_into(
        &self,
        tag: u32,
        sends: &[(usize, &[u8])],
        receives: &mut [(usize, &mut [u8])],
        timeout: Duration,
        what: &str,
    ) -> Result<(), RuntimeError>;

    /// [`ProcessGroup::exchange_into`] with owned messages: sends each
    /// `(peer, bytes)` of `sends` and receives from each `(peer, len)` of
    /// `receives` a message of `len` bytes; returns the received messages
    /// in the order of `receives`.
    fn exchange(
        &self,
        tag: u32,
        sends: Vec<(usize, Vec<u8>)>,
        receives: &[(usize, usize)],
        timeout: Duration,
        what: &str,
    ) -> Result<Vec<Vec<u8>>, RuntimeError> {
        let mut bufs: Vec<Vec<u8>> = receives.iter().map(|&(_, len)| vec![0u8; len]).collect();
        let done = {
            let out: Vec<(usize, &[u8])> = sends.iter().map(|(q, b)| (*q, &b[..])).collect();
            let mut into: Vec<(usize, &mut [u8])> =
                receives.iter().zip(bufs.iter_mut()).map(|(&(q, _), b)| (q, &mut b[..])).collect();
            // SAFETY: on an error both the sent and the receive buffers are
            // leaked below.
            unsafe { self.exchange_into(tag, &out, &mut into, timeout, what) }
        };
        match done {
            Ok(()) => Ok(bufs),
            Err(e) => {
                std::mem::forget(bufs);
                std::mem::forget(sends);
                Err(e)
            }
        }
    }

    /// Sums `send` element by element over the processes `processes`
    /// (ascending ranks, this one among them) and leaves the sum in `recv`
    /// (as long as `send`), on every one of them: the transport's own
    /// all-reduce ([`Reduction::Fast`]), in an order of its choosing. Every
    /// process of `processes` makes the same calls in the same order (a
    /// collective over them); `tag` is free for the transport's messages.
    /// The default exchanges the partial sums point to point and adds them
    /// in rank order (for transports without a reduction of their own:
    /// [`ThreadGroup`]).
    ///
    /// # Safety
    ///
    /// As [`ProcessGroup::exchange_into`]: on an error the caller leaks
    /// `send` and `recv`.
    #[allow(clippy::too_many_arguments)]
    unsafe fn sum_all_into(
        &self,
        tag: u32,
        processes: &[usize],
        ty: NativeType,
        send: &[u8],
        recv: &mut [u8],
        timeout: Duration,
        what: &str,
    ) -> Result<(), RuntimeError> {
        let me = self.rank();
        let peers: Vec<usize> = processes.iter().copied().filter(|&q| q != me).collect();
        let sends: Vec<(usize, Vec<u8>)> = peers.iter().map(|&q| (q, send.to_vec())).collect();
        let receives: Vec<(usize, usize)> = peers.iter().map(|&q| (q, send.len())).collect();
        let mut got = self.exchange(tag, sends, &receives, timeout, what)?.into_iter();
        let parts: Vec<Vec<u8>> = processes
            .iter()
            .map(|&q| if q == me { send.to_vec() } else { got.next().expect("one per peer") })
            .collect();
        fast::sum_bytes_in_order(ty, &parts, recv);
        Ok(())
    }

    /// A reduce-scatter of sums over the processes `processes` (ascending
    /// ranks, this one among them): `send` holds `counts[i]` elements for
    /// the `i`-th process of `processes`, one after the other; each
    /// process gets the sum over all of its own segment in `recv`
    /// (`counts[i]` elements). As [`ProcessGroup::sum_all_into`]
    /// otherwise: the transport's own reduction, a collective over
    /// `processes`, by default sums in rank order.
    ///
    /// # Safety
    ///
    /// As [`ProcessGroup::exchange_into`]: on an error the caller leaks
    /// `send` and `recv`.
    #[allow(clippy::too_many_arguments)]
    unsafe fn sum_scatter_into(
        &self,
        tag: u32,
        processes: &[usize],
        ty: NativeType,
        send: &[u8],
        counts: &[usize],
        recv: &mut [u8],
        timeout: Duration,
        what: &str,
    ) -> Result<(), RuntimeError> {
        let me = self.rank();
        let size = ty.size_bytes();
        let mut segments = Vec::with_capacity(processes.len());
        let mut at = 0;
        for &c in counts {
            segments.push(&send[at..at + c * size]);
            at += c * size;
        }
        let mine = processes.iter().position(|&q| q == me).expect("this process is among `processes`");
        let sends: Vec<(usize, Vec<u8>)> =
            processes.iter().zip(&segments).filter(|(&q, _)| q != me).map(|(&q, seg)| (q, seg.to_vec())).collect();
        let receives: Vec<(usize, usize)> =
            processes.iter().filter(|&&q| q != me).map(|&q| (q, segments[mine].len())).collect();
        let mut got = self.exchange(tag, sends, &receives, timeout, what)?.into_iter();
        let parts: Vec<Vec<u8>> = processes
            .iter()
            .map(|&q| if q == me { segments[mine].to_vec() } else { got.next().expect("one per peer") })
            .collect();
        fast::sum_bytes_in_order(ty, &parts, recv);
        Ok(())
    }

    /// Stops every process of the job now (after an error on this one), so
    /// that none is left behind waiting. Returns only if the transport
    /// cannot do that (then the caller exits with its own error).
    fn abort_all(&self, code: i32);

    /// Every process's `bytes`, in rank order (sizes may differ).
    fn all_gather(&self, bytes: &[u8], timeout: Duration, what: &str) -> Result<Vec<Vec<u8>>, RuntimeError> {
        let me = self.rank();
        let peers: Vec<usize> = (0..self.size()).filter(|&q| q != me).collect();
        let len = (bytes.len() as u64).to_le_bytes().to_vec();
        let sends: Vec<(usize, Vec<u8>)> = peers.iter().map(|&q| (q, len.clone())).collect();
        let receives: Vec<(usize, usize)> = peers.iter().map(|&q| (q, 8)).collect();
        let lens = self.exchange(CONTROL_TAG, sends, &receives, timeout, what)?;
        let sends: Vec<(usize, Vec<u8>)> = peers.iter().map(|&q| (q, bytes.to_vec())).collect();
        let receives: Vec<(usize, usize)> = peers
            .iter()
            .zip(&lens)
            .map(|(&q, l)| (q, u64::from_le_bytes(l[..8].try_into().expect("8 bytes")) as usize))
            .collect();
        let mut got = self.exchange(CONTROL_TAG + 1, sends, &receives, timeout, what)?.into_iter();
        Ok((0..self.size()).map(|q| if q == me { bytes.to_vec() } else { got.next().expect("one per peer") }).collect())
    }

    /// Waits until every process has reached the barrier `what`.
    fn barrier(&self, timeout: Duration, what: &str) -> Result<(), RuntimeError> {
        self.all_gather(&[], timeout, what).map(|_| ())
    }
}

/// The devices process `rank` of `processes` owns on a mesh of `devices`
/// devices: a contiguous run, as even as possible (the first
/// `devices % processes` processes own one more).
pub fn devices_of_process(devices: usize, processes: usize, rank: usize) -> std::ops::Range<usize> {
    rank * devices / processes..(rank + 1) * devices / processes
}

/// The process owning each device of a mesh of `devices` devices.
pub fn device_owners(devices: usize, processes: usize) -> Vec<usize> {
    let mut owner = vec![0; devices];
    for p in 0..processes {
        for d in devices_of_process(devices, processes, p) {
            owner[d] = p;
        }
    }
    owner
}

/// Checks that `processes` processes can share a mesh of `devices`
/// devices: every process must own at least one.
pub fn check_process_count(devices: usize, processes: usize) -> Result<(), RuntimeError> {
    if processes == 0 || processes > devices {
        return Err(RuntimeError::ProcessCount { devices, processes });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_are_dealt_in_contiguous_even_runs() {
        assert_eq!(devices_of_process(8, 2, 0), 0..4);
        assert_eq!(devices_of_process(8, 2, 1), 4..8);
        assert_eq!(devices_of_process(8, 3, 0), 0..2);
        assert_eq!(devices_of_process(8, 3, 2), 5..8);
        assert_eq!(device_owners(4, 4), vec![0, 1, 2, 3]);
        assert_eq!(device_owners(4, 1), vec![0; 4]);
        assert!(check_process_count(4, 8).is_err());
        assert!(check_process_count(4, 4).is_ok());
    }
}

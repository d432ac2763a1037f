//! [`MpiGroup`]: the processes of an `mpirun`/`srun` job, on MPI (rsmpi).
//!
//! Exchanges are MPI's non-blocking point-to-point calls, polled against a
//! deadline (so a dead or hung rank is named instead of waited for
//! forever), on `MPI_COMM_WORLD`, with MPI initialised as
//! `MPI_THREAD_SERIALIZED`: the worker thread that completes a step makes
//! the exchange, and a lock makes sure no two threads call MPI at once.
//! The calls go through `mpi::ffi` because rsmpi's scoped requests abort
//! the process when a scope ends with a request pending, which is exactly
//! what a timeout leaves.

use super::ProcessGroup;
use crate::error::RuntimeError;
use mpi::ffi;
use mpi::raw::AsRaw;
use mpi::topology::Communicator as _;
use mpi::Threading;
use std::os::raw::{c_int, c_void};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Keeps MPI initialised; dropping it finalises MPI (after which no
/// [`MpiGroup`] may be used). Hold it until the end of `main`.
pub struct MpiSession {
    _universe: mpi::environment::Universe,
}

/// The world of an MPI job (module docs).
pub struct MpiGroup {
    comm: ffi::MPI_Comm,
    rank: usize,
    size: usize,
    /// Serialises MPI calls (`MPI_THREAD_SERIALIZED`).
    calls: Mutex<()>,
}

// SAFETY: `comm` is MPI_COMM_WORLD's handle, valid until MPI is finalised
// (the `MpiSession` outlives every use); MPI was initialised with
// MPI_THREAD_SERIALIZED and every call is made under `calls`.
unsafe impl Send for MpiGroup {}
unsafe impl Sync for MpiGroup {}

impl MpiGroup {
    /// Initialises MPI (`MPI_THREAD_SERIALIZED`) and returns the world.
    pub fn init() -> Result<(MpiGroup, MpiSession), RuntimeError> {
        let fail = |message: String| RuntimeError::Process { rank: 0, message };
        let (universe, provided) = mpi::initialize_with_threading(Threading::Serialized)
            .ok_or_else(|| fail("MPI was initialised twice".into()))?;
        if provided < Threading::Serialized {
            return Err(fail(format!(
                "the MPI library provides thread support {provided:?}; weft needs Serialized (rebuild MPI with thread support)"
            )));
        }
        let world = universe.world();
        let group = MpiGroup {
            comm: world.as_raw(),
            rank: world.rank() as usize,
            size: world.size() as usize,
            calls: Mutex::new(()),
        };
        Ok((group, MpiSession { _universe: universe }))
    }
}

/// One request in flight.
struct Pending {
    request: ffi::MPI_Request,
    peer: usize,
    receive: bool,
}

impl ProcessGroup for MpiGroup {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    unsafe fn exchange_into(
        &self,
        tag: u32,
        sends: &[(usize, &[u8])],
        receives: &mut [(usize, &mut [u8])],
        timeout: Duration,
        what: &str,
    ) -> Result<(), RuntimeError> {
        let err = |message: String| RuntimeError::Process { rank: self.rank, message: format!("{what}: {message}") };
        let count =
            |n: usize| c_int::try_from(n).map_err(|_| err(format!("a message of {n} bytes is over MPI's limit")));
        let _serial = self.calls.lock().unwrap_or_else(|p| p.into_inner());
        let mut pending: Vec<Pending> = Vec::with_capacity(sends.len() + receives.len());
        // SAFETY: the buffers outlive their requests: the requests complete
        // before this returns `Ok`, and on an error the caller leaks the
        // buffers (the contract of `exchange_into`).
        unsafe {
            for (peer, buf) in receives.iter_mut() {
                let mut request = std::mem::zeroed();
                let rc = ffi::MPI_Irecv(
                    buf.as_mut_ptr() as *mut c_void,
                    count(buf.len())?,
                    ffi::RSMPI_UINT8_T,
                    *peer as c_int,
                    tag as c_int,
                    self.comm,
                    &mut request,
                );
                if rc != 0 {
                    return Err(err(format!("MPI_Irecv from rank {peer} failed ({rc})")));
                }
                pending.push(Pending { request, peer: *peer, receive: true });
            }
            for &(peer, buf) in sends {
                let mut request = std::mem::zeroed();
                let rc = ffi::MPI_Isend(
                    buf.as_ptr() as *const c_void,
                    count(buf.len())?,
                    ffi::RSMPI_UINT8_T,
                    peer as c_int,
                    tag as c_int,
                    self.comm,
                    &mut request,
                );
                if rc != 0 {
                    return Err(err(format!("MPI_Isend to rank {peer} failed ({rc})")));
                }
                pending.push(Pending { request, peer, receive: false });
            }
        }
        let start = Instant::now();
        let mut spins = 0u32;
        while !pending.is_empty() {
            let mut k = 0;
            while k < pending.len() {
                let mut flag: c_int = 0;
                // SAFETY: the request is live (not yet completed).
                let rc = unsafe { ffi::MPI_Test(&mut pending[k].request, &mut flag, ffi::RSMPI_STATUS_IGNORE) };
                if rc != 0 {
                    return Err(err(format!("MPI_Test failed ({rc}) with rank {}", pending[k].peer)));
                }
                if flag != 0 {
                    pending.swap_remove(k);
                } else {
                    k += 1;
                }
            }
            if pending.is_empty() {
                break;
            }
            if start.elapsed() >= timeout {
                let mut missing: Vec<usize> = pending.iter().filter(|p| p.receive).map(|p| p.peer).collect();
                if missing.is_empty() {
                    // Only sends are left: the peers never posted their receives.
                    missing = pending.iter().map(|p| p.peer).collect();
                }
                missing.sort_unstable();
                missing.dedup();
                return Err(RuntimeError::ProcessTimeout {
                    rank: self.rank,
                    what: what.to_string(),
                    waited: timeout,
                    missing,
                });
            }
            // Spin briefly (a collective's partner is usually close behind),
            // then keep polling but yield the core at each round: processes
            // may outnumber cores, and a sleep would hold back MPI's progress
            // (a large message moves only while MPI_Test is being called).
            spins += 1;
            if spins < 100 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        Ok(())
    }

    fn abort_all(&self, code: i32) {
        // SAFETY: MPI is initialised; MPI_Abort does not return.
        unsafe {
            ffi::MPI_Abort(self.comm, code as c_int);
        }
    }
}

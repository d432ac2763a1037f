//! [`MpiGroup`]: the processes of an `mpirun`/`srun` job, on MPI (rsmpi).
//!
//! Exchanges are MPI's non-blocking point-to-point calls, polled against a
//! deadline (so a dead or hung rank is named instead of waited for
//! forever), on `MPI_COMM_WORLD`, with MPI initialised as
//! `MPI_THREAD_SERIALIZED`: the worker thread that completes a step makes
//! the exchange, and a lock makes sure no two threads call MPI at once.
//! A point-to-point exchange takes the lock to post its requests and then
//! for each round of polling, not for its whole wait, so that exchanges of
//! several threads (a pipeline's stages, each waiting for its neighbour)
//! progress side by side. The fast mode's collectives (below) still hold
//! it for their whole wait; pipelines over processes do not use that mode.
//! A received message's length is checked against its buffer.
//! The calls go through `mpi::ffi` because rsmpi's scoped requests abort
//! the process when a scope ends with a request pending, which is exactly
//! what a timeout leaves.
//!
//! The fast reduction mode ([`super::Reduction::Fast`]) uses MPI's own
//! non-blocking reductions (`MPI_Iallreduce`, `MPI_Ireduce_scatter_block`
//! or `MPI_Ireduce_scatter` with `MPI_SUM`), polled against the same
//! deadline, on a communicator per set of processes: `MPI_COMM_WORLD` for
//! all of them, else one made by `MPI_Comm_create_group` on first use and
//! kept until MPI is finalised. That call is collective over the set and
//! blocking, with no deadline of its own, so the members first meet in a
//! rendezvous of non-blocking messages polled against the collective
//! deadline: a member that is dead or hung is named there, and the
//! blocking call is only made once every member has arrived at it. The
//! non-blocking calls may use other algorithms than the blocking ones;
//! both are MPI's choice of order.

use super::{NativeType, ProcessGroup};
use crate::error::RuntimeError;
use mpi::ffi;
use mpi::raw::AsRaw;
use mpi::topology::Communicator as _;
use mpi::Threading;
use std::collections::BTreeMap;
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
    /// Serialises MPI calls (`MPI_THREAD_SERIALIZED`), and holds the
    /// communicators of the sets of processes the fast reductions have
    /// used (by their ascending world ranks).
    calls: Mutex<BTreeMap<Vec<usize>, ffi::MPI_Comm>>,
}

/// The tag of `MPI_Comm_create_group` (above the exchanges' and the
/// control messages' tags).
const CREATE_GROUP_TAG: c_int = 31_000;

/// The tag of the rendezvous before `MPI_Comm_create_group`.
const RENDEZVOUS_TAG: c_int = 31_001;

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
            calls: Mutex::new(BTreeMap::new()),
        };
        Ok((group, MpiSession { _universe: universe }))
    }
}

/// One request in flight.
struct Pending {
    request: ffi::MPI_Request,
    peer: usize,
    receive: bool,
    /// A receive's length, checked against what arrived (a shorter message
    /// is an error, not a buffer left partly unwritten).
    expect: Option<usize>,
}

impl ProcessGroup for MpiGroup {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    /// MPI's processor name (`MPI_Get_processor_name`: the host name with
    /// Open MPI and MPICH).
    fn host_name(&self) -> String {
        let _serial = self.calls.lock().unwrap_or_else(|p| p.into_inner());
        mpi::environment::processor_name().unwrap_or_else(|_| super::this_host_name())
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
                pending.push(Pending { request, peer: *peer, receive: true, expect: Some(buf.len()) });
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
                pending.push(Pending { request, peer, receive: false, expect: None });
            }
        }
        // Polled with `calls` taken per round, not held throughout: another
        // thread's exchange (a pipeline stage's, whose message this one may
        // be waiting for) must be able to post and poll meanwhile.
        drop(_serial);
        self.wait_all(pending, timeout, what, true, &|pending: &[Pending]| {
            let mut missing: Vec<usize> = pending.iter().filter(|p| p.receive).map(|p| p.peer).collect();
            if missing.is_empty() {
                // Only sends are left: the peers never posted their receives.
                missing = pending.iter().map(|p| p.peer).collect();
            }
            missing
        })
    }

    unsafe fn sum_all_into(
        &self,
        _tag: u32,
        processes: &[usize],
        ty: NativeType,
        send: &[u8],
        recv: &mut [u8],
        timeout: Duration,
        what: &str,
    ) -> Result<(), RuntimeError> {
        let err = |message: String| RuntimeError::Process { rank: self.rank, message: format!("{what}: {message}") };
        let count = c_int::try_from(send.len() / ty.size_bytes())
            .map_err(|_| err(format!("{} elements are over MPI's limit", send.len() / ty.size_bytes())))?;
        let mut comms = self.calls.lock().unwrap_or_else(|p| p.into_inner());
        // SAFETY: MPI is initialised and called under `calls`; the buffers
        // outlive the request (it completes before this returns `Ok`, and
        // on an error the caller leaks them).
        let request = unsafe {
            let comm = self.comm_of(&mut comms, processes, timeout, what)?;
            let mut request = std::mem::zeroed();
            let rc = ffi::MPI_Iallreduce(
                send.as_ptr() as *const c_void,
                recv.as_mut_ptr() as *mut c_void,
                count,
                datatype(ty),
                ffi::RSMPI_SUM,
                comm,
                &mut request,
            );
            if rc != 0 {
                return Err(err(format!("MPI_Iallreduce failed ({rc})")));
            }
            request
        };
        drop(comms);
        self.wait_collective(request, processes, timeout, what)
    }

    unsafe fn sum_scatter_into(
        &self,
        _tag: u32,
        processes: &[usize],
        ty: NativeType,
        send: &[u8],
        counts: &[usize],
        recv: &mut [u8],
        timeout: Duration,
        what: &str,
    ) -> Result<(), RuntimeError> {
        let err = |message: String| RuntimeError::Process { rank: self.rank, message: format!("{what}: {message}") };
        let counts: Vec<c_int> = counts
            .iter()
            .map(|&c| c_int::try_from(c).map_err(|_| err(format!("{c} elements are over MPI's limit"))))
            .collect::<Result<_, _>>()?;
        let mut comms = self.calls.lock().unwrap_or_else(|p| p.into_inner());
        // SAFETY: as `sum_all_into`; `counts` is leaked on an error too.
        let request = unsafe {
            let comm = self.comm_of(&mut comms, processes, timeout, what)?;
            let mut request = std::mem::zeroed();
            let (send, recv) = (send.as_ptr() as *const c_void, recv.as_mut_ptr() as *mut c_void);
            let rc = if counts.iter().all(|&c| c == counts[0]) {
                ffi::MPI_Ireduce_scatter_block(send, recv, counts[0], datatype(ty), ffi::RSMPI_SUM, comm, &mut request)
            } else {
                ffi::MPI_Ireduce_scatter(send, recv, counts.as_ptr(), datatype(ty), ffi::RSMPI_SUM, comm, &mut request)
            };
            if rc != 0 {
                return Err(err(format!("MPI_Ireduce_scatter failed ({rc})")));
            }
            request
        };
        drop(comms);
        let done = self.wait_collective(request, processes, timeout, what);
        if done.is_err() {
            // The request may still read the counts.
            std::mem::forget(counts);
        }
        done
    }

    fn abort_all(&self, code: i32) {
        // Other threads may be polling (a pipeline's senders, a background
        // exchange): take the lock between their rounds to keep MPI calls
        // serialised, but abort anyway if a wait holds it for long (a fast
        // collective holds it for its whole wait).
        let deadline = Instant::now() + Duration::from_secs(2);
        let _serial = loop {
            match self.calls.try_lock() {
                Ok(g) => break Some(g),
                Err(std::sync::TryLockError::Poisoned(p)) => break Some(p.into_inner()),
                Err(std::sync::TryLockError::WouldBlock) if Instant::now() < deadline => std::thread::yield_now(),
                Err(std::sync::TryLockError::WouldBlock) => break None,
            }
        };
        // SAFETY: MPI is initialised; MPI_Abort does not return.
        unsafe {
            ffi::MPI_Abort(self.comm, code as c_int);
        }
    }
}

/// MPI's type for `ty`.
fn datatype(ty: NativeType) -> ffi::MPI_Datatype {
    // SAFETY: the predefined types are constants once MPI is initialised.
    unsafe {
        match ty {
            NativeType::F32 => ffi::RSMPI_FLOAT,
            NativeType::F64 => ffi::RSMPI_DOUBLE,
        }
    }
}

impl MpiGroup {
    /// The communicator of `processes` (ascending world ranks, this one
    /// among them): the world's when they are all of them, else one made
    /// on first use and kept in `comms`. Creating one is collective over
    /// `processes`: the members meet first in [`MpiGroup::rendezvous`]
    /// (so a missing one is named within `timeout`), then make it.
    ///
    /// # Safety
    ///
    /// MPI is initialised and the caller holds `calls` (whose content
    /// `comms` is).
    unsafe fn comm_of(
        &self,
        comms: &mut BTreeMap<Vec<usize>, ffi::MPI_Comm>,
        processes: &[usize],
        timeout: Duration,
        what: &str,
    ) -> Result<ffi::MPI_Comm, RuntimeError> {
        if processes.len() == self.size {
            return Ok(self.comm);
        }
        if let Some(&c) = comms.get(processes) {
            return Ok(c);
        }
        let what = format!("{what} (making the communicator of processes {processes:?})");
        let err = |message: String| RuntimeError::Process { rank: self.rank, message: format!("{what}: {message}") };
        self.rendezvous(processes, timeout, &what)?;
        let ranks: Vec<c_int> = processes.iter().map(|&p| p as c_int).collect();
        // SAFETY: the caller's contract; the handles are freed once used.
        unsafe {
            let (mut world, mut sub, mut comm) = (std::mem::zeroed(), std::mem::zeroed(), std::mem::zeroed());
            if ffi::MPI_Comm_group(self.comm, &mut world) != 0
                || ffi::MPI_Group_incl(world, ranks.len() as c_int, ranks.as_ptr(), &mut sub) != 0
            {
                return Err(err("cannot make the MPI group".into()));
            }
            let rc = ffi::MPI_Comm_create_group(self.comm, sub, CREATE_GROUP_TAG, &mut comm);
            ffi::MPI_Group_free(&mut sub);
            ffi::MPI_Group_free(&mut world);
            if rc != 0 {
                return Err(err(format!("MPI_Comm_create_group failed ({rc})")));
            }
            comms.insert(processes.to_vec(), comm);
            Ok(comm)
        }
    }

    /// Returns once every other member of `processes` has called this too
    /// (each sends every other an empty message and waits for theirs),
    /// or names those that have not within `timeout`. Members call it in
    /// the same order (their collectives' order), and MPI delivers the
    /// messages of one sender and tag in order, so rendezvous for
    /// different sets do not mix. The caller holds `calls`.
    fn rendezvous(&self, processes: &[usize], timeout: Duration, what: &str) -> Result<(), RuntimeError> {
        let err = |message: String| RuntimeError::Process { rank: self.rank, message: format!("{what}: {message}") };
        let others: Vec<usize> = processes.iter().copied().filter(|&p| p != self.rank).collect();
        let mut pending = Vec::with_capacity(2 * others.len());
        // Zero-byte messages: the buffers are never read or written.
        let mut byte = [0u8; 1];
        for &peer in &others {
            // SAFETY: MPI is initialised and the caller holds `calls`; a
            // zero-count request touches no buffer.
            unsafe {
                let (mut recv, mut send) = (std::mem::zeroed(), std::mem::zeroed());
                let buf = byte.as_mut_ptr() as *mut c_void;
                if ffi::MPI_Irecv(buf, 0, ffi::RSMPI_UINT8_T, peer as c_int, RENDEZVOUS_TAG, self.comm, &mut recv) != 0
                    || ffi::MPI_Isend(buf, 0, ffi::RSMPI_UINT8_T, peer as c_int, RENDEZVOUS_TAG, self.comm, &mut send)
                        != 0
                {
                    return Err(err(format!("posting the rendezvous with rank {peer} failed")));
                }
                pending.push(Pending { request: recv, peer, receive: true, expect: None });
                pending.push(Pending { request: send, peer, receive: false, expect: None });
            }
        }
        self.wait_all(pending, timeout, what, false, &|pending: &[Pending]| {
            pending.iter().filter(|p| p.receive).map(|p| p.peer).collect()
        })
    }

    /// Waits for a collective request over `processes` (naming all the
    /// others on a timeout: a collective does not tell which one is late).
    fn wait_collective(
        &self,
        request: ffi::MPI_Request,
        processes: &[usize],
        timeout: Duration,
        what: &str,
    ) -> Result<(), RuntimeError> {
        let others: Vec<usize> = processes.iter().copied().filter(|&p| p != self.rank).collect();
        let peer = others.first().copied().unwrap_or(self.rank);
        let pending = vec![Pending { request, peer, receive: true, expect: None }];
        let _serial = self.calls.lock().unwrap_or_else(|p| p.into_inner());
        self.wait_all(pending, timeout, what, false, &|_| others.clone())
    }

    /// Polls `pending` until every request completes or `timeout` passes;
    /// then the error names the processes `missing` gives for the requests
    /// still pending. With `lock`, `calls` is taken for each round of tests
    /// and released between rounds; without, the caller holds it.
    fn wait_all(
        &self,
        mut pending: Vec<Pending>,
        timeout: Duration,
        what: &str,
        lock: bool,
        missing: &dyn Fn(&[Pending]) -> Vec<usize>,
    ) -> Result<(), RuntimeError> {
        let err = |message: String| RuntimeError::Process { rank: self.rank, message: format!("{what}: {message}") };
        let start = Instant::now();
        let mut spins = 0u32;
        while !pending.is_empty() {
            let _serial = lock.then(|| self.calls.lock().unwrap_or_else(|p| p.into_inner()));
            let mut k = 0;
            while k < pending.len() {
                let mut flag: c_int = 0;
                // SAFETY: the request is live (not yet completed); the
                // status is written by MPI_Test and read only once it has.
                let mut status: ffi::MPI_Status = unsafe { std::mem::zeroed() };
                let rc = unsafe { ffi::MPI_Test(&mut pending[k].request, &mut flag, &mut status) };
                if rc != 0 {
                    return Err(err(format!("MPI_Test failed ({rc}) with rank {}", pending[k].peer)));
                }
                if flag != 0 {
                    if let Some(want) = pending[k].expect {
                        let mut got: c_int = 0;
                        // SAFETY: the status of a completed receive.
                        unsafe { ffi::MPI_Get_count(&status, ffi::RSMPI_UINT8_T, &mut got) };
                        if got as usize != want {
                            let peer = pending[k].peer;
                            return Err(err(format!("rank {peer} sent {got} bytes where {want} were expected")));
                        }
                    }
                    pending.swap_remove(k);
                } else {
                    k += 1;
                }
            }
            drop(_serial);
            if pending.is_empty() {
                break;
            }
            if start.elapsed() >= timeout {
                let mut missing = missing(&pending);
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
}

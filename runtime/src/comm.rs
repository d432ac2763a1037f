//! The communicator interface: how device workers meet at a collective.
//!
//! An [`crate::Executable`] runs one worker per device. When a worker
//! reaches a collective step it hands its contribution to a
//! [`Communicator`] and blocks until it gets back what it receives. The
//! executor knows nothing else about communication, so an in-process
//! implementation ([`InProcessComm`]: shared memory, one rendezvous per
//! collective) and a multi-process one (MPI; NCCL on CUDA) are
//! interchangeable behind the trait.
//!
//! Determinism: [`InProcessComm`] computes a small all-reduce once, when
//! the last member of the group arrives, with
//! [`crate::collective::combine`]; a large `f32` one is folded by its
//! receiving members together, a chunk each (`SharedFold`); for a
//! gather, an all-to-all or a reduce-scatter each member builds its
//! own result from the shared contributions when it receives
//! ([`crate::collective::member_result`]: only its part of the work, on
//! its own thread, so a group's copies run on every worker instead of all
//! on the last to arrive). Either way reductions fold the contributions
//! left to right in rank order with the interpreter's arithmetic: a result
//! depends only on the contributions, never on which thread arrived first
//! or did the work, and is bit for bit what the single-threaded executor
//! and the reference simulator compute.
//!
//! Failure: a worker whose step fails calls [`Communicator::abort`]; every
//! worker waiting in (or later entering) a collective returns
//! [`RuntimeError::Aborted`] instead of waiting for a member that will never
//! come. A wait longer than the communicator's timeout is
//! [`RuntimeError::CollectiveTimeout`], naming the collective and the
//! members that never arrived: never an indefinite hang.

use crate::collective::{combine, member_result, permute};
use crate::error::RuntimeError;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, RwLock};
use std::time::{Duration, Instant};
use weft_ir::device::collective::{f32_foldable, fold_f32_range};
use weft_ir::device::Collective;
use weft_ir::tensor::HostTensor;

/// One collective as one member sees it.
#[derive(Clone, Copy, Debug)]
pub struct CollectiveCall<'a> {
    /// The step of the device program (the same on every member).
    pub step: usize,
    /// The collective.
    pub op: &'a Collective,
    /// The group's devices in rank order (for `collective_permute`, every
    /// device of the mesh in device order).
    pub group: &'a [usize],
    /// This member's rank in `group`.
    pub rank: usize,
}

impl CollectiveCall<'_> {
    /// The device making the call.
    pub fn device(&self) -> usize {
        self.group[self.rank]
    }

    /// [`RuntimeError::Aborted`] for this call: `failed` is the failing
    /// device and its error.
    pub(crate) fn aborted(&self, failed: &(usize, String)) -> RuntimeError {
        RuntimeError::Aborted {
            device: self.device(),
            step: self.step,
            collective: self.op.name().to_string(),
            failed_device: failed.0,
            reason: failed.1.clone(),
        }
    }

    /// [`RuntimeError::CollectiveTimeout`] for this call after `waited`,
    /// for the devices `missing` that never contributed.
    pub(crate) fn timed_out(&self, waited: Duration, missing: Vec<usize>) -> RuntimeError {
        RuntimeError::CollectiveTimeout {
            device: self.device(),
            step: self.step,
            collective: self.op.name().to_string(),
            waited,
            missing,
        }
    }
}

/// Exchanges host-staged contributions between the members of a collective.
///
/// The exchange is split in two phases so that one thread can drive several
/// devices (a worker *lane*): it contributes for each of its devices, then
/// receives for each. Neither phase's result depends on the order in which
/// members arrive.
pub trait Communicator: Send + Sync {
    /// Contributes `input` to `call` as member `call.rank` (does not wait).
    fn contribute(&self, call: CollectiveCall<'_>, input: HostTensor) -> Result<(), RuntimeError>;

    /// What member `call.rank` receives from `call` (waits for the group).
    fn receive(&self, call: CollectiveCall<'_>) -> Result<HostTensor, RuntimeError>;

    /// [`Communicator::contribute`], then [`Communicator::receive`].
    fn collective(&self, call: CollectiveCall<'_>, input: HostTensor) -> Result<HostTensor, RuntimeError> {
        self.contribute(call, input)?;
        self.receive(call)
    }

    /// Wakes every member waiting in a collective (now or later) with
    /// [`RuntimeError::Aborted`]: `device` failed with `reason`.
    fn abort(&self, device: usize, reason: String);

    /// Clears an abort and any half-finished collective so that the
    /// communicator can be used again (between runs, once every worker has
    /// stopped).
    fn reset(&self);
}

/// A collective in flight: contributions so far, then what the members
/// receive.
struct Rendezvous {
    contributions: Vec<Option<HostTensor>>,
    arrived: usize,
    results: Option<Results>,
    taken: usize,
}

/// What a complete collective's members receive.
enum Results {
    /// Computed once for the group (an all-reduce, a permute): each
    /// member takes its own.
    Computed(Vec<Option<HostTensor>>),
    /// Every contribution, in rank order: each member builds its own
    /// result from them ([`member_result`]).
    Shared(Arc<Vec<HostTensor>>),
    /// A large `f32` all-reduce folded by its members together, a chunk
    /// each as they come ([`SharedFold`]).
    Folded(Arc<SharedFold>),
}

/// What one member takes from a complete collective: its result, or
/// what it builds its result from.
enum Mine {
    Ready(HostTensor),
    Build(Arc<Vec<HostTensor>>),
    Fold(Arc<SharedFold>),
}

/// Elements per chunk of a [`SharedFold`] (256 KiB of `f32`).
const FOLD_CHUNK: usize = 1 << 16;

/// An `f32` all-reduce whose fold the members share: each receiving member
/// claims chunks of the elements not yet claimed and folds them (in rank
/// order: [`fold_f32_range`], the bits of the whole fold), then waits for
/// the chunks others claimed and copies the sum into its own
/// contribution's storage, which it takes back (no result is allocated;
/// nothing reads the contributions once every chunk is folded). A claimed
/// chunk is folded at once by the thread that claimed it, so the wait
/// never depends on a member that has not arrived (a worker lane receives
/// for its devices one after another): the last fold is finished by
/// threads that are running. The work of the last member to arrive is
/// spread over every worker.
struct SharedFold {
    /// The contributions in rank order; read while folding, each taken
    /// back by its member once every chunk is folded.
    blocks: RwLock<Vec<Option<HostTensor>>>,
    op: weft_ir::ReduceOp,
    len: usize,
    next: AtomicUsize,
    sums: Vec<OnceLock<Vec<f32>>>,
    /// Chunks folded, and whether a folding thread failed (panicked).
    progress: Mutex<(usize, bool)>,
    finished: Condvar,
}

/// Marks a claimed chunk's fold as failed unless it completes, so that
/// the members waiting for it stop instead of waiting out the timeout.
struct FoldGuard<'a>(&'a SharedFold, bool);

impl Drop for FoldGuard<'_> {
    fn drop(&mut self) {
        let mut p = self.0.progress.lock().unwrap_or_else(|p| p.into_inner());
        if self.1 {
            p.0 += 1;
        } else {
            p.1 = true;
        }
        if p.0 == self.0.sums.len() || p.1 {
            self.0.finished.notify_all();
        }
    }
}

impl SharedFold {
    /// The fold of `blocks` shared by its members, if they are `f32`
    /// contributions of one shape in standard layout, large enough to
    /// split; else they are given back.
    fn new(blocks: Vec<HostTensor>, op: weft_ir::ReduceOp) -> Result<SharedFold, Vec<HostTensor>> {
        let len = blocks.first().map_or(0, |b| b.shape().iter().product::<usize>());
        if len < 2 * FOLD_CHUNK || !f32_foldable(&blocks) {
            return Err(blocks);
        }
        Ok(SharedFold {
            blocks: RwLock::new(blocks.into_iter().map(Some).collect()),
            op,
            len,
            next: AtomicUsize::new(0),
            sums: (0..len.div_ceil(FOLD_CHUNK)).map(|_| OnceLock::new()).collect(),
            progress: Mutex::new((0, false)),
            finished: Condvar::new(),
        })
    }

    /// Member `call.rank`'s result (folding what is left to fold).
    fn result(&self, call: &CollectiveCall<'_>, timeout: Duration) -> Result<HostTensor, RuntimeError> {
        let deadline = Instant::now() + timeout;
        let chunks = self.sums.len();
        loop {
            let c = self.next.fetch_add(1, Ordering::Relaxed);
            if c >= chunks {
                break;
            }
            let mut guard = FoldGuard(self, false);
            let range = c * FOLD_CHUNK..((c + 1) * FOLD_CHUNK).min(self.len);
            let sum = {
                let blocks = self.blocks.read().unwrap_or_else(|p| p.into_inner());
                // Nothing is taken back before every chunk is folded.
                let refs: Vec<&HostTensor> = blocks.iter().map(|b| b.as_ref().expect("folding")).collect();
                fold_f32_range(&refs, self.op, range)
            };
            let _ = self.sums[c].set(sum.expect("checked f32 blocks of one shape"));
            guard.1 = true;
        }
        let mut p = self.progress.lock().unwrap_or_else(|p| p.into_inner());
        while p.0 < chunks && !p.1 {
            let now = Instant::now();
            if now >= deadline {
                return Err(call.timed_out(timeout, Vec::new()));
            }
            p = self.finished.wait_timeout(p, deadline - now).unwrap_or_else(|p| p.into_inner()).0;
        }
        if p.1 {
            return Err(call.aborted(&(call.device(), "a member folding the all-reduce failed".into())));
        }
        drop(p);
        let mine = self.blocks.write().unwrap_or_else(|p| p.into_inner())[call.rank].take();
        let mut out = match mine {
            Some(HostTensor::F32(a)) => a,
            _ => unreachable!("each member takes back its own f32 contribution once"),
        };
        let dst = out.as_slice_mut().expect("standard layout");
        for (c, s) in self.sums.iter().enumerate() {
            let s = s.get().expect("every chunk is folded");
            dst[c * FOLD_CHUNK..c * FOLD_CHUNK + s.len()].copy_from_slice(s);
        }
        Ok(HostTensor::F32(out))
    }
}

/// Whether each member builds its own result of `op` from the shared
/// contributions (a part of the group's work each) rather than the last
/// member computing the group's (an all-reduce's fold, which every member
/// would otherwise repeat in full).
fn per_member(op: &Collective) -> bool {
    matches!(op, Collective::AllGather { .. } | Collective::AllToAll { .. } | Collective::ReduceScatter { .. })
}

#[derive(Default)]
struct Shared {
    /// Keyed by (step, first device of the group).
    open: HashMap<(usize, usize), Rendezvous>,
    /// Set by [`Communicator::abort`]: the failing device and its error.
    aborted: Option<(usize, String)>,
}

/// Devices of one process meeting in shared memory (one rendezvous per
/// collective and group).
pub struct InProcessComm {
    shared: Mutex<Shared>,
    changed: Condvar,
    timeout: Duration,
}

/// How long a member waits for the rest of its group by default.
pub const DEFAULT_COLLECTIVE_TIMEOUT: Duration = Duration::from_secs(600);

impl Default for InProcessComm {
    fn default() -> Self {
        InProcessComm::new(DEFAULT_COLLECTIVE_TIMEOUT)
    }
}

impl InProcessComm {
    /// A communicator whose members wait at most `timeout` for their group.
    pub fn new(timeout: Duration) -> InProcessComm {
        InProcessComm { shared: Mutex::new(Shared::default()), changed: Condvar::new(), timeout }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Shared> {
        // A worker that panicked while holding the lock leaves data that is
        // still consistent (every update is a single assignment).
        self.shared.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn results_of(call: &CollectiveCall<'_>, blocks: Vec<HostTensor>) -> Result<Vec<HostTensor>, RuntimeError> {
    match call.op {
        Collective::CollectivePermute { pairs } => Ok(permute(pairs, &blocks)),
        op => combine(op, blocks),
    }
}

fn aborted_error(s: &Shared, call: &CollectiveCall<'_>) -> Option<RuntimeError> {
    s.aborted.as_ref().map(|failed| call.aborted(failed))
}

impl Communicator for InProcessComm {
    fn contribute(&self, call: CollectiveCall<'_>, input: HostTensor) -> Result<(), RuntimeError> {
        let n = call.group.len();
        let key = (call.step, call.group[0]);
        let mut s = self.lock();
        if let Some(e) = aborted_error(&s, &call) {
            return Err(e);
        }
        let r = s.open.entry(key).or_insert_with(|| Rendezvous {
            contributions: (0..n).map(|_| None).collect(),
            arrived: 0,
            results: None,
            taken: 0,
        });
        r.contributions[call.rank] = Some(input);
        r.arrived += 1;
        if r.arrived < n {
            return Ok(());
        }
        let blocks: Vec<HostTensor> = r.contributions.iter_mut().map(|c| c.take().expect("every member")).collect();
        if per_member(call.op) {
            r.results = Some(Results::Shared(Arc::new(blocks)));
            self.changed.notify_all();
            return Ok(());
        }
        let blocks = match call.op {
            Collective::AllReduce { op, .. } => match SharedFold::new(blocks, *op) {
                Ok(fold) => {
                    r.results = Some(Results::Folded(Arc::new(fold)));
                    self.changed.notify_all();
                    return Ok(());
                }
                Err(blocks) => blocks,
            },
            _ => blocks,
        };
        // The last member computes the group's results once, outside the
        // lock: other groups' members keep contributing and receiving
        // meanwhile, and this group's members wait for `results`.
        drop(s);
        let res = results_of(&call, blocks);
        let mut s = self.lock();
        match res {
            Ok(res) => {
                let r = s.open.get_mut(&key).expect("a rendezvous stays open until its results are taken");
                r.results = Some(Results::Computed(res.into_iter().map(Some).collect()));
                self.changed.notify_all();
                Ok(())
            }
            Err(e) => {
                if s.aborted.is_none() {
                    s.aborted = Some((call.device(), e.to_string()));
                }
                self.changed.notify_all();
                Err(e.at_step(call.device(), call.step, call.op.name()))
            }
        }
    }

    fn receive(&self, call: CollectiveCall<'_>) -> Result<HostTensor, RuntimeError> {
        let n = call.group.len();
        let key = (call.step, call.group[0]);
        let deadline = Instant::now() + self.timeout;
        let mut s = self.lock();
        loop {
            if let Some(e) = aborted_error(&s, &call) {
                return Err(e);
            }
            let r = s.open.get_mut(&key).expect("a member receives only after it contributed");
            if let Some(results) = r.results.as_mut() {
                let mine = match results {
                    Results::Computed(results) => {
                        Mine::Ready(results[call.rank].take().expect("each member takes its result once"))
                    }
                    Results::Shared(blocks) => Mine::Build(Arc::clone(blocks)),
                    Results::Folded(fold) => Mine::Fold(Arc::clone(fold)),
                };
                r.taken += 1;
                if r.taken == n {
                    s.open.remove(&key);
                }
                // A member's own result is made outside the lock (the
                // contributions live while a member holds them).
                drop(s);
                return match mine {
                    Mine::Ready(out) => Ok(out),
                    Mine::Build(blocks) => member_result(call.op, &blocks, call.rank)
                        .map_err(|e| e.at_step(call.device(), call.step, call.op.name())),
                    Mine::Fold(fold) => fold.result(&call, self.timeout),
                };
            }
            let now = Instant::now();
            if now >= deadline {
                let missing: Vec<usize> = r
                    .contributions
                    .iter()
                    .enumerate()
                    .filter(|(_, c)| c.is_none())
                    .map(|(rank, _)| call.group[rank])
                    .collect();
                return Err(call.timed_out(self.timeout, missing));
            }
            s = self.changed.wait_timeout(s, deadline - now).unwrap_or_else(|p| p.into_inner()).0;
        }
    }

    fn abort(&self, device: usize, reason: String) {
        let mut s = self.lock();
        if s.aborted.is_none() {
            s.aborted = Some((device, reason));
        }
        self.changed.notify_all();
    }

    fn reset(&self) {
        let mut s = self.lock();
        s.aborted = None;
        s.open.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weft_ir::ReduceOp;

    fn t(v: f32) -> HostTensor {
        HostTensor::from_f32(&[2], vec![v, v * 2.0]).unwrap()
    }

    #[test]
    fn members_on_threads_get_the_rank_order_sum() {
        let comm = InProcessComm::default();
        let op = Collective::AllReduce { axes: vec!["x".into()], op: ReduceOp::Sum };
        let group = [0usize, 1, 2, 3];
        let outs: Vec<HostTensor> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..4)
                .map(|rank| {
                    let (comm, op, group) = (&comm, &op, &group);
                    s.spawn(move || {
                        comm.collective(CollectiveCall { step: 3, op, group, rank }, t(rank as f32 + 0.1)).unwrap()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let expect = combine(&op, vec![t(0.1), t(1.1), t(2.1), t(3.1)]).unwrap();
        for o in &outs {
            assert!(o.bitwise_eq(&expect[0]));
        }
        assert!(comm.lock().open.is_empty(), "the rendezvous is closed once every member took its result");
    }

    #[test]
    fn a_large_all_reduce_folded_by_its_members_has_the_bits_of_the_fold() {
        // Big enough to be folded in chunks by the members (3 chunks and
        // a part), by two threads that each drive two members, as worker
        // lanes do: contribute for both, then receive for each.
        let len = 3 * FOLD_CHUNK + 5;
        let big = |rank: usize| {
            let v: Vec<f32> =
                (0..len).map(|i| ((i * 7 + rank * 13) % 101) as f32 * 0.013 - 0.6 + rank as f32 * 1e-7).collect();
            HostTensor::from_f32(&[len], v).unwrap()
        };
        for op in [ReduceOp::Sum, ReduceOp::Max] {
            let comm = InProcessComm::default();
            let coll = Collective::AllReduce { axes: vec!["x".into()], op };
            let group = [0usize, 1, 2, 3];
            let outs: Vec<HostTensor> = std::thread::scope(|s| {
                let hs: Vec<_> = [[0usize, 1], [2, 3]]
                    .into_iter()
                    .map(|ranks| {
                        let (comm, coll, group) = (&comm, &coll, &group);
                        s.spawn(move || {
                            let call = |rank| CollectiveCall { step: 1, op: coll, group, rank };
                            for r in ranks {
                                comm.contribute(call(r), big(r)).unwrap();
                            }
                            ranks.map(|r| comm.receive(call(r)).unwrap())
                        })
                    })
                    .collect();
                hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
            });
            let expect = combine(&coll, (0..4).map(big).collect()).unwrap();
            for (r, o) in outs.iter().enumerate() {
                assert!(o.bitwise_eq(&expect[r]), "{op:?}: member {r}");
            }
            assert!(comm.lock().open.is_empty());
        }
    }

    #[test]
    fn an_abort_wakes_a_waiting_member() {
        let comm = InProcessComm::default();
        let op = Collective::AllReduce { axes: vec!["x".into()], op: ReduceOp::Sum };
        let group = [0usize, 1];
        let err = std::thread::scope(|s| {
            let h = s.spawn(|| comm.collective(CollectiveCall { step: 0, op: &op, group: &group, rank: 0 }, t(1.0)));
            std::thread::sleep(Duration::from_millis(20));
            comm.abort(1, "backend error".into());
            h.join().unwrap().unwrap_err()
        });
        assert!(matches!(err, RuntimeError::Aborted { failed_device: 1, .. }), "{err}");
        comm.reset();
        assert!(comm.lock().aborted.is_none());
    }

    #[test]
    fn a_missing_member_times_out_with_its_name() {
        let comm = InProcessComm::new(Duration::from_millis(30));
        let op = Collective::AllGather { dim: 0, axes: vec!["x".into()] };
        let group = [4usize, 5];
        let err = comm.collective(CollectiveCall { step: 7, op: &op, group: &group, rank: 0 }, t(1.0)).unwrap_err();
        match err {
            RuntimeError::CollectiveTimeout { device: 4, step: 7, missing, .. } => assert_eq!(missing, vec![5]),
            e => panic!("unexpected {e}"),
        }
    }
}

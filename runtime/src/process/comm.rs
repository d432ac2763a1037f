//! [`ProcessComm`]: the communicator of one process of a multi-process run.
//!
//! This process's devices contribute to a step in memory. Once the last one
//! has arrived, the step's one exchange with the other processes is made
//! (each peer gets the contributions of this process's devices that share
//! a group with its devices, in ascending device order, and sends the same
//! back), then every local group's result is computed with the same
//! rank-order fold as [`crate::InProcessComm`], and the waiting devices
//! are woken. See the [module docs](super) for why.
//!
//! Several collectives may be in flight (started, [`weft_ir::device::Step::Start`],
//! and not yet done): steps whose contributions are complete queue up and
//! are exchanged one at a time, in the order they completed, which is
//! program order on every process (every device contributes in program
//! order), so the exchanges of all processes match. By default the thread
//! that completes a step makes the queued exchanges itself; with
//! [`ProcessComm::in_background`] a thread of the communicator's own
//! makes them, so that a device's compute goes on while its collectives
//! cross to the other processes.

use super::{ProcessGroup, Reduction};
use crate::collective::{block, combine, combine_pieces, split_dim};
use crate::comm::{CollectiveCall, Communicator};
use crate::error::RuntimeError;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};
use weft_ir::device::Collective;
use weft_ir::tensor::{tensor_bytes, BlockBuf, HostTensor};

/// One local device's contribution to the current step.
pub(super) struct Contribution {
    pub(super) op: Collective,
    pub(super) group: Vec<usize>,
    pub(super) input: HostTensor,
}

#[derive(Default)]
struct State {
    /// Steps being collected and their contributions so far, by device.
    collecting: BTreeMap<usize, BTreeMap<usize, Contribution>>,
    /// Steps whose contributions are complete, in the order they completed
    /// (program order), waiting for their exchange.
    ready: std::collections::VecDeque<(usize, BTreeMap<usize, Contribution>)>,
    /// Results not yet received, by (step, device).
    results: HashMap<(usize, usize), HostTensor>,
    /// The failing device and its error.
    aborted: Option<(usize, String)>,
    /// An exchange with the other processes is in flight (it has its own
    /// deadline, and ends in results or an abort).
    exchanging: bool,
    /// The background exchanger is asked to stop.
    closing: bool,
    /// The background exchanger's failure, for the first device waiting
    /// (the others are told of it as an abort).
    failed: Option<RuntimeError>,
}

/// The communicator of one process of a multi-process run (module docs).
pub struct ProcessComm {
    pub(super) group: std::sync::Arc<dyn ProcessGroup>,
    /// The process owning each device of the mesh.
    pub(super) owner: Vec<usize>,
    /// How many devices this process owns.
    local: usize,
    pub(super) timeout: Duration,
    state: Mutex<State>,
    changed: Condvar,
    /// Receive space reused from step to step (only the thread completing
    /// a step uses it).
    pub(super) scratch: Mutex<Vec<f32>>,
    /// How sums across processes are combined ([`Reduction`]).
    pub(super) reduction: Reduction,
    /// Exchanges are made by a thread of the communicator's own
    /// ([`ProcessComm::in_background`]).
    background: bool,
    /// The first of its tags and how many ([`ProcessComm::with_tags`]).
    tags: (u32, u32),
}

impl ProcessComm {
    /// The communicator of process `group.rank()`, whose devices are those
    /// `owner` maps to it; every wait (for local devices or for other
    /// processes) lasts at most `timeout`.
    pub fn new(group: std::sync::Arc<dyn ProcessGroup>, owner: Vec<usize>, timeout: Duration) -> ProcessComm {
        let local = owner.iter().filter(|&&p| p == group.rank()).count();
        ProcessComm {
            group,
            owner,
            local,
            timeout,
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
            scratch: Mutex::new(Vec::new()),
            reduction: Reduction::Deterministic,
            background: false,
            tags: (0, COLLECTIVE_TAGS),
        }
    }

    /// This communicator with its messages tagged in `first..first + count`
    /// (`count` even, at least 2; all of `0..COLLECTIVE_TAGS` by default):
    /// communicators whose exchanges between the same processes may be in
    /// flight at once (the stages of a pipeline that share processes) take
    /// disjoint ranges, so that their messages never match each other's.
    pub fn with_tags(mut self, first: u32, count: u32) -> ProcessComm {
        assert!(
            count >= 2 && first + count <= COLLECTIVE_TAGS,
            "tags {first}..{} of 0..{COLLECTIVE_TAGS}",
            first + count
        );
        self.tags = (first, count);
        self
    }

    /// The message tag of `phase` (0 or 1) of `step`'s exchange.
    pub(super) fn tag(&self, step: usize, phase: usize) -> u32 {
        let (first, count) = self.tags;
        first + ((step % (count as usize / 2)) * 2 + phase) as u32
    }

    /// This communicator with its exchanges made by a thread of its own,
    /// so that the devices' compute goes on while started collectives
    /// cross to the other processes (the runner asks for it when the
    /// program starts collectives early). The thread ends when the
    /// returned communicator is dropped.
    pub fn in_background(mut self) -> Background {
        self.background = true;
        let comm = std::sync::Arc::new(self);
        let worker = comm.clone();
        let thread = std::thread::Builder::new()
            .name("weft-exchange".into())
            .spawn(move || worker.exchange_loop())
            .expect("spawning the exchange thread");
        Background { comm, thread: Some(thread) }
    }

    /// The background exchanger: every queued step, in order, until the
    /// communicator closes. After an abort queued steps are dropped (their
    /// devices are told by the abort).
    fn exchange_loop(&self) {
        let mut s = self.lock();
        loop {
            if s.aborted.is_some() {
                s.ready.clear();
            }
            match s.ready.pop_front() {
                Some((step, mine)) => {
                    let (next, done) = self.exchange(s, step, mine);
                    s = next;
                    if let Err(e) = done {
                        s.failed.get_or_insert(e);
                    }
                }
                None if s.closing => return,
                None => s = self.changed.wait(s).unwrap_or_else(|p| p.into_inner()),
            }
        }
    }

    /// Makes the exchange of `step` (with the lock released meanwhile),
    /// then records its results or its failure (also returned) and wakes
    /// the waiters.
    fn exchange<'a>(
        &'a self,
        mut s: std::sync::MutexGuard<'a, State>,
        step: usize,
        mine: BTreeMap<usize, Contribution>,
    ) -> (std::sync::MutexGuard<'a, State>, Result<(), RuntimeError>) {
        s.exchanging = true;
        drop(s);
        let first = *mine.keys().next().expect("a process owns at least one device");
        // A panic in the exchange must not leave `exchanging` set (every
        // later wait would hang): it fails the step instead.
        let done = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.complete(step, mine))).unwrap_or_else(
            |panic| {
                let why = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()));
                Err(RuntimeError::Process {
                    rank: self.group.rank(),
                    message: format!("the exchange of step {step} panicked: {}", why.unwrap_or_default()),
                })
            },
        );
        let mut s = self.lock();
        s.exchanging = false;
        let out = match done {
            Ok(results) => {
                s.results.extend(results.into_iter().map(|(d, t)| ((step, d), t)));
                Ok(())
            }
            Err(e) => {
                s.aborted.get_or_insert((first, e.to_string()));
                Err(e)
            }
        };
        self.changed.notify_all();
        (s, out)
    }

    /// This communicator with sums across processes combined in mode
    /// `reduction` (default [`Reduction::Deterministic`]). Every process
    /// of the job must pass the same mode.
    pub fn with_reduction(mut self, reduction: Reduction) -> ProcessComm {
        self.reduction = reduction;
        self
    }

    /// How sums across processes are combined.
    pub fn reduction(&self) -> Reduction {
        self.reduction
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Exchanges the step's contributions with the other processes and
    /// computes the local devices' results: by the transport's own sums in
    /// the fast mode ([`ProcessComm::fast`]), straight from and into tensor
    /// memory where the collective and the layout allow
    /// ([`ProcessComm::direct`]), else through byte messages.
    fn complete(
        &self,
        step: usize,
        mine: BTreeMap<usize, Contribution>,
    ) -> Result<HashMap<usize, HostTensor>, RuntimeError> {
        let mine = match self.fast(step, mine) {
            Ok(done) => return done,
            Err(mine) => mine,
        };
        let mine = match self.direct(step, mine) {
            Ok(done) => return done,
            Err(mine) => mine,
        };
        let first = mine.values().next().expect("a process owns at least one device");
        if let Some(dim) = split_dim(&first.op) {
            return self.complete_by_pieces(step, mine, dim);
        }
        if let Collective::AllReduce { op, .. } = first.op {
            if mine.values().any(|c| c.group.iter().any(|&d| self.owner[d] != self.group.rank())) {
                return self.complete_all_reduce(step, mine, op);
            }
        }
        let me = self.group.rank();
        let (op, ty) = (first.op.clone(), first.input.ty());
        let block_bytes = ty.size_bytes();
        // Which devices' contributions each peer needs from us, and which we
        // need from each peer.
        let mut send_to: BTreeMap<usize, BTreeSet<usize>> = BTreeMap::new();
        let mut recv_from: BTreeMap<usize, BTreeSet<usize>> = BTreeMap::new();
        match &op {
            Collective::CollectivePermute { pairs } => {
                for &(s, t) in pairs {
                    let (s, t) = (s as usize, t as usize);
                    let (ps, pt) = (self.owner[s], self.owner[t]);
                    if ps == me && pt != me {
                        send_to.entry(pt).or_default().insert(s);
                    }
                    if pt == me && ps != me {
                        recv_from.entry(ps).or_default().insert(s);
                    }
                }
            }
            _ => {
                for (&d, c) in &mine {
                    for &m in &c.group {
                        let p = self.owner[m];
                        if p != me {
                            send_to.entry(p).or_default().insert(d);
                            recv_from.entry(p).or_default().insert(m);
                        }
                    }
                }
            }
        }
        let mut remote: HashMap<usize, HostTensor> = HashMap::new();
        if !send_to.is_empty() || !recv_from.is_empty() {
            let sends: Vec<(usize, Vec<u8>)> = send_to
                .iter()
                .map(|(&p, devs)| {
                    let mut bytes = Vec::with_capacity(devs.len() * block_bytes);
                    for d in devs {
                        bytes.extend_from_slice(&tensor_bytes(&mine[d].input));
                    }
                    (p, bytes)
                })
                .collect();
            let receives: Vec<(usize, usize)> =
                recv_from.iter().map(|(&p, devs)| (p, devs.len() * block_bytes)).collect();
            let what = format!("step {step} (`{}`)", op.name());
            let got = self.group.exchange(self.tag(step, 0), sends, &receives, self.timeout, &what)?;
            for ((_, devs), bytes) in recv_from.iter().zip(got) {
                for (k, &d) in devs.iter().enumerate() {
                    remote.insert(d, tensor_from(&ty, &bytes[k * block_bytes..(k + 1) * block_bytes])?);
                }
            }
        }
        let mut inputs: HashMap<usize, HostTensor> = HashMap::with_capacity(mine.len());
        let mut groups: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for (d, c) in mine {
            groups.entry(c.group[0]).or_insert(c.group);
            inputs.insert(d, c.input);
        }
        let mut results = HashMap::with_capacity(inputs.len());
        match &op {
            Collective::CollectivePermute { pairs } => {
                let local: Vec<usize> = inputs.keys().copied().collect();
                let mut out: HashMap<usize, HostTensor> = local.iter().map(|&d| (d, HostTensor::zeros(&ty))).collect();
                for &(s, t) in pairs {
                    let (s, t) = (s as usize, t as usize);
                    if out.contains_key(&t) {
                        let block = inputs.get(&s).or_else(|| remote.get(&s)).expect("exchanged above");
                        out.insert(t, block.clone());
                    }
                }
                results = out;
            }
            _ => {
                for group in groups.into_values() {
                    let blocks: Vec<HostTensor> = group
                        .iter()
                        .map(|d| inputs.remove(d).or_else(|| remote.remove(d)).expect("every member's contribution"))
                        .collect();
                    for (d, r) in group.iter().zip(combine(&op, blocks)?) {
                        if self.owner[*d] == me {
                            results.insert(*d, r);
                        }
                    }
                }
            }
        }
        Ok(results)
    }
}

impl ProcessComm {
    /// [`ProcessComm::complete`] for a reduce-scatter or all-to-all, whose
    /// member of rank `r` needs only block `r` (along `dim`) of each
    /// contribution: each peer gets just the blocks its members need, so a
    /// process sends `(n - 1) / n` of its contributions rather than all of
    /// them to every peer. Messages hold, group by group (by first
    /// device), for each sending member and then each receiving member
    /// (both by ascending device), one block.
    fn complete_by_pieces(
        &self,
        step: usize,
        mine: BTreeMap<usize, Contribution>,
        dim: usize,
    ) -> Result<HashMap<usize, HostTensor>, RuntimeError> {
        let me = self.group.rank();
        let op = mine.values().next().expect("a process owns at least one device").op.clone();
        let groups = groups_of(&mine);
        let n = groups.values().next().expect("one group at least").len();
        let piece = |t: &HostTensor, r: usize| {
            block(t, dim, r, n).map_err(|message| RuntimeError::Op { op: op.name().into(), message })
        };
        let owned_by = |g: &[usize], p: usize| self.owned_by(g, p);
        let peers = self.peers(&groups);
        // Pieces this process needs, by (receiving member, contributing member).
        let mut got: HashMap<(usize, usize), HostTensor> = HashMap::new();
        if !peers.is_empty() {
            let piece_ty = {
                let t = &mine.values().next().expect("one").input;
                piece(t, 0)?.ty()
            };
            let piece_bytes = piece_ty.size_bytes();
            let mut sends = Vec::with_capacity(peers.len());
            let mut receives = Vec::with_capacity(peers.len());
            for &q in &peers {
                let mut bytes = Vec::new();
                let mut count = 0;
                for g in groups.values() {
                    let (ours, theirs) = (owned_by(g, me), owned_by(g, q));
                    for d in &ours {
                        for &m in &theirs {
                            bytes.extend_from_slice(&tensor_bytes(&piece(&mine[d].input, rank_in(g, m))?));
                        }
                    }
                    count += ours.len() * theirs.len();
                }
                sends.push((q, bytes));
                receives.push((q, count * piece_bytes));
            }
            let what = format!("step {step} (`{}`)", op.name());
            let messages = self.group.exchange(self.tag(step, 0), sends, &receives, self.timeout, &what)?;
            for (&q, bytes) in peers.iter().zip(messages) {
                let mut at = 0;
                for g in groups.values() {
                    let (ours, theirs) = (owned_by(g, me), owned_by(g, q));
                    for &e in &theirs {
                        for &m in &ours {
                            got.insert((m, e), tensor_from(&piece_ty, &bytes[at..at + piece_bytes])?);
                            at += piece_bytes;
                        }
                    }
                }
            }
        }
        let mut results = HashMap::with_capacity(mine.len());
        for g in groups.values() {
            for m in owned_by(g, me) {
                let r = rank_in(g, m);
                let pieces: Vec<HostTensor> = g
                    .iter()
                    .map(|&k| match mine.get(&k) {
                        Some(c) => piece(&c.input, r),
                        None => Ok(got.remove(&(m, k)).expect("received above")),
                    })
                    .collect::<Result<_, _>>()?;
                results.insert(m, combine_pieces(&op, pieces)?);
            }
        }
        Ok(results)
    }
}

/// The groups of the local contributions, by first device.
pub(super) fn groups_of(mine: &BTreeMap<usize, Contribution>) -> BTreeMap<usize, Vec<usize>> {
    let mut groups = BTreeMap::new();
    for c in mine.values() {
        groups.entry(c.group[0]).or_insert_with(|| c.group.clone());
    }
    groups
}

/// Gives each of `members` (this process's devices of one group: never
/// none) the group's result: copies for all but the first, which takes
/// `whole`.
pub(super) fn hand_out(results: &mut HashMap<usize, HostTensor>, members: &[usize], whole: HostTensor) {
    for &m in &members[1..] {
        results.insert(m, whole.clone());
    }
    results.insert(members[0], whole);
}

/// Device `d`'s rank in group `g`.
pub(super) fn rank_in(g: &[usize], d: usize) -> usize {
    g.iter().position(|&x| x == d).expect("a member")
}

/// A tensor of type `ty` from its little-endian bytes (a message's slice).
pub(super) fn tensor_from(ty: &weft_ir::TensorType, bytes: &[u8]) -> Result<HostTensor, RuntimeError> {
    let mut block = BlockBuf::new(ty);
    block.bytes_mut().copy_from_slice(bytes);
    Ok(block.finish()?)
}

impl ProcessComm {
    /// The members of group `g` that process `p` owns, ascending (the order
    /// of every message).
    pub(super) fn owned_by(&self, g: &[usize], p: usize) -> Vec<usize> {
        let mut v: Vec<usize> = g.iter().copied().filter(|&d| self.owner[d] == p).collect();
        v.sort_unstable();
        v
    }

    /// The other processes owning members of `groups`.
    pub(super) fn peers(&self, groups: &BTreeMap<usize, Vec<usize>>) -> BTreeSet<usize> {
        let me = self.group.rank();
        groups.values().flatten().map(|&d| self.owner[d]).filter(|&p| p != me).collect()
    }
}

/// The collectives' tags: `0..COLLECTIVE_TAGS`, below the control tags of
/// [`super::ProcessGroup`].
pub const COLLECTIVE_TAGS: u32 = 30_000;

/// Elements `[r * len / n, (r + 1) * len / n)`: chunk `r` of `n`.
pub(super) fn chunk(len: usize, n: usize, r: usize) -> std::ops::Range<usize> {
    r * len / n..(r + 1) * len / n
}

impl ProcessComm {
    /// [`ProcessComm::complete`] for an all-reduce that crosses processes,
    /// as a reduce-scatter then an all-gather of the flattened
    /// contributions: the member of rank `r` folds chunk `r` of every
    /// contribution (in rank order, so exactly the elements of the whole
    /// fold) and every process gathers the folded chunks. A process sends
    /// `2 (n - 1) / n` of a contribution's bytes instead of `n - 1` times
    /// them, and each element is folded once per group.
    fn complete_all_reduce(
        &self,
        step: usize,
        mine: BTreeMap<usize, Contribution>,
        rop: weft_ir::ReduceOp,
    ) -> Result<HashMap<usize, HostTensor>, RuntimeError> {
        let me = self.group.rank();
        let first = mine.values().next().expect("a process owns at least one device");
        let (op, ty) = (first.op.clone(), first.input.ty());
        let elem = ty.dtype.size_bytes();
        let len = ty.num_elements();
        let groups = groups_of(&mine);
        let n = groups.values().next().expect("one group at least").len();
        let owned_by = |g: &[usize], p: usize| self.owned_by(g, p);
        let bytes_of: HashMap<usize, std::borrow::Cow<'_, [u8]>> =
            mine.iter().map(|(&d, c)| (d, tensor_bytes(&c.input))).collect();
        let chunk_bytes = |r: usize| {
            let c = chunk(len, n, r);
            c.start * elem..c.end * elem
        };
        let peers = self.peers(&groups);
        let what = format!("step {step} (`{}`)", op.name());
        // Phase 1: each member's chunk of every contribution goes to the
        // member's process.
        let mut sends = Vec::with_capacity(peers.len());
        let mut receives = Vec::with_capacity(peers.len());
        for &q in &peers {
            let (mut bytes, mut count) = (Vec::new(), 0);
            for g in groups.values() {
                let (ours, theirs) = (owned_by(g, me), owned_by(g, q));
                for d in &ours {
                    for &m in &theirs {
                        bytes.extend_from_slice(&bytes_of[d][chunk_bytes(rank_in(g, m))]);
                    }
                }
                for _ in &theirs {
                    for &m in &ours {
                        count += chunk_bytes(rank_in(g, m)).len();
                    }
                }
            }
            sends.push((q, bytes));
            receives.push((q, count));
        }
        let messages = self.group.exchange(self.tag(step, 0), sends, &receives, self.timeout, &what)?;
        // Pieces received, by (receiving member, contributing member).
        let mut got: HashMap<(usize, usize), Vec<u8>> = HashMap::new();
        for (&q, bytes) in peers.iter().zip(messages) {
            let mut at = 0;
            for g in groups.values() {
                let (ours, theirs) = (owned_by(g, me), owned_by(g, q));
                for &e in &theirs {
                    for &m in &ours {
                        let k = chunk_bytes(rank_in(g, m)).len();
                        got.insert((m, e), bytes[at..at + k].to_vec());
                        at += k;
                    }
                }
            }
        }
        let piece = |bytes: &[u8], r: usize| {
            tensor_from(&weft_ir::TensorType::new(ty.dtype, vec![chunk(len, n, r).len()]), bytes)
        };
        // Each local member folds its chunk in rank order.
        let fold = Collective::ReduceScatter { dim: 0, axes: Vec::new(), op: rop };
        let mut folded: HashMap<usize, Vec<u8>> = HashMap::new();
        for g in groups.values() {
            for m in owned_by(g, me) {
                let r = rank_in(g, m);
                let pieces: Vec<HostTensor> = g
                    .iter()
                    .map(|&k| match bytes_of.get(&k) {
                        Some(b) => piece(&b[chunk_bytes(r)], r),
                        None => piece(&got.remove(&(m, k)).expect("received above"), r),
                    })
                    .collect::<Result<_, _>>()?;
                folded.insert(m, tensor_bytes(&combine_pieces(&fold, pieces)?).into_owned());
            }
        }
        // Phase 2: every folded chunk goes to every process of the group.
        let mut sends = Vec::with_capacity(peers.len());
        let mut receives = Vec::with_capacity(peers.len());
        for &q in &peers {
            let (mut bytes, mut count) = (Vec::new(), 0);
            for g in groups.values() {
                if owned_by(g, q).is_empty() {
                    continue;
                }
                for m in owned_by(g, me) {
                    bytes.extend_from_slice(&folded[&m]);
                }
                for e in owned_by(g, q) {
                    count += chunk_bytes(rank_in(g, e)).len();
                }
            }
            sends.push((q, bytes));
            receives.push((q, count));
        }
        let messages = self.group.exchange(self.tag(step, 1), sends, &receives, self.timeout, &what)?;
        let mut chunks: HashMap<usize, Vec<u8>> = folded;
        for (&q, bytes) in peers.iter().zip(messages) {
            let mut at = 0;
            for g in groups.values() {
                if owned_by(g, me).is_empty() {
                    continue;
                }
                for e in owned_by(g, q) {
                    let k = chunk_bytes(rank_in(g, e)).len();
                    chunks.insert(e, bytes[at..at + k].to_vec());
                    at += k;
                }
            }
        }
        let mut results = HashMap::with_capacity(mine.len());
        for g in groups.values() {
            let mut whole = BlockBuf::new(&ty);
            let out = whole.bytes_mut();
            for (r, d) in g.iter().enumerate() {
                out[chunk_bytes(r)].copy_from_slice(&chunks[d]);
            }
            hand_out(&mut results, &owned_by(g, me), whole.finish()?);
        }
        Ok(results)
    }
}

fn aborted(s: &State, call: &CollectiveCall<'_>) -> Option<RuntimeError> {
    s.aborted.as_ref().map(|failed| call.aborted(failed))
}

impl Communicator for ProcessComm {
    fn contribute(&self, call: CollectiveCall<'_>, input: HostTensor) -> Result<(), RuntimeError> {
        let mut s = self.lock();
        if let Some(e) = aborted(&s, &call) {
            return Err(e);
        }
        let contribution = Contribution { op: call.op.clone(), group: call.group.to_vec(), input };
        let step = s.collecting.entry(call.step).or_default();
        step.insert(call.device(), contribution);
        if step.len() < self.local {
            return Ok(());
        }
        let mine = s.collecting.remove(&call.step).expect("collecting");
        s.ready.push_back((call.step, mine));
        if self.background {
            self.changed.notify_all();
            return Ok(());
        }
        // The thread that completes a step makes the queued exchanges, in
        // order, unless another thread is making them already.
        if s.exchanging {
            return Ok(());
        }
        while let Some((step, mine)) = s.ready.pop_front() {
            if let Some(e) = aborted(&s, &call) {
                s.ready.clear();
                return Err(e);
            }
            let (next, done) = self.exchange(s, step, mine);
            s = next;
            if let Err(e) = done {
                s.ready.clear();
                return Err(e);
            }
        }
        Ok(())
    }

    fn receive(&self, call: CollectiveCall<'_>) -> Result<HostTensor, RuntimeError> {
        let deadline = Instant::now() + self.timeout;
        let mut s = self.lock();
        loop {
            if let Some(t) = s.results.remove(&(call.step, call.device())) {
                return Ok(t);
            }
            if let Some(e) = aborted(&s, &call) {
                return Err(s.failed.take().unwrap_or(e));
            }
            let now = Instant::now();
            // A step whose exchange is queued or under way ends in results
            // or an abort within the exchange's own deadline.
            if s.exchanging || s.ready.iter().any(|(step, _)| *step == call.step) {
                s = self.changed.wait(s).unwrap_or_else(|p| p.into_inner());
                continue;
            }
            if now >= deadline {
                let here = s.collecting.get(&call.step);
                let missing: Vec<usize> = (0..self.owner.len())
                    .filter(|d| self.owner[*d] == self.group.rank() && !here.is_some_and(|c| c.contains_key(d)))
                    .collect();
                return Err(call.timed_out(self.timeout, missing));
            }
            s = self.changed.wait_timeout(s, deadline - now).unwrap_or_else(|p| p.into_inner()).0;
        }
    }

    fn abort(&self, device: usize, reason: String) {
        self.lock().aborted.get_or_insert((device, reason));
        self.changed.notify_all();
    }

    fn reset(&self) {
        let mut s = self.lock();
        // An exchange still under way (the background thread's, after a
        // failed run) would land its results, or its failure, in the next
        // run: wait for it (it ends by its own deadline).
        s.ready.clear();
        while s.exchanging {
            s = self.changed.wait(s).unwrap_or_else(|p| p.into_inner());
        }
        s.aborted = None;
        s.failed = None;
        s.collecting.clear();
        s.ready.clear();
        s.results.clear();
    }
}

/// A [`ProcessComm`] whose exchanges a thread of its own makes
/// ([`ProcessComm::in_background`]).
pub struct Background {
    comm: std::sync::Arc<ProcessComm>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Communicator for Background {
    fn contribute(&self, call: CollectiveCall<'_>, input: HostTensor) -> Result<(), RuntimeError> {
        self.comm.contribute(call, input)
    }

    fn receive(&self, call: CollectiveCall<'_>) -> Result<HostTensor, RuntimeError> {
        self.comm.receive(call)
    }

    fn abort(&self, device: usize, reason: String) {
        self.comm.abort(device, reason)
    }

    fn reset(&self) {
        self.comm.reset()
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        self.comm.lock().closing = true;
        self.comm.changed.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

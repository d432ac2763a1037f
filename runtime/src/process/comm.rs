//! [`ProcessComm`]: the communicator of one process of a multi-process run.
//!
//! This process's devices contribute to a step in memory. The last one to
//! arrive makes the step's one exchange with the other processes (each
//! peer gets the contributions of this process's devices that share a
//! group with its devices, in ascending device order, and sends the same
//! back), then computes every local group's result with the same
//! rank-order fold as [`crate::InProcessComm`], and wakes the waiting
//! devices. See the [module docs](super) for why.

use super::ProcessGroup;
use crate::collective::combine;
use crate::comm::{CollectiveCall, Communicator};
use crate::error::RuntimeError;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};
use weft_ir::device::Collective;
use weft_ir::tensor::{tensor_bytes, BlockBuf, HostTensor};

/// One local device's contribution to the current step.
struct Contribution {
    op: Collective,
    group: Vec<usize>,
    input: HostTensor,
}

#[derive(Default)]
struct State {
    /// The step being collected and its contributions, by device.
    step: usize,
    contributions: BTreeMap<usize, Contribution>,
    /// Results not yet received, by device.
    results: HashMap<usize, HostTensor>,
    /// The failing device and its error.
    aborted: Option<(usize, String)>,
    /// An exchange with the other processes is in flight (it has its own
    /// deadline, and ends in results or an abort).
    exchanging: bool,
}

/// The communicator of one process of a multi-process run (module docs).
pub struct ProcessComm {
    group: std::sync::Arc<dyn ProcessGroup>,
    /// The process owning each device of the mesh.
    owner: Vec<usize>,
    /// How many devices this process owns.
    local: usize,
    timeout: Duration,
    state: Mutex<State>,
    changed: Condvar,
}

impl ProcessComm {
    /// The communicator of process `group.rank()`, whose devices are those
    /// `owner` maps to it; every wait (for local devices or for other
    /// processes) lasts at most `timeout`.
    pub fn new(group: std::sync::Arc<dyn ProcessGroup>, owner: Vec<usize>, timeout: Duration) -> ProcessComm {
        let local = owner.iter().filter(|&&p| p == group.rank()).count();
        ProcessComm { group, owner, local, timeout, state: Mutex::new(State::default()), changed: Condvar::new() }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Exchanges the step's contributions with the other processes and
    /// computes the local devices' results.
    fn complete(&self, step: usize, mine: BTreeMap<usize, Contribution>) -> Result<HashMap<usize, HostTensor>, RuntimeError> {
        let me = self.group.rank();
        let first = mine.values().next().expect("a process owns at least one device");
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
            let receives: Vec<(usize, usize)> = recv_from.iter().map(|(&p, devs)| (p, devs.len() * block_bytes)).collect();
            let what = format!("step {step} (`{}`)", op.name());
            let got = self.group.exchange((step % 30_000) as u32, sends, &receives, self.timeout, &what)?;
            for ((_, devs), bytes) in recv_from.iter().zip(got) {
                for (k, &d) in devs.iter().enumerate() {
                    let mut block = BlockBuf::new(&ty);
                    block.bytes_mut().copy_from_slice(&bytes[k * block_bytes..(k + 1) * block_bytes]);
                    remote.insert(d, block.finish()?);
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
                let mut out: HashMap<usize, HostTensor> =
                    local.iter().map(|&d| (d, HostTensor::zeros(&ty))).collect();
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

fn aborted(s: &State, call: &CollectiveCall<'_>) -> Option<RuntimeError> {
    s.aborted.as_ref().map(|(device, reason)| RuntimeError::Aborted {
        device: call.device(),
        step: call.step,
        collective: call.op.name().to_string(),
        failed_device: *device,
        reason: reason.clone(),
    })
}

impl Communicator for ProcessComm {
    fn contribute(&self, call: CollectiveCall<'_>, input: HostTensor) -> Result<(), RuntimeError> {
        let mut s = self.lock();
        if let Some(e) = aborted(&s, &call) {
            return Err(e);
        }
        if s.contributions.is_empty() {
            s.step = call.step;
        } else if s.step != call.step {
            // Every device runs the same steps in the same order; a mismatch
            // is a broken program or executor, reported rather than trusted.
            return Err(RuntimeError::InvalidProgram {
                program: String::new(),
                step: Some(call.step),
                message: format!("device {} reached step {} while step {} was collecting", call.device(), call.step, s.step),
            });
        }
        let contribution = Contribution { op: call.op.clone(), group: call.group.to_vec(), input };
        s.contributions.insert(call.device(), contribution);
        if s.contributions.len() < self.local {
            return Ok(());
        }
        let mine = std::mem::take(&mut s.contributions);
        s.exchanging = true;
        drop(s);
        let done = self.complete(call.step, mine);
        let mut s = self.lock();
        s.exchanging = false;
        let out = match done {
            Ok(results) => {
                s.results.extend(results);
                Ok(())
            }
            Err(e) => {
                s.aborted.get_or_insert((call.device(), e.to_string()));
                Err(e)
            }
        };
        self.changed.notify_all();
        out
    }

    fn receive(&self, call: CollectiveCall<'_>) -> Result<HostTensor, RuntimeError> {
        let deadline = Instant::now() + self.timeout;
        let mut s = self.lock();
        loop {
            if let Some(t) = s.results.remove(&call.device()) {
                return Ok(t);
            }
            if let Some(e) = aborted(&s, &call) {
                return Err(e);
            }
            let now = Instant::now();
            if s.exchanging {
                s = self.changed.wait(s).unwrap_or_else(|p| p.into_inner());
                continue;
            }
            if now >= deadline {
                let missing: Vec<usize> = (0..self.owner.len())
                    .filter(|d| self.owner[*d] == self.group.rank() && !s.contributions.contains_key(d))
                    .collect();
                return Err(RuntimeError::CollectiveTimeout {
                    device: call.device(),
                    step: call.step,
                    collective: call.op.name().to_string(),
                    waited: self.timeout,
                    missing,
                });
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
        s.aborted = None;
        s.contributions.clear();
        s.results.clear();
    }
}

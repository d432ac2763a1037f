//! Collectives among logical devices that share one GPU, on its memory.
//!
//! Eight logical devices on one GPU (`--mesh data=8` on a one-GPU machine)
//! used to exchange every collective through the host: a download per
//! member, a fold on the CPU, an upload per member. Their buffers are in
//! one memory already - CUDA logical devices on one GPU share its CubeCL
//! client ([`super::cuda_devices`]) - so the exchange can stay there: each
//! member leaves its buffer at a meeting point, and the last to arrive
//! computes what every member receives with the device's own kernels,
//! following [`weft_ir::device::collective::combine_with`], the same
//! definition the host communicator uses (reductions fold in rank order
//! with the binary op; blocks are `slice`s, gathers `concatenate`s). The
//! device's kernels are bitwise the interpreter's, so the result is
//! bitwise the host path's: unlike NCCL this needs no opt-in, and it is
//! what a CUDA run does by default for groups whose members all live on
//! one GPU (`device_collectives::attach`).
//!
//! A group with a member elsewhere (another GPU, another process) and
//! `collective_permute` stay on the host path; every member of a group
//! makes the same choice, since it depends only on the group. A member
//! that waits longer than the timeout for the others gets
//! [`RuntimeError::CollectiveTimeout`] naming the missing devices.

use super::device_collectives::NativeCollectives;
use super::{ops, CubeBuffer, CubeclBackend};
use crate::comm::CollectiveCall;
use crate::error::RuntimeError;
use cubecl::prelude::Runtime;
use std::collections::{BTreeSet, HashMap};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};
use weft_ir::device::collective::combine_with;
use weft_ir::device::Collective;
use weft_ir::DType;

/// One collective in progress: the contributions so far, then the results.
struct Meeting<R: Runtime> {
    inputs: Vec<Option<CubeBuffer<R>>>,
    outputs: Option<Result<Vec<Option<CubeBuffer<R>>>, String>>,
    /// Members that have not taken their result yet.
    left: usize,
}

/// The meeting point of the logical devices on one GPU (see the module
/// documentation).
pub struct SharedGpuCollectives<R: Runtime> {
    /// The mesh devices whose buffers live on this GPU.
    members: BTreeSet<usize>,
    /// Meetings by (step, first device of the group).
    meetings: Mutex<HashMap<(usize, usize), Meeting<R>>>,
    arrived: Condvar,
    timeout: Duration,
}

impl<R: Runtime> SharedGpuCollectives<R> {
    /// The meeting point of mesh devices `members`, whose backends share
    /// one CubeCL client; a member waits at most `timeout` for the others.
    pub fn new(members: impl IntoIterator<Item = usize>, timeout: Duration) -> SharedGpuCollectives<R> {
        SharedGpuCollectives {
            members: members.into_iter().collect(),
            meetings: Mutex::new(HashMap::new()),
            arrived: Condvar::new(),
            timeout,
        }
    }

    /// Whether a collective of `group` on buffers of `dtype` meets here.
    fn takes(&self, op: &Collective, group: &[usize], dtype: DType) -> bool {
        let reduces = matches!(op, Collective::AllReduce { .. } | Collective::ReduceScatter { .. });
        let permute = matches!(op, Collective::CollectivePermute { .. });
        let bool_reduction = reduces && dtype == DType::Bool;
        !(permute || bool_reduction) && group.iter().all(|d| self.members.contains(d))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(usize, usize), Meeting<R>>> {
        self.meetings.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn meet(
        &self,
        be: &CubeclBackend<R>,
        call: CollectiveCall<'_>,
        input: &CubeBuffer<R>,
    ) -> Result<CubeBuffer<R>, RuntimeError> {
        let n = call.group.len();
        let key = (call.step, call.group[0]);
        let mut meetings = self.lock();
        let m = meetings.entry(key).or_insert_with(|| Meeting { inputs: vec![None; n], outputs: None, left: n });
        m.inputs[call.rank] = Some(input.clone());
        if m.inputs.iter().all(Option::is_some) {
            let blocks: Vec<CubeBuffer<R>> = m.inputs.iter_mut().map(|b| b.take().expect("all arrived")).collect();
            let shape = input.ty().shape.clone();
            let out = combine_with(call.op, blocks, &shape, &mut |op, xs: &[&CubeBuffer<R>]| {
                ops::compute(be, op, xs).map_err(|e| e.to_string())
            });
            m.outputs = Some(out.map(|v| v.into_iter().map(Some).collect()));
            self.arrived.notify_all();
        }
        let start = Instant::now();
        let timeout = |missing: Vec<usize>| RuntimeError::CollectiveTimeout {
            device: call.device(),
            step: call.step,
            collective: call.op.name().into(),
            waited: start.elapsed(),
            missing,
        };
        let mut missing = Vec::new();
        loop {
            // Gone: another member timed out waiting for the same devices.
            let Some(m) = meetings.get_mut(&key) else { return Err(timeout(missing)) };
            if m.outputs.is_some() {
                break;
            }
            missing = m.inputs.iter().enumerate().filter(|(_, b)| b.is_none()).map(|(r, _)| call.group[r]).collect();
            let waited = start.elapsed();
            if waited >= self.timeout {
                // Every member waiting here gives up with this one.
                meetings.remove(&key);
                self.arrived.notify_all();
                return Err(timeout(missing));
            }
            meetings = self.arrived.wait_timeout(meetings, self.timeout - waited).unwrap_or_else(|e| e.into_inner()).0;
        }
        let m = meetings.get_mut(&key).expect("checked above");
        let result = match m.outputs.as_mut().expect("checked above") {
            Ok(outs) => Ok(outs[call.rank].take().expect("each member takes its result once")),
            Err(message) => Err(RuntimeError::Op { op: call.op.name().into(), message: message.clone() }),
        };
        m.left -= 1;
        if m.left == 0 {
            meetings.remove(&key);
        }
        result
    }
}

impl<R: Runtime> NativeCollectives<R> for SharedGpuCollectives<R> {
    fn run(
        &self,
        be: &CubeclBackend<R>,
        call: CollectiveCall<'_>,
        input: &CubeBuffer<R>,
    ) -> Option<Result<CubeBuffer<R>, RuntimeError>> {
        self.takes(call.op, call.group, input.ty().dtype).then(|| self.meet(be, call, input))
    }
}

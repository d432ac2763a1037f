//! Stages on processes: a pipeline whose stage axis spans the processes of
//! an `mpirun`/`srun` job.
//!
//! Every process builds the same staged step (the split is a pure
//! function of the config) and compiles only the chunks of its own
//! stages. A stage runs on the processes that own its sub-mesh's devices
//! ([`weft_runtime::process::device_owners`], mesh order): `stage=2` over
//! 2 processes puts one stage on each; `data=2,stage=2` over 4 puts stage
//! 0 on processes 0 and 2 and stage 1 on 1 and 3, each stage an SPMD
//! program over its two processes ([`SpanningFunction`]: a
//! [`weft_runtime::process::ProcessComm`] over the stage's processes, with
//! a tag range of its own so that stages sharing processes never match
//! each other's messages). The processes of a stage all hold its whole
//! results (each gathers the other processes' blocks), so the `i`-th
//! process of a stage sends to the `i`-th process of the next; every
//! stage must span the same number of processes (a named error
//! otherwise).
//!
//! What crosses processes, all on the job's process group with the
//! collective timeout, so that a stage process that died or hangs is
//! named by its neighbours:
//!
//! - **activations and cotangents**, between neighbouring chunks on
//!   different processes: one message per microbatch, its tensors' bytes
//!   back to back (their types are the chunks' boundary types, known to
//!   both sides). Sends go through a thread per link so that a stage never
//!   blocks on its neighbour's receive (1F1B would deadlock on blocking
//!   sends); each link has a tag of its own (one per chunk boundary and
//!   direction), and MPI keeps one sender's messages of one tag in order,
//!   which is microbatch order;
//! - **a spanning stage's results**: each process of the stage sends its
//!   devices' blocks to the stage's other processes (a tag per stage);
//! - **the squares**: the first process of each stage sends its chunks'
//!   `Σ g²` (and finiteness flags) to every process, which sums them in
//!   chunk order (parameter order): the same global norm, bitwise, as one
//!   process;
//! - **the metrics**: the loss and auxiliary metrics of the first process
//!   of the last stage, to every process (process 0 writes them);
//! - **the state**, when the run asks for it (checkpoints, validation, the
//!   end): every process's chunks' parameters and slots, gathered so that
//!   every process holds the whole state, saved as one process saves it.

use crate::error::{Error, Result};
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::Duration;
use weft_compiler::partition::PartitionedFunction;
use weft_compiler::sharding::Mesh;
use weft_compiler::stages::{Phase, StagedStep, Task, TraceEvent};
use weft_ir::tensor::HostTensor;
use weft_ir::TensorType;
use weft_runtime::process::{ProcessComm, COLLECTIVE_TAGS};
use weft_runtime::{AnyBackend, ExecOptions, Executable, ProcessGroup};

/// The first tag of the pipeline's links: above the collectives' (below
/// 30,000), the control messages' (30,000 and up) and MPI's communicator
/// set-up (31,000 and 31,001); each chunk boundary takes two (activations,
/// cotangents).
const LINK_TAG: u32 = 31_100;

/// The most chunks: their links' tags end where the stages' gathers'
/// begin.
pub const MAX_CHUNKS: usize = 400;

/// The first tag of the stages' result gathers, one per stage, below
/// MPI's guaranteed tag bound (32,767).
const GATHER_TAG: u32 = LINK_TAG + 2 * MAX_CHUNKS as u32;

/// Which processes run each stage, and the transport between them.
#[derive(Clone)]
pub struct StageProcesses {
    group: Arc<dyn ProcessGroup>,
    timeout: Duration,
    /// The processes running each stage, ascending.
    procs: Vec<Vec<usize>>,
    /// Per stage: the process owning each device of its sub-mesh.
    sub_owner: Vec<Vec<usize>>,
    /// This process's share of its host's physical devices.
    share: weft_runtime::HostShare,
}

impl std::fmt::Debug for StageProcesses {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "process {} of {}, stages on processes {:?}", self.group.rank(), self.group.size(), self.procs)
    }
}

impl StageProcesses {
    /// The stages of `mesh` along `axis` on the processes of `group`: each
    /// stage on the processes owning its sub-mesh's devices; `chunks`
    /// (`S·V`) at most [`MAX_CHUNKS`]. Stages over different numbers of
    /// processes are a named error. This process opens its devices in
    /// `share` of its host's.
    pub fn new(
        group: Arc<dyn ProcessGroup>,
        timeout: Duration,
        share: weft_runtime::HostShare,
        mesh: &Mesh,
        axis: &str,
        chunks: usize,
    ) -> Result<StageProcesses> {
        let n = mesh.num_devices();
        let processes = group.size();
        weft_runtime::process::check_process_count(n, processes)?;
        let owners = weft_runtime::process::device_owners(n, processes);
        let at = mesh.axes().iter().position(|a| a.name == axis).expect("validated: the stage axis exists");
        let stages = mesh.axes()[at].size;
        // A stage's sub-mesh is the mesh without the stage axis, row-major:
        // its devices in ascending mesh position.
        let mut sub_owner = vec![Vec::new(); stages];
        for (d, &p) in owners.iter().enumerate() {
            sub_owner[mesh.coords_of_position(d)[at]].push(p);
        }
        let procs: Vec<Vec<usize>> = (sub_owner.iter())
            .map(|o| {
                let mut ps = o.clone();
                ps.sort_unstable();
                ps.dedup();
                ps
            })
            .collect();
        if procs.iter().any(|ps| ps.len() != procs[0].len()) {
            let layout: Vec<String> = procs.iter().enumerate().map(|(s, ps)| format!("stage {s}: {ps:?}")).collect();
            return Err(Error::Usage(format!(
                "[pipeline] over {processes} processes: the stages run on different numbers of processes ({}); \
                 use a process count that deals every stage's devices out alike",
                layout.join(", ")
            )));
        }
        if chunks > MAX_CHUNKS {
            return Err(Error::Usage(format!(
                "[pipeline] over processes takes at most {MAX_CHUNKS} chunks (stages × virtual_stages), given {chunks}"
            )));
        }
        Ok(StageProcesses { group, timeout, procs, sub_owner, share })
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.group.rank()
    }

    /// This process's share of its host's physical devices.
    pub fn share(&self) -> weft_runtime::HostShare {
        self.share
    }

    /// The processes running stage `s`, ascending.
    pub fn processes_of(&self, s: usize) -> &[usize] {
        &self.procs[s]
    }

    /// The first process running stage `s`: the one that reports its
    /// squares, metrics and state to the others.
    pub fn first(&self, s: usize) -> usize {
        self.procs[s][0]
    }

    /// Whether this process runs stage `s`.
    pub fn runs(&self, s: usize) -> bool {
        self.procs[s].contains(&self.group.rank())
    }

    /// Whether this process is stage `s`'s first.
    pub fn leads(&self, s: usize) -> bool {
        self.first(s) == self.group.rank()
    }

    /// The process of stage `to` that this process, running stage `from`,
    /// exchanges with: the one at the same place in `to`'s processes.
    pub fn peer(&self, from: usize, to: usize) -> usize {
        let i = self.procs[from].iter().position(|&p| p == self.group.rank()).expect("this process runs `from`");
        self.procs[to][i]
    }

    /// The tag of the link after chunk `c` (to chunk `c + 1`): `cotangents`
    /// false for activations, true for the cotangents coming back.
    fn tag(c: usize, cotangents: bool) -> u32 {
        LINK_TAG + 2 * c as u32 + u32::from(cotangents)
    }

    /// Receives microbatch tensors of `types` from process `peer` on the
    /// link after chunk `c`.
    pub fn receive(&self, peer: usize, c: usize, cotangents: bool, types: &[TensorType]) -> Result<Vec<HostTensor>> {
        let len: usize = types.iter().map(|t| t.size_bytes()).sum();
        let what = format!(
            "pipeline: {} of chunk {} from process {peer}",
            if cotangents { "the cotangents" } else { "the activations" },
            if cotangents { c + 1 } else { c }
        );
        let got = self.group.exchange(Self::tag(c, cotangents), Vec::new(), &[(peer, len)], self.timeout, &what)?;
        split(&got[0], types)
    }

    /// A thread sending what `outbox` receives, in order, to process `peer`
    /// on the link after chunk `c`; it ends when the channel closes, with
    /// the first failure.
    pub fn sender(
        &self,
        peer: usize,
        c: usize,
        cotangents: bool,
        outbox: Receiver<Vec<HostTensor>>,
    ) -> std::thread::JoinHandle<Result<()>> {
        let group = self.group.clone();
        let timeout = self.timeout;
        let what = format!(
            "pipeline: sending {} of chunk {} to process {peer}",
            if cotangents { "the cotangents" } else { "the activations" },
            if cotangents { c + 1 } else { c }
        );
        let tag = Self::tag(c, cotangents);
        std::thread::Builder::new()
            .name("weft-pipeline-send".into())
            .spawn(move || {
                for tensors in outbox {
                    let bytes: Vec<u8> = tensors.iter().flat_map(|t| t.to_bytes_le()).collect();
                    group.exchange(tag, vec![(peer, bytes)], &[], timeout, &what)?;
                }
                Ok(())
            })
            .expect("spawning a pipeline sender")
    }

    /// Stops the whole job at once after this process's own error `e` (a
    /// stage's): prints it, as `weft train` prints a process's error, and
    /// aborts every process, so that the others, waiting for this one's
    /// messages, do not wait out their timeout and report only that.
    pub fn fail(&self, e: &Error) {
        let line = format!("error: process {} of {}: {e}\n", self.group.rank(), self.group.size());
        let _ = std::io::Write::write_all(&mut std::io::stderr().lock(), line.as_bytes());
        self.group.abort_all(e.exit_code());
    }

    /// Every process's `bytes`, in rank order.
    pub fn all_gather(&self, bytes: &[u8], what: &str) -> Result<Vec<Vec<u8>>> {
        Ok(self.group.all_gather(bytes, self.timeout, what)?)
    }
}

/// A stage function whose sub-mesh spans processes: this process runs its
/// devices of the SPMD program (collectives with the stage's other
/// processes through a [`ProcessComm`] with a tag range per stage), then
/// gathers the other processes' blocks of the results, so that every
/// process of the stage holds them whole.
pub struct SpanningFunction {
    pf: Box<PartitionedFunction>,
    exe: Box<Executable<AnyBackend>>,
    /// This process's devices of the sub-mesh.
    local: Vec<usize>,
    /// The process owning each device of the sub-mesh.
    owner: Vec<usize>,
    group: Arc<dyn ProcessGroup>,
    timeout: Duration,
    /// The stage (its gathers' tag).
    stage: usize,
}

impl SpanningFunction {
    /// Opens `pf` (compiled for stage `s`'s sub-mesh) on this process's
    /// devices of it, on devices of `kind` in `share` of the host's.
    pub fn open(
        pf: PartitionedFunction,
        kind: weft_runtime::BackendKind,
        procs: &StageProcesses,
        s: usize,
        share: weft_runtime::HostShare,
        options: ExecOptions,
    ) -> Result<SpanningFunction> {
        let me = procs.rank();
        let owner = procs.sub_owner[s].clone();
        let local: Vec<usize> = (0..owner.len()).filter(|&d| owner[d] == me).collect();
        let devices = weft_runtime::open_devices_shared(kind, local.len(), share)?;
        let stages = procs.procs.len() as u32;
        let count = (COLLECTIVE_TAGS / stages) & !1;
        let comm =
            ProcessComm::new(procs.group.clone(), owner.clone(), procs.timeout).with_tags(s as u32 * count, count);
        let comm: Box<dyn weft_runtime::Communicator> =
            if pf.program.starts_collectives() { Box::new(comm.in_background()) } else { Box::new(comm) };
        let exe = Executable::with_devices(pf.program.clone(), local.clone(), devices.backends, comm, options)?;
        Ok(SpanningFunction {
            pf: Box::new(pf),
            exe: Box::new(exe),
            local,
            owner,
            group: procs.group.clone(),
            timeout: procs.timeout,
            stage: s,
        })
    }

    /// The partitioned function.
    pub fn function(&self) -> &PartitionedFunction {
        &self.pf
    }

    /// The rows (dimension 0) of input `i` this process's devices read:
    /// their blocks' rows, every row where a block is not a row range.
    pub fn local_rows(&self, i: usize) -> Result<Vec<std::ops::Range<usize>>> {
        let g = &self.pf.inputs[i];
        let n = g.ty.shape.first().copied().unwrap_or(1);
        if g.ty.rank() == 0 || !g.sharding.unreduced.is_empty() {
            return Ok(std::iter::once(0..n).collect());
        }
        let mut rows = Vec::with_capacity(self.local.len());
        for &d in &self.local {
            let start = weft_compiler::sharding::shard_offset(&g.ty.shape, &g.sharding, &self.pf.mesh, d)?;
            let local = weft_compiler::sharding::local_shape(&g.ty.shape, &g.sharding, &self.pf.mesh)?;
            rows.push(start[0]..start[0] + local[0]);
        }
        Ok(rows)
    }

    /// Runs on whole host tensors and returns whole results (the same on
    /// every process of the stage).
    pub fn run(&mut self, inputs: Vec<HostTensor>) -> Result<Vec<HostTensor>> {
        let mut per = self.pf.shard_inputs(&inputs)?;
        let mine: Vec<Vec<HostTensor>> = self.local.iter().map(|&d| std::mem::take(&mut per[d])).collect();
        let outs = self.exe.run(mine)?;
        let types: Vec<TensorType> = self.pf.program.outputs.iter().map(|&b| self.pf.program.ty(b).clone()).collect();
        let per_device: usize = types.iter().map(|t| t.size_bytes()).sum();
        let me = self.group.rank();
        let mut others: Vec<usize> = self.owner.iter().copied().filter(|&q| q != me).collect();
        others.sort_unstable();
        others.dedup();
        let bytes: Vec<u8> = outs.iter().flatten().flat_map(|t| t.to_bytes_le()).collect();
        let receives: Vec<(usize, usize)> =
            (others.iter()).map(|&q| (q, per_device * self.owner.iter().filter(|&&o| o == q).count())).collect();
        let sends = others.iter().map(|&q| (q, bytes.clone())).collect();
        let what = format!(
            "pipeline: the results of @{} from the other processes of stage {}",
            self.pf.program.name, self.stage
        );
        let got = self.group.exchange(GATHER_TAG + self.stage as u32, sends, &receives, self.timeout, &what)?;
        let mut theirs: std::collections::BTreeMap<usize, (usize, &[u8])> =
            others.iter().zip(&got).map(|(&q, b)| (q, (0usize, &b[..]))).collect();
        let mut outs = outs.into_iter();
        let mut all = Vec::with_capacity(self.owner.len());
        for &q in &self.owner {
            if q == me {
                all.push(outs.next().expect("one per local device"));
            } else {
                let (at, b) = theirs.get_mut(&q).expect("a peer of the stage");
                all.push(split(&b[*at..*at + per_device], &types)?);
                *at += per_device;
            }
        }
        Ok(self.pf.unshard_outputs(all)?)
    }
}

/// `bytes` cut into tensors of `types`, in order.
pub fn split(bytes: &[u8], types: &[TensorType]) -> Result<Vec<HostTensor>> {
    let mut at = 0;
    let mut out = Vec::with_capacity(types.len());
    for t in types {
        let n = t.size_bytes();
        let piece = bytes.get(at..at + n).ok_or_else(|| {
            Error::Usage(format!("pipeline: a message of {} bytes is short of its tensors' {}", bytes.len(), at + n))
        })?;
        out.push(HostTensor::from_bytes_le(t, piece)?);
        at += n;
    }
    Ok(out)
}

/// A step's message to the other processes: the metric values (f32; empty
/// unless this process runs the last stage), then its trace events, all
/// as little-endian f64: `[n, values…, (stage, chunk, phase, micro, start,
/// end)…]`.
pub fn encode_step(values: &[f32], events: &[TraceEvent]) -> Vec<u8> {
    let mut out = vec![values.len() as f64];
    out.extend(values.iter().map(|&v| v as f64));
    for e in events {
        let phase = if e.task.phase == Phase::Forward { 0.0 } else { 1.0 };
        out.extend([e.stage as f64, e.task.chunk as f64, phase, e.task.micro as f64, e.start, e.end]);
    }
    out.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// [`encode_step`]'s message back into values and events.
pub fn decode_step(bytes: &[u8]) -> Result<(Vec<f32>, Vec<TraceEvent>)> {
    let xs: Vec<f64> = bytes.chunks_exact(8).map(|b| f64::from_le_bytes(b.try_into().expect("8 bytes"))).collect();
    let bad = || Error::Usage(format!("pipeline: a step message of {} bytes is malformed", bytes.len()));
    let n = *xs.first().ok_or_else(bad)? as usize;
    let rest = xs.get(1 + n..).ok_or_else(bad)?;
    if rest.len() % 6 != 0 {
        return Err(bad());
    }
    let values = xs[1..1 + n].iter().map(|&v| v as f32).collect();
    let events = rest
        .chunks_exact(6)
        .map(|e| TraceEvent {
            stage: e[0] as usize,
            task: Task {
                phase: if e[2] == 0.0 { Phase::Forward } else { Phase::Backward },
                micro: e[3] as usize,
                chunk: e[1] as usize,
            },
            start: e[4],
            end: e[5],
        })
        .collect();
    Ok((values, events))
}

/// f32 values as little-endian bytes.
pub fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// Little-endian bytes as f32 values.
pub fn bytes_f32(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes"))).collect()
}

/// The types of chunk `c`'s state as its update takes it: its parameters,
/// then its slots (slot-major).
pub fn state_types(staged: &StagedStep, c: usize) -> Vec<TensorType> {
    let fns = &staged.stages[c];
    let n = fns.params.len() * (1 + staged.slots.len());
    (0..n).map(|i| fns.update.ty(fns.update.params[i]).clone()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_message_round_trips_and_bad_ones_are_errors() {
        let e =
            TraceEvent { stage: 1, task: Task { phase: Phase::Backward, micro: 3, chunk: 3 }, start: 0.5, end: 0.75 };
        let bytes = encode_step(&[2.5, -1.0], std::slice::from_ref(&e));
        let (v, got) = decode_step(&bytes).unwrap();
        assert_eq!(v, vec![2.5, -1.0]);
        assert_eq!(got, vec![e]);
        assert!(decode_step(&bytes[..bytes.len() - 8]).is_err());
        assert!(decode_step(&[]).is_err());
        assert_eq!(decode_step(&encode_step(&[], &[])).unwrap().1, vec![]);
        let t = TensorType::new(weft_ir::DType::F32, vec![2]);
        assert!(split(&[0u8; 7], std::slice::from_ref(&t)).is_err());
        assert_eq!(split(&f32_bytes(&[1.0, 2.0]), &[t]).unwrap()[0].to_f64_vec(), vec![1.0, 2.0]);
    }
}

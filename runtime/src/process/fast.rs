//! The opt-in fast reduction mode ([`Reduction::Fast`]): sums across
//! processes by the transport's own reduction (MPI's) instead of the
//! exchange and rank-order fold of [`super::comm`] and [`super::direct`].
//!
//! What it covers: an all-reduce or reduce-scatter with `op = sum` of
//! `f32` or `f64` whose group crosses processes ([`NativeType`]: the types
//! MPI sums natively). Everything else — `bf16` and `f16` (MPI has no
//! predefined type for them), integers (their sums do not depend on the
//! order, so the deterministic path loses nothing), `max`/`min`/`prod`,
//! all-gather, all-to-all, permutes, groups within one process — stays on
//! the deterministic path in either mode.
//!
//! How a group's sum is formed: this process's members are first folded
//! left to right in their rank order (one partial sum per process, the
//! interpreter's `+`), then the partial sums of the group's processes go
//! to one collective of the transport ([`ProcessGroup::sum_all_into`],
//! [`ProcessGroup::sum_scatter_into`]) over exactly those processes, in
//! whatever order its algorithm adds them. A step's groups are reduced one
//! after another in the order of their first device, the same order in
//! every process, so collectives over overlapping sets of processes never
//! wait on each other in a cycle.
//!
//! [`ProcessGroup::sum_all_into`]: super::ProcessGroup::sum_all_into
//! [`ProcessGroup::sum_scatter_into`]: super::ProcessGroup::sum_scatter_into

use super::comm::{groups_of, hand_out, rank_in, tensor_from, Contribution, ProcessComm};
use crate::collective::block;
use crate::error::RuntimeError;
use std::collections::{BTreeMap, HashMap};
use weft_ir::device::Collective;
use weft_ir::tensor::{tensor_bytes, BlockBuf, HostTensor};
use weft_ir::{DType, ReduceOp};

/// How collectives that reduce across processes combine the processes'
/// contributions. Every process of a job must use the same mode (`weft
/// train` checks that the configs agree).
///
/// What [`Reduction::Fast`] still guarantees: every member of a group gets
/// the same bits. MPI defines an all-reduce's result as the one reduced
/// value, which "appears in the receive buffer of all the group members"
/// (MPI-4.1, section 6.9.6; *MPI: The Complete Reference* puts it as "MPI
/// requires that all processes participating in these operations receive
/// identical results"), and this process's devices all copy the one
/// buffer it received; a reduce-scatter gives each member its own block,
/// so there is nothing to agree on. What it does not guarantee: the same
/// bits as one process, or as another process count, device layout or
/// message size (MPI picks its algorithm, and so the order of the
/// additions, by those), or as another MPI library or version. From run
/// to run of the same job on the same machines, MPI only "strongly
/// recommends" (advice to implementors, section 6.9.1) that the same
/// arguments in the same order give the same result; Open MPI's
/// algorithms do so in practice, but it is not promised.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Reduction {
    /// Exchange the contributions and fold them here in rank order: a run
    /// on any number of processes is bitwise the run on one (the default).
    #[default]
    Deterministic,
    /// Sums of `f32`/`f64` across processes by MPI's own reduction, after
    /// folding each process's devices: faster, not bitwise reproducible.
    Fast,
}

impl Reduction {
    /// Every mode's name, as `weft train --reduction` takes it.
    pub const NAMES: [&'static str; 2] = ["deterministic", "fast"];

    /// The mode's name.
    pub fn name(self) -> &'static str {
        match self {
            Reduction::Deterministic => "deterministic",
            Reduction::Fast => "fast",
        }
    }

    /// The mode named `name` ([`Reduction::NAMES`]).
    pub fn from_name(name: &str) -> Option<Reduction> {
        match name {
            "deterministic" => Some(Reduction::Deterministic),
            "fast" => Some(Reduction::Fast),
            _ => None,
        }
    }

    /// One line on what the mode does (for a run's description).
    pub fn describe(self) -> &'static str {
        match self {
            Reduction::Deterministic => {
                "reductions deterministic (exchanged and folded in rank order: bitwise the one-process run)"
            }
            Reduction::Fast => {
                "reductions fast (f32/f64 sums across processes by MPI_SUM after a local fold: not bitwise \
                 reproducible)"
            }
        }
    }
}

/// An element type the transport sums natively.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NativeType {
    /// `f32` (`MPI_FLOAT`).
    F32,
    /// `f64` (`MPI_DOUBLE`).
    F64,
}

impl NativeType {
    /// The native type of `dtype`, if it has one.
    pub fn of(dtype: DType) -> Option<NativeType> {
        match dtype {
            DType::F32 => Some(NativeType::F32),
            DType::F64 => Some(NativeType::F64),
            _ => None,
        }
    }

    /// Bytes per element.
    pub fn size_bytes(self) -> usize {
        match self {
            NativeType::F32 => 4,
            NativeType::F64 => 8,
        }
    }
}

/// `out = parts[0] + parts[1] + ...`, element by element, left to right
/// (little-endian elements of type `ty`).
pub(super) fn sum_bytes_in_order(ty: NativeType, parts: &[Vec<u8>], out: &mut [u8]) {
    match ty {
        NativeType::F32 => {
            for (k, o) in out.chunks_exact_mut(4).enumerate() {
                let at = |p: &Vec<u8>| f32::from_le_bytes(p[4 * k..4 * k + 4].try_into().expect("4 bytes"));
                let acc = parts[1..].iter().fold(at(&parts[0]), |acc, p| acc + at(p));
                o.copy_from_slice(&acc.to_le_bytes());
            }
        }
        NativeType::F64 => {
            for (k, o) in out.chunks_exact_mut(8).enumerate() {
                let at = |p: &Vec<u8>| f64::from_le_bytes(p[8 * k..8 * k + 8].try_into().expect("8 bytes"));
                let acc = parts[1..].iter().fold(at(&parts[0]), |acc, p| acc + at(p));
                o.copy_from_slice(&acc.to_le_bytes());
            }
        }
    }
}

/// The sum of `inputs` (same type and shape), left to right.
fn local_sum(mut inputs: impl Iterator<Item = HostTensor>) -> HostTensor {
    let first = inputs.next().expect("a process owns a member of the group");
    match first {
        HostTensor::F32(mut a) => {
            for t in inputs {
                match t {
                    HostTensor::F32(b) => a += &b,
                    _ => unreachable!("checked by `fast`: one type"),
                }
            }
            HostTensor::F32(a)
        }
        HostTensor::F64(mut a) => {
            for t in inputs {
                match t {
                    HostTensor::F64(b) => a += &b,
                    _ => unreachable!("checked by `fast`: one type"),
                }
            }
            HostTensor::F64(a)
        }
        _ => unreachable!("checked by `fast`: a native type"),
    }
}

/// The contributions of a step, by device.
type Mine = BTreeMap<usize, Contribution>;

impl ProcessComm {
    /// Completes the step by the transport's own sums when the mode is
    /// [`Reduction::Fast`] and the step is a sum of a native type that
    /// crosses processes (module docs); gives the contributions back
    /// otherwise. The choice depends only on the mode, the collective and
    /// the type, the same in every process.
    pub(super) fn fast(
        &self,
        step: usize,
        mine: Mine,
    ) -> Result<Result<HashMap<usize, HostTensor>, RuntimeError>, Mine> {
        if self.reduction != Reduction::Fast {
            return Err(mine);
        }
        let first = mine.values().next().expect("a process owns at least one device");
        let ty = first.input.ty();
        let Some(native) = NativeType::of(ty.dtype) else { return Err(mine) };
        let same = mine.values().all(|c| c.input.ty() == ty);
        let crosses = mine.values().any(|c| c.group.iter().any(|&d| self.owner[d] != self.group.rank()));
        if !same || !crosses {
            return Err(mine);
        }
        let n = first.group.len();
        let scatter = match first.op {
            Collective::AllReduce { op: ReduceOp::Sum, .. } => None,
            Collective::ReduceScatter { op: ReduceOp::Sum, dim, .. }
                if ty.shape.get(dim).is_some_and(|&s| s % n == 0) =>
            {
                Some(dim)
            }
            _ => return Err(mine),
        };
        Ok(self.fast_sums(step, mine, native, scatter))
    }

    /// Each local group's sum (`scatter`: the dimension of a
    /// reduce-scatter): the local members folded in rank order, then the
    /// transport's sum over the group's processes, group by group in the
    /// order of their first device.
    fn fast_sums(
        &self,
        step: usize,
        mut mine: Mine,
        native: NativeType,
        scatter: Option<usize>,
    ) -> Result<HashMap<usize, HostTensor>, RuntimeError> {
        let me = self.group.rank();
        let op = mine.values().next().expect("a process owns at least one device").op.clone();
        let what = format!("step {step} (`{}`)", op.name());
        let groups = groups_of(&mine);
        let mut results = HashMap::with_capacity(mine.len());
        for g in groups.values() {
            let in_rank_order = |p: usize| {
                let mut v = self.owned_by(g, p);
                v.sort_by_key(|&m| rank_in(g, m));
                v
            };
            let ours = in_rank_order(me);
            let partial = local_sum(ours.iter().map(|m| mine.remove(m).expect("a local member").input));
            let mut processes: Vec<usize> = g.iter().map(|&d| self.owner[d]).collect();
            processes.sort_unstable();
            processes.dedup();
            let ty = partial.ty();
            match scatter {
                None => {
                    let mut out = BlockBuf::new(&ty);
                    let send = tensor_bytes(&partial);
                    // SAFETY: on an error the buffers are leaked below.
                    let done = unsafe {
                        self.group.sum_all_into(
                            self.tag(step, 0),
                            &processes,
                            native,
                            &send,
                            out.bytes_mut(),
                            self.timeout,
                            &what,
                        )
                    };
                    if let Err(e) = done {
                        // Requests may still be in flight out of or into this memory.
                        std::mem::forget(send);
                        std::mem::forget(partial);
                        std::mem::forget(out);
                        return Err(e);
                    }
                    drop(send);
                    hand_out(&mut results, &ours, out.finish()?);
                }
                Some(dim) => {
                    let n = g.len();
                    let piece = |r: usize| {
                        block(&partial, dim, r, n).map_err(|message| RuntimeError::Op { op: op.name().into(), message })
                    };
                    let mut piece_ty = ty.clone();
                    piece_ty.shape[dim] /= n;
                    let piece_elems = piece_ty.num_elements();
                    // Blocks by process, then by rank within each process: the
                    // segments of MPI's reduce-scatter, in communicator order.
                    let order: Vec<Vec<usize>> = processes.iter().map(|&q| in_rank_order(q)).collect();
                    let counts: Vec<usize> = order.iter().map(|ms| ms.len() * piece_elems).collect();
                    let ranks: Vec<usize> = order.iter().flatten().map(|&m| rank_in(g, m)).collect();
                    let send: std::borrow::Cow<'_, [u8]> =
                        if ty.shape[..dim].iter().all(|&s| s == 1) && ranks.iter().copied().eq(0..n) {
                            // Already laid out block after block in that order.
                            tensor_bytes(&partial)
                        } else {
                            let mut bytes = Vec::with_capacity(ty.size_bytes());
                            for &r in &ranks {
                                bytes.extend_from_slice(&tensor_bytes(&piece(r)?));
                            }
                            bytes.into()
                        };
                    let mut outs: Vec<BlockBuf> = ours.iter().map(|_| BlockBuf::new(&piece_ty)).collect();
                    let mut joined = Vec::new();
                    let done = {
                        let recv: &mut [u8] = if outs.len() == 1 {
                            outs[0].bytes_mut()
                        } else {
                            joined = vec![0u8; ours.len() * piece_ty.size_bytes()];
                            &mut joined
                        };
                        // SAFETY: on an error the buffers are leaked below.
                        unsafe {
                            self.group.sum_scatter_into(
                                self.tag(step, 0),
                                &processes,
                                native,
                                &send,
                                &counts,
                                recv,
                                self.timeout,
                                &what,
                            )
                        }
                    };
                    if let Err(e) = done {
                        // Requests may still be in flight out of or into this memory.
                        std::mem::forget(send);
                        std::mem::forget(partial);
                        std::mem::forget(outs);
                        std::mem::forget(joined);
                        return Err(e);
                    }
                    drop(send);
                    if outs.len() == 1 {
                        results.insert(ours[0], outs.pop().expect("one").finish()?);
                    } else {
                        let k = piece_ty.size_bytes();
                        for (i, &m) in ours.iter().enumerate() {
                            results.insert(m, tensor_from(&piece_ty, &joined[i * k..(i + 1) * k])?);
                        }
                    }
                }
            }
        }
        Ok(results)
    }
}

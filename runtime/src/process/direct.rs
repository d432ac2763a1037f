//! Collectives across processes whose messages go straight from and into
//! tensor memory: [`ProcessComm::direct`] (all-reduce of `f32`, and
//! all-gather and all-to-all of contiguous runs).
//!
//! The byte-message paths of [`super::comm`] pack each peer's share into a
//! message, receive into fresh buffers, then copy every block into a typed
//! tensor before folding or concatenating: five to ten passes over the
//! data, most of them into freshly faulted pages. Here each segment is its
//! own message (sent from the contribution's memory, received into the
//! result's memory or into receive space kept from step to step), and the
//! fold writes into the contribution itself, so an all-reduce touches each
//! element about three times. The wire order and the rank-order fold are
//! those of the byte paths, so the results are the same bits.

use super::comm::{chunk, groups_of, hand_out, rank_in, Contribution, ProcessComm};
use crate::collective::combiner;
use crate::error::RuntimeError;
use ndarray::ArrayD;
use std::collections::{BTreeMap, HashMap};
use weft_ir::device::Collective;
use weft_ir::interp::scalar::binary_f32;
use weft_ir::tensor::{tensor_bytes, BlockBuf, HostTensor};
use weft_ir::{BinaryOp, ReduceOp};

/// The contributions of a step, by device.
type Mine = BTreeMap<usize, Contribution>;

impl ProcessComm {
    /// Completes the step straight from and into tensor memory when it can:
    /// an `f32` all-reduce that crosses processes, an all-gather whose
    /// contributions are whole runs of the result (every dimension before
    /// the gathered one has size 1), or an all-to-all whose pieces are
    /// whole runs (likewise for the split and concatenated dimensions).
    /// Gives the contributions back otherwise.
    pub(super) fn direct(
        &self,
        step: usize,
        mine: Mine,
    ) -> Result<Result<HashMap<usize, HostTensor>, RuntimeError>, Mine> {
        let first = mine.values().next().expect("a process owns at least one device");
        let ty = first.input.ty();
        // The choice depends only on the collective and the type, the same
        // in every process of a step (the peers must agree on the messages).
        let same = mine.values().all(|c| c.input.ty() == ty);
        let crosses = mine.values().any(|c| c.group.iter().any(|&d| self.owner[d] != self.group.rank()));
        if !same || !crosses {
            return Err(mine);
        }
        match first.op.clone() {
            Collective::AllReduce { op, .. } if ty.dtype == weft_ir::DType::F32 => {
                Ok(self.all_reduce_f32(step, mine, op))
            }
            Collective::AllGather { dim, .. } if ty.size_bytes() > 0 && ty.shape[..dim].iter().all(|&s| s == 1) => {
                Ok(self.all_gather_runs(step, mine, dim))
            }
            Collective::AllToAll { split_dim, concat_dim, .. }
                if ty.size_bytes() > 0
                    && ty.shape[..split_dim.max(concat_dim)].iter().all(|&s| s == 1)
                    && ty.shape[split_dim] % first.group.len() == 0 =>
            {
                Ok(self.all_to_all_runs(step, mine, split_dim, concat_dim))
            }
            _ => Err(mine),
        }
    }

    /// An `f32` all-reduce as a reduce-scatter then an all-gather of chunks
    /// of the flattened contributions (as [`ProcessComm::complete`]'s byte
    /// path, with the same messages in the same order): the chunks a peer
    /// folds go out from the contributions, the chunks this process folds
    /// come into the reused receive space, each local member folds its
    /// chunk in rank order into its own contribution, and the peers'
    /// folded chunks come straight into the first local member's
    /// contribution (copied to the other local members of the group).
    fn all_reduce_f32(
        &self,
        step: usize,
        mine: Mine,
        rop: ReduceOp,
    ) -> Result<HashMap<usize, HostTensor>, RuntimeError> {
        let first = mine.values().next().expect("a process owns at least one device");
        let (name, len) = (first.op.name(), first.input.ty().num_elements());
        let what = format!("step {step} (`{name}`)");
        let groups = groups_of(&mine);
        let n = groups.values().next().expect("one group at least").len();
        let peers = self.peers(&groups);
        let mut arrays: BTreeMap<usize, ArrayD<f32>> = mine
            .into_iter()
            .map(|(d, c)| match c.input {
                HostTensor::F32(a) if a.is_standard_layout() => (d, a),
                HostTensor::F32(a) => (d, a.as_standard_layout().into_owned()),
                _ => unreachable!("checked by `direct`"),
            })
            .collect();
        let mut scratch = self.scratch.lock().unwrap_or_else(|p| p.into_inner());
        let done = {
            // Each local contribution cut into its `n` chunks.
            let mut chunks: BTreeMap<usize, Vec<&mut [f32]>> =
                arrays.iter_mut().map(|(&d, a)| (d, cut(a.as_slice_mut().expect("standard layout"), len, n))).collect();
            self.reduce_chunks(step, &what, &groups, &peers, &mut chunks, &mut scratch, combiner(rop))
                .and_then(|()| self.gather_chunks(step, &what, &groups, &peers, &mut chunks))
        };
        if let Err(e) = done {
            // Requests may still be in flight into or out of this memory.
            std::mem::forget(arrays);
            std::mem::forget(std::mem::take(&mut *scratch));
            return Err(e);
        }
        Ok(arrays.into_iter().map(|(d, a)| (d, HostTensor::F32(a))).collect())
    }

    /// Phase 1 of [`ProcessComm::all_reduce_f32`]: the member of rank `r`
    /// gets chunk `r` of every contribution and folds them in rank order
    /// into its own chunk `r`.
    #[allow(clippy::too_many_arguments)]
    fn reduce_chunks(
        &self,
        step: usize,
        what: &str,
        groups: &BTreeMap<usize, Vec<usize>>,
        peers: &std::collections::BTreeSet<usize>,
        chunks: &mut BTreeMap<usize, Vec<&mut [f32]>>,
        scratch: &mut Vec<f32>,
        bin: BinaryOp,
    ) -> Result<(), RuntimeError> {
        let me = self.group.rank();
        let len_of = |g: &[usize], m: usize| chunks[&m][rank_in(g, m)].len();
        // Where each received chunk lands: (receiving member, contributing
        // member) -> range of `scratch`, in message order.
        let mut at: HashMap<(usize, usize), std::ops::Range<usize>> = HashMap::new();
        let mut order: Vec<(usize, std::ops::Range<usize>)> = Vec::new();
        let mut total = 0;
        for &q in peers {
            for g in groups.values() {
                let (ours, theirs) = (self.owned_by(g, me), self.owned_by(g, q));
                for &e in &theirs {
                    for &m in &ours {
                        let k = len_of(g, m);
                        at.insert((m, e), total..total + k);
                        order.push((q, total..total + k));
                        total += k;
                    }
                }
            }
        }
        if scratch.len() < total {
            scratch.resize(total, 0.0);
        }
        {
            let mut sends: Vec<(usize, &[u8])> = Vec::new();
            for &q in peers {
                for g in groups.values() {
                    let (ours, theirs) = (self.owned_by(g, me), self.owned_by(g, q));
                    for d in &ours {
                        for &m in &theirs {
                            sends.push((q, f32_bytes(chunks[d][rank_in(g, m)])));
                        }
                    }
                }
            }
            let mut receives: Vec<(usize, &mut [u8])> = Vec::with_capacity(order.len());
            let mut rest: &mut [f32] = &mut scratch[..total];
            for (q, range) in &order {
                let (head, tail) = std::mem::take(&mut rest).split_at_mut(range.len());
                receives.push((*q, f32_bytes_mut(head)));
                rest = tail;
            }
            // SAFETY: on an error the caller leaks the contributions and
            // the receive space.
            unsafe { self.group.exchange_into(self.tag(step, 0), &sends, &mut receives, self.timeout, what)? };
        }
        for g in groups.values() {
            for m in self.owned_by(g, me) {
                let r = rank_in(g, m);
                let out = std::mem::take(&mut chunks.get_mut(&m).expect("local")[r]);
                {
                    let pieces: Vec<Option<&[f32]>> = g
                        .iter()
                        .map(|&k| match chunks.get(&k) {
                            Some(_) if k == m => None,
                            Some(c) => Some(&*c[r]),
                            None => Some(&scratch[at[&(m, k)].clone()]),
                        })
                        .collect();
                    fold_into(out, &pieces, bin);
                }
                chunks.get_mut(&m).expect("local")[r] = out;
            }
        }
        Ok(())
    }

    /// Phase 2 of [`ProcessComm::all_reduce_f32`]: every folded chunk goes
    /// to every process of its group.
    fn gather_chunks(
        &self,
        step: usize,
        what: &str,
        groups: &BTreeMap<usize, Vec<usize>>,
        peers: &std::collections::BTreeSet<usize>,
        chunks: &mut BTreeMap<usize, Vec<&mut [f32]>>,
    ) -> Result<(), RuntimeError> {
        let me = self.group.rank();
        // The peers' chunks land in the first local member's contribution:
        // (peer, group, chunk index, memory).
        let mut landing: Vec<(usize, usize, usize, &mut [f32])> = Vec::new();
        for &q in peers {
            for (&g0, g) in groups {
                let ours = self.owned_by(g, me);
                let Some(&first) = ours.first() else { continue };
                for e in self.owned_by(g, q) {
                    let r = rank_in(g, e);
                    landing.push((q, g0, r, std::mem::take(&mut chunks.get_mut(&first).expect("local")[r])));
                }
            }
        }
        {
            let mut sends: Vec<(usize, &[u8])> = Vec::new();
            for &q in peers {
                for g in groups.values() {
                    if self.owned_by(g, q).is_empty() {
                        continue;
                    }
                    for m in self.owned_by(g, me) {
                        sends.push((q, f32_bytes(chunks[&m][rank_in(g, m)])));
                    }
                }
            }
            let mut receives: Vec<(usize, &mut [u8])> =
                landing.iter_mut().map(|(q, _, _, mem)| (*q, f32_bytes_mut(mem))).collect();
            // SAFETY: on an error the caller leaks the contributions.
            unsafe { self.group.exchange_into(self.tag(step, 1), &sends, &mut receives, self.timeout, what)? };
        }
        // Every local member gets every chunk: the peers' from the landing
        // place, the other local members' from their owners.
        for (_, g0, r, mem) in &landing {
            for m in self.owned_by(&groups[g0], me).into_iter().skip(1) {
                chunks.get_mut(&m).expect("local")[*r].copy_from_slice(mem);
            }
        }
        for g in groups.values() {
            let ours = self.owned_by(g, me);
            for &m in &ours {
                let r = rank_in(g, m);
                let folded = std::mem::take(&mut chunks.get_mut(&m).expect("local")[r]);
                for &o in ours.iter().filter(|&&o| o != m) {
                    chunks.get_mut(&o).expect("local")[r].copy_from_slice(folded);
                }
                chunks.get_mut(&m).expect("local")[r] = folded;
            }
        }
        drop(landing);
        Ok(())
    }

    /// An all-gather whose contributions are whole runs of the result:
    /// each local contribution goes out from its own memory (one message
    /// per contribution and peer, ascending device order, as the byte
    /// path), and each peer's contribution comes straight into its place
    /// in the result.
    fn all_gather_runs(&self, step: usize, mine: Mine, dim: usize) -> Result<HashMap<usize, HostTensor>, RuntimeError> {
        let me = self.group.rank();
        let first = mine.values().next().expect("a process owns at least one device");
        let (name, ty) = (first.op.name(), first.input.ty());
        let what = format!("step {step} (`{name}`)");
        let groups = groups_of(&mine);
        let n = groups.values().next().expect("one group at least").len();
        let block = ty.size_bytes();
        let mut out_ty = ty.clone();
        out_ty.shape[dim] *= n;
        let group_of: BTreeMap<usize, usize> =
            groups.iter().flat_map(|(&g0, g)| g.iter().map(move |&d| (d, g0))).collect();
        let bytes: BTreeMap<usize, std::borrow::Cow<'_, [u8]>> =
            mine.iter().map(|(&d, c)| (d, tensor_bytes(&c.input))).collect();
        let mut outs: BTreeMap<usize, BlockBuf> = groups.keys().map(|&g0| (g0, BlockBuf::new(&out_ty))).collect();
        let done = {
            let mut places: BTreeMap<usize, Vec<&mut [u8]>> =
                outs.iter_mut().map(|(&g0, b)| (g0, b.bytes_mut().chunks_mut(block.max(1)).collect())).collect();
            let mut sends: Vec<(usize, &[u8])> = Vec::new();
            let mut receives: Vec<(usize, &mut [u8])> = Vec::new();
            for &q in &self.peers(&groups) {
                for (&d, b) in &bytes {
                    if !self.owned_by(&groups[&group_of[&d]], q).is_empty() {
                        sends.push((q, &b[..]));
                    }
                }
                for (&e, &g0) in &group_of {
                    if self.owner[e] == q {
                        let r = rank_in(&groups[&g0], e);
                        let place = std::mem::take(&mut places.get_mut(&g0).expect("a local group")[r]);
                        receives.push((q, place));
                    }
                }
            }
            for (&d, b) in &bytes {
                let g0 = group_of[&d];
                places.get_mut(&g0).expect("a local group")[rank_in(&groups[&g0], d)].copy_from_slice(b);
            }
            // SAFETY: on an error the contributions and results are leaked
            // below.
            unsafe { self.group.exchange_into(self.tag(step, 0), &sends, &mut receives, self.timeout, &what) }
        };
        if let Err(e) = done {
            // Requests may still be in flight out of or into this memory.
            std::mem::forget(bytes);
            std::mem::forget(mine);
            std::mem::forget(outs);
            return Err(e);
        }
        drop(bytes);
        let mut results = HashMap::with_capacity(mine.len());
        for (g0, out) in outs {
            hand_out(&mut results, &self.owned_by(&groups[&g0], me), out.finish()?);
        }
        Ok(results)
    }
}

impl ProcessComm {
    /// An all-to-all whose pieces are whole runs of the contributions and
    /// of the results (every dimension before the split and the concatenated
    /// ones has size 1): piece `r` of each local contribution goes out from
    /// its own memory to the member of rank `r` (messages in the order of
    /// [`ProcessComm::complete`]'s byte path), and each peer's piece comes
    /// straight into its place in the receiving member's result.
    fn all_to_all_runs(
        &self,
        step: usize,
        mine: Mine,
        split: usize,
        concat: usize,
    ) -> Result<HashMap<usize, HostTensor>, RuntimeError> {
        let me = self.group.rank();
        let first = mine.values().next().expect("a process owns at least one device");
        let (name, ty) = (first.op.name(), first.input.ty());
        let what = format!("step {step} (`{name}`)");
        let groups = groups_of(&mine);
        let n = groups.values().next().expect("one group at least").len();
        let piece = ty.size_bytes() / n;
        let mut out_ty = ty.clone();
        out_ty.shape[split] /= n;
        out_ty.shape[concat] *= n;
        let bytes: BTreeMap<usize, std::borrow::Cow<'_, [u8]>> =
            mine.iter().map(|(&d, c)| (d, tensor_bytes(&c.input))).collect();
        let mut outs: BTreeMap<usize, BlockBuf> = mine.keys().map(|&d| (d, BlockBuf::new(&out_ty))).collect();
        let done = {
            // Each local member's result cut into the pieces of its members.
            let mut places: BTreeMap<usize, Vec<&mut [u8]>> =
                outs.iter_mut().map(|(&d, b)| (d, b.bytes_mut().chunks_mut(piece).collect())).collect();
            let mut sends: Vec<(usize, &[u8])> = Vec::new();
            let mut receives: Vec<(usize, &mut [u8])> = Vec::new();
            for &q in &self.peers(&groups) {
                for g in groups.values() {
                    let (ours, theirs) = (self.owned_by(g, me), self.owned_by(g, q));
                    for d in &ours {
                        for &m in &theirs {
                            let r = rank_in(g, m);
                            sends.push((q, &bytes[d][r * piece..(r + 1) * piece]));
                        }
                    }
                    for &e in &theirs {
                        for &m in &ours {
                            let k = rank_in(g, e);
                            receives.push((q, std::mem::take(&mut places.get_mut(&m).expect("local")[k])));
                        }
                    }
                }
            }
            for g in groups.values() {
                let ours = self.owned_by(g, me);
                for &m in &ours {
                    let r = rank_in(g, m);
                    for &d in &ours {
                        let k = rank_in(g, d);
                        places.get_mut(&m).expect("local")[k].copy_from_slice(&bytes[&d][r * piece..(r + 1) * piece]);
                    }
                }
            }
            // SAFETY: on an error the contributions and results are leaked
            // below.
            unsafe { self.group.exchange_into(self.tag(step, 0), &sends, &mut receives, self.timeout, &what) }
        };
        if let Err(e) = done {
            // Requests may still be in flight out of or into this memory.
            std::mem::forget(bytes);
            std::mem::forget(mine);
            std::mem::forget(outs);
            return Err(e);
        }
        drop(bytes);
        outs.into_iter().map(|(d, b)| Ok((d, b.finish()?))).collect()
    }
}

/// `s` cut into the `n` chunks [`chunk`] of a flat tensor of `len` elements.
fn cut(mut s: &mut [f32], len: usize, n: usize) -> Vec<&mut [f32]> {
    (0..n)
        .map(|r| {
            let (head, tail) = std::mem::take(&mut s).split_at_mut(chunk(len, n, r).len());
            s = tail;
            head
        })
        .collect()
}

/// Folds `pieces` (in rank order; `None` is `out`'s own value) left to
/// right into `out`, element by element with the interpreter's scalar op:
/// `((p0 op p1) op p2) ...`, the arithmetic and order of
/// [`crate::collective::combine`], so the same bits.
fn fold_into(out: &mut [f32], pieces: &[Option<&[f32]>], bin: BinaryOp) {
    const TILE: usize = 2048;
    let mut acc = [0f32; TILE];
    for start in (0..out.len()).step_by(TILE) {
        let end = (start + TILE).min(out.len());
        let acc = &mut acc[..end - start];
        for (k, p) in pieces.iter().enumerate() {
            let p = p.map_or(&out[start..end], |p| &p[start..end]);
            if k == 0 {
                acc.copy_from_slice(p);
            } else {
                for (x, &y) in acc.iter_mut().zip(p) {
                    *x = binary_f32(bin, *x, y).expect("a float reduction");
                }
            }
        }
        out[start..end].copy_from_slice(acc);
    }
}

/// The bytes of `f32`s (little-endian on the machines weft runs on; the
/// peers are the same binary on the same kind of machine).
fn f32_bytes(s: &[f32]) -> &[u8] {
    // SAFETY: any f32 is 4 initialised bytes; u8 has alignment 1.
    unsafe { std::slice::from_raw_parts(s.as_ptr().cast::<u8>(), std::mem::size_of_val(s)) }
}

/// The bytes of `f32`s, to receive into.
fn f32_bytes_mut(s: &mut [f32]) -> &mut [u8] {
    // SAFETY: as `f32_bytes`, and every byte pattern is a valid f32.
    unsafe { std::slice::from_raw_parts_mut(s.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(s)) }
}

//! Lowering a `reshard` through its [`ReshardPlan`] into device steps.
//!
//! The plan (from [`plan_reshard`], the same one propagation costed) says
//! which axes move how: local slices, reduce-scatters, all-reduces,
//! all-to-alls, all-gathers, local unreduces, and permutes where blocks only
//! change devices. The plan's steps are a set of per-axis moves, not yet a
//! schedule: a gather or an all-to-all can only remove axes that are the
//! *minor-most* ones of their dimension (the group's blocks must be
//! contiguous), and slices, scatters and all-to-alls append axes as minor
//! ones. So this module tracks the sharding the buffer has after each step
//! and runs the plan's moves in plan order, taking first a move that is
//! ready: removals whose axes are minor-most, additions to a dimension no
//! pending move still removes axes from (so `[{x}] -> [{y}]` gathers `x`
//! before slicing `y`, and a pending sum is gathered before it is
//! scattered). When no move is ready (two all-to-alls swapping axes), the
//! first one runs after a collective permute that puts its axes last. The
//! plan's own permute steps are realised the same way: by a permute that
//! reorders a dimension's axes before a gather, or by the final permute
//! that turns the reached sharding into the target when the two differ only
//! in which device holds which block.
//!
//! A permute is computed generically from the two shardings: each device
//! needs one block (its block index per dimension, and its coordinates along
//! unreduced axes, which select the partial sum it holds); devices already
//! holding it keep it, the others receive it from a holder (holders are
//! paired with needers in device order, so every device sends and receives
//! at most once). Replicated-to-unreduced (`local-unreduce`) needs no new
//! step kind: the value is padded with zero copies along a new leading
//! dimension and shard-sliced over the unreduced axes, so the device of
//! rank 0 keeps the value and the others get zeros.

use super::builder::DeviceBuilder;
use crate::sharding::{plan_reshard, Collective as Move, MeshSharding};
use std::collections::BTreeMap;
use weft_ir::device::{BufferId, Collective};
use weft_ir::{Literal, Op, ReduceOp, TensorType};

/// The sharding a buffer has at some point of a reshard.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Layout {
    dims: Vec<Vec<usize>>,
    unreduced: Vec<usize>,
}

impl Layout {
    fn of(s: &MeshSharding) -> Layout {
        Layout { dims: s.dims.iter().map(|d| d.axes.clone()).collect(), unreduced: s.unreduced.clone() }
    }
}

fn removes(m: &Move) -> Option<usize> {
    match m {
        Move::AllGather { dim, .. } => Some(*dim),
        Move::AllToAll { from, .. } => Some(*from),
        _ => None,
    }
}

/// Whether `axes` are, as a set, the last axes of `list`.
fn is_suffix(list: &[usize], axes: &[usize]) -> bool {
    list.len() >= axes.len() && list[list.len() - axes.len()..].iter().all(|a| axes.contains(a))
}

struct Lowerer<'b, 'm> {
    b: &'b mut DeviceBuilder<'m>,
    buf: BufferId,
    at: Layout,
}

/// Lowers the reshard of `input` (a value of global type `ty`) from `from`
/// to `to`; returns the buffer holding the result (`input` itself when
/// nothing moves).
pub(crate) fn lower_reshard(
    b: &mut DeviceBuilder<'_>,
    ty: &TensorType,
    input: BufferId,
    from: &MeshSharding,
    to: &MeshSharding,
) -> BufferId {
    let plan = plan_reshard(ty, from, to, b.mesh);
    let mut pending: Vec<Move> =
        plan.steps.into_iter().filter(|m| !matches!(m, Move::CollectivePermute { .. })).collect();
    let mut l = Lowerer { b, buf: input, at: Layout::of(from) };
    while !pending.is_empty() {
        let i = (0..pending.len()).find(|&i| l.ready(&pending, i)).unwrap_or(0);
        let m = pending.remove(i);
        l.apply(&m);
    }
    let target = Layout::of(to);
    if l.at != target {
        let same_blocks = l.at.unreduced == target.unreduced
            && l.at.dims.iter().zip(&target.dims).all(|(a, b)| l.b.mesh.product(a) == l.b.mesh.product(b));
        assert!(
            same_blocks,
            "reshard of {ty} from {from:?} to {to:?}: the plan's moves reached {:?}, which a permute cannot fix",
            l.at
        );
        l.permute_to(target);
    }
    l.buf
}

impl Lowerer<'_, '_> {
    fn ready(&self, pending: &[Move], i: usize) -> bool {
        let others_remove = |d: usize| pending.iter().enumerate().any(|(j, m)| j != i && removes(m) == Some(d));
        match &pending[i] {
            Move::LocalSlice { dim, .. } | Move::ReduceScatter { dim, .. } => !others_remove(*dim),
            Move::AllReduce { .. } => true,
            Move::AllToAll { axes, from, to } => is_suffix(&self.at.dims[*from], axes) && !others_remove(*to),
            Move::AllGather { axes, dim } => is_suffix(&self.at.dims[*dim], axes),
            Move::LocalUnreduce { axes } => !self.at.dims.iter().flatten().any(|a| axes.contains(a)),
            Move::CollectivePermute { .. } => true,
        }
    }

    fn apply(&mut self, m: &Move) {
        match m {
            Move::LocalSlice { axes, dim } => {
                let mut dims = vec![Vec::new(); self.at.dims.len()];
                dims[*dim] = axes.clone();
                self.buf = self.b.shard_slice(self.buf, &dims);
                self.at.dims[*dim].extend(axes);
            }
            Move::ReduceScatter { axes, dim } => {
                let d = *dim;
                self.buf = self.b.collective(self.buf, axes, |axes| Collective::ReduceScatter {
                    dim: d,
                    axes,
                    op: ReduceOp::Sum,
                });
                self.at.unreduced.retain(|a| !axes.contains(a));
                self.at.dims[d].extend(axes);
            }
            Move::AllReduce { axes } => {
                self.buf = self.b.collective(self.buf, axes, |axes| Collective::AllReduce { axes, op: ReduceOp::Sum });
                self.at.unreduced.retain(|a| !axes.contains(a));
            }
            Move::AllToAll { axes, from, to } => {
                let order = self.make_suffix(*from, axes);
                let (f, t) = (*from, *to);
                self.buf = self.b.collective(self.buf, &order, |axes| Collective::AllToAll {
                    split_dim: t,
                    concat_dim: f,
                    axes,
                });
                let keep = self.at.dims[f].len() - order.len();
                self.at.dims[f].truncate(keep);
                self.at.dims[t].extend(order);
            }
            Move::AllGather { axes, dim } => {
                let order = self.make_suffix(*dim, axes);
                let d = *dim;
                self.buf = self.b.collective(self.buf, &order, |axes| Collective::AllGather { dim: d, axes });
                let keep = self.at.dims[d].len() - order.len();
                self.at.dims[d].truncate(keep);
            }
            Move::LocalUnreduce { axes } => self.unreduce(axes),
            Move::CollectivePermute { .. } => unreachable!("permutes are realised by reordering"),
        }
    }

    /// Reorders dimension `dim` so that `axes` are its minor-most axes
    /// (permuting blocks if needed); returns them in their order there.
    fn make_suffix(&mut self, dim: usize, axes: &[usize]) -> Vec<usize> {
        let list = &self.at.dims[dim];
        assert!(axes.iter().all(|a| list.contains(a)), "axes {axes:?} do not split dimension {dim} ({list:?})");
        if !is_suffix(list, axes) {
            let mut target = self.at.clone();
            let (mut keep, mut moved): (Vec<usize>, Vec<usize>) = list.iter().partition(|a| !axes.contains(a));
            keep.append(&mut moved);
            target.dims[dim] = keep;
            self.permute_to(target);
        }
        let list = &self.at.dims[dim];
        list[list.len() - axes.len()..].to_vec()
    }

    /// Moves blocks between devices so the buffer is laid out as `target`
    /// (which has the same number of blocks per dimension and the same
    /// unreduced axes).
    fn permute_to(&mut self, target: Layout) {
        let mesh = self.b.mesh;
        let key = |l: &Layout, coords: &[usize]| -> Vec<usize> {
            let mut k: Vec<usize> = l.dims.iter().map(|d| mesh.shape().rank_in(coords, d)).collect();
            k.extend(l.unreduced.iter().map(|&a| coords[a]));
            k
        };
        let mut holders: BTreeMap<Vec<usize>, Vec<u32>> = BTreeMap::new();
        let mut needers: BTreeMap<Vec<usize>, Vec<u32>> = BTreeMap::new();
        for p in 0..mesh.num_devices() {
            let c = mesh.coords_of_position(p);
            holders.entry(key(&self.at, &c)).or_default().push(p as u32);
            needers.entry(key(&target, &c)).or_default().push(p as u32);
        }
        let mut pairs = Vec::with_capacity(mesh.num_devices());
        for (k, need) in needers {
            let mut have = holders.remove(&k).unwrap_or_default();
            let mut rest = Vec::new();
            for t in need {
                match have.iter().position(|&s| s == t) {
                    Some(i) => {
                        have.remove(i);
                        pairs.push((t, t));
                    }
                    None => rest.push(t),
                }
            }
            assert_eq!(have.len(), rest.len(), "block {k:?} is held and needed by different numbers of devices");
            pairs.extend(have.into_iter().zip(rest));
        }
        pairs.sort_unstable();
        self.buf = self.b.permute(self.buf, pairs);
        self.at = target;
    }

    /// Replicated -> unreduced over `axes`: rank 0 of each group keeps the
    /// value, the others hold zeros.
    fn unreduce(&mut self, axes: &[usize]) {
        let n = self.b.mesh.product(axes);
        if n > 1 {
            let t = self.b.ty(self.buf).clone();
            let r = t.rank();
            let mut shape1 = vec![1];
            shape1.extend(&t.shape);
            let lifted = self.b.compute(
                Op::Reshape { shape: shape1.clone() },
                vec![self.buf],
                TensorType::new(t.dtype, shape1.clone()),
            );
            let zero = self.b.compute(Op::Constant(Literal::scalar(t.dtype, 0.0)), vec![], TensorType::scalar(t.dtype));
            let mut high = vec![0i64; r + 1];
            high[0] = n as i64 - 1;
            let mut padded_shape = shape1.clone();
            padded_shape[0] = n;
            let padded = self.b.compute(
                Op::Pad { low: vec![0; r + 1], high, interior: vec![0; r + 1] },
                vec![lifted, zero],
                TensorType::new(t.dtype, padded_shape),
            );
            let mut dims = vec![Vec::new(); r + 1];
            dims[0] = axes.to_vec();
            let mine = self.b.shard_slice(padded, &dims);
            self.buf = self.b.compute(Op::Reshape { shape: t.shape.clone() }, vec![mine], t);
        }
        self.at.unreduced.extend(axes);
        self.at.unreduced.sort_unstable();
    }
}

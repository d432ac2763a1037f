//! What each member of a collective's group receives: the one definition
//! of collective semantics, shared by the reference simulator
//! ([`super::sim`]) and every runtime communicator.
//!
//! Reductions fold left over the members in rank order with the
//! interpreter's binary ops ([`eval_op`]), `((b0 op b1) op b2) ...`, so a
//! sum of `bf16` buffers rounds after every addition, and every executor
//! gets bit-identical results whatever its kernels do. The `f32`
//! reductions fold in place with the same scalar op in the same order (the
//! same bits, no allocation); gathers and all-to-alls copy row-major runs.
//! Which devices form a group, and their ranks, is
//! [`DeviceProgram::groups`](super::DeviceProgram::groups).

use super::Collective;
use crate::interp::eval_op;
use crate::interp::scalar::binary_f32;
use crate::tensor::HostTensor;
use crate::{BinaryOp, Op, ReduceOp};

/// The one result of `op` (failures are named by the caller, which knows
/// the collective).
fn eval1(op: &Op, xs: &[&HostTensor]) -> Result<HostTensor, String> {
    let mut out = eval_op(op, xs).map_err(|e| e.to_string())?;
    Ok(out.remove(0))
}

/// The elementwise op that combines two contributions of a reduction.
pub fn combiner(op: ReduceOp) -> BinaryOp {
    match op {
        ReduceOp::Sum => BinaryOp::Add,
        ReduceOp::Max => BinaryOp::Max,
        ReduceOp::Min => BinaryOp::Min,
    }
}

/// Left fold of the blocks in rank order, `((b0 op b1) op b2) ...`, with
/// `eval` computing the combining binary op.
fn fold_in_rank_order<T: Clone, E: From<String>>(
    blocks: &[T],
    op: ReduceOp,
    eval: &mut OpEval<'_, T, E>,
) -> Result<T, E> {
    let bin = Op::Binary(combiner(op));
    let (first, rest) = blocks.split_first().ok_or_else(|| E::from("a group has at least one member".to_string()))?;
    rest.iter().try_fold(first.clone(), |acc, b| eval(&bin, &[&acc, b]))
}

/// The accumulated array, and the other members' arrays.
type Folded = (ndarray::ArrayD<f32>, Vec<ndarray::ArrayD<f32>>);

/// Whether `blocks` are `f32` contributions the `f32` fast paths fold
/// ([`fold_f32_range`] and the in-place fold): at least one, all `f32` in
/// standard layout, of one shape.
pub fn f32_foldable(blocks: &[HostTensor]) -> bool {
    let fits = |t: &HostTensor| matches!(t, HostTensor::F32(a) if a.is_standard_layout());
    !blocks.is_empty() && blocks.iter().all(fits) && blocks.iter().all(|b| b.shape() == blocks[0].shape())
}

/// The rank-order fold of `f32` contributions into member 0's storage, with
/// the interpreter's scalar op (the same arithmetic in the same order as
/// [`fold_in_rank_order`], so the same bits), without allocating.
/// Returns the accumulated array and the other members' arrays, or gives
/// the blocks back for other dtypes, layouts or mismatched shapes.
fn fold_f32_in_place(blocks: Vec<HostTensor>, op: ReduceOp) -> Result<Folded, Vec<HostTensor>> {
    if !f32_foldable(&blocks) {
        return Err(blocks);
    }
    let mut arrays = blocks.into_iter().map(|b| match b {
        HostTensor::F32(a) => a,
        _ => unreachable!("checked above"),
    });
    let mut first = arrays.next().expect("checked non-empty");
    let rest: Vec<ndarray::ArrayD<f32>> = arrays.collect();
    let bin = combiner(op);
    let acc = first.as_slice_mut().expect("standard layout");
    for b in &rest {
        for (x, &y) in acc.iter_mut().zip(b.as_slice().expect("standard layout")) {
            *x = binary_f32(bin, *x, y).expect("a float reduction");
        }
    }
    Ok((first, rest))
}

/// Elements `range` (of the row-major order) of the rank-order fold of
/// `f32` contributions, `((b0 op b1) op b2) ...` with the interpreter's
/// scalar op: the same bits as those elements of [`combine`]'s
/// all-reduce, so members that share memory can fold disjoint ranges of
/// one all-reduce in parallel. `None` for other dtypes, non-standard
/// layouts, contributions of different shapes or a range past the end.
pub fn fold_f32_range(blocks: &[&HostTensor], op: ReduceOp, range: std::ops::Range<usize>) -> Option<Vec<f32>> {
    let slices: Vec<&[f32]> = blocks
        .iter()
        .map(|b| match b {
            HostTensor::F32(a) if a.is_standard_layout() && a.shape() == blocks[0].shape() => a.as_slice(),
            _ => None,
        })
        .collect::<Option<_>>()?;
    let (first, rest) = slices.split_first()?;
    let mut acc = first.get(range.clone())?.to_vec();
    let bin = combiner(op);
    for b in rest {
        for (x, &y) in acc.iter_mut().zip(&b[range.clone()]) {
            *x = binary_f32(bin, *x, y).expect("a float reduction");
        }
    }
    Some(acc)
}

/// An `f32` all-reduce without allocating: the fold accumulates into
/// member 0's contribution and every other member receives the result in
/// its own contribution's storage.
fn all_reduce_f32_in_place(blocks: Vec<HostTensor>, op: ReduceOp) -> Result<Vec<HostTensor>, Vec<HostTensor>> {
    let (first, mut rest) = fold_f32_in_place(blocks, op)?;
    let acc = first.as_slice().expect("standard layout");
    for b in rest.iter_mut() {
        b.as_slice_mut().expect("standard layout").copy_from_slice(acc);
    }
    Ok(std::iter::once(first).chain(rest).map(HostTensor::F32).collect())
}

/// The `slice` that takes block `i` of `n` equal blocks along `dim` of a
/// value of shape `shape`.
fn block_op(shape: &[usize], dim: usize, i: usize, n: usize) -> Op {
    let size = shape[dim] / n;
    let start = (0..shape.len()).map(|d| if d == dim { i * size } else { 0 }).collect();
    let limit = (0..shape.len()).map(|d| if d == dim { (i + 1) * size } else { shape[d] }).collect();
    Op::Slice { start, limit, stride: vec![1; shape.len()] }
}

/// Block `i` of `n` equal blocks of `t` along `dim`.
pub fn block(t: &HostTensor, dim: usize, i: usize, n: usize) -> Result<HostTensor, String> {
    eval1(&block_op(t.shape(), dim, i, n), &[t])
}

/// What each member of one group receives, given the members'
/// contributions in rank order. (Not for `collective_permute`, which is
/// not formed of groups: see [`permute`].)
pub fn combine(op: &Collective, blocks: Vec<HostTensor>) -> Result<Vec<HostTensor>, String> {
    let n = blocks.len();
    let blocks = match op {
        Collective::AllReduce { op, .. } => match all_reduce_f32_in_place(blocks, *op) {
            Ok(out) => return Ok(out),
            Err(blocks) => blocks,
        },
        Collective::ReduceScatter { dim, op, .. } => match fold_f32_in_place(blocks, *op) {
            Ok((sum, _)) => {
                let sum = HostTensor::F32(sum);
                return (0..n).map(|r| block(&sum, *dim, r, n)).collect();
            }
            Err(blocks) => blocks,
        },
        _ => blocks,
    };
    let shape = blocks.first().map(|b| b.shape().to_vec()).unwrap_or_default();
    combine_with(op, blocks, &shape, &mut |op, xs| eval1(op, xs))
}

/// One op on values of some kind (for [`combine_with`]).
pub type OpEval<'a, T, E> = dyn FnMut(&Op, &[&T]) -> Result<T, E> + 'a;

/// [`combine`]'s arithmetic for values of any kind: `eval` computes one op
/// (a binary op of the reduction, a `slice`, a `concatenate`) on values
/// of the contributions' `shape`. [`combine`] is this with the
/// interpreter; a device that holds every member's buffer (logical
/// devices sharing one GPU) runs it with its own kernels, and since those
/// are bitwise the interpreter's, so is the result.
pub fn combine_with<T: Clone, E: From<String>>(
    op: &Collective,
    blocks: Vec<T>,
    shape: &[usize],
    eval: &mut OpEval<'_, T, E>,
) -> Result<Vec<T>, E> {
    let n = blocks.len();
    match op {
        Collective::AllGather { dim, .. } => {
            let refs: Vec<&T> = blocks.iter().collect();
            let all = eval(&Op::Concatenate { dim: *dim }, &refs)?;
            Ok(vec![all; n])
        }
        Collective::AllReduce { op, .. } => {
            let sum = fold_in_rank_order(&blocks, *op, eval)?;
            Ok(vec![sum; n])
        }
        Collective::ReduceScatter { dim, op, .. } => {
            let sum = fold_in_rank_order(&blocks, *op, eval)?;
            (0..n).map(|r| eval(&block_op(shape, *dim, r, n), &[&sum])).collect()
        }
        Collective::AllToAll { split_dim, concat_dim, .. } => {
            let pieces: Vec<Vec<T>> = blocks
                .iter()
                .map(|b| (0..n).map(|j| eval(&block_op(shape, *split_dim, j, n), &[b])).collect())
                .collect::<Result<_, _>>()?;
            (0..n)
                .map(|r| {
                    let received: Vec<&T> = pieces.iter().map(|p| &p[r]).collect();
                    eval(&Op::Concatenate { dim: *concat_dim }, &received)
                })
                .collect()
        }
        Collective::CollectivePermute { .. } => {
            Err(E::from("collective_permute has no groups; use `permute`".to_string()))
        }
    }
}

/// What one member of a reduce-scatter or all-to-all receives, from only
/// the pieces it needs: `pieces[k]` is the block of member `k`'s
/// contribution (in rank order) that this member gets (block `r` along the
/// split dimension, for the member of rank `r`). The same arithmetic in
/// the same order as [`combine`], so the same bits; it lets a member
/// that lives in another process receive `1/n` of each contribution.
pub fn combine_pieces(op: &Collective, pieces: Vec<HostTensor>) -> Result<HostTensor, String> {
    match op {
        Collective::ReduceScatter { op, .. } => match fold_f32_in_place(pieces, *op) {
            Ok((sum, _)) => Ok(HostTensor::F32(sum)),
            Err(pieces) => fold_in_rank_order(&pieces, *op, &mut |op, xs| eval1(op, xs)),
        },
        Collective::AllToAll { concat_dim, .. } => {
            let refs: Vec<&HostTensor> = pieces.iter().collect();
            eval1(&Op::Concatenate { dim: *concat_dim }, &refs)
        }
        other => Err(format!("{} is not combined from pieces", other.name())),
    }
}

/// What member `rank` of one group receives, given the members'
/// contributions in rank order: bitwise `combine(op, blocks)[rank]`,
/// computing only that member's result. For a gather, an all-to-all or a
/// reduce-scatter this is `1/n` of [`combine`]'s work (a reduce-scatter
/// folds only this member's block), so members that share memory can each
/// build their own result, in parallel, from the same contributions. An
/// all-reduce's result is every member's whole fold: computed here in
/// full, so a communicator computes it once for the group instead
/// ([`combine`]), or has its members fold disjoint ranges of it
/// ([`fold_f32_range`]).
pub fn member_result(op: &Collective, blocks: &[HostTensor], rank: usize) -> Result<HostTensor, String> {
    let n = blocks.len();
    if rank >= n {
        return Err(format!("member {rank} of a group of {n}"));
    }
    match op {
        Collective::AllGather { dim, .. } => {
            let refs: Vec<&HostTensor> = blocks.iter().collect();
            eval1(&Op::Concatenate { dim: *dim }, &refs)
        }
        Collective::ReduceScatter { dim, .. } | Collective::AllToAll { split_dim: dim, .. } => {
            if blocks.iter().any(|b| b.shape() != blocks[0].shape()) {
                return Err("contributions of different shapes".to_string());
            }
            let pieces = blocks.iter().map(|b| block(b, *dim, rank, n)).collect::<Result<Vec<_>, _>>()?;
            combine_pieces(op, pieces)
        }
        Collective::AllReduce { op, .. } => match fold_f32_in_place(blocks.to_vec(), *op) {
            Ok((sum, _)) => Ok(HostTensor::F32(sum)),
            Err(blocks) => fold_in_rank_order(&blocks, *op, &mut |op, xs| eval1(op, xs)),
        },
        Collective::CollectivePermute { .. } => Err("collective_permute has no groups; use `permute`".to_string()),
    }
}

/// The dimension a reduce-scatter or all-to-all splits each contribution
/// along (one piece per member), if `op` is one.
pub fn split_dim(op: &Collective) -> Option<usize> {
    match op {
        Collective::ReduceScatter { dim, .. } => Some(*dim),
        Collective::AllToAll { split_dim, .. } => Some(*split_dim),
        _ => None,
    }
}

/// `collective_permute` over all devices: device `t` receives the buffer of
/// `s` for each pair `(s, t)`; devices that are no target receive zeros.
pub fn permute(pairs: &[(u32, u32)], inputs: &[HostTensor]) -> Vec<HostTensor> {
    let mut out: Vec<HostTensor> = inputs.iter().map(|t| HostTensor::zeros(&t.ty())).collect();
    for &(s, t) in pairs {
        out[t as usize] = inputs[s as usize].clone();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_give_the_bits_of_the_whole_combine() {
        let n = 3;
        let contribution = |k: usize| {
            let v: Vec<f32> = (0..36).map(|i| ((i * 7 + k * 13) % 11) as f32 * 0.1 - 0.3 + k as f32 * 1e-7).collect();
            HostTensor::from_f32(&[6, 6], v).unwrap()
        };
        let ops = [
            Collective::ReduceScatter { dim: 0, axes: vec!["x".into()], op: ReduceOp::Sum },
            Collective::ReduceScatter { dim: 1, axes: vec!["x".into()], op: ReduceOp::Max },
            Collective::AllToAll { split_dim: 0, concat_dim: 1, axes: vec!["x".into()] },
            Collective::AllToAll { split_dim: 1, concat_dim: 1, axes: vec!["x".into()] },
        ];
        for op in ops {
            let whole = combine(&op, (0..n).map(contribution).collect()).unwrap();
            let dim = split_dim(&op).unwrap();
            for (r, want) in whole.iter().enumerate() {
                let pieces = (0..n).map(|k| block(&contribution(k), dim, r, n).unwrap()).collect();
                let got = combine_pieces(&op, pieces).unwrap();
                assert!(got.bitwise_eq(want), "{op:?} member {r}");
            }
        }
        let op = Collective::AllGather { dim: 0, axes: vec![] };
        assert!(combine_pieces(&op, vec![contribution(0)]).is_err());
        assert_eq!(split_dim(&op), None);
    }

    #[test]
    fn a_member_result_is_that_member_of_the_whole_combine() {
        let n = 4;
        let contribution = |k: usize| {
            let v: Vec<f32> = (0..48).map(|i| ((i * 5 + k * 11) % 13) as f32 * 0.37 - 1.1 + k as f32 * 3e-7).collect();
            HostTensor::from_f32(&[4, 12], v).unwrap()
        };
        let bf16 = |k: usize| {
            let v: Vec<f32> = (0..48).map(|i| ((i * 3 + k) % 7) as f32 * 0.013).collect();
            HostTensor::from_f32(&[4, 12], v).unwrap().convert(crate::DType::BF16)
        };
        let x = || vec!["x".to_string()];
        let ops = [
            Collective::AllGather { dim: 0, axes: x() },
            Collective::AllGather { dim: 1, axes: x() },
            Collective::AllReduce { axes: x(), op: ReduceOp::Sum },
            Collective::AllReduce { axes: x(), op: ReduceOp::Max },
            Collective::ReduceScatter { dim: 0, axes: x(), op: ReduceOp::Sum },
            Collective::ReduceScatter { dim: 1, axes: x(), op: ReduceOp::Min },
            Collective::AllToAll { split_dim: 1, concat_dim: 0, axes: x() },
            Collective::AllToAll { split_dim: 0, concat_dim: 1, axes: x() },
        ];
        for make in [&contribution as &dyn Fn(usize) -> HostTensor, &bf16] {
            for op in &ops {
                let blocks: Vec<HostTensor> = (0..n).map(make).collect();
                let whole = combine(op, blocks.clone()).unwrap();
                for (r, want) in whole.iter().enumerate() {
                    let got = member_result(op, &blocks, r).unwrap();
                    assert!(got.bitwise_eq(want), "{op:?} member {r}");
                }
                assert!(member_result(op, &blocks, n).is_err());
            }
        }
    }

    #[test]
    fn a_folded_range_has_the_bits_of_the_whole_fold() {
        let blocks: Vec<HostTensor> = (0..5)
            .map(|k| {
                let v: Vec<f32> =
                    (0..30).map(|i| ((i * 7 + k * 3) % 11) as f32 * 0.31 - 1.7 + k as f32 * 1e-7).collect();
                HostTensor::from_f32(&[5, 6], v).unwrap()
            })
            .collect();
        for op in [ReduceOp::Sum, ReduceOp::Max] {
            let whole = fold_in_rank_order(&blocks, op, &mut |op, xs| eval1(op, xs)).unwrap();
            let whole = whole.as_f32().unwrap().iter().copied().collect::<Vec<f32>>();
            let refs: Vec<&HostTensor> = blocks.iter().collect();
            let mut pieces = fold_f32_range(&refs, op, 0..7).unwrap();
            pieces.extend(fold_f32_range(&refs, op, 7..30).unwrap());
            assert_eq!(
                pieces.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                whole.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
            );
        }
        assert!(fold_f32_range(&blocks.iter().collect::<Vec<_>>(), ReduceOp::Sum, 20..31).is_none());
        let half = blocks[1].convert(crate::DType::BF16);
        assert!(fold_f32_range(&[&blocks[0], &half], ReduceOp::Sum, 0..3).is_none());
    }

    #[test]
    fn in_place_all_reduce_has_the_bits_of_the_fold() {
        let t = |v: Vec<f32>| HostTensor::from_f32(&[2, 3], v).unwrap();
        let blocks = || {
            vec![
                t(vec![0.1, -0.0, 3.5, f32::NAN, 1e30, -7.25]),
                t(vec![0.2, 0.0, -3.5, 1.0, 1e30, 1e-30]),
                t(vec![0.3, -0.0, 1e-8, 2.0, -1e30, 3.0]),
            ]
        };
        for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min] {
            let fold: HostTensor = fold_in_rank_order(&blocks(), op, &mut |op, xs| eval1(op, xs)).unwrap();
            let fast = all_reduce_f32_in_place(blocks(), op).unwrap();
            assert_eq!(fast.len(), 3);
            for r in &fast {
                assert!(r.bitwise_eq(&fold), "{op:?}: {r:?} vs {fold:?}");
            }
        }
        // Other dtypes are given back untouched.
        let ints =
            vec![HostTensor::from_values(&crate::TensorType::new(crate::DType::I32, vec![2]), &[1.0, 2.0]).unwrap(); 2];
        assert!(all_reduce_f32_in_place(ints, ReduceOp::Sum).is_err());
    }

    #[test]
    fn all_to_all_transposes_blocks() {
        let t = |v: Vec<f32>| HostTensor::from_f32(&[2, 2], v).unwrap();
        let op = Collective::AllToAll { split_dim: 0, concat_dim: 1, axes: vec!["x".into()] };
        let out = combine(&op, vec![t(vec![1., 2., 3., 4.]), t(vec![5., 6., 7., 8.])]).unwrap();
        // Rank 0 receives row 0 of each, joined along dim 1.
        assert!(out[0].bitwise_eq(&HostTensor::from_f32(&[1, 4], vec![1., 2., 5., 6.]).unwrap()));
        assert!(out[1].bitwise_eq(&HostTensor::from_f32(&[1, 4], vec![3., 4., 7., 8.]).unwrap()));
    }
}

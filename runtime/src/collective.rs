//! Host-side collectives: which devices form a group, and what each member
//! receives.
//!
//! The executor stages collectives through the host: it downloads the
//! group's contributions, calls [`combine`] (or [`permute`]) and uploads
//! the results. Reductions fold left over the members in rank order with
//! the interpreter's binary ops ([`eval_op`]), so a sum of `bf16` buffers
//! rounds after every addition exactly as the CPU backend would, and every
//! backend gets bit-identical results whatever its kernels do. Which
//! devices form a group, and their ranks, is `weft_ir::device`'s
//! ([`DeviceProgram::groups`](weft_ir::device::DeviceProgram::groups)).

use crate::error::RuntimeError;
use weft_ir::device::Collective;
use weft_ir::interp::eval_op;
use weft_ir::interp::scalar::binary_f32;
use weft_ir::tensor::HostTensor;
use weft_ir::{BinaryOp, Op, ReduceOp};

fn ir(op: &str, e: impl std::fmt::Display) -> RuntimeError {
    RuntimeError::Op { op: op.to_string(), message: e.to_string() }
}

fn eval1(op: &Op, xs: &[&HostTensor], what: &str) -> Result<HostTensor, RuntimeError> {
    let mut out = eval_op(op, xs).map_err(|e| ir(what, e))?;
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

/// Left fold of the blocks in rank order: `((b0 op b1) op b2) ...`.
fn reduce_in_rank_order(blocks: &[HostTensor], op: ReduceOp, what: &str) -> Result<HostTensor, RuntimeError> {
    let bin = Op::Binary(combiner(op));
    let (first, rest) = blocks.split_first().expect("a group has at least one member");
    rest.iter().try_fold(first.clone(), |acc, b| eval1(&bin, &[&acc, b], what))
}

/// The accumulated array, and the other members' arrays.
type Folded = (ndarray::ArrayD<f32>, Vec<ndarray::ArrayD<f32>>);

/// The rank-order fold of `f32` contributions into member 0's storage, with
/// the interpreter's scalar op (the same arithmetic in the same order as
/// [`reduce_in_rank_order`], so the same bits), without allocating.
/// Returns the accumulated array and the other members' arrays, or gives
/// the blocks back for other dtypes, layouts or mismatched shapes.
fn fold_f32_in_place(blocks: Vec<HostTensor>, op: ReduceOp) -> Result<Folded, Vec<HostTensor>> {
    let fits = |t: &HostTensor| matches!(t, HostTensor::F32(a) if a.is_standard_layout());
    if blocks.is_empty() || !blocks.iter().all(fits) || blocks.iter().any(|b| b.shape() != blocks[0].shape()) {
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

/// Block `i` of `n` equal blocks of `t` along `dim`.
pub fn block(t: &HostTensor, dim: usize, i: usize, n: usize, what: &str) -> Result<HostTensor, RuntimeError> {
    let shape = t.shape();
    let size = shape[dim] / n;
    let start: Vec<usize> = (0..shape.len()).map(|d| if d == dim { i * size } else { 0 }).collect();
    let limit: Vec<usize> = (0..shape.len()).map(|d| if d == dim { (i + 1) * size } else { shape[d] }).collect();
    let stride = vec![1; shape.len()];
    eval1(&Op::Slice { start, limit, stride }, &[t], what)
}

fn concat(blocks: &[&HostTensor], dim: usize, what: &str) -> Result<HostTensor, RuntimeError> {
    eval1(&Op::Concatenate { dim }, blocks, what)
}

/// What each member of one group receives, given the members'
/// contributions in rank order. (Not for `collective_permute`, which is
/// not formed of groups: see [`permute`].)
pub fn combine(op: &Collective, blocks: Vec<HostTensor>) -> Result<Vec<HostTensor>, RuntimeError> {
    let what = op.name();
    let n = blocks.len();
    let blocks = match op {
        Collective::AllReduce { op, .. } => match all_reduce_f32_in_place(blocks, *op) {
            Ok(out) => return Ok(out),
            Err(blocks) => blocks,
        },
        Collective::ReduceScatter { dim, op, .. } => match fold_f32_in_place(blocks, *op) {
            Ok((sum, _)) => {
                let sum = HostTensor::F32(sum);
                return (0..n).map(|r| block(&sum, *dim, r, n, what)).collect();
            }
            Err(blocks) => blocks,
        },
        _ => blocks,
    };
    let blocks = &blocks[..];
    match op {
        Collective::AllGather { dim, .. } => {
            let refs: Vec<&HostTensor> = blocks.iter().collect();
            let all = concat(&refs, *dim, what)?;
            Ok(vec![all; n])
        }
        Collective::AllReduce { op, .. } => {
            let sum = reduce_in_rank_order(blocks, *op, what)?;
            Ok(vec![sum; n])
        }
        Collective::ReduceScatter { dim, op, .. } => {
            let sum = reduce_in_rank_order(blocks, *op, what)?;
            (0..n).map(|r| block(&sum, *dim, r, n, what)).collect()
        }
        Collective::AllToAll { split_dim, concat_dim, .. } => {
            let pieces: Vec<Vec<HostTensor>> = blocks
                .iter()
                .map(|b| (0..n).map(|j| block(b, *split_dim, j, n, what)).collect())
                .collect::<Result<_, _>>()?;
            (0..n)
                .map(|r| {
                    let received: Vec<&HostTensor> = pieces.iter().map(|p| &p[r]).collect();
                    concat(&received, *concat_dim, what)
                })
                .collect()
        }
        Collective::CollectivePermute { .. } => Err(ir(what, "collective_permute has no groups; use `permute`")),
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
            let fold = reduce_in_rank_order(&blocks(), op, "t").unwrap();
            let fast = all_reduce_f32_in_place(blocks(), op).unwrap();
            assert_eq!(fast.len(), 3);
            for r in &fast {
                assert!(r.bitwise_eq(&fold), "{op:?}: {r:?} vs {fold:?}");
            }
        }
        // Other dtypes are given back untouched.
        let ints = vec![
            HostTensor::from_values(&weft_ir::TensorType::new(weft_ir::DType::I32, vec![2]), &[1.0, 2.0])
                .unwrap();
            2
        ];
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

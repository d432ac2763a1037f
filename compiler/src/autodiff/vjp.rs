//! Vector-Jacobian products: one rule per differentiable op.
//!
//! Each rule receives the operands and the result of the forward
//! instruction (already emitted in the new function) and the cotangent `g`
//! of the result, emits the cotangent contribution for every operand, and
//! returns them in operand order (`None` where no gradient flows, e.g. a
//! `select` predicate). The rules follow JAX's `lax` transpose rules; where
//! the derivative is not unique (ties in max/min and in reduce_max/min) the
//! cotangent is split evenly among the tied inputs, as `lax` does.

use crate::emit::Emitter;
use weft_ir::{BinaryOp, CompareOp, DotDims, IndexOp, Op, ReduceOp, UnaryOp, ValueId};

/// Cotangent contributions of `op`'s operands.
pub(super) fn vjp(e: &mut Emitter<'_>, op: &Op, xs: &[ValueId], y: ValueId, g: ValueId) -> Vec<Option<ValueId>> {
    match op {
        Op::Constant(_) | Op::Iota { .. } | Op::Compare(_) | Op::Call { .. } => vec![None; xs.len()],
        Op::Unary(u) => vec![unary(e, *u, xs[0], y, g)],
        Op::Binary(b) => binary(e, *b, xs[0], xs[1], y, g),
        Op::Select => {
            let zero = e.full_like(g, 0.0);
            let t = e.select(xs[0], g, zero);
            let f = e.select(xs[0], zero, g);
            vec![None, Some(t), Some(f)]
        }
        Op::Convert { .. } => {
            let from = e.ty(xs[0]).dtype;
            if from.is_float() {
                vec![Some(e.convert(g, from))]
            } else {
                vec![None]
            }
        }
        Op::BroadcastInDim { dims, shape } => {
            let xt = e.ty(xs[0]);
            let summed: Vec<usize> = (0..shape.len())
                .filter(|d| match dims.iter().position(|x| x == d) {
                    None => true,
                    Some(i) => xt.shape[i] == 1 && shape[*d] != 1,
                })
                .collect();
            let s = e.reduce_sum(g, summed);
            vec![Some(e.reshape(s, xt.shape.clone()))]
        }
        Op::Reshape { .. } => {
            let shape = e.ty(xs[0]).shape;
            vec![Some(e.reshape(g, shape))]
        }
        Op::Transpose { perm } => {
            let mut inv = vec![0; perm.len()];
            for (i, &p) in perm.iter().enumerate() {
                inv[p] = i;
            }
            vec![Some(e.transpose(g, inv))]
        }
        Op::Slice { start, limit: _, stride } => {
            let xt = e.ty(xs[0]);
            let gt = e.ty(g);
            let low: Vec<i64> = start.iter().map(|&s| s as i64).collect();
            let high: Vec<i64> = (0..xt.rank())
                .map(|d| {
                    let n = gt.shape[d] as i64;
                    let last = if n == 0 { start[d] as i64 - 1 } else { start[d] as i64 + (n - 1) * stride[d] as i64 };
                    xt.shape[d] as i64 - last - 1
                })
                .collect();
            let interior: Vec<usize> = stride.iter().map(|&s| s - 1).collect();
            let zero = e.scalar(gt.dtype, 0.0);
            vec![Some(pad_or_zeros(e, g, zero, low, high, interior, &xt.shape))]
        }
        Op::Concatenate { dim } => {
            let gt = e.ty(g);
            let mut offset = 0;
            let mut out = Vec::with_capacity(xs.len());
            for &x in xs {
                let xt = e.ty(x);
                let mut start = vec![0; gt.rank()];
                let mut limit = gt.shape.clone();
                start[*dim] = offset;
                limit[*dim] = offset + xt.shape[*dim];
                offset += xt.shape[*dim];
                out.push(Some(e.op(Op::Slice { start, limit, stride: vec![1; gt.rank()] }, &[g])));
            }
            out
        }
        Op::Pad { low, high, interior } => {
            // JAX's pad transpose: un-pad with negated low/high, then take
            // every (interior+1)-th element; the pad value gets the rest.
            let xt = e.ty(xs[0]);
            let zero = e.scalar(xt.dtype, 0.0);
            let nlow: Vec<i64> = low.iter().map(|l| -l).collect();
            let nhigh: Vec<i64> = high.iter().map(|h| -h).collect();
            let unpadded = e.op(Op::Pad { low: nlow, high: nhigh, interior: vec![0; xt.rank()] }, &[g, zero]);
            let ut = e.ty(unpadded);
            let stride: Vec<usize> = interior.iter().map(|i| i + 1).collect();
            let tx = e.op(Op::Slice { start: vec![0; xt.rank()], limit: ut.shape.clone(), stride }, &[unpadded]);
            let all_g: Vec<usize> = (0..xt.rank()).collect();
            let total_g = e.reduce_sum(g, all_g.clone());
            let total_x = e.reduce_sum(tx, all_g);
            let tp = e.sub(total_g, total_x);
            vec![Some(tx), Some(tp)]
        }
        Op::DotGeneral(dims) => {
            let lhs = dot_transpose_lhs(e, g, xs[0], xs[1], dims, false);
            let swapped = DotDims {
                lhs_batch: dims.rhs_batch.clone(),
                rhs_batch: dims.lhs_batch.clone(),
                lhs_contract: dims.rhs_contract.clone(),
                rhs_contract: dims.lhs_contract.clone(),
            };
            let rhs = dot_transpose_lhs(e, g, xs[1], xs[0], &swapped, true);
            vec![Some(lhs), Some(rhs)]
        }
        Op::Reduce { op: ReduceOp::Sum, dims } => {
            let xt = e.ty(xs[0]);
            vec![Some(broadcast_back(e, g, dims, &xt.shape))]
        }
        Op::Reduce { op: _, dims } => {
            // Split the cotangent evenly among the elements equal to the
            // extremum (lax's reduce chooser rule).
            let xt = e.ty(xs[0]);
            let yb = broadcast_back(e, y, dims, &xt.shape);
            let hit = e.compare(CompareOp::Eq, xs[0], yb);
            let ind = e.convert(hit, xt.dtype);
            let counts = e.reduce_sum(ind, dims.clone());
            let share = e.div(g, counts);
            let sb = broadcast_back(e, share, dims, &xt.shape);
            vec![Some(e.mul(sb, ind))]
        }
        Op::Index(i) => index(e, i, xs, g),
        Op::ShardingConstraint { sharding } => {
            // Gradients get the same sharding as their primals.
            vec![Some(e.op(Op::ShardingConstraint { sharding: sharding.clone() }, &[g]))]
        }
        Op::Reshard { .. } => vec![Some(g)],
    }
}

/// The indexing ops: a gather's transpose is the scatter-add of its
/// cotangent to the same indices (and back), a prefix sum's is the suffix
/// sum; indices and `top_k`'s positions take no gradient.
fn index(e: &mut Emitter<'_>, op: &IndexOp, xs: &[ValueId], g: ValueId) -> Vec<Option<ValueId>> {
    match *op {
        IndexOp::Gather { axis, batch_dims } => {
            let size = e.ty(xs[0]).shape[axis];
            vec![Some(e.op(Op::Index(IndexOp::ScatterAdd { axis, batch_dims, size }), &[xs[1], g])), None]
        }
        IndexOp::ScatterAdd { axis, batch_dims, .. } => {
            vec![None, Some(e.op(Op::Index(IndexOp::Gather { axis, batch_dims }), &[g, xs[0]]))]
        }
        IndexOp::Cumsum { dim, reverse } => {
            vec![Some(e.op(Op::Index(IndexOp::Cumsum { dim, reverse: !reverse }), &[g]))]
        }
        IndexOp::TopK { .. } => vec![None],
    }
}

/// Pads `g` back to `shape`; when every element was sliced away, zeros.
fn pad_or_zeros(
    e: &mut Emitter<'_>,
    g: ValueId,
    zero: ValueId,
    low: Vec<i64>,
    high: Vec<i64>,
    interior: Vec<usize>,
    shape: &[usize],
) -> ValueId {
    let gt = e.ty(g);
    if gt.num_elements() == 0 {
        let t = gt.with_dtype(gt.dtype);
        return e.full(&weft_ir::TensorType::new(t.dtype, shape.to_vec()), 0.0);
    }
    e.op(Op::Pad { low, high, interior }, &[g, zero])
}

/// Broadcasts a reduced value back over the reduced `dims` of `shape`.
fn broadcast_back(e: &mut Emitter<'_>, v: ValueId, dims: &[usize], shape: &[usize]) -> ValueId {
    let kept: Vec<usize> = (0..shape.len()).filter(|d| !dims.contains(d)).collect();
    e.broadcast(v, kept, shape.to_vec())
}

fn unary(e: &mut Emitter<'_>, u: UnaryOp, x: ValueId, y: ValueId, g: ValueId) -> Option<ValueId> {
    Some(match u {
        UnaryOp::Neg => e.neg(g),
        UnaryOp::Abs => {
            let s = e.unary(UnaryOp::Sign, x);
            e.mul(g, s)
        }
        UnaryOp::Exp => e.mul(g, y),
        UnaryOp::Log => e.div(g, x),
        UnaryOp::Log1p => {
            let d = e.add_const(x, 1.0);
            e.div(g, d)
        }
        UnaryOp::Tanh => {
            let y2 = e.mul(y, y);
            let one = e.full_like(y, 1.0);
            let d = e.sub(one, y2);
            e.mul(g, d)
        }
        UnaryOp::Cos => {
            let s = e.unary(UnaryOp::Sin, x);
            let gs = e.mul(g, s);
            e.neg(gs)
        }
        UnaryOp::Sin => {
            let c = e.unary(UnaryOp::Cos, x);
            e.mul(g, c)
        }
        UnaryOp::Logistic => {
            let one = e.full_like(y, 1.0);
            let omy = e.sub(one, y);
            let d = e.mul(y, omy);
            e.mul(g, d)
        }
        UnaryOp::Sqrt => {
            let gy = e.div(g, y);
            e.mul_const(gy, 0.5)
        }
        UnaryOp::Rsqrt => {
            // d/dx x^-1/2 = -1/2 x^-3/2 = -1/2 * y / x
            let yx = e.div(y, x);
            let d = e.mul_const(yx, -0.5);
            e.mul(g, d)
        }
        UnaryOp::Sign | UnaryOp::Floor | UnaryOp::Not | UnaryOp::IsFinite => return None,
    })
}

fn binary(e: &mut Emitter<'_>, b: BinaryOp, x: ValueId, yv: ValueId, out: ValueId, g: ValueId) -> Vec<Option<ValueId>> {
    match b {
        BinaryOp::Add => vec![Some(g), Some(g)],
        BinaryOp::Sub => vec![Some(g), Some(e.neg(g))],
        BinaryOp::Mul => vec![Some(e.mul(g, yv)), Some(e.mul(g, x))],
        BinaryOp::Div => {
            let gx = e.div(g, yv);
            // d/dy (x/y) = -x/y^2 = -(x/y)/y
            let q = e.div(out, yv);
            let gq = e.mul(g, q);
            vec![Some(gx), Some(e.neg(gq))]
        }
        BinaryOp::Rem => {
            // x - y*trunc(x/y): d/dx = 1, d/dy = -trunc(x/y).
            let q = e.div(x, yv);
            let s = e.unary(UnaryOp::Sign, q);
            let a = e.unary(UnaryOp::Abs, q);
            let fl = e.unary(UnaryOp::Floor, a);
            let t = e.mul(s, fl);
            let gt = e.mul(g, t);
            vec![Some(g), Some(e.neg(gt))]
        }
        BinaryOp::Max | BinaryOp::Min => {
            // Balanced: ties split the cotangent in half, like lax.max.
            let dt = e.ty(x).dtype;
            let (cx, cy) =
                if b == BinaryOp::Max { (CompareOp::Gt, CompareOp::Lt) } else { (CompareOp::Lt, CompareOp::Gt) };
            let wx = e.compare(cx, x, yv);
            let wy = e.compare(cy, x, yv);
            let eq = e.compare(CompareOp::Eq, x, yv);
            let wxf = e.convert(wx, dt);
            let wyf = e.convert(wy, dt);
            let eqf = e.convert(eq, dt);
            let half = e.mul_const(eqf, 0.5);
            let fx = e.add(wxf, half);
            let fy = e.add(wyf, half);
            vec![Some(e.mul(g, fx)), Some(e.mul(g, fy))]
        }
        BinaryOp::Pow => {
            // d/dx x^y = y * x^(y-1); d/dy x^y = log(x) * x^y (0 where x == 0).
            let ym1 = e.add_const(yv, -1.0);
            let p = e.binary(BinaryOp::Pow, x, ym1);
            let d = e.mul(yv, p);
            let gx = e.mul(g, d);
            let zero = e.full_like(x, 0.0);
            let is_zero = e.compare(CompareOp::Eq, x, zero);
            let one = e.full_like(x, 1.0);
            let safe_x = e.select(is_zero, one, x);
            let lx = e.unary(UnaryOp::Log, safe_x);
            let dy = e.mul(lx, out);
            let gy = e.mul(g, dy);
            vec![Some(gx), Some(gy)]
        }
        BinaryOp::And | BinaryOp::Or | BinaryOp::Xor | BinaryOp::ShiftLeft | BinaryOp::ShiftRightLogical => {
            vec![None, None]
        }
    }
}

/// JAX's `_dot_general_transpose_lhs`: the cotangent of `x` in
/// `dot_general(x, y, dims)` (or of `y` when `swap_ans`, with `dims` swapped).
fn dot_transpose_lhs(
    e: &mut Emitter<'_>,
    g: ValueId,
    x: ValueId,
    y: ValueId,
    dims: &DotDims,
    swap_ans: bool,
) -> ValueId {
    let x_rank = e.ty(x).rank();
    let y_rank = e.ty(y).rank();
    let remaining = |rank: usize, a: &[usize], b: &[usize]| -> Vec<usize> {
        (0..rank).filter(|d| !a.contains(d) && !b.contains(d)).collect()
    };
    let x_kept = remaining(x_rank, &dims.lhs_contract, &dims.lhs_batch);
    let y_kept = remaining(y_rank, &dims.rhs_contract, &dims.rhs_batch);
    let nb = dims.lhs_batch.len();
    // x's contracting dims in the order of y's contracting dims ascending.
    let mut order: Vec<usize> = (0..dims.rhs_contract.len()).collect();
    order.sort_by_key(|&i| dims.rhs_contract[i]);
    if nb == 0 {
        // `dot(y, g)` yields [x contract (that order), x kept]; when that is
        // x's own dimension order (the weight of `h @ w`), it is the
        // gradient itself, with no transpose to materialise.
        let swapped: Vec<usize> = order.iter().map(|&i| dims.lhs_contract[i]).chain(x_kept.iter().copied()).collect();
        if swapped.iter().enumerate().all(|(i, &d)| i == d) {
            let ans_y: Vec<usize> = if swap_ans {
                (0..y_kept.len()).collect()
            } else {
                (x_kept.len()..x_kept.len() + y_kept.len()).collect()
            };
            let d = DotDims { lhs_batch: vec![], rhs_batch: vec![], lhs_contract: y_kept, rhs_contract: ans_y };
            return e.dot(y, g, d);
        }
    }
    let ans_batch: Vec<usize> = (0..nb).collect();
    let ans_y: Vec<usize> = if swap_ans {
        (nb..nb + y_kept.len()).collect()
    } else {
        (nb + x_kept.len()..nb + x_kept.len() + y_kept.len()).collect()
    };
    let d =
        DotDims { lhs_batch: ans_batch, rhs_batch: dims.rhs_batch.clone(), lhs_contract: ans_y, rhs_contract: y_kept };
    let prod = e.dot(g, y, d);
    // The product's dims are [x batch, x kept, x contract (ordered by y's
    // contracting dims ascending)]; permute back to x's order.
    let mut src: Vec<usize> = dims.lhs_batch.clone();
    src.extend(&x_kept);
    src.extend(order.iter().map(|&i| dims.lhs_contract[i]));
    let mut perm = vec![0; src.len()];
    let mut pairs: Vec<(usize, usize)> = src.iter().enumerate().map(|(i, &d)| (d, i)).collect();
    pairs.sort();
    for (d, (_, i)) in pairs.into_iter().enumerate() {
        perm[d] = i;
    }
    e.transpose(prod, perm)
}

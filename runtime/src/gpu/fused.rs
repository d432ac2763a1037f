//! Host side of fusion for the CubeCL backend: a chain becomes one
//! [`fused_float`] launch when its result is a float, every value in it is
//! a float of one storage type or a `bool`, and every op is a float op, a
//! comparison, a select, a boolean `not`, an `is_finite`, a conversion
//! between those types, a splat (a scalar `broadcast_in_dim`, a splat
//! `constant`) or a `broadcast_in_dim` that keeps dimension order (its
//! operand read through an index map); other chains (integers, mixed float
//! storage, a `bool` result) run node by node.

use super::elementwise::{BinaryF, UnaryF};
use super::kernels_fused::{fused_float, Access, FusedExpr, FusedOp, Source};
use super::ops::{binary_float_op, compare_kind, unary_float_op, with_float};
use super::storage::{Rounding, Storage};
use super::{CubeBuffer, CubeclBackend};
use crate::backend::compute_unfused;
use crate::error::RuntimeError;
use crate::fusion::{Arg, FusedChain};
use cubecl::prelude::*;
use weft_ir::{BinaryOp, DType, Literal, LiteralData, Op, TensorType, UnaryOp};

/// The float op of a node, if it has one (`convert` between dtypes of one
/// float storage type is a rounding).
fn node_op(op: &Op, f64_math: bool) -> Option<FusedOpKind> {
    let transcendental = |u: UnaryOp| {
        !matches!(u, UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Sqrt | UnaryOp::Rsqrt | UnaryOp::Sign | UnaryOp::Floor)
    };
    match op {
        Op::Unary(UnaryOp::Not | UnaryOp::IsFinite) => None,
        Op::Unary(u) => Some(FusedOpKind::Unary(unary_float_op(*u), transcendental(*u) && !f64_math)),
        Op::Binary(b) if b.accepts(DType::F32) => {
            Some(FusedOpKind::Binary(binary_float_op(*b), *b == BinaryOp::Pow && !f64_math))
        }
        Op::Convert { .. } => Some(FusedOpKind::Unary(UnaryF::Id, false)),
        _ => None,
    }
}

enum FusedOpKind {
    /// The op, and whether it is an f64 transcendental the device lacks.
    Unary(UnaryF, bool),
    Binary(BinaryF, bool),
}

/// The expression of `chain` if it can run as one kernel: its storage type,
/// the nodes (inputs first) and where each input goes. `inputs` are the
/// chain's inputs followed by one rank-0 buffer per splat constant;
/// `constants[n]` is node `n`'s (an index into `inputs`) when it is one.
/// Every value must be a float of one storage type or a `bool`, and the
/// result a float.
fn expression<R: Runtime>(
    be: &CubeclBackend<R>,
    chain: &FusedChain,
    inputs: &[&CubeBuffer<R>],
    constants: &[Option<usize>],
) -> Option<(DType, FusedExpr, Vec<Source>)> {
    let last = chain.nodes.last()?;
    let storage = Storage::of(last.ty.dtype);
    if !matches!(storage, Storage::F32 | Storage::F64) || !last.ty.dtype.is_float() {
        return None;
    }
    let float = |d: DType| d.is_float() && Storage::of(d) == storage;
    let fits = |d: DType| float(d) || d == DType::Bool;
    if !inputs.iter().all(|b| fits(b.ty.dtype)) || !chain.nodes.iter().all(|n| fits(n.ty.dtype)) {
        return None;
    }
    let f64_math = storage != Storage::F64 || be.f64_math;
    // Inputs of the chain's size are read at each element; the rank-0
    // inputs of splats (a scalar `broadcast_in_dim`, a splat constant)
    // once per thread; the operands of broadcasts only through those
    // (their register holds a placeholder: element 0).
    let len = last.ty.num_elements();
    let (mut floats, mut masks) = (0, 0);
    let sources: Vec<Source> = inputs
        .iter()
        .map(|b| {
            let (count, source): (&mut usize, fn(usize) -> Source) =
                if b.ty.dtype == DType::Bool { (&mut masks, Source::Mask) } else { (&mut floats, Source::Float) };
            *count += 1;
            source(*count - 1)
        })
        .collect();
    let mut nodes: Vec<(FusedOp, Rounding)> = inputs
        .iter()
        .zip(&sources)
        .map(|(b, &s)| {
            (FusedOp::Load(s, if b.len() == len { Access::Element } else { Access::Scalar }), Rounding::None)
        })
        .collect();
    let reg = |a: &Arg| match *a {
        Arg::Input(k) => k,
        Arg::Node(n) => inputs.len() + n,
    };
    let dtype_of = |a: &Arg| match *a {
        Arg::Input(k) => inputs[k].ty.dtype,
        Arg::Node(n) => chain.nodes[n].ty.dtype,
    };
    for (n, node) in chain.nodes.iter().enumerate() {
        let rnd = Rounding::of(node.ty.dtype);
        let op = match (&node.op, constants.get(n).copied().flatten()) {
            (Op::Constant(_), Some(k)) => FusedOp::Unary(UnaryF::Id, k),
            (Op::BroadcastInDim { dims, .. }, _) => match node.args[0] {
                Arg::Input(k) if inputs[k].len() != len => {
                    FusedOp::Load(sources[k], Access::Broadcast(index_map(&inputs[k].ty.shape, dims, &node.ty.shape)))
                }
                // A rank-0 operand or one of the result's own shape (the
                // broadcast keeps dimension order): the value as it is.
                ref a => FusedOp::Unary(UnaryF::Id, reg(a)),
            },
            (Op::Compare(c), _) => FusedOp::Compare(compare_kind(*c), reg(&node.args[0]), reg(&node.args[1])),
            (Op::Select, _) => FusedOp::Select(reg(&node.args[0]), reg(&node.args[1]), reg(&node.args[2])),
            (Op::Unary(UnaryOp::Not), _) if node.ty.dtype == DType::Bool => FusedOp::Not(reg(&node.args[0])),
            (Op::Unary(UnaryOp::IsFinite), _) => FusedOp::IsFinite(reg(&node.args[0])),
            // To `bool`: not zero. From `bool`: 0 or 1 as they are.
            (Op::Convert { to: DType::Bool }, _) if float(dtype_of(&node.args[0])) => {
                FusedOp::NonZero(reg(&node.args[0]))
            }
            (Op::Convert { .. }, _) if dtype_of(&node.args[0]) == DType::Bool || float(dtype_of(&node.args[0])) => {
                FusedOp::Unary(UnaryF::Id, reg(&node.args[0]))
            }
            (op, _) if float(node.ty.dtype) && node.args.iter().all(|a| float(dtype_of(a))) => {
                match node_op(op, f64_math)? {
                    FusedOpKind::Unary(_, true) | FusedOpKind::Binary(_, true) => return None,
                    FusedOpKind::Unary(u, false) => FusedOp::Unary(u, reg(&node.args[0])),
                    FusedOpKind::Binary(b, false) => FusedOp::Binary(b, reg(&node.args[0]), reg(&node.args[1])),
                }
            }
            _ => return None,
        };
        nodes.push((op, rnd));
    }
    let dtype = if storage == Storage::F64 { DType::F64 } else { DType::F32 };
    Some((dtype, FusedExpr { nodes }, sources))
}

/// The `(pitch, extent, stride)` of each result dimension a
/// `broadcast_in_dim` of an operand of shape `from` (to `to`, operand
/// dimension `j` at result dimension `dims[j]`) varies along: the operand
/// element of result element `i` is at `Σ ((i / pitch) % extent) * stride`.
fn index_map(from: &[usize], dims: &[usize], to: &[usize]) -> Vec<(usize, usize, usize)> {
    let stride = |j: usize| from[j + 1..].iter().product::<usize>();
    let pitch = |d: usize| to[d + 1..].iter().product::<usize>();
    (0..from.len()).filter(|&j| from[j] != 1).map(|j| (pitch(dims[j]), to[dims[j]], stride(j))).collect()
}

/// Runs `chain` as one kernel when possible, node by node otherwise. A
/// splat constant in the chain is read from its rank-0 value, which the
/// device computes once ([`super::constants`]).
pub(super) fn compute_fused<R: Runtime>(
    be: &CubeclBackend<R>,
    chain: &FusedChain,
    inputs: &[&CubeBuffer<R>],
) -> Result<CubeBuffer<R>, RuntimeError> {
    let mut scalars = Vec::new();
    let mut constants = Vec::with_capacity(chain.nodes.len());
    for node in &chain.nodes {
        constants.push(match &node.op {
            Op::Constant(Literal { data: LiteralData::Splat(v), ty }) if ty.dtype.is_float() => {
                let scalar = Literal::splat(TensorType::new(ty.dtype, vec![]), *v);
                scalars.push(super::ops::compute(be, &Op::Constant(scalar), &[])?);
                Some(inputs.len() + scalars.len() - 1)
            }
            _ => None,
        });
    }
    let all: Vec<&CubeBuffer<R>> = inputs.iter().copied().chain(scalars.iter()).collect();
    let Some((storage_dtype, expr, sources)) = expression(be, chain, &all, &constants) else {
        return compute_unfused(be, chain, inputs);
    };
    let ty = chain.nodes.last().expect("a chain has nodes").ty.clone();
    let out = be.empty(&ty);
    if out.len() == 0 {
        return Ok(out);
    }
    let (count, dim) = be.grid(out.len());
    let masks: SequenceArg<R, Array<u32>> =
        all.iter().zip(&sources).filter(|(_, s)| matches!(s, Source::Mask(_))).map(|(b, _)| b.arg()).collect();
    with_float!(storage_dtype, F => {
        let floats: SequenceArg<R, Array<F>> =
            all.iter().zip(&sources).filter(|(_, s)| matches!(s, Source::Float(_))).map(|(b, _)| b.arg()).collect();
        fused_float::launch::<F, R>(&be.client, count, dim, floats, masks, out.arg(), expr)
    });
    Ok(out)
}

//! Host side of fusion for the CubeCL backend: a chain becomes one
//! [`fused_float`] launch when every value in it is stored as the same
//! float type and every op is a float op; other chains (comparisons,
//! selects, integers, mixed storage) run node by node.

use super::elementwise::{BinaryF, UnaryF};
use super::kernels_fused::{fused_float, FusedExpr, FusedOp};
use super::ops::{binary_float_op, unary_float_op, with_float};
use super::storage::{Rounding, Storage};
use super::{CubeBuffer, CubeclBackend};
use crate::backend::compute_unfused;
use crate::error::RuntimeError;
use crate::fusion::{Arg, FusedChain};
use cubecl::prelude::*;
use weft_ir::{BinaryOp, DType, Op, UnaryOp};

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

/// The expression of `chain` if it can run as one kernel: its storage type
/// and the nodes (inputs first).
fn expression<R: Runtime>(
    be: &CubeclBackend<R>,
    chain: &FusedChain,
    inputs: &[&CubeBuffer<R>],
) -> Option<(DType, FusedExpr)> {
    let storage = Storage::of(chain.nodes.last()?.ty.dtype);
    if !matches!(storage, Storage::F32 | Storage::F64) {
        return None;
    }
    let same = |d: DType| d.is_float() && Storage::of(d) == storage;
    if !inputs.iter().all(|b| same(b.ty.dtype)) || !chain.nodes.iter().all(|n| same(n.ty.dtype)) {
        return None;
    }
    let f64_math = storage != Storage::F64 || be.f64_math;
    let mut nodes: Vec<(FusedOp, Rounding)> = (0..inputs.len()).map(|k| (FusedOp::Input(k), Rounding::None)).collect();
    let reg = |a: &Arg| match *a {
        Arg::Input(k) => k,
        Arg::Node(n) => inputs.len() + n,
    };
    for node in &chain.nodes {
        let rnd = Rounding::of(node.ty.dtype);
        let op = match node_op(&node.op, f64_math)? {
            FusedOpKind::Unary(_, true) | FusedOpKind::Binary(_, true) => return None,
            FusedOpKind::Unary(u, false) => FusedOp::Unary(u, reg(&node.args[0])),
            FusedOpKind::Binary(b, false) => FusedOp::Binary(b, reg(&node.args[0]), reg(&node.args[1])),
        };
        nodes.push((op, rnd));
    }
    let dtype = if storage == Storage::F64 { DType::F64 } else { DType::F32 };
    Some((dtype, FusedExpr { nodes }))
}

/// Runs `chain` as one kernel when possible, node by node otherwise.
pub(super) fn compute_fused<R: Runtime>(
    be: &CubeclBackend<R>,
    chain: &FusedChain,
    inputs: &[&CubeBuffer<R>],
) -> Result<CubeBuffer<R>, RuntimeError> {
    let Some((storage_dtype, expr)) = expression(be, chain, inputs) else {
        return compute_unfused(be, chain, inputs);
    };
    let ty = chain.nodes.last().expect("a chain has nodes").ty.clone();
    let out = be.empty(&ty);
    if out.len() == 0 {
        return Ok(out);
    }
    let (count, dim) = be.grid(out.len());
    with_float!(storage_dtype, F => {
        let args: SequenceArg<R, Array<F>> = inputs.iter().map(|b| b.arg()).collect();
        fused_float::launch::<F, R>(&be.client, count, dim, args, out.arg(), expr)
    });
    Ok(out)
}

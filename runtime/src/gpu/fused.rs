//! Host side of fusion for the CubeCL backend: a chain becomes one
//! [`fused_float`] launch when its result is a float, every value in it is
//! a float of one storage type or a `bool`, and every op is a float op, a
//! comparison, a select, a boolean `not`, an `is_finite`, a conversion
//! between those types, a splat (a scalar `broadcast_in_dim`, a splat
//! `constant`) or a `broadcast_in_dim` that keeps dimension order (its
//! operand read through an index map); other chains (integers, mixed float
//! storage, a `bool` result or kept value) run node by node. The result
//! and the values the chain keeps for later steps are written to slots of
//! one allocation, each a view at its own offset.

use super::elementwise::{BinaryF, UnaryF};
use super::kernels_fused::{fused_float, Access, FusedExpr, FusedOp, Source};
use super::ops::{binary_float_op, compare_kind, unary_float_op, with_float};
use super::storage::{Rounding, Storage};
use super::{reduce, CubeBuffer, CubeclBackend};
use crate::backend::compute_unfused;
use crate::error::RuntimeError;
use crate::fusion::{Arg, FusedChain};
use cubecl::prelude::*;
use weft_ir::{BinaryOp, DType, Literal, LiteralData, Op, ReduceOp, TensorType, UnaryOp};

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
    // The result, then the kept values: floats of the chain's storage.
    if !chain.kept.iter().all(|&(n, _)| float(chain.nodes[n].ty.dtype)) {
        return None;
    }
    let mut stores = vec![inputs.len() + chain.nodes.len() - 1];
    stores.extend(chain.kept.iter().map(|&(n, _)| inputs.len() + n));
    Some((Storage::float_of(last.ty.dtype), FusedExpr { nodes, stores, pitch: slot_pitch(len, storage) }, sources))
}

/// The distance in elements between the output slots of a chain of `len`
/// elements: `len` rounded up to 256 bytes, the strictest binding offset
/// alignment a device asks for (Vulkan's `minStorageBufferOffsetAlignment`).
fn slot_pitch(len: usize, storage: Storage) -> usize {
    len.next_multiple_of(256 / storage.size())
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

/// The rank-0 values of `chain`'s float splat constants (which the device
/// computes once, [`super::constants`]), and per node the index its
/// constant takes among the inputs (`inputs` of them, then these).
#[allow(clippy::type_complexity)]
fn splat_scalars<R: Runtime>(
    be: &CubeclBackend<R>,
    chain: &FusedChain,
    inputs: usize,
) -> Result<(Vec<CubeBuffer<R>>, Vec<Option<usize>>), RuntimeError> {
    let mut scalars = Vec::new();
    let mut constants = Vec::with_capacity(chain.nodes.len());
    for node in &chain.nodes {
        constants.push(match &node.op {
            Op::Constant(Literal { data: LiteralData::Splat(v), ty }) if ty.dtype.is_float() => {
                let scalar = Literal::splat(TensorType::new(ty.dtype, vec![]), *v);
                scalars.push(super::ops::compute(be, &Op::Constant(scalar), &[])?);
                Some(inputs + scalars.len() - 1)
            }
            _ => None,
        });
    }
    Ok((scalars, constants))
}

/// A chain ending in a reduction (its value's only reader): one reduction
/// launch that computes the elementwise part where it reads each element
/// ([`reduce::reduce_float`]), when the chain keeps no values, its part
/// fuses and the reduced dimensions are innermost or leading; otherwise
/// the elementwise part as a chain (its value stored), then the reduction.
fn reduced<R: Runtime>(
    be: &CubeclBackend<R>,
    chain: &FusedChain,
    inputs: &[&CubeBuffer<R>],
    op: ReduceOp,
    dims: &[usize],
    ty: &TensorType,
) -> Result<Vec<CubeBuffer<R>>, RuntimeError> {
    // The elementwise part (computed here, never planned: its `output`
    // and `intermediates` are not read).
    let body = FusedChain { nodes: chain.nodes[..chain.nodes.len() - 1].to_vec(), ..chain.clone() };
    let value = body.nodes.last().expect("a reduction ends a chain of two or more");
    if chain.kept.is_empty() {
        let (scalars, constants) = splat_scalars(be, &body, inputs.len())?;
        let all: Vec<&CubeBuffer<R>> = inputs.iter().copied().chain(scalars.iter()).collect();
        if let Some((storage, expr, sources)) = expression(be, &body, &all, &constants) {
            let reads = reduce::Reads { inputs: all, sources, expr, storage };
            if let Some(out) = reduce::reduce_float(be, op, &reads, &value.ty.shape, dims, ty) {
                return Ok(vec![out]);
            }
        }
    }
    // The body's result is the reduced value; should the chain keep it
    // too, that buffer is also the kept one.
    let value_at = body.nodes.len() - 1;
    let body = FusedChain { kept: body.kept.iter().copied().filter(|&(n, _)| n != value_at).collect(), ..body };
    let mut outs = compute_fused(be, &body, inputs)?.into_iter();
    let stored = outs.next().expect("the body's value");
    let mut result = vec![reduce::reduce(be, op, &stored, dims, ty)];
    let mut stored = Some(stored);
    for &(n, _) in &chain.kept {
        result.push(if n == value_at { stored.take().expect("kept once") } else { outs.next().expect("kept value") });
    }
    Ok(result)
}

/// Runs `chain` as one kernel when possible, node by node otherwise,
/// returning its result and then its kept values. A
/// splat constant in the chain is read from its rank-0 value, which the
/// device computes once ([`super::constants`]).
pub(super) fn compute_fused<R: Runtime>(
    be: &CubeclBackend<R>,
    chain: &FusedChain,
    inputs: &[&CubeBuffer<R>],
) -> Result<Vec<CubeBuffer<R>>, RuntimeError> {
    let last = chain.nodes.last().expect("a chain has nodes");
    if let Op::Reduce { op, dims } = &last.op {
        return reduced(be, chain, inputs, *op, dims, &last.ty);
    }
    let (scalars, constants) = splat_scalars(be, chain, inputs.len())?;
    let all: Vec<&CubeBuffer<R>> = inputs.iter().copied().chain(scalars.iter()).collect();
    let Some((storage_dtype, expr, sources)) = expression(be, chain, &all, &constants) else {
        return compute_unfused(be, chain, inputs);
    };
    let ty = last.ty.clone();
    let len = ty.num_elements();
    // One allocation holds every value written, a slot each; the result
    // and kept values are views of their slots.
    let slots = expr.stores.len();
    let es = Storage::of(ty.dtype).size();
    let total = (slots - 1) * expr.pitch + len.max(1);
    let handle = be.client.empty(total * es);
    let types = std::iter::once(ty).chain(chain.kept.iter().map(|&(n, _)| chain.nodes[n].ty.clone()));
    let outs: Vec<CubeBuffer<R>> = types
        .enumerate()
        .map(|(s, ty)| {
            let start = s * expr.pitch;
            let h =
                handle.clone().offset_start((start * es) as u64).offset_end(((total - start - len.max(1)) * es) as u64);
            CubeBuffer { handle: h, ty, _runtime: std::marker::PhantomData }
        })
        .collect();
    if len == 0 {
        return Ok(outs);
    }
    let (count, dim) = be.grid(len);
    let masks: SequenceArg<R, Array<u32>> = reduce::bound(&all, &sources, true);
    // SAFETY: `handle` holds `total` elements of the storage type.
    let out = unsafe { ArrayArg::from_raw_parts(handle, total) };
    with_float!(storage_dtype, F => {
        let floats: SequenceArg<R, Array<F>> = reduce::bound(&all, &sources, false);
        fused_float::launch::<F, R>(&be.client, count, dim, floats, masks, out, len, expr)
    });
    Ok(outs)
}

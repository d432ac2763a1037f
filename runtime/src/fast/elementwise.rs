//! Elementwise work on `f32` as plain loops over slices: single ops, and
//! fused chains ([`crate::fusion::FusedChain`]) evaluated block by block so
//! that each intermediate lives in a small buffer in cache, never in a
//! whole tensor.
//!
//! Every element is computed with the interpreter's own scalar functions
//! ([`weft_ir::interp::scalar`]), so the results are bit for bit the
//! interpreter's. `bool` values inside a chain are carried as `0.0`/`1.0`,
//! `bf16`/`f16` values as `f32` rounded after each op ([`super::halves`]).
//! Anything else (integer or `f64` chains, integer ops) returns `None` and
//! the caller falls back to the interpreter.
//!
//! Splat nodes ([`weft_ir::Op::is_splat`]: a scalar broadcast, a splat
//! constant) fill their block with one value, so a learning rate spread over
//! a parameter costs one cache-sized block, not a tensor.

use super::halves::{narrow, widen, Carry};
use super::pool::Pool;
use super::reduce::RowFold;
use super::simd::{widest, Isa};
use crate::fusion::{self, Arg, FusedChain, FusedNode};
use ndarray::{ArrayD, IxDyn};
use weft_ir::interp::scalar::{binary_f32, compare_f32, unary_f32};
use weft_ir::tensor::HostTensor;
use weft_ir::{BinaryOp, CompareOp, DType, Op, ReduceOp, UnaryOp};

/// Elements per block of a fused chain.
const BLOCK: usize = 1024;

/// Applies `f` to each element (the match on the op is outside the loop).
macro_rules! unary_loop {
    ($op:expr, $a:expr, $out:expr) => {{
        macro_rules! go {
            ($f:expr) => {
                for (o, &x) in $out.iter_mut().zip($a) {
                    *o = $f(x);
                }
            };
        }
        match $op {
            UnaryOp::Neg => go!(|x| unary_f32(UnaryOp::Neg, x).unwrap()),
            UnaryOp::Abs => go!(|x| unary_f32(UnaryOp::Abs, x).unwrap()),
            UnaryOp::Sign => go!(|x| unary_f32(UnaryOp::Sign, x).unwrap()),
            UnaryOp::Exp => go!(|x| unary_f32(UnaryOp::Exp, x).unwrap()),
            UnaryOp::Log => go!(|x| unary_f32(UnaryOp::Log, x).unwrap()),
            UnaryOp::Log1p => go!(|x| unary_f32(UnaryOp::Log1p, x).unwrap()),
            UnaryOp::Tanh => go!(|x| unary_f32(UnaryOp::Tanh, x).unwrap()),
            UnaryOp::Cos => go!(|x| unary_f32(UnaryOp::Cos, x).unwrap()),
            UnaryOp::Sin => go!(|x| unary_f32(UnaryOp::Sin, x).unwrap()),
            UnaryOp::Logistic => go!(|x| unary_f32(UnaryOp::Logistic, x).unwrap()),
            UnaryOp::Sqrt => go!(|x| unary_f32(UnaryOp::Sqrt, x).unwrap()),
            UnaryOp::Rsqrt => go!(|x| unary_f32(UnaryOp::Rsqrt, x).unwrap()),
            UnaryOp::Floor => go!(|x| unary_f32(UnaryOp::Floor, x).unwrap()),
            UnaryOp::IsFinite => go!(|x: f32| if x.is_finite() { 1.0 } else { 0.0 }),
            UnaryOp::Not => return None,
        }
    }};
}

macro_rules! binary_loop {
    ($op:expr, $a:expr, $b:expr, $out:expr) => {{
        macro_rules! go {
            ($f:expr) => {
                for ((o, &x), &y) in $out.iter_mut().zip($a).zip($b) {
                    *o = $f(x, y);
                }
            };
        }
        match $op {
            BinaryOp::Add => go!(|x, y| binary_f32(BinaryOp::Add, x, y).unwrap()),
            BinaryOp::Sub => go!(|x, y| binary_f32(BinaryOp::Sub, x, y).unwrap()),
            BinaryOp::Mul => go!(|x, y| binary_f32(BinaryOp::Mul, x, y).unwrap()),
            BinaryOp::Div => go!(|x, y| binary_f32(BinaryOp::Div, x, y).unwrap()),
            BinaryOp::Rem => go!(|x, y| binary_f32(BinaryOp::Rem, x, y).unwrap()),
            BinaryOp::Max => go!(|x, y| binary_f32(BinaryOp::Max, x, y).unwrap()),
            BinaryOp::Min => go!(|x, y| binary_f32(BinaryOp::Min, x, y).unwrap()),
            BinaryOp::Pow => go!(|x, y| binary_f32(BinaryOp::Pow, x, y).unwrap()),
            _ => return None,
        }
    }};
}

macro_rules! compare_loop {
    ($op:expr, $a:expr, $b:expr, $out:expr) => {{
        macro_rules! go {
            ($c:expr) => {
                for ((o, &x), &y) in $out.iter_mut().zip($a).zip($b) {
                    *o = if compare_f32($c, x, y) { 1.0 } else { 0.0 };
                }
            };
        }
        match $op {
            CompareOp::Eq => go!(CompareOp::Eq),
            CompareOp::Ne => go!(CompareOp::Ne),
            CompareOp::Lt => go!(CompareOp::Lt),
            CompareOp::Le => go!(CompareOp::Le),
            CompareOp::Gt => go!(CompareOp::Gt),
            CompareOp::Ge => go!(CompareOp::Ge),
        }
    }};
}

widest!(
    /// Evaluates one node on a block: `args` are the operand blocks.
    fn node_block = node_block_any(op: &Op, args: &[&[f32]], out: &mut [f32]) -> Option<()>
);

#[inline(always)]
fn node_block_any(op: &Op, args: &[&[f32]], out: &mut [f32]) -> Option<()> {
    match op {
        Op::Unary(u) => unary_loop!(*u, args[0], out),
        Op::Binary(b) => binary_loop!(*b, args[0], args[1], out),
        // Comparisons of f32 (bool operands are compared as 0/1, which
        // orders false < true as the interpreter does).
        Op::Compare(c) => compare_loop!(*c, args[0], args[1], out),
        Op::Select => {
            for (((o, &p), &x), &y) in out.iter_mut().zip(args[0]).zip(args[1]).zip(args[2]) {
                *o = if p != 0.0 { x } else { y };
            }
        }
        // f32 <-> bool conversions (0/1 on both sides; NaN is true).
        Op::Convert { .. } => {
            for (o, &x) in out.iter_mut().zip(args[0]) {
                *o = x;
            }
        }
        // A scalar spread over the block (its operand is the rank-0 input).
        Op::BroadcastInDim { dims, .. } if dims.is_empty() => out.fill(*args[0].first()?),
        _ => return None,
    }
    Some(())
}

/// Whether a chain computes in `f32` — `f32`, `bool` (as 0/1) and the half
/// types ([`Carry`]) — and uses only ops [`node_block`] knows, with
/// operands of the output's shape (or rank 0, read by a broadcast).
fn supported(nodes: &[FusedNode], inputs: &[&HostTensor]) -> bool {
    let carried = |d: DType| Carry::of(d).is_some();
    let Some(full) = nodes.last().map(|n| n.ty.shape.as_slice()) else { return false };
    inputs.iter().all(|t| carried(t.dtype()))
        && nodes.iter().all(|n| {
            carried(n.ty.dtype)
                && n.args.iter().all(|a| match *a {
                    // Inputs of another shape are read by broadcasts only,
                    // but for rank-0 ones (spread over the block).
                    Arg::Input(k) => {
                        inputs[k].shape() == full
                            || inputs[k].shape().is_empty()
                            || matches!(n.op, Op::BroadcastInDim { .. })
                    }
                    Arg::Node(_) => !matches!(&n.op, Op::BroadcastInDim { dims, .. } if !dims.is_empty()),
                })
                && match &n.op {
                    Op::BroadcastInDim { dims, .. } => {
                        fusion::is_ordered_broadcast(&n.op) && (dims.is_empty() || n.ty.shape.as_slice() == full)
                    }
                    Op::Constant(l) => matches!(l.data, weft_ir::LiteralData::Splat(_)),
                    Op::Unary(u) => !matches!(u, UnaryOp::Not),
                    Op::Binary(b) => binary_f32(*b, 0.0, 0.0).is_some(),
                    Op::Compare(_) | Op::Select => true,
                    // Conversions to a float type copy the value and round it
                    // like any node of that type (exact from bool); a
                    // conversion to bool is `x != 0`, not a copy.
                    Op::Convert { to } => *to != DType::Bool,
                    _ => false,
                }
        })
}

/// An input as `f32` elements: f32 tensors in place; strided f32, bool
/// (0/1) and half-precision (widened) tensors as copies.
enum InputData<'a> {
    F32(&'a [f32]),
    Owned(Vec<f32>),
    /// The storage the chain writes its value into ([`fused_into`]).
    Donor,
}

impl<'a> InputData<'a> {
    /// A supported input (see [`supported`]) as `f32` elements.
    fn of(t: &'a HostTensor, pool: &mut Pool) -> InputData<'a> {
        match t {
            HostTensor::F32(a) => a.as_slice().map(InputData::F32).unwrap_or_else(|| {
                InputData::Owned(weft_ir::tensor::to_standard_layout(a.view()).into_raw_vec_and_offset().0)
            }),
            HostTensor::Bool(a) => {
                let mut v = pool.take(a.len());
                match a.as_slice() {
                    Some(bits) => v.iter_mut().zip(bits).for_each(|(o, &b)| *o = f32::from(u8::from(b))),
                    None => v.iter_mut().zip(a.iter()).for_each(|(o, &b)| *o = f32::from(u8::from(b))),
                }
                InputData::Owned(v)
            }
            half => InputData::Owned(widen(half, pool).expect("checked by `supported`").into_raw_vec_and_offset().0),
        }
    }

    fn slice(&self) -> &[f32] {
        match self {
            InputData::F32(s) => s,
            InputData::Owned(v) => v,
            InputData::Donor => &[],
        }
    }
}

/// Computes a fused chain, or `None` if it does not compute in `f32` (the
/// caller then runs it node by node): its value, then the values of
/// [`FusedChain::kept`] in order. Nodes of a half type are rounded to it
/// after each op, as the interpreter does. A trailing `reduce` (see
/// [`FusedReduce`]) folds each block as it is computed.
pub(crate) fn fused(
    chain: &FusedChain,
    inputs: &[&HostTensor],
    pool: &mut Pool,
    threads: usize,
    isa: Isa,
) -> Option<Vec<HostTensor>> {
    let (nodes, reduce) = match chain.nodes.split_last()? {
        (last, body) if matches!(last.op, Op::Reduce { .. }) => {
            match FusedReduce::of(last, body.last()?).filter(|r| r.block().is_some()) {
                Some(r) => (body, Some(r)),
                // A reduction the blocks cannot fold (over leading dimensions:
                // a bias gradient): the body as a chain, then the reduction.
                None => return fused_then_reduced(chain, body, last, inputs, pool, threads, isa),
            }
        }
        _ => (chain.nodes.as_slice(), None),
    };
    if !supported(nodes, inputs) || !keeps_supported(chain, nodes) {
        return None;
    }
    let last = nodes.last()?;
    let len: usize = last.ty.shape.iter().product();
    // Blocks hold whole rows of a reduction, or a whole number of blocks
    // make up a row.
    let block = match &reduce {
        Some(r) => r.block()?,
        None => BLOCK,
    };
    let data: Vec<InputData<'_>> = inputs.iter().map(|t| InputData::of(t, pool)).collect();
    // The chain's value goes straight to `out`, unless a reduction takes it.
    let mut out = match &reduce {
        Some(r) => pool.take(r.kept_shape.iter().product()),
        None => pool.take(len),
    };
    let mut kept: Vec<Vec<f32>> = chain.kept.iter().map(|_| pool.take(len)).collect();
    let spreads = spreads(nodes, inputs);
    let kept_out = kept_slices(chain, &mut kept);
    run_blocks(nodes, &spreads, reduce.as_ref(), &data, None, &mut out, kept_out, len, block, threads, isa)?;
    give_back(data, pool);
    let value = match reduce {
        Some(r) => HostTensor::F32(ArrayD::from_shape_vec(IxDyn(&r.kept_shape), out).expect("sized")),
        None => typed(out, last, pool),
    };
    Some(std::iter::once(value).chain(kept_values(chain, nodes, kept, pool)).collect())
}

/// A chain ending in a reduction that [`FusedReduce`] does not fold: its
/// body computed as a chain of its own (on every thread), then the
/// reduction by [`super::reduce`] (which folds leading dimensions in the
/// interpreter's order). Returns the reduction, then the kept values;
/// `None` where either part has no fast path.
fn fused_then_reduced(
    chain: &FusedChain,
    body: &[FusedNode],
    last: &FusedNode,
    inputs: &[&HostTensor],
    pool: &mut Pool,
    threads: usize,
    isa: Isa,
) -> Option<Vec<HostTensor>> {
    let Op::Reduce { op, dims } = &last.op else { return None };
    if body.len() < 2 && chain.kept.is_empty() {
        return None;
    }
    let body_chain = FusedChain { nodes: body.to_vec(), ..chain.clone() };
    let mut values = fused(&body_chain, inputs, pool, threads, isa)?;
    let Some(reduced) = super::reduce::reduce(*op, &values[0], dims, pool) else {
        values.into_iter().for_each(|v| pool.give(v));
        return None;
    };
    let value = std::mem::replace(&mut values[0], reduced);
    pool.give(value);
    Some(values)
}

/// Whether every kept value of `chain` is a node of `nodes` (not a
/// trailing reduction) of a type [`typed`] writes.
fn keeps_supported(chain: &FusedChain, nodes: &[FusedNode]) -> bool {
    let full = nodes.last().map(|n| n.ty.shape.as_slice());
    chain.kept.iter().all(|&(n, _)| nodes.get(n).is_some_and(|k| Some(k.ty.shape.as_slice()) == full))
}

/// Each kept value's node and its whole storage, for [`run_blocks`].
fn kept_slices<'a>(chain: &FusedChain, kept: &'a mut [Vec<f32>]) -> Vec<(usize, &'a mut [f32])> {
    chain.kept.iter().zip(kept.iter_mut()).map(|(&(n, _), v)| (n, v.as_mut_slice())).collect()
}

/// The kept values, each as a tensor of its node's type.
fn kept_values(chain: &FusedChain, nodes: &[FusedNode], kept: Vec<Vec<f32>>, pool: &mut Pool) -> Vec<HostTensor> {
    chain.kept.iter().zip(kept).map(|(&(n, _), v)| typed(v, &nodes[n], pool)).collect()
}

/// `f32` elements of a node's value as a tensor of its type (`bool` from
/// 0/1, half types narrowed; the elements were rounded to them already).
fn typed(v: Vec<f32>, node: &FusedNode, pool: &mut Pool) -> HostTensor {
    let out = ArrayD::from_shape_vec(IxDyn(&node.ty.shape), v).expect("sized from the type");
    match node.ty.dtype {
        DType::Bool => HostTensor::Bool(out.mapv(|x| x != 0.0)),
        d => narrow(out, d, pool),
    }
}

/// Computes an `f32` chain into the storage of its input `into`, whose last
/// use it is (`donor`; `inputs[into]` is `None`): each block of the donor
/// is read before the chain's value overwrites it, so no other buffer is
/// touched and the result's memory is already in cache. Returns the donor
/// untouched where the chain is not one [`fused`] computes with an `f32`
/// result of the donor's type. Returns the value, then the kept values,
/// as [`fused`] does.
pub(crate) fn fused_into(
    chain: &FusedChain,
    inputs: &[Option<&HostTensor>],
    into: usize,
    donor: HostTensor,
    pool: &mut Pool,
    threads: usize,
    isa: Isa,
) -> Result<Vec<HostTensor>, HostTensor> {
    let Some(last) = chain.nodes.last() else { return Err(donor) };
    let fits = matches!(&donor, HostTensor::F32(a) if a.is_standard_layout() && a.shape() == last.ty.shape.as_slice())
        && last.ty.dtype == DType::F32
        && !matches!(last.op, Op::Reduce { .. });
    let all: Vec<&HostTensor> = inputs.iter().map(|t| t.unwrap_or(&donor)).collect();
    if !fits || !supported(&chain.nodes, &all) || !keeps_supported(chain, &chain.nodes) {
        return Err(donor);
    }
    let spreads = spreads(&chain.nodes, &all);
    drop(all);
    if spreads.iter().flatten().any(|(k, _)| *k == into) {
        // A broadcast reads the donor through its index map (a broadcast
        // to its own shape, as partitioning may leave): not in place.
        return Err(donor);
    }
    let HostTensor::F32(a) = donor else { unreachable!("checked above") };
    let len = a.len();
    let (mut out, offset) = a.into_raw_vec_and_offset();
    let mut data: Vec<InputData<'_>> =
        inputs.iter().map(|t| t.map_or(InputData::Donor, |t| InputData::of(t, pool))).collect();
    if offset.unwrap_or(0) != 0 || out.len() != len {
        // Storage shared with a view: read it as an input, write fresh storage.
        let off = offset.unwrap_or(0);
        data[into] = InputData::Owned(out[off..off + len].to_vec());
        out = pool.take(len);
    }
    let donor_at = matches!(data[into], InputData::Donor).then_some(into);
    let mut kept: Vec<Vec<f32>> = chain.kept.iter().map(|_| pool.take(len)).collect();
    let kept_out = kept_slices(chain, &mut kept);
    let done = run_blocks(&chain.nodes, &spreads, None, &data, donor_at, &mut out, kept_out, len, BLOCK, threads, isa);
    give_back(data, pool);
    done.expect("a supported chain computes");
    let value = HostTensor::F32(ArrayD::from_shape_vec(IxDyn(&last.ty.shape), out).expect("sized from the type"));
    Ok(std::iter::once(value).chain(kept_values(chain, &chain.nodes, kept, pool)).collect())
}

/// The fewest elements a thread of a split chain gets.
const MIN_PER_THREAD: usize = 1 << 16;

/// Runs `nodes` block by block over `len` elements into `out` (or, with a
/// `reduce`, folds the last node's blocks into `out`), writing each kept
/// node's value into its slice of `kept` as well. Input `donor` is the
/// storage of `out` itself: each of its blocks is copied aside before the
/// block is overwritten. Without a reduction, up to `threads` threads each
/// take a contiguous run of whole blocks: every element is computed as one
/// thread would, so the result is bitwise the same.
#[allow(clippy::too_many_arguments)]
fn run_blocks(
    nodes: &[FusedNode],
    spreads: &[Option<(usize, Vec<Spread>)>],
    reduce: Option<&FusedReduce>,
    data: &[InputData<'_>],
    donor: Option<usize>,
    out: &mut [f32],
    kept: Vec<(usize, &mut [f32])>,
    len: usize,
    block: usize,
    threads: usize,
    isa: Isa,
) -> Option<()> {
    // Threads split the elements at whole blocks, and with a reduction at
    // whole rows too (each row folded by one thread, as by one alone); a
    // thread's `out` is its elements, or its rows' folds.
    let (unit, row) = match reduce {
        Some(r) => (block.max(r.row), r.row),
        None => (block, 1),
    };
    let units = len.div_ceil(unit);
    let t = threads.min(len / MIN_PER_THREAD).min(units).max(1);
    if t <= 1 {
        return run_range(nodes, spreads, reduce, data, donor, out, kept, len, 0..len, block, isa);
    }
    std::thread::scope(|s| {
        let mut rest: &mut [f32] = if reduce.is_some() { out } else { &mut out[..len] };
        let mut kept_rest = kept;
        let mut handles = Vec::with_capacity(t);
        let mut base = 0;
        for j in 0..t {
            let end = (units * (j + 1) / t * unit).min(len);
            let (mine, more) = std::mem::take(&mut rest).split_at_mut((end - base) / row);
            rest = more;
            let kept_mine: Vec<(usize, &mut [f32])> = (kept_rest.iter_mut())
                .map(|(n, k)| {
                    let (mine, more) = std::mem::take(k).split_at_mut(end - base);
                    *k = more;
                    (*n, mine)
                })
                .collect();
            let b = base;
            handles.push(s.spawn(move || {
                run_range(nodes, spreads, reduce, data, donor, mine, kept_mine, len, b..end, block, isa)
            }));
            base = end;
        }
        handles.into_iter().try_for_each(|h| h.join().expect("a chain's thread does not panic"))
    })
}

/// [`run_blocks`] over elements `range` of the chain's `len`, `out` and
/// each slice of `kept` holding exactly those (with a `reduce`, `out` holds
/// the folds of the range's rows, which it starts at a row's start).
#[allow(clippy::too_many_arguments)]
fn run_range(
    nodes: &[FusedNode],
    spreads: &[Option<(usize, Vec<Spread>)>],
    reduce: Option<&FusedReduce>,
    data: &[InputData<'_>],
    donor: Option<usize>,
    out: &mut [f32],
    mut kept: Vec<(usize, &mut [f32])>,
    len: usize,
    range: std::ops::Range<usize>,
    block: usize,
    isa: Isa,
) -> Option<()> {
    let (base, end) = (range.start, range.end);
    let carry: Vec<Carry> = nodes.iter().map(|n| Carry::of(n.ty.dtype).expect("checked")).collect();
    // Each splat constant's element, as the interpreter materialises it.
    let consts: Vec<Option<f32>> = nodes.iter().map(|n| splat_value(&n.op)).collect();
    let mut scratch = vec![0f32; nodes.len() * block];
    // A rank-0 input that a node other than a broadcast reads (a select's
    // scalar predicate), spread over a block once.
    let spread_scalars: Vec<Option<Vec<f32>>> = (data.iter().enumerate())
        .map(|(k, d)| {
            let read = |n: &FusedNode| !matches!(n.op, Op::BroadcastInDim { .. }) && n.args.contains(&Arg::Input(k));
            match d.slice() {
                [v] if len != 1 && nodes.iter().any(read) => Some(vec![*v; block]),
                _ => None,
            }
        })
        .collect();
    let mut donor_block = vec![0f32; if donor.is_some() { block } else { 0 }];
    let mut fold = reduce.map(|r| RowFold::new(r.op));
    let mut start = base;
    while start < end {
        let n = block.min(end - start);
        // `out` holds elements `base..end` (or, with a reduce, the folds).
        let at = start - base;
        if donor.is_some() {
            donor_block[..n].copy_from_slice(&out[at..at + n]);
        }
        for (j, node) in nodes.iter().enumerate() {
            let (done, rest) = scratch.split_at_mut(j * block);
            let dst = if j + 1 == nodes.len() && reduce.is_none() { &mut out[at..at + n] } else { &mut rest[..n] };
            let mut args: [&[f32]; 3] = [&[]; 3];
            for (slot, a) in args.iter_mut().zip(&node.args) {
                *slot = match *a {
                    Arg::Input(k) if Some(k) == donor => &donor_block[..n],
                    // A rank-0 input is its one element for a broadcast
                    // (which reads element 0), spread over the block where
                    // another node reads it.
                    Arg::Input(k) => match (data[k].slice(), &spread_scalars[k]) {
                        (s, _) if s.len() == len => &s[start..start + n],
                        (_, Some(b)) => &b[..n],
                        (s, _) => &s[..1],
                    },
                    Arg::Node(i) => &done[i * block..i * block + n],
                };
            }
            match (consts[j], &spreads[j]) {
                (Some(v), _) => dst.fill(v),
                (None, Some((k, map))) => spread_block(data[*k].slice(), map, start, dst),
                (None, None) => node_block(isa, &node.op, &args[..node.args.len()], dst)?,
            }
            carry[j].round(dst);
            if let Some((_, k)) = kept.iter_mut().find(|(n, _)| *n == j) {
                k[start - base..start - base + n].copy_from_slice(dst);
            }
        }
        if let (Some(r), Some(fold)) = (reduce, fold.as_mut()) {
            let j = nodes.len() - 1;
            r.fold_block(fold, &scratch[j * block..j * block + n], start - base, out);
        }
        start += n;
    }
    Some(())
}

/// Returns the inputs' temporary `f32` copies to the pool.
fn give_back(data: Vec<InputData<'_>>, pool: &mut Pool) {
    for d in data {
        if let InputData::Owned(v) = d {
            let n = v.len();
            pool.give(HostTensor::F32(ArrayD::from_shape_vec(IxDyn(&[n]), v).expect("1-d")));
        }
    }
}

/// One dimension a broadcast's result varies its operand along: result
/// element `i` reads operand element `Σ ((i / pitch) % extent) * stride`
/// over the dimensions of its [`spread_map`].
#[derive(Clone, Copy, Debug)]
struct Spread {
    pitch: usize,
    extent: usize,
    stride: usize,
}

/// The index map of a `broadcast_in_dim` of an operand of shape `from`
/// (operand dimension `j` at result dimension `dims[j]`) to `to`: one
/// [`Spread`] per operand dimension longer than 1, in operand order (so
/// pitches decrease: an ordered broadcast).
fn spread_map(from: &[usize], dims: &[usize], to: &[usize]) -> Vec<Spread> {
    (0..from.len())
        .filter(|&j| from[j] != 1)
        .map(|j| Spread {
            pitch: to[dims[j] + 1..].iter().product(),
            extent: to[dims[j]],
            stride: from[j + 1..].iter().product(),
        })
        .collect()
}

/// Per node of a chain: for a broadcast of an input of another shape than
/// the result's, that input and its index map.
fn spreads(nodes: &[FusedNode], inputs: &[&HostTensor]) -> Vec<Option<(usize, Vec<Spread>)>> {
    nodes
        .iter()
        .map(|n| match (&n.op, n.args.first()) {
            (Op::BroadcastInDim { dims, .. }, Some(&Arg::Input(k))) if !dims.is_empty() => {
                Some((k, spread_map(inputs[k].shape(), dims, &n.ty.shape)))
            }
            _ => None,
        })
        .collect()
}

/// Result elements `start..start + out.len()` of a broadcast of `from`
/// under `map`: runs of one operand element (where every varying
/// dimension's pitch exceeds 1) or of consecutive operand elements along
/// the innermost dimension, each found with a few divisions.
fn spread_block(from: &[f32], map: &[Spread], start: usize, out: &mut [f32]) {
    let at = |i: usize| map.iter().map(|m| (i / m.pitch) % m.extent * m.stride).sum::<usize>();
    let end = start + out.len();
    let step = map.iter().map(|m| m.pitch).min().unwrap_or(usize::MAX);
    let mut i = start;
    if step > 1 {
        // Each aligned run of `step` result elements reads one operand element.
        while i < end {
            let run = (i / step + 1).saturating_mul(step).min(end);
            out[i - start..run - start].fill(from[at(i)]);
            i = run;
        }
        return;
    }
    // The innermost dimension has pitch 1: along it, the operand steps by its stride.
    let inner = *map.iter().find(|m| m.pitch == 1).expect("a dimension of pitch 1");
    while i < end {
        let run = (i / inner.extent + 1).saturating_mul(inner.extent).min(end);
        let base = at(i);
        let dst = &mut out[i - start..run - start];
        if inner.stride == 1 {
            dst.copy_from_slice(&from[base..base + dst.len()]);
        } else {
            for (e, o) in dst.iter_mut().enumerate() {
                *o = from[base + e * inner.stride];
            }
        }
        i = run;
    }
}

/// A chain's trailing `reduce` over the trailing dimensions of an `f32`
/// value: rows of `row` elements folded into `kept_shape`, each exactly as
/// [`super::reduce`] folds it ([`RowFold`]), so fusing never changes a bit.
struct FusedReduce {
    op: ReduceOp,
    row: usize,
    kept_shape: Vec<usize>,
}

impl FusedReduce {
    /// The reduction `node` of the value `of`, if it is one this path folds.
    fn of(node: &FusedNode, of: &FusedNode) -> Option<FusedReduce> {
        let Op::Reduce { op, dims } = &node.op else { return None };
        let shape = &of.ty.shape;
        let suffix = !dims.is_empty() && dims.iter().enumerate().all(|(i, &d)| d == shape.len() - dims.len() + i);
        let row: usize = dims.iter().map(|&d| shape.get(d).copied().unwrap_or(0)).product();
        if of.ty.dtype != DType::F32
            || node.ty.dtype != DType::F32
            || !suffix
            || row == 0
            || node.ty.num_elements() == 0
        {
            return None;
        }
        Some(FusedReduce { op: *op, row, kept_shape: node.ty.shape.clone() })
    }

    /// Elements per block: whole rows, or a whole fraction of a row.
    fn block(&self) -> Option<usize> {
        if self.row <= BLOCK {
            Some(self.row * (BLOCK / self.row))
        } else {
            (self.row % BLOCK == 0).then_some(BLOCK)
        }
    }

    /// Folds the block of values starting at element `start` (counted from
    /// the start of the row that `out[0]` folds).
    fn fold_block(&self, fold: &mut RowFold, values: &[f32], start: usize, out: &mut [f32]) {
        if self.row <= values.len() {
            for (r, row) in values.chunks_exact(self.row).enumerate() {
                let mut f = RowFold::new(self.op);
                f.feed(row);
                out[start / self.row + r] = f.finish();
            }
        } else {
            fold.feed(values);
            if (start + values.len()) % self.row == 0 {
                out[start / self.row] = fold.finish();
                *fold = RowFold::new(self.op);
            }
        }
    }
}

/// The element of a splat constant of a carried dtype, as `f32` (exactly the
/// value the interpreter's one-element tensor holds).
fn splat_value(op: &Op) -> Option<f32> {
    let Op::Constant(l) = op else { return None };
    let weft_ir::LiteralData::Splat(v) = l.data else { return None };
    let one = HostTensor::full(&weft_ir::TensorType::new(l.ty.dtype, vec![]), v).convert(DType::F32);
    match one {
        HostTensor::F32(a) => a.first().copied(),
        _ => None,
    }
}

/// One elementwise op on standard-layout `f32` operands of one shape, or on
/// half-precision operands of one dtype (widened, computed in `f32`,
/// rounded once), or `None` (the caller falls back to the interpreter).
pub(crate) fn single(op: &Op, inputs: &[&HostTensor], pool: &mut Pool, isa: Isa) -> Option<HostTensor> {
    let arity = match op {
        Op::Unary(_) => 1,
        Op::Binary(_) | Op::Compare(_) => 2,
        _ => return None,
    };
    if inputs.len() != arity {
        return None;
    }
    let dtype = inputs[0].dtype();
    let shape = inputs[0].shape().to_vec();
    if inputs.iter().any(|t| t.shape() != shape.as_slice() || t.dtype() != dtype) {
        return None;
    }
    let bool_out = match op {
        Op::Unary(UnaryOp::IsFinite) | Op::Compare(_) => true,
        Op::Unary(_) | Op::Binary(_) => false,
        _ => return None,
    };
    let widened: Vec<ArrayD<f32>> = match dtype {
        DType::F32 => Vec::new(),
        DType::BF16 | DType::F16 => inputs.iter().map(|t| widen(t, pool)).collect::<Option<_>>()?,
        _ => return None,
    };
    let slices: Vec<&[f32]> = if widened.is_empty() {
        inputs
            .iter()
            .map(|t| match t {
                HostTensor::F32(a) => a.as_slice(),
                _ => None,
            })
            .collect::<Option<_>>()?
    } else {
        widened.iter().map(|a| a.as_slice().expect("fresh storage")).collect()
    };
    let mut out = pool.take(slices[0].len());
    let done = node_block(isa, op, &slices, &mut out);
    for a in widened {
        pool.give(HostTensor::F32(a));
    }
    done?;
    let out = ArrayD::from_shape_vec(IxDyn(&shape), out).ok()?;
    Some(if bool_out { HostTensor::Bool(out.mapv(|x| x != 0.0)) } else { narrow(out, dtype, pool) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use weft_ir::TensorType;

    /// Ordered broadcasts of operands of other shapes are read through
    /// their index maps on the fast path (the equality tests in
    /// `tests/kernels/fast_cpu.rs` would pass on the fallback too).
    #[test]
    fn broadcast_chains_run_on_the_fast_path() {
        let f = TensorType::new(DType::F32, vec![4, 3]);
        let node = |op, args| FusedNode { op, args, ty: f.clone() };
        let chain = FusedChain {
            inputs: vec![],
            nodes: vec![
                node(Op::BroadcastInDim { dims: vec![1], shape: vec![4, 3] }, vec![Arg::Input(1)]),
                node(Op::Binary(BinaryOp::Add), vec![Arg::Input(0), Arg::Node(0)]),
                node(Op::BroadcastInDim { dims: vec![0], shape: vec![4, 3] }, vec![Arg::Input(2)]),
                node(Op::Binary(BinaryOp::Mul), vec![Arg::Node(1), Arg::Node(2)]),
            ],
            output: weft_ir::device::BufferId(0),
            intermediates: vec![],
            kept: vec![],
            members: vec![0],
        };
        let x = HostTensor::from_f32(&[4, 3], (0..12).map(|i| i as f32).collect()).unwrap();
        let bias = HostTensor::from_f32(&[3], vec![100.0, 200.0, 300.0]).unwrap();
        let scale = HostTensor::from_f32(&[4], vec![1.0, 2.0, 3.0, 4.0]).unwrap();
        let mut pool = Pool::default();
        let got = fused(&chain, &[&x, &bias, &scale], &mut pool, 1, Isa::detect()).expect("the fast path").remove(0);
        let want: Vec<f64> = (0..12).map(|i| ((i as f64) + 100.0 * (1 + i % 3) as f64) * (1 + i / 3) as f64).collect();
        assert_eq!(got.to_f64_vec(), want);
        // A select on a scalar predicate (spread over the block): both ways.
        let node = |op, args| FusedNode { op, args, ty: f.clone() };
        let chain = FusedChain {
            nodes: vec![
                node(Op::Binary(BinaryOp::Mul), vec![Arg::Input(0), Arg::Input(1)]),
                node(Op::Select, vec![Arg::Input(2), Arg::Node(0), Arg::Input(0)]),
            ],
            ..chain
        };
        let y = HostTensor::from_f32(&[4, 3], vec![2.0; 12]).unwrap();
        for p in [true, false] {
            let pred = HostTensor::Bool(ndarray::ArrayD::from_elem(IxDyn(&[]), p));
            let got = fused(&chain, &[&x, &y, &pred], &mut pool, 1, Isa::detect()).expect("the fast path").remove(0);
            let want: Vec<f64> = (0..12).map(|i| if p { 2.0 * i as f64 } else { i as f64 }).collect();
            assert_eq!(got.to_f64_vec(), want, "predicate {p}");
        }
    }

    /// The half-precision paths are taken, not left to the interpreter
    /// (the equality tests in `tests/kernels/fast_cpu.rs` would pass either way).
    #[test]
    fn half_chains_and_ops_run_on_the_fast_path() {
        let h = TensorType::new(DType::BF16, vec![3, 5]);
        let x = HostTensor::zeros(&TensorType::new(DType::F32, vec![3, 5])).convert(DType::BF16);
        let node = |op, args| FusedNode { op, args, ty: h.clone() };
        let chain = FusedChain {
            inputs: vec![],
            nodes: vec![
                node(Op::Unary(UnaryOp::Exp), vec![Arg::Input(0)]),
                node(Op::Binary(BinaryOp::Mul), vec![Arg::Node(0), Arg::Input(0)]),
            ],
            output: weft_ir::device::BufferId(0),
            intermediates: vec![],
            kept: vec![],
            members: vec![0],
        };
        let mut pool = Pool::default();
        assert_eq!(fused(&chain, &[&x], &mut pool, 1, Isa::detect()).map(|t| t[0].dtype()), Some(DType::BF16));
        assert!(single(&Op::Unary(UnaryOp::Exp), &[&x], &mut pool, Isa::detect()).is_some());
        let i = HostTensor::zeros(&TensorType::new(DType::I32, vec![3, 5]));
        assert!(single(&Op::Binary(BinaryOp::Add), &[&i, &i], &mut pool, Isa::detect()).is_none());
    }

    /// `sum((broadcast(s) * x) * 0.5, dims)`: splats and a reduction run
    /// on the fast path, bit for bit this backend's ops node by node (its
    /// row sums fold in 16 lanes, [`super::reduce`]), on one
    /// thread and on three: folded block by block over trailing dimensions
    /// (rows that fit in a block, rows of whole blocks), and as the chain's
    /// body then the reduction for other rows and leading dimensions.
    #[test]
    fn splat_and_reduce_chains_run_on_the_fast_path() {
        let chain = |shape: &[usize], dims: Vec<usize>| {
            let t = TensorType::new(DType::F32, shape.to_vec());
            let kept: Vec<usize> = (0..shape.len()).filter(|d| !dims.contains(d)).map(|d| shape[d]).collect();
            let node = |op, args| FusedNode { op, args, ty: t.clone() };
            FusedChain {
                inputs: vec![],
                nodes: vec![
                    node(Op::BroadcastInDim { dims: vec![], shape: shape.to_vec() }, vec![Arg::Input(0)]),
                    node(Op::Binary(BinaryOp::Mul), vec![Arg::Node(0), Arg::Input(1)]),
                    node(Op::Constant(weft_ir::Literal::splat(t.clone(), 0.5)), vec![]),
                    node(Op::Binary(BinaryOp::Mul), vec![Arg::Node(1), Arg::Node(2)]),
                    FusedNode {
                        op: Op::Reduce { op: ReduceOp::Sum, dims },
                        args: vec![Arg::Node(3)],
                        ty: TensorType::new(DType::F32, kept),
                    },
                ],
                output: weft_ir::device::BufferId(0),
                intermediates: vec![],
                kept: vec![],
                members: vec![0],
            }
        };
        let s = HostTensor::from_f32(&[], vec![3.0]).unwrap();
        let one_by_one = super::super::FastCpuBackend::default();
        for (shape, dims) in [
            (vec![3, 40], vec![1]),
            (vec![5, 7, 64], vec![1, 2]),
            (vec![2, 2048], vec![1]),
            (vec![2, 2048], vec![0, 1]),
            (vec![2, 1500], vec![1]),
            (vec![2, 6], vec![0]),
            (vec![300, 1000], vec![1]),
            (vec![2, 128, 1024], vec![2]),
            (vec![3, 140_000], vec![1]),
            (vec![600, 1000], vec![0]),
        ] {
            let n: usize = shape.iter().product();
            let x = HostTensor::from_f32(&shape, (0..n).map(|i| ((i as f32) * 0.37).sin()).collect()).unwrap();
            let c = chain(&shape, dims.clone());
            let expected = crate::backend::compute_unfused(&one_by_one, &c, &[&s, &x]).unwrap().remove(0);
            for threads in [1, 3] {
                let got = fused(&c, &[&s, &x], &mut Pool::default(), threads, Isa::detect());
                let got = got.unwrap_or_else(|| panic!("{shape:?} over {dims:?}: no fast path")).remove(0);
                assert!(got.bitwise_eq(&expected), "{shape:?} over {dims:?}, {threads} threads");
            }
        }
    }

    /// `fused_into` writes `w - broadcast(lr) * g` over `w`'s own storage,
    /// bit for bit what `fused` computes into fresh storage, and hands back
    /// a donor it cannot use (a `bf16` one).
    #[test]
    fn a_donated_input_receives_the_chain_value_in_place() {
        let shape = vec![3, 1500];
        let t = TensorType::new(DType::F32, shape.clone());
        let node = |op, args| FusedNode { op, args, ty: t.clone() };
        let chain = FusedChain {
            inputs: vec![],
            nodes: vec![
                node(Op::BroadcastInDim { dims: vec![], shape: shape.clone() }, vec![Arg::Input(0)]),
                node(Op::Binary(BinaryOp::Mul), vec![Arg::Node(0), Arg::Input(1)]),
                node(Op::Binary(BinaryOp::Sub), vec![Arg::Input(2), Arg::Node(1)]),
            ],
            output: weft_ir::device::BufferId(0),
            intermediates: vec![],
            kept: vec![],
            members: vec![0],
        };
        let n = 4500;
        let lr = HostTensor::from_f32(&[], vec![0.01]).unwrap();
        let g = HostTensor::from_f32(&shape, (0..n).map(|i| (i as f32).sin()).collect()).unwrap();
        let w = HostTensor::from_f32(&shape, (0..n).map(|i| (i as f32 * 0.37).cos()).collect()).unwrap();
        let mut pool = Pool::default();
        let expected = fused(&chain, &[&lr, &g, &w], &mut pool, 1, Isa::detect()).unwrap().remove(0);
        let HostTensor::F32(a) = &w else { unreachable!() };
        let storage = a.as_ptr();
        let got =
            fused_into(&chain, &[Some(&lr), Some(&g), None], 2, w, &mut pool, 1, Isa::detect()).ok().unwrap().remove(0);
        let HostTensor::F32(b) = &got else { panic!("f32 result") };
        assert_eq!(b.as_ptr(), storage, "the result lives in the donor's storage");
        assert!(got.bitwise_eq(&expected));
        let half = expected.convert(DType::BF16);
        assert!(fused_into(&chain, &[Some(&lr), Some(&g), None], 2, half, &mut pool, 1, Isa::detect()).is_err());
    }

    /// A chain that keeps values (GELU's forward, whose backward reads
    /// `x²`, `tanh` and a `bool` mask again) writes each kept value bit for
    /// bit as the interpreter computes it node by node, on one thread and
    /// split over three, into fresh storage and in place; a `bf16` chain
    /// keeps `bf16` values.
    #[test]
    fn kept_values_are_the_nodes_values() {
        let shape = vec![3, 70_000];
        let n: usize = shape.iter().product();
        let chain = |d: DType| {
            let t = TensorType::new(d, shape.clone());
            let node = |op, args: Vec<Arg>| FusedNode { op, args, ty: t.clone() };
            let c = |v: f64| node(Op::Constant(weft_ir::Literal::splat(t.clone(), v)), vec![]);
            FusedChain {
                inputs: vec![],
                nodes: vec![
                    node(Op::Binary(BinaryOp::Mul), vec![Arg::Input(0), Arg::Input(0)]), // 0: x²
                    node(Op::Binary(BinaryOp::Mul), vec![Arg::Node(0), Arg::Input(0)]),  // 1: x³
                    c(0.044715),                                                         // 2
                    node(Op::Binary(BinaryOp::Mul), vec![Arg::Node(1), Arg::Node(2)]),
                    node(Op::Binary(BinaryOp::Add), vec![Arg::Input(0), Arg::Node(3)]),
                    node(Op::Unary(UnaryOp::Tanh), vec![Arg::Node(4)]), // 5: tanh
                    FusedNode {
                        op: Op::Compare(CompareOp::Gt),
                        args: vec![Arg::Node(5), Arg::Input(1)],
                        ty: TensorType::new(DType::Bool, shape.clone()),
                    }, // 6: a mask
                    node(Op::Select, vec![Arg::Node(6), Arg::Node(5), Arg::Input(1)]),
                    node(Op::Binary(BinaryOp::Mul), vec![Arg::Node(7), Arg::Input(0)]),
                ],
                output: weft_ir::device::BufferId(0),
                intermediates: vec![],
                kept: vec![(0, BufferId(1)), (5, BufferId(2)), (6, BufferId(3))],
                members: vec![0],
            }
        };
        use weft_ir::device::BufferId;
        let cpu = crate::CpuBackend;
        for d in [DType::F32, DType::BF16] {
            let chain = chain(d);
            let x = HostTensor::from_f32(&shape, (0..n).map(|i| ((i as f32) * 0.013).sin() * 3.0).collect())
                .unwrap()
                .convert(d);
            let y = HostTensor::full(&TensorType::new(d, shape.clone()), 0.25);
            let expected = crate::backend::compute_unfused(&cpu, &chain, &[&x, &y]).unwrap();
            assert_eq!(expected.len(), 4);
            for threads in [1, 3] {
                let mut pool = Pool::default();
                let got = fused(&chain, &[&x, &y], &mut pool, threads, Isa::detect()).expect("the fast path");
                assert_eq!(got.len(), 4);
                for (k, (g, e)) in got.iter().zip(&expected).enumerate() {
                    assert!(g.bitwise_eq(e), "{d:?}, {threads} threads: value {k} differs");
                }
                if d == DType::F32 {
                    let into = fused_into(&chain, &[None, Some(&y)], 0, x.clone(), &mut pool, threads, Isa::detect());
                    let Ok(into) = into else { panic!("in place") };
                    assert!(into.iter().zip(&expected).all(|(g, e)| g.bitwise_eq(e)), "in place, {threads} threads");
                }
            }
        }
    }
}

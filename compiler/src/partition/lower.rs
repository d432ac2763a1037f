//! Lowering a sharded function, instruction by instruction, to the program
//! every device runs.
//!
//! The input passed [`crate::sharding::check_locally_computable`], so every
//! instruction other than `reshard` computes each device's block of its
//! result from the device's operand blocks with the same op: only
//! attributes that name extents change to local ones (`broadcast_in_dim` and
//! `reshape` shapes, the limits of a slice along a split dimension, which
//! the contract guarantees is taken whole). Two ops depend on *where* a
//! block lies and so need the device's position: `iota` along a split
//! dimension (a 1-d global iota is shard-sliced to this device's indices
//! and broadcast), and dense constants (the global constant is
//! shard-sliced). A `dot_general` or `reduce_sum` whose reduction factor is
//! split simply computes the local partial sum: its result is `unreduced`
//! over exactly those axes, which a later `reshard` resolves. A
//! `reduce_max`/`reduce_min` over split dimensions reduces locally and
//! all-reduces the result with `max`/`min` over their axes. A `gather`
//! from an operand split along its axis, and a `scatter_add` into a result
//! split along it, shift the indices by the start of the device's block
//! (`shift_indices`): indices outside it fall out of range, which the ops
//! read as zeros and drop, so the gather leaves the pending sum its
//! reduction factor says and the scatter fills exactly its own rows.
//! `sharding_constraint` is the identity on blocks, and each `reshard` is
//! lowered through its plan ([`super::reshard`]). Results whose value is
//! still unreduced (and not annotated so) are resolved before returning.

use super::builder::DeviceBuilder;
use super::reshard::lower_reshard;
use crate::error::{CompilerError, Result, Site};
use crate::sharding::{plan_reshard, Mesh, MeshSharding};
use weft_ir::device::{BufferId, DeviceProgram};
use weft_ir::{Function, IndexOp, LiteralData, Op, TensorType, ValueId};

/// The lowered program and the global layout of its inputs and outputs.
pub(crate) struct Lowered {
    pub program: DeviceProgram,
    pub input_shardings: Vec<MeshSharding>,
    pub output_shardings: Vec<MeshSharding>,
}

fn resolve(f: &Function, mesh: &Mesh, v: ValueId) -> Result<MeshSharding> {
    let data = f.value(v);
    let s = data.sharding.as_ref().ok_or_else(|| CompilerError::NotLocallyComputable {
        problems: vec![format!("in @{}: {} has no sharding", f.name, f.value_ref(v))],
    })?;
    Ok(MeshSharding::resolve(s, &data.ty, mesh, &Site::new(&f.name, f.value_ref(v), None))?.closed())
}

fn local(ty: &TensorType, s: &MeshSharding, mesh: &Mesh) -> TensorType {
    TensorType::new(ty.dtype, s.local_shape(&ty.shape, mesh))
}

/// Lowers a call-free, locally computable function.
pub(crate) fn lower_function(f: &Function, mesh: &Mesh) -> Result<Lowered> {
    let shardings: Vec<MeshSharding> =
        (0..f.values.len()).map(|i| resolve(f, mesh, ValueId(i as u32))).collect::<Result<_>>()?;
    let mut b = DeviceBuilder::new(&f.name, mesh);
    let mut bufs: Vec<Option<BufferId>> = vec![None; f.values.len()];
    for &p in &f.params {
        let id = b.buffer(local(f.ty(p), &shardings[p.index()], mesh), f.value(p).name.clone());
        b.program.inputs.push(id);
        bufs[p.index()] = Some(id);
    }
    let buf = |bufs: &[Option<BufferId>], v: ValueId| {
        bufs[v.index()].unwrap_or_else(|| panic!("{} is used before it is lowered", f.value_ref(v)))
    };
    for (id, inst) in f.iter_insts() {
        let ins: Vec<BufferId> = inst.operands.iter().map(|&o| buf(&bufs, o)).collect();
        let r = *inst.results.first().expect("every op but call has one result");
        let rs = &shardings[r.index()];
        let out = match &inst.op {
            Op::Call { .. } => return Err(crate::inline::call_not_inlined(f, id)),
            Op::ShardingConstraint { .. } => ins[0],
            Op::Reshard { .. } => {
                let v = inst.operands[0];
                let from = &shardings[v.index()];
                match cheaper_at_source(f, mesh, &shardings, v, rs) {
                    Some(Source::Recompute(op)) => compute(&mut b, &op, vec![], f.ty(r), rs),
                    Some(Source::Broadcast { operand, to, op }) => {
                        let moved =
                            lower_reshard(&mut b, f.ty(operand), buf(&bufs, operand), &shardings[operand.index()], &to);
                        compute(&mut b, &op, vec![moved], f.ty(r), rs)
                    }
                    None => lower_reshard(&mut b, f.ty(r), ins[0], from, rs),
                }
            }
            Op::Reduce { op: rop, dims } if *rop != weft_ir::ReduceOp::Sum => {
                // Split reduced dimensions: reduce locally, then combine the
                // partial maxima (minima) over their axes.
                let local = compute(&mut b, &inst.op, ins, f.ty(r), rs);
                let x = &shardings[inst.operands[0].index()];
                let mut axes: Vec<usize> = dims.iter().flat_map(|&d| x.dims[d].axes.clone()).collect();
                axes.sort_unstable();
                let op = *rop;
                b.collective(local, &axes, |axes| weft_ir::device::Collective::AllReduce { axes, op })
            }
            Op::Index(IndexOp::Gather { axis, .. }) => {
                // A split table: gather the indices that fall in this
                // device's rows (the rest read zeros): a partial sum.
                let x = inst.operands[0];
                let axes = shardings[x.index()].dims[*axis].axes.clone();
                let idx = shift_indices(&mut b, ins[1], &axes, f.ty(x).shape[*axis]);
                compute(&mut b, &inst.op, vec![ins[0], idx], f.ty(r), rs)
            }
            Op::Index(IndexOp::ScatterAdd { axis, size, .. }) => {
                // A split result: add the updates whose indices fall in this
                // device's rows (the rest are dropped).
                let idx = shift_indices(&mut b, ins[0], &rs.dims[*axis].axes, *size);
                compute(&mut b, &inst.op, vec![idx, ins[1]], f.ty(r), rs)
            }
            op => compute(&mut b, op, ins, f.ty(r), rs),
        };
        b.name(out, f.value(r).name.as_deref());
        bufs[r.index()] = Some(out);
    }
    let mut output_shardings = Vec::with_capacity(f.results.len());
    for (k, &r) in f.results.iter().enumerate() {
        let have = &shardings[r.index()];
        let want = match f.result_shardings.get(k).and_then(|s| s.as_ref()) {
            Some(s) => {
                MeshSharding::resolve(s, f.ty(r), mesh, &Site::new(&f.name, format!("result {k}"), None))?.closed()
            }
            None => MeshSharding { dims: have.dims.clone(), unreduced: Vec::new() },
        };
        let out =
            if *have == want { buf(&bufs, r) } else { lower_reshard(&mut b, f.ty(r), buf(&bufs, r), have, &want) };
        b.name(out, f.value(r).name.as_deref());
        b.program.outputs.push(out);
        output_shardings.push(want);
    }
    let input_shardings = f.params.iter().map(|p| shardings[p.index()].clone()).collect();
    Ok(Lowered { program: b.program, input_shardings, output_shardings })
}

/// A cheaper way to obtain a resharded value than moving its blocks.
enum Source {
    /// A `constant` or `iota`: compute it directly in the target sharding.
    Recompute(Op),
    /// A `broadcast_in_dim`: reshard its (smaller) operand to `to` and
    /// broadcast locally.
    Broadcast { operand: ValueId, to: MeshSharding, op: Op },
}

/// Whether the reshard of `v` to `to` is better done at `v`'s definition:
/// position-aware ops are recomputed in the target layout, and a broadcast
/// is resharded before it broadcasts when that moves fewer bytes (gathering
/// a `[C]` parameter instead of all-to-all'ing its `[B,T,C]` broadcast).
/// The broadcast's own step is dropped later if nothing else reads it.
fn cheaper_at_source(
    f: &Function,
    mesh: &Mesh,
    shardings: &[MeshSharding],
    v: ValueId,
    to: &MeshSharding,
) -> Option<Source> {
    let weft_ir::ValueDef::Inst { inst, .. } = f.value(v).def else { return None };
    let inst = f.inst(inst);
    let from = &shardings[v.index()];
    if !from.unreduced.is_empty() || !to.unreduced.is_empty() {
        return None;
    }
    match &inst.op {
        Op::Constant(_) | Op::Iota { .. } => Some(Source::Recompute(inst.op.clone())),
        Op::BroadcastInDim { dims, shape } => {
            let u = inst.operands[0];
            let ut = f.ty(u);
            let target = MeshSharding::from_axes(
                dims.iter()
                    .enumerate()
                    .map(|(i, &d)| if ut.shape[i] == shape[d] { to.dims[d].axes.clone() } else { Vec::new() })
                    .collect(),
                Vec::new(),
            );
            let via_operand = plan_reshard(ut, &shardings[u.index()], &target, mesh).cost;
            let direct = plan_reshard(f.ty(v), from, to, mesh).cost;
            (via_operand < direct).then(|| Source::Broadcast { operand: u, to: target, op: inst.op.clone() })
        }
        _ => None,
    }
}

/// `indices` minus the first global position of this device's block of a
/// dimension of extent `extent` split over `axes` (unchanged when it is
/// not split): indices outside the block become out of range (negative,
/// or past the block; unsigned ones wrap past it), which a gather reads as
/// zeros and a scatter drops.
fn shift_indices(b: &mut DeviceBuilder<'_>, indices: BufferId, axes: &[usize], extent: usize) -> BufferId {
    if b.mesh.product(axes) == 1 {
        return indices;
    }
    let ity = b.ty(indices).clone();
    let line = TensorType::new(ity.dtype, vec![extent]);
    let iota = b.compute(Op::Iota { dim: 0, ty: line.clone() }, vec![], line);
    let mine = b.shard_slice(iota, &[axes.to_vec()]);
    let first = TensorType::new(ity.dtype, vec![1]);
    let start = b.compute(Op::Slice { start: vec![0], limit: vec![1], stride: vec![1] }, vec![mine], first);
    let scalar = TensorType::new(ity.dtype, vec![]);
    let start = b.compute(Op::Reshape { shape: vec![] }, vec![start], scalar);
    let spread = b.compute(Op::BroadcastInDim { dims: vec![], shape: ity.shape.clone() }, vec![start], ity.clone());
    b.compute(Op::Binary(weft_ir::BinaryOp::Sub), vec![indices, spread], ity)
}

/// Emits the local computation of one compute instruction whose result (of
/// global type `ty`) is sharded `rs`.
fn compute(b: &mut DeviceBuilder<'_>, op: &Op, ins: Vec<BufferId>, ty: &TensorType, rs: &MeshSharding) -> BufferId {
    let mesh = b.mesh;
    let lty = local(ty, rs, mesh);
    let split = |d: usize| mesh.product(&rs.dims[d].axes) > 1;
    let axes: Vec<Vec<usize>> = rs.dims.iter().map(|d| d.axes.clone()).collect();
    let op = match op {
        Op::Constant(lit) => match &lit.data {
            LiteralData::Splat(v) => Op::Constant(weft_ir::Literal { ty: lty.clone(), data: LiteralData::Splat(*v) }),
            LiteralData::Dense(_) if (0..ty.rank()).any(split) => {
                let global = b.compute(op.clone(), vec![], ty.clone());
                return b.shard_slice(global, &axes);
            }
            LiteralData::Dense(_) => op.clone(),
        },
        Op::Iota { dim, .. } if split(*dim) => {
            // Global indices: this device's block of a 1-d iota, broadcast.
            let line = TensorType::new(ty.dtype, vec![ty.shape[*dim]]);
            let iota =
                b.compute(Op::Iota { dim: 0, ty: line }, vec![], TensorType::new(ty.dtype, vec![ty.shape[*dim]]));
            let mine = b.shard_slice(iota, &[axes[*dim].clone()]);
            return b.compute(Op::BroadcastInDim { dims: vec![*dim], shape: lty.shape.clone() }, vec![mine], lty);
        }
        Op::Iota { dim, .. } => Op::Iota { dim: *dim, ty: lty.clone() },
        Op::BroadcastInDim { dims, .. } => Op::BroadcastInDim { dims: dims.clone(), shape: lty.shape.clone() },
        Op::Reshape { .. } => Op::Reshape { shape: lty.shape.clone() },
        Op::Index(IndexOp::ScatterAdd { axis, batch_dims, .. }) => {
            Op::Index(IndexOp::ScatterAdd { axis: *axis, batch_dims: *batch_dims, size: lty.shape[*axis] })
        }
        Op::Slice { start, limit, stride } => {
            // A split dimension is sliced whole (the contract); take the whole block.
            let (mut start, mut limit, mut stride) = (start.clone(), limit.clone(), stride.clone());
            for d in (0..lty.rank()).filter(|&d| split(d)) {
                (start[d], limit[d], stride[d]) = (0, lty.shape[d], 1);
            }
            Op::Slice { start, limit, stride }
        }
        other => other.clone(),
    };
    b.compute(op, ins, lty)
}

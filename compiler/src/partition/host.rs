//! Moving global host tensors onto a simulated mesh and back.
//!
//! [`shard_tensor`] cuts a global tensor into the block every device holds
//! under a sharding (`specs/sharding.md` §2); along `unreduced` axes the
//! device of coordinate 0 holds the value and the others zeros, so the sum
//! over those axes is the value. [`unshard_tensor`] is the inverse: it
//! checks that replicas agree bit for bit (devices that should hold the same
//! block do; a difference is a partitioner bug, never rounding), sums the
//! partial values along unreduced axes in rank order, and concatenates the
//! blocks.

use crate::error::{CompilerError, Result, Site};
use crate::sharding::{Mesh, MeshSharding};
use weft_ir::interp::eval_op;
use weft_ir::tensor::HostTensor;
use weft_ir::{BinaryOp, IrError, Op, TensorSharding, TensorType};

fn resolve(ty: &TensorType, s: &TensorSharding, mesh: &Mesh) -> Result<MeshSharding> {
    MeshSharding::resolve(s, ty, mesh, &Site::new("", format!("tensor {ty}"), None))
}

fn eval1(op: Op, xs: &[&HostTensor]) -> Result<HostTensor> {
    Ok(eval_op(&op, xs)?.remove(0))
}

/// The block of device position `pos`, or the position's block indices.
fn block_of(s: &MeshSharding, mesh: &Mesh, pos: usize) -> Vec<usize> {
    s.block_index(mesh, &mesh.coords_of_position(pos))
}

/// Splits `t` into the blocks of `sharding` on `mesh`, one per device
/// position (row-major over the mesh axes).
pub fn shard_tensor(t: &HostTensor, sharding: &TensorSharding, mesh: &Mesh) -> Result<Vec<HostTensor>> {
    let ty = t.ty();
    let s = resolve(&ty, sharding, mesh)?;
    let local = s.local_shape(&ty.shape, mesh);
    let local_ty = TensorType::new(ty.dtype, local.clone());
    (0..mesh.num_devices())
        .map(|p| {
            let coords = mesh.coords_of_position(p);
            if s.unreduced.iter().any(|&a| coords[a] != 0) {
                return Ok(HostTensor::zeros(&local_ty));
            }
            let idx = block_of(&s, mesh, p);
            let start: Vec<usize> = idx.iter().zip(&local).map(|(i, l)| i * l).collect();
            let limit: Vec<usize> = start.iter().zip(&local).map(|(s, l)| s + l).collect();
            if start.iter().all(|&x| x == 0) && local == ty.shape {
                return Ok(t.clone());
            }
            eval1(Op::Slice { start, limit, stride: vec![1; local.len()] }, &[t])
        })
        .collect()
}

/// Assembles the global tensor from one block per device position under
/// `sharding`: replicas must agree bitwise, unreduced partial values are
/// summed in rank order.
pub fn unshard_tensor(blocks: &[HostTensor], sharding: &TensorSharding, mesh: &Mesh) -> Result<HostTensor> {
    let n = mesh.num_devices();
    let bad = |m: String| CompilerError::Ir(IrError::Tensor(m));
    if blocks.len() != n {
        return Err(bad(format!("{} blocks given for a mesh of {n} devices ({mesh})", blocks.len())));
    }
    let local = blocks[0].ty();
    let rank = local.rank();
    if sharding.rank() != rank {
        return Err(bad(format!("a sharding of rank {} for blocks of type {local}", sharding.rank())));
    }
    let mut global = local.clone();
    for (d, ds) in sharding.dims.iter().enumerate() {
        global.shape[d] *= ds.axes.iter().map(|a| mesh.axis(a).map_or(1, |x| x.size)).product::<usize>();
    }
    let s = resolve(&global, sharding, mesh)?;
    let counts: Vec<usize> = (0..rank).map(|d| s.num_blocks(d, mesh)).collect();
    let num_blocks: usize = counts.iter().product();
    // For every block (row-major over block indices) and every unreduced
    // coordinate combination: the representative device's block.
    let mut grid: Vec<Vec<Option<(usize, &HostTensor)>>> = vec![Vec::new(); num_blocks];
    let partials = mesh.product(&s.unreduced);
    for g in grid.iter_mut() {
        *g = vec![None; partials];
    }
    for (p, blk) in blocks.iter().enumerate() {
        if !blk.has_type(&local) {
            return Err(bad(format!("block of device {p} is {} but block 0 is {local}", blk.ty())));
        }
        let coords = mesh.coords_of_position(p);
        let idx = s.block_index(mesh, &coords);
        let flat = idx.iter().zip(&counts).fold(0, |f, (i, c)| f * c + i);
        let part = mesh.shape().rank_in(&coords, &s.unreduced);
        match grid[flat][part] {
            None => grid[flat][part] = Some((p, blk)),
            Some((q, first)) if !first.bitwise_eq(blk) => {
                return Err(bad(format!(
                    "devices {q} and {p} should hold the same block {idx:?} of a {global} sharded {} but differ \
                     (max abs diff {})",
                    crate::sharding::fmt_sharding(sharding),
                    first.max_abs_diff(blk)
                )));
            }
            Some(_) => {}
        }
    }
    let mut tiles: Vec<HostTensor> = Vec::with_capacity(num_blocks);
    for parts in &grid {
        let mut acc = parts[0].expect("every block is held").1.clone();
        for part in &parts[1..] {
            acc = eval1(Op::Binary(BinaryOp::Add), &[&acc, part.expect("every partial is held").1])?;
        }
        tiles.push(acc);
    }
    // Concatenate: the last dimension varies fastest in `tiles`.
    for d in (0..rank).rev() {
        let c = counts[d];
        if c == 1 {
            continue;
        }
        tiles = tiles
            .chunks(c)
            .map(|chunk| eval1(Op::Concatenate { dim: d }, &chunk.iter().collect::<Vec<_>>()))
            .collect::<Result<_>>()?;
    }
    Ok(tiles.pop().expect("one tile remains"))
}

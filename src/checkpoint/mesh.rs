//! Device meshes and the block math of sharded tensors.
//!
//! A checkpoint has to know which piece of a global tensor each device
//! holds, both to write every distinct piece exactly once (replicas are
//! deduplicated) and to cut different pieces out on restore (resharding).
//! The rule is the SPMD partitioner's: a dimension split over mesh axes
//! `[a, b]` (major to minor) is cut into `size(a) * size(b)` equal blocks,
//! and the device at mesh coordinates `(.., ia, .., ib, ..)` holds block
//! `ia * size(b) + ib` of it; axes that split no dimension replicate.
//! Devices are numbered row-major over the mesh axes in order.
//!
//! The position arithmetic (coordinates, the block a position holds) is
//! the IR's [`MeshShape`], which the partitioner and the runtime use too; a
//! test checks the blocks against the partitioner's
//! (`weft_compiler::sharding::shard_offset`) device by device.

use weft_ir::mesh::MeshShape;
use weft_ir::TensorSharding;

/// A logical device mesh: named axes with sizes, major to minor (the IR's
/// mesh geometry; serialised as `{"axes": [[name, size], ...]}`).
pub type MeshSpec = MeshShape;

/// How a tensor of one global shape is cut into blocks on a mesh under one
/// sharding. Blocks are numbered row-major over the per-dimension block
/// indices.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockLayout {
    /// The global shape.
    pub shape: Vec<usize>,
    /// Per dimension: the mesh-axis positions splitting it, major to minor.
    split: Vec<Vec<usize>>,
    /// Per dimension: the number of blocks.
    blocks: Vec<usize>,
    /// The mesh.
    mesh: MeshShape,
}

impl BlockLayout {
    /// The layout of `shape` under `sharding` on `mesh`. Fails (with a
    /// message) if the sharding's rank differs from the shape's, names an
    /// unknown axis or one axis twice, has unreduced axes, or a dimension is
    /// not divisible by its number of blocks. Open dimensions are treated as
    /// closed: a checkpoint stores what the devices hold.
    pub fn new(mesh: &MeshSpec, sharding: &TensorSharding, shape: &[usize]) -> Result<BlockLayout, String> {
        mesh.check()?;
        if sharding.rank() != shape.len() {
            return Err(format!("has {} dimensions but the tensor has rank {}", sharding.rank(), shape.len()));
        }
        if !sharding.unreduced.is_empty() {
            return Err("unreduced (partial-sum) values cannot be checkpointed; reduce them first".into());
        }
        let mut used: Vec<&str> = Vec::new();
        let mut split = Vec::with_capacity(shape.len());
        let mut blocks = Vec::with_capacity(shape.len());
        for (d, dim) in sharding.dims.iter().enumerate() {
            let mut axes = Vec::new();
            for a in &dim.axes {
                let i = mesh.axis_index(a).ok_or_else(|| format!("axis `{a}` (dimension {d}) is not a mesh axis"))?;
                if used.contains(&a.as_str()) {
                    return Err(format!("axis `{a}` is used twice"));
                }
                used.push(a);
                axes.push(i);
            }
            let n: usize = axes.iter().map(|&i| mesh.axes[i].1).product();
            if shape[d] % n != 0 {
                return Err(format!("dimension {d} of size {} is not divisible into {n} blocks", shape[d]));
            }
            split.push(axes);
            blocks.push(n);
        }
        Ok(BlockLayout { shape: shape.to_vec(), split, blocks, mesh: mesh.clone() })
    }

    /// The shape of every block.
    pub fn block_shape(&self) -> Vec<usize> {
        self.shape.iter().zip(&self.blocks).map(|(s, b)| s / b).collect()
    }

    /// The number of distinct blocks.
    pub fn num_blocks(&self) -> usize {
        self.blocks.iter().product()
    }

    /// True if there is one block: every device holds the whole tensor.
    pub fn is_replicated(&self) -> bool {
        self.num_blocks() == 1
    }

    /// The block `device` holds.
    pub fn block_of(&self, device: usize) -> usize {
        let per_dim = self.mesh.block_index(&self.split, device);
        per_dim.iter().zip(&self.blocks).fold(0, |block, (&i, &n)| block * n + i)
    }

    /// The offset of `block` in the global tensor.
    pub fn block_offset(&self, block: usize) -> Vec<usize> {
        let bs = self.block_shape();
        let mut rest = block;
        let mut out = vec![0; self.shape.len()];
        for d in (0..self.shape.len()).rev() {
            out[d] = (rest % self.blocks[d]) * bs[d];
            rest /= self.blocks[d];
        }
        out
    }

    /// For every block, the lowest-numbered device holding it: the devices
    /// whose shards a save needs (each distinct block written once).
    pub fn owners(&self) -> Vec<usize> {
        let devices = self.mesh.num_devices();
        let mut owner = vec![usize::MAX; self.num_blocks()];
        for dev in 0..devices {
            let b = self.block_of(dev);
            if owner[b] == usize::MAX {
                owner[b] = dev;
            }
        }
        owner
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(s: &[&[&str]], shape: &[usize]) -> BlockLayout {
        BlockLayout::new(&MeshSpec::new(&[("x", 2), ("y", 2)]), &TensorSharding::new(s), shape).unwrap()
    }

    #[test]
    fn coords_are_row_major() {
        let m = MeshSpec::new(&[("x", 2), ("y", 3)]);
        assert_eq!(m.num_devices(), 6);
        assert_eq!(m.coords(4), vec![1, 1]);
        assert_eq!(m.to_string(), "{x=2, y=3}");
        assert_eq!(MeshSpec::single().num_devices(), 1);
    }

    #[test]
    fn block_indices_follow_axis_order() {
        // dim 0 over (x, y): device (ix, iy) holds block ix*2+iy.
        let l = layout(&[&["x", "y"], &[]], &[8, 4]);
        assert_eq!((0..4).map(|d| l.block_of(d)).collect::<Vec<_>>(), vec![0, 1, 2, 3]);
        // dim 0 over (y, x): block iy*2+ix; device 1 = (0,1) holds block 2.
        let l = layout(&[&["y", "x"], &[]], &[8, 4]);
        assert_eq!((0..4).map(|d| l.block_of(d)).collect::<Vec<_>>(), vec![0, 2, 1, 3]);
        assert_eq!(l.block_offset(2), vec![4, 0]);
        assert_eq!(l.block_shape(), vec![2, 4]);
    }

    #[test]
    fn replicas_share_blocks_and_owners_are_lowest() {
        let l = layout(&[&["y"], &[]], &[8, 4]);
        assert_eq!((0..4).map(|d| l.block_of(d)).collect::<Vec<_>>(), vec![0, 1, 0, 1]);
        assert_eq!(l.owners(), vec![0, 1]);
        let l = layout(&[&[], &["x"]], &[8, 4]);
        assert_eq!(l.owners(), vec![0, 2]);
        assert_eq!(l.block_offset(1), vec![0, 2]);
        assert!(layout(&[&[], &[]], &[8, 4]).is_replicated());
    }

    /// The checkpoint's block math is its own (the format does not depend
    /// on the compiler's mesh type) but must be the partitioner's: every
    /// device's block offset and shape agree with the compiler's
    /// `shard_offset` / `local_shape` on several meshes and shardings.
    #[test]
    fn blocks_agree_with_the_partitioner() {
        let meshes: [&[(&str, usize)]; 3] =
            [&[("x", 2), ("y", 2)], &[("data", 2), ("model", 4)], &[("a", 2), ("b", 3), ("c", 2)]];
        for axes in meshes {
            let spec = MeshSpec::new(axes);
            let text: Vec<String> = axes.iter().map(|(n, s)| format!("{n}={s}")).collect();
            let mesh = weft_compiler::sharding::Mesh::parse(&text.join(",")).unwrap();
            let names: Vec<&str> = axes.iter().map(|(n, _)| *n).collect();
            let (a, b) = (names[0], names[1]);
            let last = names[names.len() - 1];
            let shardings: [&[&[&str]]; 6] =
                [&[&[], &[]], &[&[a], &[]], &[&[a], &[b]], &[&[a, b], &[]], &[&[], &[b, a]], &[&[last], &[a]]];
            let shape = [48, 24];
            for dims in shardings {
                let sharding = TensorSharding::new(dims);
                let l = BlockLayout::new(&spec, &sharding, &shape).unwrap();
                let local = weft_compiler::sharding::local_shape(&shape, &sharding, &mesh).unwrap();
                assert_eq!(l.block_shape(), local, "{sharding} on {spec}");
                for dev in 0..spec.num_devices() {
                    let offset = weft_compiler::sharding::shard_offset(&shape, &sharding, &mesh, dev).unwrap();
                    assert_eq!(l.block_offset(l.block_of(dev)), offset, "device {dev}, {sharding} on {spec}");
                }
            }
        }
    }

    #[test]
    fn bad_shardings_are_rejected() {
        let m = MeshSpec::new(&[("x", 2), ("y", 2)]);
        let bad = |s: &[&[&str]], shape: &[usize]| BlockLayout::new(&m, &TensorSharding::new(s), shape).unwrap_err();
        assert!(bad(&[&["z"], &[]], &[8, 4]).contains("`z`"));
        assert!(bad(&[&["x"], &["x"]], &[8, 4]).contains("twice"));
        assert!(bad(&[&["x", "y"]], &[6]).contains("divisible"));
        assert!(bad(&[&["x"]], &[6, 2]).contains("rank"));
    }
}

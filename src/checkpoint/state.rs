//! What a save takes and a restore gives: a tree of named leaves on a mesh,
//! each either one global host tensor or per-device shards.
//!
//! The same [`CheckpointState`] type is the input of a save and the output
//! of a restore, so "save, restore, compare" is one equality. Sharded leaves
//! carry shards keyed by device: a save needs only one device per distinct
//! block ([`BlockLayout::owners`], so a sharded run copies each distinct
//! shard off its devices once) and ignores replicas; a restore fills every
//! device.

use super::mesh::{BlockLayout, MeshSpec};
use super::region::copy_region;
use std::collections::BTreeMap;
use weft_compiler::train::{StateLeaf, Tree};
use weft_ir::tensor::HostTensor;
use weft_ir::{TensorSharding, TensorType};

/// The per-device shards of one leaf.
#[derive(Clone, Debug, PartialEq)]
pub struct ShardedLeaf {
    /// The global type.
    pub ty: TensorType,
    /// How the leaf is split over the mesh.
    pub sharding: TensorSharding,
    /// Device id (row-major over the mesh axes) to the block it holds. A
    /// save needs at least one device per distinct block; a restore gives
    /// every device.
    pub shards: BTreeMap<usize, HostTensor>,
}

/// One leaf of a checkpointed state.
#[derive(Clone, Debug, PartialEq)]
pub enum LeafData {
    /// The whole tensor, held on the host (single device, or replicated).
    Global(HostTensor),
    /// Per-device shards on the state's mesh.
    Sharded(ShardedLeaf),
}

impl LeafData {
    /// The global type.
    pub fn ty(&self) -> TensorType {
        match self {
            LeafData::Global(t) => t.ty(),
            LeafData::Sharded(s) => s.ty.clone(),
        }
    }

    /// The sharding: replicated for a global leaf.
    pub fn sharding(&self) -> TensorSharding {
        match self {
            LeafData::Global(t) => TensorSharding::replicated(t.shape().len()),
            LeafData::Sharded(s) => s.sharding.clone(),
        }
    }

    /// The tensor `device` holds: the whole tensor for a global leaf, else
    /// the device's shard (or a replica's, if only that was given). `None`
    /// if no given device holds that block.
    pub fn device_shard(&self, mesh: &MeshSpec, device: usize) -> Option<&HostTensor> {
        match self {
            LeafData::Global(t) => Some(t),
            LeafData::Sharded(s) => {
                if let Some(t) = s.shards.get(&device) {
                    return Some(t);
                }
                let layout = BlockLayout::new(mesh, &s.sharding, &s.ty.shape).ok()?;
                let block = layout.block_of(device);
                s.shards.iter().find(|(d, _)| **d < mesh.num_devices() && layout.block_of(**d) == block).map(|(_, t)| t)
            }
        }
    }

    /// The global tensor, assembled from the shards. Fails (with a message)
    /// if the sharding does not fit, a block is missing, or a shard has the
    /// wrong type.
    pub fn to_global(&self, mesh: &MeshSpec) -> Result<HostTensor, String> {
        let s = match self {
            LeafData::Global(t) => return Ok(t.clone()),
            LeafData::Sharded(s) => s,
        };
        let layout = BlockLayout::new(mesh, &s.sharding, &s.ty.shape)?;
        let elem = s.ty.dtype.size_bytes();
        let mut out = vec![0u8; s.ty.size_bytes()];
        let block_ty = TensorType::new(s.ty.dtype, layout.block_shape());
        for (block, &dev) in layout.owners().iter().enumerate() {
            let t = self.device_shard(mesh, dev).ok_or_else(|| format!("no shard for block {block}"))?;
            if !t.has_type(&block_ty) {
                return Err(format!("block {block} is {}, expected {block_ty}", t.ty()));
            }
            let offset = layout.block_offset(block);
            copy_region(
                &weft_ir::tensor::tensor_bytes(t),
                t.shape(),
                &offset,
                &mut out,
                &s.ty.shape,
                &vec![0; offset.len()],
                elem,
            );
        }
        HostTensor::from_bytes_le(&s.ty, &out).map_err(|e| e.to_string())
    }
}

/// A state tree on a mesh: what a save writes and a restore returns.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct CheckpointState {
    /// The mesh the sharded leaves live on ([`MeshSpec::single`] for a
    /// single-device state).
    pub mesh: MeshSpec,
    /// Leaf name (`params.layers.0.w1`, `opt.m.layers.0.w1`, `step`, ...) to data.
    pub leaves: BTreeMap<String, LeafData>,
}

impl CheckpointState {
    /// An empty state on `mesh`.
    pub fn new(mesh: MeshSpec) -> CheckpointState {
        CheckpointState { mesh, leaves: BTreeMap::new() }
    }

    /// A single-device state holding every tensor of `tree`.
    pub fn from_tree(tree: Tree) -> CheckpointState {
        CheckpointState {
            mesh: MeshSpec::single(),
            leaves: tree.into_iter().map(|(k, v)| (k, LeafData::Global(v))).collect(),
        }
    }

    /// Adds (or replaces) a leaf held as one global tensor.
    pub fn insert_global(&mut self, name: impl Into<String>, t: HostTensor) {
        self.leaves.insert(name.into(), LeafData::Global(t));
    }

    /// Adds (or replaces) a sharded leaf.
    pub fn insert_sharded(&mut self, name: impl Into<String>, leaf: ShardedLeaf) {
        self.leaves.insert(name.into(), LeafData::Sharded(leaf));
    }

    /// Every leaf as its global tensor. Fails naming the first leaf that
    /// cannot be assembled.
    pub fn to_tree(&self) -> Result<Tree, String> {
        let mut out = Tree::new();
        for (name, leaf) in &self.leaves {
            out.insert(name.clone(), leaf.to_global(&self.mesh).map_err(|e| format!("leaf `{name}`: {e}"))?);
        }
        Ok(out)
    }
}

/// How one leaf should be restored.
#[derive(Clone, Debug, PartialEq)]
pub struct TargetLeaf {
    /// The type the program expects; must equal the saved type.
    pub ty: TensorType,
    /// The sharding on the target mesh. `None`: as saved, which requires
    /// the target mesh to equal the saved one (else a topology mismatch).
    pub sharding: Option<TensorSharding>,
}

/// What a restore should produce: the mesh and, per leaf, its type and
/// sharding. The leaf set must equal the checkpoint's.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct RestoreTarget {
    /// The mesh to restore onto.
    pub mesh: MeshSpec,
    /// Leaf name to how to restore it.
    pub leaves: BTreeMap<String, TargetLeaf>,
    /// Restore only these devices' blocks (one process of a multi-process
    /// run): only the files holding them are read, and sharded leaves get
    /// shards for these devices only. `None`: every device.
    pub devices: Option<Vec<usize>>,
}

impl RestoreTarget {
    /// An empty target on `mesh`.
    pub fn new(mesh: MeshSpec) -> RestoreTarget {
        RestoreTarget { mesh, leaves: BTreeMap::new(), devices: None }
    }

    /// A single-device target with the leaves and types of `tree`.
    pub fn like_tree(tree: &Tree) -> RestoreTarget {
        let mut t = RestoreTarget::new(MeshSpec::single());
        for (name, v) in tree {
            t.insert(name, v.ty(), None);
        }
        t
    }

    /// A target like `state`: its mesh, and each leaf's type and sharding.
    pub fn like_state(state: &CheckpointState) -> RestoreTarget {
        let mut t = RestoreTarget::new(state.mesh.clone());
        for (name, leaf) in &state.leaves {
            t.insert(name, leaf.ty(), Some(leaf.sharding()));
        }
        t
    }

    /// A target for a training step's state leaves on `mesh`, using each
    /// leaf's annotated sharding (replicated where it has none; open
    /// dimensions are taken as closed).
    pub fn from_state_leaves(mesh: MeshSpec, leaves: &[StateLeaf]) -> RestoreTarget {
        let mut t = RestoreTarget::new(mesh);
        for l in leaves {
            let s = l.sharding.clone().unwrap_or_else(|| TensorSharding::replicated(l.ty.rank()));
            t.insert(&l.name, l.ty.clone(), Some(s));
        }
        t
    }

    /// The same target restoring only the blocks of `devices`.
    pub fn only_devices(mut self, devices: Vec<usize>) -> RestoreTarget {
        self.devices = Some(devices);
        self
    }

    /// Adds (or replaces) a leaf.
    pub fn insert(&mut self, name: impl Into<String>, ty: TensorType, sharding: Option<TensorSharding>) {
        self.leaves.insert(name.into(), TargetLeaf { ty, sharding });
    }
}

impl RestoreTarget {
    /// A target that restores a step exactly as it was saved: the saved
    /// mesh, and every leaf with its saved type and sharding.
    pub fn from_manifest(m: &crate::checkpoint::Manifest) -> std::result::Result<RestoreTarget, String> {
        let mesh = MeshSpec { axes: m.mesh.clone() };
        let mut t = RestoreTarget::new(mesh);
        for leaf in &m.leaves {
            let dtype = weft_ir::DType::from_name(&leaf.dtype)
                .ok_or_else(|| format!("leaf `{}` has unknown dtype `{}`", leaf.name, leaf.dtype))?;
            let dims: Vec<weft_ir::DimSharding> =
                leaf.sharding.iter().map(|axes| weft_ir::DimSharding { axes: axes.clone(), open: false }).collect();
            let sharding = TensorSharding { dims, unreduced: Vec::new() };
            t.insert(leaf.name.clone(), TensorType::new(dtype, leaf.shape.clone()), Some(sharding));
        }
        Ok(t)
    }
}

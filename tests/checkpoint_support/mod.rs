//! Helpers shared by the checkpoint integration tests.
#![allow(dead_code)]

use std::collections::BTreeMap;
use weft::checkpoint::{CheckpointState, MeshSpec, ShardedLeaf};
use weft::compiler::train::Tree;
use weft::ir::tensor::HostTensor;
use weft::ir::{DType, TensorSharding, TensorType};

/// A tensor of type `ty` with pseudo-random bit patterns (for floats this
/// includes NaNs with payloads, infinities, subnormals and -0.0), fixed by
/// `seed`.
pub fn random_tensor(ty: &TensorType, seed: u64) -> HostTensor {
    let mut s = seed.wrapping_mul(0x2545_F491_4F6C_DD1D) | 1;
    let mut bytes = Vec::with_capacity(ty.size_bytes());
    while bytes.len() < ty.size_bytes() {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        bytes.extend_from_slice(&s.to_le_bytes());
    }
    bytes.truncate(ty.size_bytes());
    if ty.dtype == DType::Bool {
        bytes.iter_mut().for_each(|b| *b &= 1);
    }
    HostTensor::from_bytes_le(ty, &bytes).unwrap()
}

/// A `f32[rows, cols]` tensor holding 0, 1, 2, ... row-major.
pub fn iota_2d(rows: usize, cols: usize) -> HostTensor {
    HostTensor::from_f32(&[rows, cols], (0..rows * cols).map(|i| i as f32).collect()).unwrap()
}

pub fn f32_ty(shape: &[usize]) -> TensorType {
    TensorType::new(DType::F32, shape.to_vec())
}

/// The block of a 2-D tensor that device `dev` holds on `mesh` under the
/// per-dimension axis lists `spec`, computed independently of the library
/// with ndarray slicing: along each dimension, the block index is the
/// device's coordinates over the listed axes, linearised major to minor.
pub fn expected_block_2d(global: &HostTensor, mesh: &MeshSpec, spec: &[&[&str]; 2], dev: usize) -> HostTensor {
    // Row-major coordinates of `dev`.
    let mut coords = BTreeMap::new();
    let mut rest = dev;
    for (name, size) in mesh.axes.iter().rev() {
        coords.insert(name.as_str(), (rest % size, *size));
        rest /= size;
    }
    let a = global.as_f32().unwrap();
    let mut ranges = Vec::new();
    for (d, axes) in spec.iter().enumerate() {
        let (mut idx, mut n) = (0, 1);
        for ax in axes.iter() {
            let (c, size) = coords[ax];
            idx = idx * size + c;
            n *= size;
        }
        let len = a.shape()[d] / n;
        ranges.push(idx * len..(idx + 1) * len);
    }
    let view = a.slice(ndarray::s![ranges[0].clone(), ranges[1].clone()]);
    HostTensor::from(view.to_owned().into_dyn())
}

/// The sharded leaf of a 2-D global tensor with every device's block.
pub fn shard_2d(global: &HostTensor, mesh: &MeshSpec, spec: &[&[&str]; 2]) -> ShardedLeaf {
    ShardedLeaf {
        ty: global.ty(),
        sharding: TensorSharding::new(spec),
        shards: (0..mesh.num_devices()).map(|d| (d, expected_block_2d(global, mesh, spec, d))).collect(),
    }
}

/// A single-device state of the given tree.
pub fn tree_state(tree: &Tree) -> CheckpointState {
    CheckpointState::from_tree(tree.clone())
}

/// Bitwise equality of two trees, naming the first difference.
pub fn assert_trees_bitwise_eq(a: &Tree, b: &Tree) {
    assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>(), "leaf sets differ");
    for (k, v) in a {
        assert!(v.bitwise_eq(&b[k]), "leaf `{k}` differs:\n  {v}\n  {}", b[k]);
    }
}

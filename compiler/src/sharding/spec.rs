//! What a sharding means on a mesh: which block of a tensor each device holds.
//!
//! The IR's [`TensorSharding`] only names axes; here it is checked against a
//! [`Mesh`] and resolved to axis indices ([`MeshSharding`]). The meaning is
//! JAX's (and Shardy's): a dimension split over axes `[a, b]` (major to
//! minor) is cut into `size(a) * size(b)` equal contiguous blocks, and the
//! device at mesh coordinates `(.., ia, .., ib, ..)` holds block
//! `ia * size(b) + ib` of it. Axes a sharding does not mention replicate the
//! tensor: devices that differ only along them hold the same blocks, except
//! for `unreduced` axes, along which they hold partial values whose sum is
//! the tensor. `specs/sharding.md` states this with examples.

use super::mesh::Mesh;
use crate::error::{CompilerError, Result, Site};
use weft_ir::{DimSharding, TensorSharding, TensorType};

/// One dimension of a [`MeshSharding`]: axis indices, major to minor.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct DimAxes {
    /// Indices into [`Mesh::axes`], major to minor.
    pub axes: Vec<usize>,
    /// Whether more axes may still be added (see [`DimSharding::open`]).
    pub open: bool,
}

/// A sharding checked against a mesh, with axes as indices.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct MeshSharding {
    /// One entry per tensor dimension.
    pub dims: Vec<DimAxes>,
    /// Axes over which the value is a pending sum, in mesh order.
    pub unreduced: Vec<usize>,
}

impl MeshSharding {
    /// A closed, unsplit, reduced sharding of rank `rank`.
    pub fn replicated(rank: usize) -> MeshSharding {
        MeshSharding { dims: vec![DimAxes::default(); rank], unreduced: Vec::new() }
    }

    /// A closed sharding from per-dimension axis indices.
    pub fn from_axes(dims: Vec<Vec<usize>>, mut unreduced: Vec<usize>) -> MeshSharding {
        unreduced.sort_unstable();
        MeshSharding { dims: dims.into_iter().map(|axes| DimAxes { axes, open: false }).collect(), unreduced }
    }

    /// Checks `s` against `mesh` for a tensor of type `ty` and resolves it.
    /// Errors name `site`, the dimension, the axes and their sizes: rank
    /// mismatch, unknown axis (with the closest name), an axis used twice,
    /// a dimension not divisible by the product of its axes' sizes.
    pub fn resolve(s: &TensorSharding, ty: &TensorType, mesh: &Mesh, site: &Site) -> Result<MeshSharding> {
        let text = fmt_sharding(s);
        if s.rank() != ty.rank() {
            return Err(CompilerError::RankMismatch {
                site: site.clone(),
                sharding: text,
                sharding_rank: s.rank(),
                ty: ty.to_string(),
                rank: ty.rank(),
            });
        }
        let mut used = 0u64;
        let mut index = |name: &str| -> Result<usize> {
            let i = mesh.axis_index(name).ok_or_else(|| CompilerError::UnknownAxis {
                site: site.clone(),
                sharding: text.clone(),
                axis: name.to_string(),
                mesh: mesh.to_string(),
                suggestion: mesh.closest_axis(name).map(str::to_string),
            })?;
            if used & (1 << i) != 0 {
                return Err(CompilerError::DuplicateAxis {
                    site: site.clone(),
                    sharding: text.clone(),
                    axis: name.into(),
                });
            }
            used |= 1 << i;
            Ok(i)
        };
        let mut dims = Vec::with_capacity(s.rank());
        for d in &s.dims {
            let axes = d.axes.iter().map(|a| index(a)).collect::<Result<Vec<_>>>()?;
            dims.push(DimAxes { axes, open: d.open });
        }
        let mut unreduced = s.unreduced.iter().map(|a| index(a)).collect::<Result<Vec<_>>>()?;
        unreduced.sort_unstable();
        for (dim, (d, &extent)) in dims.iter().zip(&ty.shape).enumerate() {
            let product = mesh.product(&d.axes);
            if extent % product != 0 {
                return Err(CompilerError::NotDivisible {
                    site: site.clone(),
                    sharding: text,
                    dim,
                    extent,
                    axes: d.axes.iter().map(|&a| mesh.name(a).to_string()).collect(),
                    sizes: d.axes.iter().map(|&a| mesh.size(a)).collect(),
                    product,
                });
            }
        }
        Ok(MeshSharding { dims, unreduced })
    }

    /// The IR form, with axis names.
    pub fn to_ir(&self, mesh: &Mesh) -> TensorSharding {
        let names = |axes: &[usize]| axes.iter().map(|&a| mesh.name(a).to_string()).collect::<Vec<_>>();
        TensorSharding {
            dims: self.dims.iter().map(|d| DimSharding { axes: names(&d.axes), open: d.open }).collect(),
            unreduced: names(&self.unreduced),
        }
    }

    /// The same sharding with every dimension closed.
    pub fn closed(&self) -> MeshSharding {
        let mut s = self.clone();
        s.dims.iter_mut().for_each(|d| d.open = false);
        s
    }

    /// Tensor rank.
    pub fn rank(&self) -> usize {
        self.dims.len()
    }

    /// The set of axes used (in dimensions or unreduced), as a bit mask.
    pub fn axis_mask(&self) -> u64 {
        self.dims.iter().flat_map(|d| d.axes.iter()).chain(&self.unreduced).fold(0, |m, &a| m | (1 << a))
    }

    /// Number of blocks dimension `dim` is cut into.
    pub fn num_blocks(&self, dim: usize, mesh: &Mesh) -> usize {
        mesh.product(&self.dims[dim].axes)
    }

    /// The per-device (local) shape of a tensor of global shape `shape`.
    pub fn local_shape(&self, shape: &[usize], mesh: &Mesh) -> Vec<usize> {
        shape.iter().enumerate().map(|(d, &n)| n / self.num_blocks(d, mesh)).collect()
    }

    /// Which block of each dimension the device at grid coordinates
    /// `coords` holds: for axes `[a, b]`, `coords[a] * size(b) + coords[b]`.
    pub fn block_index(&self, mesh: &Mesh, coords: &[usize]) -> Vec<usize> {
        self.dims.iter().map(|d| mesh.shape().rank_in(coords, &d.axes)).collect()
    }
}

/// Prints a sharding with its unreduced axes: `[{x}, {}]` or
/// `[{x}, {}] unreduced {y}`.
pub fn fmt_sharding(s: &TensorSharding) -> String {
    if s.unreduced.is_empty() {
        s.to_string()
    } else {
        format!("{s} unreduced {{{}}}", s.unreduced.join(", "))
    }
}

fn resolve_plain(shape: &[usize], sharding: &TensorSharding, mesh: &Mesh) -> Result<MeshSharding> {
    let ty = TensorType::new(weft_ir::DType::F32, shape.to_vec());
    MeshSharding::resolve(sharding, &ty, mesh, &Site::new("", format!("tensor {ty}"), None))
}

/// The shape of the block each device holds of a tensor of shape
/// `global_shape` sharded by `sharding` on `mesh` (errors as for
/// [`MeshSharding::resolve`]).
pub fn local_shape(global_shape: &[usize], sharding: &TensorSharding, mesh: &Mesh) -> Result<Vec<usize>> {
    Ok(resolve_plain(global_shape, sharding, mesh)?.local_shape(global_shape, mesh))
}

/// Which block of each dimension device `device` holds (block numbers, see
/// the module doc).
pub fn shard_index(
    global_shape: &[usize],
    sharding: &TensorSharding,
    mesh: &Mesh,
    device: usize,
) -> Result<Vec<usize>> {
    let s = resolve_plain(global_shape, sharding, mesh)?;
    Ok(s.block_index(mesh, &mesh.coords(device)?))
}

/// The global index of the first element of device `device`'s block, per
/// dimension (block number times local extent).
pub fn shard_offset(
    global_shape: &[usize],
    sharding: &TensorSharding,
    mesh: &Mesh,
    device: usize,
) -> Result<Vec<usize>> {
    let s = resolve_plain(global_shape, sharding, mesh)?;
    let local = s.local_shape(global_shape, mesh);
    Ok(s.block_index(mesh, &mesh.coords(device)?).iter().zip(&local).map(|(b, l)| b * l).collect())
}

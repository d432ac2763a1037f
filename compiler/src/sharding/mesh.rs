//! Device meshes: the logical grid shardings are expressed against.
//!
//! A mesh is an ordered list of named axes with sizes, like JAX's
//! `Mesh(devices, ('data', 'model'))`. Devices sit on the grid in row-major
//! order of the axes (the first axis is the most major); by default the
//! device at flat position `p` has id `p`, and an explicit device list can
//! say otherwise (to match a physical topology). Each axis may carry the
//! bandwidth and latency of the links along it, for the cost model that
//! chooses between communication plans.

use crate::error::{CompilerError, Result};
use std::fmt;
use weft_ir::mesh::{MeshShape, MAX_DEVICES};

/// One named axis of a [`Mesh`].
#[derive(Clone, Debug, PartialEq)]
pub struct MeshAxis {
    /// The axis name (an identifier, unique in the mesh).
    pub name: String,
    /// How many devices lie along it (at least 1).
    pub size: usize,
    /// Link bandwidth along the axis in bytes per second, if known.
    pub bandwidth: Option<f64>,
    /// Link latency along the axis in seconds, if known.
    pub latency: Option<f64>,
}

/// An ordered set of named axes over a list of devices: the IR's
/// [`MeshShape`] (the geometry, where all the position arithmetic lives)
/// with device ids and link costs.
#[derive(Clone, Debug, PartialEq)]
pub struct Mesh {
    axes: Vec<MeshAxis>,
    shape: MeshShape,
    devices: Vec<usize>,
}

/// The largest number of axes a mesh may have (axis sets are bit masks).
pub const MAX_AXES: usize = 64;

impl Mesh {
    /// A mesh with these axes (major to minor) and devices `0..n`.
    pub fn new(axes: &[(&str, usize)]) -> Result<Mesh> {
        let spec = axes.iter().map(|(n, s)| format!("{n}={s}")).collect::<Vec<_>>().join(",");
        let bad = |message: String| CompilerError::InvalidMesh { spec: spec.clone(), message };
        if axes.len() > MAX_AXES {
            return Err(bad(format!("a mesh has at most {MAX_AXES} axes")));
        }
        let mut out: Vec<MeshAxis> = Vec::with_capacity(axes.len());
        for &(name, size) in axes {
            if !weft_ir::verify::is_identifier(name) {
                return Err(bad(format!("`{name}` is not a valid axis name")));
            }
            if size == 0 {
                return Err(bad(format!("axis `{name}` has size 0")));
            }
            if out.iter().any(|a| a.name == name) {
                return Err(bad(format!("axis `{name}` appears twice")));
            }
            out.push(MeshAxis { name: name.to_string(), size, bandwidth: None, latency: None });
        }
        let shape = MeshShape { axes: out.iter().map(|a| (a.name.clone(), a.size)).collect() };
        // Checked before the device list is allocated: sizes whose product
        // overflows, or a single huge axis, are errors, not a wrapped count
        // or an allocation of one entry per device.
        let n = match shape.checked_num_devices() {
            Some(n) if n <= MAX_DEVICES => n,
            Some(n) => return Err(bad(format!("{n} devices, more than the limit of {MAX_DEVICES}"))),
            None => return Err(bad(format!("the axis sizes multiply to more than {} devices", usize::MAX))),
        };
        Ok(Mesh { axes: out, shape, devices: (0..n).collect() })
    }

    /// Parses `data=2,model=4` (spaces allowed around names and sizes).
    /// An empty text or an empty item (`data=2,,model=4`) is an error, not
    /// one device or an item dropped.
    pub fn parse(text: &str) -> Result<Mesh> {
        let bad = |message: String| CompilerError::InvalidMesh { spec: text.to_string(), message };
        if text.trim().is_empty() {
            return Err(bad("an empty mesh: name its axes, e.g. `data=2,model=4` (`data=1` for one device)".into()));
        }
        let mut axes = Vec::new();
        for (k, part) in text.split(',').map(str::trim).enumerate() {
            if part.is_empty() {
                return Err(bad(format!("item {} is empty (two commas in a row, or one at an end)", k + 1)));
            }
            let (name, size) =
                part.split_once('=').ok_or_else(|| bad(format!("expected `name=size`, found `{part}`")))?;
            let (name, size) = (name.trim(), size.trim());
            let size: usize = size.parse().map_err(|_| match size.parse::<i128>() {
                Ok(_) => bad(format!("axis `{name}` has size {size}: a size is a whole number ≥ 1")),
                Err(_) => bad(format!("the size of axis `{name}` is `{size}`, not a whole number ≥ 1")),
            })?;
            axes.push((name.to_string(), size));
        }
        let refs: Vec<(&str, usize)> = axes.iter().map(|(n, s)| (n.as_str(), *s)).collect();
        Mesh::new(&refs).map_err(|e| match e {
            CompilerError::InvalidMesh { message, .. } => bad(message),
            other => other,
        })
    }

    /// The same mesh with an explicit device id for each grid position
    /// (row-major over the axes). Ids must be distinct.
    pub fn with_devices(mut self, devices: Vec<usize>) -> Result<Mesh> {
        let bad = |message: String| CompilerError::InvalidMesh { spec: self.to_string(), message };
        if devices.len() != self.num_devices() {
            return Err(bad(format!("{} device ids given for {} grid positions", devices.len(), self.num_devices())));
        }
        let mut sorted = devices.clone();
        sorted.sort_unstable();
        if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
            return Err(bad(format!("device {} appears twice", w[0])));
        }
        self.devices = devices;
        Ok(self)
    }

    /// The same mesh with the link bandwidth (bytes/s) and latency (s) of
    /// one axis set.
    pub fn with_link(mut self, axis: &str, bandwidth: f64, latency: f64) -> Result<Mesh> {
        if !(bandwidth > 0.0 && latency >= 0.0) {
            return Err(CompilerError::InvalidMesh {
                spec: self.to_string(),
                message: format!("axis `{axis}` needs a positive bandwidth and a non-negative latency"),
            });
        }
        let spec = self.to_string();
        let a = self.axes.iter_mut().find(|a| a.name == axis).ok_or_else(|| CompilerError::InvalidMesh {
            spec,
            message: format!("no axis `{axis}` to set link parameters on"),
        })?;
        a.bandwidth = Some(bandwidth);
        a.latency = Some(latency);
        Ok(self)
    }

    /// The axes, major to minor.
    pub fn axes(&self) -> &[MeshAxis] {
        &self.axes
    }

    /// The geometry: axis names and sizes.
    pub fn shape(&self) -> &MeshShape {
        &self.shape
    }

    /// The index of the axis called `name`.
    pub fn axis_index(&self, name: &str) -> Option<usize> {
        self.axes.iter().position(|a| a.name == name)
    }

    /// The axis called `name`.
    pub fn axis(&self, name: &str) -> Option<&MeshAxis> {
        self.axes.iter().find(|a| a.name == name)
    }

    /// Size of the axis at `index`.
    pub fn size(&self, index: usize) -> usize {
        self.axes[index].size
    }

    /// Name of the axis at `index`.
    pub fn name(&self, index: usize) -> &str {
        &self.axes[index].name
    }

    /// Product of the sizes of the axes at these indices.
    pub fn product(&self, axes: &[usize]) -> usize {
        axes.iter().map(|&a| self.size(a)).product()
    }

    /// Total number of devices.
    pub fn num_devices(&self) -> usize {
        self.devices.len()
    }

    /// Device ids in row-major grid order.
    pub fn devices(&self) -> &[usize] {
        &self.devices
    }

    /// The grid coordinates (one per axis) of a device id.
    pub fn coords(&self, device: usize) -> Result<Vec<usize>> {
        let pos = self
            .devices
            .iter()
            .position(|&d| d == device)
            .ok_or_else(|| CompilerError::UnknownDevice { device, mesh: self.to_string() })?;
        Ok(self.coords_of_position(pos))
    }

    /// The grid coordinates of flat (row-major) position `pos`.
    pub fn coords_of_position(&self, pos: usize) -> Vec<usize> {
        self.shape.coords(pos)
    }

    /// The device id at grid coordinates `coords` (one per axis, in range).
    pub fn device_at(&self, coords: &[usize]) -> usize {
        assert_eq!(coords.len(), self.axes.len(), "coordinates need one entry per mesh axis");
        self.devices[self.shape.position(coords)]
    }

    /// The device groups along `axes`: devices that differ only in their
    /// coordinates on those axes form one group. Groups are ordered by the
    /// remaining axes (row-major); inside a group devices are ordered
    /// row-major over `axes` in the order given (so `["model", "data"]`
    /// makes `model` the major one). This is the replica-group layout of a
    /// collective over those axes.
    pub fn groups(&self, axes: &[&str]) -> Result<Vec<Vec<usize>>> {
        let mut idx = Vec::with_capacity(axes.len());
        for &name in axes {
            let i = self.axis_index(name).ok_or_else(|| CompilerError::InvalidMesh {
                spec: self.to_string(),
                message: format!("no axis `{name}`"),
            })?;
            if idx.contains(&i) {
                return Err(CompilerError::InvalidMesh {
                    spec: self.to_string(),
                    message: format!("axis `{name}` named twice in a group"),
                });
            }
            idx.push(i);
        }
        Ok(self.groups_by_index(&idx))
    }

    /// [`Mesh::groups`] with axes given by index ([`MeshShape::groups_by_index`],
    /// positions mapped to device ids).
    pub fn groups_by_index(&self, axes: &[usize]) -> Vec<Vec<usize>> {
        let mut groups = self.shape.groups_by_index(axes);
        for g in &mut groups {
            g.iter_mut().for_each(|p| *p = self.devices[*p]);
        }
        groups
    }

    /// The existing axis name closest to `name` (edit distance at most 2, or
    /// differing only in case), to suggest in errors.
    pub fn closest_axis(&self, name: &str) -> Option<&str> {
        self.axes
            .iter()
            .map(|a| (strsim::levenshtein(&a.name.to_lowercase(), &name.to_lowercase()), a.name.as_str()))
            .filter(|&(d, n)| d <= 2 && d < n.len().max(name.len()))
            .min_by_key(|&(d, _)| d)
            .map(|(_, n)| n)
    }
}

impl fmt::Display for Mesh {
    /// Prints `data=2,model=4` (the form [`Mesh::parse`] reads).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, a) in self.axes.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{}={}", a.name, a.size)?;
        }
        Ok(())
    }
}

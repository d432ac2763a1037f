//! Sharding annotations as the IR carries them.
//!
//! This is the *syntactic* form, close to Shardy's: per tensor dimension an
//! ordered list of mesh-axis names (major to minor) and whether the dimension
//! is open (the compiler may shard it further) or closed; plus the axes over
//! which the value is an *unreduced* pending sum (the state after a
//! contraction over a sharded dimension, before its all-reduce). Mesh axes
//! are only names here: checking them against a mesh (known axes,
//! divisibility, an axis used twice) is the compiler's job, because the IR
//! does not know the mesh.
//!
//! Text form (see `specs/ir.md`): `[{data}, {model, ?}]`, an empty `{}` is a
//! replicated closed dimension and `{?}` a replicated open one; after a
//! type, `{sharding = [...], unreduced = {model}}`.

use std::fmt;

/// How one tensor dimension is split over mesh axes.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct DimSharding {
    /// Mesh axes the dimension is split over, major to minor. Empty means
    /// the dimension is not split.
    pub axes: Vec<String>,
    /// Whether the compiler may add further axes to this dimension.
    pub open: bool,
}

impl DimSharding {
    /// A closed dimension split over `axes`.
    pub fn closed(axes: &[&str]) -> DimSharding {
        DimSharding { axes: axes.iter().map(|s| s.to_string()).collect(), open: false }
    }

    /// An open dimension split over `axes` (possibly none).
    pub fn open(axes: &[&str]) -> DimSharding {
        DimSharding { axes: axes.iter().map(|s| s.to_string()).collect(), open: true }
    }
}

/// The sharding of one tensor value.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct TensorSharding {
    /// One entry per tensor dimension.
    pub dims: Vec<DimSharding>,
    /// Mesh axes over which the value is an unreduced partial sum: the true
    /// value is the sum over those axes of the per-device values.
    pub unreduced: Vec<String>,
}

impl TensorSharding {
    /// A closed sharding from per-dimension axis lists, pjit style:
    /// `TensorSharding::new(&[&["data"], &[]])` is `P('data', None)`.
    pub fn new(dims: &[&[&str]]) -> TensorSharding {
        TensorSharding { dims: dims.iter().map(|a| DimSharding::closed(a)).collect(), unreduced: Vec::new() }
    }

    /// Fully replicated (closed) sharding of a rank-`rank` tensor.
    pub fn replicated(rank: usize) -> TensorSharding {
        TensorSharding { dims: vec![DimSharding::default(); rank], unreduced: Vec::new() }
    }

    /// Fully open, unsplit sharding of a rank-`rank` tensor.
    pub fn open(rank: usize) -> TensorSharding {
        TensorSharding { dims: vec![DimSharding::open(&[]); rank], unreduced: Vec::new() }
    }

    /// The tensor rank this sharding is for.
    pub fn rank(&self) -> usize {
        self.dims.len()
    }

    /// True if no dimension is split and nothing is unreduced.
    pub fn is_replicated(&self) -> bool {
        self.dims.iter().all(|d| d.axes.is_empty()) && self.unreduced.is_empty()
    }

    /// Every axis named, in order of appearance (dimensions, then unreduced).
    pub fn axes(&self) -> impl Iterator<Item = &str> {
        self.dims.iter().flat_map(|d| d.axes.iter()).chain(self.unreduced.iter()).map(|s| s.as_str())
    }
}

impl fmt::Display for DimSharding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("{")?;
        for (i, a) in self.axes.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            f.write_str(a)?;
        }
        if self.open {
            if !self.axes.is_empty() {
                f.write_str(", ")?;
            }
            f.write_str("?")?;
        }
        f.write_str("}")
    }
}

impl fmt::Display for TensorSharding {
    /// Prints the per-dimension part, `[{data}, {model, ?}]`. The unreduced
    /// axes are printed by the text format as a separate `unreduced` entry.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, d) in self.dims.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display() {
        let mut s = TensorSharding::new(&[&["data"], &[]]);
        assert_eq!(s.to_string(), "[{data}, {}]");
        s.dims[1] = DimSharding::open(&["model"]);
        assert_eq!(s.to_string(), "[{data}, {model, ?}]");
        assert_eq!(TensorSharding::open(2).to_string(), "[{?}, {?}]");
        assert!(TensorSharding::replicated(3).is_replicated());
    }
}

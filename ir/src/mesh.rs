//! The geometry of a device mesh: the one home of SPMD arithmetic.
//!
//! A mesh is an ordered list of named axes with sizes (major to minor, like
//! JAX's `Mesh(devices, ('data', 'model'))`); its positions are numbered
//! row-major over the axes. Everything that relates positions to work is
//! here, and only here: a position's coordinates, the groups of a
//! collective over a set of axes (positions that agree on every other
//! axis) and a member's rank in its group (its coordinates along the
//! group's axes, major to minor in the order given), and which block of a
//! sharded dimension a position holds (the same rank, over the axes that
//! split the dimension). The compiler's `Mesh` (which adds device ids and
//! link costs), device programs, the runtime's collectives and the
//! checkpoint's block layouts all use [`MeshShape`].

use serde::{Deserialize, Serialize};
use std::fmt;

/// The most positions a mesh may have: 2^20. Meshes are enumerated
/// (device lists, collective groups), so a user-given size must stay far
/// below what would exhaust memory; real meshes have thousands.
pub const MAX_DEVICES: usize = 1 << 20;

/// Named axes with sizes, major to minor. No axes: one position.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct MeshShape {
    /// `(name, size)` per axis, major to minor.
    pub axes: Vec<(String, usize)>,
}

impl From<Vec<(String, usize)>> for MeshShape {
    fn from(axes: Vec<(String, usize)>) -> MeshShape {
        MeshShape { axes }
    }
}

impl MeshShape {
    /// A mesh from `(name, size)` pairs, major to minor.
    pub fn new(axes: &[(&str, usize)]) -> MeshShape {
        MeshShape { axes: axes.iter().map(|(n, s)| (n.to_string(), *s)).collect() }
    }

    /// The mesh of one position (no axes).
    pub fn single() -> MeshShape {
        MeshShape::default()
    }

    /// Number of positions: the product of the axis sizes (1 with no axes).
    /// For a mesh that passed [`MeshShape::check`]; see
    /// [`MeshShape::checked_num_devices`] for one that has not.
    pub fn num_devices(&self) -> usize {
        self.axes.iter().map(|(_, s)| s).product()
    }

    /// Number of positions, `None` if the product of the sizes overflows.
    pub fn checked_num_devices(&self) -> Option<usize> {
        self.axes.iter().try_fold(1usize, |a, (_, s)| a.checked_mul(*s))
    }

    /// The index of axis `name`.
    pub fn axis_index(&self, name: &str) -> Option<usize> {
        self.axes.iter().position(|(n, _)| n == name)
    }

    /// The size of axis `name`.
    pub fn axis_size(&self, name: &str) -> Option<usize> {
        self.axes.iter().find(|(n, _)| n == name).map(|(_, s)| *s)
    }

    /// The size of the axis at `index`.
    pub fn size(&self, index: usize) -> usize {
        self.axes[index].1
    }

    /// The coordinates of `position` (row-major over the axes).
    pub fn coords(&self, position: usize) -> Vec<usize> {
        let mut rest = position;
        let mut c = vec![0; self.axes.len()];
        for (i, (_, n)) in self.axes.iter().enumerate().rev() {
            c[i] = rest % n;
            rest /= n;
        }
        c
    }

    /// The position at `coords` (one per axis, in range).
    pub fn position(&self, coords: &[usize]) -> usize {
        coords.iter().zip(&self.axes).fold(0, |p, (&c, (_, n))| p * n + c)
    }

    /// The rank of the position at `coords` over the axes at indices
    /// `axes`: its coordinates along them, major to minor in that order.
    /// Also the block a position holds of a dimension split over `axes`.
    pub fn rank_in(&self, coords: &[usize], axes: &[usize]) -> usize {
        axes.iter().fold(0, |r, &a| r * self.axes[a].1 + coords[a])
    }

    /// Product of the sizes of the named axes (unknown axes count as 1).
    pub fn group_size(&self, names: &[String]) -> usize {
        names.iter().map(|a| self.axis_size(a).unwrap_or(1)).product()
    }

    /// The groups of a collective over the axes at indices `axes`:
    /// positions that agree on every other axis, each group in rank order,
    /// groups ordered row-major over the other axes (so by first member).
    pub fn groups_by_index(&self, axes: &[usize]) -> Vec<Vec<usize>> {
        let others: Vec<usize> = (0..self.axes.len()).filter(|i| !axes.contains(i)).collect();
        let outer: usize = others.iter().map(|&i| self.size(i)).product();
        let inner: usize = axes.iter().map(|&i| self.size(i)).product();
        let mut coords = vec![0; self.axes.len()];
        let spread = |mut k: usize, idx: &[usize], coords: &mut [usize]| {
            for &i in idx.iter().rev() {
                coords[i] = k % self.size(i);
                k /= self.size(i);
            }
        };
        let mut groups = Vec::with_capacity(outer);
        for o in 0..outer {
            spread(o, &others, &mut coords);
            let mut g = Vec::with_capacity(inner);
            for k in 0..inner {
                spread(k, axes, &mut coords);
                g.push(self.position(&coords));
            }
            groups.push(g);
        }
        groups
    }

    /// [`MeshShape::groups_by_index`] for named axes (which must exist).
    pub fn groups(&self, names: &[String]) -> Vec<Vec<usize>> {
        let idx: Vec<usize> = names
            .iter()
            .map(|a| self.axis_index(a).unwrap_or_else(|| panic!("no mesh axis `{a}` (verify first)")))
            .collect();
        self.groups_by_index(&idx)
    }

    /// Which block of each dimension `position` holds, when dimension `d`
    /// is split over the axes at indices `split[d]` (major to minor).
    pub fn block_index(&self, split: &[Vec<usize>], position: usize) -> Vec<usize> {
        let coords = self.coords(position);
        split.iter().map(|axes| self.rank_in(&coords, axes)).collect()
    }

    /// Checks that the mesh is well formed: axis sizes at least 1, names
    /// unique and non-empty, at most [`MAX_DEVICES`] positions.
    pub fn check(&self) -> Result<(), String> {
        match self.checked_num_devices() {
            Some(n) if n <= MAX_DEVICES => {}
            Some(n) => return Err(format!("mesh {self}: {n} devices, more than the limit of {MAX_DEVICES}")),
            None => return Err(format!("mesh {self}: the axis sizes multiply to more than {}", usize::MAX)),
        }
        for (i, (name, size)) in self.axes.iter().enumerate() {
            if name.is_empty() || *size == 0 {
                return Err(format!("mesh {self}: axis {i} must have a name and a size >= 1"));
            }
            if self.axes[..i].iter().any(|(n, _)| n == name) {
                return Err(format!("mesh {self}: axis `{name}` appears twice"));
            }
        }
        Ok(())
    }
}

impl fmt::Display for MeshShape {
    /// `{x=2, y=2}`; `{}` for one position.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("{")?;
        for (i, (n, s)) in self.axes.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{n}={s}")?;
        }
        f.write_str("}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_ranks_and_blocks_follow_the_contract() {
        let m = MeshShape::new(&[("a", 2), ("b", 3)]);
        assert_eq!(m.num_devices(), 6);
        assert_eq!(m.coords(4), vec![1, 1]);
        assert_eq!(m.position(&[1, 2]), 5);
        // Over b: positions sharing a coordinate, ranked by b.
        assert_eq!(m.groups(&["b".into()]), vec![vec![0, 1, 2], vec![3, 4, 5]]);
        // Over a: columns.
        assert_eq!(m.groups(&["a".into()]), vec![vec![0, 3], vec![1, 4], vec![2, 5]]);
        // Over [b, a]: rank = ib * 2 + ia.
        assert_eq!(m.groups(&["b".into(), "a".into()]), vec![vec![0, 3, 1, 4, 2, 5]]);
        assert_eq!(m.group_size(&["b".into(), "a".into()]), 6);
        // Position 5 = (1, 2): dimension 0 split over [b, a] -> block 2*2+1.
        assert_eq!(m.block_index(&[vec![1, 0], vec![]], 5), vec![5, 0]);
        assert_eq!(m.to_string(), "{a=2, b=3}");
        assert!(MeshShape::new(&[("a", 2), ("a", 1)]).check().is_err());
        let huge = MeshShape::new(&[("a", 1 << 32), ("b", 1 << 32)]);
        assert_eq!(huge.checked_num_devices(), None);
        assert!(huge.check().unwrap_err().contains("multiply to more than"), "{:?}", huge.check());
        assert!(MeshShape::new(&[("a", MAX_DEVICES + 1)]).check().unwrap_err().contains("limit of 1048576"));
    }
}

//! Shape ops: the primitive ones, NumPy-style broadcasting, and small
//! conveniences (`expand_dims`, `squeeze`, `swap_axes`, `split`).
//!
//! Broadcasting is lowered to a canonical form that later passes find easy
//! to reason about: size-1 dimensions that must stretch are first dropped
//! with a `reshape`, then one `broadcast_in_dim` maps every remaining
//! operand dimension to a result dimension of the *same* extent. So every
//! `broadcast_in_dim` the builder emits only adds dimensions; a sharded
//! operand dimension keeps its sharding in the result.

use super::{FunctionBuilder, Value};
use crate::{Op, Shape, TensorSharding};

/// The NumPy broadcast of two shapes: right-aligned, each pair of extents
/// equal or one of them 1. `[3, 1]` and `[4]` give `[3, 4]`.
pub fn broadcast_shapes(a: &[usize], b: &[usize]) -> Result<Shape, String> {
    let rank = a.len().max(b.len());
    let at = |s: &[usize], i: usize| if i + s.len() >= rank { s[i + s.len() - rank] } else { 1 };
    let mut out = Vec::with_capacity(rank);
    for i in 0..rank {
        let (x, y) = (at(a, i), at(b, i));
        out.push(match (x, y) {
            _ if x == y => x,
            (1, _) => y,
            (_, 1) => x,
            _ => return Err(format!("shapes {a:?} and {b:?} cannot be broadcast together")),
        });
    }
    Ok(out)
}

impl FunctionBuilder {
    /// StableHLO `broadcast_in_dim`: operand dimension `i` becomes result
    /// dimension `dims[i]` (extent 1 or equal); other dimensions are new.
    #[track_caller]
    pub fn broadcast_in_dim(&self, x: Value, shape: &[usize], dims: &[usize]) -> Value {
        self.emit1(Op::BroadcastInDim { dims: dims.to_vec(), shape: shape.to_vec() }, &[x])
    }

    /// Broadcasts `x` to `shape` with NumPy rules (right-aligned; size-1
    /// dimensions stretch). Returns `x` itself if it already has the shape.
    #[track_caller]
    pub fn broadcast_to(&self, x: Value, shape: &[usize]) -> Value {
        self.scope("broadcast_to", || {
            let Some(t) = self.input("broadcast_to", x) else { return self.poison() };
            if t.shape == shape {
                return x;
            }
            let bad = || format!("cannot broadcast {t} to shape {shape:?}");
            if t.rank() > shape.len() {
                self.fail("broadcast_to", bad());
                return self.poison();
            }
            let off = shape.len() - t.rank();
            let (mut kept, mut dims) = (Vec::new(), Vec::new());
            for (i, &e) in t.shape.iter().enumerate() {
                if e == shape[off + i] {
                    kept.push(e);
                    dims.push(off + i);
                } else if e != 1 {
                    self.fail("broadcast_to", bad());
                    return self.poison();
                }
            }
            let x = if kept.len() < t.rank() { self.reshape(x, &kept) } else { x };
            self.broadcast_in_dim(x, shape, &dims)
        })
    }

    /// Row-major reshape to a shape with the same number of elements.
    #[track_caller]
    pub fn reshape(&self, x: Value, shape: &[usize]) -> Value {
        self.emit1(Op::Reshape { shape: shape.to_vec() }, &[x])
    }

    /// Permutes dimensions: `result.shape[i] = x.shape[perm[i]]`.
    #[track_caller]
    pub fn transpose(&self, x: Value, perm: &[usize]) -> Value {
        self.emit1(Op::Transpose { perm: perm.to_vec() }, &[x])
    }

    /// Swaps two axes (`swap_axes(k, -1, -2)` transposes the last two).
    #[track_caller]
    pub fn swap_axes(&self, x: Value, a: isize, b: isize) -> Value {
        self.scope("swap_axes", || {
            let Some(t) = self.input("swap_axes", x) else { return self.poison() };
            let (Some(a), Some(b)) = (self.axis("swap_axes", &t, a), self.axis("swap_axes", &t, b)) else {
                return self.poison();
            };
            let mut perm: Vec<usize> = (0..t.rank()).collect();
            perm.swap(a, b);
            self.transpose(x, &perm)
        })
    }

    /// Inserts a size-1 dimension at `axis` (in `-(rank+1)..=rank`), as
    /// `numpy.expand_dims`; emitted as a `broadcast_in_dim`.
    #[track_caller]
    pub fn expand_dims(&self, x: Value, axis: isize) -> Value {
        self.scope("expand_dims", || {
            let Some(t) = self.input("expand_dims", x) else { return self.poison() };
            let r = t.rank() as isize;
            let a = if axis < 0 { axis + r + 1 } else { axis };
            if a < 0 || a > r {
                self.fail("expand_dims", format!("axis {axis} is out of range for inserting into {t}"));
                return self.poison();
            }
            let a = a as usize;
            let mut shape = t.shape.clone();
            shape.insert(a, 1);
            let dims: Vec<usize> = (0..t.rank()).map(|d| if d < a { d } else { d + 1 }).collect();
            self.broadcast_in_dim(x, &shape, &dims)
        })
    }

    /// Removes size-1 dimensions: those in `axes`, or all of them if `axes`
    /// is empty (like `numpy.squeeze`). Naming a dimension whose extent is
    /// not 1 is an error.
    #[track_caller]
    pub fn squeeze(&self, x: Value, axes: &[isize]) -> Value {
        self.scope("squeeze", || {
            let Some(t) = self.input("squeeze", x) else { return self.poison() };
            let drop: Vec<usize> = if axes.is_empty() {
                (0..t.rank()).filter(|&d| t.shape[d] == 1).collect()
            } else {
                let Some(ax) = self.axes("squeeze", &t, axes) else { return self.poison() };
                if let Some(&d) = ax.iter().find(|&&d| t.shape[d] != 1) {
                    self.fail("squeeze", format!("dimension {d} of {t} has extent {}, not 1", t.shape[d]));
                    return self.poison();
                }
                ax
            };
            let shape: Vec<usize> = (0..t.rank()).filter(|d| !drop.contains(d)).map(|d| t.shape[d]).collect();
            self.reshape(x, &shape)
        })
    }

    /// The slice `[start, limit)` in every dimension.
    #[track_caller]
    pub fn slice(&self, x: Value, start: &[usize], limit: &[usize]) -> Value {
        self.slice_strided(x, start, limit, &vec![1; start.len()])
    }

    /// The strided slice `start, start+stride, .. < limit` in every dimension.
    #[track_caller]
    pub fn slice_strided(&self, x: Value, start: &[usize], limit: &[usize], stride: &[usize]) -> Value {
        self.emit1(Op::Slice { start: start.to_vec(), limit: limit.to_vec(), stride: stride.to_vec() }, &[x])
    }

    /// The slice `[start, limit)` along one axis, everything along the others.
    #[track_caller]
    pub fn slice_axis(&self, x: Value, axis: isize, start: usize, limit: usize) -> Value {
        self.scope("slice_axis", || {
            let Some(t) = self.input("slice_axis", x) else { return self.poison() };
            let Some(a) = self.axis("slice_axis", &t, axis) else { return self.poison() };
            let mut lo = vec![0; t.rank()];
            let mut hi = t.shape.clone();
            lo[a] = start;
            hi[a] = limit;
            self.slice(x, &lo, &hi)
        })
    }

    /// Splits `x` into `parts` equal slices along `axis` (whose extent
    /// `parts` must divide), like `numpy.split(x, parts, axis)`.
    #[track_caller]
    pub fn split(&self, x: Value, axis: isize, parts: usize) -> Vec<Value> {
        self.scope("split", || {
            let fail = || vec![self.poison(); parts];
            let Some(t) = self.input("split", x) else { return fail() };
            let Some(a) = self.axis("split", &t, axis) else { return fail() };
            if parts == 0 || t.shape[a] % parts != 0 {
                self.fail("split", format!("dimension {a} of {t} cannot be split into {parts} equal parts"));
                return fail();
            }
            let n = t.shape[a] / parts;
            let mut out = Vec::with_capacity(parts);
            for p in 0..parts {
                out.push(self.slice_axis(x, a as isize, p * n, (p + 1) * n));
            }
            out
        })
    }

    /// Concatenates values of equal dtype and rank along dimension `dim`.
    #[track_caller]
    pub fn concatenate(&self, xs: &[Value], dim: usize) -> Value {
        self.emit1(Op::Concatenate { dim }, xs)
    }

    /// Pads `x` with the scalar `value` (same dtype): `low`/`high` elements
    /// before/after each dimension (negative crops), `interior` between
    /// neighbouring elements.
    #[track_caller]
    pub fn pad(&self, x: Value, value: Value, low: &[i64], high: &[i64], interior: &[usize]) -> Value {
        self.emit1(Op::Pad { low: low.to_vec(), high: high.to_vec(), interior: interior.to_vec() }, &[x, value])
    }

    /// Identity that asks for its result to have `sharding` (JAX's
    /// `with_sharding_constraint`).
    #[track_caller]
    pub fn sharding_constraint(&self, x: Value, sharding: TensorSharding) -> Value {
        self.emit1(Op::ShardingConstraint { sharding }, &[x])
    }

    /// Identity on the global value that changes its sharding to `to`.
    #[track_caller]
    pub fn reshard(&self, x: Value, to: TensorSharding) -> Value {
        self.emit1(Op::Reshard { to }, &[x])
    }
}

//! Moving between tensor shardings and factor shardings.
//!
//! A tensor dimension made of factors `[f1, f2]` (major to minor) and split
//! over axes `[a, b, c]` shards `f1` over the leading axes whose sizes
//! multiply to at most `f1`'s size, and `f2` over the rest, but only once
//! `f1` is fully split: a partly split `f1` followed by axes for `f2` is not
//! a contiguous block split of the dimension. Axes that cannot be assigned
//! this way (an axis size that does not divide what is left of the current
//! factor) make the projection inexact: the tensor's sharding cannot be
//! expressed through the op's factors. Propagation, reshard insertion and
//! the local-computability checker all use these two functions.

use super::mesh::Mesh;
use super::rules::{OpRule, TensorFactors};

/// A tensor's sharding seen through an op's factors.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Projection {
    /// Per factor of the rule: the axes this tensor shards it over, or
    /// `None` if the tensor does not have the factor.
    pub factors: Vec<Option<Vec<usize>>>,
    /// Per dimension: axes that could not be assigned to a factor.
    pub leftover: Vec<Vec<usize>>,
}

impl Projection {
    /// True if every axis of the tensor was assigned to a factor.
    pub fn exact(&self) -> bool {
        self.leftover.iter().all(Vec::is_empty)
    }

    /// The axes of factor `f` (empty if the tensor does not have it).
    pub fn axes(&self, f: usize) -> &[usize] {
        self.factors[f].as_deref().unwrap_or(&[])
    }
}

/// Projects per-dimension axes `dims` of a tensor with factors `tf` onto the
/// factors of `rule`.
pub fn project(tf: &TensorFactors, dims: &[&[usize]], rule: &OpRule, mesh: &Mesh) -> Projection {
    let mut factors = vec![None; rule.factors.len()];
    let mut leftover = vec![Vec::new(); dims.len()];
    for (d, fs) in tf.iter().enumerate() {
        for &f in fs {
            factors[f] = Some(Vec::new());
        }
        let axes = dims.get(d).copied().unwrap_or(&[]);
        let mut k = 0; // index into fs
        let mut rem = fs.first().map(|&f| rule.factors[f].size).unwrap_or(1);
        for (n, &a) in axes.iter().enumerate() {
            while rem == 1 && k + 1 < fs.len() {
                k += 1;
                rem = rule.factors[fs[k]].size;
            }
            let s = mesh.size(a);
            if fs.is_empty() || rem % s != 0 || (rem == 1 && s != 1) {
                leftover[d] = axes[n..].to_vec();
                break;
            }
            rem /= s;
            factors[fs[k]].as_mut().expect("factor registered above").push(a);
        }
    }
    Projection { factors, leftover }
}

/// The axes of a dimension made of `fs` when factor `f` is sharded over
/// `m[f]`: the concatenation of the factors' axes, stopping after the first
/// factor that is not fully split. The flag is false if axes of later
/// factors had to be dropped.
pub fn dim_axes(fs: &[usize], m: &[Vec<usize>], rule: &OpRule, mesh: &Mesh) -> (Vec<usize>, bool) {
    let mut out = Vec::new();
    for (k, &f) in fs.iter().enumerate() {
        out.extend_from_slice(&m[f]);
        if mesh.product(&m[f]) < rule.factors[f].size {
            let dropped = fs[k + 1..].iter().any(|&g| !m[g].is_empty());
            return (out, !dropped);
        }
    }
    (out, true)
}

/// The per-dimension axes of tensor `tf` when factors are sharded as `m`.
pub fn tensor_axes(tf: &TensorFactors, m: &[Vec<usize>], rule: &OpRule, mesh: &Mesh) -> Vec<Vec<usize>> {
    tf.iter().map(|fs| dim_axes(fs, m, rule, mesh).0).collect()
}

/// Clears factor shardings that some tensor of the rule cannot express (a
/// factor following a not fully split one in a dimension), until every
/// tensor can express them all.
pub fn make_expressible(m: &mut [Vec<usize>], rule: &OpRule, mesh: &Mesh) {
    loop {
        let mut changed = false;
        for t in 0..rule.num_tensors() {
            for fs in rule.tensor(t) {
                let mut partial = false;
                for &f in fs {
                    if partial && !m[f].is_empty() {
                        m[f].clear();
                        changed = true;
                    }
                    if mesh.product(&m[f]) < rule.factors[f].size {
                        partial = true;
                    }
                }
            }
        }
        if !changed {
            return;
        }
    }
}

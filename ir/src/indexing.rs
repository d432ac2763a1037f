//! The indexing ops — `gather`, `scatter_add`, `cumsum`, `top_k` — and
//! every fact about them that is not a kernel: names, operand counts,
//! attributes (read and written by the text format through one table),
//! and the type rule.
//!
//! Why a family of its own: an op's facts should have one home (Cranelift
//! defines each opcode once, as data). [`Op`](crate::Op) holds the family as
//! one variant, [`Op::Index`](crate::Op::Index); the parser, the printer,
//! [`infer()`](crate::infer()) and [`Op::name`](crate::Op::name) ask this
//! module instead of matching on each op, so adding an indexing op touches
//! this file, its kernel in [`crate::interp`] (which every CPU backend
//! falls back to), its VJP and its sharding rule.
//!
//! # Semantics (also in `specs/ir.md`)
//!
//! - `gather {axis, batch_dims}` (operand `x`, integer `indices`) is
//!   TensorFlow's `gather(x, indices, axis, batch_dims)`: the leading
//!   `batch_dims` dimensions of `x` and `indices` are paired (equal
//!   extents); the result's shape is `x.shape[..axis] ++
//!   indices.shape[batch_dims..] ++ x.shape[axis+1..]` and each result
//!   element reads `x` at the index found in `indices`. An embedding lookup
//!   is `gather {axis = 0, batch_dims = 0}` of a `[V, D]` table;
//!   `take_along_axis` of `[N, C]` logits by `[N]` targets is
//!   `gather {axis = 1, batch_dims = 1}`.
//! - `scatter_add {axis, batch_dims, size}` (integer `indices`, `updates`)
//!   is gather's transpose: a zero tensor of gather's operand shape (with
//!   `size` elements along `axis`) into which every update slice is added
//!   at its index. Sums run in increasing row-major order of the index
//!   positions; floats accumulate in `f32` (`f64` for `f64`; half types
//!   round once at the end), integers wrap.
//! - **Out-of-range indices** (negative, or not below the extent along
//!   `axis`) read zeros in `gather` and are dropped by `scatter_add`, on
//!   every backend (JAX's `mode="fill"` with fill value 0, and
//!   `mode="drop"`). This is also what makes a gather from a table split
//!   over rows a local gather plus a sum over the split (Megatron's
//!   vocabulary-parallel embedding).
//! - `cumsum {dim, reverse}`: inclusive prefix sums along `dim` (suffix
//!   sums when `reverse`); numbers only; the running sum is kept in the
//!   accumulation type above and each element rounded from it.
//! - `top_k {k}`: the `i32` positions of the `k` largest elements along the
//!   last dimension, largest first; ties go to the lower position; NaN
//!   ranks above every number. The values are a `gather` of the positions
//!   (`batch_dims = rank - 1`), so every op but `call` keeps one result.

use crate::{DType, TensorType};

/// The indexing ops, with their attributes.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum IndexOp {
    /// Slices of `x` along `axis` picked by integer indices.
    Gather {
        /// The dimension of `x` that is indexed.
        axis: usize,
        /// Leading dimensions shared by `x` and the indices.
        batch_dims: usize,
    },
    /// The transpose of `gather`: updates summed into zeros at their
    /// indices.
    ScatterAdd {
        /// The dimension of the result that is indexed.
        axis: usize,
        /// Leading dimensions shared by the result, the indices and the
        /// updates.
        batch_dims: usize,
        /// The result's extent along `axis`.
        size: usize,
    },
    /// Inclusive prefix (or suffix) sums along a dimension.
    Cumsum {
        /// The dimension summed along.
        dim: usize,
        /// Suffix sums instead of prefix sums.
        reverse: bool,
    },
    /// The positions of the `k` largest elements along the last dimension.
    TopK {
        /// How many.
        k: usize,
    },
}

/// An attribute's value as the text format writes it.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum IndexAttr {
    /// A non-negative integer.
    Int(usize),
    /// A boolean.
    Bool(bool),
}

impl std::fmt::Display for IndexAttr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            IndexAttr::Int(v) => write!(f, "{v}"),
            IndexAttr::Bool(b) => write!(f, "{b}"),
        }
    }
}

/// One row per op: mnemonic, operand count, attribute names in canonical
/// order, and each attribute's default (omitted from the text when equal;
/// `None`: required). A default's kind says whether the attribute is an
/// integer or a boolean; a required attribute is an integer.
type Row = (&'static str, usize, &'static [&'static str], &'static [Option<IndexAttr>]);

const TABLE: [Row; 4] = [
    ("gather", 2, &["axis", "batch_dims"], &[None, Some(IndexAttr::Int(0))]),
    ("scatter_add", 2, &["axis", "batch_dims", "size"], &[None, Some(IndexAttr::Int(0)), None]),
    ("cumsum", 1, &["dim", "reverse"], &[None, Some(IndexAttr::Bool(false))]),
    ("top_k", 1, &["k"], &[None]),
];

impl IndexOp {
    /// Every mnemonic of the family.
    pub fn names() -> impl Iterator<Item = &'static str> {
        TABLE.iter().map(|r| r.0)
    }

    fn row(&self) -> usize {
        match self {
            IndexOp::Gather { .. } => 0,
            IndexOp::ScatterAdd { .. } => 1,
            IndexOp::Cumsum { .. } => 2,
            IndexOp::TopK { .. } => 3,
        }
    }

    /// Mnemonic in the text format.
    pub fn name(&self) -> &'static str {
        TABLE[self.row()].0
    }

    /// The number of operands.
    pub fn arity(&self) -> usize {
        TABLE[self.row()].1
    }

    /// The attribute names of `mnemonic`, in canonical order (`None` if it
    /// is not an indexing op).
    pub fn attr_names(mnemonic: &str) -> Option<&'static [&'static str]> {
        TABLE.iter().find(|r| r.0 == mnemonic).map(|r| r.2)
    }

    /// The attribute values, in canonical order.
    fn values(&self) -> Vec<IndexAttr> {
        use IndexAttr::{Bool, Int};
        match *self {
            IndexOp::Gather { axis, batch_dims } => vec![Int(axis), Int(batch_dims)],
            IndexOp::ScatterAdd { axis, batch_dims, size } => vec![Int(axis), Int(batch_dims), Int(size)],
            IndexOp::Cumsum { dim, reverse } => vec![Int(dim), Bool(reverse)],
            IndexOp::TopK { k } => vec![Int(k)],
        }
    }

    /// The attributes as the text format writes them: canonical order,
    /// defaults omitted.
    pub fn attrs(&self) -> Vec<(&'static str, IndexAttr)> {
        let (_, _, names, defaults) = TABLE[self.row()];
        names
            .iter()
            .zip(defaults)
            .zip(self.values())
            .filter(|((_, d), v)| **d != Some(*v))
            .map(|((n, _), v)| (*n, v))
            .collect()
    }

    /// Builds the op named `mnemonic` from its attributes: `get(name,
    /// is_bool)` returns an attribute's value if present (an error if it has
    /// the wrong kind). A missing attribute without a default is an error.
    pub fn from_attrs<E>(
        mnemonic: &str,
        mut get: impl FnMut(&'static str, bool) -> Result<Option<IndexAttr>, E>,
        missing: impl Fn(&'static str) -> E,
    ) -> Option<Result<IndexOp, E>> {
        let (_, _, names, defaults) = TABLE.iter().find(|r| r.0 == mnemonic)?;
        let mut vals = Vec::with_capacity(names.len());
        for (name, default) in names.iter().zip(defaults.iter()) {
            let is_bool = matches!(default, Some(IndexAttr::Bool(_)));
            match get(name, is_bool) {
                Ok(Some(v)) => vals.push(v),
                Ok(None) => match default {
                    Some(d) => vals.push(*d),
                    None => return Some(Err(missing(name))),
                },
                Err(e) => return Some(Err(e)),
            }
        }
        let n = |i: usize| match vals[i] {
            IndexAttr::Int(v) => v,
            IndexAttr::Bool(b) => b as usize,
        };
        let b = |i: usize| matches!(vals[i], IndexAttr::Bool(true));
        Some(Ok(match mnemonic {
            "gather" => IndexOp::Gather { axis: n(0), batch_dims: n(1) },
            "scatter_add" => IndexOp::ScatterAdd { axis: n(0), batch_dims: n(1), size: n(2) },
            "cumsum" => IndexOp::Cumsum { dim: n(0), reverse: b(1) },
            "top_k" => IndexOp::TopK { k: n(0) },
            _ => unreachable!("every row of the table is built here"),
        }))
    }

    /// The result type for operands of types `xs` (whose count is
    /// [`IndexOp::arity`]), or what is wrong.
    pub fn infer(&self, xs: &[&TensorType]) -> Result<TensorType, String> {
        let integer = |t: &TensorType, what: &str| {
            if t.dtype.is_integer() {
                Ok(())
            } else {
                Err(format!("`{}` needs integer {what}, got {t}", self.name()))
            }
        };
        match *self {
            IndexOp::Gather { axis, batch_dims } => {
                let (x, idx) = (xs[0], xs[1]);
                integer(idx, "indices")?;
                check_batch(self.name(), axis, batch_dims, x, idx)?;
                let shape = [&x.shape[..axis], &idx.shape[batch_dims..], &x.shape[axis + 1..]].concat();
                Ok(TensorType::new(x.dtype, shape))
            }
            IndexOp::ScatterAdd { axis, batch_dims, size } => {
                let (idx, upd) = (xs[0], xs[1]);
                integer(idx, "indices")?;
                if upd.dtype.is_bool() {
                    return Err(format!("`scatter_add` sums numbers, got {upd}"));
                }
                let n = idx.rank() - batch_dims.min(idx.rank());
                // The updates are gather's result: x.shape[..axis] ++
                // indices.shape[batch_dims..] ++ x.shape[axis+1..].
                if upd.rank() < axis + n {
                    return Err(format!("`scatter_add` updates {upd} are too short for axis {axis} and indices {idx}"));
                }
                let x_shape = [&upd.shape[..axis], &[size][..], &upd.shape[axis + n..]].concat();
                let x = TensorType::new(upd.dtype, x_shape);
                check_batch(self.name(), axis, batch_dims, &x, idx)?;
                if upd.shape[axis..axis + n] != idx.shape[batch_dims..] {
                    return Err(format!(
                        "`scatter_add` updates {upd} must have the indices' dimensions {:?} at {axis}",
                        &idx.shape[batch_dims..]
                    ));
                }
                Ok(x)
            }
            IndexOp::Cumsum { dim, .. } => {
                let x = xs[0];
                if x.dtype.is_bool() {
                    return Err(format!("`cumsum` sums numbers, got {x}"));
                }
                if dim >= x.rank() {
                    return Err(format!("`cumsum` dimension {dim} is out of range for {x}"));
                }
                Ok(x.clone())
            }
            IndexOp::TopK { k } => {
                let x = xs[0];
                if x.dtype.is_bool() {
                    return Err(format!("`top_k` ranks numbers, got {x}"));
                }
                let Some(&last) = x.shape.last() else {
                    return Err(format!("`top_k` needs at least one dimension, got {x}"));
                };
                if k > last {
                    return Err(format!("`top_k` k = {k} exceeds the last dimension of {x}"));
                }
                let mut shape = x.shape.clone();
                *shape.last_mut().expect("checked") = k;
                Ok(TensorType::new(DType::I32, shape))
            }
        }
    }
}

/// The checks shared by `gather` and `scatter_add` on the gathered-from
/// type `x`: `batch_dims <= axis < rank`, `batch_dims` within the indices'
/// rank, and paired batch extents.
fn check_batch(name: &str, axis: usize, batch_dims: usize, x: &TensorType, idx: &TensorType) -> Result<(), String> {
    if axis >= x.rank() {
        return Err(format!("`{name}` axis {axis} is out of range for {x}"));
    }
    if batch_dims > axis || batch_dims > idx.rank() {
        return Err(format!(
            "`{name}` batch_dims {batch_dims} must be at most the axis ({axis}) and the indices' rank ({})",
            idx.rank()
        ));
    }
    if x.shape[..batch_dims] != idx.shape[..batch_dims] {
        return Err(format!("`{name}`: the first {batch_dims} dimensions of {x} and the indices {idx} must agree"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(d: DType, s: &[usize]) -> TensorType {
        TensorType::new(d, s.to_vec())
    }

    #[test]
    fn types() {
        let table = t(DType::F32, &[10, 4]);
        let ids = t(DType::I32, &[2, 3]);
        let g = IndexOp::Gather { axis: 0, batch_dims: 0 };
        assert_eq!(g.infer(&[&table, &ids]).unwrap(), t(DType::F32, &[2, 3, 4]));
        let s = IndexOp::ScatterAdd { axis: 0, batch_dims: 0, size: 10 };
        assert_eq!(s.infer(&[&ids, &t(DType::F32, &[2, 3, 4])]).unwrap(), table);
        let logits = t(DType::F32, &[5, 7]);
        let targets = t(DType::I32, &[5]);
        let take = IndexOp::Gather { axis: 1, batch_dims: 1 };
        assert_eq!(take.infer(&[&logits, &targets]).unwrap(), t(DType::F32, &[5]));
        let back = IndexOp::ScatterAdd { axis: 1, batch_dims: 1, size: 7 };
        assert_eq!(back.infer(&[&targets, &t(DType::F32, &[5])]).unwrap(), logits);
        assert!(g.infer(&[&table, &t(DType::F32, &[2])]).unwrap_err().contains("integer indices"));
        assert!(take.infer(&[&logits, &t(DType::I32, &[4])]).unwrap_err().contains("must agree"));
        assert!(IndexOp::Gather { axis: 2, batch_dims: 0 }
            .infer(&[&table, &ids])
            .unwrap_err()
            .contains("out of range"));
        assert_eq!(IndexOp::TopK { k: 3 }.infer(&[&logits]).unwrap(), t(DType::I32, &[5, 3]));
        assert!(IndexOp::TopK { k: 8 }.infer(&[&logits]).unwrap_err().contains("exceeds"));
        assert_eq!(IndexOp::Cumsum { dim: 1, reverse: true }.infer(&[&logits]).unwrap(), logits);
        assert!(IndexOp::Cumsum { dim: 0, reverse: false }.infer(&[&t(DType::Bool, &[3])]).is_err());
    }

    #[test]
    fn attributes_round_trip_through_the_table() {
        for op in [
            IndexOp::Gather { axis: 1, batch_dims: 0 },
            IndexOp::Gather { axis: 2, batch_dims: 2 },
            IndexOp::ScatterAdd { axis: 0, batch_dims: 0, size: 9 },
            IndexOp::Cumsum { dim: 1, reverse: true },
            IndexOp::Cumsum { dim: 0, reverse: false },
            IndexOp::TopK { k: 2 },
        ] {
            let attrs = op.attrs();
            let back = IndexOp::from_attrs(
                op.name(),
                |name, _| Ok::<_, String>(attrs.iter().find(|(n, _)| *n == name).map(|(_, v)| *v)),
                |name| name.to_string(),
            );
            assert_eq!(back.unwrap().unwrap(), op);
        }
        assert_eq!(IndexOp::Gather { axis: 1, batch_dims: 0 }.attrs(), vec![("axis", IndexAttr::Int(1))]);
        let missing = IndexOp::from_attrs("top_k", |_, _| Ok::<_, String>(None), |n| n.to_string());
        assert_eq!(missing.unwrap().unwrap_err(), "k");
        assert!(IndexOp::from_attrs("add", |_, _| Ok::<_, String>(None), |n| n.to_string()).is_none());
    }
}

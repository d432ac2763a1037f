//! Static shapes and tensor types.
//!
//! Every value in weft is a tensor with a static shape and an element type.
//! Scalars are rank-0 tensors (`f32[]`).

use crate::DType;
use std::fmt;

/// A static shape: one extent per dimension, major to minor.
pub type Shape = Vec<usize>;

/// The type of a value: element type and static shape.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorType {
    /// Element type.
    pub dtype: DType,
    /// Extent of each dimension; empty for a scalar.
    pub shape: Shape,
}

impl TensorType {
    /// A tensor type from a dtype and shape.
    pub fn new(dtype: DType, shape: impl Into<Shape>) -> TensorType {
        TensorType { dtype, shape: shape.into() }
    }

    /// A rank-0 tensor type.
    pub fn scalar(dtype: DType) -> TensorType {
        TensorType { dtype, shape: Vec::new() }
    }

    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// Number of elements (1 for a scalar, 0 if any extent is 0).
    pub fn num_elements(&self) -> usize {
        self.shape.iter().product()
    }

    /// Bytes occupied by a dense row-major buffer of this type.
    pub fn size_bytes(&self) -> usize {
        self.num_elements() * self.dtype.size_bytes()
    }

    /// The same shape with another dtype.
    pub fn with_dtype(&self, dtype: DType) -> TensorType {
        TensorType { dtype, shape: self.shape.clone() }
    }
}

impl fmt::Display for TensorType {
    /// Prints as in the text format: `f32[8,16]`, `i32[]`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[", self.dtype)?;
        for (i, d) in self.shape.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
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
    fn display_and_sizes() {
        let t = TensorType::new(DType::BF16, vec![8, 16]);
        assert_eq!(t.to_string(), "bf16[8,16]");
        assert_eq!(t.size_bytes(), 256);
        assert_eq!(TensorType::scalar(DType::F32).to_string(), "f32[]");
        assert_eq!(TensorType::scalar(DType::F32).num_elements(), 1);
        assert_eq!(TensorType::new(DType::F32, vec![3, 0]).num_elements(), 0);
    }
}

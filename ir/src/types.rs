//! Static shapes and tensor types.
//!
//! Every value in weft is a tensor with a static shape and an element type.
//! Scalars are rank-0 tensors (`f32[]`).

use crate::DType;
use std::fmt;

/// A static shape: one extent per dimension, major to minor.
pub type Shape = Vec<usize>;

/// The most bytes one tensor type may occupy: 2^48 (256 TiB), far above
/// any memory and far below `usize::MAX`, so the sizes of thousands of
/// values still add up without overflow. The parser and the verifier
/// reject larger types.
pub const MAX_TENSOR_BYTES: usize = 1 << 48;

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

    /// Number of elements, `None` if the product overflows `usize`.
    pub fn checked_num_elements(&self) -> Option<usize> {
        self.shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d))
    }

    /// Bytes of a dense buffer of this type, `None` if that is more than
    /// [`MAX_TENSOR_BYTES`] (so that sums of a few sizes cannot overflow
    /// and a buffer of it could be addressed at all).
    pub fn checked_size_bytes(&self) -> Option<usize> {
        self.checked_num_elements()?.checked_mul(self.dtype.size_bytes()).filter(|&b| b <= MAX_TENSOR_BYTES)
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
        assert_eq!(TensorType::new(DType::F32, vec![1 << 40, 1 << 30]).checked_num_elements(), None);
        assert_eq!(TensorType::new(DType::F32, vec![1 << 46, 4]).checked_size_bytes(), None);
        assert_eq!(TensorType::new(DType::F32, vec![1 << 45, 2]).checked_size_bytes(), Some(1 << 48));
    }
}

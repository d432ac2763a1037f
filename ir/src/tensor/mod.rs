//! Host tensors: the values the reference interpreter computes with.
//!
//! A [`HostTensor`] is a typed n-d array in host memory, one enum variant per
//! [`DType`], each backed by an `ndarray` [`ArrayD`]. A closed enum (rather
//! than bytes plus a dtype tag) keeps every kernel typed: an `f32` kernel sees
//! `&ArrayD<f32>` and cannot misread a buffer. Arrays built by this crate are
//! in row-major standard layout; every method also accepts other layouts
//! (the variants are public), reading elements in logical row-major order.
//!
//! Element values round-trip through `f64` exactly (every weft dtype embeds
//! in `f64`), which is what [`HostTensor::from_values`], [`HostTensor::to_f64_vec`]
//! and the test comparisons ([`assert_close`]) use.
//!
//! Submodules: `convert` (dtype conversion, bytes, literals), `compare`
//! (bitwise and tolerance comparisons for tests), `safetensors_io` (files).

mod bytes;
mod compare;
mod convert;
mod element;
mod safetensors_io;
mod strided;

pub use bytes::{tensor_bytes, BlockBuf};
pub use compare::{assert_close, check_close, epsilon};
pub use element::Element;
pub use safetensors_io::{
    from_safetensors_bytes, read_safetensors, safetensors_dtype, to_safetensors_bytes, write_safetensors,
};
pub use strided::to_standard_layout;

use crate::{DType, IrError, Shape, TensorType};
use half::{bf16, f16};
use ndarray::{ArrayD, IxDyn};
use std::fmt;

/// A typed n-d tensor in host memory.
#[derive(Clone, Debug, PartialEq)]
pub enum HostTensor {
    /// `f32` elements.
    F32(ArrayD<f32>),
    /// `f64` elements.
    F64(ArrayD<f64>),
    /// `bf16` elements.
    BF16(ArrayD<bf16>),
    /// `f16` elements.
    F16(ArrayD<f16>),
    /// `i32` elements.
    I32(ArrayD<i32>),
    /// `u32` elements.
    U32(ArrayD<u32>),
    /// `bool` elements.
    Bool(ArrayD<bool>),
}

/// Evaluates `$body` with `$a` bound to the typed array of whichever variant
/// `$t` is (the body is instantiated once per element type).
macro_rules! for_each_variant {
    ($t:expr, $a:ident => $body:expr) => {
        match $t {
            $crate::tensor::HostTensor::F32($a) => $body,
            $crate::tensor::HostTensor::F64($a) => $body,
            $crate::tensor::HostTensor::BF16($a) => $body,
            $crate::tensor::HostTensor::F16($a) => $body,
            $crate::tensor::HostTensor::I32($a) => $body,
            $crate::tensor::HostTensor::U32($a) => $body,
            $crate::tensor::HostTensor::Bool($a) => $body,
        }
    };
}

/// Like [`for_each_variant`], but wraps the resulting array back into the
/// same variant (for dtype-preserving operations such as shape ops).
macro_rules! map_variant {
    ($t:expr, $a:ident => $body:expr) => {
        match $t {
            $crate::tensor::HostTensor::F32($a) => $crate::tensor::HostTensor::F32($body),
            $crate::tensor::HostTensor::F64($a) => $crate::tensor::HostTensor::F64($body),
            $crate::tensor::HostTensor::BF16($a) => $crate::tensor::HostTensor::BF16($body),
            $crate::tensor::HostTensor::F16($a) => $crate::tensor::HostTensor::F16($body),
            $crate::tensor::HostTensor::I32($a) => $crate::tensor::HostTensor::I32($body),
            $crate::tensor::HostTensor::U32($a) => $crate::tensor::HostTensor::U32($body),
            $crate::tensor::HostTensor::Bool($a) => $crate::tensor::HostTensor::Bool($body),
        }
    };
}

/// Evaluates `$body` with `$T` a type alias for the Rust element type of
/// the dtype `$d`.
macro_rules! with_element_type {
    ($d:expr, $T:ident => $body:expr) => {
        match $d {
            $crate::DType::F32 => {
                type $T = f32;
                $body
            }
            $crate::DType::F64 => {
                type $T = f64;
                $body
            }
            $crate::DType::BF16 => {
                type $T = half::bf16;
                $body
            }
            $crate::DType::F16 => {
                type $T = half::f16;
                $body
            }
            $crate::DType::I32 => {
                type $T = i32;
                $body
            }
            $crate::DType::U32 => {
                type $T = u32;
                $body
            }
            $crate::DType::Bool => {
                type $T = bool;
                $body
            }
        }
    };
}

pub(crate) use {for_each_variant, map_variant, with_element_type};

fn shape_error(shape: &[usize], len: usize) -> IrError {
    let n: usize = shape.iter().product();
    IrError::Tensor(format!("shape {shape:?} needs {n} elements, got {len}"))
}

impl HostTensor {
    /// A tensor of any element type from a shape and row-major elements.
    pub fn from_vec<T: Element>(shape: &[usize], data: Vec<T>) -> Result<HostTensor, IrError> {
        let len = data.len();
        ArrayD::from_shape_vec(IxDyn(shape), data).map(T::wrap).map_err(|_| shape_error(shape, len))
    }

    /// An `f32` tensor from a shape and row-major elements.
    pub fn from_f32(shape: &[usize], data: Vec<f32>) -> Result<HostTensor, IrError> {
        HostTensor::from_vec(shape, data)
    }

    /// An `f64` tensor from a shape and row-major elements.
    pub fn from_f64(shape: &[usize], data: Vec<f64>) -> Result<HostTensor, IrError> {
        HostTensor::from_vec(shape, data)
    }

    /// A `bf16` tensor from a shape and row-major elements.
    pub fn from_bf16(shape: &[usize], data: Vec<bf16>) -> Result<HostTensor, IrError> {
        HostTensor::from_vec(shape, data)
    }

    /// An `f16` tensor from a shape and row-major elements.
    pub fn from_f16(shape: &[usize], data: Vec<f16>) -> Result<HostTensor, IrError> {
        HostTensor::from_vec(shape, data)
    }

    /// An `i32` tensor from a shape and row-major elements.
    pub fn from_i32(shape: &[usize], data: Vec<i32>) -> Result<HostTensor, IrError> {
        HostTensor::from_vec(shape, data)
    }

    /// A `u32` tensor from a shape and row-major elements.
    pub fn from_u32(shape: &[usize], data: Vec<u32>) -> Result<HostTensor, IrError> {
        HostTensor::from_vec(shape, data)
    }

    /// A `bool` tensor from a shape and row-major elements.
    pub fn from_bool(shape: &[usize], data: Vec<bool>) -> Result<HostTensor, IrError> {
        HostTensor::from_vec(shape, data)
    }

    /// A tensor of type `ty` from row-major values, each rounded to the dtype
    /// as [`DType::round`] does (nearest-even for floats, saturating
    /// truncation for integers, `!= 0` for bool).
    pub fn from_values(ty: &TensorType, values: &[f64]) -> Result<HostTensor, IrError> {
        if values.len() != ty.num_elements() {
            return Err(shape_error(&ty.shape, values.len()));
        }
        Ok(with_element_type!(ty.dtype, T => {
            let data: Vec<T> = values.iter().map(|&v| T::from_f64_rounded(v)).collect();
            T::wrap(ArrayD::from_shape_vec(IxDyn(&ty.shape), data).expect("length checked"))
        }))
    }

    /// A tensor of type `ty` with every element equal to `value` (rounded).
    pub fn full(ty: &TensorType, value: f64) -> HostTensor {
        with_element_type!(ty.dtype, T => T::wrap(ArrayD::from_elem(IxDyn(&ty.shape), T::from_f64_rounded(value))))
    }

    /// A tensor of type `ty` filled with zeros (`false` for bool).
    pub fn zeros(ty: &TensorType) -> HostTensor {
        HostTensor::full(ty, 0.0)
    }

    /// A rank-0 tensor holding `value` rounded to `dtype`.
    pub fn scalar(dtype: DType, value: f64) -> HostTensor {
        HostTensor::full(&TensorType::scalar(dtype), value)
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        match self {
            HostTensor::F32(_) => DType::F32,
            HostTensor::F64(_) => DType::F64,
            HostTensor::BF16(_) => DType::BF16,
            HostTensor::F16(_) => DType::F16,
            HostTensor::I32(_) => DType::I32,
            HostTensor::U32(_) => DType::U32,
            HostTensor::Bool(_) => DType::Bool,
        }
    }

    /// The extents, major to minor.
    pub fn shape(&self) -> &[usize] {
        for_each_variant!(self, a => a.shape())
    }

    /// The tensor type (dtype and shape).
    pub fn ty(&self) -> TensorType {
        TensorType::new(self.dtype(), Shape::from(self.shape()))
    }

    /// Whether the tensor has type `ty` (without allocating a [`TensorType`]).
    pub fn has_type(&self, ty: &TensorType) -> bool {
        self.dtype() == ty.dtype && self.shape() == ty.shape.as_slice()
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        for_each_variant!(self, a => a.len())
    }

    /// True if the tensor has no elements (some extent is 0).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The typed array, if the tensor's element type is `T`.
    pub fn as_array<T: Element>(&self) -> Option<&ArrayD<T>> {
        T::unwrap_ref(self)
    }

    /// The `f32` array, if this is an `f32` tensor.
    pub fn as_f32(&self) -> Option<&ArrayD<f32>> {
        self.as_array()
    }

    /// The `f64` array, if this is an `f64` tensor.
    pub fn as_f64(&self) -> Option<&ArrayD<f64>> {
        self.as_array()
    }

    /// The `bf16` array, if this is a `bf16` tensor.
    pub fn as_bf16(&self) -> Option<&ArrayD<bf16>> {
        self.as_array()
    }

    /// The `f16` array, if this is an `f16` tensor.
    pub fn as_f16(&self) -> Option<&ArrayD<f16>> {
        self.as_array()
    }

    /// The `i32` array, if this is an `i32` tensor.
    pub fn as_i32(&self) -> Option<&ArrayD<i32>> {
        self.as_array()
    }

    /// The `u32` array, if this is a `u32` tensor.
    pub fn as_u32(&self) -> Option<&ArrayD<u32>> {
        self.as_array()
    }

    /// The `bool` array, if this is a `bool` tensor.
    pub fn as_bool(&self) -> Option<&ArrayD<bool>> {
        self.as_array()
    }

    /// Every element as `f64` (exact), in row-major order.
    pub fn to_f64_vec(&self) -> Vec<f64> {
        for_each_variant!(self, a => a.iter().map(|&x| x.to_f64_exact()).collect())
    }

    /// The element at row-major position `i` as `f64`. Panics if out of range.
    pub fn get_f64(&self, i: usize) -> f64 {
        for_each_variant!(self, a => {
            match a.as_slice() {
                Some(s) => s[i].to_f64_exact(),
                None => a.iter().nth(i).expect("element index out of range").to_f64_exact(),
            }
        })
    }
}

impl<T: Element> From<ArrayD<T>> for HostTensor {
    fn from(a: ArrayD<T>) -> HostTensor {
        T::wrap(a)
    }
}

/// How many elements `Display` shows before eliding the rest.
const DISPLAY_ELEMENTS: usize = 8;

impl fmt::Display for HostTensor {
    /// Prints the type and the first few elements: `f32[2,2] [1, 2, 3, 4]`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} [", self.ty())?;
        for_each_variant!(self, a => {
            for (i, x) in a.iter().take(DISPLAY_ELEMENTS).enumerate() {
                if i > 0 {
                    f.write_str(", ")?;
                }
                x.fmt_value(f)?;
            }
        });
        if self.len() > DISPLAY_ELEMENTS {
            write!(f, ", ... ({} more)", self.len() - DISPLAY_ELEMENTS)?;
        }
        f.write_str("]")
    }
}

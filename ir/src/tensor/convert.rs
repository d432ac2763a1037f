//! Conversions of host tensors: between dtypes, to and from literals, and to
//! and from little-endian bytes (the form files and devices use).
//!
//! Dtype conversion goes through the exact `f64` value of each element and
//! rounds once to the target ([`Element::from_f64_rounded`]), so there is no double
//! rounding (e.g. `i32 -> bf16` does not round through `f32`). The one
//! exception is integer-to-integer conversion, which reinterprets the bits
//! (two's complement wrap: `i32 -1 -> u32 4294967295`), as XLA does; that is
//! what PRNG code relies on.

use super::{for_each_variant, with_element_type, Element, HostTensor};
use crate::{DType, IrError, Literal, LiteralData, TensorType};
use ndarray::{ArrayD, IxDyn};

impl HostTensor {
    /// Converts to `to`. Floats round to nearest-even; floats to integers
    /// truncate toward zero and saturate, NaN becomes 0; integers to
    /// integers wrap; anything to bool is `!= 0` (NaN is true); bool to
    /// numbers is 0/1. Converting to the same dtype is a copy.
    pub fn convert(&self, to: DType) -> HostTensor {
        match (self, to) {
            (HostTensor::I32(a), DType::U32) => HostTensor::U32(a.mapv(|x| x as u32)),
            (HostTensor::U32(a), DType::I32) => HostTensor::I32(a.mapv(|x| x as i32)),
            _ if self.dtype() == to => self.clone(),
            // f32 <-> half types have exact or single-rounding direct paths.
            (HostTensor::F32(a), DType::BF16) => HostTensor::BF16(a.mapv(half::bf16::from_f32)),
            (HostTensor::F32(a), DType::F16) => HostTensor::F16(a.mapv(half::f16::from_f32)),
            (HostTensor::BF16(a), DType::F32) => HostTensor::F32(a.mapv(half::bf16::to_f32)),
            (HostTensor::F16(a), DType::F32) => HostTensor::F32(a.mapv(half::f16::to_f32)),
            _ => for_each_variant!(self, a => convert_array(a, to)),
        }
    }

    /// The tensor a `constant` op produces. Fails if a dense literal has the
    /// wrong number of values.
    pub fn from_literal(lit: &Literal) -> Result<HostTensor, IrError> {
        match &lit.data {
            LiteralData::Splat(v) => Ok(HostTensor::full(&lit.ty, *v)),
            LiteralData::Dense(vs) => HostTensor::from_values(&lit.ty, vs),
        }
    }

    /// A dense literal holding this tensor's values.
    pub fn to_literal(&self) -> Literal {
        Literal { ty: self.ty(), data: LiteralData::Dense(self.to_f64_vec()) }
    }

    /// The elements as a dense little-endian row-major buffer (bool: one
    /// byte per element, 0 or 1).
    pub fn to_bytes_le(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.len() * self.dtype().size_bytes());
        for_each_variant!(self, a => a.iter().for_each(|&x| x.write_le(&mut out)));
        out
    }

    /// A tensor of type `ty` from a dense little-endian row-major buffer.
    pub fn from_bytes_le(ty: &TensorType, bytes: &[u8]) -> Result<HostTensor, IrError> {
        if bytes.len() != ty.size_bytes() {
            return Err(IrError::Tensor(format!("{ty} needs {} bytes, got {}", ty.size_bytes(), bytes.len())));
        }
        let size = ty.dtype.size_bytes();
        with_element_type!(ty.dtype, T => {
            let mut data: Vec<T> = Vec::with_capacity(ty.num_elements());
            for (i, chunk) in bytes.chunks_exact(size).enumerate() {
                let v = T::read_le(chunk).ok_or_else(|| {
                    IrError::Tensor(format!("element {i} of {ty}: byte {:?} is not a valid {}", chunk, ty.dtype))
                })?;
                data.push(v);
            }
            Ok(T::wrap(ArrayD::from_shape_vec(IxDyn(&ty.shape), data).expect("length checked")))
        })
    }
}

fn convert_array<S: Element>(a: &ArrayD<S>, to: DType) -> HostTensor {
    with_element_type!(to, T => T::wrap(a.mapv(|x| T::from_f64_rounded(x.to_f64_exact()))))
}

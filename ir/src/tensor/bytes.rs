//! Tensor data as little-endian bytes without needless copies.
//!
//! A checkpoint moves hundreds of megabytes, and a collective between
//! processes moves a step's gradients every step; an element-by-element
//! conversion or an extra buffer per file doubles the time a save or
//! restore takes. On a little-endian machine a standard-layout host tensor
//! already *is* its file (or message) bytes, so writers borrow them
//! ([`tensor_bytes`]) and readers copy bytes straight into typed tensors
//! ([`BlockBuf`]), with
//! `zerocopy` proving the casts sound. Bool tensors (whose bytes must be 0
//! or 1), other layouts and big-endian machines take the checked,
//! element-wise path of `weft_ir`.

use crate::tensor::HostTensor;
use crate::{DType, IrError, TensorType};
use std::borrow::Cow;
use zerocopy::IntoBytes;

/// The tensor's elements as dense little-endian row-major bytes (borrowed
/// when the memory already has that form).
pub fn tensor_bytes(t: &HostTensor) -> Cow<'_, [u8]> {
    if cfg!(target_endian = "little") {
        let borrowed = match t {
            HostTensor::F32(a) => a.as_slice().map(|s| s.as_bytes()),
            HostTensor::F64(a) => a.as_slice().map(|s| s.as_bytes()),
            HostTensor::BF16(a) => a.as_slice().map(|s| s.as_bytes()),
            HostTensor::F16(a) => a.as_slice().map(|s| s.as_bytes()),
            HostTensor::I32(a) => a.as_slice().map(|s| s.as_bytes()),
            HostTensor::U32(a) => a.as_slice().map(|s| s.as_bytes()),
            HostTensor::Bool(a) => a.as_slice().map(|s| s.as_bytes()),
        };
        if let Some(b) = borrowed {
            return Cow::Borrowed(b);
        }
    }
    Cow::Owned(t.to_bytes_le())
}

/// A block being filled from file bytes: a typed tensor written through
/// its bytes, or raw bytes decoded (and validated) at the end.
pub enum BlockBuf {
    /// A zeroed tensor whose memory is its little-endian bytes.
    Typed(HostTensor),
    /// Bytes of a tensor of this type (bool, or a big-endian machine).
    Raw(TensorType, Vec<u8>),
}

impl BlockBuf {
    /// A zeroed block of type `ty`.
    pub fn new(ty: &TensorType) -> BlockBuf {
        if cfg!(target_endian = "little") && ty.dtype != DType::Bool {
            BlockBuf::Typed(HostTensor::zeros(ty))
        } else {
            BlockBuf::Raw(ty.clone(), vec![0; ty.size_bytes()])
        }
    }

    /// The block's bytes, to copy into.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        fn slice(o: Option<&mut [u8]>) -> &mut [u8] {
            o.expect("zeros() builds standard-layout arrays")
        }
        match self {
            BlockBuf::Raw(_, b) => b,
            BlockBuf::Typed(HostTensor::F32(a)) => slice(a.as_slice_mut().map(|s| s.as_mut_bytes())),
            BlockBuf::Typed(HostTensor::F64(a)) => slice(a.as_slice_mut().map(|s| s.as_mut_bytes())),
            BlockBuf::Typed(HostTensor::BF16(a)) => slice(a.as_slice_mut().map(|s| s.as_mut_bytes())),
            BlockBuf::Typed(HostTensor::F16(a)) => slice(a.as_slice_mut().map(|s| s.as_mut_bytes())),
            BlockBuf::Typed(HostTensor::I32(a)) => slice(a.as_slice_mut().map(|s| s.as_mut_bytes())),
            BlockBuf::Typed(HostTensor::U32(a)) => slice(a.as_slice_mut().map(|s| s.as_mut_bytes())),
            BlockBuf::Typed(HostTensor::Bool(_)) => unreachable!("bool blocks are raw"),
        }
    }

    /// The finished tensor. Fails if raw bytes are not valid values (a
    /// bool byte other than 0 or 1).
    pub fn finish(self) -> Result<HostTensor, IrError> {
        match self {
            BlockBuf::Typed(t) => Ok(t),
            BlockBuf::Raw(ty, b) => HostTensor::from_bytes_le(&ty, &b),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_match_the_checked_path_for_every_dtype() {
        for d in DType::ALL {
            let ty = TensorType::new(d, vec![2, 3]);
            let t = HostTensor::from_values(&ty, &[1.0, -2.5, 0.0, 3.0, 1e3, -0.0]).unwrap();
            assert_eq!(tensor_bytes(&t).as_ref(), t.to_bytes_le().as_slice(), "{d}");
            let mut buf = BlockBuf::new(&ty);
            buf.bytes_mut().copy_from_slice(&t.to_bytes_le());
            assert!(buf.finish().unwrap().bitwise_eq(&t), "{d}");
        }
        // A transposed (non-standard) layout takes the element-wise path.
        let t = HostTensor::from_f32(&[2, 2], vec![1.0, 2.0, 3.0, 4.0]).unwrap();
        let HostTensor::F32(a) = &t else { unreachable!() };
        let tt = HostTensor::F32(a.clone().reversed_axes());
        let b = tensor_bytes(&tt);
        assert!(matches!(b, Cow::Owned(_)));
        assert_eq!(b.as_ref(), [1.0f32, 3.0, 2.0, 4.0].as_bytes());
    }
}

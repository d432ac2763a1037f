//! How each IR dtype is stored on a CubeCL device.
//!
//! WGSL, the language the wgpu runtime compiles to, has no 16-bit floats
//! it can always use, no bf16 at all, and cannot store `bool` in memory.
//! Rather than emulate packed formats in every kernel, the backend stores
//! each dtype in a 32- or 64-bit *storage type*:
//!
//! | dtype | storage | values |
//! |---|---|---|
//! | f32, bf16, f16 | f32 | exactly the dtype's values |
//! | f64 | f64 | (needs device support) |
//! | i32 | i32 | |
//! | u32, bool | u32 | bool is 0 or 1 |
//!
//! This matches the interpreter's numerics contract directly: half types
//! compute in `f32` and round once per produced element, so a kernel for a
//! `bf16` op is the `f32` kernel followed by an in-register rounding to
//! `bf16` (see `round.rs`), and every buffer holds exactly representable
//! values. The cost is twice the memory for half types; the gain is that
//! every kernel exists once per storage type and results match the CPU
//! bit for bit wherever the arithmetic itself does.

use crate::error::RuntimeError;
use cubecl::prelude::CubeElement;
use half::{bf16, f16};
use weft_ir::tensor::HostTensor;
use weft_ir::{DType, TensorType};

/// A storage type (see the module documentation).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Storage {
    /// 32-bit float (f32, bf16, f16).
    F32,
    /// 64-bit float.
    F64,
    /// 32-bit signed integer.
    I32,
    /// 32-bit unsigned integer (u32, bool).
    U32,
}

impl Storage {
    /// The float dtype that names the float storage of `d` (`F64` for
    /// `f64`, else `F32`): what [`with_float!`](super::ops) dispatches on.
    pub fn float_of(d: DType) -> DType {
        if Storage::of(d) == Storage::F64 {
            DType::F64
        } else {
            DType::F32
        }
    }

    /// The storage type of a dtype.
    pub fn of(d: DType) -> Storage {
        match d {
            DType::F32 | DType::BF16 | DType::F16 => Storage::F32,
            DType::F64 => Storage::F64,
            DType::I32 => Storage::I32,
            DType::U32 | DType::Bool => Storage::U32,
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Storage::F64 => 8,
            _ => 4,
        }
    }
}

/// The rounding a float result needs to land on its dtype's values.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Rounding {
    /// f32 or f64: the arithmetic already rounds.
    None,
    /// Round to nearest-even bf16.
    Bf16,
    /// Round to nearest-even f16 (with subnormals and overflow to inf).
    F16,
}

impl Rounding {
    /// The rounding for results of dtype `d`.
    pub fn of(d: DType) -> Rounding {
        match d {
            DType::BF16 => Rounding::Bf16,
            DType::F16 => Rounding::F16,
            _ => Rounding::None,
        }
    }
}

/// The bytes to upload for a host tensor.
pub fn to_device_bytes(t: &HostTensor) -> Vec<u8> {
    fn bytes<T: CubeElement>(v: &[T]) -> Vec<u8> {
        T::as_bytes(v).to_vec()
    }
    match t {
        HostTensor::F32(_) | HostTensor::F64(_) | HostTensor::I32(_) | HostTensor::U32(_) => t.to_bytes_le(),
        HostTensor::BF16(a) => bytes(&a.iter().map(|x| x.to_f32()).collect::<Vec<f32>>()),
        HostTensor::F16(a) => bytes(&a.iter().map(|x| x.to_f32()).collect::<Vec<f32>>()),
        HostTensor::Bool(a) => bytes(&a.iter().map(|&x| x as u32).collect::<Vec<u32>>()),
    }
}

/// The host tensor of type `ty` from downloaded storage bytes.
pub fn from_device_bytes(ty: &TensorType, bytes: &[u8]) -> Result<HostTensor, RuntimeError> {
    let n = ty.num_elements();
    let need = n * Storage::of(ty.dtype).size();
    if bytes.len() < need {
        return Err(RuntimeError::Device {
            backend: "cubecl".into(),
            message: format!("read {} bytes for a {ty} buffer, expected {need}", bytes.len()),
        });
    }
    let bytes = &bytes[..need];
    let shape = &ty.shape;
    let t = match ty.dtype {
        DType::F32 | DType::F64 | DType::I32 | DType::U32 => return Ok(HostTensor::from_bytes_le(ty, bytes)?),
        DType::BF16 => {
            HostTensor::from_bf16(shape, f32::from_bytes(bytes).iter().map(|&x| bf16::from_f32(x)).collect())
        }
        DType::F16 => HostTensor::from_f16(shape, f32::from_bytes(bytes).iter().map(|&x| f16::from_f32(x)).collect()),
        DType::Bool => HostTensor::from_bool(shape, u32::from_bytes(bytes).iter().map(|&x| x != 0).collect()),
    };
    Ok(t?)
}

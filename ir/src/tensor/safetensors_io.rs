//! Reading and writing named host tensors as safetensors.
//!
//! safetensors is the exchange format for parameters, inputs and reference
//! outputs (it is what JAX/PyTorch tooling writes). The file format itself is
//! handled by the `safetensors` crate; this module maps its dtypes to weft's
//! (F32 F64 BF16 F16 I32 U32 BOOL) and reports everything else, and every I/O
//! or format problem, as [`IrError::TensorFile`] naming the file and tensor.

use super::HostTensor;
use crate::{DType, IrError, TensorType};
use safetensors::tensor::{Dtype, SafeTensors, TensorView};
use std::collections::BTreeMap;
use std::path::Path;

/// What in-memory buffers are called in error messages.
const MEMORY: &str = "<memory>";

fn file_error(path: &str, message: impl Into<String>) -> IrError {
    IrError::TensorFile { path: path.to_string(), message: message.into() }
}

fn to_weft(d: Dtype) -> Option<DType> {
    Some(match d {
        Dtype::F32 => DType::F32,
        Dtype::F64 => DType::F64,
        Dtype::BF16 => DType::BF16,
        Dtype::F16 => DType::F16,
        Dtype::I32 => DType::I32,
        Dtype::U32 => DType::U32,
        Dtype::BOOL => DType::Bool,
        _ => return None,
    })
}

/// The safetensors dtype of a weft dtype.
pub fn safetensors_dtype(d: DType) -> Dtype {
    match d {
        DType::F32 => Dtype::F32,
        DType::F64 => Dtype::F64,
        DType::BF16 => Dtype::BF16,
        DType::F16 => Dtype::F16,
        DType::I32 => Dtype::I32,
        DType::U32 => Dtype::U32,
        DType::Bool => Dtype::BOOL,
    }
}

fn decode(path: &str, bytes: &[u8]) -> Result<BTreeMap<String, HostTensor>, IrError> {
    let st = SafeTensors::deserialize(bytes).map_err(|e| file_error(path, format!("not a safetensors file: {e}")))?;
    let mut out = BTreeMap::new();
    for (name, view) in st.iter() {
        let dtype = to_weft(view.dtype())
            .ok_or_else(|| file_error(path, format!("tensor `{name}` has unsupported dtype {:?}", view.dtype())))?;
        let ty = TensorType::new(dtype, view.shape().to_vec());
        let t = HostTensor::from_bytes_le(&ty, view.data())
            .map_err(|e| file_error(path, format!("tensor `{name}`: {e}")))?;
        out.insert(name.to_string(), t);
    }
    Ok(out)
}

fn encode(path: &str, tensors: &BTreeMap<String, HostTensor>) -> Result<Vec<u8>, IrError> {
    let buffers: Vec<(&String, DType, &[usize], Vec<u8>)> =
        tensors.iter().map(|(n, t)| (n, t.dtype(), t.shape(), t.to_bytes_le())).collect();
    let mut views = Vec::with_capacity(buffers.len());
    for (name, dtype, shape, bytes) in &buffers {
        let view = TensorView::new(safetensors_dtype(*dtype), shape.to_vec(), bytes)
            .map_err(|e| file_error(path, format!("tensor `{name}`: {e}")))?;
        views.push((name.as_str(), view));
    }
    safetensors::tensor::serialize(views, None).map_err(|e| file_error(path, e.to_string()))
}

/// Decodes a safetensors buffer into named tensors.
pub fn from_safetensors_bytes(bytes: &[u8]) -> Result<BTreeMap<String, HostTensor>, IrError> {
    decode(MEMORY, bytes)
}

/// Encodes named tensors as a safetensors buffer.
pub fn to_safetensors_bytes(tensors: &BTreeMap<String, HostTensor>) -> Result<Vec<u8>, IrError> {
    encode(MEMORY, tensors)
}

/// Reads every tensor of a safetensors file.
pub fn read_safetensors(path: impl AsRef<Path>) -> Result<BTreeMap<String, HostTensor>, IrError> {
    let p = path.as_ref().display().to_string();
    let bytes = std::fs::read(path.as_ref()).map_err(|e| file_error(&p, e.to_string()))?;
    decode(&p, &bytes)
}

/// Writes named tensors to a safetensors file (replacing it).
pub fn write_safetensors(path: impl AsRef<Path>, tensors: &BTreeMap<String, HostTensor>) -> Result<(), IrError> {
    let p = path.as_ref().display().to_string();
    let bytes = encode(&p, tensors)?;
    std::fs::write(path.as_ref(), bytes).map_err(|e| file_error(&p, e.to_string()))
}

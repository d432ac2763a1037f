//! Example tables: one array per model input, row `i` of every array being
//! example `i` (`x` and `y` for the MLP; `tokens` and `targets` for a GPT),
//! stored as `.npy` files or tensors of a `.safetensors` file. Only the
//! headers are parsed up front; rows are read where they lie, one positioned
//! read per example, so a reader touches only the examples of its rows.

use super::files::{check_ids, data_err, DataFile, FileDtype};
use super::InputSpec;
use crate::error::Result;
use std::collections::BTreeMap;
use std::path::Path;
use weft_ir::tensor::HostTensor;
use weft_ir::TensorType;

/// One stored array: where its elements start and what they are.
#[derive(Debug)]
pub struct Array {
    /// The file holding it.
    pub file: DataFile,
    /// The tensor's name in a safetensors file (`None` for `.npy`).
    pub tensor: Option<String>,
    /// Element type.
    pub dtype: FileDtype,
    /// Shape; dimension 0 counts examples.
    pub shape: Vec<usize>,
    /// Byte offset of element 0.
    pub offset: u64,
}

impl Array {
    /// `path (tensor t)` for messages.
    pub fn what(&self) -> String {
        match &self.tensor {
            Some(t) => format!("tensor `{t}`"),
            None => "the array".into(),
        }
    }

    /// Number of examples (dimension 0).
    pub fn rows(&self) -> u64 {
        self.shape.first().copied().unwrap_or(0) as u64
    }

    fn row_elems(&self) -> usize {
        self.shape.iter().skip(1).product()
    }

    /// The bytes of example `i`.
    fn row(&self, i: u64, buf: &mut [u8]) -> Result<()> {
        let rb = (self.row_elems() * self.dtype.size()) as u64;
        self.file.read_at(buf, self.offset + i * rb)
    }

    /// Checks the array against the model input it feeds: float data for
    /// float inputs, integer data for integer inputs, one example's shape
    /// equal to the input's shape without its batch dimension.
    pub fn check(&self, input: &InputSpec) -> Result<()> {
        let path = &self.file.path;
        let want_float = input.ty.dtype.is_float();
        if self.dtype.is_float() != want_float {
            return Err(data_err(
                path,
                format!(
                    "{} is {}, but the model's input `{}` is {} ({} data needed)",
                    self.what(),
                    self.dtype.name(),
                    input.name,
                    input.ty.dtype.name(),
                    if want_float { "floating-point" } else { "integer" }
                ),
            ));
        }
        if self.shape.len() != input.ty.rank() || self.shape[1..] != input.ty.shape[1..] {
            let row: Vec<String> = input.ty.shape[1..].iter().map(|d| d.to_string()).collect();
            return Err(data_err(
                path,
                format!(
                    "{} has shape {:?}, but the model's input `{}` ({}) needs [N, {}] (N examples)",
                    self.what(),
                    self.shape,
                    input.name,
                    input.ty,
                    row.join(", ")
                ),
            ));
        }
        Ok(())
    }

    /// Checks every element is an id below `vocab` (integer arrays that feed
    /// token inputs).
    pub fn check_ids(&self, vocab: u64) -> Result<()> {
        let total = self.shape.iter().product::<usize>();
        let chunk = (1 << 20) / self.dtype.size();
        let mut buf = vec![0u8; chunk * self.dtype.size()];
        let mut i = 0;
        while i < total {
            let n = chunk.min(total - i);
            let b = &mut buf[..n * self.dtype.size()];
            self.file.read_at(b, self.offset + (i * self.dtype.size()) as u64)?;
            check_ids(&self.file.path, self.dtype, b, i as u64, vocab)?;
            i += n;
        }
        Ok(())
    }

    /// The examples `idx` as a tensor of `dtype` and shape `[idx.len(), ...]`.
    pub fn gather(&self, idx: &[u64], ty: &TensorType) -> Result<HostTensor> {
        let re = self.row_elems();
        let mut buf = vec![0u8; re * self.dtype.size()];
        let mut vals = Vec::with_capacity(idx.len() * re);
        for &i in idx {
            self.row(i, &mut buf)?;
            vals.extend((0..re).map(|k| self.dtype.get(&buf, k)));
        }
        let mut shape = ty.shape.clone();
        shape[0] = idx.len();
        Ok(HostTensor::from_values(&TensorType::new(ty.dtype, shape), &vals)?)
    }
}

/// Opens a `.npy` file (format versions 1–3, C order, little-endian): the
/// header parsed and checked once ([`super::headers::parse_npy_header`]),
/// the data exactly the shape's bytes.
pub fn npy(path: &Path) -> Result<Array> {
    let file = DataFile::open(path)?;
    let bad = |m: String| data_err(path, format!("not a readable .npy file: {m}"));
    let mut pre = [0u8; 12];
    let n = (file.bytes as usize).min(12);
    file.read_at(&mut pre[..n], 0)?;
    if n < 10 || &pre[..6] != b"\x93NUMPY" {
        return Err(bad("no NUMPY magic (truncated or another format)".into()));
    }
    let (hlen, start) = match pre[6] {
        1 => (u16::from_le_bytes([pre[8], pre[9]]) as u64, 10u64),
        2 | 3 if n >= 12 => (u32::from_le_bytes([pre[8], pre[9], pre[10], pre[11]]) as u64, 12),
        v => return Err(bad(format!("format version {v}"))),
    };
    if start + hlen > file.bytes {
        return Err(data_err(path, "the .npy header runs past the end of the file: truncated"));
    }
    let mut h = vec![0u8; hlen as usize];
    file.read_at(&mut h, start)?;
    let text = String::from_utf8(h).map_err(|_| bad("the header is not text".into()))?;
    let header = super::headers::parse_npy_header(&text).map_err(bad)?;
    let offset = start + hlen;
    exact_len(path, "the array", &header.shape, header.dtype, file.bytes - offset)?;
    Ok(Array { file, tensor: None, dtype: header.dtype, shape: header.shape, offset })
}

/// Checks that `len` data bytes are exactly `shape` × `dtype`.
fn exact_len(path: &Path, what: &str, shape: &[usize], dtype: FileDtype, len: u64) -> Result<()> {
    let need = super::headers::data_bytes(shape, dtype);
    if need == Some(len) {
        return Ok(());
    }
    let how = match need {
        Some(n) if n > len => "truncated",
        Some(_) => "bytes left over: the shape or dtype is wrong",
        None => "the shape is impossibly large",
    };
    Err(data_err(
        path,
        format!(
            "{what} of shape {shape:?} ({}) needs {} bytes, but the file holds {len} after its header: {how}",
            dtype.name(),
            need.map(|n| n.to_string()).unwrap_or_else(|| "more than 2^64".into())
        ),
    ))
}

/// Opens every tensor of a `.safetensors` file (only the header is read,
/// and checked against the file: [`super::headers::parse_safetensors_header`]).
pub fn safetensors(path: &Path) -> Result<BTreeMap<String, Array>> {
    let file = DataFile::open(path)?;
    let bad = |m: String| data_err(path, format!("not a readable .safetensors file: {m}"));
    if file.bytes < 8 {
        return Err(bad(format!("{} bytes, shorter than the header length: truncated", file.bytes)));
    }
    let mut n8 = [0u8; 8];
    file.read_at(&mut n8, 0)?;
    let hlen = u64::from_le_bytes(n8);
    if hlen > file.bytes - 8 || hlen > 100 << 20 {
        return Err(bad(format!("a header of {hlen} bytes in a file of {} bytes: truncated", file.bytes)));
    }
    let mut h = vec![0u8; hlen as usize];
    file.read_at(&mut h, 8)?;
    let data_start = 8 + hlen;
    let entries = super::headers::parse_safetensors_header(&h, file.bytes - data_start).map_err(bad)?;
    let mut out = BTreeMap::new();
    for e in entries {
        let f = DataFile::open(path)?;
        let offset = data_start + e.offsets.0;
        out.insert(e.name.clone(), Array { file: f, tensor: Some(e.name), dtype: e.dtype, shape: e.shape, offset });
    }
    Ok(out)
}

/// Opens one array file: a `.npy`, or a `.safetensors` holding a tensor
/// named `name` (or exactly one tensor).
pub fn open_array(path: &Path, name: &str) -> Result<Array> {
    if path.extension().is_some_and(|e| e == "safetensors") {
        let mut all = safetensors(path)?;
        if let Some(a) = all.remove(name) {
            return Ok(a);
        }
        if all.len() == 1 {
            return Ok(all.into_values().next().expect("one tensor"));
        }
        let names: Vec<String> = all.keys().cloned().collect();
        return Err(data_err(path, format!("has no tensor `{name}` (it holds: {})", names.join(", "))));
    }
    npy(path)
}

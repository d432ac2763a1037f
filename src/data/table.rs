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

fn checked_len(path: &Path, what: &str, shape: &[usize], dtype: FileDtype, offset: u64, file_bytes: u64) -> Result<()> {
    let n = shape.iter().try_fold(dtype.size() as u64, |a, &d| a.checked_mul(d as u64));
    let end = n.and_then(|n| n.checked_add(offset));
    match end {
        Some(end) if end <= file_bytes => Ok(()),
        _ => Err(data_err(
            path,
            format!(
                "{what} of shape {shape:?} ({}) needs {} bytes from offset {offset}, but the file has {file_bytes} \
                 bytes: truncated",
                dtype.name(),
                n.map(|n| n.to_string()).unwrap_or_else(|| "more than 2^64".into())
            ),
        )),
    }
}

/// Opens a `.npy` file (format versions 1–3, C order, little-endian).
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
    let h = String::from_utf8_lossy(&h).to_string();
    let field = |key: &str| -> Option<&str> {
        let at = h.find(&format!("'{key}'"))? + key.len() + 2;
        Some(h[at..].trim_start().strip_prefix(':')?.trim_start())
    };
    let descr = field("descr").and_then(|r| r.strip_prefix('\'')).and_then(|r| r.split('\'').next());
    let descr = descr.ok_or_else(|| bad("no 'descr' in the header".into()))?;
    let dtype = match descr {
        "|u1" | "<u1" => FileDtype::U8,
        "<u2" => FileDtype::U16,
        "<u4" => FileDtype::U32,
        "<i4" => FileDtype::I32,
        "<i8" => FileDtype::I64,
        "<f2" => FileDtype::F16,
        "<f4" => FileDtype::F32,
        "<f8" => FileDtype::F64,
        other => {
            return Err(data_err(
                path,
                format!("unsupported dtype `{other}` (little-endian u1, u2, u4, i4, i8, f2, f4 or f8)"),
            ))
        }
    };
    if field("fortran_order").is_some_and(|r| r.starts_with("True")) {
        return Err(data_err(path, "Fortran-order arrays are not supported (save with np.ascontiguousarray)"));
    }
    let shape_text = field("shape")
        .and_then(|r| r.strip_prefix('('))
        .and_then(|r| r.split(')').next())
        .ok_or_else(|| bad("no 'shape' in the header".into()))?;
    let shape = shape_text
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<usize>().map_err(|_| bad(format!("shape `({shape_text})`"))))
        .collect::<Result<Vec<usize>>>()?;
    let offset = start + hlen;
    checked_len(path, "the array", &shape, dtype, offset, file.bytes)?;
    Ok(Array { file, tensor: None, dtype, shape, offset })
}

/// Opens every tensor of a `.safetensors` file (only the header is read).
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
    let header: BTreeMap<String, serde_json::Value> =
        serde_json::from_slice(&h).map_err(|e| bad(format!("header: {e}")))?;
    let data_start = 8 + hlen;
    let mut out = BTreeMap::new();
    for (name, v) in header.into_iter().filter(|(n, _)| n != "__metadata__") {
        let dtype = match v.get("dtype").and_then(|d| d.as_str()) {
            Some("U8") => FileDtype::U8,
            Some("U16") => FileDtype::U16,
            Some("U32") => FileDtype::U32,
            Some("I32") => FileDtype::I32,
            Some("I64") => FileDtype::I64,
            Some("F16") => FileDtype::F16,
            Some("BF16") => FileDtype::BF16,
            Some("F32") => FileDtype::F32,
            Some("F64") => FileDtype::F64,
            other => {
                return Err(data_err(
                    path,
                    format!(
                        "tensor `{name}` has unsupported dtype {} (U8, U16, U32, I32, I64, F16, BF16, F32 or F64)",
                        other.unwrap_or("(none)")
                    ),
                ))
            }
        };
        let shape: Vec<usize> = v
            .get("shape")
            .and_then(|s| serde_json::from_value(s.clone()).ok())
            .ok_or_else(|| bad(format!("tensor `{name}` has no valid shape")))?;
        let offs: [u64; 2] = v
            .get("data_offsets")
            .and_then(|s| serde_json::from_value(s.clone()).ok())
            .ok_or_else(|| bad(format!("tensor `{name}` has no valid data_offsets")))?;
        let what = format!("tensor `{name}`");
        let offset = data_start.saturating_add(offs[0]);
        checked_len(path, &what, &shape, dtype, offset, file.bytes)?;
        let f = DataFile::open(path)?;
        out.insert(name.clone(), Array { file: f, tensor: Some(name), dtype, shape, offset });
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

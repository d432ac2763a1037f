//! Dataset files: opening with named errors, positioned reads (a reader
//! fetches only the bytes of the rows it needs, never the whole file), the
//! element types files store, and the one pass that hashes a file and checks
//! its token ids.

use crate::error::{Error, Result};
use serde::Serialize;
use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// A named data error for `path`.
pub fn data_err(path: &Path, message: impl Into<String>) -> Error {
    Error::Data { path: path.to_path_buf(), message: message.into() }
}

/// An open dataset file and its size.
#[derive(Debug)]
pub struct DataFile {
    /// Where it is.
    pub path: PathBuf,
    /// Its size in bytes when opened.
    pub bytes: u64,
    file: File,
}

impl DataFile {
    /// Opens `path` for reading; a missing file or a directory is a named error.
    pub fn open(path: &Path) -> Result<DataFile> {
        let file = File::open(path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => data_err(path, "no such file"),
            _ => data_err(path, format!("cannot open: {e}")),
        })?;
        let meta = file.metadata().map_err(|e| data_err(path, format!("cannot read its size: {e}")))?;
        if !meta.is_file() {
            return Err(data_err(path, "is not a file"));
        }
        Ok(DataFile { path: path.to_path_buf(), bytes: meta.len(), file })
    }

    /// Reads exactly `buf.len()` bytes at `offset` (the file shrinking under
    /// a run is a named error, not a short batch).
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.file.read_exact_at(buf, offset).map_err(|e| {
            data_err(&self.path, format!("reading {} bytes at offset {offset}: {e} (truncated?)", buf.len()))
        })
    }

    /// Hashes the whole file (sha256) and calls `each(chunk_offset, chunk)`
    /// on its bytes in order, in one pass.
    pub fn scan(&self, mut each: impl FnMut(u64, &[u8]) -> Result<()>) -> Result<FileId> {
        let mut f = File::open(&self.path).map_err(|e| data_err(&self.path, format!("cannot open: {e}")))?;
        let mut h = Sha256::new();
        let mut buf = vec![0u8; 1 << 20];
        let mut off = 0u64;
        loop {
            // Fill the buffer (chunks stay whole elements of any type).
            let mut n = 0;
            while n < buf.len() {
                match f.read(&mut buf[n..]) {
                    Ok(0) => break,
                    Ok(k) => n += k,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(data_err(&self.path, format!("reading: {e}"))),
                }
            }
            if n == 0 {
                break;
            }
            h.update(&buf[..n]);
            each(off, &buf[..n])?;
            off += n as u64;
        }
        if off != self.bytes {
            return Err(data_err(
                &self.path,
                format!("changed size while being read ({} then {off} bytes)", self.bytes),
            ));
        }
        let sha256 = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
        Ok(FileId { path: self.path.display().to_string(), bytes: off, sha256 })
    }
}

/// What identifies one file of a dataset: its path (informative only), size
/// and content hash.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FileId {
    /// The path as configured.
    pub path: String,
    /// Size in bytes.
    pub bytes: u64,
    /// sha256 of the contents, lowercase hex.
    pub sha256: String,
}

/// An element type a dataset file may store (little-endian).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileDtype {
    /// `u8` (`|u1`, `U8`).
    U8,
    /// `u16`.
    U16,
    /// `u32`.
    U32,
    /// `i32`.
    I32,
    /// `i64`.
    I64,
    /// IEEE half.
    F16,
    /// bfloat16.
    BF16,
    /// `f32`.
    F32,
    /// `f64`.
    F64,
}

impl FileDtype {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            FileDtype::U8 => 1,
            FileDtype::U16 | FileDtype::F16 | FileDtype::BF16 => 2,
            FileDtype::U32 | FileDtype::I32 | FileDtype::F32 => 4,
            FileDtype::I64 | FileDtype::F64 => 8,
        }
    }

    /// Whether it holds floating-point numbers.
    pub fn is_float(self) -> bool {
        matches!(self, FileDtype::F16 | FileDtype::BF16 | FileDtype::F32 | FileDtype::F64)
    }

    /// Its name (`u16`, `f32`, ...).
    pub fn name(self) -> &'static str {
        match self {
            FileDtype::U8 => "u8",
            FileDtype::U16 => "u16",
            FileDtype::U32 => "u32",
            FileDtype::I32 => "i32",
            FileDtype::I64 => "i64",
            FileDtype::F16 => "f16",
            FileDtype::BF16 => "bf16",
            FileDtype::F32 => "f32",
            FileDtype::F64 => "f64",
        }
    }

    /// Decodes element `i` of `bytes` (exact: every integer a model can
    /// take and every float are exact in f64).
    pub fn get(self, bytes: &[u8], i: usize) -> f64 {
        let s = self.size();
        let b = &bytes[i * s..(i + 1) * s];
        match self {
            FileDtype::U8 => f64::from(b[0]),
            FileDtype::U16 => f64::from(u16::from_le_bytes([b[0], b[1]])),
            FileDtype::U32 => f64::from(u32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            FileDtype::I32 => f64::from(i32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            FileDtype::I64 => i64::from_le_bytes(b.try_into().expect("8 bytes")) as f64,
            FileDtype::F16 => f64::from(half::f16::from_le_bytes([b[0], b[1]])),
            FileDtype::BF16 => f64::from(half::bf16::from_le_bytes([b[0], b[1]])),
            FileDtype::F32 => f64::from(f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            FileDtype::F64 => f64::from_le_bytes(b.try_into().expect("8 bytes")),
        }
    }
}

/// Checks that every id in `bytes` (whole elements of `dtype`, an integer
/// type) is below `vocab`; `first_index` is the element index of `bytes[0]`
/// in the file's data, for the message.
pub fn check_ids(path: &Path, dtype: FileDtype, bytes: &[u8], first_index: u64, vocab: u64) -> Result<()> {
    for i in 0..bytes.len() / dtype.size() {
        let v = dtype.get(bytes, i);
        if !(v >= 0.0 && v < vocab as f64) {
            return Err(data_err(
                path,
                format!(
                    "token id {v} at element {} is outside the model's vocabulary 0..{vocab} (model.vocab)",
                    first_index + i as u64
                ),
            ));
        }
    }
    Ok(())
}

//! `weft data prepare TEXT... -o DIR`: text files to token files.
//!
//! The vocabulary is bytes (256 ids: id = byte value), so any text, in any
//! encoding, round-trips exactly and nothing has to be downloaded or
//! trained. Each file is split by position: its first `1 - val_fraction`
//! goes to `train.bin`, the rest to `val.bin` (so every file is represented
//! in both splits), in the order the files are given. The token files are
//! nanoGPT's layout (flat little-endian `u16`), with a `meta.json` beside
//! them recording the vocabulary, the sources and their sha256.

use super::files::{data_err, DataFile, FileId};
use crate::error::{Error, Result};
use serde::Serialize;
use std::path::{Path, PathBuf};

/// What `prepare` wrote.
#[derive(Clone, Debug, Serialize)]
pub struct Prepared {
    /// Vocabulary size (256).
    pub vocab_size: usize,
    /// Token file element type (`u16`).
    pub dtype: &'static str,
    /// The tokenizer (`bytes`).
    pub tokenizer: &'static str,
    /// The fraction of each file that went to validation.
    pub val_fraction: f64,
    /// Tokens in `train.bin`.
    pub train_tokens: u64,
    /// Tokens in `val.bin`.
    pub val_tokens: u64,
    /// The text files, with sizes and hashes.
    pub sources: Vec<FileId>,
}

fn write(path: &Path, bytes: &[u8]) -> Result<()> {
    std::fs::write(path, bytes).map_err(|source| Error::Io { path: path.to_path_buf(), source })
}

/// Tokenizes `texts` byte-level into `out/train.bin`, `out/val.bin` and
/// `out/meta.json`.
pub fn prepare(texts: &[PathBuf], out: &Path, val_fraction: f64) -> Result<Prepared> {
    if !(val_fraction > 0.0 && val_fraction < 1.0) {
        return Err(Error::Invalid {
            key: "--val-fraction".into(),
            value: val_fraction.to_string(),
            expected: "must be a number in (0, 1)".into(),
        });
    }
    if texts.is_empty() {
        return Err(Error::Usage("weft data prepare: no text files given".into()));
    }
    let (mut train, mut val) = (Vec::new(), Vec::new());
    let mut sources = Vec::new();
    for p in texts {
        let bytes = super::read_file(p)?;
        if bytes.is_empty() {
            return Err(data_err(p, "is empty"));
        }
        sources.push(DataFile::open(p)?.scan(|_, _| Ok(()))?);
        let cut = ((bytes.len() as f64) * (1.0 - val_fraction)).round() as usize;
        let cut = cut.clamp(1, bytes.len());
        train.extend(bytes[..cut].iter().flat_map(|&b| u16::from(b).to_le_bytes()));
        val.extend(bytes[cut..].iter().flat_map(|&b| u16::from(b).to_le_bytes()));
    }
    std::fs::create_dir_all(out).map_err(|source| Error::Io { path: out.to_path_buf(), source })?;
    write(&out.join("train.bin"), &train)?;
    write(&out.join("val.bin"), &val)?;
    let p = Prepared {
        vocab_size: 256,
        dtype: "u16",
        tokenizer: "bytes",
        val_fraction,
        train_tokens: train.len() as u64 / 2,
        val_tokens: val.len() as u64 / 2,
        sources,
    };
    let meta = serde_json::to_string_pretty(&p).expect("serializes") + "\n";
    write(&out.join("meta.json"), meta.as_bytes())?;
    Ok(p)
}

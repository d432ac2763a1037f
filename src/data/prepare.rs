//! `weft data prepare TEXT... -o DIR`: text files to token files.
//!
//! The default vocabulary is bytes (256 ids: id = byte value), so any
//! text, in any encoding, round-trips exactly and nothing has to be
//! downloaded or trained; `--tokenizer tokenizer.json` uses a Hugging Face
//! tokenizer instead ([`super::tokenize`]). Each file's tokens are split by
//! position: the first `1 - val_fraction` go to `train.bin`, the rest to
//! `val.bin` (so every file is represented in both splits), in the order
//! the files are given. The token files are nanoGPT's layout (flat
//! little-endian `u16`, or `u32` for a vocabulary of more than 65536 ids),
//! with a `meta.json` beside them recording the vocabulary size, the
//! element type, the tokenizer, the sources and their sha256. A run reading
//! `train.bin`/`val.bin` checks its `[data]` dtype and model vocabulary
//! against that `meta.json` ([`check_meta`]).

use super::files::{data_err, DataFile, FileDtype, FileId};
use super::tokenize::Tokenizer;
use crate::error::{Error, Result};
use serde::Serialize;
use std::path::{Path, PathBuf};

/// What `prepare` wrote.
#[derive(Clone, Debug, Serialize)]
pub struct Prepared {
    /// Vocabulary size: every id is below it (256 for bytes).
    pub vocab_size: u64,
    /// Token file element type (`u16`, or `u32` past 65536 ids).
    pub dtype: &'static str,
    /// The tokenizer: `bytes`, or the `tokenizer.json` path.
    pub tokenizer: String,
    /// The `tokenizer.json` with its size and sha256.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokenizer_file: Option<FileId>,
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

/// The fewest tokens a split may hold: one input and its target.
pub const MIN_SPLIT_TOKENS: usize = 2;

/// Tokenizes `texts` with `tokenizer` into `out/train.bin`, `out/val.bin`
/// and `out/meta.json`.
pub fn prepare(texts: &[PathBuf], out: &Path, val_fraction: f64, tokenizer: &Tokenizer) -> Result<Prepared> {
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
    if out.exists() && !out.is_dir() {
        return Err(data_err(out, "is a file; --output must name a directory (made if missing)"));
    }
    let dtype = tokenizer.dtype();
    let (mut train, mut val) = (Vec::new(), Vec::new());
    let mut sources = Vec::new();
    for p in texts {
        let bytes = super::read_file(p)?;
        if bytes.is_empty() {
            return Err(data_err(p, "is empty"));
        }
        sources.push(DataFile::open(p)?.scan(|_, _| Ok(()))?);
        let ids = tokenizer.encode(p, &bytes)?;
        if ids.is_empty() {
            return Err(data_err(p, format!("holds no tokens of {}", tokenizer.name())));
        }
        let cut = ((ids.len() as f64) * (1.0 - val_fraction)).round() as usize;
        let cut = cut.clamp(1, ids.len());
        push_ids(&mut train, &ids[..cut], dtype);
        push_ids(&mut val, &ids[cut..], dtype);
    }
    // A split too small to hold one input and its target is useless, and a
    // run on it would fail much later: refused here, with the numbers.
    let size = dtype.size();
    for (name, split, how) in [
        ("validation", &val, "raise --val-fraction or give more text"),
        ("training", &train, "lower --val-fraction or give more text"),
    ] {
        let tokens = split.len() / size;
        if tokens < MIN_SPLIT_TOKENS {
            return Err(Error::Invalid {
                key: "--val-fraction".into(),
                value: val_fraction.to_string(),
                expected: format!(
                    "the {name} split would hold {tokens} token{} (of {} in all), fewer than the {MIN_SPLIT_TOKENS} \
                     an example needs (an input and its target); {how}",
                    if tokens == 1 { "" } else { "s" },
                    (train.len() + val.len()) / size
                ),
            });
        }
    }
    std::fs::create_dir_all(out).map_err(|source| Error::Io { path: out.to_path_buf(), source })?;
    write(&out.join("train.bin"), &train)?;
    write(&out.join("val.bin"), &val)?;
    let size = dtype.size() as u64;
    let p = Prepared {
        vocab_size: tokenizer.vocab_size(),
        dtype: dtype.name(),
        tokenizer: tokenizer.name(),
        tokenizer_file: tokenizer.file().cloned(),
        val_fraction,
        train_tokens: train.len() as u64 / size,
        val_tokens: val.len() as u64 / size,
        sources,
    };
    let meta = serde_json::to_string_pretty(&p).expect("serializes") + "\n";
    write(&out.join("meta.json"), meta.as_bytes())?;
    Ok(p)
}

/// Appends `ids` to `out` as little-endian `dtype` (`u16` or `u32`; the
/// tokenizer chose the type so that every id fits).
fn push_ids(out: &mut Vec<u8>, ids: &[u32], dtype: FileDtype) {
    match dtype {
        FileDtype::U16 => out.extend(ids.iter().flat_map(|&t| (t as u16).to_le_bytes())),
        _ => out.extend(ids.iter().flat_map(|&t| t.to_le_bytes())),
    }
}

/// For a token file `path` named `train.bin` or `val.bin` with a
/// `meta.json` beside it written by `prepare`: the file must be read as the
/// element type it was written in (`data.dtype`), and every id the
/// tokenizer can produce must be below the model's vocabulary `vocab`.
/// Other files (and a `meta.json` that is not `prepare`'s) are not checked.
pub fn check_meta(path: &Path, dtype: FileDtype, vocab: u64) -> Result<()> {
    let named = path.file_name().is_some_and(|n| n == "train.bin" || n == "val.bin");
    let meta = path.with_file_name("meta.json");
    let Some(v) = named
        .then(|| std::fs::read_to_string(&meta).ok())
        .flatten()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
    else {
        return Ok(());
    };
    let (Some(size), Some(written), Some(tok)) =
        (v["vocab_size"].as_u64(), v["dtype"].as_str(), v["tokenizer"].as_str())
    else {
        return Ok(());
    };
    if written != dtype.name() {
        return Err(data_err(
            path,
            format!(
                "holds {written} tokens ({} says so), but data.dtype = {}; set dtype = \"{written}\" in [data]",
                meta.display(),
                dtype.name()
            ),
        ));
    }
    if size > vocab {
        return Err(data_err(
            path,
            format!(
                "was prepared with a vocabulary of {size} ids (tokenizer {tok}, {}), more than the model's \
                 vocabulary 0..{vocab}; set model.vocab to at least {size}",
                meta.display()
            ),
        ));
    }
    Ok(())
}

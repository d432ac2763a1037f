//! Tokenizers for `weft data prepare`: bytes (256 ids, any input), or a
//! user-supplied Hugging Face `tokenizer.json` through the `tokenizers`
//! crate (built without C or C++: its regexes go through `fancy-regex`;
//! nothing is downloaded, at build or run time).
//!
//! A `tokenizer.json` encodes UTF-8 text only, without special tokens (no
//! BOS/EOS or post-processor template: the token files are one stream).
//! A file is encoded in pieces of about [`PIECE_BYTES`] (encoded in
//! parallel, concatenated in order), so memory stays bounded on large
//! corpora. A piece ends after a `\n` that a non-whitespace character
//! follows: tokenizers whose pre-tokenizer splits there (word-level and
//! whitespace splits, GPT-2-style byte-level BPE) give the ids of the whole
//! file; one that marks the start of a text (a `Metaspace` that prepends
//! `▁` to the first word) marks each piece's start too.

use super::files::{data_err, DataFile, FileDtype, FileId};
use crate::error::Result;
use std::path::Path;

/// Text is encoded in pieces of at least this many bytes, cut after a `\n`.
pub const PIECE_BYTES: usize = 1 << 20;

/// How text becomes token ids.
pub enum Tokenizer {
    /// One id per byte (`0..256`).
    Bytes,
    /// A Hugging Face `tokenizer.json`.
    Json {
        /// The file, with its size and sha256.
        file: FileId,
        /// The parsed tokenizer.
        inner: Box<tokenizers::Tokenizer>,
        /// One past the largest id it can produce.
        vocab: u64,
    },
}

impl Tokenizer {
    /// Loads a `tokenizer.json`: a missing or unreadable file, or one the
    /// `tokenizers` crate cannot parse, is a named error ([`crate::Error::Data`]).
    pub fn from_file(path: &Path) -> Result<Tokenizer> {
        let bytes = super::read_file(path)?;
        let inner = tokenizers::Tokenizer::from_bytes(&bytes).map_err(|e| {
            // Valid JSON of another shape gets the crate's schema complaint
            // at a column of the text; say what the file is instead.
            let what = match serde_json::from_slice::<serde_json::Value>(&bytes) {
                Ok(v) if v.get("model").is_none() => {
                    "is JSON but not a tokenizer.json (no `model` section: save one with Hugging Face's \
                     `tokenizer.save(\"tokenizer.json\")`)"
                        .to_string()
                }
                Ok(_) => format!("is not a tokenizer.json the `tokenizers` crate can load: {e}"),
                Err(_) => format!("is not valid JSON, so not a tokenizer.json: {e}"),
            };
            data_err(path, what)
        })?;
        // Ids can have holes; the vocabulary is one past the largest.
        let vocab = inner.get_vocab(true).values().map(|&id| u64::from(id) + 1).max().unwrap_or(0);
        if vocab == 0 {
            return Err(data_err(path, "is a tokenizer.json with an empty vocabulary"));
        }
        let file = DataFile::open(path)?.scan(|_, _| Ok(()))?;
        Ok(Tokenizer::Json { file, inner: Box::new(inner), vocab })
    }

    /// The number of ids (every id is below it).
    pub fn vocab_size(&self) -> u64 {
        match self {
            Tokenizer::Bytes => 256,
            Tokenizer::Json { vocab, .. } => *vocab,
        }
    }

    /// The token files' element type: `u16` when every id fits, else `u32`.
    pub fn dtype(&self) -> FileDtype {
        if self.vocab_size() <= 1 << 16 {
            FileDtype::U16
        } else {
            FileDtype::U32
        }
    }

    /// `bytes`, or the tokenizer file's path.
    pub fn name(&self) -> String {
        match self {
            Tokenizer::Bytes => "bytes".into(),
            Tokenizer::Json { file, .. } => file.path.clone(),
        }
    }

    /// The tokenizer file, if any.
    pub fn file(&self) -> Option<&FileId> {
        match self {
            Tokenizer::Bytes => None,
            Tokenizer::Json { file, .. } => Some(file),
        }
    }

    /// The ids of `bytes`, the contents of the text file `path` (named in errors).
    pub fn encode(&self, path: &Path, bytes: &[u8]) -> Result<Vec<u32>> {
        let (inner, vocab) = match self {
            Tokenizer::Bytes => return Ok(bytes.iter().map(|&b| u32::from(b)).collect()),
            Tokenizer::Json { inner, vocab, .. } => (inner, *vocab),
        };
        let text = std::str::from_utf8(bytes).map_err(|e| {
            data_err(
                path,
                format!("is not UTF-8 text ({e}); a tokenizer.json encodes text, the byte-level vocabulary any bytes"),
            )
        })?;
        let encodings = inner
            .encode_batch_fast(pieces(text), false)
            .map_err(|e| data_err(path, format!("cannot be tokenized: {e}")))?;
        let mut ids = Vec::new();
        for enc in &encodings {
            ids.extend_from_slice(enc.get_ids());
        }
        if let Some(&bad) = ids.iter().find(|&&id| u64::from(id) >= vocab) {
            return Err(data_err(
                path,
                format!("was tokenized to id {bad}, outside the tokenizer's vocabulary 0..{vocab}"),
            ));
        }
        Ok(ids)
    }
}

/// `text` cut into pieces of at least [`PIECE_BYTES`] bytes, each ending
/// after a `\n` that a non-whitespace character follows (the last one
/// where the text ends).
fn pieces(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = text;
    while rest.len() > PIECE_BYTES {
        let b = rest.as_bytes();
        match (PIECE_BYTES..b.len() - 1).find(|&i| b[i] == b'\n' && !b[i + 1].is_ascii_whitespace()) {
            Some(i) => {
                let (a, b) = rest.split_at(i + 1);
                out.push(a);
                rest = b;
            }
            None => break,
        }
    }
    if !rest.is_empty() {
        out.push(rest);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_end_at_line_ends_and_cover_the_text() {
        let line = "x".repeat(1000) + "\n\n";
        let text = line.repeat(3000);
        let p = pieces(&text);
        assert!(p.len() >= 2);
        assert_eq!(p.concat(), text);
        assert!(p[..p.len() - 1].iter().all(|s| s.ends_with("x\n\n") && s.len() >= PIECE_BYTES));
        assert_eq!(pieces("ab"), vec!["ab"]);
        assert!(pieces("").is_empty());
    }
}

//! Token streams: a flat little-endian file of `u16` or `u32` token ids
//! with no header (nanoGPT's `train.bin` / `val.bin` layout), read in
//! windows of `seq + 1` tokens (inputs, and the same shifted by one as
//! targets).

use super::files::{check_ids, data_err, DataFile, FileDtype, FileId};
use crate::error::Result;
use std::path::Path;

/// An open, checked token file.
#[derive(Debug)]
pub struct TokenFile {
    /// The file.
    pub file: DataFile,
    /// `u16` or `u32`.
    pub dtype: FileDtype,
    /// Number of tokens.
    pub tokens: u64,
    /// Its size and hash.
    pub id: FileId,
}

impl TokenFile {
    /// Opens `path` of `dtype` tokens for batches of `batch` windows of
    /// `seq + 1` tokens, checking in one pass (which also hashes the file)
    /// that it is whole elements, holds at least one batch's tokens
    /// (`batch * seq + 1`) and that every id is below `vocab`.
    pub fn open(path: &Path, dtype: FileDtype, batch: usize, seq: usize, vocab: u64) -> Result<TokenFile> {
        let file = DataFile::open(path)?;
        let size = dtype.size() as u64;
        if file.bytes % size != 0 {
            return Err(data_err(
                path,
                format!(
                    "{} bytes is not a whole number of {} tokens ({size} bytes each): truncated, or not {} \
                     (data.dtype)",
                    file.bytes,
                    dtype.name(),
                    dtype.name()
                ),
            ));
        }
        let tokens = file.bytes / size;
        let need = (batch as u64).saturating_mul(seq as u64).saturating_add(1);
        if tokens < need {
            return Err(data_err(
                path,
                format!(
                    "holds {tokens} tokens, fewer than one batch needs ({batch} windows of model.seq = {seq}, \
                     {need} tokens)"
                ),
            ));
        }
        let id = file.scan(|off, chunk| check_ids(path, dtype, chunk, off / size, vocab))?;
        Ok(TokenFile { file, dtype, tokens, id })
    }

    /// The `len` tokens starting at token `start`.
    pub fn window(&self, start: u64, len: usize) -> Result<Vec<i32>> {
        let size = self.dtype.size();
        let mut buf = vec![0u8; len * size];
        self.file.read_at(&mut buf, start * size as u64)?;
        Ok((0..len).map(|i| self.dtype.get(&buf, i) as i32).collect())
    }
}

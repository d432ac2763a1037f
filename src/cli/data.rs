//! `weft data prepare TEXT... -o DIR`: token files for `[data]`.

use crate::data::prepare::prepare;
use crate::error::Result;
use std::path::{Path, PathBuf};

/// Tokenizes `texts` (byte-level) into `out`; prints what was written and
/// the `[data]` table that reads it.
pub fn prepare_cmd(texts: &[PathBuf], out: &Path, val_fraction: f64) -> Result<i32> {
    let p = prepare(texts, out, val_fraction)?;
    println!(
        "wrote {} ({} tokens), {} ({} tokens) and {} from {} files; vocabulary: bytes (256 ids), u16",
        out.join("train.bin").display(),
        p.train_tokens,
        out.join("val.bin").display(),
        p.val_tokens,
        out.join("meta.json").display(),
        p.sources.len()
    );
    println!(
        "\n[model]\nkind = \"gpt\"\nvocab = 256\n\n[data]\nsource = \"tokens\"\ntrain = \"{}\"\nval = \"{}\"\ndtype = \"u16\"",
        out.join("train.bin").display(),
        out.join("val.bin").display()
    );
    Ok(0)
}

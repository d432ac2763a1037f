//! `weft data prepare TEXT... -o DIR`: token files for `[data]`.

use crate::data::prepare::prepare;
use crate::data::tokenize::Tokenizer;
use crate::error::{Error, Result};
use std::path::{Path, PathBuf};

/// Tokenizes `texts` (byte-level, or with a `tokenizer.json`) into `out`;
/// prints what was written and the `[data]` table that reads it.
pub fn prepare_cmd(texts: &[PathBuf], out: &Path, val_fraction: f64, tokenizer: Option<&Path>) -> Result<i32> {
    let tok = match tokenizer {
        Some(path) => Tokenizer::from_file(path)?,
        None => Tokenizer::Bytes,
    };
    // Ids past the largest model.vocab would give a config no model loads.
    let most = crate::runner::validate::MAX_VOCAB;
    if tok.vocab_size() > most {
        return Err(Error::Invalid {
            key: "--tokenizer".into(),
            value: tok.name(),
            expected: format!(
                "its vocabulary ({} ids) is larger than the largest model.vocab, {most}",
                tok.vocab_size()
            ),
        });
    }
    let p = prepare(texts, out, val_fraction, &tok)?;
    let vocab = match tok {
        Tokenizer::Bytes => "bytes (256 ids)".to_string(),
        _ => format!("{} ({} ids)", p.tokenizer, p.vocab_size),
    };
    println!(
        "wrote {} ({} tokens), {} ({} tokens) and {} from {} files; vocabulary: {vocab}, {}",
        out.join("train.bin").display(),
        p.train_tokens,
        out.join("val.bin").display(),
        p.val_tokens,
        out.join("meta.json").display(),
        p.sources.len(),
        p.dtype
    );
    println!(
        "\n[model]\nkind = \"gpt\"\nvocab = {}\n\n[data]\nsource = \"tokens\"\ntrain = \"{}\"\nval = \"{}\"\ndtype = \"{}\"",
        p.vocab_size,
        out.join("train.bin").display(),
        out.join("val.bin").display(),
        p.dtype
    );
    Ok(0)
}

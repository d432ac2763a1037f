//! The `[data]` table of a run config.
//!
//! ```toml
//! [data]
//! source = "tokens"              # tokens (a flat u16/u32 file) | table (.npy / .safetensors)
//! train = "data/specs/train.bin"
//! val = "data/specs/val.bin"     # optional: the validation split
//! dtype = "u16"                  # token files: u16 | u32
//! shuffle = true                 # random windows / a permutation per epoch
//! prefetch = 2                   # batches read ahead by a background thread (0: none)
//! eval_every = 50                # evaluate the validation split every N steps (0: never)
//! eval_batches = 4               # batches per evaluation
//! ```
//!
//! A table's `train`/`val` is a `.safetensors` file whose tensors are named
//! by the model's inputs, or an inline table naming one file per input:
//! `train = { x = "x.npy", y = "y.npy" }`. Batch size and sequence length
//! come from `[model]`. Unknown keys are errors; ranges are checked by
//! `runner::validate`.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// Where a split's data is.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(untagged)]
pub enum DataPath {
    /// One file: a token file, or a `.safetensors` table with a tensor per input.
    File(PathBuf),
    /// One file per model input (`.npy`, or `.safetensors` with one tensor).
    Inputs(BTreeMap<String, PathBuf>),
}

impl DataPath {
    /// Every path named, for messages.
    pub fn describe(&self) -> String {
        match self {
            DataPath::File(p) => p.display().to_string(),
            DataPath::Inputs(m) => {
                m.iter().map(|(k, v)| format!("{k} = {}", v.display())).collect::<Vec<_>>().join(", ")
            }
        }
    }
}

/// The `[data]` table.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DataConfig {
    /// `tokens` or `table`.
    pub source: String,
    /// The training split.
    pub train: DataPath,
    /// The validation split, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub val: Option<DataPath>,
    /// Element type of token files: `u16` or `u32`.
    #[serde(default = "d_dtype")]
    pub dtype: String,
    /// Random windows / per-epoch permutations (else the data in order).
    #[serde(default = "d_shuffle")]
    pub shuffle: bool,
    /// Batches a background reader keeps ready (0: read in the step loop).
    #[serde(default = "d_prefetch")]
    pub prefetch: usize,
    /// Evaluate the validation split every this many steps (0: never).
    #[serde(default)]
    pub eval_every: u64,
    /// Batches of the validation split per evaluation.
    #[serde(default = "d_eval_batches")]
    pub eval_batches: usize,
}

fn d_dtype() -> String {
    "u16".into()
}
fn d_shuffle() -> bool {
    true
}
fn d_prefetch() -> usize {
    2
}
fn d_eval_batches() -> usize {
    4
}

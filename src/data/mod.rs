//! Real data for `weft train`: deterministic, sharded, prefetched and
//! resumable input pipelines.
//!
//! Why it is built this way:
//!
//! - **Batches are a pure function of (seed, epoch, step)** ([`sampler`]):
//!   drawn through weft's Threefry by global row index, so the batch order
//!   does not depend on the mesh, the number of processes or the prefetch
//!   depth, and a resumed run continues the exact sequence from the step
//!   counter the checkpoint already holds. What must still be recorded is
//!   *which* data: the [`Identity`] (files, sizes, sha256, seed, order) goes
//!   into `run.json` and, as a digest, into every checkpoint, and resuming
//!   onto other data is `Error::DataChanged`.
//! - **Readers read only their part**: [`Split::part`] reads just the
//!   examples of some rows of the global batch, for some of its inputs,
//!   with positioned reads (token windows, table rows), never the whole
//!   file. The runner asks for the part its executor's devices need
//!   (`Executor::batch_part`, a [`BatchPart`]): the whole batch in one
//!   process, the span of its devices' blocks in each process of a
//!   multi-process run, and in a pipeline whose stages run on processes
//!   only its stages' inputs, in the rows of its devices' blocks of each
//!   microbatch; the executor cuts the blocks from those rows.
//! - **Reading overlaps the step** ([`prefetch`]): a background thread keeps
//!   a bounded queue of ready batches; the time a step waited is a metric.
//! - **Bad input is a named error before anything is built**: files are
//!   opened, their headers, sizes, dtypes, shapes and token ids checked (in
//!   the same pass that hashes them) when the run starts.

pub mod config;
pub mod files;
pub mod headers;
pub mod part;
pub mod prefetch;
pub mod prepare;
pub mod sampler;
pub mod table;
pub mod tokenize;
pub mod tokens;

pub use config::{DataConfig, DataPath};
pub use files::{FileDtype, FileId};
pub use part::BatchPart;
pub use prefetch::Prefetcher;
pub use sampler::{Order, Sampler};

use crate::error::{Error, Result};
use files::data_err;
use serde::Serialize;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::ops::Range;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use weft_compiler::train::Tree;
use weft_ir::tensor::HostTensor;
use weft_ir::TensorType;

/// One model input a split fills.
#[derive(Clone, Debug, PartialEq)]
pub struct InputSpec {
    /// The loss function's parameter name (`x`, `tokens`).
    pub name: String,
    /// Its type for the whole (global) batch; dimension 0 is the batch.
    pub ty: TensorType,
    /// For token ids: the vocabulary size every id must stay below.
    pub vocab: Option<u64>,
}

enum Store {
    Tokens(tokens::TokenFile),
    Table { arrays: Vec<table::Array> },
}

/// The first 8 bytes of the sha256 of a batch's tensors (names, types and
/// little-endian bytes, in name order): what a step read, comparable across
/// runs and meshes. Computed where the batch is read ([`prefetch`]), off
/// the training loop.
pub fn batch_digest(batch: &Tree) -> u64 {
    let mut h = Sha256::new();
    for (name, t) in batch {
        h.update(format!("{name}:{}\n", t.ty()));
        h.update(t.to_bytes_le());
    }
    u64::from_be_bytes(h.finalize()[..8].try_into().expect("8 bytes"))
}

/// One split (train or validation) of a dataset, open and checked.
pub struct Split {
    store: Store,
    inputs: Vec<InputSpec>,
    sampler: Sampler,
    files: Vec<FileId>,
    /// Rows (examples or windows) read by [`Split::part`] so far.
    rows_read: AtomicU64,
}

fn invalid(key: &str, value: impl ToString, expected: impl Into<String>) -> Error {
    Error::Invalid { key: key.into(), value: value.to_string(), expected: expected.into() }
}

impl Split {
    /// Opens a split of `cfg.source` at `path` for `inputs` (the model's
    /// batch inputs, global batch types), sampled in `order` from `seed`.
    /// `key` names the config key for errors (`data.train`).
    pub fn open(
        cfg: &DataConfig,
        path: &DataPath,
        key: &str,
        inputs: &[InputSpec],
        seed: u64,
        order: Order,
    ) -> Result<Split> {
        let batch = inputs.first().map(|i| i.ty.shape.first().copied().unwrap_or(1)).unwrap_or(1);
        match cfg.source.as_str() {
            "tokens" => {
                let DataPath::File(p) = path else {
                    return Err(invalid(key, path.describe(), "must be one token file with source = \"tokens\""));
                };
                let dtype = match cfg.dtype.as_str() {
                    "u32" => FileDtype::U32,
                    _ => FileDtype::U16,
                };
                let names: Vec<&str> = inputs.iter().map(|i| i.name.as_str()).collect();
                let t = match inputs {
                    [t, _] if names == ["tokens", "targets"] && t.ty.rank() == 2 => t,
                    _ => {
                        let why =
                            format!("needs a model with inputs tokens and targets (a gpt), not {}", names.join(", "));
                        return Err(invalid("data.source", "`tokens`", why));
                    }
                };
                let seq = t.ty.shape[1];
                prepare::check_meta(p, dtype, t.vocab.unwrap_or(u64::MAX))?;
                let f = tokens::TokenFile::open(p, dtype, batch, seq, t.vocab.unwrap_or(u64::MAX))?;
                let sampler = Sampler::windows(seed, order, batch, f.tokens, seq);
                let files = vec![f.id.clone()];
                Ok(Split {
                    store: Store::Tokens(f),
                    inputs: inputs.to_vec(),
                    sampler,
                    files,
                    rows_read: AtomicU64::new(0),
                })
            }
            _ => Split::open_table(path, key, inputs, seed, order, batch),
        }
    }

    fn open_table(
        path: &DataPath,
        key: &str,
        inputs: &[InputSpec],
        seed: u64,
        order: Order,
        batch: usize,
    ) -> Result<Split> {
        let mut arrays = Vec::new();
        match path {
            DataPath::File(p) => {
                if p.extension().is_none_or(|e| e != "safetensors") {
                    return Err(data_err(
                        p,
                        format!(
                            "a table in one file must be .safetensors with a tensor per input ({}); for .npy give \
                             one file per input: {{ {} }}",
                            inputs.iter().map(|i| i.name.as_str()).collect::<Vec<_>>().join(", "),
                            inputs.iter().map(|i| format!("{0} = \"{0}.npy\"", i.name)).collect::<Vec<_>>().join(", ")
                        ),
                    ));
                }
                let mut all = table::safetensors(p)?;
                for i in inputs {
                    let a = all.remove(&i.name).ok_or_else(|| {
                        data_err(p, format!("has no tensor `{}` for the model's input of that name", i.name))
                    })?;
                    arrays.push(a);
                }
            }
            DataPath::Inputs(m) => {
                if let Some(k) = m.keys().find(|k| !inputs.iter().any(|i| &i.name == *k)) {
                    let names: Vec<&str> = inputs.iter().map(|i| i.name.as_str()).collect();
                    return Err(invalid(
                        key,
                        format!("{{ {k} = ... }}"),
                        format!("`{k}` is not an input of the model (inputs: {})", names.join(", ")),
                    ));
                }
                for i in inputs {
                    let p = m.get(&i.name).ok_or_else(|| {
                        invalid(key, path.describe(), format!("names no file for the model's input `{}`", i.name))
                    })?;
                    arrays.push(table::open_array(p, &i.name)?);
                }
            }
        }
        for (a, i) in arrays.iter().zip(inputs) {
            a.check(i)?;
        }
        let n = arrays[0].rows();
        for a in &arrays[1..] {
            if a.rows() != n {
                return Err(data_err(
                    &a.file.path,
                    format!("{} has {} examples, but {} has {n}", a.what(), a.rows(), arrays[0].file.path.display()),
                ));
            }
        }
        if n < batch as u64 {
            return Err(data_err(
                &arrays[0].file.path,
                format!("holds {n} examples, fewer than one batch (model.batch = {batch})"),
            ));
        }
        for (a, i) in arrays.iter().zip(inputs) {
            if let Some(v) = i.vocab {
                a.check_ids(v)?;
            }
        }
        // Hash each distinct file once.
        let mut files: Vec<FileId> = Vec::new();
        for a in &arrays {
            let p = a.file.path.display().to_string();
            if !files.iter().any(|f| f.path == p) {
                files.push(a.file.scan(|_, _| Ok(()))?);
            }
        }
        let sampler = Sampler::table(seed, order, batch, n);
        Ok(Split {
            store: Store::Table { arrays },
            inputs: inputs.to_vec(),
            sampler,
            files,
            rows_read: AtomicU64::new(0),
        })
    }

    /// The files of the split with their sizes and hashes.
    pub fn files(&self) -> &[FileId] {
        &self.files
    }

    /// Tokens (token streams) or examples (tables) in the split.
    pub fn len(&self) -> u64 {
        match &self.store {
            Store::Tokens(t) => t.tokens,
            Store::Table { arrays } => arrays[0].rows(),
        }
    }

    /// Whether the split is empty (never, once opened).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The whole batch of step `step`.
    pub fn batch(&self, step: u64) -> Result<Tree> {
        self.rows(step, 0..self.sampler.batch())
    }

    /// Rows in a (global) batch.
    pub fn batch_size(&self) -> usize {
        self.sampler.batch()
    }

    /// Rows read by [`Split::rows`] so far (each row is one window of a
    /// token stream or one example of a table): what a process read.
    pub fn rows_read(&self) -> u64 {
        self.rows_read.load(Ordering::Relaxed)
    }

    /// Rows `rows` of step `step`'s global batch: each input's tensor has
    /// `rows.len()` rows. Only those examples are read.
    pub fn rows(&self, step: u64, rows: Range<usize>) -> Result<Tree> {
        self.part(step, &BatchPart::rows(rows))
    }

    /// Part `part` of step `step`'s global batch: each input it reads,
    /// with its rows one range after another. Only those examples are
    /// read (none when it reads nothing).
    pub fn part(&self, step: u64, part: &BatchPart) -> Result<Tree> {
        let mut out = Tree::new();
        if part.is_empty() {
            return Ok(out);
        }
        let n = part.len();
        let idx: Vec<u64> = part.ranges().iter().flat_map(|r| self.sampler.examples(step, r.clone())).collect();
        self.rows_read.fetch_add(n as u64, Ordering::Relaxed);
        match &self.store {
            Store::Tokens(f) => {
                let seq = self.inputs[0].ty.shape[1];
                let (mut toks, mut tgts) = (Vec::with_capacity(n * seq), Vec::with_capacity(n * seq));
                for &start in &idx {
                    let w = f.window(start, seq + 1)?;
                    toks.extend_from_slice(&w[..seq]);
                    tgts.extend_from_slice(&w[1..]);
                }
                for (name, ids) in [("tokens", toks), ("targets", tgts)] {
                    if part.reads(name) {
                        out.insert(name.into(), HostTensor::from_i32(&[n, seq], ids)?);
                    }
                }
            }
            Store::Table { arrays } => {
                for (a, i) in arrays.iter().zip(&self.inputs).filter(|(_, i)| part.reads(&i.name)) {
                    out.insert(i.name.clone(), a.gather(&idx, &i.ty)?);
                }
            }
        }
        Ok(out)
    }
}

/// What identifies a run's data: the config's source and order, the seed,
/// and every file's size and sha256. Its [`Identity::digest`] is stored in
/// every checkpoint; paths are informative only (moving the files keeps it).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Identity {
    /// `tokens` or `table`.
    pub source: String,
    /// Token files' element type (`u16`/`u32`); empty for tables.
    pub dtype: String,
    /// Whether batches are shuffled.
    pub shuffle: bool,
    /// The seed batches are drawn from.
    pub seed: u64,
    /// The training files.
    pub train: Vec<FileId>,
    /// The validation files.
    pub val: Vec<FileId>,
}

impl Identity {
    /// sha256 of the identity without paths, as 8 big-endian words.
    pub fn digest(&self) -> [u32; 8] {
        let mut h = Sha256::new();
        h.update(format!("weft-data/1\n{}\n{}\n{}\n{}\n", self.source, self.dtype, self.shuffle, self.seed));
        for (split, files) in [("train", &self.train), ("val", &self.val)] {
            for f in files {
                h.update(format!("{split} {} {}\n", f.bytes, f.sha256));
            }
        }
        let d = h.finalize();
        std::array::from_fn(|i| u32::from_be_bytes([d[4 * i], d[4 * i + 1], d[4 * i + 2], d[4 * i + 3]]))
    }

    /// The digest in hex.
    pub fn digest_hex(&self) -> String {
        self.digest().iter().map(|w| format!("{w:08x}")).collect()
    }

    /// The identity as `run.json` records it (with the digest).
    pub fn to_json(&self) -> serde_json::Value {
        let mut v = serde_json::to_value(self).unwrap_or_default();
        v["digest"] = self.digest_hex().into();
        v
    }
}

/// A dataset: the training split, the optional validation split, and its
/// identity.
pub struct Dataset {
    /// The training split (shuffled as configured).
    pub train: Split,
    /// The validation split (always in order: every evaluation reads the
    /// same batches).
    pub val: Option<Split>,
    /// What the data is.
    pub identity: Identity,
}

impl Dataset {
    /// One line for the run's description: source, files, sizes, order.
    pub fn describe(&self, cfg: &DataConfig) -> String {
        let unit = if self.identity.source == "tokens" { "tokens" } else { "examples" };
        let split = |s: &Split| {
            let files: Vec<String> =
                s.files().iter().map(|f| format!("{} (sha256 {})", f.path, &f.sha256[..12])).collect();
            format!("{} {unit} in {}", s.len(), files.join(", "))
        };
        let mut out = format!(
            "data: {} {}, {}; train {}",
            self.identity.source,
            if cfg.shuffle { "shuffled" } else { "in order" },
            if cfg.prefetch == 0 { "no prefetch".to_string() } else { format!("prefetch {}", cfg.prefetch) },
            split(&self.train)
        );
        if let Some(v) = &self.val {
            out.push_str(&format!("; validation {}", split(v)));
            if cfg.eval_every > 0 {
                out.push_str(&format!(", {} batches every {} steps", cfg.eval_batches, cfg.eval_every));
            }
        }
        out
    }

    /// Opens and checks both splits of `cfg` for `inputs`, batches drawn from `seed`.
    pub fn open(cfg: &DataConfig, inputs: &[InputSpec], seed: u64) -> Result<Dataset> {
        let order = if cfg.shuffle { Order::Shuffled } else { Order::Sequential };
        let train = Split::open(cfg, &cfg.train, "data.train", inputs, seed, order)?;
        let val = match &cfg.val {
            Some(p) => Some(Split::open(cfg, p, "data.val", inputs, seed, Order::Sequential)?),
            None => None,
        };
        let identity = Identity {
            source: cfg.source.clone(),
            dtype: if cfg.source == "tokens" { cfg.dtype.clone() } else { String::new() },
            shuffle: cfg.shuffle,
            seed,
            train: train.files().to_vec(),
            val: val.as_ref().map(|v| v.files().to_vec()).unwrap_or_default(),
        };
        Ok(Dataset { train, val, identity })
    }
}

/// The inputs of a training step's batch as the loader fills them:
/// `(name, global type)` pairs, with `vocab` for the integer inputs the
/// model gives a range (`tokens` and `targets` below the vocabulary).
pub fn input_specs(batch: &[(String, TensorType)], int_max: &BTreeMap<String, u64>) -> Vec<InputSpec> {
    batch
        .iter()
        .map(|(n, t)| InputSpec {
            name: n.clone(),
            ty: t.clone(),
            vocab: int_max.get(n).copied().filter(|_| t.dtype.is_integer()),
        })
        .collect()
}

/// Reads `path` and names it in the error (for `prepare`).
pub(crate) fn read_file(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => data_err(path, "no such file"),
        _ => data_err(path, format!("cannot read: {e}")),
    })
}

/// Tensors of a tree concatenated along dimension 0 (tests: blocks of a
/// batch read separately equal the batch read whole).
pub fn concat_rows(parts: &[Tree]) -> Result<Tree> {
    let mut out = BTreeMap::new();
    let Some(first) = parts.first() else { return Ok(out) };
    for name in first.keys() {
        let mut vals = Vec::new();
        let mut rows = 0;
        let ty = first[name].ty();
        for p in parts {
            vals.extend(p[name].to_f64_vec());
            rows += p[name].shape()[0];
        }
        let mut shape = ty.shape.clone();
        shape[0] = rows;
        out.insert(name.clone(), HostTensor::from_values(&TensorType::new(ty.dtype, shape), &vals)?);
    }
    Ok(out)
}

//! The one validation layer of `weft train`: every config key (and the flag
//! that overrides it) has a documented valid range, checked before anything
//! is built. [`KEYS`] is the table; `specs/training.md` prints it
//! ([`spec_table`], kept equal by a test), and [`validate`] checks a config
//! against it plus the rules that relate keys (heads divide `d_model`,
//! micro-batches divide the batch).

use super::config::{ModelConfig, OverlapSection, RunConfig};
use crate::error::{Error, Result};
use weft_compiler::sharding::Mesh;

/// The valid values of a key.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Range {
    /// An integer in `min..=max`.
    Int {
        /// Smallest valid value.
        min: u64,
        /// Largest valid value.
        max: u64,
    },
    /// A finite number in `[min, max)` or `(min, max]` etc.
    Float {
        /// Lower bound.
        min: f64,
        /// Whether `min` itself is valid.
        min_inclusive: bool,
        /// Upper bound (`f64::INFINITY`: none; infinity itself is never valid).
        max: f64,
        /// Whether `max` itself is valid.
        max_inclusive: bool,
    },
    /// One of these names.
    OneOf(&'static [&'static str]),
    /// Free text with the stated form.
    Text(&'static str),
}

impl Range {
    /// The range as the spec table prints it.
    pub fn describe(&self) -> String {
        match *self {
            Range::Int { min, max } => format!("an integer in [{min}, {max}]"),
            Range::Float { min, min_inclusive, max, max_inclusive } => {
                let lo = if min_inclusive { "[" } else { "(" };
                let hi = if max_inclusive { "]" } else { ")" };
                let max = match max {
                    m if m.is_infinite() => "∞".to_string(),
                    m if m >= 1e6 => format!("{m:e}"),
                    m => m.to_string(),
                };
                format!("a finite number in {lo}{min}, {max}{hi}")
            }
            Range::OneOf(names) => names.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", "),
            Range::Text(t) => t.to_string(),
        }
    }
}

/// One config key.
#[derive(Clone, Copy, Debug)]
pub struct KeySpec {
    /// The key as written in the TOML (`model.d` is `d` under `[model]`).
    pub key: &'static str,
    /// The `weft train` flag that overrides it, if any.
    pub flag: Option<&'static str>,
    /// Its valid values.
    pub range: Range,
    /// The default when absent.
    pub default: &'static str,
    /// Rules that relate it to other keys, or what it means.
    pub note: &'static str,
}

const fn int(min: u64, max: u64) -> Range {
    Range::Int { min, max }
}

/// The most training steps (and checkpoint/schedule step counts): 10^12.
pub const MAX_STEPS: u64 = 1_000_000_000_000;
/// The most worker threads, and devices of a `weft train` mesh.
pub const MAX_DEVICES: u64 = super::MAX_SIMULATED_DEVICES as u64;
/// The largest model width, hidden width or batch: 2^20.
pub const MAX_DIM: u64 = 1 << 20;
/// The most layers: 4096.
pub const MAX_LAYERS: u64 = 4096;
/// The largest vocabulary: 2^24 (token ids are exact in i32 and f32).
pub const MAX_VOCAB: u64 = 1 << 24;
/// The longest sequence and widest GPT model: 2^16.
pub const MAX_SEQ: u64 = 1 << 16;

/// The most batches a data reader may keep ready.
pub const MAX_PREFETCH: u64 = 1024;

const DTYPES: &[&str] = &["f32", "bf16", "f16", "f64"];

/// Every config key, its flag, range and default.
#[rustfmt::skip]
pub const KEYS: &[KeySpec] = &[
    KeySpec { key: "steps", flag: Some("--steps"), range: int(1, MAX_STEPS), default: "(required)", note: "with `--resume`, at least the checkpoint's step" },
    KeySpec { key: "seed", flag: Some("--seed"), range: int(0, u64::MAX), default: "0", note: "" },
    KeySpec { key: "mesh", flag: Some("--mesh"), range: Range::Text("`name=size,...`; sizes ≥ 1, at most 1024 devices in all"), default: "one device", note: "" },
    KeySpec { key: "strategy", flag: Some("--strategy"), range: Range::OneOf(&["none", "dp", "tp", "fsdp", "fsdp_tp", "zero1", "zero2", "zero3", "auto"]), default: "`none`", note: "" },
    KeySpec { key: "backend", flag: Some("--backend"), range: Range::OneOf(&super::Backend::NAMES), default: "`cpu`", note: "`interp` needs a one-device mesh" },
    KeySpec { key: "threads", flag: Some("--threads"), range: int(1, MAX_DEVICES), default: "one per core (cpu), one per device (GPU)", note: "" },
    KeySpec { key: "reduction", flag: Some("--reduction"), range: Range::OneOf(&weft_runtime::process::Reduction::NAMES), default: "`deterministic`", note: "several processes only: `fast` sums f32/f64 across processes with MPI's own reductions (not bitwise reproducible)" },
    KeySpec { key: "metrics", flag: Some("--metrics"), range: Range::Text("a file path"), default: "none", note: "" },
    KeySpec { key: "memory_budget", flag: Some("--memory-budget"), range: Range::Text("a size ≥ 1 byte: `2GiB`, `512MiB`, `1e9`"), default: "none", note: "per device; `strategy = \"auto\"` only" },
    KeySpec { key: "memory_limit", flag: Some("--memory-limit"), range: Range::Text("a size ≥ 1 byte: `16GiB`, `512MiB`, `1e9`"), default: "`WEFT_MEMORY_LIMIT`, else MemTotal", note: "the run's estimated memory must fit" },
    KeySpec { key: "mesh_invariant", flag: Some("--mesh-invariant"), range: Range::OneOf(&["true", "false"]), default: "false", note: "sums in an order every mesh shares: bitwise-equal metrics across meshes, slower" },
    KeySpec { key: "divergence_steps", flag: None, range: int(0, MAX_STEPS), default: "3", note: "a run stops with an error after this many steps in a row with a non-finite loss (0: never); such steps are not checkpointed" },
    KeySpec { key: "peak_tflops", flag: None, range: Range::Float { min: 0.0, min_inclusive: false, max: 1e6, max_inclusive: true }, default: "the calibrated CPU rate (cpu); none (GPUs)", note: "a device's peak TFLOP/s: the run reports its model FLOPs utilisation (MFU) against it" },
    KeySpec { key: "sum_chunks", flag: None, range: Range::Text("a power of two ≥ 2"), default: "8", note: "`mesh_invariant` only; every shard count of a summed dimension must divide it" },
    KeySpec { key: "model.kind", flag: None, range: Range::OneOf(&["mlp", "gpt", "llama"]), default: "(required unless `model.program`)", note: "a built-in model" },
    KeySpec { key: "model.program", flag: None, range: Range::Text("a path to a program in the text format, relative to the config file"), default: "none", note: "instead of `model.kind`: trains the program (see \"Program models\")" },
    KeySpec { key: "model.loss", flag: None, range: Range::Text("a function name of the program"), default: "`loss`", note: "program; the function to minimise" },
    KeySpec { key: "model.init", flag: None, range: Range::Text("a table of name patterns = `normal(STD)`, `uniform(LO, HI)`, `zeros`, `ones`, `constant(V)`, `fan_in`"), default: "none", note: "program; the first matching pattern wins; every parameter must be covered" },
    KeySpec { key: "model.init_from", flag: None, range: Range::Text("a safetensors file, relative to the config file"), default: "none", note: "program; a tensor per parameter; instead of `model.init`" },
    KeySpec { key: "model.inputs", flag: None, range: Range::Text("a table of integer input names = `{ max = N }`, N in [1, 2^31]"), default: "none", note: "program; the synthetic batch draws them in `0..N`; `[data]` checks them" },
    KeySpec { key: "shardings", flag: None, range: Range::Text("a table of name patterns = shardings (`\"[{}, {model}]\"`)"), default: "none", note: "parameters, batch inputs and named values (a pattern that matches an input is the input's); the first matching pattern wins; every pattern must match" },
    KeySpec { key: "model.layers", flag: None, range: int(1, MAX_LAYERS), default: "2", note: "" },
    KeySpec { key: "model.d", flag: None, range: int(1, MAX_DIM), default: "16", note: "mlp" },
    KeySpec { key: "model.h", flag: None, range: int(1, MAX_DIM), default: "32", note: "mlp" },
    KeySpec { key: "model.batch", flag: None, range: int(1, MAX_DIM), default: "8", note: "a multiple of `optimizer.micro_batches`" },
    KeySpec { key: "model.compute", flag: None, range: Range::OneOf(DTYPES), default: "`f32`", note: "" },
    KeySpec { key: "model.vocab", flag: None, range: int(2, MAX_VOCAB), default: "32", note: "gpt, llama" },
    KeySpec { key: "model.seq", flag: None, range: int(1, MAX_SEQ), default: "8", note: "gpt, llama" },
    KeySpec { key: "model.d_model", flag: None, range: int(1, MAX_SEQ), default: "16", note: "gpt, llama; a multiple of `model.heads`" },
    KeySpec { key: "model.heads", flag: None, range: int(1, MAX_SEQ), default: "2 (gpt), 4 (llama)", note: "gpt, llama; divides `model.d_model` (llama: into an even head width)" },
    KeySpec { key: "model.kv_heads", flag: None, range: int(1, MAX_SEQ), default: "`model.heads`", note: "llama; key/value heads of grouped-query attention, divides `model.heads`" },
    KeySpec { key: "model.ffn", flag: None, range: int(1, MAX_DIM), default: "2 × `model.d_model`", note: "llama; the SwiGLU MLP's hidden width" },
    KeySpec { key: "model.rope_base", flag: None, range: Range::Float { min: 1.0, min_inclusive: false, max: 1e12, max_inclusive: true }, default: "10000", note: "llama; the rotary embeddings' base" },
    KeySpec { key: "model.dropout", flag: None, range: Range::Float { min: 0.0, min_inclusive: true, max: 1.0, max_inclusive: false }, default: "0", note: "gpt; with dropout, batch × heads × seq² and batch × seq × 4 d_model below 2^32" },
    KeySpec { key: "model.remat", flag: None, range: Range::OneOf(&["true", "false"]), default: "false", note: "gpt" },
    KeySpec { key: "model.experts", flag: None, range: int(1, 1024), default: "none (dense blocks)", note: "gpt; experts per mixture-of-experts block" },
    KeySpec { key: "model.top_k", flag: None, range: int(1, 1024), default: "2", note: "gpt with `model.experts`; experts per token, at most `model.experts`" },
    KeySpec { key: "model.capacity_factor", flag: None, range: Range::Float { min: 0.0, min_inclusive: false, max: 1000.0, max_inclusive: true }, default: "1.25", note: "gpt with `model.experts`; each expert takes ceil(top_k × seq × factor / experts) assignments per sequence, the rest are dropped" },
    KeySpec { key: "model.moe_every", flag: None, range: int(1, MAX_LAYERS), default: "2", note: "gpt with `model.experts`; every moe_every-th block is a mixture of experts, at most `model.layers`" },
    KeySpec { key: "model.aux_loss_weight", flag: None, range: Range::Float { min: 0.0, min_inclusive: true, max: 1000.0, max_inclusive: true }, default: "0.01", note: "gpt with `model.experts`; the load-balancing loss's weight in the loss (Switch's α)" },
    KeySpec { key: "model.tie_embeddings", flag: None, range: Range::OneOf(&["true", "false"]), default: "false", note: "gpt; the unembedding is `wte` transposed (no `lm_head`)" },
    KeySpec { key: "optimizer.kind", flag: None, range: Range::OneOf(&["sgd", "adamw"]), default: "`sgd`", note: "" },
    KeySpec { key: "optimizer.lr", flag: None, range: Range::Float { min: 0.0, min_inclusive: false, max: f64::INFINITY, max_inclusive: false }, default: "0.01", note: "" },
    KeySpec { key: "optimizer.momentum", flag: None, range: Range::Float { min: 0.0, min_inclusive: true, max: 1.0, max_inclusive: false }, default: "0", note: "sgd" },
    KeySpec { key: "optimizer.weight_decay", flag: None, range: Range::Float { min: 0.0, min_inclusive: true, max: f64::INFINITY, max_inclusive: false }, default: "1e-4", note: "adamw" },
    KeySpec { key: "optimizer.warmup_steps", flag: None, range: int(0, MAX_STEPS), default: "0", note: "" },
    KeySpec { key: "optimizer.decay_steps", flag: None, range: int(0, MAX_STEPS), default: "0", note: "0: no decay; else at least `warmup_steps`" },
    KeySpec { key: "optimizer.end_lr", flag: None, range: Range::Float { min: 0.0, min_inclusive: true, max: f64::INFINITY, max_inclusive: false }, default: "0", note: "" },
    KeySpec { key: "optimizer.clip", flag: None, range: Range::Float { min: 0.0, min_inclusive: false, max: f64::INFINITY, max_inclusive: false }, default: "none", note: "global-norm threshold" },
    KeySpec { key: "optimizer.micro_batches", flag: None, range: int(1, MAX_DIM), default: "1", note: "divides `model.batch`" },
    KeySpec { key: "loss_scaling.initial_scale", flag: None, range: Range::Float { min: 0.0, min_inclusive: false, max: 1e38, max_inclusive: true }, default: "32768", note: "at least `loss_scaling.min_scale`; a power of two keeps the unscaled loss exact" },
    KeySpec { key: "loss_scaling.period", flag: None, range: int(1, i32::MAX as u64), default: "2000", note: "good steps in a row before the scale doubles" },
    KeySpec { key: "loss_scaling.min_scale", flag: None, range: Range::Float { min: 0.0, min_inclusive: false, max: 1e38, max_inclusive: true }, default: "1", note: "a skipped step halves the scale, not below this" },
    KeySpec { key: "checkpoint.dir", flag: Some("--checkpoint-dir"), range: Range::Text("a directory path, not empty"), default: "(required with `[checkpoint]`)", note: "" },
    KeySpec { key: "checkpoint.every", flag: Some("--checkpoint-every"), range: int(1, MAX_STEPS), default: "10", note: "" },
    KeySpec { key: "checkpoint.keep_last", flag: None, range: int(1, 1_000_000), default: "3", note: "" },
    KeySpec { key: "checkpoint.keep_every", flag: None, range: int(1, MAX_STEPS), default: "none", note: "" },
    KeySpec { key: "checkpoint.every_seconds", flag: None, range: Range::Float { min: 0.0, min_inclusive: false, max: 1e9, max_inclusive: true }, default: "none", note: "also save at the first step this long after the last save" },
    KeySpec { key: "data.source", flag: None, range: Range::OneOf(&["tokens", "table"]), default: "(required with `[data]`)", note: "`tokens` needs a model whose batch inputs are `tokens` and `targets` (gpt, llama, or such a program)" },
    KeySpec { key: "data.train", flag: None, range: Range::Text("a token file, a `.safetensors` file, or `{ input = \"file.npy\", ... }`"), default: "(required with `[data]`)", note: "" },
    KeySpec { key: "data.val", flag: None, range: Range::Text("as `data.train`"), default: "none", note: "needed when `data.eval_every` > 0" },
    KeySpec { key: "data.dtype", flag: None, range: Range::OneOf(&["u16", "u32"]), default: "`u16`", note: "token files" },
    KeySpec { key: "data.shuffle", flag: None, range: Range::OneOf(&["true", "false"]), default: "true", note: "" },
    KeySpec { key: "data.prefetch", flag: None, range: int(0, MAX_PREFETCH), default: "2", note: "batches read ahead; 0: read in the step loop" },
    KeySpec { key: "data.eval_every", flag: None, range: int(0, MAX_STEPS), default: "0", note: "0: never" },
    KeySpec { key: "data.eval_batches", flag: None, range: int(1, 1_000_000), default: "4", note: "" },
    KeySpec { key: "pipeline.stages", flag: None, range: int(1, MAX_DEVICES), default: "(required with `[pipeline]`)", note: "the size of `pipeline.axis`; at most the model's layers (embedding and head count one each)" },
    KeySpec { key: "pipeline.microbatches", flag: None, range: int(1, MAX_DIM), default: "1", note: "divides `model.batch`; `optimizer.micro_batches` must stay 1" },
    KeySpec { key: "pipeline.schedule", flag: None, range: Range::OneOf(&["gpipe", "1f1b", "interleaved"]), default: "`1f1b`", note: "`interleaved`: Megatron's virtual stages; microbatches a multiple of the stages" },
    KeySpec { key: "pipeline.virtual_stages", flag: None, range: int(1, MAX_DEVICES), default: "2 with `interleaved`, else 1", note: "chunks of layers per stage; ≥ 2 with `interleaved`, 1 otherwise" },
    KeySpec { key: "pipeline.split", flag: None, range: Range::Text("layers per chunk (per stage unless interleaved), each ≥ 1, summing to the model's layers"), default: "chosen by cost", note: "" },
    KeySpec { key: "pipeline.axis", flag: None, range: Range::Text("a mesh axis"), default: "`stage`", note: "" },
    KeySpec { key: "pipeline.memory_budget", flag: None, range: Range::Text("a size ≥ 1 byte: `2GiB`, `512MiB`, `1e9`"), default: "none", note: "per device; the split must fit it" },
    KeySpec { key: "trace.file", flag: Some("--trace"), range: Range::Text("a file path"), default: "(required with `[trace]`)", note: "a Chrome trace-event JSON of the traced steps (opens in Perfetto); several processes: the rank before the extension" },
    KeySpec { key: "trace.steps", flag: Some("--trace-steps"), range: Range::Text("a step `N` or a half-open range `A..B`, within the run's steps"), default: "the run's second and third steps", note: "" },
    KeySpec { key: "trace.sync", flag: Some("--trace-sync"), range: Range::OneOf(&["true", "false"]), default: "false", note: "each span waits for its device: a GPU's device times (slower)" },
    KeySpec { key: "overlap.enabled", flag: Some("--no-overlap"), range: Range::OneOf(&["true", "false"]), default: "true", note: "collectives start when their input is ready and are waited for where their result is read (bitwise the same results)" },
    KeySpec { key: "overlap.prefetch", flag: None, range: Range::Text("a size: `64MiB`, `0`, `1e9`"), default: "`64MiB`", note: "extra bytes per device for collectives started early (gathers); reductions move regardless" },
    KeySpec { key: "overlap.bucket", flag: None, range: Range::Text("a size: `1MiB`, `0`, `25MB`"), default: "`1MiB`", note: "all-reduces under this size are combined into buckets of up to it (fewer exchanges; bitwise the same results); `0`: none" },
    KeySpec { key: "stragglers.ratio", flag: None, range: Range::Float { min: 1.0, min_inclusive: false, max: 1e6, max_inclusive: true }, default: "1.5", note: "several processes: a process whose compute exceeds this times the others' median (by 1 ms or more) is slow" },
    KeySpec { key: "stragglers.steps", flag: None, range: int(1, MAX_STEPS), default: "20", note: "slow steps in a row before process 0 warns (once per streak)" },
];

/// The spec of `key` (which must be in [`KEYS`]).
pub fn spec(key: &str) -> &'static KeySpec {
    KEYS.iter().find(|k| k.key == key).unwrap_or_else(|| panic!("`{key}` is not in validate::KEYS"))
}

fn name(k: &KeySpec) -> String {
    match k.flag {
        Some(f) => format!("{} ({f})", k.key),
        None => k.key.to_string(),
    }
}

fn invalid(key: &str, value: impl ToString, expected: String) -> Error {
    Error::Invalid { key: name(spec(key)), value: value.to_string(), expected }
}

/// Checks an integer against its key's range.
pub fn check_int(key: &str, v: u64) -> Result<()> {
    match spec(key).range {
        Range::Int { min, max } if v < min || v > max => {
            Err(invalid(key, v, format!("must be {}", spec(key).range.describe())))
        }
        _ => Ok(()),
    }
}

/// Checks a number against its key's range (NaN and infinities never pass).
pub fn check_float(key: &str, v: f64) -> Result<()> {
    let r = spec(key).range;
    let ok = match r {
        Range::Float { min, min_inclusive, max, max_inclusive } => {
            v.is_finite() && (v > min || (min_inclusive && v == min)) && (v < max || (max_inclusive && v == max))
        }
        _ => true,
    };
    if ok {
        Ok(())
    } else {
        Err(invalid(key, v, format!("must be {}", r.describe())))
    }
}

fn check_name(key: &str, v: &str) -> Result<()> {
    match spec(key).range {
        Range::OneOf(names) if !names.contains(&v) => {
            Err(invalid(key, format!("`{v}`"), format!("must be one of {}", spec(key).range.describe())))
        }
        _ => Ok(()),
    }
}

/// Checks every key of `c` (after command-line overrides) and the rules
/// that relate keys; returns the parsed mesh.
pub fn validate(c: &RunConfig) -> Result<Mesh> {
    check_int("steps", c.steps)?;
    check_int("seed", c.seed)?;
    if let Some(d) = c.divergence_steps {
        check_int("divergence_steps", d)?;
    }
    let mesh_text = c.mesh.as_deref().unwrap_or("data=1");
    let mesh = Mesh::parse(mesh_text).map_err(|e| {
        let why = match e {
            weft_compiler::CompilerError::InvalidMesh { message, .. } => message,
            other => other.to_string(),
        };
        invalid("mesh", format!("`{mesh_text}`"), why)
    })?;
    if mesh.num_devices() as u64 > MAX_DEVICES {
        return Err(invalid(
            "mesh",
            format!("`{mesh_text}`"),
            format!("{} devices, more than the {MAX_DEVICES} a training run may have", mesh.num_devices()),
        ));
    }
    if let Some(s) = &c.strategy {
        check_name("strategy", s)?;
    }
    if let Some(b) = &c.backend {
        check_name("backend", b)?;
    }
    if let Some(t) = c.threads {
        check_int("threads", t as u64)?;
    }
    if let Some(r) = &c.reduction {
        check_name("reduction", r)?;
    }
    if let Some(m) = &c.memory_limit {
        weft_ir::limits::parse_bytes(m).map_err(|e| invalid("memory_limit", format!("`{m}`"), e))?;
    }
    if let Some(m) = &c.memory_budget {
        weft_ir::limits::parse_bytes(m).map_err(|e| invalid("memory_budget", format!("`{m}`"), e))?;
        if c.strategy.as_deref() != Some("auto") {
            return Err(invalid(
                "memory_budget",
                format!("`{m}`"),
                "is the auto-sharder's budget: it needs `strategy = \"auto\"` (--strategy auto)".to_string(),
            ));
        }
    }
    if let Some(k) = c.sum_chunks {
        weft_compiler::canonical_sums::SumChunks::new(k).map_err(|e| invalid("sum_chunks", k, e.to_string()))?;
        if !c.mesh_invariant {
            return Err(invalid(
                "sum_chunks",
                k,
                "is the chunk count of mesh-invariant sums: it needs `mesh_invariant = true`".to_string(),
            ));
        }
    }
    if c.mesh_invariant && c.pipeline.is_some() {
        return Err(invalid(
            "mesh_invariant",
            true,
            "is not supported with `[pipeline]` yet (the stages are cut from the model, not from the step)".to_string(),
        ));
    }
    let batch = match &c.model {
        ModelConfig::Mlp { layers, d, h, batch, compute } => {
            check_int("model.layers", *layers as u64)?;
            check_int("model.d", *d as u64)?;
            check_int("model.h", *h as u64)?;
            check_int("model.batch", *batch as u64)?;
            if let Some(t) = compute {
                check_name("model.compute", t)?;
            }
            Some(*batch)
        }
        ModelConfig::Gpt {
            vocab,
            seq,
            d_model,
            heads,
            layers,
            batch,
            dropout,
            compute,
            experts,
            top_k,
            capacity_factor,
            moe_every,
            aux_loss_weight,
            ..
        } => {
            if let Some(e) = experts {
                check_int("model.experts", *e as u64)?;
                check_int("model.top_k", *top_k as u64)?;
                check_float("model.capacity_factor", *capacity_factor)?;
                check_int("model.moe_every", *moe_every as u64)?;
                check_float("model.aux_loss_weight", *aux_loss_weight)?;
                if top_k > e {
                    return Err(invalid("model.top_k", top_k, format!("must be at most model.experts = {e}")));
                }
                if moe_every > layers {
                    return Err(invalid(
                        "model.moe_every",
                        moe_every,
                        format!("must be at most model.layers = {layers}"),
                    ));
                }
            }
            check_int("model.vocab", *vocab as u64)?;
            check_int("model.seq", *seq as u64)?;
            check_int("model.d_model", *d_model as u64)?;
            check_int("model.heads", *heads as u64)?;
            if d_model % heads != 0 {
                return Err(invalid("model.heads", heads, format!("must divide model.d_model = {d_model}")));
            }
            check_int("model.layers", *layers as u64)?;
            check_int("model.batch", *batch as u64)?;
            check_float("model.dropout", *dropout)?;
            // Dropout masks draw one 32-bit counter per element.
            let mask = [*batch, *heads, *seq, *seq].iter().fold(1u64, |a, &x| a.saturating_mul(x as u64));
            let mlp = [*batch, *seq, 4, *d_model].iter().fold(1u64, |a, &x| a.saturating_mul(x as u64));
            if *dropout > 0.0 && mask.max(mlp) >= 1 << 32 {
                return Err(invalid(
                    "model.dropout",
                    dropout,
                    format!(
                        "dropout needs fewer than 2^32 elements per mask, but batch x heads x seq x seq = {mask} and \
                         batch x seq x 4 d_model = {mlp}; use dropout = 0 or smaller sizes"
                    ),
                ));
            }
            if let Some(t) = compute {
                check_name("model.compute", t)?;
            }
            Some(*batch)
        }
        ModelConfig::Llama { vocab, seq, d_model, heads, kv_heads, ffn, layers, batch, rope_base } => {
            check_int("model.vocab", *vocab as u64)?;
            check_int("model.seq", *seq as u64)?;
            check_int("model.d_model", *d_model as u64)?;
            check_int("model.heads", *heads as u64)?;
            check_int("model.kv_heads", *kv_heads as u64)?;
            check_int("model.ffn", *ffn as u64)?;
            check_int("model.layers", *layers as u64)?;
            check_int("model.batch", *batch as u64)?;
            check_float("model.rope_base", *rope_base)?;
            if d_model % heads != 0 {
                return Err(invalid("model.heads", heads, format!("must divide model.d_model = {d_model}")));
            }
            if heads % kv_heads != 0 {
                return Err(invalid("model.kv_heads", kv_heads, format!("must divide model.heads = {heads}")));
            }
            if (d_model / heads) % 2 != 0 {
                return Err(invalid(
                    "model.heads",
                    heads,
                    format!(
                        "must leave an even head width d_model / heads (rotary embeddings), not {}",
                        d_model / heads
                    ),
                ));
            }
            Some(*batch)
        }
        ModelConfig::Program { program, loss, .. } => {
            if program.as_os_str().is_empty() {
                return Err(invalid("model.program", "\"\"", "must name a program file (`model.weft`)".into()));
            }
            if loss.is_empty() {
                return Err(invalid("model.loss", "\"\"", "must name the function to minimise".into()));
            }
            // A program's batch is its inputs' dimension 0: one micro-batch.
            None
        }
    };
    let o = &c.optimizer;
    check_name("optimizer.kind", &o.kind)?;
    check_float("optimizer.lr", o.lr)?;
    check_float("optimizer.momentum", o.momentum)?;
    check_float("optimizer.weight_decay", o.weight_decay)?;
    check_int("optimizer.warmup_steps", o.warmup_steps)?;
    check_int("optimizer.decay_steps", o.decay_steps)?;
    if o.decay_steps != 0 && o.decay_steps < o.warmup_steps {
        return Err(invalid(
            "optimizer.decay_steps",
            o.decay_steps,
            format!("must be 0 (no decay) or at least optimizer.warmup_steps = {}", o.warmup_steps),
        ));
    }
    check_float("optimizer.end_lr", o.end_lr)?;
    if let Some(clip) = o.clip {
        check_float("optimizer.clip", clip)?;
    }
    check_int("optimizer.micro_batches", o.micro_batches as u64)?;
    if let Some(ls) = &c.loss_scaling {
        check_float("loss_scaling.initial_scale", ls.initial_scale)?;
        check_int("loss_scaling.period", ls.period)?;
        check_float("loss_scaling.min_scale", ls.min_scale)?;
        if ls.min_scale > ls.initial_scale {
            return Err(invalid(
                "loss_scaling.min_scale",
                ls.min_scale,
                format!("must be at most loss_scaling.initial_scale = {}", ls.initial_scale),
            ));
        }
    }
    if batch.is_some_and(|batch| batch % o.micro_batches != 0) {
        let batch = batch.unwrap_or_default();
        return Err(invalid(
            "optimizer.micro_batches",
            o.micro_batches,
            format!("must divide model.batch = {batch} (each micro-batch has batch / micro_batches rows)"),
        ));
    }
    if let Some(k) = &c.checkpoint {
        if k.dir.as_os_str().is_empty() {
            return Err(invalid(
                "checkpoint.dir",
                "\"\"",
                "[checkpoint] needs a `dir` (or pass --checkpoint-dir)".into(),
            ));
        }
        check_int("checkpoint.every", k.every)?;
        check_int("checkpoint.keep_last", k.keep_last as u64)?;
        if let Some(e) = k.keep_every {
            check_int("checkpoint.keep_every", e)?;
        }
        if let Some(s) = k.every_seconds {
            check_float("checkpoint.every_seconds", s)?;
        }
    }
    if let Some(d) = &c.data {
        validate_data(d, &c.model)?;
    }
    if let Some(p) = &c.pipeline {
        validate_pipeline(p, c, &mesh, batch)?;
    }
    if let Some(t) = &c.trace {
        if t.file.as_os_str().is_empty() {
            return Err(invalid(
                "trace.file",
                "\"\"",
                "a trace needs a file: pass --trace FILE or set [trace] file".into(),
            ));
        }
        super::trace::parse_steps(t.steps.as_deref(), 0, u64::MAX)?;
    }
    if let Some(t) = c.peak_tflops {
        check_float("peak_tflops", t)?;
    }
    if let Some(s) = &c.stragglers {
        check_float("stragglers.ratio", s.ratio)?;
        check_int("stragglers.steps", s.steps)?;
    }
    if let Some(o) = &c.overlap {
        for (key, v) in [("overlap.prefetch", &o.prefetch), ("overlap.bucket", &o.bucket)] {
            if let Some(v) = v {
                OverlapSection::bytes(v).map_err(|e| invalid(key, format!("`{v}`"), e))?;
            }
        }
    }
    Ok(mesh)
}

/// The stage axis and the mesh of the other axes: the axis must exist,
/// with one position per stage, and must not be the `data` axis the
/// strategies split the batch over.
pub fn split_mesh(mesh: &Mesh, axis: &str, stages: usize) -> Result<Mesh> {
    use weft_compiler::CompilerError;
    let Some(size) = mesh.axis(axis).map(|a| a.size) else {
        let axes: Vec<&str> = mesh.axes().iter().map(|a| a.name.as_str()).collect();
        return Err(CompilerError::PipelineNoStageAxis {
            axis: axis.into(),
            stages,
            mesh: mesh.to_string(),
            axes: axes.join(", "),
        }
        .into());
    };
    if size != stages {
        return Err(CompilerError::PipelineStageAxis { axis: axis.into(), size, stages }.into());
    }
    if axis == "data" {
        return Err(CompilerError::PipelineConfig {
            message: format!(
                "pipeline.axis = \"data\": the data axis splits the batch, it cannot also hold the stages (each stage \
                 would run on a mesh without it); use a mesh such as `stage={stages},data=2` with pipeline.axis = \"stage\""
            ),
        }
        .into());
    }
    let rest: Vec<(&str, usize)> =
        mesh.axes().iter().filter(|a| a.name != axis).map(|a| (a.name.as_str(), a.size)).collect();
    Ok(Mesh::new(&rest)?)
}

/// The `[pipeline]` keys: ranges, then the stage axis and the batch.
fn validate_pipeline(
    p: &super::config::PipelineSection,
    c: &RunConfig,
    mesh: &Mesh,
    batch: Option<usize>,
) -> Result<()> {
    use weft_compiler::CompilerError;
    check_int("pipeline.stages", p.stages as u64)?;
    check_int("pipeline.microbatches", p.microbatches as u64)?;
    check_name("pipeline.schedule", &p.schedule)?;
    if let Some(v) = p.virtual_stages {
        check_int("pipeline.virtual_stages", v as u64)?;
    }
    let schedule = p.schedule()?;
    schedule.check(p.stages, p.microbatches)?;
    if let Some(m) = &p.memory_budget {
        weft_ir::limits::parse_bytes(m).map_err(|e| invalid("pipeline.memory_budget", format!("`{m}`"), e))?;
    }
    if let Some(split) = &p.split {
        let chunks = schedule.chunks(p.stages);
        if split.len() != chunks || split.contains(&0) {
            let per = if chunks == p.stages { "one per stage" } else { "one per chunk: stages × virtual_stages" };
            return Err(invalid(
                "pipeline.split",
                format!("{split:?}"),
                format!("must list {chunks} layer counts ({per}), each at least 1"),
            ));
        }
    }
    split_mesh(mesh, &p.axis, p.stages)?;
    if let Some(batch) = batch.filter(|b| b % p.microbatches != 0) {
        return Err(CompilerError::PipelineMicrobatches { microbatches: p.microbatches, batch }.into());
    }
    if c.optimizer.micro_batches != 1 {
        return Err(invalid(
            "optimizer.micro_batches",
            c.optimizer.micro_batches,
            "must be 1 with [pipeline]: pipeline.microbatches sets the accumulation".into(),
        ));
    }
    Ok(())
}

/// The `[data]` keys.
fn validate_data(d: &crate::data::DataConfig, model: &ModelConfig) -> Result<()> {
    check_name("data.source", &d.source)?;
    if d.source == "tokens" && matches!(model, ModelConfig::Mlp { .. }) {
        return Err(invalid(
            "data.source",
            "`tokens`",
            "token streams feed a model with inputs tokens and targets: model.kind = `gpt`, or a program".into(),
        ));
    }
    for (key, p) in std::iter::once(("data.train", &d.train)).chain(d.val.as_ref().map(|v| ("data.val", v))) {
        let empty = match p {
            crate::data::DataPath::File(f) => f.as_os_str().is_empty(),
            crate::data::DataPath::Inputs(m) => m.is_empty() || m.values().any(|f| f.as_os_str().is_empty()),
        };
        if empty {
            return Err(invalid(key, format!("`{}`", p.describe()), format!("must be {}", spec(key).range.describe())));
        }
    }
    check_name("data.dtype", &d.dtype)?;
    check_int("data.prefetch", d.prefetch as u64)?;
    check_int("data.eval_every", d.eval_every)?;
    check_int("data.eval_batches", d.eval_batches as u64)?;
    if d.eval_every > 0 && d.val.is_none() {
        return Err(invalid(
            "data.eval_every",
            d.eval_every,
            "needs a validation split to evaluate: set data.val (or eval_every = 0)".into(),
        ));
    }
    Ok(())
}

/// The table of [`KEYS`] as `specs/training.md` prints it.
pub fn spec_table() -> String {
    let mut out = String::from("| key | flag | valid values | default | notes |\n|---|---|---|---|---|\n");
    for k in KEYS {
        out.push_str(&format!(
            "| `{}` | {} | {} | {} | {} |\n",
            k.key,
            k.flag.map(|f| format!("`{f}`")).unwrap_or_default(),
            k.range.describe(),
            k.default,
            k.note
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_strategy_key_lists_every_strategy() {
        let spec = KEYS.iter().find(|k| k.key == "strategy").expect("a strategy key");
        let Range::OneOf(names) = spec.range else { panic!("strategy is one of a list") };
        let all: Vec<&str> = crate::strategy::Strategy::ALL.iter().map(|s| s.name()).collect();
        assert_eq!(names.to_vec(), all);
    }

    #[test]
    fn integer_ranges_accept_their_bounds_and_reject_one_past() {
        for k in KEYS {
            if let Range::Int { min, max } = k.range {
                assert!(check_int(k.key, min).is_ok() && check_int(k.key, max).is_ok(), "{}", k.key);
                if min > 0 {
                    assert!(check_int(k.key, min - 1).is_err(), "{}", k.key);
                }
                if max < u64::MAX {
                    let e = check_int(k.key, max + 1).unwrap_err().to_string();
                    assert!(e.contains(&max.to_string()), "{}: {e}", k.key);
                }
            }
        }
    }

    #[test]
    fn floats_reject_nan_infinities_and_out_of_range() {
        for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -1.0] {
            assert!(check_float("optimizer.lr", bad).is_err(), "{bad}");
            assert!(check_float("optimizer.clip", bad).is_err(), "{bad}");
        }
        assert!(check_float("optimizer.lr", 0.0).is_err());
        assert!(check_float("model.dropout", 1.0).is_err());
        assert!(check_float("model.dropout", 0.0).is_ok());
        let e = check_float("model.dropout", -0.5).unwrap_err().to_string();
        assert_eq!(e, "model.dropout = -0.5: must be a finite number in [0, 1)");
    }

    /// The defaults the key table states are the ones a config gets: every
    /// key whose default is a plain value (`10`, `1e-4`, `false`, `` `sgd` ``)
    /// is compared with the parsed config's value (keys a config leaves
    /// unset, `None`, are skipped).
    #[test]
    fn the_key_table_states_the_config_defaults() {
        let text = "steps = 1\n[model]\nkind = \"gpt\"\n[optimizer]\n[checkpoint]\ndir = \"x\"\n[loss_scaling]\n";
        let json = serde_json::to_value(RunConfig::from_toml(text).unwrap()).unwrap();
        let mut checked = Vec::new();
        for k in KEYS {
            let Some(got) = k.key.split('.').try_fold(&json, |v, part| v.get(part)).filter(|v| !v.is_null()) else {
                continue;
            };
            let stated = k.default.trim_matches('`');
            let want = match serde_json::from_str::<serde_json::Value>(stated) {
                Ok(v) => v,
                Err(_) if k.default.starts_with('`') && k.default.ends_with('`') => serde_json::json!(stated),
                Err(_) => continue,
            };
            let same = match (got.as_f64(), want.as_f64()) {
                (Some(a), Some(b)) => a == b,
                _ => *got == want,
            };
            assert!(same, "{}: the key table says the default is {}, a config gets {got}", k.key, k.default);
            checked.push(k.key);
        }
        assert!(checked.len() >= 20, "only {checked:?} compared");
    }

    #[test]
    fn the_spec_lists_every_key() {
        let spec = include_str!("../../specs/training.md");
        assert!(
            spec.contains(&spec_table()),
            "specs/training.md must contain validate::spec_table():\n{}",
            spec_table()
        );
    }
}

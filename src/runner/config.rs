//! The experiment configuration (`weft train CONFIG.toml`).
//!
//! ```toml
//! steps = 100
//! seed = 0
//! mesh = "data=2,model=4"     # default: a single device
//! strategy = "dp"             # none|dp|tp|fsdp|fsdp_tp|zero1|zero2|zero3
//! backend = "cpu"             # cpu (simulated devices) | interp (unsharded oracle)
//! reduction = "deterministic" # or "fast": MPI's own sums across processes (not bitwise reproducible)
//! metrics = "runs/mlp/metrics.jsonl"
//! mesh_invariant = false      # true: bitwise the same metrics on every mesh (slower)
//! peak_tflops = 989           # a device's peak, for the MFU a run reports (GPUs)
//!
//! [model]
//! kind = "mlp"                # or "gpt"; or instead a program:
//! # program = "model.weft"   # (relative to this file) with loss = "loss",
//! #                          # [model.init], init_from, [model.inputs]
//! layers = 4
//! d = 64
//! h = 256
//! batch = 32
//!
//! [optimizer]
//! kind = "sgd"                # or "adamw"
//! lr = 0.01
//!
//! [loss_scaling]              # optional: dynamic loss scaling (f16 training);
//! initial_scale = 32768       # an empty table takes these defaults
//! period = 2000
//! min_scale = 1
//!
//! [checkpoint]
//! dir = "runs/mlp/ckpt"
//! every = 10
//! keep_last = 3
//! every_seconds = 600         # also save when 10 minutes have passed
//!
//! [shardings]                 # optional: name patterns -> shardings
//! "params.*.w1" = "[{}, {model}]"
//!
//! [pipeline]                  # optional; mesh = "stage=4" or "data=2,stage=2,model=2"
//! stages = 4
//! microbatches = 8
//! schedule = "1f1b"           # or "gpipe", or "interleaved" (with virtual_stages)
//! virtual_stages = 2          # chunks per stage with "interleaved" (default 2)
//! split = [2, 1, 1, 2]        # optional; default: chosen by cost (one count per chunk)
//!
//! [trace]                     # optional; or `--trace FILE`
//! file = "runs/mlp/trace.json" # Chrome trace-event JSON (opens in Perfetto)
//! steps = "1..3"              # default: the run's second and third steps
//! sync = false                # true: each span waits for its device (GPU times)
//!
//! [overlap]                   # optional; collectives overlapped with compute
//! enabled = true              # default true; false: each collective waits in place
//! prefetch = "64MiB"          # extra bytes a device may hold for gathers started early
//! bucket = "1MiB"             # all-reduces under this size share buckets of up to it; "0": none
//!
//! [stragglers]                # optional; several processes (`mpirun`)
//! ratio = 1.5                 # compute over 1.5x the others' median is slow
//! steps = 20                  # for 20 steps in a row: process 0 warns
//! ```
//!
//! Unknown keys are errors (a typo never silently does nothing), and every
//! value is range-checked before anything is built (`super::validate`; the
//! ranges are listed in `specs/training.md`).

use crate::models::{gpt::GptConfig, mlp::MlpConfig};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use weft_compiler::canonical_sums::SumChunks;
use weft_compiler::train::{LossScaling, Optimizer, Schedule, TrainConfig};
use weft_ir::DType;

/// A whole run.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RunConfig {
    /// Number of training steps (the run stops when `step` reaches it).
    pub steps: u64,
    /// Seed for parameter initialisation, synthetic data and the PRNG key.
    #[serde(default)]
    pub seed: u64,
    /// Device mesh, e.g. `data=2,model=4` (default: one device).
    #[serde(default)]
    pub mesh: Option<String>,
    /// Parallelism strategy name (see `weft::strategy`).
    #[serde(default)]
    pub strategy: Option<String>,
    /// Execution backend.
    #[serde(default)]
    pub backend: Option<String>,
    /// Worker threads of a runtime backend (default: one per core for the CPU backends, one per device for GPUs).
    #[serde(default)]
    pub threads: Option<usize>,
    /// Where to append one JSON object per step.
    #[serde(default)]
    pub metrics: Option<PathBuf>,
    /// How sums across the processes of a multi-process run are combined:
    /// `deterministic` (default: bitwise the one-process run) or `fast`
    /// (MPI's own reductions; see `weft_runtime::process::Reduction`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reduction: Option<String>,
    /// The memory the run may need (`16GiB`); default `WEFT_MEMORY_LIMIT`,
    /// else the machine's memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_limit: Option<String>,
    /// Per-device memory budget of `strategy = "auto"` (`2GiB`): the
    /// auto-sharder's plan must fit it.
    #[serde(default)]
    pub memory_budget: Option<String>,
    /// Sum in an order that does not depend on the mesh
    /// ([`weft_compiler::canonical_sums`]): the same metrics, bit for bit,
    /// on one device and on every mesh whose shard counts divide
    /// `sum_chunks`. It costs time on every mesh; off by default.
    #[serde(default, skip_serializing_if = "is_false")]
    pub mesh_invariant: bool,
    /// The chunk count of `mesh_invariant` sums (a power of two; default 8).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sum_chunks: Option<usize>,
    /// The peak TFLOP/s of one device, for the model FLOPs utilisation a
    /// run reports (default: the calibrated CPU rate on the CPU backends;
    /// none on a GPU: declare the card's, e.g. 989 for an H100's dense
    /// bf16).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_tflops: Option<f64>,
    /// Stop with an error after this many steps in a row whose loss is not
    /// finite (default 3; 0: never stop). Such steps are never checkpointed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub divergence_steps: Option<u64>,
    /// The model.
    pub model: ModelConfig,
    /// `[shardings]`: parameter and batch-input name patterns mapped to
    /// shardings in the text notation (`"params.*.w1" = "[{}, {model}]"`),
    /// in order; the first match wins.
    #[serde(default, skip_serializing_if = "Vec::is_empty", deserialize_with = "ordered")]
    pub shardings: Vec<(String, String)>,
    /// The optimizer and schedule.
    #[serde(default)]
    pub optimizer: OptimizerConfig,
    /// Dynamic loss scaling (`[loss_scaling]`; an empty table takes the
    /// defaults).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss_scaling: Option<LossScalingSection>,
    /// Checkpointing.
    #[serde(default)]
    pub checkpoint: Option<CheckpointConfig>,
    /// The dataset (`[data]`, see `crate::data::config`); without it the
    /// run trains on the model's fixed synthetic batch (or `--data`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<crate::data::DataConfig>,
    /// Pipeline parallelism (`[pipeline]`): the model split by depth over
    /// the positions of a `stage` mesh axis.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pipeline: Option<PipelineSection>,
    /// A step trace (`[trace]`, `--trace`; see `super::trace`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<TraceSection>,
    /// When a slow process of a multi-process run is warned about
    /// (`[stragglers]`; see `super::stragglers`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stragglers: Option<super::stragglers::StragglerSection>,
    /// Collectives overlapped with compute (`[overlap]`; the compile's
    /// `overlap_collectives` pass).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overlap: Option<OverlapSection>,
}

/// `[overlap]`: whether collectives start early and are waited for late,
/// and how much memory gathers started early may hold.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct OverlapSection {
    /// Default true; false: every collective waits where the partitioner
    /// put it.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// The most bytes a device may hold beyond the in-order program's for
    /// collectives started early (`64MiB`, the default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefetch: Option<String>,
    /// All-reduces smaller than this share buckets of up to this size
    /// (`1MiB`, the default; `0`: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bucket: Option<String>,
}

fn yes() -> bool {
    true
}

impl OverlapSection {
    /// The pass's options, or `None` when overlap is off; the prefetch
    /// size must parse (validated before).
    pub fn options(
        section: Option<&OverlapSection>,
    ) -> Result<Option<weft_compiler::partition::overlap::OverlapOptions>, String> {
        let mut o = weft_compiler::partition::overlap::OverlapOptions::default();
        let Some(s) = section else { return Ok(Some(o)) };
        if !s.enabled {
            return Ok(None);
        }
        if let Some(p) = &s.prefetch {
            o.prefetch_bytes = OverlapSection::bytes(p)?;
        }
        if let Some(b) = &s.bucket {
            o.bucket_bytes = OverlapSection::bytes(b)?;
        }
        Ok(Some(o))
    }

    /// `prefetch` or `bucket` in bytes: a size, or `0` (none).
    pub fn bytes(p: &str) -> Result<u64, String> {
        if p.trim() == "0" {
            return Ok(0);
        }
        weft_ir::limits::parse_bytes(p)
    }
}

/// `[trace]`: where to write a step trace, of which steps, and whether
/// each span waits for its device.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TraceSection {
    /// The Chrome trace-event JSON file.
    pub file: PathBuf,
    /// `"N"` or `"A..B"`; default the run's second and third steps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steps: Option<String>,
    /// Wait for the device after every span (GPU device times).
    #[serde(default, skip_serializing_if = "is_false")]
    pub sync: bool,
}

/// `[pipeline]`: stages, microbatches, schedule, an optional split.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PipelineSection {
    /// Stages: the size of the stage axis.
    pub stages: usize,
    /// Microbatches per step (they replace `optimizer.micro_batches`).
    #[serde(default = "d_micro")]
    pub microbatches: usize,
    /// `gpipe`, `1f1b` or `interleaved`.
    #[serde(default = "d_schedule")]
    pub schedule: String,
    /// Chunks of layers per stage (`V`): at least 2 with the `interleaved`
    /// schedule (stage `s` holds chunks `s, s + S, …`; default 2), else 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub virtual_stages: Option<usize>,
    /// Layers per chunk (per stage without interleaving; the embedding and
    /// the head count as one layer each); default: chosen by the cost model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub split: Option<Vec<usize>>,
    /// The mesh axis whose positions are the stages.
    #[serde(default = "d_stage_axis")]
    pub axis: String,
    /// Bytes per device a stage may use (`2GiB`): the split must fit it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_budget: Option<String>,
}

impl PipelineSection {
    /// The schedule with its chunks per stage (`virtual_stages`, by
    /// default 2 when interleaved, else 1).
    pub fn schedule(&self) -> crate::Result<weft_compiler::stages::Schedule> {
        let v = self.virtual_stages.unwrap_or(if self.schedule == "interleaved" { 2 } else { 1 });
        Ok(weft_compiler::stages::Schedule::named(&self.schedule, v)?)
    }
}

fn is_false(b: &bool) -> bool {
    !*b
}

fn d_schedule() -> String {
    "1f1b".into()
}
fn d_stage_axis() -> String {
    "stage".into()
}

/// The model and its sizes (the defaults: [`ModelTable`]).
///
/// Read through [`ModelTable`] (one flat table, then the kind's keys), not
/// as a serde internally tagged enum: serde buffers a tagged enum's table
/// before it reads it, and a wrong value type would then be reported at
/// `[model]` without its key and line.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(tag = "kind", rename_all = "lowercase", try_from = "ModelTable")]
pub enum ModelConfig {
    /// The residual MLP.
    Mlp {
        /// Residual layers.
        layers: usize,
        /// Width D.
        d: usize,
        /// Hidden width H.
        h: usize,
        /// Batch size.
        batch: usize,
        /// Compute dtype (`f32`, `bf16`, `f16`).
        compute: Option<String>,
    },
    /// The GPT-style decoder.
    Gpt {
        /// Vocabulary size.
        vocab: usize,
        /// Sequence length.
        seq: usize,
        /// Model width.
        d_model: usize,
        /// Attention heads.
        heads: usize,
        /// Blocks.
        layers: usize,
        /// Batch size.
        batch: usize,
        /// Dropout rate.
        dropout: f64,
        /// Rematerialise blocks.
        remat: bool,
        /// Compute dtype.
        compute: Option<String>,
        /// Unembed with the token embedding transposed (GPT-2).
        tie_embeddings: bool,
        /// Experts per mixture-of-experts block (none: every block dense).
        experts: Option<usize>,
        /// Experts per token.
        top_k: usize,
        /// Expert capacity as a multiple of an even share.
        capacity_factor: f64,
        /// Every `moe_every`-th block is a mixture of experts.
        moe_every: usize,
        /// The load-balancing loss's weight.
        aux_loss_weight: f64,
    },
    /// The Llama-style decoder (RMSNorm, rotary embeddings, grouped-query
    /// attention, SwiGLU).
    Llama {
        /// Vocabulary size.
        vocab: usize,
        /// Sequence length.
        seq: usize,
        /// Model width.
        d_model: usize,
        /// Query heads.
        heads: usize,
        /// Key/value heads (divides `heads`).
        kv_heads: usize,
        /// The MLP's hidden width.
        ffn: usize,
        /// Blocks.
        layers: usize,
        /// Batch size.
        batch: usize,
        /// The rotary embeddings' base.
        rope_base: f64,
    },
    /// A program in the text format (`program = "model.weft"`).
    Program {
        /// The program file (relative paths are resolved against the
        /// config file's directory by [`RunConfig::load`]).
        program: PathBuf,
        /// The function to minimise.
        loss: String,
        /// `[model.init]`: parameter-name patterns and init functions, in
        /// order.
        init: Vec<(String, String)>,
        /// A safetensors file with a tensor per parameter.
        init_from: Option<PathBuf>,
        /// `[model.inputs]`: integer inputs' ranges.
        inputs: BTreeMap<String, InputRange>,
    },
}

/// The range of an integer batch input (`tokens = { max = 256 }`): the
/// synthetic batch draws it uniformly in `0..max`.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct InputRange {
    /// One past the largest value.
    pub max: u64,
}

/// A TOML table read in the order it is written (for rules whose first
/// match wins).
fn ordered<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<(String, String)>, D::Error> {
    struct Visitor;
    impl<'de> serde::de::Visitor<'de> for Visitor {
        type Value = Vec<(String, String)>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a table of quoted name patterns and strings")
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut out = Vec::new();
            while let Some((k, v)) = map.next_entry::<String, String>()? {
                out.push((k, v));
            }
            Ok(out)
        }
    }
    d.deserialize_map(Visitor)
}

/// [`ordered`] for an optional table.
fn ordered_opt<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Vec<(String, String)>>, D::Error> {
    ordered(d).map(Some)
}

/// The `[model]` table as written: every key of every kind, each checked
/// for its type where it stands; [`ModelConfig::try_from`] then takes the
/// keys of `kind` and refuses the others.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelTable {
    kind: Option<String>,
    program: Option<PathBuf>,
    loss: Option<String>,
    #[serde(default, deserialize_with = "ordered_opt")]
    init: Option<Vec<(String, String)>>,
    init_from: Option<PathBuf>,
    inputs: Option<BTreeMap<String, InputRange>>,
    layers: Option<usize>,
    batch: Option<usize>,
    compute: Option<String>,
    d: Option<usize>,
    h: Option<usize>,
    vocab: Option<usize>,
    seq: Option<usize>,
    d_model: Option<usize>,
    heads: Option<usize>,
    dropout: Option<f64>,
    remat: Option<bool>,
    tie_embeddings: Option<bool>,
    experts: Option<usize>,
    top_k: Option<usize>,
    capacity_factor: Option<f64>,
    moe_every: Option<usize>,
    aux_loss_weight: Option<f64>,
    kv_heads: Option<usize>,
    ffn: Option<usize>,
    rope_base: Option<f64>,
}

impl TryFrom<ModelTable> for ModelConfig {
    type Error = String;

    fn try_from(t: ModelTable) -> Result<ModelConfig, String> {
        let (layers, batch, compute) = (t.layers.unwrap_or_else(d_layers), t.batch.unwrap_or_else(d_batch), t.compute);
        let kind = match (t.kind.as_deref(), &t.program) {
            (None | Some("program"), Some(_)) => "program",
            (None, None) => return Err("missing field `kind` (or `program`, the path of a program to train)".into()),
            (Some(k), None) => k,
            (Some(k), Some(_)) => {
                return Err(format!(
                    "`program` trains a program, but model.kind = \"{k}\" is a built-in model; give one or the other"
                ))
            }
        };
        const KINDS: [&str; 4] = ["mlp", "gpt", "llama", "program"];
        if !KINDS.contains(&kind) {
            return Err(format!(
                "unknown variant `{kind}`, expected `mlp`, `gpt` or `llama` (model.kind), or a `program`"
            ));
        }
        // Every key of the table and the kinds that take it.
        let keys: [(&str, bool, &[&str]); 25] = [
            ("layers", t.layers.is_some(), &["mlp", "gpt", "llama"]),
            ("batch", t.batch.is_some(), &["mlp", "gpt", "llama"]),
            ("compute", compute.is_some(), &["mlp", "gpt"]),
            ("d", t.d.is_some(), &["mlp"]),
            ("h", t.h.is_some(), &["mlp"]),
            ("vocab", t.vocab.is_some(), &["gpt", "llama"]),
            ("seq", t.seq.is_some(), &["gpt", "llama"]),
            ("d_model", t.d_model.is_some(), &["gpt", "llama"]),
            ("heads", t.heads.is_some(), &["gpt", "llama"]),
            ("dropout", t.dropout.is_some(), &["gpt"]),
            ("remat", t.remat.is_some(), &["gpt"]),
            ("tie_embeddings", t.tie_embeddings.is_some(), &["gpt"]),
            ("experts", t.experts.is_some(), &["gpt"]),
            ("top_k", t.top_k.is_some(), &["gpt"]),
            ("capacity_factor", t.capacity_factor.is_some(), &["gpt"]),
            ("moe_every", t.moe_every.is_some(), &["gpt"]),
            ("aux_loss_weight", t.aux_loss_weight.is_some(), &["gpt"]),
            ("kv_heads", t.kv_heads.is_some(), &["llama"]),
            ("ffn", t.ffn.is_some(), &["llama"]),
            ("rope_base", t.rope_base.is_some(), &["llama"]),
            ("loss", t.loss.is_some(), &["program"]),
            ("init", t.init.is_some(), &["program"]),
            ("init_from", t.init_from.is_some(), &["program"]),
            ("inputs", t.inputs.is_some(), &["program"]),
            ("program", t.program.is_some(), &["program"]),
        ];
        if let Some((k, _, kinds)) = keys.iter().find(|(_, set, kinds)| *set && !kinds.contains(&kind)) {
            return Err(match (kind, *k) {
                ("program", "compute") => {
                    "unknown field `compute` for a program model: a program's dtypes are its own (convert where it \
                     computes)"
                        .into()
                }
                ("program", "batch") => {
                    "unknown field `batch` for a program model: a program's batch is its inputs' dimension 0".into()
                }
                (_, k) if kinds == &["program"] => {
                    format!("unknown field `{k}`: it is a key of a program model (`program = \"...\"`)")
                }
                ("program", k) => {
                    format!("unknown field `{k}` for a program model: it is a key of the built-in models")
                }
                (_, k) => format!(
                    "unknown field `{k}`: it is a key of model.kind = {}, not \"{kind}\"",
                    kinds.iter().map(|k| format!("\"{k}\"")).collect::<Vec<_>>().join(" or ")
                ),
            });
        }
        if t.experts.is_none() {
            let moe_keys = [
                ("top_k", t.top_k.is_some()),
                ("capacity_factor", t.capacity_factor.is_some()),
                ("moe_every", t.moe_every.is_some()),
                ("aux_loss_weight", t.aux_loss_weight.is_some()),
            ];
            if let Some((k, _)) = moe_keys.iter().find(|(_, set)| *set) {
                return Err(format!(
                    "`{k}` configures the mixture-of-experts blocks, which need `experts` (the experts per block)"
                ));
            }
        }
        Ok(match kind {
            "program" => ModelConfig::Program {
                program: t.program.unwrap_or_default(),
                loss: t.loss.unwrap_or_else(|| "loss".into()),
                init: t.init.unwrap_or_default(),
                init_from: t.init_from,
                inputs: t.inputs.unwrap_or_default(),
            },
            "mlp" => ModelConfig::Mlp {
                layers,
                d: t.d.unwrap_or_else(d_width),
                h: t.h.unwrap_or_else(d_hidden),
                batch,
                compute,
            },
            "gpt" => ModelConfig::Gpt {
                vocab: t.vocab.unwrap_or_else(d_vocab),
                seq: t.seq.unwrap_or_else(d_seq),
                d_model: t.d_model.unwrap_or_else(d_width),
                heads: t.heads.unwrap_or_else(d_heads),
                layers,
                batch,
                dropout: t.dropout.unwrap_or(0.0),
                remat: t.remat.unwrap_or(false),
                compute,
                tie_embeddings: t.tie_embeddings.unwrap_or(false),
                experts: t.experts,
                top_k: t.top_k.unwrap_or(2),
                capacity_factor: t.capacity_factor.unwrap_or(1.25),
                moe_every: t.moe_every.unwrap_or(2),
                aux_loss_weight: t.aux_loss_weight.unwrap_or(0.01),
            },
            _ => {
                let heads = t.heads.unwrap_or(4);
                ModelConfig::Llama {
                    vocab: t.vocab.unwrap_or_else(d_vocab),
                    seq: t.seq.unwrap_or_else(d_seq),
                    d_model: t.d_model.unwrap_or_else(d_width),
                    heads,
                    kv_heads: t.kv_heads.unwrap_or(heads),
                    ffn: t.ffn.unwrap_or(2 * t.d_model.unwrap_or_else(d_width)),
                    layers,
                    batch,
                    rope_base: t.rope_base.unwrap_or(10000.0),
                }
            }
        })
    }
}

fn d_layers() -> usize {
    2
}
fn d_width() -> usize {
    16
}
fn d_hidden() -> usize {
    32
}
fn d_batch() -> usize {
    8
}
fn d_vocab() -> usize {
    32
}
fn d_seq() -> usize {
    8
}
fn d_heads() -> usize {
    2
}

/// Optimizer, schedule and clipping.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct OptimizerConfig {
    /// `sgd` or `adamw`.
    #[serde(default = "d_opt")]
    pub kind: String,
    /// Peak learning rate.
    #[serde(default = "d_lr")]
    pub lr: f64,
    /// SGD momentum.
    #[serde(default)]
    pub momentum: f64,
    /// AdamW weight decay.
    #[serde(default = "d_wd")]
    pub weight_decay: f64,
    /// Linear warmup steps (0: constant rate unless `decay_steps` is set).
    #[serde(default)]
    pub warmup_steps: u64,
    /// Cosine decay end step (0: no decay).
    #[serde(default)]
    pub decay_steps: u64,
    /// Final rate of the cosine decay.
    #[serde(default)]
    pub end_lr: f64,
    /// Global-norm clipping threshold.
    #[serde(default)]
    pub clip: Option<f64>,
    /// Micro-batches per step (gradient accumulation).
    #[serde(default = "d_micro")]
    pub micro_batches: usize,
}

fn d_opt() -> String {
    "sgd".into()
}
fn d_lr() -> f64 {
    0.01
}
fn d_wd() -> f64 {
    1e-4
}
fn d_micro() -> usize {
    1
}

impl Default for OptimizerConfig {
    fn default() -> Self {
        OptimizerConfig {
            kind: d_opt(),
            lr: d_lr(),
            momentum: 0.0,
            weight_decay: d_wd(),
            warmup_steps: 0,
            decay_steps: 0,
            end_lr: 0.0,
            clip: None,
            micro_batches: 1,
        }
    }
}

/// `[loss_scaling]`: dynamic loss scaling as optax/jmp's
/// `DynamicLossScale` and PyTorch's `GradScaler` do it (the loss times the
/// scale is differentiated; a step whose gradients are not all finite is
/// skipped and halves the scale; `period` good steps in a row double it).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LossScalingSection {
    /// The scale of a fresh run.
    #[serde(default = "d_initial_scale")]
    pub initial_scale: f64,
    /// Good steps in a row before the scale doubles.
    #[serde(default = "d_scale_period")]
    pub period: u64,
    /// The smallest scale.
    #[serde(default = "d_min_scale")]
    pub min_scale: f64,
}

fn d_initial_scale() -> f64 {
    LossScaling::default().initial_scale
}
fn d_scale_period() -> u64 {
    LossScaling::default().period as u64
}
fn d_min_scale() -> f64 {
    LossScaling::default().min_scale
}

impl LossScalingSection {
    /// The training step's loss scaling (a validated section).
    pub fn loss_scaling(&self) -> LossScaling {
        LossScaling {
            initial_scale: self.initial_scale,
            period: self.period.min(u32::MAX as u64) as u32,
            min_scale: self.min_scale,
        }
    }
}

/// Checkpointing.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CheckpointConfig {
    /// Directory of the checkpoints (may come from `--checkpoint-dir`).
    #[serde(default)]
    pub dir: PathBuf,
    /// Save every this many steps (and at the end).
    #[serde(default = "d_every")]
    pub every: u64,
    /// Keep the newest N steps.
    #[serde(default = "d_keep")]
    pub keep_last: usize,
    /// Also keep every K-th step.
    #[serde(default)]
    pub keep_every: Option<u64>,
    /// Also save at the first step boundary at least this many seconds
    /// after the last save (process 0's clock decides for a job).
    #[serde(default)]
    pub every_seconds: Option<f64>,
}

fn d_every() -> u64 {
    10
}
fn d_keep() -> usize {
    3
}

fn dtype(s: &Option<String>) -> Result<DType, String> {
    match s.as_deref() {
        None => Ok(DType::F32),
        Some(n) => match DType::from_name(n) {
            Some(d) if d.is_float() => Ok(d),
            _ => Err(format!("compute dtype `{n}` must be one of f32, bf16, f16, f64")),
        },
    }
}

impl ModelConfig {
    /// The model this table describes: a built-in one, or the program it
    /// names (read, verified and checked against the loss contract).
    pub fn model(&self) -> crate::Result<crate::models::Model> {
        use crate::models::{init, model, Init, Model};
        if let Some(cfg) = self.mlp().map_err(crate::Error::Usage)? {
            return Ok(Model::mlp(&cfg));
        }
        if let Some(cfg) = self.gpt().map_err(crate::Error::Usage)? {
            return Ok(Model::gpt(&cfg));
        }
        if let Some(cfg) = self.llama() {
            cfg.check().map_err(|message| crate::Error::Model { what: "[model]".into(), message })?;
            return Ok(Model::llama(&cfg));
        }
        let ModelConfig::Program { program, loss, init, init_from, inputs } = self else {
            unreachable!("four kinds of model table")
        };
        let module = model::load_program(program)?;
        let err = |message: String| crate::Error::Model { what: "[model]".into(), message };
        let init = match init_from {
            Some(_) if !init.is_empty() => {
                return Err(err("give either [model.init] rules or init_from, not both".into()));
            }
            Some(p) => Init::File(p.clone()),
            None => {
                let pairs = init.iter().map(|(p, f)| (p.as_str(), f.as_str()));
                Init::Rules(init::parse_rules(pairs).map_err(|e| err(format!("[model.init] {e}")))?)
            }
        };
        let mut m = Model::program(format!("program {}", program.display()), module, loss, init)?;
        m.set_int_ranges(inputs.iter().map(|(n, r)| (n.as_str(), r.max)), "[model.inputs]")?;
        Ok(m)
    }

    /// The Llama sizes, if this is the Llama-style decoder.
    pub fn llama(&self) -> Option<crate::models::llama::LlamaConfig> {
        match *self {
            ModelConfig::Llama { vocab, seq, d_model, heads, kv_heads, ffn, layers, batch, rope_base } => {
                Some(crate::models::llama::LlamaConfig {
                    vocab,
                    seq,
                    d_model,
                    heads,
                    kv_heads,
                    ffn,
                    layers,
                    batch,
                    rope_base,
                })
            }
            _ => None,
        }
    }

    /// The MLP sizes, if this is the MLP.
    pub fn mlp(&self) -> Result<Option<MlpConfig>, String> {
        Ok(match self {
            ModelConfig::Mlp { layers, d, h, batch, compute } => {
                Some(MlpConfig { layers: *layers, d: *d, h: *h, batch: *batch, compute: dtype(compute)? })
            }
            _ => None,
        })
    }

    /// The GPT sizes, if this is the GPT.
    pub fn gpt(&self) -> Result<Option<GptConfig>, String> {
        Ok(match self {
            ModelConfig::Gpt {
                vocab,
                seq,
                d_model,
                heads,
                layers,
                batch,
                dropout,
                remat,
                compute,
                tie_embeddings,
                experts,
                top_k,
                capacity_factor,
                moe_every,
                aux_loss_weight,
            } => {
                // Ranges and cross-checks: `validate` (and the builder).
                Some(GptConfig {
                    vocab: *vocab,
                    seq: *seq,
                    d_model: *d_model,
                    heads: *heads,
                    layers: *layers,
                    batch: *batch,
                    dropout: *dropout,
                    remat: *remat,
                    compute: dtype(compute)?,
                    tie_embeddings: *tie_embeddings,
                    moe: experts.map(|experts| crate::models::gpt::MoeBlocks {
                        experts,
                        top_k: *top_k,
                        capacity_factor: *capacity_factor,
                        every: *moe_every,
                        aux_loss_weight: *aux_loss_weight,
                    }),
                })
            }
            _ => None,
        })
    }
}

impl OptimizerConfig {
    /// The training-step configuration (without sharding overrides).
    pub fn train_config(&self) -> Result<TrainConfig, String> {
        let optimizer = match self.kind.as_str() {
            "sgd" => Optimizer::Sgd { momentum: self.momentum, nesterov: false },
            "adamw" => Optimizer::AdamW { b1: 0.9, b2: 0.999, eps: 1e-8, weight_decay: self.weight_decay },
            other => return Err(format!("optimizer kind `{other}` must be `sgd` or `adamw`")),
        };
        let schedule = if self.warmup_steps == 0 && self.decay_steps == 0 {
            Schedule::Constant(self.lr)
        } else {
            Schedule::WarmupCosine {
                init: 0.0,
                peak: self.lr,
                warmup_steps: self.warmup_steps,
                decay_steps: self.decay_steps.max(self.warmup_steps),
                end: self.end_lr,
            }
        };
        Ok(TrainConfig {
            optimizer,
            schedule,
            clip_global_norm: self.clip,
            micro_batches: self.micro_batches,
            ..Default::default()
        })
    }
}

impl RunConfig {
    /// The training-step configuration: the optimizer's, with the loss
    /// scaling (without sharding overrides).
    pub fn train_config(&self) -> Result<TrainConfig, String> {
        let mut tc = self.optimizer.train_config()?;
        tc.loss_scaling = self.loss_scaling.as_ref().map(LossScalingSection::loss_scaling);
        Ok(tc)
    }

    /// The `[shardings]` rules, parsed (a sharding that does not parse is
    /// an error naming its pattern).
    pub fn sharding_rules(&self) -> crate::Result<crate::models::rules::Rules<weft_ir::TensorSharding>> {
        let rules: crate::Result<Vec<_>> = self
            .shardings
            .iter()
            .map(|(pat, text)| {
                let s = weft_ir::text::parse_sharding(text).map_err(|e| crate::Error::Model {
                    what: "[shardings]".into(),
                    message: format!("\"{pat}\" = \"{text}\": {e}"),
                })?;
                Ok((pat.clone(), s))
            })
            .collect();
        Ok(crate::models::rules::Rules::new(rules?))
    }

    /// The micro-batches of a step: `pipeline.microbatches` under
    /// `[pipeline]`, else `optimizer.micro_batches` (at least 1). A
    /// program's batch inputs are one of them.
    pub fn step_micro_batches(&self) -> usize {
        self.pipeline.as_ref().map_or(self.optimizer.micro_batches, |p| p.microbatches).max(1)
    }

    /// The loss scale a fresh state starts from (1 without loss scaling).
    pub fn initial_loss_scale(&self) -> f64 {
        self.loss_scaling.as_ref().map_or(1.0, |l| l.initial_scale)
    }

    /// The chunk count of mesh-invariant sums (`sum_chunks`, default 8), or
    /// `None` when `mesh_invariant` is off.
    pub fn mesh_invariant_chunks(&self) -> Option<usize> {
        self.mesh_invariant.then(|| self.sum_chunks.unwrap_or(SumChunks::DEFAULT.get()))
    }

    /// Parses a TOML config.
    pub fn from_toml(text: &str) -> Result<RunConfig, String> {
        toml::from_str(text).map_err(|e| e.to_string())
    }

    /// Reads a config file: parses it, and resolves the model's files
    /// (`program`, `init_from`) against the file's directory.
    pub fn load(path: &Path) -> crate::Result<RunConfig> {
        let text = crate::error::read_to_string(path)?;
        let mut c = RunConfig::from_toml(&text).map_err(|e| crate::Error::Usage(format!("{}: {e}", path.display())))?;
        c.resolve_paths(path.parent().unwrap_or(Path::new("")));
        Ok(c)
    }

    /// Makes the model's relative file paths relative to `base` instead.
    pub fn resolve_paths(&mut self, base: &Path) {
        if let ModelConfig::Program { program, init_from, .. } = &mut self.model {
            for p in std::iter::once(program).chain(init_from.as_mut()) {
                if p.is_relative() && !p.as_os_str().is_empty() {
                    // Lexically: `configs/../models/m.weft` is `models/m.weft`.
                    let mut out = PathBuf::new();
                    for c in base.join(&*p).components() {
                        match c {
                            std::path::Component::ParentDir
                                if matches!(out.components().next_back(), Some(std::path::Component::Normal(_))) =>
                            {
                                out.pop();
                            }
                            std::path::Component::CurDir => {}
                            c => out.push(c),
                        }
                    }
                    *p = out;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rules whose first match wins keep the order they are written in.
    #[test]
    fn rule_tables_keep_their_order() {
        let c = RunConfig::from_toml(
            "steps = 1\n[model]\nprogram = \"m.weft\"\n[model.init]\n\"z.*\" = \"zeros\"\n\"a.*\" = \"ones\"\n\"m\" = \"fan_in\"\n\
             [shardings]\n\"y\" = \"[{}]\"\n\"b\" = \"[]\"\n",
        )
        .unwrap();
        let ModelConfig::Program { init, .. } = &c.model else { panic!("a program model") };
        let keys: Vec<&str> = init.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["z.*", "a.*", "m"]);
        assert_eq!(c.shardings.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(), ["y", "b"]);
    }

    #[test]
    fn program_paths_resolve_against_the_config_file() {
        let mut c =
            RunConfig::from_toml("steps = 1\n[model]\nprogram = \"../models/m.weft\"\ninit_from = \"i.safetensors\"\n")
                .unwrap();
        c.resolve_paths(Path::new("examples/configs"));
        let ModelConfig::Program { program, init_from, .. } = &c.model else { panic!("a program model") };
        assert_eq!(program, Path::new("examples/models/m.weft"));
        assert_eq!(init_from.as_deref(), Some(Path::new("examples/configs/i.safetensors")));
    }
}

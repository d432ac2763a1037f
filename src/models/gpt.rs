//! A GPT-style decoder: token and position embeddings, `layers` pre-norm
//! blocks of causal multi-head self-attention and a GELU MLP, a final layer
//! norm, an unembedding and softmax cross-entropy on next-token targets.
//! With `tie_embeddings` (GPT-2's choice) the unembedding is the token
//! embedding transposed instead of a parameter `lm_head` of its own.
//!
//! Each block is its own function `@block`, called once per layer; with
//! `remat` the calls are marked for rematerialisation (activation
//! checkpointing), so the backward pass recomputes each block's activations.
//!
//! With `moe`, every `every`-th block's MLP is a mixture of experts
//! (`@moe_block`, the builder's [`FunctionBuilder::moe`] on the batch's
//! sequences as routing groups): its expert weights `moe.w1[E, C, 4C]`
//! and `moe.w2[E, 4C, C]` carry the expert first, so an `expert` mesh axis
//! splits them (the model's expert rules) while it splits the batch too,
//! and the partitioner exchanges the tokens with all-to-alls. The loss adds
//! Switch's load-balancing loss (weight `aux_loss_weight`, by default
//! Switch's 0.01, averaged over the MoE blocks); the step's metrics gain
//! `aux_loss`, `moe_dropped` (the share of assignments over capacity) and
//! `moe_load_{e}` (each expert's share of the assignments).

use super::{filled, normal_init, Shardings};
use std::collections::BTreeMap;
use weft_ir::builder::{FunctionBuilder, ModuleBuilder, Value};
use weft_ir::prng::Key;
use weft_ir::tensor::HostTensor;
use weft_ir::{DType, IrError, Module};

/// Sizes and options of the decoder.
#[derive(Clone, Debug, PartialEq)]
pub struct GptConfig {
    /// Vocabulary size V.
    pub vocab: usize,
    /// Sequence length T.
    pub seq: usize,
    /// Model width C.
    pub d_model: usize,
    /// Attention heads (must divide C).
    pub heads: usize,
    /// Number of blocks.
    pub layers: usize,
    /// Batch size B.
    pub batch: usize,
    /// Dropout rate on attention probabilities and residual branches
    /// (0 disables dropout and the `rng` input).
    pub dropout: f64,
    /// Recompute each block's activations in the backward pass.
    pub remat: bool,
    /// Dtype of the computation (parameters stay f32).
    pub compute: DType,
    /// Unembed with `wteᵀ` (no `lm_head` parameter).
    pub tie_embeddings: bool,
    /// Mixture-of-experts blocks, if any.
    pub moe: Option<MoeBlocks>,
}

/// Which blocks are mixtures of experts, and how they route.
#[derive(Clone, Debug, PartialEq)]
pub struct MoeBlocks {
    /// Experts per MoE block.
    pub experts: usize,
    /// Experts per token.
    pub top_k: usize,
    /// Capacity per expert and sequence, as a multiple of an even share
    /// (`ceil(top_k · seq · factor / experts)`).
    pub capacity_factor: f64,
    /// Every `every`-th block (the 2nd, 4th, ... for 2) is a MoE block.
    pub every: usize,
    /// The weight of the load-balancing loss in the loss (Switch
    /// Transformer's α, 0.01 there).
    pub aux_loss_weight: f64,
}

impl GptConfig {
    /// Whether block `i` (from 0) is a mixture of experts.
    pub fn is_moe(&self, i: usize) -> bool {
        self.moe.as_ref().is_some_and(|m| (i + 1) % m.every.max(1) == 0)
    }
}

impl Default for GptConfig {
    fn default() -> Self {
        GptConfig {
            vocab: 32,
            seq: 8,
            d_model: 16,
            heads: 2,
            layers: 2,
            batch: 2,
            dropout: 0.0,
            remat: false,
            compute: DType::F32,
            tie_embeddings: false,
            moe: None,
        }
    }
}

/// The parameter suffixes and shapes of block `i` (a MoE block's MLP is
/// its router and expert weights).
fn block_params(cfg: &GptConfig, i: usize) -> Vec<(&'static str, Vec<usize>)> {
    let c = cfg.d_model;
    let mut v = vec![
        ("ln1.g", vec![c]),
        ("ln1.b", vec![c]),
        // `[C, 3, C]`: q, k and v side by side, so a split of the last
        // dimension over `model` gives each device whole heads of all three
        // (Megatron's layout; a split of a flat `3C` would cut across them).
        ("attn.wqkv", vec![c, 3, c]),
        ("attn.wo", vec![c, c]),
        ("ln2.g", vec![c]),
        ("ln2.b", vec![c]),
    ];
    match (&cfg.moe, cfg.is_moe(i)) {
        (Some(m), true) => v.extend([
            ("moe.router", vec![c, m.experts]),
            ("moe.w1", vec![m.experts, c, 4 * c]),
            ("moe.w2", vec![m.experts, 4 * c, c]),
        ]),
        _ => v.extend([
            ("mlp.w1", vec![c, 4 * c]),
            ("mlp.b1", vec![4 * c]),
            ("mlp.w2", vec![4 * c, c]),
            ("mlp.b2", vec![c]),
        ]),
    }
    v
}

/// Every parameter's name and shape, in the order of `@loss`'s parameters.
pub fn param_shapes(cfg: &GptConfig) -> Vec<(String, Vec<usize>)> {
    let (v, t, c) = (cfg.vocab, cfg.seq, cfg.d_model);
    let mut out = vec![("params.wte".to_string(), vec![v, c]), ("params.wpe".to_string(), vec![t, c])];
    for i in 0..cfg.layers {
        for (s, shape) in block_params(cfg, i) {
            out.push((format!("params.h.{i}.{s}"), shape));
        }
    }
    out.push(("params.ln_f.g".into(), vec![c]));
    out.push(("params.ln_f.b".into(), vec![c]));
    if !cfg.tie_embeddings {
        out.push(("params.lm_head".into(), vec![c, v]));
    }
    out
}

/// `@block` (or, for block `i` a mixture of experts, `@moe_block`, which
/// also returns its load-balancing loss, dropped share and loads).
fn build_block(cfg: &GptConfig, mb: &ModuleBuilder, i: usize) -> FunctionBuilder {
    let (b, t, c, nh) = (cfg.batch, cfg.seq, cfg.d_model, cfg.heads);
    let hd = c / nh;
    let f = mb.function(if cfg.is_moe(i) { "moe_block" } else { "block" });
    let x = f.param("x", cfg.compute, &[b, t, c]);
    let ps: Vec<Value> = block_params(cfg, i).iter().map(|(s, shape)| f.param(s, DType::F32, shape)).collect();
    let key = (cfg.dropout > 0.0).then(|| f.param("key", DType::U32, &[2]));
    let w = |i: usize| f.convert(ps[i], cfg.compute);
    let drop = |v: Value, k: u32| match key {
        Some(key) => f.dropout(v, f.fold_in(key, f.scalar(DType::U32, k as f64)), cfg.dropout),
        None => v,
    };
    // Attention.
    let h = f.layer_norm(x, Some(w(0)), Some(w(1)), -1, 1e-5);
    let qkv_dims = weft_ir::DotDims { lhs_contract: vec![2], rhs_contract: vec![0], ..Default::default() };
    let parts = f.split(f.dot_general(h, w(2), qkv_dims), 2, 3);
    let heads = |v: Value| f.transpose(f.reshape(v, &[b, t, nh, hd]), &[0, 2, 1, 3]);
    let (q, k, v) = (heads(parts[0]), heads(parts[1]), heads(parts[2]));
    let scores = f.mul_scalar(f.matmul(q, f.swap_axes(k, -1, -2)), 1.0 / (hd as f64).sqrt());
    let masked = f.masked_fill(scores, f.not(f.causal_mask(t)), f64::NEG_INFINITY);
    let probs = drop(f.softmax(masked, -1), 0);
    let y = f.reshape(f.transpose(f.matmul(probs, v), &[0, 2, 1, 3]), &[b, t, c]);
    let x = f.name(f.add(x, drop(f.linear(y, w(3), None), 1)), "residual.attn");
    // MLP.
    let h = f.layer_norm(x, Some(w(4)), Some(w(5)), -1, 1e-5);
    match &cfg.moe {
        Some(m) if cfg.is_moe(i) => {
            let out = f.moe(h, w(6), w(7), w(8), m.top_k, m.capacity_factor);
            let x = f.name(f.add(x, drop(out.y, 2)), "residual.mlp");
            let f32 = |v: Value| f.convert(v, DType::F32);
            f.set_results(&[x, f32(out.aux_loss), f32(out.dropped), f32(out.load)]);
        }
        _ => {
            let a = f.gelu(f.linear(h, w(6), Some(w(7))));
            let x = f.name(f.add(x, drop(f.linear(a, w(8), Some(w(9))), 2)), "residual.mlp");
            f.set_results(&[x]);
        }
    }
    f
}

/// Builds the module with `@block` and `@loss(params..., [rng: u32[2]],
/// tokens: i32[B,T], targets: i32[B,T]) -> (loss f32[], accuracy f32[])`.
pub fn build(cfg: &GptConfig, shardings: &Shardings) -> Result<Module, IrError> {
    if cfg.heads == 0 || cfg.d_model % cfg.heads != 0 {
        return Err(IrError::Builder(format!("heads ({}) must divide d_model ({})", cfg.heads, cfg.d_model)));
    }
    let mut mb = ModuleBuilder::new();
    if let Some(m) = &cfg.moe {
        if m.experts == 0 || m.every == 0 || m.every > cfg.layers {
            return Err(IrError::Builder(format!(
                "MoE blocks need experts >= 1 and 1 <= moe_every <= layers ({}), got {} and {}",
                cfg.layers, m.experts, m.every
            )));
        }
    }
    // One function per kind of block the model has.
    for i in (0..cfg.layers).filter(|&i| i == 0 || cfg.is_moe(i) != cfg.is_moe(0)).take(2) {
        mb.add(build_block(cfg, &mb, i));
    }
    let f = mb.function("loss");
    let p = |name: &str, dtype: DType, shape: &[usize]| match shardings.get(name) {
        Some(s) => f.param_sharded(name, dtype, shape, s.clone()),
        None => f.param(name, dtype, shape),
    };
    let params: BTreeMap<String, Value> =
        param_shapes(cfg).into_iter().map(|(n, s)| (n.clone(), p(&n, DType::F32, &s))).collect();
    let rng = (cfg.dropout > 0.0).then(|| p("rng", DType::U32, &[2]));
    let tokens = p("tokens", DType::I32, &[cfg.batch, cfg.seq]);
    let targets = p("targets", DType::I32, &[cfg.batch, cfg.seq]);
    let w = |n: &str| f.convert(params[n], cfg.compute);
    let embedded = f
        .add(f.embedding(tokens, w("params.wte")), f.broadcast_to(w("params.wpe"), &[cfg.batch, cfg.seq, cfg.d_model]));
    let mut x = f.name(embedded, "residual.embed");
    let mut moe_stats: Vec<[Value; 3]> = Vec::new();
    for i in 0..cfg.layers {
        let mut args = vec![x];
        args.extend(block_params(cfg, i).iter().map(|(s, _)| params[&format!("params.h.{i}.{s}")]));
        if let Some(rng) = rng {
            args.push(f.fold_in(rng, f.scalar(DType::U32, i as f64)));
        }
        if cfg.is_moe(i) {
            let r = if cfg.remat { f.call_remat_n::<4>("moe_block", &args) } else { f.call_n::<4>("moe_block", &args) };
            x = r[0];
            moe_stats.push([r[1], r[2], r[3]]);
        } else {
            x = if cfg.remat { f.call_remat_n::<1>("block", &args)[0] } else { f.call_n::<1>("block", &args)[0] };
        }
    }
    let x = f.layer_norm(x, Some(w("params.ln_f.g")), Some(w("params.ln_f.b")), -1, 1e-5);
    let unembed = match cfg.tie_embeddings {
        true => f.transpose(w("params.wte"), &[1, 0]),
        false => w("params.lm_head"),
    };
    let logits = f.convert(f.linear(x, unembed, None), DType::F32);
    let mut loss = f.softmax_cross_entropy(logits, targets);
    let acc = f.name(f.accuracy(logits, targets), "accuracy");
    let mut results = vec![loss, acc];
    if let (Some(m), false) = (&cfg.moe, moe_stats.is_empty()) {
        // Means over the MoE blocks.
        let n = moe_stats.len() as f64;
        let mean = |k: usize| {
            let total = moe_stats[1..].iter().fold(moe_stats[0][k], |acc, st| f.add(acc, st[k]));
            f.div_scalar(total, n)
        };
        let aux = mean(0);
        loss = f.add(loss, f.mul_scalar(aux, m.aux_loss_weight));
        results[0] = loss;
        results.push(f.name(aux, "aux_loss"));
        results.push(f.name(mean(1), "moe_dropped"));
        let load = mean(2);
        for e in 0..m.experts {
            let share = f.reshape(f.slice(load, &[e], &[e + 1]), &[]);
            results.push(f.name(share, &format!("moe_load_{e}")));
        }
    }
    f.set_results(&results);
    mb.add(f);
    mb.finish()
}

/// Deterministic initial parameters from `seed` (GPT-2 style: N(0, 0.02)
/// weights, unit layer-norm gains, zero biases).
pub fn init(cfg: &GptConfig, seed: u64) -> BTreeMap<String, HostTensor> {
    let key = Key::from_seed(seed);
    param_shapes(cfg)
        .into_iter()
        .enumerate()
        .map(|(i, (name, shape))| {
            let t = if name.ends_with(".g") {
                filled(&shape, 1.0)
            } else if name.ends_with(".b") || name.ends_with(".b1") || name.ends_with(".b2") {
                filled(&shape, 0.0)
            } else {
                normal_init(key.fold_in(i as u32), &shape, 0.02)
            };
            (name, t)
        })
        .collect()
}

/// A fixed synthetic batch: `tokens` from `seed`, `targets` = tokens
/// shifted left by one (the last position predicts token 0).
pub fn synthetic_batch(cfg: &GptConfig, seed: u64) -> BTreeMap<String, HostTensor> {
    let bits = Key::from_seed(seed).fold_in(0x70C).random_bits(cfg.batch * cfg.seq);
    let toks: Vec<i32> = bits.iter().map(|b| (b % cfg.vocab as u32) as i32).collect();
    let tgts: Vec<i32> = (0..cfg.batch)
        .flat_map(|b| {
            let row = &toks[b * cfg.seq..(b + 1) * cfg.seq];
            (0..cfg.seq).map(move |j| if j + 1 < row.len() { row[j + 1] } else { 0 })
        })
        .collect();
    BTreeMap::from([
        ("tokens".to_string(), HostTensor::from_i32(&[cfg.batch, cfg.seq], toks).expect("shape")),
        ("targets".to_string(), HostTensor::from_i32(&[cfg.batch, cfg.seq], tgts).expect("shape")),
    ])
}

impl super::model::Architecture for GptConfig {
    fn module(&self, micro_batches: usize) -> crate::Result<Module> {
        let micro = GptConfig { batch: self.batch / micro_batches.max(1), ..self.clone() };
        Ok(build(&micro, &Shardings::new())?)
    }
    fn eval_module(&self) -> crate::Result<Module> {
        Ok(build(&GptConfig { dropout: 0.0, remat: false, ..self.clone() }, &Shardings::new())?)
    }
    fn synthetic_batch(&self, _micro_batches: usize, seed: u64) -> Option<BTreeMap<String, HostTensor>> {
        Some(synthetic_batch(self, seed))
    }
    fn init_rules(&self) -> Vec<(String, super::init::InitFn)> {
        use super::init::InitFn;
        vec![
            ("params.*.g".into(), InitFn::Ones),
            ("params.*.b".into(), InitFn::Zeros),
            ("params.*.b1".into(), InitFn::Zeros),
            ("params.*.b2".into(), InitFn::Zeros),
            ("params.*".into(), InitFn::Normal(0.02)),
        ]
    }
    fn element_counts(&self) -> Option<super::ElementCounts> {
        use super::elements as mul;
        let GptConfig { vocab, seq, d_model, heads, layers, batch, tie_embeddings, .. } = *self;
        let c2 = mul(&[d_model, d_model]);
        // Per block: 12 C^2 weights and 9 C gains and biases.
        let block = c2.saturating_mul(12).saturating_add(mul(&[9, d_model]));
        let params = mul(&[layers])
            .saturating_mul(block)
            .saturating_add(mul(&[if tie_embeddings { 1 } else { 2 }, vocab, d_model]))
            .saturating_add(mul(&[seq, d_model]))
            .saturating_add(mul(&[2, d_model]));
        let tokens = mul(&[batch, seq]);
        // Per block: about 16 C values per token (qkv, attention out, MLP 4C
        // twice, norms) and the heads x T x T attention scores and
        // probabilities; then the logits and their softmax.
        let per_block = tokens.saturating_mul(mul(&[16, d_model])).saturating_add(mul(&[2, batch, heads, seq, seq]));
        let activations =
            mul(&[layers]).saturating_mul(per_block).saturating_add(tokens.saturating_mul(mul(&[2, vocab])));
        Some(super::ElementCounts { params, batch: tokens.saturating_mul(2), activations })
    }
}

/// Megatron's tensor-parallel split of the GPT: the QKV projection and the
/// MLP's first layer (and its bias) column-parallel, the attention output
/// and the MLP's second layer row-parallel; the token embedding split over
/// the vocabulary (each device gathers the ids in its rows, an all-reduce
/// adds them: Megatron's vocabulary-parallel embedding) and the head
/// likewise (the cross-entropy reads the target's logit where it lives and
/// never gathers the logits); position embeddings and norms replicated.
/// The residual stream (`residual.*`, `[batch, seq, C]`) is split by
/// position: Megatron's sequence parallelism (Korthikanti et al. 2022), so
/// the layer norms, residual adds and dropouts between the parallel
/// layers run on a quarter of the positions each on `model=4` instead of
/// every device repeating them, and each row-parallel layer's all-reduce
/// becomes a reduce-scatter, each column-parallel layer's input an
/// all-gather.
pub fn tp_rules() -> super::rules::Rules<weft_ir::TensorSharding> {
    use weft_ir::TensorSharding as S;
    let col = || S::new(&[&[], &["model"]]);
    let row = || S::new(&[&["model"], &[]]);
    super::rules::Rules::new([
        ("params.h.*.attn.wqkv".to_string(), S::new(&[&[], &[], &["model"]])),
        ("params.h.*.mlp.w1".to_string(), col()),
        ("params.h.*.mlp.b1".to_string(), S::new(&[&["model"]])),
        ("params.h.*.attn.wo".to_string(), row()),
        ("params.h.*.mlp.w2".to_string(), row()),
        ("params.wte".to_string(), row()),
        ("params.lm_head".to_string(), col()),
        // A MoE block's experts: their hidden units, as the dense MLP's.
        ("params.h.*.moe.w1".to_string(), S::new(&[&[], &[], &["model"]])),
        ("params.h.*.moe.w2".to_string(), S::new(&[&[], &["model"], &[]])),
        ("residual.*".to_string(), sequence_parallel()),
    ])
}

/// `[{?}, {model}, {}]`: a `[batch, seq, C]` activation split over `model`
/// by position, its batch dimension left to propagation.
pub(crate) fn sequence_parallel() -> weft_ir::TensorSharding {
    use weft_ir::DimSharding;
    weft_ir::TensorSharding {
        dims: vec![DimSharding::open(&[]), DimSharding::closed(&["model"]), DimSharding::closed(&[])],
        unreduced: Vec::new(),
    }
}

/// Expert parallelism: a MoE block's expert weights split over the
/// `expert` axis by expert.
pub fn expert_rules() -> super::rules::Rules<weft_ir::TensorSharding> {
    let by_expert = || weft_ir::TensorSharding::new(&[&["expert"], &[], &[]]);
    super::rules::Rules::new([
        ("params.h.*.moe.w1".to_string(), by_expert()),
        ("params.h.*.moe.w2".to_string(), by_expert()),
    ])
}

impl super::Model {
    /// The built-in GPT as a model: its own seeded initialisation,
    /// Megatron's split as its tensor-parallel rules, token ids below the
    /// vocabulary.
    pub fn gpt(cfg: &GptConfig) -> super::Model {
        let init_cfg = cfg.clone();
        super::Model {
            label: "gpt".into(),
            arch: std::sync::Arc::new(cfg.clone()),
            loss: "loss".into(),
            init: super::Init::Seeded(std::sync::Arc::new(move |seed| init(&init_cfg, seed))),
            tp_rules: tp_rules(),
            expert_rules: expert_rules(),
            int_max: ["tokens", "targets"].into_iter().map(|n| (n.to_string(), cfg.vocab as u64)).collect(),
        }
    }
}

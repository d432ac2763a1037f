//! A Llama-style decoder built from today's layers: token embeddings (no
//! position table), `layers` pre-norm blocks of RMSNorm, grouped-query
//! causal attention with rotary position embeddings, and a SwiGLU MLP; a
//! final RMSNorm, an unembedding and softmax cross-entropy on next-token
//! targets. Each block is its own function `@block`, called once per layer
//! (so `[pipeline]` can cut between blocks).
//!
//! It is an ordinary model: its initialisation is `[model.init]`-style
//! rules (norm gains one, every other parameter N(0, 0.02), drawn by name)
//! and its tensor parallelism is sharding rules (Megatron's split:
//! the Q/K/V projections and the MLP's gate and up projections
//! column-parallel, the attention output and the MLP's down projection
//! row-parallel).

use super::init::InitFn;
use super::rules::Rules;
use std::collections::BTreeMap;
use weft_ir::builder::{FunctionBuilder, ModuleBuilder, Value};
use weft_ir::prng::Key;
use weft_ir::tensor::HostTensor;
use weft_ir::{DType, IrError, Module, TensorSharding};

/// Sizes of the decoder.
#[derive(Clone, Debug, PartialEq)]
pub struct LlamaConfig {
    /// Vocabulary size V.
    pub vocab: usize,
    /// Sequence length T.
    pub seq: usize,
    /// Model width C.
    pub d_model: usize,
    /// Query heads H (divides C).
    pub heads: usize,
    /// Key/value heads (divides H; H for multi-head attention).
    pub kv_heads: usize,
    /// The MLP's hidden width F.
    pub ffn: usize,
    /// Blocks.
    pub layers: usize,
    /// Batch size B.
    pub batch: usize,
    /// The rotary embeddings' base (10000 in Llama 2).
    pub rope_base: f64,
}

impl Default for LlamaConfig {
    fn default() -> Self {
        LlamaConfig {
            vocab: 32,
            seq: 8,
            d_model: 16,
            heads: 4,
            kv_heads: 2,
            ffn: 32,
            layers: 2,
            batch: 2,
            rope_base: 10000.0,
        }
    }
}

impl LlamaConfig {
    fn head_dim(&self) -> usize {
        self.d_model / self.heads.max(1)
    }

    /// Why these sizes cannot make a model, if they cannot.
    pub fn check(&self) -> Result<(), String> {
        if self.heads == 0 || self.d_model % self.heads != 0 {
            return Err(format!("heads ({}) must divide d_model ({})", self.heads, self.d_model));
        }
        if self.kv_heads == 0 || self.heads % self.kv_heads != 0 {
            return Err(format!("kv_heads ({}) must divide heads ({})", self.kv_heads, self.heads));
        }
        if self.head_dim() % 2 != 0 {
            return Err(format!(
                "the head width d_model / heads = {} must be even (rotary embeddings)",
                self.head_dim()
            ));
        }
        Ok(())
    }
}

fn block_params(cfg: &LlamaConfig) -> Vec<(&'static str, Vec<usize>)> {
    let (c, f, kv) = (cfg.d_model, cfg.ffn, cfg.kv_heads * cfg.head_dim());
    vec![
        ("attn_norm.g", vec![c]),
        ("attn.wq", vec![c, c]),
        ("attn.wk", vec![c, kv]),
        ("attn.wv", vec![c, kv]),
        ("attn.wo", vec![c, c]),
        ("mlp_norm.g", vec![c]),
        ("mlp.w_gate", vec![c, f]),
        ("mlp.w_up", vec![c, f]),
        ("mlp.w_down", vec![f, c]),
    ]
}

/// Every parameter's name and shape, in the order of `@loss`'s parameters.
pub fn param_shapes(cfg: &LlamaConfig) -> Vec<(String, Vec<usize>)> {
    let mut out = vec![("params.wte".to_string(), vec![cfg.vocab, cfg.d_model])];
    for i in 0..cfg.layers {
        out.extend(block_params(cfg).into_iter().map(|(s, shape)| (format!("params.h.{i}.{s}"), shape)));
    }
    out.push(("params.norm_f.g".into(), vec![cfg.d_model]));
    out.push(("params.lm_head".into(), vec![cfg.d_model, cfg.vocab]));
    out
}

fn build_block(cfg: &LlamaConfig, mb: &ModuleBuilder) -> FunctionBuilder {
    let (b, t, c, h, kv, hd) = (cfg.batch, cfg.seq, cfg.d_model, cfg.heads, cfg.kv_heads, cfg.head_dim());
    let f = mb.function("block");
    let x = f.param("x", DType::F32, &[b, t, c]);
    let p: Vec<Value> = block_params(cfg).iter().map(|(s, shape)| f.param(s, DType::F32, shape)).collect();
    let heads = |v: Value, n: usize| f.transpose(f.reshape(v, &[b, t, n, hd]), &[0, 2, 1, 3]);
    let a = f.rms_norm(x, Some(p[0]), -1, 1e-5);
    let q = f.rotary_embedding(heads(f.matmul(a, p[1]), h), cfg.rope_base);
    let k = f.rotary_embedding(heads(f.matmul(a, p[2]), kv), cfg.rope_base);
    let v = heads(f.matmul(a, p[3]), kv);
    let y = f.reshape(f.transpose(f.grouped_query_attention(q, k, v, true), &[0, 2, 1, 3]), &[b, t, c]);
    let x = f.name(f.add(x, f.matmul(y, p[4])), "residual.attn");
    let m = f.rms_norm(x, Some(p[5]), -1, 1e-5);
    let x = f.name(f.add(x, f.swiglu(m, p[6], p[7], p[8])), "residual.mlp");
    f.set_results(&[x]);
    f
}

/// Builds the module with `@block` and `@loss(params..., tokens: i32[B,T],
/// targets: i32[B,T]) -> (loss f32[], accuracy f32[])`.
pub fn build(cfg: &LlamaConfig) -> Result<Module, IrError> {
    cfg.check().map_err(IrError::Builder)?;
    let mut mb = ModuleBuilder::new();
    let block = build_block(cfg, &mb);
    mb.add(block);
    let f = mb.function("loss");
    let params: BTreeMap<String, Value> =
        param_shapes(cfg).into_iter().map(|(n, s)| (n.clone(), f.param(&n, DType::F32, &s))).collect();
    let tokens = f.param("tokens", DType::I32, &[cfg.batch, cfg.seq]);
    let targets = f.param("targets", DType::I32, &[cfg.batch, cfg.seq]);
    let mut x = f.name(f.embedding(tokens, params["params.wte"]), "residual.embed");
    for i in 0..cfg.layers {
        let mut args = vec![x];
        args.extend(block_params(cfg).iter().map(|(s, _)| params[&format!("params.h.{i}.{s}")]));
        x = f.call_n::<1>("block", &args)[0];
    }
    let x = f.rms_norm(x, Some(params["params.norm_f.g"]), -1, 1e-5);
    let logits = f.matmul(x, params["params.lm_head"]);
    let loss = f.softmax_cross_entropy(logits, targets);
    let acc = f.name(f.accuracy(logits, targets), "accuracy");
    f.set_results(&[loss, acc]);
    mb.add(f);
    mb.finish()
}

/// The initialisation rules: norm gains one, the rest N(0, 0.02).
pub fn init_rules() -> Rules<InitFn> {
    Rules::new([("params.*.g".to_string(), InitFn::Ones), ("params.*".to_string(), InitFn::Normal(0.02))])
}

/// The tensor-parallel rules (Megatron's split, and the residual stream
/// split by position: sequence parallelism, as the GPT's).
pub fn tp_rules() -> Rules<TensorSharding> {
    let col = || TensorSharding::new(&[&[], &["model"]]);
    let row = || TensorSharding::new(&[&["model"], &[]]);
    Rules::new([
        ("params.h.*.attn.wq".to_string(), col()),
        ("params.h.*.attn.wk".to_string(), col()),
        ("params.h.*.attn.wv".to_string(), col()),
        ("params.h.*.attn.wo".to_string(), row()),
        ("params.h.*.mlp.w_gate".to_string(), col()),
        ("params.h.*.mlp.w_up".to_string(), col()),
        ("params.h.*.mlp.w_down".to_string(), row()),
        ("params.wte".to_string(), row()),
        ("params.lm_head".to_string(), col()),
        ("residual.*".to_string(), super::gpt::sequence_parallel()),
    ])
}

/// A fixed synthetic batch: `tokens` from `seed`, `targets` the tokens
/// shifted left by one (as the GPT's).
pub fn synthetic_batch(cfg: &LlamaConfig, seed: u64) -> BTreeMap<String, HostTensor> {
    let bits = Key::from_seed(seed).fold_in(0x11A).random_bits(cfg.batch * cfg.seq);
    let toks: Vec<i32> = bits.iter().map(|b| (b % cfg.vocab as u32) as i32).collect();
    let tgts: Vec<i32> =
        (0..cfg.batch * cfg.seq).map(|i| if (i + 1) % cfg.seq != 0 { toks[i + 1] } else { 0 }).collect();
    BTreeMap::from([
        ("tokens".to_string(), HostTensor::from_i32(&[cfg.batch, cfg.seq], toks).expect("shape")),
        ("targets".to_string(), HostTensor::from_i32(&[cfg.batch, cfg.seq], tgts).expect("shape")),
    ])
}

impl super::model::Architecture for LlamaConfig {
    fn module(&self, micro_batches: usize) -> crate::Result<Module> {
        Ok(build(&LlamaConfig { batch: self.batch / micro_batches.max(1), ..self.clone() })?)
    }
    fn eval_module(&self) -> crate::Result<Module> {
        Ok(build(self)?)
    }
    fn synthetic_batch(&self, _micro_batches: usize, seed: u64) -> Option<BTreeMap<String, HostTensor>> {
        Some(synthetic_batch(self, seed))
    }
}

impl super::Model {
    /// The built-in Llama-style decoder as a model: initialisation and
    /// tensor parallelism by rules, like a program's.
    pub fn llama(cfg: &LlamaConfig) -> super::Model {
        super::Model {
            label: "llama".into(),
            arch: std::sync::Arc::new(cfg.clone()),
            loss: "loss".into(),
            init: super::Init::Rules(init_rules()),
            tp_rules: tp_rules(),
            expert_rules: Default::default(),
            int_max: ["tokens", "targets"].into_iter().map(|n| (n.to_string(), cfg.vocab as u64)).collect(),
        }
    }
}

//! The residual MLP: parameters `params.layers.{i}.w1: f32[D,H]` and
//! `params.layers.{i}.w2: f32[H,D]`; forward `h = x; for each layer:
//! h = h + relu(h @ w1) @ w2`; loss `mean((h - y)^2)`.

use super::{normal_init, Shardings};
use std::collections::BTreeMap;
use weft_ir::builder::FunctionBuilder;
use weft_ir::prng::Key;
use weft_ir::tensor::HostTensor;
use weft_ir::{DType, IrError, Module};

/// Sizes of the residual MLP.
#[derive(Clone, Debug, PartialEq)]
pub struct MlpConfig {
    /// Number of residual layers.
    pub layers: usize,
    /// Model width D (input and output features).
    pub d: usize,
    /// Hidden width H.
    pub h: usize,
    /// Batch size B.
    pub batch: usize,
    /// Dtype of the forward/backward computation (parameters stay f32).
    pub compute: DType,
}

impl Default for MlpConfig {
    fn default() -> Self {
        MlpConfig { layers: 2, d: 16, h: 32, batch: 8, compute: DType::F32 }
    }
}

/// Names of the parameters, in order.
pub fn param_names(cfg: &MlpConfig) -> Vec<String> {
    (0..cfg.layers).flat_map(|i| [format!("params.layers.{i}.w1"), format!("params.layers.{i}.w2")]).collect()
}

/// Every parameter's name and shape (`w1: [D, H]`, `w2: [H, D]`), in the
/// order of `@loss`'s parameters.
pub fn param_shapes(cfg: &MlpConfig) -> Vec<(String, Vec<usize>)> {
    param_names(cfg)
        .into_iter()
        .map(|n| {
            let shape = if n.ends_with(".w1") { vec![cfg.d, cfg.h] } else { vec![cfg.h, cfg.d] };
            (n, shape)
        })
        .collect()
}

/// Builds the module with `@loss(params..., x: f32[B,D], y: f32[B,D]) -> f32[]`.
pub fn build(cfg: &MlpConfig, shardings: &Shardings) -> Result<Module, IrError> {
    let f = FunctionBuilder::new("loss");
    let p = |name: &str, shape: &[usize]| match shardings.get(name) {
        Some(s) => f.param_sharded(name, DType::F32, shape, s.clone()),
        None => f.param(name, DType::F32, shape),
    };
    let ws: Vec<_> = (0..cfg.layers)
        .map(|i| {
            (p(&format!("params.layers.{i}.w1"), &[cfg.d, cfg.h]), p(&format!("params.layers.{i}.w2"), &[cfg.h, cfg.d]))
        })
        .collect();
    let x = p("x", &[cfg.batch, cfg.d]);
    let y = p("y", &[cfg.batch, cfg.d]);
    let c = |v| f.convert(v, cfg.compute);
    let mut h = c(x);
    for (i, &(w1, w2)) in ws.iter().enumerate() {
        let a = f.relu(f.matmul(h, c(w1)));
        h = f.add(h, f.matmul(a, c(w2)));
        f.name(h, &format!("h{}", i + 1));
    }
    let diff = f.sub(f.convert(h, DType::F32), y);
    let loss = f.mean_all(f.mul(diff, diff));
    f.set_results(&[loss]);
    Ok(Module { functions: vec![f.finish()?] })
}

/// Deterministic initial parameters: N(0, 1/fan_in) from `seed`.
pub fn init(cfg: &MlpConfig, seed: u64) -> BTreeMap<String, HostTensor> {
    let key = Key::from_seed(seed);
    param_names(cfg)
        .into_iter()
        .enumerate()
        .map(|(i, name)| {
            let (shape, fan_in) = if name.ends_with("w1") { ([cfg.d, cfg.h], cfg.d) } else { ([cfg.h, cfg.d], cfg.h) };
            let t = normal_init(key.fold_in(i as u32), &shape, 1.0 / (fan_in as f64).sqrt());
            (name, t)
        })
        .collect()
}

/// A fixed synthetic batch `x`, `y` from `seed` (y is a fixed nonlinear
/// function of x, so the loss can fall).
pub fn synthetic_batch(cfg: &MlpConfig, seed: u64) -> BTreeMap<String, HostTensor> {
    let key = Key::from_seed(seed).fold_in(0xBA7C);
    let x = normal_init(key, &[cfg.batch, cfg.d], 1.0);
    let xv = x.to_f64_vec();
    let yv: Vec<f32> = (0..cfg.batch)
        .flat_map(|b| {
            let row = &xv[b * cfg.d..(b + 1) * cfg.d];
            (0..cfg.d).map(move |j| (0.5 * row[j] + 0.25 * row[(j + 1) % row.len()].tanh()) as f32)
        })
        .collect();
    let y = HostTensor::from_f32(&[cfg.batch, cfg.d], yv).expect("shape matches");
    BTreeMap::from([("x".to_string(), x), ("y".to_string(), y)])
}

impl super::model::Architecture for MlpConfig {
    fn module(&self, micro_batches: usize) -> crate::Result<Module> {
        let micro = MlpConfig { batch: self.batch / micro_batches.max(1), ..self.clone() };
        Ok(build(&micro, &Shardings::new())?)
    }
    fn eval_module(&self) -> crate::Result<Module> {
        Ok(build(self, &Shardings::new())?)
    }
    fn synthetic_batch(&self, _micro_batches: usize, seed: u64) -> Option<BTreeMap<String, HostTensor>> {
        Some(synthetic_batch(self, seed))
    }
    fn init_rules(&self) -> Vec<(String, super::init::InitFn)> {
        vec![("params.*".into(), super::init::InitFn::FanIn)]
    }
    fn element_counts(&self) -> Option<super::ElementCounts> {
        use super::elements as mul;
        let MlpConfig { layers, d, h, batch, .. } = *self;
        Some(super::ElementCounts {
            params: mul(&[layers, 2, d, h]),
            batch: mul(&[2, batch, d]),
            // Per layer: the input, the pre-activation and the activation.
            activations: mul(&[layers, batch]).saturating_mul((d as u64).saturating_add(mul(&[2, h]))),
        })
    }
}

/// Megatron's tensor-parallel split of the MLP: `w1` column-parallel
/// (`[{}, {model}]`), `w2` row-parallel (`[{model}, {}]`).
pub fn tp_rules() -> super::rules::Rules<weft_ir::TensorSharding> {
    use weft_ir::TensorSharding as S;
    super::rules::Rules::new([
        ("params.*.w1".to_string(), S::new(&[&[], &["model"]])),
        ("params.*.w2".to_string(), S::new(&[&["model"], &[]])),
    ])
}

impl super::Model {
    /// The built-in residual MLP as a model: its own seeded
    /// initialisation, Megatron's split as its tensor-parallel rules.
    pub fn mlp(cfg: &MlpConfig) -> super::Model {
        let init_cfg = cfg.clone();
        super::Model {
            label: "mlp".into(),
            arch: std::sync::Arc::new(cfg.clone()),
            loss: "loss".into(),
            init: super::Init::Seeded(std::sync::Arc::new(move |seed| init(&init_cfg, seed))),
            tp_rules: tp_rules(),
            expert_rules: Default::default(),
            int_max: BTreeMap::new(),
        }
    }
}

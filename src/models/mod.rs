//! Models: what any trainable model is ([`Model`]: a module, its
//! initialisation, its sharding rules), the pieces it is described with
//! (name-pattern [`rules`], [`init`] functions), and the two built-in ones
//! written with the builder, the residual MLP and a GPT-style decoder.
//! Each loss function takes the parameters (`params.*`), an optional PRNG
//! key (`rng`) and the batch, and returns the scalar loss first — the form
//! `build_train_step` expects. Initialisation is deterministic from a seed
//! (Threefry), so runs are reproducible.

pub mod gpt;
pub mod init;
pub mod llama;
pub mod mlp;
pub mod model;
pub mod rules;

pub use model::{Architecture, ElementCounts, Init, Model};

use std::collections::BTreeMap;
use weft_ir::prng::Key;
use weft_ir::tensor::HostTensor;
use weft_ir::{DType, TensorSharding};

/// Shardings to annotate on parameters and batch inputs, by name
/// (`params.layers.0.w1`, `x`). Unnamed values are left for propagation.
pub type Shardings = BTreeMap<String, TensorSharding>;

/// The product of sizes, saturating (element counts of estimates).
pub fn elements(xs: &[usize]) -> u64 {
    xs.iter().fold(1u64, |a, &x| a.saturating_mul(x as u64))
}

/// Normal(0, std²) values for a leaf, drawn from `fold_in(key, leaf index)`
/// by the Box–Muller transform over two uniform streams (the host twin of
/// `prng_emit::normal`).
pub fn normal_init(key: Key, shape: &[usize], std: f64) -> HostTensor {
    let n: usize = shape.iter().product();
    let u0 = key.fold_in(0).uniform_f32(n);
    let u1 = key.fold_in(1).uniform_f32(n);
    let v: Vec<f32> = u0
        .iter()
        .zip(&u1)
        .map(|(&a, &b)| {
            let r = (-2.0 * (1.0 - a as f64).ln()).sqrt();
            (r * (std::f64::consts::TAU * b as f64).cos() * std) as f32
        })
        .collect();
    HostTensor::from_f32(shape, v).expect("shape matches")
}

/// A tensor of `shape` filled with `v` (f32).
pub fn filled(shape: &[usize], v: f32) -> HostTensor {
    HostTensor::full(&weft_ir::TensorType::new(DType::F32, shape.to_vec()), v as f64)
}

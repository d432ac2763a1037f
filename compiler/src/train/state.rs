//! Training state: a flat tree of named tensor leaves.

use weft_ir::{TensorSharding, TensorType};

/// What a parameter of a loss function is, by its name (the contract of
/// `specs/training.md`): the one place that reads the names.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum InputRole {
    /// A trained parameter (`params.*`).
    Param,
    /// The PRNG key (`rng`, `u32[2]`).
    Key,
    /// A batch input (any other name; dimension 0 is the batch).
    Batch,
}

impl InputRole {
    /// The role of a loss-function parameter named `name`.
    pub fn of(name: &str) -> InputRole {
        if name.starts_with("params.") {
            InputRole::Param
        } else if name == "rng" {
            InputRole::Key
        } else {
            InputRole::Batch
        }
    }
}

/// What a state leaf is for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StateRole {
    /// A trained parameter (`params.*`).
    Param,
    /// An optimizer slot of a parameter (`opt.m.*`, `opt.v.*`, `opt.mu.*`).
    OptimizerSlot {
        /// The parameter leaf it belongs to.
        param: String,
    },
    /// The step counter (`step`, i32 scalar).
    Step,
    /// The PRNG key (`rng`, `u32[2]`); constant across steps, each step uses
    /// `fold_in(rng, step)`.
    Rng,
    /// The dynamic loss scale (`loss_scale.scale`, f32 scalar).
    LossScale,
    /// Steps since the last loss-scale change (`loss_scale.good_steps`).
    LossScaleCounter,
}

/// One leaf of the training state.
#[derive(Clone, Debug, PartialEq)]
pub struct StateLeaf {
    /// Dotted name, e.g. `params.layers.0.w1` or `opt.m.layers.0.w1`.
    pub name: String,
    /// Its type.
    pub ty: TensorType,
    /// Its sharding, when annotated (optimizer slots follow their parameter).
    pub sharding: Option<TensorSharding>,
    /// What it is.
    pub role: StateRole,
}

//! The whole training step as one pure function.
//!
//! [`build_train_step`] turns a loss function into
//! `train_step(state..., batch...) -> (state'..., metrics...)`: forward,
//! backward ([`crate::autodiff`]), gradient accumulation over micro-batches,
//! optional dynamic loss scaling, global-norm clipping, a learning-rate
//! schedule and the optimizer update, all in one verified IR function over
//! named state leaves. Training state is therefore a pure value: the same
//! state and batch always give the same next state, which is what makes
//! checkpoints resume bit for bit.

mod host;
mod optim;
mod state;
mod step;

pub use host::{check_tree, Metrics, Tree};
pub use optim::{broadcast_scalar, clip_by_global_norm, Optimizer, Schedule};
pub use state::{InputRole, StateLeaf, StateRole};
pub(crate) use step::{all_finite_f32, is_one};
pub use step::{build_train_step, LossScaling, TrainConfig, TrainStep};

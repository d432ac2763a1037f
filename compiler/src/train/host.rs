//! Running a training step on host tensors with the reference interpreter,
//! and building and checking state trees.
//!
//! State and batches are maps from leaf name to tensor. Every mismatch with
//! the step's layout (a missing, unexpected or wrongly typed leaf) is an
//! error that names the leaf.

use super::state::StateRole;
use super::step::TrainStep;
use crate::CompilerError;
use std::collections::BTreeMap;
use weft_ir::interp::Interpreter;
use weft_ir::prng::Key;
use weft_ir::tensor::HostTensor;
use weft_ir::TensorType;

/// A state or batch tree: leaf name to tensor.
pub type Tree = BTreeMap<String, HostTensor>;

/// Metrics of one step, by name.
pub type Metrics = BTreeMap<String, f64>;

fn leaf_err(leaf: &str, message: String) -> CompilerError {
    CompilerError::State { leaf: leaf.to_string(), message }
}

/// Checks that `tree` has exactly the leaves `expected`, with their types.
pub fn check_tree<'a>(
    what: &str,
    tree: &Tree,
    expected: impl Iterator<Item = (&'a str, &'a TensorType)>,
) -> Result<(), CompilerError> {
    let mut names = Vec::new();
    for (name, ty) in expected {
        names.push(name);
        let t = tree.get(name).ok_or_else(|| leaf_err(name, format!("missing from the {what}")))?;
        if !t.has_type(ty) {
            return Err(leaf_err(name, format!("{what} leaf has type {} but the step expects {ty}", t.ty())));
        }
    }
    if let Some(extra) = tree.keys().find(|k| !names.contains(&k.as_str())) {
        return Err(leaf_err(extra, format!("is not a leaf of the {what} (expected leaves: {})", names.join(", "))));
    }
    Ok(())
}

impl TrainStep {
    /// A fresh state: the given parameters (every `params.*` leaf, checked),
    /// zero optimizer slots, step 0, the PRNG key for `seed`, and the
    /// initial loss scale.
    pub fn init_state(&self, params: &Tree, seed: u64, initial_loss_scale: f64) -> Result<Tree, CompilerError> {
        let expected = self.state.iter().filter(|l| l.role == StateRole::Param).map(|l| (l.name.as_str(), &l.ty));
        check_tree("parameters", params, expected)?;
        let mut out = Tree::new();
        for l in &self.state {
            let t = match &l.role {
                StateRole::Param => params[&l.name].clone(),
                StateRole::OptimizerSlot { .. } | StateRole::Step | StateRole::LossScaleCounter => {
                    HostTensor::zeros(&l.ty)
                }
                StateRole::Rng => HostTensor::from_u32(&[2], Key::from_seed(seed).0.to_vec())?,
                StateRole::LossScale => HostTensor::full(&l.ty, initial_loss_scale),
            };
            out.insert(l.name.clone(), t);
        }
        Ok(out)
    }

    /// Checks a state tree against the layout.
    pub fn check_state(&self, state: &Tree) -> Result<(), CompilerError> {
        check_tree("state", state, self.state.iter().map(|l| (l.name.as_str(), &l.ty)))
    }

    /// Checks a batch against the layout.
    pub fn check_batch(&self, batch: &Tree) -> Result<(), CompilerError> {
        check_tree("batch", batch, self.batch.iter().map(|(n, t)| (n.as_str(), t)))
    }

    /// Arguments of `@train_step` in order, after checking both trees.
    pub fn arguments(&self, state: &Tree, batch: &Tree) -> Result<Vec<HostTensor>, CompilerError> {
        self.check_state(state)?;
        self.check_batch(batch)?;
        Ok(self
            .state
            .iter()
            .map(|l| state[&l.name].clone())
            .chain(self.batch.iter().map(|(n, _)| batch[n].clone()))
            .collect())
    }

    /// Splits `@train_step`'s results into the new state and the metrics.
    pub fn split_results(&self, results: Vec<HostTensor>) -> (Tree, Metrics) {
        let mut it = results.into_iter();
        let state = self.state.iter().map(|l| (l.name.clone(), it.next().expect("state result"))).collect();
        let metrics =
            self.metrics.iter().map(|m| (m.clone(), it.next().expect("metric result").to_f64_vec()[0])).collect();
        (state, metrics)
    }

    /// One step on the reference interpreter.
    pub fn run_interp(
        &self,
        interp: &Interpreter<'_>,
        state: &Tree,
        batch: &Tree,
    ) -> Result<(Tree, Metrics), CompilerError> {
        let args = self.arguments(state, batch)?;
        let out = interp.run_owned("train_step", args)?;
        Ok(self.split_results(out))
    }
}

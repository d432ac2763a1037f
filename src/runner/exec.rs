//! Executors: how one training step runs.

use crate::error::Result;
use weft_compiler::train::{Metrics, TrainStep, Tree};
use weft_ir::interp::Interpreter;

/// Runs training steps on some backend and mesh.
pub trait Executor {
    /// One step: the new state and the metrics.
    fn step(&mut self, step: &TrainStep, state: &Tree, batch: &Tree) -> Result<(Tree, Metrics)>;
    /// A line describing where it runs (printed at start and in the manifest).
    fn describe(&self) -> String;
}

/// The unsharded reference interpreter on one CPU device.
pub struct InterpExecutor {
    module: weft_ir::Module,
}

impl InterpExecutor {
    /// An executor for `step`'s module (verified once).
    pub fn new(step: &TrainStep) -> Result<InterpExecutor> {
        weft_ir::verify_module(&step.module)?;
        Ok(InterpExecutor { module: step.module.clone() })
    }
}

impl Executor for InterpExecutor {
    fn step(&mut self, step: &TrainStep, state: &Tree, batch: &Tree) -> Result<(Tree, Metrics)> {
        let interp = Interpreter::from_verified(&self.module);
        Ok(step.run_interp(&interp, state, batch)?)
    }

    fn describe(&self) -> String {
        "backend interp: unsharded reference interpreter, 1 CPU device".into()
    }
}

//! Executors: where training steps run. An executor holds the training
//! state between steps (on devices, for device backends), so a step moves
//! only the batch in and the metrics out; the state comes back to the host
//! only when checkpointed.

use crate::checkpoint::CheckpointState;
use crate::data::BatchPart;
use crate::error::Result;
use weft_compiler::train::{Metrics, TrainStep, Tree};
use weft_ir::interp::Interpreter;

/// Runs training steps on some backend and mesh.
pub trait Executor {
    /// Places a (global) state on the devices.
    fn load(&mut self, step: &TrainStep, state: &Tree) -> Result<()>;
    /// Places a restored checkpoint state (laid out as
    /// [`Executor::state_layout`]) on the devices. By default through the
    /// global state; a multi-process executor takes its devices' blocks
    /// only (the state was restored for those devices alone).
    fn load_blocks(&mut self, step: &TrainStep, state: &CheckpointState) -> Result<()> {
        let tree = state.to_tree().map_err(crate::error::Error::Usage)?;
        self.load(step, &tree)
    }
    /// Runs one step on the loaded state; returns the metrics.
    fn step(&mut self, step: &TrainStep, batch: &Tree) -> Result<Metrics>;
    /// The part of the global batch its devices need (a data loader reads
    /// only that): the whole batch, unless it runs some of a multi-process
    /// run's devices.
    fn batch_part(&self, step: &TrainStep) -> Result<BatchPart> {
        Ok(BatchPart::whole(global_batch_rows(step)))
    }
    /// [`Executor::step`] on part `part` of the global batch: `batch`
    /// holds just that ([`Executor::batch_part`]). By default only the
    /// whole batch.
    fn step_part(&mut self, step: &TrainStep, batch: &Tree, part: &BatchPart) -> Result<Metrics> {
        if !part.is_whole(global_batch_rows(step)) {
            return Err(crate::error::Error::Usage(format!(
                "this executor runs a step on the whole batch, not {part} of it"
            )));
        }
        self.step(step, batch)
    }
    /// The current state as a checkpoint: per-device shards where the state
    /// is sharded (each distinct block once), global tensors otherwise.
    fn checkpoint_state(&mut self, step: &TrainStep) -> Result<CheckpointState>;
    /// How each state leaf (in `TrainStep::state` order) is laid out over
    /// the executor's mesh: the target sharding when restoring a
    /// checkpoint saved on any mesh.
    fn state_layout(&self, step: &TrainStep) -> Vec<weft_ir::TensorSharding>;
    /// The current state as global tensors.
    fn global_state(&mut self, step: &TrainStep) -> Result<Tree>;
    /// The current parameters (the `params.*` leaves) as global tensors,
    /// for evaluation. A multi-process executor gathers them from every
    /// process (the rest of the state is never assembled).
    fn global_params(&mut self, step: &TrainStep) -> Result<Tree> {
        Ok(self.global_state(step)?.into_iter().filter(|(k, _)| k.starts_with(PARAMS)).collect())
    }
    /// Wall time of each compile phase of the executor's program.
    fn compile_phases(&self) -> Vec<(&'static str, std::time::Duration)> {
        Vec::new()
    }
    /// The partitioned device program it runs, if it runs one (for the
    /// cost model's prediction).
    fn device_program(&self) -> Option<&weft_ir::device::DeviceProgram> {
        None
    }
    /// Where it runs: backend, mesh, the mapping of logical devices.
    fn describe(&self) -> String;
    /// Traces the next steps' device work (`Some`) or stops (`None`);
    /// executors without devices of their own ignore it.
    fn set_trace(&mut self, _mode: Option<weft_runtime::TraceMode>) {}
    /// The device spans of the last traced step, if it recorded any.
    fn take_trace(&mut self) -> Option<weft_runtime::Trace> {
        None
    }
    /// Per device of this process, where its time went in the last step
    /// ([`weft_runtime::DeviceTime`]); `None` for executors without
    /// devices of their own.
    fn device_times(&self) -> Option<Vec<weft_runtime::DeviceTime>> {
        None
    }
}

/// The prefix of the parameter leaves of a training state.
pub const PARAMS: &str = "params.";

/// Rows in `step`'s global batch (dimension 0 of its batch inputs).
pub fn global_batch_rows(step: &TrainStep) -> usize {
    step.batch.first().and_then(|(_, t)| t.shape.first().copied()).unwrap_or(0)
}

/// The unsharded reference interpreter on one CPU device.
pub struct InterpExecutor {
    module: weft_ir::Module,
    state: Tree,
}

impl InterpExecutor {
    /// An executor for `step`'s module (verified once).
    pub fn new(step: &TrainStep) -> Result<InterpExecutor> {
        weft_ir::verify_module(&step.module)?;
        Ok(InterpExecutor { module: step.module.clone(), state: Tree::new() })
    }
}

impl Executor for InterpExecutor {
    fn load(&mut self, step: &TrainStep, state: &Tree) -> Result<()> {
        step.check_state(state)?;
        self.state = state.clone();
        Ok(())
    }

    fn step(&mut self, step: &TrainStep, batch: &Tree) -> Result<Metrics> {
        let interp = Interpreter::from_verified(&self.module);
        let (next, m) = step.run_interp(&interp, &self.state, batch)?;
        self.state = next;
        Ok(m)
    }

    fn checkpoint_state(&mut self, _step: &TrainStep) -> Result<CheckpointState> {
        Ok(CheckpointState::from_tree(self.state.clone()))
    }

    fn global_state(&mut self, _step: &TrainStep) -> Result<Tree> {
        Ok(self.state.clone())
    }

    fn state_layout(&self, step: &TrainStep) -> Vec<weft_ir::TensorSharding> {
        step.state.iter().map(|l| weft_ir::TensorSharding::replicated(l.ty.rank())).collect()
    }

    fn describe(&self) -> String {
        "backend interp: unsharded reference interpreter, 1 CPU device".into()
    }
}

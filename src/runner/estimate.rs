//! What a training run will need in memory, estimated from the config and
//! the model's sizes or module (checked arithmetic, before anything is
//! compiled or allocated), and compared with the memory limit.
//!
//! The estimate is a lower bound of what the run holds at once on the host
//! (all simulated devices share it): the initial parameters, the initial
//! state (parameters and optimizer slots), one device copy of that state,
//! the batch, and the activations one step keeps for its backward pass.
//! After compilation the partitioned program's static peak per device is
//! checked too ([`super::MeshExecutor::with_limit`]).

use super::config::RunConfig;
use crate::error::Result;
use crate::models::{elements, Model};
use weft_compiler::train::InputRole;
use weft_ir::limits::MemoryLimit;

/// The parts of a run's memory estimate, in bytes (saturating).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Estimate {
    /// Trainable parameters (elements).
    pub params: u64,
    /// Training state: parameters and optimizer slots, f32.
    pub state_bytes: u64,
    /// The batch (inputs and targets).
    pub batch_bytes: u64,
    /// Activations kept for the backward pass of one step.
    pub activation_bytes: u64,
    /// The batches a `[data]` reader keeps ready (`data.prefetch` of them).
    pub prefetch_bytes: u64,
}

impl Estimate {
    /// The total: initial parameters, initial state, one device copy of
    /// the state, the batch, and the activations.
    pub fn total(&self) -> u64 {
        let param_bytes = self.params.saturating_mul(4);
        param_bytes
            .saturating_add(self.state_bytes.saturating_mul(2))
            .saturating_add(self.batch_bytes)
            .saturating_add(self.activation_bytes)
            .saturating_add(self.prefetch_bytes)
    }
}

/// The optimizer's slots per parameter (AdamW 2, SGD with momentum 1).
fn slot_count(c: &RunConfig) -> u64 {
    match c.optimizer.kind.as_str() {
        "adamw" => 2,
        _ if c.optimizer.momentum != 0.0 => 1,
        _ => 0,
    }
}

/// The run's memory limit: `memory_limit` (from the config or
/// `--memory-limit`), else `WEFT_MEMORY_LIMIT`, else the machine's memory.
pub fn memory_limit(c: &RunConfig) -> Result<Option<MemoryLimit>> {
    Ok(MemoryLimit::resolve(c.memory_limit.as_deref(), "memory_limit (--memory-limit)")?)
}

/// Estimates the memory of a run of `model` under `c` (whose sizes are
/// validated): the model's own count from its sizes where it has one (the
/// built-in MLP and GPT, [`crate::models::Architecture::element_counts`]),
/// else counted from its module — its parameters and batch exactly, and
/// as activations every value the module computes (a bound on what the
/// backward pass keeps), for one of the step's micro-batches at a time.
pub fn estimate(c: &RunConfig, model: &Model) -> Result<Estimate> {
    let state = |params: u64| params.saturating_mul(1 + slot_count(c)).saturating_mul(4);
    let queued = c.data.as_ref().map_or(0, |d| d.prefetch as u64);
    if let Some(n) = model.arch.element_counts() {
        let batch_bytes = n.batch.saturating_mul(4);
        return Ok(Estimate {
            params: n.params,
            state_bytes: state(n.params),
            batch_bytes,
            activation_bytes: n.activations.saturating_mul(4),
            prefetch_bytes: batch_bytes.saturating_mul(queued),
        });
    }
    let k = c.step_micro_batches();
    let module = model.arch.module(k)?;
    let k = k as u64;
    let f = model.loss_fn(&module)?;
    let bytes = |t: &weft_ir::TensorType| elements(&t.shape).saturating_mul(t.dtype.size_bytes() as u64);
    let (mut params, mut batch_bytes) = (0u64, 0u64);
    for i in 0..f.params.len() {
        let ty = f.ty(f.params[i]);
        match InputRole::of(&f.param_name(i)) {
            InputRole::Param => params = params.saturating_add(elements(&ty.shape)),
            InputRole::Batch => batch_bytes = batch_bytes.saturating_add(bytes(ty).saturating_mul(k)),
            InputRole::Key => {}
        }
    }
    let activation_bytes = module
        .functions
        .iter()
        .flat_map(|g| g.values.iter().filter(|v| !matches!(v.def, weft_ir::ValueDef::Param(_))))
        .fold(0u64, |a, v| a.saturating_add(bytes(&v.ty)));
    let prefetch_bytes = batch_bytes.saturating_mul(queued);
    Ok(Estimate { params, state_bytes: state(params), batch_bytes, activation_bytes, prefetch_bytes })
}

/// Errors if the estimate of a run of `model` under `c` exceeds the limit.
pub fn check(c: &RunConfig, model: &Model, limit: Option<&MemoryLimit>) -> Result<()> {
    let Some(limit) = limit else { return Ok(()) };
    let e = estimate(c, model)?;
    let kind = &model.label;
    let queued = match c.data.as_ref().map(|d| d.prefetch) {
        Some(n) if n > 0 => format!(", {n} prefetched batches {}", weft_ir::limits::human_bytes(e.prefetch_bytes)),
        _ => String::new(),
    };
    let what = format!(
        "the run ({kind} with {} parameters: state {}, batch {}, activations {}{queued}, with host copies)",
        e.params,
        weft_ir::limits::human_bytes(e.state_bytes),
        weft_ir::limits::human_bytes(e.batch_bytes),
        weft_ir::limits::human_bytes(e.activation_bytes)
    );
    Ok(limit.check(&what, e.total())?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_estimate_counts_parameters_exactly() {
        let c = RunConfig::from_toml("steps = 1\n[model]\nkind = \"mlp\"\nlayers = 2\nd = 16\nh = 32\nbatch = 8\n")
            .unwrap();
        let e = estimate(&c, &c.model.model().unwrap()).unwrap();
        assert_eq!(e.params, 2 * 2 * 16 * 32);
        assert_eq!(e.state_bytes, e.params * 4);
        let p = crate::models::mlp::param_shapes(&c.model.mlp().unwrap().unwrap());
        assert_eq!(e.params, p.iter().map(|(_, s)| s.iter().product::<usize>() as u64).sum::<u64>());
        let g = RunConfig::from_toml("steps = 1\n[model]\nkind = \"gpt\"\n[optimizer]\nkind = \"adamw\"\n").unwrap();
        let e = estimate(&g, &g.model.model().unwrap()).unwrap();
        let p = crate::models::gpt::param_shapes(&g.model.gpt().unwrap().unwrap());
        assert_eq!(e.params, p.iter().map(|(_, s)| s.iter().product::<usize>() as u64).sum::<u64>());
        assert_eq!(e.state_bytes, e.params * 3 * 4);
    }
}

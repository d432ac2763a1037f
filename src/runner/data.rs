//! The runner's side of `[data]`: opening the dataset before anything is
//! compiled, feeding one batch per step through the prefetcher, evaluating
//! the validation split, and the data identity that checkpoints carry.
//!
//! Evaluation runs the model's loss function (built for the global batch,
//! without dropout) on one device of the CPU backend (the interpreter for
//! `interp`/`sim` runs) with the parameters the training executor holds
//! (in a multi-process run, gathered from every process: each process
//! evaluates, the same bits, and the first writes the metrics).
//! It never touches the training state, and on one device its result does
//! not depend on the training mesh beyond the parameters themselves.

use super::config::RunConfig;
use super::exec::{Executor, InterpExecutor};
use super::mesh::{MeshBackend, MeshExecutor};
use super::Backend;
use super::{Overrides, Prepared};
use crate::checkpoint::{CheckpointState, Manifest};
use crate::data::{input_specs, BatchPart, Dataset, Identity, Prefetcher, Split};
use crate::error::{Error, Result};
use crate::models::Model;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use weft_compiler::sharding::Mesh;
use weft_compiler::train::{InputRole, Metrics, TrainStep, Tree};
use weft_ir::tensor::HostTensor;
use weft_ir::{DType, TensorType};
use weft_runtime::BackendKind;

/// The checkpoint leaf holding the data identity's digest (`u32[8]`).
pub const IDENTITY_LEAF: &str = "data.identity";

/// `--data` (one fixed batch) and `[data]` (a dataset) exclude each other.
pub fn check_flags(c: &RunConfig, ov: &Overrides) -> Result<()> {
    match (&c.data, &ov.data) {
        (Some(_), Some(p)) => Err(Error::Usage(format!(
            "--data {} (one fixed batch) and a [data] table (a dataset) cannot both be given",
            p.display()
        ))),
        _ => Ok(()),
    }
}

/// Opens and checks the configured dataset for the prepared step (before
/// the executor is compiled, so bad data fails fast). `None` without `[data]`.
/// (The session has already refused `--data` with `[data]`: [`check_flags`].)
pub fn open_dataset(c: &RunConfig, model: &Model, prepared: &Prepared) -> Result<Option<Dataset>> {
    let Some(d) = &c.data else { return Ok(None) };
    if d.source == "tokens" {
        let names: Vec<&str> = prepared.step.batch.iter().map(|(n, _)| n.as_str()).collect();
        if names != ["tokens", "targets"] && names != ["targets", "tokens"] {
            return Err(Error::Usage(format!(
                "data.source = \"tokens\" feeds a model whose batch inputs are `tokens` and `targets`, but {} takes {}",
                model.label,
                names.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ")
            )));
        }
    }
    Dataset::open(d, &input_specs(&prepared.step.batch, &model.int_max), c.seed).map(Some)
}

/// The identity digest as a checkpoint leaf.
pub fn identity_leaf(id: &Identity) -> HostTensor {
    HostTensor::from_u32(&[8], id.digest().to_vec()).expect("8 words")
}

/// Adds the identity leaf to a state being checkpointed.
pub fn add_identity(state: &mut CheckpointState, id: &Identity) {
    state.insert_global(IDENTITY_LEAF, identity_leaf(id));
}

/// The type of [`IDENTITY_LEAF`].
pub fn identity_type() -> TensorType {
    TensorType::new(DType::U32, vec![8])
}

/// What `run.json` beside the checkpoints says the data was, for messages.
fn recorded(dir: &std::path::Path) -> String {
    std::fs::read_to_string(dir.join("run.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .map(|v| match v.get("data") {
            Some(d) => format!("; {} records the data it was trained on: {d}", dir.join("run.json").display()),
            None => String::new(),
        })
        .unwrap_or_default()
}

/// Before restoring step `saved.step`: a checkpoint saved with data needs
/// this run to have data and vice versa (`Error::DataChanged`).
pub fn check_saved(saved: &Manifest, ours: Option<&Identity>, dir: &std::path::Path) -> Result<()> {
    let has = saved.leaves.iter().any(|l| l.name == IDENTITY_LEAF);
    match (has, ours) {
        (true, None) => Err(Error::DataChanged(format!(
            "the checkpoint at step {} was trained on a [data] dataset, but this run has no [data] table{}",
            saved.step,
            recorded(dir)
        ))),
        (false, Some(id)) => Err(Error::DataChanged(format!(
            "the checkpoint at step {} was trained without a [data] dataset (the synthetic batch or --data), but \
             this run reads {}",
            saved.step,
            id.train.iter().map(|f| f.path.as_str()).collect::<Vec<_>>().join(", ")
        ))),
        _ => Ok(()),
    }
}

/// After restoring: the saved digest must equal this run's.
pub fn check_restored(tree: &mut Tree, ours: Option<&Identity>, step: u64, dir: &std::path::Path) -> Result<()> {
    let (Some(saved), Some(id)) = (tree.remove(IDENTITY_LEAF), ours) else { return Ok(()) };
    if saved.bitwise_eq(&identity_leaf(id)) {
        return Ok(());
    }
    let hex: String = saved.to_f64_vec().iter().map(|&w| format!("{:08x}", w as u32)).collect();
    Err(Error::DataChanged(format!(
        "the checkpoint at step {step} was trained on other data (data identity {hex}); this run's data is {} \
         ({}, seed {}, shuffle {}: {}){}. Resume with the same files, seed and order, or start a new run",
        id.digest_hex(),
        id.source,
        id.seed,
        id.shuffle,
        id.train
            .iter()
            .chain(&id.val)
            .map(|f| format!("{} sha256 {}", f.path, f.sha256))
            .collect::<Vec<_>>()
            .join(", "),
        recorded(dir)
    )))
}

/// Evaluates the validation split with the training executor's parameters.
struct Evaluator {
    step: TrainStep,
    exec: Box<dyn Executor>,
    /// The evaluation batches, read once: the validation split is read in
    /// order from its start, so every evaluation sees the same batches;
    /// each cut into the evaluated function's rows (one part for the
    /// built-in models, whose evaluation takes a whole batch).
    batches: Vec<Vec<Tree>>,
}

/// The model's loss function (without dropout) as a step with no state:
/// every parameter and the batch are its inputs, the loss and auxiliary
/// results its metrics.
fn eval_step(model: &Model) -> Result<TrainStep> {
    let mut module = model.arch.eval_module()?;
    let f = module.function_mut(&model.loss).expect("the contract checks the loss function");
    f.name = "train_step".into();
    let f = module.function("train_step").expect("renamed");
    let batch = (0..f.params.len()).map(|i| (f.param_name(i), f.ty(f.params[i]).clone())).collect();
    let mut metrics = vec!["loss".to_string()];
    for (a, &r) in f.results[1..].iter().enumerate() {
        metrics.push(f.value(r).name.clone().unwrap_or_else(|| format!("metric{}", a + 1)));
    }
    Ok(TrainStep { module, state: Vec::new(), batch, metrics })
}

impl Evaluator {
    fn new(model: &Model, backend: Backend, val: Split, batches: usize) -> Result<Evaluator> {
        let step = eval_step(model)?;
        // The evaluated function's rows: dimension 0 of its batch inputs
        // (its other inputs are the parameters and the key).
        let rows = step
            .batch
            .iter()
            .find(|(n, _)| InputRole::of(n) == InputRole::Batch)
            .and_then(|(_, t)| t.shape.first().copied())
            .unwrap_or(0);
        let exec: Box<dyn Executor> = match backend {
            Backend::Interp | Backend::Sim => Box::new(InterpExecutor::new(&step)?),
            Backend::Runtime(kind) => {
                // On one CPU device: the reference one beside `cpu-ref`.
                let kind = if kind == BackendKind::CpuRef { kind } else { BackendKind::Cpu };
                let one = Mesh::parse("data=1")?;
                Box::new(MeshExecutor::new(&step, &one, MeshBackend::Devices(kind), Some(1))?)
            }
        };
        // Each batch in parts of the evaluated function's rows (one part for
        // the built-in models, whose evaluation takes a whole batch).
        let whole = val.batch_size();
        let rows = if rows == 0 { whole } else { rows };
        let batches = (0..batches as u64)
            .map(|b| (0..whole / rows).map(|p| val.rows(b, p * rows..(p + 1) * rows)).collect::<Result<_>>())
            .collect::<Result<_>>()?;
        Ok(Evaluator { step, exec, batches })
    }

    /// Mean loss (and other results) over the evaluation batches, named `val_*`.
    fn evaluate(&mut self, train: &TrainStep, exec: &mut dyn Executor) -> Result<Metrics> {
        let mut inputs: Tree = exec.global_params(train)?;
        if self.step.batch.iter().any(|(n, _)| InputRole::of(n) == InputRole::Key) {
            // A program's PRNG key (dropout): evaluation uses a fixed one.
            inputs.insert("rng".into(), HostTensor::from_u32(&[2], vec![0, 0])?);
        }
        let mut sums: BTreeMap<String, f64> = BTreeMap::new();
        let mut parts = 0;
        for b in self.batches.iter().flatten() {
            inputs.extend(b.iter().map(|(k, v)| (k.clone(), v.clone())));
            for (k, v) in self.exec.step(&self.step, &inputs)? {
                *sums.entry(format!("val_{k}")).or_default() += v;
            }
            parts += 1;
        }
        Ok(sums.into_iter().map(|(k, v)| (k, v / parts as f64)).collect())
    }
}

/// One batch per step and the evaluations of a run with `[data]`.
pub struct Feed {
    prefetch: Prefetcher,
    eval: Option<Evaluator>,
    eval_every: u64,
    /// Steps fed (for the trace).
    fed: u64,
    end: u64,
}

/// The environment variable that makes every process print, after its
/// last batch, which part of the global batch it read and how many rows
/// it read in all (to stderr: the tests' proof that each process of a
/// multi-process run reads only what its devices need).
pub const TRACE_ENV: &str = "WEFT_DATA_TRACE";

impl Feed {
    /// Starts feeding steps `first..c.steps` of `data`: of each step's
    /// global batch, the part `part` (the executor's
    /// [`Executor::batch_part`]); only that is read and converted.
    pub fn start(
        c: &RunConfig,
        model: &Model,
        data: Dataset,
        backend: Backend,
        first: u64,
        part: BatchPart,
    ) -> Result<Feed> {
        let d = c.data.as_ref().expect("a dataset comes from [data]");
        let Dataset { train, val, .. } = data;
        let prefetch = Prefetcher::new(Arc::new(train), part, first, c.steps, d.prefetch)?;
        let eval = match val {
            Some(v) if d.eval_every > 0 => Some(Evaluator::new(model, backend, v, d.eval_batches)?),
            _ => None,
        };
        Ok(Feed { prefetch, eval, eval_every: d.eval_every, fed: 0, end: c.steps.saturating_sub(first) })
    }

    /// The part of each global batch this feed reads (for
    /// [`Executor::step_part`]).
    pub fn part(&self) -> &BatchPart {
        self.prefetch.part()
    }

    /// The next step's rows of its batch, how long the loop waited for
    /// them, and their digest ([`crate::data::batch_digest`]).
    pub fn next_batch(&mut self) -> Result<(Tree, Duration, u64)> {
        let (_, b, waited, digest) = self.prefetch.next_batch()?;
        self.fed += 1;
        if self.fed == self.end && std::env::var_os(TRACE_ENV).is_some_and(|v| !v.is_empty() && v != "0") {
            let split = self.prefetch.split();
            let line = format!(
                "weft data: read {} of every batch of {}: {} rows in {} steps\n",
                self.prefetch.part(),
                split.batch_size(),
                split.rows_read(),
                self.fed
            );
            // One write: the lines of several processes do not interleave.
            let _ = std::io::Write::write_all(&mut std::io::stderr().lock(), line.as_bytes());
        }
        Ok((b, waited, digest))
    }

    /// The validation metrics with the current parameters, if `step` (the
    /// number of completed steps) is an evaluation point: a multiple of
    /// `eval_every`, or the run's last step `total`.
    pub fn evaluate_at(
        &mut self,
        step: u64,
        total: u64,
        train: &TrainStep,
        exec: &mut dyn Executor,
    ) -> Result<Option<Metrics>> {
        match &mut self.eval {
            Some(e) if step % self.eval_every == 0 || step == total => e.evaluate(train, exec).map(Some),
            _ => Ok(None),
        }
    }
}

/// `data wait: median X ms, total Y ms = Z% of the step time` for a run
/// with `[data]` (the waits are `data_wait_ms` in its metrics).
pub fn wait_summary(summary: &super::RunSummary) -> Option<String> {
    let waits: Vec<f64> = summary.metrics.iter().filter_map(|(_, m)| m.get("data_wait_ms").copied()).collect();
    let median = super::median(&waits)?;
    let total: f64 = waits.iter().sum();
    let steps: f64 = summary.step_secs.iter().sum::<f64>() * 1e3;
    Some(format!(
        "data wait: median {:.3} ms, total {:.1} ms over {} steps = {:.2}% of the step time",
        median,
        total,
        waits.len(),
        100.0 * total / steps.max(1e-9)
    ))
}

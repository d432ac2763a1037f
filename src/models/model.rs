//! A model as data: a module (its loss function takes one micro-batch), how
//! its parameters start (rules or given tensors), its tensor-parallel
//! sharding rules, and the ranges of its integer inputs. The built-in
//! models and a program the user wrote (text format or the Rust builder)
//! are all a [`Model`]; the runner trains any of them the same way and
//! never asks which one it has.
//!
//! The contract of a loss function (`specs/training.md`, "Program models"):
//! parameters named `params.*` are trained (optimizer state follows them),
//! an optional `rng: u32[2]` is the PRNG key, every other parameter is a
//! batch input whose dimension 0 is the batch; the first result is the
//! scalar `f32` loss and further scalar results are logged as metrics.

use super::init::{init_by_rules, shown, InitFn};
use super::normal_init;
use super::rules::Rules;
use crate::error::{Error, Result};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use weft_compiler::train::InputRole;
use weft_ir::tensor::{read_safetensors, HostTensor};
use weft_ir::{Function, Module, TensorSharding, TensorType};

/// Parameters or a batch by leaf name.
pub type Tree = BTreeMap<String, HostTensor>;

/// How a model's module is made for a step split into micro-batches.
///
/// A program is one fixed module whose batch inputs are one micro-batch
/// (a step of `k` micro-batches takes `k` times its rows); a built-in
/// model is rebuilt for micro-batches of `batch / k` rows.
pub trait Architecture: Send + Sync {
    /// The module whose loss function takes one of `micro_batches`
    /// micro-batches of a step.
    fn module(&self, micro_batches: usize) -> Result<Module>;
    /// The module to evaluate (no dropout): its loss function is applied
    /// to batches of its own rows.
    fn eval_module(&self) -> Result<Module>;
    /// A fixed batch of its own for a step of `micro_batches` (the built-in
    /// models'); `None`: drawn from the inputs' types and the seed
    /// ([`Model::synthetic_batch`]).
    fn synthetic_batch(&self, _micro_batches: usize, _seed: u64) -> Option<Tree> {
        None
    }
    /// What a run of the whole batch holds, counted from the model's sizes
    /// where it has a formula of its own (the built-in MLP and GPT); `None`:
    /// the memory estimate counts the module's values instead.
    fn element_counts(&self) -> Option<ElementCounts> {
        None
    }
    /// The model's initialisation as name rules, where it is not rules
    /// itself (the built-in MLP's and GPT's: the same distributions),
    /// for `weft model`.
    fn init_rules(&self) -> Vec<(String, InitFn)> {
        Vec::new()
    }
}

/// Elements (4 bytes each in the estimate) a run of a model holds: its
/// parameters, one batch, and the activations one step keeps for its
/// backward pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ElementCounts {
    /// Trained parameters.
    pub params: u64,
    /// The batch's inputs.
    pub batch: u64,
    /// Activations kept for the backward pass.
    pub activations: u64,
}

/// How a model's parameters start.
#[derive(Clone)]
pub enum Init {
    /// By name patterns (`[model.init]`): a pure function of (seed, name).
    Rules(Rules<InitFn>),
    /// From a safetensors file with a tensor per parameter (`init_from`).
    File(PathBuf),
    /// Computed by the model from the seed (the built-in models' own
    /// initialisation).
    Seeded(Arc<dyn Fn(u64) -> Tree + Send + Sync>),
}

/// A trainable model.
#[derive(Clone)]
pub struct Model {
    /// What the model is, for messages (`mlp`, `program model.weft`).
    pub label: String,
    /// Its module for each micro-batch count.
    pub arch: Arc<dyn Architecture>,
    /// The name of the function to minimise.
    pub loss: String,
    /// How the parameters start.
    pub init: Init,
    /// The shardings of `strategy = "tp"` (and `fsdp_tp`), by parameter
    /// or named-value pattern (the GPT's `residual.*`); axes the mesh
    /// lacks are dropped.
    pub tp_rules: Rules<TensorSharding>,
    /// The shardings over an `expert` mesh axis (expert parallelism), by
    /// parameter name pattern: applied under every strategy but `none` and
    /// `auto` when the mesh has that axis, and combined with the
    /// tensor-parallel rules (expert axes first).
    pub expert_rules: Rules<TensorSharding>,
    /// Integer batch inputs' ranges: values in `0..max` (`tokens` below
    /// the vocabulary).
    pub int_max: BTreeMap<String, u64>,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model").field("label", &self.label).field("loss", &self.loss).finish_non_exhaustive()
    }
}

/// A fixed module: a program file or a module built in Rust.
pub struct Program {
    /// The module.
    pub module: Module,
}

impl Architecture for Program {
    fn module(&self, _micro_batches: usize) -> Result<Module> {
        Ok(self.module.clone())
    }
    fn eval_module(&self) -> Result<Module> {
        Ok(self.module.clone())
    }
}

/// Names a loss function's inputs may not take: the training step's own
/// state leaves and metrics.
const RESERVED: &[&str] = &["step", "loss", "grad_norm", "lr", "skipped", "data_wait_ms"];
const RESERVED_PREFIXES: &[&str] = &["opt.", "loss_scale", "data.", "new.", "metrics.", "val_"];

/// Names the training step gives functions of its own.
const STEP_FUNCTIONS: &[&str] = &["train_step", "scaled_loss"];

/// Whether `name` is one the training step uses for its own leaves,
/// metrics or functions.
fn reserved(name: &str) -> bool {
    RESERVED.contains(&name) || RESERVED_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// Checks a module against the loss-function contract; `what` names it in
/// errors (a file, or `the module`).
pub fn check_contract(module: &Module, loss: &str, what: &str) -> Result<()> {
    let err = |message: String| Error::Model { what: what.to_string(), message };
    let Some(f) = module.function(loss) else {
        let names: Vec<String> = module.functions.iter().map(|f| format!("@{}", f.name)).collect();
        let hint = if loss == "loss" { " (set model.loss to the function to minimise)" } else { "" };
        return Err(err(format!("has no function @{loss} to minimise{hint}; it defines {}", names.join(", "))));
    };
    let at = |f: &Function| f.loc.map(|l| format!(" (@{} at {l})", f.name)).unwrap_or_default();
    let Some(&first) = f.results.first() else {
        return Err(err(format!("@{loss} returns nothing; its first result must be the scalar f32 loss{}", at(f))));
    };
    let ty = f.ty(first);
    if ty.dtype != weft_ir::DType::F32 || !ty.shape.is_empty() {
        return Err(err(format!("the loss (the first result of @{loss}) must be f32[], but it is {ty}{}", at(f))));
    }
    if let Some(g) = module.functions.iter().find(|g| g.name != loss && STEP_FUNCTIONS.contains(&g.name.as_str())) {
        return Err(err(format!(
            "defines @{}, a name the training step gives a function of its own; rename it{}",
            g.name,
            at(g)
        )));
    }
    for (i, &r) in f.results.iter().enumerate().skip(1) {
        if let Some(name) = f.value(r).name.as_deref().filter(|n| reserved(n)) {
            return Err(err(format!(
                "result {i} of @{loss} is named %{name}, a metric the training step logs itself; rename it"
            )));
        }
        if !f.ty(r).shape.is_empty() {
            return Err(err(format!(
                "result {i} of @{loss} ({}) is {}: results after the loss are logged as metrics and must be scalars",
                f.value_ref(r),
                f.ty(r)
            )));
        }
    }
    let mut trained = 0;
    for i in 0..f.params.len() {
        let name = f.param_name(i);
        let ty = f.ty(f.params[i]);
        let role = InputRole::of(&name);
        if role == InputRole::Param {
            trained += 1;
            if !ty.dtype.is_float() {
                return Err(err(format!("parameter %{name} is {ty}: trained parameters (params.*) must be floats")));
            }
        } else if role == InputRole::Key {
            if *ty != TensorType::new(weft_ir::DType::U32, vec![2]) {
                return Err(err(format!("%rng is the PRNG key and must be u32[2], but it is {ty}")));
            }
        } else if reserved(&name) {
            return Err(err(format!(
                "batch input %{name} takes a name the training step uses for its own state or metrics; rename it"
            )));
        } else if ty.shape.is_empty() {
            return Err(err(format!(
                "batch input %{name} is a scalar ({ty}): dimension 0 of a batch input is the batch"
            )));
        }
    }
    if trained == 0 {
        return Err(err(format!("@{loss} has no trained parameters: name them `params.*` (e.g. %params.w)")));
    }
    Ok(())
}

/// Loads a program file (`[model] program`): parses and verifies it.
/// Errors name the file and, where there is one, the line and column.
/// ([`Model::program`] checks the loss-function contract.)
pub fn load_program(path: &Path) -> Result<Module> {
    let text = crate::error::read_to_string(path)?;
    weft_ir::text::parse_and_verify(&text)
        .map_err(|e| Error::Model { what: path.display().to_string(), message: e.to_string() })
}

impl Model {
    /// A model from a fixed module (a program, or one built in Rust) with
    /// its initialisation; no tensor-parallel rules of its own.
    pub fn program(label: impl Into<String>, module: Module, loss: &str, init: Init) -> Result<Model> {
        let label = label.into();
        check_contract(&module, loss, &label)?;
        Ok(Model {
            label,
            arch: Arc::new(Program { module }),
            loss: loss.to_string(),
            init,
            tp_rules: Rules::default(),
            expert_rules: Rules::default(),
            int_max: BTreeMap::new(),
        })
    }

    /// Sets the ranges of integer batch inputs (`[model.inputs]`): values
    /// in `0..max`. A name that is not an input of the loss function, a
    /// float input, or a `max` outside `[1, 2^31]` is an error of `what`.
    pub fn set_int_ranges<'a>(&mut self, ranges: impl IntoIterator<Item = (&'a str, u64)>, what: &str) -> Result<()> {
        let module = self.arch.module(1)?;
        let f = self.loss_fn(&module)?;
        for (name, max) in ranges {
            let ty = (0..f.params.len()).find(|&i| f.param_name(i) == name).map(|i| f.ty(f.params[i]));
            let problem = match ty {
                None => Some(format!("`{name}` is not an input of @{}", self.loss)),
                Some(t) if t.dtype.is_float() => Some(format!("`{name}` is {t}: a range is for integer inputs")),
                Some(_) if max == 0 || max > 1 << 31 => Some(format!("`{name}`: max = {max} must be in [1, 2^31]")),
                Some(_) => None,
            };
            if let Some(message) = problem {
                return Err(Error::Model { what: what.to_string(), message });
            }
            self.int_max.insert(name.to_string(), max);
        }
        Ok(())
    }

    /// The loss function of `module` (made by this model).
    pub fn loss_fn<'m>(&self, module: &'m Module) -> Result<&'m Function> {
        module.function(&self.loss).ok_or_else(|| Error::Model {
            what: self.label.clone(),
            message: format!("the module has no function @{}", self.loss),
        })
    }

    /// The trained parameters of the loss function (name, type), in order.
    pub fn params(&self, module: &Module) -> Result<Vec<(String, TensorType)>> {
        let f = self.loss_fn(module)?;
        Ok((0..f.params.len())
            .map(|i| (f.param_name(i), f.ty(f.params[i]).clone()))
            .filter(|(n, _)| InputRole::of(n) == InputRole::Param)
            .collect())
    }

    /// The initial parameters from `seed`.
    pub fn initial_params(&self, module: &Module, seed: u64) -> Result<Tree> {
        let params = self.params(module)?;
        match &self.init {
            Init::Seeded(f) => Ok(f(seed)),
            Init::Rules(rules) => init_by_rules(rules, &params, seed)
                .map_err(|message| Error::Model { what: self.label.clone(), message }),
            Init::File(path) => {
                let file = read_safetensors(path)?;
                let err = |message: String| Error::Model { what: format!("init_from {}", path.display()), message };
                let missing: Vec<&str> =
                    params.iter().map(|(n, _)| n.as_str()).filter(|n| !file.contains_key(*n)).collect();
                if !missing.is_empty() {
                    return Err(err(format!("has no tensor for {}", shown(&missing))));
                }
                let mut out = Tree::new();
                for (name, ty) in params {
                    let t = &file[&name];
                    if t.ty() != ty {
                        return Err(err(format!("`{name}` is {} but the parameter is {ty}", t.ty())));
                    }
                    out.insert(name, t.clone());
                }
                Ok(out)
            }
        }
    }

    /// The fixed batch of a step whose batch inputs are `batch` (name and
    /// whole-step type): the model's own, else drawn from `seed` —
    /// floats N(0, 1), integers uniform in `0..max` ([`Model::int_max`]).
    pub fn synthetic_batch(&self, batch: &[(String, TensorType)], micro_batches: usize, seed: u64) -> Result<Tree> {
        if let Some(b) = self.arch.synthetic_batch(micro_batches, seed) {
            return Ok(b);
        }
        let mut out = Tree::new();
        for (name, ty) in batch {
            let key = super::init::name_key(seed, 0xBA7C, name);
            let n: usize = ty.shape.iter().product();
            let t = if ty.dtype.is_float() {
                let v = normal_init(key, &ty.shape, 1.0).to_f64_vec();
                HostTensor::from_values(ty, &v)?
            } else {
                let Some(&max) = self.int_max.get(name).filter(|&&m| m > 0) else {
                    return Err(Error::Model {
                        what: self.label.clone(),
                        message: format!(
                            "batch input %{name} is {ty}: an integer or bool input needs its range for the synthetic \
                             batch ([model.inputs] {name} = {{ max = N }}, values in 0..N; 2 for a bool mask), or \
                             train on [data]"
                        ),
                    });
                };
                let v: Vec<f64> = key.random_bits(n).iter().map(|&b| (b as u64 % max) as f64).collect();
                HostTensor::from_values(ty, &v)?
            };
            out.insert(name.clone(), t);
        }
        Ok(out)
    }
}

/// Sets the sharding annotation of the loss function's parameters named in
/// `shardings` (as the builder's `param_sharded` does); a rank that does
/// not fit is an error.
pub fn annotate(module: &mut Module, loss: &str, shardings: &super::Shardings) -> Result<()> {
    let f = module.function_mut(loss).ok_or_else(|| Error::Usage(format!("the module has no function @{loss}")))?;
    for i in 0..f.params.len() {
        let name = f.param_name(i);
        if let Some(s) = shardings.get(&name) {
            let v = f.params[i];
            if s.rank() != f.ty(v).rank() {
                return Err(Error::Usage(format!(
                    "sharding {s} of %{name} has rank {} but its type is {}",
                    s.rank(),
                    f.ty(v)
                )));
            }
            f.values[v.index()].sharding = Some(s.clone());
        }
    }
    Ok(())
}

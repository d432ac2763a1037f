//! [`Trainer`]: train a model built in Rust on the engine behind `weft
//! train` — the same mesh, strategies, `[shardings]`, optimizers,
//! checkpoints, `--resume`, `[data]`, `[pipeline]` and `mpirun` — with the
//! options written as a config file's keys (without `[model]`: the model is
//! the module).
//!
//! ```no_run
//! use weft::ir::builder::FunctionBuilder;
//! use weft::ir::{DType, Module};
//! use weft::Trainer;
//!
//! let f = FunctionBuilder::new("loss");
//! let w = f.param("params.w", DType::F32, &[4, 1]);
//! let x = f.param("x", DType::F32, &[8, 4]);
//! let y = f.param("y", DType::F32, &[8, 1]);
//! let d = f.sub(f.matmul(x, w), y);
//! f.set_results(&[f.mean_all(f.mul(d, d))]);
//! let module = Module { functions: vec![f.finish().unwrap()] };
//! let summary = Trainer::new("linear", module)
//!     .unwrap()
//!     .init(&[("params.*", "zeros")])
//!     .unwrap()
//!     .options("steps = 10\nmesh = \"data=2\"\nstrategy = \"dp\"")
//!     .unwrap()
//!     .run(&mut |line| println!("{line:?}"))
//!     .unwrap();
//! println!("{:?}", summary.metrics.last());
//! ```

use crate::error::{Error, Result};
use crate::models::{init::parse_rules, rules::Rules, Init, Model};
use crate::runner::processes::Launch;
use crate::runner::{run_model_on, Line, Overrides, RunConfig, RunSummary};
use std::path::PathBuf;
use weft_ir::Module;

/// A model built in Rust and the options of its run.
pub struct Trainer {
    model: Model,
    config: RunConfig,
    overrides: Overrides,
}

impl Trainer {
    /// A trainer of `module`, whose function `@loss` is minimised (the
    /// contract of `specs/training.md`, "Program models"); `name` names the
    /// model in messages and `run.json`. Its parameters need
    /// [`Trainer::init`] rules (or [`Trainer::init_from`]); it runs one
    /// step on one device until [`Trainer::options`] says otherwise.
    pub fn new(name: &str, module: Module) -> Result<Trainer> {
        Trainer::with_loss(name, module, "loss")
    }

    /// [`Trainer::new`] minimising the function `loss`.
    pub fn with_loss(name: &str, module: Module, loss: &str) -> Result<Trainer> {
        let model = Model::program(name, module, loss, Init::Rules(Rules::default()))?;
        let config = options_config(name, "steps = 1")?;
        Ok(Trainer { model, config, overrides: Overrides { quiet: true, ..Default::default() } })
    }

    /// Initialisation rules, as `[model.init]` writes them: name patterns
    /// and `normal(STD)`, `uniform(LO, HI)`, `zeros`, `ones`,
    /// `constant(V)`, `fan_in`; the first match wins.
    pub fn init(mut self, rules: &[(&str, &str)]) -> Result<Trainer> {
        let rules = parse_rules(rules.iter().copied())
            .map_err(|message| Error::Model { what: "Trainer::init".into(), message })?;
        self.model.init = Init::Rules(rules);
        Ok(self)
    }

    /// Initial parameters from a safetensors file (as `init_from`).
    pub fn init_from(mut self, path: impl Into<PathBuf>) -> Result<Trainer> {
        self.model.init = Init::File(path.into());
        Ok(self)
    }

    /// Ranges of integer batch inputs (as `[model.inputs]`): values in
    /// `0..max`. A name that is not an integer input of the loss function,
    /// or a `max` outside `[1, 2^31]`, is an error.
    pub fn int_inputs(mut self, ranges: &[(&str, u64)]) -> Result<Trainer> {
        self.model.set_int_ranges(ranges.iter().copied(), "Trainer::int_inputs")?;
        Ok(self)
    }

    /// The run's options as a config file writes them, without `[model]`:
    /// `steps`, `mesh`, `strategy`, `backend`, `[optimizer]`,
    /// `[checkpoint]`, `[shardings]`, `[data]`, `[pipeline]`, ...
    pub fn options(mut self, toml: &str) -> Result<Trainer> {
        self.config = options_config(&self.model.label, toml)?;
        Ok(self)
    }

    /// Command-line style overrides (`--resume`, `--steps`, a progress
    /// bar: `quiet = false`).
    pub fn overrides(mut self, ov: Overrides) -> Trainer {
        self.overrides = ov;
        self
    }

    /// The model being trained.
    pub fn model(&self) -> &Model {
        &self.model
    }

    /// Trains: as one process, or as one process of an `mpirun`/`srun`
    /// job (built with the `mpi` feature). `log` receives the lines
    /// `weft train` prints.
    pub fn run(&self, log: &mut dyn FnMut(Line)) -> Result<RunSummary> {
        let launch = Launch::from_environment()?;
        // `run_model_on` validates the options before anything is built.
        let c = self.overrides.apply(self.config.clone());
        run_model_on(&c, &self.model, &self.overrides, launch.processes.as_ref(), log)
    }
}

/// A run config from options without `[model]`: the model is `name`'s
/// module (recorded as its program in `run.json`).
fn options_config(name: &str, toml_text: &str) -> Result<RunConfig> {
    let mut table: toml::Table = toml_text.parse().map_err(|e| Error::Usage(format!("Trainer options: {e}")))?;
    if table.contains_key("model") {
        return Err(Error::Usage("Trainer options: no [model] table: the trainer's model is its module".into()));
    }
    let mut model = toml::Table::new();
    model.insert("program".into(), toml::Value::String(format!("<{name}>")));
    table.insert("model".into(), toml::Value::Table(model));
    table.try_into().map_err(|e| Error::Usage(format!("Trainer options: {e}")))
}

//! Modules of functions that call each other, and the `call` op.
//!
//! Functions are added in dependency order: [`ModuleBuilder::function`]
//! hands out a builder that knows the signatures of every function added so
//! far, so `call` is type-checked (by [`crate::infer()`]) as it is built and
//! recursion cannot be expressed. Errors are sticky here too: the first
//! failing function's error is kept and reported by
//! [`ModuleBuilder::finish`].

use super::{FunctionBuilder, Value};
use crate::{IrError, Module, Op, Signature};

/// Builds a [`Module`]; see the [module docs](crate::builder).
///
/// ```
/// use weft_ir::builder::ModuleBuilder;
/// use weft_ir::DType::F32;
///
/// let mut mb = ModuleBuilder::new();
/// mb.define("square", |f| {
///     let x = f.param("x", F32, &[4]);
///     vec![f.mul(x, x)]
/// });
/// mb.define("main", |f| {
///     let x = f.param("x", F32, &[4]);
///     let [y] = f.call_n("square", &[x]);
///     vec![f.sum_all(y)]
/// });
/// let m = mb.finish().unwrap();
/// assert_eq!(m.functions.len(), 2);
/// ```
#[derive(Default)]
pub struct ModuleBuilder {
    module: Module,
    error: Option<IrError>,
}

impl ModuleBuilder {
    /// An empty module builder.
    pub fn new() -> ModuleBuilder {
        ModuleBuilder::default()
    }

    /// Continues building an existing module (e.g. to add a gradient or a
    /// training step next to a model's forward function).
    pub fn from_module(module: Module) -> ModuleBuilder {
        ModuleBuilder { module, error: None }
    }

    /// A builder for a new function that may call every function added so
    /// far. Give it back with [`add`](Self::add).
    pub fn function(&self, name: &str) -> FunctionBuilder {
        FunctionBuilder::in_module(name, &self.module)
    }

    /// Finishes `f` and adds it to the module. An error (the function's own,
    /// or a duplicate name) is kept and reported by [`finish`](Self::finish);
    /// after an error, further functions are ignored.
    #[track_caller]
    pub fn add(&mut self, f: FunctionBuilder) {
        if self.error.is_some() {
            return;
        }
        match f.finish() {
            Err(e) => self.error = Some(e),
            Ok(func) if self.module.function(&func.name).is_some() => {
                let loc = std::panic::Location::caller();
                self.error = Some(IrError::Builder(format!(
                    "@{}: a function of that name was already added (at {}:{}:{})",
                    func.name,
                    loc.file(),
                    loc.line(),
                    loc.column()
                )));
            }
            Ok(func) => self.module.functions.push(func),
        }
    }

    /// Builds and adds a function in one go: `body` declares parameters and
    /// ops and returns the results.
    #[track_caller]
    pub fn define(&mut self, name: &str, body: impl FnOnce(&FunctionBuilder) -> Vec<Value>) {
        let f = self.function(name);
        let results = body(&f);
        f.set_results(&results);
        self.add(f);
    }

    /// The signature of a function added so far.
    pub fn signature(&self, name: &str) -> Option<Signature> {
        self.module.signature(name)
    }

    /// The functions added so far.
    pub fn module(&self) -> &Module {
        &self.module
    }

    /// The first error, or the module (verified as a whole).
    pub fn finish(self) -> Result<Module, IrError> {
        if let Some(e) = self.error {
            return Err(e);
        }
        crate::verify_module(&self.module)?;
        Ok(self.module)
    }
}

impl FunctionBuilder {
    /// Calls `callee` (a function of the module this builder was started
    /// from) and returns its results. If the call is ill-typed, the error is
    /// recorded and the vector holds one placeholder per callee result (one
    /// if the callee is unknown).
    #[track_caller]
    pub fn call(&self, callee: &str, args: &[Value]) -> Vec<Value> {
        self.emit(Op::Call { callee: callee.to_string(), remat: false }, args)
    }

    /// [`call`](Self::call) marked for rematerialization: differentiation
    /// recomputes the callee's activations in the backward pass instead of
    /// keeping them (like `jax.checkpoint`).
    #[track_caller]
    pub fn call_remat(&self, callee: &str, args: &[Value]) -> Vec<Value> {
        self.emit(Op::Call { callee: callee.to_string(), remat: true }, args)
    }

    /// [`call`](Self::call) for a callee with exactly `N` results:
    /// `let [loss, grad] = f.call_n("step", &[x]);`. Another result count is
    /// an error (and gives `N` placeholders).
    #[track_caller]
    pub fn call_n<const N: usize>(&self, callee: &str, args: &[Value]) -> [Value; N] {
        let r = self.call(callee, args);
        self.exactly(callee, r)
    }

    /// [`call_remat`](Self::call_remat) for a callee with exactly `N` results.
    #[track_caller]
    pub fn call_remat_n<const N: usize>(&self, callee: &str, args: &[Value]) -> [Value; N] {
        let r = self.call_remat(callee, args);
        self.exactly(callee, r)
    }

    #[track_caller]
    fn exactly<const N: usize>(&self, callee: &str, r: Vec<Value>) -> [Value; N] {
        let n = r.len();
        match <[Value; N]>::try_from(r) {
            Ok(a) => a,
            Err(_) => {
                self.fail("call", format!("@{callee} returns {n} result(s), not {N}"));
                [self.poison(); N]
            }
        }
    }
}

//! The function builder's state: values, sticky errors, parameters,
//! results and `finish`.
//!
//! The state sits in a `RefCell` so that every op method takes `&self` and
//! calls nest (`f.add(f.mul(a, b), c)` would not borrow-check with `&mut`).
//! Errors are sticky: the first one is recorded with the op name and the
//! caller's location, and from then on every method returns a placeholder
//! [`Value`] without adding instructions or further errors. Composite
//! helpers run inside [`FunctionBuilder::scope`], which remembers the
//! caller's location and the composite's name, so an error deep inside
//! `softmax` is reported as "`exp` in `softmax` at <your file>:<line>".

use crate::verify::is_value_name;
use crate::{infer, DType, Function, IrError, Module, Op, TensorSharding, TensorType, ValueDef, ValueId};
use std::cell::RefCell;
use std::panic::Location;

/// A handle to a value of the function being built. Cheap to copy; only
/// meaningful to the [`FunctionBuilder`] that returned it (using it with
/// another builder is reported as an error).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct Value {
    /// Index in the builder's value arena, or `POISON`.
    pub(crate) id: u32,
    /// Identifies the builder (a hash of the function name).
    pub(crate) tag: u32,
}

const POISON: u32 = u32::MAX;

impl Value {
    /// True for the placeholder returned by a builder after its first error.
    pub fn is_placeholder(self) -> bool {
        self.id == POISON
    }
}

struct State {
    func: Function,
    results_set: bool,
    error: Option<String>,
    /// The outermost composite being built and where the user called it.
    ctx: Option<(&'static str, &'static Location<'static>)>,
}

/// Builds one function; see the [module docs](crate::builder).
pub struct FunctionBuilder {
    st: RefCell<State>,
    /// Functions this one may call (a snapshot of the module so far).
    pub(crate) callees: Module,
    tag: u32,
}

/// FNV-1a of the function name: tells values of different functions apart
/// without any global counter.
fn name_tag(name: &str) -> u32 {
    name.bytes().fold(0x811c_9dc5u32, |h, b| (h ^ b as u32).wrapping_mul(0x0100_0193))
}

impl FunctionBuilder {
    /// A builder for a function that calls no other function.
    pub fn new(name: &str) -> FunctionBuilder {
        FunctionBuilder::in_module(name, &Module::new())
    }

    /// A builder for a function that may call the functions of `module`
    /// (which is copied; the new function is not added to it).
    pub fn in_module(name: &str, module: &Module) -> FunctionBuilder {
        let mut error = None;
        if !crate::verify::is_identifier(name) {
            error = Some(format!("@{name}: `{name}` is not a valid function name"));
        }
        let st = State { func: Function::new(name), results_set: false, error, ctx: None };
        FunctionBuilder { st: RefCell::new(st), callees: module.clone(), tag: name_tag(name) }
    }

    /// The name of the function being built.
    pub fn func_name(&self) -> String {
        self.st.borrow().func.name.clone()
    }

    /// The first error recorded so far, if any (as `finish` would report it).
    pub fn error_message(&self) -> Option<String> {
        self.st.borrow().error.clone()
    }

    /// True once an error has been recorded.
    pub fn has_error(&self) -> bool {
        self.st.borrow().error.is_some()
    }

    /// The placeholder value returned after an error.
    pub(crate) fn poison(&self) -> Value {
        Value { id: POISON, tag: self.tag }
    }

    /// Records `msg` as the error of `op` unless an error is already
    /// recorded. The location is the one captured by the outermost
    /// [`scope`](Self::scope), else the `#[track_caller]` chain's caller.
    #[track_caller]
    pub(crate) fn fail(&self, op: &str, msg: impl Into<String>) {
        let mut st = self.st.borrow_mut();
        if st.error.is_some() {
            return;
        }
        let (loc, within) = match st.ctx {
            Some((name, loc)) if name != op => (loc, format!(" in `{name}`")),
            Some((_, loc)) => (loc, String::new()),
            None => (Location::caller(), String::new()),
        };
        let msg = msg.into();
        st.error =
            Some(format!("@{}: `{op}`{within} at {}:{}:{}: {msg}", st.func.name, loc.file(), loc.line(), loc.column()));
    }

    /// Runs a composite helper's body with the caller's location and the
    /// composite's name recorded for error messages. Inside `body`, builder
    /// calls may come from closures (which lose `#[track_caller]`); errors
    /// still point at the user's call of the outermost composite.
    #[track_caller]
    pub(crate) fn scope<T>(&self, name: &'static str, body: impl FnOnce() -> T) -> T {
        let loc = Location::caller();
        let outer = {
            let mut st = self.st.borrow_mut();
            let outer = st.ctx.is_none();
            if outer {
                st.ctx = Some((name, loc));
            }
            outer
        };
        let r = body();
        if outer {
            self.st.borrow_mut().ctx = None;
        }
        r
    }

    /// The type of `v` if the builder has no error and `v` is one of its
    /// values; otherwise records an error for `op` (unless one exists) and
    /// returns `None`. Composites validate their inputs with this.
    #[track_caller]
    pub(crate) fn input(&self, op: &str, v: Value) -> Option<TensorType> {
        let st = self.st.borrow();
        if st.error.is_some() {
            return None;
        }
        if v.tag != self.tag || v.id as usize >= st.func.values.len() {
            drop(st);
            self.fail(op, "got a value that belongs to another function builder");
            return None;
        }
        Some(st.func.values[v.id as usize].ty.clone())
    }

    /// Types of several inputs (see [`input`](Self::input)).
    #[track_caller]
    pub(crate) fn inputs(&self, op: &str, vs: &[Value]) -> Option<Vec<TensorType>> {
        let mut out = Vec::with_capacity(vs.len());
        for &v in vs {
            out.push(self.input(op, v)?);
        }
        Some(out)
    }

    /// Normalizes a NumPy-style axis (negative counts from the end).
    #[track_caller]
    pub(crate) fn axis(&self, op: &str, ty: &TensorType, axis: isize) -> Option<usize> {
        let r = ty.rank() as isize;
        let a = if axis < 0 { axis + r } else { axis };
        if a < 0 || a >= r {
            self.fail(op, format!("axis {axis} is out of range for {ty}"));
            return None;
        }
        Some(a as usize)
    }

    /// Normalizes a list of axes; the result is sorted, duplicates are errors.
    #[track_caller]
    pub(crate) fn axes(&self, op: &str, ty: &TensorType, axes: &[isize]) -> Option<Vec<usize>> {
        let mut out = Vec::with_capacity(axes.len());
        for &a in axes {
            out.push(self.axis(op, ty, a)?);
        }
        out.sort_unstable();
        if out.windows(2).any(|w| w[0] == w[1]) {
            self.fail(op, format!("axes {axes:?} name a dimension of {ty} twice"));
            return None;
        }
        Some(out)
    }

    /// Appends any op applied to `operands` and returns its results (one
    /// per result; `call` may have several). Result types come from
    /// [`crate::infer()`]; an ill-typed op records the error and returns
    /// placeholders. This is the escape hatch under every other method, and
    /// lets passes such as autodiff copy instructions from another function.
    #[track_caller]
    pub fn emit(&self, op: Op, operands: &[Value]) -> Vec<Value> {
        let name = op.name();
        let n_results = match &op {
            Op::Call { callee } => self.callees.signature(callee).map_or(1, |s| s.results.len()),
            _ => 1,
        };
        let Some(tys) = self.inputs(name, operands) else { return vec![self.poison(); n_results] };
        let refs: Vec<&TensorType> = tys.iter().collect();
        let types = match infer(&op, &refs, &self.callees) {
            Ok(t) => t,
            Err(msg) => {
                self.fail(name, msg);
                return vec![self.poison(); n_results];
            }
        };
        let mut st = self.st.borrow_mut();
        let ids: Vec<ValueId> = operands.iter().map(|v| ValueId(v.id)).collect();
        let inst = st.func.add_inst(op, ids, types.into_iter().map(|t| (t, None)).collect(), None);
        st.func.insts[inst.index()].results.iter().map(|r| Value { id: r.0, tag: self.tag }).collect()
    }

    /// [`emit`](Self::emit) for single-result ops.
    #[track_caller]
    pub(crate) fn emit1(&self, op: Op, operands: &[Value]) -> Value {
        self.emit(op, operands).into_iter().next().unwrap_or_else(|| self.poison())
    }

    /// Declares a parameter named `name` (a valid, unique value name such as
    /// `x` or `params.layers.0.w1`). Parameters may be declared at any
    /// point; `finish` numbers them before all instruction results.
    #[track_caller]
    pub fn param(&self, name: &str, dtype: DType, shape: &[usize]) -> Value {
        self.add_param(name, TensorType::new(dtype, shape.to_vec()), None)
    }

    /// Declares a parameter with a sharding annotation (like a `jit`
    /// `in_shardings` entry). The sharding's rank must equal the shape's.
    #[track_caller]
    pub fn param_sharded(&self, name: &str, dtype: DType, shape: &[usize], sharding: TensorSharding) -> Value {
        self.add_param(name, TensorType::new(dtype, shape.to_vec()), Some(sharding))
    }

    #[track_caller]
    fn add_param(&self, name: &str, ty: TensorType, sharding: Option<TensorSharding>) -> Value {
        if self.has_error() || !self.check_name("param", name) {
            return self.poison();
        }
        if let Some(s) = &sharding {
            if s.rank() != ty.rank() {
                self.fail("param", format!("sharding {s} of %{name} has rank {} but its type is {ty}", s.rank()));
                return self.poison();
            }
        }
        let mut st = self.st.borrow_mut();
        let id = st.func.add_param(Some(name.to_string()), ty);
        st.func.values[id.index()].sharding = sharding;
        Value { id: id.0, tag: self.tag }
    }

    #[track_caller]
    fn check_name(&self, op: &str, name: &str) -> bool {
        if !is_value_name(name) {
            self.fail(op, format!("`{name}` is not a valid value name ([A-Za-z0-9_.]+, not all digits)"));
            return false;
        }
        if self.st.borrow().func.value_by_name(name).is_some() {
            self.fail(op, format!("the name `%{name}` is already used in this function"));
            return false;
        }
        true
    }

    /// Gives `v` a name (printed `%name` instead of `%N`) and returns `v`.
    #[track_caller]
    pub fn name(&self, v: Value, name: &str) -> Value {
        if self.input("name", v).is_none() {
            return self.poison();
        }
        let current = self.st.borrow().func.values[v.id as usize].name.clone();
        if current.as_deref() == Some(name) || !self.check_name("name", name) {
            return v;
        }
        self.st.borrow_mut().func.values[v.id as usize].name = Some(name.to_string());
        v
    }

    /// The value named `name` (a parameter or a value named with
    /// [`name`](Self::name)), if any.
    pub fn value_by_name(&self, name: &str) -> Option<Value> {
        self.st.borrow().func.value_by_name(name).map(|id| Value { id: id.0, tag: self.tag })
    }

    /// The parameters declared so far, in order.
    pub fn params(&self) -> Vec<Value> {
        self.st.borrow().func.params.iter().map(|p| Value { id: p.0, tag: self.tag }).collect()
    }

    /// The type of `v` (`f32[]` for a placeholder).
    #[track_caller]
    pub fn ty(&self, v: Value) -> TensorType {
        if v.tag == self.tag && v.id == POISON {
            return TensorType::scalar(DType::F32);
        }
        let st = self.st.borrow();
        match st.func.values.get(v.id as usize) {
            Some(d) if v.tag == self.tag => d.ty.clone(),
            _ => {
                drop(st);
                self.fail("ty", "got a value that belongs to another function builder");
                TensorType::scalar(DType::F32)
            }
        }
    }

    /// The shape of `v`.
    #[track_caller]
    pub fn shape(&self, v: Value) -> Vec<usize> {
        self.ty(v).shape
    }

    /// The element type of `v`.
    #[track_caller]
    pub fn dtype(&self, v: Value) -> DType {
        self.ty(v).dtype
    }

    /// The rank of `v`.
    #[track_caller]
    pub fn rank(&self, v: Value) -> usize {
        self.ty(v).rank()
    }

    /// Sets the function's results (replacing any set before).
    #[track_caller]
    pub fn set_results(&self, results: &[Value]) {
        if self.inputs("set_results", results).is_none() {
            return;
        }
        let mut st = self.st.borrow_mut();
        st.func.results = results.iter().map(|v| ValueId(v.id)).collect();
        st.results_set = true;
    }

    /// Requests a sharding for each result (like `jit(out_shardings=...)`):
    /// one entry per result, `None` for "let the compiler choose". Checked
    /// against the results when they are set (in either order).
    #[track_caller]
    pub fn set_result_shardings(&self, shardings: &[Option<TensorSharding>]) {
        if self.has_error() {
            return;
        }
        self.st.borrow_mut().func.result_shardings = shardings.to_vec();
        self.check_result_shardings();
    }

    #[track_caller]
    fn check_result_shardings(&self) -> bool {
        let st = self.st.borrow();
        let f = &st.func;
        if f.result_shardings.is_empty() || !st.results_set {
            return true;
        }
        let msg = if f.result_shardings.len() != f.results.len() {
            Some(format!("{} result shardings for {} results", f.result_shardings.len(), f.results.len()))
        } else {
            f.result_shardings.iter().zip(&f.results).enumerate().find_map(|(k, (s, &r))| match s {
                Some(s) if s.rank() != f.ty(r).rank() => {
                    Some(format!("sharding {s} of result {k} has rank {} but the result is {}", s.rank(), f.ty(r)))
                }
                _ => None,
            })
        };
        drop(st);
        match msg {
            Some(m) => {
                self.fail("set_result_shardings", m);
                false
            }
            None => true,
        }
    }

    /// Finishes the function: reports the first recorded error, checks that
    /// results were set, numbers parameters first, and verifies the function
    /// (against the module it may call).
    #[track_caller]
    pub fn finish(self) -> Result<Function, IrError> {
        if self.st.borrow().results_set {
            self.check_result_shardings();
        }
        let st = self.st.into_inner();
        if let Some(e) = st.error {
            return Err(IrError::Builder(e));
        }
        if !st.results_set {
            return Err(IrError::Builder(format!("@{}: no results were set (call set_results)", st.func.name)));
        }
        let func = params_first(st.func);
        crate::verify_function(&self.callees, &func)?;
        Ok(func)
    }

    /// Finishes the function and wraps it in a module together with the
    /// functions it may call.
    #[track_caller]
    pub fn finish_module(self) -> Result<Module, IrError> {
        let mut m = self.callees.clone();
        m.functions.push(self.finish()?);
        crate::verify_module(&m)?;
        Ok(m)
    }
}

/// Renumbers values so parameters come first, then instruction results in
/// program order (the IR's invariant), when some parameter was declared
/// after an instruction.
fn params_first(mut f: Function) -> Function {
    if f.params.iter().enumerate().all(|(i, p)| p.index() == i) {
        return f;
    }
    let mut order: Vec<ValueId> = f.params.clone();
    order.extend(f.insts.iter().flat_map(|i| i.results.iter().copied()));
    let mut map = vec![ValueId(u32::MAX); f.values.len()];
    for (new, old) in order.iter().enumerate() {
        map[old.index()] = ValueId(new as u32);
    }
    let m = |v: &mut ValueId| *v = map[v.index()];
    f.values = order.iter().map(|old| f.values[old.index()].clone()).collect();
    f.params.iter_mut().for_each(m);
    f.results.iter_mut().for_each(m);
    for inst in &mut f.insts {
        inst.operands.iter_mut().for_each(m);
        inst.results.iter_mut().for_each(m);
    }
    debug_assert!(f.values.iter().enumerate().all(|(i, v)| match v.def {
        ValueDef::Param(p) => f.params[p as usize].index() == i,
        ValueDef::Inst { inst, index } => f.insts[inst.index()].results[index as usize].index() == i,
    }));
    f
}

//! The function builder's state: values, sticky errors, emitting ops
//! and `finish`.
//!
//! The state sits in a `RefCell` so that every op method takes `&self` and
//! calls nest (`f.add(f.mul(a, b), c)` would not borrow-check with `&mut`).
//! Errors are sticky: the first one is recorded with the op name and the
//! caller's location, and from then on every method returns a placeholder
//! [`Value`] without adding instructions or further errors. Composite
//! helpers run inside [`FunctionBuilder::scope`], which remembers the
//! caller's location and the composite's name, so an error deep inside
//! `softmax` is reported as "`exp` in `softmax` at your_file.rs:LINE:COL".

use crate::{infer, Function, IrError, Module, Op, TensorType, ValueDef, ValueId};
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

pub(super) const POISON: u32 = u32::MAX;

impl Value {
    /// True for the placeholder returned by a builder after its first error.
    pub fn is_placeholder(self) -> bool {
        self.id == POISON
    }
}

pub(super) struct State {
    pub(super) func: Function,
    pub(super) results_set: bool,
    pub(super) error: Option<String>,
    /// The outermost composite being built and where the user called it.
    ctx: Option<(&'static str, &'static Location<'static>)>,
}

/// Builds one function; see the [module docs](crate::builder).
pub struct FunctionBuilder {
    pub(super) st: RefCell<State>,
    /// Functions this one may call (a snapshot of the module so far).
    pub(crate) callees: Module,
    pub(super) tag: u32,
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
            Op::Call { callee, .. } => self.callees.signature(callee).map_or(1, |s| s.results.len()),
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

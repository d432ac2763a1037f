//! The function's interface: parameters, value names, type queries,
//! results and their requested shardings.
//!
//! Names are checked when given (valid and unique), with the caller's
//! location, rather than only by the verifier at `finish`.

use super::core::POISON;
use super::{FunctionBuilder, Value};
use crate::verify::is_value_name;
use crate::{DType, TensorSharding, TensorType, ValueId};

impl FunctionBuilder {
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
    pub(super) fn check_result_shardings(&self) -> bool {
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
}

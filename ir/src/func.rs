//! Modules, functions, instructions and values.
//!
//! Values and instructions live in per-function arenas indexed by typed
//! `u32` ids ([`ValueId`], [`InstId`]), as in Cranelift. A value's id is its
//! arena index and prints as `%N`; ids are assigned in definition order
//! (parameters first, then each instruction's results), so the text format
//! can refer to an unnamed value by its id and a printed program parses back
//! to the same ids. Values may also carry a name (`%x`, `%params.w1`), which
//! is printed instead of the id.
//!
//! Functions are straight-line SSA: the instruction list is the program
//! order, and a value may be used only after its definition.

use crate::{Op, TensorSharding, TensorType};
use std::fmt;

/// Identifies a value within its function. Prints as `%N`.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ValueId(pub u32);

impl ValueId {
    /// The arena index.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for ValueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "%{}", self.0)
    }
}

/// Identifies an instruction within its function.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct InstId(pub u32);

impl InstId {
    /// The arena index (also the position in program order).
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for InstId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "inst{}", self.0)
    }
}

/// A position in source text (1-based line and column).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Loc {
    /// 1-based line.
    pub line: u32,
    /// 1-based column (in characters).
    pub col: u32,
}

impl fmt::Display for Loc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.line, self.col)
    }
}

/// Where a value comes from.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum ValueDef {
    /// The function's parameter at this position.
    Param(u32),
    /// Result number `index` of an instruction.
    Inst {
        /// The defining instruction.
        inst: InstId,
        /// Which of its results.
        index: u32,
    },
}

/// Everything known about one value.
#[derive(Clone, Debug, PartialEq)]
pub struct ValueData {
    /// Its type.
    pub ty: TensorType,
    /// Optional name, printed instead of the id.
    pub name: Option<String>,
    /// Where it is defined.
    pub def: ValueDef,
    /// Its sharding, when annotated (by the user on parameters, or by
    /// sharding propagation on every value).
    pub sharding: Option<TensorSharding>,
}

/// One instruction: an op applied to operands, defining result values.
#[derive(Clone, Debug, PartialEq)]
pub struct Inst {
    /// The operation and its attributes.
    pub op: Op,
    /// Operand values, in order.
    pub operands: Vec<ValueId>,
    /// Result values, in order (one for every op except `call`).
    pub results: Vec<ValueId>,
    /// Source position, when parsed from text.
    pub loc: Option<Loc>,
}

/// A function: parameters, a straight-line body and results.
#[derive(Clone, Debug, PartialEq)]
pub struct Function {
    /// Name (printed `@name`).
    pub name: String,
    /// Parameter values, in order.
    pub params: Vec<ValueId>,
    /// Result values, in order.
    pub results: Vec<ValueId>,
    /// Requested sharding of each result (like `jit(out_shardings=...)`);
    /// empty, or one entry per result.
    pub result_shardings: Vec<Option<TensorSharding>>,
    /// Value arena.
    pub values: Vec<ValueData>,
    /// Instruction arena, in program order.
    pub insts: Vec<Inst>,
    /// Source position of the `func` keyword, when parsed.
    pub loc: Option<Loc>,
    /// Source position of the `return`, when parsed.
    pub return_loc: Option<Loc>,
}

impl Function {
    /// An empty function with no parameters and no results.
    pub fn new(name: impl Into<String>) -> Function {
        Function {
            name: name.into(),
            params: Vec::new(),
            results: Vec::new(),
            result_shardings: Vec::new(),
            values: Vec::new(),
            insts: Vec::new(),
            loc: None,
            return_loc: None,
        }
    }

    /// Appends a parameter and returns its value.
    pub fn add_param(&mut self, name: Option<String>, ty: TensorType) -> ValueId {
        let id = self.next_value_id();
        let pos = self.params.len() as u32;
        self.values.push(ValueData { ty, name, def: ValueDef::Param(pos), sharding: None });
        self.params.push(id);
        id
    }

    /// Appends an instruction with results of the given types (and optional
    /// names) and returns the new instruction's id.
    pub fn add_inst(
        &mut self,
        op: Op,
        operands: Vec<ValueId>,
        results: Vec<(TensorType, Option<String>)>,
        loc: Option<Loc>,
    ) -> InstId {
        let inst = InstId(self.insts.len() as u32);
        let mut ids = Vec::with_capacity(results.len());
        for (index, (ty, name)) in results.into_iter().enumerate() {
            let id = self.next_value_id();
            self.values.push(ValueData { ty, name, def: ValueDef::Inst { inst, index: index as u32 }, sharding: None });
            ids.push(id);
        }
        self.insts.push(Inst { op, operands, results: ids, loc });
        inst
    }

    /// The id the next defined value will get.
    pub fn next_value_id(&self) -> ValueId {
        ValueId(u32::try_from(self.values.len()).expect("more than 2^32 values in one function"))
    }

    /// Data of a value. Panics (a broken invariant) if the id is out of range.
    pub fn value(&self, v: ValueId) -> &ValueData {
        self.values.get(v.index()).unwrap_or_else(|| panic!("{v} is not a value of @{}", self.name))
    }

    /// Type of a value.
    pub fn ty(&self, v: ValueId) -> &TensorType {
        &self.value(v).ty
    }

    /// An instruction. Panics (a broken invariant) if the id is out of range.
    pub fn inst(&self, i: InstId) -> &Inst {
        self.insts.get(i.index()).unwrap_or_else(|| panic!("{i} is not an instruction of @{}", self.name))
    }

    /// Iterates over instructions with their ids, in program order.
    pub fn iter_insts(&self) -> impl Iterator<Item = (InstId, &Inst)> {
        self.insts.iter().enumerate().map(|(i, inst)| (InstId(i as u32), inst))
    }

    /// Parameter types, in order.
    pub fn param_types(&self) -> Vec<TensorType> {
        self.params.iter().map(|&p| self.ty(p).clone()).collect()
    }

    /// Result types, in order.
    pub fn result_types(&self) -> Vec<TensorType> {
        self.results.iter().map(|&r| self.ty(r).clone()).collect()
    }

    /// Finds a value by name.
    pub fn value_by_name(&self, name: &str) -> Option<ValueId> {
        self.values.iter().position(|v| v.name.as_deref() == Some(name)).map(|i| ValueId(i as u32))
    }

    /// The name of parameter `i` (its value's name, or `arg{i}` if unnamed).
    pub fn param_name(&self, i: usize) -> String {
        self.value(self.params[i]).name.clone().unwrap_or_else(|| format!("arg{i}"))
    }

    /// How a value is written in the text format: `%name` or `%N`.
    pub fn value_ref(&self, v: ValueId) -> String {
        match self.values.get(v.index()).and_then(|d| d.name.as_ref()) {
            Some(n) => format!("%{n}"),
            None => v.to_string(),
        }
    }
}

/// A set of functions that may call each other.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Module {
    /// Functions, in definition order.
    pub functions: Vec<Function>,
}

impl Module {
    /// An empty module.
    pub fn new() -> Module {
        Module::default()
    }

    /// Finds a function by name.
    pub fn function(&self, name: &str) -> Option<&Function> {
        self.functions.iter().find(|f| f.name == name)
    }

    /// Finds a function by name, mutably.
    pub fn function_mut(&mut self, name: &str) -> Option<&mut Function> {
        self.functions.iter_mut().find(|f| f.name == name)
    }

    /// The signature (parameter and result types) of a function, if present.
    pub fn signature(&self, name: &str) -> Option<Signature> {
        self.function(name).map(|f| Signature { params: f.param_types(), results: f.result_types() })
    }
}

/// Parameter and result types of a function.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Signature {
    /// Parameter types.
    pub params: Vec<TensorType>,
    /// Result types.
    pub results: Vec<TensorType>,
}

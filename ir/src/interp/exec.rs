//! The execution loop: input checking, instruction dispatch, calls, and
//! freeing values after their last use.
//!
//! Each function gets a small plan once, when the [`Interpreter`] is built:
//! for every instruction, the values whose last use it is. Values live in a
//! per-call environment indexed by value id; parameters are borrowed from
//! the caller (no copy of the inputs), instruction results are owned.
//! Identity-like ops (`sharding_constraint`, `reshard`, `reshape`) take their
//! operand instead of copying it when this is its last use.

use super::shape;
use crate::callgraph::CallGraph;
use crate::limits::MemoryLimit;
use crate::tensor::HostTensor;
use crate::{verify_module, Diagnostic, Function, Inst, IrError, Module, Op, ValueDef, ValueId};
use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};

/// The most instructions one run may execute, counting every call's body
/// each time it is called: 2^24. Checked before running, from the call
/// graph, so a small module whose functions each call the next twice is an
/// error instead of a run that never ends.
pub const MAX_INTERP_INSTS: u64 = 1 << 24;

/// Runs functions of one verified module. Build it once and reuse it.
pub struct Interpreter<'m> {
    module: &'m Module,
    by_name: HashMap<&'m str, usize>,
    plans: Vec<Plan>,
    /// Per function, its instructions with calls expanded (`None`: the
    /// module recurses).
    expanded: Option<Vec<u64>>,
    /// No instruction may produce more bytes than this.
    memory_limit: Option<MemoryLimit>,
}

/// Per-function liveness, computed once.
struct Plan {
    /// For each instruction, the values to drop after it runs.
    frees: Vec<Vec<ValueId>>,
    /// Parameters no instruction or result uses.
    unused_params: Vec<ValueId>,
}

/// Values of one running function, by value id.
type Env<'a> = Vec<Option<Cow<'a, HostTensor>>>;

impl Plan {
    fn new(f: &Function) -> Plan {
        let n = f.values.len();
        let mut last_use: Vec<Option<usize>> = vec![None; n];
        for (i, inst) in f.insts.iter().enumerate() {
            for v in &inst.operands {
                last_use[v.index()] = Some(i);
            }
        }
        let mut is_result = vec![false; n];
        for r in &f.results {
            is_result[r.index()] = true;
        }
        let mut frees = vec![Vec::new(); f.insts.len()];
        let mut unused_params = Vec::new();
        for (v, data) in f.values.iter().enumerate() {
            let id = ValueId(v as u32);
            match (is_result[v], last_use[v], data.def) {
                (true, _, _) => {}
                (false, Some(i), _) => frees[i].push(id),
                (false, None, ValueDef::Param(_)) => unused_params.push(id),
                (false, None, ValueDef::Inst { inst, .. }) => {
                    if let Some(list) = frees.get_mut(inst.index()) {
                        list.push(id);
                    }
                }
            }
        }
        Plan { frees, unused_params }
    }
}

impl<'m> Interpreter<'m> {
    /// Verifies `module` ([`verify_module`]) and prepares to run it, with
    /// [`MemoryLimit::detect`]'s memory limit (`WEFT_MEMORY_LIMIT`, else the
    /// machine's memory; a malformed `WEFT_MEMORY_LIMIT` is an error).
    pub fn new(module: &'m Module) -> Result<Interpreter<'m>, IrError> {
        verify_module(module)?;
        Ok(Interpreter::from_verified(module).with_memory_limit(MemoryLimit::detect()?))
    }

    /// Prepares to run a module that has already passed [`verify_module`],
    /// without verifying it again, and without a memory limit (for callers
    /// that checked the program's memory already and run it many times; see
    /// [`Interpreter::with_memory_limit`]). On an unverified module,
    /// ill-typed instructions are reported as [`IrError::Interp`] where
    /// detected, and a use before definition panics.
    pub fn from_verified(module: &'m Module) -> Interpreter<'m> {
        let by_name = module.functions.iter().enumerate().map(|(i, f)| (f.name.as_str(), i)).collect();
        let plans = module.functions.iter().map(Plan::new).collect();
        // A module without calls (every inlined program, e.g. a training
        // step interpreted each step) needs no call graph: each function
        // runs its own instructions.
        let has_calls = module.functions.iter().any(|f| f.insts.iter().any(|i| matches!(i.op, Op::Call { .. })));
        let expanded = if has_calls {
            CallGraph::new(module).expanded_sizes()
        } else {
            Some(module.functions.iter().map(|f| f.insts.len() as u64).collect())
        };
        Interpreter { module, by_name, plans, expanded, memory_limit: None }
    }

    /// The same interpreter with another memory limit (`None`: unchecked):
    /// an instruction whose results would need more is an
    /// [`IrError::TooLarge`] before anything is allocated.
    pub fn with_memory_limit(mut self, limit: Option<MemoryLimit>) -> Interpreter<'m> {
        self.memory_limit = limit;
        self
    }

    /// The module this interpreter runs.
    pub fn module(&self) -> &'m Module {
        self.module
    }

    fn function(&self, name: &str) -> Result<usize, IrError> {
        let fi = self.by_name.get(name).copied().ok_or_else(|| {
            IrError::Interp(Diagnostic {
                func: name.to_string(),
                loc: None,
                subject: String::new(),
                message: "no function of this name in the module".into(),
            })
        })?;
        let size = self.expanded.as_ref().map(|s| s[fi]);
        if size.is_none_or(|n| n > MAX_INTERP_INSTS) {
            let graph = CallGraph::new(self.module);
            let message = match size {
                None => "the module has recursive calls (verify it first)".to_string(),
                Some(n) => format!(
                    "runs {} instructions once its calls are expanded, more than the interpreter's limit of \
                     {MAX_INTERP_INSTS}; the calls that multiply it: {}",
                    if n == u64::MAX { "more than 2^64".to_string() } else { n.to_string() },
                    graph.heaviest_chain(fi)
                ),
            };
            return Err(IrError::Interp(Diagnostic {
                func: name.to_string(),
                loc: None,
                subject: String::new(),
                message,
            }));
        }
        Ok(fi)
    }

    /// Runs `func` on positional `args` (borrowed, not copied).
    pub fn run(&self, func: &str, args: &[HostTensor]) -> Result<Vec<HostTensor>, IrError> {
        let fi = self.function(func)?;
        check_positional(&self.module.functions[fi], args.iter())?;
        self.exec(fi, args.iter().map(Cow::Borrowed).collect())
    }

    /// Runs `func` on positional `args`, consuming them (so they can be
    /// freed, or reused by identity ops, as soon as they are dead).
    pub fn run_owned(&self, func: &str, args: Vec<HostTensor>) -> Result<Vec<HostTensor>, IrError> {
        let fi = self.function(func)?;
        check_positional(&self.module.functions[fi], args.iter())?;
        self.exec(fi, args.into_iter().map(Cow::Owned).collect())
    }

    /// Runs `func` with inputs by parameter name (an unnamed parameter `i`
    /// is called `arg{i}`). Every parameter must be given exactly once, with
    /// its type, and no other names.
    pub fn run_named(&self, func: &str, inputs: &BTreeMap<String, HostTensor>) -> Result<Vec<HostTensor>, IrError> {
        let fi = self.function(func)?;
        let f = &self.module.functions[fi];
        let names: Vec<String> = (0..f.params.len()).map(|i| f.param_name(i)).collect();
        let mut args = Vec::with_capacity(names.len());
        for (name, &p) in names.iter().zip(&f.params) {
            let t = inputs.get(name).ok_or_else(|| IrError::Input {
                name: name.clone(),
                message: format!("missing input of @{}; expected {}", f.name, f.ty(p)),
            })?;
            check_type(name, f, p, t)?;
            args.push(Cow::Borrowed(t));
        }
        if let Some(extra) = inputs.keys().find(|k| !names.contains(k)) {
            return Err(IrError::Input {
                name: extra.clone(),
                message: format!("@{} has no parameter of this name (parameters: {})", f.name, names.join(", ")),
            });
        }
        self.exec(fi, args)
    }

    fn exec<'a>(&self, fi: usize, args: Vec<Cow<'a, HostTensor>>) -> Result<Vec<HostTensor>, IrError> {
        let f = &self.module.functions[fi];
        let plan = &self.plans[fi];
        let mut env: Env<'a> = (0..f.values.len()).map(|_| None).collect();
        for (&p, a) in f.params.iter().zip(args) {
            env[p.index()] = Some(a);
        }
        for v in &plan.unused_params {
            env[v.index()] = None;
        }
        for (inst, dying) in f.insts.iter().zip(&plan.frees) {
            let outs = self.exec_inst(f, inst, dying, &mut env)?;
            if outs.len() != inst.results.len() {
                let m = format!("produced {} results for {} result values", outs.len(), inst.results.len());
                return Err(diag(f, inst, m));
            }
            for (&r, t) in inst.results.iter().zip(outs) {
                if !t.has_type(f.ty(r)) {
                    return Err(diag(
                        f,
                        inst,
                        format!("produced {} but {} is declared {}", t.ty(), f.value_ref(r), f.ty(r)),
                    ));
                }
                env[r.index()] = Some(Cow::Owned(t));
            }
            for v in dying {
                env[v.index()] = None;
            }
        }
        let mut results = Vec::with_capacity(f.results.len());
        for (j, &r) in f.results.iter().enumerate() {
            let slot = &mut env[r.index()];
            // Move the value out at its last mention among the results.
            let t = if f.results[j + 1..].contains(&r) { slot.clone() } else { slot.take() };
            let t = t.unwrap_or_else(|| panic!("result {} of @{} has no value", f.value_ref(r), f.name));
            results.push(t.into_owned());
        }
        Ok(results)
    }

    fn exec_inst(
        &self,
        f: &Function,
        inst: &Inst,
        dying: &[ValueId],
        env: &mut Env<'_>,
    ) -> Result<Vec<HostTensor>, IrError> {
        let d = |m: String| diag(f, inst, m);
        if let Some(n) = inst.op.arity() {
            if inst.operands.len() != n {
                return Err(d(format!("takes {n} operands, got {}", inst.operands.len())));
            }
        }
        match &inst.op {
            Op::ShardingConstraint { .. } | Op::Reshard { .. } => return Ok(vec![take_or_clone(f, inst, dying, env)]),
            Op::Reshape { shape } => {
                return Ok(vec![shape::reshape(take_or_clone(f, inst, dying, env), shape).map_err(d)?])
            }
            Op::Call { callee, .. } => {
                let fi = self
                    .by_name
                    .get(callee.as_str())
                    .copied()
                    .ok_or_else(|| d(format!("unknown function @{callee}")))?;
                let callee_f = &self.module.functions[fi];
                let args: Vec<Cow<'_, HostTensor>> =
                    inst.operands.iter().map(|&v| Cow::Borrowed(operand(env, f, v))).collect();
                if let Err(e) = check_positional(callee_f, args.iter().map(|a| a.as_ref())) {
                    return Err(d(format!("bad arguments to @{callee}: {e}")));
                }
                return self.exec(fi, args);
            }
            _ => {}
        }
        if let Some(limit) = &self.memory_limit {
            let need = inst.results.iter().fold(0u64, |a, &r| a.saturating_add(f.ty(r).size_bytes() as u64));
            if need > limit.bytes {
                let results: Vec<String> = inst.results.iter().map(|&r| f.ty(r).to_string()).collect();
                let subject = crate::verify::inst_subject(f, inst_id(f, inst));
                let what = format!("in @{}: {subject} (result {})", f.name, results.join(", "));
                return Err(IrError::TooLarge {
                    what,
                    need,
                    limit: limit.bytes,
                    limit_source: limit.source.to_string(),
                });
            }
        }
        let xs: Vec<&HostTensor> = inst.operands.iter().map(|&v| operand(env, f, v)).collect();
        let out = super::eval_simple(&inst.op, &xs);
        out.map(|t| vec![t]).map_err(d)
    }
}

/// The id of `inst`, an instruction of `f`.
fn inst_id(f: &Function, inst: &Inst) -> crate::InstId {
    let i = f.insts.iter().position(|x| std::ptr::eq(x, inst)).unwrap_or(0);
    crate::InstId(i as u32)
}

/// The value of operand `v`; a missing one is a broken invariant (the
/// verifier guarantees definition before use).
fn operand<'e>(env: &'e Env<'_>, f: &Function, v: ValueId) -> &'e HostTensor {
    env.get(v.index()).and_then(|slot| slot.as_deref()).unwrap_or_else(|| {
        panic!("{} has no value when used in @{} (was the module verified?)", f.value_ref(v), f.name)
    })
}

/// Operand 0 of `inst`, moved out of the environment if this is its last
/// use and it appears once, copied otherwise.
fn take_or_clone(f: &Function, inst: &Inst, dying: &[ValueId], env: &mut Env<'_>) -> HostTensor {
    let v = inst.operands[0];
    let once = inst.operands.iter().filter(|&&o| o == v).count() == 1;
    if once && dying.contains(&v) {
        if let Some(t) = env[v.index()].take() {
            return t.into_owned();
        }
    }
    operand(env, f, v).clone()
}

fn diag(f: &Function, inst: &Inst, message: String) -> IrError {
    let results: Vec<String> = inst.results.iter().map(|&r| f.value_ref(r)).collect();
    IrError::Interp(Diagnostic {
        func: f.name.clone(),
        loc: inst.loc,
        subject: format!("{} = `{}`", results.join(", "), inst.op.name()),
        message,
    })
}

fn check_type(name: &str, f: &Function, p: ValueId, t: &HostTensor) -> Result<(), IrError> {
    if t.has_type(f.ty(p)) {
        Ok(())
    } else {
        Err(IrError::Input { name: name.to_string(), message: format!("expected {}, given {}", f.ty(p), t.ty()) })
    }
}

fn check_positional<'t>(f: &Function, args: impl ExactSizeIterator<Item = &'t HostTensor>) -> Result<(), IrError> {
    let given = args.len();
    for (i, t) in args.enumerate() {
        match f.params.get(i) {
            Some(&p) => check_type(&f.param_name(i), f, p, t)?,
            None => {
                return Err(IrError::Input {
                    name: format!("arg{i}"),
                    message: format!("@{} takes {} inputs, given {given}", f.name, f.params.len()),
                })
            }
        }
    }
    if given < f.params.len() {
        let p = f.params[given];
        return Err(IrError::Input {
            name: f.param_name(given),
            message: format!(
                "missing input of @{} (takes {}, given {given}); expected {}",
                f.name,
                f.params.len(),
                f.ty(p)
            ),
        });
    }
    Ok(())
}

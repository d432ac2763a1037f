//! Call inlining: one flat function for the passes that need one.
//!
//! Sharding propagation (like Shardy after JAX's inlining) works on a single
//! straight-line function, so calls are inlined first. Values of an inlined
//! body are renamed `<callee>.<n>.<name>` (`n` counts calls, so every copy
//! is distinct) and keep their source positions. A sharding annotation on
//! an instruction result of a callee becomes a `sharding_constraint` on
//! it (so autodiff constrains its cotangent too: a model's activation
//! rules shard the backward pass as well); the entry function's own
//! annotations stay where they are. A named call result gives its name
//! to the value it becomes, when that value is new. Annotations on a
//! callee's parameters and results are dropped (they describe the callee's
//! own interface, which no longer exists); a sharding annotation on a call's
//! result becomes a `sharding_constraint`, so it still applies.
//!
//! Autodiff inlines with the same code ([`inline_function`]): a call marked
//! `remat` becomes a *region*, the range of inlined instructions whose
//! activations the backward pass recomputes instead of keeping. Nested
//! remat calls belong to the outermost region.

use crate::error::{CompilerError, Result};
use std::collections::HashSet;
use std::ops::Range;
use weft_ir::callgraph::CallGraph;
use weft_ir::{Function, Module, Op, ValueDef, ValueId};

/// Calls nested deeper than this are an error (the verifier rejects
/// recursion and deeper chains; this guards unverified modules).
const MAX_DEPTH: usize = weft_ir::callgraph::MAX_CALL_DEPTH;

/// The most instructions an inlined function may have: 2^22 (a 32-layer
/// GPT training step has tens of thousands). Checked before inlining, from
/// the call graph, so a small module whose functions each call the next
/// twice is an error instead of an exponential expansion.
pub const MAX_INLINED_INSTS: u64 = 1 << 22;

/// Inlines every call (transitively) into a copy of function `entry` of `m`.
pub fn inline_calls(m: &Module, entry: &str) -> Result<Function> {
    let f = m.function(entry).ok_or_else(|| CompilerError::UnknownFunction { name: entry.to_string() })?;
    weft_ir::verify_module(m)?;
    Ok(inline_function(m, f)?.function)
}

/// Inlines every call of function `entry` of `m`: [`inline_calls`], as the
/// call-free [`InlinedFunction`] the pipeline's passes take.
pub fn inline(m: &Module, entry: &str) -> Result<InlinedFunction> {
    Ok(InlinedFunction(inline_calls(m, entry)?))
}

/// [`CompilerError::CallNotInlined`] for `f`'s first call, if it has one:
/// the one check that a function is call-free, for the entry points that
/// take a plain [`Function`] ([`InlinedFunction::new`],
/// [`crate::sharding::propagate`], [`crate::autoshard::auto_shard`]).
pub fn check_call_free(f: &Function) -> Result<()> {
    match f.iter_insts().find(|(_, i)| matches!(i.op, Op::Call { .. })) {
        Some((id, _)) => Err(call_not_inlined(f, id)),
        None => Ok(()),
    }
}

/// The error for call `id` of `f` (a pass that met a call it cannot take).
pub(crate) fn call_not_inlined(f: &Function, id: weft_ir::InstId) -> CompilerError {
    let inst = f.inst(id);
    let site = crate::Site::new(&f.name, weft_ir::verify::inst_subject(f, id), inst.loc);
    let callee = match &inst.op {
        Op::Call { callee, .. } => callee.clone(),
        _ => String::new(),
    };
    CompilerError::CallNotInlined { site, callee }
}

/// A function without calls. Made by [`inline`] or checked by
/// [`InlinedFunction::new`], so the passes that take one
/// ([`crate::sharding::propagate_inlined`], the pipeline) do not re-check
/// that calls were inlined.
#[derive(Clone, Debug)]
pub struct InlinedFunction(Function);

impl InlinedFunction {
    /// Wraps `f`; [`CompilerError::CallNotInlined`] names its first call.
    pub fn new(f: Function) -> Result<InlinedFunction> {
        check_call_free(&f)?;
        Ok(InlinedFunction(f))
    }

    /// The function.
    pub fn function(&self) -> &Function {
        &self.0
    }

    /// The function, unwrapped.
    pub fn into_function(self) -> Function {
        self.0
    }

    /// Sets the shardings of the named parameters and of results (by
    /// index); others keep theirs. Errors: a parameter name the function
    /// does not have, a result index out of range.
    pub fn annotate(&mut self, a: &crate::pipeline::Annotations) -> Result<()> {
        let f = &mut self.0;
        for (name, s) in &a.params {
            let Some(i) = (0..f.params.len()).find(|&i| f.param_name(i) == *name) else {
                let known: Vec<String> = (0..f.params.len()).map(|i| f.param_name(i)).collect();
                return Err(CompilerError::UnknownParameter {
                    func: f.name.clone(),
                    name: name.clone(),
                    known: known.join(", "),
                });
            };
            let p = f.params[i];
            f.values[p.index()].sharding = Some(s.clone());
        }
        for (k, s) in &a.results {
            if *k >= f.results.len() {
                return Err(CompilerError::UnknownParameter {
                    func: f.name.clone(),
                    name: format!("result {k}"),
                    known: format!("results 0..{}", f.results.len()),
                });
            }
            f.result_shardings.resize(f.results.len(), None);
            f.result_shardings[*k] = Some(s.clone());
        }
        Ok(())
    }

    /// Pins result `k` to sharding `s` (for stable training-state layouts).
    pub(crate) fn set_result_sharding(&mut self, k: usize, s: weft_ir::TensorSharding) {
        self.0.result_shardings.resize(self.0.results.len(), None);
        self.0.result_shardings[k] = Some(s);
    }
}

/// A function with its calls inlined.
#[derive(Clone, Debug)]
pub struct Inlined {
    /// The flat function.
    pub function: Function,
    /// Instruction ranges that came from calls marked `remat` (outermost
    /// ones only), in order.
    pub remat_regions: Vec<Range<usize>>,
}

/// Inlines every call (transitively) into a copy of `f`, whose callees are
/// looked up in `m` (`f` itself need not be in `m`). Errors: a callee that
/// does not exist, calls nested more than 64 deep, or an expansion to more
/// than [`MAX_INLINED_INSTS`] instructions.
pub fn inline_function(m: &Module, f: &Function) -> Result<Inlined> {
    check_expanded_size(m, f)?;
    let mut out = Function::new(f.name.clone());
    (out.loc, out.return_loc) = (f.loc, f.return_loc);
    let mut st = State {
        m,
        names: f.values.iter().filter_map(|v| v.name.clone()).collect(),
        calls: 0,
        regions: Vec::new(),
        caller: f.name.clone(),
    };
    let args: Vec<ValueId> = f
        .params
        .iter()
        .map(|&p| {
            let np = out.add_param(f.value(p).name.clone(), f.ty(p).clone());
            out.values[np.index()].sharding = f.value(p).sharding.clone();
            np
        })
        .collect();
    out.results = st.body(f, &args, &mut out, "", false, 0)?;
    out.result_shardings = f.result_shardings.clone();
    Ok(Inlined { function: out, remat_regions: st.regions })
}

/// Errors if inlining every call of `f` would give more than
/// [`MAX_INLINED_INSTS`] instructions, naming the calls that multiply it.
fn check_expanded_size(m: &Module, f: &Function) -> Result<()> {
    if !f.insts.iter().any(|i| matches!(i.op, Op::Call { .. })) {
        return Ok(());
    }
    let g = CallGraph::new(m);
    // Unverified modules may recurse; the depth limit reports those.
    let Some(sizes) = g.expanded_sizes() else { return Ok(()) };
    let mut total = 0u64;
    let mut heaviest: Option<(u64, usize)> = None;
    for inst in &f.insts {
        let Op::Call { callee, .. } = &inst.op else {
            total = total.saturating_add(1);
            continue;
        };
        let Some(c) = g.index(callee) else { continue };
        total = total.saturating_add(sizes[c]);
        if heaviest.is_none_or(|(s, _)| sizes[c] > s) {
            heaviest = Some((sizes[c], c));
        }
    }
    if total <= MAX_INLINED_INSTS {
        return Ok(());
    }
    let chain = match heaviest {
        Some((_, c)) => {
            let calls =
                f.insts.iter().filter(|i| matches!(&i.op, Op::Call { callee, .. } if callee == g.name(c))).count();
            let times = if calls > 1 { format!(" ({calls} calls)") } else { String::new() };
            let rest = g.heaviest_chain(c);
            let rest = rest.split_once(' ').map(|(_, r)| format!(" {r}")).unwrap_or_default();
            format!("@{} -> @{}{times}{rest}", f.name, g.name(c))
        }
        None => format!("@{}", f.name),
    };
    Err(CompilerError::ProgramTooLarge { func: f.name.clone(), insts: total, limit: MAX_INLINED_INSTS, chain })
}

struct State<'a> {
    m: &'a Module,
    names: HashSet<String>,
    calls: usize,
    regions: Vec<Range<usize>>,
    /// The function being inlined into (for errors).
    caller: String,
}

impl State<'_> {
    fn fresh(&mut self, base: String) -> String {
        let mut name = base.clone();
        let mut k = 1;
        while self.names.contains(&name) {
            name = format!("{base}_{k}");
            k += 1;
        }
        self.names.insert(name.clone());
        name
    }

    /// Emits the body of `g` into `out` with its parameters bound to `args`;
    /// returns the values of its results. `in_region`: inside a remat call.
    fn body(
        &mut self,
        g: &Function,
        args: &[ValueId],
        out: &mut Function,
        prefix: &str,
        in_region: bool,
        depth: usize,
    ) -> Result<Vec<ValueId>> {
        if depth > MAX_DEPTH {
            return Err(CompilerError::Unsupported(format!(
                "@{}: calls nested more than {MAX_DEPTH} deep (at @{})",
                self.caller, g.name
            )));
        }
        let mut map: Vec<Option<ValueId>> = vec![None; g.values.len()];
        for (&p, &a) in g.params.iter().zip(args) {
            map[p.index()] = Some(a);
        }
        let get = |map: &[Option<ValueId>], v: ValueId| map[v.index()].expect("verified: defined before use");
        for inst in &g.insts {
            let ops: Vec<ValueId> = inst.operands.iter().map(|&o| get(&map, o)).collect();
            if let Op::Call { callee, remat } = &inst.op {
                let h =
                    self.m.function(callee).ok_or_else(|| CompilerError::UnknownFunction { name: callee.clone() })?;
                self.calls += 1;
                let inner = format!("{prefix}{callee}.{}.", self.calls);
                let start = out.insts.len();
                let res = self.body(h, &ops, out, &inner, in_region || *remat, depth + 1)?;
                if *remat && !in_region && out.insts.len() > start {
                    self.regions.push(start..out.insts.len());
                }
                for (&r, &v) in inst.results.iter().zip(&res) {
                    let data = g.value(r);
                    // Top-level names are already reserved for exactly this value.
                    let name = data.name.as_ref().map(|n| {
                        if prefix.is_empty() {
                            n.clone()
                        } else {
                            self.fresh(format!("{prefix}{n}"))
                        }
                    });
                    if let Some(s) = &data.sharding {
                        let id = out.add_inst(
                            Op::ShardingConstraint { sharding: s.clone() },
                            vec![v],
                            vec![(data.ty.clone(), name)],
                            inst.loc,
                        );
                        map[r.index()] = Some(out.insts[id.index()].results[0]);
                        continue;
                    }
                    let fresh_inst_value = matches!(out.value(v).def, ValueDef::Inst { .. })
                        && !ops.contains(&v)
                        && out.value(v).name.as_ref().is_none_or(|n| n.starts_with(&inner));
                    if let (Some(n), true) = (name, fresh_inst_value) {
                        if let Some(old) = out.values[v.index()].name.take() {
                            self.names.remove(&old);
                        }
                        out.values[v.index()].name = Some(n);
                    }
                    map[r.index()] = Some(v);
                }
                continue;
            }
            let results = inst
                .results
                .iter()
                .map(|&r| {
                    let name = g.value(r).name.as_ref().map(|n| {
                        if prefix.is_empty() {
                            n.clone()
                        } else {
                            self.fresh(format!("{prefix}{n}"))
                        }
                    });
                    (g.ty(r).clone(), name)
                })
                .collect();
            let id = out.add_inst(inst.op.clone(), ops, results, inst.loc);
            for (&r, &nr) in inst.results.iter().zip(&out.insts[id.index()].results.clone()) {
                map[r.index()] = Some(nr);
                let Some(s) = g.value(r).sharding.clone() else { continue };
                if prefix.is_empty() {
                    out.values[nr.index()].sharding = Some(s);
                    continue;
                }
                // Inside a callee the annotation becomes a constraint, so
                // that autodiff constrains the value's cotangent too.
                let ty = out.ty(nr).clone();
                let c = out.add_inst(Op::ShardingConstraint { sharding: s }, vec![nr], vec![(ty, None)], inst.loc);
                map[r.index()] = Some(out.insts[c.index()].results[0]);
            }
        }
        Ok(g.results.iter().map(|&r| get(&map, r)).collect())
    }
}

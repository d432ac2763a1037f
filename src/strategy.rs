//! Named parallelism strategies as shardings: data parallel, Megatron
//! tensor parallel (by a model's rules), FSDP, FSDP+TP and ZeRO-1/2/3, for
//! any model.
//!
//! A strategy is nothing but annotations — on parameters and batch inputs,
//! named activations (a model's sequence-parallel rule under tp),
//! optimizer-state leaves (`state_shardings`) and gradients
//! (`grad_shardings`) — so the compiler needs no special code path per
//! strategy: the collectives fall out of propagation and partitioning.
//! Every parameter and optimizer-state leaf is annotated, replicated where
//! the strategy does not split it, so propagation never shards what a
//! strategy keeps whole (a ZeRO-1 parameter stays replicated even though
//! its update is computed next to sharded optimizer state).
//! Mesh axes are called `data` (batch / FSDP / ZeRO) and `model` (tensor
//! parallel); a strategy only uses the axes the mesh has.

use crate::error::{Error, Result};
use crate::models::{rules::Rules, Model, Shardings};
use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use weft_compiler::train::{InputRole, TrainConfig};
use weft_ir::{Module, TensorSharding};

/// A parallelism strategy.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Strategy {
    /// No annotations: everything replicated (or left to propagation).
    None,
    /// Batch split over `data`; parameters replicated; gradients all-reduced.
    DataParallel,
    /// Megatron tensor parallelism over `model` (column- then row-parallel
    /// layers), batch over `data` when the mesh has it.
    TensorParallel,
    /// Fully sharded data parallel over the whole mesh: the batch and
    /// dimension 0 of every parameter and optimizer-state leaf split over
    /// all mesh axes together (`data` first, as JAX's
    /// `P(("data", "model"))`), parameters gathered before use. No device
    /// repeats another's work.
    Fsdp,
    /// FSDP over `data` combined with Megatron over `model`.
    FsdpTp,
    /// ZeRO-1: data parallel with optimizer state split over `data`.
    Zero1,
    /// ZeRO-2: ZeRO-1 plus gradients split over `data` (reduce-scatter).
    Zero2,
    /// ZeRO-3: ZeRO-2 plus parameters split over `data` (= FSDP).
    Zero3,
    /// No annotations: the compiler's auto-sharder chooses every layout
    /// (cost model and memory budget; `compiler::autoshard`).
    Auto,
}

impl Strategy {
    /// Every strategy, in a fixed order.
    pub const ALL: [Strategy; 9] = [
        Strategy::None,
        Strategy::DataParallel,
        Strategy::TensorParallel,
        Strategy::Fsdp,
        Strategy::FsdpTp,
        Strategy::Zero1,
        Strategy::Zero2,
        Strategy::Zero3,
        Strategy::Auto,
    ];

    /// The name used in configs and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Strategy::None => "none",
            Strategy::DataParallel => "dp",
            Strategy::TensorParallel => "tp",
            Strategy::Fsdp => "fsdp",
            Strategy::FsdpTp => "fsdp_tp",
            Strategy::Zero1 => "zero1",
            Strategy::Zero2 => "zero2",
            Strategy::Zero3 => "zero3",
            Strategy::Auto => "auto",
        }
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Strategy {
    type Err = String;
    fn from_str(s: &str) -> Result<Strategy, String> {
        Strategy::ALL.into_iter().find(|x| x.name() == s).ok_or_else(|| {
            let names: Vec<&str> = Strategy::ALL.iter().map(|x| x.name()).collect();
            format!("unknown strategy `{s}` (expected one of: {})", names.join(", "))
        })
    }
}

/// The annotations of a strategy for one model.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StrategyShardings {
    /// Parameters and batch inputs (for the model builder).
    pub inputs: Shardings,
    /// Optimizer-state leaves (`TrainConfig::state_shardings`).
    pub state: BTreeMap<String, TensorSharding>,
    /// Gradients (`TrainConfig::grad_shardings`).
    pub grads: BTreeMap<String, TensorSharding>,
}

impl StrategyShardings {
    /// Puts the optimizer-state and gradient annotations into `tc` and
    /// returns the parameter and batch annotations, for the model builder.
    pub fn configure(self, tc: &mut TrainConfig) -> Shardings {
        tc.state_shardings = self.state;
        tc.grad_shardings = self.grads;
        self.inputs
    }
}

/// A parameter as a strategy sees it: its name, shape, and the sharding its
/// rules give it (`[shardings]`, an annotation in the program, or under
/// `tp`/`fsdp_tp` the model's tensor-parallel rules), if any.
#[derive(Clone, Debug, PartialEq)]
pub struct ParamSpec {
    /// The parameter's name (`params.layers.0.w1`).
    pub name: String,
    /// Its shape.
    pub shape: Vec<usize>,
    /// The sharding its rules give it (of the shape's rank).
    pub split: Option<TensorSharding>,
}

/// A batch input as a strategy sees it: name, rank, and a sharding its
/// rules give it.
#[derive(Clone, Debug, PartialEq)]
pub struct BatchSpec {
    /// The input's name.
    pub name: String,
    /// Its rank (dimension 0 is the batch).
    pub rank: usize,
    /// The sharding its rules give it.
    pub split: Option<TensorSharding>,
}

/// The annotations of `strategy` for parameters `params`, batch inputs
/// `batch` (dimension 0 is the batch), optimizer slot prefixes `slots`
/// (e.g. `opt.m`), on a mesh with axes `axes`. A parameter's `split` is the
/// start (its open dimensions and unreduced axes kept): FSDP/ZeRO add the
/// data axes it does not use yet to the first dimension it leaves free;
/// its optimizer slots take the same sharding.
pub fn shardings(
    strategy: Strategy,
    params: &[ParamSpec],
    batch: &[BatchSpec],
    slots: &[&str],
    axes: &[&str],
) -> StrategyShardings {
    let mut out = StrategyShardings::default();
    let slot_names = |name: &str| {
        let suffix = name.strip_prefix("params.").unwrap_or(name).to_string();
        slots.iter().map(move |slot| format!("{slot}.{suffix}"))
    };
    if matches!(strategy, Strategy::None | Strategy::Auto) {
        // Only what rules fix; the rest is left to propagation or the
        // auto-sharder.
        for b in batch {
            if let Some(split) = &b.split {
                out.inputs.insert(b.name.clone(), split.clone());
            }
        }
        for p in params {
            if let Some(split) = &p.split {
                out.inputs.insert(p.name.clone(), split.clone());
                out.state.extend(slot_names(&p.name).map(|n| (n, split.clone())));
            }
        }
        return out;
    }
    let has = |a: &str| axes.contains(&a);
    // The axes that split the batch and the FSDP/ZeRO state: `data`, or for
    // pure FSDP every axis of the mesh (`data` first), so that the `model`
    // axis does not compute the same batch block four times over.
    let shard_axes: Vec<&str> = if strategy == Strategy::Fsdp {
        let mut v: Vec<&str> = axes.iter().copied().filter(|&a| a == "data").collect();
        v.extend(axes.iter().copied().filter(|&a| a != "data"));
        v
    } else {
        // The expert axis splits the batch too (GShard): a MoE block's
        // tokens then meet their experts by all-to-all.
        ["data", "expert"].into_iter().filter(|a| has(a)).collect()
    };
    for b in batch {
        if let Some(split) = &b.split {
            out.inputs.insert(b.name.clone(), split.clone());
        } else if !shard_axes.is_empty() {
            let mut dims: Vec<Vec<&str>> = vec![vec![]; b.rank];
            if b.rank > 0 {
                dims[0] = shard_axes.clone();
            }
            out.inputs.insert(b.name.clone(), sharding(&dims));
        }
    }
    let fsdp = !shard_axes.is_empty() && matches!(strategy, Strategy::Fsdp | Strategy::FsdpTp | Strategy::Zero3);
    let zero_state = has("data") && matches!(strategy, Strategy::Zero1 | Strategy::Zero2 | Strategy::Zero3);
    let zero_grads = has("data") && matches!(strategy, Strategy::Zero2 | Strategy::Zero3);
    for p in params {
        let rank = p.shape.len();
        let base = p.split.clone().unwrap_or_else(|| TensorSharding::replicated(rank));
        // The data-axis split for FSDP/ZeRO: the shard axes the base does
        // not use yet, on dimension 0, after the base's own axes there (a
        // row-split weight is split further by rows; a vocabulary-split
        // embedding table keeps its trailing dimension whole, so the
        // gathered activations keep their batch split).
        let used: Vec<&str> = base.dims.iter().flat_map(|d| d.axes.iter().map(String::as_str)).collect();
        let extra: Vec<&str> = shard_axes.iter().copied().filter(|a| !used.contains(a)).collect();
        let data_dim = (rank > 0 && !extra.is_empty()).then_some(0);
        let mut split = base.clone();
        if let Some(d) = data_dim {
            split.dims[d].axes.extend(extra.iter().map(|a| a.to_string()));
        }
        // Every parameter and optimizer-state leaf is annotated, replicated
        // where the strategy does not split it: left open, propagation
        // would shard a ZeRO-1/2 parameter like its optimizer state.
        out.inputs.insert(p.name.clone(), if fsdp { split.clone() } else { base.clone() });
        let slot = if zero_state || fsdp { &split } else { &base };
        out.state.extend(slot_names(&p.name).map(|n| (n, slot.clone())));
        if zero_grads && data_dim.is_some() {
            out.grads.insert(p.name.clone(), split);
        }
    }
    out
}

/// The module of `model` for `micro_batches`, annotated for `strategy` on a
/// mesh with axes `axes`, with `tc`'s optimizer-state and gradient
/// annotations set: what every run trains (`weft train`, the pipeline
/// stages, the prediction report, [`crate::Trainer`]).
///
/// A parameter's split comes from the first of: a `rules` pattern
/// (`[shardings]`), its annotation in the program, and under `tp` and
/// `fsdp_tp` the model's tensor-parallel rules (keeping the axes the mesh
/// has). Batch inputs take a `rules` split or their program annotation,
/// else the strategy's. A named instruction result, in any function, takes
/// the first `rules` pattern that matches it and no input, else its
/// program annotation, else under tp such a model rule
/// ([`fit_model_value_rules`] then drops the model's where the mesh does
/// not divide them). Errors: a pattern that matches nothing, a
/// sharding that names an axis the mesh lacks or does not fit the rank,
/// and `tp` on a model with no tensor-parallel rules of its own or given.
pub fn annotated_module(
    strategy: Strategy,
    model: &Model,
    micro_batches: usize,
    rules: &Rules<TensorSharding>,
    tc: &mut TrainConfig,
    axes: &[&str],
) -> Result<Module> {
    let mut module = model.arch.module(micro_batches)?;
    let f = model.loss_fn(&module)?;
    // Rules name parameters and batch inputs (the key `rng` is neither).
    let inputs: Vec<(usize, String)> =
        (0..f.params.len()).map(|i| (i, f.param_name(i))).filter(|(_, n)| InputRole::of(n) != InputRole::Key).collect();
    let name_refs: Vec<&str> = inputs.iter().map(|(_, n)| n.as_str()).collect();
    let err = |message: String| Error::Model { what: "[shardings]".into(), message };
    let value_names = named_values(&module);
    let mut all_names = name_refs.clone();
    all_names.extend(value_names.iter().map(|(_, _, n)| n.as_str()));
    let unmatched = rules.unmatched(&all_names);
    if !unmatched.is_empty() {
        return Err(err(format!(
            "{} match{} no parameter, batch input or named value of @{} (its inputs: {})",
            unmatched.iter().map(|p| format!("`{p}`")).collect::<Vec<_>>().join(", "),
            if unmatched.len() == 1 { "es" } else { "" },
            model.loss,
            crate::models::init::shown(&name_refs)
        )));
    }
    let tp = matches!(strategy, Strategy::TensorParallel | Strategy::FsdpTp);
    if tp && model.tp_rules.is_empty() && rules.is_empty() {
        return Err(Error::Usage(format!(
            "strategy `{strategy}` splits layers by the model's tensor-parallel rules, and {} has none: give them in \
             a [shardings] table (\"params.*.w_up\" = \"[{{}}, {{model}}]\"), or use dp, fsdp, zero1..3 or auto",
            model.label
        )));
    }
    let (mut params, mut batch) = (Vec::new(), Vec::new());
    for (i, name) in &inputs {
        let ty = f.ty(f.params[*i]);
        let rank_err = |what: &str, r: &crate::models::rules::Rule<TensorSharding>| {
            format!("{what}`{}` = \"{}\" has rank {}, but %{name} is {ty}", r.pattern, r.value, r.value.rank())
        };
        let split = match (rules.first(name), &f.value(f.params[*i]).sharding) {
            (Some(r), _) => {
                if r.value.rank() != ty.rank() {
                    return Err(err(rank_err("", r)));
                }
                if let Some(message) = missing_axis(r, axes) {
                    return Err(err(message));
                }
                Some(r.value.clone())
            }
            (None, Some(s)) => Some(s.clone()),
            (None, None) if InputRole::of(name) == InputRole::Param => {
                // The model's rules: expert parallelism where the mesh has
                // an `expert` axis, tensor parallelism under tp, combined
                // dimension by dimension (expert axes first).
                let expert = axes.contains(&"expert") && !matches!(strategy, Strategy::None | Strategy::Auto);
                let mut found: Option<TensorSharding> = None;
                for (on, rules, what) in [
                    (expert, &model.expert_rules, "the expert-parallel rule "),
                    (tp, &model.tp_rules, "the tensor-parallel rule "),
                ] {
                    let Some(r) = rules.first(name).filter(|_| on) else { continue };
                    if r.value.rank() != ty.rank() {
                        let message = rank_err(what, r);
                        return Err(Error::Model { what: model.label.clone(), message });
                    }
                    // The model's rules use the axes the mesh has.
                    let s = on_mesh(&r.value, axes);
                    found = Some(match found {
                        None => s,
                        Some(mut have) => {
                            for (d, more) in have.dims.iter_mut().zip(s.dims) {
                                for a in more.axes {
                                    if !d.axes.contains(&a) {
                                        d.axes.push(a);
                                    }
                                }
                            }
                            have
                        }
                    });
                }
                found
            }
            (None, None) => None,
        };
        if InputRole::of(name) == InputRole::Param {
            params.push(ParamSpec { name: name.clone(), shape: ty.shape.clone(), split });
        } else {
            batch.push(BatchSpec { name: name.clone(), rank: ty.rank(), split });
        }
    }
    let sh = shardings(strategy, &params, &batch, tc.optimizer.slots(), axes);
    let inputs = sh.configure(tc);
    crate::models::model::annotate(&mut module, &model.loss, &inputs)?;
    // Named activations: a `[shardings]` rule, an annotation in the
    // program, or under tp the model's rules (Megatron's sequence
    // parallelism: the residual stream split over `model` by position).
    for (fi, v, name) in value_names {
        let f = &mut module.functions[fi];
        let ty = f.ty(v).clone();
        let (rule, what) = match (value_rule(&name, rules, model, tp, &name_refs), &f.value(v).sharding) {
            (Some((r, from_model)), None) => (r, from_model.then(|| model.label.clone())),
            (Some((r, false)), Some(_)) => (r, None),
            _ => continue,
        };
        let s = rule.value.clone();
        if s.rank() != ty.rank() {
            let message =
                format!("`{}` = \"{}\" has rank {}, but %{name} of @{} is {ty}", rule.pattern, s, s.rank(), f.name);
            return Err(match what {
                Some(label) => Error::Model { what: label, message },
                None => err(message),
            });
        }
        let s = match what {
            // The model's rules use the axes the mesh has, and constrain
            // nothing where it has none of theirs.
            Some(_) => match on_mesh(&s, axes) {
                s if s.axes().next().is_none() => continue,
                s => s,
            },
            None => match missing_axis(rule, axes) {
                Some(message) => return Err(err(message)),
                None => s,
            },
        };
        f.values[v.index()].sharding = Some(s);
    }
    Ok(module)
}

/// `s` with only the axes of `axes` (a model's rules on a smaller mesh).
fn on_mesh(s: &TensorSharding, axes: &[&str]) -> TensorSharding {
    let mut s = s.clone();
    for d in &mut s.dims {
        d.axes.retain(|a| axes.contains(&a.as_str()));
    }
    s.unreduced.retain(|a| axes.contains(&a.as_str()));
    s
}

/// The error of a `[shardings]` rule naming an axis the mesh lacks.
fn missing_axis(r: &crate::models::rules::Rule<TensorSharding>, axes: &[&str]) -> Option<String> {
    let a = r.value.axes().find(|a| !axes.contains(a))?;
    Some(format!(
        "`{}` = \"{}\" names the axis `{a}`, which the mesh does not have (its axes: {})",
        r.pattern,
        r.value,
        axes.join(", ")
    ))
}

/// The rule that annotates the named value `name`, and whether it is the
/// model's: the first `[shardings]` rule, else under tp the first of the
/// model's tensor-parallel rules, that matches it and no input (a rule
/// that names an input, `"x"` or `"params.*"`, is an input's rule: it does
/// not reach a value that happens to share its pattern).
fn value_rule<'r>(
    name: &str,
    rules: &'r Rules<TensorSharding>,
    model: &'r Model,
    tp: bool,
    inputs: &[&str],
) -> Option<(&'r crate::models::rules::Rule<TensorSharding>, bool)> {
    let for_values =
        |r: &&crate::models::rules::Rule<TensorSharding>| r.matches(name) && !inputs.iter().any(|i| r.matches(i));
    rules
        .iter()
        .find(for_values)
        .map(|r| (r, false))
        .or_else(|| model.tp_rules.iter().filter(|_| tp).find(for_values).map(|r| (r, true)))
}

/// Removes the annotations that the model's rules gave named values of
/// `module` (annotated by [`annotated_module`] for `strategy`, `rules`)
/// where they do not divide the value on `mesh`: a GPT whose `seq` the
/// `model` axis does not divide keeps its residual stream whole instead
/// of failing (a `[shardings]` rule that does not divide is an error).
pub fn fit_model_value_rules(
    module: &mut Module,
    strategy: Strategy,
    model: &Model,
    rules: &Rules<TensorSharding>,
    mesh: &weft_compiler::sharding::Mesh,
) -> Result<()> {
    let tp = matches!(strategy, Strategy::TensorParallel | Strategy::FsdpTp);
    let f = model.loss_fn(module)?;
    let inputs: Vec<String> = (0..f.params.len()).map(|i| f.param_name(i)).collect();
    let inputs: Vec<&str> = inputs.iter().map(String::as_str).collect();
    for (fi, v, name) in named_values(module) {
        if !matches!(value_rule(&name, rules, model, tp, &inputs), Some((_, true))) {
            continue;
        }
        let f = &mut module.functions[fi];
        let value = &f.values[v.index()];
        let Some(s) = &value.sharding else { continue };
        // The compiler's own check (divisibility, known axes).
        let site = weft_compiler::Site::new(&f.name, name.as_str(), None);
        if weft_compiler::sharding::MeshSharding::resolve(s, &value.ty, mesh, &site).is_err() {
            f.values[v.index()].sharding = None;
        }
    }
    Ok(())
}

/// Every named instruction result of every function of `module`: its
/// function's index, the value, its name.
pub fn named_values(module: &Module) -> Vec<(usize, weft_ir::ValueId, String)> {
    let mut out = Vec::new();
    for (fi, f) in module.functions.iter().enumerate() {
        for (_, inst) in f.iter_insts() {
            for &r in &inst.results {
                if let Some(n) = &f.value(r).name {
                    out.push((fi, r, n.clone()));
                }
            }
        }
    }
    out
}

fn sharding(dims: &[Vec<&str>]) -> TensorSharding {
    let refs: Vec<&[&str]> = dims.iter().map(|d| d.as_slice()).collect();
    TensorSharding::new(&refs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strategies_annotate_as_documented() {
        let split = |d: &[&[&str]]| Some(TensorSharding::new(d));
        let params = |tp: bool| {
            vec![
                ParamSpec {
                    name: "params.layers.0.w1".into(),
                    shape: vec![8, 16],
                    split: if tp { split(&[&[], &["model"]]) } else { None },
                },
                ParamSpec {
                    name: "params.layers.0.w2".into(),
                    shape: vec![16, 8],
                    split: if tp { split(&[&["model"], &[]]) } else { None },
                },
            ]
        };
        let batch = [BatchSpec { name: "x".into(), rank: 2, split: None }];
        let axes = ["data", "model"];
        let s = |st: Strategy| {
            let tp = matches!(st, Strategy::TensorParallel | Strategy::FsdpTp);
            shardings(st, &params(tp), &batch, &["opt.m"], &axes)
        };
        let dp = s(Strategy::DataParallel);
        assert_eq!(dp.inputs["x"].to_string(), "[{data}, {}]");
        assert_eq!(dp.inputs["params.layers.0.w1"].to_string(), "[{}, {}]");
        assert_eq!(dp.state["opt.m.layers.0.w1"].to_string(), "[{}, {}]");
        assert!(dp.grads.is_empty());
        let tp = s(Strategy::TensorParallel);
        assert_eq!(tp.inputs["params.layers.0.w1"].to_string(), "[{}, {model}]");
        assert_eq!(tp.inputs["params.layers.0.w2"].to_string(), "[{model}, {}]");
        assert_eq!(tp.state["opt.m.layers.0.w1"].to_string(), "[{}, {model}]");
        let fsdp_tp = s(Strategy::FsdpTp);
        assert_eq!(fsdp_tp.inputs["params.layers.0.w1"].to_string(), "[{data}, {model}]");
        assert_eq!(fsdp_tp.inputs["params.layers.0.w2"].to_string(), "[{model, data}, {}]");
        let z1 = s(Strategy::Zero1);
        assert_eq!(z1.inputs["params.layers.0.w1"].to_string(), "[{}, {}]");
        assert_eq!(z1.state["opt.m.layers.0.w1"].to_string(), "[{data}, {}]");
        assert!(z1.grads.is_empty());
        let z2 = s(Strategy::Zero2);
        assert_eq!(z2.grads["params.layers.0.w2"].to_string(), "[{data}, {}]");
        let fsdp = s(Strategy::Fsdp);
        assert_eq!(fsdp.inputs["x"].to_string(), "[{data, model}, {}]");
        assert_eq!(fsdp.inputs["params.layers.0.w2"].to_string(), "[{data, model}, {}]");
        assert_eq!(fsdp.state["opt.m.layers.0.w1"].to_string(), "[{data, model}, {}]");
        let fsdp_model_first = shardings(Strategy::Fsdp, &params(false), &batch, &["opt.m"], &["model", "data"]);
        assert_eq!(fsdp_model_first.inputs["x"].to_string(), "[{data, model}, {}]");
        let z3 = s(Strategy::Zero3);
        assert_eq!(z3.inputs["params.layers.0.w1"].to_string(), "[{data}, {}]");
        assert_eq!("zero2".parse::<Strategy>().unwrap(), Strategy::Zero2);
        let none = s(Strategy::None);
        assert!(none.inputs.is_empty() && none.state.is_empty() && none.grads.is_empty());
        assert!("zero4".parse::<Strategy>().unwrap_err().contains("fsdp_tp"));
    }
}

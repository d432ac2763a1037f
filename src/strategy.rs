//! Named parallelism strategies as shardings: data parallel, Megatron
//! tensor parallel (by a model's rules), FSDP, FSDP+TP and ZeRO-1/2/3, for
//! any model.
//!
//! A strategy is nothing but annotations — on parameters and batch inputs,
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
use weft_compiler::train::TrainConfig;
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

/// A parameter as a strategy sees it: its name, shape, and the split its
/// rules give it (`[shardings]`, an annotation in the program, or under
/// `tp`/`fsdp_tp` the model's tensor-parallel rules), if any.
#[derive(Clone, Debug, PartialEq)]
pub struct ParamSpec {
    /// The parameter's name (`params.layers.0.w1`).
    pub name: String,
    /// Its shape.
    pub shape: Vec<usize>,
    /// The split its rules give it, one axis list per dimension.
    pub split: Option<Vec<Vec<String>>>,
}

/// A batch input as a strategy sees it: name, rank, and a split its rules
/// give it.
#[derive(Clone, Debug, PartialEq)]
pub struct BatchSpec {
    /// The input's name.
    pub name: String,
    /// Its rank (dimension 0 is the batch).
    pub rank: usize,
    /// The split its rules give it.
    pub split: Option<Vec<Vec<String>>>,
}

/// The annotations of `strategy` for parameters `params`, batch inputs
/// `batch` (dimension 0 is the batch), optimizer slot prefixes `slots`
/// (e.g. `opt.m`), on a mesh with axes `axes`. A parameter's `split` is the
/// start: FSDP/ZeRO add the data axes to its first dimension the split
/// leaves free; its optimizer slots take the same split.
pub fn shardings(
    strategy: Strategy,
    params: &[ParamSpec],
    batch: &[BatchSpec],
    slots: &[&str],
    axes: &[&str],
) -> StrategyShardings {
    let mut out = StrategyShardings::default();
    if matches!(strategy, Strategy::None | Strategy::Auto) {
        // Only what rules fix; the rest is left to propagation or the
        // auto-sharder.
        for b in batch {
            if let Some(split) = &b.split {
                out.inputs.insert(b.name.clone(), sharding(&owned(split)));
            }
        }
        for p in params {
            if let Some(split) = &p.split {
                out.inputs.insert(p.name.clone(), sharding(&owned(split)));
                let suffix = p.name.strip_prefix("params.").unwrap_or(&p.name);
                for slot in slots {
                    out.state.insert(format!("{slot}.{suffix}"), sharding(&owned(split)));
                }
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
    } else if has("data") {
        vec!["data"]
    } else {
        vec![]
    };
    for b in batch {
        if let Some(split) = &b.split {
            out.inputs.insert(b.name.clone(), sharding(&owned(split)));
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
        let dims: Vec<Vec<&str>> = match &p.split {
            Some(split) => owned(split),
            None => vec![vec![]; rank],
        };
        // The data-axis split for FSDP/ZeRO: dimension 0 when it is free,
        // else the first free dimension (and none where a rule already
        // uses a data axis).
        let uses_shard_axis = dims.iter().flatten().any(|a| shard_axes.contains(a));
        let data_dim = (0..rank).find(|&d| dims[d].is_empty() && rank >= 1 && !uses_shard_axis);
        let mut data_dims = dims.clone();
        if let Some(d) = data_dim {
            for (i, a) in shard_axes.iter().enumerate() {
                data_dims[d].insert(i, a);
            }
        }
        // Every parameter and optimizer-state leaf is annotated, replicated
        // where the strategy does not split it: left open, propagation
        // would shard a ZeRO-1/2 parameter like its optimizer state.
        let param_dims = if fsdp { &data_dims } else { &dims };
        out.inputs.insert(p.name.clone(), sharding(param_dims));
        let suffix = p.name.strip_prefix("params.").unwrap_or(&p.name);
        for slot in slots {
            let slot_dims = if zero_state || fsdp { &data_dims } else { &dims };
            out.state.insert(format!("{slot}.{suffix}"), sharding(slot_dims));
        }
        if zero_grads && data_dim.is_some() {
            out.grads.insert(p.name.clone(), sharding(&data_dims));
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
/// else the strategy's. Errors: a pattern that matches nothing, a
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
    let names: Vec<String> = (0..f.params.len()).map(|i| f.param_name(i)).collect();
    let name_refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let err = |message: String| Error::Model { what: "[shardings]".into(), message };
    let unmatched = rules.unmatched(&name_refs);
    if !unmatched.is_empty() {
        return Err(err(format!(
            "{} match{} no parameter or batch input of @{} (its inputs: {})",
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
    let dims = |s: &TensorSharding| -> Vec<Vec<String>> { s.dims.iter().map(|d| d.axes.clone()).collect() };
    let (mut params, mut batch) = (Vec::new(), Vec::new());
    for (i, name) in names.iter().enumerate() {
        let ty = f.ty(f.params[i]);
        let split = match (rules.first(name), &f.value(f.params[i]).sharding) {
            (Some(r), _) => {
                if r.value.rank() != ty.rank() {
                    return Err(err(format!(
                        "`{}` = \"{}\" has rank {}, but %{name} is {ty}",
                        r.pattern,
                        r.value,
                        r.value.rank()
                    )));
                }
                if let Some(a) = r.value.dims.iter().flat_map(|d| &d.axes).find(|a| !axes.contains(&a.as_str())) {
                    return Err(err(format!(
                        "`{}` = \"{}\" names the axis `{a}`, which the mesh does not have (its axes: {})",
                        r.pattern,
                        r.value,
                        axes.join(", ")
                    )));
                }
                Some(dims(&r.value))
            }
            (None, Some(s)) => Some(dims(s)),
            (None, None) if tp && name.starts_with("params.") => model.tp_rules.first(name).map(|r| {
                r.value
                    .dims
                    .iter()
                    .map(|d| d.axes.iter().filter(|a| axes.contains(&a.as_str())).cloned().collect())
                    .collect()
            }),
            (None, None) => None,
        };
        if name.starts_with("params.") {
            params.push(ParamSpec { name: name.clone(), shape: ty.shape.clone(), split });
        } else if name != "rng" {
            batch.push(BatchSpec { name: name.clone(), rank: ty.rank(), split });
        }
    }
    let sh = shardings(strategy, &params, &batch, tc.optimizer.slots(), axes);
    let inputs = sh.configure(tc);
    crate::models::model::annotate(&mut module, &model.loss, &inputs)?;
    Ok(module)
}

/// Axis lists as borrowed names.
fn owned(d: &[Vec<String>]) -> Vec<Vec<&str>> {
    d.iter().map(|a| a.iter().map(String::as_str).collect()).collect()
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
        let split = |d: &[&[&str]]| Some(d.iter().map(|a| a.iter().map(|s| s.to_string()).collect()).collect());
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
        assert_eq!(fsdp_tp.inputs["params.layers.0.w2"].to_string(), "[{model}, {data}]");
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

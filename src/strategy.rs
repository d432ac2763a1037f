//! Named parallelism strategies as shardings: data parallel, Megatron
//! tensor parallel, FSDP, FSDP+TP and ZeRO-1/2/3, for the example models.
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

use crate::models::{gpt, mlp, Shardings};
use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use weft_compiler::train::TrainConfig;
use weft_ir::TensorSharding;

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

/// How a parameter takes part in Megatron tensor parallelism.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum TpRole {
    /// Not split over `model`.
    Replicated,
    /// A column-parallel weight `[in, out]`: `out` split over `model`.
    Column,
    /// The bias of a column-parallel layer: its only dimension split.
    ColumnBias,
    /// A row-parallel weight `[in, out]`: `in` split over `model`.
    Row,
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

/// The batch inputs of the residual MLP (name, rank).
pub const MLP_BATCH: [(&str, usize); 2] = [("x", 2), ("y", 2)];

/// The batch inputs of the GPT (name, rank).
pub const GPT_BATCH: [(&str, usize); 2] = [("tokens", 2), ("targets", 2)];

/// The residual MLP's parameters (name, shape, tensor-parallel role).
pub fn mlp_params(cfg: &mlp::MlpConfig) -> Vec<(String, Vec<usize>, TpRole)> {
    mlp::param_shapes(cfg).into_iter().map(|(n, s)| (n.clone(), s, mlp_role(&n))).collect()
}

/// The GPT's parameters (name, shape, tensor-parallel role).
pub fn gpt_params(cfg: &gpt::GptConfig) -> Vec<(String, Vec<usize>, TpRole)> {
    gpt::param_shapes(cfg).into_iter().map(|(n, s)| (n.clone(), s, gpt_role(&n))).collect()
}

/// The annotations of `strategy` for parameters `params` (name, shape,
/// tensor-parallel role), batch inputs `batch` (name, rank; dimension 0 is
/// the batch), optimizer slot prefixes `slots` (e.g. `opt.m`), on a mesh
/// with axes `axes`.
pub fn shardings(
    strategy: Strategy,
    params: &[(String, Vec<usize>, TpRole)],
    batch: &[(&str, usize)],
    slots: &[&str],
    axes: &[&str],
) -> StrategyShardings {
    let mut out = StrategyShardings::default();
    if matches!(strategy, Strategy::None | Strategy::Auto) {
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
    if !shard_axes.is_empty() {
        for &(name, rank) in batch {
            let mut dims: Vec<Vec<&str>> = vec![vec![]; rank];
            if rank > 0 {
                dims[0] = shard_axes.clone();
            }
            out.inputs.insert(name.to_string(), sharding(&dims));
        }
    }
    let tp = has("model") && matches!(strategy, Strategy::TensorParallel | Strategy::FsdpTp);
    let fsdp = !shard_axes.is_empty() && matches!(strategy, Strategy::Fsdp | Strategy::FsdpTp | Strategy::Zero3);
    let zero_state = has("data") && matches!(strategy, Strategy::Zero1 | Strategy::Zero2 | Strategy::Zero3);
    let zero_grads = has("data") && matches!(strategy, Strategy::Zero2 | Strategy::Zero3);
    for (name, shape, role) in params {
        let rank = shape.len();
        let mut dims: Vec<Vec<&str>> = vec![vec![]; rank];
        if tp {
            match role {
                TpRole::Column if rank == 2 => dims[1].push("model"),
                TpRole::ColumnBias if rank == 1 => dims[0].push("model"),
                TpRole::Row if rank == 2 => dims[0].push("model"),
                _ => {}
            }
        }
        // The data-axis split for FSDP/ZeRO: dimension 0 when it is free,
        // else the first free dimension.
        let data_dim = (0..rank).find(|&d| dims[d].is_empty() && rank >= 1);
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
        out.inputs.insert(name.clone(), sharding(param_dims));
        let suffix = name.strip_prefix("params.").unwrap_or(name);
        for slot in slots {
            let slot_dims = if zero_state || fsdp { &data_dims } else { &dims };
            out.state.insert(format!("{slot}.{suffix}"), sharding(slot_dims));
        }
        if zero_grads && data_dim.is_some() {
            out.grads.insert(name.clone(), sharding(&data_dims));
        }
    }
    out
}

fn sharding(dims: &[Vec<&str>]) -> TensorSharding {
    let refs: Vec<&[&str]> = dims.iter().map(|d| d.as_slice()).collect();
    TensorSharding::new(&refs)
}

/// The tensor-parallel role of a residual-MLP parameter.
pub fn mlp_role(name: &str) -> TpRole {
    if name.ends_with(".w1") {
        TpRole::Column
    } else if name.ends_with(".w2") {
        TpRole::Row
    } else {
        TpRole::Replicated
    }
}

/// The tensor-parallel role of a GPT parameter.
pub fn gpt_role(name: &str) -> TpRole {
    if name.ends_with("attn.wqkv") || name.ends_with("mlp.w1") {
        TpRole::Column
    } else if name.ends_with("mlp.b1") {
        TpRole::ColumnBias
    } else if name.ends_with("attn.wo") || name.ends_with("mlp.w2") {
        TpRole::Row
    } else {
        TpRole::Replicated
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strategies_annotate_as_documented() {
        let params = vec![
            ("params.layers.0.w1".to_string(), vec![8, 16], TpRole::Column),
            ("params.layers.0.w2".to_string(), vec![16, 8], TpRole::Row),
        ];
        let batch = [("x", 2)];
        let axes = ["data", "model"];
        let s = |st: Strategy| shardings(st, &params, &batch, &["opt.m"], &axes);
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
        let fsdp_model_first = shardings(Strategy::Fsdp, &params, &batch, &["opt.m"], &["model", "data"]);
        assert_eq!(fsdp_model_first.inputs["x"].to_string(), "[{data, model}, {}]");
        let z3 = s(Strategy::Zero3);
        assert_eq!(z3.inputs["params.layers.0.w1"].to_string(), "[{data}, {}]");
        assert_eq!("zero2".parse::<Strategy>().unwrap(), Strategy::Zero2);
        let none = s(Strategy::None);
        assert!(none.inputs.is_empty() && none.state.is_empty() && none.grads.is_empty());
        assert!("zero4".parse::<Strategy>().unwrap_err().contains("fsdp_tp"));
    }
}

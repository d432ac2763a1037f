//! Building `train_step` from a loss function.

use super::optim::{broadcast_scalar, clip_by_global_norm, Optimizer, Schedule};
use super::state::{InputRole, StateLeaf, StateRole};
use crate::autodiff::{value_and_grad, GradOptions};
use crate::emit::Emitter;
use crate::CompilerError;
use std::collections::BTreeMap;
use weft_ir::{
    BinaryOp, CompareOp, DType, Function, Module, Op, ReduceOp, TensorSharding, TensorType, UnaryOp, ValueId,
};

/// Dynamic loss scaling (for f16 training), as in optax/jmp's
/// `DynamicLossScale`: the loss is multiplied by `scale` before
/// differentiation; if any gradient is not finite the update is skipped and
/// the scale halved (not below `min_scale`), otherwise after `period` good
/// steps it doubles.
#[derive(Clone, Debug, PartialEq)]
pub struct LossScaling {
    /// The scale of a fresh state.
    pub initial_scale: f64,
    /// Good steps before the scale doubles.
    pub period: u32,
    /// The smallest scale.
    pub min_scale: f64,
}

impl LossScaling {
    /// The scale and good-step counter after a step that used `scale`,
    /// with `good_steps` good steps before it, whose gradients were
    /// `finite` or not: the f32/i32 arithmetic the training step emits
    /// (a pipelined step, which updates the scale on the host, uses this).
    pub fn next(&self, scale: f32, good_steps: i32, finite: bool) -> (f32, i32) {
        if finite {
            let good = good_steps.wrapping_add(1);
            if good >= self.period as i32 {
                (scale * 2.0, 0)
            } else {
                (scale, good)
            }
        } else {
            ((scale * 0.5).max(self.min_scale as f32), 0)
        }
    }
}

impl Default for LossScaling {
    fn default() -> Self {
        LossScaling { initial_scale: 32768.0, period: 2000, min_scale: 1.0 }
    }
}

/// How to build a training step.
#[derive(Clone, Debug, PartialEq)]
pub struct TrainConfig {
    /// The optimizer.
    pub optimizer: Optimizer,
    /// The learning-rate schedule.
    pub schedule: Schedule,
    /// Clip gradients to this global norm.
    pub clip_global_norm: Option<f64>,
    /// Number of micro-batches per step (gradient accumulation); the batch
    /// inputs' leading dimension is split into this many equal parts and the
    /// gradients are summed, then divided by the count so that a step with
    /// a mean loss equals the full-batch step.
    pub micro_batches: usize,
    /// Dynamic loss scaling.
    pub loss_scaling: Option<LossScaling>,
    /// Sharding overrides for state leaves by name (e.g. ZeRO-1 shards
    /// `opt.m.*` over `data` while the parameters stay replicated). Leaves
    /// not listed take their parameter's annotation (optimizer slots) or
    /// none.
    pub state_shardings: BTreeMap<String, TensorSharding>,
    /// Sharding constraints on the gradient of a parameter, by parameter
    /// name (e.g. ZeRO-2 shards gradients over `data`, which turns their
    /// all-reduce into a reduce-scatter). Applied after accumulation.
    pub grad_shardings: BTreeMap<String, TensorSharding>,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            optimizer: Optimizer::sgd(),
            schedule: Schedule::Constant(0.01),
            clip_global_norm: None,
            micro_batches: 1,
            loss_scaling: None,
            state_shardings: BTreeMap::new(),
            grad_shardings: BTreeMap::new(),
        }
    }
}

/// A built training step and the layout of its inputs and outputs.
#[derive(Clone, Debug)]
pub struct TrainStep {
    /// A module holding `@train_step`.
    pub module: Module,
    /// State leaves: the first parameters of `@train_step` and, in the same
    /// order, its first results.
    pub state: Vec<StateLeaf>,
    /// Batch inputs (the remaining parameters), with their full types.
    pub batch: Vec<(String, TensorType)>,
    /// Names of the metric results that follow the new state.
    pub metrics: Vec<String>,
}

impl TrainStep {
    /// The `@train_step` function.
    pub fn function(&self) -> &Function {
        self.module.function("train_step").expect("a TrainStep always holds @train_step")
    }
}

fn err(f: &Function, message: String) -> CompilerError {
    CompilerError::Autodiff { func: f.name.clone(), message }
}

/// Builds `train_step` from `loss`, whose first result is the scalar loss
/// and whose parameters are: trained parameters named `params.*`, an
/// optional PRNG key named `rng` (`u32[2]`), and batch inputs (anything else).
/// Further results are auxiliary metrics, named by their value names.
pub fn build_train_step(m: &Module, loss: &Function, cfg: &TrainConfig) -> Result<TrainStep, CompilerError> {
    if cfg.micro_batches == 0 {
        return Err(err(loss, "micro_batches must be at least 1".into()));
    }
    let names: Vec<String> = (0..loss.params.len()).map(|i| loss.param_name(i)).collect();
    let role = |i: usize| InputRole::of(&names[i]);
    let param_pos: Vec<usize> = (0..names.len()).filter(|&i| role(i) == InputRole::Param).collect();
    if param_pos.is_empty() {
        return Err(err(loss, "the loss function has no trainable parameters (parameters named `params.*`)".into()));
    }
    let rng_pos = (0..names.len()).find(|&i| role(i) == InputRole::Key);
    if let Some(i) = rng_pos {
        let t = loss.ty(loss.params[i]);
        if *t != TensorType::new(DType::U32, vec![2]) {
            return Err(err(loss, format!("parameter `rng` must be a u32[2] key, got {t}")));
        }
    }
    let batch_pos: Vec<usize> = (0..names.len()).filter(|i| !param_pos.contains(i) && Some(*i) != rng_pos).collect();
    let k = cfg.micro_batches;
    for &i in &batch_pos {
        let t = loss.ty(loss.params[i]);
        if k > 1 && t.rank() == 0 {
            return Err(err(
                loss,
                format!("batch input `{}` is a scalar and cannot be split into {k} micro-batches", names[i]),
            ));
        }
    }

    // The function to differentiate: the loss, scaled when loss scaling is on.
    let scaled;
    let (grad_src, wrt_module) = if cfg.loss_scaling.is_some() {
        let mut e = Emitter::with_module("scaled_loss", m);
        let args: Vec<ValueId> = loss
            .params
            .iter()
            .enumerate()
            .map(|(i, &p)| e.f.add_param(Some(names[i].clone()), loss.ty(p).clone()))
            .collect();
        let scale = e.f.add_param(Some("loss_scale".into()), TensorType::scalar(DType::F32));
        let outs = e.inline(loss, &args);
        let lt = e.ty(outs[0]);
        let s = e.convert(scale, lt.dtype);
        let l = e.mul(outs[0], s);
        e.f.results = std::iter::once(l).chain(outs[1..].iter().copied()).collect();
        scaled = e.f;
        (&scaled, m)
    } else {
        (loss, m)
    };
    let wrt: Vec<&str> = param_pos.iter().map(|&i| names[i].as_str()).collect();
    let vg = value_and_grad(wrt_module, grad_src, &wrt, &GradOptions::default())?;

    // State layout.
    let mut state = Vec::new();
    for &i in &param_pos {
        let v = loss.value(loss.params[i]);
        state.push(StateLeaf {
            name: names[i].clone(),
            ty: v.ty.clone(),
            sharding: v.sharding.clone(),
            role: StateRole::Param,
        });
    }
    for slot in cfg.optimizer.slots() {
        for &i in &param_pos {
            let v = loss.value(loss.params[i]);
            let suffix = &names[i]["params.".len()..];
            state.push(StateLeaf {
                name: format!("{slot}.{suffix}"),
                ty: v.ty.with_dtype(DType::F32),
                sharding: v.sharding.clone(),
                role: StateRole::OptimizerSlot { param: names[i].clone() },
            });
        }
    }
    state.push(StateLeaf {
        name: "step".into(),
        ty: TensorType::scalar(DType::I32),
        sharding: None,
        role: StateRole::Step,
    });
    if rng_pos.is_some() {
        state.push(StateLeaf {
            name: "rng".into(),
            ty: TensorType::new(DType::U32, vec![2]),
            sharding: None,
            role: StateRole::Rng,
        });
    }
    if cfg.loss_scaling.is_some() {
        state.push(StateLeaf {
            name: "loss_scale.scale".into(),
            ty: TensorType::scalar(DType::F32),
            sharding: None,
            role: StateRole::LossScale,
        });
        state.push(StateLeaf {
            name: "loss_scale.good_steps".into(),
            ty: TensorType::scalar(DType::I32),
            sharding: None,
            role: StateRole::LossScaleCounter,
        });
    }
    for (name, sh) in &cfg.state_shardings {
        let leaf = state
            .iter_mut()
            .find(|l| &l.name == name)
            .ok_or_else(|| err(loss, format!("state_shardings names `{name}`, which is not a state leaf")))?;
        leaf.sharding = Some(sh.clone());
    }
    for name in cfg.grad_shardings.keys() {
        if !param_pos.iter().any(|&i| &names[i] == name) {
            return Err(err(loss, format!("grad_shardings names `{name}`, which is not a parameter")));
        }
    }
    let batch: Vec<(String, TensorType)> = batch_pos
        .iter()
        .map(|&i| {
            let mut t = loss.ty(loss.params[i]).clone();
            if k > 1 {
                t.shape[0] *= k;
            }
            (names[i].clone(), t)
        })
        .collect();

    // Emit @train_step.
    let mut e = Emitter::with_module("train_step", m);
    let sv: Vec<ValueId> = state
        .iter()
        .map(|l| {
            let v = e.f.add_param(Some(l.name.clone()), l.ty.clone());
            e.f.values[v.index()].sharding = l.sharding.clone();
            v
        })
        .collect();
    // Batch inputs keep the loss function's annotations (e.g. data
    // parallelism shards `x` over `data`).
    let bv: Vec<ValueId> = batch
        .iter()
        .zip(&batch_pos)
        .map(|((n, t), &i)| {
            let v = e.f.add_param(Some(n.clone()), t.clone());
            e.f.values[v.index()].sharding = loss.value(loss.params[i]).sharding.clone();
            v
        })
        .collect();
    let leaf = |name: &str| state.iter().position(|l| l.name == name).map(|i| sv[i]);
    let step = leaf("step").expect("step leaf");
    let np = param_pos.len();

    let key = rng_pos.map(|_| fold_in(&mut e, leaf("rng").expect("rng leaf"), step));
    let scale = leaf("loss_scale.scale");
    let n_aux = loss.results.len() - 1;
    let mut grads: Vec<Option<ValueId>> = vec![None; np];
    let mut loss_sum: Option<ValueId> = None;
    let mut aux_sum: Vec<Option<ValueId>> = vec![None; n_aux];
    for micro in 0..k {
        let mut args = Vec::with_capacity(loss.params.len() + 1);
        let mut bi = 0;
        for i in 0..loss.params.len() {
            if let Some(j) = param_pos.iter().position(|&p| p == i) {
                args.push(sv[j]);
            } else if Some(i) == rng_pos {
                let kk = key.expect("key");
                args.push(if k > 1 {
                    let idx = micro_index(&mut e, micro);
                    fold_in(&mut e, kk, idx)
                } else {
                    kk
                });
            } else {
                let b = bv[bi];
                bi += 1;
                args.push(if k > 1 { micro_slice(&mut e, b, micro, k) } else { b });
            }
        }
        if let Some(s) = scale {
            args.push(s);
        }
        let outs = e.inline(&vg, &args);
        loss_sum = Some(accumulate(&mut e, loss_sum, outs[0]));
        for a in 0..n_aux {
            aux_sum[a] = Some(accumulate(&mut e, aux_sum[a], outs[1 + a]));
        }
        for g in 0..np {
            grads[g] = Some(accumulate(&mut e, grads[g], outs[1 + n_aux + g]));
        }
    }
    let mean = |e: &mut Emitter<'_>, v: ValueId| if k > 1 { e.mul_const(v, 1.0 / k as f64) } else { v };
    let mut loss_v = mean(&mut e, loss_sum.expect("at least one micro-batch"));
    let aux: Vec<ValueId> = aux_sum.into_iter().map(|a| a.expect("aux")).map(|a| mean(&mut e, a)).collect();
    let mut grads: Vec<ValueId> = grads.into_iter().map(|g| g.expect("grad")).map(|g| mean(&mut e, g)).collect();
    // Gradients in the master (f32) precision of their parameters.
    for (g, &i) in grads.iter_mut().zip(&param_pos) {
        let dt = loss.ty(loss.params[i]).dtype;
        *g = e.convert(*g, dt);
    }
    let mut finite = None;
    if let Some(s) = scale {
        let lt = e.ty(loss_v);
        let sc = e.convert(s, lt.dtype);
        loss_v = e.div(loss_v, sc);
        grads = grads
            .into_iter()
            .map(|g| {
                let t = e.ty(g);
                let sb = broadcast_scalar(&mut e, s, &t.shape, t.dtype);
                e.div(g, sb)
            })
            .collect();
        finite = Some(all_finite(&mut e, &grads));
    }
    for (g, &i) in grads.iter_mut().zip(&param_pos) {
        if let Some(sh) = cfg.grad_shardings.get(&names[i]) {
            *g = e.op(Op::ShardingConstraint { sharding: sh.clone() }, &[*g]);
        }
    }
    let (grads, gnorm) = clip_by_global_norm(&mut e, &grads, cfg.clip_global_norm);
    let lr = cfg.schedule.emit(&mut e, step);
    let one_i = e.scalar(DType::I32, 1.0);
    let next_step = e.add(step, one_i);
    let count = e.convert(next_step, DType::F32);

    let slots = cfg.optimizer.slots();
    let mut new_state: Vec<ValueId> = sv.clone();
    for j in 0..np {
        let slot_vals: Vec<ValueId> = (0..slots.len()).map(|s| sv[np * (s + 1) + j]).collect();
        let (p, new_slots) = cfg.optimizer.update(&mut e, sv[j], grads[j], &slot_vals, lr, count);
        new_state[j] = p;
        for (s, v) in new_slots.into_iter().enumerate() {
            new_state[np * (s + 1) + j] = v;
        }
    }
    let step_i = state.iter().position(|l| l.role == StateRole::Step).expect("step");
    new_state[step_i] = next_step;
    let mut metric_vals = vec![loss_v];
    let mut metrics = vec!["loss".to_string()];
    for (a, &r) in loss.results[1..].iter().enumerate() {
        metrics.push(loss.value(r).name.clone().unwrap_or_else(|| format!("metric{}", a + 1)));
        metric_vals.push(aux[a]);
    }
    metrics.push("grad_norm".into());
    metric_vals.push(gnorm);
    metrics.push("lr".into());
    metric_vals.push(lr);
    if let (Some(ls), Some(finite)) = (&cfg.loss_scaling, finite) {
        // Skip the update on non-finite gradients; adjust the scale.
        for (i, l) in state.iter().enumerate() {
            if matches!(l.role, StateRole::Param | StateRole::OptimizerSlot { .. }) {
                new_state[i] = e.select(finite, new_state[i], sv[i]);
            }
        }
        let si = state.iter().position(|l| l.role == StateRole::LossScale).expect("scale");
        let gi = state.iter().position(|l| l.role == StateRole::LossScaleCounter).expect("counter");
        let good = e.add(sv[gi], one_i);
        let period = e.scalar(DType::I32, ls.period as f64);
        let grow = e.compare(CompareOp::Ge, good, period);
        let doubled = e.mul_const(sv[si], 2.0);
        let kept = e.select(grow, doubled, sv[si]);
        let zero_i = e.scalar(DType::I32, 0.0);
        let good_next = e.select(grow, zero_i, good);
        let halved = e.mul_const(sv[si], 0.5);
        let minv = e.scalar(DType::F32, ls.min_scale);
        let halved = e.binary(BinaryOp::Max, halved, minv);
        new_state[si] = e.select(finite, kept, halved);
        new_state[gi] = e.select(finite, good_next, zero_i);
        let skipped = e.unary(UnaryOp::Not, finite);
        let skipped = e.convert(skipped, DType::F32);
        metrics.push("skipped".into());
        metric_vals.push(skipped);
        metrics.push("loss_scale".into());
        metric_vals.push(sv[si]);
    }
    for (i, l) in state.iter().enumerate() {
        if new_state[i] == sv[i] || e.f.results.contains(&new_state[i]) {
            continue;
        }
        e.named(new_state[i], format!("new.{}", l.name));
    }
    for (name, &v) in metrics.iter().zip(&metric_vals) {
        if !sv.contains(&v) {
            e.named(v, format!("metrics.{name}"));
        }
    }
    e.f.results = new_state.into_iter().chain(metric_vals).collect();
    if state.iter().any(|l| l.sharding.is_some()) {
        e.f.result_shardings = state.iter().map(|l| l.sharding.clone()).chain(metrics.iter().map(|_| None)).collect();
    }
    let f = crate::dce::dce(&e.f);
    let mut module = m.clone();
    module.functions.retain(|g| g.name != "train_step");
    module.functions.push(f);
    weft_ir::verify_module(&module)?;
    Ok(TrainStep { module, state, batch, metrics })
}

fn accumulate(e: &mut Emitter<'_>, acc: Option<ValueId>, v: ValueId) -> ValueId {
    match acc {
        Some(a) => e.add(a, v),
        None => v,
    }
}

fn micro_index(e: &mut Emitter<'_>, i: usize) -> ValueId {
    e.scalar(DType::U32, i as f64)
}

/// Micro-batch `i` of `k` along dimension 0.
fn micro_slice(e: &mut Emitter<'_>, b: ValueId, i: usize, k: usize) -> ValueId {
    let t = e.ty(b);
    let mb = t.shape[0] / k;
    let mut start = vec![0; t.rank()];
    let mut limit = t.shape.clone();
    start[0] = i * mb;
    limit[0] = (i + 1) * mb;
    e.op(Op::Slice { start, limit, stride: vec![1; t.rank()] }, &[b])
}

/// A bool scalar: every element of every tensor is finite.
fn all_finite(e: &mut Emitter<'_>, xs: &[ValueId]) -> ValueId {
    let acc = all_finite_f32(e, xs);
    is_one(e, acc)
}

/// An f32 scalar: 1 when every element of every tensor is finite, else 0
/// (the minimum of the elements' `is_finite`, so the flags of several
/// groups of tensors combine exactly by `min`).
pub(crate) fn all_finite_f32(e: &mut Emitter<'_>, xs: &[ValueId]) -> ValueId {
    let mut acc = e.scalar(DType::F32, 1.0);
    for &x in xs {
        let f = e.unary(UnaryOp::IsFinite, x);
        let ff = e.convert(f, DType::F32);
        let r = e.ty(ff).rank();
        let m = e.op(Op::Reduce { op: ReduceOp::Min, dims: (0..r).collect() }, &[ff]);
        acc = e.binary(BinaryOp::Min, acc, m);
    }
    acc
}

/// `flag == 1` for an f32 flag of [`all_finite_f32`].
pub(crate) fn is_one(e: &mut Emitter<'_>, flag: ValueId) -> ValueId {
    let one = e.scalar(DType::F32, 1.0);
    e.compare(CompareOp::Eq, flag, one)
}

/// `fold_in(key, data)` for a `u32[2]` key and an i32 or u32 scalar.
fn fold_in(e: &mut Emitter<'_>, key: ValueId, data: ValueId) -> ValueId {
    let d = e.convert(data, DType::U32);
    crate::random::fold_in(e, key, d)
}

//! Cutting a loss function into per-stage functions.
//!
//! **Units.** The parameters name the model's layers: `params.layers.3.w1`
//! and `params.h.3.attn.wo` belong to the unit `params.layers.3` /
//! `params.h.3` (the prefix through the first numeric component); runs of
//! parameters without a number (`params.wte`, `params.wpe`; `params.ln_f.*`,
//! `params.lm_head`) form one unit each (the embedding, the head). Units
//! are ordered as the parameters are. After inlining every call, an
//! instruction belongs to the latest unit among its operands' units; one
//! that depends on no parameter (constants, masks, the batch inputs'
//! conversions) is *free* and is recomputed by every stage that needs it.
//! So every edge goes from a unit to the same or a later one, and a split of
//! the units into contiguous runs cuts the function into stages whose
//! cross-stage values flow forward only.
//!
//! **Per stage** `s` the split gives:
//! - `forward(params_s, batch, act_in) -> act_out` (the last stage returns
//!   the loss and the auxiliary metrics instead), where `act_in` are the
//!   values defined before `s` and used at or after it (values only
//!   passing through are returned unchanged);
//! - `backward(params_s, batch, act_in, cot_out) -> (grads_s, cot_in)`, the
//!   vector–Jacobian product by [`value_and_grad`] of the surrogate
//!   `Σ sum(out · cot)` (whose gradient with respect to `out` is exactly
//!   `cot`); it recomputes the forward (GPipe's re-materialisation), so a
//!   stage stashes only its inputs between a microbatch's F and B;
//! - `square(gsum_s) -> per-parameter Σ g²` and
//!   `update(params_s, slots_s, step, gsum_s, norm) -> (params_s', slots_s',
//!   lr)`: the tail of `build_train_step` (mean over microbatches,
//!   clipping by the global norm, schedule, optimizer) for the stage's
//!   parameters, with the global norm assembled by the driver from every
//!   stage's squares in parameter order.
//!
//! A PRNG input (`rng`) is an input like the batch: each stage gets the
//! microbatch's key (the driver folds the step and the microbatch index
//! into the state's key as the unpipelined step does) and recomputes the
//! per-layer keys it needs.
//!
//! **Tied weights.** A parameter used by instructions of a later stage than
//! its own (a GPT's token embedding reused as the unembedding) crosses the
//! boundaries like any other value: its stage returns it with its
//! activations, the stages between pass it on, and the stage that uses it
//! takes it as an `act.<id>` input. Its cotangent comes back the same way,
//! and the owning stage's backward adds it to the parameter's gradient (the
//! surrogate `Σ sum(out · cot)` has the parameter itself among `out`), so
//! the parameter has one home, one gradient and one update, and no extra
//! collective is needed (Megatron all-reduces the two copies of a tied
//! embedding instead).
//!
//! **Dynamic loss scaling.** The last stage's backward differentiates the
//! loss times the scale (a `loss_scale` input after its others), so every
//! cotangent crossing a boundary and every stage's gradients are scaled,
//! as in the unpipelined step. `square` and `update` also take the scale
//! and divide the accumulated gradients by it before anything else;
//! `square` returns one more result, 1 when all its stage's unscaled
//! gradients are finite (else 0), and `update` takes the minimum of those
//! flags over the stages (`finite`) and keeps the old parameters and slots
//! when it is 0. The driver updates the scale itself
//! ([`LossScaling::next`](crate::train::LossScaling::next)).

use super::split::{SplitProblem, StageSplit, UnitProfile};
use super::PipelineConfig;
use crate::autodiff::{value_and_grad, GradOptions};
use crate::autoshard::{AutoShardOptions, CostModel};
use crate::emit::Emitter;
use crate::sharding::rules::rule_for;
use crate::train::broadcast_scalar;
use crate::train::{all_finite_f32, is_one, LossScaling, TrainConfig};
use crate::CompilerError;
use std::collections::{BTreeMap, BTreeSet};
use weft_ir::{CompareOp, DType, Function, Module, Op, TensorType, ValueDef, ValueId};

/// The loss function cut into units.
#[derive(Clone, Debug)]
pub struct Units {
    /// Unit names, in order.
    pub names: Vec<String>,
    /// The loss function with every call inlined.
    pub loss: Function,
    /// Per parameter of `loss`: its unit (`None`: a batch input).
    pub param_unit: Vec<Option<usize>>,
    /// Per instruction of `loss`: its unit (`None`: free).
    pub inst_unit: Vec<Option<usize>>,
}

/// The unit a parameter name belongs to (`None`: not numbered).
fn numbered_unit(name: &str) -> Option<String> {
    let parts: Vec<&str> = name.split('.').collect();
    let k = parts.iter().position(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))?;
    Some(parts[..=k].join("."))
}

impl Units {
    /// The units of `@loss` in `m`.
    pub fn of(m: &Module) -> Result<Units, CompilerError> {
        let loss = crate::inline_calls(m, "loss")?;
        let mut names: Vec<String> = Vec::new();
        let mut param_unit = vec![None; loss.params.len()];
        let mut last_numbered = true;
        for (i, slot) in param_unit.iter_mut().enumerate() {
            let name = loss.param_name(i);
            if !name.starts_with("params.") {
                continue;
            }
            match numbered_unit(&name) {
                Some(u) => {
                    let at = names.iter().position(|n| *n == u).unwrap_or_else(|| {
                        names.push(u);
                        names.len() - 1
                    });
                    *slot = Some(at);
                    last_numbered = true;
                }
                None => {
                    if last_numbered {
                        names.push(name.clone());
                    } else {
                        let last = names.last_mut().expect("a unit");
                        last.push('+');
                        last.push_str(&name["params.".len()..]);
                    }
                    *slot = Some(names.len() - 1);
                    last_numbered = false;
                }
            }
        }
        let mut value_unit: Vec<Option<usize>> = vec![None; loss.values.len()];
        for (i, &p) in loss.params.iter().enumerate() {
            value_unit[p.index()] = param_unit[i];
        }
        let mut inst_unit = Vec::with_capacity(loss.insts.len());
        for inst in &loss.insts {
            let u = inst.operands.iter().filter_map(|o| value_unit[o.index()]).max();
            for r in &inst.results {
                value_unit[r.index()] = u;
            }
            inst_unit.push(u);
        }
        Ok(Units { names, loss, param_unit, inst_unit })
    }

    /// The unit of value `v` (`None`: free).
    fn value_unit(&self, v: ValueId) -> Option<usize> {
        match self.loss.value(v).def {
            ValueDef::Param(i) => self.param_unit[i as usize],
            ValueDef::Inst { inst, .. } => self.inst_unit[inst.index()],
        }
    }

    /// Per unit: the values defined before it (not free) that it or a later
    /// unit uses (the activations a stage starting there receives), in id
    /// order; entry `names.len()` is empty.
    fn crossing(&self) -> Vec<BTreeSet<ValueId>> {
        let n = self.names.len();
        let mut cross = vec![BTreeSet::new(); n + 1];
        let mut add = |v: ValueId, d: usize, t: usize| {
            for c in cross.iter_mut().take(t + 1).skip(d + 1) {
                c.insert(v);
            }
        };
        for (i, inst) in self.loss.insts.iter().enumerate() {
            let Some(t) = self.inst_unit[i] else { continue };
            // Values of a unit, instructions' results and parameters alike
            // (a tied parameter is sent to the later stages that use it).
            for &o in &inst.operands {
                if let Some(d) = self.value_unit(o) {
                    add(o, d, t);
                }
            }
        }
        for &r in &self.loss.results {
            if let Some(d) = self.value_unit(r) {
                add(r, d, n - 1);
            }
        }
        cross
    }

    /// Each unit's predicted forward and backward time, state bytes
    /// (parameter, gradient accumulator, `slots` optimizer slots in f32),
    /// activation bytes and input bytes per microbatch. An instruction
    /// takes the cost model's time ([`CostModel::op_time`]: the per-op
    /// overhead plus the longer of its compute and its memory traffic, so
    /// that element-wise work such as a softmax over a large vocabulary
    /// costs something), split over `split_over` devices; the backward
    /// recomputes the forward and costs twice it again.
    pub fn profile(&self, slots: usize, split_over: usize, opts: &AutoShardOptions) -> Vec<UnitProfile> {
        let model = CostModel::new(&weft_compiler_mesh_1(), opts);
        let f = &self.loss;
        let n = self.names.len();
        let mut time = vec![0.0f64; n];
        let mut act = vec![0u64; n];
        for (i, inst) in f.insts.iter().enumerate() {
            let Some(u) = self.inst_unit[i] else { continue };
            let ops: Vec<&TensorType> = inst.operands.iter().map(|&o| f.ty(o)).collect();
            let rs: Vec<&TensorType> = inst.results.iter().map(|&r| f.ty(r)).collect();
            let flops = rule_for(&inst.op, &ops, &rs)
                .map_or(0.0, |rule| crate::autoshard::space::inst_flops(&inst.op, &rule, &ops, rs[0]));
            let bytes: f64 = ops.iter().chain(&rs).map(|t| t.size_bytes() as f64).sum();
            time[u] += model.op_time(flops, split_over.max(1), bytes / split_over.max(1) as f64);
            act[u] += rs.iter().map(|t| t.size_bytes() as u64).sum::<u64>();
        }
        let mut state = vec![0u64; n];
        let mut batch = 0u64;
        for (i, &p) in f.params.iter().enumerate() {
            let t = f.ty(p);
            match self.param_unit[i] {
                Some(u) => state[u] += (2 * t.size_bytes() + slots * t.num_elements() * 4) as u64,
                None => batch += t.size_bytes() as u64,
            }
        }
        let cross = self.crossing();
        (0..n)
            .map(|u| {
                let fwd = time[u];
                UnitProfile {
                    name: self.names[u].clone(),
                    forward: fwd,
                    backward: 3.0 * fwd,
                    state_bytes: state[u],
                    activation_bytes: act[u],
                    input_bytes: batch + cross[u].iter().map(|&v| f.ty(v).size_bytes() as u64).sum::<u64>(),
                }
            })
            .collect()
    }
}

/// A mesh of one device (the unit profiles are per device already).
fn weft_compiler_mesh_1() -> crate::sharding::Mesh {
    crate::sharding::Mesh::new(&[]).expect("the empty mesh is valid")
}

/// Each unit's predicted cost and memory ([`Units::profile`]).
pub fn profile_units(
    m: &Module,
    slots: usize,
    split_over: usize,
    opts: &AutoShardOptions,
) -> Result<Vec<UnitProfile>, CompilerError> {
    Ok(Units::of(m)?.profile(slots, split_over, opts))
}

/// One stage's functions and the names of their inputs.
#[derive(Clone, Debug)]
pub struct StageFns {
    /// `forward(params, batch, act_in) -> act_out` (last stage: loss, aux).
    pub forward: Function,
    /// `backward(params, batch, act_in, cot_out) -> ([value, aux...,] grads, cot_in)`;
    /// with loss scaling the last stage's also takes `loss_scale` (last)
    /// and its value is the scaled loss.
    pub backward: Function,
    /// `square(gsum) -> Σ g² per parameter`; with loss scaling
    /// `square(gsum, loss_scale) -> (Σ g² per parameter, finite)`.
    pub square: Function,
    /// `update(params, slots (slot-major), step, gsum, norm) -> (params', slots', lr)`;
    /// with loss scaling it also takes `loss_scale` and `finite` (last).
    pub update: Function,
    /// The stage's parameters, in `@loss` order.
    pub params: Vec<String>,
    /// The batch inputs the stage reads.
    pub batch: Vec<String>,
    /// Input activations (types), in `forward`'s order.
    pub act_in: Vec<TensorType>,
    /// Which input activations are floats (they get cotangents).
    pub act_in_float: Vec<bool>,
    /// Output activations (types); empty for the last stage.
    pub act_out: Vec<TensorType>,
    /// Which output activations are floats (they receive cotangents).
    pub act_out_float: Vec<bool>,
}

/// A training step cut into stages.
#[derive(Clone, Debug)]
pub struct StagedStep {
    /// Per chunk of the model, in order (`S·V` chunks under the interleaved
    /// schedule, chunk `c` on stage `c mod S`; one per stage otherwise).
    /// Functions are named after their chunk: `stage<c>.forward`, ….
    pub stages: Vec<StageFns>,
    /// The split with its predictions.
    pub split: StageSplit,
    /// The unit names.
    pub unit_names: Vec<String>,
    /// The pipeline configuration.
    pub config: PipelineConfig,
    /// Names of the loss function's auxiliary results (metrics).
    pub aux: Vec<String>,
    /// The optimizer's slot names (`opt.m`, ...).
    pub slots: Vec<String>,
    /// Dynamic loss scaling, when on.
    pub loss_scaling: Option<LossScaling>,
}

/// Cuts the training step of `@loss` in `m` into the schedule's chunks
/// (`pc.stages` stages, `V` chunks each when interleaved). The
/// loss is built for one microbatch; `split_over` is the number of devices
/// each stage's work is split over (for the cost model).
pub fn build_stages(
    m: &Module,
    tc: &TrainConfig,
    pc: &PipelineConfig,
    split_over: usize,
    opts: &AutoShardOptions,
) -> Result<StagedStep, CompilerError> {
    let units = Units::of(m)?;
    let scaling = tc.loss_scaling.is_some();
    let problem = SplitProblem {
        units: units.profile(tc.optimizer.slots().len(), split_over, opts),
        stages: pc.stages,
        microbatches: pc.microbatches,
        schedule: pc.schedule,
        memory_budget: pc.memory_budget,
    };
    let split = match &pc.split {
        Some(counts) => problem.evaluate(counts)?,
        None => problem.best()?,
    };
    let mut stage_of_unit = Vec::new();
    for (s, &c) in split.counts.iter().enumerate() {
        stage_of_unit.extend(std::iter::repeat_n(s, c));
    }
    let f = &units.loss;
    let stage_of_inst: Vec<Option<usize>> = units.inst_unit.iter().map(|u| u.map(|u| stage_of_unit[u])).collect();
    let cross = units.crossing();
    let starts: Vec<usize> = split.ranges().iter().map(|r| r.start).collect();
    let boundary = |s: usize| -> Vec<ValueId> {
        if s == 0 {
            Vec::new()
        } else {
            cross[starts[s]].iter().copied().collect()
        }
    };
    let s_n = pc.schedule.chunks(pc.stages);
    let aux: Vec<String> = f.results[1..]
        .iter()
        .enumerate()
        .map(|(a, &r)| f.value(r).name.clone().unwrap_or_else(|| format!("metric{}", a + 1)))
        .collect();
    let mut stages = Vec::with_capacity(s_n);
    for s in 0..s_n {
        let b_in = boundary(s);
        let b_out = if s + 1 < s_n { boundary(s + 1) } else { Vec::new() };
        let outs = if s + 1 < s_n { b_out.clone() } else { f.results.clone() };
        let forward = extract(f, &units, &stage_of_unit, &stage_of_inst, s, &b_in, &outs)?;
        let n_params =
            units.param_unit.iter().enumerate().filter(|(_, u)| u.is_some_and(|u| stage_of_unit[u] == s)).count();
        let params: Vec<String> = (0..n_params).map(|i| forward.param_name(i)).collect();
        let batch: Vec<String> = (n_params..forward.params.len() - b_in.len()).map(|i| forward.param_name(i)).collect();
        let act_in: Vec<TensorType> = b_in.iter().map(|&v| f.ty(v).clone()).collect();
        let act_out: Vec<TensorType> = b_out.iter().map(|&v| f.ty(v).clone()).collect();
        let act_in_float: Vec<bool> = act_in.iter().map(|t| t.dtype.is_float()).collect();
        let act_out_float: Vec<bool> = act_out.iter().map(|t| t.dtype.is_float()).collect();
        let mut wrt: Vec<String> = params.clone();
        wrt.extend(b_in.iter().zip(&act_in_float).filter(|(_, &fl)| fl).map(|(v, _)| format!("act.{}", v.index())));
        let wrt_refs: Vec<&str> = wrt.iter().map(String::as_str).collect();
        let gopts = GradOptions { name: Some(format!("stage{s}.backward")), grad_prefix: None };
        let empty = Module { functions: vec![] };
        let backward = if s + 1 == s_n && scaling {
            value_and_grad(&empty, &scaled_loss(&forward), &wrt_refs, &gopts)?
        } else if s + 1 == s_n {
            value_and_grad(&empty, &forward, &wrt_refs, &gopts)?
        } else {
            let sur = surrogate(&forward, &b_out, &act_out_float);
            value_and_grad(&empty, &sur, &wrt_refs, &gopts)?
        };
        let square = square_fn(s, &forward, n_params, pc.microbatches, scaling);
        let update = update_fn(s, &forward, n_params, tc, pc.microbatches);
        stages.push(StageFns {
            forward,
            backward,
            square,
            update,
            params,
            batch,
            act_in,
            act_in_float,
            act_out,
            act_out_float,
        });
    }
    Ok(StagedStep {
        stages,
        split,
        unit_names: units.names.clone(),
        config: pc.clone(),
        aux,
        slots: tc.optimizer.slots().iter().map(|s| s.to_string()).collect(),
        loss_scaling: tc.loss_scaling.clone(),
    })
}

/// Stage `s`'s forward: its parameters, the batch inputs it reads, `b_in`
/// as `act.<id>`; its instructions and the free ones it needs; `outs`.
fn extract(
    f: &Function,
    units: &Units,
    stage_of_unit: &[usize],
    stage_of_inst: &[Option<usize>],
    s: usize,
    b_in: &[ValueId],
    outs: &[ValueId],
) -> Result<Function, CompilerError> {
    let n = f.insts.len();
    let def_inst = |v: ValueId| match f.value(v).def {
        ValueDef::Inst { inst, .. } => Some(inst.index()),
        ValueDef::Param(_) => None,
    };
    let incoming: BTreeSet<ValueId> = b_in.iter().copied().collect();
    // The free instructions the stage needs, found backwards.
    let mut take = vec![false; n];
    let mut stack: Vec<ValueId> = outs.iter().filter(|v| !incoming.contains(v)).copied().collect();
    for i in 0..n {
        if stage_of_inst[i] == Some(s) {
            take[i] = true;
            stack.extend(f.insts[i].operands.iter().copied());
        }
    }
    while let Some(v) = stack.pop() {
        if incoming.contains(&v) {
            continue;
        }
        if let Some(i) = def_inst(v) {
            if !take[i] {
                if stage_of_inst[i].is_some() {
                    return Err(CompilerError::Internal {
                        stage: "pipeline stage split".into(),
                        message: format!("stage {s} needs {v} from stage {:?} outside its inputs", stage_of_inst[i]),
                    });
                }
                take[i] = true;
                stack.extend(f.insts[i].operands.iter().copied());
            }
        }
    }
    let mut used = vec![false; f.values.len()];
    for (i, inst) in f.insts.iter().enumerate() {
        if take[i] {
            for o in &inst.operands {
                used[o.index()] = true;
            }
        }
    }
    for o in outs {
        used[o.index()] = true;
    }
    let mut g = Function::new(format!("stage{s}.forward"));
    let mut map: BTreeMap<ValueId, ValueId> = BTreeMap::new();
    let add_param = |g: &mut Function, map: &mut BTreeMap<ValueId, ValueId>, v: ValueId, name: String| {
        let np = g.add_param(Some(name), f.ty(v).clone());
        g.values[np.index()].sharding = f.value(v).sharding.clone();
        map.insert(v, np);
    };
    // Parameters of the stage (all of them: a stage's parameter unused by
    // its instructions still gets a zero gradient), then batch inputs.
    for (i, &p) in f.params.iter().enumerate() {
        if units.param_unit[i].is_some_and(|u| stage_of_unit[u] == s) {
            add_param(&mut g, &mut map, p, f.param_name(i));
        }
    }
    for (i, &p) in f.params.iter().enumerate() {
        if units.param_unit[i].is_none() && used[p.index()] {
            add_param(&mut g, &mut map, p, f.param_name(i));
        }
    }
    for &v in b_in {
        add_param(&mut g, &mut map, v, format!("act.{}", v.index()));
    }
    for (i, inst) in f.insts.iter().enumerate() {
        if !take[i] {
            continue;
        }
        let ops: Vec<ValueId> = inst.operands.iter().map(|o| map[o]).collect();
        let results: Vec<_> = inst.results.iter().map(|&r| (f.ty(r).clone(), f.value(r).name.clone())).collect();
        let ni = g.add_inst(inst.op.clone(), ops, results, inst.loc);
        for (k, &r) in inst.results.iter().enumerate() {
            let nr = g.insts[ni.index()].results[k];
            g.values[nr.index()].sharding = f.value(r).sharding.clone();
            map.insert(r, nr);
        }
    }
    g.results = outs.iter().map(|o| map[o]).collect();
    weft_ir::verify_function(&Module { functions: vec![] }, &g)?;
    Ok(g)
}

/// An emitter for `<fwd>.<what>`, a function that starts with `fwd`'s
/// parameters (names, types and shardings), and those parameters.
fn wrapping(fwd: &Function, what: &str) -> (Emitter<'static>, Vec<ValueId>) {
    let mut e = Emitter::new(format!("{}.{what}", fwd.name));
    let args = (0..fwd.params.len())
        .map(|i| {
            let v = e.f.add_param(Some(fwd.param_name(i)), fwd.ty(fwd.params[i]).clone());
            e.f.values[v.index()].sharding = fwd.value(fwd.params[i]).sharding.clone();
            v
        })
        .collect();
    (e, args)
}

/// `Σ_k sum(out_k · cot_k)` over the float outputs of `fwd`, with the
/// cotangents as parameters `cot.<id>` after `fwd`'s.
fn surrogate(fwd: &Function, b_out: &[ValueId], float: &[bool]) -> Function {
    let (mut e, args) = wrapping(fwd, "surrogate");
    let cots: Vec<Option<ValueId>> = b_out
        .iter()
        .zip(float)
        .enumerate()
        .map(|(k, (v, &fl))| {
            fl.then(|| e.f.add_param(Some(format!("cot.{}", v.index())), fwd.ty(fwd.results[k]).clone()))
        })
        .collect();
    let outs = e.inline(fwd, &args);
    let mut total = e.scalar(DType::F32, 0.0);
    for (o, c) in outs.iter().zip(&cots) {
        let Some(c) = c else { continue };
        let p = e.mul(*o, *c);
        let s = e.sum_all(p);
        let s = e.convert(s, DType::F32);
        total = e.add(total, s);
    }
    e.f.results = vec![total];
    e.f
}

/// The last stage's forward with its loss (first result) multiplied by
/// a `loss_scale` input (f32, after the others), as the unpipelined step
/// scales the loss it differentiates.
fn scaled_loss(fwd: &Function) -> Function {
    let (mut e, args) = wrapping(fwd, "scaled");
    let scale = e.f.add_param(Some("loss_scale".into()), TensorType::scalar(DType::F32));
    let mut outs = e.inline(fwd, &args);
    let lt = e.ty(outs[0]).dtype;
    let s = e.convert(scale, lt);
    outs[0] = e.mul(outs[0], s);
    e.f.results = outs;
    e.f
}

/// The mean of an accumulated gradient in its parameter's dtype, as the
/// unpipelined step computes it; divided by the loss scale `scale` when
/// there is one.
fn mean_grad(e: &mut Emitter<'_>, g: ValueId, dtype: DType, k: usize, scale: Option<ValueId>) -> ValueId {
    let m = if k > 1 { e.mul_const(g, 1.0 / k as f64) } else { g };
    let g = e.convert(m, dtype);
    match scale {
        Some(s) => {
            let t = e.ty(g);
            let sb = broadcast_scalar(e, s, &t.shape, t.dtype);
            e.div(g, sb)
        }
        None => g,
    }
}

/// `square(gsum...) -> (Σ g² per parameter)` (f32 scalars); with loss
/// scaling `square(gsum..., loss_scale) -> (Σ g² per parameter..., finite)`.
fn square_fn(s: usize, fwd: &Function, n_params: usize, k: usize, scaling: bool) -> Function {
    let mut e = Emitter::new(format!("stage{s}.square"));
    let gs: Vec<ValueId> = (0..n_params)
        .map(|i| e.f.add_param(Some(format!("grad.{}", fwd.param_name(i))), fwd.ty(fwd.params[i]).clone()))
        .collect();
    let scale = scaling.then(|| e.f.add_param(Some("loss_scale".into()), TensorType::scalar(DType::F32)));
    let mut out = Vec::new();
    let mut grads = Vec::new();
    for (i, &g) in gs.iter().enumerate() {
        let g = mean_grad(&mut e, g, fwd.ty(fwd.params[i]).dtype, k, scale);
        grads.push(g);
        let g32 = e.convert(g, DType::F32);
        let sq = e.mul(g32, g32);
        out.push(e.sum_all(sq));
    }
    if scaling {
        out.push(all_finite_f32(&mut e, &grads));
    }
    e.f.results = out;
    e.f
}

/// `update(params, slots, step, gsum, norm[, loss_scale, finite]) -> (params', slots', lr)`.
fn update_fn(s: usize, fwd: &Function, n_params: usize, tc: &TrainConfig, k: usize) -> Function {
    let mut e = Emitter::new(format!("stage{s}.update"));
    let slots = tc.optimizer.slots();
    let ps: Vec<ValueId> = (0..n_params)
        .map(|i| {
            let v = e.f.add_param(Some(fwd.param_name(i)), fwd.ty(fwd.params[i]).clone());
            e.f.values[v.index()].sharding = fwd.value(fwd.params[i]).sharding.clone();
            v
        })
        .collect();
    let mut sv = Vec::new();
    for slot in slots {
        for i in 0..n_params {
            let name = fwd.param_name(i);
            let t = fwd.ty(fwd.params[i]).with_dtype(DType::F32);
            let v = e.f.add_param(Some(format!("{slot}.{}", &name["params.".len()..])), t);
            let sh = tc.state_shardings.get(&format!("{slot}.{}", &name["params.".len()..])).cloned();
            e.f.values[v.index()].sharding = sh.or_else(|| fwd.value(fwd.params[i]).sharding.clone());
            sv.push(v);
        }
    }
    let step = e.f.add_param(Some("step".into()), TensorType::scalar(DType::I32));
    let gs: Vec<ValueId> = (0..n_params)
        .map(|i| e.f.add_param(Some(format!("grad.{}", fwd.param_name(i))), fwd.ty(fwd.params[i]).clone()))
        .collect();
    let norm = e.f.add_param(Some("norm".into()), TensorType::scalar(DType::F32));
    let scaling = tc.loss_scaling.is_some();
    let scale = scaling.then(|| e.f.add_param(Some("loss_scale".into()), TensorType::scalar(DType::F32)));
    let finite = scaling.then(|| e.f.add_param(Some("finite".into()), TensorType::scalar(DType::F32)));
    let mut grads: Vec<ValueId> = gs
        .iter()
        .enumerate()
        .map(|(i, &g)| {
            let dt = fwd.ty(fwd.params[i]).dtype;
            let g = mean_grad(&mut e, g, dt, k, scale);
            match tc.grad_shardings.get(&fwd.param_name(i)) {
                Some(sh) => e.op(Op::ShardingConstraint { sharding: sh.clone() }, &[g]),
                None => g,
            }
        })
        .collect();
    if let Some(max_norm) = tc.clip_global_norm {
        // As `clip_by_global_norm`, with the norm given.
        let maxv = e.scalar(DType::F32, max_norm);
        let keep = e.compare(CompareOp::Lt, norm, maxv);
        let factor = e.div(maxv, norm);
        grads = grads
            .into_iter()
            .map(|g| {
                let t = e.ty(g);
                let fb = broadcast_scalar(&mut e, factor, &t.shape, t.dtype);
                let scaled = e.mul(g, fb);
                e.select(keep, g, scaled)
            })
            .collect();
    }
    let lr = tc.schedule.emit(&mut e, step);
    let one_i = e.scalar(DType::I32, 1.0);
    let next_step = e.add(step, one_i);
    let count = e.convert(next_step, DType::F32);
    let keep = finite.map(|f| is_one(&mut e, f));
    let mut new_p = Vec::new();
    let mut new_s = vec![Vec::new(); slots.len()];
    for j in 0..n_params {
        let slot_vals: Vec<ValueId> = (0..slots.len()).map(|q| sv[q * n_params + j]).collect();
        let (mut p, mut ns) = tc.optimizer.update(&mut e, ps[j], grads[j], &slot_vals, lr, count);
        if let Some(keep) = keep {
            // Non-finite gradients somewhere: keep the old values.
            p = e.select(keep, p, ps[j]);
            for (q, v) in ns.iter_mut().enumerate() {
                *v = e.select(keep, *v, slot_vals[q]);
            }
        }
        new_p.push(p);
        for (q, v) in ns.into_iter().enumerate() {
            new_s[q].push(v);
        }
    }
    e.f.results = new_p.into_iter().chain(new_s.into_iter().flatten()).chain([lr]).collect();
    crate::dce::dce(&e.f)
}

//! The SPMD partitioner: from a sharded global program to the program each
//! device runs, with every byte of communication explicit.
//!
//! Propagation ([`crate::sharding::propagate()`]) leaves a function in which
//! every value has a closed sharding and every instruction other than
//! `reshard` is locally computable. [`partition`] turns it into one
//! [`DeviceProgram`] that all devices run (SPMD): buffers with local shapes,
//! compute steps with attributes rewritten for local shapes, each `reshard`
//! lowered through its [`crate::sharding::ReshardPlan`] into shard slices
//! and collectives, and `free` steps after each buffer's last use. Nothing
//! about the mathematics changes; the reference simulator
//! ([`weft_ir::device::simulate`]) and [`PartitionedFunction::run`] prove it
//! on the CPU against the unsharded interpreter. Strategies (data parallel,
//! Megatron, FSDP, ZeRO-1/2/3) are annotations only: this module has no code
//! path per strategy.
//!
//! Pieces: `lower` (instructions), `reshard` (plans to steps), `liveness`
//! (fusion, frees), `bucket` (small all-reduces combined), [`overlap`]
//! (collectives split into start and done around the compute they
//! overlap), [`report`] (memory and communication per device),
//! [`host`] (global tensors to blocks and back). The text form and
//! the semantics of device programs are written in `specs/device-program.md`.

mod bucket;
mod builder;
mod cse;
pub mod host;
pub(crate) mod liveness;
mod lower;
pub mod overlap;
mod remat;
pub mod report;
mod reshard;

pub use host::{shard_tensor, unshard_tensor};
pub use report::{CollectiveStat, ProgramReport};

use crate::error::{CompilerError, Result};
use crate::pipeline::{Pass, PassTimes, Pipeline, Program};
use crate::sharding::{Mesh, MeshSharding, PropagateOptions, ShardedFunction};
use weft_ir::device::{simulate, verify_program, DeviceProgram};
use weft_ir::tensor::HostTensor;
use weft_ir::{IrError, Module, TensorSharding, TensorType};

/// A clean-up pass over a lowered device program (`specs/device-program.md`
/// §5). Each takes a verified program to a verified program with the same
/// semantics.
pub type Cleanup = fn(&mut DeviceProgram);

/// The clean-ups [`partition_function`] runs after lowering, by name, in
/// order: compose transposes of transposes, forward identity steps, fold
/// transposes into the dots that read them, merge repeated computations
/// ([`cse`]), remove dead steps, fuse all-reduce + shard slice into
/// reduce-scatter, recompute cheap values and splats where they are read
/// instead of storing them ([`remat`]), compact (renumber buffers in definition order), insert
/// frees after last uses.
pub const CLEANUPS: &[(&str, Cleanup)] = &[
    ("compose_transposes", liveness::compose_transposes),
    ("forward_identities", liveness::forward_identities),
    ("fold_transposes", liveness::fold_transposes_into_dots),
    ("cse", cse::eliminate_common_subexpressions),
    ("remove_dead_steps", liveness::remove_dead_steps),
    ("fuse_reduce_scatter", liveness::fuse_reduce_scatter),
    ("rematerialize", remat::rematerialize),
    ("compact", liveness::compact),
    ("insert_frees", liveness::insert_frees),
];

/// The clean-up named `name` (see [`CLEANUPS`]).
pub fn cleanup_pass(name: &str) -> Option<Cleanup> {
    CLEANUPS.iter().find(|(n, _)| *n == name).map(|(_, c)| *c)
}

/// A global input or output of a partitioned function: its name, global
/// type and sharding.
#[derive(Clone, Debug, PartialEq)]
pub struct GlobalValue {
    /// Parameter name (or `arg{i}`), or the result value's name (or `out{k}`).
    pub name: String,
    /// The global type.
    pub ty: TensorType,
    /// How it is laid out over the mesh (closed).
    pub sharding: TensorSharding,
}

/// A device program with the global layout of its inputs and outputs: what
/// is needed to run it on global tensors.
#[derive(Clone, Debug)]
pub struct PartitionedFunction {
    /// The program every device runs.
    pub program: DeviceProgram,
    /// The mesh.
    pub mesh: Mesh,
    /// The function's parameters, in order.
    pub inputs: Vec<GlobalValue>,
    /// The function's results, in order.
    pub outputs: Vec<GlobalValue>,
}

/// Lowers a sharded function (call-free; see [`crate::inline_calls`]) to the
/// program every device of `mesh` runs. Errors: a function that is not
/// locally computable on `mesh` or has a call, or (a partitioner bug) a
/// program the verifier rejects.
pub fn partition(sf: &ShardedFunction, mesh: &Mesh) -> Result<DeviceProgram> {
    Ok(partition_function(sf, mesh)?.program)
}

/// [`partition`], keeping the global layout of inputs and outputs: the
/// pipeline's `partition` pass and every clean-up ([`crate::pipeline`]).
pub fn partition_function(sf: &ShardedFunction, mesh: &Mesh) -> Result<PartitionedFunction> {
    let lowered = Program::Partitioned(Box::new(lower_sharded(sf, mesh)?));
    let cleanups =
        Pipeline { mesh: mesh.clone(), passes: Pipeline::cleanups().collect(), verify: cfg!(debug_assertions) };
    cleanups.run_from(lowered, &mut |_, _| {})?.0.into_partitioned()
}

/// The pipeline's `partition` pass: checks that `sf` is locally computable
/// and lowers it, without the clean-ups (the program is valid, with
/// identity steps, dead steps and sparse buffer ids, and no frees).
pub fn lower_sharded(sf: &ShardedFunction, mesh: &Mesh) -> Result<PartitionedFunction> {
    let f = &sf.function;
    crate::sharding::check_locally_computable(f, mesh)?;
    let lowered = lower::lower_function(f, mesh)?;
    let program = lowered.program;
    let layout =
        |name: String, ty: &TensorType, s: &MeshSharding| GlobalValue { name, ty: ty.clone(), sharding: s.to_ir(mesh) };
    let inputs =
        f.params.iter().enumerate().map(|(i, &p)| layout(f.param_name(i), f.ty(p), &lowered.input_shardings[i]));
    let outputs = f.results.iter().enumerate().map(|(k, &r)| {
        let name = f.value(r).name.clone().unwrap_or_else(|| format!("out{k}"));
        layout(name, f.ty(r), &lowered.output_shardings[k])
    });
    Ok(PartitionedFunction { program, mesh: mesh.clone(), inputs: inputs.collect(), outputs: outputs.collect() })
}

/// The whole pipeline for function `entry` of `m`: inline calls, propagate
/// shardings on `mesh`, partition, clean up ([`Pipeline::standard`]).
pub fn compile(m: &Module, entry: &str, mesh: &Mesh, options: &PropagateOptions) -> Result<PartitionedFunction> {
    Pipeline::standard(mesh, options).run(m, entry, &mut |_, _| {})?.0.into_partitioned()
}

/// The compile of a function whose first `state` parameters are replaced,
/// result for parameter, by its first `state` results (a training step),
/// over any pipeline (e.g. [`Pipeline::standard`], or one with an
/// `autoshard` pass before `propagate`, for `--strategy auto`). Each such
/// result is pinned to the sharding its parameter gets, like
/// `jit(out_shardings=in_shardings)`, so the new state comes out laid out
/// exactly as the step takes it (any reshard this needs is inside the
/// program) and can stay on the devices between steps: every round runs
/// the pipeline's passes on the inlined function with the state results
/// pinned so far. Returns the partitioned function and the time of each
/// phase: `inline`, then each pass before `partition` by its name, and
/// `partition` with its clean-ups.
///
/// An `autoshard` pass's memory budget is a promise about the program that
/// runs, not only about the plan: the partitioned program's peak of live
/// bytes (what the devices measure) can exceed the plan's estimate, so the
/// plan is searched again under a budget lowered by the excess, a few
/// times, and a program still over is [`CompilerError::ProgramOverBudget`].
pub fn compile_stable(
    pipeline: &Pipeline,
    m: &Module,
    entry: &str,
    state: usize,
) -> Result<(PartitionedFunction, PassTimes)> {
    let clock = std::time::Instant::now();
    let f = crate::inline::inline(m, entry)?;
    let inlined = ("inline", clock.elapsed());
    let n_results = f.function().results.len();
    let n_params = f.function().params.len();
    if state > n_params.min(n_results) {
        return Err(CompilerError::State {
            leaf: format!("@{entry}"),
            message: format!("{n_params} parameters and {n_results} results, fewer than its {state} state leaves"),
        });
    }
    let budget = pipeline.passes.iter().find_map(|p| match p {
        Pass::AutoShard(o) => o.memory_budget,
        _ => None,
    });
    let Some(budget) = budget else { return settle_state(pipeline, f, entry, state, vec![inlined]) };
    let mut pipeline = pipeline.clone();
    let mut peak = 0;
    for round in 0..4 {
        let (pf, times) = match settle_state(&pipeline, f.clone(), entry, state, vec![inlined]) {
            Ok(r) => r,
            // A lowered budget no plan meets: report the program's need.
            Err(CompilerError::MemoryBudgetInfeasible { .. }) if round > 0 => break,
            Err(e) => return Err(e),
        };
        peak = pf.report().peak_live_bytes as u64;
        if peak <= budget {
            return Ok((pf, times));
        }
        for p in pipeline.passes.iter_mut() {
            if let Pass::AutoShard(o) = p {
                let asked = o.memory_budget.unwrap_or(budget);
                o.memory_budget = Some(asked.saturating_sub(peak - budget).max(1));
            }
        }
    }
    Err(CompilerError::ProgramOverBudget { func: entry.to_string(), peak, budget })
}

/// Runs the pipeline on `f` until each state result's layout is its
/// parameter's (pinning the results that moved), adding the passes' times
/// to `times`.
fn settle_state(
    pipeline: &Pipeline,
    mut f: crate::inline::InlinedFunction,
    entry: &str,
    state: usize,
    mut times: PassTimes,
) -> Result<(PartitionedFunction, PassTimes)> {
    // Pinning a result can move the layout propagation picks for an unpinned
    // parameter; a few rounds reach the fixed point.
    for _round in 0..4 {
        let (p, passes) = pipeline.run_from(Program::Inlined(f.clone()), &mut |_, _| {})?;
        for (name, t) in passes {
            let phase = match name {
                "annotate" => "annotate",
                "autoshard" => "autoshard",
                "propagate" => "propagate",
                _ => "partition",
            };
            times.push((phase, t));
        }
        let pf = p.into_partitioned()?;
        let moved: Vec<usize> = (0..state).filter(|&i| pf.inputs[i].sharding != pf.outputs[i].sharding).collect();
        if moved.is_empty() {
            return Ok((pf, merge_phases(times)));
        }
        for i in moved {
            f.set_result_sharding(i, pf.inputs[i].sharding.clone());
        }
    }
    Err(CompilerError::State {
        leaf: format!("@{entry}"),
        message: "the state layout did not settle: pinning each new state leaf to its parameter's sharding kept moving the parameters".into(),
    })
}

/// Sums repeated phases, keeping first-seen order.
fn merge_phases(times: PassTimes) -> PassTimes {
    let mut out: PassTimes = Vec::new();
    for (name, t) in times {
        match out.iter_mut().find(|(n, _)| *n == name) {
            Some((_, acc)) => *acc += t,
            None => out.push((name, t)),
        }
    }
    out
}

impl PartitionedFunction {
    /// Memory and communication per device.
    pub fn report(&self) -> ProgramReport {
        ProgramReport::of(&self.program)
    }

    /// Checks that the mesh fits on `available_devices` devices and that the
    /// program verifies: the errors to report before anything runs.
    pub fn check_runnable(&self, available_devices: usize) -> Result<()> {
        let needed = self.mesh.num_devices();
        if needed > available_devices {
            return Err(CompilerError::InvalidMesh {
                spec: self.mesh.to_string(),
                message: format!(
                    "the mesh needs {needed} devices but only {available_devices} {} available",
                    if available_devices == 1 { "is" } else { "are" }
                ),
            });
        }
        verify_program(&self.program)?;
        Ok(())
    }

    /// Cuts global inputs into per-device blocks (checking their number and
    /// types): `result[d]` is device position `d`'s input list.
    pub fn shard_inputs(&self, inputs: &[HostTensor]) -> Result<Vec<Vec<HostTensor>>> {
        if inputs.len() != self.inputs.len() {
            let names: Vec<&str> = self.inputs.iter().map(|g| g.name.as_str()).collect();
            return Err(IrError::Input {
                name: format!("arg{}", inputs.len().min(self.inputs.len())),
                message: format!(
                    "@{} takes {} inputs ({}), given {}",
                    self.program.name,
                    self.inputs.len(),
                    names.join(", "),
                    inputs.len()
                ),
            }
            .into());
        }
        let mut per_device = vec![Vec::with_capacity(inputs.len()); self.mesh.num_devices()];
        for (g, t) in self.inputs.iter().zip(inputs) {
            if !t.has_type(&g.ty) {
                let message = format!("expected {}, given {}", g.ty, t.ty());
                return Err(IrError::Input { name: g.name.clone(), message }.into());
            }
            for (d, blk) in shard_tensor(t, &g.sharding, &self.mesh)?.into_iter().enumerate() {
                per_device[d].push(blk);
            }
        }
        Ok(per_device)
    }

    /// Assembles per-device outputs into the global results.
    pub fn unshard_outputs(&self, per_device: Vec<Vec<HostTensor>>) -> Result<Vec<HostTensor>> {
        let mut by_output: Vec<Vec<HostTensor>> = vec![Vec::with_capacity(per_device.len()); self.outputs.len()];
        for outs in per_device {
            for (k, t) in outs.into_iter().enumerate() {
                by_output[k].push(t);
            }
        }
        self.outputs.iter().zip(&by_output).map(|(g, blocks)| unshard_tensor(blocks, &g.sharding, &self.mesh)).collect()
    }

    /// Runs on global inputs with the reference simulator, one simulated
    /// device per mesh position, and returns the global results. Errors
    /// before anything runs: a mesh larger than `available_devices`, a
    /// program the verifier rejects, wrong inputs.
    pub fn run(&self, inputs: &[HostTensor], available_devices: usize) -> Result<Vec<HostTensor>> {
        self.check_runnable(available_devices)?;
        let per_device = self.shard_inputs(inputs)?;
        let outs = simulate(&self.program, per_device)?;
        self.unshard_outputs(outs)
    }
}

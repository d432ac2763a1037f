//! Mesh executors: the partitioned training step runs on one logical
//! device per mesh position, either simulated by the reference
//! device-program simulator (`cpu`: ndarray, deterministic in-process
//! collectives) or on CubeCL devices through the runtime (`wgpu`, `cuda`:
//! kernels, host-staged collectives in the same fixed order). The state is
//! kept as per-device blocks across steps, and checkpointed shard by shard.

use super::exec::Executor;
use super::session::mesh_spec;
use crate::checkpoint::{CheckpointState, ShardedLeaf};
use crate::error::Result;
use std::collections::BTreeMap;
use weft_compiler::partition::{compile, shard_tensor, unshard_tensor, PartitionedFunction};
use weft_compiler::sharding::{Mesh, PropagateOptions};
use weft_compiler::train::{Metrics, TrainStep, Tree};
use weft_ir::device::simulate;
use weft_ir::tensor::HostTensor;

/// Simulated devices available in one process.
pub const MAX_SIMULATED_DEVICES: usize = 1024;

/// What executes the device program.
enum Engine {
    /// The reference simulator.
    Simulator,
    /// CubeCL (or CPU-backend) devices of the runtime.
    Devices(weft_runtime::Devices),
}

/// Runs the partitioned training step on the devices of a mesh.
pub struct MeshExecutor {
    pf: PartitionedFunction,
    mesh: Mesh,
    engine: Engine,
    /// Per device, the blocks of the state leaves (in `TrainStep::state` order).
    state: Vec<Vec<HostTensor>>,
}

/// The simulated-mesh executor (`--backend cpu`).
pub type SimulatedExecutor = MeshExecutor;

impl MeshExecutor {
    /// Propagates shardings over the training step and partitions it for
    /// `mesh`, simulating every device on the CPU.
    pub fn new(step: &TrainStep, mesh: &Mesh) -> Result<MeshExecutor> {
        let pf = compile(&step.module, "train_step", mesh, &PropagateOptions::default())?;
        pf.check_runnable(MAX_SIMULATED_DEVICES)?;
        Ok(MeshExecutor { pf, mesh: mesh.clone(), engine: Engine::Simulator, state: Vec::new() })
    }

    /// The same on the runtime's devices of `kind` (one logical device per
    /// mesh position, mapped onto the physical devices present).
    pub fn on_devices(step: &TrainStep, mesh: &Mesh, kind: weft_runtime::BackendKind) -> Result<MeshExecutor> {
        let pf = compile(&step.module, "train_step", mesh, &PropagateOptions::default())?;
        pf.check_runnable(MAX_SIMULATED_DEVICES)?;
        let devices = weft_runtime::open_devices(kind, mesh.num_devices())?;
        Ok(MeshExecutor { pf, mesh: mesh.clone(), engine: Engine::Devices(devices), state: Vec::new() })
    }

    /// The partitioned program (for reports).
    pub fn partitioned(&self) -> &PartitionedFunction {
        &self.pf
    }
}

impl Executor for MeshExecutor {
    fn load(&mut self, step: &TrainStep, state: &Tree) -> Result<()> {
        step.check_state(state)?;
        let n = self.mesh.num_devices();
        let mut per_device: Vec<Vec<HostTensor>> = vec![Vec::new(); n];
        for (leaf, g) in step.state.iter().zip(&self.pf.inputs) {
            for (d, blk) in shard_tensor(&state[&leaf.name], &g.sharding, &self.mesh)?.into_iter().enumerate() {
                per_device[d].push(blk);
            }
        }
        self.state = per_device;
        Ok(())
    }

    fn step(&mut self, step: &TrainStep, batch: &Tree) -> Result<Metrics> {
        step.check_batch(batch)?;
        let ns = step.state.len();
        let mut inputs = std::mem::take(&mut self.state);
        for ((name, _), g) in step.batch.iter().zip(&self.pf.inputs[ns..]) {
            for (d, blk) in shard_tensor(&batch[name], &g.sharding, &self.mesh)?.into_iter().enumerate() {
                inputs[d].push(blk);
            }
        }
        let outs = match &self.engine {
            Engine::Simulator => simulate(&self.pf.program, inputs)?,
            Engine::Devices(d) => weft_runtime::run_program(&self.pf.program, &d.backends, inputs)?,
        };
        let n = self.mesh.num_devices();
        let mut new_state: Vec<Vec<HostTensor>> = vec![Vec::with_capacity(ns); n];
        let mut metric_blocks: Vec<Vec<HostTensor>> = vec![Vec::with_capacity(n); self.pf.outputs.len() - ns];
        for (d, mut o) in outs.into_iter().enumerate() {
            let rest = o.split_off(ns);
            new_state[d] = o;
            for (k, t) in rest.into_iter().enumerate() {
                metric_blocks[k].push(t);
            }
        }
        // A state leaf whose new value comes out laid out differently from
        // how the step takes it is re-laid out on the host.
        for i in 0..ns {
            let (gin, gout) = (&self.pf.inputs[i], &self.pf.outputs[i]);
            if gin.sharding != gout.sharding {
                let blocks: Vec<HostTensor> = new_state.iter().map(|s| s[i].clone()).collect();
                let global = unshard_tensor(&blocks, &gout.sharding, &self.mesh)?;
                for (d, blk) in shard_tensor(&global, &gin.sharding, &self.mesh)?.into_iter().enumerate() {
                    new_state[d][i] = blk;
                }
            }
        }
        self.state = new_state;
        let mut m = Metrics::new();
        for ((name, blocks), g) in step.metrics.iter().zip(metric_blocks).zip(&self.pf.outputs[ns..]) {
            let t = unshard_tensor(&blocks, &g.sharding, &self.mesh)?;
            m.insert(name.clone(), t.to_f64_vec()[0]);
        }
        Ok(m)
    }

    fn checkpoint_state(&self, step: &TrainStep) -> Result<CheckpointState> {
        let mut cs = CheckpointState::new(mesh_spec(&self.mesh));
        for (i, (leaf, g)) in step.state.iter().zip(&self.pf.inputs).enumerate() {
            if g.sharding.is_replicated() {
                cs.insert_global(leaf.name.clone(), self.state[0][i].clone());
            } else {
                let shards: BTreeMap<usize, HostTensor> =
                    self.state.iter().enumerate().map(|(d, s)| (d, s[i].clone())).collect();
                cs.insert_sharded(
                    leaf.name.clone(),
                    ShardedLeaf { ty: leaf.ty.clone(), sharding: g.sharding.clone(), shards },
                );
            }
        }
        Ok(cs)
    }

    fn state_layout(&self, step: &TrainStep) -> Vec<weft_ir::TensorSharding> {
        self.pf.inputs[..step.state.len()].iter().map(|g| g.sharding.clone()).collect()
    }

    fn global_state(&self, step: &TrainStep) -> Result<Tree> {
        let mut t = Tree::new();
        for (i, (leaf, g)) in step.state.iter().zip(&self.pf.inputs).enumerate() {
            let blocks: Vec<HostTensor> = self.state.iter().map(|s| s[i].clone()).collect();
            t.insert(leaf.name.clone(), unshard_tensor(&blocks, &g.sharding, &self.mesh)?);
        }
        Ok(t)
    }

    fn describe(&self) -> String {
        let r = self.pf.report();
        let colls: Vec<String> = r.collectives.iter().map(|(k, v)| format!("{} {k}", v.count)).collect();
        let placement = match &self.engine {
            Engine::Simulator => format!(
                "backend cpu: {} simulated devices on one CPU (logical device d = mesh position d of {}, row-major)",
                self.mesh.num_devices(),
                self.mesh
            ),
            Engine::Devices(d) => format!("{} (mesh {}, logical device d = mesh position d)", d.map, self.mesh),
        };
        format!(
            "{placement}; per device: {} params, {} optimizer state, {} peak live; per step: {}",
            human(r.param_bytes),
            human(r.optimizer_bytes),
            human(r.peak_live_bytes),
            if colls.is_empty() { "no collectives".to_string() } else { colls.join(", ") }
        )
    }
}

/// Bytes as `1.5 MiB`.
pub fn human(b: usize) -> String {
    let units = ["B", "KiB", "MiB", "GiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", units[u])
    }
}

//! One home for "compile this step for this (sub)mesh and open it on this
//! backend": whole-mesh runs ([`super::MeshExecutor`]), the stage functions
//! of `[pipeline]` runs and the step-time prediction compile here, through
//! the same pass list ([`Pipeline::for_step`]), and the runtime backends
//! open their devices and executable here.

use super::processes::Processes;
use crate::error::Result;
use std::time::{Duration, Instant};
use weft_compiler::autoshard::AutoShardOptions;
use weft_compiler::partition::overlap::OverlapOptions;
use weft_compiler::partition::{compile_stable, PartitionedFunction};
use weft_compiler::pipeline::{PassTimes, Pipeline};
use weft_compiler::sharding::Mesh;
use weft_ir::Module;
use weft_runtime::gpu::device_collectives::{self, CollectivePath};
use weft_runtime::{AnyBackend, BackendKind, DeviceMap, ExecOptions, Executable, ProcessComm};

/// Compiles `entry` of `module` for `mesh` with the training-step pass list
/// (the auto-sharder first under `auto`; `overlap_collectives` under
/// `overlap`). With `pinned_state = Some(n)`
/// its first `n` parameters are state whose results keep their layouts
/// (and an auto-sharding budget holds for the partitioned program:
/// [`compile_stable`]).
pub fn compile(
    module: &Module,
    entry: &str,
    mesh: &Mesh,
    auto: Option<&AutoShardOptions>,
    overlap: Option<OverlapOptions>,
    pinned_state: Option<usize>,
) -> Result<(PartitionedFunction, PassTimes)> {
    let pipeline = Pipeline::for_step(mesh, auto, overlap);
    Ok(match pinned_state {
        Some(n) => compile_stable(&pipeline, module, entry, n)?,
        None => {
            let (program, times) = pipeline.run(module, entry, &mut |_, _| {})?;
            (program.into_partitioned()?, times)
        }
    })
}

/// A partitioned program opened on devices.
pub struct Opened {
    /// The executable over the devices.
    pub exe: Executable<AnyBackend>,
    /// Where its logical devices run.
    pub map: DeviceMap,
    /// Time opening the devices, then building the executable.
    pub phases: Vec<(&'static str, Duration)>,
}

/// Opens `pf` on devices of `kind`: the logical devices `local` of the
/// mesh (all of them in one process; this process's share of a
/// multi-process run, whose processes first check that they compiled the
/// same program), the device collectives of `WEFT_COLLECTIVES`, and the
/// executable with `options`.
pub fn open(
    pf: &PartitionedFunction,
    kind: BackendKind,
    local: &[usize],
    processes: Option<&Processes>,
    options: ExecOptions,
) -> Result<Opened> {
    if let Some(p) = processes {
        let text = weft_ir::device::print_program(&pf.program);
        p.check_same(&[("program", text.as_bytes())])?;
    }
    let share = processes.map_or(weft_runtime::HostShare::ALONE, |p| p.host_share());
    open_shared(pf, kind, local, processes, share, options)
}

/// [`open`] with this process's share of its host's physical devices
/// given apart (`share`): a pipeline stage's function opens its devices in
/// its process's share without being one SPMD program over the job's
/// processes (`processes` is then `None`).
pub fn open_shared(
    pf: &PartitionedFunction,
    kind: BackendKind,
    local: &[usize],
    processes: Option<&Processes>,
    share: weft_runtime::HostShare,
    options: ExecOptions,
) -> Result<Opened> {
    let clock = Instant::now();
    let mut devices = weft_runtime::open_devices_shared(kind, local.len(), share)?;
    // WEFT_COLLECTIVES=nccl: NCCL on CUDA devices (opt-in; not bitwise the
    // host path, see weft_runtime::gpu::device_collectives).
    let path = CollectivePath::from_env()?;
    let (group, timeout) = match processes {
        Some(p) => (Some(p.group().as_ref()), p.timeout()),
        None => (None, weft_runtime::comm::DEFAULT_COLLECTIVE_TIMEOUT),
    };
    device_collectives::attach(path, &pf.program, local, &mut devices, group, timeout)?;
    let mut phases = vec![("open devices", clock.elapsed())];
    let clock = Instant::now();
    let exe = match processes {
        Some(p) => {
            let n = pf.program.num_devices();
            let comm = ProcessComm::new(p.group().clone(), p.owners(n), p.timeout()).with_reduction(p.reduction());
            // A program that starts collectives early has its exchanges
            // made by a thread of their own, beside the compute.
            let comm: Box<dyn weft_runtime::Communicator> =
                if pf.program.starts_collectives() { Box::new(comm.in_background()) } else { Box::new(comm) };
            Executable::with_devices(pf.program.clone(), local.to_vec(), devices.backends, comm, options)?
        }
        None => Executable::new(pf.program.clone(), devices.backends, options)?,
    };
    phases.push(("executable", clock.elapsed()));
    Ok(Opened { exe, map: devices.map, phases })
}

//! One-shot runs: a device program run once on N borrowed devices, all in
//! the calling thread (one worker lane holding every device, see
//! [`crate::executable`]). Tests and tools that run a program once use
//! this; training builds an [`crate::Executable`] instead, which plans once
//! and keeps its state on the devices. Both share the same lane code, so
//! they compute the same thing. Collectives go through the host (see
//! [`crate::collective`]) via the in-process communicator.
//!
//! Buffers are released at the program's `free` steps, so the backend's
//! allocator can reuse the memory; the executor counts live bytes per
//! device and reports the peak in [`DeviceStats`]. For backends that fuse
//! ([`Backend::fusion`]), chains of elementwise steps ([`crate::fusion`])
//! run as one call at the chain's last step; their intermediates are never
//! allocated (so the measured peak can be below the verifier's static one)
//! and frees inside a chain are applied right after it.

use crate::backend::Backend;
use crate::comm::InProcessComm;
use crate::error::RuntimeError;
use crate::executable::check_values;
use crate::executable::lane::{run_lane, DeviceRun, RunCtx, Slots};
use crate::executable::plan::Plan;
use crate::fusion::FusionOptions;
use crate::verify::verify_program;
use weft_ir::device::{BufferId, DeviceProgram};
use weft_ir::tensor::HostTensor;

/// Memory accounting of one device over a run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceStats {
    /// The largest number of bytes held in live buffers at once (dense
    /// sizes of the program's buffer types, inputs included).
    pub peak_live_bytes: usize,
    /// Bytes still live at the end (the outputs, and any buffer the
    /// program never frees).
    pub final_live_bytes: usize,
}

/// Where one device's time went in a run of an [`crate::Executable`]: the
/// wall time of its lane's run, and of it the time in its own ops, fused
/// chains and transfers (compute) and in its collectives (communication,
/// contribution and receipt; all of it exposed: collectives do not
/// overlap compute yet). The rest is idle: the lane running its other
/// devices, or waiting. Host-side times: on a GPU, whose kernels run
/// asynchronously, the waits at transfers and collectives absorb device
/// time.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct DeviceTime {
    /// The lane's run, start to end.
    pub wall: std::time::Duration,
    /// In the device's ops, fused chains and transfers.
    pub compute: std::time::Duration,
    /// In the device's collectives: contributing and waiting (the
    /// exposed communication).
    pub communication: std::time::Duration,
    /// Host-staged collectives started early, in flight while the device
    /// did other work: for each, from its start to its done, less the
    /// device's own time in it. An upper bound (the exchange may end
    /// before the done), summed over collectives, so two in flight at once
    /// count twice; the verdict caps it at the device's time outside its
    /// collectives.
    pub hidden: std::time::Duration,
}

impl DeviceTime {
    /// The wall time in neither compute nor communication.
    pub fn idle(&self) -> std::time::Duration {
        self.wall.saturating_sub(self.compute + self.communication)
    }
}

/// The result of [`run_program_stats`].
#[derive(Debug)]
pub struct RunOutput {
    /// Per device, the output buffers in program order.
    pub outputs: Vec<Vec<HostTensor>>,
    /// Per device, memory accounting.
    pub stats: Vec<DeviceStats>,
    /// Chains of elementwise steps run fused (the same on every device).
    pub fused_chains: usize,
}

/// Runs `program` on `backends` (one per device of the mesh, in flat device
/// order) with `inputs[d]` the input buffers of device `d`, and returns
/// each device's outputs.
pub fn run_program<B: Backend>(
    program: &DeviceProgram,
    backends: &[B],
    inputs: Vec<Vec<HostTensor>>,
) -> Result<Vec<Vec<HostTensor>>, RuntimeError> {
    Ok(run_program_stats(program, backends, inputs)?.outputs)
}

/// [`run_program`], also returning per-device memory statistics.
pub fn run_program_stats<B: Backend>(
    program: &DeviceProgram,
    backends: &[B],
    inputs: Vec<Vec<HostTensor>>,
) -> Result<RunOutput, RuntimeError> {
    let n = program.num_devices();
    if backends.len() != n {
        return Err(RuntimeError::device_count(program, backends.len()));
    }
    verify_program(program)?;
    check_inputs(program, &inputs)?;
    let plan = Plan::new(program, backends.first().map_or(FusionOptions::NONE, |b| b.fusion()));
    let comm = InProcessComm::default();
    let ctx = RunCtx { program, plan: &plan, comm: &comm };
    let mut devices = Vec::with_capacity(n);
    for (d, (backend, ins)) in backends.iter().zip(inputs).enumerate() {
        let (slots, transfers, time) = (Slots::new(program), Default::default(), Default::default());
        let mut dev = DeviceRun {
            device: d,
            backend,
            slots,
            transfers,
            trace: None,
            time,
            native: Vec::new(),
            in_flight: Vec::new(),
        };
        for (&b, t) in program.inputs.iter().zip(ins) {
            let buf = backend.upload_owned(t).map_err(|e| input_err(d, program, b, e))?;
            dev.slots.put(b, buf);
        }
        devices.push(dev);
    }
    run_lane(&ctx, &mut devices)?;
    let mut outputs = Vec::with_capacity(n);
    let mut stats = Vec::with_capacity(n);
    for dev in &mut devices {
        let outs = program
            .outputs
            .iter()
            .map(|&b| dev.backend.download(dev.slots.get(b)))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| e.at_step(dev.device, program.steps.len(), "download"))?;
        outputs.push(outs);
        stats.push(dev.slots.finish());
    }
    Ok(RunOutput { outputs, stats, fused_chains: plan.chains.len() })
}

fn input_err(device: usize, p: &DeviceProgram, b: BufferId, e: RuntimeError) -> RuntimeError {
    let index = p.inputs.iter().position(|&x| x == b).unwrap_or(0);
    RuntimeError::Input { device, index, message: e.to_string() }
}

fn check_inputs(p: &DeviceProgram, inputs: &[Vec<HostTensor>]) -> Result<(), RuntimeError> {
    let all: Vec<usize> = (0..p.inputs.len()).collect();
    check_values(p, &(0..p.num_devices()).collect::<Vec<_>>(), &all, inputs, "input")
}

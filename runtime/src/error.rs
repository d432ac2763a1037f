//! The runtime's one error type.
//!
//! Every failure the runtime reports is a [`RuntimeError`] saying where it
//! happened (which device, which step of the program, which op) so that a
//! mistake in a device program or in the inputs can be found without a
//! debugger. Broken internal invariants (a buffer slot the verifier proved
//! defined turns out empty) panic instead, naming the buffer.

use weft_ir::IrError;

/// Everything that can go wrong when choosing backends, verifying a device
/// program or running it.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// A backend name other than `cpu`, `wgpu` or `cuda`.
    #[error("unknown backend `{0}` (expected cpu, cpu-ref, wgpu or cuda; `weft train` also takes sim and interp)")]
    UnknownBackend(String),
    /// The backend exists but cannot be used here (no adapter, no driver,
    /// not compiled in).
    #[error("backend {backend} is not available: {reason}")]
    BackendUnavailable {
        /// The backend's name.
        backend: String,
        /// Why it cannot be used.
        reason: String,
    },
    /// The program's mesh needs a different number of devices than given.
    #[error("program `{program}` runs on a mesh of {needed} devices ({mesh}), but {given} were given")]
    DeviceCount {
        /// The program's name.
        program: String,
        /// The mesh, e.g. `data=4 x model=2`.
        mesh: String,
        /// Devices the mesh has.
        needed: usize,
        /// Devices (backends) passed to the executor.
        given: usize,
    },
    /// The device program is malformed (found before anything runs).
    #[error("invalid device program `{program}`{}: {message}", step.map(|s| format!(" at step {s}")).unwrap_or_default())]
    InvalidProgram {
        /// The program's name.
        program: String,
        /// The offending step, if the problem is in one.
        step: Option<usize>,
        /// What is wrong.
        message: String,
    },
    /// The inputs do not match the program's input buffers.
    #[error("input {index} of device {device}: {message}")]
    Input {
        /// The device.
        device: usize,
        /// Position among the program's inputs.
        index: usize,
        /// What is wrong.
        message: String,
    },
    /// A backend does not implement an op for these types.
    #[error("backend {backend} does not support {what}")]
    Unsupported {
        /// The backend's name.
        backend: String,
        /// The op and types.
        what: String,
    },
    /// A compute step failed on a device.
    #[error("device {device}, step {step} (`{op}`): {message}")]
    Step {
        /// The device.
        device: usize,
        /// The step index in the program.
        step: usize,
        /// The op or collective mnemonic.
        op: String,
        /// What went wrong.
        message: String,
    },
    /// An op failed outside a program (a direct backend call).
    #[error("`{op}`: {message}")]
    Op {
        /// The op mnemonic.
        op: String,
        /// What went wrong.
        message: String,
    },
    /// The device itself failed (allocation, kernel launch, read-back).
    #[error("device error on {backend}: {message}")]
    Device {
        /// The backend's name.
        backend: String,
        /// The error reported by the device layer.
        message: String,
    },
    /// A device stopped in a collective because another device failed.
    #[error("device {device} stopped at step {step} (`{collective}`): device {failed_device} failed: {reason}")]
    Aborted {
        /// The device that was waiting.
        device: usize,
        /// The step it was at.
        step: usize,
        /// The collective it was waiting in.
        collective: String,
        /// The device whose failure stopped the run.
        failed_device: usize,
        /// That device's error.
        reason: String,
    },
    /// A member of a collective waited longer than the communicator's
    /// timeout for the rest of its group.
    #[error("device {device} waited {waited:?} at step {step} (`{collective}`) for devices {missing:?}, which never arrived")]
    CollectiveTimeout {
        /// The device that waited.
        device: usize,
        /// The step.
        step: usize,
        /// The collective.
        collective: String,
        /// How long it waited.
        waited: std::time::Duration,
        /// The devices of its group that never contributed.
        missing: Vec<usize>,
    },
    /// The executable's resident state is not there: never loaded, or
    /// donated to a step that failed (its buffers are gone).
    #[error("executable `{program}` has no resident state: {why}; load the state again")]
    NoState {
        /// The program's name.
        program: String,
        /// Why.
        why: String,
    },
    /// A process waited longer than the timeout for messages from other
    /// processes (they died, hang, or run another program).
    #[error(
        "process {rank} waited {waited:?} in {what} for process(es) {missing:?}, which never sent (dead, hung, or running \
         something else); stopping"
    )]
    ProcessTimeout {
        /// The process that waited.
        rank: usize,
        /// What it was waiting in (the step and collective, or a barrier).
        what: String,
        /// How long it waited.
        waited: std::time::Duration,
        /// The processes that never sent.
        missing: Vec<usize>,
    },
    /// Another process stopped the job while this one waited.
    #[error("process {rank}: the job was stopped by process {by} while this one waited in {what}")]
    ProcessAborted {
        /// The process that waited.
        rank: usize,
        /// The process that stopped the job.
        by: usize,
        /// What it was waiting in.
        what: String,
    },
    /// The transport between processes failed.
    #[error("process {rank}: {message}")]
    Process {
        /// The process reporting it.
        rank: usize,
        /// What failed.
        message: String,
    },
    /// More processes than devices: every process must own at least one.
    #[error(
        "the mesh has {devices} devices but the job has {processes} processes; every process owns at least one \
         device (use a mesh of at least {processes} devices, or fewer processes)"
    )]
    ProcessCount {
        /// Devices of the mesh.
        devices: usize,
        /// Processes of the job.
        processes: usize,
    },
    /// A setting (an environment variable) has a value weft does not know.
    #[error("{name}={value:?} is not a valid setting: expected {expected}")]
    BadSetting {
        /// The setting.
        name: String,
        /// Its value.
        value: String,
        /// What it may be.
        expected: String,
    },
    /// NCCL was asked for (`WEFT_COLLECTIVES=nccl`) but cannot be used
    /// here: the library is not installed, the build has no `cuda`
    /// feature, or the devices are not CUDA GPUs of their own.
    #[error("NCCL is not available: {reason}")]
    NcclUnavailable {
        /// Why, and what to do about it.
        reason: String,
    },
    /// An NCCL call failed (set `NCCL_DEBUG=WARN` for NCCL's own account).
    #[error("NCCL `{call}` failed on device {device}: {message}")]
    Nccl {
        /// The logical device.
        device: usize,
        /// The NCCL call.
        call: String,
        /// NCCL's error.
        message: String,
    },
    /// An error from the IR layer (host tensor conversion, interpreter).
    #[error(transparent)]
    Ir(#[from] IrError),
}

impl RuntimeError {
    /// [`RuntimeError::DeviceCount`] for `program` given `given` devices.
    pub fn device_count(program: &weft_ir::device::DeviceProgram, given: usize) -> RuntimeError {
        let mesh: Vec<String> = program.mesh.axes.iter().map(|(a, s)| format!("{a}={s}")).collect();
        RuntimeError::DeviceCount {
            program: program.name.clone(),
            mesh: mesh.join(" x "),
            needed: program.num_devices(),
            given,
        }
    }

    /// Attributes an error raised by a backend call to `device` and `step`
    /// of a program running `op` (errors that already name a step, or that
    /// are about the device or backend itself, are kept as they are).
    pub fn at_step(self, device: usize, step: usize, op: &str) -> RuntimeError {
        match self {
            RuntimeError::Op { op, message } => RuntimeError::Step { device, step, op, message },
            RuntimeError::Ir(e) => RuntimeError::Step { device, step, op: op.to_string(), message: e.to_string() },
            other => other,
        }
    }
}

//! # weft-runtime
//!
//! Runs the per-device programs the SPMD partitioner produces
//! ([`weft_ir::device::DeviceProgram`]) on N logical devices.
//!
//! - [`Backend`]: one logical device (allocate, upload, download, run one
//!   IR op, free). [`CpuBackend`] evaluates ops with the reference
//!   interpreter; [`CubeclBackend`] runs CubeCL kernels on wgpu (Vulkan,
//!   including Mesa's lavapipe on machines without a GPU) or, with the
//!   `cuda` feature, CUDA.
//! - [`devices`]: choosing a backend by name ([`BackendKind`],
//!   [`select_backend`]) and mapping N logical devices onto the physical
//!   adapters present ([`open_devices`], [`DeviceMap`]).
//! - [`executable`]: [`Executable`] plans a device program once and runs
//!   it many times, one worker thread per device, with donated state kept
//!   resident on the devices; [`comm`]: the [`Communicator`] the workers
//!   meet at for collectives ([`InProcessComm`] in one process);
//! - [`process`]: one mesh over several processes ([`ProcessGroup`]: MPI
//!   with the `mpi` feature, threads in tests; [`ProcessComm`]);
//! - [`exec`]: [`run_program`] runs a device program once on borrowed
//!   devices in the calling thread;
//!   [`fusion`] lets GPU backends run chains of elementwise steps as one
//!   kernel; [`trace`]: the spans of a traced run (`weft train --trace`).
#![warn(missing_docs)]

pub mod any;
pub mod backend;
pub mod collective;
pub mod comm;
pub mod cpu;
pub mod devices;
pub mod error;
pub mod exec;
pub mod executable;
pub mod fast;
pub mod fusion;
pub mod gpu;
pub mod process;
mod strided;
pub mod trace;
pub mod verify;

pub use crate::gpu::{CubeBuffer, CubeclBackend};
pub use any::{AnyBackend, AnyBuffer};
pub use backend::{compute_fused_then_free, compute_then_free, compute_unfused, Backend};
pub use comm::{Communicator, InProcessComm};
pub use cpu::CpuBackend;
pub use devices::{
    available_backends, open_devices, open_devices_shared, select_backend, BackendKind, DeviceMap, Devices, HostShare,
};
pub use error::RuntimeError;
pub use exec::{run_program, run_program_stats, DeviceStats, DeviceTime, RunOutput};
pub use executable::{shard_slice_op, ExecOptions, ExecStats, Executable, TransferStats};
pub use fast::FastCpuBackend;
pub use process::{ProcessComm, ProcessGroup, ThreadGroup};
pub use trace::{Span, SpanKind, Trace, TraceMode};
pub use verify::{verify_program, ProgramInfo};

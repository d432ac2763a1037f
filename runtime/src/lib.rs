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
//! - [`exec`]: [`run_program`] verifies a device program and runs it on
//!   all devices, with host-staged collectives in a fixed order;
//!   [`fusion`] lets GPU backends run chains of elementwise steps as one
//!   kernel.
#![warn(missing_docs)]

pub mod backend;
pub mod collective;
pub mod cpu;
pub mod devices;
pub mod error;
pub mod exec;
pub mod fusion;
pub mod gpu;
pub mod verify;

pub use crate::gpu::{CubeBuffer, CubeclBackend};
pub use backend::{AnyBackend, AnyBuffer, Backend};
pub use cpu::CpuBackend;
pub use devices::{available_backends, open_devices, select_backend, BackendKind, DeviceMap, Devices};
pub use error::RuntimeError;
pub use exec::{run_program, run_program_stats, DeviceStats, RunOutput};
pub use verify::{verify_program, ProgramInfo};

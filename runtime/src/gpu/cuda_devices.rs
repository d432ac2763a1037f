//! CUDA devices (with the `cuda` feature).
//!
//! CubeCL's CUDA runtime loads the driver and NVRTC when first used, so a
//! build with the feature runs anywhere; without a driver, probing finds
//! no device instead of failing. Logical devices on one GPU share its
//! CubeCL client (and memory pool); the executor still accounts their
//! memory separately.

use super::CubeclBackend;
use cubecl::cuda::{CudaDevice, CudaRuntime};
use cubecl::prelude::*;

/// The number of CUDA devices (0 when the driver cannot be loaded).
pub fn device_count() -> usize {
    std::panic::catch_unwind(|| <CudaRuntime as Runtime>::enumerate_all_devices(&()).len()).unwrap_or(0)
}

/// Opens `count` logical devices on GPU `index`.
///
/// Several logical devices on one GPU submit to one CUDA stream. CubeCL
/// otherwise gives each thread (each executor lane) a stream of its own
/// and orders work across streams by where a buffer was allocated; that
/// does not cover a buffer computed on one stream, read on a second and
/// freed by a third, which the collectives among these devices
/// (`shared_collectives.rs`) do all the time: its memory could be reused
/// before the second stream's read ran (seen on an H200 as wrong
/// tensor-parallel losses after a few steps). On one stream, work runs in
/// the order the lanes submit it, and a buffer is freed only after every
/// kernel that reads it was submitted, so that cannot happen.
pub fn open(index: usize, count: usize, first: usize) -> Vec<CubeclBackend<CudaRuntime>> {
    let mut client = CudaRuntime::client(&CudaDevice::new(index));
    if count > 1 {
        // SAFETY: every client of these logical devices names the same
        // stream, so their work is ordered as submitted (see above).
        unsafe { client.set_stream(cubecl::stream_id::StreamId::current()) };
    }
    (first..first + count)
        .map(|i| CubeclBackend::new(client.clone(), format!("cuda device {i} on GPU {index}")))
        .collect()
}

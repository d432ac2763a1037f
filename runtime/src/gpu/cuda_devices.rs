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
pub fn open(index: usize, count: usize, first: usize) -> Vec<CubeclBackend<CudaRuntime>> {
    let client = CudaRuntime::client(&CudaDevice::new(index));
    (first..first + count)
        .map(|i| CubeclBackend::new(client.clone(), format!("cuda device {i} on GPU {index}")))
        .collect()
}

//! CUDA devices (with the `cuda` feature).
//!
//! CubeCL's CUDA runtime loads the driver and NVRTC when first used, so a
//! build with the feature runs anywhere; without a driver, probing finds
//! no device instead of failing. Logical devices on one GPU share its
//! CubeCL client (and memory pool); the executor still accounts their
//! memory separately.
//!
//! Float products run on cuBLAS where it loads (`cublas.rs`; one handle
//! per GPU, shared by its logical devices). `WEFT_GEMM=cubek` keeps them
//! on cubek's routines instead, `WEFT_CUBLAS_HALF=packed` packs
//! half-type operands before cuBLAS reads them, and
//! `WEFT_CUBLAS_ORDER=host` orders cuBLAS's stream and CubeCL's by host
//! waits instead of flags on the device (to compare).

use super::cublas::Cublas;
use super::library_gemm::LibraryGemm;
use super::CubeclBackend;
use cubecl::cuda::{CudaDevice, CudaRuntime};
use cubecl::prelude::*;
use cudarc::driver::CudaContext;
use std::panic::catch_unwind;
use std::sync::Arc;

/// The message of a panic caught from cudarc (which panics when a library
/// or a symbol is missing).
pub(super) fn panic_message(p: Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "unknown panic".into())
}

/// GPU `gpu`'s primary context (CubeCL's too), without cudarc's panic when
/// there is no driver; why not, as a sentence.
pub(super) fn primary_context(gpu: usize) -> Result<Arc<CudaContext>, String> {
    match catch_unwind(|| CudaContext::new(gpu)) {
        Ok(Ok(ctx)) => Ok(ctx),
        Ok(Err(e)) => Err(format!("CUDA GPU {gpu} cannot be opened: {e}")),
        Err(p) => Err(format!("the CUDA driver cannot be loaded: {}", panic_message(p))),
    }
}

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
    let gemm = library_gemm(index);
    (first..first + count)
        .map(|i| {
            let mut be = CubeclBackend::new(client.clone(), format!("cuda device {i} on GPU {index}"));
            be.set_library_gemm(gemm.clone());
            be
        })
        .collect()
}

/// cuBLAS on GPU `index`, unless `WEFT_GEMM=cubek` or it cannot be opened
/// (said once on standard error; the products then run on cubek).
fn library_gemm(index: usize) -> Option<Arc<dyn LibraryGemm<CudaRuntime>>> {
    if std::env::var("WEFT_GEMM").is_ok_and(|v| v == "cubek") {
        return None;
    }
    let pack = std::env::var("WEFT_CUBLAS_HALF").is_ok_and(|v| v == "packed");
    let host_waits = std::env::var("WEFT_CUBLAS_ORDER").is_ok_and(|v| v == "host");
    match Cublas::open(index, pack, host_waits) {
        Ok(c) => Some(Arc::new(c)),
        Err(e) => {
            eprintln!("weft: products on GPU {index} run on cubek's routines: {e}");
            None
        }
    }
}

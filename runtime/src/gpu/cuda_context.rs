//! Opening CUDA through cudarc (with the `cuda` feature), for everything
//! that talks to the driver beside CubeCL: the device probe
//! (`cuda_devices.rs`), cuBLAS (`cublas.rs`) and NCCL (`nccl.rs`). cudarc
//! panics when a library or a symbol is missing; these turn that into a
//! sentence, so a build with the feature runs (and says why not) anywhere.

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

//! CUDA devices (with the `cuda` feature).
//!
//! CubeCL's CUDA runtime loads the driver and NVRTC when first used, so a
//! build with the feature runs anywhere; without a driver, probing finds
//! no device instead of failing. Logical devices on one GPU share its
//! CubeCL client (and memory pool); the executor still accounts their
//! memory separately.
//!
//! Large float products run on cuBLAS where it loads (`cublas.rs`; one
//! handle per GPU, shared by its logical devices). `WEFT_GEMM=cubek` keeps
//! them on cubek's routines instead, `WEFT_CUBLAS_HALF=packed` packs
//! half-type operands before cuBLAS reads them, and
//! `WEFT_CUBLAS_ORDER=host` orders cuBLAS's stream and CubeCL's by host
//! waits instead of flags on the device (to compare); any other value is
//! an error ([`GemmChoice`]).

use super::cublas::Cublas;
use super::library_gemm::LibraryGemm;
use super::CubeclBackend;
use crate::error::RuntimeError;
use cubecl::cuda::{CudaDevice, CudaRuntime};
use cubecl::prelude::*;
use std::sync::Arc;

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
///
/// An error when `WEFT_GEMM`, `WEFT_CUBLAS_HALF` or `WEFT_CUBLAS_ORDER`
/// holds a value other than those [`GemmChoice`] names.
pub fn open(index: usize, count: usize, first: usize) -> Result<Vec<CubeclBackend<CudaRuntime>>, RuntimeError> {
    let choice = GemmChoice::from_vars(|name| std::env::var(name).ok())
        .map_err(|reason| RuntimeError::BackendUnavailable { backend: "cuda".into(), reason })?;
    let mut client = CudaRuntime::client(&CudaDevice::new(index));
    if count > 1 {
        // SAFETY: every client of these logical devices names the same
        // stream, so their work is ordered as submitted (see above).
        unsafe { client.set_stream(cubecl::stream_id::StreamId::current()) };
    }
    let gemm = library_gemm(index, choice);
    Ok((first..first + count)
        .map(|i| {
            let mut be = CubeclBackend::new(client.clone(), format!("cuda device {i} on GPU {index}"));
            be.set_library_gemm(gemm.clone());
            be
        })
        .collect())
}

/// How CUDA devices run their products, from the environment:
/// `WEFT_GEMM` = `cublas` (the default) or `cubek`, `WEFT_CUBLAS_HALF` =
/// `unpacked` (the default) or `packed`, `WEFT_CUBLAS_ORDER` = `device`
/// (the default) or `host`. An empty value is the default.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
struct GemmChoice {
    cublas: bool,
    pack_half: bool,
    host_waits: bool,
}

impl GemmChoice {
    /// The choice `var` (a variable's value by name) gives, or which
    /// variable holds what, and what it may hold.
    fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<GemmChoice, String> {
        let is = |name: &str, [default, other]: [&str; 2]| match var(name).as_deref() {
            None | Some("") => Ok(false),
            Some(v) if v == default => Ok(false),
            Some(v) if v == other => Ok(true),
            Some(v) => Err(format!("{name}={v:?}: expected `{default}` (the default) or `{other}`")),
        };
        Ok(GemmChoice {
            cublas: !is("WEFT_GEMM", ["cublas", "cubek"])?,
            pack_half: is("WEFT_CUBLAS_HALF", ["unpacked", "packed"])?,
            host_waits: is("WEFT_CUBLAS_ORDER", ["device", "host"])?,
        })
    }
}

/// cuBLAS on GPU `index`, unless `choice` says cubek or it cannot be
/// opened (said once on standard error; the products then run on cubek).
fn library_gemm(index: usize, choice: GemmChoice) -> Option<Arc<dyn LibraryGemm<CudaRuntime>>> {
    if !choice.cublas {
        return None;
    }
    match Cublas::open(index, choice.pack_half, choice.host_waits) {
        Ok(c) => Some(Arc::new(c)),
        Err(e) => {
            eprintln!("weft: products on GPU {index} run on cubek's routines: {e}");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::GemmChoice;

    fn choice(vars: &[(&str, &str)]) -> Result<GemmChoice, String> {
        GemmChoice::from_vars(|name| vars.iter().find(|(n, _)| *n == name).map(|(_, v)| v.to_string()))
    }

    #[test]
    fn gemm_variables_take_their_names_and_refuse_others() {
        let default = GemmChoice { cublas: true, pack_half: false, host_waits: false };
        assert_eq!(choice(&[]), Ok(default));
        assert_eq!(choice(&[("WEFT_GEMM", ""), ("WEFT_CUBLAS_ORDER", "device")]), Ok(default));
        assert_eq!(choice(&[("WEFT_GEMM", "cubek")]), Ok(GemmChoice { cublas: false, ..default }));
        let both = choice(&[("WEFT_CUBLAS_HALF", "packed"), ("WEFT_CUBLAS_ORDER", "host")]);
        assert_eq!(both, Ok(GemmChoice { pack_half: true, host_waits: true, ..default }));
        let bad = choice(&[("WEFT_GEMM", "cuBLAS")]).unwrap_err();
        assert!(bad.contains("WEFT_GEMM=\"cuBLAS\"") && bad.contains("`cubek`"), "{bad}");
        assert!(choice(&[("WEFT_CUBLAS_ORDER", "hots")]).unwrap_err().contains("WEFT_CUBLAS_ORDER"));
        assert!(choice(&[("WEFT_CUBLAS_HALF", "yes")]).unwrap_err().contains("WEFT_CUBLAS_HALF"));
    }
}

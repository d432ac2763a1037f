//! The CubeCL backend: IR ops as GPU kernels on any CubeCL runtime (wgpu
//! with Vulkan/Metal/DX12, CUDA behind the `cuda` feature).
//!
//! A [`CubeclBackend`] is one logical device: a CubeCL compute client
//! (several logical devices may share one physical adapter; each gets its
//! own client and memory pool). Buffers are immutable once computed, so
//! ops that only reinterpret (reshape, same-bits conversions, the identity
//! ops) return a view sharing the handle instead of copying.
//!
//! Layout: `storage.rs` (dtype to storage type), `round.rs` and `math.rs`
//! (scalar helpers), `elementwise.rs`, `kernels_copy.rs`,
//! `kernels_convert.rs`, `kernels_reduce.rs`, `kernels_matmul.rs`,
//! `kernels_fused.rs`, `kernels_index.rs` (the kernels), `constants.rs`
//! (constants computed once per device), and `ops.rs`, `layout.rs`,
//! `reduce.rs`, `dot.rs`, `fused.rs`, `index.rs` (the host side that maps
//! each [`Op`], or fused chain, onto them). `device_collectives.rs` is the path that
//! runs collectives on device memory: `shared_collectives.rs` among the
//! logical devices of one GPU (bitwise the host path, the default on
//! CUDA), `nccl.rs` (with the `cuda` feature, opt-in) across GPUs.

mod constants;
#[cfg(feature = "cuda")]
pub mod cublas;
#[cfg(feature = "cuda")]
mod cuda_context;
#[cfg(feature = "cuda")]
pub mod cuda_devices;
pub mod device_collectives;
mod dot;
mod elementwise;
mod fused;
mod index;
mod kernels_convert;
mod kernels_copy;
mod kernels_fused;
mod kernels_index;
mod kernels_matmul;
mod kernels_reduce;
mod layout;
pub mod library_gemm;
mod math;
#[cfg(feature = "cuda")]
pub mod nccl;
mod ops;
mod reduce;
mod round;
pub mod shared_collectives;
mod storage;
pub mod wgpu_devices;

use crate::backend::Backend;
use crate::comm::CollectiveCall;
use crate::error::RuntimeError;
use crate::fusion::{FusedChain, FusionOptions};
use cubecl::client::ComputeClient;
use cubecl::ir::{ElemType, FloatKind};
use cubecl::prelude::*;
use cubecl::server::Handle;
use device_collectives::NativeCollectives;
use library_gemm::LibraryGemm;
pub use ops::is_transcendental;
use std::sync::Arc;
pub use storage::Storage;
use weft_ir::tensor::HostTensor;
use weft_ir::{DType, Op, TensorType};

/// Threads per cube for one-thread-per-element kernels.
const BLOCK: u32 = 256;

/// The most distinct metadata arrays a device keeps uploaded.
const META_KEPT: usize = 16_384;

/// One logical device on a CubeCL runtime.
pub struct CubeclBackend<R: Runtime> {
    client: ComputeClient<R>,
    label: String,
    f64_ok: bool,
    f64_math: bool,
    fusion: bool,
    /// The device-native collectives, when the run asked for them.
    native: Option<Arc<dyn NativeCollectives<R>>>,
    /// The vendor GEMM library products run on, where one is attached
    /// ([`library_gemm`]).
    gemm: Option<Arc<dyn LibraryGemm<R>>>,
    /// What the device keeps between launches (boxed: the backend is one
    /// variant of `AnyBackend`, and these are large).
    kept: Box<Kept<R>>,
}

/// What a logical device keeps between launches.
struct Kept<R: Runtime> {
    /// Constants already computed ([`constants`]).
    constants: constants::ConstantCache<R>,
    /// The matmul routine each product (dtype, `[b, m, n, k]`, operand
    /// strides) runs ([`dot::Routine`]), chosen at its first run, and
    /// whether its operands are copied dense first.
    routines: std::sync::Mutex<std::collections::HashMap<dot::RoutineKey, (dot::Routine, bool)>>,
    /// Kernel metadata arrays already on the device ([`CubeclBackend::meta`]).
    meta: std::sync::Mutex<std::collections::HashMap<Vec<u32>, Handle>>,
}

/// A buffer on a CubeCL device: a memory handle and the IR type of what it
/// holds (stored as described in `storage.rs`).
pub struct CubeBuffer<R: Runtime> {
    handle: Handle,
    ty: TensorType,
    _runtime: std::marker::PhantomData<R>,
}

impl<R: Runtime> Clone for CubeBuffer<R> {
    fn clone(&self) -> Self {
        CubeBuffer { handle: self.handle.clone(), ty: self.ty.clone(), _runtime: std::marker::PhantomData }
    }
}

impl<R: Runtime> CubeBuffer<R> {
    /// The IR type of the buffer.
    pub fn ty(&self) -> &TensorType {
        &self.ty
    }

    fn len(&self) -> usize {
        self.ty.num_elements()
    }

    fn storage(&self) -> Storage {
        Storage::of(self.ty.dtype)
    }

    /// The same memory seen as another type of the same storage and size.
    fn view(&self, ty: TensorType) -> CubeBuffer<R> {
        debug_assert_eq!(Storage::of(ty.dtype).size(), self.storage().size());
        debug_assert_eq!(ty.num_elements(), self.len());
        CubeBuffer { handle: self.handle.clone(), ty, _runtime: std::marker::PhantomData }
    }

    /// A kernel argument over the buffer's elements.
    fn arg(&self) -> ArrayArg<R> {
        // SAFETY: the handle was allocated for `len()` elements of the
        // storage type the kernels read it as (at least one element).
        unsafe { ArrayArg::from_raw_parts(self.handle.clone(), self.len().max(1)) }
    }
}

impl<R: Runtime> CubeclBackend<R> {
    /// A backend on a compute client, described by `label`.
    pub fn new(client: ComputeClient<R>, label: impl Into<String>) -> CubeclBackend<R> {
        let f64_ok = client.properties().supports_type(ElemType::Float(FloatKind::F64));
        // Vulkan's extended instructions (exp, log, sin, pow, ...) exist
        // for 16- and 32-bit floats only; wgpu passes f64 ones through and
        // gets garbage back.
        let f64_math = f64_ok && !R::name(&client).starts_with("wgpu");
        CubeclBackend {
            client,
            label: label.into(),
            f64_ok,
            f64_math,
            fusion: true,
            native: None,
            gemm: None,
            kept: Box::new(Kept {
                constants: Default::default(),
                routines: Default::default(),
                meta: Default::default(),
            }),
        }
    }

    /// Runs the collectives `native` takes on device memory from now on
    /// ([`device_collectives`]).
    pub fn set_native_collectives(&mut self, native: Arc<dyn NativeCollectives<R>>) {
        self.native = Some(native);
    }

    /// Runs float products on `gemm` from now on (`None`: on cubek's
    /// routines); the routines chosen so far are forgotten.
    pub fn set_library_gemm(&mut self, gemm: Option<Arc<dyn LibraryGemm<R>>>) {
        self.gemm = gemm;
        self.lock_routines().clear();
    }

    /// The name of the vendor GEMM library products run on, if any.
    pub fn library_gemm(&self) -> Option<&'static str> {
        self.gemm.as_ref().map(|g| g.name())
    }

    /// Turns fusion of elementwise chains on (the default) or off.
    pub fn with_fusion(mut self, on: bool) -> CubeclBackend<R> {
        self.fusion = on;
        self
    }

    /// How many constants this device keeps computed, and their bytes
    /// (large ones at most 128 MiB; see `constants.rs`).
    pub fn cached_constants(&self) -> (usize, usize) {
        self.kept.constants.stats()
    }

    /// The matmul routine each product run so far took: dtype, `[b, m, n,
    /// k]` and the routine's name, with "(operands copied dense)" where
    /// they could not be read in place (for benchmarks and reports).
    pub fn matmul_routines(&self) -> Vec<(DType, [usize; 4], String)> {
        let name = |(r, dense): &(dot::Routine, bool)| {
            format!("{r:?}{}", if *dense { " (operands copied dense)" } else { "" })
        };
        let mut v: Vec<_> = self.lock_routines().iter().map(|(k, r)| (k.0, k.1, name(r))).collect();
        v.sort_by_key(|a| (a.0.to_string(), a.1));
        v
    }

    fn lock_routines(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<dot::RoutineKey, (dot::Routine, bool)>> {
        self.kept.routines.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The compute client.
    pub fn client(&self) -> &ComputeClient<R> {
        &self.client
    }

    fn unsupported(&self, what: String) -> RuntimeError {
        RuntimeError::Unsupported { backend: self.label.clone(), what }
    }

    fn check_dtype(&self, d: DType, op: &str) -> Result<(), RuntimeError> {
        if d == DType::F64 && !self.f64_ok {
            return Err(self.unsupported(format!("`{op}` on f64 (the device has no 64-bit floats)")));
        }
        Ok(())
    }

    /// An uninitialised buffer of type `ty`.
    fn empty(&self, ty: &TensorType) -> CubeBuffer<R> {
        let bytes = ty.num_elements().max(1) * Storage::of(ty.dtype).size();
        CubeBuffer { handle: self.client.empty(bytes), ty: ty.clone(), _runtime: std::marker::PhantomData }
    }

    /// Launch geometry covering `n` threads: cubes of [`BLOCK`] threads,
    /// spread over a 2-D (or 3-D) grid when there are more than 65535.
    fn grid(&self, n: usize) -> (CubeCount, CubeDim) {
        let dim = CubeDim::new_1d(BLOCK);
        (cubecl::calculate_cube_count_elemwise(&self.client, n.max(1), dim), dim)
    }

    /// A small `u32` array on the device (kernel metadata: shapes and
    /// strides). A program's layouts repeat every step, and kernels only
    /// read these arrays, so each distinct one is uploaded once per device
    /// (up to [`META_KEPT`] of them) instead of once per launch.
    fn meta(&self, values: &[u32]) -> (Handle, usize) {
        let mut kept = self.kept.meta.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(h) = kept.get(values) {
            return (h.clone(), values.len());
        }
        let h = self.client.create_from_slice(u32::as_bytes(values));
        if kept.len() < META_KEPT {
            kept.insert(values.to_vec(), h.clone());
        }
        (h, values.len())
    }
}

impl<R: Runtime> Backend for CubeclBackend<R> {
    type Buffer = CubeBuffer<R>;

    fn name(&self) -> String {
        self.label.clone()
    }

    fn alloc(&self, ty: &TensorType) -> Result<CubeBuffer<R>, RuntimeError> {
        self.upload(&HostTensor::zeros(ty))
    }

    fn upload(&self, t: &HostTensor) -> Result<CubeBuffer<R>, RuntimeError> {
        self.check_dtype(t.dtype(), "upload")?;
        let mut bytes = storage::to_device_bytes(t);
        if bytes.is_empty() {
            bytes = vec![0; Storage::of(t.dtype()).size()];
        }
        let handle = self.client.create_from_slice(&bytes);
        Ok(CubeBuffer { handle, ty: t.ty(), _runtime: std::marker::PhantomData })
    }

    fn download(&self, b: &CubeBuffer<R>) -> Result<HostTensor, RuntimeError> {
        if b.len() == 0 {
            return Ok(HostTensor::zeros(&b.ty));
        }
        let bytes = self
            .client
            .read_one(b.handle.clone())
            .map_err(|e| RuntimeError::Device { backend: self.label.clone(), message: format!("{e:?}") })?;
        storage::from_device_bytes(&b.ty, &bytes)
    }

    fn buffer_type(&self, b: &CubeBuffer<R>) -> TensorType {
        b.ty.clone()
    }

    fn compute(&self, op: &Op, inputs: &[&CubeBuffer<R>]) -> Result<Vec<CubeBuffer<R>>, RuntimeError> {
        ops::compute(self, op, inputs).map(|b| vec![b])
    }

    fn fusion(&self) -> FusionOptions {
        if self.fusion {
            // Splats and broadcasts join chains: a spread value is read
            // where it is used, not a tensor written and read back, and a
            // launch fewer.
            // Kept values: a chain goes on past the values later steps
            // read again (a launch costs microseconds of host time); a
            // reduction of a chain's value reads it where it is computed; a
            // chain reaches across a few steps that read none of its values.
            FusionOptions {
                splats: true,
                broadcasts: true,
                kept: true,
                kept_outputs: true,
                reductions: true,
                across: true,
                float_kernels: true,
                max_bindings: self.client.properties().hardware.max_bindings as usize,
                ..FusionOptions::ELEMENTWISE
            }
        } else {
            FusionOptions::NONE
        }
    }

    fn compute_fused(&self, chain: &FusedChain, inputs: &[&CubeBuffer<R>]) -> Result<Vec<CubeBuffer<R>>, RuntimeError> {
        fused::compute_fused(self, chain, inputs)
    }

    fn device_collectives(&self) -> bool {
        self.native.is_some()
    }

    fn collective_on_device(
        &self,
        call: CollectiveCall<'_>,
        input: &CubeBuffer<R>,
    ) -> Option<Result<CubeBuffer<R>, RuntimeError>> {
        self.native.as_ref()?.run(self, call, input)
    }

    fn sync(&self) -> Result<(), RuntimeError> {
        cubecl::future::block_on(self.client.sync())
            .map_err(|e| RuntimeError::Device { backend: self.label.clone(), message: format!("{e:?}") })
    }
}

//! cuBLAS for CUDA devices' products (the `cuda` feature; see
//! `library_gemm.rs` for why).
//!
//! cuBLAS comes through `cudarc` (already the path to NCCL), which loads
//! `libcublas` at run time: a build runs where the library is missing, and
//! [`Cublas::open`] then says so and the device keeps cubek's routines
//! (`WEFT_GEMM=cubek` asks for that on purpose).
//!
//! **Arithmetic.** `f32` products compute in `f32` (`CUBLAS_COMPUTE_32F`,
//! default math mode: no TF32, as JAX's `highest` precision); half-type
//! values, which weft stores as `f32`, go to the tensor cores through
//! `CUBLAS_COMPUTE_32F_FAST_16BF`/`16F` (the down-conversion is exact: the
//! stored values are the half type's) with `f32` accumulation, or packed
//! into the half type first ([`Cublas::packs_half`]). cuBLAS picks its
//! algorithm by shape and device, not by timing, and with atomics not
//! allowed (its default) a product gives the same bits on every run on the
//! same GPU model.
//!
//! **Ordering, without host waits.** CubeCL 0.10 does not expose the CUDA
//! stream it launches on, so cuBLAS runs on a stream of its own and the
//! two streams meet through two flag words in device memory, one pair per
//! CubeCL stream (per calling thread), each product with the next number
//! `e` of its pair:
//! 1. the operands' and output's pointers are resolved (which makes the
//!    calling thread's CubeCL stream wait for their producers on other
//!    streams), and a one-thread CubeCL kernel stores `e` in the first
//!    flag: it runs once every kernel queued before it on that stream has;
//! 2. cuBLAS's stream waits for the first flag to reach `e`
//!    (`cuStreamWaitValue32`), runs the product, and writes `e` to the
//!    second flag (`cuStreamWriteValue32`, after the product's writes);
//! 3. a one-thread CubeCL kernel spins until the second flag reaches `e`,
//!    so every kernel queued after it sees the product.
//!
//! Nothing waits on the host. Every launch and stream operation of a
//! product is made under one lock, and CubeCL's queue is flushed after
//! each of its two kernels, so every wait reaches the driver after what it
//! waits for: no cycle, whichever hardware queues the streams share.
//! Memory stays safe: the spin kernel binds the operands and the output
//! (unread), so CubeCL holds their memory until it has run, also for a
//! buffer of another thread's stream. A driver without stream memory
//! operations makes the first failure turn the rest to host waits (the
//! calling stream synchronised before the product, cuBLAS's after it).
//! One flag pair is kept per thread that ever ran a product (8 bytes).

use super::cuda_context::{panic_message, primary_context};
use super::library_gemm::{GemmElems, GemmOperand, LibraryGemm};
use super::CubeclBackend;
use crate::backend::Backend;
use crate::error::RuntimeError;
use cubecl::cuda::CudaRuntime;
use cubecl::prelude::*;
use cubecl::server::Handle;
use cudarc::cublas::{result as cublas, sys};
use cudarc::driver::sys as cu;
use cudarc::driver::{CudaContext, CudaStream};
use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;

/// Stores `value` in `flags[0]` (step 1 of the module docs' ordering).
#[cube(launch)]
fn signal(flags: &Array<Atomic<u32>>, value: u32) {
    if ABSOLUTE_POS == 0 {
        flags[0].store(value);
    }
}

/// Returns once `flags[1]` has reached `value` (step 3). The product's
/// operands and output are bound too, unread, so that CubeCL holds their
/// memory until this kernel has run (a buffer from another thread's
/// stream returns to that stream's pool when freed, and that stream never
/// waits for cuBLAS's).
#[cube(launch)]
fn wait_for(flags: &Array<Atomic<u32>>, _a: &Array<u32>, _b: &Array<u32>, _out: &Array<u32>, value: u32) {
    if ABSOLUTE_POS == 0 {
        loop {
            if flags[1].load() >= value {
                break;
            }
        }
    }
}

/// A calling thread's (CubeCL stream's) flag pair and its last number.
struct Flags {
    handle: Handle,
    /// The pair's device address (CubeCL never moves a live buffer).
    ptr: u64,
    epoch: u32,
}

/// What the [`Cublas`] lock guards.
struct State {
    /// The cuBLAS handle (a raw pointer).
    handle: sys::cublasHandle_t,
    /// The flag pairs, by calling thread.
    flags: HashMap<ThreadId, Flags>,
    /// Whether the streams meet on the device (false once the driver
    /// refused a stream memory operation: host waits from then on).
    on_device: bool,
}
// SAFETY: a cuBLAS handle may move between threads; [`Cublas`] uses it
// from one thread at a time (its mutex).
unsafe impl Send for State {}

/// cuBLAS on one GPU, for the logical devices on it.
pub struct Cublas {
    gpu: usize,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    state: Mutex<State>,
    pack_half: bool,
}

impl Drop for Cublas {
    fn drop(&mut self) {
        let st = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        if self.ctx.bind_to_thread().is_ok() && self.stream.synchronize().is_ok() {
            // SAFETY: the handle was made by `create_handle`, is dropped
            // once, and its stream has finished.
            unsafe {
                let _ = cublas::destroy_handle(st.handle);
            }
        }
    }
}

fn failed(gpu: usize, what: impl std::fmt::Display) -> RuntimeError {
    RuntimeError::Device { backend: format!("cuBLAS on CUDA GPU {gpu}"), message: what.to_string() }
}

impl Cublas {
    /// cuBLAS on CUDA GPU `gpu` (its primary context, which CubeCL uses
    /// too), with a stream of its own; an error when the library or the
    /// GPU cannot be opened. `pack_half`: see [`LibraryGemm::packs_half`];
    /// `host_waits`: order the streams by host waits from the start (module
    /// docs), to compare.
    pub fn open(gpu: usize, pack_half: bool, host_waits: bool) -> Result<Cublas, RuntimeError> {
        // SAFETY: only probes for the library's file.
        let present = catch_unwind(|| unsafe { sys::is_culib_present() }).unwrap_or(false);
        if !present {
            return Err(failed(
                gpu,
                "libcublas was not found (install CUDA's cuBLAS, or pip's nvidia-cublas, and put its \
                 lib folder on LD_LIBRARY_PATH; a `libcublas.so.N` only may need a `libcublas.so` link)",
            ));
        }
        let ctx = primary_context(gpu).map_err(|why| failed(gpu, why))?;
        let stream = ctx.new_stream().map_err(|e| failed(gpu, format!("cuStreamCreate: {e}")))?;
        ctx.bind_to_thread().map_err(|e| failed(gpu, format!("cuCtxSetCurrent: {e}")))?;
        let handle = catch_unwind(AssertUnwindSafe(|| -> Result<sys::cublasHandle_t, String> {
            let h = cublas::create_handle().map_err(|e| format!("cublasCreate: {e}"))?;
            // SAFETY: `h` was just made; the stream lives as long as `Cublas`.
            unsafe {
                cublas::set_stream(h, stream.cu_stream() as sys::cudaStream_t)
                    .and_then(|_| sys::cublasSetMathMode(h, sys::cublasMath_t::CUBLAS_DEFAULT_MATH).result())
                    .map_err(|e| format!("cublasSetStream/SetMathMode: {e}"))?;
            }
            Ok(h)
        }))
        .map_err(|p| failed(gpu, panic_message(p)))?
        .map_err(|e| failed(gpu, e))?;
        let state = State { handle, flags: HashMap::new(), on_device: !host_waits };
        Ok(Cublas { gpu, ctx, stream, state: Mutex::new(state), pack_half })
    }
}

/// cuBLAS's view of a `[rows, cols]` operand with `strides` (row or column
/// contiguous) as the transposed matrix the column-major product reads
/// (see [`Cublas::gemm`]): the operation and leading dimension.
fn side(strides: [usize; 3], rows: usize, cols: usize) -> (sys::cublasOperation_t, usize) {
    if strides[2] == 1 {
        // Row-major: column-major memory holds the transpose, as needed.
        (sys::cublasOperation_t::CUBLAS_OP_N, strides[1].max(cols).max(1))
    } else {
        // Column-major: the matrix itself; cuBLAS transposes it.
        (sys::cublasOperation_t::CUBLAS_OP_T, strides[2].max(rows).max(1))
    }
}

fn int(gpu: usize, v: usize) -> Result<i32, RuntimeError> {
    i32::try_from(v).map_err(|_| failed(gpu, format!("a dimension of {v} is past cuBLAS's 32-bit sizes")))
}

impl LibraryGemm<CudaRuntime> for Cublas {
    fn gemm(
        &self,
        be: &CubeclBackend<CudaRuntime>,
        a: &GemmOperand,
        b: &GemmOperand,
        out: &Handle,
        [nb, m, k, n]: [usize; 4],
        elems: GemmElems,
    ) -> Result<(), RuntimeError> {
        use sys::cublasComputeType_t as C;
        use sys::cudaDataType as T;
        let g = self.gpu;
        let (in_ty, out_ty, compute) = match elems {
            GemmElems::F32 => (T::CUDA_R_32F, T::CUDA_R_32F, C::CUBLAS_COMPUTE_32F),
            GemmElems::F64 => (T::CUDA_R_64F, T::CUDA_R_64F, C::CUBLAS_COMPUTE_64F),
            GemmElems::Bf16InF32 => (T::CUDA_R_32F, T::CUDA_R_32F, C::CUBLAS_COMPUTE_32F_FAST_16BF),
            GemmElems::F16InF32 => (T::CUDA_R_32F, T::CUDA_R_32F, C::CUBLAS_COMPUTE_32F_FAST_16F),
            GemmElems::Bf16 => (T::CUDA_R_16BF, T::CUDA_R_32F, C::CUBLAS_COMPUTE_32F),
            GemmElems::F16 => (T::CUDA_R_16F, T::CUDA_R_32F, C::CUBLAS_COMPUTE_32F),
        };
        // Row-major `out[m, n] = a[m, k] · b[k, n]` is the column-major
        // `out^T[n, m] = b^T[n, k] · a^T[k, m]`.
        let (op_b, ldb) = side(b.strides, k, n);
        let (op_a, lda) = side(a.strides, m, k);
        let dims = [int(g, n)?, int(g, m)?, int(g, k)?, int(g, ldb)?, int(g, lda)?, int(g, nb)?];
        let client = be.client();
        let resource = |h: &Handle| client.get_resource(h.clone()).map_err(|e| failed(g, format!("{e:?}")));
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let st = &mut *st;
        let (ra, rb, rc) = (resource(&a.handle)?, resource(&b.handle)?, resource(out)?);
        self.ctx.bind_to_thread().map_err(|e| failed(g, format!("cuCtxSetCurrent: {e}")))?;
        let cu_stream = self.stream.cu_stream();
        // Step 1: this thread's flags, the next number, and the signal.
        let on_device = st.on_device;
        let meeting = if on_device {
            let flags = match st.flags.entry(std::thread::current().id()) {
                Entry::Occupied(o) => o.into_mut(),
                Entry::Vacant(v) => {
                    // The zeros must be in place before cuBLAS's stream reads them.
                    let handle = client.create_from_slice(&[0u8; 8]);
                    let ptr = resource(&handle)?.resource().ptr;
                    be.sync()?;
                    v.insert(Flags { handle, ptr, epoch: 0 })
                }
            };
            flags.epoch += 1;
            let (fh, ptr, e) = (flags.handle.clone(), flags.ptr, flags.epoch);
            // SAFETY: `fh` holds two `u32` flags.
            let arg = unsafe { ArrayArg::from_raw_parts(fh.clone(), 2) };
            signal::launch::<CudaRuntime>(client, CubeCount::Static(1, 1, 1), CubeDim::new_1d(1), arg, e);
            // CubeCL queues launches on the host; the signal must reach the
            // driver before the wait that depends on it.
            client.flush().map_err(|e| failed(g, format!("{e:?}")))?;
            // Step 2's wait.
            // SAFETY: `ptr` is the live flag pair; the stream is cuBLAS's.
            let waited = catch_unwind(|| unsafe {
                cu::cuStreamWaitValue32_v2(
                    cu_stream,
                    ptr,
                    e,
                    cu::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32,
                )
            });
            match waited {
                Ok(cu::CUresult::CUDA_SUCCESS) => Some((fh, ptr, e)),
                _ => {
                    st.on_device = false;
                    None
                }
            }
        } else {
            None
        };
        if meeting.is_none() {
            be.sync()?;
        }
        let (one32, zero32, one64, zero64) = (1f32, 0f32, 1f64, 0f64);
        let (alpha, beta): (*const c_void, *const c_void) = if elems == GemmElems::F64 {
            (&one64 as *const f64 as _, &zero64 as *const f64 as _)
        } else {
            (&one32 as *const f32 as _, &zero32 as *const f32 as _)
        };
        // SAFETY: the three pointers are live device allocations (held by
        // `ra`, `rb`, `rc` and the caller's buffers until the product is
        // ordered before every later CubeCL kernel, below) of the
        // operands' strided views and the dense `[nb, m, n]` output, in
        // the element types above; `alpha` and `beta` are host scalars of
        // the compute type, read when the call is made; the handle is used
        // under its lock.
        let r = unsafe {
            cublas::gemm_strided_batched_ex(
                st.handle,
                op_b,
                op_a,
                dims[0],
                dims[1],
                dims[2],
                alpha,
                rb.resource().ptr as *const c_void,
                in_ty,
                dims[3],
                b.strides[0] as i64,
                ra.resource().ptr as *const c_void,
                in_ty,
                dims[4],
                a.strides[0] as i64,
                beta,
                rc.resource().ptr as *mut c_void,
                out_ty,
                dims[0],
                (m * n) as i64,
                dims[5],
                compute,
                sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        };
        r.map_err(|e| failed(g, format!("cublasGemmStridedBatchedEx: {e}")))?;
        // Steps 2's write and 3, or the host wait.
        let written = meeting.and_then(|(fh, ptr, e)| {
            // SAFETY: as the wait above; the second flag is 4 bytes in.
            let w = catch_unwind(|| unsafe {
                cu::cuStreamWriteValue32_v2(
                    cu_stream,
                    ptr + 4,
                    e,
                    cu::CUstreamWriteValue_flags::CU_STREAM_WRITE_VALUE_DEFAULT as u32,
                )
            });
            matches!(w, Ok(cu::CUresult::CUDA_SUCCESS)).then_some((fh, e))
        });
        match written {
            Some((fh, e)) => {
                // SAFETY: `fh` holds two `u32` flags; the other three
                // buffers hold at least one 4-byte element each, never read.
                let (f, x, y, z) = unsafe {
                    (
                        ArrayArg::from_raw_parts(fh, 2),
                        ArrayArg::from_raw_parts(a.handle.clone(), 1),
                        ArrayArg::from_raw_parts(b.handle.clone(), 1),
                        ArrayArg::from_raw_parts(out.clone(), 1),
                    )
                };
                let one = CubeCount::Static(1, 1, 1);
                wait_for::launch::<CudaRuntime>(client, one, CubeDim::new_1d(1), f, x, y, z, e);
                client.flush().map_err(|e| failed(g, format!("{e:?}")))?;
            }
            None => {
                if on_device {
                    st.on_device = false;
                }
                self.stream.synchronize().map_err(|e| failed(g, format!("cuStreamSynchronize: {e}")))?;
            }
        }
        drop((ra, rb, rc));
        Ok(())
    }

    fn packs_half(&self) -> bool {
        self.pack_half
    }

    fn name(&self) -> &'static str {
        "cuBLAS"
    }
}

#[cfg(test)]
mod tests {
    use super::{side, sys};

    #[test]
    fn operands_map_to_column_major_transposes() {
        use sys::cublasOperation_t::{CUBLAS_OP_N, CUBLAS_OP_T};
        // A row-major [m=3, k=5] left operand: its memory is the
        // column-major [5, 3] transpose, read as is with ld 5.
        assert_eq!(side([15, 5, 1], 3, 5), (CUBLAS_OP_N, 5));
        // The same values stored transposed ([k, m], as `x^T @ dy` reads
        // x): column-major [3, 5] with ld 3, transposed by cuBLAS.
        assert_eq!(side([15, 1, 3], 3, 5), (CUBLAS_OP_T, 3));
        // A row of a wider buffer (row stride 8 for 5 columns) keeps its stride.
        assert_eq!(side([0, 8, 1], 3, 5), (CUBLAS_OP_N, 8));
        // One row: any leading dimension of at least the columns.
        assert_eq!(side([5, 5, 1], 1, 5), (CUBLAS_OP_N, 5));
    }
}

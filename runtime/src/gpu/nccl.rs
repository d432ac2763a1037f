//! NCCL collectives on CUDA devices (the `cuda` feature; opt-in with
//! `WEFT_COLLECTIVES=nccl`, see [`super::device_collectives`] for why it is
//! not the default and which collectives it takes).
//!
//! NCCL comes through `cudarc`, which CubeCL's CUDA runtime already
//! depends on: it loads `libnccl` when first called, so weft builds without
//! NCCL (or CUDA) installed. A missing library would make cudarc panic;
//! [`version`] probes for it first (inside `catch_unwind`, for a library
//! that loads but lacks a symbol) and names the problem instead:
//! [`RuntimeError::NcclUnavailable`].
//!
//! **Communicators.** Every group of the program's all-reduces,
//! reduce-scatters and all-gathers gets one NCCL communicator, with the
//! group's rank order as NCCL's rank order, so member `r` of a
//! reduce-scatter keeps block `r` and an all-gather concatenates in rank
//! order, as the host path does. NCCL allows one rank per GPU in a
//! communicator, so every group's devices must be on distinct GPUs (checked
//! here for this process's devices; NCCL itself refuses a GPU shared across
//! processes); at world size 1 each group is one device. The group's first
//! device's process makes the group's unique id, and the ids reach the
//! other processes through the [`ProcessGroup`]'s `all_gather` (MPI in a
//! multi-process run): one exchange at start-up, before any communicator is
//! made. The communicators are then made in one NCCL group call, so that a
//! process making several waits for none of them in turn.
//!
//! **Buffers and ordering.** The collectives read and write CubeCL buffers
//! in place: `ComputeClient::get_resource` gives the CUDA device pointer of
//! a handle (offset included), in the primary context that both CubeCL and
//! NCCL use. CubeCL launches its kernels on streams of its own that it does
//! not expose, so the ordering with them is explicit: the output is
//! reserved, both pointers are resolved (which also makes the calling
//! thread's CubeCL stream wait for the buffers' producers), then the
//! CubeCL stream is synchronised, the NCCL call is enqueued on this
//! device's NCCL stream, and that stream is waited for before the output
//! goes back to the executor (at most the collective timeout: past it the
//! communicator is aborted and the call is a named error, never a hang). A buffer that the collective reads or writes
//! is therefore never in use by a CubeCL kernel at the same time, and
//! CubeCL may reuse the input's memory as soon as the call returns. The
//! price is that collectives do not overlap with compute; overlapping them
//! needs CubeCL to expose its stream (or events), which 0.10 does not.
//!
//! **Not verified on hardware.** This path was written and built on a
//! machine without a GPU; `specs/runtime.md` says what has been checked
//! and the command that checks the rest (`tests/nccl.rs`).

use super::cuda_context::{panic_message, primary_context};
use super::device_collectives::{native_groups, native_kind, native_output_type, NativeCollectives, NativeKind};
use super::{CubeBuffer, CubeclBackend};
use crate::backend::Backend;
use crate::comm::CollectiveCall;
use crate::error::RuntimeError;
use crate::process::ProcessGroup;
use cubecl::cuda::CudaRuntime;
use cudarc::driver::{CudaContext, CudaStream};
use cudarc::nccl::{result as nccl, sys};
use std::collections::HashMap;
use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use weft_ir::device::DeviceProgram;
use weft_ir::{DType, ReduceOp};

/// Bytes of an NCCL unique id.
pub const ID_BYTES: usize = 128;

fn unavailable(reason: String) -> RuntimeError {
    RuntimeError::NcclUnavailable { reason }
}

/// NCCL's name for a failed call's result.
fn nccl_message(e: nccl::NcclError) -> String {
    format!("{:?} (set NCCL_DEBUG=WARN for NCCL's own account)", e.0)
}

/// The version of the NCCL library this process can load (e.g. `22304`
/// for 2.23.4), or [`RuntimeError::NcclUnavailable`] saying why not.
/// Never panics: cudarc's loader panics on a missing library, so the
/// library is looked for first, and the first call is made inside
/// `catch_unwind`.
pub fn version() -> Result<i32, RuntimeError> {
    // SAFETY: `is_culib_present` only tries to open the library names
    // cudarc knows (and closes what it opened).
    let present = catch_unwind(|| unsafe { sys::is_culib_present() }).unwrap_or(false);
    if !present {
        let names = cudarc::get_lib_name_candidates("nccl");
        // NCCL's runtime packages (libnccl2, pip's nvidia-nccl-cu12) ship
        // `libnccl.so.2` only, a name cudarc does not look for.
        // SAFETY: loading NCCL runs no code of ours; it is closed at once.
        let soname_only = unsafe { libloading::Library::new("libnccl.so.2") }.is_ok();
        let hint = if soname_only {
            "libnccl.so.2 is installed, but cudarc (which loads NCCL) looks only for the names above: put a symlink \
             libnccl.so -> libnccl.so.2 in a directory on LD_LIBRARY_PATH (or install libnccl-dev)"
        } else {
            "install NCCL (e.g. the libnccl2 and libnccl-dev packages, which provide libnccl.so) and put its \
             directory on LD_LIBRARY_PATH"
        };
        return Err(unavailable(format!(
            "the NCCL library could not be loaded (looked for {}); {hint}, or unset WEFT_COLLECTIVES to stage \
             collectives through the host",
            names.join(", ")
        )));
    }
    match catch_unwind(nccl::get_nccl_version) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(unavailable(format!("libnccl loads, but ncclGetVersion failed: {}", nccl_message(e)))),
        Err(p) => Err(unavailable(format!(
            "libnccl loads but is not a usable NCCL ({}); install NCCL 2.x and put it first on LD_LIBRARY_PATH",
            panic_message(p)
        ))),
    }
}

/// An NCCL unique id: what the members of one communicator share.
#[derive(Clone, Copy)]
pub struct NcclId(sys::ncclUniqueId);

impl NcclId {
    /// A fresh id (NCCL must be loadable: call [`version`] first).
    pub fn new() -> Result<NcclId, RuntimeError> {
        match catch_unwind(nccl::get_uniqueid) {
            Ok(Ok(id)) => Ok(NcclId(id)),
            Ok(Err(e)) => Err(unavailable(format!("ncclGetUniqueId failed: {}", nccl_message(e)))),
            Err(p) => Err(unavailable(format!("ncclGetUniqueId: {}", panic_message(p)))),
        }
    }

    /// The id as bytes (to send to other processes).
    pub fn to_bytes(&self) -> [u8; ID_BYTES] {
        self.0.internal.map(|c| c as u8)
    }

    /// The id sent as `bytes` by [`NcclId::to_bytes`].
    pub fn from_bytes(bytes: &[u8; ID_BYTES]) -> NcclId {
        NcclId(sys::ncclUniqueId { internal: bytes.map(|b| b as std::ffi::c_char) })
    }
}

/// One communicator of a group, as one member holds it.
struct GroupComm {
    comm: sys::ncclComm_t,
    size: usize,
}

// SAFETY: an NCCL communicator may be used from any thread, one call at a
// time: every use goes through the `Mutex` of its `NcclDevice`.
unsafe impl Send for GroupComm {}

impl Drop for GroupComm {
    fn drop(&mut self) {
        // SAFETY: `comm` was made by `comm_init_rank` and is destroyed once.
        // An error here (a peer that died) cannot be acted on.
        let comm = self.comm;
        let _ = catch_unwind(AssertUnwindSafe(|| unsafe { nccl::comm_destroy(comm) }));
    }
}

/// One logical device's side of NCCL: its GPU's context, a stream for the
/// collectives, and its communicator for each group it belongs to.
pub struct NcclDevice {
    /// The logical device (for errors).
    device: usize,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    /// How long one collective may take before it is abandoned.
    timeout: Duration,
    /// By the group's devices in rank order.
    comms: Mutex<HashMap<Vec<usize>, GroupComm>>,
}

fn driver_err(device: usize, call: &str, e: impl std::fmt::Display) -> RuntimeError {
    RuntimeError::Nccl { device, call: call.into(), message: e.to_string() }
}

/// The CUDA context (the GPU's primary context, CubeCL's too) and a new
/// stream on GPU `gpu`, without cudarc's panic when there is no driver.
fn context(device: usize, gpu: usize) -> Result<(Arc<CudaContext>, Arc<CudaStream>), RuntimeError> {
    let ctx = primary_context(gpu).map_err(|why| unavailable(format!("{why} (for device {device})")))?;
    let stream = ctx.new_stream().map_err(|e| driver_err(device, "cuStreamCreate", e))?;
    Ok((ctx, stream))
}

/// Makes the NCCL side of this process's devices `local` of `program`'s
/// mesh (ascending; `gpus[k]` is the CUDA ordinal device `local[k]` runs
/// on): one communicator per group of the program's collectives that NCCL
/// may run, the unique ids shared with the other processes of `processes`
/// (waiting at most `timeout`, which also bounds each collective). One
/// [`NcclDevice`] per local device, in order.
pub fn connect(
    program: &DeviceProgram,
    local: &[usize],
    gpus: &[usize],
    processes: Option<&dyn ProcessGroup>,
    timeout: Duration,
) -> Result<Vec<Arc<NcclDevice>>, RuntimeError> {
    version()?;
    let groups = native_groups(program);
    let gpu_of = |d: usize| local.iter().position(|&l| l == d).map(|k| gpus[k]);
    for g in &groups {
        let mut seen: HashMap<usize, usize> = HashMap::new();
        for &d in g {
            let Some(gpu) = gpu_of(d) else { continue };
            if let Some(other) = seen.insert(gpu, d) {
                return Err(unavailable(format!(
                    "devices {other} and {d} of the collective group {g:?} both run on CUDA GPU {gpu}, and NCCL \
                     allows one rank per GPU in a communicator (use one GPU per device of each group, or unset \
                     WEFT_COLLECTIVES)"
                )));
            }
        }
    }
    let ids = share_ids(&groups, local, processes, timeout)?;
    let mut devices = Vec::with_capacity(local.len());
    for (k, &d) in local.iter().enumerate() {
        let (ctx, stream) = context(d, gpus[k])?;
        devices.push(NcclDevice { device: d, ctx, stream, timeout, comms: Mutex::new(HashMap::new()) });
    }
    // Every communicator of this process in one group call: NCCL makes
    // them together, so none waits for a peer this thread has yet to make.
    let mut made: Vec<(usize, Vec<usize>, GroupComm)> = Vec::new();
    nccl::group_start().map_err(|e| nccl_err(local[0], "ncclGroupStart", e))?;
    let mut failed = None;
    'init: for (k, dev) in devices.iter().enumerate() {
        for (g, id) in groups.iter().zip(&ids) {
            let (Some(rank), Some(id)) = (g.iter().position(|&x| x == local[k]), id) else { continue };
            if let Err(e) = dev.ctx.bind_to_thread() {
                failed = Some(driver_err(dev.device, "cuCtxSetCurrent", e));
                break 'init;
            }
            let mut comm = std::mem::MaybeUninit::uninit();
            // SAFETY: `comm` is written by NCCL before it is read; the size
            // and rank describe this member of a group of `g.len()`.
            let r = unsafe { nccl::comm_init_rank(comm.as_mut_ptr(), g.len() as i32, id.0, rank as i32) };
            match r {
                // SAFETY: a successful init wrote the communicator.
                Ok(_) => made.push((k, g.clone(), GroupComm { comm: unsafe { comm.assume_init() }, size: g.len() })),
                Err(e) => {
                    failed = Some(nccl_err(dev.device, "ncclCommInitRank", e));
                    break 'init;
                }
            }
        }
    }
    let ended = nccl::group_end().map_err(|e| nccl_err(local[0], "ncclGroupEnd (making the communicators)", e));
    if let Some(e) = failed.or(ended.err()) {
        // Communicators of a failed group call may be half made: leak them
        // rather than destroy what NCCL may not have finished (the run
        // stops).
        std::mem::forget(made);
        return Err(e);
    }
    for (k, g, comm) in made {
        devices[k].comms.get_mut().unwrap_or_else(|p| p.into_inner()).insert(g, comm);
    }
    Ok(devices.into_iter().map(Arc::new).collect())
}

fn nccl_err(device: usize, call: &str, e: nccl::NcclError) -> RuntimeError {
    RuntimeError::Nccl { device, call: call.into(), message: nccl_message(e) }
}

/// For each group, its unique id if this process has a member (`None`
/// otherwise): made by the process owning the group's first device, sent
/// to the others with one `all_gather`.
fn share_ids(
    groups: &[Vec<usize>],
    local: &[usize],
    processes: Option<&dyn ProcessGroup>,
    timeout: Duration,
) -> Result<Vec<Option<NcclId>>, RuntimeError> {
    let mut ids: Vec<Option<NcclId>> = vec![None; groups.len()];
    let mut mine = Vec::new();
    for (i, g) in groups.iter().enumerate() {
        if local.contains(&g[0]) {
            let id = NcclId::new()?;
            mine.extend_from_slice(&(i as u32).to_le_bytes());
            mine.extend_from_slice(&id.to_bytes());
            ids[i] = Some(id);
        }
    }
    let Some(pg) = processes.filter(|p| p.size() > 1) else { return Ok(ids) };
    let all = pg.all_gather(&mine, timeout, "sharing the NCCL unique ids")?;
    for (q, bytes) in all.iter().enumerate() {
        if q == pg.rank() {
            continue;
        }
        for rec in bytes.chunks(4 + ID_BYTES) {
            let bad = || RuntimeError::Process {
                rank: pg.rank(),
                message: format!("process {q} sent a malformed NCCL unique id ({} bytes)", rec.len()),
            };
            let i = u32::from_le_bytes(rec.get(..4).ok_or_else(bad)?.try_into().expect("4 bytes")) as usize;
            let id: &[u8; ID_BYTES] = rec.get(4..).and_then(|b| b.try_into().ok()).ok_or_else(bad)?;
            if i >= groups.len() {
                return Err(bad());
            }
            if groups[i].iter().any(|d| local.contains(d)) {
                ids[i] = Some(NcclId::from_bytes(id));
            }
        }
    }
    for (g, id) in groups.iter().zip(&ids) {
        if id.is_none() && g.iter().any(|d| local.contains(d)) {
            return Err(RuntimeError::Process {
                rank: pg.rank(),
                message: format!(
                    "no process sent the NCCL unique id of the group {g:?} (do all run the same program?)"
                ),
            });
        }
    }
    Ok(ids)
}

/// NCCL's type for elements of dtype `d` as CubeCL stores them.
fn reduce_type(d: DType) -> sys::ncclDataType_t {
    match d {
        DType::F64 => sys::ncclDataType_t::ncclFloat64,
        _ => sys::ncclDataType_t::ncclFloat32,
    }
}

fn reduce_op(op: ReduceOp) -> sys::ncclRedOp_t {
    match op {
        ReduceOp::Sum => sys::ncclRedOp_t::ncclSum,
        ReduceOp::Max => sys::ncclRedOp_t::ncclMax,
        ReduceOp::Min => sys::ncclRedOp_t::ncclMin,
    }
}

impl NcclDevice {
    /// Runs `kind` for `call` on `input` (module docs: ordering).
    fn launch(
        &self,
        be: &CubeclBackend<CudaRuntime>,
        call: CollectiveCall<'_>,
        kind: NativeKind,
        input: &CubeBuffer<CudaRuntime>,
    ) -> Result<CubeBuffer<CudaRuntime>, RuntimeError> {
        let d = self.device;
        let mut comms = self.comms.lock().unwrap_or_else(|p| p.into_inner());
        let (comm, n) = match comms.get(call.group) {
            Some(c) => (c.comm, c.size),
            None => {
                return Err(RuntimeError::Nccl {
                    device: d,
                    call: call.op.name().into(),
                    message: format!("no communicator was made for the group {:?}", call.group),
                })
            }
        };
        let out_ty = native_output_type(kind, call.op, input.ty(), n);
        let out = be.empty(&out_ty);
        let resource = |h: &cubecl::server::Handle| {
            be.client()
                .get_resource(h.clone())
                .map_err(|e| RuntimeError::Device { backend: be.name(), message: format!("{e:?}") })
        };
        let src = resource(&input.handle)?;
        let dst = resource(&out.handle)?;
        be.sync()?;
        self.ctx.bind_to_thread().map_err(|e| driver_err(d, "cuCtxSetCurrent", e))?;
        let (sp, dp) = (src.resource().ptr as *const c_void, dst.resource().ptr as *mut c_void);
        let stream = self.stream.cu_stream() as sys::cudaStream_t;
        let elems = input.len();
        // SAFETY: `sp` and `dp` point to live device allocations of the
        // input (`elems` elements of its storage type) and the output
        // (reserved for `out_ty`), both held (`input`, `out`, `src`, `dst`)
        // until the stream is synchronised below; `comm` is this device's
        // communicator of the group, used by this thread only (the lock).
        let r = unsafe {
            match kind {
                NativeKind::AllReduce(op) => {
                    nccl::all_reduce(sp, dp, elems, reduce_type(input.ty().dtype), reduce_op(op), comm, stream)
                }
                NativeKind::ReduceScatter(op) => {
                    nccl::reduce_scatter(sp, dp, elems / n, reduce_type(input.ty().dtype), reduce_op(op), comm, stream)
                }
                NativeKind::AllGather => {
                    let bytes = elems * input.storage().size();
                    nccl::all_gather(sp, dp, bytes, sys::ncclDataType_t::ncclUint8, comm, stream)
                }
            }
        };
        r.map_err(|e| nccl_err(d, call.op.name(), e))?;
        match self.wait(call, comm) {
            Ok(()) => {}
            Err(e) => {
                // An aborted communicator is gone: never destroy it again.
                if let Some(c) = comms.remove(call.group) {
                    std::mem::forget(c);
                }
                // The collective may still be writing: leak what it uses.
                std::mem::forget((src, dst, out));
                return Err(e);
            }
        }
        drop((src, dst));
        Ok(out)
    }

    /// Waits for this device's NCCL stream, at most the timeout: a member
    /// that never comes (a failed device or process) would otherwise hang
    /// the call forever. Past the deadline the communicator is aborted
    /// (NCCL's way out of a collective in flight) and the error names the
    /// collective and its group.
    fn wait(&self, call: CollectiveCall<'_>, comm: sys::ncclComm_t) -> Result<(), RuntimeError> {
        use cudarc::driver::sys::{cuStreamQuery, CUresult};
        let start = std::time::Instant::now();
        let mut spins = 0u32;
        loop {
            // SAFETY: the stream is live (held by `self`).
            match unsafe { cuStreamQuery(self.stream.cu_stream()) } {
                CUresult::CUDA_SUCCESS => return Ok(()),
                CUresult::CUDA_ERROR_NOT_READY => {}
                e => return Err(driver_err(self.device, "cuStreamQuery (after NCCL)", format!("{e:?}"))),
            }
            if start.elapsed() >= self.timeout {
                // SAFETY: `comm` is this device's live communicator; after
                // the abort the caller forgets it.
                let _ = catch_unwind(|| unsafe { nccl::comm_abort(comm) });
                return Err(RuntimeError::Nccl {
                    device: self.device,
                    call: call.op.name().into(),
                    message: format!(
                        "step {}: the group {:?} did not complete within {:?} (a member failed or never came); the \
                         communicator was aborted",
                        call.step, call.group, self.timeout
                    ),
                });
            }
            spins += 1;
            if spins < 1000 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }
}

impl NativeCollectives<CudaRuntime> for NcclDevice {
    fn run(
        &self,
        backend: &CubeclBackend<CudaRuntime>,
        call: CollectiveCall<'_>,
        input: &CubeBuffer<CudaRuntime>,
    ) -> Option<Result<CubeBuffer<CudaRuntime>, RuntimeError>> {
        let kind = native_kind(call.op, input.ty(), call.group.len())?;
        Some(self.launch(backend, call, kind, input))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_through_bytes() {
        let bytes: [u8; ID_BYTES] = std::array::from_fn(|i| (i * 7 + 200) as u8);
        assert_eq!(NcclId::from_bytes(&bytes).to_bytes(), bytes);
    }

    /// Where NCCL is missing (this crate's development machine), asking for
    /// it is the named error, not cudarc's panic; where it is installed,
    /// the version is a plausible one.
    #[test]
    fn missing_nccl_is_a_named_error() {
        match version() {
            Err(RuntimeError::NcclUnavailable { reason }) => {
                println!("as expected without NCCL: {reason}");
                assert!(reason.contains("libnccl"), "{reason}");
            }
            Err(e) => panic!("expected NcclUnavailable, got {e}"),
            Ok(v) => {
                println!("NCCL {v} is installed: the missing-library error is not exercised here");
                assert!(v >= 2_00_00, "NCCL version {v}");
            }
        }
    }
}

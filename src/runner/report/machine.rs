//! The machine model the auto-sharder plans with, per backend.
//!
//! The auto-sharder's defaults describe accelerators (100 TFLOP/s, 100 GB/s
//! links, element-wise ops priced by their FLOPs), under which the cheapest
//! CPU plan is to replicate everything. Logical CPU devices share the
//! host's cores (the fast CPU backend runs one worker per core, each
//! driving a run of devices, and overlaps nothing), so every rate below is
//! measured per core and each device gets its share, `cores / devices`:
//!
//! - **GEMM**: 97 GFLOP/s per core (`examples/calibrate_cpu.rs`: 78 to
//!   117 GFLOP/s for the MLP's shapes on the 2-core development machine).
//! - **Memory streaming**: 16 GB/s per core for the bytes element-wise ops
//!   and reductions read and write. Without it an element-wise op costs one
//!   FLOP per element at the GEMM rate, about 100 times too little: a plan
//!   that repeats the activations' element-wise work on every device of an
//!   axis (Megatron: residual adds, the loss, their gradients, replicated
//!   over `model`) looked as cheap as one that splits it. From
//!   `weft compare-strategies` on the MLP (B=4096, D=H=256, L=4,
//!   `data=2,model=4`) on a quiet machine: each strategy's step less its
//!   GEMMs and collectives, over the bytes it streams, gives 15 to 19.5
//!   GB/s per core.
//! - **Per op**: 0.35 µs of a core for every op of every device (dispatch,
//!   buffers): on the 2-layer GPT example (about 4,600 ops per device) the
//!   measured steps exceed the model's compute and communication by about
//!   the same 6 ms under every strategy; on the MLP it is noise.
//! - **Collectives** (in-process: a rendezvous, the last member folds the
//!   group's buffers and every member copies the result): 12 GB/s per core
//!   and 10 µs per call (`calibrate_cpu`: all-reduces of 64 KiB to 2 MiB per
//!   device on `data=2,model=4` run at 2.2 to 7.1 GB/s per device).

use crate::runner::Backend;
use weft_compiler::autoshard::AutoShardOptions;
use weft_compiler::sharding::Mesh;

/// GEMM FLOP/s of one core.
pub const CPU_GEMM_FLOPS_PER_CORE: f64 = 97e9;
/// Bytes/s one core streams through element-wise ops and reductions.
pub const CPU_STREAM_BYTES_PER_CORE: f64 = 16e9;
/// Seconds of a core every op of every device takes besides its work.
pub const CPU_OP_OVERHEAD_PER_CORE: f64 = 0.35e-6;
/// Bytes/s of an in-process collective, per core.
pub const CPU_COLLECTIVE_BYTES_PER_CORE: f64 = 12e9;
/// Seconds per in-process collective.
pub const CPU_COLLECTIVE_LATENCY: f64 = 10e-6;

/// The auto-sharder's options for `backend` on `mesh`: `base` (its memory
/// budget, limits) with the backend's compute, memory and link constants.
pub fn machine_model(backend: Backend, mesh: &Mesh, base: &AutoShardOptions) -> AutoShardOptions {
    let mut o = base.clone();
    if backend.on_host() {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        let share = cores / mesh.num_devices().max(1) as f64;
        o.device_flops = CPU_GEMM_FLOPS_PER_CORE * share;
        o.device_memory_bandwidth = CPU_STREAM_BYTES_PER_CORE * share;
        o.op_overhead = CPU_OP_OVERHEAD_PER_CORE / share;
        o.default_bandwidth = CPU_COLLECTIVE_BYTES_PER_CORE * share;
        o.default_latency = CPU_COLLECTIVE_LATENCY;
    }
    o
}

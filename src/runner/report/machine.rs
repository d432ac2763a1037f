//! The machine model the auto-sharder plans with, per backend.
//!
//! The auto-sharder's defaults describe accelerators (100 TFLOP/s, 100 GB/s
//! links), under which the cheapest CPU plan is to replicate everything.
//! Logical CPU devices share the host's cores and exchange through host
//! memory: each gets its share of the cores' GEMM rate (about 97 GFLOP/s
//! per core on the 2-core development machine, BENCHMARKS.md) and
//! collectives cost a rendezvous and a memory copy.

use weft_compiler::autoshard::AutoShardOptions;
use weft_compiler::sharding::Mesh;

/// The auto-sharder's options for `backend` on `mesh`: `base` (its memory
/// budget, limits) with the backend's compute and link constants.
pub fn machine_model(backend: &str, mesh: &Mesh, base: &AutoShardOptions) -> AutoShardOptions {
    let mut o = base.clone();
    if matches!(backend, "cpu" | "cpu-ref" | "sim" | "interp") {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        o.device_flops = 97e9 * cores / mesh.num_devices().max(1) as f64;
        o.default_bandwidth = 5e9;
        o.default_latency = 20e-6;
    }
    o
}

//! Collective latency and bandwidth across processes: weft's
//! [`ProcessComm`] (exchange of contributions + rank-order fold, bitwise
//! reproducible), the same in its fast reduction mode ([`Reduction::Fast`]:
//! MPI's own sums for all-reduce and reduce-scatter; the other collectives
//! are the same in both modes) and the raw MPI call on the same bytes, one
//! device per process.
//!
//! ```sh
//! cargo build --release -p weft-runtime --features mpi --example mpi_collectives
//! mpirun -n 2 target/release/examples/mpi_collectives
//! ```
//! Prints, per collective and size, the mean time per call of each and
//! weft's overhead over MPI (ratio, deterministic mode). Timing: mean of a fixed number of calls after
//! warm-up, every process in lockstep. weft's time includes a clone of the
//! input at each call (`ProcessComm` takes its contribution by value, as
//! the executor hands over its buffer), one copy the MPI side does not make.

/// The allocator `weft` runs with (large buffers are reused, not returned
/// to the OS and faulted in again at every call).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use mpi::collective::SystemOperation;
use mpi::traits::*;
use std::sync::Arc;
use std::time::{Duration, Instant};
use weft_ir::device::Collective;
use weft_ir::tensor::HostTensor;
use weft_ir::ReduceOp;
use weft_runtime::comm::{CollectiveCall, Communicator};
use weft_runtime::process::{MpiGroup, ProcessGroup, Reduction};
use weft_runtime::ProcessComm;

fn main() {
    let (group, _session) = MpiGroup::init().expect("MPI starts");
    let world = mpi::topology::SimpleCommunicator::world();
    let (rank, p) = (group.rank(), group.size());
    let group: Arc<dyn ProcessGroup> = Arc::new(group);
    let comm = ProcessComm::new(Arc::clone(&group), (0..p).collect(), Duration::from_secs(60));
    let fast =
        ProcessComm::new(Arc::clone(&group), (0..p).collect(), Duration::from_secs(60)).with_reduction(Reduction::Fast);
    let members: Vec<usize> = (0..p).collect();
    let axes = vec!["x".to_string()];
    if rank == 0 {
        println!("{p} processes, one device each; mean per call");
        println!(
            "{:<16} {:>10} {:>12} {:>12} {:>12} {:>8} {:>10}",
            "collective", "bytes", "weft (us)", "fast (us)", "MPI (us)", "ratio", "weft GB/s"
        );
    }
    let mut step = 0usize;
    for &elems in &[1usize << 10, 1 << 14, 1 << 18, 1 << 22] {
        let bytes = elems * 4;
        let iters = (200_000_000 / bytes.max(1)).clamp(5, 200);
        let input: Vec<f32> = (0..elems).map(|i| (i % 97) as f32 * 0.5 + rank as f32).collect();
        let kinds: Vec<(&str, Collective)> = vec![
            ("all_reduce", Collective::AllReduce { axes: axes.clone(), op: ReduceOp::Sum }),
            ("all_gather", Collective::AllGather { dim: 0, axes: axes.clone() }),
            ("reduce_scatter", Collective::ReduceScatter { dim: 0, axes: axes.clone(), op: ReduceOp::Sum }),
            ("all_to_all", Collective::AllToAll { split_dim: 0, concat_dim: 0, axes: axes.clone() }),
        ];
        for (name, op) in &kinds {
            let t = HostTensor::from_f32(&[elems], input.clone()).unwrap();
            let mut time = |comm: &ProcessComm| {
                let mut ours = || {
                    let call = CollectiveCall { step, op, group: &members, rank };
                    step += 1;
                    comm.collective(call, t.clone()).expect("collective")
                };
                for _ in 0..3 {
                    ours();
                }
                world.barrier();
                let clock = Instant::now();
                for _ in 0..iters {
                    ours();
                }
                clock.elapsed().as_secs_f64() / iters as f64
            };
            let weft = time(&comm);
            let weft_fast = time(&fast);
            let mut out = vec![0f32; if *name == "all_gather" { elems * p } else { elems }];
            let mut small = vec![0f32; elems / p];
            let mut raw = || match *name {
                "all_reduce" => world.all_reduce_into(&input[..], &mut out[..], SystemOperation::sum()),
                "all_gather" => world.all_gather_into(&input[..], &mut out[..]),
                "reduce_scatter" => world.reduce_scatter_block_into(&input[..], &mut small[..], SystemOperation::sum()),
                _ => world.all_to_all_into(&input[..], &mut out[..]),
            };
            for _ in 0..3 {
                raw();
            }
            world.barrier();
            let clock = Instant::now();
            for _ in 0..iters {
                raw();
            }
            let mpi = clock.elapsed().as_secs_f64() / iters as f64;
            if rank == 0 {
                println!(
                    "{:<16} {:>10} {:>12.1} {:>12.1} {:>12.1} {:>8.2} {:>10.2}",
                    name,
                    bytes,
                    weft * 1e6,
                    weft_fast * 1e6,
                    mpi * 1e6,
                    weft / mpi,
                    bytes as f64 / weft / 1e9
                );
            }
        }
    }
}

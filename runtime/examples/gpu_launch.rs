//! What one kernel launch costs on a CubeCL device, end to end, and where
//! it goes: a step of weft's GPT benchmark is ~1,600 launches, so the fixed
//! cost of one decides how close a small model's step can come to JAX's.
//!
//! ```text
//! cargo run --release --features cuda -p weft-runtime --example gpu_launch
//! ```
//!
//! Each line launches `N` (default 2,000) kernels back to back, waits once
//! for the device, and prints the time per launch (the median of 5 rounds):
//! - `raw`: a one-element kernel on a buffer made once (checked and
//!   unchecked launches): CubeCL's own cost per launch;
//! - `raw+alloc`: the same, each launch writing a buffer allocated for it,
//!   as weft's ops do;
//! - `weft add [n]`: weft's `add` op through [`Backend::compute`] (type
//!   inference, allocation, launch) on `n` elements;
//! - `weft fused`: fused chains through [`Backend::compute_fused`]: a
//!   2-node one (a product with a splat) and an 8-node one with `tanh` and
//!   a division (as the GPT step's per-parameter scalar chains), from one
//!   element up;
//! - `weft reduce_sum`: the reductions of a layer norm and of a softmax
//!   over a vocabulary, a bias gradient and a whole-tensor sum (the global
//!   norm's).
//!
//! Without the `cuda` feature it runs on the first wgpu adapter.

use cubecl::prelude::*;
use std::time::Instant;
use weft_ir::device::BufferId;
use weft_ir::tensor::HostTensor;
use weft_ir::{BinaryOp, DType, Literal, Op, ReduceOp, TensorType, UnaryOp};
use weft_runtime::fusion::{Arg, FusedChain, FusedNode};
use weft_runtime::{Backend, CubeclBackend};

/// A chain over inputs `x` and `y` of type `ty`: `x * 0.5` (short) or
/// `(0.5 - tanh(0.7 * x)) * 0.25 / y` (long: 8 nodes, 3 splats).
fn chain(ty: &TensorType, long: bool) -> FusedChain {
    let node = |op: Op, args: Vec<Arg>| FusedNode { op, args, ty: ty.clone() };
    let splat = |v: f64| Op::Constant(Literal::splat(ty.clone(), v));
    let (i, n) = (Arg::Input, Arg::Node);
    let nodes = if long {
        vec![
            node(splat(0.7), vec![]),
            node(Op::Binary(BinaryOp::Mul), vec![n(0), i(0)]),
            node(Op::Unary(UnaryOp::Tanh), vec![n(1)]),
            node(splat(0.5), vec![]),
            node(Op::Binary(BinaryOp::Sub), vec![n(3), n(2)]),
            node(splat(0.25), vec![]),
            node(Op::Binary(BinaryOp::Mul), vec![n(4), n(5)]),
            node(Op::Binary(BinaryOp::Div), vec![n(6), i(1)]),
        ]
    } else {
        vec![node(splat(0.5), vec![]), node(Op::Binary(BinaryOp::Mul), vec![i(0), n(0)])]
    };
    let k = nodes.len();
    FusedChain {
        inputs: vec![BufferId(0), BufferId(1)],
        nodes,
        output: BufferId(2 + k as u32 - 1),
        intermediates: (2..2 + k as u32 - 1).map(BufferId).collect(),
        kept: vec![],
        members: (0..k).collect(),
    }
}

#[cube(launch, launch_unchecked)]
fn bump(x: &mut Array<f32>) {
    if ABSOLUTE_POS < x.len() {
        x[ABSOLUTE_POS] += 1.0;
    }
}

/// Median over 5 rounds of the seconds per launch of `round` (which makes
/// `n` launches), the device drained before and after each round.
fn per_launch<R: Runtime>(client: &ComputeClient<R>, n: usize, mut round: impl FnMut()) -> f64 {
    let sync = || cubecl::future::block_on(client.sync()).expect("device sync");
    round();
    sync();
    let mut t: Vec<f64> = (0..5)
        .map(|_| {
            let s = Instant::now();
            round();
            sync();
            s.elapsed().as_secs_f64() / n as f64
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[2]
}

fn run<R: Runtime>(be: &CubeclBackend<R>) {
    let n: usize = std::env::var("N").ok().and_then(|v| v.parse().ok()).unwrap_or(2000);
    let client = be.client();
    println!("device {}: {n} launches per round", be.name());
    let one = client.empty(4);
    let (count, dim) = (CubeCount::Static(1, 1, 1), CubeDim::new_1d(32));
    // SAFETY: `one` holds one f32, the kernel's only element.
    let arg = || unsafe { ArrayArg::<R>::from_raw_parts(one.clone(), 1) };
    let us = |s: f64| s * 1e6;
    let t = per_launch(client, n, || {
        for _ in 0..n {
            bump::launch::<R>(client, count.clone(), dim, arg());
        }
    });
    println!("raw (checked)          {:8.2} us per launch", us(t));
    let t = per_launch(client, n, || {
        for _ in 0..n {
            // SAFETY: the kernel checks its index against the length.
            unsafe { bump::launch_unchecked::<R>(client, count.clone(), dim, arg()) };
        }
    });
    println!("raw (unchecked)        {:8.2} us per launch", us(t));
    let t = per_launch(client, n, || {
        for _ in 0..n {
            let h = client.empty(4);
            // SAFETY: as above, on a fresh one-element buffer.
            bump::launch::<R>(client, count.clone(), dim, unsafe { ArrayArg::from_raw_parts(h, 1) });
        }
    });
    println!("raw+alloc (checked)    {:8.2} us per launch", us(t));

    let up = |shape: &[usize]| {
        let ty = TensorType::new(DType::F32, shape.to_vec());
        let v: Vec<f32> = (0..ty.num_elements()).map(|i| (i % 7) as f32 * 0.125).collect();
        be.upload(&HostTensor::from_f32(shape, v).expect("values")).expect("upload")
    };
    for len in [1usize, 1 << 20, 8 << 20] {
        let (a, b) = (up(&[len]), up(&[len]));
        let add = Op::Binary(BinaryOp::Add);
        let t = per_launch(client, n, || {
            let mut x = be.compute(&add, &[&a, &b]).expect("add").remove(0);
            for _ in 1..n {
                x = be.compute(&add, &[&x, &b]).expect("add").remove(0);
            }
        });
        let gbs = 12.0 * len as f64 / t / 1e9;
        println!("weft add [{len:>8}]     {:8.2} us per op ({gbs:.0} GB/s)", us(t));
    }
    for long in [false, true] {
        for len in [0usize, 512, 1 << 20] {
            let shape: Vec<usize> = if len == 0 { vec![] } else { vec![len] };
            let (a, b) = (up(&shape), up(&shape));
            let c = chain(&TensorType::new(DType::F32, shape.clone()), long);
            let t = per_launch(client, n, || {
                for _ in 0..n {
                    be.compute_fused(&c, &[&a, &b]).expect("fused chain").remove(0);
                }
            });
            println!("weft fused({}) {shape:?}: {:8.2} us per chain", c.nodes.len(), us(t));
        }
    }
    let reductions: [(&[usize], &[usize], &str); 4] = [
        (&[4096, 512], &[1], "a layer norm's rows"),
        (&[4096, 8192], &[1], "a softmax over the vocabulary"),
        (&[4096, 2048], &[0], "a bias gradient"),
        (&[512, 2048], &[0, 1], "a whole tensor (global norm)"),
    ];
    for (shape, dims, what) in reductions {
        let x = up(shape);
        let op = Op::Reduce { op: ReduceOp::Sum, dims: dims.to_vec() };
        let m = (n / 20).max(5);
        let t = per_launch(client, m, || {
            for _ in 0..m {
                be.compute(&op, &[&x]).expect("reduce");
            }
        });
        let gbs = 4.0 * shape.iter().product::<usize>() as f64 / t / 1e9;
        println!("weft reduce_sum {shape:?} over {dims:?} ({what}): {:8.2} us ({gbs:.0} GB/s)", us(t));
    }
}

fn main() {
    #[cfg(feature = "cuda")]
    run(&weft_runtime::gpu::cuda_devices::open(0, 1, 0).expect("a CUDA device").remove(0));
    #[cfg(not(feature = "cuda"))]
    {
        let (instance, adapters) = weft_runtime::gpu::wgpu_devices::adapters();
        let adapter = adapters.first().expect("a wgpu adapter");
        run(&weft_runtime::gpu::wgpu_devices::open(&instance, adapter, 1, 0).unwrap().remove(0));
    }
}

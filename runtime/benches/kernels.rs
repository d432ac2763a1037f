//! Kernel timings: the CubeCL backend on wgpu (lavapipe on a machine
//! without a GPU) against the CPU reference backend, and a host-staged
//! collective on 8 logical devices. Prints a table; no targets asserted.
//!
//! Run with `cargo bench -p weft-runtime --bench kernels` (add
//! `--profile dev` to reuse the dev build of cubecl/wgpu, whose
//! dependencies are optimised too). Each measurement is the median of
//! repeated runs after a warm-up run (which compiles the kernel); GPU runs
//! include waiting for the device, not uploads or downloads.

use std::time::{Duration, Instant};
use weft_ir::device::{Buffer, BufferId, Collective, DeviceProgram, Step};
use weft_ir::tensor::HostTensor;
use weft_ir::{BinaryOp, DType, DotDims, Op, ReduceOp, TensorType, UnaryOp};
use weft_runtime::compute_unfused;
use weft_runtime::devices::{open_devices, physical_devices, BackendKind};
use weft_runtime::fusion::plan_fusion;
use weft_runtime::{run_program, AnyBackend, Backend, CpuBackend};

/// Median seconds of `f` over repeated runs (at least 3, about 2 s).
fn time(mut f: impl FnMut()) -> f64 {
    f();
    let mut times = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(2);
    while times.len() < 3 || (Instant::now() < deadline && times.len() < 50) {
        let t = Instant::now();
        f();
        times.push(t.elapsed().as_secs_f64());
    }
    times.sort_by(|a, b| a.partial_cmp(b).unwrap());
    times[times.len() / 2]
}

fn random(ty: &TensorType, seed: u64) -> HostTensor {
    let mut s = seed | 1;
    let vals: Vec<f64> = (0..ty.num_elements())
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
        })
        .collect();
    HostTensor::from_values(ty, &vals).unwrap()
}

/// Seconds per run of `op` on `be`, inputs already on the device.
fn op_time<B: Backend>(be: &B, op: &Op, inputs: &[HostTensor]) -> f64 {
    let bufs: Vec<B::Buffer> = inputs.iter().map(|t| be.upload(t).unwrap()).collect();
    let refs: Vec<&B::Buffer> = bufs.iter().collect();
    time(|| {
        let out = be.compute(op, &refs).unwrap();
        be.sync().unwrap();
        drop(out);
    })
}

struct Row {
    name: String,
    unit: &'static str,
    /// Work per run, in the unit's numerator (bytes or flops).
    work: f64,
    inputs: Vec<HostTensor>,
    op: Op,
}

fn rows() -> Vec<Row> {
    let n = 1 << 24;
    let f32v = TensorType::new(DType::F32, vec![n]);
    let bf16v = TensorType::new(DType::BF16, vec![n]);
    let m = TensorType::new(DType::F32, vec![512, 512]);
    let sq = TensorType::new(DType::F32, vec![4096, 4096]);
    let gb = |bytes: usize| bytes as f64;
    vec![
        Row {
            name: "add f32 [16M]".into(),
            unit: "GB/s",
            work: gb(3 * 4 * n),
            inputs: vec![random(&f32v, 1), random(&f32v, 2)],
            op: Op::Binary(BinaryOp::Add),
        },
        Row {
            name: "exp f32 [16M]".into(),
            unit: "GB/s",
            work: gb(2 * 4 * n),
            inputs: vec![random(&f32v, 3)],
            op: Op::Unary(UnaryOp::Exp),
        },
        Row {
            name: "mul bf16 [16M]".into(),
            unit: "GB/s",
            work: gb(3 * 2 * n),
            inputs: vec![random(&bf16v, 4), random(&bf16v, 5)],
            op: Op::Binary(BinaryOp::Mul),
        },
        Row {
            name: "transpose f32 [4096,4096]".into(),
            unit: "GB/s",
            work: gb(2 * 4 * 4096 * 4096),
            inputs: vec![random(&sq, 6)],
            op: Op::Transpose { perm: vec![1, 0] },
        },
        Row {
            name: "reduce_sum f32 [4096,4096] dim 1".into(),
            unit: "GB/s",
            work: gb(4 * 4096 * 4096),
            inputs: vec![random(&sq, 7)],
            op: Op::Reduce { op: ReduceOp::Sum, dims: vec![1] },
        },
        Row {
            name: "dot f32 512x512x512".into(),
            unit: "GFLOP/s",
            work: 2.0 * 512f64.powi(3),
            inputs: vec![random(&m, 8), random(&m, 9)],
            op: Op::DotGeneral(DotDims::matmul()),
        },
    ]
}

/// `out = -max(x*y + x, y) * (x*y)` over `n` floats, one step per op.
fn chain_program(n: usize) -> DeviceProgram {
    let t = TensorType::new(DType::F32, vec![n]);
    let c = |op, ins: &[u32], out: u32| Step::Compute {
        op,
        inputs: ins.iter().map(|&b| BufferId(b)).collect(),
        outputs: vec![BufferId(out)],
    };
    DeviceProgram {
        name: "chain".into(),
        mesh: vec![("x".into(), 1)].into(),
        buffers: (0..7).map(|_| Buffer { ty: t.clone(), name: None }).collect(),
        inputs: vec![BufferId(0), BufferId(1)],
        outputs: vec![BufferId(6)],
        steps: vec![
            c(Op::Binary(BinaryOp::Mul), &[0, 1], 2),
            c(Op::Binary(BinaryOp::Add), &[2, 0], 3),
            c(Op::Binary(BinaryOp::Max), &[3, 1], 4),
            c(Op::Unary(UnaryOp::Neg), &[4], 5),
            c(Op::Binary(BinaryOp::Mul), &[5, 2], 6),
        ],
    }
}

/// Seconds per run of a 5-op chain, fused and node by node.
fn chain_times<B: Backend>(be: &B, n: usize) -> (f64, f64) {
    let p = chain_program(n);
    let chain = plan_fusion(&p).remove(0);
    let t = TensorType::new(DType::F32, vec![n]);
    let bufs = [be.upload(&random(&t, 11)).unwrap(), be.upload(&random(&t, 12)).unwrap()];
    let ins: Vec<&B::Buffer> = bufs.iter().collect();
    let fused = time(|| {
        drop(be.compute_fused(&chain, &ins).unwrap());
        be.sync().unwrap();
    });
    let unfused = time(|| {
        drop(compute_unfused(be, &chain, &ins).unwrap());
        be.sync().unwrap();
    });
    (fused, unfused)
}

/// An all_reduce of `n` floats over 8 logical devices.
fn all_reduce_program(n: usize) -> DeviceProgram {
    let t = TensorType::new(DType::F32, vec![n]);
    DeviceProgram {
        name: "all_reduce".into(),
        mesh: vec![("x".into(), 8)].into(),
        buffers: vec![Buffer { ty: t.clone(), name: None }, Buffer { ty: t, name: None }],
        inputs: vec![BufferId(0)],
        outputs: vec![BufferId(1)],
        steps: vec![Step::Collective {
            op: Collective::AllReduce { axes: vec!["x".into()], op: ReduceOp::Sum },
            input: BufferId(0),
            output: BufferId(1),
        }],
    }
}

fn main() {
    let wgpu = physical_devices(BackendKind::Wgpu).ok().map(|_| open_devices(BackendKind::Wgpu, 8).unwrap());
    match &wgpu {
        Some(d) => print!("{}", d.map),
        None => println!("no wgpu adapter: CPU numbers only"),
    }
    let cpu = CpuBackend::new();
    println!("\n| kernel | cpu | wgpu | unit |\n|---|---|---|---|");
    for r in rows() {
        let c = r.work / op_time(&cpu, &r.op, &r.inputs) / 1e9;
        let g = wgpu.as_ref().map(|d| r.work / op_time(&d.backends[0], &r.op, &r.inputs) / 1e9);
        let g = g.map(|g| format!("{g:.2}")).unwrap_or_else(|| "-".into());
        println!("| {} | {c:.2} | {g} | {} |", r.name, r.unit);
    }
    let n = 1 << 24;
    // Useful traffic of the chain: read x and y, write out.
    let work = (3 * 4 * n) as f64;
    let (_, cu) = chain_times(&cpu, n);
    let g = wgpu.as_ref().map(|d| chain_times(&d.backends[0], n));
    let (gf, gu) = match g {
        Some((f, u)) => (format!("{:.2}", work / f / 1e9), format!("{:.2}", work / u / 1e9)),
        None => ("-".into(), "-".into()),
    };
    println!("| 5-op f32 chain [16M], fused | - | {gf} | GB/s |");
    println!("| 5-op f32 chain [16M], op by op | {:.2} | {gu} | GB/s |", work / cu / 1e9);
    let n = 1 << 20;
    let p = all_reduce_program(n);
    let inputs = || (0..8).map(|d| vec![random(&TensorType::new(DType::F32, vec![n]), d + 10)]).collect::<Vec<_>>();
    let cpus = vec![CpuBackend::new(); 8];
    let c = time(|| drop(run_program(&p, &cpus, inputs()).unwrap()));
    let g = wgpu.as_ref().map(|d| {
        let devs: &[AnyBackend] = &d.backends;
        time(|| drop(run_program(&p, devs, inputs()).unwrap()))
    });
    let g = g.map(|g| format!("{:.1}", g * 1e3)).unwrap_or_else(|| "-".into());
    println!("| all_reduce 1M f32 over 8 devices (whole run, incl. upload/download) | {:.1} | {g} | ms |", c * 1e3);
}

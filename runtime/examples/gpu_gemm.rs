//! GEMM rates on a GPU: weft's `dot_general` on the CubeCL backend, and
//! (with `probe`) every cubek-matmul routine this build can launch, so the
//! rules in `gpu/dot.rs` that pick a routine per device and shape can be
//! re-measured on a new device.
//!
//! ```text
//! cargo run --release --features cuda -p weft-runtime --example gpu_gemm            # weft's dot
//! cargo run --release --features cuda -p weft-runtime --example gpu_gemm -- probe   # every routine
//! ```
//!
//! Without the `cuda` feature it runs on the first wgpu adapter (lavapipe
//! here), at small sizes only (`SHAPES=64x64x64`). Shapes are `MxKxN`
//! products from `SHAPES` (default: 1024³, 4096³ and the MLP benchmark's
//! `256x512x2048` and its two transposes). Each rate is the median of repeated
//! runs after a warm-up (which compiles the kernel); correctness is the
//! largest relative difference from the `f32` unit routine's product of
//! the same (exactly representable) inputs. With the `cuda` feature the
//! products run on cuBLAS (where it loads) and then on cubek's routines,
//! side by side, with how far apart the two products are.

use cubecl::prelude::*;
use cubecl::zspace::{Shape, Strides};
use cubek::matmul::definition::{MatmulElems, MatmulGlobalElems};
use cubek::matmul::launch::{launch_ref, Strategy};
use cubek::std::InputBinding;
use half::bf16;
use std::time::Instant;
use weft_ir::tensor::HostTensor;
use weft_ir::{DType, DotDims, Op, TensorType};
use weft_runtime::{Backend, CubeclBackend};

/// The `MxKxN` products of `SHAPES`; a trailing `t` marks a product whose
/// left operand is stored transposed (`[K, M]`, as a weight gradient's
/// `x^T @ dy`): weft's dot reads it in place, the probe skips it.
fn shapes() -> Vec<([usize; 3], bool)> {
    std::env::var("SHAPES")
        .unwrap_or_else(|_| "1024x1024x1024,4096x4096x4096,256x512x2048,256x2048x512,2048x256x512".into())
        .split(',')
        .map(|s| {
            let s = s.trim();
            let t = s.ends_with('t');
            let v: Vec<usize> =
                s.trim_end_matches('t').split('x').map(|d| d.parse().expect("SHAPES: MxKxN[t],...")).collect();
            ([v[0], v[1], v[2]], t)
        })
        .collect()
}

/// Deterministic values in [-1, 1) that are exactly representable in bf16.
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            bf16::from_f32(((s >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) as f32).to_f32()
        })
        .collect()
}

/// Median seconds of `f` (which waits for the device) over 3..20 runs.
fn median(mut f: impl FnMut()) -> f64 {
    f();
    let mut t = Vec::new();
    let start = Instant::now();
    while t.len() < 3 || (t.len() < 20 && start.elapsed().as_secs_f64() < 0.3) {
        let s = Instant::now();
        f();
        t.push(s.elapsed().as_secs_f64());
    }
    t.sort_by(|a, b| a.partial_cmp(b).unwrap());
    t[t.len() / 2]
}

fn binding<R: Runtime>(h: &cubecl::server::Handle, shape: [usize; 2]) -> TensorBinding<R> {
    // SAFETY: `h` holds a dense row-major matrix of this shape.
    unsafe { TensorBinding::from_raw_parts(h.clone(), Strides::from(vec![shape[1], 1]), Shape::from(shape.to_vec())) }
}

fn strategies() -> Vec<Strategy> {
    use cubek::matmul::routines::double_unit::DoubleUnitSelectionArgs;
    use cubek::matmul::routines::simple_unit::SimpleUnitSelectionArgs;
    use cubek::matmul::routines::{BlueprintStrategy::Inferred, TileSizeSelection::MinTileSize};
    use Strategy::*;
    vec![
        SimpleUnit(Default::default()),
        SimpleUnit(Inferred(SimpleUnitSelectionArgs { tile_size: MinTileSize })),
        DoubleUnit(Default::default()),
        DoubleUnit(Inferred(DoubleUnitSelectionArgs { tile_size: MinTileSize })),
        SimpleCyclicCmma(Default::default()),
        SimpleCyclicMma(Default::default()),
        DoubleCyclicCmma(Default::default()),
        DoubleCyclicMma(Default::default()),
        DoubleTilewiseMma(Default::default()),
        DoubleHybridMma(Default::default()),
        SimpleTmaMma(Default::default()),
        DoubleTmaMma(Default::default()),
        SpecializedCyclicMma(Default::default()),
        SpecializedTmaMma(Default::default()),
        OrderedDoubleCmma(Default::default()),
        OrderedDoubleMma(Default::default()),
        Auto,
    ]
}

/// Runs every routine on every shape, for f32 and bf16 inputs (f32 out).
fn probe<R: Runtime>(client: &ComputeClient<R>) {
    let bf = bf16::as_type_native_unchecked().storage_type();
    let f = f32::as_type_native_unchecked().storage_type();
    for ([m, k, n], _) in shapes().into_iter().filter(|(_, t)| !t) {
        let (a, b) = (values(m * k, 1), values(k * n, 2));
        let a32 = client.create_from_slice(f32::as_bytes(&a));
        let b32 = client.create_from_slice(f32::as_bytes(&b));
        let a16v: Vec<bf16> = a.iter().map(|&x| bf16::from_f32(x)).collect();
        let b16v: Vec<bf16> = b.iter().map(|&x| bf16::from_f32(x)).collect();
        let a16 = client.create_from_slice(bf16::as_bytes(&a16v));
        let b16 = client.create_from_slice(bf16::as_bytes(&b16v));
        let out = client.empty(m * n * 4);
        let reference = client.empty(m * n * 4);
        let mut el = MatmulElems::from_single_dtype(f32::as_type_native_unchecked());
        let unit = Strategy::SimpleUnit(Default::default());
        let lhs = InputBinding::Normal(binding::<R>(&a32, [m, k]), f);
        let rhs = InputBinding::Normal(binding::<R>(&b32, [k, n]), f);
        launch_ref(&unit, client, lhs, rhs, binding::<R>(&reference, [m, n]), &mut el).expect("the unit routine");
        let want = f32::from_bytes(&client.read_one(reference.clone()).unwrap()).to_vec();
        let flops = 2.0 * (m * k * n) as f64;
        // f32 inputs, bf16 inputs, and f32-stored bf16 values staged as bf16
        // (what weft's `Routine::TensorCores` does).
        for (input, staged, (ah, bh)) in [(f, f, (&a32, &b32)), (bf, bf, (&a16, &b16)), (f, bf, (&a32, &b32))] {
            for s in strategies() {
                if input != staged && !format!("{s}").contains("cyclic_mma") && !format!("{s}").contains("tilewise_mma")
                {
                    continue;
                }
                let name = format!("{s}");
                let mut el = MatmulElems::from_globals(&MatmulGlobalElems { lhs: input, rhs: input, out: f });
                el.lhs_stage = staged;
                el.rhs_stage = staged;
                el.lhs_register = staged;
                el.rhs_register = staged;
                let mut run = || {
                    let lhs = InputBinding::Normal(binding::<R>(ah, [m, k]), input);
                    let rhs = InputBinding::Normal(binding::<R>(bh, [k, n]), input);
                    launch_ref(&s, client, lhs, rhs, binding::<R>(&out, [m, n]), &mut el)
                };
                if let Err(e) = run() {
                    let e = format!("{e:?}");
                    println!("{m}x{k}x{n} {:8} {name:40} declined: {}", dt(input, staged, bf), &e[..e.len().min(90)]);
                    continue;
                }
                let got = f32::from_bytes(&client.read_one(out.clone()).unwrap()).to_vec();
                let err = rel_err(&got, &want);
                let secs = median(|| {
                    run().unwrap();
                    cubecl::future::block_on(client.sync()).unwrap();
                });
                println!(
                    "{m}x{k}x{n} {:8} {name:40} {:8.2} TFLOP/s  {:9.3} ms  rel err {err:.1e}",
                    dt(input, staged, bf),
                    flops / secs / 1e12,
                    secs * 1e3
                );
            }
        }
    }
}

fn dt(input: cubecl::ir::StorageType, staged: cubecl::ir::StorageType, bf: cubecl::ir::StorageType) -> &'static str {
    match (input == bf, staged == bf) {
        (true, _) => "bf16",
        (false, true) => "f32>bf16",
        _ => "f32",
    }
}

fn rel_err(got: &[f32], want: &[f32]) -> f64 {
    let scale = want.iter().fold(0f64, |m, &w| m.max(w.abs() as f64)).max(1e-30);
    got.iter().zip(want).fold(0f64, |m, (&g, &w)| m.max((g as f64 - w as f64).abs())) / scale
}

/// weft's own `dot_general` (through the [`Backend`] trait, as the
/// executor calls it), for f32 and bf16 operands, on `route` (the
/// library's name or cubek); the products, shape by shape (f32 then bf16).
fn weft_dot<R: Runtime>(be: &CubeclBackend<R>, route: &str) -> Vec<Vec<f32>> {
    let mut all = Vec::new();
    for ([m, k, n], t) in shapes() {
        let dims =
            DotDims { lhs_batch: vec![], rhs_batch: vec![], lhs_contract: vec![t as usize ^ 1], rhs_contract: vec![0] };
        let lhs_shape = if t { vec![k, m] } else { vec![m, k] };
        let mut products = Vec::new();
        for dtype in [DType::F32, DType::BF16] {
            let a = HostTensor::from_values(
                &TensorType::new(dtype, lhs_shape.clone()),
                &values(m * k, 1).iter().map(|&x| x as f64).collect::<Vec<_>>(),
            )
            .unwrap();
            let b = HostTensor::from_values(
                &TensorType::new(dtype, vec![k, n]),
                &values(k * n, 2).iter().map(|&x| x as f64).collect::<Vec<_>>(),
            )
            .unwrap();
            let (a, b) = (be.upload(&a).unwrap(), be.upload(&b).unwrap());
            let op = Op::DotGeneral(dims.clone());
            let secs = median(|| {
                let out = be.compute(&op, &[&a, &b]).unwrap();
                be.sync().unwrap();
                drop(out);
            });
            let flops = 2.0 * (m * k * n) as f64;
            let product = be.download(&be.compute(&op, &[&a, &b]).unwrap().remove(0)).unwrap();
            let values: Vec<f32> = product.to_f64_vec().iter().map(|&x| x as f32).collect();
            // The bf16 product of the same (bf16) values against the f32
            // one: a difference of bf16 rounding at most (2^-8 relative).
            let err = products.first().map(|f: &Vec<f32>| rel_err(&values, f)).unwrap_or(0.0);
            products.push(values);
            println!(
                "weft dot [{route}] {m}x{k}x{n}{} {:4} {:8.2} TFLOP/s  {:9.3} ms  rel diff from f32 {err:.1e}",
                if t { "t" } else { "" },
                dtype.to_string(),
                flops / secs / 1e12,
                secs * 1e3
            );
        }
        all.extend(products);
    }
    for (d, [b, m, n, k], routine) in be.matmul_routines() {
        println!("weft routine [{route}] {d} b={b} m={m} n={n} k={k}: {routine}");
    }
    all
}

fn main() {
    let probe_all = std::env::args().any(|a| a == "probe");
    #[cfg(feature = "cuda")]
    {
        use cubecl::cuda::{CudaDevice, CudaRuntime};
        let mut be = weft_runtime::gpu::cuda_devices::open(0, 1, 0).expect("a CUDA device").remove(0);
        if probe_all {
            probe::<CudaRuntime>(&CudaRuntime::client(&CudaDevice::new(0)));
        }
        // The attached library (cuBLAS), then cubek's routines on the same
        // values, and how far apart their products are.
        if let Some(lib) = be.library_gemm() {
            let with_lib = weft_dot(&be, lib);
            be.set_library_gemm(None);
            let with_cubek = weft_dot(&be, "cubek");
            for (i, (a, b)) in with_lib.iter().zip(&with_cubek).enumerate() {
                let dtype = if i % 2 == 0 { "f32" } else { "bf16" };
                println!("product {} ({dtype}): {lib} vs cubek rel diff {:.1e}", i / 2, rel_err(a, b));
            }
        } else {
            weft_dot(&be, "cubek");
        }
    }
    #[cfg(not(feature = "cuda"))]
    {
        let (instance, adapters) = weft_runtime::gpu::wgpu_devices::adapters();
        let adapter = adapters.first().expect("a wgpu adapter");
        let be = weft_runtime::gpu::wgpu_devices::open(&instance, adapter, 1, 0).unwrap().remove(0);
        if probe_all {
            probe(be.client());
        }
        weft_dot(&be, "cubek");
    }
}

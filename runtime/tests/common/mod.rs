//! Shared test helpers: the Vulkan device (or a loud skip), seeded random
//! tensors, and comparison of a backend against the CPU reference.
#![allow(dead_code)]

use cubecl::wgpu::WgpuRuntime;
use weft_ir::interp::eval_op;
use weft_ir::tensor::{check_close, HostTensor};
use weft_ir::{DType, Op, TensorType};
use weft_runtime::devices::{open_devices, physical_devices, BackendKind};
use weft_runtime::gpu::wgpu_devices;
use weft_runtime::{AnyBackend, Backend, CubeclBackend};

const SKIP: &str = "SKIPPED: no Vulkan device (install mesa-vulkan-drivers)";

/// Whether a wgpu adapter exists; without one, prints the skip message,
/// or panics with it when `CI=true` (CI must really run the GPU tests).
fn have_wgpu() -> bool {
    if physical_devices(BackendKind::Wgpu).is_ok() {
        return true;
    }
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("{SKIP}");
    }
    println!("{SKIP}");
    false
}

/// One logical wgpu device, or `None` (after printing why) without one.
pub fn wgpu_or_skip() -> Option<CubeclBackend<WgpuRuntime>> {
    if !have_wgpu() {
        return None;
    }
    let (instance, adapters) = wgpu_devices::adapters();
    Some(wgpu_devices::open(&instance, &adapters[0], 1, 0).expect("open a wgpu device").remove(0))
}

/// `n` logical wgpu devices, or `None` without an adapter.
pub fn wgpu_devices_or_skip(n: usize) -> Option<Vec<AnyBackend>> {
    if !have_wgpu() {
        return None;
    }
    let devs = open_devices(BackendKind::Wgpu, n).expect("open wgpu devices");
    println!("{}", devs.map);
    Some(devs.backends)
}

/// A small deterministic generator (xorshift64*).
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub fn next_u32(&mut self) -> u32 {
        (self.next_u64() >> 32) as u32
    }

    /// Uniform in `[lo, hi)`.
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// A random tensor: floats uniform in `[lo, hi)` (rounded to the dtype),
/// integers uniform in `[lo, hi)`, bools fair coins.
pub fn random(rng: &mut Rng, ty: &TensorType, lo: f64, hi: f64) -> HostTensor {
    let n = ty.num_elements();
    let vals: Vec<f64> = (0..n)
        .map(|_| match ty.dtype {
            DType::Bool => (rng.next_u32() & 1) as f64,
            d if d.is_integer() => rng.uniform(lo, hi).floor(),
            _ => rng.uniform(lo, hi),
        })
        .collect();
    HostTensor::from_values(ty, &vals).unwrap()
}

/// Random `u32` bits over the whole range (for bit-exact tests).
pub fn random_bits(rng: &mut Rng, shape: &[usize]) -> HostTensor {
    let n: usize = shape.iter().product();
    HostTensor::from_u32(shape, (0..n).map(|_| rng.next_u32()).collect()).unwrap()
}

pub fn ty(d: DType, shape: &[usize]) -> TensorType {
    TensorType::new(d, shape.to_vec())
}

/// Default relative tolerance of a dtype against the CPU.
pub fn rtol(d: DType) -> f64 {
    match d {
        DType::F32 => 1e-5,
        DType::F64 => 1e-12,
        DType::BF16 => 1e-2,
        DType::F16 => 1e-3,
        _ => 0.0,
    }
}

/// Runs `op` on the CPU reference and on `be`, and checks the results
/// agree: bit for bit when `exact`, else within `rtol` relative plus
/// `atol` absolute (NaN matching NaN).
pub fn check_op<B: Backend>(be: &B, op: &Op, inputs: &[HostTensor], exact: bool, rtol: f64, atol: f64) {
    let refs: Vec<&HostTensor> = inputs.iter().collect();
    let want = eval_op(op, &refs).unwrap_or_else(|e| panic!("CPU rejects {op:?}: {e}")).remove(0);
    let bufs: Vec<B::Buffer> = inputs.iter().map(|t| be.upload(t).unwrap()).collect();
    let brefs: Vec<&B::Buffer> = bufs.iter().collect();
    let out = be.compute(op, &brefs).unwrap_or_else(|e| panic!("{} rejects {op:?}: {e}", be.name())).remove(0);
    let got = be.download(&out).unwrap();
    let shapes: Vec<String> = inputs.iter().map(|t| t.ty().to_string()).collect();
    assert_eq!(got.ty(), want.ty(), "{op:?} on {shapes:?}: result types differ");
    if exact || !want.dtype().is_float() {
        if !got.bitwise_eq(&want) {
            let bad = check_close(&got, &want, 0.0, 0.0)
                .err()
                .unwrap_or_else(|| "signs of zero or NaN payloads differ".into());
            panic!("{op:?} on {shapes:?} is not bit-exact: {bad}");
        }
    } else if let Err(m) = check_close(&got, &want, rtol, atol) {
        panic!("{op:?} on {shapes:?}: {m}");
    }
}

//! Fused elementwise chains give the results of unfused execution, never
//! allocate their intermediates, and fall back node by node where the
//! fused kernel does not apply (integers, a `bool` result).

use crate::common::{wgpu_devices_or_skip, wgpu_or_skip, Rng};
use weft_ir::device::{Buffer, BufferId, DeviceProgram, Step};
use weft_ir::tensor::{check_close, HostTensor};
use weft_ir::{BinaryOp, CompareOp, DType, Op, TensorType, UnaryOp};
use weft_runtime::{run_program_stats, Backend, CpuBackend, RunOutput};

/// `out = f(x, y)` as a chain of single-op steps with frees between, in
/// dtype `d`: t = x*y; u = t + x; v = max(u, y); w = neg(v); out = w * t.
fn chain(d: DType, n: usize, with_select: bool) -> DeviceProgram {
    let t = TensorType::new(d, vec![n]);
    let buffers = (0..8)
        .map(|i| Buffer { ty: if i == 7 { TensorType::new(DType::Bool, vec![n]) } else { t.clone() }, name: None })
        .collect();
    let c = |op, ins: &[u32], out: u32| Step::Compute {
        op,
        inputs: ins.iter().map(|&b| BufferId(b)).collect(),
        outputs: vec![BufferId(out)],
    };
    let mut steps = vec![
        c(Op::Binary(BinaryOp::Mul), &[0, 1], 2),
        c(Op::Binary(BinaryOp::Add), &[2, 0], 3),
        Step::Free(vec![BufferId(0)]),
        c(Op::Binary(BinaryOp::Max), &[3, 1], 4),
        Step::Free(vec![BufferId(3)]),
        c(Op::Unary(UnaryOp::Neg), &[4], 5),
        Step::Free(vec![BufferId(4)]),
        c(Op::Binary(BinaryOp::Mul), &[5, 2], 6),
        Step::Free(vec![BufferId(1), BufferId(2), BufferId(5)]),
    ];
    if with_select {
        // A comparison and a select in the middle: not a float-only chain.
        steps.insert(5, c(Op::Compare(CompareOp::Gt), &[4, 4], 7));
        steps.insert(6, c(Op::Select, &[7, 4, 4], 5));
        steps.remove(7);
        steps.push(Step::Free(vec![BufferId(7)]));
    }
    DeviceProgram {
        name: "chain".into(),
        mesh: vec![("x".into(), 1)].into(),
        buffers,
        inputs: vec![BufferId(0), BufferId(1)],
        outputs: vec![BufferId(6)],
        steps,
    }
}

fn run<B: Backend>(b: B, p: &DeviceProgram, x: &HostTensor, y: &HostTensor) -> RunOutput {
    run_program_stats(p, &[b], vec![vec![x.clone(), y.clone()]]).unwrap()
}

#[test]
fn fused_chains_match_the_cpu_bit_for_bit() {
    let Some(be) = wgpu_or_skip() else { return };
    let mut rng = Rng::new(30);
    let n = 70_001;
    for d in [DType::F32, DType::BF16, DType::F16] {
        let p = chain(d, n, false);
        let x = crate::common::random(&mut rng, &TensorType::new(d, vec![n]), -4.0, 4.0);
        let y = crate::common::random(&mut rng, &TensorType::new(d, vec![n]), -4.0, 4.0);
        let cpu = run(CpuBackend::new(), &p, &x, &y);
        let gpu = run(be_clone(&be), &p, &x, &y);
        assert_eq!(cpu.fused_chains, 0);
        assert_eq!(gpu.fused_chains, 1);
        assert!(
            gpu.outputs[0][0].bitwise_eq(&cpu.outputs[0][0]),
            "{d}: {:?}",
            check_close(&gpu.outputs[0][0], &cpu.outputs[0][0], 0.0, 0.0)
        );
        // Intermediates t, u, v, w never exist on the GPU.
        let elem = TensorType::new(d, vec![n]).size_bytes();
        assert_eq!(gpu.stats[0].peak_live_bytes, 3 * elem, "x, y and out");
        assert!(cpu.stats[0].peak_live_bytes >= 4 * elem);
    }
}

/// A wgpu backend on the same client (one logical device, fusion on).
fn be_clone(
    be: &weft_runtime::CubeclBackend<cubecl::wgpu::WgpuRuntime>,
) -> weft_runtime::CubeclBackend<cubecl::wgpu::WgpuRuntime> {
    weft_runtime::CubeclBackend::new(be.client().clone(), "wgpu (test)")
}

#[test]
fn chains_with_comparisons_and_selects_fuse() {
    let Some(be) = wgpu_or_skip() else { return };
    let mut rng = Rng::new(31);
    let p = chain(DType::F32, 1000, true);
    let t = TensorType::new(DType::F32, vec![1000]);
    let x = crate::common::random(&mut rng, &t, -4.0, 4.0);
    let y = crate::common::random(&mut rng, &t, -4.0, 4.0);
    let cpu = run(CpuBackend::new(), &p, &x, &y);
    let gpu = run(be_clone(&be), &p, &x, &y);
    let unfused = run(be_clone(&be).with_fusion(false), &p, &x, &y);
    assert!(gpu.fused_chains >= 1);
    assert_eq!(unfused.fused_chains, 0);
    assert!(gpu.outputs[0][0].bitwise_eq(&cpu.outputs[0][0]));
    assert!(unfused.outputs[0][0].bitwise_eq(&cpu.outputs[0][0]));
}

/// Transcendentals in a chain agree with the CPU to rounding, on 8 logical
/// devices through `AnyBackend`.
#[test]
fn transcendental_chains_on_logical_devices() {
    let Some(devs) = wgpu_devices_or_skip(2) else { return };
    let mut p = chain(DType::F32, 513, false);
    p.mesh = vec![("x".into(), 2)].into();
    p.steps[5] = Step::Compute { op: Op::Unary(UnaryOp::Tanh), inputs: vec![BufferId(4)], outputs: vec![BufferId(5)] };
    let t = TensorType::new(DType::F32, vec![513]);
    let mut rng = Rng::new(32);
    let x = crate::common::random(&mut rng, &t, -2.0, 2.0);
    let y = crate::common::random(&mut rng, &t, -2.0, 2.0);
    let inputs = vec![vec![x.clone(), y.clone()], vec![y, x]];
    let gpu = run_program_stats(&p, &devs, inputs.clone()).unwrap();
    let cpu = run_program_stats(&p, &[CpuBackend::new(), CpuBackend::new()], inputs).unwrap();
    assert_eq!(gpu.fused_chains, 1);
    for d in 0..2 {
        check_close(&gpu.outputs[d][0], &cpu.outputs[d][0], 1e-5, 1e-6).unwrap();
    }
}

/// `out = (x * 0.1 + broadcast(s)) max -inf - 3.3`, in dtype `d`: two
/// splat constants (one not representable, so rounded to `d`), a scalar
/// broadcast of an input and an infinite constant, all in one chain.
fn splat_chain(d: DType, n: usize) -> DeviceProgram {
    format!(
        "device_program @splats mesh [x=1] {{
  input %0 : {d}[{n}]
  input %1 : {d}[]
  %2 = constant 0.1 : {d}[{n}]
  %3 = mul %0, %2 : {d}[{n}]
  %4 = broadcast_in_dim %1 {{dims = []}} : {d}[{n}]
  %5 = add %3, %4 : {d}[{n}]
  %6 = constant -inf : {d}[{n}]
  %7 = max %5, %6 : {d}[{n}]
  %8 = constant 3.3 : {d}[{n}]
  %9 = sub %7, %8 : {d}[{n}]
  return %9
}}
"
    )
    .parse()
    .unwrap()
}

/// Splats (constants and scalar broadcasts) join the chains that read them
/// on the GPU, still bit for bit the CPU; the rank-0 constants are computed
/// once per device and reused by the next run.
#[test]
fn splats_fuse_and_constants_are_computed_once() {
    let Some(be) = wgpu_or_skip() else { return };
    let mut rng = Rng::new(32);
    let n = 5_003;
    for d in [DType::F32, DType::BF16] {
        let p = splat_chain(d, n);
        let x = crate::common::random(&mut rng, &TensorType::new(d, vec![n]), -4.0, 4.0);
        let s = crate::common::random(&mut rng, &TensorType::new(d, vec![]), -4.0, 4.0);
        let cpu = run(CpuBackend::new(), &p, &x, &s);
        let gpu_be = be_clone(&be);
        let program_inputs = vec![vec![x.clone(), s.clone()]];
        let first = run_program_stats(&p, std::slice::from_ref(&gpu_be), program_inputs.clone()).unwrap();
        assert_eq!(first.fused_chains, 1, "{d}: the whole program is one chain");
        assert_eq!(gpu_be.cached_constants().0, 3, "{d}: three rank-0 constants kept");
        let again = run_program_stats(&p, std::slice::from_ref(&gpu_be), program_inputs).unwrap();
        assert_eq!(gpu_be.cached_constants().0, 3, "{d}: nothing new to keep");
        let unfused = run(be_clone(&be).with_fusion(false), &p, &x, &s);
        for (what, got) in [("fused", &first), ("fused, cached constants", &again), ("unfused", &unfused)] {
            assert!(
                got.outputs[0][0].bitwise_eq(&cpu.outputs[0][0]),
                "{d} {what}: {:?}",
                check_close(&got.outputs[0][0], &cpu.outputs[0][0], 0.0, 0.0)
            );
        }
        // Unfused, the full-size constants are kept and handed out again.
        let unfused_be = be_clone(&be).with_fusion(false);
        let a = run_program_stats(&p, std::slice::from_ref(&unfused_be), vec![vec![x.clone(), s.clone()]]).unwrap();
        assert_eq!(unfused_be.cached_constants(), (3, 3 * n * 4), "{d}: three constants of {n} f32-stored elements");
        assert!(a.outputs[0][0].bitwise_eq(&cpu.outputs[0][0]));
    }
}

/// `out = (x - s) * b + c - 0.5` with `s: [4,6]`, `b: [5]` and `c: [4,1]`
/// each spread over `x: [4,6,5]` by a `broadcast_in_dim` (the last through
/// a unit dimension): one chain on the GPU, bit for bit the CPU.
#[test]
fn broadcasts_fuse_into_chains() {
    let Some(be) = wgpu_or_skip() else { return };
    let mut rng = Rng::new(33);
    for d in [DType::F32, DType::BF16] {
        let p: DeviceProgram = format!(
            "device_program @broadcasts mesh [x=1] {{
  input %0 : {d}[4,6,5]
  input %1 : {d}[4,6]
  input %2 : {d}[5]
  input %3 : {d}[4,1]
  %4 = broadcast_in_dim %1 {{dims = [0, 1]}} : {d}[4,6,5]
  %5 = sub %0, %4 : {d}[4,6,5]
  %6 = broadcast_in_dim %2 {{dims = [2]}} : {d}[4,6,5]
  %7 = mul %5, %6 : {d}[4,6,5]
  %8 = broadcast_in_dim %3 {{dims = [0, 1]}} : {d}[4,6,5]
  %9 = add %7, %8 : {d}[4,6,5]
  %10 = constant 0.5 : {d}[4,6,5]
  %11 = sub %9, %10 : {d}[4,6,5]
  return %11
}}
"
        )
        .parse()
        .unwrap();
        let ins: Vec<HostTensor> = [vec![4, 6, 5], vec![4, 6], vec![5], vec![4, 1]]
            .into_iter()
            .map(|s| crate::common::random(&mut rng, &TensorType::new(d, s), -4.0, 4.0))
            .collect();
        one_chain_bitwise(&be, &p, ins, d);
    }
}

/// Runs `p` on the CPU and on the GPU: one fused chain there, bit for bit
/// the CPU's result.
fn one_chain_bitwise(
    be: &weft_runtime::CubeclBackend<cubecl::wgpu::WgpuRuntime>,
    p: &DeviceProgram,
    ins: Vec<HostTensor>,
    d: DType,
) {
    let cpu = run_program_stats(p, &[CpuBackend::new()], vec![ins.clone()]).unwrap();
    let gpu = run_program_stats(p, &[be_clone(be)], vec![ins]).unwrap();
    assert_eq!(gpu.fused_chains, 1, "{d}: the whole program is one chain");
    assert!(
        gpu.outputs[0][0].bitwise_eq(&cpu.outputs[0][0]),
        "{d}: {:?}",
        check_close(&gpu.outputs[0][0], &cpu.outputs[0][0], 0.0, 0.0)
    );
}

/// Comparisons, selects, `not`, `is_finite`, conversions from and to
/// `bool` and a broadcast boolean mask, with NaN and infinities among the
/// values: one chain on the GPU, bit for bit the CPU. A chain whose result
/// is a `bool` runs node by node, with the same bits.
#[test]
fn mixed_boolean_chains_fuse() {
    let Some(be) = wgpu_or_skip() else { return };
    let mut rng = Rng::new(34);
    for d in [DType::F32, DType::BF16] {
        let p: DeviceProgram = format!(
            "device_program @mixed mesh [x=1] {{
  input %0 : {d}[4,6,5]
  input %1 : {d}[4,6,5]
  input %2 : bool[6,5]
  %3 = constant 0.0 : {d}[4,6,5]
  %4 = gt %0, %3 : bool[4,6,5]
  %5 = select %4, %1, %3 : {d}[4,6,5]
  %6 = broadcast_in_dim %2 {{dims = [1, 2]}} : bool[4,6,5]
  %7 = not %6 : bool[4,6,5]
  %8 = constant -inf : {d}[4,6,5]
  %9 = select %7, %8, %5 : {d}[4,6,5]
  %10 = is_finite %9 : bool[4,6,5]
  %11 = convert %10 : {d}[4,6,5]
  %12 = add %11, %9 : {d}[4,6,5]
  %13 = convert %0 : bool[4,6,5]
  %14 = convert %13 : {d}[4,6,5]
  %15 = mul %12, %14 : {d}[4,6,5]
  return %15
}}
"
        )
        .parse()
        .unwrap();
        let mut x = crate::common::random(&mut rng, &TensorType::new(d, vec![4, 6, 5]), -2.0, 2.0);
        let mut v = x.to_f64_vec();
        (v[0], v[1], v[2], v[3]) = (f64::NAN, f64::INFINITY, 0.0, -0.0);
        x = HostTensor::from_values(&x.ty(), &v).unwrap();
        let g = crate::common::random(&mut rng, &TensorType::new(d, vec![4, 6, 5]), -2.0, 2.0);
        let mask = HostTensor::from_bool(&[6, 5], (0..30).map(|i| i % 3 != 0).collect()).unwrap();
        let ins = vec![x, g, mask];
        one_chain_bitwise(&be, &p, ins.clone(), d);
        // Ending at the `bool` (%13 returned): node by node, same bits.
        let mut q = p.clone();
        q.steps.truncate(q.steps.iter().position(|s| format!("{s:?}").contains("BufferId(14)")).unwrap());
        q.outputs = vec![weft_ir::device::BufferId(13)];
        let cpu = run_program_stats(&q, &[CpuBackend::new()], vec![ins.clone()]).unwrap();
        let gpu = run_program_stats(&q, &[be_clone(&be)], vec![ins]).unwrap();
        assert!(gpu.outputs[0][0].bitwise_eq(&cpu.outputs[0][0]), "{d}: the bool chain");
    }
}

/// Values of a chain that later steps read (here a reduction) or that the
/// program returns no longer split it: the whole elementwise run is one
/// launch writing its result and those kept values, each bit for bit the
/// CPU's, and the kept values are freed like any other buffer.
#[test]
fn chains_keep_values_read_after_them() {
    let Some(be) = wgpu_or_skip() else { return };
    let mut rng = Rng::new(35);
    for d in [DType::F32, DType::BF16] {
        let p: DeviceProgram = format!(
            "device_program @kept mesh [x=1] {{
  input %0 : {d}[64,33]
  input %1 : {d}[64,33]
  %2 = mul %0, %1 : {d}[64,33]
  %3 = add %2, %0 : {d}[64,33]
  %4 = neg %3 : {d}[64,33]
  %5 = mul %4, %2 : {d}[64,33]
  %6 = reduce_sum %3 {{dims = [1]}} : {d}[64]
  return %5, %6, %2
}}
"
        )
        .parse()
        .unwrap();
        let ins: Vec<HostTensor> =
            (0..2).map(|_| crate::common::random(&mut rng, &TensorType::new(d, vec![64, 33]), -4.0, 4.0)).collect();
        let cpu = run_program_stats(&p, &[CpuBackend::new()], vec![ins.clone()]).unwrap();
        let gpu = run_program_stats(&p, &[be_clone(&be)], vec![ins]).unwrap();
        assert_eq!(gpu.fused_chains, 1, "{d}: steps 0..=3 are one chain");
        for (k, (g, c)) in gpu.outputs[0].iter().zip(&cpu.outputs[0]).enumerate() {
            // The row sums add in the GPU's order: to rounding.
            let tol = if k == 1 { 1e-2 } else { 0.0 };
            check_close(g, c, tol, tol).unwrap_or_else(|e| panic!("{d}: output {k}: {e}"));
            if k != 1 {
                assert!(g.bitwise_eq(c), "{d}: output {k}");
            }
        }
    }
}

/// A chain whose value only a reduction reads ends in that reduction: one
/// launch that computes each element where the reduction reads it, over
/// the innermost dimensions (a layer norm's row sums), the leading ones
/// (a bias gradient) or all (a squared norm); over middle dimensions the
/// chain's value is stored and reduced. Each equals the CPU to rounding.
#[test]
fn chains_end_in_their_reductions() {
    let Some(be) = wgpu_or_skip() else { return };
    let mut rng = Rng::new(36);
    for d in [DType::F32, DType::BF16] {
        for dims in ["[2]", "[0, 1]", "[0, 1, 2]", "[1]"] {
            let kept: Vec<usize> = match dims {
                "[2]" => vec![6, 20],
                "[0, 1]" => vec![45],
                "[0, 1, 2]" => vec![],
                _ => vec![6, 45],
            };
            let out = TensorType::new(d, kept.clone());
            let p: DeviceProgram = format!(
                "device_program @norm mesh [x=1] {{
  input %0 : {d}[6,20,45]
  input %1 : {d}[45]
  %2 = broadcast_in_dim %1 {{dims = [2]}} : {d}[6,20,45]
  %3 = sub %0, %2 : {d}[6,20,45]
  %4 = constant 0.5 : {d}[6,20,45]
  %5 = mul %3, %4 : {d}[6,20,45]
  %6 = mul %5, %3 : {d}[6,20,45]
  %7 = reduce_sum %6 {{dims = {dims}}} : {out}
  return %7
}}
"
            )
            .parse()
            .unwrap();
            let ins = vec![
                crate::common::random(&mut rng, &TensorType::new(d, vec![6, 20, 45]), -2.0, 2.0),
                crate::common::random(&mut rng, &TensorType::new(d, vec![45]), -2.0, 2.0),
            ];
            let cpu = run_program_stats(&p, &[CpuBackend::new()], vec![ins.clone()]).unwrap();
            let gpu = run_program_stats(&p, &[be_clone(&be)], vec![ins.clone()]).unwrap();
            let unfused = run_program_stats(&p, &[be_clone(&be).with_fusion(false)], vec![ins]).unwrap();
            assert_eq!(gpu.fused_chains, 1, "{d} over {dims}");
            let tol = if d == DType::BF16 { 2e-2 } else { 1e-4 };
            check_close(&gpu.outputs[0][0], &cpu.outputs[0][0], tol, tol)
                .unwrap_or_else(|e| panic!("{d} over {dims}: {e}"));
            // Fused or not, the GPU adds in the same order.
            assert!(gpu.outputs[0][0].bitwise_eq(&unfused.outputs[0][0]), "{d} over {dims}");
            // The squares are never stored when the reduction reads them in place.
            let elem = TensorType::new(d, vec![6, 20, 45]).size_bytes();
            if dims != "[1]" {
                assert!(gpu.stats[0].peak_live_bytes < 2 * elem, "{d} over {dims}: {}", gpu.stats[0].peak_live_bytes);
            }
        }
    }
}

/// A chain's value that a reduction reads and later steps read again is
/// kept and reduced: the reduction and the later reader both see it.
#[test]
fn a_reduced_value_can_also_be_kept() {
    let Some(be) = wgpu_or_skip() else { return };
    let mut rng = Rng::new(37);
    let p: DeviceProgram = "device_program @softmax mesh [x=1] {
  input %0 : f32[16,40]
  input %1 : f32[16,40]
  %2 = add %0, %1 : f32[16,40]
  %3 = exp %2 : f32[16,40]
  %4 = reduce_sum %3 {dims = [1]} : f32[16]
  %5 = broadcast_in_dim %4 {dims = [0]} : f32[16,40]
  %6 = div %3, %5 : f32[16,40]
  return %6, %2
}
"
    .parse()
    .unwrap();
    let ins: Vec<HostTensor> = (0..2)
        .map(|_| crate::common::random(&mut rng, &TensorType::new(DType::F32, vec![16, 40]), -2.0, 2.0))
        .collect();
    let cpu = run_program_stats(&p, &[CpuBackend::new()], vec![ins.clone()]).unwrap();
    let gpu = run_program_stats(&p, &[be_clone(&be)], vec![ins]).unwrap();
    assert!(gpu.fused_chains >= 1);
    for (g, c) in gpu.outputs[0].iter().zip(&cpu.outputs[0]) {
        check_close(g, c, 1e-5, 1e-6).unwrap();
    }
}

/// A global norm over several parameters: each squared norm is a chain
/// ending in its sum, and the running total one chain of adds that
/// reaches across them (frees inside its range wait for it); the result
/// equals the CPU's to rounding, and the GPU runs 1 + n chains for n
/// parameters.
#[test]
fn a_running_total_reaches_across_the_norms() {
    let Some(be) = wgpu_or_skip() else { return };
    let mut rng = Rng::new(38);
    let n = 6;
    // Buffers: %k the parameters; %(n+3k) the squares, %(n+3k+1) their
    // sums, %(n+3k+2) the running total (from k = 1); %(4n) the norm.
    let (q, s, t) = (|k: usize| n + 3 * k, |k: usize| n + 3 * k + 1, |k: usize| n + 3 * k + 2);
    let mut text = String::from("device_program @norm mesh [x=1] {\n");
    for k in 0..n {
        text += &format!("  input %{k} : f32[{}]\n", 100 + 37 * k);
    }
    for k in 0..n {
        let len = 100 + 37 * k;
        text += &format!("  %{} = mul %{k}, %{k} : f32[{len}]\n", q(k));
        text += &format!("  %{} = reduce_sum %{} {{dims = [0]}} : f32[]\n", s(k), q(k));
        if k == 1 {
            text += &format!("  %{} = add %{}, %{} : f32[]\n", t(1), s(0), s(1));
            text += &format!("  free %{}, %{}\n", s(0), s(1));
        } else if k > 1 {
            text += &format!("  %{} = add %{}, %{} : f32[]\n", t(k), t(k - 1), s(k));
            text += &format!("  free %{}, %{}\n", t(k - 1), s(k));
        }
        text += &format!("  free %{k}\n");
    }
    text += &format!("  %{} = sqrt %{} : f32[]\n  return %{}\n}}\n", 4 * n, t(n - 1), 4 * n);
    let p: DeviceProgram = weft_ir::device::parse_program(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let ins: Vec<HostTensor> = (0..n)
        .map(|k| crate::common::random(&mut rng, &TensorType::new(DType::F32, vec![100 + 37 * k]), -1.0, 1.0))
        .collect();
    let cpu = run_program_stats(&p, &[CpuBackend::new()], vec![ins.clone()]).unwrap();
    let gpu = run_program_stats(&p, &[be_clone(&be)], vec![ins]).unwrap();
    assert_eq!(gpu.fused_chains, 1 + n, "{text}");
    check_close(&gpu.outputs[0][0], &cpu.outputs[0][0], 1e-5, 1e-6).unwrap();
    assert_eq!(gpu.stats[0].final_live_bytes, 4, "only the norm is left");
}

/// A `select` on a scalar predicate (a clipped update: `finite ? g·s :
/// g`) joins the chain on the GPU, its predicate read once per element as
/// a splat; bit for bit the CPU.
#[test]
fn scalar_predicates_fuse() {
    let Some(be) = wgpu_or_skip() else { return };
    let mut rng = Rng::new(39);
    for pred in ["1.0", "-1.0"] {
        let p: DeviceProgram = format!(
            "device_program @clip mesh [x=1] {{
  input %0 : f32[33,20]
  input %1 : f32[]
  %2 = constant {pred} : f32[]
  %3 = constant 0.0 : f32[]
  %4 = gt %2, %3 : bool[]
  %5 = broadcast_in_dim %1 {{dims = []}} : f32[33,20]
  %6 = mul %0, %5 : f32[33,20]
  %7 = select %4, %6, %0 : f32[33,20]
  %8 = neg %7 : f32[33,20]
  return %8
}}
"
        )
        .parse()
        .unwrap();
        let ins = vec![
            crate::common::random(&mut rng, &TensorType::new(DType::F32, vec![33, 20]), -2.0, 2.0),
            crate::common::random(&mut rng, &TensorType::new(DType::F32, vec![]), -2.0, 2.0),
        ];
        let cpu = run_program_stats(&p, &[CpuBackend::new()], vec![ins.clone()]).unwrap();
        let gpu = run_program_stats(&p, &[be_clone(&be)], vec![ins]).unwrap();
        // The spread, the product and the select are never stored: `x`
        // and the result (and scalars) are all that is ever live.
        let elem = TensorType::new(DType::F32, vec![33, 20]).size_bytes();
        assert!(gpu.stats[0].peak_live_bytes < 3 * elem, "{pred}: {}", gpu.stats[0].peak_live_bytes);
        assert!(gpu.outputs[0][0].bitwise_eq(&cpu.outputs[0][0]), "{pred}");
    }
}

/// A chain of more inputs and splat constants than a kernel may bind on
/// the device (lavapipe: 32 storage buffers) is split into chains that
/// fit: before, the kernel failed to build and the launch wrote nothing.
/// Every result is bit for bit the CPU's.
#[test]
fn chains_past_the_binding_limit_split() {
    let Some(be) = wgpu_or_skip() else { return };
    let mut text = String::from("device_program @wide mesh [x=1] {\n");
    for k in 0..12 {
        text += &format!("  input %{k} : f32[40]\n");
    }
    // acc = x0; then 30 times acc = acc * c_j + x_(j mod 12), each c_j
    // its own constant.
    let mut acc = 0;
    let mut next = 12;
    for j in 1..=30 {
        let (c, m, a) = (next, next + 1, next + 2);
        text += &format!("  %{c} = constant {} : f32[40]\n", 1.0 + j as f64 / 64.0);
        text += &format!("  %{m} = mul %{acc}, %{c} : f32[40]\n");
        text += &format!("  %{a} = add %{m}, %{} : f32[40]\n", j % 12);
        acc = a;
        next += 3;
    }
    text += &format!("  return %{acc}\n}}\n");
    let p: DeviceProgram = text.parse().unwrap();
    let mut rng = Rng::new(38);
    let ins: Vec<HostTensor> =
        (0..12).map(|_| crate::common::random(&mut rng, &TensorType::new(DType::F32, vec![40]), -1.0, 1.0)).collect();
    let cpu = run_program_stats(&p, &[CpuBackend::new()], vec![ins.clone()]).unwrap();
    let gpu = run_program_stats(&p, &[be_clone(&be)], vec![ins]).unwrap();
    assert!(gpu.fused_chains >= 2, "{} chains", gpu.fused_chains);
    assert!(gpu.outputs[0][0].bitwise_eq(&cpu.outputs[0][0]));
}

/// A chain of rank-0 steps on rank-0 inputs (not through a broadcast)
/// that then spreads its value over a vector (an AdamW update reading
/// bias corrections computed earlier): the result is bit for bit the
/// CPU's.
#[test]
fn a_chain_computes_rank0_inputs_before_spreading_them() {
    let Some(be) = wgpu_or_skip() else { return };
    let p: DeviceProgram = "device_program @bias mesh [x=1] {
  input %0 : f32[]
  input %1 : f32[]
  input %2 : f32[]
  input %3 : f32[64]
  input %4 : f32[64]
  %5 = constant -2.0 : f32[]
  %6 = mul %0, %5 : f32[]
  %7 = div %6, %1 : f32[]
  %8 = broadcast_in_dim %2 {dims = []} : f32[64]
  %9 = div %3, %8 : f32[64]
  %10 = broadcast_in_dim %7 {dims = []} : f32[64]
  %11 = div %4, %10 : f32[64]
  %12 = sqrt %11 : f32[64]
  %13 = div %9, %12 : f32[64]
  return %13
}
"
    .parse()
    .unwrap();
    let ins = vec![
        HostTensor::from_f32(&[], vec![-0.3]).unwrap(),
        HostTensor::from_f32(&[], vec![1.3]).unwrap(),
        HostTensor::from_f32(&[], vec![0.7]).unwrap(),
        HostTensor::from_f32(&[64], (0..64).map(|i| i as f32 - 3.5).collect()).unwrap(),
        HostTensor::from_f32(&[64], (0..64).map(|i| 1.0 + i as f32).collect()).unwrap(),
    ];
    let cpu = run_program_stats(&p, &[CpuBackend::new()], vec![ins.clone()]).unwrap();
    let gpu = run_program_stats(&p, &[be_clone(&be)], vec![ins]).unwrap();
    let (g, c) = (&gpu.outputs[0][0], &cpu.outputs[0][0]);
    assert!(g.bitwise_eq(c), "{:?} against {:?}", g.to_f64_vec(), c.to_f64_vec());
}

/// A rank-0 chain keeping two of its values for later steps (AdamW's bias
/// corrections once common subexpressions are merged: `tanh` and
/// `1 - tanh` read again by the next parameter's update): the result and
/// both kept values are bit for bit the CPU's.
#[test]
fn a_scalar_chain_keeps_two_values() {
    let Some(be) = wgpu_or_skip() else { return };
    let p: DeviceProgram = "device_program @bias mesh [x=1] {
  input %0 : f32[]
  input %1 : f32[8]
  %2 = constant -0.05 : f32[]
  %3 = mul %0, %2 : f32[]
  %4 = tanh %3 : f32[]
  %5 = constant 1.0 : f32[]
  %6 = sub %5, %4 : f32[]
  %7 = constant -2.0 : f32[]
  %8 = mul %4, %7 : f32[]
  %9 = div %8, %6 : f32[]
  %10 = broadcast_in_dim %9 {dims = []} : f32[8]
  %11 = div %1, %10 : f32[8]
  %12 = constant 3.0 : f32[]
  %13 = mul %4, %12 : f32[]
  %14 = div %13, %6 : f32[]
  %15 = broadcast_in_dim %14 {dims = []} : f32[8]
  %16 = div %1, %15 : f32[8]
  return %11, %16
}
"
    .parse()
    .unwrap();
    let ins = vec![
        HostTensor::from_f32(&[], vec![7.0]).unwrap(),
        HostTensor::from_f32(&[8], (0..8).map(|i| i as f32 - 3.5).collect()).unwrap(),
    ];
    let cpu = run_program_stats(&p, &[CpuBackend::new()], vec![ins.clone()]).unwrap();
    let gpu = run_program_stats(&p, &[be_clone(&be)], vec![ins]).unwrap();
    for (k, (g, c)) in gpu.outputs[0].iter().zip(&cpu.outputs[0]).enumerate() {
        assert!(g.bitwise_eq(c), "output {k}: {:?} against {:?}", g.to_f64_vec(), c.to_f64_vec());
    }
}

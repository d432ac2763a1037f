//! Fused elementwise chains give the results of unfused execution, never
//! allocate their intermediates, and fall back node by node where the
//! fused kernel does not apply.

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
fn chains_with_comparisons_run_node_by_node() {
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

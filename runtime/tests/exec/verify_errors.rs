//! Malformed programs and inputs are rejected before anything runs, with
//! errors that say where.

use crate::programs::*;
use weft_ir::device::{Buffer, BufferId, Collective, DeviceProgram, Step};
use weft_ir::tensor::HostTensor;
use weft_ir::{DType, Op, ReduceOp, TensorType, UnaryOp};
use weft_runtime::{run_program, CpuBackend, RuntimeError};

fn gather() -> DeviceProgram {
    one_collective(&[("x", 2)], f32s(&[2]), Collective::AllGather { dim: 0, axes: vec!["x".into()] }, f32s(&[4]))
}

fn inputs(n: usize) -> Vec<Vec<HostTensor>> {
    (0..n).map(|_| vec![HostTensor::zeros(&f32s(&[2]))]).collect()
}

fn run_err(p: &DeviceProgram, n_devices: usize, ins: Vec<Vec<HostTensor>>) -> RuntimeError {
    run_program(p, &vec![CpuBackend::new(); n_devices], ins).expect_err("should be rejected")
}

fn invalid_at(e: RuntimeError, want_step: Option<usize>, needle: &str) {
    match &e {
        RuntimeError::InvalidProgram { step, message, .. } => {
            assert_eq!(*step, want_step, "{e}");
            assert!(message.contains(needle), "{e}");
        }
        _ => panic!("expected InvalidProgram, got {e}"),
    }
}

#[test]
fn device_count_must_match_the_mesh() {
    let e = run_err(&gather(), 3, inputs(3));
    assert!(matches!(e, RuntimeError::DeviceCount { needed: 2, given: 3, .. }), "{e}");
    assert!(e.to_string().contains("x=2"), "{e}");
}

#[test]
fn inputs_are_checked() {
    let e = run_err(&gather(), 2, vec![vec![HostTensor::zeros(&f32s(&[2]))], vec![HostTensor::zeros(&f32s(&[3]))]]);
    assert!(matches!(e, RuntimeError::Input { device: 1, index: 0, .. }), "{e}");
    assert!(e.to_string().contains("%0 (%x) is f32[2], given f32[3]"), "{e}");
    let e = run_err(&gather(), 2, inputs(1));
    assert!(matches!(e, RuntimeError::Input { .. }), "{e}");
}

#[test]
fn collective_types_and_axes_are_checked() {
    let mut p = gather();
    p.buffers[1].ty = f32s(&[3]);
    invalid_at(run_err(&p, 2, inputs(2)), Some(0), "should be f32[4]");
    let p =
        one_collective(&[("x", 2)], f32s(&[2]), Collective::AllGather { dim: 0, axes: vec!["z".into()] }, f32s(&[4]));
    invalid_at(run_err(&p, 2, inputs(2)), Some(0), "mesh axis `z` does not exist");
    let p = one_collective(
        &[("x", 2)],
        f32s(&[3]),
        Collective::ReduceScatter { dim: 0, axes: vec!["x".into()], op: ReduceOp::Sum },
        f32s(&[1]),
    );
    invalid_at(run_err(&p, 2, inputs(2)), Some(0), "not divisible");
    let b = TensorType::new(DType::Bool, vec![2]);
    let p =
        one_collective(&[("x", 2)], b.clone(), Collective::AllReduce { axes: vec!["x".into()], op: ReduceOp::Max }, b);
    invalid_at(run_err(&p, 2, vec![]), Some(0), "bool");
    let p = one_collective(
        &[("x", 2)],
        f32s(&[2]),
        Collective::CollectivePermute { pairs: vec![(0, 1), (1, 1)] },
        f32s(&[2]),
    );
    invalid_at(run_err(&p, 2, inputs(2)), Some(0), "target of two pairs");
}

#[test]
fn liveness_is_checked() {
    // Use after free.
    let mut p = gather();
    p.steps.insert(0, Step::Free(vec![BufferId(0)]));
    invalid_at(run_err(&p, 2, inputs(2)), Some(1), "used after it was freed");
    // Output never defined.
    let mut p = gather();
    p.steps.truncate(0);
    invalid_at(run_err(&p, 2, inputs(2)), None, "output 0: buffer %1 is used before it is defined");
    // A compute step whose declared output type is wrong.
    let mut p = gather();
    p.buffers.push(Buffer { ty: TensorType::new(DType::I32, vec![2]), name: Some("bad".into()) });
    p.steps.insert(
        0,
        Step::Compute { op: Op::Unary(UnaryOp::Exp), inputs: vec![BufferId(0)], outputs: vec![BufferId(2)] },
    );
    invalid_at(run_err(&p, 2, inputs(2)), Some(0), "output 0 has type i32[2] but should be f32[2]");
    // Defined twice.
    let mut p = gather();
    p.steps.insert(
        0,
        Step::Compute { op: Op::Unary(UnaryOp::Neg), inputs: vec![BufferId(0)], outputs: vec![BufferId(0)] },
    );
    invalid_at(run_err(&p, 2, inputs(2)), Some(0), "defined twice");
}

#[test]
fn shard_slices_are_checked() {
    let p = DeviceProgram {
        name: "slice".into(),
        mesh: mesh(&[("x", 2), ("y", 3)]),
        buffers: vec![Buffer { ty: f32s(&[4, 4]), name: None }, Buffer { ty: f32s(&[2, 2]), name: None }],
        inputs: vec![BufferId(0)],
        outputs: vec![BufferId(1)],
        steps: vec![Step::ShardSlice {
            input: BufferId(0),
            output: BufferId(1),
            dims: vec![vec!["x".into()], vec!["y".into()]],
        }],
    };
    invalid_at(
        run_err(&p, 6, vec![]),
        Some(0),
        "dimension 1 of f32[4,4] (extent 4) is not divisible by the group size 3",
    );
}

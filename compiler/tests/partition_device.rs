//! Device programs on their own (the contract with the runtime): the text
//! printer, the verifier's diagnostics, and the reference simulator's
//! group/rank semantics on hand-built programs with hand-computed results.
use weft_ir::device::{print_program, simulate, verify_program, Buffer, BufferId, Collective, DeviceProgram, Step};
use weft_ir::tensor::HostTensor;
use weft_ir::{DType, DotDims, IrError, Op, ReduceOp, TensorType};

fn t(shape: &[usize]) -> TensorType {
    TensorType::new(DType::F32, shape.to_vec())
}

/// A program on mesh x=2,y=2 with the given buffers (unnamed) and steps;
/// buffer 0 is the input, the last buffer the output.
fn prog(buffers: &[&[usize]], steps: Vec<Step>) -> DeviceProgram {
    DeviceProgram {
        name: "p".into(),
        mesh: vec![("x".into(), 2), ("y".into(), 2)].into(),
        buffers: buffers.iter().map(|s| Buffer { ty: t(s), name: None }).collect(),
        inputs: vec![BufferId(0)],
        outputs: vec![BufferId(buffers.len() as u32 - 1)],
        steps,
    }
}

fn coll(op: Collective, i: u32, o: u32) -> Step {
    Step::Collective { op, input: BufferId(i), output: BufferId(o) }
}

fn axes(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}

/// Device d's input: `[d*10 + k for k in 0..n]` shaped `shape`.
fn run(p: &DeviceProgram, shape: &[usize]) -> Vec<Vec<f64>> {
    let n: usize = shape.iter().product();
    let ins = (0..4)
        .map(|d| vec![HostTensor::from_f32(shape, (0..n).map(|k| (d * 10 + k) as f32).collect()).unwrap()])
        .collect();
    simulate(p, ins).unwrap().into_iter().map(|mut o| o.remove(0).to_f64_vec()).collect()
}

#[test]
fn all_gather_concatenates_in_rank_order_of_the_axes_given() {
    // Groups over [y, x]: all four devices, rank = y * 2 + x.
    let p = prog(&[&[1], &[4]], vec![coll(Collective::AllGather { dim: 0, axes: axes(&["y", "x"]) }, 0, 1)]);
    // Devices (x, y): 0 = (0,0), 1 = (0,1), 2 = (1,0), 3 = (1,1); ranks 0, 2, 1, 3.
    assert_eq!(run(&p, &[1]), vec![vec![0.0, 20.0, 10.0, 30.0]; 4]);
}

#[test]
fn reductions_fold_in_rank_order_and_scatter_by_rank() {
    let p = prog(&[&[2], &[2]], vec![coll(Collective::AllReduce { axes: axes(&["x"]), op: ReduceOp::Sum }, 0, 1)]);
    // Groups over x: {0, 2} and {1, 3}.
    assert_eq!(run(&p, &[2]), vec![vec![20.0, 22.0], vec![40.0, 42.0], vec![20.0, 22.0], vec![40.0, 42.0]]);
    let p = prog(
        &[&[2], &[1]],
        vec![coll(Collective::ReduceScatter { dim: 0, axes: axes(&["y"]), op: ReduceOp::Max }, 0, 1)],
    );
    // Groups over y: {0, 1} -> max [10, 11]; {2, 3} -> [30, 31]; rank r keeps element r.
    assert_eq!(run(&p, &[2]), vec![vec![10.0], vec![11.0], vec![30.0], vec![31.0]]);
}

#[test]
fn all_to_all_sends_block_j_to_rank_j() {
    let p = prog(
        &[&[1, 2], &[2, 1]],
        vec![coll(Collective::AllToAll { split_dim: 1, concat_dim: 0, axes: axes(&["y"]) }, 0, 1)],
    );
    // Group {0, 1}: device 0 has [0, 1], device 1 has [10, 11]; rank 0
    // receives element 0 of each: [0, 10]; rank 1: [1, 11].
    assert_eq!(run(&p, &[1, 2]), vec![vec![0.0, 10.0], vec![1.0, 11.0], vec![20.0, 30.0], vec![21.0, 31.0]]);
}

#[test]
fn permute_moves_buffers_and_zeroes_devices_that_receive_nothing() {
    let pairs = vec![(0, 3), (3, 0), (1, 1)];
    let p = prog(&[&[1], &[1]], vec![coll(Collective::CollectivePermute { pairs }, 0, 1)]);
    assert_eq!(run(&p, &[1]), vec![vec![30.0], vec![10.0], vec![0.0], vec![0.0]]);
}

#[test]
fn shard_slice_takes_the_block_of_the_device() {
    let p = prog(
        &[&[4, 2], &[2, 1]],
        vec![Step::ShardSlice { input: BufferId(0), output: BufferId(1), dims: vec![axes(&["x"]), axes(&["y"])] }],
    );
    // Device (x, y) takes rows 2x..2x+2, column y.
    assert_eq!(run(&p, &[4, 2]), vec![vec![0.0, 2.0], vec![11.0, 13.0], vec![24.0, 26.0], vec![35.0, 37.0]]);
}

#[test]
fn the_printer_shows_every_step() {
    let mut p = prog(
        &[&[4, 2], &[2, 4], &[4, 4], &[4, 4], &[2, 4]],
        vec![
            Step::Compute {
                op: Op::Transpose { perm: vec![1, 0] },
                inputs: vec![BufferId(0)],
                outputs: vec![BufferId(1)],
            },
            Step::Compute {
                op: Op::DotGeneral(DotDims::matmul()),
                inputs: vec![BufferId(0), BufferId(1)],
                outputs: vec![BufferId(2)],
            },
            coll(Collective::AllReduce { axes: axes(&["x", "y"]), op: ReduceOp::Sum }, 2, 3),
            Step::Free(vec![BufferId(0), BufferId(1), BufferId(2)]),
            Step::ShardSlice { input: BufferId(3), output: BufferId(4), dims: vec![axes(&["x"]), vec![]] },
            Step::Free(vec![BufferId(3)]),
        ],
    );
    p.buffers[0].name = Some("x".into());
    p.buffers[4].name = Some("out".into());
    verify_program(&p).unwrap();
    assert_eq!(
        print_program(&p),
        "device_program @p mesh [x=2, y=2] {
  input %0 : f32[4,2]  // x
  %1 = transpose %0 {perm = [1, 0]} : f32[2,4]
  %2 = dot_general %0, %1 {lhs_contract = [1], rhs_contract = [0]} : f32[4,4]
  %3 = all_reduce %2 {axes = [x, y], op = sum} : f32[4,4]
  free %0, %1, %2
  %4 = shard_slice %3 {dims = [{x}, {}]} : f32[2,4]  // out
  free %3
  return %4
}
"
    );
}

fn problems(p: &DeviceProgram) -> Vec<String> {
    match verify_program(p) {
        Err(IrError::Verify(ds)) => ds.iter().map(|d| d.to_string()).collect(),
        other => panic!("expected verifier errors, got {other:?}"),
    }
}

#[test]
fn the_verifier_lists_every_problem_with_its_step() {
    let p = prog(
        &[&[3], &[6], &[3], &[3], &[3]],
        vec![
            coll(Collective::AllGather { dim: 1, axes: axes(&["x"]) }, 0, 1),
            coll(Collective::ReduceScatter { dim: 0, axes: axes(&["x", "x"]), op: ReduceOp::Sum }, 0, 2),
            Step::Free(vec![BufferId(0)]),
            Step::Compute {
                op: Op::Unary(weft_ir::UnaryOp::Neg),
                inputs: vec![BufferId(0)],
                outputs: vec![BufferId(3)],
            },
            coll(Collective::CollectivePermute { pairs: vec![(0, 1), (2, 1), (9, 0)] }, 3, 3),
            coll(Collective::AllReduce { axes: axes(&["z"]), op: ReduceOp::Sum }, 3, 5),
        ],
    );
    assert_eq!(
        problems(&p),
        vec![
            "in @p: step 0 (`all_gather`): gather dimension 1 is out of range for f32[3]",
            "in @p: step 1 (`reduce_scatter`): mesh axis `x` is named twice",
            "in @p: step 1 (`reduce_scatter`): dimension 0 of f32[3] (extent 3) is not divisible by the group size 4",
            "in @p: step 3 (`neg`): buffer %0 is used after it was freed",
            "in @p: step 4 (`collective_permute`): buffer %3 is defined twice",
            "in @p: step 4 (`collective_permute`): device 1 is the target of two pairs",
            "in @p: step 4 (`collective_permute`): pair (9, 0) names a device outside the mesh of 4 devices",
            "in @p: step 5 (`all_reduce`): buffer %5 does not exist (5 buffers)",
            "in @p: output 0: buffer %4 is used before it is defined",
        ]
    );
}

#[test]
fn the_verifier_checks_compute_types_against_inference() {
    let p = prog(
        &[&[2, 2], &[2, 3]],
        vec![Step::Compute {
            op: Op::Transpose { perm: vec![1, 0] },
            inputs: vec![BufferId(0)],
            outputs: vec![BufferId(1)],
        }],
    );
    assert_eq!(problems(&p), vec!["in @p: step 0 (`transpose`): output 0 has type f32[2,3] but should be f32[2,2]"]);
    let e = simulate(&p, vec![vec![]; 4]).unwrap_err();
    assert!(matches!(e, IrError::Verify(_)));
}

#[test]
fn simulate_checks_its_inputs() {
    let p = prog(&[&[2], &[2]], vec![coll(Collective::AllReduce { axes: axes(&["x"]), op: ReduceOp::Sum }, 0, 1)]);
    let e = simulate(&p, vec![vec![]; 3]).unwrap_err();
    assert_eq!(e.to_string(), "input `devices`: @p runs on 4 devices but inputs for 3 were given");
    let e = simulate(&p, vec![vec![HostTensor::zeros(&t(&[3]))]; 4]).unwrap_err();
    assert_eq!(e.to_string(), "input `input 0`: device 0: expected f32[2], given f32[3]");
}

//! Every collective on every test mesh, on the CPU and on wgpu.

use crate::common::wgpu_devices_or_skip;
use crate::programs::*;
use weft_ir::device::{Buffer, BufferId, Collective, DeviceProgram, Step};
use weft_ir::interp::eval_op;
use weft_ir::tensor::HostTensor;
use weft_ir::{BinaryOp, DType, DotDims, Literal, Op, ReduceOp, TensorType};
use weft_runtime::{run_program, run_program_stats, verify_program, Backend, CpuBackend};

pub(crate) const MESHES: &[&[(&str, usize)]] =
    &[&[("x", 2)], &[("x", 2), ("y", 2)], &[("x", 4), ("y", 2)], &[("x", 8)]];

fn axis_sets(m: &[(&str, usize)]) -> Vec<Vec<&'static str>> {
    if m.len() == 1 {
        vec![vec!["x"]]
    } else {
        vec![vec!["x"], vec!["y"], vec!["x", "y"], vec!["y", "x"]]
    }
}

/// One case: the program, and each device's expected output.
pub(crate) struct Case {
    pub(crate) program: DeviceProgram,
    pub(crate) inputs: Vec<Mat>,
    pub(crate) expected: Vec<Mat>,
}

fn owned(axes: &[&str]) -> Vec<String> {
    axes.iter().map(|a| a.to_string()).collect()
}

/// Every collective over `axes` of mesh `m`, with expectations computed
/// from the contract: members in rank order, left folds, blocks by rank.
fn cases(m: &[(&str, usize)], axes: &[&str]) -> Vec<Case> {
    let n: usize = m.iter().map(|a| a.1).product();
    let g: usize = axes.iter().map(|a| m.iter().find(|(b, _)| b == a).unwrap().1).product();
    let mut out = Vec::new();
    let inputs = |rows, cols| (0..n).map(|d| Mat::input(d, rows, cols)).collect::<Vec<_>>();
    let members = |ins: &[Mat], d: usize| group_of(m, axes, d).into_iter().map(|e| ins[e].clone()).collect::<Vec<_>>();
    for dim in [0, 1] {
        let ins = inputs(2, 3);
        let expected = (0..n).map(|d| Mat::concat(&members(&ins, d), dim)).collect();
        let out_shape = if dim == 0 { [2 * g, 3] } else { [2, 3 * g] };
        let op = Collective::AllGather { dim, axes: owned(axes) };
        out.push(Case { program: one_collective(m, f32s(&[2, 3]), op, f32s(&out_shape)), inputs: ins, expected });
    }
    for (rop, f) in
        [(ReduceOp::Sum, (|a, b| a + b) as fn(f32, f32) -> f32), (ReduceOp::Max, f32::max), (ReduceOp::Min, f32::min)]
    {
        let ins = inputs(2, 3);
        let fold = |ms: Vec<Mat>| ms[1..].iter().fold(ms[0].clone(), |acc, x| acc.zip(x, f));
        let expected = (0..n).map(|d| fold(members(&ins, d))).collect();
        let op = Collective::AllReduce { axes: owned(axes), op: rop };
        out.push(Case { program: one_collective(m, f32s(&[2, 3]), op, f32s(&[2, 3])), inputs: ins.clone(), expected });
        for dim in [0, 1] {
            let (rows, cols) = if dim == 0 { (2 * g, 3) } else { (2, 3 * g) };
            let ins = inputs(rows, cols);
            let expected = (0..n).map(|d| fold(members(&ins, d)).block(dim, rank_of(m, axes, d), g)).collect();
            let op = Collective::ReduceScatter { dim, axes: owned(axes), op: rop };
            out.push(Case {
                program: one_collective(m, f32s(&[rows, cols]), op, f32s(&[2, 3])),
                inputs: ins,
                expected,
            });
        }
    }
    for (split, concat) in [(0, 1), (1, 0), (0, 0)] {
        let (rows, cols) = if split == 0 { (2 * g, 3) } else { (2, 3 * g) };
        let ins = inputs(rows, cols);
        // Device d receives block rank(d) of every member, in rank order.
        let expected = (0..n)
            .map(|d| {
                let r = rank_of(m, axes, d);
                Mat::concat(&members(&ins, d).iter().map(|x| x.block(split, r, g)).collect::<Vec<_>>(), concat)
            })
            .collect::<Vec<Mat>>();
        let e: &Mat = &expected[0];
        let op = Collective::AllToAll { split_dim: split, concat_dim: concat, axes: owned(axes) };
        out.push(Case {
            program: one_collective(m, f32s(&[rows, cols]), op, f32s(&[e.rows, e.cols])),
            inputs: ins,
            expected,
        });
    }
    out
}

pub(crate) fn permute_cases(m: &[(&str, usize)]) -> Vec<Case> {
    let n: usize = m.iter().map(|a| a.1).product();
    let ins: Vec<Mat> = (0..n).map(|d| Mat::input(d, 2, 3)).collect();
    let zero = Mat { rows: 2, cols: 3, v: vec![0.0; 6] };
    let ring: Vec<(u32, u32)> = (0..n as u32).map(|d| (d, (d + 1) % n as u32)).collect();
    let ring_expected = (0..n).map(|d| ins[(d + n - 1) % n].clone()).collect();
    let one = vec![(0, n as u32 - 1)];
    let one_expected = (0..n).map(|d| if d == n - 1 { ins[0].clone() } else { zero.clone() }).collect();
    [(ring, ring_expected), (one, one_expected)]
        .into_iter()
        .map(|(pairs, expected)| Case {
            program: one_collective(m, f32s(&[2, 3]), Collective::CollectivePermute { pairs }, f32s(&[2, 3])),
            inputs: ins.clone(),
            expected,
        })
        .collect()
}

/// Every collective case on mesh `m`: the permutes, and every collective
/// over every axis set.
pub(crate) fn all_cases(m: &[(&str, usize)]) -> Vec<Case> {
    let mut all = permute_cases(m);
    for axes in axis_sets(m) {
        all.extend(cases(m, &axes));
    }
    all
}

fn check_all<B: Backend>(backends: &[B]) {
    let mut count = 0;
    for &m in MESHES {
        let n: usize = m.iter().map(|a| a.1).product();
        for case in all_cases(m) {
            let inputs = case.inputs.iter().map(|x| vec![x.tensor()]).collect();
            let outs = run_program(&case.program, &backends[..n], inputs)
                .unwrap_or_else(|e| panic!("{} on {m:?}: {e}", case.program.name));
            for (d, (got, want)) in outs.iter().zip(&case.expected).enumerate() {
                assert!(
                    got[0].bitwise_eq(&want.tensor()),
                    "{:?} on mesh {m:?}, device {d}:\n got  {}\n want {}",
                    case.program.steps[0],
                    got[0],
                    want.tensor()
                );
                count += 1;
            }
        }
    }
    assert!(count > 500, "only {count} device results checked");
}

#[test]
fn collectives_on_the_cpu() {
    let cpus = vec![CpuBackend::new(); 8];
    check_all(&cpus);
}

#[test]
fn collectives_on_eight_logical_wgpu_devices() {
    let Some(devs) = wgpu_devices_or_skip(8) else { return };
    check_all(&devs);
}

/// Hand-written expectations for one small case, as a check on the
/// helpers above: mesh (x=2, y=2), all_reduce over y adds devices 0+1 and
/// 2+3; all_gather over x stacks devices 0 and 2.
#[test]
fn small_cases_by_hand() {
    let m = [("x", 2), ("y", 2)];
    assert_eq!(group_of(&m, &["y"], 2), vec![2, 3]);
    assert_eq!(group_of(&m, &["y", "x"], 1), vec![0, 2, 1, 3]);
    let cpus = vec![CpuBackend::new(); 4];
    let inputs =
        |_: ()| (0..4).map(|d| vec![HostTensor::from_f32(&[2], vec![d as f32, 10.0 * d as f32]).unwrap()]).collect();
    let p =
        one_collective(&m, f32s(&[2]), Collective::AllReduce { axes: vec!["y".into()], op: ReduceOp::Sum }, f32s(&[2]));
    let out = run_program(&p, &cpus, inputs(())).unwrap();
    assert_eq!(out[0][0].as_f32().unwrap().as_slice().unwrap(), &[1.0, 10.0]);
    assert_eq!(out[3][0].as_f32().unwrap().as_slice().unwrap(), &[5.0, 50.0]);
    let p = one_collective(&m, f32s(&[2]), Collective::AllGather { dim: 0, axes: vec!["x".into()] }, f32s(&[4]));
    let out = run_program(&p, &cpus, inputs(())).unwrap();
    assert_eq!(out[1][0].as_f32().unwrap().as_slice().unwrap(), &[1.0, 10.0, 3.0, 30.0]);
}

/// A data-parallel matrix product with a sharded weight: shard_slice,
/// compute steps (constant, dot, add), all_gather over both axes,
/// all_reduce, and frees; compared with the global product computed by the
/// interpreter. The measured peak of live bytes equals the verifier's.
fn mixed_program() -> DeviceProgram {
    let b = |shape: &[usize], name: &str| Buffer { ty: f32s(shape), name: Some(name.into()) };
    let buffers = vec![
        b(&[8, 4], "x"),      // %0 replicated input
        b(&[4, 6], "w"),      // %1 replicated weight
        b(&[2, 4], "x.blk"),  // %2 rows by x
        b(&[4, 3], "w.blk"),  // %3 columns by y
        b(&[2, 3], "y.blk"),  // %4 local product
        b(&[2, 3], "one"),    // %5 constant
        b(&[2, 3], "y1"),     // %6 y.blk + 1
        b(&[2, 6], "y.rows"), // %7 gathered over y
        b(&[8, 6], "y"),      // %8 gathered over x
        b(&[8, 6], "total"),  // %9 all_reduce over both axes (8 copies)
    ];
    let s = |op, ins: &[u32], outs: &[u32]| Step::Compute {
        op,
        inputs: ins.iter().map(|&i| BufferId(i)).collect(),
        outputs: outs.iter().map(|&i| BufferId(i)).collect(),
    };
    DeviceProgram {
        name: "mixed".into(),
        mesh: mesh(&[("x", 4), ("y", 2)]),
        buffers,
        inputs: vec![BufferId(0), BufferId(1)],
        outputs: vec![BufferId(8), BufferId(9)],
        steps: vec![
            Step::ShardSlice { input: BufferId(0), output: BufferId(2), dims: vec![vec!["x".into()], vec![]] },
            Step::ShardSlice { input: BufferId(1), output: BufferId(3), dims: vec![vec![], vec!["y".into()]] },
            Step::Free(vec![BufferId(0), BufferId(1)]),
            s(Op::DotGeneral(DotDims::matmul()), &[2, 3], &[4]),
            Step::Free(vec![BufferId(2), BufferId(3)]),
            s(Op::Constant(Literal::splat(f32s(&[2, 3]), 1.0)), &[], &[5]),
            s(Op::Binary(BinaryOp::Add), &[4, 5], &[6]),
            Step::Free(vec![BufferId(4), BufferId(5)]),
            Step::Collective {
                op: Collective::AllGather { dim: 1, axes: vec!["y".into()] },
                input: BufferId(6),
                output: BufferId(7),
            },
            Step::Free(vec![BufferId(6)]),
            Step::Collective {
                op: Collective::AllGather { dim: 0, axes: vec!["x".into()] },
                input: BufferId(7),
                output: BufferId(8),
            },
            Step::Free(vec![BufferId(7)]),
            Step::Collective {
                op: Collective::AllReduce { axes: vec!["y".into(), "x".into()], op: ReduceOp::Sum },
                input: BufferId(8),
                output: BufferId(9),
            },
        ],
    }
}

fn check_mixed<B: Backend>(backends: &[B]) {
    let p = mixed_program();
    let x = HostTensor::from_f32(&[8, 4], (0..32).map(|i| (i % 7) as f32 - 3.0).collect()).unwrap();
    let w = HostTensor::from_f32(&[4, 6], (0..24).map(|i| (i % 5) as f32 * 0.5).collect()).unwrap();
    let y = eval_op(&Op::DotGeneral(DotDims::matmul()), &[&x, &w]).unwrap().remove(0);
    let ones = HostTensor::full(&f32s(&[8, 6]), 1.0);
    let y = eval_op(&Op::Binary(BinaryOp::Add), &[&y, &ones]).unwrap().remove(0);
    let eight = HostTensor::full(&f32s(&[8, 6]), 8.0);
    let total = eval_op(&Op::Binary(BinaryOp::Mul), &[&y, &eight]).unwrap().remove(0);
    let run = run_program_stats(&p, backends, (0..8).map(|_| vec![x.clone(), w.clone()]).collect()).unwrap();
    for (d, outs) in run.outputs.iter().enumerate() {
        assert!(outs[0].bitwise_eq(&y), "device {d}: {} vs {y}", outs[0]);
        assert!(outs[1].bitwise_eq(&total), "device {d}: {} vs {total}", outs[1]);
    }
    let info = verify_program(&p).unwrap();
    // The peak is at the end (y and total, 2 x 48 floats), above the 76
    // floats live after the slices, and far below the 202 floats of all
    // buffers together, thanks to the frees.
    assert_eq!(info.peak_live_bytes, 96 * 4);
    let all: usize = p.buffers.iter().map(|b| b.ty.size_bytes()).sum();
    assert_eq!(all, 202 * 4);
    for s in &run.stats {
        assert_eq!(s.peak_live_bytes, info.peak_live_bytes);
        assert_eq!(s.final_live_bytes, 96 * 4);
    }
}

#[test]
fn shard_slice_compute_collectives_and_frees_on_the_cpu() {
    check_mixed(&vec![CpuBackend::new(); 8]);
}

#[test]
fn shard_slice_compute_collectives_and_frees_on_wgpu() {
    let Some(devs) = wgpu_devices_or_skip(8) else { return };
    check_mixed(&devs);
}

/// Collectives on half-precision and integer buffers use the CPU's
/// arithmetic (a bf16 sum rounds after every addition, in rank order).
#[test]
fn reductions_round_in_rank_order() {
    let m = [("x", 4)];
    let p = one_collective(
        &m,
        TensorType::new(DType::BF16, vec![1]),
        Collective::AllReduce { axes: vec!["x".into()], op: ReduceOp::Sum },
        TensorType::new(DType::BF16, vec![1]),
    );
    // 256 + 1 rounds back to 256 in bf16 (8 significant bits), three times.
    let vals = [256.0, 1.0, 1.0, 1.0];
    let inputs = vals
        .iter()
        .map(|&v| vec![HostTensor::from_values(&TensorType::new(DType::BF16, vec![1]), &[v]).unwrap()])
        .collect();
    let out = run_program(&p, &vec![CpuBackend::new(); 4], inputs).unwrap();
    assert_eq!(out[2][0].to_f64_vec(), vec![256.0]);
}

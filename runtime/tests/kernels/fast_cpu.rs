//! The fast CPU backend against the interpreter, op by op on random data
//! with special values: elementwise ops bit for bit (they use the
//! interpreter's scalar functions, in the vectors of every instruction set
//! the CPU has), matrix products and reductions to
//! 1e-5 relative (only the summation order differs), fused chains bit for
//! bit against the same chain run node by node.

use crate::common::*;
use weft_ir::tensor::HostTensor;
use weft_ir::{BinaryOp, CompareOp, DType, DotDims, Op, ReduceOp, UnaryOp};
use weft_runtime::fast::simd::Isa;
use weft_runtime::fusion::{Arg, FusedChain, FusedNode};
use weft_runtime::{Backend, FastCpuBackend};

fn f32s(rng: &mut Rng, shape: &[usize], lo: f64, hi: f64) -> HostTensor {
    random(rng, &ty(DType::F32, shape), lo, hi)
}

/// A chain of `nodes` (its buffers do not matter to a backend's compute).
fn chain_of(nodes: Vec<FusedNode>) -> FusedChain {
    FusedChain {
        inputs: vec![],
        nodes,
        output: weft_ir::device::BufferId(0),
        intermediates: vec![],
        kept: vec![],
        members: vec![0],
    }
}

/// Random values with zeros of both signs, infinities and NaN mixed in.
fn with_specials(rng: &mut Rng, shape: &[usize]) -> HostTensor {
    let t = f32s(rng, shape, -3.0, 3.0);
    let mut v: Vec<f32> = t.to_f64_vec().into_iter().map(|x| x as f32).collect();
    let specials = [0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 1e-40, -1e30];
    for (i, s) in specials.iter().enumerate() {
        if i * 7 < v.len() {
            v[i * 7] = *s;
        }
    }
    HostTensor::from_f32(shape, v).unwrap()
}

/// Every elementwise op, in the vectors of every instruction set the CPU
/// has (the same loops compiled for each; `weft_runtime::fast::simd`).
#[test]
fn elementwise_ops_are_bit_exact() {
    for isa in Isa::available() {
        let be = FastCpuBackend::new().with_isa(isa);
        let mut rng = Rng::new(11);
        for shape in [&[][..], &[7], &[33, 65], &[3, 1024 + 5]] {
            let (x, y) = (with_specials(&mut rng, shape), with_specials(&mut rng, shape));
            // Wide and tiny magnitudes too (tanh saturates, exp overflows).
            let wide = f32s(&mut rng, shape, -40.0, 40.0);
            let tiny = f32s(&mut rng, shape, -1e-3, 1e-3);
            for u in UnaryOp::ALL.into_iter().filter(|u| u.accepts(DType::F32)) {
                for v in [&x, &wide, &tiny] {
                    check_op(&be, &Op::Unary(u), &[v.clone()], true, 0.0, 0.0);
                }
            }
            for b in BinaryOp::ALL.into_iter().filter(|b| b.accepts(DType::F32)) {
                check_op(&be, &Op::Binary(b), &[x.clone(), y.clone()], true, 0.0, 0.0);
            }
            for c in [CompareOp::Eq, CompareOp::Ne, CompareOp::Lt, CompareOp::Le, CompareOp::Gt, CompareOp::Ge] {
                check_op(&be, &Op::Compare(c), &[x.clone(), y.clone()], true, 0.0, 0.0);
            }
        }
    }
}

#[test]
fn reshapes_are_bit_exact() {
    let be = FastCpuBackend::new();
    let mut rng = Rng::new(16);
    for (from, to) in [(&[8, 6][..], &[4, 2, 6][..]), (&[4096 + 8], &[2, 2052]), (&[3, 1, 5], &[15])] {
        check_op(&be, &Op::Reshape { shape: to.to_vec() }, &[with_specials(&mut rng, from)], true, 0.0, 0.0);
    }
    // A buffer handed over (its last reader) keeps its storage.
    let x = with_specials(&mut rng, &[8, 6]);
    let want = x.to_f64_vec();
    let HostTensor::F32(a) = &x else { unreachable!() };
    let at = a.as_ptr();
    let y = be.reshape_owned(&Op::Reshape { shape: vec![4, 12] }, x).unwrap();
    let HostTensor::F32(b) = &y else { panic!("f32 in, f32 out") };
    assert_eq!((b.as_ptr(), b.shape()), (at, &[4, 12][..]));
    assert_eq!(
        y.to_f64_vec().iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        want.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );
}

#[test]
fn half_precision_elementwise_ops_are_bit_exact() {
    // Computed in f32 and rounded once per op, as the interpreter does.
    let be = FastCpuBackend::new();
    let mut rng = Rng::new(15);
    for dtype in [DType::BF16, DType::F16] {
        for shape in [&[][..], &[7], &[33, 65]] {
            let x = with_specials(&mut rng, shape).convert(dtype);
            let y = with_specials(&mut rng, shape).convert(dtype);
            for u in UnaryOp::ALL.into_iter().filter(|u| u.accepts(dtype)) {
                check_op(&be, &Op::Unary(u), &[x.clone()], true, 0.0, 0.0);
            }
            for b in BinaryOp::ALL.into_iter().filter(|b| b.accepts(dtype)) {
                check_op(&be, &Op::Binary(b), &[x.clone(), y.clone()], true, 0.0, 0.0);
            }
            check_op(&be, &Op::Compare(CompareOp::Lt), &[x.clone(), y.clone()], true, 0.0, 0.0);
            for op in [ReduceOp::Max, ReduceOp::Min, ReduceOp::Sum] {
                let dims: Vec<usize> = (0..shape.len()).collect();
                if !dims.is_empty() {
                    let exact = op != ReduceOp::Sum;
                    check_op(&be, &Op::Reduce { op, dims }, &[x.clone()], exact, 1e-2, 1e-2);
                }
            }
        }
    }
}

/// Batch and contracting dimensions of a product.
fn dims(lb: &[usize], rb: &[usize], lc: &[usize], rc: &[usize]) -> DotDims {
    DotDims { lhs_batch: lb.to_vec(), rhs_batch: rb.to_vec(), lhs_contract: lc.to_vec(), rhs_contract: rc.to_vec() }
}

#[test]
fn dot_general_matches_in_every_layout() {
    let be = FastCpuBackend::new();
    let mut rng = Rng::new(12);
    let cases: Vec<(Vec<usize>, Vec<usize>, DotDims)> = vec![
        (vec![37, 64], vec![64, 29], dims(&[], &[], &[1], &[0])),
        (vec![64, 37], vec![64, 29], dims(&[], &[], &[0], &[0])),
        (vec![37, 64], vec![29, 64], dims(&[], &[], &[1], &[1])),
        (vec![64, 37], vec![29, 64], dims(&[], &[], &[0], &[1])),
        (vec![3, 17, 40], vec![3, 40, 9], dims(&[0], &[0], &[2], &[1])),
        (vec![17, 3, 40], vec![40, 9, 3], dims(&[1], &[2], &[2], &[0])),
        (vec![5, 6, 7, 8], vec![7, 8, 9], dims(&[], &[], &[2, 3], &[0, 1])),
        (vec![6, 5, 8, 7], vec![8, 7, 9], dims(&[], &[], &[3, 2], &[1, 0])),
        (vec![4, 0], vec![0, 5], dims(&[], &[], &[1], &[0])),
        // Batch dims that do not collapse: a mesh-invariant contraction's
        // chunk index (the operand's minor-most batch dim) leads the batch.
        (vec![2, 5, 4, 3, 6], vec![4, 3, 2, 7], dims(&[2, 0], &[0, 2], &[3], &[1])),
        (vec![3, 16, 8, 2], vec![8, 2, 3, 5], dims(&[2, 0], &[0, 2], &[3], &[1])),
    ];
    for (ls, rs, d) in cases {
        let (l, r) = (f32s(&mut rng, &ls, -1.0, 1.0), f32s(&mut rng, &rs, -1.0, 1.0));
        check_op(&be, &Op::DotGeneral(d.clone()), &[l, r], false, 1e-5, 1e-5);
        let (l, r) =
            (random(&mut rng, &ty(DType::BF16, &ls), -1.0, 1.0), random(&mut rng, &ty(DType::BF16, &rs), -1.0, 1.0));
        check_op(&be, &Op::DotGeneral(d), &[l, r], false, 1e-2, 1e-2);
    }
}

/// A product split over threads (whole batch elements, or blocks of output
/// rows) is bitwise the one-thread product: every output element is still
/// one call's, over the whole contraction.
#[test]
fn products_split_over_threads_are_bitwise_one_threads() {
    let mut rng = Rng::new(13);
    let cases: Vec<(Vec<usize>, Vec<usize>, DotDims)> = vec![
        // Row blocks: one matrix, plain and with transposed operands.
        (vec![517, 300], vec![300, 260], dims(&[], &[], &[1], &[0])),
        (vec![300, 517], vec![260, 300], dims(&[], &[], &[0], &[1])),
        // Batch elements: more of them than threads.
        (vec![6, 130, 200], vec![6, 200, 90], dims(&[0], &[0], &[2], &[1])),
        // Fewer batch elements than threads: row blocks of each.
        (vec![2, 400, 300], vec![2, 300, 128], dims(&[0], &[0], &[2], &[1])),
    ];
    for (ls, rs, d) in cases {
        for dtype in [DType::F32, DType::F64, DType::BF16] {
            let (l, r) = (random(&mut rng, &ty(dtype, &ls), -1.0, 1.0), random(&mut rng, &ty(dtype, &rs), -1.0, 1.0));
            let op = Op::DotGeneral(d.clone());
            let run = |threads: usize| {
                let be = FastCpuBackend::new().with_threads(threads);
                let (a, b) = (be.upload(&l).unwrap(), be.upload(&r).unwrap());
                be.download(&be.compute(&op, &[&a, &b]).unwrap()[0]).unwrap()
            };
            let one = run(1);
            for threads in [2, 3, 4, 7] {
                assert!(run(threads).bitwise_eq(&one), "{dtype} {ls:?} x {rs:?} on {threads} threads");
            }
        }
    }
}

/// A fused chain split over threads (runs of whole blocks) is bitwise the
/// one-thread chain, written fresh or into a donated input.
#[test]
fn fused_chains_split_over_threads_are_bitwise_one_threads() {
    let mut rng = Rng::new(15);
    let shape = [700, 600];
    let f = ty(DType::F32, &shape);
    let node = |op, args: Vec<Arg>| FusedNode { op, args, ty: f.clone() };
    // tanh(x) * y - x / (1 + e^y): the shape of GELU's pieces.
    let chain = chain_of(vec![
        node(Op::Unary(UnaryOp::Tanh), vec![Arg::Input(0)]),
        node(Op::Binary(BinaryOp::Mul), vec![Arg::Node(0), Arg::Input(1)]),
        node(Op::Unary(UnaryOp::Exp), vec![Arg::Input(1)]),
        node(Op::Unary(UnaryOp::Log1p), vec![Arg::Node(2)]),
        node(Op::Binary(BinaryOp::Div), vec![Arg::Input(0), Arg::Node(3)]),
        node(Op::Binary(BinaryOp::Sub), vec![Arg::Node(1), Arg::Node(4)]),
    ]);
    let (x, y) = (with_specials(&mut rng, &shape), f32s(&mut rng, &shape, -3.0, 3.0));
    let fresh = |threads: usize| {
        FastCpuBackend::new().with_threads(threads).compute_fused(&chain, &[&x, &y]).unwrap().remove(0)
    };
    let donated = |threads: usize| {
        let be = FastCpuBackend::new().with_threads(threads);
        be.compute_fused_into(&chain, &[Some(&x), None], 1, y.clone()).unwrap().remove(0)
    };
    let one = fresh(1);
    let slow = weft_runtime::compute_unfused(&weft_runtime::CpuBackend::new(), &chain, &[&x, &y]).unwrap().remove(0);
    assert!(one.bitwise_eq(&slow), "the one-thread chain is the interpreter's");
    for threads in [2, 3, 5] {
        assert!(fresh(threads).bitwise_eq(&one), "{threads} threads");
        assert!(donated(threads).bitwise_eq(&one), "{threads} threads, into the donor");
    }
    for isa in Isa::available() {
        let be = FastCpuBackend::new().with_isa(isa);
        assert!(be.compute_fused(&chain, &[&x, &y]).unwrap()[0].bitwise_eq(&one), "{isa:?}");
    }
}

#[test]
fn reductions_match_over_leading_trailing_and_mixed_dims() {
    let be = FastCpuBackend::new();
    let mut rng = Rng::new(13);
    let x = f32s(&mut rng, &[6, 70, 33], -2.0, 2.0);
    for dims in [vec![0], vec![0, 1], vec![2], vec![1, 2], vec![0, 1, 2], vec![1], vec![0, 2]] {
        for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min] {
            let exact = op != ReduceOp::Sum;
            check_op(&be, &Op::Reduce { op, dims: dims.clone() }, &[x.clone()], exact, 1e-5, 1e-5);
        }
    }
    let nan = with_specials(&mut rng, &[40, 50]);
    check_op(&be, &Op::Reduce { op: ReduceOp::Max, dims: vec![1] }, &[nan.clone()], true, 0.0, 0.0);
    check_op(&be, &Op::Reduce { op: ReduceOp::Min, dims: vec![0] }, &[nan], true, 0.0, 0.0);
}

#[test]
fn fused_chains_equal_their_nodes_run_one_by_one() {
    let be = FastCpuBackend::new();
    let mut rng = Rng::new(14);
    let shape = [129, 31];
    let f = ty(DType::F32, &shape);
    let b = ty(DType::Bool, &shape);
    // relu'(x) * dy - x / (1 + e^x), with a bool intermediate and a convert.
    let node = |op, args: Vec<Arg>, t: &weft_ir::TensorType| FusedNode { op, args, ty: t.clone() };
    let chain = chain_of(vec![
        node(Op::Compare(CompareOp::Gt), vec![Arg::Input(0), Arg::Input(2)], &b),
        node(Op::Select, vec![Arg::Node(0), Arg::Input(1), Arg::Input(2)], &f),
        node(Op::Convert { to: DType::F32 }, vec![Arg::Node(0)], &f),
        node(Op::Binary(BinaryOp::Mul), vec![Arg::Node(1), Arg::Node(2)], &f),
        node(Op::Unary(UnaryOp::Exp), vec![Arg::Input(0)], &f),
        node(Op::Unary(UnaryOp::Log1p), vec![Arg::Node(4)], &f),
        node(Op::Binary(BinaryOp::Div), vec![Arg::Input(0), Arg::Node(5)], &f),
        node(Op::Binary(BinaryOp::Sub), vec![Arg::Node(3), Arg::Node(6)], &f),
    ]);
    let ins = [with_specials(&mut rng, &shape), f32s(&mut rng, &shape, -1.0, 1.0), HostTensor::zeros(&f)];
    let refs: Vec<&HostTensor> = ins.iter().collect();
    let fused = be.compute_fused(&chain, &refs).unwrap().remove(0);
    let slow = weft_runtime::compute_unfused(&weft_runtime::CpuBackend::new(), &chain, &refs).unwrap().remove(0);
    assert!(fused.bitwise_eq(&slow), "fused chain differs from the interpreter's node-by-node result");

    // The same chain in bf16 storage, entered from f32 through a convert:
    // every bf16 node rounds, as the interpreter's ops do.
    let h = ty(DType::BF16, &shape);
    let mut half = chain.clone();
    for n in half.nodes.iter_mut() {
        if n.ty.dtype == DType::F32 {
            n.ty = h.clone();
        }
        if let Op::Convert { to } = &mut n.op {
            *to = DType::BF16;
        }
    }
    half.nodes.insert(0, node(Op::Convert { to: DType::BF16 }, vec![Arg::Input(3)], &h));
    for n in half.nodes.iter_mut().skip(1) {
        for a in n.args.iter_mut() {
            if let Arg::Node(i) = a {
                *i += 1;
            }
        }
    }
    let last = half.nodes.len() - 1;
    half.nodes.push(node(Op::Binary(BinaryOp::Add), vec![Arg::Node(last), Arg::Node(0)], &h));
    let ins = [
        with_specials(&mut rng, &shape).convert(DType::BF16),
        f32s(&mut rng, &shape, -1.0, 1.0).convert(DType::BF16),
        HostTensor::zeros(&h),
        f32s(&mut rng, &shape, -1.0, 1.0),
    ];
    let refs: Vec<&HostTensor> = ins.iter().collect();
    let fused = be.compute_fused(&half, &refs).unwrap().remove(0);
    let slow = weft_runtime::compute_unfused(&weft_runtime::CpuBackend::new(), &half, &refs).unwrap().remove(0);
    assert_eq!(fused.dtype(), DType::BF16);
    assert!(fused.bitwise_eq(&slow), "bf16 fused chain differs from the interpreter's node-by-node result");
}

/// Chains with splats (a scalar broadcast, a splat constant) and a trailing
/// reduction, as the fast backend plans them ([`FusionOptions::ALL`]):
/// bit for bit the same nodes run one by one on the fast backend, and the
/// interpreter's values to 1e-5 (its sums fold in another order), for rows
/// within one block, rows of several blocks, rows that fit neither (run
/// node by node) and half-precision splats.
/// Chains that read operands of other shapes through ordered broadcasts (a
/// layer norm's `(x - mean) * rstd * g + b`: statistics spread over
/// features, a scale and bias over rows, one operand with a dimension of
/// 1, one in bf16) equal their nodes run one by one, bitwise, on any
/// number of threads, in any vectors, and into a donated input.
#[test]
fn fused_broadcasts_equal_their_nodes_run_one_by_one() {
    let mut rng = Rng::new(17);
    for shape in [vec![3, 37, 50], vec![4, 128, 300], vec![2, 1, 5]] {
        let (b, t, c) = (shape[0], shape[1], shape[2]);
        let f = ty(DType::F32, &shape);
        let node = |op, args: Vec<Arg>| FusedNode { op, args, ty: f.clone() };
        let spread =
            |dims: Vec<usize>, k: usize| node(Op::BroadcastInDim { dims, shape: shape.clone() }, vec![Arg::Input(k)]);
        let chain = chain_of(vec![
            spread(vec![0, 1], 1),
            node(Op::Binary(BinaryOp::Sub), vec![Arg::Input(0), Arg::Node(0)]),
            spread(vec![0, 1, 2], 2),
            node(Op::Binary(BinaryOp::Mul), vec![Arg::Node(1), Arg::Node(2)]),
            spread(vec![2], 3),
            node(Op::Binary(BinaryOp::Mul), vec![Arg::Node(3), Arg::Node(4)]),
            FusedNode {
                op: Op::BroadcastInDim { dims: vec![2], shape: shape.clone() },
                args: vec![Arg::Input(4)],
                ty: ty(DType::BF16, &shape),
            },
            node(Op::Convert { to: DType::F32 }, vec![Arg::Node(6)]),
            node(Op::Binary(BinaryOp::Add), vec![Arg::Node(5), Arg::Node(7)]),
            spread(vec![1, 2], 5),
            node(Op::Binary(BinaryOp::Add), vec![Arg::Node(8), Arg::Node(9)]),
        ]);
        let ins = [
            with_specials(&mut rng, &shape),
            f32s(&mut rng, &[b, t], -1.0, 1.0),
            f32s(&mut rng, &[b, t, 1], 0.5, 2.0),
            f32s(&mut rng, &[c], -2.0, 2.0),
            f32s(&mut rng, &[c], -1.0, 1.0).convert(DType::BF16),
            f32s(&mut rng, &[t, c], -1.0, 1.0),
        ];
        let refs: Vec<&HostTensor> = ins.iter().collect();
        let slow = FastCpuBackend::new();
        let want = weft_runtime::compute_unfused(&slow, &chain, &refs).unwrap().remove(0);
        let interp = weft_runtime::compute_unfused(&weft_runtime::CpuBackend::new(), &chain, &refs).unwrap().remove(0);
        assert!(want.bitwise_eq(&interp), "{shape:?}: node by node differs from the interpreter");
        for isa in Isa::available() {
            for threads in [1, 2, 3] {
                let be = FastCpuBackend::new().with_threads(threads).with_isa(isa);
                let got = be.compute_fused(&chain, &refs).unwrap().remove(0);
                assert!(got.bitwise_eq(&want), "{shape:?} on {threads} threads in {isa:?}");
                let mut into: Vec<Option<&HostTensor>> = refs.iter().map(|&t| Some(t)).collect();
                into[0] = None;
                let got = be.compute_fused_into(&chain, &into, 0, ins[0].clone()).unwrap().remove(0);
                assert!(got.bitwise_eq(&want), "{shape:?} into the donor on {threads} threads in {isa:?}");
            }
        }
    }
    // A broadcast to its own shape (as partitioning leaves `[1, C] -> [B, C]`
    // on a device with one row) reading the donated input: not in place,
    // and the same bits.
    let shape = [1, 7];
    let f = ty(DType::F32, &shape);
    let node = |op, args: Vec<Arg>| FusedNode { op, args, ty: f.clone() };
    let chain = chain_of(vec![
        node(Op::BroadcastInDim { dims: vec![0, 1], shape: shape.to_vec() }, vec![Arg::Input(0)]),
        node(Op::Binary(BinaryOp::Mul), vec![Arg::Node(0), Arg::Input(1)]),
    ]);
    let (x, y) = (f32s(&mut rng, &shape, -1.0, 1.0), f32s(&mut rng, &shape, -1.0, 1.0));
    let be = FastCpuBackend::new();
    let want = weft_runtime::compute_unfused(&be, &chain, &[&x, &y]).unwrap().remove(0);
    let got = be.compute_fused_into(&chain, &[None, Some(&y)], 0, x.clone()).unwrap().remove(0);
    assert!(got.bitwise_eq(&want), "a broadcast of the donor");
}

#[test]
fn fused_splats_and_reductions_equal_their_nodes_run_one_by_one() {
    let be = FastCpuBackend::new();
    let mut rng = Rng::new(15);
    for (shape, dims, op) in [
        (vec![9, 40], vec![1], ReduceOp::Sum),
        (vec![5, 7, 64], vec![1, 2], ReduceOp::Sum),
        (vec![3, 4096], vec![1], ReduceOp::Sum),
        (vec![2, 2048], vec![0, 1], ReduceOp::Max),
        (vec![2, 1500], vec![1], ReduceOp::Min),
        (vec![6, 33], vec![0], ReduceOp::Sum),
    ] {
        let f = ty(DType::F32, &shape);
        let kept: Vec<usize> = (0..shape.len()).filter(|d| !dims.contains(d)).map(|d| shape[d]).collect();
        let node = |op, args: Vec<Arg>, t: &weft_ir::TensorType| FusedNode { op, args, ty: t.clone() };
        // sum((x - broadcast(lr) * g) * 0.5)
        let chain = chain_of(vec![
            node(Op::BroadcastInDim { dims: vec![], shape: shape.clone() }, vec![Arg::Input(0)], &f),
            node(Op::Binary(BinaryOp::Mul), vec![Arg::Node(0), Arg::Input(1)], &f),
            node(Op::Binary(BinaryOp::Sub), vec![Arg::Input(2), Arg::Node(1)], &f),
            node(Op::Constant(weft_ir::Literal::splat(f.clone(), 0.5)), vec![], &f),
            node(Op::Binary(BinaryOp::Mul), vec![Arg::Node(2), Arg::Node(3)], &f),
            node(Op::Reduce { op, dims: dims.clone() }, vec![Arg::Node(4)], &ty(DType::F32, &kept)),
        ]);
        let ins = [
            HostTensor::from_f32(&[], vec![0.01]).unwrap(),
            with_specials(&mut rng, &shape),
            f32s(&mut rng, &shape, -1.0, 1.0),
        ];
        let refs: Vec<&HostTensor> = ins.iter().collect();
        let fused = be.compute_fused(&chain, &refs).unwrap().remove(0);
        let node_by_node = weft_runtime::compute_unfused(&be, &chain, &refs).unwrap().remove(0);
        assert!(fused.bitwise_eq(&node_by_node), "{shape:?} over {dims:?}: fused differs from node by node");
        let interp = weft_runtime::compute_unfused(&weft_runtime::CpuBackend::new(), &chain, &refs).unwrap().remove(0);
        weft_ir::tensor::check_close(&fused, &interp, 1e-5, 1e-5).unwrap_or_else(|e| panic!("{shape:?}: {e}"));
    }
    // A bf16 chain: the broadcast scalar and the constant are bf16 values.
    let shape = [17, 30];
    let h = ty(DType::BF16, &shape);
    let node = |op, args: Vec<Arg>| FusedNode { op, args, ty: h.clone() };
    let chain = chain_of(vec![
        node(Op::BroadcastInDim { dims: vec![], shape: shape.to_vec() }, vec![Arg::Input(0)]),
        node(Op::Constant(weft_ir::Literal::splat(h.clone(), 0.1)), vec![]),
        node(Op::Binary(BinaryOp::Mul), vec![Arg::Node(0), Arg::Input(1)]),
        node(Op::Binary(BinaryOp::Add), vec![Arg::Node(2), Arg::Node(1)]),
    ]);
    let ins = [
        HostTensor::from_f32(&[], vec![0.3]).unwrap().convert(DType::BF16),
        f32s(&mut rng, &shape, -2.0, 2.0).convert(DType::BF16),
    ];
    let refs: Vec<&HostTensor> = ins.iter().collect();
    let fused = be.compute_fused(&chain, &refs).unwrap().remove(0);
    let interp = weft_runtime::compute_unfused(&weft_runtime::CpuBackend::new(), &chain, &refs).unwrap().remove(0);
    assert!(fused.bitwise_eq(&interp), "bf16 splat chain differs from the interpreter");
}

#[test]
fn indexing_ops_are_bit_exact() {
    use weft_ir::IndexOp;
    let be = FastCpuBackend::new();
    let mut rng = Rng::new(13);
    let table = with_specials(&mut rng, &[11, 5]);
    let ids = HostTensor::from_vec(&[3, 4], vec![0i32, 10, -1, 11, 3, 3, 7, i32::MIN, 2, 9, 1, 0]).unwrap();
    let gather = Op::Index(IndexOp::Gather { axis: 0, batch_dims: 0 });
    check_op(&be, &gather, &[table.clone(), ids.clone()], true, 0.0, 0.0);
    let upd = with_specials(&mut rng, &[3, 4, 5]);
    let scatter = Op::Index(IndexOp::ScatterAdd { axis: 0, batch_dims: 0, size: 11 });
    check_op(&be, &scatter, &[ids.clone(), upd], true, 0.0, 0.0);
    let logits = with_specials(&mut rng, &[6, 9]);
    let picked = HostTensor::from_vec(&[6], vec![0i32, 8, 9, -2, 4, 4]).unwrap();
    check_op(&be, &Op::Index(IndexOp::Gather { axis: 1, batch_dims: 1 }), &[logits.clone(), picked], true, 0.0, 0.0);
    for reverse in [false, true] {
        check_op(&be, &Op::Index(IndexOp::Cumsum { dim: 1, reverse }), &[logits.clone()], true, 0.0, 0.0);
    }
    for k in [0, 3, 9] {
        check_op(&be, &Op::Index(IndexOp::TopK { k }), &[logits.clone()], true, 0.0, 0.0);
    }
    let none = HostTensor::from_vec(&[0], Vec::<i32>::new()).unwrap();
    check_op(&be, &gather, &[table, none], true, 0.0, 0.0);
}

//! Every op's VJP checked against central finite differences in f64.
//!
//! Each case builds `loss(x[, y]) = sum(op(x[, y]) * w)` with a fixed random
//! weight tensor `w` (so the cotangent reaching the op is not uniform),
//! differentiates it with `value_and_grad`, and compares every gradient
//! element with `(loss(x + h e_i) - loss(x - h e_i)) / 2h` run on the
//! reference interpreter.

use weft_compiler::autodiff::{value_and_grad, GradOptions};
use weft_compiler::emit::Emitter;
use weft_ir::tensor::HostTensor;
use weft_ir::{
    BinaryOp, CompareOp, DType, DotDims, IndexOp, Literal, Module, Op, ReduceOp, TensorSharding, TensorType, UnaryOp,
    ValueId,
};

/// A small deterministic generator (SplitMix64) for test data.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }
    fn uniform(&mut self, lo: f64, hi: f64, n: usize) -> Vec<f64> {
        (0..n).map(|_| lo + (hi - lo) * self.next()).collect()
    }
}

/// Emits a case's function body from its parameters.
type Body = Box<dyn Fn(&mut Emitter<'_>, &[ValueId]) -> ValueId>;

struct Case {
    name: &'static str,
    inputs: Vec<(Vec<usize>, f64, f64)>,
    body: Body,
}

fn case(
    name: &'static str,
    inputs: Vec<(Vec<usize>, f64, f64)>,
    body: impl Fn(&mut Emitter<'_>, &[ValueId]) -> ValueId + 'static,
) -> Case {
    Case { name, inputs, body: Box::new(body) }
}

fn check(c: &Case, seed: u64) {
    let mut rng = Rng(seed);
    let mut e = Emitter::new("loss");
    let names: Vec<String> = (0..c.inputs.len()).map(|i| format!("x{i}")).collect();
    let params: Vec<ValueId> = c
        .inputs
        .iter()
        .zip(&names)
        .map(|((shape, _, _), n)| e.f.add_param(Some(n.clone()), TensorType::new(DType::F64, shape.clone())))
        .collect();
    let out = (c.body)(&mut e, &params);
    let ot = e.ty(out);
    let w = Literal::dense(ot.clone(), rng.uniform(-1.0, 1.0, ot.num_elements())).unwrap();
    let wv = e.op(Op::Constant(w), &[]);
    let prod = e.mul(out, wv);
    let loss = e.reduce_sum(prod, (0..ot.rank()).collect());
    e.f.results = vec![loss];
    let f = e.f;
    let m = Module { functions: vec![f.clone()] };
    weft_ir::verify_module(&m).unwrap_or_else(|err| panic!("{}: forward does not verify: {err}", c.name));
    let wrt: Vec<&str> = names.iter().map(|s| s.as_str()).collect();
    let g = value_and_grad(&m, &f, &wrt, &GradOptions::default()).unwrap();
    let gm = Module { functions: vec![g.clone()] };
    weft_ir::verify_module(&gm).unwrap_or_else(|err| panic!("{}: gradient function does not verify: {err}", c.name));

    let xs: Vec<Vec<f64>> = c.inputs.iter().map(|(s, lo, hi)| rng.uniform(*lo, *hi, s.iter().product())).collect();
    let tensors = |xs: &[Vec<f64>]| -> Vec<HostTensor> {
        c.inputs.iter().zip(xs).map(|((s, _, _), v)| HostTensor::from_f64(s, v.clone()).unwrap()).collect()
    };
    let outs = weft_ir::interp::run(&gm, &g.name, &tensors(&xs)).unwrap();
    let loss_at = |xs: &[Vec<f64>]| weft_ir::interp::run(&m, "loss", &tensors(xs)).unwrap()[0].to_f64_vec()[0];
    assert!((outs[0].to_f64_vec()[0] - loss_at(&xs)).abs() < 1e-12, "{}: value differs", c.name);
    let h = 1e-6;
    for (k, x) in xs.iter().enumerate() {
        let grad = outs[1 + k].to_f64_vec();
        for i in 0..x.len() {
            let mut plus = xs.clone();
            plus[k][i] += h;
            let mut minus = xs.clone();
            minus[k][i] -= h;
            let fd = (loss_at(&plus) - loss_at(&minus)) / (2.0 * h);
            let err = (grad[i] - fd).abs() / fd.abs().max(1.0);
            assert!(
                err < 1e-6,
                "{}: d/d{}[{i}]: autodiff {} vs finite difference {fd} (rel err {err:e})",
                c.name,
                names[k],
                grad[i]
            );
        }
    }
}

fn s(v: &[usize]) -> Vec<usize> {
    v.to_vec()
}

fn cases() -> Vec<Case> {
    let mut cs = vec![];
    let unary = [
        (UnaryOp::Neg, -2.0, 2.0),
        (UnaryOp::Abs, 0.5, 2.0),
        (UnaryOp::Exp, -1.0, 1.0),
        (UnaryOp::Log, 0.5, 2.0),
        (UnaryOp::Log1p, -0.5, 2.0),
        (UnaryOp::Tanh, -2.0, 2.0),
        (UnaryOp::Cos, -3.0, 3.0),
        (UnaryOp::Sin, -3.0, 3.0),
        (UnaryOp::Logistic, -3.0, 3.0),
        (UnaryOp::Sqrt, 0.5, 2.0),
        (UnaryOp::Rsqrt, 0.5, 2.0),
    ];
    for (u, lo, hi) in unary {
        cs.push(case(u.name(), vec![(s(&[2, 3]), lo, hi)], move |e, p| e.unary(u, p[0])));
    }
    // abs on negative inputs too
    cs.push(case("abs_negative", vec![(s(&[4]), -2.0, -0.5)], |e, p| e.unary(UnaryOp::Abs, p[0])));
    let binary = [
        (BinaryOp::Add, (-1.0, 1.0), (-1.0, 1.0)),
        (BinaryOp::Sub, (-1.0, 1.0), (-1.0, 1.0)),
        (BinaryOp::Mul, (-1.0, 1.0), (-1.0, 1.0)),
        (BinaryOp::Div, (-1.0, 1.0), (1.0, 2.0)),
        (BinaryOp::Rem, (5.2, 5.8), (2.0, 2.2)),
        (BinaryOp::Max, (0.0, 1.0), (2.0, 3.0)),
        (BinaryOp::Min, (0.0, 1.0), (2.0, 3.0)),
        (BinaryOp::Pow, (0.5, 2.0), (-1.5, 1.5)),
    ];
    for (b, (l0, h0), (l1, h1)) in binary {
        cs.push(case(b.name(), vec![(s(&[2, 3]), l0, h0), (s(&[2, 3]), l1, h1)], move |e, p| e.binary(b, p[0], p[1])));
        if !matches!(b, BinaryOp::Pow | BinaryOp::Div) {
            // The same op with the operand ranges swapped (pow needs a
            // positive base and div a divisor away from zero).
            cs.push(case(b.name(), vec![(s(&[2, 3]), l1, h1), (s(&[2, 3]), l0, h0)], move |e, p| {
                e.binary(b, p[0], p[1])
            }));
        }
    }
    cs.push(case("select", vec![(s(&[5]), -1.0, 1.0), (s(&[5]), -1.0, 1.0)], |e, p| {
        let pred = e.compare(CompareOp::Gt, p[0], p[1]);
        let sq = e.mul(p[0], p[0]);
        e.select(pred, sq, p[1])
    }));
    cs.push(case("convert", vec![(s(&[3]), -1.0, 1.0)], |e, p| {
        let m = e.mul(p[0], p[0]);
        e.op(Op::Convert { to: DType::F64 }, &[m])
    }));
    cs.push(case("broadcast_in_dim", vec![(s(&[3, 1]), -1.0, 1.0)], |e, p| {
        e.op(Op::BroadcastInDim { dims: vec![0, 2], shape: vec![3, 2, 4] }, &[p[0]])
    }));
    cs.push(case("reshape", vec![(s(&[2, 6]), -1.0, 1.0)], |e, p| e.op(Op::Reshape { shape: vec![3, 4] }, &[p[0]])));
    cs.push(case("transpose", vec![(s(&[2, 3, 4]), -1.0, 1.0)], |e, p| {
        e.op(Op::Transpose { perm: vec![2, 0, 1] }, &[p[0]])
    }));
    cs.push(case("slice", vec![(s(&[5, 7]), -1.0, 1.0)], |e, p| {
        e.op(Op::Slice { start: vec![1, 0], limit: vec![5, 7], stride: vec![2, 3] }, &[p[0]])
    }));
    cs.push(case("concatenate", vec![(s(&[2, 3]), -1.0, 1.0), (s(&[2, 2]), -1.0, 1.0)], |e, p| {
        let sq = e.mul(p[1], p[1]);
        e.op(Op::Concatenate { dim: 1 }, &[p[0], sq])
    }));
    cs.push(case("pad", vec![(s(&[3, 4]), -1.0, 1.0), (s(&[]), -1.0, 1.0)], |e, p| {
        e.op(Op::Pad { low: vec![1, -1], high: vec![2, 1], interior: vec![1, 0] }, &[p[0], p[1]])
    }));
    cs.push(case("dot_general_matmul", vec![(s(&[3, 4]), -1.0, 1.0), (s(&[4, 2]), -1.0, 1.0)], |e, p| {
        e.dot(p[0], p[1], DotDims::matmul())
    }));
    cs.push(case("dot_general_batched", vec![(s(&[4, 2, 3]), -1.0, 1.0), (s(&[2, 5, 4]), -1.0, 1.0)], |e, p| {
        // lhs [k=4, b=2, i=3], rhs [b=2, j=5, k=4] -> [b, i, j]
        e.dot(
            p[0],
            p[1],
            DotDims { lhs_batch: vec![1], rhs_batch: vec![0], lhs_contract: vec![0], rhs_contract: vec![2] },
        )
    }));
    cs.push(case("dot_general_two_contract", vec![(s(&[2, 3, 4]), -1.0, 1.0), (s(&[4, 5, 3]), -1.0, 1.0)], |e, p| {
        e.dot(
            p[0],
            p[1],
            DotDims { lhs_batch: vec![], rhs_batch: vec![], lhs_contract: vec![2, 1], rhs_contract: vec![0, 2] },
        )
    }));
    cs.push(case("reduce_sum", vec![(s(&[2, 3, 4]), -1.0, 1.0)], |e, p| {
        e.op(Op::Reduce { op: ReduceOp::Sum, dims: vec![0, 2] }, &[p[0]])
    }));
    for r in [ReduceOp::Max, ReduceOp::Min] {
        cs.push(case(r.name(), vec![(s(&[3, 4]), -1.0, 1.0)], move |e, p| {
            e.op(Op::Reduce { op: r, dims: vec![1] }, &[p[0]])
        }));
    }
    // The indexing ops: repeated and out-of-range indices included.
    let ids = |e: &mut Emitter<'_>, shape: &[usize], v: &[f64]| {
        let ty = TensorType::new(DType::I32, shape.to_vec());
        e.op(Op::Constant(Literal { ty, data: weft_ir::LiteralData::Dense(v.to_vec()) }), &[])
    };
    cs.push(case("gather_rows", vec![(s(&[4, 3]), -1.0, 1.0)], move |e, p| {
        let i = ids(e, &[2, 3], &[3.0, 0.0, -1.0, 1.0, 4.0, 1.0]);
        let sq = e.mul(p[0], p[0]);
        e.op(Op::Index(IndexOp::Gather { axis: 0, batch_dims: 0 }), &[sq, i])
    }));
    cs.push(case("gather_batched", vec![(s(&[3, 5]), -1.0, 1.0)], move |e, p| {
        let i = ids(e, &[3, 2], &[4.0, 4.0, 0.0, 2.0, 1.0, 7.0]);
        e.op(Op::Index(IndexOp::Gather { axis: 1, batch_dims: 1 }), &[p[0], i])
    }));
    cs.push(case("scatter_add", vec![(s(&[2, 3, 2]), -1.0, 1.0)], move |e, p| {
        let i = ids(e, &[3], &[2.0, 0.0, 2.0]);
        let sq = e.mul(p[0], p[0]);
        e.op(Op::Index(IndexOp::ScatterAdd { axis: 1, batch_dims: 0, size: 4 }), &[i, sq])
    }));
    for reverse in [false, true] {
        cs.push(case("cumsum", vec![(s(&[3, 4]), -1.0, 1.0)], move |e, p| {
            let sq = e.mul(p[0], p[0]);
            e.op(Op::Index(IndexOp::Cumsum { dim: 1, reverse }), &[sq])
        }));
    }
    cs.push(case("top_k_values", vec![(s(&[3, 5]), -1.0, 1.0)], |e, p| {
        let k = e.op(Op::Index(IndexOp::TopK { k: 2 }), &[p[0]]);
        e.op(Op::Index(IndexOp::Gather { axis: 1, batch_dims: 1 }), &[p[0], k])
    }));
    cs.push(case("sharding_constraint", vec![(s(&[2, 2]), -1.0, 1.0)], |e, p| {
        let sq = e.mul(p[0], p[0]);
        e.op(Op::ShardingConstraint { sharding: TensorSharding::new(&[&["x"], &[]]) }, &[sq])
    }));
    cs.push(case("fan_out_accumulates", vec![(s(&[3]), 0.5, 1.5)], |e, p| {
        let a = e.unary(UnaryOp::Exp, p[0]);
        let b = e.unary(UnaryOp::Log, p[0]);
        let c = e.mul(a, b);
        e.mul(c, p[0])
    }));
    cs
}

#[test]
fn every_vjp_matches_finite_differences() {
    for (i, c) in cases().iter().enumerate() {
        check(c, 1000 + i as u64);
    }
}

#[test]
fn reduce_max_ties_split_evenly() {
    // max over [1, 3, 3]: d/dx = [0, 0.5, 0.5] (lax's reduce chooser rule).
    let mut e = Emitter::new("loss");
    let x = e.f.add_param(Some("x".into()), TensorType::new(DType::F64, vec![3]));
    let y = e.op(Op::Reduce { op: ReduceOp::Max, dims: vec![0] }, &[x]);
    e.f.results = vec![y];
    let m = Module { functions: vec![e.f.clone()] };
    let g = value_and_grad(&m, &e.f, &["x"], &GradOptions::default()).unwrap();
    let gm = Module { functions: vec![g.clone()] };
    let out = weft_ir::interp::run(&gm, &g.name, &[HostTensor::from_f64(&[3], vec![1.0, 3.0, 3.0]).unwrap()]).unwrap();
    assert_eq!(out[1].to_f64_vec(), vec![0.0, 0.5, 0.5]);
}

#[test]
fn errors_name_the_offending_parameter() {
    let mut e = Emitter::new("loss");
    let x = e.f.add_param(Some("x".into()), TensorType::new(DType::F32, vec![2]));
    let n = e.f.add_param(Some("step".into()), TensorType::scalar(DType::I32));
    let s = e.reduce_sum(x, vec![0]);
    e.f.results = vec![s, n];
    let m = Module { functions: vec![e.f.clone()] };
    let err = value_and_grad(&m, &e.f, &["step"], &GradOptions::default()).unwrap_err().to_string();
    assert!(err.contains("`step`") && err.contains("i32[]"), "{err}");
    let err = value_and_grad(&m, &e.f, &["w"], &GradOptions::default()).unwrap_err().to_string();
    assert!(err.contains("no such parameter") && err.contains("x, step"), "{err}");
    let mut e2 = Emitter::new("vec_loss");
    let x2 = e2.f.add_param(Some("x".into()), TensorType::new(DType::F32, vec![2]));
    e2.f.results = vec![x2];
    let err = value_and_grad(&m, &e2.f, &["x"], &GradOptions::default()).unwrap_err().to_string();
    assert!(err.contains("must be a float scalar"), "{err}");
}

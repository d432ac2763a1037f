//! Issue "SPMD partitioner": for every op kind, several input shardings and
//! the meshes (1,), (2,), (2,2), (2,4), (4,2), (8,), propagate -> partition
//! -> simulate must equal the unsharded interpreter (f32, 1e-5 relative).
//! Partitioning changes the communication, never the mathematics.
mod partition_support;
use partition_support::*;
use weft_ir::{
    infer, BinaryOp, CompareOp, DType, DotDims, Function, Literal, NoFunctions, Op, ReduceOp, TensorType, UnaryOp,
    ValueId,
};

/// A function under construction, with inferred result types.
struct F(Function);

impl F {
    fn op(&mut self, op: Op, operands: &[ValueId]) -> ValueId {
        let tys: Vec<&TensorType> = operands.iter().map(|&o| self.0.ty(o)).collect();
        let res = infer(&op, &tys, &NoFunctions).unwrap_or_else(|e| panic!("test program is ill-typed: {e}"));
        let id = self.0.add_inst(op, operands.to_vec(), res.into_iter().map(|t| (t, None)).collect(), None);
        self.0.insts[id.index()].results[0]
    }
}

fn f32t(shape: &[usize]) -> TensorType {
    TensorType::new(DType::F32, shape.to_vec())
}

type Body = fn(&mut F, &[ValueId]) -> Vec<ValueId>;

/// One op family: parameter types and the body.
struct Case {
    name: &'static str,
    params: Vec<TensorType>,
    body: Body,
}

fn case(name: &'static str, params: &[&[usize]], body: Body) -> Case {
    Case { name, params: params.iter().map(|s| f32t(s)).collect(), body }
}

fn build(c: &Case, annotations: &[Option<String>]) -> Function {
    let mut f = F(Function::new(c.name));
    let ps: Vec<ValueId> = c
        .params
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let v = f.0.add_param(Some(format!("p{i}")), t.clone());
            f.0.values[v.index()].sharding = annotations[i].as_deref().map(parse_sharding);
            v
        })
        .collect();
    let rs = (c.body)(&mut f, &ps);
    f.0.results = rs;
    f.0
}

/// Runs every case on every mesh under `per_param` annotation choices per
/// parameter (all combinations); reports every failure.
fn run_cases(cases: &[Case], per_param: usize) {
    let mut failures = Vec::new();
    let mut runs = 0;
    for c in cases {
        for mesh in meshes() {
            let choices: Vec<Vec<Option<String>>> =
                c.params.iter().map(|t| choices(&mesh, &t.shape, per_param)).collect();
            let mut combos: Vec<Vec<Option<String>>> = vec![vec![]];
            for ch in &choices {
                combos = combos
                    .into_iter()
                    .flat_map(|pre| ch.iter().map(move |o| [pre.clone(), vec![o.clone()]].concat()))
                    .collect();
            }
            for (k, ann) in combos.iter().enumerate() {
                let f = build(c, ann);
                let inputs: Vec<_> = c.params.iter().enumerate().map(|(i, t)| input(t, (k * 7 + i) as u64)).collect();
                runs += 1;
                if let Err(e) = check_equivalent(&f, &mesh, &inputs) {
                    failures.push(format!("{} on ({mesh}) with {ann:?}: {e}", c.name));
                }
            }
        }
    }
    assert!(runs > 0);
    assert!(failures.is_empty(), "{} of {runs} runs failed:\n\n{}", failures.len(), failures.join("\n\n"));
    println!("{runs} partitioned runs equal the interpreter");
}

#[test]
fn elementwise_ops() {
    run_cases(
        &[
            case("unary", &[&[8, 8]], |f, p| {
                let e = f.op(Op::Unary(UnaryOp::Tanh), &[p[0]]);
                vec![f.op(Op::Unary(UnaryOp::Neg), &[e])]
            }),
            case("binary", &[&[8, 8], &[8, 8]], |f, p| {
                let a = f.op(Op::Binary(BinaryOp::Add), &[p[0], p[1]]);
                let m = f.op(Op::Binary(BinaryOp::Mul), &[a, p[1]]);
                vec![f.op(Op::Binary(BinaryOp::Max), &[m, p[0]])]
            }),
            case("compare_select", &[&[8, 8], &[8, 8]], |f, p| {
                let c = f.op(Op::Compare(CompareOp::Gt), &[p[0], p[1]]);
                vec![f.op(Op::Select, &[c, p[0], p[1]])]
            }),
            case("convert", &[&[8, 8]], |f, p| {
                let d = f.op(Op::Convert { to: DType::F64 }, &[p[0]]);
                let e = f.op(Op::Unary(UnaryOp::Exp), &[d]);
                vec![f.op(Op::Convert { to: DType::F32 }, &[e])]
            }),
        ],
        6,
    );
}

#[test]
fn shape_ops() {
    run_cases(
        &[
            case("broadcast_in_dim", &[&[8], &[8, 8]], |f, p| {
                let b = f.op(Op::BroadcastInDim { dims: vec![1], shape: vec![8, 8] }, &[p[0]]);
                vec![f.op(Op::Binary(BinaryOp::Add), &[b, p[1]])]
            }),
            case("broadcast_expand", &[&[1, 8]], |f, p| {
                vec![f.op(Op::BroadcastInDim { dims: vec![0, 2], shape: vec![8, 4, 8] }, &[p[0]])]
            }),
            case("reshape_merge", &[&[8, 8]], |f, p| vec![f.op(Op::Reshape { shape: vec![64] }, &[p[0]])]),
            case("reshape_split", &[&[8, 16]], |f, p| vec![f.op(Op::Reshape { shape: vec![4, 2, 16] }, &[p[0]])]),
            case("reshape_tangled", &[&[8, 6]], |f, p| vec![f.op(Op::Reshape { shape: vec![6, 8] }, &[p[0]])]),
            case("transpose", &[&[8, 8, 2]], |f, p| vec![f.op(Op::Transpose { perm: vec![1, 2, 0] }, &[p[0]])]),
            case("slice", &[&[8, 16]], |f, p| {
                vec![f.op(Op::Slice { start: vec![0, 2], limit: vec![8, 14], stride: vec![1, 3] }, &[p[0]])]
            }),
            case("concatenate", &[&[8, 8], &[8, 8]], |f, p| {
                let c = f.op(Op::Concatenate { dim: 1 }, &[p[0], p[1]]);
                vec![f.op(Op::Concatenate { dim: 0 }, &[c, c])]
            }),
            case("pad", &[&[8, 8]], |f, p| {
                let z = f.op(Op::Constant(Literal::scalar(DType::F32, 0.5)), &[]);
                vec![f.op(Op::Pad { low: vec![0, 2], high: vec![0, -1], interior: vec![0, 1] }, &[p[0], z])]
            }),
        ],
        6,
    );
}

#[test]
fn contractions_and_reductions() {
    run_cases(
        &[
            case("matmul", &[&[8, 16], &[16, 8]], |f, p| vec![f.op(Op::DotGeneral(DotDims::matmul()), &[p[0], p[1]])]),
            case("batched_dot", &[&[4, 8, 8], &[4, 8, 8]], |f, p| {
                let dims =
                    DotDims { lhs_batch: vec![0], rhs_batch: vec![0], lhs_contract: vec![2], rhs_contract: vec![1] };
                vec![f.op(Op::DotGeneral(dims), &[p[0], p[1]])]
            }),
            case("reduce_sum", &[&[8, 16]], |f, p| {
                let a = f.op(Op::Reduce { op: ReduceOp::Sum, dims: vec![0] }, &[p[0]]);
                let b = f.op(Op::Reduce { op: ReduceOp::Sum, dims: vec![1] }, &[p[0]]);
                let c = f.op(Op::Reduce { op: ReduceOp::Sum, dims: vec![0, 1] }, &[p[0]]);
                vec![a, b, c]
            }),
            case("reduce_max_min", &[&[8, 16]], |f, p| {
                let a = f.op(Op::Reduce { op: ReduceOp::Max, dims: vec![1] }, &[p[0]]);
                let b = f.op(Op::Reduce { op: ReduceOp::Min, dims: vec![0] }, &[p[0]]);
                vec![a, b]
            }),
            case("mlp", &[&[8, 16], &[16, 8], &[8, 16]], |f, p| {
                let h = f.op(Op::DotGeneral(DotDims::matmul()), &[p[0], p[1]]);
                let a = f.op(Op::Unary(UnaryOp::Tanh), &[h]);
                let o = f.op(Op::DotGeneral(DotDims::matmul()), &[a, p[2]]);
                let s = f.op(Op::Binary(BinaryOp::Mul), &[o, o]);
                vec![o, f.op(Op::Reduce { op: ReduceOp::Sum, dims: vec![0, 1] }, &[s])]
            }),
        ],
        4,
    );
}

#[test]
fn position_dependent_ops() {
    run_cases(
        &[
            case("iota", &[&[8, 8]], |f, p| {
                let i0 = f.op(Op::Iota { dim: 0, ty: f32t(&[8, 8]) }, &[]);
                let i1 = f.op(Op::Iota { dim: 1, ty: f32t(&[8, 8]) }, &[]);
                let a = f.op(Op::Binary(BinaryOp::Add), &[p[0], i0]);
                let m = f.op(Op::Binary(BinaryOp::Mul), &[a, i1]);
                vec![m]
            }),
            case("dense_constant", &[&[8, 4]], |f, p| {
                let vals: Vec<f64> = (0..32).map(|i| i as f64 * 0.25 - 3.0).collect();
                let c = f.op(Op::Constant(Literal::dense(f32t(&[8, 4]), vals).unwrap()), &[]);
                vec![f.op(Op::Binary(BinaryOp::Sub), &[p[0], c])]
            }),
            case("splat_constant", &[&[8, 4]], |f, p| {
                let c = f.op(Op::Constant(Literal::splat(f32t(&[8, 4]), 2.0)), &[]);
                vec![f.op(Op::Binary(BinaryOp::Div), &[p[0], c])]
            }),
            case("causal_mask", &[&[8, 8]], |f, p| {
                let r = f.op(Op::Iota { dim: 0, ty: TensorType::new(DType::I32, vec![8, 8]) }, &[]);
                let c = f.op(Op::Iota { dim: 1, ty: TensorType::new(DType::I32, vec![8, 8]) }, &[]);
                let keep = f.op(Op::Compare(CompareOp::Ge), &[r, c]);
                let z = f.op(Op::Constant(Literal::splat(f32t(&[8, 8]), 0.0)), &[]);
                vec![f.op(Op::Select, &[keep, p[0], z])]
            }),
        ],
        8,
    );
}

/// Integer indices from an `f32` parameter in [-1, 1): `convert(x * s)`,
/// so some fall out of range (negative, or past an extent below `s`).
fn indices(f: &mut F, x: ValueId, s: f64) -> ValueId {
    let ty = f.0.ty(x).clone();
    let k = f.op(Op::Constant(Literal::splat(ty, s)), &[]);
    let m = f.op(Op::Binary(BinaryOp::Mul), &[x, k]);
    f.op(Op::Convert { to: DType::I32 }, &[m])
}

#[test]
fn indexing_ops() {
    use weft_ir::IndexOp;
    run_cases(
        &[
            // An embedding lookup and its transpose: a split table gathers
            // locally and sums; split tokens scatter into partial sums.
            case("gather_rows_and_scatter_back", &[&[8, 8], &[4, 8]], |f, p| {
                let ids = indices(f, p[1], 10.0);
                let g = f.op(Op::Index(IndexOp::Gather { axis: 0, batch_dims: 0 }), &[p[0], ids]);
                let s = f.op(Op::Index(IndexOp::ScatterAdd { axis: 0, batch_dims: 0, size: 8 }), &[ids, g]);
                // A table gradient split over rows: each device adds its own.
                let rows = weft_ir::TensorSharding::new(&[&["x"], &[]]);
                let split = f.op(Op::ShardingConstraint { sharding: rows }, &[s]);
                vec![g, s, split]
            }),
            // Cross-entropy's pick of the target's logit.
            case("take_along_axis", &[&[8, 8], &[8]], |f, p| {
                let ids = indices(f, p[1], 8.0);
                let g = f.op(Op::Index(IndexOp::Gather { axis: 1, batch_dims: 1 }), &[p[0], ids]);
                let s = f.op(Op::Index(IndexOp::ScatterAdd { axis: 1, batch_dims: 1, size: 8 }), &[ids, g]);
                let cols = weft_ir::TensorSharding::new(&[&[], &["x"]]);
                let split = f.op(Op::ShardingConstraint { sharding: cols }, &[s]);
                vec![g, s, split]
            }),
            case("cumsum_and_top_k", &[&[8, 8]], |f, p| {
                let c = f.op(Op::Index(IndexOp::Cumsum { dim: 1, reverse: true }), &[p[0]]);
                let k = f.op(Op::Index(IndexOp::TopK { k: 3 }), &[c]);
                let v = f.op(Op::Index(IndexOp::Gather { axis: 1, batch_dims: 1 }), &[c, k]);
                vec![c, k, v]
            }),
        ],
        6,
    );
}

fn typed_case(name: &'static str, params: &[(DType, &[usize])], body: Body) -> Case {
    Case { name, params: params.iter().map(|(d, s)| TensorType::new(*d, s.to_vec())).collect(), body }
}

#[test]
fn integer_bool_and_passthrough() {
    run_cases(
        &[
            typed_case("i32_dot_and_sum", &[(DType::I32, &[8, 8]), (DType::I32, &[8, 8])], |f, p| {
                let d = f.op(Op::DotGeneral(DotDims::matmul()), &[p[0], p[1]]);
                let s = f.op(Op::Reduce { op: ReduceOp::Sum, dims: vec![1] }, &[d]);
                let m = f.op(Op::Reduce { op: ReduceOp::Max, dims: vec![0] }, &[d]);
                vec![s, m]
            }),
            typed_case("bool_select_scalar_pred", &[(DType::Bool, &[]), (DType::F32, &[8, 8])], |f, p| {
                let n = f.op(Op::Unary(UnaryOp::Neg), &[p[1]]);
                vec![f.op(Op::Select, &[p[0], p[1], n])]
            }),
            typed_case("convert_to_int", &[(DType::F32, &[8, 8])], |f, p| {
                let s = f.op(Op::Constant(Literal::splat(f32t(&[8, 8]), 8.0)), &[]);
                let m = f.op(Op::Binary(BinaryOp::Mul), &[p[0], s]);
                let i = f.op(Op::Convert { to: DType::I32 }, &[m]);
                vec![f.op(Op::Reduce { op: ReduceOp::Sum, dims: vec![0, 1] }, &[i])]
            }),
            // Results that are parameters, twice, and an unused parameter.
            case("passthrough", &[&[8, 8], &[8, 8]], |f, p| {
                let n = f.op(Op::Unary(UnaryOp::Neg), &[p[0]]);
                vec![p[0], n, p[0]]
            }),
        ],
        6,
    );
}

/// Intermediate `sharding_constraint`s and result annotations, chosen from
/// the same catalogue as parameter annotations: every reshard between them
/// is lowered and checked.
#[test]
fn constraints_and_result_annotations() {
    let mut failures = Vec::new();
    let mut runs = 0;
    for mesh in meshes() {
        let opts = choices(&mesh, &[8, 16], 5);
        for (i, pa) in opts.iter().enumerate() {
            for (j, ca) in opts.iter().enumerate().skip(1) {
                for ra in opts.iter().take(3) {
                    let mut f = F(Function::new("constrained"));
                    let x = f.0.add_param(Some("x".into()), f32t(&[8, 16]));
                    f.0.values[x.index()].sharding = pa.as_deref().map(parse_sharding);
                    let w = f.0.add_param(Some("w".into()), f32t(&[16, 16]));
                    let t = f.op(Op::Unary(UnaryOp::Tanh), &[x]);
                    let c = f.op(Op::ShardingConstraint { sharding: parse_sharding(ca.as_deref().unwrap()) }, &[t]);
                    let d = f.op(Op::DotGeneral(DotDims::matmul()), &[c, w]);
                    let r = f.op(Op::Reduce { op: ReduceOp::Sum, dims: vec![1] }, &[d]);
                    f.0.results = vec![d, r];
                    f.0.result_shardings = vec![ra.as_deref().map(parse_sharding), None];
                    let inputs = [input(&f32t(&[8, 16]), (i * 31 + j) as u64), input(&f32t(&[16, 16]), 5)];
                    runs += 1;
                    if let Err(e) = check_equivalent(&f.0, &mesh, &inputs) {
                        failures.push(format!("({mesh}) x {pa:?}, constraint {ca:?}, result {ra:?}: {e}"));
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{} of {runs} runs failed:\n\n{}", failures.len(), failures.join("\n\n"));
    println!("{runs} constrained programs equal the interpreter");
}

/// A mixture-of-experts layer with its groups split over `data` and
/// `expert` and its experts over `expert` (expert parallelism): the
/// partitioned program equals the interpreter, and the tokens reach their
/// experts' devices by an all-to-all (GShard's pattern, chosen by the
/// partitioner's costs: with expert weights larger than a group's tokens,
/// as in real models, moving the tokens is cheaper than gathering the
/// weights; with tiny experts it gathers the weights instead).
#[test]
fn mixture_of_experts_over_an_expert_axis() {
    use weft_ir::builder::FunctionBuilder;
    for (mesh, groups) in
        [("data=2,expert=4", "data, expert"), ("expert=4", "expert"), ("data=2,expert=2", "data, expert")]
    {
        let mesh = weft_compiler::sharding::Mesh::parse(mesh).unwrap();
        let f = FunctionBuilder::new("moe");
        let x = f.param_sharded("x", DType::F32, &[8, 6, 8], parse_sharding(&format!("[{{{groups}}}, {{}}, {{}}]")));
        let r = f.param("r", DType::F32, &[8, 4]);
        let experts = parse_sharding("[{expert}, {}, {}]");
        let w1 = f.param_sharded("w1", DType::F32, &[4, 8, 256], experts.clone());
        let w2 = f.param_sharded("w2", DType::F32, &[4, 256, 8], experts);
        let out = f.moe(x, r, w1, w2, 2, 1.0);
        f.set_results(&[out.y, out.aux_loss, out.dropped]);
        let func = f.finish().unwrap();
        let inputs: Vec<_> = func.params.iter().enumerate().map(|(i, &p)| input(func.ty(p), i as u64)).collect();
        let pf = check_equivalent(&func, &mesh, &inputs).unwrap_or_else(|e| panic!("on ({mesh}): {e}"));
        let text = weft_ir::device::print_program(&pf.program);
        let report = pf.report();
        println!("moe on ({mesh}): {:?}", report.collectives);
        assert!(text.contains("all_to_all"), "on ({mesh}): no all-to-all:\n{text}");
    }
}

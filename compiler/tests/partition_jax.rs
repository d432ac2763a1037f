//! The JAX explicit-sharding dot and reduce cases of
//! `shared/reference-cases.md` (jax `tests/pjit_test.py`,
//! `ShardingInTypesTest`), partitioned: each produces the listed result
//! sharding and exactly the listed collectives in the device program, and
//! the simulated result equals the interpreter's.
mod partition_support;
use partition_support::*;
use weft_compiler::sharding::{fmt_sharding, Mesh};
use weft_ir::{DType, DotDims, Function, Op, ReduceOp, TensorType, ValueId};

fn mesh() -> Mesh {
    Mesh::parse("x=2,y=2").unwrap()
}

fn param(f: &mut Function, name: &str, shape: &[usize], s: &str) -> ValueId {
    let v = f.add_param(Some(name.into()), TensorType::new(DType::F32, shape.to_vec()));
    f.values[v.index()].sharding = Some(parse_sharding(s));
    v
}

fn inst(f: &mut Function, op: Op, operands: &[ValueId]) -> ValueId {
    let tys: Vec<&TensorType> = operands.iter().map(|&o| f.ty(o)).collect();
    let t = weft_ir::infer(&op, &tys, &weft_ir::NoFunctions).unwrap().remove(0);
    let id = f.add_inst(op, operands.to_vec(), vec![(t, None)], None);
    f.insts[id.index()].results[0]
}

/// `x @ y` for `x: f32[m,k]`, `y: f32[k,n]` with the given specs.
fn dot(lhs: &str, rhs: &str, m: usize, k: usize, n: usize, out: Option<&str>) -> Function {
    let mut f = Function::new("dot");
    let a = param(&mut f, "x", &[m, k], lhs);
    let b = param(&mut f, "y", &[k, n], rhs);
    let r = inst(&mut f, Op::DotGeneral(DotDims::matmul()), &[a, b]);
    f.results = vec![r];
    f.result_shardings = vec![out.map(parse_sharding)];
    f
}

/// Partitions and runs `f`; returns the result sharding and the
/// collectives emitted (`kind{axes}`), in program order.
fn lower(f: &Function) -> (String, Vec<String>) {
    let ins: Vec<_> = f.params.iter().enumerate().map(|(i, &p)| input(f.ty(p), i as u64)).collect();
    let pf = check_equivalent(f, &mesh(), &ins).unwrap_or_else(|e| panic!("{e}"));
    let colls = pf
        .program
        .steps
        .iter()
        .filter_map(|s| match s {
            weft_ir::device::Step::Collective { op, .. } => {
                let attrs = weft_ir::device::printer::collective_attrs(op);
                let axes = attrs.split("axes = [").nth(1).map(|a| a.split(']').next().unwrap().to_string());
                Some(format!("{}{{{}}}", op.name(), axes.unwrap_or_default()))
            }
            _ => None,
        })
        .collect();
    (fmt_sharding(&pf.outputs[0].sharding), colls)
}

#[test]
fn jax_dot_cases() {
    // (lhs, rhs, result spec, collectives JAX emits)
    let cases: [(&str, &str, &str, &[&str]); 5] = [
        ("[{x}, {}]", "[{}, {y}]", "[{x}, {y}]", &[]),
        ("[{x}, {}]", "[{}, {}]", "[{x}, {}]", &[]),
        ("[{x}, {y}]", "[{}, {}]", "[{x}, {}]", &["all_gather{y}"]),
        ("[{x}, {}]", "[{x}, {}]", "[{x}, {}]", &["all_gather{x}"]),
        ("[{}, {y}]", "[{}, {y}]", "[{}, {y}]", &["all_gather{y}"]),
    ];
    for (lhs, rhs, want, colls) in cases {
        let (got, emitted) = lower(&dot(lhs, rhs, 8, 2, 8, None));
        assert_eq!(got, want, "{lhs} @ {rhs}");
        assert_eq!(emitted, colls.to_vec(), "{lhs} @ {rhs}");
    }
}

#[test]
fn contracting_dims_sharded_give_a_partial_product_then_a_reduction() {
    // Result left to propagation: the partial product is all-reduced over y.
    let (got, emitted) = lower(&dot("[{x}, {y}]", "[{y}, {}]", 8, 2, 8, None));
    assert_eq!((got.as_str(), emitted), ("[{x}, {}]", vec!["all_reduce{y}".to_string()]));
    // Requested sharded on y: for the tiny case gathering the contracting
    // dimension is cheaper (specs/sharding.md §9) ...
    let (got, emitted) = lower(&dot("[{x}, {y}]", "[{y}, {}]", 8, 2, 8, Some("[{x}, {y}]")));
    assert_eq!(got, "[{x}, {y}]");
    assert!(!emitted.iter().any(|c| c.starts_with("all_reduce")), "{emitted:?}");
    // ... with a contracting extent of 64 the partial product is reduce-scattered.
    let (got, emitted) = lower(&dot("[{x}, {y}]", "[{y}, {}]", 8, 64, 8, Some("[{x}, {y}]")));
    assert_eq!((got.as_str(), emitted), ("[{x}, {y}]", vec!["reduce_scatter{y}".to_string()]));
}

#[test]
fn jax_reduce_cases() {
    let cases: [(&str, &[usize], &str, &[&str]); 5] = [
        ("[{x}, {y}]", &[0, 1], "[]", &["all_reduce{x, y}"]),
        ("[{x}, {y}]", &[0], "[{y}]", &["all_reduce{x}"]),
        ("[{x}, {y}]", &[1], "[{x}]", &["all_reduce{y}"]),
        ("[{x, y}, {}]", &[0], "[{}]", &["all_reduce{x, y}"]),
        ("[{x, y}, {}]", &[1], "[{x, y}]", &[]),
    ];
    for (spec, dims, want, colls) in cases {
        let mut f = Function::new("reduce");
        let a = param(&mut f, "x", &[8, 4], spec);
        let r = inst(&mut f, Op::Reduce { op: ReduceOp::Sum, dims: dims.to_vec() }, &[a]);
        f.results = vec![r];
        let (got, emitted) = lower(&f);
        assert_eq!(got, want, "sum of {spec} over {dims:?}");
        assert_eq!(emitted, colls.to_vec(), "sum of {spec} over {dims:?}");
    }
}

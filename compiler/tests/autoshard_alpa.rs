//! Alpa's auto-sharding optimum on its 2-layer MLP
//! (`playground/auto_sharding_solver/test_solver_mlp.py` and
//! `tests/shard_parallel/test_mlp.py`, see shared/reference-cases.md): the
//! same forward + backward + SGD-update graph built with the builder, the
//! same cost model (α = β = 1 per mesh axis, f32, communication only, every
//! dot split over the whole mesh), and the same closed-form objectives.
use weft_compiler::autoshard::{auto_shard, AutoShardOptions, AutoShardPlan, CollKind};
use weft_compiler::sharding::{check_locally_computable, fmt_sharding, Mesh};
use weft_ir::builder::FunctionBuilder;
use weft_ir::{DType, DotDims, Function, TensorSharding};

fn contract(l: usize, r: usize) -> DotDims {
    DotDims { lhs_batch: vec![], rhs_batch: vec![], lhs_contract: vec![l], rhs_contract: vec![r] }
}

/// `get_mlp_2_layer_computation`: `h1 = x@w1; h2 = h1@w2; loss = h2 - y`,
/// the gradients of the mean squared loss by hand, and `w -= grad`; the new
/// weights alias the old ones (`new.w1`, `new.w2`).
fn alpa_mlp(batch: usize, hidden: usize, zero3: bool) -> Function {
    let f = FunctionBuilder::new("mlp");
    let w = |name: &str| {
        if zero3 {
            f.param_sharded(name, DType::F32, &[hidden, hidden], TensorSharding::new(&[&["x"], &[]]))
        } else {
            f.param(name, DType::F32, &[hidden, hidden])
        }
    };
    let x = f.param("x", DType::F32, &[batch, hidden]);
    let y = f.param("y", DType::F32, &[batch, hidden]);
    let (w1, w2) = (w("w1"), w("w2"));
    let h1 = f.dot_general(x, w1, DotDims::matmul());
    let h2 = f.dot_general(h1, w2, DotDims::matmul());
    let loss = f.sub(h2, y);
    let coef = f.scalar(DType::F32, 2.0 / batch as f64 / hidden as f64);
    let grad_loss = f.mul(loss, f.broadcast_in_dim(coef, &[batch, hidden], &[]));
    let grad_w2 = f.dot_general(h1, grad_loss, contract(0, 0));
    let new_w2 = f.name(f.sub(w2, grad_w2), "new.w2");
    let grad_h2 = f.dot_general(grad_loss, w2, contract(1, 1));
    let grad_w1 = f.dot_general(x, grad_h2, contract(0, 0));
    let new_w1 = f.name(f.sub(w1, grad_w1), "new.w1");
    f.set_results(&[new_w1, new_w2]);
    f.finish().expect("valid MLP")
}

/// Alpa's `all_reduce_cost` with α = β = 1.
fn all_reduce(n: f64, bytes: f64) -> f64 {
    1.0 + 2.0 * (n - 1.0) / n * bytes
}

fn mesh_1d() -> Mesh {
    Mesh::parse("x=4").unwrap().with_link("x", 1.0, 1.0).unwrap()
}

fn plan(f: &Function, mesh: &Mesh) -> AutoShardPlan {
    let p = auto_shard(f, mesh, &AutoShardOptions::alpa()).unwrap_or_else(|e| panic!("{e}"));
    let sharded = p.to_sharded().unwrap_or_else(|e| panic!("{e}\n{}", p.report()));
    check_locally_computable(&sharded.function, mesh).unwrap();
    assert!(sharded.reshards.is_empty(), "propagation had nothing left to decide: {:?}", sharded.reshards);
    p
}

fn sharding(p: &AutoShardPlan, name: &str) -> String {
    fmt_sharding(p.sharding_of(name).unwrap())
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * b.abs().max(1.0)
}

#[test]
fn large_batch_is_data_parallel() {
    let p = plan(&alpa_mlp(1024, 128, false), &mesh_1d());
    println!("{}", p.report());
    let expected = 2.0 * all_reduce(4.0, 128.0 * 128.0 * 4.0);
    assert!(close(p.cost.total, expected), "objective {} vs Alpa's {expected}\n{}", p.cost.total, p.report());
    assert_eq!(p.count(CollKind::AllReduce), 2, "{}", p.report());
    assert!(p.collectives.iter().filter(|c| c.kind.communicates()).all(|c| c.bytes == 65536.0));
    assert_eq!(p.comm.len(), 1, "only all-reduces: {:?}", p.comm);
    assert_eq!(sharding(&p, "x"), "[{x}, {}]");
    assert_eq!(sharding(&p, "w1"), "[{}, {}]");
    assert_eq!(sharding(&p, "w2"), "[{}, {}]");
    assert!(p.search.exact);
}

#[test]
fn large_hidden_is_megatron() {
    let p = plan(&alpa_mlp(128, 1024, false), &mesh_1d());
    println!("{}", p.report());
    let expected = all_reduce(4.0, 128.0 * 1024.0 * 4.0);
    assert!(close(p.cost.total, expected), "objective {} vs Alpa's {expected}\n{}", p.cost.total, p.report());
    assert_eq!(p.count(CollKind::AllReduce), 1, "{}", p.report());
    assert_eq!(p.comm.len(), 1);
    // Column- then row-parallel weights.
    assert_eq!(sharding(&p, "w1"), "[{}, {x}]");
    assert_eq!(sharding(&p, "w2"), "[{x}, {}]");
    assert!(p.search.exact);
}

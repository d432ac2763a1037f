//! Auto-sharding: the rewrites on the e-graph, the report, `explain`,
//! `apply`, annotations as constraints, and errors.
mod common;
use common::s;
use weft_compiler::autoshard::lang::{apply_step, AxisList, CollKey};
use weft_compiler::autoshard::{auto_shard, AutoShardOptions, CollKind};
use weft_compiler::sharding::{fmt_sharding, Mesh, MeshSharding};
use weft_compiler::{CompilerError, Site};
use weft_ir::builder::FunctionBuilder;
use weft_ir::{DType, DotDims, Function, TensorType};

/// `loss = sum(relu(x @ w1) @ w2)`, with optional annotations.
fn mlp(batch: usize, hidden: usize, x: Option<&str>) -> Function {
    let f = FunctionBuilder::new("mlp");
    let xv = match x {
        Some(a) => f.param_sharded("x", DType::F32, &[batch, hidden], s(a)),
        None => f.param("x", DType::F32, &[batch, hidden]),
    };
    let w1 = f.param("w1", DType::F32, &[hidden, hidden]);
    let w2 = f.param("w2", DType::F32, &[hidden, hidden]);
    let h = f.name(f.relu(f.dot_general(xv, w1, DotDims::matmul())), "h");
    let o = f.name(f.dot_general(h, w2, DotDims::matmul()), "o");
    f.set_results(&[f.sum_all(o)]);
    f.finish().unwrap()
}

fn mesh4() -> Mesh {
    Mesh::parse("x=4").unwrap().with_link("x", 1.0, 1.0).unwrap()
}

#[test]
fn rewrites_add_sharded_forms_and_collective_algebra() {
    let p = auto_shard(&mlp(64, 32, None), &mesh4(), &AutoShardOptions::alpa()).unwrap();
    let e = &p.search.egraph;
    assert_eq!(e.stop, "saturated");
    assert!(!e.cut);
    for rule in [
        "sharded-forms",
        "input-layouts",
        "gather-to-replicated",
        "all-reduce-slice-is-reduce-scatter",
        "reshard-chain-collapse",
    ] {
        assert!(e.applied.get(rule).copied().unwrap_or(0) > 0, "{rule} never applied: {:?}", e.applied);
    }
    assert!(e.nodes > e.classes);
    assert_eq!(e.unexpanded, 0);
}

#[test]
fn gather_then_slice_back_is_the_same_layout() {
    // An e-class is a (value, layout) pair, so `slice(all-gather(x))` lands
    // in x's own class; all-reduce then slice is a reduce-scatter's layout.
    let m = mesh4();
    let split = MeshSharding::resolve(
        &s("[{x}, {}]"),
        &TensorType::new(DType::F32, vec![8, 8]),
        &m,
        &Site::new("f", "v", None),
    )
    .unwrap();
    let step = |kind, dim| CollKey { kind, axes: AxisList::new(&[0]), dim, dim2: 0 };
    let gathered = apply_step(&split, &step(CollKind::AllGather, 0)).unwrap();
    assert_eq!(gathered, MeshSharding::replicated(2));
    assert_eq!(apply_step(&gathered, &step(CollKind::LocalSlice, 0)).unwrap(), split);
    let partial = MeshSharding::from_axes(vec![vec![], vec![]], vec![0]);
    let reduced = apply_step(&partial, &step(CollKind::AllReduce, 0)).unwrap();
    let sliced = apply_step(&reduced, &step(CollKind::LocalSlice, 0)).unwrap();
    assert_eq!(apply_step(&partial, &step(CollKind::ReduceScatter, 0)).unwrap(), sliced);
    // A step that does not apply is refused.
    assert!(apply_step(&split, &step(CollKind::AllReduce, 0)).is_none());
}

#[test]
fn explain_lists_the_alternatives_with_costs() {
    let f = mlp(1024, 32, None);
    let p = auto_shard(&f, &mesh4(), &AutoShardOptions::alpa()).unwrap();
    let h = f.value_by_name("h").unwrap();
    let alts = p.explain(h);
    assert!(alts.len() > 1, "{alts:?}");
    assert_eq!(alts.iter().filter(|a| a.chosen).count(), 1);
    let chosen = alts.iter().find(|a| a.chosen).unwrap();
    assert_eq!(chosen.sharding, p.sharding_text(h));
    for a in &alts {
        assert!((a.total - (a.compute + a.operands + a.users)).abs() < 1e-9);
    }
    let text = p.explain_text(h);
    assert!(text.contains('*') && text.contains("%h"), "{text}");
    // A parameter's alternatives are its input layouts.
    let w1 = p.explain(f.value_by_name("w1").unwrap());
    assert!(w1.iter().all(|a| a.strategy.is_none()) && w1.iter().any(|a| a.chosen));
}

#[test]
fn report_has_every_section() {
    let f = mlp(1024, 32, None);
    let p = auto_shard(&f, &mesh4(), &AutoShardOptions::alpa().with_budget(1 << 30)).unwrap();
    let r = p.report();
    for needle in [
        "auto-sharding @mlp on mesh x=4",
        "e-graph of",
        "rewrites applied",
        "extraction:",
        "step time",
        "memory per device",
        "(budget 1.00 GiB)",
        "communication per step",
        "shardings:",
        "%w1",
        "%x",
    ] {
        assert!(r.contains(needle), "missing `{needle}` in\n{r}");
    }
    assert_eq!(p.cost.total, p.cost.compute + p.cost.communication);
    let comm: f64 = p.comm.values().map(|c| c.cost).sum();
    assert!((comm - p.cost.communication).abs() < 1e-6);
}

#[test]
fn annotations_constrain_the_plan() {
    // x pinned to be split on its features: the plan must start there.
    let f = mlp(1024, 32, Some("[{}, {x}]"));
    let p = auto_shard(&f, &mesh4(), &AutoShardOptions::alpa()).unwrap();
    assert_eq!(fmt_sharding(p.sharding_of("x").unwrap()), "[{}, {x}]");
    // An open annotation fixes a prefix only.
    let f = mlp(1024, 32, Some("[{?}, {}]"));
    let p = auto_shard(&f, &mesh4(), &AutoShardOptions::alpa()).unwrap();
    assert!(fmt_sharding(p.sharding_of("x").unwrap()).ends_with(", {}]"));
    // A result annotation is honoured when returning.
    let mut f = mlp(64, 32, None);
    f.result_shardings = vec![Some(s("[]"))];
    let p = auto_shard(&f, &mesh4(), &AutoShardOptions::alpa()).unwrap();
    assert_eq!(fmt_sharding(&p.result_shardings[0]), "[]");
}

#[test]
fn apply_hands_over_every_collective() {
    let f = mlp(1024, 32, None);
    let p = auto_shard(&f, &mesh4(), &AutoShardOptions::alpa()).unwrap();
    let applied = p.apply();
    // Every value annotated, every collective an explicit reshard.
    assert!(applied.values.iter().all(|v| v.sharding.is_some()));
    let reshards = applied.insts.iter().filter(|i| matches!(i.op, weft_ir::Op::Reshard { .. })).count();
    // One reshard per step of each reshard path (plus local slices of fused
    // constants).
    assert!(p.comm.is_empty() || reshards > 0, "{reshards}");
    let sharded = p.to_sharded().unwrap();
    sharded.check().unwrap();
    assert!(sharded.reshards.is_empty());
    assert_eq!(sharded.num_reshards(), reshards);
    // Data parallel: the loss is reduced over the batch.
    assert!(p.count(CollKind::AllReduce) >= 1);
}

#[test]
fn errors() {
    let f = mlp(64, 32, Some("[{y}, {}]"));
    let err = auto_shard(&f, &mesh4(), &AutoShardOptions::default()).unwrap_err();
    assert!(matches!(err, CompilerError::UnknownAxis { .. }), "{err}");
    let f = mlp(6, 32, Some("[{x}, {}]"));
    let err = auto_shard(&f, &mesh4(), &AutoShardOptions::default()).unwrap_err();
    assert!(matches!(err, CompilerError::NotDivisible { .. }), "{err}");
    let err = weft_compiler::autoshard::parse_memory_budget("12 parsecs").unwrap_err();
    assert!(err.to_string().contains("12 parsecs"), "{err}");
}

/// A mesh whose axes all have size 1 leaves nothing to split: one plan,
/// everything replicated, no communication (this used to loop forever
/// choosing how many dimension groups each axis may take).
#[test]
fn a_mesh_of_one_device_gives_the_replicated_plan() {
    let mesh = Mesh::parse("x=1").unwrap();
    let p = auto_shard(&mlp(64, 32, None), &mesh, &AutoShardOptions::default()).unwrap();
    for name in ["x", "w1", "w2", "h", "o"] {
        assert_eq!(fmt_sharding(p.sharding_of(name).unwrap()), "[{}, {}]", "{name}");
    }
    assert_eq!(p.cost.communication, 0.0);
}

#[test]
fn limits_cut_the_search_and_say_so() {
    let f = mlp(1024, 32, None);
    let mut opts = AutoShardOptions::alpa();
    opts.limits.nodes = 40;
    let p = auto_shard(&f, &mesh4(), &opts).unwrap();
    assert!(p.search.egraph.cut);
    assert!(p.search.egraph.stop.contains("node limit"), "{}", p.search.egraph.stop);
    assert!(p.report().contains("node limit"), "{}", p.report());
    p.to_sharded().unwrap().check().unwrap();
    opts.limits.nodes = 1_000_000;
    opts.limits.iterations = 1;
    let p = auto_shard(&f, &mesh4(), &opts).unwrap();
    assert!(p.search.egraph.stop.contains("iteration limit"), "{}", p.search.egraph.stop);
    assert!(p.report().contains("not proven optimal") || p.report().contains("before the limit"), "{}", p.report());
}

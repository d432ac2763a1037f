//! Propagation behaviour: priorities, open and closed dimensions, every op
//! kind in one program, iteration limits, and the e-graph itself.
mod common;
use common::*;
use weft_compiler::sharding::{propagate, ProgramGraph, PropagateOptions};
use weft_ir::{BinaryOp, CompareOp, DType, DotDims, Literal, Op, ReduceOp, TensorType, UnaryOp, ValueId};

// User annotations are settled before constraints: %p gets [{x},{}] from
// the user-annotated %q through the add, so the constraint asking for
// [{y},{}] is met by resharding %p for it, not by changing %p.
#[test]
fn user_annotations_outrank_constraints() {
    let mut b = B::new("f");
    let p = b.param("p", &[8, 8], None);
    let q = b.param("q", &[8, 8], Some("[{x}, {}]"));
    let c = b.op(Op::ShardingConstraint { sharding: s("[{y}, {}]") }, &[p]);
    let a = b.op(Op::Binary(BinaryOp::Add), &[p, q]);
    b.ret(&[c, a], &[None, None]);
    let out = shard(&b.f, &mesh("x=2,y=2"));
    assert_eq!(fin(&out, p), "[{x}, {}]");
    assert_eq!(fin(&out, c), "[{y}, {}]");
    assert_eq!(fin(&out, a), "[{x}, {}]");
    assert_eq!(out.reshards.len(), 1);
    assert_eq!(out.reshards[0].user, Some(weft_ir::InstId(0)));
    assert!(out.reshards[0].why.contains("sharding_constraint"), "{}", out.reshards[0].why);
}

// Without a competing user annotation the constraint propagates backward
// and forward like any annotation.
#[test]
fn constraints_propagate_both_ways() {
    let mut b = B::new("f");
    let p = b.param("p", &[8, 8], None);
    let n = b.op(Op::Unary(UnaryOp::Neg), &[p]);
    let c = b.op(Op::ShardingConstraint { sharding: s("[{y}, {?}]") }, &[n]);
    let e = b.op(Op::Unary(UnaryOp::Exp), &[c]);
    b.ret(&[e], &[None]);
    let out = shard(&b.f, &mesh("x=2,y=2"));
    for v in [p, n, c, e] {
        assert_eq!(fin(&out, v), "[{y}, {}]", "{}", dump(&out.function));
    }
    assert_eq!(out.num_reshards(), 0);
    assert_eq!(
        out.explain_text(p),
        "%2: [{y}, {}] <- sharding_constraint\n\
         %1: [{y}, {}] (dim 0) <- backward through `%2 = sharding_constraint` from %2\n\
         %p: [{y}, {}] (dim 0) <- backward through `%1 = neg` from %1\n"
    );
}

#[test]
fn open_dims_are_refined_closed_dims_are_not() {
    let m = mesh("x=2,y=2");
    let mut b = B::new("f");
    let p = b.param("p", &[8, 8], Some("[{x, ?}, {?}]"));
    let q = b.param("q", &[8, 8], Some("[{x, y}, {}]"));
    let r = b.param("r", &[8, 8], Some("[{}, {}]"));
    let a = b.op(Op::Binary(BinaryOp::Add), &[p, q]);
    let c = b.op(Op::Binary(BinaryOp::Add), &[a, r]);
    b.ret(&[c], &[None]);
    let out = shard(&b.f, &m);
    assert_eq!(fin(&out, p), "[{x, y}, {}]", "open dim extended");
    assert_eq!(fin(&out, r), "[{}, {}]", "closed dims stay");
    assert_eq!(fin(&out, c), "[{x, y}, {}]");
    assert_eq!(collectives(&out), vec!["local-slice{x, y} dim 0"]);
}

#[test]
fn every_op_kind_in_one_program() {
    let m = mesh("x=2,y=2");
    let f32t = |s: &[usize]| TensorType::new(DType::F32, s.to_vec());
    let mut b = B::new("all");
    let p = b.param("p", &[8, 4], Some("[{x}, {y}]"));
    let w = b.param("w", &[4, 6], None);
    let c = b.op(Op::Constant(Literal::splat(f32t(&[8, 4]), 1.0)), &[]);
    let io = b.op(Op::Iota { dim: 0, ty: f32t(&[8, 4]) }, &[]);
    let ad = b.op(Op::Binary(BinaryOp::Add), &[p, c]);
    let ad2 = b.op(Op::Binary(BinaryOp::Mul), &[ad, io]);
    let ex = b.op(Op::Unary(UnaryOp::Exp), &[ad2]);
    let cmp = b.op(Op::Compare(CompareOp::Gt), &[ex, ad]);
    let sel = b.op(Op::Select, &[cmp, ex, ad]);
    let t = b.op(Op::Constant(Literal::scalar(DType::Bool, 1.0)), &[]);
    let sel2 = b.op(Op::Select, &[t, sel, ad]);
    let cv = b.op(Op::Convert { to: DType::BF16 }, &[sel2]);
    let cv2 = b.op(Op::Convert { to: DType::F32 }, &[cv]);
    let d = b.op(Op::DotGeneral(DotDims::matmul()), &[cv2, w]);
    let rs = b.op(Op::Reshape { shape: vec![2, 4, 6] }, &[d]);
    let tr = b.op(Op::Transpose { perm: vec![2, 0, 1] }, &[rs]);
    let sl = b.op(Op::Slice { start: vec![0, 0, 0], limit: vec![6, 2, 2], stride: vec![1, 1, 1] }, &[tr]);
    let cat = b.op(Op::Concatenate { dim: 2 }, &[sl, sl]);
    let z = b.op(Op::Constant(Literal::scalar(DType::F32, 0.0)), &[]);
    let pd = b.op(Op::Pad { low: vec![0, 0, 1], high: vec![0, 0, 1], interior: vec![0, 0, 0] }, &[cat, z]);
    let mx = b.op(Op::Reduce { op: ReduceOp::Max, dims: vec![2] }, &[pd]);
    let bc = b.op(Op::BroadcastInDim { dims: vec![0, 1], shape: vec![6, 2, 3] }, &[mx]);
    let sm = b.op(Op::Reduce { op: ReduceOp::Sum, dims: vec![1] }, &[bc]);
    let sc = b.op(Op::ShardingConstraint { sharding: s("[{?}, {?}]") }, &[sm]);
    let rh = b.op(Op::Reshard { to: s("[{x}, {}]") }, &[sc]);
    b.ret(&[rh], &[None]);
    let out = shard(&b.f, &m);
    assert_eq!(fin(&out, c), "[{x}, {y}]", "constants take their users' sharding");
    assert_eq!(fin(&out, io), "[{x}, {y}]");
    assert_eq!(fin(&out, sel2), "[{x}, {y}]");
    assert_eq!(fin(&out, w), "[{y}, {}]", "contracting dim follows the lhs");
    assert_eq!(fin(&out, d), "[{x}, {}] unreduced {y}");
    assert_eq!(fin(&out, rs), "[{x}, {}, {}]");
    assert_eq!(fin(&out, tr), "[{}, {x}, {}]");
    assert_eq!(fin(&out, rh), "[{x}, {}]");
    assert!(out.stats.converged);
}

// The visit budget bounds the work; a starved run is still deterministic,
// complete and locally computable.
#[test]
fn iteration_limit() {
    let m = mesh("x=2");
    let mut b = B::new("chain");
    let p = b.param("p", &[8], None);
    let mut v = p;
    for _ in 0..20 {
        v = b.op(Op::Unary(UnaryOp::Neg), &[v]);
    }
    let last = b.op(Op::ShardingConstraint { sharding: s("[{x}]") }, &[v]);
    b.ret(&[last], &[None]);
    let full = shard(&b.f, &m);
    assert!(full.stats.converged);
    assert_eq!(fin(&full, p), "[{x}]");
    let starved = PropagateOptions { max_visits_per_inst: 1, ..Default::default() };
    let a = propagate(&b.f, &m, &starved).unwrap();
    let b2 = propagate(&b.f, &m, &starved).unwrap();
    assert!(!a.stats.converged);
    assert_eq!(a.function, b2.function);
    a.check().unwrap();
    assert_eq!(weft_compiler::sharding::fmt_sharding(a.sharding(p)), "[{}]");
}

#[test]
fn the_egraph_holds_the_program() {
    let mut b = B::new("f");
    let p = b.param("p", &[8], None);
    let n1 = b.op(Op::Unary(UnaryOp::Neg), &[p]);
    let n2 = b.op(Op::Unary(UnaryOp::Neg), &[p]);
    let a = b.op(Op::Binary(BinaryOp::Add), &[n1, n2]);
    b.ret(&[a], &[None]);
    let seeds = (0..b.f.values.len())
        .map(|i| weft_compiler::sharding::ValueFacts::unknown(ValueId(i as u32), b.f.values[i].ty.clone()))
        .collect();
    let rules =
        b.f.insts
            .iter()
            .map(|i| {
                let ops: Vec<&TensorType> = i.operands.iter().map(|&o| b.f.ty(o)).collect();
                weft_compiler::sharding::rule_for(&i.op, &ops, &[b.f.ty(i.results[0])]).unwrap()
            })
            .collect();
    let g = ProgramGraph::build(&b.f, seeds, rules);
    // Identical instructions stay distinct values.
    assert_eq!(g.egraph.number_of_classes(), 4);
    assert_eq!(g.users(p), vec![0, 1]);
    assert_eq!(g.users(n1), vec![2]);
    assert_eq!(g.definer(a), Some(2));
    assert_eq!(g.definer(p), None);
    assert_eq!(g.facts(n2).value, n2);
}

#[test]
fn device_grid_of_a_value() {
    let mut b = B::new("f");
    let p = b.param("p", &[4, 4], Some("[{x}, {}]"));
    b.ret(&[p], &[None]);
    let out = shard(&b.f, &mesh("x=2,y=2"));
    let g = out.render(p).unwrap();
    assert!(g.contains("| dev 0,1 [0:2, 0:4] |") && g.contains("| dev 2,3 [2:4, 0:4] |"), "{g}");
}

// A value used twice by one instruction in different roles (p @ p).
#[test]
fn a_value_used_twice() {
    let mut b = B::new("sq");
    let p = b.param("p", &[8, 8], Some("[{x}, {?}]"));
    let q = b.param("q", &[8, 8], None);
    let d = b.op(Op::DotGeneral(DotDims::matmul()), &[p, p]);
    let e = b.op(Op::DotGeneral(DotDims::matmul()), &[q, q]);
    let a = b.op(Op::Binary(BinaryOp::Add), &[d, e]);
    b.ret(&[a], &[Some("[{x}, {y}]")]);
    let out = shard(&b.f, &mesh("x=2,y=2"));
    assert!(out.stats.converged);
    assert_eq!(fin(&out, a), "[{x}, {y}]");
}

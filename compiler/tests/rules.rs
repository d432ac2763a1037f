//! Every op's sharding rule, in Shardy's notation (compare Shardy's
//! `op_sharding_rule` attributes: dot_general is `([i, k], [k, j])->([i, j])
//! {i=.., j=.., k=..} reduction={k}`).
use weft_compiler::sharding::{rule_for, FactorKind, OpRule, RuleKind};
use weft_ir::{
    infer, BinaryOp, CompareOp, DType, DotDims, Literal, NoFunctions, Op, ReduceOp, TensorSharding, TensorType, UnaryOp,
};

fn t(shape: &[usize]) -> TensorType {
    TensorType::new(DType::F32, shape.to_vec())
}

/// The rule of `op` on operands of these types (result types inferred).
fn rule(op: Op, operands: &[TensorType]) -> OpRule {
    let refs: Vec<&TensorType> = operands.iter().collect();
    let res = infer(&op, &refs, &NoFunctions).expect("well-typed");
    let res_refs: Vec<&TensorType> = res.iter().collect();
    rule_for(&op, &refs, &res_refs).expect("not a call")
}

fn text(op: Op, operands: &[TensorType]) -> String {
    rule(op, operands).to_string()
}

#[test]
fn constant_and_iota_are_result_only() {
    let c = Op::Constant(Literal::splat(t(&[4, 8]), 1.0));
    assert_eq!(text(c, &[]), "()->([i, j]) {i=4, j=8}");
    assert_eq!(text(Op::Iota { dim: 1, ty: t(&[4, 8]) }, &[]), "()->([i, j]) {i=4, j=8}");
}

#[test]
fn elementwise_ops_share_every_factor() {
    let a = t(&[4, 8]);
    for u in UnaryOp::ALL.into_iter().filter(|u| u.accepts(DType::F32)) {
        assert_eq!(text(Op::Unary(u), std::slice::from_ref(&a)), "([i, j])->([i, j]) {i=4, j=8}", "{}", u.name());
    }
    for b in BinaryOp::ALL.into_iter().filter(|b| b.accepts(DType::F32)) {
        assert_eq!(
            text(Op::Binary(b), &[a.clone(), a.clone()]),
            "([i, j], [i, j])->([i, j]) {i=4, j=8}",
            "{}",
            b.name()
        );
    }
    for c in CompareOp::ALL {
        assert_eq!(text(Op::Compare(c), &[a.clone(), a.clone()]), "([i, j], [i, j])->([i, j]) {i=4, j=8}");
    }
    assert_eq!(text(Op::Convert { to: DType::BF16 }, std::slice::from_ref(&a)), "([i, j])->([i, j]) {i=4, j=8}");
}

#[test]
fn select_with_scalar_and_full_predicate() {
    let a = t(&[4, 8]);
    let p = TensorType::scalar(DType::Bool);
    assert_eq!(text(Op::Select, &[p, a.clone(), a.clone()]), "([], [i, j], [i, j])->([i, j]) {i=4, j=8}");
    let pf = a.with_dtype(DType::Bool);
    assert_eq!(text(Op::Select, &[pf, a.clone(), a]), "([i, j], [i, j], [i, j])->([i, j]) {i=4, j=8}");
}

#[test]
fn broadcast_in_dim_new_and_expanded_dims() {
    let op = Op::BroadcastInDim { dims: vec![1], shape: vec![4, 8] };
    assert_eq!(text(op, &[t(&[8])]), "([j])->([i, j]) {i=4, j=8}");
    // An extent-1 dimension broadcast to 8 needs replication on the operand side.
    let op = Op::BroadcastInDim { dims: vec![1], shape: vec![4, 8] };
    assert_eq!(text(op, &[t(&[1])]), "([k])->([i, j]) {i=4, j=8, k=1} need_replication={k}");
}

#[test]
fn reshape_factorisation() {
    let r = |from: &[usize], to: &[usize]| text(Op::Reshape { shape: to.to_vec() }, &[t(from)]);
    assert_eq!(r(&[6], &[2, 3]), "([ij])->([i, j]) {i=2, j=3}");
    assert_eq!(r(&[2, 3], &[6]), "([i, j])->([ij]) {i=2, j=3}");
    assert_eq!(r(&[8, 1, 3], &[24]), "([i, j, k])->([ik]) {i=8, j=1, k=3}");
    // Nothing in common: every part needs replication.
    assert_eq!(r(&[2, 3], &[3, 2]), "([i, k])->([j, l]) {i=2, j=3, k=3, l=2} need_replication={i, j, k, l}");
    // A common major factor of 2, then a tangle.
    assert_eq!(r(&[6, 4], &[4, 6]), "([ij, m])->([ik, l]) {i=2, j=3, k=2, l=6, m=4} need_replication={j, k, l, m}");
    assert_eq!(r(&[4, 6], &[4, 6]), "([i, j])->([i, j]) {i=4, j=6}");
}

#[test]
fn transpose_permutes_factors() {
    assert_eq!(
        text(Op::Transpose { perm: vec![1, 2, 0] }, &[t(&[4, 2, 2])]),
        "([i, j, k])->([j, k, i]) {i=4, j=2, k=2}"
    );
}

#[test]
fn slice_pad_concatenate_need_replication_on_changed_dims() {
    let slice = Op::Slice { start: vec![0, 1], limit: vec![8, 5], stride: vec![1, 1] };
    assert_eq!(text(slice, &[t(&[8, 6])]), "([i, j])->([i, j]) {i=8, j=4} need_replication={j}");
    let full = Op::Slice { start: vec![0, 0], limit: vec![8, 6], stride: vec![1, 1] };
    assert_eq!(text(full, &[t(&[8, 6])]), "([i, j])->([i, j]) {i=8, j=6}");
    let pad = Op::Pad { low: vec![0, 1], high: vec![0, 1], interior: vec![0, 0] };
    assert_eq!(text(pad, &[t(&[4, 6]), t(&[])]), "([i, j], [])->([i, j]) {i=4, j=8} need_replication={j}");
    let cat = Op::Concatenate { dim: 1 };
    assert_eq!(text(cat, &[t(&[4, 4]), t(&[4, 2])]), "([i, j], [i, j])->([i, j]) {i=4, j=6} need_replication={j}");
}

#[test]
fn dot_general_contracting_is_reduction() {
    assert_eq!(
        text(Op::DotGeneral(DotDims::matmul()), &[t(&[8, 2]), t(&[2, 16])]),
        "([i, k], [k, j])->([i, j]) {i=8, j=16, k=2} reduction={k}"
    );
    let dims = DotDims { lhs_batch: vec![0], rhs_batch: vec![0], lhs_contract: vec![2], rhs_contract: vec![1] };
    assert_eq!(
        text(Op::DotGeneral(dims), &[t(&[4, 3, 5]), t(&[4, 5, 7])]),
        "([i, j, l], [i, l, k])->([i, j, k]) {i=4, j=3, k=7, l=5} reduction={l}"
    );
}

#[test]
fn reductions_sum_vs_max_min() {
    let sum = Op::Reduce { op: ReduceOp::Sum, dims: vec![1] };
    assert_eq!(text(sum, &[t(&[8, 2])]), "([i, j])->([i]) {i=8, j=2} reduction={j}");
    for op in [ReduceOp::Max, ReduceOp::Min] {
        let r = Op::Reduce { op, dims: vec![0] };
        assert_eq!(text(r, &[t(&[8, 2])]), "([i, j])->([j]) {i=8, j=2} combined_reduction={i}");
    }
}

#[test]
fn constraint_reshard_and_call() {
    let s = TensorSharding::new(&[&["x"], &[]]);
    let c = rule(Op::ShardingConstraint { sharding: s.clone() }, &[t(&[4, 8])]);
    assert_eq!((c.to_string().as_str(), c.kind), ("([i, j])->([i, j]) {i=4, j=8}", RuleKind::Identity));
    let r = rule(Op::Reshard { to: s }, &[t(&[4, 8])]);
    assert_eq!(r.kind, RuleKind::Reshard);
    let a = t(&[4]);
    assert!(rule_for(&Op::Call { callee: "f".into(), remat: false }, &[&a], &[&a]).is_none());
}

#[test]
fn factor_kinds_and_occurrences() {
    let r = rule(Op::DotGeneral(DotDims::matmul()), &[t(&[8, 2]), t(&[2, 16])]);
    let kinds: Vec<FactorKind> = r.factors.iter().map(|f| f.kind).collect();
    assert_eq!(kinds, vec![FactorKind::PassThrough, FactorKind::PassThrough, FactorKind::Reduction]);
    assert_eq!(r.occurrences(2), vec![(0, 1), (1, 0)]);
    assert!(r.in_result(0) && r.in_result(1) && !r.in_result(2));
}

#[test]
fn indexing_ops() {
    use weft_ir::IndexOp;
    let i32t = |s: &[usize]| TensorType::new(DType::I32, s.to_vec());
    // Embedding: the table's rows are a reduction factor (a split table
    // gathers locally and leaves a pending sum); the ids' dims pass through.
    let g = Op::Index(IndexOp::Gather { axis: 0, batch_dims: 0 });
    assert_eq!(
        text(g, &[t(&[32, 8]), i32t(&[4, 6])]),
        "([k, l], [i, j])->([i, j, l]) {i=4, j=6, k=32, l=8} reduction={k}"
    );
    // take_along_axis: the batch dim is shared by all three.
    let take = Op::Index(IndexOp::Gather { axis: 1, batch_dims: 1 });
    assert_eq!(text(take, &[t(&[4, 32]), i32t(&[4])]), "([i, j], [i])->([i]) {i=4, j=32} reduction={j}");
    // The transpose: the table's rows belong to the result alone, the
    // token dims are summed.
    let s = Op::Index(IndexOp::ScatterAdd { axis: 0, batch_dims: 0, size: 32 });
    assert_eq!(
        text(s, &[i32t(&[4, 6]), t(&[4, 6, 8])]),
        "([k, l], [k, l, j])->([i, j]) {i=32, j=8, k=4, l=6} reduction={k, l}"
    );
    let c = Op::Index(IndexOp::Cumsum { dim: 1, reverse: false });
    assert_eq!(text(c, &[t(&[4, 8])]), "([i, j])->([i, j]) {i=4, j=8} need_replication={j}");
    let k = Op::Index(IndexOp::TopK { k: 2 });
    assert_eq!(text(k, &[t(&[4, 8])]), "([i, j])->([i, k]) {i=4, j=8, k=2} need_replication={j, k}");
}

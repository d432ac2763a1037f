//! Every primitive-op method of the builder produces verified IR with the
//! expected result types and the expected op.

use weft_ir::builder::{FunctionBuilder, Value};
use weft_ir::DType::{Bool, F32, I32, U32};
use weft_ir::{BinaryOp, CompareOp, DotDims, Function, Literal, Op, ReduceOp, TensorSharding, TensorType, UnaryOp};

/// Checks each value's type, makes them all results, and finishes.
fn finish(f: FunctionBuilder, expected: &[(Value, &str)]) -> Function {
    for (i, (v, want)) in expected.iter().enumerate() {
        assert_eq!(f.ty(*v).to_string(), *want, "value {i}");
    }
    let vs: Vec<Value> = expected.iter().map(|(v, _)| *v).collect();
    f.set_results(&vs);
    let func = f.finish().unwrap_or_else(|e| panic!("{e}"));
    let tys: Vec<String> = func.result_types().iter().map(|t| t.to_string()).collect();
    assert_eq!(tys, expected.iter().map(|(_, t)| t.to_string()).collect::<Vec<_>>());
    func
}

/// The op that defines result `k` of `func`.
fn def_op(func: &Function, k: usize) -> &Op {
    match func.value(func.results[k]).def {
        weft_ir::ValueDef::Inst { inst, .. } => &func.inst(inst).op,
        weft_ir::ValueDef::Param(_) => panic!("result {k} is a parameter"),
    }
}

#[test]
fn constants() {
    let f = FunctionBuilder::new("c");
    let vals = [
        (f.constant(Literal::scalar(F32, 2.5)), "f32[]"),
        (f.scalar(I32, 3.0), "i32[]"),
        (f.full(F32, &[2, 3], 1.5), "f32[2,3]"),
        (f.zeros(U32, &[4]), "u32[4]"),
        (f.ones(Bool, &[1, 2]), "bool[1,2]"),
        (f.dense(TensorType::new(F32, vec![2, 2]), vec![1.0, 2.0, 3.0, 4.0]), "f32[2,2]"),
        (f.iota(I32, &[3, 5], 1), "i32[3,5]"),
        (f.arange(F32, 7), "f32[7]"),
    ];
    let x = f.param("x", F32, &[3]);
    let likes = [(f.full_like(x, 4.0), "f32[3]"), (f.zeros_like(x), "f32[3]"), (f.ones_like(x), "f32[3]")];
    let all: Vec<(Value, &str)> = vals.iter().chain(&likes).copied().collect();
    let func = finish(f, &all);
    assert_eq!(def_op(&func, 6), &Op::Iota { dim: 1, ty: TensorType::new(I32, vec![3, 5]) });
    let Op::Constant(lit) = def_op(&func, 5) else { panic!() };
    assert_eq!(lit.to_vec(), vec![1.0, 2.0, 3.0, 4.0]);
    let Op::Constant(lit) = def_op(&func, 9) else { panic!() };
    assert_eq!((lit.ty.to_string(), lit.get(2)), ("f32[3]".to_string(), 0.0));
}

#[test]
fn unary_ops() {
    let f = FunctionBuilder::new("u");
    let x = f.param("x", F32, &[2, 3]);
    let i = f.param("i", I32, &[4]);
    let b = f.param("b", Bool, &[]);
    let mut out = vec![
        (f.neg(x), "f32[2,3]"),
        (f.abs(i), "i32[4]"),
        (f.exp(x), "f32[2,3]"),
        (f.log(x), "f32[2,3]"),
        (f.log1p(x), "f32[2,3]"),
        (f.tanh(x), "f32[2,3]"),
        (f.cos(x), "f32[2,3]"),
        (f.sin(x), "f32[2,3]"),
        (f.logistic(x), "f32[2,3]"),
        (f.sqrt(x), "f32[2,3]"),
        (f.rsqrt(x), "f32[2,3]"),
        (f.sign(i), "i32[4]"),
        (f.floor(x), "f32[2,3]"),
        (f.not(b), "bool[]"),
        (f.is_finite(x), "bool[2,3]"),
    ];
    for op in UnaryOp::ALL {
        let arg = if op == UnaryOp::Not { i } else { x };
        let want = if op == UnaryOp::IsFinite {
            "bool[2,3]"
        } else if op == UnaryOp::Not {
            "i32[4]"
        } else {
            "f32[2,3]"
        };
        out.push((f.unary(op, arg), want));
    }
    let func = finish(f, &out);
    let names: Vec<&str> = (0..UnaryOp::ALL.len()).map(|k| def_op(&func, k).name()).collect();
    let all: Vec<&str> = UnaryOp::ALL.iter().map(|u| u.name()).collect();
    assert_eq!(names, all);
}

#[test]
fn binary_and_compare_ops_on_equal_types() {
    let f = FunctionBuilder::new("b");
    let x = f.param("x", F32, &[2, 3]);
    let y = f.param("y", F32, &[2, 3]);
    let i = f.param("i", U32, &[5]);
    let out = vec![
        (f.add(x, y), "f32[2,3]"),
        (f.sub(x, y), "f32[2,3]"),
        (f.mul(x, y), "f32[2,3]"),
        (f.div(x, y), "f32[2,3]"),
        (f.rem(x, y), "f32[2,3]"),
        (f.maximum(x, y), "f32[2,3]"),
        (f.minimum(x, y), "f32[2,3]"),
        (f.pow(x, y), "f32[2,3]"),
        (f.and(i, i), "u32[5]"),
        (f.or(i, i), "u32[5]"),
        (f.xor(i, i), "u32[5]"),
        (f.shift_left(i, i), "u32[5]"),
        (f.shift_right_logical(i, i), "u32[5]"),
        (f.eq(x, y), "bool[2,3]"),
        (f.ne(x, y), "bool[2,3]"),
        (f.lt(x, y), "bool[2,3]"),
        (f.le(x, y), "bool[2,3]"),
        (f.gt(x, y), "bool[2,3]"),
        (f.ge(i, i), "bool[5]"),
        (f.binary(BinaryOp::Add, i, i), "u32[5]"),
        (f.compare(CompareOp::Ne, i, i), "bool[5]"),
    ];
    let func = finish(f, &out);
    let names: Vec<&str> = (0..19).map(|k| def_op(&func, k).name()).collect();
    let mut want: Vec<&str> = BinaryOp::ALL.iter().map(|b| b.name()).collect();
    want.extend(CompareOp::ALL.iter().map(|c| c.name()));
    assert_eq!(names, want);
    // Identical types need no broadcasts: 21 instructions for 21 ops.
    assert_eq!(func.insts.len(), 21);
}

#[test]
fn select_and_convert() {
    let f = FunctionBuilder::new("s");
    let p = f.param("p", Bool, &[2]);
    let x = f.param("x", F32, &[2]);
    let y = f.param("y", F32, &[2]);
    let out = vec![(f.select(p, x, y), "f32[2]"), (f.convert(x, I32), "i32[2]"), (f.convert(p, F32), "f32[2]")];
    let func = finish(f, &out);
    assert_eq!(def_op(&func, 0), &Op::Select);
    assert_eq!(def_op(&func, 1), &Op::Convert { to: I32 });
}

#[test]
fn shape_ops() {
    let f = FunctionBuilder::new("sh");
    let x = f.param("x", F32, &[2, 3]);
    let z = f.scalar(F32, 0.0);
    let out = vec![
        (f.broadcast_in_dim(x, &[4, 2, 3], &[1, 2]), "f32[4,2,3]"),
        (f.reshape(x, &[3, 2]), "f32[3,2]"),
        (f.transpose(x, &[1, 0]), "f32[3,2]"),
        (f.swap_axes(x, 0, -1), "f32[3,2]"),
        (f.slice(x, &[0, 1], &[2, 3]), "f32[2,2]"),
        (f.slice_strided(x, &[0, 0], &[2, 3], &[1, 2]), "f32[2,2]"),
        (f.slice_axis(x, -1, 1, 2), "f32[2,1]"),
        (f.concatenate(&[x, x, x], 0), "f32[6,3]"),
        (f.pad(x, z, &[1, 0], &[0, -1], &[0, 1]), "f32[3,4]"),
        (f.expand_dims(x, 1), "f32[2,1,3]"),
        (f.expand_dims(x, -1), "f32[2,3,1]"),
        (f.broadcast_to(x, &[5, 2, 3]), "f32[5,2,3]"),
    ];
    let parts = f.split(x, 1, 3);
    assert_eq!(parts.len(), 3);
    let mut all = out.clone();
    all.extend(parts.iter().map(|&p| (p, "f32[2,1]")));
    let e = f.expand_dims(x, 0);
    all.push((f.squeeze(e, &[]), "f32[2,3]"));
    all.push((f.squeeze(f.reshape(x, &[1, 2, 1, 3]), &[-2]), "f32[1,2,3]"));
    let func = finish(f, &all);
    assert_eq!(def_op(&func, 3), &Op::Transpose { perm: vec![1, 0] });
    assert_eq!(def_op(&func, 5), &Op::Slice { start: vec![0, 0], limit: vec![2, 3], stride: vec![1, 2] });
    assert_eq!(def_op(&func, 9), &Op::BroadcastInDim { dims: vec![0, 2], shape: vec![2, 1, 3] });
    assert_eq!(def_op(&func, 13), &Op::Slice { start: vec![0, 1], limit: vec![2, 2], stride: vec![1, 1] });
}

#[test]
fn dot_reduce_and_sharding_ops() {
    let f = FunctionBuilder::new("d");
    let a = f.param("a", F32, &[4, 3, 5]);
    let b = f.param("b", F32, &[4, 5, 7]);
    let dims = DotDims { lhs_batch: vec![0], rhs_batch: vec![0], lhs_contract: vec![2], rhs_contract: vec![1] };
    let s = TensorSharding::new(&[&["data"], &[], &[]]);
    let out = vec![
        (f.dot_general(a, b, dims), "f32[4,3,7]"),
        (f.reduce(ReduceOp::Sum, a, &[0, 2]), "f32[3]"),
        (f.reduce_sum(a, &[1]), "f32[4,5]"),
        (f.reduce_max(a, &[]), "f32[4,3,5]"),
        (f.reduce_min(a, &[0, 1, 2]), "f32[]"),
        (f.sharding_constraint(a, s.clone()), "f32[4,3,5]"),
        (f.reshard(a, s.clone()), "f32[4,3,5]"),
        (f.emit(Op::Unary(UnaryOp::Exp), &[a])[0], "f32[4,3,5]"),
    ];
    let func = finish(f, &out);
    assert_eq!(def_op(&func, 1), &Op::Reduce { op: ReduceOp::Sum, dims: vec![0, 2] });
    assert_eq!(def_op(&func, 5), &Op::ShardingConstraint { sharding: s.clone() });
    assert_eq!(def_op(&func, 6), &Op::Reshard { to: s });
}

#[test]
fn params_names_and_shardings() {
    let f = FunctionBuilder::new("p");
    let s = TensorSharding::new(&[&["data"], &[]]);
    let x = f.param_sharded("x", F32, &[8, 16], s.clone());
    let w = f.param("params.layers.0.w1", F32, &[16, 4]);
    let y = f.name(f.matmul(x, w), "logits");
    assert_eq!((f.shape(y), f.dtype(y), f.rank(y)), (vec![8, 4], F32, 2));
    assert_eq!(f.value_by_name("logits"), Some(y));
    assert_eq!(f.params(), vec![x, w]);
    assert_eq!(f.func_name(), "p");
    f.set_results(&[y]);
    f.set_result_shardings(&[Some(TensorSharding::open(2))]);
    let func = f.finish().unwrap();
    assert_eq!(func.value(func.params[0]).sharding, Some(s));
    assert_eq!(func.param_name(1), "params.layers.0.w1");
    assert_eq!(func.value_ref(func.results[0]), "%logits");
    assert_eq!(func.result_shardings, vec![Some(TensorSharding::open(2))]);
}

#[test]
fn late_parameters_are_numbered_first() {
    let f = FunctionBuilder::new("late");
    let x = f.param("x", F32, &[2]);
    let y = f.exp(x);
    let b = f.param("b", F32, &[2]); // declared after an instruction
    let z = f.add(y, b);
    f.set_results(&[z, b]);
    let func = f.finish().unwrap();
    assert_eq!(func.params.iter().map(|p| p.0).collect::<Vec<_>>(), vec![0, 1]);
    assert_eq!(func.param_name(1), "b");
    assert_eq!(func.insts[1].operands[1], func.params[1]);
    assert_eq!(func.results[1], func.params[1]);
    assert_eq!(func.results[0], func.insts[1].results[0]);
}

#[test]
fn random_numbers() {
    let f = FunctionBuilder::new("r");
    let key = f.param("key", U32, &[2]);
    let x = f.param("x", F32, &[4, 5]);
    let keys = f.split_key(key, 3);
    assert_eq!(keys.len(), 3);
    let out = vec![
        (f.fold_in(key, f.scalar(U32, 7.0)), "u32[2]"),
        (f.random_bits(keys[0], &[3, 4]), "u32[3,4]"),
        (f.random_uniform(keys[1], F32, &[8]), "f32[8]"),
        (f.random_uniform(keys[1], weft_ir::DType::BF16, &[2, 2]), "bf16[2,2]"),
        (f.random_normal(keys[2], F32, &[]), "f32[]"),
        (f.bernoulli(key, 0.25, &[6]), "bool[6]"),
        (f.dropout(x, key, 0.1), "f32[4,5]"),
        (f.dropout(x, key, 0.0), "f32[4,5]"),
    ];
    let func = finish(f, &out);
    assert_eq!(func.results[7], func.params[1], "dropout with rate 0 is the identity");
}

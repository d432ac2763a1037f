//! NumPy-style broadcasting in the builder: result shapes, the emitted
//! canonical form (reshape away stretched size-1 dims, then a
//! `broadcast_in_dim` that only adds dims), scalar helpers, and select.

use proptest::prelude::*;
use weft_ir::builder::{broadcast_shapes, FunctionBuilder, Value};
use weft_ir::DType::{Bool, F32, I32};
use weft_ir::{Function, Op};

fn finish(f: FunctionBuilder, results: &[Value]) -> Function {
    f.set_results(results);
    f.finish().unwrap_or_else(|e| panic!("{e}"))
}

fn def_of(func: &Function, v: weft_ir::ValueId) -> &Op {
    match func.value(v).def {
        weft_ir::ValueDef::Inst { inst, .. } => &func.inst(inst).op,
        weft_ir::ValueDef::Param(_) => panic!("{v} is a parameter"),
    }
}

fn ops(func: &Function) -> Vec<Op> {
    func.insts.iter().map(|i| i.op.clone()).collect()
}

/// Every `broadcast_in_dim` maps operand dims to result dims of equal extent.
fn assert_canonical(func: &Function) {
    for inst in &func.insts {
        if let Op::BroadcastInDim { dims, shape } = &inst.op {
            let t = func.ty(inst.operands[0]);
            for (i, &d) in dims.iter().enumerate() {
                assert_eq!(t.shape[i], shape[d], "{t} -> {shape:?} via {dims:?} stretches a dim");
            }
        }
    }
}

#[test]
fn column_plus_row() {
    let f = FunctionBuilder::new("b");
    let a = f.param("a", F32, &[3, 1]);
    let b = f.param("b", F32, &[4]);
    let c = f.add(a, b);
    assert_eq!(f.ty(c).to_string(), "f32[3,4]");
    let func = finish(f, &[c]);
    assert_eq!(
        ops(&func)[..3],
        [
            Op::Reshape { shape: vec![3] },
            Op::BroadcastInDim { dims: vec![0], shape: vec![3, 4] },
            Op::BroadcastInDim { dims: vec![1], shape: vec![3, 4] },
        ]
    );
    assert_eq!(func.insts[3].op, Op::Binary(weft_ir::BinaryOp::Add));
    assert_canonical(&func);
}

#[test]
fn scalar_and_matrix() {
    let f = FunctionBuilder::new("s");
    let s = f.param("s", F32, &[]);
    let m = f.param("m", F32, &[2, 3]);
    let l = f.mul(s, m);
    let r = f.sub(m, s);
    assert_eq!((f.ty(l).to_string(), f.ty(r).to_string()), ("f32[2,3]".into(), "f32[2,3]".into()));
    let func = finish(f, &[l, r]);
    assert_eq!(func.insts[0].op, Op::BroadcastInDim { dims: vec![], shape: vec![2, 3] });
    assert_eq!(func.insts.len(), 4);
}

#[test]
fn both_sides_stretch() {
    let f = FunctionBuilder::new("b");
    let a = f.param("a", F32, &[2, 1, 4]);
    let b = f.param("b", F32, &[3, 1]);
    let c = f.maximum(a, b);
    let d = f.lt(b, a);
    assert_eq!(f.ty(c).to_string(), "f32[2,3,4]");
    assert_eq!(f.ty(d).to_string(), "bool[2,3,4]");
    assert_canonical(&finish(f, &[c, d]));
}

#[test]
fn size_one_to_size_one_is_kept() {
    let f = FunctionBuilder::new("k");
    let a = f.param("a", F32, &[1, 5]);
    let b = f.param("b", F32, &[2, 1, 5]);
    let c = f.add(a, b);
    assert_eq!(f.ty(c).to_string(), "f32[2,1,5]");
    let func = finish(f, &[c]);
    // [1,5] -> [2,1,5] needs no reshape: both dims keep their extent.
    assert_eq!(func.insts[0].op, Op::BroadcastInDim { dims: vec![1, 2], shape: vec![2, 1, 5] });
}

#[test]
fn scalar_helpers_use_the_operand_dtype() {
    let f = FunctionBuilder::new("sc");
    let i = f.param("i", I32, &[3]);
    let x = f.param("x", F32, &[2]);
    let outs = [
        f.add_scalar(i, 1.0),
        f.sub_scalar(x, 1.0),
        f.mul_scalar(x, 2.0),
        f.div_scalar(x, 4.0),
        f.pow_scalar(x, 3.0),
        f.maximum_scalar(i, 0.0),
        f.minimum_scalar(x, 6.0),
        f.rsub_scalar(1.0, x),
        f.square(x),
        f.compare_scalar(weft_ir::CompareOp::Gt, i, 2.0),
    ];
    let want = ["i32[3]", "f32[2]", "f32[2]", "f32[2]", "f32[2]", "i32[3]", "f32[2]", "f32[2]", "f32[2]", "bool[3]"];
    let got: Vec<String> = outs.iter().map(|&v| f.ty(v).to_string()).collect();
    assert_eq!(got, want);
    let func = finish(f, &outs);
    let Op::Constant(lit) = &func.insts[0].op else { panic!("expected the constant first") };
    assert_eq!((lit.ty.to_string(), lit.get(0)), ("i32[3]".to_string(), 1.0));
    // rsub computes c - x: the constant is the first operand of the second `sub`.
    let sub = func.insts.iter().filter(|i| i.op == Op::Binary(weft_ir::BinaryOp::Sub)).nth(1).unwrap();
    assert!(matches!(def_of(&func, sub.operands[0]), Op::Constant(_)));
    assert_eq!(sub.operands[1], func.params[1]);
}

#[test]
fn select_broadcasts_all_three() {
    let f = FunctionBuilder::new("sel");
    let p = f.param("p", Bool, &[3, 1]);
    let t = f.param("t", F32, &[]);
    let e = f.param("e", F32, &[4]);
    let r = f.select(p, t, e);
    assert_eq!(f.ty(r).to_string(), "f32[3,4]");
    let ps = f.param("ps", Bool, &[]);
    let r2 = f.select(ps, t, e);
    assert_eq!(f.ty(r2).to_string(), "f32[4]");
    let x = f.param("x", F32, &[2, 4]);
    let m = f.masked_fill(x, f.lt(e, t), -1e9);
    assert_eq!(f.ty(m).to_string(), "f32[2,4]");
    let func = finish(f, &[r, r2, m]);
    // The scalar predicate stays scalar.
    let sel = func.insts.iter().filter(|i| i.op == Op::Select).nth(1).unwrap();
    assert_eq!(func.ty(sel.operands[0]).to_string(), "bool[]");
    assert_canonical(&func);
}

#[test]
fn broadcast_to_expand_and_squeeze() {
    let f = FunctionBuilder::new("bt");
    let x = f.param("x", F32, &[3, 1]);
    let same = f.broadcast_to(x, &[3, 1]);
    assert_eq!(same, x, "broadcasting to the own shape is the identity");
    let y = f.broadcast_to(x, &[2, 3, 7]);
    assert_eq!(f.ty(y).to_string(), "f32[2,3,7]");
    let func = finish(f, &[y]);
    assert_eq!(func.insts.len(), 2);
    assert_canonical(&func);
}

#[test]
fn broadcast_shapes_rules() {
    assert_eq!(broadcast_shapes(&[3, 1], &[4]).unwrap(), vec![3, 4]);
    assert_eq!(broadcast_shapes(&[], &[2, 3]).unwrap(), vec![2, 3]);
    assert_eq!(broadcast_shapes(&[5, 1, 4], &[3, 1]).unwrap(), vec![5, 3, 4]);
    assert_eq!(broadcast_shapes(&[0], &[1]).unwrap(), vec![0]);
    assert!(broadcast_shapes(&[3], &[4]).unwrap_err().contains("[3] and [4]"));
    assert!(broadcast_shapes(&[2, 3], &[3, 3]).is_err());
}

/// A shape and a second shape that broadcasts against it (each extent of
/// the second is the first's, 1, or missing on the left; or the first has 1).
fn broadcastable() -> impl Strategy<Value = (Vec<usize>, Vec<usize>)> {
    prop::collection::vec((1usize..4, 0u8..4), 0..4).prop_flat_map(|dims| {
        let a: Vec<usize> = dims.iter().map(|&(e, k)| if k == 0 { 1 } else { e }).collect();
        let b: Vec<usize> = dims.iter().map(|&(e, k)| if k == 1 { 1 } else { e }).collect();
        (Just(a), Just(b), 0..=dims.len()).prop_map(|(a, b, drop)| (a, b[drop..].to_vec()))
    })
}

proptest! {
    #[test]
    fn binary_broadcasting_matches_numpy((a, b) in broadcastable()) {
        let want = broadcast_shapes(&a, &b).unwrap();
        let f = FunctionBuilder::new("p");
        let x = f.param("x", F32, &a);
        let y = f.param("y", F32, &b);
        let s = f.add(x, y);
        let t = f.ge(y, x);
        prop_assert_eq!(f.shape(s), want.clone());
        prop_assert_eq!(f.shape(t), want);
        f.set_results(&[s, t]);
        let func = f.finish().unwrap();
        assert_canonical(&func);
    }
}

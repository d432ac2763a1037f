//! The local-computability checker rejects every instruction that would
//! need communication, and lists each problem.
mod common;
use common::*;
use weft_compiler::sharding::check_locally_computable;
use weft_compiler::CompilerError;
use weft_ir::{BinaryOp, DotDims, Function, Op};

fn problems(f: &Function) -> Vec<String> {
    match check_locally_computable(f, &mesh("x=2,y=2")) {
        Ok(()) => vec![],
        Err(CompilerError::NotLocallyComputable { problems }) => problems,
        Err(e) => panic!("unexpected error {e}"),
    }
}

fn set(f: &mut Function, v: weft_ir::ValueId, sh: &str) {
    f.values[v.index()].sharding = Some(s(sh));
}

#[test]
fn elementwise_operands_must_agree() {
    let mut b = B::new("f");
    let p = b.param("p", &[8, 8], Some("[{x}, {}]"));
    let q = b.param("q", &[8, 8], Some("[{}, {}]"));
    let a = b.op(Op::Binary(BinaryOp::Add), &[p, q]);
    set(&mut b.f, a, "[{x}, {}]");
    let ps = problems(&b.f);
    assert_eq!(ps.len(), 1, "{ps:?}");
    assert!(ps[0].contains("`%2 = add`: factor i of ([i, j], [i, j])->([i, j])"), "{ps:?}");
    set(&mut b.f, q, "[{x}, {}]");
    assert!(problems(&b.f).is_empty());
}

#[test]
fn contraction_results_must_be_unreduced_exactly() {
    let mut b = B::new("f");
    let l = b.param("l", &[8, 4], Some("[{x}, {y}]"));
    let r = b.param("r", &[4, 8], Some("[{y}, {}]"));
    let d = b.op(Op::DotGeneral(DotDims::matmul()), &[l, r]);
    set(&mut b.f, d, "[{x}, {}]");
    let ps = problems(&b.f);
    assert!(ps.len() == 1 && ps[0].contains("unreduced over {} but the sharded reduction factors give {y}"), "{ps:?}");
    set(&mut b.f, d, "[{x}, {}] unreduced {y}");
    assert!(problems(&b.f).is_empty());
    // An unreduced operand is not locally usable.
    let n = b.op(Op::Unary(weft_ir::UnaryOp::Neg), &[d]);
    set(&mut b.f, n, "[{x}, {}]");
    assert!(problems(&b.f).iter().any(|p| p.contains("operand 0 (%2) is unreduced")));
}

#[test]
fn need_replication_and_inexpressible_shardings() {
    let mut b = B::new("f");
    let p = b.param("p", &[4, 4], Some("[{}, {y}]"));
    let c = b.op(Op::Concatenate { dim: 1 }, &[p, p]);
    set(&mut b.f, c, "[{}, {y}]");
    let ps = problems(&b.f);
    assert!(ps.iter().any(|x| x.contains("needs replication but %p splits it")), "{ps:?}");

    let m4 = mesh("x=4");
    let mut b = B::new("g");
    let p = b.param("p", &[8], Some("[{x}]"));
    let r = b.op(Op::Reshape { shape: vec![2, 4] }, &[p]);
    set(&mut b.f, r, "[{}, {}]");
    let e = check_locally_computable(&b.f, &m4).unwrap_err().to_string();
    assert!(e.contains("%p dimension 0: axes {x} do not fit the factors of ([ij])->([i, j])"), "{e}");

    // [8] -> [2,4] with x=2 on the major factor is local.
    let m2 = mesh("x=2");
    let mut b = B::new("h");
    let p = b.param("p", &[8], Some("[{x}]"));
    let r = b.op(Op::Reshape { shape: vec![2, 4] }, &[p]);
    set(&mut b.f, r, "[{x}, {}]");
    check_locally_computable(&b.f, &m2).unwrap();
}

#[test]
fn missing_open_and_identity_problems_are_all_listed() {
    let mut b = B::new("f");
    let p = b.param("p", &[8, 8], Some("[{x, ?}, {}]"));
    let q = b.param("q", &[8, 8], None);
    let c = b.op(Op::ShardingConstraint { sharding: s("[{y}, {}]") }, &[q]);
    set(&mut b.f, q, "[{x}, {}]");
    set(&mut b.f, c, "[{y}, {}]");
    let r = b.op(Op::Reshard { to: s("[{}, {x}]") }, &[c]);
    set(&mut b.f, r, "[{}, {y}]");
    let _ = p;
    let ps = problems(&b.f);
    assert_eq!(ps.len(), 3, "{ps:?}");
    assert!(ps[0].contains("%p has an open sharding"), "{ps:?}");
    assert!(ps[1].contains("operand is [{x}, {}] but the result is [{y}, {}]"), "{ps:?}");
    assert!(ps[2].contains("not sharded as the reshard's target"), "{ps:?}");
}

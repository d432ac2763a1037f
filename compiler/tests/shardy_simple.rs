//! Shardy's `@simple` case (shardy/dialect/sdy/transforms/propagation/test/
//! basic_propagation.mlir): shardings flow forward through `add`, forward
//! through `dot`, and backward to the unannotated `arg2`.
mod common;
use common::*;
use weft_ir::{BinaryOp, DotDims, Op};

#[test]
fn shardy_simple_backward_propagation() {
    let m = mesh("a=2,b=2");
    let mut b = B::new("simple");
    let arg0 = b.param("arg0", &[8, 8], Some("[{a}, {b}]"));
    let arg1 = b.param("arg1", &[8, 8], None);
    let arg2 = b.param("arg2", &[8, 16], None);
    let add = b.op(Op::Binary(BinaryOp::Add), &[arg0, arg1]);
    let dot = b.op(Op::DotGeneral(DotDims::matmul()), &[add, arg2]);
    b.ret(&[dot], &[None]);
    let out = shard(&b.f, &m);
    assert_eq!(fin(&out, arg1), "[{a}, {b}]");
    assert_eq!(fin(&out, add), "[{a}, {b}]");
    // The contracting dimension is split over b: a partial result.
    assert_eq!(fin(&out, dot), "[{a}, {}] unreduced {b}");
    assert_eq!(fin(&out, arg2), "[{b}, {}]");
    for st in out.explain(arg2) {
        println!("{st}");
    }
    println!("{}", dump(&out.function));
}

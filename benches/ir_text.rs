//! Benchmark: parse + verify + print of a generated 10,000-op program.
//!
//! Target (issue "Foundation"): under 50 ms on the 2-core development
//! machine. Run with `cargo bench --bench ir_text`; results go in
//! BENCHMARKS.md. Timings are the median and minimum of repeated runs of the
//! whole parse → verify → print cycle on the same text.

use std::time::{Duration, Instant};
use weft_ir::{
    infer, BinaryOp, DType, DotDims, Function, Literal, Module, NoFunctions, Op, ReduceOp, TensorType, UnaryOp, ValueId,
};

/// Appends one instruction whose result type comes from `infer`.
fn push(f: &mut Function, op: Op, operands: Vec<ValueId>) -> ValueId {
    let tys: Vec<TensorType> = operands.iter().map(|&v| f.ty(v).clone()).collect();
    let refs: Vec<&TensorType> = tys.iter().collect();
    let ty = infer(&op, &refs, &NoFunctions).expect("generator builds well-typed ops").remove(0);
    let inst = f.add_inst(op, operands, vec![(ty, None)], None);
    f.insts[inst.index()].results[0]
}

/// A chain of mixed ops on f32[32,32] values: elementwise, dot, transpose,
/// reduce + broadcast, constants. Exactly `n` instructions.
fn generate(n: usize) -> Module {
    let t = TensorType::new(DType::F32, vec![32, 32]);
    let mut f = Function::new("main");
    let x = f.add_param(Some("x".into()), t.clone());
    let w = f.add_param(Some("w".into()), t.clone());
    let mut h = x;
    let mut count = 0;
    while count < n {
        let step = count % 8;
        h = match step {
            0 => push(&mut f, Op::DotGeneral(DotDims::matmul()), vec![h, w]),
            1 => push(&mut f, Op::Unary(UnaryOp::Tanh), vec![h]),
            2 => push(&mut f, Op::Binary(BinaryOp::Add), vec![h, x]),
            3 => push(&mut f, Op::Transpose { perm: vec![1, 0] }, vec![h]),
            4 => push(&mut f, Op::Reduce { op: ReduceOp::Sum, dims: vec![1] }, vec![h]),
            5 => push(&mut f, Op::BroadcastInDim { dims: vec![0], shape: vec![32, 32] }, vec![h]),
            6 => push(&mut f, Op::Constant(Literal::splat(t.clone(), 0.5)), vec![]),
            _ => push(&mut f, Op::Binary(BinaryOp::Mul), vec![h, x]),
        };
        count += 1;
    }
    f.results = vec![h];
    Module { functions: vec![f] }
}

fn main() {
    let n = 10_000;
    let text = weft_ir::text::print_module(&generate(n));
    let mut times = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(3);
    while times.len() < 10 || (Instant::now() < deadline && times.len() < 200) {
        let start = Instant::now();
        let m = weft_ir::text::parse_module(&text).expect("generated text parses");
        weft_ir::verify_module(&m).expect("generated program verifies");
        let printed = weft_ir::text::print_module(&m);
        times.push(start.elapsed());
        assert_eq!(printed.len(), text.len());
    }
    times.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "parse+verify+print, {n} ops, {} bytes: median {:.2} ms, min {:.2} ms over {} runs (target < 50 ms)",
        text.len(),
        ms(times[times.len() / 2]),
        ms(times[0]),
        times.len()
    );
}

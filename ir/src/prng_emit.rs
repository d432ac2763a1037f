//! Threefry random numbers emitted as IR (u32 ops), bit-identical to the
//! host reference in [`crate::prng`].
//!
//! The generator is built from primitive elementwise u32 ops (wrapping add,
//! xor, shifts, or) over a counter computed from `iota`s, so it needs no
//! special op: the interpreter runs it, sharding treats it as elementwise
//! (each device computes its block from global indices), and a GPU backend
//! can fuse the chain into one kernel. These functions work on a bare
//! [`Function`] so that both the builder and compiler transforms can use them.

use crate::{infer, BinaryOp, DType, Function, Literal, NoFunctions, Op, TensorType, ValueId};

fn push(f: &mut Function, op: Op, operands: &[ValueId]) -> ValueId {
    let tys: Vec<TensorType> = operands.iter().map(|&v| f.ty(v).clone()).collect();
    let refs: Vec<&TensorType> = tys.iter().collect();
    let ty = infer(&op, &refs, &NoFunctions)
        .unwrap_or_else(|e| panic!("prng emitted an ill-typed `{}`: {e}", op.name()))
        .remove(0);
    let i = f.add_inst(op, operands.to_vec(), vec![(ty, None)], None);
    f.insts[i.index()].results[0]
}

fn constant(f: &mut Function, ty: TensorType, v: f64) -> ValueId {
    push(f, Op::Constant(Literal::splat(ty, v)), &[])
}

fn bin(f: &mut Function, b: BinaryOp, x: ValueId, y: ValueId) -> ValueId {
    push(f, Op::Binary(b), &[x, y])
}

fn u32_const_like(f: &mut Function, like: ValueId, v: u32) -> ValueId {
    let t = f.ty(like).clone();
    constant(f, t, v as f64)
}

fn rotl(f: &mut Function, x: ValueId, r: u32) -> ValueId {
    let rl = u32_const_like(f, x, r);
    let rr = u32_const_like(f, x, 32 - r);
    let a = bin(f, BinaryOp::ShiftLeft, x, rl);
    let b = bin(f, BinaryOp::ShiftRightLogical, x, rr);
    bin(f, BinaryOp::Or, a, b)
}

/// Splits a `u32[2]` key into two `u32[]` words.
pub fn key_words(f: &mut Function, key: ValueId) -> [ValueId; 2] {
    let w = |f: &mut Function, i: usize| {
        let s = push(f, Op::Slice { start: vec![i], limit: vec![i + 1], stride: vec![1] }, &[key]);
        push(f, Op::Reshape { shape: vec![] }, &[s])
    };
    [w(f, 0), w(f, 1)]
}

/// Joins two `u32[]` words into a `u32[2]` key.
pub fn make_key(f: &mut Function, words: [ValueId; 2]) -> ValueId {
    let a = push(f, Op::Reshape { shape: vec![1] }, &[words[0]]);
    let b = push(f, Op::Reshape { shape: vec![1] }, &[words[1]]);
    push(f, Op::Concatenate { dim: 0 }, &[a, b])
}

/// Threefry-2x32 (20 rounds) of the counters `ctr` (two u32 tensors of one
/// shape) under the key words `key` (two u32 scalars).
pub fn threefry2x32(f: &mut Function, key: [ValueId; 2], ctr: [ValueId; 2]) -> [ValueId; 2] {
    let shape = f.ty(ctr[0]).shape.clone();
    let bcast = |f: &mut Function, s: ValueId| push(f, Op::BroadcastInDim { dims: vec![], shape: shape.clone() }, &[s]);
    let parity = constant(f, TensorType::scalar(DType::U32), crate::prng::KS_PARITY as f64);
    let k01 = bin(f, BinaryOp::Xor, key[0], key[1]);
    let k2 = bin(f, BinaryOp::Xor, k01, parity);
    let ks = [bcast(f, key[0]), bcast(f, key[1]), bcast(f, k2)];
    let mut x0 = bin(f, BinaryOp::Add, ctr[0], ks[0]);
    let mut x1 = bin(f, BinaryOp::Add, ctr[1], ks[1]);
    const ROTATIONS: [[u32; 4]; 2] = [[13, 15, 26, 6], [17, 29, 16, 24]];
    for group in 0..5usize {
        for &r in &ROTATIONS[group % 2] {
            x0 = bin(f, BinaryOp::Add, x0, x1);
            x1 = rotl(f, x1, r);
            x1 = bin(f, BinaryOp::Xor, x1, x0);
        }
        let g = group + 1;
        x0 = bin(f, BinaryOp::Add, x0, ks[g % 3]);
        let inj = u32_const_like(f, x1, g as u32);
        let k = bin(f, BinaryOp::Add, ks[(g + 1) % 3], inj);
        x1 = bin(f, BinaryOp::Add, x1, k);
    }
    [x0, x1]
}

/// `fold_in(key, data)`: `key` is `u32[2]`, `data` a u32 scalar.
pub fn fold_in(f: &mut Function, key: ValueId, data: ValueId) -> ValueId {
    let kw = key_words(f, key);
    let zero = constant(f, TensorType::scalar(DType::U32), 0.0);
    let [a, b] = threefry2x32(f, kw, [zero, data]);
    make_key(f, [a, b])
}

/// The row-major flat index of every element of `shape`, as u32 (shapes
/// must have fewer than 2^32 elements).
pub fn flat_index(f: &mut Function, shape: &[usize]) -> ValueId {
    let t = TensorType::new(DType::U32, shape.to_vec());
    let mut acc = constant(f, t.clone(), 0.0);
    let mut stride = 1usize;
    for d in (0..shape.len()).rev() {
        let io = push(f, Op::Iota { dim: d, ty: t.clone() }, &[]);
        let term = if stride == 1 {
            io
        } else {
            let s = constant(f, t.clone(), stride as f64);
            bin(f, BinaryOp::Mul, io, s)
        };
        acc = bin(f, BinaryOp::Add, acc, term);
        stride *= shape[d];
    }
    acc
}

/// `jax.random.bits(key, shape)` (partitionable): u32 bits of each element.
pub fn random_bits(f: &mut Function, key: ValueId, shape: &[usize]) -> ValueId {
    let n: usize = shape.iter().product();
    assert!(n as u64 <= u32::MAX as u64, "random_bits supports fewer than 2^32 elements");
    let kw = key_words(f, key);
    let lo = flat_index(f, shape);
    let hi = constant(f, TensorType::new(DType::U32, shape.to_vec()), 0.0);
    let [a, b] = threefry2x32(f, kw, [hi, lo]);
    bin(f, BinaryOp::Xor, a, b)
}

/// `jax.random.uniform(key, shape)` in `[0, 1)` as f32: the top 23 random
/// bits scaled by 2^-23 (the same value JAX gets by building a float in
/// `[1, 2)` from those bits and subtracting 1).
pub fn uniform(f: &mut Function, key: ValueId, shape: &[usize]) -> ValueId {
    let bits = random_bits(f, key, shape);
    let nine = u32_const_like(f, bits, 9);
    let top = bin(f, BinaryOp::ShiftRightLogical, bits, nine);
    let fl = push(f, Op::Convert { to: DType::F32 }, &[top]);
    let scale = constant(f, TensorType::new(DType::F32, shape.to_vec()), (2f64).powi(-23));
    bin(f, BinaryOp::Mul, fl, scale)
}

/// True with probability `p` for each element (dropout masks).
pub fn bernoulli(f: &mut Function, key: ValueId, p: f64, shape: &[usize]) -> ValueId {
    let u = uniform(f, key, shape);
    let pv = constant(f, TensorType::new(DType::F32, shape.to_vec()), p);
    push(f, Op::Compare(crate::CompareOp::Lt), &[u, pv])
}

/// Standard normal samples (f32) by the Box–Muller transform over two
/// uniform streams `fold_in(key, 0)` and `fold_in(key, 1)`. (JAX uses an
/// inverse-erf transform instead, so these values differ from JAX's.)
pub fn normal(f: &mut Function, key: ValueId, shape: &[usize]) -> ValueId {
    let t = TensorType::new(DType::F32, shape.to_vec());
    let zero = constant(f, TensorType::scalar(DType::U32), 0.0);
    let one = constant(f, TensorType::scalar(DType::U32), 1.0);
    let k0 = fold_in(f, key, zero);
    let k1 = fold_in(f, key, one);
    let u0 = uniform(f, k0, shape);
    let u1 = uniform(f, k1, shape);
    let ones = constant(f, t.clone(), 1.0);
    let u0 = bin(f, BinaryOp::Sub, ones, u0); // (0, 1]
    let l = push(f, Op::Unary(crate::UnaryOp::Log), &[u0]);
    let m2 = constant(f, t.clone(), -2.0);
    let r2 = bin(f, BinaryOp::Mul, l, m2);
    let r = push(f, Op::Unary(crate::UnaryOp::Sqrt), &[r2]);
    let tau = constant(f, t, std::f64::consts::TAU);
    let ang = bin(f, BinaryOp::Mul, u1, tau);
    let c = push(f, Op::Unary(crate::UnaryOp::Cos), &[ang]);
    bin(f, BinaryOp::Mul, r, c)
}

//! Randomly generated programs with random annotations (a deterministic
//! generator, so failures reproduce): propagation must always succeed, be
//! deterministic, and produce a locally computable program.
mod common;
use common::*;
use weft_compiler::sharding::{propagate, ConflictPolicy, PropagateOptions};
use weft_compiler::CompilerError;
use weft_ir::{
    BinaryOp, DType, DimSharding, DotDims, Function, Literal, Op, ReduceOp, TensorSharding, TensorType, UnaryOp,
    ValueId,
};

/// xorshift64*: small, deterministic.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

fn random_sharding(r: &mut Rng, shape: &[usize], axes: &[(&str, usize)]) -> TensorSharding {
    let mut dims: Vec<DimSharding> = shape.iter().map(|_| DimSharding::closed(&[])).collect();
    let mut products = vec![1usize; shape.len()];
    for &(name, size) in axes {
        if shape.is_empty() || !r.chance(60) {
            continue;
        }
        let d = r.below(shape.len());
        if shape[d] % (products[d] * size) == 0 {
            dims[d].axes.push(name.to_string());
            products[d] *= size;
        }
    }
    for d in dims.iter_mut() {
        d.open = r.chance(30);
    }
    TensorSharding { dims, unreduced: vec![] }
}

fn ty(shape: &[usize]) -> TensorType {
    TensorType::new(DType::F32, shape.to_vec())
}

fn program(seed: u64, axes: &[(&str, usize)]) -> Function {
    let mut r = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut b = B::new("rand");
    let shapes: [&[usize]; 6] = [&[8, 4], &[4, 8], &[8, 8], &[4, 4], &[8], &[2, 4, 8]];
    let mut pool: Vec<ValueId> = Vec::new();
    for i in 0..4 {
        let shape = shapes[r.below(shapes.len())];
        let v = b.param(&format!("p{i}"), shape, None);
        if r.chance(50) {
            let mut sh = random_sharding(&mut r, shape, axes);
            // Sometimes a pending sum over an axis the dimensions do not use.
            if let Some(&(free, _)) = axes.iter().find(|(a, _)| !sh.axes().any(|x| x == *a)) {
                if r.chance(15) {
                    sh.unreduced.push(free.to_string());
                }
            }
            b.f.values[v.index()].sharding = Some(sh);
        }
        pool.push(v);
    }
    for _ in 0..24 {
        let a = pool[r.below(pool.len())];
        let sa = b.f.ty(a).shape.clone();
        let rank = sa.len();
        let v = match r.below(18) {
            0 => b.op(Op::Unary(UnaryOp::Exp), &[a]),
            1 | 2 => {
                let same: Vec<ValueId> = pool.iter().copied().filter(|&p| b.f.ty(p).shape == sa).collect();
                let o = same[r.below(same.len())];
                let op = [BinaryOp::Add, BinaryOp::Mul, BinaryOp::Max][r.below(3)];
                b.op(Op::Binary(op), &[a, o])
            }
            3 if rank >= 2 => {
                let mut perm: Vec<usize> = (0..rank).collect();
                perm.rotate_left(1 + r.below(rank - 1));
                b.op(Op::Transpose { perm }, &[a])
            }
            4 if rank >= 1 => {
                let d = r.below(rank);
                let op = if r.chance(70) { ReduceOp::Sum } else { ReduceOp::Max };
                b.op(Op::Reduce { op, dims: vec![d] }, &[a])
            }
            5 if rank <= 2 => {
                let pos = r.below(rank + 1);
                let mut shape = sa.clone();
                shape.insert(pos, [2, 4][r.below(2)]);
                let dims: Vec<usize> = (0..rank + 1).filter(|&d| d != pos).collect();
                b.op(Op::BroadcastInDim { dims, shape }, &[a])
            }
            6 if rank >= 2 => {
                let d = r.below(rank - 1);
                let mut shape = sa.clone();
                let merged = shape.remove(d + 1);
                shape[d] *= merged;
                b.op(Op::Reshape { shape }, &[a])
            }
            7 if sa.iter().any(|&n| n >= 4 && n % 2 == 0) => {
                let d = (0..rank).find(|&d| sa[d] >= 4 && sa[d] % 2 == 0).unwrap();
                let mut shape = sa.clone();
                shape[d] /= 2;
                shape.insert(d + 1, 2);
                b.op(Op::Reshape { shape }, &[a])
            }
            8 => {
                let cands: Vec<ValueId> = pool
                    .iter()
                    .copied()
                    .filter(|&p| rank >= 1 && b.f.ty(p).rank() >= 1 && b.f.ty(p).shape[0] == sa[rank - 1])
                    .collect();
                if cands.is_empty() {
                    continue;
                }
                let o = cands[r.below(cands.len())];
                let dims = DotDims {
                    lhs_batch: vec![],
                    rhs_batch: vec![],
                    lhs_contract: vec![rank - 1],
                    rhs_contract: vec![0],
                };
                b.op(Op::DotGeneral(dims), &[a, o])
            }
            9 if rank >= 1 => {
                let d = r.below(rank);
                let mut limit = sa.clone();
                limit[d] = sa[d] / 2;
                b.op(Op::Slice { start: vec![0; rank], limit, stride: vec![1; rank] }, &[a])
            }
            10 if rank >= 1 => b.op(Op::Concatenate { dim: r.below(rank) }, &[a, a]),
            11 if rank >= 1 => {
                let z = b.op(Op::Constant(Literal::scalar(DType::F32, 0.0)), &[]);
                let d = r.below(rank);
                let mut low = vec![0i64; rank];
                low[d] = 2;
                b.op(Op::Pad { low: low.clone(), high: low, interior: vec![0; rank] }, &[a, z])
            }
            12 => {
                let s = random_sharding(&mut r, &sa, axes);
                b.op(Op::ShardingConstraint { sharding: s }, &[a])
            }
            13 => {
                let t = b.op(Op::Constant(Literal::scalar(DType::Bool, 1.0)), &[]);
                b.op(Op::Select, &[t, a, a])
            }
            14 if rank >= 1 => b.op(Op::Iota { dim: r.below(rank), ty: ty(&sa) }, &[]),
            15 => {
                let s = random_sharding(&mut r, &sa, axes);
                b.op(Op::Reshard { to: s }, &[a])
            }
            16 if rank >= 1 => {
                // A gather of slices along a dimension and its transpose.
                let d = r.below(rank);
                let n = [2, 4][r.below(2)];
                let idx = b.op(Op::Iota { dim: 0, ty: TensorType::new(DType::I32, vec![n]) }, &[]);
                let g = b.op(Op::Index(weft_ir::IndexOp::Gather { axis: d, batch_dims: 0 }), &[a, idx]);
                if r.chance(50) {
                    b.op(Op::Index(weft_ir::IndexOp::ScatterAdd { axis: d, batch_dims: 0, size: sa[d] }), &[idx, g])
                } else {
                    g
                }
            }
            17 if rank >= 1 => {
                b.op(Op::Index(weft_ir::IndexOp::Cumsum { dim: r.below(rank), reverse: r.chance(50) }), &[a])
            }
            _ => b.op(Op::Constant(Literal::splat(ty(&sa), 1.0)), &[]),
        };
        if r.chance(8)
            && !matches!(b.f.insts.last().map(|i| &i.op), Some(Op::ShardingConstraint { .. } | Op::Reshard { .. }))
        {
            let shape = b.f.ty(v).shape.clone();
            b.f.values[v.index()].sharding = Some(random_sharding(&mut r, &shape, axes));
        }
        pool.push(v);
    }
    let n = 1 + r.below(3);
    let results: Vec<ValueId> = (0..n).map(|_| pool[pool.len() - 1 - r.below(6)]).collect();
    let shardings: Vec<Option<TensorSharding>> = results
        .iter()
        .map(|&v| if r.chance(40) { Some(random_sharding(&mut r, &b.f.ty(v).shape.clone(), axes)) } else { None })
        .collect();
    b.f.results = results;
    b.f.result_shardings = shardings;
    b.f
}

fn run(mesh_text: &str, axes: &[(&str, usize)], seeds: u64) {
    let m = mesh(mesh_text);
    let (mut reshards, mut conflicts) = (0, 0);
    for seed in 0..seeds {
        let f = program(seed, axes);
        let a = propagate(&f, &m, &PropagateOptions::default())
            .unwrap_or_else(|e| panic!("seed {seed}: {e}\n{}", dump(&f)));
        if let Err(e) = a.check() {
            panic!("seed {seed}: {e}\n{}\n{}", dump(&f), dump(&a.function));
        }
        weft_ir::verify_function(&weft_ir::Module::new(), &a.function).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        let b = propagate(&f, &m, &PropagateOptions::default()).unwrap();
        assert_eq!(a.function, b.function, "seed {seed} is not deterministic");
        assert!(a.stats.converged, "seed {seed}");
        reshards += a.num_reshards();
        let strict = PropagateOptions { conflict_policy: ConflictPolicy::Error, ..Default::default() };
        match propagate(&f, &m, &strict) {
            Ok(c) => assert_eq!(c.function, a.function, "seed {seed}"),
            Err(CompilerError::ConflictingAnnotations { .. }) => conflicts += 1,
            Err(e) => panic!("seed {seed}: {e}"),
        }
    }
    assert!(conflicts > 0);
    assert!(reshards > 0);
}

#[test]
fn random_programs_on_a_2x2_mesh() {
    run("x=2,y=2", &[("x", 2), ("y", 2)], 600);
}

#[test]
fn random_programs_on_a_2x4x2_mesh() {
    run("x=2,y=4,z=2", &[("x", 2), ("y", 4), ("z", 2)], 600);
}

//! Random well-typed modules for the text-format property tests.
//!
//! Programs are built with the core API (`Function::add_param`, `add_inst`,
//! result types from `infer`) from a stream of choices that proptest
//! generates and shrinks: an exhausted stream always picks the first option,
//! so shrinking the stream shrinks the program.
#![allow(dead_code)]

use weft_ir::{
    infer, BinaryOp, CompareOp, DType, DotDims, Function, IndexOp, Literal, Module, Op, ReduceOp, TensorSharding,
    TensorType, UnaryOp, ValueId,
};

/// A stream of random choices.
pub struct Choices {
    data: Vec<u32>,
    pos: usize,
}

impl Choices {
    /// Wraps raw random numbers.
    pub fn new(data: Vec<u32>) -> Choices {
        Choices { data, pos: 0 }
    }

    /// The next raw number (0 once exhausted).
    pub fn raw(&mut self) -> u32 {
        let v = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        v
    }

    /// A number in `0..n` (0 if `n == 0`).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            self.raw() as usize % n
        }
    }

    /// True with probability 1/n.
    pub fn one_in(&mut self, n: usize) -> bool {
        self.below(n) == n - 1
    }

    /// One of `xs`.
    pub fn pick<T: Clone>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len())].clone()
    }
}

/// A module of one to three functions; a function may call the functions
/// after it (so calls refer forward), or, in reversed modules, before it.
pub fn module(c: &mut Choices) -> Module {
    let n = 1 + c.below(3);
    let mut built: Vec<Function> = Vec::new();
    for i in (0..n).rev() {
        let mut g = Gen { f: Function::new(format!("f{i}")), c: &mut *c, callees: &built, names: 0 };
        g.function();
        let f = g.f;
        built.push(f);
    }
    if !c.one_in(3) {
        built.reverse();
    }
    Module { functions: built }
}

struct Gen<'a> {
    f: Function,
    c: &'a mut Choices,
    callees: &'a [Function],
    names: usize,
}

const AXES: [&str; 4] = ["data", "model", "x", "y.z"];

impl Gen<'_> {
    fn function(&mut self) {
        for _ in 0..self.c.below(4) {
            let ty = self.ty();
            let name = self.name();
            let p = self.f.add_param(name, ty);
            self.maybe_shard(p);
        }
        for _ in 0..self.c.below(14) {
            self.inst();
        }
        let n = if self.f.values.is_empty() { 0 } else { self.c.below(4) };
        for _ in 0..n {
            let v = ValueId(self.c.below(self.f.values.len()) as u32);
            self.f.results.push(v);
        }
        if n > 0 && self.c.one_in(2) {
            let mut s: Vec<Option<TensorSharding>> = Vec::new();
            for &r in &self.f.results.clone() {
                s.push(if self.c.one_in(2) { Some(self.sharding(self.f.ty(r).rank())) } else { None });
            }
            if s[0].is_none() {
                s[0] = Some(self.sharding(self.f.ty(self.f.results[0]).rank()));
            }
            self.f.result_shardings = s;
        }
    }

    fn name(&mut self) -> Option<String> {
        self.names += 1;
        let n = self.names;
        match self.c.below(6) {
            0 | 1 => None,
            2 => Some(format!("x{n}")),
            3 => Some(format!("params.layers.{n}.w")),
            4 => Some(format!("{n}a")),
            _ => Some(format!("_t{n}")),
        }
    }

    fn shape(&mut self, rank: usize) -> Vec<usize> {
        (0..rank).map(|_| if self.c.one_in(12) { 0 } else { 1 + self.c.below(4) }).collect()
    }

    fn ty(&mut self) -> TensorType {
        let d = self.c.pick(&DType::ALL);
        let rank = self.c.below(4);
        TensorType::new(d, self.shape(rank))
    }

    fn sharding(&mut self, rank: usize) -> TensorSharding {
        let mut free: Vec<&str> = AXES.to_vec();
        let mut s = TensorSharding::replicated(rank);
        for d in 0..rank {
            for _ in 0..self.c.below(3) {
                if !free.is_empty() && self.c.one_in(2) {
                    let a = free.remove(self.c.below(free.len()));
                    s.dims[d].axes.push(a.to_string());
                }
            }
            s.dims[d].open = self.c.one_in(3);
        }
        if !free.is_empty() && self.c.one_in(3) {
            s.unreduced.push(free[self.c.below(free.len())].to_string());
        }
        s
    }

    fn maybe_shard(&mut self, v: ValueId) {
        if self.c.one_in(4) {
            let s = self.sharding(self.f.ty(v).rank());
            self.f.values[v.index()].sharding = Some(s);
        }
    }

    /// Adds an instruction with inferred, possibly named and sharded results.
    fn add(&mut self, op: Op, operands: Vec<ValueId>) -> Vec<ValueId> {
        let tys: Vec<&TensorType> = operands.iter().map(|&o| self.f.ty(o)).collect();
        let callees = Module { functions: self.callees.to_vec() };
        let types = infer(&op, &tys, &callees).unwrap_or_else(|e| panic!("generator built an ill-typed {op:?}: {e}"));
        let results: Vec<_> = types.into_iter().map(|t| (t, self.name())).collect();
        let id = self.f.add_inst(op, operands, results, None);
        let results = self.f.insts[id.index()].results.clone();
        for &r in &results {
            self.maybe_shard(r);
        }
        results
    }

    fn value(&mut self, d: DType) -> f64 {
        let v = match d {
            DType::Bool => self.c.below(2) as f64,
            DType::I32 => self.c.raw() as i32 as f64,
            DType::U32 => self.c.raw() as f64,
            _ => match self.c.below(8) {
                0 => f64::NAN,
                1 => f64::INFINITY,
                2 => f64::NEG_INFINITY,
                3 => -0.0,
                4 => f64::from_bits(((self.c.raw() as u64) << 32) | self.c.raw() as u64),
                5 => 1e-8,
                _ => (self.c.below(2001) as f64 - 1000.0) / 8.0,
            },
        };
        d.round(v)
    }

    fn constant(&mut self, ty: TensorType) -> ValueId {
        let n = ty.num_elements();
        let lit = if ty.rank() > 0 && n <= 24 && self.c.one_in(2) {
            let values = (0..n).map(|_| self.value(ty.dtype)).collect();
            Literal::dense(ty, values).expect("count matches")
        } else {
            let v = self.value(ty.dtype);
            Literal::splat(ty, v)
        };
        self.add(Op::Constant(lit), vec![])[0]
    }

    /// A value whose type satisfies `pred`, or a new constant of type `make`.
    fn operand(&mut self, pred: impl Fn(&TensorType) -> bool, make: impl FnOnce(&mut Self) -> TensorType) -> ValueId {
        let ok: Vec<ValueId> =
            (0..self.f.values.len()).map(|i| ValueId(i as u32)).filter(|&v| pred(self.f.ty(v))).collect();
        if !ok.is_empty() && !self.c.one_in(5) {
            return self.c.pick(&ok);
        }
        let ty = make(self);
        self.constant(ty)
    }

    fn same_type_as(&mut self, v: ValueId) -> ValueId {
        let t = self.f.ty(v).clone();
        self.operand(|u| *u == t, |_| t.clone())
    }

    fn float_ty(&mut self) -> TensorType {
        let d = self.c.pick(&[DType::F32, DType::F64, DType::BF16, DType::F16]);
        let rank = self.c.below(4);
        TensorType::new(d, self.shape(rank))
    }

    fn increasing_subset(&mut self, n: usize) -> Vec<usize> {
        (0..n).filter(|_| self.c.one_in(2)).collect()
    }

    fn inst(&mut self) {
        let any = |_: &TensorType| true;
        let numeric = |t: &TensorType| !t.dtype.is_bool();
        match self.c.below(19) {
            0 => {
                let ty = self.ty();
                self.constant(ty);
            }
            1 => {
                let d = self.c.pick(&[DType::F32, DType::I32, DType::U32, DType::BF16, DType::F64, DType::F16]);
                let rank = 1 + self.c.below(3);
                let ty = TensorType::new(d, self.shape(rank));
                let dim = self.c.below(ty.rank());
                self.add(Op::Iota { dim, ty }, vec![]);
            }
            2 => {
                let u = self.c.pick(&UnaryOp::ALL);
                let d = if u == UnaryOp::Not { DType::U32 } else { DType::F32 };
                let v = self.operand(|t| u.accepts(t.dtype), |g| TensorType::new(d, g.shape(2)));
                self.add(Op::Unary(u), vec![v]);
            }
            3 => {
                let b = self.c.pick(&BinaryOp::ALL);
                let d = if b.accepts(DType::F32) { DType::F32 } else { DType::I32 };
                let v = self.operand(|t| b.accepts(t.dtype), |g| TensorType::new(d, g.shape(1)));
                let w = self.same_type_as(v);
                self.add(Op::Binary(b), vec![v, w]);
            }
            4 => {
                let v = self.operand(any, Self::ty);
                let w = self.same_type_as(v);
                let op = Op::Compare(self.c.pick(&CompareOp::ALL));
                self.add(op, vec![v, w]);
            }
            5 => {
                let v = self.operand(any, Self::ty);
                let shape = self.f.ty(v).shape.clone();
                let p = self.operand(
                    |t| t.dtype == DType::Bool && (t.rank() == 0 || t.shape == shape),
                    |_| TensorType::new(DType::Bool, shape.clone()),
                );
                let w = self.same_type_as(v);
                self.add(Op::Select, vec![p, v, w]);
            }
            6 => {
                let v = self.operand(any, Self::ty);
                let op = Op::Convert { to: self.c.pick(&DType::ALL) };
                self.add(op, vec![v]);
            }
            7 => {
                let v = self.operand(any, Self::ty);
                let t = self.f.ty(v).clone();
                let rank = t.rank() + self.c.below(3);
                let mut dims: Vec<usize> = (0..rank).collect();
                while dims.len() > t.rank() {
                    dims.remove(self.c.below(dims.len()));
                }
                let mut shape = self.shape(rank);
                for (i, &d) in dims.iter().enumerate() {
                    if t.shape[i] != 1 || self.c.one_in(2) {
                        shape[d] = t.shape[i];
                    }
                }
                self.add(Op::BroadcastInDim { dims, shape }, vec![v]);
            }
            8 => {
                let v = self.operand(any, Self::ty);
                let n = self.f.ty(v).num_elements();
                let shape = match self.c.below(3) {
                    0 => vec![n],
                    1 if n % 2 == 0 => vec![2, n / 2],
                    _ => vec![1, n, 1],
                };
                self.add(Op::Reshape { shape }, vec![v]);
            }
            9 => {
                let v = self.operand(any, Self::ty);
                let mut perm: Vec<usize> = (0..self.f.ty(v).rank()).collect();
                for i in (1..perm.len()).rev() {
                    perm.swap(i, self.c.below(i + 1));
                }
                self.add(Op::Transpose { perm }, vec![v]);
            }
            10 => {
                let v = self.operand(any, Self::ty);
                let shape = self.f.ty(v).shape.clone();
                let (mut start, mut limit, mut stride) = (vec![], vec![], vec![]);
                for e in shape {
                    let s = self.c.below(e + 1);
                    start.push(s);
                    limit.push(s + self.c.below(e - s + 1));
                    stride.push(1 + if self.c.one_in(3) { self.c.below(3) } else { 0 });
                }
                self.add(Op::Slice { start, limit, stride }, vec![v]);
            }
            11 => {
                let v = self.operand(|t| t.rank() > 0, |g| TensorType::new(DType::I32, g.shape(2)));
                let mut ops = vec![v];
                for _ in 0..self.c.below(3) {
                    let w = self.same_type_as(v);
                    ops.push(w);
                }
                let dim = self.c.below(self.f.ty(v).rank());
                self.add(Op::Concatenate { dim }, ops);
            }
            12 => {
                let v = self.operand(any, Self::ty);
                let t = self.f.ty(v).clone();
                let p = self.operand(|u| u.rank() == 0 && u.dtype == t.dtype, |_| TensorType::scalar(t.dtype));
                let (mut low, mut high, mut interior) = (vec![], vec![], vec![]);
                for &e in &t.shape {
                    let (l, h, i) = (self.c.below(4) as i64 - 1, self.c.below(4) as i64 - 1, self.c.below(3));
                    let inner = if e == 0 { 0 } else { (e + (e - 1) * i) as i64 };
                    let ok = inner + l + h >= 0;
                    low.push(if ok { l } else { 0 });
                    high.push(if ok { h } else { 0 });
                    interior.push(if self.c.one_in(2) { 0 } else { i });
                }
                self.add(Op::Pad { low, high, interior }, vec![v, p]);
            }
            13 => {
                let v = self.operand(numeric, Self::float_ty);
                let w = self.same_type_as(v);
                let mut dims = DotDims::default();
                for d in 0..self.f.ty(v).rank() {
                    match self.c.below(3) {
                        0 => {
                            dims.lhs_batch.push(d);
                            dims.rhs_batch.push(d);
                        }
                        1 => {
                            dims.lhs_contract.push(d);
                            dims.rhs_contract.push(d);
                        }
                        _ => {}
                    }
                }
                self.add(Op::DotGeneral(dims), vec![v, w]);
            }
            14 => {
                let v = self.operand(numeric, Self::float_ty);
                let dims = self.increasing_subset(self.f.ty(v).rank());
                let op = Op::Reduce { op: self.c.pick(&ReduceOp::ALL), dims };
                self.add(op, vec![v]);
            }
            15 if !self.callees.is_empty() => {
                let callees = self.callees;
                let callee = &callees[self.c.below(callees.len())];
                let (name, params) = (callee.name.clone(), callee.param_types());
                let args = params.into_iter().map(|p| self.operand(|t| *t == p, |_| p.clone())).collect();
                let remat = self.c.one_in(3);
                self.add(Op::Call { callee: name, remat }, args);
            }
            18 => {
                // An indexing op on a numeric operand of rank 1 or more.
                let v = self.operand(
                    |t| !t.dtype.is_bool() && t.rank() > 0,
                    |g| {
                        let rank = 1 + g.c.below(3);
                        TensorType::new(DType::F32, g.shape(rank))
                    },
                );
                let t = self.f.ty(v).clone();
                match self.c.below(4) {
                    0 => {
                        let dim = self.c.below(t.rank());
                        let reverse = self.c.one_in(2);
                        self.add(Op::Index(IndexOp::Cumsum { dim, reverse }), vec![v]);
                    }
                    1 => {
                        let k = self.c.below(t.shape[t.rank() - 1] + 1);
                        self.add(Op::Index(IndexOp::TopK { k }), vec![v]);
                    }
                    _ => {
                        let axis = self.c.below(t.rank());
                        let ity = TensorType::new(DType::I32, vec![1 + self.c.below(4)]);
                        let idx = self.add(Op::Iota { dim: 0, ty: ity }, vec![])[0];
                        let g = self.add(Op::Index(IndexOp::Gather { axis, batch_dims: 0 }), vec![v, idx])[0];
                        if self.c.one_in(2) {
                            let size = t.shape[axis];
                            self.add(Op::Index(IndexOp::ScatterAdd { axis, batch_dims: 0, size }), vec![idx, g]);
                        }
                    }
                }
            }
            16 | 17 => {
                let v = self.operand(any, Self::ty);
                let s = self.sharding(self.f.ty(v).rank());
                let op = if self.c.one_in(2) { Op::ShardingConstraint { sharding: s } } else { Op::Reshard { to: s } };
                self.add(op, vec![v]);
            }
            _ => {
                let ty = self.ty();
                self.constant(ty);
            }
        }
    }
}

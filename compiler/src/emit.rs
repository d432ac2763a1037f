//! A small instruction emitter over the core IR API, for transforms.
//!
//! Transforms (autodiff, optimizers, the training step) take *verified*
//! functions and emit new instructions. A result type that `infer` rejects
//! is then a bug in the transform, not a user mistake, so [`Emitter`] panics
//! naming the op and operand types rather than returning an error.

use weft_ir::{
    infer, BinaryOp, CompareOp, DType, DotDims, Function, Literal, Module, NoFunctions, Op, ReduceOp, SignatureLookup,
    TensorType, UnaryOp, ValueId,
};

/// Appends instructions to a function, inferring result types.
pub struct Emitter<'m> {
    /// The function being built.
    pub f: Function,
    /// Signatures for `call`.
    funcs: &'m dyn SignatureLookup,
}

impl Emitter<'static> {
    /// An emitter for a new, empty function that makes no calls.
    pub fn new(name: impl Into<String>) -> Emitter<'static> {
        Emitter { f: Function::new(name), funcs: &NoFunctions }
    }
}

impl<'m> Emitter<'m> {
    /// An emitter whose `call`s are resolved in `m`.
    pub fn with_module(name: impl Into<String>, m: &'m Module) -> Emitter<'m> {
        Emitter { f: Function::new(name), funcs: m }
    }

    /// Type of a value.
    pub fn ty(&self, v: ValueId) -> TensorType {
        self.f.ty(v).clone()
    }

    /// Appends `op` and returns all its results.
    pub fn op_multi(&mut self, op: Op, operands: &[ValueId]) -> Vec<ValueId> {
        let tys: Vec<TensorType> = operands.iter().map(|&v| self.ty(v)).collect();
        let refs: Vec<&TensorType> = tys.iter().collect();
        let results = infer(&op, &refs, self.funcs).unwrap_or_else(|e| {
            let shown: Vec<String> = tys.iter().map(|t| t.to_string()).collect();
            panic!("transform emitted an ill-typed `{}` on ({}): {e}", op.name(), shown.join(", "))
        });
        let inst = self.f.add_inst(op, operands.to_vec(), results.into_iter().map(|t| (t, None)).collect(), None);
        self.f.insts[inst.index()].results.clone()
    }

    /// Appends a single-result `op`.
    pub fn op(&mut self, op: Op, operands: &[ValueId]) -> ValueId {
        let r = self.op_multi(op, operands);
        assert_eq!(r.len(), 1, "op_multi used for a single-result op");
        r[0]
    }

    /// A splat constant of type `ty`.
    pub fn full(&mut self, ty: &TensorType, v: f64) -> ValueId {
        self.op(Op::Constant(Literal::splat(ty.clone(), v)), &[])
    }

    /// A scalar constant.
    pub fn scalar(&mut self, dtype: DType, v: f64) -> ValueId {
        self.full(&TensorType::scalar(dtype), v)
    }

    /// A constant with `like`'s type and value `v` everywhere.
    pub fn full_like(&mut self, like: ValueId, v: f64) -> ValueId {
        let t = self.ty(like);
        self.full(&t, v)
    }

    /// Elementwise unary op.
    pub fn unary(&mut self, u: UnaryOp, x: ValueId) -> ValueId {
        self.op(Op::Unary(u), &[x])
    }

    /// Elementwise binary op (identical operand types).
    pub fn binary(&mut self, b: BinaryOp, x: ValueId, y: ValueId) -> ValueId {
        self.op(Op::Binary(b), &[x, y])
    }

    /// `x + y`.
    pub fn add(&mut self, x: ValueId, y: ValueId) -> ValueId {
        self.binary(BinaryOp::Add, x, y)
    }

    /// `x - y`.
    pub fn sub(&mut self, x: ValueId, y: ValueId) -> ValueId {
        self.binary(BinaryOp::Sub, x, y)
    }

    /// `x * y`.
    pub fn mul(&mut self, x: ValueId, y: ValueId) -> ValueId {
        self.binary(BinaryOp::Mul, x, y)
    }

    /// `x / y`.
    pub fn div(&mut self, x: ValueId, y: ValueId) -> ValueId {
        self.binary(BinaryOp::Div, x, y)
    }

    /// `-x`.
    pub fn neg(&mut self, x: ValueId) -> ValueId {
        self.unary(UnaryOp::Neg, x)
    }

    /// `x * c` for a constant `c`.
    pub fn mul_const(&mut self, x: ValueId, c: f64) -> ValueId {
        let k = self.full_like(x, c);
        self.mul(x, k)
    }

    /// `x + c` for a constant `c`.
    pub fn add_const(&mut self, x: ValueId, c: f64) -> ValueId {
        let k = self.full_like(x, c);
        self.add(x, k)
    }

    /// Comparison.
    pub fn compare(&mut self, c: CompareOp, x: ValueId, y: ValueId) -> ValueId {
        self.op(Op::Compare(c), &[x, y])
    }

    /// `select(p, t, f)`.
    pub fn select(&mut self, p: ValueId, t: ValueId, f: ValueId) -> ValueId {
        self.op(Op::Select, &[p, t, f])
    }

    /// Converts to another dtype (a no-op when already of that dtype).
    pub fn convert(&mut self, x: ValueId, to: DType) -> ValueId {
        if self.ty(x).dtype == to {
            return x;
        }
        self.op(Op::Convert { to }, &[x])
    }

    /// `reduce_sum` over `dims` (a no-op when `dims` is empty).
    pub fn reduce_sum(&mut self, x: ValueId, dims: Vec<usize>) -> ValueId {
        if dims.is_empty() {
            return x;
        }
        self.op(Op::Reduce { op: ReduceOp::Sum, dims }, &[x])
    }

    /// `broadcast_in_dim` (a no-op when it would be the identity).
    pub fn broadcast(&mut self, x: ValueId, dims: Vec<usize>, shape: Vec<usize>) -> ValueId {
        let t = self.ty(x);
        if t.shape == shape && dims.iter().copied().eq(0..shape.len()) {
            return x;
        }
        self.op(Op::BroadcastInDim { dims, shape }, &[x])
    }

    /// Reshape (a no-op when the shape is unchanged).
    pub fn reshape(&mut self, x: ValueId, shape: Vec<usize>) -> ValueId {
        if self.ty(x).shape == shape {
            return x;
        }
        self.op(Op::Reshape { shape }, &[x])
    }

    /// Transpose (a no-op for the identity permutation).
    pub fn transpose(&mut self, x: ValueId, perm: Vec<usize>) -> ValueId {
        if perm.iter().copied().eq(0..perm.len()) {
            return x;
        }
        self.op(Op::Transpose { perm }, &[x])
    }

    /// `dot_general`.
    pub fn dot(&mut self, x: ValueId, y: ValueId, dims: DotDims) -> ValueId {
        self.op(Op::DotGeneral(dims), &[x, y])
    }
}

impl Emitter<'_> {
    /// Copies `callee`'s instructions into this function with its parameters
    /// bound to `args`, and returns the values of its results. Value names
    /// are not copied (they would collide when inlining twice). One level
    /// only: calls in `callee` stay calls, so a `remat` marking survives for
    /// a later [`crate::autodiff::value_and_grad`] (which inlines everything with
    /// [`crate::inline::inline_function`]).
    pub fn inline(&mut self, callee: &Function, args: &[ValueId]) -> Vec<ValueId> {
        assert_eq!(args.len(), callee.params.len(), "inline of @{} with the wrong number of arguments", callee.name);
        let mut map: std::collections::HashMap<ValueId, ValueId> =
            callee.params.iter().copied().zip(args.iter().copied()).collect();
        for inst in &callee.insts {
            let ops: Vec<ValueId> = inst.operands.iter().map(|o| map[o]).collect();
            let results = self.op_multi(inst.op.clone(), &ops);
            for (&r, nr) in inst.results.iter().zip(results) {
                self.f.values[nr.index()].sharding = callee.value(r).sharding.clone();
                map.insert(r, nr);
            }
        }
        callee.results.iter().map(|r| map[r]).collect()
    }

    /// Sum of all elements (a scalar).
    pub fn sum_all(&mut self, x: ValueId) -> ValueId {
        let r = self.ty(x).rank();
        self.reduce_sum(x, (0..r).collect())
    }

    /// Names a value (if the name is free) and returns it.
    pub fn named(&mut self, v: ValueId, name: impl Into<String>) -> ValueId {
        let name = name.into();
        if self.f.value_by_name(&name).is_none() {
            self.f.values[v.index()].name = Some(name);
        }
        v
    }
}

//! Elementwise ops with NumPy-style broadcasting.
//!
//! The IR's binary, compare and select ops need operands of identical type;
//! these helpers accept any shapes that broadcast (see
//! [`broadcast_shapes`](super::broadcast_shapes)) and insert the
//! broadcasts. Dtypes are never promoted implicitly: mixing `f32` and `i32`
//! is an error that asks for an explicit [`convert`](FunctionBuilder::convert).
//! The `*_scalar` helpers make a splat constant of the tensor's own type.

use super::{broadcast_shapes, FunctionBuilder, Value};
use crate::{BinaryOp, CompareOp, DType, Op, UnaryOp};

macro_rules! unary_methods {
    ($($(#[$doc:meta])* $name:ident => $op:ident;)*) => {$(
        $(#[$doc])*
        #[track_caller]
        pub fn $name(&self, x: Value) -> Value {
            self.unary(UnaryOp::$op, x)
        }
    )*};
}

macro_rules! binary_methods {
    ($($(#[$doc:meta])* $name:ident => $op:ident;)*) => {$(
        $(#[$doc])*
        ///
        /// Broadcasts NumPy-style; both operands must have the same dtype.
        #[track_caller]
        pub fn $name(&self, a: Value, b: Value) -> Value {
            self.binary(BinaryOp::$op, a, b)
        }
    )*};
}

macro_rules! compare_methods {
    ($($(#[$doc:meta])* $name:ident => $op:ident;)*) => {$(
        $(#[$doc])*
        ///
        /// Broadcasts NumPy-style; the result is `bool`.
        #[track_caller]
        pub fn $name(&self, a: Value, b: Value) -> Value {
            self.compare(CompareOp::$op, a, b)
        }
    )*};
}

macro_rules! scalar_methods {
    ($($(#[$doc:meta])* $name:ident => $op:ident;)*) => {$(
        $(#[$doc])*
        #[track_caller]
        pub fn $name(&self, x: Value, c: f64) -> Value {
            self.binary_scalar(BinaryOp::$op, x, c)
        }
    )*};
}

impl FunctionBuilder {
    /// Applies an elementwise unary op.
    #[track_caller]
    pub fn unary(&self, op: UnaryOp, x: Value) -> Value {
        self.emit1(Op::Unary(op), &[x])
    }

    unary_methods! {
        /// `-x`.
        neg => Neg;
        /// `|x|`.
        abs => Abs;
        /// `e^x`.
        exp => Exp;
        /// Natural logarithm.
        log => Log;
        /// `ln(1 + x)`, accurate for small `x`.
        log1p => Log1p;
        /// Hyperbolic tangent.
        tanh => Tanh;
        /// Cosine.
        cos => Cos;
        /// Sine.
        sin => Sin;
        /// `1 / (1 + e^-x)` (the primitive; [`sigmoid`](Self::sigmoid) is an alias).
        logistic => Logistic;
        /// Square root.
        sqrt => Sqrt;
        /// `1 / sqrt(x)`.
        rsqrt => Rsqrt;
        /// -1, 0 or 1.
        sign => Sign;
        /// Round toward -inf.
        floor => Floor;
        /// Bitwise (integers) or logical (bool) not.
        not => Not;
        /// True where `x` is neither infinite nor NaN.
        is_finite => IsFinite;
    }

    /// Applies an elementwise binary op, broadcasting NumPy-style.
    #[track_caller]
    pub fn binary(&self, op: BinaryOp, a: Value, b: Value) -> Value {
        self.scope(op.name(), || match self.broadcast_pair(op.name(), a, b) {
            Some((a, b)) => self.emit1(Op::Binary(op), &[a, b]),
            None => self.poison(),
        })
    }

    binary_methods! {
        /// `a + b`.
        add => Add;
        /// `a - b`.
        sub => Sub;
        /// `a * b`.
        mul => Mul;
        /// `a / b` (integers truncate toward zero).
        div => Div;
        /// Remainder with the sign of `a`.
        rem => Rem;
        /// Elementwise maximum (NaN-propagating), like `numpy.maximum`.
        /// (The reduction is [`max`](Self::max).)
        maximum => Max;
        /// Elementwise minimum (NaN-propagating), like `numpy.minimum`.
        /// (The reduction is [`min`](Self::min).)
        minimum => Min;
        /// `a ^ b` (floats).
        pow => Pow;
        /// Bitwise / logical and.
        and => And;
        /// Bitwise / logical or.
        or => Or;
        /// Bitwise / logical xor.
        xor => Xor;
        /// `a << b` (integers; shifts of 32 or more give 0).
        shift_left => ShiftLeft;
        /// Logical `a >> b` (integers; shifts of 32 or more give 0).
        shift_right_logical => ShiftRightLogical;
    }

    /// Applies an elementwise comparison, broadcasting NumPy-style.
    #[track_caller]
    pub fn compare(&self, op: CompareOp, a: Value, b: Value) -> Value {
        self.scope(op.name(), || match self.broadcast_pair(op.name(), a, b) {
            Some((a, b)) => self.emit1(Op::Compare(op), &[a, b]),
            None => self.poison(),
        })
    }

    compare_methods! {
        /// `a == b`.
        eq => Eq;
        /// `a != b`.
        ne => Ne;
        /// `a < b`.
        lt => Lt;
        /// `a <= b`.
        le => Le;
        /// `a > b`.
        gt => Gt;
        /// `a >= b`.
        ge => Ge;
    }

    /// `a op c` for a constant `c` of `a`'s dtype.
    #[track_caller]
    pub fn binary_scalar(&self, op: BinaryOp, x: Value, c: f64) -> Value {
        self.scope(op.name(), || {
            let k = self.full_like(x, c);
            self.binary(op, x, k)
        })
    }

    /// `x op c` for a constant `c` of `x`'s dtype; the result is `bool`.
    #[track_caller]
    pub fn compare_scalar(&self, op: CompareOp, x: Value, c: f64) -> Value {
        self.scope(op.name(), || {
            let k = self.full_like(x, c);
            self.compare(op, x, k)
        })
    }

    scalar_methods! {
        /// `x + c`.
        add_scalar => Add;
        /// `x - c`.
        sub_scalar => Sub;
        /// `x * c`.
        mul_scalar => Mul;
        /// `x / c`.
        div_scalar => Div;
        /// `x ^ c`.
        pow_scalar => Pow;
        /// `max(x, c)`.
        maximum_scalar => Max;
        /// `min(x, c)`.
        minimum_scalar => Min;
    }

    /// `c - x` for a constant `c` of `x`'s dtype.
    #[track_caller]
    pub fn rsub_scalar(&self, c: f64, x: Value) -> Value {
        self.scope("sub", || {
            let k = self.full_like(x, c);
            self.sub(k, x)
        })
    }

    /// Clamps `x` to `[lo, hi]` (like `numpy.clip`).
    #[track_caller]
    pub fn clip(&self, x: Value, lo: f64, hi: f64) -> Value {
        self.scope("clip", || self.minimum_scalar(self.maximum_scalar(x, lo), hi))
    }

    /// `x * x`.
    #[track_caller]
    pub fn square(&self, x: Value) -> Value {
        self.binary(BinaryOp::Mul, x, x)
    }

    /// `pred ? on_true : on_false` elementwise. All three broadcast
    /// NumPy-style (a scalar `pred` is kept scalar, which the op allows).
    #[track_caller]
    pub fn select(&self, pred: Value, on_true: Value, on_false: Value) -> Value {
        self.scope("select", || {
            let Some(tys) = self.inputs("select", &[pred, on_true, on_false]) else { return self.poison() };
            let (p, t, f) = (&tys[0], &tys[1], &tys[2]);
            if p.dtype != DType::Bool {
                self.fail("select", format!("the predicate must be bool, got {p}"));
                return self.poison();
            }
            let shape = match broadcast_shapes(&t.shape, &f.shape).and_then(|s| broadcast_shapes(&s, &p.shape)) {
                Ok(s) => s,
                Err(_) => {
                    self.fail("select", format!("predicate {p} and branches {t}, {f} cannot be broadcast together"));
                    return self.poison();
                }
            };
            let pred = if p.rank() == 0 { pred } else { self.broadcast_to(pred, &shape) };
            let (on_true, on_false) = (self.broadcast_to(on_true, &shape), self.broadcast_to(on_false, &shape));
            self.emit1(Op::Select, &[pred, on_true, on_false])
        })
    }

    /// Where `mask` is true, `value` (a constant of `x`'s dtype); elsewhere
    /// `x`. `mask` broadcasts to `x`'s shape, e.g. a `[T, T]`
    /// [`causal_mask`](Self::causal_mask) over `[B, H, T, T]` scores.
    #[track_caller]
    pub fn masked_fill(&self, x: Value, mask: Value, value: f64) -> Value {
        self.scope("masked_fill", || {
            let k = self.full_like(x, value);
            self.select(mask, k, x)
        })
    }

    /// Converts to another dtype (floats round to nearest-even; float to
    /// integer truncates toward zero and saturates; bool gives 0/1).
    #[track_caller]
    pub fn convert(&self, x: Value, dtype: DType) -> Value {
        self.emit1(Op::Convert { to: dtype }, &[x])
    }

    /// Broadcasts two operands of one dtype to their common shape.
    #[track_caller]
    pub(crate) fn broadcast_pair(&self, op: &str, a: Value, b: Value) -> Option<(Value, Value)> {
        let ta = self.input(op, a)?;
        let tb = self.input(op, b)?;
        if ta.dtype != tb.dtype {
            self.fail(op, format!("operands {ta} and {tb} have different dtypes (convert one explicitly)"));
            return None;
        }
        if ta.shape == tb.shape {
            return Some((a, b));
        }
        match broadcast_shapes(&ta.shape, &tb.shape) {
            Ok(s) => Some((self.broadcast_to(a, &s), self.broadcast_to(b, &s))),
            Err(_) => {
                self.fail(op, format!("operands {ta} and {tb} cannot be broadcast together"));
                None
            }
        }
    }
}

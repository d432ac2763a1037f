//! Elementwise kernels: unary, binary, compare and select.
//!
//! One kernel per category and storage class, with the operation chosen at
//! compile time (`#[comptime]`), so CubeCL specialises each (op, type)
//! pair into its own shader while the source stays one `match`. Every
//! kernel is one thread per element; `ABSOLUTE_POS` is linear over a 2-D
//! grid of cubes, so any size fits under the 65535-cubes-per-dimension
//! limit (see `launch_1d`).
//!
//! Semantics follow the interpreter's numerics contract; where the GPU
//! builtin differs (NaN-propagating max/min, `fmod`, `pow` of negative
//! bases, integer division by zero, shifts of 32 or more, `log1p` near 0)
//! the kernels spell the contract out.

use super::math;
use super::math::{is_inf, is_nan};
use super::round::apply_rounding;
use super::storage::Rounding;
use cubecl::prelude::*;

/// Float unary operations (`Id` only rounds; used for conversions).
#[allow(missing_docs)]
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum UnaryF {
    Id,
    Neg,
    Abs,
    Exp,
    Log,
    Log1p,
    Tanh,
    Cos,
    Sin,
    Logistic,
    Sqrt,
    Rsqrt,
    Sign,
    Floor,
}

/// Integer (and bool) unary operations.
#[allow(missing_docs)]
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum UnaryI {
    Neg,
    Abs,
    Sign,
    Not,
    /// Logical not of a 0/1 bool.
    BoolNot,
}

/// Float binary operations.
#[allow(missing_docs)]
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum BinaryF {
    Add,
    Sub,
    Mul,
    Div,
    Rem,
    Max,
    Min,
    Pow,
}

/// Integer (and bool) binary operations.
#[allow(missing_docs)]
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum BinaryI {
    Add,
    Sub,
    Mul,
    Div,
    Rem,
    Max,
    Min,
    And,
    Or,
    Xor,
    Shl,
    Shr,
}

/// Comparisons (IEEE for floats).
#[allow(missing_docs)]
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Cmp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

#[cube]
pub(super) fn float_unary_op<F: Float>(v: F, #[comptime] op: UnaryF) -> F {
    match op {
        UnaryF::Id => v,
        UnaryF::Neg => -v,
        UnaryF::Abs => F::abs(v),
        UnaryF::Exp => F::exp(v),
        UnaryF::Log => F::ln(v),
        UnaryF::Log1p => math::log1p::<F>(v),
        UnaryF::Tanh => math::tanh::<F>(v),
        UnaryF::Cos => F::cos(v),
        UnaryF::Sin => F::sin(v),
        UnaryF::Logistic => math::logistic::<F>(v),
        UnaryF::Sqrt => F::sqrt(v),
        UnaryF::Rsqrt => F::new(1.0) / F::sqrt(v),
        UnaryF::Sign => math::sign::<F>(v),
        UnaryF::Floor => F::floor(v),
    }
}

/// `out = round(op(x))`.
#[cube(launch)]
pub fn float_unary<F: Float>(x: &Array<F>, out: &mut Array<F>, #[comptime] op: UnaryF, #[comptime] rnd: Rounding) {
    let i = ABSOLUTE_POS;
    if i < out.len() {
        out[i] = apply_rounding::<F>(float_unary_op::<F>(x[i], op), rnd);
    }
}

/// `out = is_finite(x)` as 0/1.
#[cube(launch)]
pub fn is_finite<F: Float>(x: &Array<F>, out: &mut Array<u32>) {
    let i = ABSOLUTE_POS;
    if i < out.len() {
        let v = x[i];
        out[i] = select(is_nan::<F>(v) || is_inf::<F>(v), 0u32, 1u32);
    }
}

#[cube]
fn int_unary_op<I: Int>(v: I, #[comptime] op: UnaryI) -> I {
    match op {
        UnaryI::Neg => I::new(0) - v,
        UnaryI::Abs => select(v < I::new(0), I::new(0) - v, v),
        UnaryI::Sign => select(v > I::new(0), I::new(1), select(v < I::new(0), I::new(-1), I::new(0))),
        UnaryI::Not => !v,
        UnaryI::BoolNot => I::new(1) - v,
    }
}

/// `out = op(x)` on integers (wrapping).
#[cube(launch)]
pub fn int_unary<I: Int>(x: &Array<I>, out: &mut Array<I>, #[comptime] op: UnaryI) {
    let i = ABSOLUTE_POS;
    if i < out.len() {
        out[i] = int_unary_op::<I>(x[i], op);
    }
}

#[cube]
pub(super) fn float_binary_op<F: Float>(a: F, b: F, #[comptime] op: BinaryF) -> F {
    match op {
        BinaryF::Add => a + b,
        BinaryF::Sub => a - b,
        BinaryF::Mul => a * b,
        BinaryF::Div => a / b,
        BinaryF::Rem => math::fmod::<F>(a, b),
        BinaryF::Max => math::max_nan::<F>(a, b),
        BinaryF::Min => math::min_nan::<F>(a, b),
        BinaryF::Pow => math::pow::<F>(a, b),
    }
}

/// `out = round(a op b)`.
#[cube(launch)]
pub fn float_binary<F: Float>(
    a: &Array<F>,
    b: &Array<F>,
    out: &mut Array<F>,
    #[comptime] op: BinaryF,
    #[comptime] rnd: Rounding,
) {
    let i = ABSOLUTE_POS;
    if i < out.len() {
        out[i] = apply_rounding::<F>(float_binary_op::<F>(a[i], b[i], op), rnd);
    }
}

#[cube]
fn int_binary_op<I: Int>(a: I, b: I, #[comptime] op: BinaryI, #[comptime] signed: bool) -> I {
    let zero = I::new(0);
    match op {
        BinaryI::Add => a + b,
        BinaryI::Sub => a - b,
        BinaryI::Mul => a * b,
        BinaryI::Div => {
            // x / 0 = 0; MIN / -1 wraps to MIN (its negation).
            let minus_one = signed && b == I::new(-1);
            let safe = select(b == zero || minus_one, I::new(1), b);
            select(b == zero, zero, select(minus_one, zero - a, a / safe))
        }
        BinaryI::Rem => {
            // x rem 0 = x; x rem -1 = 0.
            let minus_one = signed && b == I::new(-1);
            let safe = select(b == zero || minus_one, I::new(1), b);
            select(b == zero, a, select(minus_one, zero, a % safe))
        }
        BinaryI::Max => select(a > b, a, b),
        BinaryI::Min => select(a < b, a, b),
        BinaryI::And => a & b,
        BinaryI::Or => a | b,
        BinaryI::Xor => a ^ b,
        BinaryI::Shl => math::shift_left::<I>(a, b),
        BinaryI::Shr => math::shift_right_logical::<I>(a, b),
    }
}

/// `out = a op b` on integers (wrapping; see the numerics contract).
#[cube(launch)]
pub fn int_binary<I: Int>(
    a: &Array<I>,
    b: &Array<I>,
    out: &mut Array<I>,
    #[comptime] op: BinaryI,
    #[comptime] signed: bool,
) {
    let i = ABSOLUTE_POS;
    if i < out.len() {
        out[i] = int_binary_op::<I>(a[i], b[i], op, signed);
    }
}

#[cube]
pub(super) fn compare_op<N: Numeric>(a: N, b: N, #[comptime] op: Cmp) -> bool {
    match op {
        Cmp::Eq => a == b,
        // Not `a != b`: naga compiles it to an ordered comparison, false
        // for NaN.
        Cmp::Ne => !(a == b),
        Cmp::Lt => a < b,
        Cmp::Le => a <= b,
        Cmp::Gt => a > b,
        Cmp::Ge => a >= b,
    }
}

/// `out = a cmp b` as 0/1.
#[cube(launch)]
pub fn compare<N: Numeric>(a: &Array<N>, b: &Array<N>, out: &mut Array<u32>, #[comptime] op: Cmp) {
    let i = ABSOLUTE_POS;
    if i < out.len() {
        out[i] = select(compare_op::<N>(a[i], b[i], op), 1u32, 0u32);
    }
}

/// `out = pred ? t : f`; a scalar predicate (`pred_scalar`) applies to all.
#[cube(launch)]
pub fn select_kernel<N: Numeric>(
    pred: &Array<u32>,
    t: &Array<N>,
    f: &Array<N>,
    out: &mut Array<N>,
    #[comptime] pred_scalar: bool,
) {
    let i = ABSOLUTE_POS;
    if i < out.len() {
        let p = if pred_scalar { pred[0] } else { pred[i] };
        out[i] = select(p != 0u32, t[i], f[i]);
    }
}

//! The interpreter's element-level semantics for `f32`, one function per
//! op, for backends that loop over elements themselves (the fast CPU
//! backend's fused loops). They are the very expressions the interpreter's
//! kernels apply, so a backend using them computes bit for bit what the
//! interpreter does.

use super::elementwise::Real;
use crate::{BinaryOp, CompareOp, UnaryOp};

/// `op(x)` for a float unary op (`None` for `not` and `is_finite`, which
/// do not map `f32` to `f32`).
#[inline(always)]
pub fn unary_f32(op: UnaryOp, x: f32) -> Option<f32> {
    Some(match op {
        UnaryOp::Neg => -x,
        UnaryOp::Abs => x.abs(),
        UnaryOp::Sign => x.sign(),
        UnaryOp::Exp => x.exp(),
        UnaryOp::Log => x.ln(),
        UnaryOp::Log1p => x.ln_1p(),
        UnaryOp::Tanh => x.tanh_pinned(),
        UnaryOp::Cos => x.cos(),
        UnaryOp::Sin => x.sin(),
        UnaryOp::Logistic => x.logistic(),
        UnaryOp::Sqrt => x.sqrt(),
        UnaryOp::Rsqrt => x.sqrt().recip(),
        UnaryOp::Floor => x.floor(),
        UnaryOp::Not | UnaryOp::IsFinite => return None,
    })
}

/// `op(x, y)` for a float binary op (`None` for the bitwise ops).
#[inline(always)]
pub fn binary_f32(op: BinaryOp, x: f32, y: f32) -> Option<f32> {
    Some(match op {
        BinaryOp::Add => x + y,
        BinaryOp::Sub => x - y,
        BinaryOp::Mul => x * y,
        BinaryOp::Div => x / y,
        BinaryOp::Rem => x % y,
        BinaryOp::Max => x.max_nan(y),
        BinaryOp::Min => x.min_nan(y),
        BinaryOp::Pow => x.powf(y),
        BinaryOp::And | BinaryOp::Or | BinaryOp::Xor | BinaryOp::ShiftLeft | BinaryOp::ShiftRightLogical => {
            return None
        }
    })
}

/// `x op y` (IEEE: every comparison with NaN is false but `ne`).
#[inline(always)]
pub fn compare_f32(op: CompareOp, x: f32, y: f32) -> bool {
    match op {
        CompareOp::Eq => x == y,
        CompareOp::Ne => x != y,
        CompareOp::Lt => x < y,
        CompareOp::Le => x <= y,
        CompareOp::Gt => x > y,
        CompareOp::Ge => x >= y,
    }
}

//! The reference interpreter: executes a module on host tensors.
//!
//! This is the numeric oracle of weft. Sharded runs, GPU kernels and
//! finite-difference gradient checks are all compared against it, so its
//! semantics are pinned down exactly here rather than left to whatever the
//! host libraries happen to do. It favours clarity and determinism over
//! speed, but avoids per-element index arithmetic (kernels use `ndarray`
//! views, `Zip` and `mapv`) and frees each value after its last use, so the
//! small training steps of the test suite run quickly.
//!
//! Entry points: [`run`] and [`run_named`] verify the module and run one
//! function; [`Interpreter`] verifies once (or trusts a module already
//! verified, [`Interpreter::from_verified`]) and then runs any number of
//! times, which is what hot test loops should use.
//!
//! # Numerics contract
//!
//! - **Floats**: `f32` ops compute in `f32`, `f64` ops in `f64`. `bf16` and
//!   `f16` are storage types: operands are widened exactly to `f32`, the op
//!   computes in `f32`, and each result element is rounded to nearest-even
//!   (so a `bf16` add is `round_bf16(f32(a) + f32(b))`). `f32` `tanh` is
//!   weft's own ([`tanh`]: evaluated in `f64` and rounded once, the same
//!   on every machine); the other transcendentals use Rust's `std`
//!   implementations. `logistic` is evaluated as `1/(1+e^-x)`
//!   for `x >= 0` and `e^x/(1+e^x)` otherwise (no overflow). `rsqrt(x)` is
//!   `1/sqrt(x)`. `rem` is C's `fmod` (sign of the dividend).
//! - **max/min** propagate NaN; `max(-0, +0) = +0`, `min(-0, +0) = -0`.
//! - **sign**: -1 / +1 for negative / positive, and the input itself for
//!   ±0 and NaN (`sign(-0.0) = -0.0`, `sign(NaN) = NaN`); integer `sign` is
//!   -1 / 0 / 1.
//! - **Integers** wrap on `add`, `sub`, `mul`, `neg`, `abs`
//!   (`abs(i32::MIN) = i32::MIN`). `div` truncates toward zero;
//!   division by zero gives 0; `rem` by zero gives the dividend;
//!   `i32::MIN / -1` wraps to `i32::MIN` (and `i32::MIN rem -1 = 0`).
//!   Shifts by 32 or more (or by a negative amount) give 0;
//!   `shift_right_logical` shifts in zeros for `i32` too.
//! - **Comparisons** follow IEEE: every comparison involving NaN is false
//!   except `ne`; `-0 == +0`; for bool, `false < true`.
//! - **convert** rounds once from the exact source value: to floats
//!   nearest-even; floats to integers truncate toward zero and saturate,
//!   NaN gives 0; integer to integer reinterprets the 32 bits (wraps); to
//!   bool is `!= 0` (NaN is true); bool to numbers is 0 or 1.
//! - **dot_general**: operands are rearranged to `[B,M,K] x [B,K,N]` and
//!   multiplied with ndarray's `general_mat_mul` (`matrixmultiply`), which
//!   accumulates in `f32` for `f32`/`bf16`/`f16` (half types round once at
//!   the end) and `f64` for `f64`; its summation order is fixed for given
//!   extents on a given machine (it may use FMA where the CPU has it).
//!   Integer dots accumulate with wrapping arithmetic in increasing
//!   contraction index. The result is ordered batch, lhs free, rhs free.
//! - **Reductions** fold left from the identity over the reduced elements
//!   in row-major order of the reduced dimensions; sums accumulate in the
//!   compute type above (`f32` for half types). Identities: 0 for sums,
//!   `-inf`/`+inf` for float max/min, `MIN`/`MAX` for integer max/min;
//!   empty reductions give the identity.
//! - **pad** with negative `low`/`high` crops; `interior` inserts padding
//!   between neighbours. `slice` supports strides. `iota` produces the
//!   index converted to the dtype (so large indices round in `bf16`).
//!   `select` takes a scalar or full-shape predicate.
//! - **gather**, **scatter_add**, **cumsum**, **top_k**: as
//!   [`crate::indexing`] says (out-of-range indices read 0 and are
//!   dropped; sums accumulate as `reduce_sum` does, in a fixed order).
//! - **call** runs the callee recursively; **sharding_constraint** and
//!   **reshard** are the identity on the global value.

mod dot;
mod elementwise;
mod exec;
mod index;
mod reduce;
pub mod scalar;
mod shape;
pub mod tanh;

pub use exec::Interpreter;

use crate::tensor::HostTensor;
use crate::{infer, IrError, Module, NoFunctions, Op, TensorType};
use std::collections::BTreeMap;

/// Verifies `m` and runs function `func` on positional `args`, returning its
/// results in order.
pub fn run(m: &Module, func: &str, args: &[HostTensor]) -> Result<Vec<HostTensor>, IrError> {
    Interpreter::new(m)?.run(func, args)
}

/// Verifies `m` and runs function `func` with inputs given by parameter
/// name (an unnamed parameter `i` is called `arg{i}`). Missing, unknown or
/// wrongly typed inputs are [`IrError::Input`] naming the parameter.
pub fn run_named(m: &Module, func: &str, inputs: &BTreeMap<String, HostTensor>) -> Result<Vec<HostTensor>, IrError> {
    Interpreter::new(m)?.run_named(func, inputs)
}

/// Evaluates one op on host tensors with exactly the interpreter's
/// semantics (the numerics contract above), outside any function: what a
/// device program's compute step does on the CPU. Operand types are checked
/// with [`infer()`](crate::infer()) first. `call` needs a module and is
/// rejected; `sharding_constraint` and `reshard` are the identity.
pub fn eval_op(op: &Op, inputs: &[&HostTensor]) -> Result<Vec<HostTensor>, IrError> {
    let fail = |m: String| IrError::Tensor(format!("`{}`: {m}", op.name()));
    if let Op::Call { callee, .. } = op {
        return Err(fail(format!("cannot call @{callee} outside a module")));
    }
    let tys: Vec<TensorType> = inputs.iter().map(|t| t.ty()).collect();
    let ty_refs: Vec<&TensorType> = tys.iter().collect();
    infer(op, &ty_refs, &NoFunctions).map_err(fail)?;
    let out = match op {
        Op::ShardingConstraint { .. } | Op::Reshard { .. } => Ok(inputs[0].clone()),
        Op::Reshape { shape } => shape::reshape(inputs[0].clone(), shape),
        _ => eval_simple(op, inputs),
    };
    out.map(|t| vec![t]).map_err(fail)
}

/// The single-result ops that need no module and do not take their operand
/// by value (everything but `call`, `reshape` and the identities).
fn eval_simple(op: &Op, xs: &[&HostTensor]) -> Result<HostTensor, String> {
    match op {
        Op::Constant(lit) => HostTensor::from_literal(lit).map_err(|e| e.to_string()),
        Op::Iota { dim, ty } => shape::iota(ty, *dim),
        Op::Unary(u) => elementwise::unary(*u, xs[0]),
        Op::Binary(b) => elementwise::binary(*b, xs[0], xs[1]),
        Op::Compare(c) => elementwise::compare(*c, xs[0], xs[1]),
        Op::Select => elementwise::select(xs[0], xs[1], xs[2]),
        Op::Convert { to } => Ok(xs[0].convert(*to)),
        Op::BroadcastInDim { dims, shape } => shape::broadcast_in_dim(xs[0], dims, shape),
        Op::Transpose { perm } => shape::transpose(xs[0], perm),
        Op::Slice { start, limit, stride } => shape::slice(xs[0], start, limit, stride),
        Op::Concatenate { dim } => shape::concatenate(xs, *dim),
        Op::Pad { low, high, interior } => shape::pad(xs[0], xs[1], low, high, interior),
        Op::DotGeneral(dims) => dot::dot_general(xs[0], xs[1], dims),
        Op::Reduce { op, dims } => reduce::reduce(*op, xs[0], dims),
        Op::Index(i) => index::eval(i, xs),
        Op::ShardingConstraint { .. } | Op::Reshard { .. } | Op::Reshape { .. } | Op::Call { .. } => {
            unreachable!("`{}` is handled by the caller", op.name())
        }
    }
}

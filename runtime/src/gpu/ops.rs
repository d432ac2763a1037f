//! Maps each IR op onto kernel launches.
//!
//! Types are checked with [`weft_ir::infer()`] first, so kernels only see
//! well-typed inputs; this file then picks the kernel and its storage-type
//! instantiation. Ops that do not change bits (reshape, the identity ops,
//! conversions between dtypes that share a storage type and values) return
//! views of their input.

use super::elementwise::{self as ew, BinaryF, BinaryI, Cmp, UnaryF, UnaryI};
use super::kernels_convert as cv;
use super::storage::{Rounding, Storage};
use super::{dot, index, layout, reduce, CubeBuffer, CubeclBackend};
use crate::backend::Backend;
use crate::error::RuntimeError;
use cubecl::prelude::*;
use weft_ir::tensor::HostTensor;
use weft_ir::{infer, BinaryOp, CompareOp, DType, LiteralData, NoFunctions, Op, TensorType, UnaryOp};

/// Runs `$body` with `$F` bound to the float storage type of `$d`.
macro_rules! with_float {
    ($d:expr, $F:ident => $body:expr) => {
        match $crate::gpu::Storage::of($d) {
            $crate::gpu::Storage::F64 => {
                type $F = f64;
                $body
            }
            _ => {
                type $F = f32;
                $body
            }
        }
    };
}
pub(super) use with_float;

/// Runs `$body` with `$N` bound to the storage type of `$d`.
macro_rules! with_storage {
    ($d:expr, $N:ident => $body:expr) => {
        match $crate::gpu::Storage::of($d) {
            $crate::gpu::Storage::F32 => {
                type $N = f32;
                $body
            }
            $crate::gpu::Storage::F64 => {
                type $N = f64;
                $body
            }
            $crate::gpu::Storage::I32 => {
                type $N = i32;
                $body
            }
            $crate::gpu::Storage::U32 => {
                type $N = u32;
                $body
            }
        }
    };
}
pub(super) use with_storage;

fn op_err(op: &Op, message: impl Into<String>) -> RuntimeError {
    RuntimeError::Op { op: op.name().to_string(), message: message.into() }
}

/// Computes `op` on `xs`, returning its single result.
pub(super) fn compute<R: Runtime>(
    be: &CubeclBackend<R>,
    op: &Op,
    xs: &[&CubeBuffer<R>],
) -> Result<CubeBuffer<R>, RuntimeError> {
    let tys: Vec<&TensorType> = xs.iter().map(|b| &b.ty).collect();
    let out_ty = infer(op, &tys, &NoFunctions).map_err(|m| op_err(op, m))?.remove(0);
    for t in tys.iter().copied().chain([&out_ty]) {
        be.check_dtype(t.dtype, op.name())?;
    }
    if is_transcendental(op) && out_ty.dtype == DType::F64 && !be.f64_math {
        return Err(be.unsupported(format!("`{}` on f64 (no 64-bit transcendentals on this device)", op.name())));
    }
    match op {
        Op::Reshape { .. } | Op::ShardingConstraint { .. } | Op::Reshard { .. } => return Ok(xs[0].view(out_ty)),
        Op::Call { callee, .. } => return Err(op_err(op, format!("cannot call @{callee} on a device"))),
        _ => {}
    }
    if out_ty.num_elements() == 0 {
        return Ok(be.empty(&out_ty));
    }
    match op {
        Op::Constant(_) | Op::Iota { .. } => be.kept.constants.get_or(be, op, &out_ty, |be| value(be, op, &out_ty)),
        Op::Unary(u) => Ok(unary(be, *u, xs[0], &out_ty)),
        Op::Binary(b) => Ok(binary(be, *b, xs[0], xs[1], &out_ty)),
        Op::Compare(c) => Ok(compare(be, *c, xs[0], xs[1], &out_ty)),
        Op::Select => Ok(select(be, xs[0], xs[1], xs[2], &out_ty)),
        Op::Convert { to } => Ok(convert(be, xs[0], *to)),
        Op::BroadcastInDim { dims, .. } => Ok(layout::broadcast_in_dim(be, xs[0], dims, &out_ty)),
        Op::Transpose { perm } => Ok(layout::transpose(be, xs[0], perm)),
        Op::Slice { start, stride, .. } => Ok(layout::slice(be, xs[0], start, stride, &out_ty)),
        Op::Concatenate { dim } => Ok(layout::concatenate(be, xs, *dim, &out_ty)),
        Op::Pad { low, interior, .. } => Ok(layout::pad(be, xs[0], xs[1], low, interior, &out_ty)),
        Op::DotGeneral(dims) => dot::dot_general(be, xs[0], xs[1], dims, &out_ty),
        Op::Reduce { op: r, dims } => Ok(reduce::reduce(be, *r, xs[0], dims, &out_ty)),
        Op::Index(i) => Ok(index::index(be, i, xs, &out_ty)),
        Op::Reshape { .. } | Op::ShardingConstraint { .. } | Op::Reshard { .. } | Op::Call { .. } => {
            unreachable!("handled above")
        }
    }
}

/// The value of a constant-making op (a `constant` or an `iota`).
fn value<R: Runtime>(be: &CubeclBackend<R>, op: &Op, ty: &TensorType) -> Result<CubeBuffer<R>, RuntimeError> {
    match op {
        Op::Constant(lit) => match &lit.data {
            LiteralData::Splat(v) => layout::fill_value(be, ty, *v),
            LiteralData::Dense(_) => be.upload(&HostTensor::from_literal(lit)?),
        },
        Op::Iota { dim, ty } => layout::iota(be, ty, *dim),
        _ => unreachable!("only constants and iotas have values of their own"),
    }
}

/// The float kernel op of a unary op on floats.
pub(super) fn unary_float_op(u: UnaryOp) -> UnaryF {
    match u {
        UnaryOp::Neg => UnaryF::Neg,
        UnaryOp::Abs => UnaryF::Abs,
        UnaryOp::Exp => UnaryF::Exp,
        UnaryOp::Log => UnaryF::Log,
        UnaryOp::Log1p => UnaryF::Log1p,
        UnaryOp::Tanh => UnaryF::Tanh,
        UnaryOp::Cos => UnaryF::Cos,
        UnaryOp::Sin => UnaryF::Sin,
        UnaryOp::Logistic => UnaryF::Logistic,
        UnaryOp::Sqrt => UnaryF::Sqrt,
        UnaryOp::Rsqrt => UnaryF::Rsqrt,
        UnaryOp::Sign => UnaryF::Sign,
        UnaryOp::Floor => UnaryF::Floor,
        UnaryOp::Not | UnaryOp::IsFinite => unreachable!("not a float-to-float op (checked by infer)"),
    }
}

/// Rounds a float buffer to the dtype of `ty` (a copy when no rounding is
/// needed).
pub(super) fn round_to<R: Runtime>(be: &CubeclBackend<R>, x: &CubeBuffer<R>, ty: &TensorType) -> CubeBuffer<R> {
    let out = be.empty(ty);
    let (count, dim) = be.grid(out.len());
    with_float!(ty.dtype, F => ew::float_unary::launch::<F, R>(
        &be.client, count, dim, x.arg(), out.arg(), UnaryF::Id, Rounding::of(ty.dtype)
    ));
    out
}

fn unary<R: Runtime>(be: &CubeclBackend<R>, u: UnaryOp, x: &CubeBuffer<R>, ty: &TensorType) -> CubeBuffer<R> {
    let out = be.empty(ty);
    let (count, dim) = be.grid(out.len());
    let c = &be.client;
    let d = x.ty.dtype;
    match d {
        DType::I32 | DType::U32 | DType::Bool => {
            let iop = match u {
                UnaryOp::Neg => UnaryI::Neg,
                UnaryOp::Abs => UnaryI::Abs,
                UnaryOp::Sign => UnaryI::Sign,
                UnaryOp::Not if d == DType::Bool => UnaryI::BoolNot,
                _ => UnaryI::Not,
            };
            if d == DType::I32 {
                ew::int_unary::launch::<i32, R>(c, count, dim, x.arg(), out.arg(), iop);
            } else {
                ew::int_unary::launch::<u32, R>(c, count, dim, x.arg(), out.arg(), iop);
            }
        }
        _ if u == UnaryOp::IsFinite => {
            with_float!(d, F => ew::is_finite::launch::<F, R>(c, count, dim, x.arg(), out.arg()))
        }
        _ => with_float!(d, F => ew::float_unary::launch::<F, R>(
            c, count, dim, x.arg(), out.arg(), unary_float_op(u), Rounding::of(d)
        )),
    }
    out
}

/// The float kernel op of a binary op on floats.
pub(super) fn binary_float_op(op: BinaryOp) -> BinaryF {
    match op {
        BinaryOp::Add => BinaryF::Add,
        BinaryOp::Sub => BinaryF::Sub,
        BinaryOp::Mul => BinaryF::Mul,
        BinaryOp::Div => BinaryF::Div,
        BinaryOp::Rem => BinaryF::Rem,
        BinaryOp::Max => BinaryF::Max,
        BinaryOp::Min => BinaryF::Min,
        BinaryOp::Pow => BinaryF::Pow,
        _ => unreachable!("integer op on floats (checked by infer)"),
    }
}

fn binary<R: Runtime>(
    be: &CubeclBackend<R>,
    op: BinaryOp,
    a: &CubeBuffer<R>,
    b: &CubeBuffer<R>,
    ty: &TensorType,
) -> CubeBuffer<R> {
    let out = be.empty(ty);
    let (count, dim) = be.grid(out.len());
    let c = &be.client;
    let d = ty.dtype;
    if d.is_float() {
        let fop = binary_float_op(op);
        with_float!(d, F => ew::float_binary::launch::<F, R>(
            c, count, dim, a.arg(), b.arg(), out.arg(), fop, Rounding::of(d)
        ));
    } else {
        let iop = match op {
            BinaryOp::Add => BinaryI::Add,
            BinaryOp::Sub => BinaryI::Sub,
            BinaryOp::Mul => BinaryI::Mul,
            BinaryOp::Div => BinaryI::Div,
            BinaryOp::Rem => BinaryI::Rem,
            BinaryOp::Max => BinaryI::Max,
            BinaryOp::Min => BinaryI::Min,
            BinaryOp::And => BinaryI::And,
            BinaryOp::Or => BinaryI::Or,
            BinaryOp::Xor => BinaryI::Xor,
            BinaryOp::ShiftLeft => BinaryI::Shl,
            BinaryOp::ShiftRightLogical => BinaryI::Shr,
            BinaryOp::Pow => unreachable!("pow on integers (checked by infer)"),
        };
        if d == DType::I32 {
            ew::int_binary::launch::<i32, R>(c, count, dim, a.arg(), b.arg(), out.arg(), iop, true);
        } else {
            ew::int_binary::launch::<u32, R>(c, count, dim, a.arg(), b.arg(), out.arg(), iop, false);
        }
    }
    out
}

fn compare<R: Runtime>(
    be: &CubeclBackend<R>,
    op: CompareOp,
    a: &CubeBuffer<R>,
    b: &CubeBuffer<R>,
    ty: &TensorType,
) -> CubeBuffer<R> {
    let out = be.empty(ty);
    let (count, dim) = be.grid(out.len());
    let cmp = compare_kind(op);
    with_storage!(a.ty.dtype, N => ew::compare::launch::<N, R>(&be.client, count, dim, a.arg(), b.arg(), out.arg(), cmp));
    out
}

/// The kernel comparison of a compare op.
pub(super) fn compare_kind(op: CompareOp) -> Cmp {
    match op {
        CompareOp::Eq => Cmp::Eq,
        CompareOp::Ne => Cmp::Ne,
        CompareOp::Lt => Cmp::Lt,
        CompareOp::Le => Cmp::Le,
        CompareOp::Gt => Cmp::Gt,
        CompareOp::Ge => Cmp::Ge,
    }
}

fn select<R: Runtime>(
    be: &CubeclBackend<R>,
    p: &CubeBuffer<R>,
    t: &CubeBuffer<R>,
    f: &CubeBuffer<R>,
    ty: &TensorType,
) -> CubeBuffer<R> {
    let out = be.empty(ty);
    let (count, dim) = be.grid(out.len());
    let scalar = p.ty.shape.is_empty() && !ty.shape.is_empty();
    with_storage!(ty.dtype, N => ew::select_kernel::launch::<N, R>(
        &be.client, count, dim, p.arg(), t.arg(), f.arg(), out.arg(), scalar
    ));
    out
}

/// `convert` (see `kernels_convert.rs` for the rounding rules).
pub(super) fn convert<R: Runtime>(be: &CubeclBackend<R>, x: &CubeBuffer<R>, to: DType) -> CubeBuffer<R> {
    let from = x.ty.dtype;
    let ty = TensorType::new(to, x.ty.shape.clone());
    // Same bits: identical storage and every source value is a target value.
    let same_bits = from == to
        || matches!((from, to), (DType::I32, DType::U32) | (DType::U32, DType::I32))
        || matches!((from, to), (DType::Bool, DType::U32) | (DType::Bool, DType::I32))
        || (matches!(from, DType::BF16 | DType::F16) && to == DType::F32);
    if same_bits {
        return x.view(ty);
    }
    let out = be.empty(&ty);
    let (count, dim) = be.grid(out.len());
    let c = &be.client;
    let rnd = Rounding::of(to);
    let signed = from == DType::I32;
    match (Storage::of(from), to) {
        (_, DType::Bool) => with_storage!(from, N => cv::nonzero::launch::<N, R>(c, count, dim, x.arg(), out.arg())),
        (Storage::F32 | Storage::F64, DType::I32) => {
            with_float!(from, F => cv::float_to_int::launch::<F, i32, R>(c, count, dim, x.arg(), out.arg(), true))
        }
        (Storage::F32 | Storage::F64, DType::U32) => {
            with_float!(from, F => cv::float_to_int::launch::<F, u32, R>(c, count, dim, x.arg(), out.arg(), false))
        }
        (Storage::I32, DType::BF16 | DType::F16) => {
            cv::int_to_half::launch::<i32, R>(c, count, dim, x.arg(), out.arg(), signed, rnd)
        }
        (Storage::U32, DType::BF16 | DType::F16) => {
            cv::int_to_half::launch::<u32, R>(c, count, dim, x.arg(), out.arg(), false, rnd)
        }
        (Storage::F64, DType::BF16 | DType::F16) => {
            cv::f64_to_half::launch::<R>(c, count, dim, x.arg(), out.arg(), rnd)
        }
        (_, DType::F32 | DType::BF16 | DType::F16) => {
            with_storage!(from, N => cv::to_float::launch::<N, f32, R>(c, count, dim, x.arg(), out.arg(), rnd))
        }
        (_, DType::F64) => {
            with_storage!(from, N => cv::to_float::launch::<N, f64, R>(c, count, dim, x.arg(), out.arg(), rnd))
        }
        (Storage::I32 | Storage::U32, DType::I32 | DType::U32) => unreachable!("same bits, handled above"),
    }
    out
}

/// Whether `op` needs transcendental math (`exp`, `log`, `tanh`, `pow`, …),
/// which Vulkan has no 64-bit instructions for: on f64 such ops are
/// refused by devices without `f64_math`.
pub fn is_transcendental(op: &Op) -> bool {
    matches!(
        op,
        Op::Unary(
            UnaryOp::Exp
                | UnaryOp::Log
                | UnaryOp::Log1p
                | UnaryOp::Tanh
                | UnaryOp::Cos
                | UnaryOp::Sin
                | UnaryOp::Logistic
        ) | Op::Binary(BinaryOp::Pow)
    )
}

//! The closed set of operations.
//!
//! One enum, [`Op`], with typed attributes. Ops whose result type is not a
//! function of their operands carry it in their attributes (`constant`,
//! `iota`, `convert`, `broadcast_in_dim`, `reshape`), so type inference
//! ([`crate::infer()`]) is a pure function of the op and its operand types.
//! Semantics follow StableHLO; `specs/ir.md` has the table.

use crate::{DType, IndexOp, Literal, Shape, TensorSharding, TensorType};

/// Elementwise unary operations.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum UnaryOp {
    /// `-x` (numbers).
    Neg,
    /// `|x|` (numbers).
    Abs,
    /// `e^x` (floats).
    Exp,
    /// Natural logarithm (floats).
    Log,
    /// `ln(1 + x)` (floats).
    Log1p,
    /// Hyperbolic tangent (floats).
    Tanh,
    /// Cosine (floats).
    Cos,
    /// Sine (floats).
    Sin,
    /// `1 / (1 + e^-x)` (floats).
    Logistic,
    /// Square root (floats).
    Sqrt,
    /// `1 / sqrt(x)` (floats).
    Rsqrt,
    /// -1, 0 or 1 (NaN stays NaN) (numbers).
    Sign,
    /// Round toward -inf (floats).
    Floor,
    /// Bitwise / logical not (integers, bool).
    Not,
    /// True where the value is neither infinite nor NaN (floats -> bool).
    IsFinite,
}

impl UnaryOp {
    /// Every unary op.
    pub const ALL: [UnaryOp; 15] = [
        UnaryOp::Neg,
        UnaryOp::Abs,
        UnaryOp::Exp,
        UnaryOp::Log,
        UnaryOp::Log1p,
        UnaryOp::Tanh,
        UnaryOp::Cos,
        UnaryOp::Sin,
        UnaryOp::Logistic,
        UnaryOp::Sqrt,
        UnaryOp::Rsqrt,
        UnaryOp::Sign,
        UnaryOp::Floor,
        UnaryOp::Not,
        UnaryOp::IsFinite,
    ];

    /// Mnemonic in the text format.
    pub fn name(self) -> &'static str {
        match self {
            UnaryOp::Neg => "neg",
            UnaryOp::Abs => "abs",
            UnaryOp::Exp => "exp",
            UnaryOp::Log => "log",
            UnaryOp::Log1p => "log1p",
            UnaryOp::Tanh => "tanh",
            UnaryOp::Cos => "cos",
            UnaryOp::Sin => "sin",
            UnaryOp::Logistic => "logistic",
            UnaryOp::Sqrt => "sqrt",
            UnaryOp::Rsqrt => "rsqrt",
            UnaryOp::Sign => "sign",
            UnaryOp::Floor => "floor",
            UnaryOp::Not => "not",
            UnaryOp::IsFinite => "is_finite",
        }
    }

    /// Whether the op accepts operands of this dtype.
    pub fn accepts(self, d: DType) -> bool {
        match self {
            UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Sign => d.is_float() || d == DType::I32,
            UnaryOp::Not => d.is_integer() || d.is_bool(),
            _ => d.is_float(),
        }
    }

    /// The result dtype for an operand of dtype `d`.
    pub fn result_dtype(self, d: DType) -> DType {
        match self {
            UnaryOp::IsFinite => DType::Bool,
            _ => d,
        }
    }
}

/// Elementwise binary operations on two operands of identical type.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    /// Addition (wrapping for integers).
    Add,
    /// Subtraction (wrapping for integers).
    Sub,
    /// Multiplication (wrapping for integers).
    Mul,
    /// Division (integers: truncating toward zero; division by zero gives 0).
    Div,
    /// Remainder with the sign of the dividend (integers: remainder by zero
    /// gives the dividend).
    Rem,
    /// Maximum (NaN-propagating for floats).
    Max,
    /// Minimum (NaN-propagating for floats).
    Min,
    /// `x^y` (floats).
    Pow,
    /// Bitwise / logical and (integers, bool).
    And,
    /// Bitwise / logical or (integers, bool).
    Or,
    /// Bitwise / logical xor (integers, bool).
    Xor,
    /// Left shift; shifts of 32 or more give 0 (integers).
    ShiftLeft,
    /// Logical right shift; shifts of 32 or more give 0 (integers).
    ShiftRightLogical,
}

impl BinaryOp {
    /// Every binary op.
    pub const ALL: [BinaryOp; 13] = [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Rem,
        BinaryOp::Max,
        BinaryOp::Min,
        BinaryOp::Pow,
        BinaryOp::And,
        BinaryOp::Or,
        BinaryOp::Xor,
        BinaryOp::ShiftLeft,
        BinaryOp::ShiftRightLogical,
    ];

    /// Mnemonic in the text format.
    pub fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
            BinaryOp::Div => "div",
            BinaryOp::Rem => "rem",
            BinaryOp::Max => "max",
            BinaryOp::Min => "min",
            BinaryOp::Pow => "pow",
            BinaryOp::And => "and",
            BinaryOp::Or => "or",
            BinaryOp::Xor => "xor",
            BinaryOp::ShiftLeft => "shift_left",
            BinaryOp::ShiftRightLogical => "shift_right_logical",
        }
    }

    /// Whether the op accepts operands of this dtype.
    pub fn accepts(self, d: DType) -> bool {
        match self {
            BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul | BinaryOp::Div | BinaryOp::Rem => {
                d.is_float() || d.is_integer()
            }
            BinaryOp::Max | BinaryOp::Min => !d.is_bool(),
            BinaryOp::Pow => d.is_float(),
            BinaryOp::And | BinaryOp::Or | BinaryOp::Xor => d.is_integer() || d.is_bool(),
            BinaryOp::ShiftLeft | BinaryOp::ShiftRightLogical => d.is_integer(),
        }
    }
}

/// Elementwise comparisons; the result is `bool`.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum CompareOp {
    /// `==`
    Eq,
    /// `!=`
    Ne,
    /// `<`
    Lt,
    /// `<=`
    Le,
    /// `>`
    Gt,
    /// `>=`
    Ge,
}

impl CompareOp {
    /// Every comparison.
    pub const ALL: [CompareOp; 6] =
        [CompareOp::Eq, CompareOp::Ne, CompareOp::Lt, CompareOp::Le, CompareOp::Gt, CompareOp::Ge];

    /// Mnemonic in the text format.
    pub fn name(self) -> &'static str {
        match self {
            CompareOp::Eq => "eq",
            CompareOp::Ne => "ne",
            CompareOp::Lt => "lt",
            CompareOp::Le => "le",
            CompareOp::Gt => "gt",
            CompareOp::Ge => "ge",
        }
    }
}

/// Reductions over a set of dimensions.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Sum (identity 0).
    Sum,
    /// Maximum (identity -inf, or the dtype's minimum).
    Max,
    /// Minimum (identity +inf, or the dtype's maximum).
    Min,
}

impl ReduceOp {
    /// Every reduction.
    pub const ALL: [ReduceOp; 3] = [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min];

    /// Mnemonic in the text format (`reduce_sum`, ...).
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "reduce_sum",
            ReduceOp::Max => "reduce_max",
            ReduceOp::Min => "reduce_min",
        }
    }
}

/// Dimension numbers of `dot_general`, as in StableHLO. The result's
/// dimensions are: batch dims, then lhs free dims in order, then rhs free dims.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct DotDims {
    /// Batch dimensions of the lhs.
    pub lhs_batch: Vec<usize>,
    /// Batch dimensions of the rhs (paired with `lhs_batch`).
    pub rhs_batch: Vec<usize>,
    /// Contracting dimensions of the lhs.
    pub lhs_contract: Vec<usize>,
    /// Contracting dimensions of the rhs (paired with `lhs_contract`).
    pub rhs_contract: Vec<usize>,
}

impl DotDims {
    /// A plain matrix product `[m,k] x [k,n]`.
    pub fn matmul() -> DotDims {
        DotDims { lhs_batch: vec![], rhs_batch: vec![], lhs_contract: vec![1], rhs_contract: vec![0] }
    }
}

/// How a `dot_general` maps onto a batched matrix product
/// `[B, M, K] x [B, K, N] -> [B, M, N]`: the permutation that brings each
/// operand into that order, the four extents, and the result shape in
/// StableHLO order (batch, lhs free, rhs free). Shared by every backend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MatmulLayout {
    /// lhs dimensions in the order batch, free, contracting.
    pub lhs_perm: Vec<usize>,
    /// rhs dimensions in the order batch, contracting, free.
    pub rhs_perm: Vec<usize>,
    /// Product of the batch extents.
    pub b: usize,
    /// Product of the lhs free extents.
    pub m: usize,
    /// Product of the contracting extents.
    pub k: usize,
    /// Product of the rhs free extents.
    pub n: usize,
    /// The result shape.
    pub out_shape: Vec<usize>,
}

impl DotDims {
    /// The batched-matmul layout of this contraction for operands of shapes
    /// `lhs` and `rhs` (which must satisfy [`crate::infer()`]'s rule).
    pub fn matmul_layout(&self, lhs: &[usize], rhs: &[usize]) -> MatmulLayout {
        let free = |rank: usize, batch: &[usize], contract: &[usize]| -> Vec<usize> {
            (0..rank).filter(|d| !batch.contains(d) && !contract.contains(d)).collect()
        };
        let lf = free(lhs.len(), &self.lhs_batch, &self.lhs_contract);
        let rf = free(rhs.len(), &self.rhs_batch, &self.rhs_contract);
        let prod = |shape: &[usize], ds: &[usize]| ds.iter().map(|&d| shape[d]).product::<usize>();
        let out_shape: Vec<usize> =
            self.lhs_batch.iter().chain(&lf).map(|&d| lhs[d]).chain(rf.iter().map(|&d| rhs[d])).collect();
        MatmulLayout {
            lhs_perm: [&self.lhs_batch[..], &lf, &self.lhs_contract].concat(),
            rhs_perm: [&self.rhs_batch[..], &self.rhs_contract, &rf].concat(),
            b: prod(lhs, &self.lhs_batch),
            m: prod(lhs, &lf),
            k: prod(lhs, &self.lhs_contract),
            n: prod(rhs, &rf),
            out_shape,
        }
    }
}

/// An operation. Operands are passed separately (see [`crate::Inst`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// A constant tensor. No operands.
    Constant(Literal),
    /// `result[i0, .., in] = i_dim`. No operands.
    Iota {
        /// The dimension whose index is produced.
        dim: usize,
        /// The result type.
        ty: TensorType,
    },
    /// Elementwise unary op. One operand.
    Unary(UnaryOp),
    /// Elementwise binary op. Two operands of identical type.
    Binary(BinaryOp),
    /// Elementwise comparison. Two operands of identical type; bool result.
    Compare(CompareOp),
    /// `select(pred, on_true, on_false)`: pred is bool with the same shape
    /// (or a bool scalar); the branches have identical types.
    Select,
    /// Converts to another dtype (floats round to nearest-even; float to
    /// integer truncates toward zero and saturates, NaN becomes 0).
    Convert {
        /// The target dtype.
        to: DType,
    },
    /// StableHLO `broadcast_in_dim`: operand dimension `i` maps to result
    /// dimension `dims[i]`; its extent must be 1 or equal the result's.
    BroadcastInDim {
        /// Result dimension of each operand dimension (strictly increasing).
        dims: Vec<usize>,
        /// The result shape.
        shape: Shape,
    },
    /// Row-major reshape to a shape with the same number of elements.
    Reshape {
        /// The result shape.
        shape: Shape,
    },
    /// `result.shape[i] = operand.shape[perm[i]]`.
    Transpose {
        /// A permutation of the operand's dimensions.
        perm: Vec<usize>,
    },
    /// Strided slice `[start, limit)` with `stride` per dimension.
    Slice {
        /// First index per dimension.
        start: Vec<usize>,
        /// One past the last index per dimension.
        limit: Vec<usize>,
        /// Step per dimension (at least 1).
        stride: Vec<usize>,
    },
    /// Concatenation of one or more operands along `dim`.
    Concatenate {
        /// The dimension that grows.
        dim: usize,
    },
    /// Pads the first operand with the scalar second operand: `low` and
    /// `high` elements at each end (negative values crop), `interior`
    /// elements between neighbours.
    Pad {
        /// Padding before the first element, per dimension.
        low: Vec<i64>,
        /// Padding after the last element, per dimension.
        high: Vec<i64>,
        /// Padding between elements, per dimension.
        interior: Vec<usize>,
    },
    /// General tensor contraction.
    DotGeneral(DotDims),
    /// Reduction over `dims` (which are removed from the shape).
    Reduce {
        /// Which reduction.
        op: ReduceOp,
        /// The reduced dimensions (strictly increasing).
        dims: Vec<usize>,
    },
    /// An indexing op (`gather`, `scatter_add`, `cumsum`, `top_k`); their
    /// facts live in [`crate::indexing`].
    Index(IndexOp),
    /// Calls another function of the module; one result per callee result.
    Call {
        /// Name of the callee.
        callee: String,
        /// Rematerialise: differentiation recomputes the callee's
        /// activations in the backward pass instead of keeping them (like
        /// `jax.checkpoint`). Printed as `{remat = true}`.
        remat: bool,
    },
    /// Identity that asks for its result to have this sharding, like JAX's
    /// `with_sharding_constraint`. Its rank must equal the operand's.
    ShardingConstraint {
        /// The requested sharding.
        sharding: TensorSharding,
    },
    /// Identity on the global value that changes its sharding to `to`; the
    /// partitioner lowers it to collectives. Inserted by sharding
    /// propagation wherever an operand's sharding differs from what its user
    /// needs.
    Reshard {
        /// The sharding of the result.
        to: TensorSharding,
    },
}

impl Op {
    /// The mnemonic used in the text format.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Constant(_) => "constant",
            Op::Iota { .. } => "iota",
            Op::Unary(u) => u.name(),
            Op::Binary(b) => b.name(),
            Op::Compare(c) => c.name(),
            Op::Select => "select",
            Op::Convert { .. } => "convert",
            Op::BroadcastInDim { .. } => "broadcast_in_dim",
            Op::Reshape { .. } => "reshape",
            Op::Transpose { .. } => "transpose",
            Op::Slice { .. } => "slice",
            Op::Concatenate { .. } => "concatenate",
            Op::Pad { .. } => "pad",
            Op::DotGeneral(_) => "dot_general",
            Op::Reduce { op, .. } => op.name(),
            Op::Index(i) => i.name(),
            Op::Call { .. } => "call",
            Op::ShardingConstraint { .. } => "sharding_constraint",
            Op::Reshard { .. } => "reshard",
        }
    }

    /// The number of operands the op takes, or `None` if variadic
    /// (`concatenate` takes at least one, `call` as many as the callee).
    pub fn arity(&self) -> Option<usize> {
        match self {
            Op::Constant(_) | Op::Iota { .. } => Some(0),
            Op::Unary(_)
            | Op::Convert { .. }
            | Op::BroadcastInDim { .. }
            | Op::Reshape { .. }
            | Op::Transpose { .. }
            | Op::Slice { .. }
            | Op::Reduce { .. }
            | Op::ShardingConstraint { .. }
            | Op::Reshard { .. } => Some(1),
            Op::Binary(_) | Op::Compare(_) | Op::Pad { .. } | Op::DotGeneral(_) => Some(2),
            Op::Select => Some(3),
            Op::Index(i) => Some(i.arity()),
            Op::Concatenate { .. } | Op::Call { .. } => None,
        }
    }

    /// True for ops whose result type is carried in the op's attributes and
    /// so is printed only in the type annotation.
    pub fn result_type_in_attrs(&self) -> bool {
        matches!(
            self,
            Op::Constant(_) | Op::Iota { .. } | Op::Convert { .. } | Op::BroadcastInDim { .. } | Op::Reshape { .. }
        )
    }

    /// True for elementwise ops (the result element at an index depends only
    /// on operand elements at the same index).
    pub fn is_elementwise(&self) -> bool {
        matches!(self, Op::Unary(_) | Op::Binary(_) | Op::Compare(_) | Op::Select | Op::Convert { .. })
    }

    /// True for ops that spread one value over their result: a
    /// `broadcast_in_dim` of a rank-0 operand (no `dims`) and a splat
    /// `constant`. Such a value costs nothing to recompute where it is
    /// read, inside a fused loop, and a whole tensor to store.
    pub fn is_splat(&self) -> bool {
        match self {
            Op::BroadcastInDim { dims, .. } => dims.is_empty(),
            Op::Constant(l) => matches!(l.data, crate::LiteralData::Splat(_)),
            _ => false,
        }
    }
}

//! Constants and index tensors.
//!
//! Values are given as `f64` and rounded to the dtype when the literal is
//! built (see [`Literal`]), so `scalar(DType::BF16, 0.1)` holds exactly the
//! bf16 nearest to 0.1 and what the program computes with.

use super::{FunctionBuilder, Value};
use crate::{DType, Literal, Op, TensorType};

impl FunctionBuilder {
    /// A constant from a literal.
    #[track_caller]
    pub fn constant(&self, lit: Literal) -> Value {
        self.emit1(Op::Constant(lit), &[])
    }

    /// A rank-0 constant.
    #[track_caller]
    pub fn scalar(&self, dtype: DType, value: f64) -> Value {
        self.constant(Literal::scalar(dtype, value))
    }

    /// A constant with every element equal to `value` (a splat literal).
    #[track_caller]
    pub fn full(&self, dtype: DType, shape: &[usize], value: f64) -> Value {
        self.constant(Literal::splat(TensorType::new(dtype, shape.to_vec()), value))
    }

    /// All zeros.
    #[track_caller]
    pub fn zeros(&self, dtype: DType, shape: &[usize]) -> Value {
        self.full(dtype, shape, 0.0)
    }

    /// All ones.
    #[track_caller]
    pub fn ones(&self, dtype: DType, shape: &[usize]) -> Value {
        self.full(dtype, shape, 1.0)
    }

    /// A splat constant with the type of `x`.
    #[track_caller]
    pub fn full_like(&self, x: Value, value: f64) -> Value {
        match self.input("constant", x) {
            Some(t) => self.constant(Literal::splat(t, value)),
            None => self.poison(),
        }
    }

    /// Zeros with the type of `x`.
    #[track_caller]
    pub fn zeros_like(&self, x: Value) -> Value {
        self.full_like(x, 0.0)
    }

    /// Ones with the type of `x`.
    #[track_caller]
    pub fn ones_like(&self, x: Value) -> Value {
        self.full_like(x, 1.0)
    }

    /// A constant with one value per element, row-major. The number of
    /// values must equal the number of elements of `ty`.
    #[track_caller]
    pub fn dense(&self, ty: TensorType, values: Vec<f64>) -> Value {
        if self.has_error() {
            return self.poison();
        }
        match Literal::dense(ty, values) {
            Ok(lit) => self.constant(lit),
            Err(msg) => {
                self.fail("constant", msg);
                self.poison()
            }
        }
    }

    /// `result[i0, .., in] = i_dim`: the index along dimension `dim`.
    #[track_caller]
    pub fn iota(&self, dtype: DType, shape: &[usize], dim: usize) -> Value {
        self.emit1(Op::Iota { dim, ty: TensorType::new(dtype, shape.to_vec()) }, &[])
    }

    /// `[0, 1, .., n-1]`, like `numpy.arange(n)`.
    #[track_caller]
    pub fn arange(&self, dtype: DType, n: usize) -> Value {
        self.iota(dtype, &[n], 0)
    }
}

//! Reductions: the primitive `reduce_*` ops over exact dimension lists, and
//! NumPy-style helpers (`sum`, `max`, `mean`, `variance`, `logsumexp`,
//! `argmax`) that take possibly negative axes and `keepdims`.
//!
//! `keepdims` is a `reshape` of the reduced value (the IR's reductions drop
//! the reduced dimensions), so results broadcast back against the input.

use super::{FunctionBuilder, Value};
use crate::{DType, Op, ReduceOp, TensorType};

/// `shape` with the dimensions in `axes` set to 1.
fn kept_shape(shape: &[usize], axes: &[usize]) -> Vec<usize> {
    shape.iter().enumerate().map(|(d, &e)| if axes.contains(&d) { 1 } else { e }).collect()
}

impl FunctionBuilder {
    /// The primitive reduction over `dims` (strictly increasing), which are
    /// removed from the shape.
    #[track_caller]
    pub fn reduce(&self, op: ReduceOp, x: Value, dims: &[usize]) -> Value {
        self.emit1(Op::Reduce { op, dims: dims.to_vec() }, &[x])
    }

    /// Primitive sum over `dims`.
    #[track_caller]
    pub fn reduce_sum(&self, x: Value, dims: &[usize]) -> Value {
        self.reduce(ReduceOp::Sum, x, dims)
    }

    /// Primitive maximum over `dims`.
    #[track_caller]
    pub fn reduce_max(&self, x: Value, dims: &[usize]) -> Value {
        self.reduce(ReduceOp::Max, x, dims)
    }

    /// Primitive minimum over `dims`.
    #[track_caller]
    pub fn reduce_min(&self, x: Value, dims: &[usize]) -> Value {
        self.reduce(ReduceOp::Min, x, dims)
    }

    /// Reduces over NumPy-style `axes`, keeping them as size 1 if `keepdims`.
    #[track_caller]
    fn reduction(&self, name: &'static str, op: ReduceOp, x: Value, axes: &[isize], keepdims: bool) -> Value {
        self.scope(name, || {
            let Some(t) = self.input(name, x) else { return self.poison() };
            let Some(ax) = self.axes(name, &t, axes) else { return self.poison() };
            let r = self.reduce(op, x, &ax);
            if keepdims {
                self.reshape(r, &kept_shape(&t.shape, &ax))
            } else {
                r
            }
        })
    }

    /// Sum over `axes` (negative axes count from the end).
    #[track_caller]
    pub fn sum(&self, x: Value, axes: &[isize], keepdims: bool) -> Value {
        self.reduction("sum", ReduceOp::Sum, x, axes, keepdims)
    }

    /// Maximum over `axes`. (Elementwise maximum is [`maximum`](Self::maximum).)
    #[track_caller]
    pub fn max(&self, x: Value, axes: &[isize], keepdims: bool) -> Value {
        self.reduction("max", ReduceOp::Max, x, axes, keepdims)
    }

    /// Minimum over `axes`. (Elementwise minimum is [`minimum`](Self::minimum).)
    #[track_caller]
    pub fn min(&self, x: Value, axes: &[isize], keepdims: bool) -> Value {
        self.reduction("min", ReduceOp::Min, x, axes, keepdims)
    }

    /// Sum of all elements (a scalar).
    #[track_caller]
    pub fn sum_all(&self, x: Value) -> Value {
        self.scope("sum_all", || {
            let Some(t) = self.input("sum_all", x) else { return self.poison() };
            self.reduce_sum(x, &(0..t.rank()).collect::<Vec<_>>())
        })
    }

    /// Mean over `axes` (floats only): the sum divided by the number of
    /// reduced elements.
    #[track_caller]
    pub fn mean(&self, x: Value, axes: &[isize], keepdims: bool) -> Value {
        self.scope("mean", || {
            let Some(t) = self.float_input("mean", x) else { return self.poison() };
            let Some(ax) = self.axes("mean", &t, axes) else { return self.poison() };
            // Saturating: an oversized type is reported by the verifier.
            let n = ax.iter().fold(1usize, |a, &d| a.saturating_mul(t.shape[d]));
            let m = self.div_scalar(self.reduce_sum(x, &ax), n as f64);
            if keepdims {
                self.reshape(m, &kept_shape(&t.shape, &ax))
            } else {
                m
            }
        })
    }

    /// Mean of all elements (a scalar; floats only).
    #[track_caller]
    pub fn mean_all(&self, x: Value) -> Value {
        self.scope("mean_all", || {
            let Some(t) = self.float_input("mean_all", x) else { return self.poison() };
            let s = self.sum_all(x);
            self.div_scalar(s, t.num_elements() as f64)
        })
    }

    /// Population variance over `axes` (divides by N, like `numpy.var`),
    /// computed as the mean of squared deviations from the mean (stable,
    /// unlike `E[x^2] - E[x]^2`).
    #[track_caller]
    pub fn variance(&self, x: Value, axes: &[isize], keepdims: bool) -> Value {
        self.scope("variance", || {
            let Some(t) = self.float_input("variance", x) else { return self.poison() };
            let Some(ax) = self.axes("variance", &t, axes) else { return self.poison() };
            let mu = self.broadcast_back(self.mean(x, axes, false), &t, &ax);
            let d = self.sub(x, mu);
            let sq = self.square(d);
            self.mean(sq, axes, keepdims)
        })
    }

    /// `log(sum(exp(x)))` over `axes`, computed stably as
    /// `m + log(sum(exp(x - m)))` with `m` the maximum (replaced by 0 where
    /// it is not finite, so all -inf inputs give -inf instead of NaN).
    #[track_caller]
    pub fn logsumexp(&self, x: Value, axes: &[isize], keepdims: bool) -> Value {
        self.scope("logsumexp", || {
            let Some(t) = self.float_input("logsumexp", x) else { return self.poison() };
            let Some(ax) = self.axes("logsumexp", &t, axes) else { return self.poison() };
            let m = self.stable_max(x, &ax);
            let e = self.exp(self.sub(x, self.broadcast_back(m, &t, &ax)));
            let r = self.add(self.log(self.reduce_sum(e, &ax)), m);
            if keepdims {
                self.reshape(r, &kept_shape(&t.shape, &ax))
            } else {
                r
            }
        })
    }

    /// Index of the first maximum along `axis`, as `i32` (the axis is
    /// removed). Where a slice contains NaN the result is the axis extent.
    #[track_caller]
    pub fn argmax(&self, x: Value, axis: isize) -> Value {
        self.arg_extremum("argmax", x, axis, true)
    }

    /// Index of the first minimum along `axis`, as `i32` (the axis is removed).
    #[track_caller]
    pub fn argmin(&self, x: Value, axis: isize) -> Value {
        self.arg_extremum("argmin", x, axis, false)
    }

    #[track_caller]
    fn arg_extremum(&self, name: &'static str, x: Value, axis: isize, is_max: bool) -> Value {
        self.scope(name, || {
            let Some(t) = self.input(name, x) else { return self.poison() };
            let Some(a) = self.axis(name, &t, axis) else { return self.poison() };
            let ext = if is_max { self.reduce_max(x, &[a]) } else { self.reduce_min(x, &[a]) };
            let hit = self.eq(x, self.broadcast_back(ext, &t, &[a]));
            let idx = self.iota(DType::I32, &t.shape, a);
            let none = self.full(DType::I32, &t.shape, t.shape[a] as f64);
            let cand = self.select(hit, idx, none);
            self.reduce_min(cand, &[a])
        })
    }

    /// The maximum over `dims` (removed), replaced by 0 where it is not
    /// finite: the shift that makes `exp(x - m)` safe.
    #[track_caller]
    pub(crate) fn stable_max(&self, x: Value, dims: &[usize]) -> Value {
        let m = self.reduce_max(x, dims);
        let finite = self.is_finite(m);
        let zero = self.zeros_like(m);
        self.select(finite, m, zero)
    }

    /// Broadcasts `v`, the reduction of a `t`-typed value over `dims`, back
    /// to `t`'s shape (cleaner IR than a keepdims reshape followed by a
    /// broadcast that drops the size-1 dimensions again).
    #[track_caller]
    pub(crate) fn broadcast_back(&self, v: Value, t: &TensorType, dims: &[usize]) -> Value {
        let kept: Vec<usize> = (0..t.rank()).filter(|d| !dims.contains(d)).collect();
        self.broadcast_in_dim(v, &t.shape, &kept)
    }

    /// Like [`input`](Self::input), but also requires a float dtype.
    #[track_caller]
    pub(crate) fn float_input(&self, op: &str, x: Value) -> Option<TensorType> {
        let t = self.input(op, x)?;
        if !t.dtype.is_float() {
            self.fail(op, format!("needs a float operand, got {t} (convert it first)"));
            return None;
        }
        Some(t)
    }
}

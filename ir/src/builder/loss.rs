//! Losses and metrics, reduced to a scalar mean over the batch.

use super::{FunctionBuilder, Value};
use crate::DType;

impl FunctionBuilder {
    /// Mean softmax cross-entropy of `logits[..., C]` against integer
    /// `labels[...]` (same leading shape): the mean of
    /// `-log_softmax(logits)[label]`, the log-probability read by a `gather`
    /// (no one-hot tensor). Stable for large logits; a label outside `0..C`
    /// contributes 0. The result is a scalar of the logits' dtype.
    #[track_caller]
    pub fn softmax_cross_entropy(&self, logits: Value, labels: Value) -> Value {
        self.scope("softmax_cross_entropy", || {
            let Some(tl) = self.float_input("softmax_cross_entropy", logits) else { return self.poison() };
            let Some(ty) = self.input("softmax_cross_entropy", labels) else { return self.poison() };
            let r = tl.rank();
            if r == 0 || ty.shape != tl.shape[..r - 1] || !ty.dtype.is_integer() {
                self.fail(
                    "softmax_cross_entropy",
                    format!(
                        "needs logits[..., C] and integer labels[...] with the same leading shape, got {tl} and {ty}"
                    ),
                );
                return self.poison();
            }
            // The label's log-probability, read by index (no one-hot).
            let picked = self.gather(self.log_softmax(logits, -1), labels, -1, r - 1);
            self.neg(self.mean_all(picked))
        })
    }

    /// Mean squared error `mean((pred - target)^2)` over all elements (a
    /// scalar). `target` broadcasts against `pred`.
    #[track_caller]
    pub fn mse(&self, pred: Value, target: Value) -> Value {
        self.scope("mse", || {
            if self.float_input("mse", pred).is_none() {
                return self.poison();
            }
            self.mean_all(self.square(self.sub(pred, target)))
        })
    }

    /// Fraction of rows whose [`argmax`](Self::argmax) over the last axis of
    /// `logits[..., C]` equals the integer label: a scalar of the logits'
    /// dtype in `[0, 1]`. Ties count for the first maximal class.
    #[track_caller]
    pub fn accuracy(&self, logits: Value, labels: Value) -> Value {
        self.scope("accuracy", || {
            let Some(tl) = self.float_input("accuracy", logits) else { return self.poison() };
            let Some(ty) = self.input("accuracy", labels) else { return self.poison() };
            let r = tl.rank();
            if r == 0 || ty.shape != tl.shape[..r - 1] || !ty.dtype.is_integer() {
                self.fail(
                    "accuracy",
                    format!(
                        "needs logits[..., C] and integer labels[...] with the same leading shape, got {tl} and {ty}"
                    ),
                );
                return self.poison();
            }
            let idx = self.argmax(logits, -1);
            let pred = if ty.dtype == DType::I32 { idx } else { self.convert(idx, ty.dtype) };
            self.mean_all(self.convert(self.eq(pred, labels), tl.dtype))
        })
    }
}

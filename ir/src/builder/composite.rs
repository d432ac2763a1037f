//! Neural-network composites: activations, softmax, normalization,
//! one-hot encodings, embeddings and masks.
//!
//! Every helper expands into primitives, so autodiff, sharding and the
//! interpreter need no special cases, and each is written in its
//! numerically stable form (max-shifted softmax, log1p-based softplus,
//! deviation-based variance).

use super::{FunctionBuilder, Value};
use crate::{DType, TensorType};

impl FunctionBuilder {
    /// `max(x, 0)`.
    #[track_caller]
    pub fn relu(&self, x: Value) -> Value {
        self.scope("relu", || {
            let z = self.zeros_like(x);
            self.maximum(x, z)
        })
    }

    /// GELU, **tanh approximation** (as GPT-2 and `jax.nn.gelu(approximate=True)`):
    /// `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.
    #[track_caller]
    pub fn gelu(&self, x: Value) -> Value {
        self.scope("gelu", || {
            if self.float_input("gelu", x).is_none() {
                return self.poison();
            }
            let x3 = self.mul(self.square(x), x);
            let inner = self.add(x, self.mul_scalar(x3, 0.044715));
            let t = self.tanh(self.mul_scalar(inner, (2.0 / std::f64::consts::PI).sqrt()));
            let half_x = self.mul_scalar(x, 0.5);
            self.mul(half_x, self.add_scalar(t, 1.0))
        })
    }

    /// `1 / (1 + e^-x)` (the `logistic` primitive, stable for large |x|).
    #[track_caller]
    pub fn sigmoid(&self, x: Value) -> Value {
        self.unary(crate::UnaryOp::Logistic, x)
    }

    /// `x * sigmoid(x)` (SiLU / swish).
    #[track_caller]
    pub fn silu(&self, x: Value) -> Value {
        self.scope("silu", || self.mul(x, self.sigmoid(x)))
    }

    /// `log(1 + e^x)`, computed stably as `max(x, 0) + log1p(e^-|x|)`.
    #[track_caller]
    pub fn softplus(&self, x: Value) -> Value {
        self.scope("softplus", || {
            let tail = self.log1p(self.exp(self.neg(self.abs(x))));
            self.add(self.relu(x), tail)
        })
    }

    /// Softmax along `axis`: `exp(x - max) / sum(exp(x - max))`; rows sum to 1
    /// and large logits do not overflow.
    #[track_caller]
    pub fn softmax(&self, x: Value, axis: isize) -> Value {
        self.scope("softmax", || {
            let Some(t) = self.float_input("softmax", x) else { return self.poison() };
            let Some(a) = self.axis("softmax", &t, axis) else { return self.poison() };
            let e = self.exp(self.sub(x, self.broadcast_back(self.stable_max(x, &[a]), &t, &[a])));
            self.div(e, self.broadcast_back(self.reduce_sum(e, &[a]), &t, &[a]))
        })
    }

    /// Log-softmax along `axis`: `(x - m) - log(sum(exp(x - m)))` with `m`
    /// the maximum; finite even for logits of 1000.
    #[track_caller]
    pub fn log_softmax(&self, x: Value, axis: isize) -> Value {
        self.scope("log_softmax", || {
            let Some(t) = self.float_input("log_softmax", x) else { return self.poison() };
            let Some(a) = self.axis("log_softmax", &t, axis) else { return self.poison() };
            let shifted = self.sub(x, self.broadcast_back(self.stable_max(x, &[a]), &t, &[a]));
            let lse = self.log(self.reduce_sum(self.exp(shifted), &[a]));
            self.sub(shifted, self.broadcast_back(lse, &t, &[a]))
        })
    }

    /// Layer normalization over one `axis`: `(x - mean) / sqrt(var + eps)`,
    /// then `* gamma + beta` when given. `gamma` and `beta` have shape
    /// `[x.shape[axis]]` and are broadcast along that axis.
    ///
    /// A bf16 or f16 `x` is normalized in f32 and the result converted back
    /// before `gamma` and `beta` (as PyTorch's autocast and flax's
    /// `LayerNorm` compute the statistics): in f16 the backward's
    /// `(var + eps)^-3/2` overflows for the small variances of freshly
    /// initialised activations (4e-4 gives 1.25e5 > 65504), and the
    /// gradients turn to NaN.
    #[track_caller]
    pub fn layer_norm(&self, x: Value, gamma: Option<Value>, beta: Option<Value>, axis: isize, eps: f64) -> Value {
        self.scope("layer_norm", || {
            let Some(t) = self.float_input("layer_norm", x) else { return self.poison() };
            let Some(a) = self.axis("layer_norm", &t, axis) else { return self.poison() };
            let (x, tw) = self.widened(x, &t);
            let centered = self.sub(x, self.broadcast_back(self.mean(x, &[axis], false), &tw, &[a]));
            let var = self.mean(self.square(centered), &[axis], false);
            let inv = self.rsqrt(self.add_scalar(var, eps));
            let y = self.mul(centered, self.broadcast_back(inv, &tw, &[a]));
            let y = if tw.dtype != t.dtype { self.convert(y, t.dtype) } else { y };
            self.scale_shift("layer_norm", y, &t, a, gamma, beta)
        })
    }

    /// `x` in f32 when it is bf16 or f16 (normalization statistics), with
    /// its type; otherwise `x` itself.
    fn widened(&self, x: Value, t: &TensorType) -> (Value, TensorType) {
        match t.dtype {
            DType::BF16 | DType::F16 => (self.convert(x, DType::F32), t.with_dtype(DType::F32)),
            _ => (x, t.clone()),
        }
    }

    /// RMS normalization over one `axis`: `x / sqrt(mean(x^2) + eps) * gamma`;
    /// a bf16 or f16 `x` is normalized in f32, as in [`Self::layer_norm`].
    #[track_caller]
    pub fn rms_norm(&self, x: Value, gamma: Option<Value>, axis: isize, eps: f64) -> Value {
        self.scope("rms_norm", || {
            let Some(t) = self.float_input("rms_norm", x) else { return self.poison() };
            let Some(a) = self.axis("rms_norm", &t, axis) else { return self.poison() };
            let (x, tw) = self.widened(x, &t);
            let ms = self.mean(self.square(x), &[axis], false);
            let y = self.mul(x, self.broadcast_back(self.rsqrt(self.add_scalar(ms, eps)), &tw, &[a]));
            let y = if tw.dtype != t.dtype { self.convert(y, t.dtype) } else { y };
            self.scale_shift("rms_norm", y, &t, a, gamma, None)
        })
    }

    /// `y * gamma + beta` with the 1-D `gamma`/`beta` laid along `axis`.
    #[track_caller]
    fn scale_shift(
        &self,
        op: &str,
        y: Value,
        t: &TensorType,
        axis: usize,
        gamma: Option<Value>,
        beta: Option<Value>,
    ) -> Value {
        let mut y = y;
        for (what, p, is_scale) in [("gamma", gamma, true), ("beta", beta, false)] {
            let Some(p) = p else { continue };
            let Some(tp) = self.input(op, p) else { return self.poison() };
            if tp.dtype != t.dtype || tp.shape != [t.shape[axis]] {
                let want = TensorType::new(t.dtype, vec![t.shape[axis]]);
                self.fail(op, format!("{what} must be {want} to normalize axis {axis} of {t}, got {tp}"));
                return self.poison();
            }
            let pb = self.broadcast_in_dim(p, &t.shape, &[axis]);
            y = if is_scale { self.mul(y, pb) } else { self.add(y, pb) };
        }
        y
    }

    /// One-hot encoding: integer `labels` of shape `S` give `dtype[S..., n]`
    /// with 1 at each label's index and 0 elsewhere (labels outside
    /// `0..n` give all zeros). Built as `iota == labels`, converted.
    #[track_caller]
    pub fn one_hot(&self, labels: Value, num_classes: usize, dtype: DType) -> Value {
        self.scope("one_hot", || {
            let Some(t) = self.input("one_hot", labels) else { return self.poison() };
            if !t.dtype.is_integer() {
                self.fail("one_hot", format!("labels must be i32 or u32, got {t}"));
                return self.poison();
            }
            let mut shape = t.shape.clone();
            shape.push(num_classes);
            let classes = self.iota(t.dtype, &shape, t.rank());
            let lab = self.broadcast_in_dim(labels, &shape, &(0..t.rank()).collect::<Vec<_>>());
            self.convert(self.eq(classes, lab), dtype)
        })
    }

    /// Embedding lookup `table[ids]`: integer `ids` of shape `S` and
    /// `table[V, D]` give `[S..., D]`, by a `gather` of rows (ids outside
    /// `0..V` give zeros); its gradient is a `scatter_add` into the table.
    #[track_caller]
    pub fn embedding(&self, ids: Value, table: Value) -> Value {
        self.scope("embedding", || {
            let Some(tt) = self.input("embedding", table) else { return self.poison() };
            if tt.rank() != 2 {
                self.fail("embedding", format!("the table must be [vocab, dim], got {tt}"));
                return self.poison();
            }
            self.gather(table, ids, 0, 0)
        })
    }

    /// `bool[seq, seq]`, true where key position `j <= ` query position `i`
    /// (the positions causal attention may look at). Use it as
    /// `masked_fill(scores, not(mask), -inf)` on `[..., seq, seq]` scores.
    #[track_caller]
    pub fn causal_mask(&self, seq: usize) -> Value {
        self.scope("causal_mask", || {
            let q = self.iota(DType::I32, &[seq, seq], 0);
            let k = self.iota(DType::I32, &[seq, seq], 1);
            self.ge(q, k)
        })
    }

    /// Scaled dot-product attention: `softmax(q k^T / sqrt(D)) v` for
    /// `q[..., Tq, D]`, `k[..., Tk, D]`, `v[..., Tk, Dv]` (leading dims as in
    /// [`matmul`](Self::matmul)), giving `[..., Tq, Dv]`. With `causal`
    /// (which needs `Tq == Tk`), query `i` only sees keys `j <= i`.
    #[track_caller]
    pub fn dot_product_attention(&self, q: Value, k: Value, v: Value, causal: bool) -> Value {
        self.scope("dot_product_attention", || {
            let Some(ts) = self.inputs("dot_product_attention", &[q, k, v]) else { return self.poison() };
            let (tq, tk, tv) = (&ts[0], &ts[1], &ts[2]);
            let last2 = |t: &TensorType| (t.rank() >= 2).then(|| (t.shape[t.rank() - 2], t.shape[t.rank() - 1]));
            let ok = match (last2(tq), last2(tk), last2(tv)) {
                (Some((sq, dq)), Some((sk, dk)), Some((sv, _))) => dq == dk && sk == sv && (!causal || sq == sk),
                _ => false,
            };
            if !ok || !tq.dtype.is_float() {
                let what = if causal { "causal " } else { "" };
                self.fail(
                    "dot_product_attention",
                    format!(
                        "needs float q[..., T, D], k[..., T', D], v[..., T', Dv] ({what}T == T'), got {tq}, {tk}, {tv}"
                    ),
                );
                return self.poison();
            }
            let d = tq.shape[tq.rank() - 1];
            let scores = self.matmul(q, self.swap_axes(k, -1, -2));
            let mut scores = self.mul_scalar(scores, 1.0 / (d as f64).sqrt());
            if causal {
                let mask = self.causal_mask(tq.shape[tq.rank() - 2]);
                scores = self.masked_fill(scores, self.not(mask), f64::NEG_INFINITY);
            }
            self.matmul(self.softmax(scores, -1), v)
        })
    }
}

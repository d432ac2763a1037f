//! The layers of today's decoders (Llama, Mistral, Qwen): rotary position
//! embeddings, the SwiGLU feed-forward block and grouped-query attention.
//! Like every composite they expand into primitives, so autodiff, sharding
//! and every backend need nothing new; each is checked against finite
//! differences (`compiler/tests/layer_grads.rs`).

use super::{FunctionBuilder, Value};
use crate::TensorType;

impl FunctionBuilder {
    /// Rotary position embeddings (RoFormer; Llama's "rotate half" form)
    /// on `x[..., T, D]` (D even): position `t` rotates the pairs
    /// `(x[i], x[i + D/2])` by the angle `t · base^(-2i/D)`:
    /// `x · cos + rotate_half(x) · sin`, `rotate_half(x) = [-x₂, x₁]`. The
    /// tables are constants computed in f64.
    #[track_caller]
    pub fn rotary_embedding(&self, x: Value, base: f64) -> Value {
        self.scope("rotary_embedding", || {
            let Some(t) = self.float_input("rotary_embedding", x) else { return self.poison() };
            let r = t.rank();
            if r < 2 || t.shape[r - 1] % 2 != 0 || base.is_nan() || base <= 1.0 {
                self.fail(
                    "rotary_embedding",
                    format!("needs x[..., T, D] with D even and base > 1, got {t}, base {base}"),
                );
                return self.poison();
            }
            let (seq, d) = (t.shape[r - 2], t.shape[r - 1]);
            let half = d / 2;
            let angle = |pos: usize, j: usize| pos as f64 * base.powf(-2.0 * (j % half) as f64 / d as f64);
            let table = |f: fn(f64) -> f64| -> Vec<f64> {
                (0..seq).flat_map(|p| (0..d).map(move |j| f(angle(p, j)))).collect()
            };
            let ty = TensorType::new(t.dtype, vec![seq, d]);
            let dims = [r - 2, r - 1];
            let cos = self.broadcast_in_dim(self.dense(ty.clone(), table(f64::cos)), &t.shape, &dims);
            let sin = self.broadcast_in_dim(self.dense(ty, table(f64::sin)), &t.shape, &dims);
            let halves = self.split(x, -1, 2);
            let rotated = self.concatenate(&[self.neg(halves[1]), halves[0]], r - 1);
            self.add(self.mul(x, cos), self.mul(rotated, sin))
        })
    }

    /// The SwiGLU feed-forward block (Shazeer 2020; Llama's MLP):
    /// `(silu(x @ w_gate) * (x @ w_up)) @ w_down` for `x[..., D]`,
    /// `w_gate, w_up: [D, F]`, `w_down: [F, D]`.
    #[track_caller]
    pub fn swiglu(&self, x: Value, w_gate: Value, w_up: Value, w_down: Value) -> Value {
        self.scope("swiglu", || {
            let gate = self.silu(self.matmul(x, w_gate));
            self.matmul(self.mul(gate, self.matmul(x, w_up)), w_down)
        })
    }

    /// Grouped-query attention (Ainslie et al. 2023): `q[B, H, T, D]`
    /// attends over `k, v[B, KV, T, D]` with `KV` dividing `H`; query head
    /// `h` uses key/value head `h / (H / KV)` (as Hugging Face's
    /// `repeat_kv`). `KV == H` is multi-head attention, `KV == 1`
    /// multi-query attention. Causal when `causal`.
    #[track_caller]
    pub fn grouped_query_attention(&self, q: Value, k: Value, v: Value, causal: bool) -> Value {
        self.scope("grouped_query_attention", || {
            let Some(ts) = self.inputs("grouped_query_attention", &[q, k, v]) else { return self.poison() };
            let (tq, tk, tv) = (&ts[0], &ts[1], &ts[2]);
            let ok = tq.rank() == 4
                && tk.shape == tv.shape
                && tk.rank() == 4
                && tk.shape[0] == tq.shape[0]
                && tk.shape[1] > 0
                && tq.shape[1] % tk.shape[1] == 0;
            if !ok {
                self.fail(
                    "grouped_query_attention",
                    format!("needs q[B, H, T, D] and k, v[B, KV, T', D] with KV dividing H, got {tq}, {tk}, {tv}"),
                );
                return self.poison();
            }
            let group = tq.shape[1] / tk.shape[1];
            let repeat = |x: Value, t: &TensorType| {
                if group == 1 {
                    return x;
                }
                let (b, kv, s, d) = (t.shape[0], t.shape[1], t.shape[2], t.shape[3]);
                let wide = self.broadcast_in_dim(x, &[b, kv, group, s, d], &[0, 1, 3, 4]);
                self.reshape(wide, &[b, kv * group, s, d])
            };
            self.dot_product_attention(q, repeat(k, tk), repeat(v, tv), causal)
        })
    }
}

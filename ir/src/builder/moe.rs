//! A mixture-of-experts layer: a router, top-k token choice with a
//! capacity, dispatch and combine by indexing, and per-expert GELU MLPs
//! (Switch/GShard with Mixtral's normalised top-k gates).
//!
//! Why it is built this way: the tokens are routed within *groups* (the
//! leading dimension, a sequence of the batch), so every routing decision
//! is local to a group, and the expert buffers are a `scatter_add` of the
//! tokens into `[group, expert · capacity, C]` slots. Expert weights carry
//! the expert as their leading dimension, so the MLPs are two batched
//! contractions over the experts. A split of the groups over one mesh
//! axis and of the experts over the same axis then meet at one reshard of
//! the buffers (the all-to-all of expert parallelism), chosen by the
//! partitioner like any other.
//!
//! Determinism: the positions in an expert's buffer follow a fixed order,
//! first choices before second choices, then token order (GShard's
//! priority), computed with `cumsum`; a token's assignment beyond the
//! capacity is dropped (its slot index is out of range, which the scatter
//! drops and the gather reads as zero) and counted.

use super::{FunctionBuilder, Value};
use crate::{DType, DotDims};

/// The results of [`FunctionBuilder::moe`].
#[derive(Copy, Clone, Debug)]
pub struct MoeOutput {
    /// The layer's output, `[G, S, C]`.
    pub y: Value,
    /// Switch's load-balancing loss `E · Σ_e f_e · P_e` (`f_e`: the share
    /// of assignments routed to expert `e`; `P_e`: its mean router
    /// probability), a scalar; 1 when the load is uniform.
    pub aux_loss: Value,
    /// The share of assignments dropped for want of capacity, a scalar.
    pub dropped: Value,
    /// Each expert's share of the assignments (before the capacity), `[E]`.
    pub load: Value,
}

/// The capacity of each expert per group: `ceil(k · S · factor / E)`, at
/// least 1.
pub fn moe_capacity(tokens_per_group: usize, experts: usize, top_k: usize, capacity_factor: f64) -> usize {
    let c = (top_k * tokens_per_group) as f64 * capacity_factor / experts.max(1) as f64;
    (c.ceil() as usize).max(1)
}

impl FunctionBuilder {
    /// A mixture-of-experts layer on `x[G, S, C]` (`G` groups of `S`
    /// tokens): router `router[C, E]`, experts `w1[E, C, H]`, `w2[E, H, C]`
    /// (GELU between). Each token goes to its `top_k` most probable experts
    /// with gates normalised over those `top_k`; each expert takes at most
    /// [`moe_capacity`] assignments per group, first choices first, and the
    /// rest are dropped (the token gets nothing from that expert).
    #[track_caller]
    pub fn moe(&self, x: Value, router: Value, w1: Value, w2: Value, top_k: usize, capacity_factor: f64) -> MoeOutput {
        self.scope("moe", || {
            let poisoned = || MoeOutput { y: self.poison(), aux_loss: self.poison(), dropped: self.poison(), load: self.poison() };
            let Some(tys) = self.inputs("moe", &[x, router, w1, w2]) else { return poisoned() };
            let (tx, tr, t1, t2) = (&tys[0], &tys[1], &tys[2], &tys[3]);
            let ok = tx.rank() == 3
                && tx.dtype.is_float()
                && tr.shape.len() == 2
                && tr.shape[0] == tx.shape[2]
                && t1.rank() == 3
                && t1.shape[..2] == [tr.shape[1], tx.shape[2]]
                && t2.shape == [t1.shape[0], t1.shape[2], tx.shape[2]]
                && [tr.dtype, t1.dtype, t2.dtype].iter().all(|&d| d == tx.dtype);
            if !ok {
                self.fail(
                    "moe",
                    format!("needs x[G, S, C], router[C, E], w1[E, C, H] and w2[E, H, C] of one float dtype, got {tx}, {tr}, {t1} and {t2}"),
                );
                return poisoned();
            }
            let (g, s, c) = (tx.shape[0], tx.shape[1], tx.shape[2]);
            let e = tr.shape[1];
            if top_k == 0 || top_k > e || capacity_factor.is_nan() || capacity_factor <= 0.0 {
                self.fail("moe", format!("needs 1 <= top_k <= experts ({e}) and a positive capacity factor, got top_k {top_k} and {capacity_factor}"));
                return poisoned();
            }
            let dt = tx.dtype;
            let (k, cap) = (top_k, moe_capacity(s, e, top_k, capacity_factor));
            let ks = k * s;
            // Router.
            let probs = self.softmax(self.matmul(x, router), -1);
            let (vals, idx) = self.top_k(probs, k);
            let gates = self.div(vals, self.sum(vals, &[-1], true));
            // Assignments in priority order: choice-major, then token.
            let choice_major = |v: Value| self.reshape(self.transpose(v, &[0, 2, 1]), &[g, ks]);
            let (idx, gates) = (choice_major(idx), choice_major(gates));
            let experts = self.iota(DType::I32, &[g, ks, e], 2);
            let onehot = self.convert(self.eq(self.broadcast_in_dim(idx, &[g, ks, e], &[0, 1]), experts), DType::I32);
            // Position of each assignment in its expert's buffer.
            let pos = self.sub_scalar(self.sum(self.mul(self.cumsum(onehot, 1, false), onehot), &[-1], false), 1.0);
            let keep = self.lt(pos, self.full(DType::I32, &[g, ks], cap as f64));
            let slot = self.add(self.mul_scalar(idx, cap as f64), pos);
            let slot = self.select(keep, slot, self.full(DType::I32, &[g, ks], (e * cap) as f64));
            // Dispatch: every assignment's token into its slot.
            let xk = self.reshape(self.broadcast_in_dim(x, &[g, k, s, c], &[0, 2, 3]), &[g, ks, c]);
            let buf = self.scatter_add(slot, xk, 1, 1, e * cap);
            let per_expert = |v: Value, width: usize| {
                self.reshape(self.transpose(self.reshape(v, &[g, e, cap, width]), &[1, 0, 2, 3]), &[e, g * cap, width])
            };
            let batched = DotDims { lhs_batch: vec![0], rhs_batch: vec![0], lhs_contract: vec![2], rhs_contract: vec![1] };
            let hidden = self.gelu(self.dot_general(per_expert(buf, c), w1, batched.clone()));
            let out = self.dot_general(hidden, w2, batched);
            let out = self.reshape(self.transpose(self.reshape(out, &[e, g, cap, c]), &[1, 0, 2, 3]), &[g, e * cap, c]);
            // Combine: each assignment's output, weighted by its gate.
            let yk = self.gather(out, slot, 1, 1);
            let weighted = self.mul(yk, self.broadcast_in_dim(gates, &[g, ks, c], &[0, 1]));
            let y = self.sum(self.reshape(weighted, &[g, k, s, c]), &[1], false);
            // Metrics and the load-balancing loss.
            let assignments = (g * ks) as f64;
            let load = self.div_scalar(self.convert(self.sum(onehot, &[0, 1], false), dt), assignments);
            let kept = self.sum_all(self.convert(keep, dt));
            let dropped = self.rsub_scalar(1.0, self.div_scalar(kept, assignments));
            let mean_prob = self.div_scalar(self.sum(probs, &[0, 1], false), (g * s) as f64);
            let aux_loss = self.mul_scalar(self.sum_all(self.mul(load, mean_prob)), e as f64);
            MoeOutput { y, aux_loss, dropped, load }
        })
    }
}

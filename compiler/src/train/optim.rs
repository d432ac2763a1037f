//! Optimizers, learning-rate schedules and gradient clipping, emitted as
//! pure IR over named state leaves.
//!
//! The update rules follow optax so that numbers can be checked against it:
//! `sgd(momentum)` is `trace` then `scale_by_learning_rate`; `adamw` is
//! `scale_by_adam` (bias correction with the incremented step count), then
//! `add_decayed_weights`, then `scale_by_learning_rate`; global-norm
//! clipping is `clip_by_global_norm`; the schedule is
//! `warmup_cosine_decay_schedule`.

use crate::emit::Emitter;
use weft_ir::{BinaryOp, CompareOp, DType, UnaryOp, ValueId};

/// An optimizer.
#[derive(Clone, Debug, PartialEq)]
pub enum Optimizer {
    /// Stochastic gradient descent, with optional (heavy-ball or Nesterov)
    /// momentum. `momentum == 0` keeps no state.
    Sgd {
        /// Momentum decay (0 for plain SGD).
        momentum: f64,
        /// Nesterov momentum.
        nesterov: bool,
    },
    /// Adam with decoupled weight decay.
    AdamW {
        /// First-moment decay.
        b1: f64,
        /// Second-moment decay.
        b2: f64,
        /// Added to the root of the second moment.
        eps: f64,
        /// Decoupled weight decay coefficient.
        weight_decay: f64,
    },
}

impl Optimizer {
    /// Plain SGD.
    pub fn sgd() -> Optimizer {
        Optimizer::Sgd { momentum: 0.0, nesterov: false }
    }

    /// AdamW with optax's defaults (b1 0.9, b2 0.999, eps 1e-8, wd 1e-4).
    pub fn adamw() -> Optimizer {
        Optimizer::AdamW { b1: 0.9, b2: 0.999, eps: 1e-8, weight_decay: 1e-4 }
    }

    /// The per-parameter state slots, as leaf-name prefixes (`opt.m` gives
    /// `opt.m.<param>`).
    pub fn slots(&self) -> &'static [&'static str] {
        match self {
            Optimizer::Sgd { momentum, .. } if *momentum == 0.0 => &[],
            Optimizer::Sgd { .. } => &["opt.mu"],
            Optimizer::AdamW { .. } => &["opt.m", "opt.v"],
        }
    }

    /// Emits the update of one parameter. `slots` holds the current values
    /// of [`Optimizer::slots`]; returns the new parameter and new slots.
    /// `lr` is an f32 scalar, `count` the f32 scalar step count after
    /// increment (`step + 1`).
    pub fn update(
        &self,
        e: &mut Emitter<'_>,
        param: ValueId,
        grad: ValueId,
        slots: &[ValueId],
        lr: ValueId,
        count: ValueId,
    ) -> (ValueId, Vec<ValueId>) {
        let pt = e.ty(param);
        let lr_b = broadcast_scalar(e, lr, &pt.shape, pt.dtype);
        match self {
            Optimizer::Sgd { momentum, nesterov } => {
                if *momentum == 0.0 {
                    let step = e.mul(lr_b, grad);
                    return (e.sub(param, step), vec![]);
                }
                let decayed = e.mul_const(slots[0], *momentum);
                let mu = e.add(grad, decayed);
                let direction = if *nesterov {
                    let m2 = e.mul_const(mu, *momentum);
                    e.add(grad, m2)
                } else {
                    mu
                };
                let step = e.mul(lr_b, direction);
                (e.sub(param, step), vec![mu])
            }
            Optimizer::AdamW { b1, b2, eps, weight_decay } => {
                let m0 = e.mul_const(slots[0], *b1);
                let gm = e.mul_const(grad, 1.0 - b1);
                let m = e.add(m0, gm);
                let v0 = e.mul_const(slots[1], *b2);
                let g2 = e.mul(grad, grad);
                let gv = e.mul_const(g2, 1.0 - b2);
                let v = e.add(v0, gv);
                // Bias corrections 1 - b^count, as f32 scalars.
                let c1 = bias_correction(e, *b1, count);
                let c2 = bias_correction(e, *b2, count);
                let c1b = broadcast_scalar(e, c1, &pt.shape, pt.dtype);
                let c2b = broadcast_scalar(e, c2, &pt.shape, pt.dtype);
                let m_hat = e.div(m, c1b);
                let v_hat = e.div(v, c2b);
                let root = e.unary(UnaryOp::Sqrt, v_hat);
                let denom = e.add_const(root, *eps);
                let mut u = e.div(m_hat, denom);
                if *weight_decay != 0.0 {
                    let wd = e.mul_const(param, *weight_decay);
                    u = e.add(u, wd);
                }
                let step = e.mul(lr_b, u);
                (e.sub(param, step), vec![m, v])
            }
        }
    }
}

/// `1 - b^count` for an f32 scalar count, accurate to a few ulp in f32.
///
/// The direct form loses four digits to cancellation for `b = 0.999`
/// (the f32 nearest 0.999 is 0.99900001), which would put a 1e-5 relative
/// error on every Adam step. Instead: `1 - b^t = -expm1(t ln b)`, with
/// `ln b` computed on the host in f64 and `expm1(x) = 2u / (1 - u)` for
/// `u = tanh(x / 2)`, which has no cancellation. Only f32 arithmetic and
/// `tanh` are used, so every backend (including GPUs without 64-bit
/// transcendentals) computes it.
fn bias_correction(e: &mut Emitter<'_>, b: f64, count: ValueId) -> ValueId {
    let half_ln_b = e.scalar(DType::F32, 0.5 * b.ln());
    let x = e.mul(count, half_ln_b);
    let u = e.unary(UnaryOp::Tanh, x);
    let one = e.scalar(DType::F32, 1.0);
    let den = e.sub(one, u);
    let two_u = e.mul_const(u, -2.0);
    e.div(two_u, den)
}

/// Broadcasts an f32 scalar to `shape`, converting to `dtype`.
pub fn broadcast_scalar(e: &mut Emitter<'_>, s: ValueId, shape: &[usize], dtype: DType) -> ValueId {
    let c = e.convert(s, dtype);
    e.broadcast(c, vec![], shape.to_vec())
}

/// A learning-rate schedule: a function of the step counter.
#[derive(Clone, Debug, PartialEq)]
pub enum Schedule {
    /// The same rate every step.
    Constant(f64),
    /// optax's `warmup_cosine_decay_schedule`: linear from `init` to `peak`
    /// over `warmup_steps`, then cosine decay to `end` at `decay_steps`
    /// (counted from step 0), constant `end` after.
    WarmupCosine {
        /// Rate at step 0.
        init: f64,
        /// Rate at the end of warmup.
        peak: f64,
        /// Steps of linear warmup.
        warmup_steps: u64,
        /// Step at which the decay reaches `end` (includes warmup).
        decay_steps: u64,
        /// Final rate.
        end: f64,
    },
}

impl Schedule {
    /// The rate at `step`, computed on the host (for tests and reports).
    pub fn at(&self, step: u64) -> f64 {
        match *self {
            Schedule::Constant(lr) => lr,
            Schedule::WarmupCosine { init, peak, warmup_steps, decay_steps, end } => {
                if step < warmup_steps {
                    init + (peak - init) * step as f64 / warmup_steps as f64
                } else {
                    let span = decay_steps.saturating_sub(warmup_steps).max(1) as f64;
                    let t = ((step - warmup_steps) as f64).min(span) / span;
                    end + (peak - end) * 0.5 * (1.0 + (std::f64::consts::PI * t).cos())
                }
            }
        }
    }

    /// Emits the rate at `step` (an i32 scalar) as an f32 scalar.
    pub fn emit(&self, e: &mut Emitter<'_>, step: ValueId) -> ValueId {
        match *self {
            Schedule::Constant(lr) => e.scalar(DType::F32, lr),
            Schedule::WarmupCosine { init, peak, warmup_steps, decay_steps, end } => {
                let s = e.convert(step, DType::F32);
                let w = e.scalar(DType::F32, warmup_steps.max(1) as f64);
                let frac = e.div(s, w);
                let rise = e.mul_const(frac, peak - init);
                let warm = e.add_const(rise, init);
                let span = decay_steps.saturating_sub(warmup_steps).max(1) as f64;
                let since = e.add_const(s, -(warmup_steps as f64));
                let zero = e.scalar(DType::F32, 0.0);
                let since = e.binary(BinaryOp::Max, since, zero);
                let spanv = e.scalar(DType::F32, span);
                let since = e.binary(BinaryOp::Min, since, spanv);
                let t = e.div(since, spanv);
                let angle = e.mul_const(t, std::f64::consts::PI);
                let c = e.unary(UnaryOp::Cos, angle);
                let c1 = e.add_const(c, 1.0);
                let half = e.mul_const(c1, 0.5 * (peak - end));
                let decay = e.add_const(half, end);
                let wv = e.scalar(DType::F32, warmup_steps as f64);
                let in_warmup = e.compare(CompareOp::Lt, s, wv);
                e.select(in_warmup, warm, decay)
            }
        }
    }
}

/// optax's `clip_by_global_norm`: returns the clipped gradients and the
/// global norm (f32 scalar) before clipping.
pub fn clip_by_global_norm(e: &mut Emitter<'_>, grads: &[ValueId], max_norm: Option<f64>) -> (Vec<ValueId>, ValueId) {
    let mut total = e.scalar(DType::F32, 0.0);
    for &g in grads {
        let g32 = e.convert(g, DType::F32);
        let sq = e.mul(g32, g32);
        let s = e.sum_all(sq);
        total = e.add(total, s);
    }
    let norm = e.unary(UnaryOp::Sqrt, total);
    let Some(max_norm) = max_norm else { return (grads.to_vec(), norm) };
    let maxv = e.scalar(DType::F32, max_norm);
    let keep = e.compare(CompareOp::Lt, norm, maxv);
    let factor = e.div(maxv, norm);
    let clipped = grads
        .iter()
        .map(|&g| {
            let t = e.ty(g);
            let fb = broadcast_scalar(e, factor, &t.shape, t.dtype);
            let scaled = e.mul(g, fb);
            e.select(keep, g, scaled)
        })
        .collect();
    (clipped, norm)
}

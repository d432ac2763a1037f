//! Random numbers in the program: counter-based Threefry keys, as in JAX.
//!
//! A key is a `u32[2]` value (usually a parameter, so each step can get a
//! fresh one). The bits come from [`crate::prng_emit`], which expands into
//! primitive u32 ops bit-identical to the host reference [`crate::prng`];
//! these methods check their inputs (that emitter assumes well-typed ones)
//! and add the float conveniences model code wants (`dropout`).

use super::{FunctionBuilder, Value};
use crate::{prng_emit, DType, Function, TensorType, ValueId};

impl FunctionBuilder {
    /// Checks that `key` is a `u32[2]` key and `shape` has fewer than 2^32
    /// elements.
    #[track_caller]
    fn key_input(&self, op: &str, key: Value, shape: &[usize]) -> bool {
        let Some(t) = self.input(op, key) else { return false };
        if t != TensorType::new(DType::U32, vec![2]) {
            self.fail(op, format!("the key must be u32[2], got {t}"));
            return false;
        }
        if shape.iter().try_fold(1u64, |n, &e| n.checked_mul(e as u64)).is_none_or(|n| n > u32::MAX as u64) {
            self.fail(op, format!("shape {shape:?} has 2^32 or more elements"));
            return false;
        }
        true
    }

    /// Runs a `prng_emit` helper on the function being built.
    fn with_func(&self, emit: impl FnOnce(&mut Function) -> ValueId) -> Value {
        let mut st = self.st.borrow_mut();
        Value { id: emit(&mut st.func).0, tag: self.tag }
    }

    /// A new key derived from `key` and the u32 scalar `data`
    /// (`jax.random.fold_in`).
    #[track_caller]
    pub fn fold_in(&self, key: Value, data: Value) -> Value {
        let Some(td) = self.input("fold_in", data) else { return self.poison() };
        if td != TensorType::scalar(DType::U32) {
            self.fail("fold_in", format!("data must be a u32 scalar, got {td}"));
            return self.poison();
        }
        if !self.key_input("fold_in", key, &[]) {
            return self.poison();
        }
        self.with_func(|f| prng_emit::fold_in(f, ValueId(key.id), ValueId(data.id)))
    }

    /// `n` independent keys `fold_in(key, 0..n)` (not `jax.random.split`'s
    /// values, but as independent).
    #[track_caller]
    pub fn split_key(&self, key: Value, n: usize) -> Vec<Value> {
        let mut out = Vec::with_capacity(n);
        for i in 0..n {
            let d = self.scalar(DType::U32, i as f64);
            out.push(self.fold_in(key, d));
        }
        out
    }

    /// Random `u32` bits of the given shape (`jax.random.bits`).
    #[track_caller]
    pub fn random_bits(&self, key: Value, shape: &[usize]) -> Value {
        if !self.key_input("random_bits", key, shape) {
            return self.poison();
        }
        self.with_func(|f| prng_emit::random_bits(f, ValueId(key.id), shape))
    }

    /// Uniform samples in `[0, 1)` (`jax.random.uniform`), generated in f32
    /// and converted to `dtype` (a float type).
    #[track_caller]
    pub fn random_uniform(&self, key: Value, dtype: DType, shape: &[usize]) -> Value {
        self.random_float("random_uniform", key, dtype, shape, prng_emit::uniform)
    }

    /// Standard normal samples (Box–Muller over two uniform streams; the
    /// values differ from JAX's), generated in f32 and converted to `dtype`.
    #[track_caller]
    pub fn random_normal(&self, key: Value, dtype: DType, shape: &[usize]) -> Value {
        self.random_float("random_normal", key, dtype, shape, prng_emit::normal)
    }

    #[track_caller]
    fn random_float(
        &self,
        op: &str,
        key: Value,
        dtype: DType,
        shape: &[usize],
        emit: fn(&mut Function, ValueId, &[usize]) -> ValueId,
    ) -> Value {
        if !dtype.is_float() {
            self.fail(op, format!("needs a float dtype, got {dtype}"));
            return self.poison();
        }
        if !self.key_input(op, key, shape) {
            return self.poison();
        }
        let u = self.with_func(|f| emit(f, ValueId(key.id), shape));
        if dtype == DType::F32 {
            u
        } else {
            self.convert(u, dtype)
        }
    }

    /// `bool` samples, true with probability `p` in `[0, 1]`.
    #[track_caller]
    pub fn bernoulli(&self, key: Value, p: f64, shape: &[usize]) -> Value {
        if !(0.0..=1.0).contains(&p) {
            self.fail("bernoulli", format!("the probability {p} is outside [0, 1]"));
            return self.poison();
        }
        if !self.key_input("bernoulli", key, shape) {
            return self.poison();
        }
        self.with_func(|f| prng_emit::bernoulli(f, ValueId(key.id), p, shape))
    }

    /// Inverted dropout: each element is zeroed with probability `rate` (in
    /// `[0, 1)`) and the kept ones are scaled by `1 / (1 - rate)`, so the
    /// expectation is unchanged. `rate == 0` returns `x`.
    #[track_caller]
    pub fn dropout(&self, x: Value, key: Value, rate: f64) -> Value {
        self.scope("dropout", || {
            let Some(t) = self.float_input("dropout", x) else { return self.poison() };
            if !(0.0..1.0).contains(&rate) {
                self.fail("dropout", format!("the rate {rate} is outside [0, 1)"));
                return self.poison();
            }
            if rate == 0.0 {
                return x;
            }
            let keep = self.bernoulli(key, 1.0 - rate, &t.shape);
            let scaled = self.mul_scalar(x, 1.0 / (1.0 - rate));
            self.select(keep, scaled, self.zeros_like(x))
        })
    }
}

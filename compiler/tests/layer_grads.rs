//! The decoder layers of the builder (RMSNorm, rotary embeddings, SwiGLU,
//! grouped-query attention) differentiated by `value_and_grad` and checked
//! against central finite differences in f64 on the reference interpreter,
//! as `grad_check.rs` checks every op's VJP.

use weft_compiler::autodiff::{value_and_grad, GradOptions};
use weft_ir::builder::{FunctionBuilder, Value};
use weft_ir::tensor::HostTensor;
use weft_ir::{DType, Module};

/// SplitMix64 values in `[lo, hi)`.
fn uniform(seed: &mut u64, lo: f64, hi: f64, n: usize) -> Vec<f64> {
    (0..n)
        .map(|_| {
            *seed = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = *seed;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            lo + (hi - lo) * ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
        })
        .collect()
}

/// Checks `loss = sum(layer(inputs) * w)` for a fixed random `w`.
fn check(name: &str, shapes: &[&[usize]], layer: impl Fn(&FunctionBuilder, &[Value]) -> Value) {
    let mut seed = 7u64;
    let f = FunctionBuilder::new("loss");
    let names: Vec<String> = (0..shapes.len()).map(|i| format!("x{i}")).collect();
    let xs: Vec<Value> = shapes.iter().zip(&names).map(|(s, n)| f.param(n, DType::F64, s)).collect();
    let out = layer(&f, &xs);
    let ot = f.ty(out);
    let w = f.dense(ot.clone(), uniform(&mut seed, -1.0, 1.0, ot.num_elements()));
    let loss = f.sum_all(f.mul(out, w));
    f.set_results(&[loss]);
    let func = f.finish().unwrap_or_else(|e| panic!("{name}: {e}"));
    let m = Module { functions: vec![func.clone()] };
    let wrt: Vec<&str> = names.iter().map(String::as_str).collect();
    let g = value_and_grad(&m, &func, &wrt, &GradOptions::default()).unwrap();
    let gm = Module { functions: vec![g.clone()] };
    weft_ir::verify_module(&gm).unwrap_or_else(|e| panic!("{name}: the gradient does not verify: {e}"));
    let vals: Vec<Vec<f64>> = shapes.iter().map(|s| uniform(&mut seed, -1.0, 1.0, s.iter().product())).collect();
    let tensors = |v: &[Vec<f64>]| -> Vec<HostTensor> {
        shapes.iter().zip(v).map(|(s, x)| HostTensor::from_f64(s, x.clone()).unwrap()).collect()
    };
    let outs = weft_ir::interp::run(&gm, &g.name, &tensors(&vals)).unwrap();
    let loss_at = |v: &[Vec<f64>]| weft_ir::interp::run(&m, "loss", &tensors(v)).unwrap()[0].to_f64_vec()[0];
    let h = 1e-6;
    let mut checked = 0;
    for (k, x) in vals.iter().enumerate() {
        let grad = outs[1 + k].to_f64_vec();
        for i in 0..x.len() {
            let (mut plus, mut minus) = (vals.clone(), vals.clone());
            plus[k][i] += h;
            minus[k][i] -= h;
            let fd = (loss_at(&plus) - loss_at(&minus)) / (2.0 * h);
            let err = (grad[i] - fd).abs() / fd.abs().max(1.0);
            assert!(err < 1e-6, "{name}: d/d{}[{i}]: autodiff {} vs finite difference {fd}", names[k], grad[i]);
            checked += 1;
        }
    }
    assert!(checked > 0);
}

#[test]
fn rms_norm_matches_finite_differences() {
    check("rms_norm", &[&[3, 8], &[8]], |f, x| f.rms_norm(x[0], Some(x[1]), -1, 1e-5));
}

#[test]
fn rotary_embedding_matches_finite_differences_and_rotates() {
    check("rotary_embedding", &[&[2, 2, 5, 4]], |f, x| f.rotary_embedding(x[0], 10000.0));
    // Position 0 is the identity; norms of each rotated pair are kept.
    let f = FunctionBuilder::new("rope");
    let x = f.param("x", DType::F64, &[3, 4]);
    let y = f.rotary_embedding(x, 100.0);
    f.set_results(&[y]);
    let m = Module { functions: vec![f.finish().unwrap()] };
    let xs: Vec<f64> = (0..12).map(|i| i as f64 * 0.25 - 1.0).collect();
    let out = weft_ir::interp::run(&m, "rope", &[HostTensor::from_f64(&[3, 4], xs.clone()).unwrap()]).unwrap();
    let y = out[0].to_f64_vec();
    assert_eq!(&y[..4], &xs[..4], "position 0 is not rotated");
    for p in 0..3 {
        for j in 0..2 {
            let (a, b) = (p * 4 + j, p * 4 + j + 2);
            let before = xs[a].hypot(xs[b]);
            assert!((y[a].hypot(y[b]) - before).abs() < 1e-12, "pair ({a}, {b}) keeps its norm");
        }
    }
}

#[test]
fn swiglu_matches_finite_differences() {
    check("swiglu", &[&[2, 3, 4], &[4, 6], &[4, 6], &[6, 4]], |f, x| f.swiglu(x[0], x[1], x[2], x[3]));
}

#[test]
fn grouped_query_attention_matches_finite_differences_and_repeats_heads() {
    // Four query heads over two key/value heads, causal.
    check("grouped_query_attention", &[&[1, 4, 3, 2], &[1, 2, 3, 2], &[1, 2, 3, 2]], |f, x| {
        f.grouped_query_attention(x[0], x[1], x[2], true)
    });
    // With the key/value heads repeated by hand it is multi-head attention.
    let f = FunctionBuilder::new("gqa");
    let q = f.param("q", DType::F64, &[1, 4, 3, 2]);
    let k = f.param("k", DType::F64, &[1, 2, 3, 2]);
    let v = f.param("v", DType::F64, &[1, 2, 3, 2]);
    let gqa = f.grouped_query_attention(q, k, v, true);
    let rep = |x| {
        f.concatenate(
            &[f.slice_axis(x, 1, 0, 1), f.slice_axis(x, 1, 0, 1), f.slice_axis(x, 1, 1, 2), f.slice_axis(x, 1, 1, 2)],
            1,
        )
    };
    let mha = f.dot_product_attention(q, rep(k), rep(v), true);
    f.set_results(&[gqa, mha]);
    let m = Module { functions: vec![f.finish().unwrap()] };
    let mut seed = 3;
    let t =
        |s: &[usize], seed: &mut u64| HostTensor::from_f64(s, uniform(seed, -1.0, 1.0, s.iter().product())).unwrap();
    let args = [t(&[1, 4, 3, 2], &mut seed), t(&[1, 2, 3, 2], &mut seed), t(&[1, 2, 3, 2], &mut seed)];
    let out = weft_ir::interp::run(&m, "gqa", &args).unwrap();
    assert_eq!(out[0].to_f64_vec(), out[1].to_f64_vec());
}

#[test]
fn mixture_of_experts_matches_finite_differences() {
    // Capacity 2 per expert and group for 12 assignments: some are dropped.
    for (k, factor) in [(2, 0.5), (1, 2.0)] {
        check("moe", &[&[2, 6, 4], &[4, 3], &[3, 4, 5], &[3, 5, 4]], |f, x| f.moe(x[0], x[1], x[2], x[3], k, factor).y);
        check("moe aux loss", &[&[2, 6, 4], &[4, 3], &[3, 4, 5], &[3, 5, 4]], |f, x| {
            f.moe(x[0], x[1], x[2], x[3], k, factor).aux_loss
        });
    }
}

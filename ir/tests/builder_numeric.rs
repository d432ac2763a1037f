//! Numeric checks of the builder's composites on the reference
//! interpreter: properties (softmax rows sum to 1, layer_norm gives zero
//! mean and unit variance), stability at extreme logits, and hand-computed
//! values (cross-entropy, gelu, matmul against a naive loop).

use weft_ir::builder::{FunctionBuilder, ModuleBuilder, Value};
use weft_ir::interp;
use weft_ir::tensor::HostTensor;
use weft_ir::DType::{F32, I32, U32};
use weft_ir::Module;

/// Finishes `f` with `results` and runs it on `args`.
fn run(f: FunctionBuilder, results: &[Value], args: &[HostTensor]) -> Vec<Vec<f64>> {
    f.set_results(results);
    let m = f.finish_module().unwrap_or_else(|e| panic!("{e}"));
    run_module(&m, args)
}

fn run_module(m: &Module, args: &[HostTensor]) -> Vec<Vec<f64>> {
    let name = &m.functions.last().unwrap().name;
    let out = interp::run(m, name, args).unwrap_or_else(|e| panic!("{e}"));
    out.iter().map(|t| t.to_f64_vec()).collect()
}

fn f32s(shape: &[usize], v: &[f32]) -> HostTensor {
    HostTensor::from_f32(shape, v.to_vec()).unwrap()
}

fn i32s(shape: &[usize], v: &[i32]) -> HostTensor {
    HostTensor::from_i32(shape, v.to_vec()).unwrap()
}

fn close(got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{got:?} vs {want:?}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= tol * (1.0 + w.abs()), "element {i}: got {g}, want {w} (all: {got:?})");
    }
}

#[test]
fn softmax_rows_sum_to_one() {
    let f = FunctionBuilder::new("sm");
    let x = f.param("x", F32, &[2, 3]);
    let s = f.softmax(x, -1);
    let r = run(f, &[s], &[f32s(&[2, 3], &[1.0, 2.0, 3.0, -5.0, 0.0, 5.0])]);
    close(&r[0][..3], &[0.09003057, 0.24472847, 0.66524096], 1e-6);
    for row in r[0].chunks(3) {
        close(&[row.iter().sum()], &[1.0], 1e-6);
    }
}

#[test]
fn log_softmax_and_logsumexp_are_stable() {
    let f = FunctionBuilder::new("ls");
    let x = f.param("x", F32, &[3, 2]);
    let ls = f.log_softmax(x, 1);
    let lse = f.logsumexp(x, &[-1], false);
    let sm = f.softmax(x, -1);
    let inf = f32::NEG_INFINITY;
    let r = run(f, &[ls, lse, sm], &[f32s(&[3, 2], &[1000.0, 1000.0, 1000.0, 0.0, inf, inf])]);
    let ln2 = std::f64::consts::LN_2;
    close(&r[0][..4], &[-ln2, -ln2, 0.0, -1000.0], 1e-6);
    close(&r[1][..2], &[1000.0 + ln2, 1000.0], 1e-6);
    assert_eq!(r[1][2], f64::NEG_INFINITY, "an all -inf row has logsumexp -inf, not NaN");
    close(&r[2][..4], &[0.5, 0.5, 1.0, 0.0], 1e-6);
}

#[test]
fn layer_norm_gives_zero_mean_unit_variance() {
    let f = FunctionBuilder::new("ln");
    let x = f.param("x", F32, &[2, 4]);
    let g = f.param("g", F32, &[4]);
    let b = f.param("b", F32, &[4]);
    let plain = f.layer_norm(x, None, None, -1, 1e-6);
    let affine = f.layer_norm(x, Some(g), Some(b), -1, 1e-6);
    let var = f.variance(plain, &[-1], false);
    let xs = [1.0, 2.0, 3.0, 4.0, -10.0, 0.0, 10.0, 20.0];
    let args = [f32s(&[2, 4], &xs), f32s(&[4], &[1.0, 2.0, 3.0, 4.0]), f32s(&[4], &[0.5, 0.5, 0.5, 0.5])];
    let r = run(f, &[plain, affine, var], &args);
    for row in r[0].chunks(4) {
        close(&[row.iter().sum::<f64>() / 4.0], &[0.0], 1e-6);
    }
    close(&r[2], &[1.0, 1.0], 1e-5);
    // Row 0 is [1,2,3,4]: mean 2.5, variance 1.25.
    let z: Vec<f64> = [1.0, 2.0, 3.0, 4.0].iter().map(|v| (v - 2.5) / 1.25f64.sqrt()).collect();
    close(&r[0][..4], &z, 1e-5);
    let want: Vec<f64> = z.iter().zip([1.0, 2.0, 3.0, 4.0]).map(|(z, g)| z * g + 0.5).collect();
    close(&r[1][..4], &want, 1e-5);
}

#[test]
fn cross_entropy_matches_hand_computation() {
    let f = FunctionBuilder::new("ce");
    let logits = f.param("logits", F32, &[2, 3]);
    let labels = f.param("labels", I32, &[2]);
    let ce = f.softmax_cross_entropy(logits, labels);
    let acc = f.accuracy(logits, labels);
    let r = run(f, &[ce, acc], &[f32s(&[2, 3], &[1.0, 2.0, 3.0, 1.0, 1.0, 1.0]), i32s(&[2], &[2, 1])]);
    // Row 0: lse(1,2,3) - 3 = ln(1 + e^-1 + e^-2) = 0.40760596; row 1: ln 3 = 1.09861229.
    close(&r[0], &[(0.40760596 + 1.09861229) / 2.0], 1e-6);
    // Row 0 predicts 2 (right); row 1 ties, argmax takes class 0 (wrong).
    close(&r[1], &[0.5], 0.0);
}

#[test]
fn cross_entropy_is_stable_for_huge_logits() {
    let f = FunctionBuilder::new("ce");
    let logits = f.param("logits", F32, &[1, 2]);
    let labels = f.param("labels", I32, &[1]);
    let ce = f.softmax_cross_entropy(logits, labels);
    let r = run(f, &[ce], &[f32s(&[1, 2], &[1000.0, 0.0]), i32s(&[1], &[1])]);
    close(&r[0], &[1000.0], 1e-6);
}

#[test]
fn gelu_sigmoid_softplus_at_points() {
    let f = FunctionBuilder::new("act");
    let x = f.param("x", F32, &[6]);
    let outs = [f.gelu(x), f.sigmoid(x), f.softplus(x), f.relu(x), f.silu(x)];
    let xs = [0.0f32, 1.0, -1.0, 3.0, -100.0, 100.0];
    let r = run(f, &outs, &[f32s(&[6], &xs)]);
    // tanh-approximation GELU: 0.5 x (1 + tanh(0.7978845608 (x + 0.044715 x^3))).
    close(&r[0][..4], &[0.0, 0.8411920, -0.1588080, 2.9963627], 1e-6);
    close(&r[0][4..], &[0.0, 100.0], 1e-6);
    close(&r[1][..3], &[0.5, 0.7310586, 0.2689414], 1e-6);
    close(&r[2][..3], &[std::f64::consts::LN_2, 1.3132616, 0.3132617], 1e-6);
    close(&r[2][4..], &[0.0, 100.0], 1e-6);
    close(&r[3], &[0.0, 1.0, 0.0, 3.0, 0.0, 100.0], 0.0);
    close(&r[4][..3], &[0.0, 0.7310586, -0.2689414], 1e-6);
}

/// Naive `[.., m, k] @ [.., k, n]` over equal batch shapes.
fn naive_matmul(a: &[f64], b: &[f64], batch: usize, m: usize, k: usize, n: usize) -> Vec<f64> {
    let mut out = vec![0.0; batch * m * n];
    for t in 0..batch {
        for i in 0..m {
            for j in 0..n {
                out[(t * m + i) * n + j] = (0..k).map(|p| a[(t * m + i) * k + p] * b[(t * k + p) * n + j]).sum();
            }
        }
    }
    out
}

#[test]
fn matmul_matches_a_naive_loop() {
    let seq = |n: usize, s: f32| (0..n).map(|i| (i as f32 * 0.37 + s).sin()).collect::<Vec<f32>>();
    let (a, b) = (seq(6, 0.1), seq(60, 0.7));
    let f = FunctionBuilder::new("mm");
    let x = f.param("a", F32, &[2, 3]);
    let y = f.param("b", F32, &[5, 3, 4]);
    let v = f.param("v", F32, &[3]);
    let outs = [f.matmul(x, y), f.matmul(x, v), f.matmul(v, y)];
    let r = run(f, &outs, &[f32s(&[2, 3], &a), f32s(&[5, 3, 4], &b), f32s(&[3], &a[..3])]);
    let (a64, b64): (Vec<f64>, Vec<f64>) =
        (a.iter().map(|&v| v as f64).collect(), b.iter().map(|&v| v as f64).collect());
    let tiled: Vec<f64> = (0..5).flat_map(|_| a64.clone()).collect();
    close(&r[0], &naive_matmul(&tiled, &b64, 5, 2, 3, 4), 1e-5);
    close(&r[1], &naive_matmul(&a64, &a64[..3], 1, 2, 3, 1), 1e-5);
    let row: Vec<f64> = (0..5).flat_map(|_| a64[..3].to_vec()).collect();
    close(&r[2], &naive_matmul(&row, &b64, 5, 1, 3, 4), 1e-5);
}

#[test]
fn broadcasting_values() {
    let f = FunctionBuilder::new("bc");
    let a = f.param("a", F32, &[3, 1]);
    let b = f.param("b", F32, &[4]);
    let s = f.add(a, b);
    let r = run(f, &[s], &[f32s(&[3, 1], &[0.0, 10.0, 20.0]), f32s(&[4], &[1.0, 2.0, 3.0, 4.0])]);
    close(&r[0], &[1.0, 2.0, 3.0, 4.0, 11.0, 12.0, 13.0, 14.0, 21.0, 22.0, 23.0, 24.0], 0.0);
}

#[test]
fn one_hot_embedding_and_argmax() {
    let f = FunctionBuilder::new("emb");
    let ids = f.param("ids", I32, &[3]);
    let table = f.param("table", F32, &[4, 2]);
    let x = f.param("x", F32, &[2, 3]);
    let outs = [f.one_hot(ids, 4, F32), f.embedding(ids, table), f.argmax(x, -1), f.argmin(x, 0)];
    let args = [
        i32s(&[3], &[2, 0, 9]),
        f32s(&[4, 2], &[0.0, 1.0, 10.0, 11.0, 20.0, 21.0, 30.0, 31.0]),
        f32s(&[2, 3], &[1.0, 5.0, 5.0, 7.0, 0.0, 7.0]),
    ];
    let r = run(f, &outs, &args);
    close(&r[0], &[0.0, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0], 0.0);
    close(&r[1], &[20.0, 21.0, 0.0, 1.0, 0.0, 0.0], 0.0);
    close(&r[2], &[1.0, 0.0], 0.0);
    close(&r[3], &[0.0, 1.0, 0.0], 0.0);
}

#[test]
fn reductions_and_mse() {
    let f = FunctionBuilder::new("red");
    let x = f.param("x", F32, &[2, 3]);
    let y = f.param("y", F32, &[2, 3]);
    let outs = [
        f.sum(x, &[0], true),
        f.mean(x, &[-1], false),
        f.variance(x, &[1], false),
        f.mse(x, y),
        f.max(x, &[0, 1], false),
    ];
    let r = run(
        f,
        &outs,
        &[f32s(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 6.0, 8.0]), f32s(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 6.0, 5.0])],
    );
    close(&r[0], &[5.0, 8.0, 11.0], 0.0);
    close(&r[1], &[2.0, 6.0], 1e-7);
    close(&r[2], &[2.0 / 3.0, 8.0 / 3.0], 1e-6);
    close(&r[3], &[9.0 / 6.0], 1e-7);
    close(&r[4], &[8.0], 0.0);
}

#[test]
fn causal_attention_first_query_sees_only_first_key() {
    let f = FunctionBuilder::new("att");
    let q = f.param("q", F32, &[3, 2]);
    let k = f.param("k", F32, &[3, 2]);
    let v = f.param("v", F32, &[3, 2]);
    let o = f.dot_product_attention(q, k, v, true);
    let qs = [0.3, -1.0, 2.0, 0.5, 1.0, 1.0];
    let vs = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
    let r = run(f, &[o], &[f32s(&[3, 2], &qs), f32s(&[3, 2], &qs), f32s(&[3, 2], &vs)]);
    close(&r[0][..2], &[1.0, 2.0], 1e-6);
    // Query 1 sees keys 0 and 1 with weights softmax(q1.k0, q1.k1) / sqrt(2).
    let s = [(2.0 * 0.3 - 0.5) / 2f64.sqrt(), (4.0 + 0.25) / 2f64.sqrt()];
    let w1 = 1.0 / (1.0 + (s[0] - s[1]).exp());
    close(&r[0][2..4], &[(1.0 - w1) * 1.0 + w1 * 3.0, (1.0 - w1) * 2.0 + w1 * 4.0], 1e-5);
}

#[test]
fn dropout_zeroes_or_scales() {
    let f = FunctionBuilder::new("drop");
    let x = f.param("x", F32, &[1000]);
    let key = f.param("key", U32, &[2]);
    let d = f.dropout(x, key, 0.25);
    let r = run(f, &[d], &[f32s(&[1000], &[3.0; 1000]), HostTensor::from_u32(&[2], vec![0, 42]).unwrap()]);
    assert!(r[0].iter().all(|&v| v == 0.0 || v == 4.0), "{:?}", &r[0][..10]);
    let kept = r[0].iter().filter(|&&v| v != 0.0).count();
    assert!((650..850).contains(&kept), "kept {kept} of 1000 at rate 0.25");
}

#[test]
fn module_calls_and_late_params_run() {
    let mut mb = ModuleBuilder::new();
    mb.define("affine", |f| {
        let x = f.param("x", F32, &[2]);
        let y = f.mul_scalar(x, 2.0);
        let b = f.param("b", F32, &[2]); // declared after an instruction
        vec![f.add(y, b)]
    });
    mb.define("main", |f| {
        let x = f.param("x", F32, &[2]);
        let [y] = f.call_n("affine", &[x, f.ones(F32, &[2])]);
        vec![f.sum_all(y)]
    });
    let m = mb.finish().unwrap();
    close(&run_module(&m, &[f32s(&[2], &[1.0, 2.0])])[0], &[8.0], 0.0);
}

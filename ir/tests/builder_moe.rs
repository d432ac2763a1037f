//! The mixture-of-experts layer on the interpreter against a direct
//! implementation of its routing (softmax router, top-k with ties to the
//! lower expert, gates normalised over the chosen, GShard's priority:
//! first choices before second, then token order; capacity per expert and
//! group; GELU MLPs), and its metrics.

use weft_ir::builder::{moe_capacity, FunctionBuilder};
use weft_ir::tensor::HostTensor;
use weft_ir::{interp, DType, Module};

fn values(seed: &mut u64, n: usize) -> Vec<f64> {
    (0..n)
        .map(|_| {
            *seed ^= *seed << 13;
            *seed ^= *seed >> 7;
            *seed ^= *seed << 17;
            (*seed >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
        })
        .collect()
}

fn gelu(x: f64) -> f64 {
    // The builder's tanh approximation.
    0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())
}

struct Reference {
    y: Vec<f64>,
    dropped: f64,
    load: Vec<f64>,
    aux: f64,
}

#[allow(clippy::too_many_arguments)]
fn reference(x: &[f64], r: &[f64], w1: &[f64], w2: &[f64], dims: [usize; 5], k: usize, cap: usize) -> Reference {
    let [g, s, c, e, h] = dims;
    let mut y = vec![0.0; g * s * c];
    let (mut kept, mut load, mut mean_prob) = (0usize, vec![0.0; e], vec![0.0; e]);
    for gi in 0..g {
        let tok = |si: usize| &x[(gi * s + si) * c..][..c];
        let mut choices = vec![]; // per token: (expert, gate), best first
        for si in 0..s {
            let logits: Vec<f64> = (0..e).map(|ei| (0..c).map(|ci| tok(si)[ci] * r[ci * e + ei]).sum()).collect();
            let m = logits.iter().cloned().fold(f64::MIN, f64::max);
            let z: f64 = logits.iter().map(|l| (l - m).exp()).sum();
            let p: Vec<f64> = logits.iter().map(|l| (l - m).exp() / z).collect();
            for ei in 0..e {
                mean_prob[ei] += p[ei] / (g * s) as f64;
            }
            let mut order: Vec<usize> = (0..e).collect();
            order.sort_by(|&a, &b| p[b].partial_cmp(&p[a]).unwrap());
            let total: f64 = order[..k].iter().map(|&ei| p[ei]).sum();
            choices.push(order[..k].iter().map(|&ei| (ei, p[ei] / total)).collect::<Vec<_>>());
        }
        let mut filled = vec![0usize; e];
        for j in 0..k {
            for (si, chosen) in choices.iter().enumerate() {
                let (ei, gate) = chosen[j];
                load[ei] += 1.0 / (g * s * k) as f64;
                if filled[ei] == cap {
                    continue;
                }
                filled[ei] += 1;
                kept += 1;
                let hid: Vec<f64> =
                    (0..h).map(|hi| gelu((0..c).map(|ci| tok(si)[ci] * w1[(ei * c + ci) * h + hi]).sum())).collect();
                for ci in 0..c {
                    let o: f64 = (0..h).map(|hi| hid[hi] * w2[(ei * h + hi) * c + ci]).sum();
                    y[(gi * s + si) * c + ci] += gate * o;
                }
            }
        }
    }
    let aux = e as f64 * (0..e).map(|ei| load[ei] * mean_prob[ei]).sum::<f64>();
    Reference { y, dropped: 1.0 - kept as f64 / (g * s * k) as f64, load, aux }
}

#[test]
fn the_layer_routes_drops_and_combines_as_specified() {
    let (g, s, c, e, h) = (2, 7, 4, 3, 5);
    for (k, factor) in [(2, 0.5), (1, 1.0), (3, 4.0)] {
        let mut seed = 0x5eed + k as u64;
        let (x, r, w1, w2) = (
            values(&mut seed, g * s * c),
            values(&mut seed, c * e),
            values(&mut seed, e * c * h),
            values(&mut seed, e * h * c),
        );
        let f = FunctionBuilder::new("moe");
        let ps = [("x", vec![g, s, c]), ("r", vec![c, e]), ("w1", vec![e, c, h]), ("w2", vec![e, h, c])];
        let vs: Vec<_> = ps.iter().map(|(n, sh)| f.param(n, DType::F64, sh)).collect();
        let out = f.moe(vs[0], vs[1], vs[2], vs[3], k, factor);
        f.set_results(&[out.y, out.aux_loss, out.dropped, out.load]);
        let m = Module { functions: vec![f.finish().unwrap()] };
        let args: Vec<HostTensor> = [&x, &r, &w1, &w2]
            .iter()
            .zip(&ps)
            .map(|(v, (_, sh))| HostTensor::from_f64(sh, v.to_vec()).unwrap())
            .collect();
        let got = interp::run(&m, "moe", &args).unwrap();
        let cap = moe_capacity(s, e, k, factor);
        let want = reference(&x, &r, &w1, &w2, [g, s, c, e, h], k, cap);
        let close = |a: &[f64], b: &[f64], what: &str| {
            assert_eq!(a.len(), b.len());
            for (i, (p, q)) in a.iter().zip(b).enumerate() {
                assert!((p - q).abs() <= 1e-12 * q.abs().max(1.0), "k={k}: {what}[{i}]: {p} vs {q}");
            }
        };
        close(&got[0].to_f64_vec(), &want.y, "y");
        close(&got[1].to_f64_vec(), &[want.aux], "aux_loss");
        close(&got[2].to_f64_vec(), &[want.dropped], "dropped");
        close(&got[3].to_f64_vec(), &want.load, "load");
        // The cases cover dropping and not dropping.
        if factor < 1.0 {
            assert!(want.dropped > 0.0, "k={k}: dropped {}", want.dropped);
        }
        if cap >= s {
            assert_eq!(want.dropped, 0.0, "k={k}");
        }
    }
}

#[test]
fn bad_shapes_and_choices_are_named_errors() {
    let f = FunctionBuilder::new("moe");
    let x = f.param("x", DType::F32, &[2, 4, 8]);
    let r = f.param("r", DType::F32, &[8, 4]);
    let w1 = f.param("w1", DType::F32, &[4, 8, 16]);
    let bad = f.param("bad", DType::F32, &[4, 16, 4]);
    let _ = f.moe(x, r, w1, bad, 2, 1.0);
    let e = f.finish().unwrap_err().to_string();
    assert!(e.contains("needs x[G, S, C], router[C, E], w1[E, C, H] and w2[E, H, C]"), "{e}");
    let f = FunctionBuilder::new("moe");
    let (x, r, w1, w2) = (
        f.param("x", DType::F32, &[2, 4, 8]),
        f.param("r", DType::F32, &[8, 4]),
        f.param("w1", DType::F32, &[4, 8, 16]),
        f.param("w2", DType::F32, &[4, 16, 8]),
    );
    let _ = f.moe(x, r, w1, w2, 5, 1.0);
    let e = f.finish().unwrap_err().to_string();
    assert!(e.contains("1 <= top_k <= experts (4)"), "{e}");
}

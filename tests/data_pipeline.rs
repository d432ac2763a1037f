//! The `[data]` pipeline: batches are a pure function of (seed, epoch,
//! step) — the same with any prefetch depth, on any mesh and after a resume
//! — the shuffle is a permutation per epoch, random windows cover the
//! stream uniformly, and a run evaluates its validation split.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use weft::data::{concat_rows, input_specs, DataConfig, DataPath, Order, Sampler, Split};
use weft::ir::tensor::{write_safetensors, HostTensor};
use weft::ir::{DType, TensorType};
use weft::runner::{run_session, Overrides, RunConfig, RunSummary};
use weft::Error;

/// A fresh scratch directory, unique per call: tests run in parallel in one
/// process, and two of them sharing `gpt` data must not delete each
/// other's files.
fn dir(name: &str) -> PathBuf {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let k = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let d = std::env::temp_dir().join(format!("weft-data-{name}-{}-{k}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A token stream with structure a model can learn: `t_{i+1} = (3 t_i + 1
/// + noise) mod 32`, the noise from a fixed xorshift.
fn token_file(path: &Path, n: usize) {
    let mut x = 0x1234_5678u64;
    let mut t = 0u16;
    let mut bytes = Vec::with_capacity(2 * n);
    for _ in 0..n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        t = (3 * t + 1 + (x % 3 == 0) as u16) % 32;
        bytes.extend_from_slice(&t.to_le_bytes());
    }
    std::fs::write(path, bytes).unwrap();
}

/// An MLP table of `n` examples (x: f32[n, 4], y = tanh(x) rolled).
fn mlp_table(path: &Path, n: usize) {
    let xs: Vec<f32> = (0..n * 4).map(|i| ((i * 37 % 101) as f32 / 50.0) - 1.0).collect();
    let ys: Vec<f32> = (0..n * 4).map(|i| xs[(i / 4) * 4 + (i + 1) % 4].tanh()).collect();
    let t = BTreeMap::from([
        ("x".to_string(), HostTensor::from_f32(&[n, 4], xs).unwrap()),
        ("y".to_string(), HostTensor::from_f32(&[n, 4], ys).unwrap()),
    ]);
    write_safetensors(path, &t).unwrap();
}

fn gpt_config(d: &Path, steps: u64, prefetch: usize) -> String {
    format!(
        r#"
steps = {steps}
seed = 5
[model]
kind = "gpt"
vocab = 32
seq = 8
d_model = 16
heads = 2
layers = 1
batch = 8
[optimizer]
kind = "adamw"
lr = 0.01
[data]
source = "tokens"
train = "{0}/train.bin"
val = "{0}/val.bin"
prefetch = {prefetch}
eval_every = 3
eval_batches = 2
"#,
        d.display()
    )
}

fn mlp_config(d: &Path, steps: u64) -> String {
    format!(
        r#"
steps = {steps}
seed = 9
[model]
kind = "mlp"
layers = 1
d = 4
h = 8
batch = 8
[optimizer]
kind = "sgd"
lr = 0.05
[data]
source = "table"
train = "{0}/train.safetensors"
val = "{0}/val.safetensors"
eval_every = 2
eval_batches = 1
"#,
        d.display()
    )
}

fn run(config: &str, mesh: &str, strategy: &str, ov: Overrides) -> Result<RunSummary, Error> {
    let mut c = RunConfig::from_toml(config).unwrap();
    c.mesh = Some(mesh.into());
    c.strategy = Some(strategy.into());
    let c = ov.apply(c);
    run_session(&c, &Overrides { quiet: true, ..ov }, &mut |_| {})
}

/// Every metric but the measured wait, as bits.
fn bits(s: &RunSummary) -> Vec<(u64, Vec<(String, u64)>)> {
    let all = s.metrics.iter().chain(&s.evals);
    all.map(|(step, m)| {
        (*step, m.iter().filter(|(k, _)| *k != "data_wait_ms").map(|(k, v)| (k.clone(), v.to_bits())).collect())
    })
    .collect()
}

fn gpt_data() -> PathBuf {
    let d = dir("gpt");
    token_file(&d.join("train.bin"), 4000);
    token_file(&d.join("val.bin"), 600);
    d
}

#[test]
fn prefetch_depth_changes_nothing_but_the_wait() {
    let d = gpt_data();
    let a = run(&gpt_config(&d, 7, 0), "data=2", "dp", Overrides::default()).unwrap();
    let b = run(&gpt_config(&d, 7, 4), "data=2", "dp", Overrides::default()).unwrap();
    assert_eq!(a.metrics.len(), 7);
    assert!(a.metrics.iter().all(|(_, m)| m.contains_key("data_wait_ms") && m.contains_key("accuracy")));
    // Evaluated before steps 0, 3, 6 and after the last.
    assert_eq!(a.evals.iter().map(|e| e.0).collect::<Vec<_>>(), vec![0, 3, 6, 7]);
    assert!(a.evals.iter().all(|(_, m)| m.contains_key("val_loss") && m.contains_key("val_accuracy")));
    assert_eq!(bits(&a), bits(&b));
    assert_eq!(a.batch_digests, b.batch_digests);
    // Different steps read different batches.
    assert_eq!(a.batch_digests.len(), 7);
    assert!(a.batch_digests.windows(2).all(|w| w[0] != w[1]));
    let _ = std::fs::remove_dir_all(d);
}

#[test]
fn every_mesh_reads_the_same_batches() {
    let d = gpt_data();
    let one = run(&gpt_config(&d, 5, 2), "data=1", "none", Overrides::default()).unwrap();
    for (mesh, strategy) in [("data=8", "dp"), ("data=2,model=4", "tp"), ("data=2,model=4", "fsdp_tp")] {
        let got = run(&gpt_config(&d, 5, 2), mesh, strategy, Overrides::default()).unwrap();
        // The batches are bitwise the same ...
        assert_eq!(got.batch_digests, one.batch_digests, "{strategy} on {mesh}");
        // ... and the numbers equal up to the order of the partitioned
        // reductions (the sums run in another order on another mesh;
        // `mesh_invariant = true` makes them bitwise equal, tested below).
        let (x, y) = (bits(&got), bits(&one));
        assert_eq!(x.len(), y.len());
        for ((s, a), (_, b)) in x.iter().zip(&y) {
            for ((k, va), (_, vb)) in a.iter().zip(b) {
                let (va, vb) = (f64::from_bits(*va), f64::from_bits(*vb));
                assert!(
                    (va - vb).abs() <= 1e-5 * vb.abs().max(1e-3),
                    "{strategy} on {mesh}: step {s} {k}: {va} vs {vb}"
                );
            }
        }
    }
    let _ = std::fs::remove_dir_all(d);
}

#[test]
fn mesh_invariant_sums_give_the_same_bits_on_every_mesh() {
    let d = gpt_data();
    let config = format!("mesh_invariant = true\n{}", gpt_config(&d, 5, 2));
    let one = run(&config, "data=1", "none", Overrides::default()).unwrap();
    for (mesh, strategy) in [
        ("data=2", "dp"),
        ("data=8", "dp"),
        ("data=2,model=4", "tp"),
        ("data=2,model=4", "fsdp_tp"),
        ("data=4", "fsdp"),
        ("data=8", "zero3"),
    ] {
        let got = run(&config, mesh, strategy, Overrides::default()).unwrap();
        assert_eq!(got.batch_digests, one.batch_digests, "{strategy} on {mesh}");
        assert_eq!(bits(&got), bits(&one), "{strategy} on {mesh}");
    }
    // Without it the meshes differ in the last bits (the test above
    // bounds by how much): the option is what makes them equal.
    let plain = run(&gpt_config(&d, 5, 2), "data=8", "dp", Overrides::default()).unwrap();
    let plain_one = run(&gpt_config(&d, 5, 2), "data=1", "none", Overrides::default()).unwrap();
    assert_ne!(bits(&plain), bits(&plain_one));
    let _ = std::fs::remove_dir_all(d);
}

#[test]
fn mesh_invariant_sums_hold_for_the_mlp_and_refuse_bad_settings() {
    let d = dir("invariant-mlp");
    mlp_table(&d.join("train.safetensors"), 64);
    mlp_table(&d.join("val.safetensors"), 8);
    let config = format!("mesh_invariant = true\nsum_chunks = 4\n{}", mlp_config(&d, 6));
    let one = run(&config, "data=1", "none", Overrides::default()).unwrap();
    for (mesh, strategy) in
        [("data=4", "dp"), ("data=1,model=2", "tp"), ("data=2,model=2", "tp"), ("data=4", "fsdp"), ("data=2", "zero2")]
    {
        let got = run(&config, mesh, strategy, Overrides::default()).unwrap();
        assert_eq!(bits(&got), bits(&one), "{strategy} on {mesh}");
    }
    // The flag is the config key.
    let flag = Overrides { mesh_invariant: true, ..Overrides::default() };
    let by_flag = run(&format!("sum_chunks = 4\n{}", mlp_config(&d, 6)), "data=4", "dp", flag).unwrap();
    assert_eq!(bits(&by_flag), bits(&one));
    let bad = |head: &str, tail: &str| {
        run(&format!("{head}\n{}{tail}", mlp_config(&d, 2)), "data=1", "none", Overrides::default())
    };
    for (head, tail, key, why) in [
        ("mesh_invariant = true\nsum_chunks = 6", "", "sum_chunks", "power of two"),
        ("sum_chunks = 8", "", "sum_chunks", "needs `mesh_invariant = true`"),
        ("mesh_invariant = true", "[pipeline]\nstages = 1\n", "mesh_invariant", "[pipeline]"),
    ] {
        let e = bad(head, tail).unwrap_err().to_string();
        assert!(e.contains(key) && e.contains(why), "{head} {tail}: {e}");
    }
    let _ = std::fs::remove_dir_all(d);
}

#[test]
fn a_run_resumed_mid_epoch_equals_the_uninterrupted_run() {
    let d = dir("resume");
    // 20 examples, batches of 8: epochs end mid-step (after 2.5 steps).
    mlp_table(&d.join("train.safetensors"), 20);
    mlp_table(&d.join("val.safetensors"), 8);
    let config = mlp_config(&d, 9);
    let full = run(&config, "data=2", "dp", Overrides::default()).unwrap();
    let ck = |steps, resume| Overrides {
        steps: Some(steps),
        checkpoint_dir: Some(d.join("ckpt")),
        checkpoint_every: Some(3),
        resume,
        ..Default::default()
    };
    let first = run(&config, "data=2", "dp", ck(3, false)).unwrap();
    // Resumed at step 3: example 24 of the stream, epoch 1 position 4.
    let second = run(&config, "data=2", "dp", ck(9, true)).unwrap();
    assert_eq!(second.metrics.first().map(|m| m.0), Some(3), "resumed at step 3");
    let mut metrics = first.metrics.clone();
    metrics.extend(second.metrics.clone());
    // The first run's evaluation after its last step (3) is not one of
    // the uninterrupted run's (3 is not a multiple of eval_every = 2).
    let mut evals: Vec<_> = first.evals.iter().filter(|e| e.0 < 3).cloned().collect();
    evals.extend(second.evals.clone());
    let joined = RunSummary { metrics, evals, ..full.clone() };
    assert_eq!(bits(&joined), bits(&full));
    let mut digests = first.batch_digests.clone();
    digests.extend(&second.batch_digests);
    assert_eq!(digests, full.batch_digests);
    let _ = std::fs::remove_dir_all(d);
}

#[test]
fn resuming_onto_other_data_is_refused_and_nothing_is_lost() {
    let d = dir("changed");
    mlp_table(&d.join("train.safetensors"), 20);
    mlp_table(&d.join("val.safetensors"), 8);
    let config = mlp_config(&d, 6);
    let metrics = d.join("metrics.jsonl");
    let ov = |steps, resume| Overrides {
        steps: Some(steps),
        checkpoint_dir: Some(d.join("ckpt")),
        metrics: Some(metrics.clone()),
        resume,
        ..Default::default()
    };
    run(&config, "data=1", "none", ov(3, false)).unwrap();
    let before = std::fs::read(&metrics).unwrap();
    // Other contents in the same file.
    mlp_table(&d.join("train.safetensors"), 24);
    let e = run(&config, "data=1", "none", ov(6, true)).unwrap_err();
    assert!(matches!(e, Error::DataChanged(_)), "{e}");
    assert!(e.to_string().contains("trained on other data"), "{e}");
    // Another seed draws other batches: also other data.
    mlp_table(&d.join("train.safetensors"), 20);
    let e = run(&config, "data=1", "none", Overrides { seed: Some(10), ..ov(6, true) }).unwrap_err();
    assert!(matches!(e, Error::DataChanged(_)), "{e}");
    // A run without [data] may not continue it either.
    let synthetic = config.split("[data]").next().unwrap().to_string();
    let e = run(&synthetic, "data=1", "none", ov(6, true)).unwrap_err();
    assert!(matches!(e, Error::DataChanged(_)) && e.to_string().contains("no [data] table"), "{e}");
    // Nothing was lost: the metrics and the checkpoint are as they were,
    // and with the original data the run resumes.
    assert_eq!(std::fs::read(&metrics).unwrap(), before);
    let s = run(&config, "data=1", "none", ov(6, true)).unwrap();
    assert_eq!(s.metrics.first().map(|m| m.0), Some(3));
    let _ = std::fs::remove_dir_all(d);
}

#[test]
fn a_checkpoint_without_data_cannot_continue_with_data() {
    let d = dir("nodata");
    mlp_table(&d.join("train.safetensors"), 20);
    mlp_table(&d.join("val.safetensors"), 8);
    let config = mlp_config(&d, 4);
    let ov = |steps, resume| Overrides {
        steps: Some(steps),
        checkpoint_dir: Some(d.join("ckpt")),
        resume,
        ..Default::default()
    };
    let synthetic = config.split("[data]").next().unwrap().to_string();
    run(&synthetic, "data=1", "none", ov(2, false)).unwrap();
    let e = run(&config, "data=1", "none", ov(4, true)).unwrap_err();
    assert!(matches!(e, Error::DataChanged(_)) && e.to_string().contains("without a [data] dataset"), "{e}");
    let _ = std::fs::remove_dir_all(d);
}

#[test]
fn validation_loss_falls_on_a_learnable_stream() {
    let d = gpt_data();
    let s = run(&gpt_config(&d, 30, 2), "data=1", "none", Overrides::default()).unwrap();
    let first = s.evals.first().unwrap().1["val_loss"];
    let last = s.evals.last().unwrap().1["val_loss"];
    assert_eq!(s.evals.last().unwrap().0, 30);
    assert!(last < 0.8 * first, "val_loss {first} -> {last}");
    let _ = std::fs::remove_dir_all(d);
}

fn cfg(source: &str, train: &Path) -> DataConfig {
    DataConfig {
        source: source.into(),
        train: DataPath::File(train.to_path_buf()),
        val: None,
        dtype: "u16".into(),
        shuffle: true,
        prefetch: 0,
        eval_every: 0,
        eval_batches: 1,
    }
}

#[test]
fn blocks_read_separately_equal_the_batch() {
    let d = dir("blocks");
    token_file(&d.join("t.bin"), 1000);
    mlp_table(&d.join("m.safetensors"), 30);
    let gpt = [
        ("tokens".to_string(), TensorType::new(DType::I32, vec![8, 8])),
        ("targets".to_string(), TensorType::new(DType::I32, vec![8, 8])),
    ];
    let mlp = [
        ("x".to_string(), TensorType::new(DType::F32, vec![8, 4])),
        ("y".to_string(), TensorType::new(DType::F32, vec![8, 4])),
    ];
    let splits = [
        Split::open(
            &cfg("tokens", &d.join("t.bin")),
            &cfg("tokens", &d.join("t.bin")).train,
            "data.train",
            &input_specs(&gpt, &vocab(32)),
            1,
            Order::Shuffled,
        )
        .unwrap(),
        Split::open(
            &cfg("table", &d.join("m.safetensors")),
            &cfg("table", &d.join("m.safetensors")).train,
            "data.train",
            &input_specs(&mlp, &Default::default()),
            1,
            Order::Shuffled,
        )
        .unwrap(),
    ];
    for split in &splits {
        for step in [0u64, 3, 11] {
            let whole = split.batch(step).unwrap();
            // The data-axis blocks of data=8, data=2 and data=4.
            for parts in [8usize, 2, 4] {
                let rows = 8 / parts;
                let blocks: Vec<_> = (0..parts).map(|i| split.rows(step, i * rows..(i + 1) * rows).unwrap()).collect();
                let joined = concat_rows(&blocks).unwrap();
                for (name, t) in &whole {
                    assert!(joined[name].bitwise_eq(t), "{name} step {step} in {parts} blocks");
                }
            }
        }
    }
    // Targets are the tokens shifted by one within each window.
    let b = splits[0].batch(2).unwrap();
    let (t, y) = (b["tokens"].to_f64_vec(), b["targets"].to_f64_vec());
    for r in 0..8 {
        assert_eq!(t[r * 8 + 1..r * 8 + 8], y[r * 8..r * 8 + 7]);
    }
    let _ = std::fs::remove_dir_all(d);
}

#[test]
fn the_shuffle_is_a_permutation_every_epoch() {
    // 37 examples in batches of 5: epochs end mid-batch.
    let n = 37u64;
    let s = Sampler::table(11, Order::Shuffled, 5, n);
    let stream: Vec<u64> = (0..40).flat_map(|step| s.examples(step, 0..5)).collect();
    let mut orders = Vec::new();
    for epoch in stream.chunks(n as usize).filter(|c| c.len() == n as usize) {
        let mut sorted = epoch.to_vec();
        sorted.sort();
        assert_eq!(sorted, (0..n).collect::<Vec<_>>(), "every example exactly once per epoch");
        orders.push(epoch.to_vec());
    }
    assert_eq!(orders.len(), 5);
    assert!(orders.windows(2).all(|w| w[0] != w[1]), "each epoch has its own order");
    assert_ne!(orders[0], (0..n).collect::<Vec<_>>(), "shuffled");
    // In order without shuffling.
    let seq = Sampler::table(11, Order::Sequential, 5, n);
    assert_eq!(seq.examples(8, 0..5), vec![3, 4, 5, 6, 7]);
    // Another seed, another order.
    assert_ne!(Sampler::table(12, Order::Shuffled, 5, n).examples(0, 0..5), s.examples(0, 0..5));
}

#[test]
fn random_windows_cover_the_stream_uniformly() {
    // Window starts over 10000 - 16 = 9984 positions in 48 buckets of 208:
    // Pearson's chi-square over 200000 windows with a fixed seed. With 47
    // degrees of freedom the statistic has mean 47 and sd 9.7; 100 is
    // exceeded with probability below 1e-5 for a uniform sampler.
    let (tokens, seq, batch) = (10_000u64, 16usize, 8usize);
    let s = Sampler::windows(3, Order::Shuffled, batch, tokens, seq);
    let starts = tokens - seq as u64;
    let buckets = 48u64;
    let mut counts = vec![0u64; buckets as usize];
    let steps = 25_000u64;
    for step in 0..steps {
        for w in s.examples(step, 0..batch) {
            assert!(w < starts, "window {w} runs past the stream");
            counts[(w * buckets / starts) as usize] += 1;
        }
    }
    let total = (steps * batch as u64) as f64;
    let expected = total / buckets as f64;
    let chi2: f64 = counts.iter().map(|&c| (c as f64 - expected).powi(2) / expected).sum();
    assert!(chi2 < 100.0, "chi-square {chi2} over {buckets} buckets: {counts:?}");
    // Both ends of the stream are reachable.
    let all: Vec<u64> = (0..steps).flat_map(|st| s.examples(st, 0..batch)).collect();
    assert_eq!(*all.iter().min().unwrap(), 0);
    assert_eq!(*all.iter().max().unwrap(), starts - 1);
    // In order, windows tile the stream.
    let seqw = Sampler::windows(3, Order::Sequential, batch, tokens, seq);
    assert_eq!(seqw.examples(0, 0..3), vec![0, 16, 32]);
}

/// The metrics file without the measured waits, line by line.
fn metrics_lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| {
            let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
            v.as_object_mut().unwrap().remove("data_wait_ms");
            v.to_string()
        })
        .collect()
}

#[test]
fn weft_train_resumed_mid_epoch_writes_the_uninterrupted_metrics_file() {
    let d = dir("cli-resume");
    mlp_table(&d.join("train.safetensors"), 20);
    mlp_table(&d.join("val.safetensors"), 8);
    std::fs::write(d.join("c.toml"), mlp_config(&d, 9)).unwrap();
    let train = |metrics: &str, extra: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_weft"))
            .arg("train")
            .arg(d.join("c.toml"))
            .args(["-q", "--mesh", "data=2", "--strategy", "dp", "--metrics"])
            .arg(d.join(metrics))
            .args(extra)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    train("full.jsonl", &[]);
    let full = metrics_lines(&d.join("full.jsonl"));
    assert_eq!(full.len(), 10, "9 steps and the final evaluation");
    // Stopped after 4 or 5 steps and resumed: 20 examples per epoch, 8 per
    // step, so step 4 starts at epoch 1 position 12 (mid-epoch), step 5 at
    // epoch 2 position 0.
    for stop in [4u64, 5] {
        let ckpt = d.join(format!("ckpt{stop}")).display().to_string();
        let metrics = format!("resumed{stop}.jsonl");
        train(&metrics, &["--steps", &stop.to_string(), "--checkpoint-dir", &ckpt]);
        let out = train(&metrics, &["--checkpoint-dir", &ckpt, "--resume"]);
        assert!(out.contains(&format!("resuming from step {stop}")), "{out}");
        assert_eq!(metrics_lines(&d.join(&metrics)), full, "stopped at {stop}");
    }
    let _ = std::fs::remove_dir_all(d);
}

/// The ranges of the GPT's token inputs.
fn vocab(v: u64) -> std::collections::BTreeMap<String, u64> {
    [("tokens".to_string(), v), ("targets".to_string(), v)].into()
}

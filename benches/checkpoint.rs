//! Benchmark: checkpoint save and restore throughput for a 100M-parameter
//! f32 state (8 leaves of 12.5M elements, 400 MB), sync and async.
//!
//! Run with `cargo bench --bench checkpoint`; results go in BENCHMARKS.md.
//! Each measurement is repeated (default 3 times, `WEFT_BENCH_RUNS` to
//! change) into a fresh step; the median and best are printed. Every save
//! includes encoding, sha256, writing and fsyncing every file and the
//! commit rename; every restore includes reading and checking the sha256 of
//! every file. "Blocked" is the time `save_async` keeps the training loop
//! waiting (the copy of the state); "total" runs until the commit.
//! The checkpoint directory is under the system temporary directory
//! (`TMPDIR` to change).

use std::time::{Duration, Instant};
use weft::checkpoint::{CheckpointManager, CheckpointOptions, CheckpointState, MeshSpec, RestoreTarget};
use weft::ir::tensor::HostTensor;
use weft::ir::TensorSharding;

const LEAVES: usize = 8;
const ELEMENTS: usize = 12_500_000;

fn leaf(seed: usize) -> HostTensor {
    let data: Vec<f32> = (0..ELEMENTS).map(|i| ((i * 31 + seed * 7) % 1000) as f32 * 0.001).collect();
    HostTensor::from_f32(&[ELEMENTS / 1000, 1000], data).unwrap()
}

fn summary(label: &str, times: &[Duration], bytes: f64) {
    let mut t: Vec<f64> = times.iter().map(|d| d.as_secs_f64()).collect();
    t.sort_by(f64::total_cmp);
    let median = t[t.len() / 2];
    println!(
        "{label:<44} median {:>8.1} ms  best {:>8.1} ms  {:>7.0} MB/s (median)",
        median * 1e3,
        t[0] * 1e3,
        bytes / 1e6 / median
    );
}

fn main() {
    let runs: usize = std::env::var("WEFT_BENCH_RUNS").ok().and_then(|s| s.parse().ok()).unwrap_or(3);
    let dir = tempfile::tempdir().expect("temporary directory");
    let options = CheckpointOptions::default();
    println!(
        "checkpoint benchmark: {LEAVES} leaves x {ELEMENTS} f32 = {} MB, {} threads, {runs} runs, in {}",
        LEAVES * ELEMENTS * 4 / 1_000_000,
        options.threads,
        dir.path().display()
    );
    let single = CheckpointState::from_tree((0..LEAVES).map(|i| (format!("params.layer{i}.w"), leaf(i))).collect());
    let bytes = (LEAVES * ELEMENTS * 4) as f64;
    let mut m = CheckpointManager::open(dir.path(), options).unwrap();
    let mut step = 0;

    let mut saves = Vec::new();
    for _ in 0..runs {
        step += 1;
        let t = Instant::now();
        m.save(step, &single).unwrap();
        saves.push(t.elapsed());
    }
    summary("save, sync, 1 device", &saves, bytes);

    let (mut blocked, mut total) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        step += 1;
        let t = Instant::now();
        m.save_async(step, &single).unwrap();
        blocked.push(t.elapsed());
        m.wait().unwrap();
        total.push(t.elapsed());
    }
    summary("save, async, 1 device: training loop blocked", &blocked, bytes);
    summary("save, async, 1 device: until committed", &total, bytes);

    let target = RestoreTarget::like_state(&single);
    let mut restores = Vec::new();
    for _ in 0..runs {
        let t = Instant::now();
        let r = m.restore(None, &target).unwrap();
        restores.push(t.elapsed());
        assert_eq!(r.state, single);
    }
    summary("restore, same layout, 1 device", &restores, bytes);

    // Sharded over 4 devices (dim 0 over x,y); restored as saved and
    // resharded onto 2 devices splitting the other dimension.
    let mesh = MeshSpec::new(&[("x", 2), ("y", 2)]);
    let sharding = TensorSharding::new(&[&["x", "y"], &[]]);
    // The shards are cut by restoring the first step onto the mesh.
    let mut to_mesh = RestoreTarget::new(mesh.clone());
    for (name, l) in &single.leaves {
        to_mesh.insert(name, l.ty(), Some(sharding.clone()));
    }
    let sharded = m.restore(Some(1), &to_mesh).unwrap().state;
    let mut saves = Vec::new();
    for _ in 0..runs {
        step += 1;
        let t = Instant::now();
        m.save(step, &sharded).unwrap();
        saves.push(t.elapsed());
    }
    summary("save, sync, 4 devices (dim 0 over x,y)", &saves, bytes);
    let mut restores = Vec::new();
    for _ in 0..runs {
        let t = Instant::now();
        m.restore(None, &RestoreTarget::like_state(&sharded)).unwrap();
        restores.push(t.elapsed());
    }
    summary("restore, 4 devices, same layout", &restores, bytes);
    let other = MeshSpec::new(&[("m", 2)]);
    let mut resharded = RestoreTarget::new(other.clone());
    for (name, l) in &single.leaves {
        resharded.insert(name, l.ty(), Some(TensorSharding::new(&[&[], &["m"]])));
    }
    let mut restores = Vec::new();
    for _ in 0..runs {
        let t = Instant::now();
        m.restore(None, &resharded).unwrap();
        restores.push(t.elapsed());
    }
    summary("restore, resharded onto 2 devices (dim 1)", &restores, bytes);
    m.finish().unwrap();
}

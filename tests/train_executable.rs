//! Training through the runtime's executable. With the reference CPU
//! backend (`--backend cpu-ref`, every op through the interpreter) every
//! strategy gives metrics bitwise equal to the reference simulator
//! (`--backend sim`, the oracle of sharded runs): the executable adds no
//! arithmetic of its own. The fast CPU backend (`--backend cpu`) equals the
//! simulator to 1e-5 relative over 20 steps and is bitwise reproducible,
//! whatever the number of worker threads. The state stays on the devices
//! between checkpoints, and the measured peak memory per device stays
//! within the partitioner's static estimate.

use weft::runner::{prepare, run_session, Executor, MeshBackend, MeshExecutor, Overrides, RunConfig};
use weft_compiler::sharding::Mesh;

const MLP: &str = "steps = 4\nseed = 3\n[model]\nkind = \"mlp\"\nlayers = 2\nd = 16\nh = 32\nbatch = 8\n[optimizer]\nkind = \"sgd\"\nlr = 0.01\n";
const GPT: &str = "steps = 3\nseed = 1\n[model]\nkind = \"gpt\"\nvocab = 16\nseq = 8\nd_model = 16\nheads = 4\nlayers = 1\nbatch = 8\n[optimizer]\nkind = \"adamw\"\nlr = 0.003\n";

fn metrics(
    config: &str,
    mesh: &str,
    strategy: &str,
    backend: &str,
    threads: Option<usize>,
) -> Vec<(u64, Vec<(String, u64)>)> {
    let mut c = RunConfig::from_toml(config).unwrap();
    c.mesh = Some(mesh.into());
    c.strategy = Some(strategy.into());
    c.backend = Some(backend.into());
    c.threads = threads;
    let s = run_session(&c, &Overrides { quiet: true, ..Default::default() }, &mut |_| {}).unwrap();
    assert_eq!(s.metrics.len() as u64, c.steps, "{strategy} on {mesh}: every step ran");
    s.metrics.iter().map(|(k, m)| (*k, m.iter().map(|(n, v)| (n.clone(), v.to_bits())).collect())).collect()
}

const CASES: [(&str, &str); 8] = [
    ("data=8", "dp"),
    ("data=2,model=4", "tp"),
    ("data=8", "fsdp"),
    ("data=2,model=4", "fsdp_tp"),
    ("data=4", "zero1"),
    ("data=4", "zero2"),
    ("data=4", "zero3"),
    ("data=2,model=2", "none"),
];

#[test]
fn mlp_executable_equals_the_simulator_bitwise_under_every_strategy() {
    for (mesh, strategy) in CASES {
        let oracle = metrics(MLP, mesh, strategy, "sim", None);
        assert_eq!(metrics(MLP, mesh, strategy, "cpu-ref", None), oracle, "{strategy} on {mesh}");
    }
}

/// The config with `steps = n` as its first line.
fn with_steps(config: &str, n: u64) -> String {
    let rest: Vec<&str> = config.lines().filter(|l| !l.starts_with("steps =")).collect();
    format!("steps = {n}\n{}\n", rest.join("\n"))
}

fn close(got: &[(u64, Vec<(String, u64)>)], want: &[(u64, Vec<(String, u64)>)], what: &str) {
    close_to(got, want, 1e-5, what)
}

fn close_to(got: &[(u64, Vec<(String, u64)>)], want: &[(u64, Vec<(String, u64)>)], rtol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: steps");
    for ((s, g), (sw, w)) in got.iter().zip(want) {
        assert_eq!(s, sw, "{what}: step numbers");
        assert_eq!(g.len(), w.len(), "{what}: metrics of step {s}");
        for ((name, a), (name_w, b)) in g.iter().zip(w) {
            assert_eq!(name, name_w, "{what}: step {s}: metric names");
            let (a, b) = (f64::from_bits(*a), f64::from_bits(*b));
            assert!((a - b).abs() <= rtol * b.abs().max(1e-6), "{what}: step {s} {name}: fast {a} vs oracle {b}");
        }
    }
}

/// `config` computing in `dtype` (the `[model]` table's `compute`).
fn computing_in(config: &str, dtype: &str) -> String {
    config.replace("[model]\n", &format!("[model]\ncompute = \"{dtype}\"\n"))
}

#[test]
fn the_fast_cpu_backend_in_bf16_follows_the_simulator() {
    // Elementwise ops and chains are bit-exact in bf16 (f32 compute,
    // rounded per op as the interpreter); GEMMs sum in another order, and
    // a different f32 sum can round to a neighbouring bf16 value, so the
    // runs agree to bf16 precision, not bitwise.
    for (config, steps) in [(MLP, 10u64), (GPT, 10)] {
        let config = with_steps(&computing_in(config, "bf16"), steps);
        assert!(config.contains("compute = \"bf16\""));
        for (mesh, strategy) in CASES.into_iter().take(4) {
            let oracle = metrics(&config, mesh, strategy, "sim", None);
            let fast = metrics(&config, mesh, strategy, "cpu", None);
            close_to(&fast, &oracle, 1e-2, &format!("bf16 {strategy} on {mesh}"));
        }
    }
}

#[test]
fn the_fast_cpu_backend_equals_the_simulator_over_20_steps() {
    for (config, steps) in [(MLP, 20u64), (GPT, 20)] {
        let config = with_steps(config, steps);
        for (mesh, strategy) in CASES {
            let oracle = metrics(&config, mesh, strategy, "sim", None);
            let fast = metrics(&config, mesh, strategy, "cpu", None);
            close(&fast, &oracle, &format!("{strategy} on {mesh}"));
            assert_eq!(metrics(&config, mesh, strategy, "cpu", None), fast, "{strategy} on {mesh}: rerun");
        }
    }
}

#[test]
fn gpt_executable_equals_the_simulator_bitwise_under_every_strategy() {
    for (mesh, strategy) in CASES {
        let oracle = metrics(GPT, mesh, strategy, "sim", None);
        assert_eq!(metrics(GPT, mesh, strategy, "cpu-ref", None), oracle, "{strategy} on {mesh}");
    }
}

#[test]
fn worker_thread_count_does_not_change_a_bit() {
    for backend in ["cpu", "cpu-ref"] {
        for (config, strategy) in [(MLP, "fsdp_tp"), (GPT, "tp")] {
            let one = metrics(config, "data=2,model=4", strategy, backend, Some(1));
            for threads in [Some(2), Some(8), None] {
                let got = metrics(config, "data=2,model=4", strategy, backend, threads);
                assert_eq!(got, one, "{backend}: {strategy}, {threads:?}");
            }
        }
    }
}

#[test]
fn the_state_stays_on_the_devices_between_checkpoints() {
    for (config, mesh, strategy) in [(MLP, "data=2,model=4", "fsdp_tp"), (GPT, "data=4", "zero2")] {
        let c = RunConfig::from_toml(config).unwrap();
        let mesh = Mesh::parse(mesh).unwrap();
        let axes: Vec<&str> = mesh.axes().iter().map(|a| a.name.as_str()).collect();
        let mut c = c;
        c.strategy = Some(strategy.into());
        let p = prepare(&c, &axes, &Overrides::default()).unwrap();
        let kind = weft_runtime::BackendKind::Cpu;
        let mut exec = MeshExecutor::new(&p.step, &mesh, MeshBackend::Devices(kind), None).unwrap();
        let state = p.step.init_state(&p.params, c.seed, c.initial_loss_scale()).unwrap();
        exec.load(&p.step, &state).unwrap();
        let leaves = (p.step.state.len() * mesh.num_devices()) as u64;
        let loaded = exec.transfers().unwrap();
        assert_eq!((loaded.state_uploads, loaded.state_downloads), (leaves, 0));
        for _ in 0..3 {
            exec.step(&p.step, &p.batch).unwrap();
        }
        let t = exec.transfers().unwrap();
        assert_eq!(
            (t.state_uploads, t.state_downloads),
            (leaves, 0),
            "{strategy}: no state crossed the host in 3 steps"
        );
        let batch_blocks = (p.step.batch.len() * mesh.num_devices()) as u64;
        assert_eq!(t.input_uploads, 3 * batch_blocks, "{strategy}: only the batch went in");
        // The measured peak of every device is within the static estimate.
        let estimate = exec.partitioned().report().peak_live_bytes;
        for (d, peak) in exec.measured_peaks().unwrap().into_iter().enumerate() {
            assert!(peak > 0 && peak <= estimate, "{strategy}: device {d} peaked at {peak} B, estimate {estimate} B");
        }
        // A checkpoint reads the state back, one copy of each distinct
        // block (a replicated leaf once, not once per device).
        let blocks: u64 = exec
            .state_layout(&p.step)
            .iter()
            .map(|s| s.axes().map(|a| mesh.axis(a).unwrap().size as u64).product::<u64>())
            .sum();
        assert!(blocks <= leaves);
        if strategy == "zero2" {
            assert!(blocks < leaves, "zero2 replicates its parameters: {blocks} blocks of {leaves} values");
        }
        let saved = exec.checkpoint_state(&p.step).unwrap();
        let after = exec.transfers().unwrap();
        assert_eq!(after.state_downloads, blocks, "{strategy}");
        assert_eq!(saved.leaves.len(), p.step.state.len());
        // And the state read back equals the simulator's after the same steps.
        let mut sim = MeshExecutor::new(&p.step, &mesh, MeshBackend::Simulator, None).unwrap();
        sim.load(&p.step, &state).unwrap();
        for _ in 0..3 {
            sim.step(&p.step, &p.batch).unwrap();
        }
        let (a, b) = (exec.global_state(&p.step).unwrap(), sim.global_state(&p.step).unwrap());
        for (name, t) in &b {
            weft_ir::tensor::check_close(&a[name], t, 1e-5, 1e-6)
                .unwrap_or_else(|e| panic!("{strategy}: leaf {name} differs from the simulator's: {e}"));
        }
    }
}

#[test]
fn zero_worker_threads_is_a_named_error() {
    let mut c = RunConfig::from_toml(MLP).unwrap();
    c.threads = Some(0);
    let e = run_session(&c, &Overrides { quiet: true, ..Default::default() }, &mut |_| {}).expect_err("rejected");
    assert!(matches!(&e, weft::Error::Invalid { key, .. } if key == "threads (--threads)"), "{e:?}");
    assert_eq!(e.to_string(), "threads (--threads) = 0: must be an integer in [1, 1024]");
}

//! Training through the runtime's executable (`--backend cpu`): every
//! strategy gives metrics bitwise equal to the reference simulator
//! (`--backend sim`, the oracle of sharded runs), whatever the number of
//! worker threads; the state stays on the devices between checkpoints; and
//! the measured peak memory per device stays within the partitioner's
//! static estimate.

use weft::runner::{prepare, run_session, Executor, MeshBackend, MeshExecutor, Overrides, RunConfig};
use weft_compiler::sharding::Mesh;

const MLP: &str = "steps = 4\nseed = 3\n[model]\nkind = \"mlp\"\nlayers = 2\nd = 16\nh = 32\nbatch = 8\n[optimizer]\nkind = \"sgd\"\nlr = 0.01\n";
const GPT: &str = "steps = 3\nseed = 1\n[model]\nkind = \"gpt\"\nvocab = 16\nseq = 8\nd_model = 16\nheads = 4\nlayers = 1\nbatch = 8\n[optimizer]\nkind = \"adamw\"\nlr = 0.003\n";

fn metrics(config: &str, mesh: &str, strategy: &str, backend: &str, threads: Option<usize>) -> Vec<(u64, Vec<(String, u64)>)> {
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
        assert_eq!(metrics(MLP, mesh, strategy, "cpu", None), oracle, "{strategy} on {mesh}");
    }
}

#[test]
fn gpt_executable_equals_the_simulator_bitwise_under_every_strategy() {
    for (mesh, strategy) in CASES {
        let oracle = metrics(GPT, mesh, strategy, "sim", None);
        assert_eq!(metrics(GPT, mesh, strategy, "cpu", None), oracle, "{strategy} on {mesh}");
    }
}

#[test]
fn worker_thread_count_does_not_change_a_bit() {
    for (config, strategy) in [(MLP, "fsdp_tp"), (GPT, "tp")] {
        let one = metrics(config, "data=2,model=4", strategy, "cpu", Some(1));
        for threads in [Some(2), Some(8), None] {
            assert_eq!(metrics(config, "data=2,model=4", strategy, "cpu", threads), one, "{strategy}, {threads:?}");
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
        let state = p.step.init_state(&p.params, c.seed, 1.0).unwrap();
        exec.load(&p.step, &state).unwrap();
        let leaves = (p.step.state.len() * mesh.num_devices()) as u64;
        let loaded = exec.transfers().unwrap();
        assert_eq!((loaded.state_uploads, loaded.state_downloads), (leaves, 0));
        for _ in 0..3 {
            exec.step(&p.step, &p.batch).unwrap();
        }
        let t = exec.transfers().unwrap();
        assert_eq!((t.state_uploads, t.state_downloads), (leaves, 0), "{strategy}: no state crossed the host in 3 steps");
        let batch_blocks = (p.step.batch.len() * mesh.num_devices()) as u64;
        assert_eq!(t.input_uploads, 3 * batch_blocks, "{strategy}: only the batch went in");
        // The measured peak of every device is within the static estimate.
        let estimate = exec.partitioned().report().peak_live_bytes;
        for (d, peak) in exec.measured_peaks().unwrap().into_iter().enumerate() {
            assert!(peak > 0 && peak <= estimate, "{strategy}: device {d} peaked at {peak} B, estimate {estimate} B");
        }
        // A checkpoint reads the state back, once per leaf and device.
        exec.checkpoint_state(&p.step).unwrap();
        let after = exec.transfers().unwrap();
        assert_eq!(after.state_downloads, leaves);
        // And the state read back equals the simulator's after the same steps.
        let mut sim = MeshExecutor::new(&p.step, &mesh, MeshBackend::Simulator, None).unwrap();
        sim.load(&p.step, &state).unwrap();
        for _ in 0..3 {
            sim.step(&p.step, &p.batch).unwrap();
        }
        let (a, b) = (exec.global_state(&p.step).unwrap(), sim.global_state(&p.step).unwrap());
        for (name, t) in &b {
            assert!(a[name].bitwise_eq(t), "{strategy}: leaf {name} differs from the simulator's");
        }
    }
}

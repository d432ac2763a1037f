//! `--strategy auto` through `weft train`: the training step is sharded by
//! the auto-sharder inside the stable-state compile, trains to the
//! unsharded run's losses, fits a per-device memory budget on the devices
//! (measured, not only planned), and an infeasible budget is a named error
//! before any step runs.

use weft::runner::{prepare, run_session, Executor, MeshBackend, MeshExecutor, Overrides, RunConfig};
use weft_compiler::sharding::Mesh;

const MLP: &str = "steps = 4\nseed = 3\n[model]\nkind = \"mlp\"\nlayers = 2\nd = 16\nh = 32\nbatch = 64\n[optimizer]\nkind = \"sgd\"\nlr = 0.01\n";
const GPT: &str = "steps = 3\nseed = 1\n[model]\nkind = \"gpt\"\nvocab = 16\nseq = 8\nd_model = 16\nheads = 4\nlayers = 1\nbatch = 8\n[optimizer]\nkind = \"adamw\"\nlr = 0.003\n";

fn config(text: &str, mesh: &str, strategy: &str, backend: &str) -> RunConfig {
    let mut c = RunConfig::from_toml(text).unwrap();
    c.mesh = Some(mesh.into());
    c.strategy = Some(strategy.into());
    c.backend = Some(backend.into());
    c
}

fn losses(c: &RunConfig) -> Vec<(u64, f64)> {
    let s = run_session(c, &Overrides { quiet: true, ..Default::default() }, &mut |_| {}).unwrap();
    assert_eq!(s.metrics.len() as u64, c.steps);
    s.metrics.iter().map(|(k, m)| (*k, m["loss"])).collect()
}

#[test]
fn auto_trains_to_the_unsharded_losses() {
    for model in [MLP, GPT] {
        let want = losses(&config(model, "data=1", "none", "interp"));
        for backend in ["cpu", "sim"] {
            let got = losses(&config(model, "data=2,model=2", "auto", backend));
            assert_eq!(got.len(), want.len());
            for ((s, a), (t, b)) in got.iter().zip(&want) {
                assert_eq!(s, t);
                assert!((a - b).abs() <= 1e-5 * b.abs(), "{backend} step {s}: auto {a} vs unsharded {b}");
            }
        }
    }
}

#[test]
fn auto_under_a_memory_budget_stays_under_it_on_the_devices() {
    // Well under the replicated step's peak (checked below), so the plan
    // must shard; above what the sharded program needs on the devices.
    let budget: usize = 30 * 1024;
    let mut c = config(MLP, "data=2,model=2", "auto", "cpu");
    c.memory_budget = Some(budget.to_string());
    let mesh = Mesh::parse("data=2,model=2").unwrap();
    let axes: Vec<&str> = mesh.axes().iter().map(|a| a.name.as_str()).collect();
    let p = prepare(&c, &axes, &Overrides::default()).unwrap();
    let replicated = {
        let p1 = prepare(&config(MLP, "data=2,model=2", "none", "cpu"), &axes, &Overrides::default()).unwrap();
        let kind = weft_runtime::select_backend(Some("cpu")).unwrap();
        let mut e = MeshExecutor::new(&p1.step, &mesh, MeshBackend::Devices(kind), None).unwrap();
        let state = p1.step.init_state(&p1.params, 0, 1.0).unwrap();
        e.load(&p1.step, &state).unwrap();
        e.step(&p1.step, &p1.batch).unwrap();
        *e.measured_peaks().unwrap().iter().max().unwrap()
    };
    assert!(budget < replicated, "budget {budget} B does not force sharding (replicated peak {replicated} B)");
    let kind = weft_runtime::select_backend(Some("cpu")).unwrap();
    let mut e =
        MeshExecutor::with_limit(&p.step, &mesh, MeshBackend::Devices(kind), None, None, p.auto.as_ref()).unwrap();
    let state = p.step.init_state(&p.params, 0, 1.0).unwrap();
    e.load(&p.step, &state).unwrap();
    for _ in 0..2 {
        e.step(&p.step, &p.batch).unwrap();
    }
    for (d, &peak) in e.measured_peaks().unwrap().iter().enumerate() {
        assert!(peak <= budget, "device {d}: measured peak {peak} B over the budget {budget} B");
    }
}

#[test]
fn an_infeasible_budget_is_a_named_error_before_training() {
    let mut c = config(MLP, "data=2,model=2", "auto", "cpu");
    c.memory_budget = Some("1KiB".into());
    let mut lines = Vec::new();
    let e = run_session(&c, &Overrides { quiet: true, ..Default::default() }, &mut |l| lines.push(format!("{l:?}")))
        .unwrap_err()
        .to_string();
    assert!(e.contains("no sharding of @train_step fits the memory budget of 1024 bytes"), "{e}");
    assert!(!lines.iter().any(|l| l.contains("step 1")), "no step ran: {lines:?}");
    // A budget the plan meets but the partitioned program (reshards, the
    // new state beside the old) cannot: named, with both numbers.
    let mut c = config(MLP, "data=2,model=2", "auto", "cpu");
    c.memory_budget = Some("25600".into());
    let e = run_session(&c, &Overrides { quiet: true, ..Default::default() }, &mut |_| {}).unwrap_err().to_string();
    assert!(e.contains("over the memory budget of 25.0 KiB"), "{e}");
    // A budget without `auto` is a config error, not silently ignored.
    let mut c = config(MLP, "data=2,model=2", "dp", "cpu");
    c.memory_budget = Some("1MiB".into());
    let e = run_session(&c, &Overrides::default(), &mut |_| {}).unwrap_err().to_string();
    assert!(e.contains("memory_budget") && e.contains("auto"), "{e}");
}

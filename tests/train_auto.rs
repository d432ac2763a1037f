//! `--strategy auto` through `weft train`: the training step is sharded by
//! the auto-sharder inside the stable-state compile, trains to the
//! unsharded run's losses, fits a per-device memory budget on the devices
//! (measured, not only planned), and an infeasible budget is a named error
//! before any step runs. Every run, auto or named, states the cost model's
//! predicted step time next to the measured one (`weft compare-strategies`
//! does it for every strategy at once).

use weft::runner::report::machine_model;
use weft::runner::{prepare, run_session, Executor, Line, MeshBackend, MeshExecutor, Overrides, RunConfig};
use weft_compiler::autoshard::{predict_program, AutoShardOptions};
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
    let mut e = MeshExecutor::with_limit(&p.step, &mesh, MeshBackend::Devices(kind), None, None, p.auto.as_ref(), None)
        .unwrap();
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

#[test]
fn the_run_states_the_predicted_step_next_to_the_measured_one() {
    let mesh = Mesh::parse("data=2,model=2").unwrap();
    let axes: Vec<&str> = mesh.axes().iter().map(|a| a.name.as_str()).collect();
    let mut communication = Vec::new();
    for strategy in ["none", "tp", "auto"] {
        let dir = tempfile::tempdir().unwrap();
        let mut c = config(MLP, "data=2,model=2", strategy, "cpu");
        c.metrics = Some(dir.path().join("metrics.jsonl"));
        let mut lines = Vec::new();
        let ov = Overrides { quiet: true, ..Default::default() };
        let summary = run_session(&c, &ov, &mut |l| {
            if let Line::Info(l) = l {
                lines.push(l)
            }
        })
        .unwrap();
        let manifest: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.path().join("run.json")).unwrap()).unwrap();
        let p = &manifest["predicted_step"];
        let (predicted, measured) = (p["step_s"].as_f64().unwrap(), summary.steady_step_secs().unwrap());
        assert!(predicted > 0.0, "{strategy}: {p}");
        assert_eq!(p["measured_step_s"].as_f64(), Some(measured), "{strategy}: {p}");
        assert_eq!(p["measured_step_s"], manifest["timings"]["steady_step_s"], "{strategy}");
        let ratio = p["measured_over_predicted"].as_f64().unwrap();
        assert!((ratio - measured / predicted).abs() <= 1e-12 * ratio, "{strategy}: {p}");
        // Compute plus the communication the collectives started early do
        // not hide.
        let hidden = p["hidden_communication_s"].as_f64().unwrap();
        let sum = p["compute_s"].as_f64().unwrap() + p["communication_s"].as_f64().unwrap() - hidden;
        assert!(hidden >= 0.0 && (sum - predicted).abs() <= 1e-9 * predicted, "{strategy}: {p}");
        assert!(lines.iter().any(|l| l.starts_with("cost model: predicted step")), "{strategy}: {lines:?}");
        let last = lines.iter().find(|l| l.starts_with("steady-state step")).unwrap();
        assert!(last.contains(&format!("predicted {:.2} ms, measured / predicted", predicted * 1e3)), "{last}");
        // The prediction prices the program the devices ran.
        let prepared = prepare(&c, &axes, &ov).unwrap();
        let auto = prepared.auto.as_ref().map(|o| machine_model(weft::runner::Backend::DEFAULT, &mesh, o));
        let kind = weft_runtime::select_backend(Some("cpu")).unwrap();
        let e = MeshExecutor::with_limit(
            &prepared.step,
            &mesh,
            MeshBackend::Devices(kind),
            None,
            None,
            auto.as_ref(),
            prepared.overlap,
        )
        .unwrap();
        let model = machine_model(weft::runner::Backend::DEFAULT, &mesh, &AutoShardOptions::default());
        let again = predict_program(&e.partitioned().program, &mesh, &model).total;
        assert!((again - predicted).abs() <= 1e-12 * predicted, "{strategy}: {again} vs {predicted}");
        communication.push((strategy, p["communication_s"].as_f64().unwrap()));
    }
    // Replicated runs exchange nothing; Megatron all-reduces activations.
    assert_eq!(communication[0], ("none", 0.0));
    assert!(communication[1].1 > 0.0, "{communication:?}");
}

#[test]
fn compare_strategies_prints_predicted_against_measured() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mlp.toml");
    std::fs::write(&path, format!("mesh = \"data=2,model=2\"\n{MLP}")).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_weft"))
        .args(["compare-strategies", path.to_str().unwrap(), "--steps", "2", "--rounds", "1"])
        .args(["--strategies", "none,tp,auto", "--backend", "cpu"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    for strategy in ["none", "tp", "auto"] {
        let row = text.lines().find(|l| l.starts_with(&format!("| {strategy} |"))).unwrap_or_else(|| panic!("{text}"));
        // Name, predicted, compute, communication, GEMM GFLOP, streamed
        // MiB, measured (min), all rounds, measured / predicted.
        assert_eq!(row.split('|').count(), 11, "{row}");
    }
    assert!(text.contains("Spearman rank correlation, predicted vs measured (3 strategies): "), "{text}");
    assert!(text.contains("against the best named strategy, "), "{text}");
    assert!(text.contains("measured / predicted from "), "{text}");
    // A strategy that does not exist is a usage error, before any run.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_weft"))
        .args(["compare-strategies", path.to_str().unwrap(), "--strategies", "dp,bogus"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown strategy `bogus`"));
    // So are too few steps or no rounds.
    for bad in [["--steps", "1"], ["--rounds", "0"]] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_weft"))
            .args(["compare-strategies", path.to_str().unwrap()])
            .args(bad)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{bad:?}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("needs --steps of at least 2 and --rounds of at least 1"));
    }
}

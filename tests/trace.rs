//! Issue "see the step": `weft train --trace FILE.json` writes Chrome
//! trace-event JSON that Perfetto opens — checked here against the format's
//! schema (every event a complete `X` span or `M` metadata with numeric
//! times, on named lanes), against the device program (every collective of
//! the step on every device lane: the counts the cost model read off the
//! same program, in `run.json`), and against an untraced run (tracing
//! changes no result). Under `mpirun -n 2` each process writes its own file.

mod mpi_support;

use mpi_support::{mpirun_or_skip, ok, read, train, WEFT};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

const CONFIG: &str = "examples/configs/mlp.toml";

/// Checks the trace-event schema; returns the complete spans.
fn spans(path: &Path) -> Vec<Value> {
    trace(path).0
}

/// A collective in flight: (device, train step, collective, start µs, end µs).
type Flight = (u64, u64, String, f64, f64);

/// Checks the trace-event schema; returns the complete spans and the
/// asynchronous (in-flight) ones, each begin matched with its end.
fn trace(path: &Path) -> (Vec<Value>, Vec<Flight>) {
    let doc: Value = serde_json::from_slice(&read(path)).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let events = doc["traceEvents"].as_array().expect("a traceEvents array");
    let mut named_lanes = BTreeSet::new();
    let mut out = Vec::new();
    let mut begun: BTreeMap<u64, Value> = BTreeMap::new();
    let mut flights = Vec::new();
    for e in events {
        let ph = e["ph"].as_str().expect("every event has a phase");
        assert!(e["pid"].is_u64() && e["name"].is_string(), "{e}");
        match ph {
            "M" => {
                assert!(e["args"]["name"].is_string(), "{e}");
                if e["name"] == "thread_name" {
                    named_lanes.insert((e["pid"].as_u64().unwrap(), e["tid"].as_u64().unwrap()));
                }
            }
            "X" => {
                assert!(e["tid"].is_u64() && e["cat"].is_string(), "{e}");
                let (ts, dur) = (e["ts"].as_f64().expect("ts in µs"), e["dur"].as_f64().expect("dur in µs"));
                assert!(ts >= 0.0 && dur >= 0.0, "{e}");
                out.push(e.clone());
            }
            "b" => {
                assert_eq!(e["cat"], "collective.in_flight", "{e}");
                let id = e["id"].as_u64().expect("an id");
                assert!(begun.insert(id, e.clone()).is_none(), "id {id} begun twice");
            }
            "e" => {
                let b = begun.remove(&e["id"].as_u64().expect("an id")).unwrap_or_else(|| panic!("end alone: {e}"));
                assert_eq!((&b["name"], &b["pid"], &b["tid"]), (&e["name"], &e["pid"], &e["tid"]), "{e}");
                let (ts, end) = (b["ts"].as_f64().unwrap(), e["ts"].as_f64().unwrap());
                assert!(end >= ts, "{e}");
                let device = b["tid"].as_u64().unwrap() - 1;
                let step = b["args"]["train_step"].as_u64().unwrap();
                flights.push((device, step, b["name"].as_str().unwrap().to_string(), ts, end));
            }
            other => panic!("unexpected phase {other}: {e}"),
        }
    }
    assert!(begun.is_empty(), "spans begun and never ended: {begun:?}");
    for s in &out {
        let lane = (s["pid"].as_u64().unwrap(), s["tid"].as_u64().unwrap());
        assert!(s["cat"] == "predicted" || named_lanes.contains(&lane), "span on an unnamed lane: {s}");
    }
    (out, flights)
}

/// Per (device, traced step): how many spans of each collective kind (a
/// host-staged collective counts once, by its contribution).
fn collectives(spans: &[Value]) -> BTreeMap<(u64, u64), BTreeMap<String, u64>> {
    let mut by: BTreeMap<(u64, u64), BTreeMap<String, u64>> = BTreeMap::new();
    for s in spans {
        let cat = s["cat"].as_str().unwrap();
        if cat == "collective" || cat == "collective.contribute" {
            let key = (s["tid"].as_u64().unwrap() - 1, s["args"]["train_step"].as_u64().unwrap());
            *by.entry(key).or_default().entry(s["name"].as_str().unwrap().to_string()).or_default() += 1;
        }
    }
    by
}

/// The collectives of the step by kind, as the cost model counted them on
/// the program the run ran (`run.json`).
fn program_collectives(run_json: &Path) -> BTreeMap<String, u64> {
    let v: Value = serde_json::from_slice(&read(run_json)).unwrap();
    let c = v["predicted_step"]["collectives"].as_object().expect("run.json lists the step's collectives");
    // The cost model writes `all-reduce`, the program `all_reduce`.
    c.iter().map(|(k, v)| (k.replace('-', "_"), v["count"].as_u64().unwrap())).collect()
}

fn loss_lines(metrics: &Path) -> Vec<String> {
    String::from_utf8(read(metrics))
        .unwrap()
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            format!("{} {}", v["step"], v["loss"])
        })
        .collect()
}

#[test]
fn a_traced_dp_run_writes_a_valid_trace_with_every_collective_and_the_same_results() {
    let d = tempfile::tempdir().unwrap();
    let (t, m, m0) = (d.path().join("out/trace.json"), d.path().join("m.jsonl"), d.path().join("m0.jsonl"));
    let (k, k0) = (d.path().join("ck"), d.path().join("ck0"));
    let common = ["--steps", "4", "--mesh", "data=4", "--strategy", "dp", "--threads", "2"];
    let (m_, k_, t_) = (m.to_str().unwrap(), k.to_str().unwrap(), t.to_str().unwrap());
    let traced = [&common[..], &["--metrics", m_, "--checkpoint-dir", k_, "--trace", t_]].concat();
    ok(&train(0, CONFIG, &traced, &[]), "traced run");
    let untraced = [&common[..], &["--metrics", m0.to_str().unwrap(), "--checkpoint-dir", k0.to_str().unwrap()]];
    ok(&train(0, CONFIG, &untraced.concat(), &[]), "untraced run");
    assert_eq!(loss_lines(&m), loss_lines(&m0), "tracing changed a result");

    let spans = spans(&t);
    // The default: the run's second and third steps, on every device lane.
    let steps: BTreeSet<u64> = spans.iter().filter_map(|s| s["args"]["train_step"].as_u64()).collect();
    assert_eq!(steps, BTreeSet::from([1, 2]));
    let lanes: BTreeSet<u64> = spans.iter().filter(|s| s["pid"] == 0).map(|s| s["tid"].as_u64().unwrap()).collect();
    assert_eq!(lanes, BTreeSet::from([0, 1, 2, 3, 4]), "the host lane and four device lanes");
    for cat in ["op", "step", "data", "upload", "download", "predicted"] {
        assert!(spans.iter().any(|s| s["cat"] == cat), "no {cat} span");
    }
    let want = program_collectives(&k.join("run.json"));
    assert!(want.get("all_reduce").is_some_and(|&n| n > 0), "dp all-reduces its gradients: {want:?}");
    let got = collectives(&spans);
    assert_eq!(got.len(), 4 * 2, "every device, every traced step: {got:?}");
    for (k, by_kind) in &got {
        assert_eq!(by_kind, &want, "device {} step {}", k.0, k.1);
    }
}

#[test]
fn trace_steps_and_flags_out_of_range_are_named_errors() {
    let d = tempfile::tempdir().unwrap();
    let t = d.path().join("t.json");
    let cases: [(&[&str], &str); 3] = [
        (&["--trace", t.to_str().unwrap(), "--trace-steps", "3..9"], "trace.steps (--trace-steps)"),
        (&["--trace", t.to_str().unwrap(), "--trace-steps", "2..1"], "trace.steps"),
        (&["--trace-sync"], "trace.file (--trace)"),
    ];
    for (args, named) in cases {
        let o = std::process::Command::new(WEFT)
            .args(["train", CONFIG, "--steps", "4", "--mesh", "data=2", "-q"])
            .args(args)
            .current_dir(mpi_support::root())
            .env("WEFT_MEMORY_LIMIT", "8GiB")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains(named), "{args:?}: {err}");
        assert!(!t.exists(), "{args:?} wrote a trace");
    }
}

#[test]
fn under_mpirun_each_process_writes_its_own_trace() {
    if mpirun_or_skip("under_mpirun_each_process_writes_its_own_trace").is_none() {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let (t, k) = (d.path().join("trace.json"), d.path().join("ck"));
    let (t_, k_) = (t.to_str().unwrap(), k.to_str().unwrap());
    let args = ["--steps", "3", "--mesh", "data=4", "--strategy", "dp", "--trace", t_, "--checkpoint-dir", k_];
    ok(&train(2, CONFIG, &args, &[]), "mpirun -n 2 traced run");
    for rank in 0..2u64 {
        let (spans, flights) = trace(&d.path().join(format!("trace.{rank}.json")));
        // The gradients' all-reduces are in flight while the backward pass
        // computes: ops of the same device and step run inside them.
        let overlapped = flights
            .iter()
            .filter(|(dev, step, name, from, to)| {
                name == "all_reduce"
                    && spans.iter().any(|s| {
                        let ts = s["ts"].as_f64().unwrap();
                        s["cat"] == "op"
                            && s["tid"].as_u64() == Some(dev + 1)
                            && s["args"]["train_step"].as_u64() == Some(*step)
                            && ts > *from
                            && ts + s["dur"].as_f64().unwrap() < *to
                    })
            })
            .count();
        assert!(overlapped > 0, "process {rank}: no all-reduce overlaps an op: {flights:?}");
        assert!(spans.iter().all(|s| s["pid"] == rank || s["pid"] == 1000 + rank), "rank {rank}");
        let got = collectives(&spans);
        let devices: BTreeSet<u64> = got.keys().map(|k| k.0).collect();
        assert_eq!(devices, BTreeSet::from([2 * rank, 2 * rank + 1]), "process {rank} runs two devices");
        assert!(got.values().all(|k| k.get("all_reduce").is_some_and(|&n| n > 0)), "{got:?}");
    }
    assert!(!t.exists(), "a multi-process run writes per-rank files only");
}

#[test]
fn a_traced_pipeline_has_a_lane_per_stage_with_every_task() {
    // examples/configs/pipelined.toml: 2 stages, 8 microbatches, interleaved
    // with 2 chunks per stage: per traced step, each stage lane holds the
    // forward and backward of each of its chunks on each microbatch.
    let d = tempfile::tempdir().unwrap();
    let (t, m, k) = (d.path().join("trace.json"), d.path().join("m.jsonl"), d.path().join("ck"));
    let args = ["--steps", "3", "--trace", t.to_str().unwrap(), "--metrics", m.to_str().unwrap()];
    let o = train(
        0,
        "examples/configs/pipelined.toml",
        &[&args[..], &["--checkpoint-dir", k.to_str().unwrap()]].concat(),
        &[],
    );
    ok(&o, "traced pipeline");
    let spans = spans(&t);
    let tasks: Vec<&Value> = spans.iter().filter(|s| s["cat"] == "pipeline.task").collect();
    for step in [1u64, 2] {
        for stage in [0u64, 1] {
            let names: BTreeSet<String> = (tasks.iter())
                .filter(|s| s["args"]["train_step"] == step && s["tid"] == stage + 1)
                .map(|s| s["name"].as_str().unwrap().to_string())
                .collect();
            assert_eq!(names.len(), 2 * 2 * 8, "step {step} stage {stage}: {names:?}");
            assert!(names.contains("F0") || stage == 1, "stage 0 runs chunk 0 (no suffix): {names:?}");
            assert!(names.contains(&format!("B7/c{}", stage + 2)), "{names:?}");
        }
    }
    let doc: Value = serde_json::from_slice(&read(&t)).unwrap();
    let lanes: BTreeSet<String> = (doc["traceEvents"].as_array().unwrap().iter())
        .filter(|e| e["name"] == "thread_name")
        .map(|e| e["args"]["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(lanes, BTreeSet::from(["host".into(), "stage 0".into(), "stage 1".into()]));
}

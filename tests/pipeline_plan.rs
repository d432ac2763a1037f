//! Pipeline plans: the unit-cost bubble, the stage programs' memory under
//! GPipe and 1F1B, the cost-based split against the uniform one, and the
//! named errors of bad pipeline configurations. `bench_pipeline` and
//! `bench_pipeline_split` (ignored; `cargo test --release --test
//! pipeline_plan bench -- --ignored --nocapture`) print the benchmark
//! numbers.

use weft::runner::stages::{prepare_pipeline, report, PipelineExecutor};
use weft::runner::{Executor, Overrides, RunConfig};
use weft_compiler::stages::{ideal_bubble, simulate, Phase, Schedule};
use weft_compiler::CompilerError;

fn gpt(batch: usize, layers: usize, vocab: usize) -> String {
    format!(
        "steps = 2\nseed = 3\n[model]\nkind = \"gpt\"\nvocab = {vocab}\nseq = 8\nd_model = 16\nheads = 2\nlayers = {layers}\nbatch = {batch}\n[optimizer]\nkind = \"sgd\"\nlr = 0.05\n"
    )
}

fn config(model: &str, mesh: &str, pipeline: &str) -> RunConfig {
    let mut c = RunConfig::from_toml(model).unwrap();
    c.mesh = Some(mesh.into());
    c.pipeline = Some(toml::from_str(pipeline).unwrap());
    c
}

fn build(c: &RunConfig, backend: &str) -> weft::Result<(PipelineExecutor, weft::runner::Prepared)> {
    let mesh = weft::runner::validate::validate(c)?;
    let (p, staged, sub) = prepare_pipeline(c, &mesh, &Overrides::default())?;
    Ok((PipelineExecutor::new(staged, &sub, backend.parse()?)?, p))
}

#[test]
fn the_unit_cost_bubble_is_the_textbook_fraction() {
    for schedule in ["gpipe", "1f1b"] {
        for m in [4, 8, 16] {
            let c = config(
                &gpt(16, 2, 32),
                "stage=4",
                &format!("stages = 4\nmicrobatches = {m}\nschedule = \"{schedule}\""),
            );
            let (exec, _) = build(&c, "interp").unwrap();
            let r = report(&exec).unwrap();
            let want = ideal_bubble(schedule.parse().unwrap(), 4, m);
            assert!(
                (r.unit_trace.bubble() - want).abs() < 1e-12,
                "{schedule} M={m}: {} vs {want}",
                r.unit_trace.bubble()
            );
            assert_eq!(r.unit_trace.events.len(), 2 * 4 * m);
            assert!(r.json().contains("\"unit_trace\":{\"clock\":\"unit\""));
        }
    }
}

#[test]
fn the_interleaved_unit_bubble_is_megatrons_and_below_1f1b() {
    // GPT with 6 layers: 8 units, S = 2 stages of V = 2 or 4 chunks.
    for (v, s) in [(2, 2), (4, 2), (2, 4)] {
        for m in [s, 2 * s, 4 * s] {
            let c = config(
                &gpt(16, 6, 32),
                &format!("stage={s}"),
                &format!("stages = {s}\nmicrobatches = {m}\nschedule = \"interleaved\"\nvirtual_stages = {v}"),
            );
            let (mut exec, p) = build(&c, "interp").unwrap();
            let r = report(&exec).unwrap();
            let schedule = Schedule::Interleaved { virtual_stages: v };
            let want = ideal_bubble(schedule, s, m);
            assert!((r.unit_trace.bubble() - want).abs() < 1e-12, "V={v} M={m}: {} vs {want}", r.unit_trace.bubble());
            let one = simulate(Schedule::OneFOneB, s, m, &|_, p| if p == Phase::Forward { 1.0 } else { 2.0 }).unwrap();
            assert!(r.unit_trace.bubble() < one.bubble(), "V={v} M={m}: not below 1F1B's");
            assert_eq!(r.stage_units.len(), s * v, "one entry per chunk");
            assert_eq!(r.program_peaks.len(), s, "one program per stage");
            let text = r.text();
            assert!(text.contains(&format!("schedule interleaved (V={v})")), "{text}");
            assert!(text.contains(&format!("stage 1 chunk {}: ", s + 1)), "{text}");
            assert!(text.contains("(S-1)/(V*M+S-1)"), "{text}");
            let json: serde_json::Value = serde_json::from_str(&r.json()).unwrap();
            assert_eq!(json["virtual_stages"], v);
            assert_eq!(json["schedule"], "interleaved");
            // The driver holds the activation bytes the stage programs
            // predict, over all of a stage's chunks.
            let state = p.step.init_state(&p.params, 0, 1.0).unwrap();
            exec.load(&p.step, &state).unwrap();
            exec.step(&p.step, &p.batch).unwrap();
            let predicted: Vec<u64> = exec.stage_memory().iter().map(|(_, p)| p.activations).collect();
            assert_eq!(exec.held_peaks(), &predicted[..], "V={v} M={m}: measured vs predicted activation peaks");
            let trace = exec.last_trace().unwrap();
            assert_eq!(trace.events.len(), 2 * s * v * m);
            assert!(trace.events.iter().all(|e| e.task.chunk % s == e.stage));
        }
    }
    // Bad interleaved configurations are named errors before anything runs.
    for (pipeline, says) in [
        ("stages = 2\nmicrobatches = 3\nschedule = \"interleaved\"\nvirtual_stages = 2", "multiple of the stages"),
        ("stages = 2\nmicrobatches = 4\nschedule = \"interleaved\"\nvirtual_stages = 1", "virtual_stages ≥ 2"),
        ("stages = 2\nmicrobatches = 4\nschedule = \"1f1b\"\nvirtual_stages = 2", "needs schedule = \"interleaved\""),
        ("stages = 2\nmicrobatches = 4\nschedule = \"interleaved\"\nvirtual_stages = 8", "layers"),
        ("stages = 2\nmicrobatches = 4\nschedule = \"interleaved\"\nsplit = [4, 4]", "one per chunk"),
    ] {
        let c = config(&gpt(16, 6, 32), "stage=2", pipeline);
        let e = build(&c, "interp").err().unwrap_or_else(|| panic!("{pipeline}: accepted"));
        assert!(e.to_string().contains(says), "{pipeline}: {e}");
    }
}

#[test]
fn one_f_one_b_holds_at_most_s_microbatches_while_gpipe_grows_with_m() {
    // Microbatches of 2 rows: the batch grows with M, each microbatch's
    // activations stay the same.
    let s = 4;
    let mut last: Option<(Vec<u64>, Vec<u64>)> = None;
    for m in [4, 8, 16] {
        let mut peaks = Vec::new();
        for schedule in ["gpipe", "1f1b"] {
            let c = config(
                &gpt(2 * m, 2, 32),
                "stage=4",
                &format!("stages = {s}\nmicrobatches = {m}\nschedule = \"{schedule}\""),
            );
            let (mut exec, p) = build(&c, "interp").unwrap();
            let mem = exec.stage_memory();
            // The driver holds exactly the activation bytes the stage
            // program predicts (measured over a step).
            let state = p.step.init_state(&p.params, 0, 1.0).unwrap();
            exec.load(&p.step, &state).unwrap();
            exec.step(&p.step, &p.batch).unwrap();
            let predicted: Vec<u64> = mem.iter().map(|(_, p)| p.activations).collect();
            assert_eq!(exec.held_peaks(), &predicted[..], "{schedule} M={m}: measured vs predicted activation peaks");
            for (st, (b, p)) in mem.iter().enumerate() {
                let b = &b[0];
                let per_micro = b.stash + b.act_out + b.cot_out + b.cot_in;
                assert!(b.stash > 0, "stage {st} stashes something");
                if schedule == "1f1b" {
                    assert_eq!(p.in_flight, s - st, "1f1b M={m} stage {st}");
                    assert!(p.activations <= s as u64 * per_micro, "1f1b M={m} stage {st}: {p:?} vs {b:?}");
                } else {
                    assert_eq!(p.in_flight, m, "gpipe M={m} stage {st}");
                    assert!(p.activations >= m as u64 * b.stash, "gpipe M={m} stage {st}: {p:?} vs {b:?}");
                }
            }
            peaks.push(mem.iter().map(|(_, p)| p.total).collect::<Vec<u64>>());
        }
        let (g, o) = (peaks[0].clone(), peaks[1].clone());
        // Stage 0 holds S microbatches under 1F1B, M under GPipe; the
        // later stages fewer under 1F1B.
        for st in 0..s {
            assert!(o[st] <= g[st], "M={m}: 1f1b peak {o:?} vs gpipe {g:?}");
        }
        if m > s {
            assert!(o[0] < g[0], "M={m}: 1f1b peak {o:?} vs gpipe {g:?}");
        }
        if let Some((pg, po)) = &last {
            for st in 0..s {
                assert!(g[st] > pg[st], "gpipe's stage {st} peak grows with M: {} after {}", g[st], pg[st]);
                assert_eq!(o[st], po[st], "1f1b's stage {st} peak does not depend on M");
            }
        }
        last = Some((g, o));
    }
}

#[test]
fn the_cost_based_split_beats_the_uniform_split_on_a_model_with_heavy_ends() {
    // A large vocabulary makes the embedding and the head heavy.
    let model = gpt(16, 6, 2048);
    let best = config(&model, "stage=4", "stages = 4\nmicrobatches = 8");
    let uniform = config(&model, "stage=4", "stages = 4\nmicrobatches = 8\nsplit = [2, 2, 2, 2]");
    let (eb, _) = build(&best, "interp").unwrap();
    let (eu, _) = build(&uniform, "interp").unwrap();
    let (rb, ru) = (report(&eb).unwrap(), report(&eu).unwrap());
    assert_ne!(eb.staged().split.counts, vec![2, 2, 2, 2]);
    eprintln!("{}\n{}", rb.text(), ru.text());
    assert!(rb.predicted_step < ru.predicted_step, "{}\nvs\n{}", rb.text(), ru.text());
    // The head (the last unit) is the heaviest: it gets a stage of its own.
    assert_eq!(eb.staged().split.counts.last(), Some(&1), "{}", rb.text());
}

fn compiler_error(e: weft::Error) -> CompilerError {
    match e {
        weft::Error::Compiler(b) => *b,
        other => panic!("expected a compiler error, got {other:?}"),
    }
}

#[test]
fn bad_pipeline_configurations_are_named_errors() {
    let model = gpt(8, 2, 32);
    // GPT with 2 blocks: 4 units.
    let e = build(&config(&model, "stage=5", "stages = 5\nmicrobatches = 1"), "interp").err().unwrap();
    assert!(matches!(compiler_error(e), CompilerError::PipelineStagesExceedLayers { stages: 5, layers: 4, .. }));
    let e = build(&config(&model, "stage=2", "stages = 2\nmicrobatches = 3"), "interp").err().unwrap();
    assert!(matches!(compiler_error(e), CompilerError::PipelineMicrobatches { microbatches: 3, batch: 8 }));
    let e = build(&config(&model, "stage=2", "stages = 4\nmicrobatches = 2"), "interp").err().unwrap();
    assert!(matches!(compiler_error(e), CompilerError::PipelineStageAxis { size: 2, stages: 4, .. }));
    let e = build(&config(&model, "data=4", "stages = 4\nmicrobatches = 2"), "interp").err().unwrap();
    let e = compiler_error(e);
    assert!(matches!(e, CompilerError::PipelineNoStageAxis { stages: 4, .. }), "{e}");
    assert!(e.to_string().contains("has no axis `stage` (its axes: data)"), "{e}");
    let e = build(&config(&model, "data=2", "stages = 2\nmicrobatches = 2\naxis = \"data\""), "interp").err().unwrap();
    let e = compiler_error(e);
    assert!(e.to_string().contains("the data axis splits the batch"), "{e}");
    let e = build(&config(&model, "stage=2", "stages = 2\nmicrobatches = 2\nmemory_budget = \"4KiB\""), "interp")
        .err()
        .unwrap();
    let e = compiler_error(e);
    assert!(matches!(e, CompilerError::PipelineMemoryInfeasible { budget: 4096, .. }), "{e}");
    assert!(e.to_string().contains("no split of 4 layers into 2 stages fits"), "{e}");
    let e = build(&config(&model, "stage=2", "stages = 2\nmicrobatches = 2\nsplit = [1, 2]"), "interp").err().unwrap();
    assert!(matches!(compiler_error(e), CompilerError::PipelineConfig { .. }));
    // The budget that fits, and an explicit split, are accepted.
    build(
        &config(&model, "stage=2", "stages = 2\nmicrobatches = 2\nmemory_budget = \"1GiB\"\nsplit = [1, 3]"),
        "interp",
    )
    .unwrap();
}

/// The median of the steps after the first (seconds).
fn median_step(exec: &mut PipelineExecutor, p: &weft::runner::Prepared, steps: usize) -> f64 {
    let state = p.step.init_state(&p.params, 0, 1.0).unwrap();
    exec.load(&p.step, &state).unwrap();
    let mut t: Vec<f64> = (0..steps)
        .map(|_| {
            let c = std::time::Instant::now();
            exec.step(&p.step, &p.batch).unwrap();
            c.elapsed().as_secs_f64()
        })
        .skip(1)
        .collect();
    t.sort_by(f64::total_cmp);
    t[t.len() / 2]
}

#[test]
#[ignore = "benchmark: run with --release -- --ignored --nocapture"]
fn bench_pipeline() {
    // Compile time of the pipelined GPT step, bubble and step time for S=4.
    let model = "steps = 2\nseed = 3\n[model]\nkind = \"gpt\"\nvocab = 256\nseq = 64\nd_model = 128\nheads = 4\nlayers = 8\nbatch = 32\n[optimizer]\nkind = \"adamw\"\nlr = 0.001\n";
    for schedule in ["gpipe", "1f1b"] {
        for m in [4, 8, 16] {
            let c = config(model, "stage=4", &format!("stages = 4\nmicrobatches = {m}\nschedule = \"{schedule}\""));
            let clock = std::time::Instant::now();
            let (mut exec, p) = build(&c, "cpu").unwrap();
            let compile = clock.elapsed().as_secs_f64();
            let step = median_step(&mut exec, &p, 6);
            let r = report(&exec).unwrap();
            let t = r.measured_trace.as_ref().unwrap();
            println!(
                "S=4 M={m:2} {schedule:5}: build+compile {compile:.3} s, step {:.1} ms, measured bubble {:.3}, unit bubble {:.3}, predicted bubble {:.3}, split {:?}",
                step * 1e3,
                t.bubble(),
                r.unit_trace.bubble(),
                r.predicted_bubble,
                exec.staged().split.counts
            );
        }
    }
    // The unpipelined step with the same accumulation, one device.
    for m in [4, 8, 16] {
        let mut c = RunConfig::from_toml(model).unwrap();
        c.optimizer.micro_batches = m;
        let mesh = weft_compiler::sharding::Mesh::parse("data=1").unwrap();
        let p = weft::runner::prepare(&c, &["data"], &Overrides::default()).unwrap();
        let mut exec = weft::runner::executor(weft::runner::Backend::DEFAULT, &mesh, &p, None).unwrap();
        let state = p.step.init_state(&p.params, 0, 1.0).unwrap();
        exec.load(&p.step, &state).unwrap();
        let mut t: Vec<f64> = (0..6)
            .map(|_| {
                let c = std::time::Instant::now();
                exec.step(&p.step, &p.batch).unwrap();
                c.elapsed().as_secs_f64()
            })
            .skip(1)
            .collect();
        t.sort_by(f64::total_cmp);
        println!("unpipelined, micro_batches = {m:2}: step {:.1} ms", t[t.len() / 2] * 1e3);
    }
}

#[test]
#[ignore = "benchmark: run with --release -- --ignored --nocapture"]
fn bench_interleaved() {
    // 1F1B against interleaved 1F1B (V = 2, 4) on S = 2 stages (one core
    // each on this 2-core machine), GPT with 8 blocks (10 units), CPU
    // backend: unit-clock, predicted and measured bubble, step time.
    let model = "steps = 2\nseed = 3\n[model]\nkind = \"gpt\"\nvocab = 256\nseq = 64\nd_model = 128\nheads = 4\nlayers = 8\nbatch = 32\n[optimizer]\nkind = \"adamw\"\nlr = 0.001\n";
    for m in [2, 4, 8] {
        for (schedule, v) in [("1f1b", 1), ("interleaved", 2), ("interleaved", 4)] {
            let pipeline = format!("stages = 2\nmicrobatches = {m}\nschedule = \"{schedule}\"\nvirtual_stages = {v}");
            let c = config(model, "stage=2", &pipeline);
            let (mut exec, p) = build(&c, "cpu").unwrap();
            let state = p.step.init_state(&p.params, 0, 1.0).unwrap();
            exec.load(&p.step, &state).unwrap();
            let (mut steps, mut bubbles) = (Vec::new(), Vec::new());
            for i in 0..7 {
                let clock = std::time::Instant::now();
                exec.step(&p.step, &p.batch).unwrap();
                if i > 0 {
                    steps.push(clock.elapsed().as_secs_f64());
                    bubbles.push(exec.last_trace().unwrap().bubble());
                }
            }
            steps.sort_by(f64::total_cmp);
            bubbles.sort_by(f64::total_cmp);
            let r = report(&exec).unwrap();
            println!(
                "S=2 M={m} {schedule:11} V={v}: step {:.1} ms, measured bubble {:.3} (median of 6), unit bubble {:.3}, predicted bubble {:.3}, split {:?}",
                steps[steps.len() / 2] * 1e3,
                bubbles[bubbles.len() / 2],
                r.unit_trace.bubble(),
                r.predicted_bubble,
                exec.staged().split.counts
            );
        }
    }
}

/// The median of the steps after the first (seconds), and the median of
/// each step's time outside its schedule (the step's wall time less the
/// makespan of its trace: cutting the batch, starting the stage threads,
/// the global norm and the updates).
fn median_step_outside(exec: &mut PipelineExecutor, p: &weft::runner::Prepared, steps: usize) -> (f64, f64) {
    let state = p.step.init_state(&p.params, 0, 1.0).unwrap();
    exec.load(&p.step, &state).unwrap();
    let (mut wall, mut outside): (Vec<f64>, Vec<f64>) = (0..steps)
        .map(|_| {
            let c = std::time::Instant::now();
            exec.step(&p.step, &p.batch).unwrap();
            let w = c.elapsed().as_secs_f64();
            (w, w - exec.last_trace().unwrap().makespan())
        })
        .skip(1)
        .unzip();
    wall.sort_by(f64::total_cmp);
    outside.sort_by(f64::total_cmp);
    (wall[wall.len() / 2], outside[outside.len() / 2])
}

#[test]
#[ignore = "benchmark: run with --release -- --ignored --nocapture"]
fn bench_pipeline_split() {
    // Cost-based vs uniform split on a GPT whose head (unembedding and the
    // softmax over the vocabulary) is heavy, S = 2 (one core per stage on
    // this 2-core machine), predicted and measured: the wall step time, and
    // the schedule replayed with each stage's measured median F and B times
    // from a serial run (one task at a time, so no task shares a core).
    // Vocabulary 2048: the head is about a block's cost and a half; 8192:
    // about four blocks'.
    for vocab in [2048, 8192] {
        bench_split_on(vocab);
    }
}

/// Per stage, the (forward, backward) task time `pick` chooses from the
/// trace's durations of that stage and phase, and the 1F1B schedule of
/// 2 stages and 8 microbatches replayed with those times.
fn replay(t: &weft_compiler::stages::Trace, pick: fn(Vec<f64>) -> f64) -> (Vec<(f64, f64)>, f64) {
    let time = |s: usize, phase: Phase| {
        pick(t.events.iter().filter(|e| e.stage == s && e.task.phase == phase).map(|e| e.end - e.start).collect())
    };
    let times: Vec<(f64, f64)> = (0..2).map(|s| (time(s, Phase::Forward), time(s, Phase::Backward))).collect();
    let makespan =
        simulate(Schedule::OneFOneB, 2, 8, &|s, ph| if ph == Phase::Forward { times[s].0 } else { times[s].1 })
            .unwrap()
            .makespan();
    (times, makespan)
}

/// The best measurements of one split over the rounds.
struct Best {
    /// The fastest round's median wall step.
    wall: f64,
    /// That round's median time outside the schedule.
    outside: f64,
    /// That round's schedule replayed with its own median task times.
    own_replay: f64,
    /// The fastest serial replay, and its per-stage (F, B) times.
    serial_replay: f64,
    serial_times: Vec<(f64, f64)>,
}

fn bench_split_on(vocab: usize) {
    let heavy = format!("steps = 2\nseed = 3\n[model]\nkind = \"gpt\"\nvocab = {vocab}\nseq = 32\nd_model = 64\nheads = 2\nlayers = 6\nbatch = 16\n[optimizer]\nkind = \"sgd\"\nlr = 0.01\n");
    // Three rounds, the two splits interleaved; the fastest round of each
    // (other work on the machine only slows a round down).
    let splits = ["", "\nsplit = [4, 4]"];
    let mut execs: Vec<_> = splits
        .iter()
        .map(|split| build(&config(&heavy, "stage=2", &format!("stages = 2\nmicrobatches = 8{split}")), "cpu").unwrap())
        .collect();
    let mut best: Vec<Best> = splits
        .iter()
        .map(|_| Best {
            wall: f64::INFINITY,
            outside: f64::INFINITY,
            own_replay: f64::INFINITY,
            serial_replay: f64::INFINITY,
            serial_times: Vec::new(),
        })
        .collect();
    let median = |mut d: Vec<f64>| {
        d.sort_by(f64::total_cmp);
        d[d.len() / 2]
    };
    // The fastest task (the least disturbed).
    let fastest = |d: Vec<f64>| d.into_iter().fold(f64::INFINITY, f64::min);
    for _ in 0..3 {
        for (k, (exec, p)) in execs.iter_mut().enumerate() {
            exec.set_serial(false);
            let (wall, outside) = median_step_outside(exec, p, 6);
            // The same schedule replayed with the concurrent run's own median
            // task times: what is left between it and the wall step is
            // waiting (hand-offs, wake-ups), the rest is tasks slowed down by
            // sharing the cores.
            let (_, own_replay) = replay(exec.last_trace().unwrap(), median);
            exec.set_serial(true);
            median_step(exec, p, 2);
            let (times, serial_replay) = replay(exec.last_trace().unwrap(), fastest);
            let b = &mut best[k];
            if wall < b.wall {
                (b.wall, b.outside, b.own_replay) = (wall, outside, own_replay);
            }
            if serial_replay < b.serial_replay {
                (b.serial_replay, b.serial_times) = (serial_replay, times);
            }
        }
    }
    for (b, (exec, _)) in best.iter().zip(&execs) {
        let r = report(exec).unwrap();
        let times: Vec<String> = b.serial_times.iter().map(|(f, b)| format!("{:.2}+{:.2}", f * 1e3, b * 1e3)).collect();
        println!(
            "heavy head, vocab {vocab}, split {:?}: predicted step {:.2} ms (bubble {:.3}); measured wall step {:.1} ms ({:.1} ms outside the schedule; its own task times replayed {:.1} ms); serial stage F+B ms {times:?}, replayed step {:.1} ms",
            exec.staged().split.counts,
            r.predicted_step * 1e3,
            r.predicted_bubble,
            b.wall * 1e3,
            b.outside * 1e3,
            b.own_replay * 1e3,
            b.serial_replay * 1e3
        );
    }
}

#[test]
fn weft_train_runs_a_pipeline_and_weft_plot_draws_its_timeline() {
    let dir = tempfile::tempdir().unwrap();
    let metrics = dir.path().join("metrics.jsonl");
    let cfg = dir.path().join("pp.toml");
    let text = format!(
        "{}metrics = {:?}\nmesh = \"data=2,stage=2\"\nstrategy = \"dp\"\n[pipeline]\nstages = 2\nmicrobatches = 4\nschedule = \"gpipe\"\n",
        "steps = 3\nseed = 1\n",
        metrics.display().to_string()
    ) + &gpt(8, 2, 32).replace("steps = 2\nseed = 3\n", "");
    std::fs::write(&cfg, text).unwrap();
    let weft = env!("CARGO_BIN_EXE_weft");
    let out = std::process::Command::new(weft).arg("train").arg(&cfg).arg("-q").output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("pipeline: 2 stages, 4 microbatches, schedule gpipe"), "{stdout}");
    assert!(stdout.contains("stage 1: "), "{stdout}");
    assert_eq!(std::fs::read_to_string(&metrics).unwrap().lines().count(), 3);
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("pipeline.json")).unwrap()).unwrap();
    assert_eq!(json["unit_trace"]["events"].as_array().unwrap().len(), 2 * 2 * 4);
    assert_eq!(json["measured_trace"]["events"].as_array().unwrap().len(), 2 * 2 * 4);
    assert!((json["unit_trace"]["bubble"].as_f64().unwrap() - ideal_bubble(Schedule::GPipe, 2, 4)).abs() < 1e-12);
    let svg = dir.path().join("timeline.svg");
    let out = std::process::Command::new(weft)
        .arg("plot")
        .arg(dir.path().join("pipeline.json"))
        .arg("-o")
        .arg(&svg)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let drawn = std::fs::read_to_string(&svg).unwrap();
    for label in ["F0", "B3", "unit_trace", "measured_trace"] {
        assert!(drawn.contains(label), "the timeline has no {label}");
    }
}

#[test]
fn the_example_pipeline_configs_lower_and_train() {
    // examples/configs/pipelined.toml (interleaved) and gpt_3d.toml (data
    // x stage x model): the plan report names the schedule, and two steps
    // train, write the metrics and a checkpoint.
    let weft = env!("CARGO_BIN_EXE_weft");
    let root = env!("CARGO_MANIFEST_DIR");
    for (file, says) in [
        ("pipelined.toml", "schedule interleaved (V=2)"),
        ("gpt_3d.toml", "pipeline: 2 stages, 4 microbatches, schedule 1f1b"),
    ] {
        let config = format!("{root}/examples/configs/{file}");
        let out = std::process::Command::new(weft).arg("lower").arg(&config).output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "lower {file}: {stdout}\n{}", String::from_utf8_lossy(&out.stderr));
        assert!(stdout.contains(says), "lower {file}: {stdout}");
        let dir = tempfile::tempdir().unwrap();
        let metrics = dir.path().join("metrics.jsonl");
        let out = std::process::Command::new(weft)
            .args(["train", &config, "-q", "--steps", "2", "--checkpoint-every", "2"])
            .arg("--metrics")
            .arg(&metrics)
            .arg("--checkpoint-dir")
            .arg(dir.path().join("ckpt"))
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "train {file}: {stdout}\n{}", String::from_utf8_lossy(&out.stderr));
        assert!(stdout.contains(says), "train {file}: {stdout}");
        assert_eq!(std::fs::read_to_string(&metrics).unwrap().lines().count(), 2, "{file}");
        assert!(dir.path().join("ckpt").read_dir().unwrap().count() > 0, "{file}: no checkpoint");
    }
}

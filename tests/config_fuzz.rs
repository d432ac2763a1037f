//! Property: random configs, flags and meshes never panic. Each case is a
//! TOML config drawn by a seeded generator (so a failure names its seed and
//! reproduces) from values chosen to hit edges — 0, 1, bounds, one past
//! them, huge numbers, negatives, NaN and infinities, wrong types, unknown
//! names — and a random mesh. A case must either be rejected with an error
//! or, when accepted, train (at most 2 steps, under a 256 MiB memory limit
//! so an accepted case stays small) without panicking.

use std::panic::{catch_unwind, AssertUnwindSafe};
use weft::runner::{run_session, validate::validate, Overrides, RunConfig};

mod fuzz_support;

use fuzz_support::Rng;

/// An integer-ish TOML value: mostly small valid sizes, sometimes an edge.
fn int(r: &mut Rng, small: &[&str]) -> String {
    const EDGES: &[&str] = &[
        "0",
        "1",
        "-1",
        "1048576",
        "1048577",
        "65536",
        "16777216",
        "4294967296",
        "9223372036854775807",
        "1.5",
        "\"8\"",
        "nan",
    ];
    if r.chance(80) {
        r.pick(small).to_string()
    } else {
        r.pick(EDGES).to_string()
    }
}

/// A float TOML value: mostly valid, sometimes NaN, infinite, negative or 0.
fn float(r: &mut Rng, good: &[&str]) -> String {
    const EDGES: &[&str] = &["nan", "inf", "-inf", "-0.5", "0.0", "1.0", "1e308", "-1e-300", "\"x\"", "3"];
    if r.chance(75) {
        r.pick(good).to_string()
    } else {
        r.pick(EDGES).to_string()
    }
}

fn mesh(r: &mut Rng) -> String {
    const NAMES: &[&str] = &["data", "data", "model", "model", "x", "", "1a", "data "];
    const SIZES: &[&str] =
        &["1", "2", "2", "4", "0", "3", "2048", "4294967296", "18446744073709551615", "-1", "abc", ""];
    // Half the time a mesh the models can run on; else one to three random
    // items, sometimes none (an empty mesh is an error).
    if r.chance(50) {
        return r.pick(&["data=1", "data=2", "data=2,model=2", "model=2"]).to_string();
    }
    let n = if r.chance(5) { 0 } else { 1 + r.below(3) };
    (0..n).map(|_| format!("{}={}", r.pick(NAMES), r.pick(SIZES))).collect::<Vec<_>>().join(",")
}

fn config(r: &mut Rng) -> String {
    let mut s = String::new();
    if !r.chance(3) {
        s += &format!("steps = {}\n", int(r, &["1", "2", "3"]));
    }
    if r.chance(30) {
        s += &format!("seed = {}\n", int(r, &["0", "7", "18446744073709551615"]));
    }
    if r.chance(70) {
        s += &format!("mesh = \"{}\"\n", mesh(r));
    }
    if r.chance(70) {
        s += &format!(
            "strategy = \"{}\"\n",
            r.pick(&["none", "dp", "tp", "fsdp", "fsdp_tp", "zero1", "zero2", "zero3", "zero4"])
        );
    }
    if r.chance(50) {
        s += &format!("backend = \"{}\"\n", r.pick(&["cpu", "cpu", "sim", "interp", "cpu-ref", "tpu"]));
    }
    if r.chance(20) {
        s += &format!("threads = {}\n", int(r, &["1", "2"]));
    }
    if r.chance(5) {
        s += &format!("unknown_key = {}\n", int(r, &["1"]));
    }
    if r.chance(50) {
        s += "[model]\nkind = \"mlp\"\n";
        for (k, small) in [
            ("layers", &["1", "2"][..]),
            ("d", &["4", "8", "16"]),
            ("h", &["4", "8", "32"]),
            ("batch", &["2", "4", "8", "3"]),
        ] {
            if r.chance(70) {
                s += &format!("{k} = {}\n", int(r, small));
            }
        }
    } else {
        let kind = if r.chance(95) {
            if r.chance(80) {
                "gpt"
            } else {
                "llama"
            }
        } else {
            "rnn"
        };
        s += &format!("[model]\nkind = \"{kind}\"\n");
        if kind == "llama" && r.chance(60) {
            s += &format!("kv_heads = {}\n", int(r, &["1", "2", "3"]));
        }
        for (k, small) in [
            ("vocab", &["2", "16", "32"][..]),
            ("seq", &["2", "4", "8"]),
            ("d_model", &["4", "8", "16"]),
            ("heads", &["1", "2", "3"]),
            ("layers", &["1", "2"]),
            ("batch", &["2", "4", "8"]),
        ] {
            if r.chance(70) {
                s += &format!("{k} = {}\n", int(r, small));
            }
        }
        // The GPT's own keys (on the Llama decoder they are errors; mostly
        // left out there so that Llama configs train too).
        let own = kind != "llama" || r.chance(10);
        if own && r.chance(30) {
            s += &format!("dropout = {}\n", float(r, &["0.0", "0.1", "0.5"]));
        }
        if own && r.chance(20) {
            s += &format!("remat = {}\n", r.pick(&["true", "false", "1"]));
        }
        if own && r.chance(20) {
            s += &format!("tie_embeddings = {}\n", r.pick(&["true", "false", "1"]));
        }
    }
    if r.chance(20) {
        s += &format!("compute = \"{}\"\n", r.pick(&["f32", "bf16", "f16", "i32"]));
    }
    if r.chance(70) {
        s += &format!("[optimizer]\nkind = \"{}\"\n", r.pick(&["sgd", "adamw", "adam"]));
        for (k, good) in [
            ("lr", &["0.01", "0.1"][..]),
            ("momentum", &["0.0", "0.9"]),
            ("weight_decay", &["0.0", "1e-4"]),
            ("end_lr", &["0.0", "0.001"]),
            ("clip", &["1.0", "0.5"]),
        ] {
            if r.chance(40) {
                s += &format!("{k} = {}\n", float(r, good));
            }
        }
        for (k, small) in [
            ("warmup_steps", &["0", "1", "5"][..]),
            ("decay_steps", &["0", "2", "10"]),
            ("micro_batches", &["1", "2", "4"]),
        ] {
            if r.chance(40) {
                s += &format!("{k} = {}\n", int(r, small));
            }
        }
    }
    if r.chance(15) {
        s += "[loss_scaling]\n";
        for (k, good) in [("initial_scale", &["32768.0", "1024.0"][..]), ("min_scale", &["1.0", "0.5"])] {
            if r.chance(50) {
                s += &format!("{k} = {}\n", float(r, good));
            }
        }
        if r.chance(50) {
            s += &format!("period = {}\n", int(r, &["1", "2", "2000"]));
        }
    }
    s
}

#[test]
fn random_configs_and_meshes_never_panic() {
    let mut accepted = 0;
    let mut rejected = 0;
    let mut trained = 0;
    let dir = tempfile::tempdir().unwrap();
    for seed in 1..=1500u64 {
        let mut r = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let text = config(&mut r);
        let flag_mesh = r.chance(20).then(|| mesh(&mut r));
        let metrics = dir.path().join(format!("m{seed}.jsonl"));
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            let Ok(mut c) = RunConfig::from_toml(&text) else { return "unparsable" };
            let ov = Overrides { mesh: flag_mesh.clone(), quiet: true, ..Default::default() };
            c = ov.apply(c);
            c.memory_limit = Some("256MiB".into());
            c.metrics = Some(metrics.clone());
            if validate(&c).is_err() {
                return "invalid";
            }
            c.steps = c.steps.min(2);
            match run_session(&c, &ov, &mut |_| {}) {
                Ok(s) => {
                    assert_eq!(s.metrics.len() as u64, c.steps, "an accepted run runs its steps");
                    "trained"
                }
                Err(e) => {
                    eprintln!("seed {seed}: refused after validation: {e}");
                    "refused"
                }
            }
        }));
        match outcome {
            Ok("trained") => trained += 1,
            Ok("refused") => accepted += 1,
            Ok(_) => rejected += 1,
            Err(_) => panic!("seed {seed} panicked on the config\n{text}\nwith --mesh {flag_mesh:?}"),
        }
    }
    // The generator reaches every outcome (so the property is exercised).
    assert!(trained >= 100 && rejected >= 500, "trained {trained}, refused {accepted}, rejected {rejected}");
    eprintln!("trained {trained}, refused after validation {accepted}, rejected {rejected}");
}

#[test]
fn random_mesh_texts_never_panic() {
    let mut r = Rng(0xC0FFEE);
    for _ in 0..2000 {
        let text = mesh(&mut r);
        let got = catch_unwind(|| weft::compiler::sharding::Mesh::parse(&text).ok().map(|m| m.num_devices()));
        match got {
            Ok(Some(n)) => assert!((1..=weft::ir::mesh::MAX_DEVICES).contains(&n), "{text}: {n} devices"),
            Ok(None) => {}
            Err(_) => panic!("Mesh::parse panicked on `{text}`"),
        }
    }
}

/// Property: random program-model tables — `[model.init]` rules,
/// `[shardings]` rules, `[model.inputs]` ranges, loss names and strategies,
/// each drawn from valid values and edge cases — never panic: every case
/// trains or is a named error.
#[test]
fn random_program_tables_never_panic() {
    let program = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/models/mlp.weft");
    let (mut trained, mut refused) = (0, 0);
    // Mostly a valid value, sometimes an edge case.
    let either = |r: &mut Rng, good: &[&'static str], bad: &[&'static str]| {
        if r.chance(85) {
            r.pick(good)
        } else {
            r.pick(bad)
        }
    };
    for seed in 1..=300u64 {
        let mut r = Rng(seed.wrapping_mul(0xD1B5_4A32_D192_ED03));
        let mesh = either(&mut r, &["data=2,model=2", "data=2", "data=4"], &["model=2", "data=3", ""]);
        let strategy = either(&mut r, &["dp", "fsdp", "zero1", "zero3", "none", "auto"], &["tp", "fsdp_tp"]);
        let mut s = format!("steps = 1\nmesh = \"{mesh}\"\nstrategy = \"{strategy}\"\n");
        s += &format!("[model]\nprogram = \"{}\"\n", program.display());
        if r.chance(5) {
            s += &format!("loss = \"{}\"\n", r.pick(&["loss", "forward", ""]));
        }
        if r.chance(5) {
            s += &format!(
                "[model.inputs]\n{} = {{ max = {} }}\n",
                r.pick(&["x", "tokens", "\"\""]),
                int(&mut r, &["4"])
            );
        }
        if r.chance(95) {
            s += "[model.init]\n";
            for _ in 0..r.below(3) {
                let pat = either(&mut r, &["\"params.*.b_up\"", "\"params.l0.*\""], &["\"nothing\"", "\"[\""]);
                let f = either(
                    &mut r,
                    &["zeros", "ones", "normal(0.02)", "uniform(-1, 1)", "constant(2)"],
                    &["normal(-1)", "uniform(1, 0)", "normal(nan)", "normal", "fan_in(3)", "", "normal(1e400)"],
                );
                s += &format!("{pat} = \"{f}\"\n");
            }
            s += &format!("\"params.*\" = \"{}\"\n", either(&mut r, &["fan_in", "normal(0.1)"], &["gauss"]));
        }
        if r.chance(50) {
            s += "[shardings]\n";
            for _ in 0..r.below(3) + 1 {
                let pat = either(
                    &mut r,
                    &["\"params.*.w_up\"", "\"params.*.w_down\"", "\"x\"", "\"params.*.b_up\""],
                    &["\"zz\"", "\"*\""],
                );
                let sh = either(
                    &mut r,
                    &["[{}, {model}]", "[{model}, {}]", "[{data}, {?}]", "[{}, {}]", "[{?}, {?}]"],
                    &["[{model}]", "[{}]", "[{expert}, {}]", "[{data", "[{data}, {data}]", "[]"],
                );
                s += &format!("{pat} = \"{sh}\"\n");
            }
        }
        if trains_or_refuses(seed, &s) {
            trained += 1;
        } else {
            refused += 1;
        }
    }
    assert!(trained >= 20 && refused >= 100, "trained {trained}, refused {refused}");
    eprintln!("program tables: trained {trained}, refused {refused}");
}

/// Property: random `[data]` and `[pipeline]` tables (with meshes that
/// have a stage axis or not) never panic: every case trains its steps or
/// is a named error. The data are a small token file (ids below 16) and
/// its validation split; paths, dtypes, prefetch depths, evaluation
/// periods, stage counts, splits (up to ones that wrap past 2^64), axes
/// and schedules are drawn from valid values and edges.
#[test]
fn random_data_and_pipeline_tables_never_panic() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = |n: usize| -> Vec<u8> { (0..n).flat_map(|i| ((i * 7 % 16) as u16).to_le_bytes()).collect() };
    std::fs::write(dir.path().join("train.bin"), tokens(4096)).unwrap();
    std::fs::write(dir.path().join("val.bin"), tokens(512)).unwrap();
    std::fs::write(dir.path().join("odd.bin"), [1u8, 2, 3]).unwrap();
    let path = |n: &str| dir.path().join(n).display().to_string();
    let (mut trained, mut refused) = (0, 0);
    let either = |r: &mut Rng, good: &[&'static str], bad: &[&'static str]| {
        if r.chance(80) {
            r.pick(good)
        } else {
            r.pick(bad)
        }
    };
    for seed in 1..=300u64 {
        let mut r = Rng(seed.wrapping_mul(0xA076_1D64_78BD_642F));
        let pipelined = r.chance(50);
        let mesh = if pipelined {
            either(&mut r, &["stage=2", "stage=2,data=2", "data=2,stage=2"], &["data=2", "stage=3", "stage=0", ""])
        } else {
            either(&mut r, &["data=1", "data=2"], &["data=2,,x=1", "model=-1"])
        };
        let mut s = format!("steps = 2\nmesh = \"{mesh}\"\n");
        s += "[model]\nkind = \"gpt\"\nvocab = 16\nseq = 4\nd_model = 8\nheads = 2\nlayers = 2\nbatch = 4\n";
        if r.chance(85) {
            s += &format!("[data]\nsource = \"{}\"\n", either(&mut r, &["tokens"], &["table", "text", ""]));
            s += &format!(
                "train = \"{}\"\n",
                path(either(&mut r, &["train.bin"], &["missing.bin", "odd.bin", "val.bin"]))
            );
            if r.chance(50) {
                s += &format!("val = \"{}\"\n", path(either(&mut r, &["val.bin"], &["missing.bin", "odd.bin"])));
            }
            if r.chance(40) {
                s += &format!("dtype = \"{}\"\n", either(&mut r, &["u16"], &["u32", "u8", "f32"]));
            }
            if r.chance(40) {
                s += &format!("shuffle = {}\n", either(&mut r, &["true", "false"], &["1", "\"yes\""]));
            }
            if r.chance(50) {
                s += &format!("prefetch = {}\n", either(&mut r, &["0", "1", "2"], &["1024", "1025", "-1", "nan"]));
            }
            if r.chance(40) {
                s += &format!("eval_every = {}\n", either(&mut r, &["0", "1"], &["-1", "1e3", "18446744073709551616"]));
            }
            if r.chance(30) {
                s += &format!("eval_batches = {}\n", either(&mut r, &["1", "2"], &["0", "1000001"]));
            }
        }
        if pipelined || r.chance(10) {
            s += &format!("[pipeline]\nstages = {}\n", either(&mut r, &["2"], &["0", "1", "3", "9999"]));
            if r.chance(50) {
                s += &format!("microbatches = {}\n", either(&mut r, &["1", "2", "4"], &["0", "3", "8"]));
            }
            if r.chance(40) {
                s += &format!("schedule = \"{}\"\n", either(&mut r, &["gpipe", "1f1b"], &["zb", ""]));
            }
            if r.chance(40) {
                let split = either(
                    &mut r,
                    &["[2, 2]", "[1, 3]", "[3, 1]"],
                    &["[4, 0]", "[1, 1]", "[2, 2, 2]", "[]", "[9223372036854775808, 9223372036854775812]", "[-1, 5]"],
                );
                s += &format!("split = {split}\n");
            }
            if r.chance(20) {
                s += &format!("axis = \"{}\"\n", either(&mut r, &["stage"], &["data", "model", ""]));
            }
            if r.chance(20) {
                s += &format!("memory_budget = \"{}\"\n", either(&mut r, &["1GiB"], &["1B", "nan", "-1", ""]));
            }
        }
        if trains_or_refuses(seed, &s) {
            trained += 1;
        } else {
            refused += 1;
        }
    }
    assert!(trained >= 40 && refused >= 100, "trained {trained}, refused {refused}");
    eprintln!("data and pipeline tables: trained {trained}, refused {refused}");
}

/// Runs config `s` (under a 256 MiB memory limit): true when it trains all
/// its steps, false when it is refused with an error (unparsable, invalid,
/// or refused after validation); a panic fails the test, naming the seed.
fn trains_or_refuses(seed: u64, s: &str) -> bool {
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        let Ok(mut c) = RunConfig::from_toml(s) else { return false };
        c.memory_limit = Some("256MiB".into());
        if validate(&c).is_err() {
            return false;
        }
        match run_session(&c, &Overrides { quiet: true, ..Default::default() }, &mut |_| {}) {
            Ok(summary) => {
                assert_eq!(summary.metrics.len() as u64, c.steps, "an accepted run runs its steps");
                true
            }
            Err(_) => false,
        }
    }));
    outcome.unwrap_or_else(|_| panic!("seed {seed} panicked on the config\n{s}"))
}

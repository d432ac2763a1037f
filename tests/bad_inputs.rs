//! Every bad input gets a named error: no panic, abort, hang or silent
//! wrong result. A table of cases — configs, flags, meshes, IR text, data
//! files, checkpoints, metrics — each run through the `weft` binary with
//! the exit code and the words of the error it must give.
//!
//! Exit codes: 2 for a value outside its documented range or a malformed
//! flag (`Error::Invalid`, `Error::Usage`), 1 for everything else (memory
//! limits, program errors, resume errors); 101 (a panic) or a signal
//! (abort) never.

use std::path::Path;
use std::process::Command;

const MLP: &str = "steps = 2\n[model]\nkind = \"mlp\"\n";

/// One case: files to write (name, contents; `{dir}` is replaced by the
/// case's directory), the arguments, environment, and what must come out.
struct Case {
    name: &'static str,
    files: &'static [(&'static str, &'static str)],
    args: &'static [&'static str],
    env: &'static [(&'static str, &'static str)],
    code: i32,
    stderr: &'static [&'static str],
}

const fn case(
    name: &'static str,
    files: &'static [(&'static str, &'static str)],
    args: &'static [&'static str],
    code: i32,
    stderr: &'static [&'static str],
) -> Case {
    Case { name, files, args, env: &[], code, stderr }
}

fn weft(dir: &Path, args: &[String], env: &[(&str, &str)]) -> (Option<i32>, String, String) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_weft"));
    c.args(args).current_dir(dir).env_remove("WEFT_MEMORY_LIMIT");
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().expect("weft runs");
    (out.status.code(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

/// `n` functions, each calling the next `calls` times; `@main` is the first.
fn call_chain(n: usize, calls: usize) -> String {
    let mut s = String::from("func @main() -> (f32[2]) {\n  %x = constant 1.0 : f32[2]\n");
    let body = |s: &mut String, next: usize| {
        let mut prev = "%x".to_string();
        for c in 0..calls {
            s.push_str(&format!("  %c{c} = call @f{next}({prev})\n"));
            prev = format!("%c{c}");
        }
        s.push_str(&format!("  return {prev}\n}}\n"));
    };
    body(&mut s, 1);
    for i in 1..n {
        s.push_str(&format!("func @f{i}(%x: f32[2]) -> (f32[2]) {{\n"));
        body(&mut s, i + 1);
    }
    s + &format!("func @f{n}(%x: f32[2]) -> (f32[2]) {{\n  %y = tanh %x\n  return %y\n}}\n")
}

fn run_cases(cases: &[Case], extra_files: &[(&str, String)]) {
    let mut failures = Vec::new();
    for c in cases {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().display().to_string();
        for (name, text) in c.files {
            std::fs::write(dir.path().join(name), text.replace("{dir}", &d)).unwrap();
        }
        for (name, text) in extra_files {
            std::fs::write(dir.path().join(name), text).unwrap();
        }
        let args: Vec<String> = c.args.iter().map(|a| a.replace("{dir}", &d)).collect();
        let (code, _stdout, stderr) = weft(dir.path(), &args, c.env);
        if code != Some(c.code) {
            failures.push(format!("{}: exit {code:?}, expected {}; stderr:\n{stderr}", c.name, c.code));
            continue;
        }
        if stderr.contains("panicked") || stderr.contains("RUST_BACKTRACE") {
            failures.push(format!("{}: panicked:\n{stderr}", c.name));
        }
        for want in c.stderr {
            if !stderr.contains(want) {
                failures.push(format!("{}: stderr lacks `{want}`:\n{stderr}", c.name));
            }
        }
    }
    assert!(failures.is_empty(), "{} of {} cases failed:\n\n{}", failures.len(), cases.len(), failures.join("\n\n"));
}

#[test]
#[rustfmt::skip] // one case per line
fn bad_configs_and_flags_name_the_key_value_and_range() {
    run_cases(
        &[
            case("a straggler ratio of 1", &[("c.toml", "steps = 2\n[model]\nkind = \"mlp\"\n[stragglers]\nratio = 1.0\n")], &["train", "c.toml"], 2,
                &["stragglers.ratio = 1: must be a finite number in (1, 1e6]"]),
            case("straggler steps 0", &[("c.toml", "steps = 2\n[model]\nkind = \"mlp\"\n[stragglers]\nsteps = 0\n")], &["train", "c.toml"], 2,
                &["stragglers.steps = 0: must be an integer in [1, "]),
            case("an unknown straggler key", &[("c.toml", "steps = 2\n[model]\nkind = \"mlp\"\n[stragglers]\nratoi = 2.0\n")], &["train", "c.toml"], 2,
                &["unknown field `ratoi`, expected `ratio` or `steps`"]),
            case("a prefetch that is no size", &[("c.toml", "steps = 2\n[model]\nkind = \"mlp\"\n[overlap]\nprefetch = \"nan\"\n")], &["train", "c.toml"], 2,
                &["overlap.prefetch = `nan`", "is not a size"]),
            case("a bucket in parsecs", &[("c.toml", "steps = 2\n[model]\nkind = \"mlp\"\n[overlap]\nbucket = \"12 parsecs\"\n")], &["train", "c.toml"], 2,
                &["overlap.bucket = `12 parsecs`", "unknown unit `parsecs`"]),
            case("an unknown overlap key", &[("c.toml", "steps = 2\n[model]\nkind = \"mlp\"\n[overlap]\nenable = false\n")], &["train", "c.toml"], 2,
                &["unknown field `enable`"]),
            case("a peak of 0 TFLOP/s", &[("c.toml", "steps = 2\npeak_tflops = 0.0\n[model]\nkind = \"mlp\"\n")], &["train", "c.toml"], 2,
                &["peak_tflops = 0: must be a finite number in (0, 1e6]"]),
            case("a NaN peak", &[("c.toml", "steps = 2\npeak_tflops = nan\n[model]\nkind = \"mlp\"\n")], &["train", "c.toml"], 2,
                &["peak_tflops = NaN: must be a finite number in (0, 1e6]"]),
            case("zero experts", &[("c.toml", "steps = 2\n[model]\nkind = \"gpt\"\nexperts = 0\n")], &["train", "c.toml"], 2,
                &["model.experts = 0: must be an integer in [1, 1024]"]),
            case("top_k above the experts", &[("c.toml", "steps = 2\n[model]\nkind = \"gpt\"\nexperts = 4\ntop_k = 5\n")], &["train", "c.toml"], 2,
                &["model.top_k = 5: must be at most model.experts = 4"]),
            case("a capacity factor of 0", &[("c.toml", "steps = 2\n[model]\nkind = \"gpt\"\nexperts = 4\ncapacity_factor = 0.0\n")], &["train", "c.toml"], 2,
                &["model.capacity_factor = 0: must be a finite number in (0, 1000]"]),
            case("moe_every past the layers", &[("c.toml", "steps = 2\n[model]\nkind = \"gpt\"\nlayers = 2\nexperts = 4\nmoe_every = 3\n")], &["train", "c.toml"], 2,
                &["model.moe_every = 3: must be at most model.layers = 2"]),
            case("a negative aux loss weight", &[("c.toml", "steps = 2\n[model]\nkind = \"gpt\"\nexperts = 2\naux_loss_weight = -1.0\n")], &["train", "c.toml"], 2,
                &["model.aux_loss_weight = -1: must be a finite number in [0, 1000]"]),
            case("MoE keys without experts", &[("c.toml", "steps = 2\n[model]\nkind = \"gpt\"\ntop_k = 1\n")], &["train", "c.toml"], 2,
                &["`top_k` configures the mixture-of-experts blocks, which need `experts`"]),
            case("more expert shards than experts", &[("c.toml", "steps = 2\nmesh = \"expert=8\"\nstrategy = \"dp\"\n[model]\nkind = \"gpt\"\nbatch = 8\nexperts = 4\n")], &["train", "c.toml"], 1,
                &["4 is not divisible by 8"]),
            case("mlp width 0", &[("c.toml", "steps = 2\n[model]\nkind = \"mlp\"\nd = 0\n")], &["train", "c.toml"], 2,
                &["error: model.d = 0: must be an integer in [1, 1048576]"]),
            case("mlp hidden 0", &[("c.toml", "steps = 2\n[model]\nkind = \"mlp\"\nh = 0\n")], &["train", "c.toml"], 2,
                &["model.h = 0"]),
            case("mlp batch 0", &[("c.toml", "steps = 2\n[model]\nkind = \"mlp\"\nbatch = 0\n")], &["train", "c.toml"], 2,
                &["model.batch = 0"]),
            case("gpt vocabulary 0", &[("c.toml", "steps = 2\n[model]\nkind = \"gpt\"\nvocab = 0\n")], &["train", "c.toml"], 2,
                &["model.vocab = 0: must be an integer in [2, 16777216]"]),
            case("gpt sequence 0", &[("c.toml", "steps = 2\n[model]\nkind = \"gpt\"\nseq = 0\n")], &["train", "c.toml"], 2,
                &["model.seq = 0"]),
            case("gpt model dim 0", &[("c.toml", "steps = 2\n[model]\nkind = \"gpt\"\nd_model = 0\n")], &["train", "c.toml"], 2,
                &["model.d_model = 0"]),
            case("gpt heads do not divide", &[("c.toml", "steps = 2\n[model]\nkind = \"gpt\"\nheads = 3\n")], &["train", "c.toml"], 2,
                &["model.heads = 3: must divide model.d_model = 16"]),
            case("batch of i64::MAX", &[("c.toml", "steps = 2\n[model]\nkind = \"mlp\"\nbatch = 9223372036854775807\n")],
                &["train", "c.toml"], 2, &["model.batch = 9223372036854775807: must be an integer in [1, 1048576]"]),
            case("negative batch", &[("c.toml", "steps = 2\n[model]\nkind = \"mlp\"\nbatch = -1\n")], &["train", "c.toml"], 2,
                &["c.toml", "invalid value"]),
            case("NaN learning rate", &[("c.toml", "steps = 2\n[model]\nkind = \"mlp\"\n[optimizer]\nlr = nan\n")],
                &["train", "c.toml"], 2, &["optimizer.lr = NaN: must be a finite number in (0, ∞)"]),
            case("infinite learning rate", &[("c.toml", "steps = 2\n[model]\nkind = \"mlp\"\n[optimizer]\nlr = inf\n")],
                &["train", "c.toml"], 2, &["optimizer.lr = inf"]),
            case("negative clip norm", &[("c.toml", "steps = 2\n[model]\nkind = \"mlp\"\n[optimizer]\nclip = -1.0\n")],
                &["train", "c.toml"], 2, &["optimizer.clip = -1: must be a finite number in (0, ∞)"]),
            case("negative dropout", &[("c.toml", "steps = 2\n[model]\nkind = \"gpt\"\ndropout = -0.5\n")], &["train", "c.toml"], 2,
                &["model.dropout = -0.5: must be a finite number in [0, 1)"]),
            case("dropout masks past 2^32 elements", &[("c.toml", "steps = 2\n[model]\nkind = \"gpt\"\ndropout = 0.1\nbatch = 65536\nseq = 256\n")],
                &["train", "c.toml"], 2, &["model.dropout = 0.1: dropout needs fewer than 2^32 elements per mask, but batch x heads x seq x seq = 8589934592"]),
            case("dropout 1", &[("c.toml", "steps = 2\n[model]\nkind = \"gpt\"\ndropout = 1.0\n")], &["train", "c.toml"], 2,
                &["model.dropout = 1"]),
            case("tie_embeddings not a boolean", &[("c.toml", "steps = 2\n[model]\nkind = \"gpt\"\ntie_embeddings = 1\n")],
                &["train", "c.toml"], 2, &["c.toml", "line 4", "tie_embeddings = 1", "invalid type: integer `1`, expected a boolean"]),
            case("remat not a boolean", &[("c.toml", "steps = 2\n[model]\nkind = \"gpt\"\nremat = \"yes\"\n")],
                &["train", "c.toml"], 2, &["c.toml", "line 4", "remat = \"yes\"", "expected a boolean"]),
            case("model kind unknown", &[("c.toml", "steps = 2\n[model]\nkind = \"cnn\"\n")],
                &["train", "c.toml"], 2, &["c.toml", "unknown variant `cnn`, expected `mlp`, `gpt` or `llama`"]),
            case("tie_embeddings on the mlp", &[("c.toml", "steps = 2\n[model]\nkind = \"mlp\"\ntie_embeddings = true\n")],
                &["train", "c.toml"], 2, &["c.toml", "unknown field `tie_embeddings`: it is a key of model.kind = \"gpt\", not \"mlp\""]),
            case("loss scale 0", &[("c.toml", "steps = 2\n[model]\nkind = \"mlp\"\n[loss_scaling]\ninitial_scale = 0.0\n")],
                &["train", "c.toml"], 2, &["loss_scaling.initial_scale = 0: must be a finite number in (0, 1e38]"]),
            case("loss scale period 0", &[("c.toml", "steps = 2\n[model]\nkind = \"mlp\"\n[loss_scaling]\nperiod = 0\n")],
                &["train", "c.toml"], 2, &["loss_scaling.period = 0: must be an integer in [1, 2147483647]"]),
            case("min loss scale above the initial", &[("c.toml", "steps = 2\n[model]\nkind = \"mlp\"\n[loss_scaling]\ninitial_scale = 2.0\nmin_scale = 4.0\n")],
                &["train", "c.toml"], 2, &["loss_scaling.min_scale = 4: must be at most loss_scaling.initial_scale = 2"]),
            case("unknown loss-scaling key", &[("c.toml", "steps = 2\n[model]\nkind = \"mlp\"\n[loss_scaling]\nscale = 2.0\n")],
                &["train", "c.toml"], 2, &["c.toml", "unknown field `scale`"]),
            case("momentum 1", &[("c.toml", "steps = 2\n[model]\nkind = \"mlp\"\n[optimizer]\nmomentum = 1.0\n")],
                &["train", "c.toml"], 2, &["optimizer.momentum = 1"]),
            case("micro-batches do not divide", &[("c.toml", "steps = 2\n[model]\nkind = \"mlp\"\n[optimizer]\nmicro_batches = 3\n")],
                &["train", "c.toml"], 2, &["optimizer.micro_batches = 3: must divide model.batch = 8"]),
            case("decay before warmup", &[("c.toml", "steps = 2\n[model]\nkind = \"mlp\"\n[optimizer]\nwarmup_steps = 10\ndecay_steps = 5\n")],
                &["train", "c.toml"], 2, &["optimizer.decay_steps = 5: must be 0 (no decay) or at least optimizer.warmup_steps = 10"]),
            case("compute dtype", &[("c.toml", "steps = 2\n[model]\nkind = \"mlp\"\ncompute = \"i32\"\n")], &["train", "c.toml"], 2,
                &["model.compute = `i32`: must be one of `f32`, `bf16`, `f16`, `f64`"]),
            case("optimizer kind", &[("c.toml", "steps = 2\n[model]\nkind = \"mlp\"\n[optimizer]\nkind = \"adam\"\n")],
                &["train", "c.toml"], 2, &["optimizer.kind = `adam`: must be one of `sgd`, `adamw`"]),
            case("unknown key", &[("c.toml", "steps = 2\nstpes = 3\n[model]\nkind = \"mlp\"\n")], &["train", "c.toml"], 2,
                &["c.toml", "unknown field `stpes`"]),
            case("keep_last 0", &[("c.toml", "steps = 2\n[model]\nkind = \"mlp\"\n[checkpoint]\ndir = \"ck\"\nkeep_last = 0\n")],
                &["train", "c.toml"], 2, &["checkpoint.keep_last = 0"]),
            case("checkpoint without dir", &[("c.toml", "steps = 2\n[model]\nkind = \"mlp\"\n[checkpoint]\nevery = 1\n")],
                &["train", "c.toml"], 2, &["checkpoint.dir (--checkpoint-dir)", "needs a `dir`"]),
            case("--steps 0", &[("c.toml", MLP)], &["train", "c.toml", "--steps", "0"], 2,
                &["steps (--steps) = 0: must be an integer in [1, 1000000000000]"]),
            case("--steps u64::MAX", &[("c.toml", MLP)], &["train", "c.toml", "--steps", "18446744073709551615"], 2,
                &["steps (--steps) = 18446744073709551615"]),
            case("--threads 0", &[("c.toml", MLP)], &["train", "c.toml", "--threads", "0"], 2, &["threads (--threads) = 0"]),
            case("--checkpoint-every 0", &[("c.toml", MLP)], &["train", "c.toml", "--checkpoint-dir", "ck", "--checkpoint-every", "0"],
                2, &["checkpoint.every (--checkpoint-every) = 0"]),
            case("--strategy unknown", &[("c.toml", MLP)], &["train", "c.toml", "--strategy", "zero4"], 2,
                &["strategy (--strategy) = `zero4`: must be one of `none`, `dp`"]),
            case("--backend unknown", &[("c.toml", MLP)], &["train", "c.toml", "--backend", "tpu"], 2,
                &["backend (--backend) = `tpu`"]),
            case("--memory-limit malformed", &[("c.toml", MLP)], &["train", "c.toml", "--memory-limit", "lots"], 2,
                &["memory_limit (--memory-limit) = `lots`: unknown unit"]),
            case("--memory-limit NaN", &[("c.toml", MLP)], &["train", "c.toml", "--memory-limit", "nan"], 2,
                &["memory_limit (--memory-limit) = `nan`"]),
        ],
        &[],
    );
}

#[test]
#[rustfmt::skip] // one case per line
fn sizes_beyond_memory_are_refused_before_allocating() {
    let big_mlp = "steps = 2\n[model]\nkind = \"mlp\"\nd = 1000000\nh = 1000000\n";
    let big_gpt = "steps = 2\n[model]\nkind = \"gpt\"\nvocab = 16777216\nd_model = 65536\nheads = 1\n";
    let cases = [
        Case {
            name: "mlp widths in the millions, machine memory",
            files: &[],
            args: &["train", "big_mlp.toml"],
            env: &[],
            code: 1,
            stderr: &["the run (mlp with 4000000000000 parameters", "more than the memory limit of", "MemTotal"],
        },
        case("mlp widths in the millions, --memory-limit", &[], &["train", "big_mlp.toml", "--memory-limit", "1GiB"], 1,
            &["needs 43.7 TiB (48000256000000 bytes), more than the memory limit of 1.0 GiB (1073741824 bytes, from memory_limit (--memory-limit))"]),
        case("gpt vocabulary in the millions", &[], &["train", "big_gpt.toml", "--memory-limit", "16GiB"], 1,
            &["the run (gpt with", "more than the memory limit of 16.0 GiB"]),
        Case {
            name: "WEFT_MEMORY_LIMIT below a small run",
            files: &[("c.toml", MLP)],
            args: &["train", "c.toml"],
            env: &[("WEFT_MEMORY_LIMIT", "1KiB")],
            code: 1,
            stderr: &["more than the memory limit of 1.0 KiB (1024 bytes, from WEFT_MEMORY_LIMIT)"],
        },
        Case {
            name: "WEFT_MEMORY_LIMIT malformed",
            files: &[("c.toml", MLP)],
            args: &["train", "c.toml"],
            env: &[("WEFT_MEMORY_LIMIT", "-3GiB")],
            code: 1,
            stderr: &["WEFT_MEMORY_LIMIT", "`-3GiB`: must be a size between 1 byte"],
        },
        case("the compiled step over the limit", &[("c.toml", "steps = 2\n[model]\nkind = \"mlp\"\nd = 256\nh = 1024\nbatch = 64\n")],
            &["train", "c.toml", "--mesh", "data=8", "--strategy", "dp", "--memory-limit", "30MiB"], 1,
            &["the partitioned training step (8 devices x", "more than the memory limit of 30.0 MiB"]),
        case("a 1e13-element constant", &[("p.weft", "func @main() -> (f32[10000000000000]) {\n  %c = constant 1.0 : f32[10000000000000]\n  return %c\n}\n")],
            &["run", "p.weft"], 1, &["@main (peak of live tensors) needs 36.4 TiB (40000000000000 bytes), more than the memory limit"]),
        case("a 1e10-element iota", &[("p.weft", "func @main() -> (i32[100000,100000]) {\n  %c = iota {dim = 0} : i32[100000,100000]\n  return %c\n}\n")],
            &["run", "p.weft", "--memory-limit", "1GiB"], 1, &["needs 37.3 GiB (40000000000 bytes), more than the memory limit of 1.0 GiB"]),
        case("a 1e18-element constant", &[("p.weft", "func @main() -> (f32[1000000000000000000]) {\n  %c = constant 1.0 : f32[1000000000000000000]\n  return %c\n}\n")],
            &["run", "p.weft"], 1, &["p.weft:1:18: error: type f32[1000000000000000000] has too many elements"]),
        case("a type whose size overflows", &[("p.weft", "func @main(%x: f32[4294967296,4294967296,16]) -> (f32[2]) {\n  %c = constant 1.0 : f32[2]\n  return %c\n}\n")],
            &["check", "p.weft"], 1, &["has too many elements"]),
        case("run --memory-limit malformed", &[("p.weft", "func @main() -> (f32[2]) {\n  %c = constant 1.0 : f32[2]\n  return %c\n}\n")],
            &["run", "p.weft", "--memory-limit", "1 parsec"], 2, &["--memory-limit", "unknown unit `parsec`"]),
    ];
    run_cases(&cases, &[("big_mlp.toml", big_mlp.to_string()), ("big_gpt.toml", big_gpt.to_string())]);
}

const PROGRAM: &str = "func @main(%x: f32[8,16], %w: f32[16,4]) -> (f32[8,4]) {
  %y = dot_general %x, %w {lhs_contract = [1], rhs_contract = [0]}
  return %y
}
";

#[test]
#[rustfmt::skip] // one case per line
fn bad_meshes_are_named_errors() {
    run_cases(
        &[
            case("train: axis sizes whose product overflows", &[("c.toml", MLP)],
                &["train", "c.toml", "--mesh", "data=4294967296,model=4294967296"], 2,
                &["mesh (--mesh) = `data=4294967296,model=4294967296`: the axis sizes multiply to more than 18446744073709551615 devices"]),
            case("train: one huge axis", &[("c.toml", MLP)], &["train", "c.toml", "--mesh", "data=100000000000"], 2,
                &["100000000000 devices, more than the limit of 1048576"]),
            case("train: more devices than a run may simulate", &[("c.toml", MLP)], &["train", "c.toml", "--mesh", "data=2048"], 2,
                &["2048 devices, more than the 1024 a training run may have"]),
            case("train: axis of size 0", &[("c.toml", MLP)], &["train", "c.toml", "--mesh", "data=0"], 2, &["axis `data` has size 0"]),
            case("train: negative size", &[("c.toml", MLP)], &["train", "c.toml", "--mesh", "data=-2"], 2,
                &["axis `data` has size -2: a size is a whole number ≥ 1"]),
            case("train: a size that is not a number", &[("c.toml", MLP)], &["train", "c.toml", "--mesh", "data=two"], 2,
                &["the size of axis `data` is `two`, not a whole number ≥ 1"]),
            case("train: an empty mesh", &[("c.toml", MLP)], &["train", "c.toml", "--mesh", ""], 2,
                &["mesh (--mesh) = ``: an empty mesh", "`data=1` for one device"]),
            case("train: an empty item", &[("c.toml", MLP)], &["train", "c.toml", "--mesh", "data=2,,model=4"], 2,
                &["item 2 is empty"]),
            case("train: a trailing comma", &[("c.toml", MLP)], &["train", "c.toml", "--mesh", "data=2,"], 2,
                &["item 2 is empty"]),
            case("train: axis twice", &[("c.toml", MLP)], &["train", "c.toml", "--mesh", "data=2,data=2"], 2,
                &["axis `data` appears twice"]),
            case("shard: product overflows", &[("p.weft", PROGRAM)], &["shard", "p.weft", "--mesh", "a=4294967296,b=4294967296"], 2,
                &["--mesh", "multiply to more than"]),
            case("shard --auto: product overflows", &[("p.weft", PROGRAM)],
                &["shard", "p.weft", "--auto", "--mesh", "a=4294967296,b=4294967296"], 2, &["multiply to more than"]),
            case("shard --auto: one huge axis", &[("p.weft", PROGRAM)], &["shard", "p.weft", "--auto", "--mesh", "a=100000000000"], 2,
                &["more than the limit of 1048576"]),
            case("lower: mesh comment overflows", &[("p.weft", "// mesh: a=4294967296,b=4294967296\nfunc @main(%x: f32[8]) -> (f32[8]) {\n  %y = tanh %x\n  return %y\n}\n")],
                &["lower", "p.weft"], 1, &["multiply to more than"]),
        ],
        &[],
    );
}

#[test]
#[rustfmt::skip] // one case per line
fn bad_programs_are_named_errors_without_recursion_or_blow_up() {
    // The check is linear in the chain (each call's callee found through an
    // index, not a scan): 100,000 nested calls are named in about 0.6 s
    // (BENCHMARKS.md), where a scan per call took 16 s.
    let deep = call_chain(100_000, 1);
    let too_deep = call_chain(100, 1);
    let doubling = call_chain(60, 2);
    let nested = format!("func @main() -> (f32[1]) {{\n  %c = constant {}1{} : f32[1]\n  return %c\n}}\n", "[".repeat(100_000), "]".repeat(100_000));
    run_cases(
        &[
            case("a chain of 100000 calls", &[], &["check", "deep.weft"], 1,
                &["error: in @main: calls nested 100000 deep, more than the limit of 64: @main -> @f1 -> @f2 -> @f3 -> ... -> @f99999 -> @f100000"]),
            case("a chain of 100 calls, run", &[], &["run", "too_deep.weft"], 1, &["calls nested 100 deep, more than the limit of 64"]),
            case("each function calls the next twice, run", &[], &["run", "doubling.weft"], 1,
                &["inlining @main would expand it to 1152921504606846977 instructions, more than the limit of 4194304; the calls that multiply it: @main -> @f1 (2 calls) -> @f2 (2 calls)"]),
            case("each function calls the next twice, shard", &[], &["shard", "doubling.weft", "--mesh", "a=2"], 1,
                &["inlining @main would expand it"]),
            case("each function calls the next twice, lower", &[], &["lower", "doubling.weft", "--mesh", "a=2"], 1,
                &["inlining @main would expand it"]),
            case("literal nested 100000 deep", &[], &["check", "nested.weft"], 1, &["nesting deeper than 256 levels"]),
            case("recursion", &[("p.weft", "func @a(%x: f32[2]) -> (f32[2]) {\n  %y = call @b(%x)\n  return %y\n}\nfunc @b(%x: f32[2]) -> (f32[2]) {\n  %y = call @a(%x)\n  return %y\n}\n")],
                &["check", "p.weft"], 1, &["recursive calls are not allowed: @a -> @b -> @a"]),
        ],
        &[("deep.weft", deep), ("too_deep.weft", too_deep), ("doubling.weft", doubling), ("nested.weft", nested)],
    );
}

/// A safetensors file with the given header and data (to forge bad ones).
fn safetensors(header: &str, data: &[u8]) -> Vec<u8> {
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    out
}

#[test]
#[rustfmt::skip] // one case per line
fn bad_data_files_are_named_errors() {
    use std::collections::BTreeMap;
    use weft::ir::tensor::{write_safetensors, HostTensor};
    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| dir.path().join(n);
    std::fs::write(p("huge.safetensors"), safetensors(r#"{"x":{"dtype":"F32","shape":[1000000000000],"data_offsets":[0,4000000000000]}}"#, &[])).unwrap();
    std::fs::write(p("overflow.safetensors"), safetensors(r#"{"x":{"dtype":"F32","shape":[4294967296,4294967296,4],"data_offsets":[0,16]}}"#, &[0; 16])).unwrap();
    std::fs::write(p("garbage.safetensors"), b"hello").unwrap();
    let t = |shape: &[usize]| HostTensor::from_f32(shape, vec![0.5; shape.iter().product()]).unwrap();
    write_safetensors(p("wrong_shape.safetensors"), &BTreeMap::from([("x".into(), t(&[4, 16])), ("y".into(), t(&[4, 16]))])).unwrap();
    let toks = |v: i32| HostTensor::from_i32(&[8, 8], vec![v; 64]).unwrap();
    write_safetensors(p("tokens.safetensors"), &BTreeMap::from([("tokens".into(), toks(1000)), ("targets".into(), toks(1))])).unwrap();
    write_safetensors(p("params.safetensors"), &BTreeMap::from([("params.nothing".into(), t(&[2]))])).unwrap();
    std::fs::write(p("c.toml"), MLP).unwrap();
    std::fs::write(p("g.toml"), "steps = 2\n[model]\nkind = \"gpt\"\nbatch = 8\n").unwrap();
    std::fs::write(p("p.weft"), "func @main(%x: f32[2]) -> (f32[2]) {\n  %y = tanh %x\n  return %y\n}\n").unwrap();
    let d = dir.path();
    let cases: &[(&[&str], i32, &[&str])] = &[
        (&["run", "p.weft", "--inputs", "huge.safetensors"], 1, &["tensor file huge.safetensors: not a safetensors file"]),
        (&["run", "p.weft", "--inputs", "overflow.safetensors"], 1, &["tensor file overflow.safetensors", "overflow"]),
        (&["run", "p.weft", "--inputs", "garbage.safetensors"], 1, &["tensor file garbage.safetensors"]),
        (&["run", "p.weft", "--inputs", "missing.safetensors"], 1, &["missing.safetensors"]),
        (&["run", "p.weft", "--inputs", "wrong_shape.safetensors"], 1, &["input `x`"]),
        (&["train", "c.toml", "--data", "wrong_shape.safetensors"], 2, &["--data wrong_shape.safetensors", "leaf `x`"]),
        (&["train", "c.toml", "--data", "garbage.safetensors"], 1, &["tensor file garbage.safetensors"]),
        (&["train", "g.toml", "--data", "tokens.safetensors"], 2, &["--data tokens.safetensors: `tokens` holds 1000, outside the vocabulary 0..32"]),
        (&["train", "c.toml", "--init", "params.safetensors"], 2, &["--init params.safetensors"]),
    ];
    let mut failures = Vec::new();
    for (args, code, want) in cases {
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        let (got, _, stderr) = weft(d, &args, &[]);
        if got != Some(*code) || !want.iter().all(|w| stderr.contains(w)) || stderr.contains("panicked") {
            failures.push(format!("{args:?}: exit {got:?} (expected {code}), stderr:\n{stderr}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// Trains `steps` steps of the MLP with checkpoints every 2 under `dir/ck`.
fn train_with_checkpoints(dir: &Path, steps: &str, extra: &[&str]) -> (Option<i32>, String, String) {
    let mut args: Vec<String> =
        ["train", "c.toml", "--checkpoint-dir", "ck", "--checkpoint-every", "2", "-q", "--steps", steps]
            .map(String::from)
            .to_vec();
    args.extend(extra.iter().map(|s| s.to_string()));
    weft(dir, &args, &[])
}

#[test]
fn resume_means_resume() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("c.toml"), MLP).unwrap();
    // No directory: an error, unless asked to start fresh.
    let (code, _, err) = train_with_checkpoints(d, "4", &["--resume"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("error: --resume: the checkpoint directory ck does not exist; pass --resume-or-start"),
        "{err}"
    );
    assert!(!d.join("ck").exists(), "a failed --resume must not create the directory");
    // An empty directory: no valid checkpoint.
    std::fs::create_dir(d.join("ck")).unwrap();
    let (code, _, err) = train_with_checkpoints(d, "4", &["--resume"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("--resume: no valid checkpoint in ck: it holds none"), "{err}");
    // --resume-or-start starts from 0, with a warning even under -q; with
    // --metrics in a directory that does not exist yet.
    let (code, out, err) = train_with_checkpoints(d, "4", &["--resume-or-start", "--metrics", "new/dir/m.jsonl"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("warning: no valid checkpoint in ck (none yet): starting from step 0"), "{err}");
    assert!(out.contains("step 4 loss"), "{out}");
    assert_eq!(std::fs::read_to_string(d.join("new/dir/m.jsonl")).unwrap().lines().count(), 4);
    // Fewer steps than the checkpoint holds: an error that says so.
    let (code, _, err) = train_with_checkpoints(d, "3", &["--resume"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("--resume: the newest valid checkpoint in ck is at step 4, past the run's 3 steps"), "{err}");
    // Resuming with --metrics in a directory that does not exist yet.
    let (code, out, err) = train_with_checkpoints(d, "6", &["--resume", "--metrics", "other/m.jsonl"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("resuming from step 4\n") && out.contains("step 6 loss"), "{out}");
    assert_eq!(std::fs::read_to_string(d.join("other/m.jsonl")).unwrap().lines().count(), 2);
    // Onto another mesh: a warning that the layout changes.
    let (code, out, err) = train_with_checkpoints(d, "8", &["--resume", "--mesh", "data=2", "--strategy", "fsdp"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("resuming from step 6\n"), "{out}");
    assert!(
        err.contains("warning: the checkpoint at step 6 was saved on mesh data=1; resharding it onto mesh data=2"),
        "{err}"
    );
    assert!(err.contains("state leaves change layout on resume"), "{err}");
    // Every checkpoint corrupt: the skips are reported under -q, and the run
    // is an error, not a silent restart from 0.
    let steps = weft::checkpoint::list_steps(&d.join("ck")).unwrap();
    assert!(steps.len() >= 2, "{steps:?}");
    for s in &steps {
        let m = d.join("ck").join(weft::checkpoint::step_dir_name(*s)).join(weft::checkpoint::MANIFEST);
        std::fs::write(m, "{ corrupt").unwrap();
    }
    let (code, _, err) = train_with_checkpoints(d, "10", &["--resume"]);
    assert_eq!(code, Some(1), "{err}");
    for s in &steps {
        assert!(err.contains(&format!("warning: skipping the checkpoint at step {s}:")), "{err}");
    }
    assert!(err.contains(&format!("no valid checkpoint in ck: all {} are corrupt", steps.len())), "{err}");
    let (code, _, err) = train_with_checkpoints(d, "10", &["--resume-or-start"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("warning: no valid checkpoint in ck (every one is corrupt): starting from step 0"), "{err}");
    // --resume and --resume-or-start together are a usage error.
    let (code, _, err) = train_with_checkpoints(d, "10", &["--resume", "--resume-or-start"]);
    assert_eq!(code, Some(2), "{err}");
}

#[test]
fn bad_metrics_files_are_named_errors() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("garbage.jsonl"), "{\"step\": 0, \"loss\": 1.0}\nnot json\n").unwrap();
    std::fs::write(d.join("nostep.jsonl"), "{\"loss\": 1.0}\n").unwrap();
    std::fs::write(d.join("array.jsonl"), "[1, 2]\n").unwrap();
    std::fs::write(d.join("inf.jsonl"), "{\"step\": 0, \"loss\": \"inf\"}\n").unwrap();
    std::fs::write(d.join("cut.json"), "{\"timings\": ").unwrap();
    let cases: &[(&str, &str)] = &[
        ("cut.json", "cut.json: not JSON"),
        ("garbage.jsonl", "garbage.jsonl:2:"),
        ("nostep.jsonl", "nostep.jsonl:1: no integer `step`"),
        ("array.jsonl", "array.jsonl:1: not a JSON object"),
        ("inf.jsonl", "no finite"),
        ("missing.jsonl", "missing.jsonl"),
    ];
    for (file, want) in cases {
        let args: Vec<String> = ["plot", file, "-o", "out.svg"].map(String::from).to_vec();
        let (code, _, err) = weft(d, &args, &[]);
        assert!(matches!(code, Some(1) | Some(2)), "{file}: exit {code:?}: {err}");
        assert!(err.contains(want), "{file}: {err}");
    }
}

#[test]
fn library_errors_are_named_variants() {
    use weft::compiler::sharding::Mesh;
    use weft::compiler::CompilerError;
    use weft::ir::IrError;
    use weft::runner::{run_session, Overrides, RunConfig};
    let quiet = Overrides { quiet: true, ..Default::default() };
    let c = RunConfig::from_toml("steps = 2\n[model]\nkind = \"mlp\"\nd = 0\n").unwrap();
    let e = run_session(&c, &quiet, &mut |_| {}).unwrap_err();
    assert!(matches!(&e, weft::Error::Invalid { key, value, .. } if key == "model.d" && value == "0"), "{e:?}");
    let mut c = RunConfig::from_toml("steps = 2\n[model]\nkind = \"mlp\"\nd = 1000000\nh = 1000000\n").unwrap();
    c.memory_limit = Some("1GiB".into());
    let e = run_session(&c, &quiet, &mut |_| {}).unwrap_err();
    assert!(
        matches!(&e, weft::Error::Ir(IrError::TooLarge { need, limit, .. }) if *need == 48000256000000 && *limit == 1 << 30),
        "{e:?}"
    );
    let c = RunConfig::from_toml(MLP).unwrap();
    let e = run_session(&c, &Overrides { resume: true, ..quiet.clone() }, &mut |_| {}).unwrap_err();
    assert!(matches!(&e, weft::Error::Resume(_)), "{e:?}");
    let e = Mesh::parse("a=4294967296,b=4294967296").unwrap_err();
    assert!(matches!(&e, CompilerError::InvalidMesh { message, .. } if message.contains("multiply")), "{e:?}");
    assert!(Mesh::new(&[("a", usize::MAX), ("b", 2)]).is_err());
    let m = weft::ir::text::parse_module(&call_chain(60, 2)).unwrap();
    let e = weft::compiler::inline_calls(&m, "main").unwrap_err();
    assert!(matches!(&e, CompilerError::ProgramTooLarge { insts, limit, .. } if *insts > *limit), "{e:?}");
    let e = weft::ir::interp::Interpreter::new(&m).unwrap().run("main", &[]).unwrap_err();
    assert!(
        matches!(&e, IrError::Interp(d) if d.message.contains("more than the interpreter's limit of 16777216")),
        "{e:?}"
    );
    let m = weft::ir::text::parse_module(&call_chain(100, 1)).unwrap();
    let e = weft::ir::verify_module(&m).unwrap_err();
    assert!(matches!(&e, IrError::Verify(d) if d[0].message.contains("calls nested 100 deep")), "{e:?}");
}

#[test]
#[rustfmt::skip] // one case per line
fn negative_numbers_nan_sizes_pipeline_axes_and_divergence_are_named() {
    const PIPE: &str = "steps = 2\nmesh = \"stage=2\"\n[model]\nkind = \"mlp\"\nlayers = 2\n[pipeline]\nstages = 2\n";
    const DIVERGES: &str = "steps = 8\n[model]\nkind = \"mlp\"\n[optimizer]\nkind = \"sgd\"\nlr = 1e30\n[checkpoint]\ndir = \"ck\"\nevery = 1\n";
    run_cases(
        &[
            case("negative seed", &[("c.toml", MLP)], &["train", "c.toml", "--seed", "-1"], 2, &["invalid value '-1' for '--seed"]),
            case("negative steps", &[("c.toml", MLP)], &["train", "c.toml", "--steps", "-3"], 2, &["invalid value '-3' for '--steps"]),
            case("negative validation fraction", &[("in.txt", "some text")], &["data", "prepare", "in.txt", "-o", "out", "--val-fraction", "-1"], 2,
                &["--val-fraction = -1: must be a number in (0, 1)"]),
            case("a memory budget of nan", &[("c.toml", MLP)], &["train", "c.toml", "--strategy", "auto", "--memory-budget", "nan"], 2,
                &["memory_budget (--memory-budget) = `nan`: `nan` is not a size"]),
            case("a memory limit of inf", &[("c.toml", MLP)], &["train", "c.toml", "--memory-limit", "inf"], 2, &["`inf` is not a size"]),
            case("a pipeline split that wraps past 2^64", &[("c.toml", WRAPS)], &["train", "c.toml"], 1,
                &["the split [9223372036854775808, 9223372036854775810] must give each of the 2 stages at least one layer"]),
            case("a pipeline split that wraps past 2^64, lowered", &[("c.toml", WRAPS)], &["lower", "c.toml"], 1,
                &["must give each of the 2 stages at least one layer"]),
            case("no stage axis", &[("c.toml", PIPE)], &["train", "c.toml", "--mesh", "data=2"], 1,
                &["the mesh `data=2` has no axis `stage` (its axes: data); add `stage=2`"]),
            case("the data axis as the stage axis", &[("c.toml", "steps = 2\nmesh = \"data=2\"\n[model]\nkind = \"mlp\"\nlayers = 2\n[pipeline]\nstages = 2\naxis = \"data\"\n")],
                &["train", "c.toml"], 1, &["the data axis splits the batch"]),
            case("a checkpoint directory that is a file", &[("c.toml", MLP), ("afile", "")], &["train", "c.toml", "--checkpoint-dir", "afile"], 1,
                &["afile: it is a file, not a directory"]),
            case("resuming from a checkpoint directory that is a file", &[("c.toml", MLP), ("afile", "")],
                &["train", "c.toml", "--checkpoint-dir", "afile", "--resume"], 1, &["the checkpoint directory afile is a file, not a directory"]),
            case("data prepare into a file", &[("in.txt", "some text here"), ("afile", "")], &["data", "prepare", "in.txt", "-o", "afile"], 1,
                &["afile: is a file; --output must name a directory"]),
            case("an empty validation split", &[("in.txt", "some text here")], &["data", "prepare", "in.txt", "-o", "out", "--val-fraction", "1e-9"], 2,
                &["the validation split would hold 0 tokens (of 14 in all), fewer than the 2 an example needs"]),
            case("a one-token validation split", &[("in.txt", "ab")], &["data", "prepare", "in.txt", "-o", "out", "--val-fraction", "0.99"], 2,
                &["the validation split would hold 1 token (of 2 in all)"]),
            case("JSON that is not a tokenizer", &[("in.txt", "some text here"), ("t.json", "{\"a\": 1}")],
                &["data", "prepare", "in.txt", "-o", "out", "--tokenizer", "t.json"], 1, &["t.json: is JSON but not a tokenizer.json (no `model` section"]),
            case("a tokenizer with 2^32 ids", &[("in.txt", "a a a a a a a a"), ("t.json", BIG_TOKENIZER)],
                &["data", "prepare", "in.txt", "-o", "out", "--tokenizer", "t.json"], 2,
                &["its vocabulary (4294967296 ids) is larger than the largest model.vocab, 16777216"]),
            case("metrics where nothing can be written", &[("c.toml", MLP)], &["train", "c.toml", "--metrics", "/sys/weft-metrics.jsonl"], 1,
                &["error: /sys/weft-metrics.jsonl: "]),
            case("a prefetch queue past the memory limit", &[("c.toml", PREFETCH), ("train.bin", "abcd")], &["train", "c.toml"], 1,
                &["1024 prefetched batches 64.0 MiB", "more than the memory limit of 64.0 MiB"]),
            case("a loss that is NaN from step 1", &[("c.toml", DIVERGES)], &["train", "c.toml", "--metrics", "m.jsonl"], 65,
                &["the run diverged: the loss was not finite for 3 steps in a row (steps 1 to 3)", "last checkpoint is the one of step 1"]),
        ],
        &[],
    );
}

/// A GPT whose `[data]` reader would keep 1,024 batches (64 MiB) ready:
/// alone past the 64 MiB limit (with `prefetch = 2` the run fits).
const PREFETCH: &str = "steps = 2\nmemory_limit = \"64MiB\"\n[model]\nkind = \"gpt\"\nbatch = 512\nseq = 16\nvocab = 256\n[data]\nsource = \"tokens\"\ntrain = \"train.bin\"\nprefetch = 1024\n";

/// A word-level tokenizer whose largest id is 2^32 - 1.
const BIG_TOKENIZER: &str = r#"{"version":"1.0","truncation":null,"padding":null,"added_tokens":[],"normalizer":null,"pre_tokenizer":{"type":"Whitespace"},"post_processor":null,"decoder":null,"model":{"type":"WordLevel","vocab":{"a":4294967295,"[UNK]":0},"unk_token":"[UNK]"}}"#;

/// A `[pipeline] split` whose counts sum to the layer count modulo 2^64.
const WRAPS: &str = "steps = 2\nmesh = \"stage=2\"\n[model]\nkind = \"mlp\"\nlayers = 2\n[pipeline]\nstages = 2\nsplit = [9223372036854775808, 9223372036854775810]\n";

/// A diverging run keeps its metrics (the plot still draws them) and its
/// last checkpoint with a finite loss, and saves none of the others.
#[test]
fn a_diverging_run_keeps_its_metrics_and_last_good_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("c.toml"), "steps = 8\n[model]\nkind = \"mlp\"\n[optimizer]\nkind = \"sgd\"\nlr = 1e30\n")
        .unwrap();
    let args: Vec<String> =
        ["train", "c.toml", "--metrics", "m.jsonl", "--checkpoint-dir", "ck", "--checkpoint-every", "1"]
            .iter()
            .map(|s| s.to_string())
            .collect();
    let (code, _, stderr) = weft(d, &args, &[]);
    assert_eq!(code, Some(65), "a diverged run's own code (weft launch does not restart it): {stderr}");
    let lines = std::fs::read_to_string(d.join("m.jsonl")).unwrap();
    assert_eq!(lines.lines().count(), 4, "steps 0 to 3 are in the metrics: {lines}");
    let steps: Vec<String> = std::fs::read_dir(d.join("ck"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("step_"))
        .collect();
    assert_eq!(steps, ["step_00000001"], "only the state after the finite step is saved");
    let plot: Vec<String> = ["plot", "m.jsonl", "-o", "p.svg"].iter().map(|s| s.to_string()).collect();
    let (code, _, stderr) = weft(d, &plot, &[]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(std::fs::metadata(d.join("p.svg")).unwrap().len() > 0);
    // With `divergence_steps = 0` the same run goes to its end.
    std::fs::write(
        d.join("c0.toml"),
        "steps = 8\ndivergence_steps = 0\n[model]\nkind = \"mlp\"\n[optimizer]\nkind = \"sgd\"\nlr = 1e30\n",
    )
    .unwrap();
    let args: Vec<String> = ["train", "c0.toml", "-q"].iter().map(|s| s.to_string()).collect();
    let (code, _, stderr) = weft(d, &args, &[]);
    assert_eq!(code, Some(0), "{stderr}");
}

/// Two runs whose metrics share a directory keep their own `run.json`
/// (named after each metrics file), not one overwriting the other's.
#[test]
fn runs_sharing_a_metrics_directory_keep_their_own_manifests() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("c.toml"), MLP).unwrap();
    for (name, seed) in [("a", "1"), ("b", "2")] {
        let args: Vec<String> = ["train", "c.toml", "-q", "--seed", seed, "--metrics", &format!("runs/{name}.jsonl")]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let (code, _, stderr) = weft(d, &args, &[]);
        assert_eq!(code, Some(0), "{stderr}");
    }
    for (name, seed) in [("a", 1), ("b", 2)] {
        let m: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(d.join(format!("runs/{name}.run.json"))).unwrap()).unwrap();
        assert_eq!(m["seed"], seed, "{name}");
        assert_eq!(m["config"]["metrics"], format!("runs/{name}.jsonl"));
    }
    assert!(!d.join("runs/run.json").exists());
}

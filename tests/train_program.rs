//! Program models: a model written in the text format (and the same model
//! built in Rust through `weft::Trainer`) trains through the one engine —
//! sharded on `data=2,model=4` under `dp`, `fsdp`, `auto` and `[shardings]`
//! rules, equal to the unsharded interpreter on one device; reruns and
//! resumes bitwise; and every way a program or its tables can be wrong is a
//! named error.

#[path = "../examples/train_own_model.rs"]
mod example;

use std::path::{Path, PathBuf};
use weft::runner::{run_session, Overrides, RunConfig, RunSummary};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `examples/configs/program.toml` for `steps` steps, without files.
fn program_config(steps: u64) -> RunConfig {
    let mut c = RunConfig::load(&root().join("examples/configs/program.toml")).unwrap();
    c.steps = steps;
    c.metrics = None;
    c.checkpoint = None;
    c
}

fn quiet() -> Overrides {
    Overrides { quiet: true, ..Default::default() }
}

fn run(c: &RunConfig) -> RunSummary {
    run_session(c, &quiet(), &mut |_| {}).unwrap_or_else(|e| panic!("{e}"))
}

fn losses(s: &RunSummary) -> Vec<f64> {
    s.metrics.iter().map(|(_, m)| m["loss"]).collect()
}

/// The unsharded interpreter on one device: the oracle.
fn oracle(steps: u64) -> RunSummary {
    let mut c = program_config(steps);
    c.mesh = None;
    c.strategy = None;
    c.shardings.clear();
    c.backend = Some("interp".into());
    run(&c)
}

fn assert_close(what: &str, got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= 1e-5 * w.abs().max(1e-12), "{what}: step {i}: loss {g} vs the interpreter's {w}");
    }
}

#[test]
fn a_program_trains_sharded_like_the_interpreter_on_one_device() {
    let want = oracle(10);
    let l = losses(&want);
    assert!(l[9] < 0.8 * l[0], "the loss falls: {l:?}");
    assert!(want.metrics.iter().all(|(_, m)| m["mae"] > 0.0), "the second result is the metric `mae`");
    for (strategy, rules) in
        [("dp", false), ("fsdp", false), ("auto", false), ("fsdp_tp", true), ("tp", true), ("none", true)]
    {
        let mut c = program_config(10);
        c.strategy = Some(strategy.into());
        if !rules {
            c.shardings.clear();
        }
        let got = run(&c);
        assert_close(&format!("{strategy} (rules: {rules})"), &losses(&got), &l);
        // `mae` is logged for every strategy.
        assert_close(
            &format!("{strategy} mae"),
            &got.metrics.iter().map(|(_, m)| m["mae"]).collect::<Vec<_>>(),
            &want.metrics.iter().map(|(_, m)| m["mae"]).collect::<Vec<_>>(),
        );
    }
}

#[test]
fn a_program_reruns_and_resumes_bitwise() {
    let tmp = tempfile::tempdir().unwrap();
    let with_files = |name: &str, steps: u64| {
        let mut c = program_config(steps);
        c.metrics = Some(tmp.path().join(name).join("metrics.jsonl"));
        c.checkpoint = Some(weft::runner::CheckpointConfig {
            dir: tmp.path().join(name).join("ckpt"),
            every: 5,
            keep_last: 3,
            keep_every: None,
            every_seconds: None,
        });
        c
    };
    let a = run(&with_files("a", 10));
    let b = run(&with_files("b", 10));
    let bits = |s: &RunSummary| s.metrics.iter().map(|(_, m)| m["loss"].to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&a), bits(&b), "a rerun is bitwise");
    // Stop after 5 steps, then resume to 10.
    run(&with_files("c", 5));
    let resumed = run_session(&with_files("c", 10), &Overrides { resume: true, ..quiet() }, &mut |_| {}).unwrap();
    assert_eq!(resumed.metrics.first().map(|(s, _)| *s), Some(5));
    assert_eq!(bits(&resumed), bits(&a)[5..], "a resume is bitwise");
    let read = |n: &str| std::fs::read(tmp.path().join(n).join("metrics.jsonl")).unwrap();
    assert_eq!(read("a"), read("c"), "the resumed metrics file equals the uninterrupted one");
}

#[test]
fn the_rust_example_trains_to_the_text_programs_losses() {
    let rust = example::trainer(6).unwrap().run(&mut |_| {}).unwrap();
    let text = run(&program_config(6));
    assert_eq!(losses(&rust).len(), 6);
    assert_close("the Rust module vs the text program", &losses(&rust), &losses(&text));
}

/// Trains `program` (text) for 2 steps on `data=2,model=2` with the
/// config's `[model]` extras `model_extra` and further tables `tables`.
fn train_text(program: &str, model_extra: &str, tables: &str, strategy: &str) -> Result<RunSummary, String> {
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path().join("m.weft");
    std::fs::write(&p, program).unwrap();
    let text = format!(
        "steps = 2\nmesh = \"data=2,model=2\"\nstrategy = \"{strategy}\"\n[model]\nprogram = \"m.weft\"\n{model_extra}\n{tables}"
    );
    let cfg = tmp.path().join("c.toml");
    std::fs::write(&cfg, text).unwrap();
    let c = RunConfig::load(&cfg).map_err(|e| e.to_string())?;
    run_session(&c, &quiet(), &mut |_| {}).map_err(|e| e.to_string())
}

/// The error of [`train_text`].
fn error_of(program: &str, model_extra: &str, tables: &str, strategy: &str) -> String {
    match train_text(program, model_extra, tables, strategy) {
        Ok(_) => panic!("{program}\n{model_extra}\n{tables}: trained, but an error was expected"),
        Err(e) => e,
    }
}

const LINEAR: &str = "func @loss(%params.w: f32[4,2], %x: f32[8,4], %y: f32[8,2]) -> (f32[]) {
  %p = dot_general %x, %params.w {lhs_contract = [1], rhs_contract = [0]} : f32[8,2]
  %e = sub %p, %y
  %s = mul %e, %e
  %t = reduce_sum %s {dims = [0, 1]} : f32[]
  return %t
}
";
/// [`LINEAR`] with integer targets (converted in the program).
fn int_targets() -> String {
    LINEAR
        .replace("%y: f32[8,2]", "%y: i32[8,2]")
        .replace("%e = sub %p, %y", "%yf = convert %y : f32[8,2]\n  %e = sub %p, %yf")
}

const INIT: &str = "[model.init]\n\"params.*\" = \"normal(0.1)\"";

#[test]
fn the_error_cases_base_program_trains() {
    let s = train_text(LINEAR, INIT, "", "dp").unwrap();
    assert_eq!(s.metrics.len(), 2);
    // An integer input with a range draws its synthetic values below it.
    let ints = int_targets();
    let s = train_text(&ints, "[model.inputs]\ny = { max = 3 }\n[model.init]\n\"params.*\" = \"zeros\"", "", "fsdp")
        .unwrap();
    assert!(s.metrics[0].1["loss"] > 0.0);
}

#[test]
fn every_contract_breach_is_named() {
    let cases: Vec<(String, &str, &str, &str, &str)> = vec![
        (LINEAR.replace("@loss", "@forward"), INIT, "", "dp", "has no function @loss to minimise"),
        (LINEAR.into(), "loss = \"fwd\"\n[model.init]\n\"params.*\" = \"zeros\"", "", "dp", "has no function @fwd"),
        (
            LINEAR.replace("-> (f32[])", "-> (f32[8,2])").replace("return %t", "return %s"),
            INIT,
            "",
            "dp",
            "the loss (the first result of @loss) must be f32[], but it is f32[8,2]",
        ),
        (LINEAR.replace("%params.w", "%w"), "[model.init]\n\"w\" = \"zeros\"", "", "dp", "has no trained parameters"),
        (LINEAR.replace("%x", "%step"), INIT, "", "dp", "takes a name the training step uses"),
        (LINEAR.replace("dot_general", "dot_generl"), INIT, "", "dp", "m.weft: parse error at 2:8"),
        (LINEAR.into(), "", "", "dp", "no [model.init] rule covers params.w"),
        (
            LINEAR.into(),
            "[model.init]\n\"params.v*\" = \"zeros\"\n\"params.*\" = \"zeros\"",
            "",
            "dp",
            "`params.v*` matches no parameter",
        ),
        (LINEAR.into(), "[model.init]\n\"params.*\" = \"gauss(1)\"", "", "dp", "gauss(1)"),
        (
            LINEAR.into(),
            INIT,
            "[shardings]\n\"params.q\" = \"[{}, {model}]\"",
            "dp",
            "`params.q` matches no parameter, batch input or named value",
        ),
        (
            LINEAR.into(),
            INIT,
            "[shardings]\n\"params.w\" = \"[{}, {expert}]\"",
            "dp",
            "names the axis `expert`, which the mesh does not have",
        ),
        (
            LINEAR.into(),
            INIT,
            "[shardings]\n\"params.w\" = \"[{model}]\"",
            "dp",
            "has rank 1, but %params.w is f32[4,2]",
        ),
        (LINEAR.into(), INIT, "[shardings]\n\"params.w\" = \"[{model}, \"", "dp", "[shardings]: \"params.w\""),
        (LINEAR.into(), INIT, "", "tp", "strategy `tp` splits layers by the model's tensor-parallel rules"),
        (LINEAR.into(), "compute = \"bf16\"", "", "dp", "a program's dtypes are its own"),
        (LINEAR.into(), "kind = \"mlp\"", "", "dp", "give one or the other"),
        (int_targets(), INIT, "", "dp", "an integer or bool input needs its range"),
        (
            LINEAR.into(),
            "[model.inputs]\nx = { max = 3 }\n[model.init]\n\"params.*\" = \"zeros\"",
            "",
            "dp",
            "`x` is f32[8,4]: a range is for integer inputs",
        ),
        (LINEAR.into(), "init_from = \"nowhere.safetensors\"", "", "dp", "nowhere.safetensors"),
        (
            LINEAR.into(),
            "[model.inputs]\nz = { max = 3 }\n[model.init]\n\"params.*\" = \"zeros\"",
            "",
            "dp",
            "`z` is not an input of @loss",
        ),
        (
            int_targets(),
            "[model.inputs]\ny = { max = 0 }\n[model.init]\n\"params.*\" = \"zeros\"",
            "",
            "dp",
            "`y`: max = 0 must be in [1, 2^31]",
        ),
        (
            LINEAR
                .replace("-> (f32[])", "-> (f32[], f32[])")
                .replace("return %t", "%lr = reduce_sum %e {dims = [0, 1]} : f32[]\n  return %t, %lr"),
            INIT,
            "",
            "dp",
            "result 1 of @loss is named %lr, a metric the training step logs itself",
        ),
        (
            format!("{LINEAR}func @train_step(%a: f32[]) -> (f32[]) {{\n  return %a\n}}\n"),
            INIT,
            "",
            "dp",
            "defines @train_step, a name the training step gives a function of its own",
        ),
    ];
    for (program, extra, tables, strategy, want) in cases {
        let e = error_of(&program, extra, tables, strategy);
        assert!(e.contains(want), "want `{want}` in:\n{e}\n(model: {extra}; tables: {tables})");
    }
}

#[test]
fn init_from_checks_names_shapes_and_dtypes() {
    let tmp = tempfile::tempdir().unwrap();
    let write = |name: &str, t: weft::ir::tensor::HostTensor| {
        let p = tmp.path().join(name);
        weft::ir::tensor::write_safetensors(&p, &[("params.w".to_string(), t)].into_iter().collect()).unwrap();
        p
    };
    let good = write("good.safetensors", weft::ir::tensor::HostTensor::from_f32(&[4, 2], vec![0.5; 8]).unwrap());
    let bad = write("bad.safetensors", weft::ir::tensor::HostTensor::from_f32(&[2, 4], vec![0.5; 8]).unwrap());
    let extra = |p: &Path| format!("init_from = \"{}\"", p.display());
    let e = error_of(LINEAR, &extra(&bad), "", "dp");
    assert!(e.contains("`params.w` is f32[2,4] but the parameter is f32[4,2]"), "{e}");
    let e = error_of(LINEAR, &format!("{}\n[model.init]\n\"params.*\" = \"zeros\"", extra(&good)), "", "dp");
    assert!(e.contains("either [model.init] rules or init_from"), "{e}");
}

#[test]
fn the_llama_decoder_trains_on_text_with_tensor_parallel_rules() {
    let tmp = tempfile::tempdir().unwrap();
    let texts: Vec<PathBuf> =
        ["specs/training.md", "specs/ir.md", "README.md"].iter().map(|p| root().join(p)).collect();
    let data = tmp.path().join("docs");
    weft::data::prepare::prepare(&texts, &data, 0.1, &weft::data::tokenize::Tokenizer::Bytes).unwrap();
    let config = format!(
        r#"steps = 40
mesh = "data=2,model=4"
strategy = "tp"
[model]
kind = "llama"
vocab = 256
seq = 32
d_model = 32
heads = 4
kv_heads = 2
ffn = 64
layers = 2
batch = 8
[optimizer]
kind = "adamw"
lr = 1e-2
[data]
source = "tokens"
train = "{0}/train.bin"
val = "{0}/val.bin"
eval_every = 20
eval_batches = 2
"#,
        data.display()
    );
    let c = RunConfig::from_toml(&config).unwrap();
    let mut lines = Vec::new();
    let s = run_session(&c, &quiet(), &mut |l| lines.push(format!("{l:?}"))).unwrap();
    let l = losses(&s);
    assert!(l[39] < 0.75 * l[0], "the loss falls: {} -> {}", l[0], l[39]);
    assert_eq!(s.evals.iter().map(|(step, _)| *step).collect::<Vec<_>>(), vec![0, 20, 40]);
    eprintln!("{:?}", s.evals);
    assert!(s.evals[2].1["val_loss"] < s.evals[0].1["val_loss"], "validation improves: {:?}", s.evals);
    // The tensor-parallel rules split the attention and MLP weights.
    assert!(lines.iter().any(|l| l.contains("llama")), "{lines:?}");
}

#[test]
fn weft_model_writes_a_program_that_trains_like_the_built_in_model() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("gpt.weft");
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_weft"))
        .args(["model", root().join("examples/configs/gpt.toml").to_str().unwrap(), "-o", out.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let toml_text = std::fs::read_to_string(tmp.path().join("gpt.toml")).unwrap();
    assert!(toml_text.contains("program = \"gpt.weft\"") && toml_text.contains("[model.init]"), "{toml_text}");
    // The same initial parameters (`--init`) give the same losses, bit for
    // bit: the program is the built-in model's module.
    let builtin = RunConfig::load(&root().join("examples/configs/gpt.toml")).unwrap();
    let program = RunConfig::load(&tmp.path().join("gpt.toml")).unwrap();
    let params = weft::Model::gpt(&builtin.model.gpt().unwrap().unwrap());
    let init = tmp.path().join("init.safetensors");
    let module = params.arch.module(1).unwrap();
    weft::ir::tensor::write_safetensors(&init, &params.initial_params(&module, 0).unwrap()).unwrap();
    // The program draws its own synthetic batch; give both the built-in one.
    let batch = tmp.path().join("batch.safetensors");
    let cfg = builtin.model.gpt().unwrap().unwrap();
    weft::ir::tensor::write_safetensors(&batch, &weft::models::gpt::synthetic_batch(&cfg, 0)).unwrap();
    let with_batch = |mut c: RunConfig| {
        c.steps = 3;
        c.metrics = None;
        c.checkpoint = None;
        let ov = Overrides { init: Some(init.clone()), data: Some(batch.clone()), ..quiet() };
        run_session(&c, &ov, &mut |_| {}).unwrap().metrics.iter().map(|(_, m)| m["loss"].to_bits()).collect::<Vec<_>>()
    };
    assert_eq!(
        with_batch(builtin.clone()),
        with_batch(program.clone()),
        "the exported program equals the built-in GPT"
    );
    // Its own synthetic batch and init rules also train.
    let mut own = program;
    own.steps = 3;
    own.metrics = None;
    own.checkpoint = None;
    assert_eq!(run(&own).metrics.len(), 3);
}

/// A config that overrides one of the model's rules (sequence parallelism
/// off) exports it once: the written `model.toml` loads, with the
/// config's rule.
#[test]
fn weft_model_writes_an_overridden_rule_once() {
    let tmp = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(root().join("examples/configs/gpt.toml")).unwrap();
    let config = tmp.path().join("sp_off.toml");
    std::fs::write(&config, format!("{text}\n[shardings]\n\"residual.*\" = \"[{{?}}, {{?}}, {{?}}]\"\n")).unwrap();
    let out = tmp.path().join("model.weft");
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_weft"))
        .args(["model", config.to_str().unwrap(), "-o", out.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let written = std::fs::read_to_string(tmp.path().join("model.toml")).unwrap();
    assert_eq!(written.matches("\"residual.*\"").count(), 1, "{written}");
    let c = RunConfig::load(&tmp.path().join("model.toml")).unwrap();
    assert!(c.shardings.iter().any(|(p, s)| p == "residual.*" && s == "[{?}, {?}, {?}]"), "{:?}", c.shardings);
}

#[test]
fn a_program_whose_layers_are_calls_trains_pipelined_like_unpipelined() {
    // The built-in GPT's module as a program: its blocks are calls to @block.
    let tmp = tempfile::tempdir().unwrap();
    let cfg = weft::models::gpt::GptConfig { batch: 4, ..Default::default() };
    let module = weft::models::gpt::build(&cfg, &Default::default()).unwrap();
    std::fs::write(tmp.path().join("gpt.weft"), weft::ir::text::print_module(&module)).unwrap();
    let config = |mesh: &str, tail: &str| {
        let text = format!(
            "steps = 3\nmesh = \"{mesh}\"\nstrategy = \"dp\"\n[model]\nprogram = \"gpt.weft\"\n[model.inputs]\ntokens = {{ max = 32 }}\n\
             targets = {{ max = 32 }}\n[model.init]\n\"params.*.g\" = \"ones\"\n\"params.*\" = \"normal(0.02)\"\n{tail}"
        );
        let p = tmp.path().join(format!("{}.toml", mesh.replace(['=', ','], "_")));
        std::fs::write(&p, text).unwrap();
        RunConfig::load(&p).unwrap()
    };
    let want = run(&config("data=2", "[optimizer]\nmicro_batches = 2"));
    let got = run(&config("data=2,stage=2", "[pipeline]\nstages = 2\nmicrobatches = 2"));
    assert_close("pipelined program", &losses(&got), &losses(&want));
}

/// The README's "Train your own model" program and config, pasted as a
/// newcomer would, train (for 3 steps here) and the loss falls.
#[test]
fn the_readme_program_trains() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let start = readme.find("## Train your own model").expect("the README section");
    let section = &readme[start..];
    let block = |fence: &str, from: usize| {
        let at = section[from..].find(fence).expect("a code block") + from + fence.len();
        let end = section[at..].find("```").expect("its end") + at;
        (section[at..end].to_string(), end + 3)
    };
    let (program, next) = block("```\n", 0);
    let (config, _) = block("```toml\n", next);
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("model.weft"), program).unwrap();
    std::fs::write(tmp.path().join("model.toml"), config).unwrap();
    let mut c = RunConfig::load(&tmp.path().join("model.toml")).unwrap();
    c.metrics = None;
    c.steps = 5;
    let l = losses(&run(&c));
    assert!(l[4] < l[0], "the loss falls: {l:?}");
}

/// Micro-batches, loss scaling and a schedule apply to a program
/// as to a built-in model: its batch inputs are one micro-batch, so two
/// micro-batches of the program equal one step of a program twice as wide
/// (within rounding: the sums are split differently).
#[test]
fn micro_batches_and_loss_scaling_apply_to_programs() {
    let wide = LINEAR.replace("[8,", "[16,");
    let extra = "[optimizer]\nkind = \"adamw\"\nlr = 0.01\nwarmup_steps = 1\ndecay_steps = 2\n[loss_scaling]\ninitial_scale = 1024\n";
    let one = train_text(&wide, INIT, extra, "dp").unwrap();
    let two = train_text(LINEAR, INIT, &extra.replace("lr = 0.01", "lr = 0.01\nmicro_batches = 2"), "dp").unwrap();
    assert!(one.metrics.iter().all(|(_, m)| m["loss_scale"] == 1024.0), "loss scaling is on");
    // The program's loss is a sum over its rows: two micro-batches average
    // two half sums, one wide step sums all rows (twice as large).
    let (l1, l2) = (losses(&one), losses(&two));
    for (a, b) in l1.iter().zip(&l2) {
        assert!((a / 2.0 - b).abs() <= 1e-5 * b.abs(), "{l1:?} vs {l2:?}");
    }
}

/// `[shardings]` keeps open dimensions, FSDP adds only the data axes a rule
/// leaves unused, and the PRNG key is never matched by a pattern.
#[test]
fn sharding_rules_compose_with_strategies() {
    use weft::compiler::train::TrainConfig;
    use weft::models::{rules::Rules, Init};
    use weft::strategy::{annotated_module, Strategy};
    let module = weft::ir::text::parse_and_verify(LINEAR).unwrap();
    let model = weft::Model::program("linear", module, "loss", Init::Rules(Rules::default())).unwrap();
    let rules = |pairs: &[(&str, &str)]| {
        Rules::new(pairs.iter().map(|(p, s)| (p.to_string(), weft::ir::text::parse_sharding(s).unwrap())))
    };
    let annotated = |strategy: Strategy, r: &Rules<weft::ir::TensorSharding>| {
        let mut tc = TrainConfig::default();
        let m = annotated_module(strategy, &model, 1, r, &mut tc, &["data", "model"]).unwrap();
        let f = m.function("loss").unwrap();
        let by_name = |n: &str| {
            let i = (0..f.params.len()).find(|&i| f.param_name(i) == n).unwrap();
            f.value(f.params[i]).sharding.as_ref().map(|s| s.to_string()).unwrap_or_default()
        };
        (by_name("params.w"), by_name("x"))
    };
    let open = rules(&[("x", "[{data}, {?}]")]);
    assert_eq!(annotated(Strategy::DataParallel, &open).1, "[{data}, {?}]");
    let tp = rules(&[("params.w", "[{}, {model}]")]);
    assert_eq!(annotated(Strategy::Fsdp, &tp).0, "[{data}, {model}]", "fsdp adds data beside a model rule");
    assert_eq!(annotated(Strategy::DataParallel, &tp).0, "[{}, {model}]");
    assert_eq!(annotated(Strategy::Zero3, &tp).0, "[{data}, {model}]");
    // A Trainer's input ranges are checked as [model.inputs] is.
    let t = weft::Trainer::new("linear", weft::ir::text::parse_and_verify(LINEAR).unwrap()).unwrap();
    let e = t.int_inputs(&[("x", 4)]).err().expect("x is a float input").to_string();
    assert!(e.contains("a range is for integer inputs"), "{e}");
}

/// Rules name activations too: the GPT's `residual.*` rule shards its
/// residual stream by position under tp (sequence parallelism) and nowhere
/// else, and a `[shardings]` rule annotates a program's named value, with
/// the same errors as for inputs.
#[test]
fn sharding_rules_name_values() {
    use weft::compiler::train::TrainConfig;
    use weft::models::{gpt::GptConfig, rules::Rules, Init};
    use weft::strategy::{annotated_module, Strategy};
    let rules = |pairs: &[(&str, &str)]| {
        Rules::new(pairs.iter().map(|(p, s)| (p.to_string(), weft::ir::text::parse_sharding(s).unwrap())))
    };
    let sharding_of = |m: &weft::ir::Module, func: &str, name: &str| {
        let f = m.function(func).unwrap();
        let v = f.value_by_name(name).unwrap_or_else(|| panic!("@{func} has no %{name}"));
        f.value(v).sharding.as_ref().map(|s| s.to_string()).unwrap_or_default()
    };
    let gpt = weft::Model::gpt(&GptConfig {
        vocab: 32,
        seq: 8,
        d_model: 16,
        heads: 2,
        layers: 2,
        batch: 4,
        ..Default::default()
    });
    let build = |model: &weft::Model, st: Strategy, r: &Rules<weft::ir::TensorSharding>, axes: &[&str]| {
        annotated_module(st, model, 1, r, &mut TrainConfig::default(), axes)
    };
    let none = Rules::default();
    for st in [Strategy::TensorParallel, Strategy::FsdpTp] {
        let m = build(&gpt, st, &none, &["data", "model"]).unwrap();
        for (func, name) in [("block", "residual.attn"), ("block", "residual.mlp"), ("loss", "residual.embed")] {
            assert_eq!(sharding_of(&m, func, name), "[{?}, {model}, {}]", "{st}: %{name}");
        }
    }
    // A model rule that does not divide on the mesh is dropped (seq 8 over
    // model=3), one that does is kept.
    for (mesh, want) in [("data=2,model=3", ""), ("data=2,model=4", "[{?}, {model}, {}]")] {
        let mut m = build(&gpt, Strategy::TensorParallel, &none, &["data", "model"]).unwrap();
        let mesh = weft::compiler::sharding::Mesh::parse(mesh).unwrap();
        weft::strategy::fit_model_value_rules(&mut m, Strategy::TensorParallel, &gpt, &none, &mesh).unwrap();
        assert_eq!(sharding_of(&m, "block", "residual.attn"), want, "{mesh}");
    }
    // Not under dp, and not where the mesh has no `model` axis.
    let dp = build(&gpt, Strategy::DataParallel, &none, &["data", "model"]).unwrap();
    assert_eq!(sharding_of(&dp, "block", "residual.attn"), "");
    let tp_data_only = build(&gpt, Strategy::TensorParallel, &none, &["data"]).unwrap();
    assert_eq!(sharding_of(&tp_data_only, "block", "residual.mlp"), "");
    // A program's named value, by a [shardings] rule, under any strategy.
    let model = || {
        let module = weft::ir::text::parse_and_verify(LINEAR).unwrap();
        weft::Model::program("linear", module, "loss", Init::Rules(Rules::default())).unwrap()
    };
    let m = build(&model(), Strategy::DataParallel, &rules(&[("e", "[{data}, {?}]")]), &["data"]).unwrap();
    assert_eq!(sharding_of(&m, "loss", "e"), "[{data}, {?}]");
    // A rule that names an input stays the input's: `p*` matches
    // `params.w`, so it does not reach the value `%p`.
    let m = build(&model(), Strategy::DataParallel, &rules(&[("p*", "[{}, {}]")]), &["data"]).unwrap();
    assert_eq!(sharding_of(&m, "loss", "p"), "");
    let err =
        |r: &[(&str, &str)]| build(&model(), Strategy::DataParallel, &rules(r), &["data"]).unwrap_err().to_string();
    let e = err(&[("e", "[{data}]")]);
    assert!(e.contains("has rank 1") && e.contains("%e"), "{e}");
    let e = err(&[("e", "[{model}, {}]")]);
    assert!(e.contains("names the axis `model`"), "{e}");
    let e = err(&[("nothing.*", "[{data}]")]);
    assert!(e.contains("`nothing.*` matches no parameter, batch input or named value"), "{e}");
}

#[test]
fn weft_model_refuses_a_toml_output_name() {
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_weft"))
        .args(["model", root().join("examples/configs/mlp.toml").to_str().unwrap(), "-o", "/tmp/x.toml"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("give the program a name such as model.weft"));
}

/// The Trainer's options are a config without `[model]`: an unknown key, a
/// `[model]` table, or a value out of range is a named error.
#[test]
fn bad_trainer_options_are_named_errors() {
    let t = || weft::Trainer::new("linear", weft::ir::text::parse_and_verify(LINEAR).unwrap()).unwrap();
    let e = t().options("stepz = 3").err().expect("an unknown key").to_string();
    assert!(e.contains("Trainer options") && e.contains("stepz"), "{e}");
    let e = t().options("steps = 3\n[model]\nkind = \"mlp\"").err().expect("a model table").to_string();
    assert!(e.contains("no [model] table"), "{e}");
    let e = t().init(&[("params.*", "zeros")]).unwrap().options("steps = 0").unwrap().run(&mut |_| {}).unwrap_err();
    assert!(e.to_string().contains("steps"), "{e}");
}

//! `compiler::pipeline`: the compile as named passes, each IR -> IR, verified
//! between passes, timed, dumpable; `compile` is a wrapper over it.
use weft_compiler::autoshard::AutoShardOptions;
use weft_compiler::partition::compile;
use weft_compiler::pipeline::{Annotations, Pass, Pipeline, Program};
use weft_compiler::sharding::{Mesh, PropagateOptions};
use weft_compiler::{CompilerError, InlinedFunction};
use weft_ir::device::{print_program, DeviceProgram, Step};
use weft_ir::text::parse_module;
use weft_ir::{Module, TensorSharding};

const SRC: &str = "
func @layer(%x: f32[8,16], %w: f32[16,16]) -> (f32[8,16]) {
  %h = dot_general %x, %w {lhs_contract = [1], rhs_contract = [0]}
  %y = tanh %h
  return %y
}
func @main(%x: f32[8,16] {sharding = [{x}, {}]}, %w1: f32[16,16], %w2: f32[16,16]) -> (f32[8,16]) {
  %a = call @layer(%x, %w1)
  %b = call @layer(%a, %w2)
  %t = transpose %b {perm = [0, 1]}
  return %t
}
";

fn module() -> Module {
    parse_module(SRC).unwrap()
}

fn mesh() -> Mesh {
    Mesh::parse("x=2,y=2").unwrap()
}

#[test]
fn the_standard_pipeline_is_a_list_of_named_passes() {
    let p = Pipeline::standard(&mesh(), &PropagateOptions::default());
    assert_eq!(
        p.names(),
        [
            "inline",
            "propagate",
            "partition",
            "compose_transposes",
            "forward_identities",
            "fold_transposes",
            "cse",
            "remove_dead_steps",
            "fuse_reduce_scatter",
            "rematerialize",
            "compact",
            "insert_frees"
        ]
    );
    assert!(p.check_pass_name("compact").is_ok() && p.check_pass_name("all").is_ok());
    let e = p.check_pass_name("compactt").unwrap_err();
    assert!(matches!(e, CompilerError::UnknownPass { .. }));
    assert!(e.to_string().starts_with("unknown pass `compactt` (passes: inline, propagate, partition,"), "{e}");
}

#[test]
fn every_pass_is_dumped_and_timed_and_compile_is_the_same_program() {
    let p = Pipeline::standard(&mesh(), &PropagateOptions::default());
    let mut dumps: Vec<(String, String)> = Vec::new();
    let (out, times) = p.run(&module(), "main", &mut |name, prog| dumps.push((name.to_string(), prog.text()))).unwrap();
    let names: Vec<&str> = dumps.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, p.names());
    let timed: Vec<&str> = times.iter().map(|(n, _)| *n).collect();
    assert_eq!(timed, p.names());
    // inline: calls are gone; propagate: shardings; partition: a device
    // program with its identity transpose; forward_identities: without it.
    let after = |pass: &str| &dumps.iter().find(|(n, _)| n == pass).unwrap_or_else(|| panic!("no {pass}")).1;
    assert!(after("inline").starts_with("func @main(") && !after("inline").contains("call"), "{}", after("inline"));
    assert!(after("propagate").contains("{sharding = [{x}, {}]}"), "{}", after("propagate"));
    assert!(after("partition").starts_with("device_program @main") && after("partition").contains("= transpose"));
    assert!(!after("forward_identities").contains("= transpose"), "{}", after("forward_identities"));
    assert!(!after("compact").contains("free") && after("insert_frees").contains("free"));
    let pf = out.into_partitioned().unwrap();
    let direct = compile(&module(), "main", &mesh(), &PropagateOptions::default()).unwrap();
    assert_eq!(print_program(&pf.program), print_program(&direct.program));
    assert_eq!(after("insert_frees"), &print_program(&direct.program));
    // `compile` is itself the pipeline; the steps spelled out by hand
    // (inline, propagate, lower, each clean-up in order) give the same
    // program, so the pipeline neither skips nor reorders a pass.
    let flat = weft_compiler::inline_calls(&module(), "main").unwrap();
    let sf = weft_compiler::sharding::propagate(&flat, &mesh(), &PropagateOptions::default()).unwrap();
    let mut by_hand = weft_compiler::partition::lower_sharded(&sf, &mesh()).unwrap().program;
    for (_, cleanup) in weft_compiler::partition::CLEANUPS {
        cleanup(&mut by_hand);
    }
    assert_eq!(print_program(&pf.program), print_program(&by_hand));
}

#[test]
fn annotate_and_autoshard_are_passes_too() {
    let mut p = Pipeline::standard(&mesh(), &PropagateOptions::default());
    let w1 = TensorSharding::new(&[&[], &["y"]]);
    p.insert_before("propagate", Pass::Annotate(Annotations { params: vec![("w1".into(), w1)], results: vec![] }));
    assert_eq!(&p.names()[..3], ["inline", "annotate", "propagate"]);
    let pf = p.run(&module(), "main", &mut |_, _| {}).unwrap().0.into_partitioned().unwrap();
    assert_eq!(pf.program.ty(pf.program.inputs[1]).shape, vec![16, 8], "w1 is split over y");

    let bad = Annotations { params: vec![("w9".into(), TensorSharding::new(&[&[], &[]]))], results: vec![] };
    let mut q = Pipeline::standard(&mesh(), &PropagateOptions::default());
    q.insert_before("propagate", Pass::Annotate(bad));
    let e = q.run(&module(), "main", &mut |_, _| {}).unwrap_err();
    assert_eq!(e.to_string(), "@main has no w9 (it has x, w1, w2)");

    let mut a = Pipeline::standard(&mesh(), &PropagateOptions::default());
    a.insert_before("propagate", Pass::AutoShard(AutoShardOptions::default()));
    let (mut before_auto, mut after_auto) = (String::new(), String::new());
    let pf = a
        .run(&module(), "main", &mut |n, p| {
            if n == "inline" {
                before_auto = p.text();
            }
            if n == "autoshard" {
                after_auto = p.text();
            }
        })
        .unwrap()
        .0
        .into_partitioned()
        .unwrap();
    assert!(after_auto.contains("sharding"), "{after_auto}");
    // The auto-sharder annotated values the input left open (only %x was).
    assert!(after_auto.matches("sharding").count() > before_auto.matches("sharding").count(), "{after_auto}");
    assert_eq!(pf.program.inputs.len(), 3);
}

#[test]
fn passes_out_of_order_are_named_errors() {
    let f = InlinedFunction::new(weft_compiler::inline_calls(&module(), "main").unwrap()).unwrap();
    let p = Pipeline { mesh: mesh(), passes: vec![Pass::Partition], verify: true };
    let e = p.run_from(Program::Inlined(f), &mut |_, _| {}).unwrap_err();
    assert_eq!(e.to_string(), "pass `partition` takes a sharded function, but was given an inlined function");
    let with_calls = module().function("main").unwrap().clone();
    let e = InlinedFunction::new(with_calls).unwrap_err();
    assert!(matches!(e, CompilerError::CallNotInlined { ref callee, .. } if callee == "layer"), "{e}");
}

/// A broken clean-up: drops every step (the outputs are then undefined).
fn drop_steps(p: &mut DeviceProgram) {
    p.steps.retain(|s| matches!(s, Step::Free(_)));
}

#[test]
fn the_verifier_between_passes_names_the_pass_that_broke_the_program() {
    let mut p = Pipeline::standard(&mesh(), &PropagateOptions::default());
    p.insert_before("compact", Pass::Cleanup("drop_steps", drop_steps));
    p.verify = true;
    let e = p.run(&module(), "main", &mut |_, _| {}).unwrap_err();
    assert!(e.to_string().starts_with("internal error after drop_steps: the device program does not verify"), "{e}");
    // Without the verifier between passes the final check still rejects it.
    p.verify = false;
    let e = p.run(&module(), "main", &mut |_, _| {}).unwrap_err();
    assert!(matches!(e, CompilerError::Ir(_)), "{e}");
}

/// `h = x; h = h + relu(h @ w1) @ w2`; loss `mean((h - y)^2)`.
fn residual_mlp(d: usize, h: usize, batch: usize) -> Module {
    use weft_ir::builder::FunctionBuilder;
    use weft_ir::DType;
    let f = FunctionBuilder::new("loss");
    let w1 = f.param("params.w1", DType::F32, &[d, h]);
    let w2 = f.param("params.w2", DType::F32, &[h, d]);
    let x = f.param("x", DType::F32, &[batch, d]);
    let y = f.param("y", DType::F32, &[batch, d]);
    let hv = f.add(x, f.matmul(f.relu(f.matmul(x, w1)), w2));
    let diff = f.sub(hv, y);
    f.set_results(&[f.mean_all(f.mul(diff, diff))]);
    Module { functions: vec![f.finish().unwrap()] }
}

/// `--strategy auto`'s compiler side: a training step auto-sharded inside
/// the stable-state compile keeps every state leaf's layout from step to
/// step, and computes what the unsharded interpreter computes.
#[test]
fn stable_state_compile_with_an_autoshard_pass() {
    use weft_compiler::partition::compile_stable;
    use weft_compiler::train::{build_train_step, TrainConfig};
    use weft_ir::interp::Interpreter;
    use weft_ir::tensor::{check_close, HostTensor};
    let m = residual_mlp(16, 32, 64);
    let ts = build_train_step(&m, m.function("loss").unwrap(), &TrainConfig::default()).unwrap();
    let mesh = Mesh::parse("data=2,model=2").unwrap();
    let mut p = Pipeline::standard(&mesh, &PropagateOptions::default());
    // Slow devices: splitting the work is worth its all-reduces.
    p.insert_before("propagate", Pass::AutoShard(AutoShardOptions { device_flops: 1e9, ..Default::default() }));
    let state = ts.state.len();
    let (pf, phases) = compile_stable(&p, &ts.module, "train_step", state).unwrap();
    let names: Vec<&str> = phases.iter().map(|(n, _)| *n).collect();
    assert_eq!(names, ["inline", "autoshard", "propagate", "partition"]);
    for i in 0..state {
        assert_eq!(pf.inputs[i].sharding, pf.outputs[i].sharding, "state leaf {}", pf.inputs[i].name);
    }
    let split = (0..pf.inputs.len()).filter(|&i| pf.program.ty(pf.program.inputs[i]).shape != pf.inputs[i].ty.shape);
    assert!(split.count() > 0, "the plan splits some input");
    let ty = |i: usize| pf.inputs[i].ty.clone();
    let args: Vec<HostTensor> = (0..pf.inputs.len())
        .map(|i| {
            let t = ty(i);
            let n: usize = t.shape.iter().product();
            if t.dtype != weft_ir::DType::F32 {
                return HostTensor::zeros(&t); // the step counter
            }
            HostTensor::from_f32(&t.shape, (0..n).map(|k| ((k * 7 + i) % 13) as f32 / 13.0 - 0.4).collect()).unwrap()
        })
        .collect();
    let got = pf.run(&args, 4).unwrap();
    let want = Interpreter::new(&ts.module).unwrap().run("train_step", &args).unwrap();
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(&want) {
        check_close(g, w, 1e-5, 1e-5).unwrap();
    }
}

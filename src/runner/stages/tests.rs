//! Unit tests of the pipeline driver's pieces: in-place accumulation, the
//! root cause among the stage threads' errors, which updates wait for the
//! global norm, and the one-device path of a compiled stage function
//! (inputs moved, parameters held on the device).

use super::*;
use crate::runner::{Overrides, RunConfig};

const MLP: &str = "steps = 1\nseed = 5\n[model]\nkind = \"mlp\"\nlayers = 4\nd = 8\nh = 16\nbatch = 8\n[optimizer]\nkind = \"sgd\"\nlr = 0.05\n";

/// An executor of the MLP on `mesh` (stage axis of 2, 2 microbatches) with
/// `strategy`, its state and its batch.
fn executor_on(optimizer_extra: &str, backend: &str, mesh: &str, strategy: &str) -> (PipelineExecutor, Tree, Tree) {
    let mut c = RunConfig::from_toml(&format!("{MLP}{optimizer_extra}")).unwrap();
    c.mesh = Some(mesh.into());
    c.strategy = Some(strategy.into());
    c.pipeline = Some(toml::from_str("stages = 2\nmicrobatches = 2").unwrap());
    let mesh = crate::runner::validate::validate(&c).unwrap();
    let (p, staged, sub) = session::prepare_pipeline(&c, &mesh, &Overrides::default()).unwrap();
    let mut exec = PipelineExecutor::new(staged, &sub, backend.parse().unwrap()).unwrap();
    let state = p.step.init_state(&p.params, c.seed, c.initial_loss_scale()).unwrap();
    exec.load_tree(&state).unwrap();
    (exec, state, p.batch.clone())
}

/// [`executor_on`] `stage=2` without a strategy.
fn executor(optimizer_extra: &str, backend: &str) -> (PipelineExecutor, Tree) {
    let (exec, state, _) = executor_on(optimizer_extra, backend, "stage=2", "none");
    (exec, state)
}

#[test]
fn add_into_sums_in_place_and_names_mismatches() {
    let mut a = HostTensor::from_f32(&[2, 2], vec![1.0, 2.0, 3.0, 1e8]).unwrap();
    let b = HostTensor::from_f32(&[2, 2], vec![0.5, -2.0, 0.25, 1.0]).unwrap();
    add_into(&mut a, &b).unwrap();
    let want: Vec<f32> = vec![1.0f32 + 0.5, 0.0, 3.25, 1e8f32 + 1.0];
    assert!(a.bitwise_eq(&HostTensor::from_f32(&[2, 2], want).unwrap()));
    let other_shape = HostTensor::from_f32(&[4], vec![0.0; 4]).unwrap();
    assert!(matches!(add_into(&mut a, &other_shape), Err(Error::Usage(m)) if m.contains("[4]")));
    let ints = HostTensor::from_i32(&[2, 2], vec![0; 4]).unwrap();
    assert!(matches!(add_into(&mut a, &ints), Err(Error::Usage(m)) if m.contains("i32")));
}

#[test]
fn a_stage_that_failed_is_reported_before_the_stages_it_stopped() {
    let stopped = |m: &str| Err(StageError::Stopped(Error::Usage(m.into())));
    let own = |m: &str| Err(StageError::Own(Error::Usage(m.into())));
    let msg = |r: Result<Vec<StageRun>>| match r {
        Err(Error::Usage(m)) => m,
        _ => panic!("expected an error"),
    };
    assert_eq!(msg(first_error(vec![stopped("neighbour"), own("cause"), stopped("driver")])), "cause");
    assert_eq!(msg(first_error(vec![stopped("first"), stopped("second")])), "first");
    let ok = StageRun { grads: Vec::new(), lr: 0.5, outputs: Vec::new(), events: Vec::new(), held_peak: 0 };
    assert_eq!(first_error(vec![Ok(ok)]).unwrap()[0].lr, 0.5);
}

#[test]
fn a_failed_sender_is_reported_before_stopped_stages_but_after_own_errors() {
    let stopped = || Err(StageError::Stopped(Error::Usage("neighbour stopped".into())));
    let own = || Err(StageError::Own(Error::Usage("cause".into())));
    let sender = || vec![Ok(()), Err(Error::Usage("process 1 never received".into()))];
    let msg = |r: Result<Vec<StageRun>>| match r {
        Err(Error::Usage(m)) => m,
        _ => panic!("expected an error"),
    };
    assert_eq!(msg(first_error_or_sender(vec![stopped()], sender())), "process 1 never received");
    assert_eq!(msg(first_error_or_sender(vec![stopped(), own()], sender())), "cause");
    assert_eq!(msg(first_error_or_sender(vec![stopped()], vec![Ok(())])), "neighbour stopped");
    let ok = StageRun { grads: Vec::new(), lr: 0.5, outputs: Vec::new(), events: Vec::new(), held_peak: 0 };
    assert_eq!(msg(first_error_or_sender(vec![Ok(ok)], sender())), "process 1 never received");
}

#[test]
fn only_updates_that_clip_or_scale_the_loss_wait_for_the_norm() {
    let (exec, _) = executor("", "interp");
    assert!(exec.stages.iter().all(|st| !st.update_waits));
    let (exec, _) = executor("clip = 0.5\n", "interp");
    assert!(exec.stages.iter().all(|st| st.update_waits));
    // Loss scaling: every update needs the combined finiteness flag.
    let (exec, _) = executor("[loss_scaling]\n", "interp");
    assert!(exec.stages.iter().all(|st| st.update_waits));
}

/// Runs stage 0's squares and update with a driver that never sends the
/// norm (its end of the channel is closed).
fn finish_without_norm(exec: &mut PipelineExecutor) -> (StageResult, Vec<f32>) {
    let st = &mut exec.stages[0];
    let grads = vec![st.params.clone()];
    let run = StageRun { grads, lr: f32::NAN, outputs: Vec::new(), events: Vec::new(), held_peak: 0 };
    let (sq_tx, sq_rx) = channel();
    let (norm_tx, norm_rx) = channel::<Norm>();
    drop(norm_tx);
    let mut own =
        [ChunkEnds { chunk: 0, stage: st, fwd: (None, None), bwd: (None, None), squares: sq_tx, norm: norm_rx }];
    let r = finish_stage(0, &mut own, run, &exec.step, None, None);
    let sq: Squares = sq_rx.recv().unwrap();
    assert_eq!(sq.finite, 1.0);
    (r, sq.values)
}

#[test]
fn a_stage_updates_without_the_norm_unless_its_update_reads_it() {
    let (mut exec, state) = executor("", "interp");
    let (r, squares) = finish_without_norm(&mut exec);
    assert_eq!(squares.len(), exec.stages[0].params.len());
    assert!(squares.iter().all(|s| s.is_finite() && *s > 0.0));
    assert_eq!(r.ok().map(|r| r.lr), Some(0.05));
    // SGD moved every parameter of the stage.
    let names = &exec.stages[0].fns.params;
    assert!(names.iter().zip(&exec.stages[0].params).all(|(n, p)| !p.bitwise_eq(&state[n])));

    let (mut exec, state) = executor("clip = 0.5\n", "interp");
    let (r, _) = finish_without_norm(&mut exec);
    assert!(matches!(r, Err(StageError::Stopped(_))));
    // The stage kept its state.
    let names = &exec.stages[0].fns.params;
    assert!(names.iter().zip(&exec.stages[0].params).all(|(n, p)| p.bitwise_eq(&state[n])));
}

#[test]
fn a_one_device_stage_function_names_wrong_inputs() {
    let (mut exec, _) = executor("", "cpu");
    let st = &mut exec.stages[0];
    // The squares of the parameters themselves, moved in and out: as the
    // interpreter computes them.
    let sq = st.square.run(st.params.clone()).unwrap();
    let m = Module { functions: vec![st.fns.square.clone()] };
    let want = weft_ir::interp::run(&m, &st.fns.square.name, &st.params).unwrap();
    assert_eq!(sq.len(), st.params.len());
    for (g, w) in sq.iter().zip(&want) {
        assert!((scalar_f32(g) - scalar_f32(w)).abs() <= 1e-5 * scalar_f32(w).abs(), "{g:?} vs {w:?}");
    }
    assert!(st.square.run(Vec::new()).is_err());
    let mut wrong = st.params.clone();
    wrong[0] = HostTensor::from_f32(&[1], vec![0.0]).unwrap();
    assert!(st.square.run(wrong).is_err());
}

fn assert_close(got: &[HostTensor], want: &[HostTensor]) {
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(want) {
        let scale = w.to_f64_vec().iter().fold(1e-30f64, |a, x| a.max(x.abs()));
        assert!(g.max_abs_diff(w) <= 1e-5 * scale, "{g:?} vs {w:?}");
    }
}

#[test]
fn one_device_stage_functions_hold_the_parameters_between_runs() {
    let (mut exec, _, batch) = executor_on("", "cpu", "stage=2", "none");
    let st = &mut exec.stages[0];
    let np = st.params.len();
    assert_eq!((st.forward.resident(), st.backward.resident()), (np, np));
    assert_eq!((st.square.resident(), st.update.resident()), (0, 0));
    // Stage 0's forward takes the parameters (held) and the batch rows.
    let rest: Vec<HostTensor> = st.fns.batch.iter().map(|n| rows(&batch[n], 0, 2).unwrap()).collect();
    let m = Module { functions: vec![st.fns.forward.clone()] };
    let reference = |params: &[HostTensor]| {
        let all: Vec<HostTensor> = params.iter().chain(&rest).cloned().collect();
        weft_ir::interp::run(&m, &st.fns.forward.name, &all).unwrap()
    };
    let first = st.forward.run(rest.clone()).unwrap();
    assert_close(&first, &reference(&st.params));
    // A run gives the parameters back to the device: the next run reads them.
    let again = st.forward.run(rest.clone()).unwrap();
    assert!(first.iter().zip(&again).all(|(a, b)| a.bitwise_eq(b)));
    // Loading other parameters changes what the runs read.
    let halved: Vec<HostTensor> = st
        .params
        .iter()
        .map(|t| HostTensor::from_f32(t.shape(), t.as_f32().unwrap().iter().map(|x| x * 0.5).collect()).unwrap())
        .collect();
    st.forward.load(&halved).unwrap();
    let other = st.forward.run(rest.clone()).unwrap();
    assert!(!other[0].bitwise_eq(&first[0]));
    assert_close(&other, &reference(&halved));
    // Passing the parameters as well is a named error.
    let mut all = st.params.clone();
    all.extend(rest);
    assert!(matches!(st.forward.run(all), Err(Error::Ir(weft_ir::IrError::Input { .. }))));

    // Nothing is held on the interpreter or on a sub-mesh of several devices.
    let (exec, _) = executor("", "interp");
    assert_eq!(exec.stages[0].forward.resident(), 0);
    let (exec, _, _) = executor_on("", "cpu", "stage=2,data=2", "dp");
    assert_eq!(exec.stages[0].forward.resident(), 0);
}

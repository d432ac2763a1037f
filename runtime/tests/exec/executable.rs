//! The executable: donated state stays on the devices, results do not
//! depend on the number of worker threads, and bad inputs, failing devices
//! and state lost to a failed run are named errors, never hangs.

use crate::common::wgpu_devices_or_skip;
use crate::programs::*;
use std::cell::Cell;
use weft_ir::device::{Buffer, BufferId, Collective, DeviceProgram, Step};
use weft_ir::tensor::HostTensor;
use weft_ir::{BinaryOp, Op, ReduceOp, TensorType};
use weft_runtime::{
    run_program, AnyBackend, Backend, CpuBackend, ExecOptions, Executable, RuntimeError, TransferStats,
};

/// A training-like step on mesh `x=4, y=2`: state `w: f32[2,3]` (donated),
/// batch `b: f32[2,3]`; `g = all_reduce_x(b * w)`, `w' = w - g`, metric
/// `m = all_reduce_{x,y}(g)`.
fn step_program() -> DeviceProgram {
    let t = f32s(&[2, 3]);
    let buf = |name: &str| Buffer { ty: t.clone(), name: Some(name.into()) };
    let id = BufferId;
    DeviceProgram {
        name: "step".into(),
        mesh: mesh(&[("x", 4), ("y", 2)]),
        buffers: vec![buf("w"), buf("b"), buf("p"), buf("g"), buf("w2"), buf("m")],
        inputs: vec![id(0), id(1)],
        outputs: vec![id(4), id(5)],
        steps: vec![
            Step::Compute { op: Op::Binary(BinaryOp::Mul), inputs: vec![id(1), id(0)], outputs: vec![id(2)] },
            Step::Free(vec![id(1)]),
            Step::Collective {
                op: Collective::AllReduce { axes: vec!["x".into()], op: ReduceOp::Sum },
                input: id(2),
                output: id(3),
            },
            Step::Free(vec![id(2)]),
            Step::Compute { op: Op::Binary(BinaryOp::Sub), inputs: vec![id(0), id(3)], outputs: vec![id(4)] },
            Step::Free(vec![id(0)]),
            Step::Collective {
                op: Collective::AllReduce { axes: vec!["x".into(), "y".into()], op: ReduceOp::Sum },
                input: id(3),
                output: id(5),
            },
            Step::Free(vec![id(3)]),
        ],
    }
}

fn state() -> Vec<Vec<HostTensor>> {
    (0..8).map(|d| vec![Mat::input(d, 2, 3).tensor()]).collect()
}

fn batch(step: usize) -> Vec<Vec<HostTensor>> {
    (0..8).map(|d| vec![Mat::input(d * 7 + step, 2, 3).tensor()]).collect()
}

fn donating(threads: Option<usize>) -> ExecOptions {
    ExecOptions { donate: vec![(0, 0)], threads, ..Default::default() }
}

/// Per device, a list of values.
type PerDevice = Vec<Vec<HostTensor>>;

/// Runs three steps; returns every metric and the final state.
fn three_steps<B>(backends: Vec<B>, threads: Option<usize>) -> (Vec<PerDevice>, PerDevice, TransferStats)
where
    B: Backend + Send + 'static,
    B::Buffer: Send + 'static,
{
    let mut exe = Executable::new(step_program(), backends, donating(threads)).unwrap();
    exe.load_state(state()).unwrap();
    let metrics: Vec<_> = (0..3).map(|s| exe.run(batch(s)).unwrap()).collect();
    let during = exe.stats().transfers.clone();
    (metrics, exe.read_state().unwrap(), during)
}

/// The same three steps with `run_program` (no donation), state through the host.
fn reference() -> (Vec<PerDevice>, PerDevice) {
    let mut w = state();
    let mut metrics = Vec::new();
    for s in 0..3 {
        let ins = w.iter().zip(batch(s)).map(|(w, b)| vec![w[0].clone(), b[0].clone()]).collect();
        let outs = run_program(&step_program(), &vec![CpuBackend::new(); 8], ins).unwrap();
        w = outs.iter().map(|o| vec![o[0].clone()]).collect();
        metrics.push(outs.iter().map(|o| vec![o[1].clone()]).collect());
    }
    (metrics, w)
}

fn assert_bitwise(a: &[Vec<HostTensor>], b: &[Vec<HostTensor>], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: device count");
    for (d, (x, y)) in a.iter().zip(b).enumerate() {
        assert_eq!(x.len(), y.len(), "{what}: device {d}: value count");
        for (k, (p, q)) in x.iter().zip(y).enumerate() {
            assert!(p.bitwise_eq(q), "{what}: device {d}, value {k}: {p:?} vs {q:?}");
        }
    }
}

#[test]
fn state_stays_resident_and_results_do_not_depend_on_threads() {
    let (ref_metrics, ref_state) = reference();
    for threads in [Some(1), Some(2), Some(3), Some(8), None] {
        let (metrics, final_state, t) = three_steps(vec![CpuBackend::new(); 8], threads);
        for (s, (m, r)) in metrics.iter().zip(&ref_metrics).enumerate() {
            assert_bitwise(m, r, &format!("{threads:?} threads, step {s} metrics"));
        }
        assert_bitwise(&final_state, &ref_state, &format!("{threads:?} threads, final state"));
        // Between loading and reading back, no state crossed the host.
        assert_eq!((t.state_uploads, t.state_downloads), (8, 0), "{threads:?} threads: {t:?}");
        assert_eq!((t.input_uploads, t.output_downloads), (24, 24));
    }
}

#[test]
fn host_devices_default_to_one_worker_per_core() {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let exe = Executable::new(step_program(), vec![CpuBackend::new(); 8], donating(None)).unwrap();
    assert_eq!(exe.threads(), cores.min(8));
    let exe = Executable::new(step_program(), vec![CpuBackend::new(); 8], donating(Some(8))).unwrap();
    assert_eq!(exe.threads(), 8);
}

#[test]
fn wgpu_state_stays_resident_and_matches_cpu() {
    let Some(devs) = wgpu_devices_or_skip(8) else { return };
    let (ref_metrics, ref_state) = reference();
    let (metrics, final_state, t) = three_steps::<AnyBackend>(devs, None);
    for (s, (m, r)) in metrics.iter().zip(&ref_metrics).enumerate() {
        assert_bitwise(m, r, &format!("wgpu step {s}"));
    }
    assert_bitwise(&final_state, &ref_state, "wgpu final state");
    assert_eq!((t.state_uploads, t.state_downloads), (8, 0), "{t:?}");
}

#[test]
fn a_state_read_downloads_only_the_values_it_names() {
    for threads in [Some(1), Some(3), None] {
        let mut exe = Executable::new(step_program(), vec![CpuBackend::new(); 8], donating(threads)).unwrap();
        exe.load_state(state()).unwrap();
        exe.run(batch(0)).unwrap();
        let all = exe.read_state().unwrap();
        let before = exe.stats().transfers.state_downloads;
        // Devices 0 and 5 only (one copy of each block, as a checkpoint reads).
        let want: Vec<Vec<bool>> = (0..8).map(|d| vec![d == 0 || d == 5]).collect();
        let some = exe.read_state_where(want).unwrap();
        assert_eq!(exe.stats().transfers.state_downloads - before, 2, "{threads:?}: two values downloaded");
        for (d, (got, full)) in some.iter().zip(&all).enumerate() {
            match &got[0] {
                Some(t) => {
                    assert!(d == 0 || d == 5, "device {d} was not asked for");
                    assert!(t.bitwise_eq(&full[0]), "device {d}: the value read in full");
                }
                None => assert!(d != 0 && d != 5, "device {d} was asked for"),
            }
        }
        // The state stays on the devices: the next step runs.
        exe.run(batch(1)).unwrap();
        let bad = exe.read_state_where(vec![vec![true]; 7]).unwrap_err();
        assert!(bad.to_string().contains("7 devices"), "{bad}");
        let bad = exe.read_state_where(vec![vec![true, true]; 8]).unwrap_err();
        assert!(bad.to_string().contains("2 values"), "{bad}");
    }
}

#[test]
fn a_batch_of_the_wrong_type_is_rejected_before_anything_runs() {
    let mut exe = Executable::new(step_program(), vec![CpuBackend::new(); 8], donating(None)).unwrap();
    exe.load_state(state()).unwrap();
    let mut bad = batch(0);
    bad[5][0] = Mat::input(0, 3, 2).tensor();
    let e = exe.run(bad).unwrap_err();
    assert!(matches!(e, RuntimeError::Input { device: 5, index: 1, .. }), "{e}");
    assert!(e.to_string().contains("f32[2,3]"), "{e}");
    let mut short = batch(0);
    short[2].clear();
    assert!(matches!(exe.run(short).unwrap_err(), RuntimeError::Input { device: 2, .. }));
    // Nothing ran, so the state is still there and a good batch runs.
    exe.run(batch(0)).unwrap();
}

#[test]
fn running_without_state_is_a_named_error() {
    let mut exe = Executable::new(step_program(), vec![CpuBackend::new(); 8], donating(Some(2))).unwrap();
    let e = exe.run(batch(0)).unwrap_err();
    assert!(matches!(e, RuntimeError::NoState { .. }), "{e}");
    assert!(exe.read_state().is_err());
}

/// The CPU backend, failing on its `fail_at`-th compute call.
struct Flaky {
    inner: CpuBackend,
    fail_at: Option<usize>,
    calls: Cell<usize>,
    panic_on_upload: bool,
    /// Whether the caller drives the last lane (as for host-memory devices).
    caller_drives: bool,
}

// One worker owns each backend; the cell is never shared between threads.
unsafe impl Send for Flaky {}

impl Backend for Flaky {
    type Buffer = HostTensor;
    fn name(&self) -> String {
        "flaky".into()
    }
    fn caller_drives_a_lane(&self) -> bool {
        self.caller_drives
    }
    fn alloc(&self, ty: &TensorType) -> Result<HostTensor, RuntimeError> {
        self.inner.alloc(ty)
    }
    fn upload(&self, t: &HostTensor) -> Result<HostTensor, RuntimeError> {
        assert!(!self.panic_on_upload, "simulated allocator panic");
        self.inner.upload(t)
    }
    fn download(&self, b: &HostTensor) -> Result<HostTensor, RuntimeError> {
        self.inner.download(b)
    }
    fn buffer_type(&self, b: &HostTensor) -> TensorType {
        b.ty()
    }
    fn compute(&self, op: &Op, inputs: &[&HostTensor]) -> Result<Vec<HostTensor>, RuntimeError> {
        let n = self.calls.get();
        self.calls.set(n + 1);
        if Some(n) == self.fail_at {
            return Err(RuntimeError::Device { backend: "flaky".into(), message: "simulated device fault".into() });
        }
        self.inner.compute(op, inputs)
    }
}

#[test]
fn a_device_failing_mid_step_stops_every_worker_with_its_error() {
    // Device 6 or 7 (in the last lane, the caller's where it drives one)
    // fails in its second compute (after the first collective), while the
    // others wait for it in the second collective.
    let cases = [None, Some(2), Some(1)].into_iter().flat_map(|t| [(t, false, 6), (t, true, 6), (t, true, 7)]);
    for (threads, caller_drives, failing) in cases {
        let backends: Vec<Flaky> = (0..8)
            .map(|d| Flaky {
                inner: CpuBackend::new(),
                fail_at: (d == failing).then_some(1),
                calls: Cell::new(0),
                panic_on_upload: false,
                caller_drives,
            })
            .collect();
        let mut exe = Executable::new(step_program(), backends, donating(threads)).unwrap();
        exe.load_state(state()).unwrap();
        let e = exe.run(batch(0)).unwrap_err();
        assert!(e.to_string().contains("simulated device fault"), "{threads:?}: {e}");
        // The state was donated to the failed run: using it again is an error.
        let again = exe.run(batch(1)).unwrap_err();
        assert!(matches!(again, RuntimeError::NoState { .. }), "{again}");
        assert!(again.to_string().contains("donated to a run that failed"), "{again}");
        // Loading it again makes the executable usable.
        exe.load_state(state()).unwrap();
        exe.run(batch(1)).unwrap();
    }
}

#[test]
fn donation_must_pair_buffers_of_one_type() {
    let bad = ExecOptions { donate: vec![(0, 3)], ..Default::default() };
    let e = Executable::new(step_program(), vec![CpuBackend::new(); 8], bad).err().unwrap();
    assert!(e.to_string().contains("no such input or output"), "{e}");
    let twice = ExecOptions { donate: vec![(0, 0), (0, 1)], ..Default::default() };
    assert!(Executable::new(step_program(), vec![CpuBackend::new(); 8], twice).is_err());
    let e = Executable::new(step_program(), vec![CpuBackend::new(); 3], ExecOptions::default()).err().unwrap();
    assert!(matches!(e, RuntimeError::DeviceCount { needed: 8, given: 3, .. }), "{e}");
}

#[test]
fn a_backend_panicking_while_loading_is_an_error_and_the_executable_stays_usable() {
    // Device 3 is in a worker thread's lane; device 7 in the last lane,
    // which the caller drives when `caller_drives`.
    for (caller_drives, panicking) in [(false, 3), (true, 3), (true, 7)] {
        let backends: Vec<Flaky> = (0..8)
            .map(|d| Flaky {
                inner: CpuBackend::new(),
                fail_at: None,
                calls: Cell::new(0),
                panic_on_upload: d == panicking,
                caller_drives,
            })
            .collect();
        let mut exe = Executable::new(step_program(), backends, donating(Some(4))).unwrap();
        assert_eq!(exe.threads(), 4);
        let e = exe.load_state(state()).unwrap_err();
        assert!(e.to_string().contains("simulated allocator panic"), "{caller_drives} {panicking}: {e}");
        // Every lane answered the load; nothing is left queued for the run,
        // which is refused for want of state rather than misreading replies.
        let again = exe.run(batch(0)).unwrap_err();
        assert!(matches!(again, RuntimeError::NoState { .. }), "{again}");
    }
}

//! Every collective with the mesh's devices split over several processes
//! (simulated by threads: [`ThreadGroup`]), each running an executable over
//! its own devices with a [`ProcessComm`]: bitwise the contract's results,
//! for 2 processes, one process per device, and an uneven split; in the
//! fast reduction mode, sums through the transport's own reduction, close
//! to the contract and the same on every member; and a process that never
//! comes is named by the others.

use crate::collectives::{all_cases, permute_cases, Case, MESHES};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use weft_ir::tensor::HostTensor;
use weft_runtime::process::{device_owners, devices_of_process, NativeType, Reduction};
use weft_runtime::{ExecOptions, Executable, FastCpuBackend, ProcessComm, ProcessGroup, RuntimeError, ThreadGroup};

fn run_split(case: &Case, processes: usize) -> Vec<HostTensor> {
    run_split_in(case, processes, Reduction::Deterministic, &Arc::new(AtomicUsize::new(0)))
}

/// A [`ThreadGroup`] that counts the calls of the transport's own sums
/// (which it leaves to the trait's defaults: partial sums exchanged and
/// added in process order).
struct Counting {
    inner: ThreadGroup,
    sums: Arc<AtomicUsize>,
}

impl ProcessGroup for Counting {
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn size(&self) -> usize {
        self.inner.size()
    }
    unsafe fn exchange_into(
        &self,
        tag: u32,
        sends: &[(usize, &[u8])],
        receives: &mut [(usize, &mut [u8])],
        timeout: Duration,
        what: &str,
    ) -> Result<(), RuntimeError> {
        unsafe { self.inner.exchange_into(tag, sends, receives, timeout, what) }
    }
    unsafe fn sum_all_into(
        &self,
        tag: u32,
        processes: &[usize],
        ty: NativeType,
        send: &[u8],
        recv: &mut [u8],
        timeout: Duration,
        what: &str,
    ) -> Result<(), RuntimeError> {
        self.sums.fetch_add(1, Ordering::Relaxed);
        unsafe { self.inner.sum_all_into(tag, processes, ty, send, recv, timeout, what) }
    }
    unsafe fn sum_scatter_into(
        &self,
        tag: u32,
        processes: &[usize],
        ty: NativeType,
        send: &[u8],
        counts: &[usize],
        recv: &mut [u8],
        timeout: Duration,
        what: &str,
    ) -> Result<(), RuntimeError> {
        self.sums.fetch_add(1, Ordering::Relaxed);
        unsafe { self.inner.sum_scatter_into(tag, processes, ty, send, counts, recv, timeout, what) }
    }
    fn abort_all(&self, code: i32) {
        self.inner.abort_all(code)
    }
}

/// Every device's output of `case` with its devices over `processes`
/// simulated processes, sums across them combined in mode `reduction`;
/// `sums` counts the transport's own sums.
fn run_split_in(case: &Case, processes: usize, reduction: Reduction, sums: &Arc<AtomicUsize>) -> Vec<HostTensor> {
    let n = case.program.num_devices();
    let owner = device_owners(n, processes);
    let groups: Vec<Counting> =
        ThreadGroup::new(processes).into_iter().map(|inner| Counting { inner, sums: Arc::clone(sums) }).collect();
    let outs: Vec<Vec<Vec<weft_ir::tensor::HostTensor>>> = std::thread::scope(|s| {
        let hs: Vec<_> = groups
            .into_iter()
            .enumerate()
            .map(|(rank, g)| {
                let (owner, program) = (owner.clone(), case.program.clone());
                let inputs: Vec<Vec<_>> =
                    devices_of_process(n, processes, rank).map(|d| vec![case.inputs[d].tensor()]).collect();
                s.spawn(move || {
                    let local: Vec<usize> = devices_of_process(n, processes, rank).collect();
                    let backends = vec![FastCpuBackend::new(); local.len()];
                    let comm = ProcessComm::new(Arc::new(g), owner, Duration::from_secs(30)).with_reduction(reduction);
                    let comm = Box::new(comm);
                    let mut exe =
                        Executable::with_devices(program, local, backends, comm, ExecOptions::default()).unwrap();
                    exe.run(inputs).unwrap()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    outs.into_iter().flatten().map(|mut o| o.remove(0)).collect()
}

#[test]
fn collectives_across_processes_are_bitwise_the_contract() {
    let mut count = 0;
    for &m in MESHES {
        let n: usize = m.iter().map(|a| a.1).product();
        for case in &all_cases(m) {
            for processes in [2, 3, n] {
                if processes > n {
                    continue;
                }
                let got = run_split(case, processes);
                for (d, (g, want)) in got.iter().zip(&case.expected).enumerate() {
                    assert!(
                        g.bitwise_eq(&want.tensor()),
                        "{:?} on mesh {m:?} over {processes} processes, device {d}:\n got  {g}\n want {}",
                        case.program.steps[0],
                        want.tensor()
                    );
                    count += 1;
                }
            }
        }
    }
    assert!(count > 1000, "only {count} device results checked");
}

#[test]
fn fast_sums_across_processes_are_close_and_the_same_on_every_member() {
    let (mut checked, fast_calls) = (0, Arc::new(AtomicUsize::new(0)));
    for &m in MESHES {
        let n: usize = m.iter().map(|a| a.1).product();
        for case in &all_cases(m) {
            for processes in [2, 3, n] {
                if processes > n {
                    continue;
                }
                let plain = Arc::new(AtomicUsize::new(0));
                let deterministic = run_split_in(case, processes, Reduction::Deterministic, &plain);
                assert_eq!(plain.load(Ordering::Relaxed), 0, "the deterministic mode never takes the transport's sums");
                let got = run_split_in(case, processes, Reduction::Fast, &fast_calls);
                for (d, (g, want)) in got.iter().zip(&case.expected).enumerate() {
                    let want = want.tensor();
                    let scale = want.to_f64_vec().iter().fold(1f64, |a, x| a.max(x.abs()));
                    assert!(
                        g.max_abs_diff(&want) <= 1e-6 * scale,
                        "{:?} on mesh {m:?} over {processes} processes, device {d}:\n got  {g}\n want {want}",
                        case.program.steps[0]
                    );
                    assert!(deterministic[d].bitwise_eq(&want), "the deterministic mode is the contract");
                    // Members expecting the same result get the same bits.
                    for (e, other) in case.expected.iter().enumerate().skip(d + 1) {
                        if other.tensor().bitwise_eq(&want) {
                            assert!(got[e].bitwise_eq(g), "devices {d} and {e} of {:?} differ", case.program.steps[0]);
                        }
                    }
                    checked += 1;
                }
            }
        }
    }
    assert!(checked > 1000, "only {checked} device results checked");
    assert!(fast_calls.load(Ordering::Relaxed) > 50, "the fast mode took the transport's sums");
}

#[test]
fn a_process_that_never_comes_is_named() {
    let m = [("x", 4)];
    let case = permute_cases(&m).remove(0);
    // The exchange made by the completing thread, then by the
    // communicator's own thread: the same error either way.
    for background in [false, true] {
        let owner = device_owners(4, 2);
        let mut groups = ThreadGroup::new(2);
        let _absent = groups.pop();
        let g = groups.pop().unwrap();
        let comm = ProcessComm::new(std::sync::Arc::new(g), owner, Duration::from_millis(100));
        let comm: Box<dyn weft_runtime::Communicator> =
            if background { Box::new(comm.in_background()) } else { Box::new(comm) };
        let backends = vec![FastCpuBackend::new(); 2];
        let mut exe =
            Executable::with_devices(case.program.clone(), vec![0, 1], backends, comm, ExecOptions::default()).unwrap();
        let err = exe.run(vec![vec![case.inputs[0].tensor()], vec![case.inputs[1].tensor()]]).unwrap_err();
        match &err {
            RuntimeError::ProcessTimeout { rank: 0, missing, what, .. } => {
                assert_eq!(missing, &vec![1]);
                assert!(what.contains("collective_permute"), "{what}");
            }
            e => panic!("expected a process timeout (background {background}), got {e}"),
        }
    }
}

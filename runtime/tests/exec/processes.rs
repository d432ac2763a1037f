//! Every collective with the mesh's devices split over several processes
//! (simulated by threads: [`ThreadGroup`]), each running an executable over
//! its own devices with a [`ProcessComm`]: bitwise the contract's results,
//! for 2 processes, one process per device, and an uneven split; and a
//! process that never comes is named by the others.

use crate::collectives::{all_cases, permute_cases, Case, MESHES};
use std::time::Duration;
use weft_runtime::process::{device_owners, devices_of_process};
use weft_runtime::{ExecOptions, Executable, FastCpuBackend, ProcessComm, RuntimeError, ThreadGroup};

fn run_split(case: &Case, processes: usize) -> Vec<weft_ir::tensor::HostTensor> {
    let n = case.program.num_devices();
    let owner = device_owners(n, processes);
    let groups = ThreadGroup::new(processes);
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
                    let comm = Box::new(ProcessComm::new(std::sync::Arc::new(g), owner, Duration::from_secs(30)));
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
fn a_process_that_never_comes_is_named() {
    let m = [("x", 4)];
    let case = permute_cases(&m).remove(0);
    let owner = device_owners(4, 2);
    let mut groups = ThreadGroup::new(2);
    let _absent = groups.pop();
    let g = groups.pop().unwrap();
    let comm = Box::new(ProcessComm::new(std::sync::Arc::new(g), owner, Duration::from_millis(100)));
    let backends = vec![FastCpuBackend::new(); 2];
    let mut exe =
        Executable::with_devices(case.program.clone(), vec![0, 1], backends, comm, ExecOptions::default()).unwrap();
    let err = exe.run(vec![vec![case.inputs[0].tensor()], vec![case.inputs[1].tensor()]]).unwrap_err();
    match &err {
        RuntimeError::ProcessTimeout { rank: 0, missing, what, .. } => {
            assert_eq!(missing, &vec![1]);
            assert!(what.contains("collective_permute"), "{what}");
        }
        e => panic!("expected a process timeout, got {e}"),
    }
}

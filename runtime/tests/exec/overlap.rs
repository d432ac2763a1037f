//! Started collectives (`*_start` ... `done`, what the compiler's
//! `overlap_collectives` pass makes): several in flight at once, waited for
//! in another order than started, with compute between. Every executor
//! gives bitwise the reference simulator's results, which are the in-order
//! program's: one lane or several, and the mesh split over (simulated)
//! processes whose exchanges are made by the completing thread or by the
//! communicator's own thread.

use std::sync::Arc;
use std::time::Duration;
use weft_ir::device::{parse_program, simulate, DeviceProgram};
use weft_ir::tensor::HostTensor;
use weft_runtime::process::{device_owners, devices_of_process};
use weft_runtime::{ExecOptions, Executable, FastCpuBackend, ProcessComm, ThreadGroup};

const STARTED: &str = "\
device_program @f mesh [data=2, model=2] {
  input %0 : f32[4,8]
  %1 = all_reduce_start %0 {axes = [data], op = sum} : f32[4,8]
  %2 = tanh %0 : f32[4,8]
  %3 = all_gather_start %2 {dim = 0, axes = [model]} : f32[8,8]
  %4 = reduce_scatter_start %2 {dim = 1, axes = [data, model], op = sum} : f32[4,2]
  %5 = exp %2 : f32[4,8]
  done %3
  %6 = all_to_all_start %5 {split_dim = 1, concat_dim = 0, axes = [model]} : f32[8,4]
  done %1
  %7 = add %1, %5 : f32[4,8]
  %8 = all_reduce %7 {axes = [model], op = max} : f32[4,8]
  done %6
  done %4
  %9 = collective_permute_start %8 {pairs = [(0, 3), (3, 0), (1, 2), (2, 1)]} : f32[4,8]
  done %9
  return %3, %4, %6, %8, %9
}
";

/// The same program with every collective waited for where it starts.
fn in_order() -> DeviceProgram {
    let text: String = STARTED
        .lines()
        .filter(|l| !l.trim_start().starts_with("done"))
        .map(|l| l.replace("_start ", " ") + "\n")
        .collect();
    parse_program(&text).unwrap()
}

fn inputs() -> Vec<Vec<HostTensor>> {
    (0..4)
        .map(|d| {
            let data = (0..32).map(|i| ((i * 7 + d * 13) % 17) as f32 * 0.37 - 2.5 + d as f32 * 1e-3).collect();
            vec![HostTensor::from_f32(&[4, 8], data).unwrap()]
        })
        .collect()
}

fn assert_same(got: &[Vec<HostTensor>], want: &[Vec<HostTensor>], what: &str) {
    for (d, (g, w)) in got.iter().zip(want).enumerate() {
        for (k, (a, b)) in g.iter().zip(w).enumerate() {
            assert!(a.bitwise_eq(b), "{what}: device {d}, output {k}:\n got  {a}\n want {b}");
        }
    }
}

#[test]
fn started_collectives_give_the_in_order_results_on_every_executor() {
    let started = parse_program(STARTED).unwrap();
    let want = simulate(&in_order(), inputs()).unwrap();
    assert_same(&simulate(&started, inputs()).unwrap(), &want, "simulator");
    for threads in [1, 2, 4] {
        let options = ExecOptions { threads: Some(threads), ..Default::default() };
        let mut exe = Executable::new(started.clone(), vec![FastCpuBackend::new(); 4], options).unwrap();
        for run in 0..3 {
            assert_same(&exe.run(inputs()).unwrap(), &want, &format!("{threads} lanes, run {run}"));
        }
    }
    for processes in [2, 4] {
        for background in [false, true] {
            let got = run_on_processes(&started, processes, background);
            assert_same(&got, &want, &format!("{processes} processes, background {background}"));
        }
    }
}

/// Every device's outputs of two runs of `p` with its devices over
/// `processes` simulated processes (the second run's).
fn run_on_processes(p: &DeviceProgram, processes: usize, background: bool) -> Vec<Vec<HostTensor>> {
    let n = p.num_devices();
    let owner = device_owners(n, processes);
    let all = inputs();
    let outs: Vec<Vec<Vec<HostTensor>>> = std::thread::scope(|s| {
        let hs: Vec<_> = ThreadGroup::new(processes)
            .into_iter()
            .enumerate()
            .map(|(rank, g)| {
                let (owner, program) = (owner.clone(), p.clone());
                let local: Vec<usize> = devices_of_process(n, processes, rank).collect();
                let mine: Vec<Vec<HostTensor>> = local.iter().map(|&d| all[d].clone()).collect();
                s.spawn(move || {
                    let backends = vec![FastCpuBackend::new(); local.len()];
                    let comm = ProcessComm::new(Arc::new(g), owner, Duration::from_secs(30));
                    let comm: Box<dyn weft_runtime::Communicator> =
                        if background { Box::new(comm.in_background()) } else { Box::new(comm) };
                    let mut exe =
                        Executable::with_devices(program, local, backends, comm, ExecOptions::default()).unwrap();
                    exe.run(mine.clone()).unwrap();
                    exe.run(mine).unwrap()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    outs.into_iter().flatten().collect()
}

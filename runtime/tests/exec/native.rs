//! The executor's device-native collective path
//! (`Backend::collective_on_device`, what NCCL plugs into) without a GPU:
//! wgpu devices are given a stand-in `NativeCollectives` that computes
//! through its own in-process communicator. The run must equal the
//! host-staged run bitwise, stage through the executor's communicator only
//! what the native path leaves (an inner-dimension gather), and give each
//! device a worker thread of its own.

use crate::common::wgpu_devices_or_skip;
use std::sync::Arc;
use weft_ir::device::DeviceProgram;
use weft_ir::tensor::HostTensor;
use weft_runtime::comm::{CollectiveCall, Communicator, InProcessComm};
use weft_runtime::gpu::device_collectives::{native_kind, NativeCollectives};
use weft_runtime::{AnyBackend, Backend, CubeBuffer, CubeclBackend, ExecOptions, Executable, RuntimeError};

use cubecl::wgpu::WgpuRuntime;

/// Takes what NCCL would take, and computes it through the host.
struct StandIn {
    comm: InProcessComm,
}

impl NativeCollectives<WgpuRuntime> for StandIn {
    fn run(
        &self,
        be: &CubeclBackend<WgpuRuntime>,
        call: CollectiveCall<'_>,
        input: &CubeBuffer<WgpuRuntime>,
    ) -> Option<Result<CubeBuffer<WgpuRuntime>, RuntimeError>> {
        native_kind(call.op, input.ty(), call.group.len())?;
        Some(be.download(input).and_then(|t| self.comm.collective(call, t)).and_then(|t| be.upload(&t)))
    }
}

const PROGRAM: &str = "device_program @main mesh [x=2, y=2] {
  input %0 : f32[4,3]  // a
  %1 = all_reduce %0 {axes = [y], op = sum} : f32[4,3]
  %2 = reduce_scatter %0 {dim = 0, axes = [x, y], op = max} : f32[1,3]
  %3 = all_gather %0 {dim = 1, axes = [x]} : f32[4,6]
  %4 = all_gather %1 {dim = 0, axes = [x]} : f32[8,3]
  return %2, %3, %4
}
";

fn inputs() -> Vec<Vec<HostTensor>> {
    (0..4)
        .map(|d| {
            let v: Vec<f32> = (0..12).map(|i| ((i * 5 + d * 3) % 7) as f32 * 0.37 - 1.1).collect();
            vec![HostTensor::from_f32(&[4, 3], v).unwrap()]
        })
        .collect()
}

fn run(backends: Vec<AnyBackend>, threads: usize) -> (Vec<Vec<HostTensor>>, u64, usize) {
    let program: DeviceProgram = PROGRAM.parse().unwrap();
    let options = ExecOptions { threads: Some(threads), ..Default::default() };
    let mut exe = Executable::new(program, backends, options).unwrap();
    let out = exe.run(inputs()).unwrap();
    (out, exe.stats().transfers.collective_downloads, exe.threads())
}

#[test]
fn device_native_collectives_equal_the_host_path() {
    let (Some(host), Some(mut native)) = (wgpu_devices_or_skip(4), wgpu_devices_or_skip(4)) else { return };
    let stand_in: Arc<StandIn> = Arc::new(StandIn { comm: InProcessComm::default() });
    for b in &mut native {
        match b {
            AnyBackend::Wgpu(b) => b.set_native_collectives(stand_in.clone()),
            _ => unreachable!("wgpu devices"),
        }
    }
    let (want, staged_host, _) = run(host, 1);
    let (got, staged_native, threads) = run(native, 1);
    assert_eq!(staged_host, 4 * 4, "every collective of every device through the executor's communicator");
    assert_eq!(staged_native, 4, "only the inner-dimension gather through the executor's communicator");
    assert_eq!(threads, 4, "a device with native collectives gets a thread of its own");
    for (d, (g, w)) in got.iter().zip(&want).enumerate() {
        for (k, (a, b)) in g.iter().zip(w).enumerate() {
            assert!(a.bitwise_eq(b), "device {d}, output {k}: {a:?} vs {b:?}");
        }
    }
}

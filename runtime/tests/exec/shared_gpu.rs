//! Collectives among logical devices that share one GPU run on its memory
//! (`gpu::shared_collectives`, the default on CUDA) and give the host
//! path's results bit for bit. Without CUDA this runs on four backends
//! over one wgpu client (lavapipe here): every collective of the program
//! but the permute meets on the device, nothing of theirs is staged
//! through the host, and each kind (sums of f32 and bf16, a max, gathers
//! and scatters along inner dimensions, an all-to-all) equals the
//! host-staged run on four separate wgpu devices.

use crate::common::{wgpu_devices_or_skip, wgpu_or_skip};
use std::sync::Arc;
use std::time::Duration;
use weft_ir::device::DeviceProgram;
use weft_ir::tensor::HostTensor;
use weft_ir::{DType, TensorType};
use weft_runtime::gpu::shared_collectives::SharedGpuCollectives;
use weft_runtime::{AnyBackend, CubeclBackend, ExecOptions, Executable, RuntimeError};

const PROGRAM: &str = "device_program @main mesh [x=2, y=2] {
  input %0 : f32[4,6]  // a
  input %1 : bf16[4,6]  // b
  %2 = all_reduce %0 {axes = [x, y], op = sum} : f32[4,6]
  %3 = all_reduce %1 {axes = [y], op = sum} : bf16[4,6]
  %4 = reduce_scatter %0 {dim = 1, axes = [x], op = max} : f32[4,3]
  %5 = all_gather %1 {dim = 1, axes = [x, y]} : bf16[4,24]
  %6 = all_to_all %0 {split_dim = 1, concat_dim = 0, axes = [y]} : f32[8,3]
  %7 = collective_permute %0 {pairs = [(0, 1), (1, 2), (2, 3), (3, 0)]} : f32[4,6]
  return %2, %3, %4, %5, %6, %7
}
";

fn inputs() -> Vec<Vec<HostTensor>> {
    (0..4)
        .map(|d| {
            let v: Vec<f64> = (0..24).map(|i| ((i * 5 + d * 3) % 7) as f64 * 0.37 - 1.1 + d as f64 * 1e-3).collect();
            let a = HostTensor::from_values(&TensorType::new(DType::F32, vec![4, 6]), &v).unwrap();
            let b = HostTensor::from_values(&TensorType::new(DType::BF16, vec![4, 6]), &v).unwrap();
            vec![a, b]
        })
        .collect()
}

fn run(backends: Vec<AnyBackend>) -> Result<(Vec<Vec<HostTensor>>, u64), RuntimeError> {
    let program: DeviceProgram = PROGRAM.parse().unwrap();
    let mut exe = Executable::new(program, backends, ExecOptions::default())?;
    let out = exe.run(inputs())?;
    Ok((out, exe.stats().transfers.collective_downloads))
}

/// Four backends over one client, meeting at `meeting`.
fn shared(one: &CubeclBackend<cubecl::wgpu::WgpuRuntime>, timeout: Duration, members: usize) -> Vec<AnyBackend> {
    let meeting = Arc::new(SharedGpuCollectives::new(0..members, timeout));
    (0..4)
        .map(|i| {
            let mut b = CubeclBackend::new(one.client().clone(), format!("wgpu device {i} (shared client)"));
            b.set_native_collectives(meeting.clone());
            AnyBackend::Wgpu(b)
        })
        .collect()
}

#[test]
fn collectives_on_one_gpu_equal_the_host_path() {
    let (Some(host), Some(one)) = (wgpu_devices_or_skip(4), wgpu_or_skip()) else { return };
    let (want, staged_host) = run(host).unwrap();
    let (got, staged_shared) = run(shared(&one, Duration::from_secs(60), 4)).unwrap();
    assert_eq!(staged_host, 6 * 4, "every collective of every device through the host");
    assert_eq!(staged_shared, 4, "only the permute through the host");
    for (d, (g, w)) in got.iter().zip(&want).enumerate() {
        for (k, (a, b)) in g.iter().zip(w).enumerate() {
            assert!(a.bitwise_eq(b), "device {d}, output {k}: {a:?} vs {b:?}");
        }
    }
    // Twice on the same executable: the meetings of the first run are gone.
    let program: DeviceProgram = PROGRAM.parse().unwrap();
    let mut exe = Executable::new(program, shared(&one, Duration::from_secs(60), 4), ExecOptions::default()).unwrap();
    for _ in 0..2 {
        let again = exe.run(inputs()).unwrap();
        assert!(again.iter().flatten().zip(want.iter().flatten()).all(|(a, b)| a.bitwise_eq(b)));
    }
}

/// A group with a member off the GPU takes the host path for every member
/// (here devices 2 and 3 are not members of the meeting point, so only
/// the groups of {0, 1} meet on the device: the `[x]` reduce-scatter of
/// devices 0 and 2 does not).
#[test]
fn groups_reaching_off_the_gpu_stay_on_the_host() {
    let (Some(host), Some(one)) = (wgpu_devices_or_skip(4), wgpu_or_skip()) else { return };
    let (want, _) = run(host).unwrap();
    let (got, staged) = run(shared(&one, Duration::from_secs(60), 2)).unwrap();
    // Devices 0 and 1 form the `[y]` group of the bf16 sum and of the
    // all-to-all: those two meet on the device for them (4 staged less).
    assert_eq!(staged, 6 * 4 - 4);
    assert!(got.iter().flatten().zip(want.iter().flatten()).all(|(a, b)| a.bitwise_eq(b)));
}

/// A member whose group never completes gets a named timeout listing the
/// devices that never arrived, not a hang.
#[test]
fn a_meeting_that_never_completes_times_out_with_the_missing_devices() {
    use weft_runtime::comm::CollectiveCall;
    use weft_runtime::gpu::device_collectives::NativeCollectives;
    use weft_runtime::Backend;
    let Some(one) = wgpu_or_skip() else { return };
    let meeting: SharedGpuCollectives<cubecl::wgpu::WgpuRuntime> =
        SharedGpuCollectives::new(0..3, Duration::from_millis(200));
    let op = weft_ir::device::Collective::AllReduce { axes: vec!["x".into()], op: weft_ir::ReduceOp::Sum };
    let x = one.upload(&HostTensor::from_f32(&[2], vec![1.0, 2.0]).unwrap()).unwrap();
    let call = CollectiveCall { step: 7, op: &op, group: &[0, 1, 2], rank: 1 };
    let Err(e) = meeting.run(&one, call, &x).expect("a group on this GPU meets here") else {
        panic!("a meeting of one of three members completed")
    };
    match &e {
        RuntimeError::CollectiveTimeout { device: 1, step: 7, missing, .. } => assert_eq!(missing, &vec![0, 2], "{e}"),
        other => panic!("expected a timeout, got {other}"),
    }
}

/// Two of three members waiting when the first gives up: both get the
/// named timeout (the second from the meeting the first closed), neither
/// panics or waits on. (On a loaded machine the second may reach the
/// meeting only after the first gave up; it then names itself missing
/// too, so each message must name member 2 and may name member 0 or 1.)
#[test]
fn members_waiting_together_time_out_together() {
    use weft_runtime::comm::CollectiveCall;
    use weft_runtime::gpu::device_collectives::NativeCollectives;
    use weft_runtime::Backend;
    let Some(one) = wgpu_or_skip() else { return };
    let meeting: Arc<SharedGpuCollectives<cubecl::wgpu::WgpuRuntime>> =
        Arc::new(SharedGpuCollectives::new(0..3, Duration::from_millis(1000)));
    let op = weft_ir::device::Collective::AllReduce { axes: vec!["x".into()], op: weft_ir::ReduceOp::Sum };
    let x = one.upload(&HostTensor::from_f32(&[2], vec![1.0, 2.0]).unwrap()).unwrap();
    let start = std::time::Instant::now();
    let errors: Vec<String> = std::thread::scope(|s| {
        let members: Vec<_> = (0..2)
            .map(|rank| {
                let (meeting, op, x, one) = (meeting.clone(), &op, x.clone(), &one);
                s.spawn(move || {
                    let call = CollectiveCall { step: 3, op, group: &[0, 1, 2], rank };
                    match meeting.run(one, call, &x).expect("a group on this GPU meets here") {
                        Ok(_) => panic!("a meeting of two of three members completed"),
                        Err(e) => e.to_string(),
                    }
                })
            })
            .collect();
        members.into_iter().map(|m| m.join().expect("no panic")).collect()
    });
    assert!(start.elapsed() < Duration::from_secs(8), "both gave up at about the timeout");
    for e in &errors {
        let named = ["[2]", "[0, 2]", "[1, 2]"].iter().any(|m| e.contains(m));
        assert!(named && e.contains("never arrived"), "{e}");
    }
}

//! Device-native collectives: the paths that keep a collective's data on
//! the GPU, and how a run turns them on.
//!
//! By default a collective is folded in rank order with the interpreter's
//! arithmetic, so a run on GPUs is bit for bit the run on the CPU, on any
//! number of processes. Among logical devices of one GPU that fold runs on
//! the GPU itself ([`super::shared_collectives`], on by default on CUDA);
//! any other group is staged through the host ([`crate::comm`]). That is
//! the contract weft keeps unless told otherwise, and it is why NCCL
//! ([`super::nccl`]) is **opt-in** (`WEFT_COLLECTIVES=nccl`) rather than the default on
//! CUDA: an NCCL all-reduce sums in the order its algorithm (ring or tree,
//! split into chunks and channels chosen from the message size, the
//! topology and `NCCL_*` settings) dictates, which is not the rank-order
//! fold, so its results differ from the host path in the last bits, and
//! NCCL does not promise the same bits under another configuration. A user
//! who wants the speed asks for it and gets a run that is close to, not
//! equal to, the CPU oracle; everyone else keeps bitwise reproducibility.
//!
//! What takes the device path when it is on (everything else stays on the
//! host path, so a program mixes both): all-reduce and reduce-scatter of
//! `f32` and `f64` buffers, and all-gather of any dtype (pure data
//! movement: bitwise the host result), where the gathered or scattered
//! dimension is the outermost non-trivial one (NCCL gathers and scatters
//! contiguous runs of the flat buffer). All-to-all and collective permute
//! are host-staged. Reductions of half types stay on the host: their
//! buffers are stored as `f32` holding exactly representable values
//! (`storage.rs`), which an `f32` NCCL sum would not preserve.

use crate::comm::CollectiveCall;
use crate::devices::Devices;
use crate::error::RuntimeError;
use crate::gpu::{CubeBuffer, CubeclBackend};
use crate::process::ProcessGroup;
use cubecl::prelude::Runtime;
use std::time::Duration;
use weft_ir::device::{Collective, DeviceProgram};
use weft_ir::{DType, TensorType};

/// A device-native implementation of collectives for the logical devices
/// of one CubeCL runtime (given to a backend with
/// [`CubeclBackend::set_native_collectives`]).
pub trait NativeCollectives<R: Runtime>: Send + Sync {
    /// Runs `call` on `input`'s device memory, or `None` to leave it to the
    /// host-staged communicator (the answer must depend only on the
    /// collective and the buffer's type, so that every member of a group
    /// takes the same path).
    fn run(
        &self,
        backend: &CubeclBackend<R>,
        call: CollectiveCall<'_>,
        input: &CubeBuffer<R>,
    ) -> Option<Result<CubeBuffer<R>, RuntimeError>>;
}

/// Where a run's collectives go.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub enum CollectivePath {
    /// Staged through the host, folded in rank order: bitwise the CPU
    /// (the default).
    #[default]
    Host,
    /// NCCL on the GPUs where it can (module docs); not bitwise the host
    /// fold.
    Nccl,
}

impl CollectivePath {
    /// The environment variable that chooses the path (`host` or `nccl`).
    pub const ENV: &'static str = "WEFT_COLLECTIVES";

    /// The path named `s` (`host` or `nccl`).
    pub fn parse(s: &str) -> Result<CollectivePath, RuntimeError> {
        match s.trim() {
            "" | "host" => Ok(CollectivePath::Host),
            "nccl" => Ok(CollectivePath::Nccl),
            other => Err(RuntimeError::BadSetting {
                name: CollectivePath::ENV.into(),
                value: other.into(),
                expected: "`host` (the default: bitwise the CPU) or `nccl` (CUDA only)".into(),
            }),
        }
    }

    /// The path `WEFT_COLLECTIVES` names (`host` when it is unset).
    pub fn from_env() -> Result<CollectivePath, RuntimeError> {
        match std::env::var(CollectivePath::ENV) {
            Ok(v) => CollectivePath::parse(&v),
            Err(std::env::VarError::NotPresent) => Ok(CollectivePath::Host),
            Err(std::env::VarError::NotUnicode(v)) => CollectivePath::parse(&v.to_string_lossy()),
        }
    }
}

/// Gives `devices` (this process's devices `local` of `program`'s mesh,
/// opened with [`crate::open_devices`]) the collective path `path`:
/// nothing to do for [`CollectivePath::Host`]; for
/// [`CollectivePath::Nccl`], one NCCL communicator per collective group,
/// the unique ids sent to the other processes of `processes` (waiting at
/// most `timeout` for them). A named error when NCCL cannot be used here
/// ([`RuntimeError::NcclUnavailable`]).
pub fn attach(
    path: CollectivePath,
    program: &DeviceProgram,
    local: &[usize],
    devices: &mut Devices,
    processes: Option<&dyn ProcessGroup>,
    timeout: Duration,
) -> Result<(), RuntimeError> {
    match path {
        CollectivePath::Host => {
            attach_shared(local, devices, timeout);
            Ok(())
        }
        CollectivePath::Nccl => attach_nccl(program, local, devices, processes, timeout),
    }
}

/// Gives the logical devices that share a GPU their meeting point
/// ([`super::shared_collectives`]; CUDA only: on wgpu each logical device
/// has a CubeCL server, and so a memory, of its own).
#[cfg(feature = "cuda")]
fn attach_shared(local: &[usize], devices: &mut Devices, timeout: Duration) {
    use super::shared_collectives::SharedGpuCollectives;
    use crate::any::AnyBackend;
    use std::sync::Arc;
    if devices.map.kind != crate::BackendKind::Cuda {
        return;
    }
    for p in 0..devices.map.physical.len() {
        let on_p = devices.map.logical_on(p);
        if on_p.len() < 2 {
            continue;
        }
        let meeting = Arc::new(SharedGpuCollectives::new(on_p.iter().map(|&i| local[i]), timeout));
        for &i in &on_p {
            match &mut devices.backends[i] {
                AnyBackend::Cuda(b) => b.set_native_collectives(meeting.clone()),
                _ => unreachable!("a device map of kind cuda opens cuda devices"),
            }
        }
    }
}

#[cfg(not(feature = "cuda"))]
fn attach_shared(_: &[usize], _: &mut Devices, _: Duration) {}

#[cfg(feature = "cuda")]
fn attach_nccl(
    program: &DeviceProgram,
    local: &[usize],
    devices: &mut Devices,
    processes: Option<&dyn ProcessGroup>,
    timeout: Duration,
) -> Result<(), RuntimeError> {
    use crate::any::AnyBackend;
    if devices.map.kind != crate::BackendKind::Cuda {
        return Err(RuntimeError::NcclUnavailable {
            reason: format!(
                "the backend is {}; NCCL runs the collectives of CUDA devices (use --backend cuda, or unset {})",
                devices.map.kind,
                CollectivePath::ENV
            ),
        });
    }
    let nccl = super::nccl::connect(program, local, &devices.map.assignment, processes, timeout)?;
    for (backend, dev) in devices.backends.iter_mut().zip(nccl) {
        match backend {
            AnyBackend::Cuda(b) => b.set_native_collectives(dev),
            _ => unreachable!("a device map of kind cuda opens cuda devices"),
        }
    }
    Ok(())
}

#[cfg(not(feature = "cuda"))]
fn attach_nccl(
    _: &DeviceProgram,
    _: &[usize],
    _: &mut Devices,
    _: Option<&dyn ProcessGroup>,
    _: Duration,
) -> Result<(), RuntimeError> {
    Err(RuntimeError::NcclUnavailable {
        reason: format!(
            "weft was built without the `cuda` feature (rebuild with --features cuda, or unset {})",
            CollectivePath::ENV
        ),
    })
}

/// How the device path runs one collective on a buffer of type `ty` in a
/// group of `n` (`None`: host-staged; module docs).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum NativeKind {
    /// Every member gets the elementwise reduction.
    AllReduce(weft_ir::ReduceOp),
    /// Member `r` gets the `r`-th of `n` contiguous runs of the reduction.
    ReduceScatter(weft_ir::ReduceOp),
    /// Every member gets the members' buffers one after the other.
    AllGather,
}

/// [`NativeKind`] of `op` on a buffer of type `ty` in a group of `n`.
pub fn native_kind(op: &Collective, ty: &TensorType, n: usize) -> Option<NativeKind> {
    if ty.num_elements() == 0 || n == 0 {
        return None;
    }
    let reducible = matches!(ty.dtype, DType::F32 | DType::F64);
    // Concatenating (or splitting) along `dim` is concatenating the flat
    // buffers when every dimension outside it has size 1.
    let outermost = |dim: usize| ty.shape.get(..dim).is_some_and(|outer| outer.iter().all(|&s| s == 1));
    match op {
        Collective::AllReduce { op, .. } if reducible => Some(NativeKind::AllReduce(*op)),
        Collective::ReduceScatter { dim, op, .. }
            if reducible && outermost(*dim) && ty.shape.get(*dim).is_some_and(|&s| s % n == 0) =>
        {
            Some(NativeKind::ReduceScatter(*op))
        }
        Collective::AllGather { dim, .. } if outermost(*dim) && *dim < ty.shape.len() => Some(NativeKind::AllGather),
        _ => None,
    }
}

/// The type a member receives from `kind` on a buffer of type `ty` in a
/// group of `n` (`dim` is the collective's gathered or scattered
/// dimension).
pub fn native_output_type(kind: NativeKind, op: &Collective, ty: &TensorType, n: usize) -> TensorType {
    let mut shape = ty.shape.clone();
    match (kind, op) {
        (NativeKind::AllReduce(_), _) => {}
        (NativeKind::ReduceScatter(_), Collective::ReduceScatter { dim, .. }) => shape[*dim] /= n,
        (NativeKind::AllGather, Collective::AllGather { dim, .. }) => shape[*dim] *= n,
        _ => unreachable!("native_kind matches the collective"),
    }
    TensorType { shape, dtype: ty.dtype }
}

/// The distinct groups of the collectives of `program` the device path
/// may run (all-reduce, reduce-scatter and all-gather), sorted.
pub fn native_groups(program: &DeviceProgram) -> Vec<Vec<usize>> {
    let mut groups = std::collections::BTreeSet::new();
    for step in &program.steps {
        if let Some((op, _, _)) = step.collective() {
            match op {
                Collective::AllReduce { axes, .. }
                | Collective::ReduceScatter { axes, .. }
                | Collective::AllGather { axes, .. } => groups.extend(program.groups(axes)),
                Collective::AllToAll { .. } | Collective::CollectivePermute { .. } => {}
            }
        }
    }
    groups.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use weft_ir::ReduceOp;

    fn ty(shape: &[usize], dtype: DType) -> TensorType {
        TensorType { shape: shape.to_vec(), dtype }
    }

    #[test]
    fn paths_parse_and_a_bad_one_is_named() {
        assert_eq!(CollectivePath::parse("nccl").unwrap(), CollectivePath::Nccl);
        assert_eq!(CollectivePath::parse("host").unwrap(), CollectivePath::Host);
        assert_eq!(CollectivePath::parse("").unwrap(), CollectivePath::Host);
        let e = CollectivePath::parse("mpi").unwrap_err();
        assert!(matches!(e, RuntimeError::BadSetting { .. }), "{e}");
        assert!(e.to_string().contains("WEFT_COLLECTIVES"), "{e}");
    }

    #[test]
    fn started_collectives_have_their_groups_too() {
        let p = weft_ir::device::parse_program(
            "device_program @f mesh [data=2, model=2] {
  input %0 : f32[4]
  %1 = all_reduce_start %0 {axes = [model], op = sum} : f32[4]
  %2 = all_gather %0 {dim = 0, axes = [data]} : f32[8]
  done %1
  return %1, %2
}",
        )
        .unwrap();
        assert_eq!(native_groups(&p), vec![vec![0, 1], vec![0, 2], vec![1, 3], vec![2, 3]]);
    }

    #[test]
    fn which_collectives_stay_on_the_device() {
        let ar = |op| Collective::AllReduce { axes: vec!["x".into()], op };
        let ag = |dim| Collective::AllGather { dim, axes: vec!["x".into()] };
        let rs = |dim| Collective::ReduceScatter { dim, axes: vec!["x".into()], op: ReduceOp::Sum };
        assert_eq!(
            native_kind(&ar(ReduceOp::Max), &ty(&[3, 4], DType::F32), 2),
            Some(NativeKind::AllReduce(ReduceOp::Max))
        );
        // Half types and integers reduce on the host (module docs).
        assert_eq!(native_kind(&ar(ReduceOp::Sum), &ty(&[4], DType::BF16), 2), None);
        assert_eq!(native_kind(&ar(ReduceOp::Sum), &ty(&[4], DType::I32), 2), None);
        // Gathers move bytes: any dtype, outermost dimension only.
        assert_eq!(native_kind(&ag(0), &ty(&[3, 4], DType::BF16), 2), Some(NativeKind::AllGather));
        assert_eq!(native_kind(&ag(1), &ty(&[1, 4], DType::I32), 2), Some(NativeKind::AllGather));
        assert_eq!(native_kind(&ag(1), &ty(&[3, 4], DType::F32), 2), None);
        assert_eq!(native_kind(&rs(0), &ty(&[4, 3], DType::F32), 2), Some(NativeKind::ReduceScatter(ReduceOp::Sum)));
        assert_eq!(native_kind(&rs(0), &ty(&[3, 3], DType::F32), 2), None);
        assert_eq!(native_kind(&rs(1), &ty(&[4, 4], DType::F32), 2), None);
        assert_eq!(native_kind(&ar(ReduceOp::Sum), &ty(&[0], DType::F32), 2), None);
        let a2a = Collective::AllToAll { split_dim: 0, concat_dim: 0, axes: vec!["x".into()] };
        assert_eq!(native_kind(&a2a, &ty(&[4], DType::F32), 2), None);
        let k = native_kind(&ag(0), &ty(&[3, 4], DType::F32), 2).unwrap();
        assert_eq!(native_output_type(k, &ag(0), &ty(&[3, 4], DType::F32), 2).shape, vec![6, 4]);
        let k = native_kind(&rs(0), &ty(&[4, 3], DType::F32), 2).unwrap();
        assert_eq!(native_output_type(k, &rs(0), &ty(&[4, 3], DType::F32), 2).shape, vec![2, 3]);
    }

    const PROGRAM: &str = "device_program @main mesh [data=2, model=2] {
  input %0 : f32[4,3]  // x
  %1 = all_reduce %0 {axes = [model], op = sum} : f32[4,3]
  %2 = all_gather %1 {dim = 0, axes = [data]} : f32[8,3]
  %3 = all_to_all %2 {split_dim = 0, concat_dim = 0, axes = [data, model]} : f32[8,3]
  return %3
}
";

    #[test]
    fn groups_of_the_collectives_nccl_may_run() {
        let p: DeviceProgram = PROGRAM.parse().unwrap();
        // model pairs {0,1}, {2,3}; data pairs {0,2}, {1,3}; the
        // all-to-all's group (all four) stays on the host.
        assert_eq!(native_groups(&p), vec![vec![0, 1], vec![0, 2], vec![1, 3], vec![2, 3]]);
    }

    #[test]
    fn nccl_on_a_cpu_backend_is_a_named_error() {
        let p: DeviceProgram = PROGRAM.parse().unwrap();
        let mut devices = crate::open_devices(crate::BackendKind::Cpu, 4).unwrap();
        attach(CollectivePath::Host, &p, &[0, 1, 2, 3], &mut devices, None, Duration::from_secs(1)).unwrap();
        let e =
            attach(CollectivePath::Nccl, &p, &[0, 1, 2, 3], &mut devices, None, Duration::from_secs(1)).unwrap_err();
        assert!(matches!(e, RuntimeError::NcclUnavailable { .. }), "{e}");
    }
}

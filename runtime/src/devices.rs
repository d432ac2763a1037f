//! Choosing a backend and mapping logical devices onto physical ones.
//!
//! A program's mesh needs N logical devices; a machine has some number of
//! physical devices (GPUs, a software Vulkan adapter, the host CPU).
//! Logical devices are assigned to physical ones in contiguous blocks
//! (devices `0..k` on the first, ...), so any N runs anywhere: eight
//! logical devices on one lavapipe adapter test the same collectives an
//! eight-GPU machine would run. [`DeviceMap`] records and prints the
//! assignment.
//!
//! In a job of several processes, the processes on one host share its
//! physical devices ([`HostShare`]: the process's local rank of the
//! processes there): each opens its own contiguous slice of them (four
//! processes, four GPUs: one GPU each), or, with more processes than
//! devices, one device shared with its neighbours. A launcher that gives
//! each process its own devices (`CUDA_VISIBLE_DEVICES` per task, as
//! Slurm's `--gpus-per-task` does) shows each process fewer devices than
//! processes on its host, and so each opens the one it sees.
//!
//! The default backend ("best available") is CUDA when compiled in and a
//! GPU is present, then wgpu on a hardware adapter, then the CPU. A
//! software Vulkan adapter (lavapipe) is used only when asked for by name
//! (`wgpu`): it is slower than the CPU reference backend and exists to
//! test the GPU path on machines without a GPU.

use crate::any::AnyBackend;
use crate::cpu::CpuBackend;
use crate::error::RuntimeError;
use crate::fast::FastCpuBackend;
use crate::gpu::wgpu_devices;
use std::fmt;
use std::str::FromStr;

/// A kind of backend.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum BackendKind {
    /// The fast CPU backend ([`crate::FastCpuBackend`]).
    Cpu,
    /// The CPU reference backend: every op through the interpreter
    /// ([`crate::CpuBackend`]); the executable's oracle.
    CpuRef,
    /// CubeCL on wgpu (Vulkan, Metal, DX12).
    Wgpu,
    /// CubeCL on CUDA (needs the `cuda` feature).
    Cuda,
}

impl BackendKind {
    /// Every kind, best first.
    pub const ALL: [BackendKind; 4] = [BackendKind::Cuda, BackendKind::Wgpu, BackendKind::Cpu, BackendKind::CpuRef];

    /// The name used to select it (`cpu`, `cpu-ref`, `wgpu`, `cuda`).
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Cpu => "cpu",
            BackendKind::CpuRef => "cpu-ref",
            BackendKind::Wgpu => "wgpu",
            BackendKind::Cuda => "cuda",
        }
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for BackendKind {
    type Err = RuntimeError;

    fn from_str(s: &str) -> Result<BackendKind, RuntimeError> {
        BackendKind::ALL.into_iter().find(|k| k.name() == s).ok_or_else(|| RuntimeError::UnknownBackend(s.into()))
    }
}

/// A physical device logical devices can be placed on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PhysicalDevice {
    /// A description (adapter name, type, API, driver).
    pub name: String,
    /// True for software implementations (lavapipe) and the host CPU.
    pub software: bool,
}

/// The physical devices of `kind` on this machine (an error saying why
/// when there are none).
pub fn physical_devices(kind: BackendKind) -> Result<Vec<PhysicalDevice>, RuntimeError> {
    let unavailable =
        |reason: &str| RuntimeError::BackendUnavailable { backend: kind.name().into(), reason: reason.into() };
    match kind {
        BackendKind::Cpu => Ok(vec![PhysicalDevice { name: "host CPU".into(), software: true }]),
        BackendKind::CpuRef => {
            Ok(vec![PhysicalDevice { name: "host CPU (reference interpreter)".into(), software: true }])
        }
        BackendKind::Wgpu => {
            let (_, adapters) = wgpu_devices::adapters();
            if adapters.is_empty() {
                return Err(unavailable(
                    "no Vulkan, Metal or DX12 adapter found (without a GPU on Linux, install mesa-vulkan-drivers)",
                ));
            }
            Ok(adapters
                .iter()
                .map(|a| {
                    let (name, software) = wgpu_devices::describe(a);
                    PhysicalDevice { name, software }
                })
                .collect())
        }
        BackendKind::Cuda => cuda_devices().map_err(|r| unavailable(&r)),
    }
}

#[cfg(feature = "cuda")]
fn cuda_devices() -> Result<Vec<PhysicalDevice>, String> {
    match crate::gpu::cuda_devices::device_count() {
        0 => Err("no CUDA device found (or the CUDA driver could not be loaded)".into()),
        n => Ok((0..n).map(|i| PhysicalDevice { name: format!("CUDA GPU {i}"), software: false }).collect()),
    }
}

#[cfg(not(feature = "cuda"))]
fn cuda_devices() -> Result<Vec<PhysicalDevice>, String> {
    Err("weft-runtime was built without the `cuda` feature".into())
}

/// The kinds that can run here, best first.
pub fn available_backends() -> Vec<BackendKind> {
    BackendKind::ALL.into_iter().filter(|&k| physical_devices(k).is_ok()).collect()
}

/// The backend to use: `name` (`cpu`, `wgpu`, `cuda`; checked to be
/// available), or the best available one when `None` or `"auto"` (see the
/// module documentation).
pub fn select_backend(name: Option<&str>) -> Result<BackendKind, RuntimeError> {
    match name {
        Some(n) if n != "auto" => {
            let kind: BackendKind = n.parse()?;
            physical_devices(kind)?;
            Ok(kind)
        }
        _ => {
            if physical_devices(BackendKind::Cuda).is_ok() {
                return Ok(BackendKind::Cuda);
            }
            match physical_devices(BackendKind::Wgpu) {
                Ok(devs) if devs.iter().any(|d| !d.software) => Ok(BackendKind::Wgpu),
                _ => Ok(BackendKind::Cpu),
            }
        }
    }
}

/// A process's share of its host's physical devices: it is the
/// `index`-th (its local rank) of `of` processes on the host.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct HostShare {
    /// The process's place among the processes on its host.
    pub index: usize,
    /// The number of processes on the host (at least 1).
    pub of: usize,
}

impl HostShare {
    /// The only process on its host: every device is its own.
    pub const ALONE: HostShare = HostShare { index: 0, of: 1 };

    /// The physical devices (indices into `count`) this process opens: a
    /// contiguous, nearly equal slice when there are at least as many
    /// devices as processes, else the one device it shares with the
    /// processes nearest in local rank.
    pub fn physical(&self, count: usize) -> std::ops::Range<usize> {
        let (i, of) = (self.index, self.of.max(1));
        if count == 0 {
            0..0
        } else if of <= count {
            i * count / of..(i + 1) * count / of
        } else {
            let d = i * count / of;
            d..d + 1
        }
    }
}

/// Which physical device each logical device runs on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceMap {
    /// The backend.
    pub kind: BackendKind,
    /// The physical devices present.
    pub physical: Vec<PhysicalDevice>,
    /// For each logical device, the index of its physical device.
    pub assignment: Vec<usize>,
    /// This process's share of the host's devices.
    pub share: HostShare,
}

impl DeviceMap {
    /// Places `n` logical devices on `physical` devices: one each while
    /// there are enough, otherwise in contiguous, nearly equal blocks.
    pub fn new(kind: BackendKind, physical: Vec<PhysicalDevice>, n: usize) -> DeviceMap {
        DeviceMap::shared(kind, physical, n, HostShare::ALONE)
    }

    /// [`DeviceMap::new`] on this process's `share` of the host's
    /// `physical` devices only ([`HostShare::physical`]).
    pub fn shared(kind: BackendKind, physical: Vec<PhysicalDevice>, n: usize, share: HostShare) -> DeviceMap {
        let mine = share.physical(physical.len());
        let p = mine.len().max(1);
        let assignment = (0..n).map(|i| mine.start + if n <= p { i } else { i * p / n }).collect();
        DeviceMap { kind, physical, assignment, share }
    }

    /// The logical devices placed on physical device `p`, in order.
    pub fn logical_on(&self, p: usize) -> Vec<usize> {
        (0..self.assignment.len()).filter(|&i| self.assignment[i] == p).collect()
    }
}

impl fmt::Display for DeviceMap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.assignment.len();
        let plural = |k: usize| if k == 1 { "" } else { "s" };
        let shared = match self.share {
            HostShare { of: 1, .. } => String::new(),
            HostShare { index, of } => format!("; this process is {index} of {of} on this host"),
        };
        writeln!(f, "{n} logical device{} on {} ({} physical{shared}):", plural(n), self.kind, self.physical.len())?;
        let mine = self.share.physical(self.physical.len());
        for (p, dev) in self.physical.iter().enumerate() {
            let l = self.logical_on(p);
            let which = match (l.first(), l.last()) {
                (Some(a), Some(b)) if a == b => format!("logical {a}"),
                (Some(a), Some(b)) => format!("logical {a}-{b}"),
                _ if !mine.contains(&p) => "other processes on this host".to_string(),
                _ => "unused".to_string(),
            };
            writeln!(f, "  [{p}] {}: {which}", dev.name)?;
        }
        Ok(())
    }
}

/// N logical devices, ready for the executor.
pub struct Devices {
    /// One backend per logical device, in flat device order.
    pub backends: Vec<AnyBackend>,
    /// Where they run.
    pub map: DeviceMap,
}

/// Threads each of `n` CPU devices' products and fused chains may use (a
/// device computes on one thread otherwise): the cores this
/// process gets (the host's, shared evenly by its processes) over its
/// devices, at least 1. With as many devices as cores or more, the lanes
/// already fill the cores and each product stays on its own lane's thread.
///
/// `WEFT_KERNEL_THREADS=N` sets it (1: every device on its lane's thread
/// alone, as before; for comparisons).
pub fn kernel_threads(n: usize, share: HostShare) -> usize {
    if let Some(t) = std::env::var("WEFT_KERNEL_THREADS").ok().and_then(|v| v.parse::<usize>().ok()) {
        return t.max(1);
    }
    let cores = std::thread::available_parallelism().map(|c| c.get()).unwrap_or(1);
    (cores / share.of.max(1) / n.max(1)).max(1)
}

/// Opens `n` logical devices of `kind` on the physical devices present.
pub fn open_devices(kind: BackendKind, n: usize) -> Result<Devices, RuntimeError> {
    open_devices_shared(kind, n, HostShare::ALONE)
}

/// [`open_devices`] for a process with `share` of its host's physical
/// devices: the logical devices go on its slice only
/// ([`DeviceMap::shared`]).
pub fn open_devices_shared(kind: BackendKind, n: usize, share: HostShare) -> Result<Devices, RuntimeError> {
    let physical = physical_devices(kind)?;
    let map = DeviceMap::shared(kind, physical, n, share);
    let mut backends = Vec::with_capacity(n);
    match kind {
        BackendKind::Cpu => {
            let threads = kernel_threads(n, share);
            backends.extend((0..n).map(|_| AnyBackend::Cpu(FastCpuBackend::new().with_threads(threads))))
        }
        BackendKind::CpuRef => backends.extend((0..n).map(|_| AnyBackend::CpuRef(CpuBackend::new()))),
        BackendKind::Wgpu => {
            let (instance, adapters) = wgpu_devices::adapters();
            for (p, adapter) in adapters.iter().enumerate().take(map.physical.len()) {
                let logical = map.logical_on(p);
                if let Some(&first) = logical.first() {
                    let opened = wgpu_devices::open(&instance, adapter, logical.len(), first)?;
                    backends.extend(opened.into_iter().map(AnyBackend::Wgpu));
                }
            }
        }
        BackendKind::Cuda => open_cuda(&map, &mut backends)?,
    }
    if backends.len() != n {
        return Err(RuntimeError::BackendUnavailable {
            backend: kind.name().into(),
            reason: format!("opened {} of {n} logical devices (adapters changed while opening?)", backends.len()),
        });
    }
    Ok(Devices { backends, map })
}

#[cfg(feature = "cuda")]
fn open_cuda(map: &DeviceMap, backends: &mut Vec<AnyBackend>) -> Result<(), RuntimeError> {
    for p in 0..map.physical.len() {
        let logical = map.logical_on(p);
        if let Some(&first) = logical.first() {
            let opened = crate::gpu::cuda_devices::open(p, logical.len(), first)?;
            backends.extend(opened.into_iter().map(AnyBackend::Cuda));
        }
    }
    Ok(())
}

#[cfg(not(feature = "cuda"))]
fn open_cuda(_: &DeviceMap, _: &mut Vec<AnyBackend>) -> Result<(), RuntimeError> {
    Err(RuntimeError::BackendUnavailable {
        backend: "cuda".into(),
        reason: "weft-runtime was built without the `cuda` feature".into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn phys(n: usize) -> Vec<PhysicalDevice> {
        (0..n).map(|i| PhysicalDevice { name: format!("gpu{i}"), software: false }).collect()
    }

    #[test]
    fn blocks_of_logical_devices() {
        assert_eq!(DeviceMap::new(BackendKind::Wgpu, phys(1), 8).assignment, vec![0; 8]);
        assert_eq!(DeviceMap::new(BackendKind::Wgpu, phys(2), 8).assignment, vec![0, 0, 0, 0, 1, 1, 1, 1]);
        assert_eq!(DeviceMap::new(BackendKind::Wgpu, phys(3), 4).assignment, vec![0, 0, 1, 2]);
        assert_eq!(DeviceMap::new(BackendKind::Wgpu, phys(4), 2).assignment, vec![0, 1]);
        let text = DeviceMap::new(BackendKind::Wgpu, phys(2), 8).to_string();
        assert!(text.contains("[0] gpu0: logical 0-3") && text.contains("[1] gpu1: logical 4-7"), "{text}");
    }

    #[test]
    fn processes_on_one_host_share_its_devices() {
        let share = |index, of| HostShare { index, of };
        // Four processes, four GPUs: one each.
        for i in 0..4 {
            assert_eq!(share(i, 4).physical(4), i..i + 1);
        }
        // Two processes, eight GPUs: four each.
        assert_eq!(share(1, 2).physical(8), 4..8);
        // Eight processes, two GPUs: four share each; one GPU seen per
        // process (CUDA_VISIBLE_DEVICES per task): each its own.
        assert_eq!(share(3, 8).physical(2), 0..1);
        assert_eq!(share(4, 8).physical(2), 1..2);
        assert_eq!(share(7, 8).physical(1), 0..1);
        assert_eq!(HostShare::ALONE.physical(3), 0..3);
        assert_eq!(share(0, 2).physical(0), 0..0);
        // Process 2 of 4 on a 4-GPU host, two logical devices: both on GPU 2.
        let map = DeviceMap::shared(BackendKind::Cuda, phys(4), 2, share(2, 4));
        assert_eq!(map.assignment, vec![2, 2]);
        assert_eq!(map.logical_on(2), vec![0, 1]);
        let text = map.to_string();
        assert!(text.contains("this process is 2 of 4 on this host"), "{text}");
        assert!(text.contains("[2] gpu2: logical 0-1") && text.contains("[0] gpu0: other processes"), "{text}");
        // Process 1 of 2 on an 8-GPU host, 4 logical devices: GPUs 4-7.
        assert_eq!(DeviceMap::shared(BackendKind::Cuda, phys(8), 4, share(1, 2)).assignment, vec![4, 5, 6, 7]);
        // Alone on the host: unchanged.
        assert_eq!(
            DeviceMap::shared(BackendKind::Wgpu, phys(2), 8, HostShare::ALONE),
            DeviceMap::new(BackendKind::Wgpu, phys(2), 8)
        );
    }

    #[test]
    fn missing_cuda_is_an_error_not_a_panic() {
        // Without the feature, or without a driver (CubeCL loads it at run
        // time), asking for CUDA is a clear error; the default falls back.
        match select_backend(Some("cuda")) {
            Ok(k) => assert_eq!(k, BackendKind::Cuda),
            Err(e) => assert!(matches!(e, RuntimeError::BackendUnavailable { .. }), "{e}"),
        }
        assert!(select_backend(None).is_ok());
        assert!(available_backends().contains(&BackendKind::Cpu));
    }

    #[test]
    fn names_parse() {
        assert_eq!("wgpu".parse::<BackendKind>().unwrap(), BackendKind::Wgpu);
        assert!(matches!("tpu".parse::<BackendKind>(), Err(RuntimeError::UnknownBackend(_))));
        assert_eq!(select_backend(Some("cpu")).unwrap(), BackendKind::Cpu);
    }
}

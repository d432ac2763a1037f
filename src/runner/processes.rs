//! Multi-process runs: `mpirun -n P weft train CONFIG` (or `srun`).
//!
//! Every process runs the same session: it parses the same config,
//! compiles the same program and owns a contiguous run of the mesh's
//! devices ([`weft_runtime::process::devices_of_process`]: on 8 devices
//! and 2 processes, process 0 owns devices 0–3 and process 1 devices
//! 4–7). Collectives between processes go through MPI
//! ([`weft_runtime::process::ProcessComm`]), folded in rank order, so the
//! metrics are bitwise those of one process. Before anything runs, the
//! processes compare hashes of the binary, the config and the compiled
//! program, and stop with [`Error::ProcessMismatch`] if any differs.
//! Process 0 writes the metrics, the run manifest and the checkpoint
//! manifest; every process writes the checkpoint blocks its devices hold.
//!
//! Sums across processes can instead take MPI's own reductions
//! (`reduction = "fast"`, `--reduction fast`; [`Reduction`]): faster, and
//! still the same on every process, but not bitwise the one-process run.
//! The mode is part of the config, so every process checks that the
//! others run the same one.
//!
//! The processes may span several hosts: at start-up they exchange their
//! host names ([`Hosts`]), and each opens its share of its own host's
//! physical devices ([`weft_runtime::HostShare`]: four processes on a
//! four-GPU host, one GPU each). The description printed at start names
//! every process's host and local rank.
//!
//! A process that fails stops the whole job (`MPI_Abort`), so none is left
//! waiting; a process that dies or hangs is noticed by the others within
//! the collective timeout (`WEFT_COLLECTIVE_TIMEOUT`, seconds), whose
//! error names it.

use crate::error::{Error, Result};
use sha2::{Digest, Sha256};
use std::sync::Arc;
use std::time::Duration;
use weft_runtime::process::TimedGroup;
use weft_runtime::process::{check_process_count, device_owners, devices_of_process, Hosts, Reduction};
use weft_runtime::{HostShare, ProcessGroup};

/// How long a process waits for the others by default.
pub const DEFAULT_PROCESS_TIMEOUT: Duration = Duration::from_secs(300);

/// The processes of a multi-process run, as this one sees them.
#[derive(Clone)]
pub struct Processes {
    group: Arc<dyn ProcessGroup>,
    /// The same transport, timing every call: the time spent waiting for
    /// the other processes ([`Processes::waited`]).
    clock: Arc<TimedGroup>,
    hosts: Arc<Hosts>,
    timeout: Duration,
    reduction: Reduction,
}

impl std::fmt::Debug for Processes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "process {} of {}", self.group.rank(), self.group.size())
    }
}

/// Keeps the transport alive (MPI: finalised when dropped).
pub struct Launch {
    /// The processes, if launched as several.
    pub processes: Option<Processes>,
    #[cfg(feature = "mpi")]
    _session: Option<weft_runtime::process::MpiSession>,
}

/// The number of processes the launcher started, from its environment
/// (Open MPI's `mpirun`, MPICH's Hydra, Slurm's `srun`); `None` outside a
/// launcher.
fn launched_size() -> Option<usize> {
    ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS"]
        .iter()
        .find_map(|v| std::env::var(v).ok().and_then(|s| s.trim().parse().ok()))
}

/// The collective timeout: `WEFT_COLLECTIVE_TIMEOUT` seconds, or the default.
pub fn timeout_from_env() -> Result<Duration> {
    match std::env::var("WEFT_COLLECTIVE_TIMEOUT") {
        Err(_) => Ok(DEFAULT_PROCESS_TIMEOUT),
        Ok(s) => match s.trim().parse::<f64>() {
            Ok(secs) if secs > 0.0 && secs.is_finite() => Ok(Duration::from_secs_f64(secs)),
            _ => Err(Error::Usage(format!("WEFT_COLLECTIVE_TIMEOUT={s}: expected a positive number of seconds"))),
        },
    }
}

impl Launch {
    /// Joins the job the launcher started: with the `mpi` feature under
    /// `mpirun`/`srun`, MPI is initialised; a single process (no launcher,
    /// or a job of one) runs alone. A launch of several processes by a
    /// weft built without the `mpi` feature is [`Error::NoMpi`].
    pub fn from_environment() -> Result<Launch> {
        let size = launched_size();
        #[cfg(feature = "mpi")]
        {
            if size.is_none_or(|n| n <= 1) {
                return Ok(Launch { processes: None, _session: None });
            }
            let timeout = timeout_from_env()?;
            let (group, session) = weft_runtime::process::MpiGroup::init()?;
            // A world of one (the environment overstated it) runs alone.
            let processes = match group.size() > 1 {
                true => Some(Processes::join(Arc::new(group), timeout)?),
                false => None,
            };
            Ok(Launch { processes, _session: Some(session) })
        }
        #[cfg(not(feature = "mpi"))]
        {
            match size {
                Some(n) if n > 1 => Err(Error::NoMpi { processes: n }),
                _ => Ok(Launch { processes: None }),
            }
        }
    }
}

impl Processes {
    /// Processes over any transport (threads in tests, MPI in `weft`):
    /// every process calls it once at start-up, and they exchange their
    /// host names ([`Hosts`]).
    pub fn join(group: Arc<dyn ProcessGroup>, timeout: Duration) -> Result<Processes> {
        let clock = Arc::new(TimedGroup::new(group));
        let group: Arc<dyn ProcessGroup> = clock.clone();
        let hosts = Arc::new(Hosts::gather(group.as_ref(), timeout)?);
        Ok(Processes { group, clock, hosts, timeout, reduction: Reduction::Deterministic })
    }

    /// The time this process has spent in exchanges with the others since
    /// it joined (waiting for them, and the transfers): the measure of
    /// [`super::stragglers`].
    pub fn waited(&self) -> Duration {
        self.clock.waited()
    }

    /// These processes with sums across them combined in mode `reduction`
    /// (default [`Reduction::Deterministic`]).
    pub fn with_reduction(mut self, reduction: Reduction) -> Processes {
        self.reduction = reduction;
        self
    }

    /// How sums across the processes are combined.
    pub fn reduction(&self) -> Reduction {
        self.reduction
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.group.rank()
    }

    /// The number of processes.
    pub fn size(&self) -> usize {
        self.group.size()
    }

    /// The transport.
    pub fn group(&self) -> &Arc<dyn ProcessGroup> {
        &self.group
    }

    /// The transport without the clock of [`Processes::waited`]: a
    /// pipeline's stages wait for each other inside a step as the schedule
    /// says, which is not a straggler's wait.
    pub fn untimed_group(&self) -> &Arc<dyn ProcessGroup> {
        self.clock.inner()
    }

    /// The host of every process.
    pub fn hosts(&self) -> &Hosts {
        &self.hosts
    }

    /// This process's share of its host's physical devices.
    pub fn host_share(&self) -> HostShare {
        self.hosts.share(self.rank())
    }

    /// How long a process waits for the others.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Whether this process writes what is written once (metrics, run
    /// manifest, checkpoint manifest).
    pub fn is_first(&self) -> bool {
        self.rank() == 0
    }

    /// The devices this process owns on a mesh of `devices` devices.
    pub fn local_devices(&self, devices: usize) -> Result<Vec<usize>> {
        check_process_count(devices, self.size())?;
        Ok(devices_of_process(devices, self.size(), self.rank()).collect())
    }

    /// The process owning each device of a mesh of `devices` devices.
    pub fn owners(&self, devices: usize) -> Vec<usize> {
        device_owners(devices, self.size())
    }

    /// Stops every process of the job (after an error here).
    pub fn abort_all(&self, code: i32) {
        self.group.abort_all(code)
    }

    /// Waits for every process at `what`.
    pub fn barrier(&self, what: &str) -> Result<()> {
        Ok(self.group.barrier(self.timeout, what)?)
    }

    /// Every process's `bytes`, in rank order.
    pub fn all_gather(&self, bytes: &[u8], what: &str) -> Result<Vec<Vec<u8>>> {
        Ok(self.group.all_gather(bytes, self.timeout, what)?)
    }

    /// Checks that every process has the same `(what, bytes)` items (the
    /// binary, the config, the program): [`Error::ProcessMismatch`] names
    /// the first item that differs and the processes whose copy differs
    /// from process 0's.
    pub fn check_same(&self, items: &[(&str, &[u8])]) -> Result<()> {
        let mut digest = Vec::with_capacity(32 * items.len());
        for (_, bytes) in items {
            digest.extend_from_slice(&Sha256::digest(bytes));
        }
        let all = self.all_gather(&digest, "the start-up check")?;
        for (k, (what, _)) in items.iter().enumerate() {
            let first = &all[0][32 * k..32 * (k + 1)];
            let differ: Vec<usize> =
                (1..all.len()).filter(|&p| all[p].get(32 * k..32 * (k + 1)) != Some(first)).collect();
            if !differ.is_empty() {
                return Err(Error::ProcessMismatch { what: what.to_string(), processes: differ });
            }
        }
        Ok(())
    }

    /// Checks that `dir` is one directory for every process (a checkpoint
    /// root on a file system every host mounts): process 0 writes a file
    /// of unique contents into it, every process reads it back, and a
    /// process that does not see it makes [`Error::NotShared`] on all of
    /// them (naming it and its host) before any training step, rather
    /// than a failed save hours later. A collective: every process calls
    /// it with the same `dir`.
    pub fn check_shared_dir(&self, dir: &std::path::Path) -> Result<()> {
        // Process 0's file name and contents, unique to this check.
        let offer = if self.is_first() {
            let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
            let token = format!("{:x}", Sha256::digest(format!("{}:{nanos}", std::process::id())));
            let path = dir.join(format!(".weft-shared-{}", &token[..16]));
            std::fs::write(&path, &token).map_err(|source| Error::Io { path: path.clone(), source })?;
            format!("{}\n{token}", path.display())
        } else {
            String::new()
        };
        let offers = self.all_gather(offer.as_bytes(), "the check that the checkpoint directory is shared")?;
        let offer = String::from_utf8_lossy(&offers[0]).into_owned();
        let (path, token) = offer.split_once('\n').unwrap_or(("", ""));
        let seen = std::fs::read(path).is_ok_and(|b| b == token.as_bytes());
        let seen_all = self.all_gather(&[seen as u8], "the check that the checkpoint directory is shared")?;
        if self.is_first() {
            std::fs::remove_file(path).ok();
        }
        let missing: Vec<usize> = (0..self.size()).filter(|&q| seen_all[q] != [1]).collect();
        if missing.is_empty() {
            return Ok(());
        }
        let hosts = self.hosts.distinct_of(missing.iter().copied());
        Err(Error::NotShared {
            dir: dir.to_path_buf(),
            writer: self.hosts.name(0).to_string(),
            processes: missing,
            hosts: format!("host{} {}", if hosts.len() == 1 { "" } else { "s" }, hosts.join(", ")),
        })
    }
}

/// The bytes of the running binary (for [`Processes::check_same`]).
pub fn binary_bytes() -> Vec<u8> {
    std::env::current_exe().and_then(std::fs::read).unwrap_or_default()
}

/// Makes the whole-leaf (replicated) entries of this process's part of a
/// checkpoint state blocks of device 0, held by the first process only:
/// a multi-process save writes each block once, from its lowest device.
pub fn own_replicated_leaves(state: &mut crate::checkpoint::CheckpointState, first: bool) {
    use crate::checkpoint::{LeafData, ShardedLeaf};
    for leaf in state.leaves.values_mut() {
        if let LeafData::Global(t) = leaf {
            let ty = t.ty();
            let sharding = weft_ir::TensorSharding::replicated(ty.rank());
            let mut shards = std::collections::BTreeMap::new();
            if first {
                shards.insert(0, t.clone());
            }
            *leaf = LeafData::Sharded(ShardedLeaf { ty, sharding, shards });
        }
    }
}

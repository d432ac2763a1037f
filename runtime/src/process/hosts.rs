//! Hosts: which processes of a job share a machine, and so its GPUs.
//!
//! A job of `P` processes may span several hosts (`mpirun -n 8 --host
//! a:4,b:4`, `srun -N 2`). Devices are dealt to processes by rank alone
//! ([`super::devices_of_process`]), but the physical devices a process
//! opens are those of its own host, shared with the other processes there:
//! four processes on a host with four GPUs must open one GPU each, not all
//! GPU 0 (what `CUDA_VISIBLE_DEVICES`-less launches do when every process
//! opens "the first GPU"). JAX (`local_device_ids`) and Horovod
//! (`hvd.local_rank()`) solve the same problem the same way: a process's
//! *local rank* among the processes on its host picks its share.
//!
//! Processes learn their hosts by gathering each one's host name (MPI's
//! processor name under MPI) at start-up; [`Hosts`] derives from those
//! names, in rank order, each process's host, its local rank and the
//! number of processes there, and [`Hosts::share`] the
//! [`crate::devices::HostShare`] that places its devices. Only names are
//! compared, so two processes are on one host exactly when their launcher
//! says so, whatever the network looks like (the multi-host tests run
//! "hosts" that are network and UTS namespaces of one machine).

use super::ProcessGroup;
use crate::devices::HostShare;
use crate::error::RuntimeError;
use std::time::Duration;

/// This machine's host name: the kernel's (`/proc/sys/kernel/hostname`,
/// which a UTS namespace sets), else `$HOSTNAME`, else `localhost`.
pub fn this_host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".to_string())
}

/// The host of every process of a job (module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hosts {
    /// Each process's host name, by rank.
    names: Vec<String>,
}

impl Hosts {
    /// Hosts from each process's host name, in rank order.
    pub fn from_names(names: Vec<String>) -> Hosts {
        Hosts { names }
    }

    /// Gathers every process's [`ProcessGroup::host_name`] (a collective:
    /// every process of `group` calls it once, at start-up).
    pub fn gather(group: &dyn ProcessGroup, timeout: Duration) -> Result<Hosts, RuntimeError> {
        let all = group.all_gather(group.host_name().as_bytes(), timeout, "the exchange of host names")?;
        Ok(Hosts { names: all.into_iter().map(|b| String::from_utf8_lossy(&b).into_owned()).collect() })
    }

    /// The number of processes.
    pub fn processes(&self) -> usize {
        self.names.len()
    }

    /// The host of process `rank`.
    pub fn name(&self, rank: usize) -> &str {
        &self.names[rank]
    }

    /// The distinct hosts, in the order of their lowest rank.
    pub fn distinct(&self) -> Vec<&str> {
        self.distinct_of(0..self.names.len())
    }

    /// The distinct hosts of the processes `ranks`, in the order they
    /// first appear.
    pub fn distinct_of(&self, ranks: impl IntoIterator<Item = usize>) -> Vec<&str> {
        let mut seen: Vec<&str> = Vec::new();
        for q in ranks {
            if !seen.contains(&self.names[q].as_str()) {
                seen.push(&self.names[q]);
            }
        }
        seen
    }

    /// The ranks on the host of process `rank`, ascending.
    pub fn ranks_on_host_of(&self, rank: usize) -> Vec<usize> {
        let host = &self.names[rank];
        (0..self.names.len()).filter(|&q| &self.names[q] == host).collect()
    }

    /// Process `rank`'s share of its host: its local rank (its place among
    /// the processes of its host, by rank) of their number.
    pub fn share(&self, rank: usize) -> HostShare {
        let local = self.ranks_on_host_of(rank);
        let index = local.iter().position(|&q| q == rank).expect("a process is on its own host");
        HostShare { index, of: local.len() }
    }

    /// Every host with its processes: "hosts a (processes 0-1), b
    /// (processes 2-3)".
    pub fn layout(&self) -> String {
        let ranges: Vec<String> = self
            .distinct()
            .into_iter()
            .map(|h| {
                let ranks: Vec<usize> = (0..self.names.len()).filter(|&q| self.names[q] == h).collect();
                let contiguous = ranks.windows(2).all(|w| w[1] == w[0] + 1);
                let list = match (ranks.first(), ranks.last()) {
                    (Some(a), Some(b)) if a == b => format!("process {a}"),
                    (Some(a), Some(b)) if contiguous => format!("processes {a}-{b}"),
                    _ => format!("processes {}", ranks.iter().map(|r| r.to_string()).collect::<Vec<_>>().join(",")),
                };
                format!("{h} ({list})")
            })
            .collect();
        format!("host{} {}", if ranges.len() == 1 { "" } else { "s" }, ranges.join(", "))
    }

    /// One line for the run's description: "host a (local rank 1 of 4;
    /// 2 hosts)".
    pub fn describe(&self, rank: usize) -> String {
        let share = self.share(rank);
        let hosts = self.distinct().len();
        format!(
            "host {} (local rank {} of {}; {hosts} host{})",
            self.names[rank],
            share.index,
            share.of,
            if hosts == 1 { "" } else { "s" }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(names: &[&str]) -> Hosts {
        Hosts::from_names(names.iter().map(|s| s.to_string()).collect())
    }

    #[test]
    fn local_ranks_follow_world_ranks_on_each_host() {
        // Block placement (mpirun --map-by slot): a a b b.
        let h = hosts(&["a", "a", "b", "b"]);
        assert_eq!(h.distinct(), vec!["a", "b"]);
        assert_eq!(h.share(0), HostShare { index: 0, of: 2 });
        assert_eq!(h.share(1), HostShare { index: 1, of: 2 });
        assert_eq!(h.share(2), HostShare { index: 0, of: 2 });
        assert_eq!(h.share(3), HostShare { index: 1, of: 2 });
        // Round robin (mpirun --map-by node): a b a b c.
        let h = hosts(&["a", "b", "a", "b", "c"]);
        assert_eq!(h.ranks_on_host_of(2), vec![0, 2]);
        assert_eq!(h.share(2), HostShare { index: 1, of: 2 });
        assert_eq!(h.share(4), HostShare { index: 0, of: 1 });
        assert_eq!(h.describe(3), "host b (local rank 1 of 2; 3 hosts)");
        assert_eq!(h.layout(), "hosts a (processes 0,2), b (processes 1,3), c (process 4)");
        assert_eq!(hosts(&["a", "a", "b", "b"]).layout(), "hosts a (processes 0-1), b (processes 2-3)");
        assert_eq!(hosts(&["x"]).describe(0), "host x (local rank 0 of 1; 1 host)");
    }

    #[test]
    fn host_names_are_gathered_in_rank_order() {
        let group = super::super::ThreadGroup::on_hosts(&["b", "a", "b"]);
        let got: Vec<Hosts> = std::thread::scope(|s| {
            let hs: Vec<_> =
                group.iter().map(|g| s.spawn(move || Hosts::gather(g, Duration::from_secs(5)).unwrap())).collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for h in &got {
            assert_eq!(h, &hosts(&["b", "a", "b"]));
        }
        assert_eq!(got[2].share(2), HostShare { index: 1, of: 2 });
    }

    #[test]
    fn this_host_has_a_name() {
        assert!(!this_host_name().is_empty());
    }
}

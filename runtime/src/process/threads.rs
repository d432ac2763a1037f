//! [`ThreadGroup`]: processes simulated by threads of one process, for
//! tests of everything above the transport (the communicator, the
//! executable over a subset of devices, the checkpoint protocol) on any
//! machine, with or without MPI.

use super::ProcessGroup;
use crate::error::RuntimeError;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Messages in flight, by (source, destination, tag), in send order.
#[derive(Default)]
struct Mailboxes {
    queues: HashMap<(usize, usize, u32), VecDeque<Vec<u8>>>,
    aborted: Option<usize>,
}

/// One member of a group of simulated processes ([`ThreadGroup::new`]).
pub struct ThreadGroup {
    rank: usize,
    size: usize,
    host: String,
    shared: Arc<(Mutex<Mailboxes>, Condvar)>,
}

impl ThreadGroup {
    /// `size` members sharing one set of mailboxes; member `r` is rank `r`.
    /// All on this machine's host ([`super::this_host_name`]).
    pub fn new(size: usize) -> Vec<ThreadGroup> {
        let host = super::this_host_name();
        ThreadGroup::on_hosts(&vec![host.as_str(); size])
    }

    /// One member per entry of `hosts`, member `r` claiming to run on
    /// host `hosts[r]` (to test placement over several hosts).
    pub fn on_hosts(hosts: &[&str]) -> Vec<ThreadGroup> {
        let shared = Arc::new((Mutex::new(Mailboxes::default()), Condvar::new()));
        let size = hosts.len();
        hosts
            .iter()
            .enumerate()
            .map(|(rank, h)| ThreadGroup { rank, size, host: h.to_string(), shared: Arc::clone(&shared) })
            .collect()
    }
}

impl ProcessGroup for ThreadGroup {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn host_name(&self) -> String {
        self.host.clone()
    }

    unsafe fn exchange_into(
        &self,
        tag: u32,
        sends: &[(usize, &[u8])],
        receives: &mut [(usize, &mut [u8])],
        timeout: Duration,
        what: &str,
    ) -> Result<(), RuntimeError> {
        let (lock, changed) = &*self.shared;
        let mut m = lock.lock().unwrap_or_else(|p| p.into_inner());
        for &(q, bytes) in sends {
            m.queues.entry((self.rank, q, tag)).or_default().push_back(bytes.to_vec());
        }
        changed.notify_all();
        let deadline = Instant::now() + timeout;
        let mut done = vec![false; receives.len()];
        loop {
            if let Some(by) = m.aborted {
                return Err(RuntimeError::ProcessAborted { rank: self.rank, by, what: what.to_string() });
            }
            // In list order, so that several messages from one peer are
            // taken in the order it sent them.
            for (filled, (q, buf)) in done.iter_mut().zip(receives.iter_mut()) {
                if *filled {
                    continue;
                }
                if let Some(msg) = m.queues.get_mut(&(*q, self.rank, tag)).and_then(|d| d.pop_front()) {
                    if msg.len() != buf.len() {
                        return Err(RuntimeError::Process {
                            rank: self.rank,
                            message: format!("{what}: {} bytes from rank {q}, expected {}", msg.len(), buf.len()),
                        });
                    }
                    buf.copy_from_slice(&msg);
                    *filled = true;
                }
            }
            if done.iter().all(|&f| f) {
                return Ok(());
            }
            let now = Instant::now();
            if now >= deadline {
                let mut missing: Vec<usize> =
                    receives.iter().zip(&done).filter(|(_, f)| !**f).map(|((q, _), _)| *q).collect();
                missing.sort_unstable();
                missing.dedup();
                return Err(RuntimeError::ProcessTimeout {
                    rank: self.rank,
                    what: what.to_string(),
                    waited: timeout,
                    missing,
                });
            }
            m = changed.wait_timeout(m, deadline - now).unwrap_or_else(|p| p.into_inner()).0;
        }
    }

    fn abort_all(&self, _code: i32) {
        let (lock, changed) = &*self.shared;
        lock.lock().unwrap_or_else(|p| p.into_inner()).aborted.get_or_insert(self.rank);
        changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_gather_and_a_missing_rank() {
        let group = ThreadGroup::new(3);
        let t = Duration::from_secs(5);
        let got: Vec<Vec<Vec<u8>>> = std::thread::scope(|s| {
            let hs: Vec<_> = group
                .iter()
                .map(|g| s.spawn(move || g.all_gather(&vec![g.rank() as u8; g.rank() + 1], t, "test").unwrap()))
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for g in &got {
            assert_eq!(g, &vec![vec![0u8], vec![1, 1], vec![2, 2, 2]]);
        }
        // Rank 2 never comes: ranks 0 and 1 time out naming it.
        let short = Duration::from_millis(50);
        let errs: Vec<RuntimeError> = std::thread::scope(|s| {
            let hs: Vec<_> =
                group[..2].iter().map(|g| s.spawn(move || g.barrier(short, "the barrier").unwrap_err())).collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for e in errs {
            match e {
                RuntimeError::ProcessTimeout { missing, what, .. } => {
                    assert_eq!(missing, vec![2]);
                    assert_eq!(what, "the barrier");
                }
                e => panic!("unexpected {e}"),
            }
        }
    }
}

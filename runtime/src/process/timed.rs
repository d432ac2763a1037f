//! [`TimedGroup`]: a transport that keeps the time its caller spent in it.
//!
//! A process that waits in an exchange is waiting for a slower one (or for
//! the wire). Summed per step beside the step's wall time, this splits the
//! step into compute and waiting, the measurement behind the runner's
//! straggler report: the process the others waited for is the one whose
//! compute took longest. Every call of the [`ProcessGroup`] interface is
//! timed once, at the outside, whatever the wrapped transport does inside
//! (its default methods call each other: they are forwarded, not
//! re-entered here, so nothing is counted twice).

use super::{NativeType, ProcessGroup};
use crate::error::RuntimeError;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A [`ProcessGroup`] that adds the wall time of every call to a clock
/// ([`TimedGroup::waited`]).
pub struct TimedGroup {
    inner: Arc<dyn ProcessGroup>,
    nanos: AtomicU64,
}

impl TimedGroup {
    /// Wraps `inner`, its clock at zero.
    pub fn new(inner: Arc<dyn ProcessGroup>) -> TimedGroup {
        TimedGroup { inner, nanos: AtomicU64::new(0) }
    }

    /// The transport it times: for exchanges that are not waiting for a
    /// slower process (a pipeline's stages waiting for each other inside a
    /// step), which must not count as the step's waiting.
    pub fn inner(&self) -> &Arc<dyn ProcessGroup> {
        &self.inner
    }

    /// The time spent in this group's calls so far (by every thread).
    pub fn waited(&self) -> Duration {
        Duration::from_nanos(self.nanos.load(Ordering::Relaxed))
    }

    fn timed<T>(&self, f: impl FnOnce() -> T) -> T {
        let t = Instant::now();
        let out = f();
        let spent = u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.nanos.fetch_add(spent, Ordering::Relaxed);
        out
    }
}

impl ProcessGroup for TimedGroup {
    fn rank(&self) -> usize {
        self.inner.rank()
    }

    fn size(&self) -> usize {
        self.inner.size()
    }

    fn host_name(&self) -> String {
        self.inner.host_name()
    }

    unsafe fn exchange_into(
        &self,
        tag: u32,
        sends: &[(usize, &[u8])],
        receives: &mut [(usize, &mut [u8])],
        timeout: Duration,
        what: &str,
    ) -> Result<(), RuntimeError> {
        // SAFETY: the caller keeps the contract of `exchange_into`.
        self.timed(|| unsafe { self.inner.exchange_into(tag, sends, receives, timeout, what) })
    }

    fn exchange(
        &self,
        tag: u32,
        sends: Vec<(usize, Vec<u8>)>,
        receives: &[(usize, usize)],
        timeout: Duration,
        what: &str,
    ) -> Result<Vec<Vec<u8>>, RuntimeError> {
        self.timed(|| self.inner.exchange(tag, sends, receives, timeout, what))
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
        // SAFETY: the caller keeps the contract of `sum_all_into`.
        self.timed(|| unsafe { self.inner.sum_all_into(tag, processes, ty, send, recv, timeout, what) })
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
        // SAFETY: the caller keeps the contract of `sum_scatter_into`.
        self.timed(|| unsafe { self.inner.sum_scatter_into(tag, processes, ty, send, counts, recv, timeout, what) })
    }

    fn abort_all(&self, code: i32) {
        self.inner.abort_all(code)
    }

    fn all_gather(&self, bytes: &[u8], timeout: Duration, what: &str) -> Result<Vec<Vec<u8>>, RuntimeError> {
        self.timed(|| self.inner.all_gather(bytes, timeout, what))
    }

    fn barrier(&self, timeout: Duration, what: &str) -> Result<(), RuntimeError> {
        self.timed(|| self.inner.barrier(timeout, what))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::ThreadGroup;

    #[test]
    fn the_clock_holds_the_wait_for_a_late_peer() {
        let groups = ThreadGroup::new(2);
        let timed: Vec<Arc<TimedGroup>> =
            groups.into_iter().map(|g| Arc::new(TimedGroup::new(Arc::new(g) as Arc<dyn ProcessGroup>))).collect();
        let late = Arc::clone(&timed[1]);
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(150));
            late.barrier(Duration::from_secs(10), "test").unwrap();
        });
        timed[0].barrier(Duration::from_secs(10), "test").unwrap();
        t.join().unwrap();
        assert!(timed[0].waited() >= Duration::from_millis(100), "{:?}", timed[0].waited());
        assert!(timed[1].waited() < timed[0].waited(), "{:?} {:?}", timed[1].waited(), timed[0].waited());
        assert_eq!((timed[0].rank(), timed[1].size()), (0, 2));
    }
}

//! Running one fallible job per file on a few threads.
//!
//! Saving and restoring handle many independent files whose cost is
//! hashing and I/O, so a handful of threads overlap them. The first error
//! stops the remaining jobs from starting and is the one reported.

use super::error::{CheckpointError, Result};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// Runs `job(i)` for `i` in `0..n` on up to `threads` threads and returns
/// the results in index order, or the first error.
pub fn run_jobs<T: Send>(n: usize, threads: usize, job: impl Fn(usize) -> Result<T> + Sync) -> Result<Vec<T>> {
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<T>>> = Mutex::new((0..n).map(|_| None).collect());
    let first_error: Mutex<Option<CheckpointError>> = Mutex::new(None);
    std::thread::scope(|scope| {
        for _ in 0..threads.clamp(1, n.max(1)) {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n || first_error.lock().unwrap().is_some() {
                    return;
                }
                match job(i) {
                    Ok(r) => results.lock().unwrap()[i] = Some(r),
                    Err(e) => {
                        first_error.lock().unwrap().get_or_insert(e);
                    }
                }
            });
        }
    });
    if let Some(e) = first_error.into_inner().unwrap() {
        return Err(e);
    }
    Ok(results.into_inner().unwrap().into_iter().map(|r| r.expect("every job ran")).collect())
}

//! The file-system protocol that makes commits atomic and deletions safe.
//!
//! A step becomes visible in one `rename` of a fully written and fsynced
//! temporary directory to `step_<n>`; nothing else is ever named `step_*`.
//! So a crash at any moment leaves either the old set of steps or the new
//! one, plus hidden leftovers that [`cleanup`] resolves at the next start:
//!
//! - `.tmp_step_<n>_<rand>`: a save that did not commit: deleted.
//! - `.del_step_<n>_<rand>`: a step being deleted (renamed away first, so
//!   it is never listed half-deleted): deleted.
//! - `.old_step_<n>_<rand>`: a committed step being replaced by a new save
//!   of the same step: deleted if `step_<n>` exists, otherwise renamed back
//!   (the replacement never committed, so the old one is restored).

use super::error::{io, Result};
use std::fs::{self, File};
use std::hash::{BuildHasher, Hasher};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Prefix of a committed step directory.
const STEP: &str = "step_";
const TMP: &str = ".tmp_step_";
const DEL: &str = ".del_step_";
const OLD: &str = ".old_step_";

/// The directory name of a committed step: `step_00001200`.
pub fn step_dir_name(step: u64) -> String {
    format!("{STEP}{step:08}")
}

/// The step of a committed step directory name, if it is one.
pub fn parse_step_dir(name: &str) -> Option<u64> {
    let digits = name.strip_prefix(STEP)?;
    if digits.len() < 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// A random suffix (from the standard library's randomly keyed hasher), so
/// two writers never collide on a temporary name.
fn random_suffix() -> String {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    format!("{:016x}", h.finish())
}

/// Fsyncs a directory, making renames and creations in it durable.
pub fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir).and_then(|f| f.sync_all()).map_err(io("fsync directory", dir))
}

/// Creates `path` (which must not exist), writes `bytes` and fsyncs it.
pub fn write_synced(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut f = File::options().write(true).create_new(true).open(path).map_err(io("create", path))?;
    f.write_all(bytes).map_err(io("write", path))?;
    f.sync_all().map_err(io("fsync", path))
}

/// The committed steps in `root`, ascending. Only `step_<digits>`
/// directories count.
pub fn list_steps(root: &Path) -> Result<Vec<u64>> {
    let mut steps = Vec::new();
    for entry in fs::read_dir(root).map_err(io("list", root))? {
        let entry = entry.map_err(io("list", root))?;
        let Some(step) = entry.file_name().to_str().and_then(parse_step_dir) else { continue };
        if entry.file_type().map_err(io("stat", entry.path()))?.is_dir() {
            steps.push(step);
        }
    }
    steps.sort_unstable();
    Ok(steps)
}

/// Creates a fresh temporary directory for a save of `step`.
pub fn create_temp_dir(root: &Path, step: u64) -> Result<PathBuf> {
    let dir = root.join(format!("{TMP}{step}_{}", random_suffix()));
    fs::create_dir(&dir).map_err(io("create directory", &dir))?;
    Ok(dir)
}

/// Makes the fully written and fsynced directory `tmp` the committed step
/// `step`, replacing an existing commit of that step if there is one.
pub fn commit(root: &Path, tmp: &Path, step: u64) -> Result<PathBuf> {
    sync_dir(tmp)?;
    let dest = root.join(step_dir_name(step));
    let old = if dest.exists() {
        let old = root.join(format!("{OLD}{step}_{}", random_suffix()));
        fs::rename(&dest, &old).map_err(io("rename", &dest))?;
        Some(old)
    } else {
        None
    };
    fs::rename(tmp, &dest).map_err(io("rename", tmp))?;
    sync_dir(root)?;
    if let Some(old) = old {
        fs::remove_dir_all(&old).map_err(io("remove", &old))?;
    }
    Ok(dest)
}

/// Deletes the committed step `step`: renamed out of the listing first
/// (durably), then removed.
pub fn delete_step(root: &Path, step: u64) -> Result<()> {
    let dir = root.join(step_dir_name(step));
    let doomed = root.join(format!("{DEL}{step}_{}", random_suffix()));
    fs::rename(&dir, &doomed).map_err(io("rename", &dir))?;
    sync_dir(root)?;
    fs::remove_dir_all(&doomed).map_err(io("remove", &doomed))
}

/// Resolves leftovers of interrupted saves and deletions (see the module
/// docs). Returns the paths removed or restored.
pub fn cleanup(root: &Path) -> Result<Vec<PathBuf>> {
    let mut done = Vec::new();
    for entry in fs::read_dir(root).map_err(io("list", root))? {
        let entry = entry.map_err(io("list", root))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        if name.starts_with(TMP) || name.starts_with(DEL) {
            remove_any(&path)?;
            done.push(path);
        } else if let Some(rest) = name.strip_prefix(OLD) {
            let step = rest.split('_').next().and_then(|s| s.parse::<u64>().ok());
            match step.map(|s| root.join(step_dir_name(s))) {
                Some(dest) if !dest.exists() => fs::rename(&path, &dest).map_err(io("rename", &path))?,
                _ => remove_any(&path)?,
            }
            done.push(path);
        }
    }
    if !done.is_empty() {
        sync_dir(root)?;
    }
    Ok(done)
}

fn remove_any(path: &Path) -> Result<()> {
    let r = if path.is_dir() { fs::remove_dir_all(path) } else { fs::remove_file(path) };
    r.map_err(io("remove", path))
}

/// Makes the calling thread run only on CPU time nothing else wants
/// (Linux's `SCHED_IDLE`; `nice` 19 where that is refused): a save written
/// in the background must not slow the training steps beside it. At the
/// default priority a writer takes a core's share from steps that keep
/// every core busy; `nice` 19 alone still let the steps beside a save run
/// about 40% slower on 2 cores and 2 processes, `SCHED_IDLE` 12-30%
/// (BENCHMARKS.md). Threads it starts inherit the policy. Returns the
/// thread's id, for [`normal_priority`] once the save is awaited. Best
/// effort: a failure leaves the priority as it was.
pub(crate) fn background_priority() -> i32 {
    // SAFETY: sched_setscheduler gets a valid sched_param that outlives
    // the call; gettid and setpriority take no pointers. On Linux both act
    // on the calling thread alone (pid 0 and a thread id).
    unsafe {
        let tid = libc::gettid();
        let idle = libc::sched_param { sched_priority: 0 };
        if libc::sched_setscheduler(0, libc::SCHED_IDLE, &idle) != 0 {
            libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 19);
        }
        tid
    }
}

/// Puts thread `tid` (of this process, lowered by [`background_priority`])
/// back at the normal priority: a save being waited for is the training's
/// critical path, and idle-priority writers starve on a host whose other
/// processes poll for them. Best effort (a `nice` 19 fallback stays).
pub(crate) fn normal_priority(tid: i32) {
    if tid <= 0 {
        return;
    }
    // SAFETY: as in `background_priority`; `tid` names a thread of this
    // process whose handle the caller still holds (it has not been joined).
    unsafe {
        let normal = libc::sched_param { sched_priority: 0 };
        libc::sched_setscheduler(tid, libc::SCHED_OTHER, &normal);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_dir_names_round_trip() {
        assert_eq!(step_dir_name(1200), "step_00001200");
        assert_eq!(parse_step_dir("step_00001200"), Some(1200));
        assert_eq!(parse_step_dir(&step_dir_name(123_456_789_012)), Some(123_456_789_012));
        assert_eq!(parse_step_dir("step_12"), None);
        assert_eq!(parse_step_dir(".tmp_step_00000001"), None);
        assert_eq!(parse_step_dir("step_0000000x"), None);
    }
}

//! `weft train --trace FILE.json`: a step trace in Chrome's trace-event
//! JSON, which Perfetto (ui.perfetto.dev) and `chrome://tracing` open as is.
//!
//! A few chosen steps are traced (`trace.steps`, by default the run's
//! second and third: the first pays one-time work). In the file:
//! - per process (`pid` = its rank), a `host` lane (`tid` 0) with each
//!   traced step, its data wait, its checkpoint work and its metrics
//!   write;
//! - a lane per logical device (`tid` = device + 1) with every op, fused
//!   chain, collective (its kind, group and bytes; a host-staged one as its
//!   contribution and its receipt, so the wait for the other members
//!   shows) and host transfer of the step ([`weft_runtime::trace`]);
//! - a collective started early (overlapped) also as an asynchronous span
//!   (`ph` `b`/`e`, category `collective.in_flight`) from its start to its
//!   result on the device, on a track of its own beside the device's, so
//!   the compute it overlaps shows under it;
//! - the cost model's prediction of the same step, as a track of its own
//!   (`pid` 1000 + rank): its compute and communication parts;
//! - for a pipelined run, a lane per stage (`tid` = stage + 1) with its
//!   tasks (`F3` forward of microbatch 3, `B3/c2` backward of chunk 2,
//!   category `pipeline.task`), on the driver's clock; under several
//!   processes each process's file has every stage's tasks.
//!
//! On a GPU a span is the time to enqueue the work unless `trace.sync`
//! (`--trace-sync`) waits for the device after each one. Under several
//! processes each writes its own file, its rank before the extension
//! (`trace.1.json`). Tracing never changes a result.

use crate::error::{Error, Result};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::Instant;
use weft_runtime::{Trace, TraceMode};

/// The host lane's thread id; device `d`'s is `d + 1`.
const HOST_TID: u64 = 0;
/// The cost model's track: `pid` = this plus the rank.
const PREDICTED_PID: u64 = 1000;

/// Which steps to trace: `"N"` or `"A..B"` (half-open), absolute step
/// numbers as the metrics file writes them, for a run of steps
/// `first..total`. `None`: the run's second and third steps (as many of
/// them as it runs; its only step if it runs one).
pub fn parse_steps(text: Option<&str>, first: u64, total: u64) -> Result<std::ops::Range<u64>> {
    let Some(t) = text else {
        let start = if total > first + 1 { first + 1 } else { first };
        return Ok(start..(first + 3).min(total).max(start + 1));
    };
    let bad =
        || Error::Usage(format!("trace.steps = {t:?}: expected a step `N` or a half-open range `A..B` with A < B"));
    let num = |s: &str| s.trim().parse::<u64>().map_err(|_| bad());
    let r = match t.split_once("..") {
        Some((a, b)) => num(a)?..num(b)?,
        None => {
            let n = num(t)?;
            n..n.checked_add(1).ok_or_else(bad)?
        }
    };
    if r.start >= r.end {
        return Err(bad());
    }
    Ok(r)
}

/// A trace being recorded, written once its last step is traced.
pub struct TraceWriter {
    path: PathBuf,
    steps: std::ops::Range<u64>,
    mode: TraceMode,
    pid: u64,
    origin: Instant,
    events: Vec<Value>,
    devices: std::collections::BTreeSet<usize>,
    /// The cost model's (compute, communication) seconds of a step.
    predicted: Option<(f64, f64)>,
    /// The last id of an asynchronous (in-flight) span.
    async_ids: u64,
    /// The lanes are pipeline stages (the spans are stage tasks).
    stages: bool,
    written: bool,
}

impl TraceWriter {
    /// A trace of `steps` to `path` (with `.RANK` before the extension in
    /// a multi-process run).
    pub fn new(path: &Path, steps: std::ops::Range<u64>, sync: bool, rank: Option<usize>) -> TraceWriter {
        TraceWriter {
            path: rank.map(|r| ranked(path, r)).unwrap_or_else(|| path.to_path_buf()),
            steps,
            mode: if sync { TraceMode::Synced } else { TraceMode::Host },
            pid: rank.unwrap_or(0) as u64,
            origin: Instant::now(),
            events: Vec::new(),
            devices: Default::default(),
            predicted: None,
            async_ids: 0,
            stages: false,
            written: false,
        }
    }

    /// The file it writes.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Shows the cost model's prediction of a step beside each traced one:
    /// its compute, then the communication it does not hide.
    pub fn set_prediction(&mut self, compute_s: f64, communication_s: f64) {
        self.predicted = Some((compute_s, communication_s));
    }

    /// How step `s`'s devices are traced, if it is traced.
    pub fn mode_for(&self, s: u64) -> Option<TraceMode> {
        self.steps.contains(&s).then_some(self.mode)
    }

    fn us(&self, t: Instant) -> f64 {
        t.saturating_duration_since(self.origin).as_nanos() as f64 / 1e3
    }

    /// A span of the host lane from `start` to `end`.
    pub fn host(&mut self, name: &str, cat: &str, start: Instant, end: Instant, args: Value) {
        let (ts, end) = (self.us(start), self.us(end));
        self.events.push(json!({
            "name": name, "cat": cat, "ph": "X", "ts": ts, "dur": end - ts,
            "pid": self.pid, "tid": HOST_TID, "args": args,
        }));
    }

    /// Step `s`'s device spans, and the prediction beside it (from the
    /// step's start).
    pub fn devices(&mut self, s: u64, trace: Trace) {
        let base = self.us(trace.start);
        for sp in &trace.spans {
            self.devices.insert(sp.device);
            self.stages |= sp.kind == weft_runtime::SpanKind::Task;
            let mut args = json!({ "train_step": s, "bytes": sp.bytes, "type": sp.detail });
            if let Some(i) = sp.step {
                args["program_step"] = json!(i);
            }
            if sp.kind == weft_runtime::SpanKind::InFlight {
                // Spans in flight overlap each other and the device's
                // spans: asynchronous events, which need not nest.
                self.async_ids += 1;
                let (ts, end) = (base + sp.start_ns as f64 / 1e3, base + (sp.start_ns + sp.dur_ns) as f64 / 1e3);
                let (cat, id) = (sp.kind.name(), self.async_ids);
                let tid = sp.device as u64 + 1;
                self.events.push(json!({
                    "name": sp.name, "cat": cat, "ph": "b", "id": id, "ts": ts, "pid": self.pid, "tid": tid,
                    "args": args,
                }));
                self.events.push(json!({
                    "name": sp.name, "cat": cat, "ph": "e", "id": id, "ts": end, "pid": self.pid, "tid": tid,
                }));
                continue;
            }
            self.events.push(json!({
                "name": sp.name, "cat": sp.kind.name(), "ph": "X",
                "ts": base + sp.start_ns as f64 / 1e3, "dur": sp.dur_ns as f64 / 1e3,
                "pid": self.pid, "tid": sp.device as u64 + 1, "args": args,
            }));
        }
        if let Some((compute, comm)) = self.predicted {
            let pid = PREDICTED_PID + self.pid;
            let (c_us, m_us) = (compute * 1e6, comm * 1e6);
            self.events.push(json!({
                "name": "compute (predicted)", "cat": "predicted", "ph": "X", "ts": base, "dur": c_us,
                "pid": pid, "tid": 0, "args": { "train_step": s },
            }));
            self.events.push(json!({
                "name": "communication, exposed (predicted)", "cat": "predicted", "ph": "X", "ts": base + c_us, "dur": m_us,
                "pid": pid, "tid": 0, "args": { "train_step": s },
            }));
        }
    }

    /// Whether step `s` is the last traced one (the file is written after it).
    pub fn is_last(&self, s: u64) -> bool {
        s + 1 == self.steps.end
    }

    /// Writes the file (once; later calls do nothing).
    pub fn write(&mut self) -> Result<()> {
        if self.written {
            return Ok(());
        }
        self.written = true;
        let meta = |pid: u64, tid: Option<u64>, what: &str, name: String| {
            let mut e = json!({ "name": what, "ph": "M", "pid": pid, "args": { "name": name } });
            if let Some(t) = tid {
                e["tid"] = json!(t);
            }
            e
        };
        let mut events = vec![
            meta(self.pid, None, "process_name", format!("weft process {}", self.pid)),
            meta(self.pid, Some(HOST_TID), "thread_name", "host".into()),
        ];
        for &d in &self.devices {
            let name = if self.stages { format!("stage {d}") } else { format!("device {d}") };
            events.push(meta(self.pid, Some(d as u64 + 1), "thread_name", name));
        }
        if self.predicted.is_some() {
            let name = format!("cost model (predicted), process {}", self.pid);
            events.push(meta(PREDICTED_PID + self.pid, None, "process_name", name));
        }
        events.append(&mut self.events);
        let doc = json!({
            "traceEvents": events,
            "displayTimeUnit": "ms",
            "otherData": {
                "weft_trace_steps": format!("{}..{}", self.steps.start, self.steps.end),
                "device_times": match self.mode {
                    TraceMode::Host => "host (enqueue time on asynchronous devices)",
                    TraceMode::Synced => "synced (each span waits for its device)",
                },
            },
        });
        let text = serde_json::to_string(&doc).map_err(|e| Error::Usage(format!("trace: {e}")))?;
        if let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|source| Error::Io { path: dir.to_path_buf(), source })?;
        }
        std::fs::write(&self.path, text).map_err(|source| Error::Io { path: self.path.clone(), source })
    }
}

/// `trace.json` as process `rank` writes it: `trace.RANK.json`.
fn ranked(path: &Path, rank: usize) -> PathBuf {
    match (path.file_stem(), path.extension()) {
        (Some(stem), Some(ext)) => {
            path.with_file_name(format!("{}.{rank}.{}", stem.to_string_lossy(), ext.to_string_lossy()))
        }
        _ => PathBuf::from(format!("{}.{rank}", path.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_parse_as_one_step_or_a_half_open_range() {
        assert_eq!(parse_steps(None, 0, 100).unwrap(), 1..3);
        assert_eq!(parse_steps(None, 10, 100).unwrap(), 11..13);
        assert_eq!(parse_steps(None, 0, 2).unwrap(), 1..2);
        assert_eq!(parse_steps(None, 4, 5).unwrap(), 4..5);
        assert_eq!(parse_steps(Some("4"), 0, 100).unwrap(), 4..5);
        assert_eq!(parse_steps(Some("2..6"), 0, 100).unwrap(), 2..6);
        for bad in ["", "x", "3..3", "5..2", "-1", "1..", "18446744073709551615"] {
            let e = parse_steps(Some(bad), 0, 100).unwrap_err().to_string();
            assert!(e.contains("trace.steps"), "{bad}: {e}");
        }
    }

    #[test]
    fn a_multi_process_trace_puts_the_rank_before_the_extension() {
        assert_eq!(ranked(Path::new("runs/t.json"), 3), PathBuf::from("runs/t.3.json"));
        assert_eq!(ranked(Path::new("trace"), 1), PathBuf::from("trace.1"));
    }
}

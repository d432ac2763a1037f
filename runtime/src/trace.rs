//! What a traced run records: one [`Span`] per op, fused chain, collective
//! and host transfer of every device, on a clock the run's lanes share.
//!
//! Tracing is per run ([`crate::Executable::set_trace`]), so a training
//! loop traces the few steps a user asked for and pays nothing on the
//! others. A span's times are the host's: for devices in host memory that
//! is when the op ran; a GPU's launches are asynchronous, so a host span is
//! the cost of *enqueuing* the work, and [`TraceMode::Synced`] waits for
//! the device after each step to make it the device time too (slower, and
//! it hides the overlap of host and device, so it is opt-in). Turning
//! tracing on never changes a result: it only reads clocks (and, synced,
//! waits).
//!
//! The spans are plain data; writing them as Chrome trace-event JSON (what
//! Perfetto opens) is the caller's business (`weft train --trace`).

use crate::backend::Backend;
use std::time::Instant;

/// How a run is traced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TraceMode {
    /// Host times only: for an asynchronous device, the time to enqueue.
    Host,
    /// After every span, wait for the device ([`Backend::sync`]), so that
    /// each span holds its device time.
    Synced,
}

/// What a span measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SpanKind {
    /// One IR op.
    Op,
    /// A fused chain of elementwise ops, one kernel.
    Fused,
    /// A collective on device memory (shared collectives, NCCL).
    Collective,
    /// A device's contribution to a host-staged collective (its download
    /// and hand-over).
    Contribute,
    /// Waiting for, and uploading, a host-staged collective's result.
    Receive,
    /// A started collective from its start to its result on the device
    /// (`Step::Start` .. `Step::Done`): the time it was in flight, which
    /// the device's other spans in between overlap.
    InFlight,
    /// A batch input moved host → device.
    Upload,
    /// A metric output moved device → host.
    Download,
    /// A pipeline stage's task: the forward or backward of a chunk on a
    /// microbatch (its `device` is the stage; the driver's clock).
    Task,
}

impl SpanKind {
    /// The category name a trace viewer shows.
    pub fn name(self) -> &'static str {
        match self {
            SpanKind::Op => "op",
            SpanKind::Fused => "fused",
            SpanKind::Collective => "collective",
            SpanKind::Contribute => "collective.contribute",
            SpanKind::Receive => "collective.receive",
            SpanKind::InFlight => "collective.in_flight",
            SpanKind::Upload => "upload",
            SpanKind::Download => "download",
            SpanKind::Task => "pipeline.task",
        }
    }
}

/// One timed piece of a run on one device.
#[derive(Clone, Debug, PartialEq)]
pub struct Span {
    /// The logical device.
    pub device: usize,
    /// What it is.
    pub kind: SpanKind,
    /// The op's name (`dot_general`, `all_reduce`, `fused(3): mul,add,exp`).
    pub name: String,
    /// The device-program step it ran, if it is one.
    pub step: Option<usize>,
    /// Nanoseconds from the run's start ([`Trace::start`]).
    pub start_ns: u64,
    /// Its length in nanoseconds.
    pub dur_ns: u64,
    /// Bytes it produced or moved (its result's size).
    pub bytes: u64,
    /// More about it: the result type, a collective's group.
    pub detail: String,
}

/// The spans of one traced run.
#[derive(Clone, Debug)]
pub struct Trace {
    /// When the run started (every span's zero).
    pub start: Instant,
    /// How it was traced.
    pub mode: TraceMode,
    /// Every device's spans, by device, then in the order they ran.
    pub spans: Vec<Span>,
}

/// Records one device's spans during a run.
pub(crate) struct Recorder {
    mode: TraceMode,
    start: Instant,
    device: usize,
    pub spans: Vec<Span>,
}

impl Recorder {
    pub fn new(mode: TraceMode, start: Instant, device: usize) -> Recorder {
        Recorder { mode, start, device, spans: Vec::new() }
    }

    /// Now, as nanoseconds from the run's start.
    pub fn now(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    /// Closes a span begun at `begun` ([`Recorder::now`]); synced, it first
    /// waits for the device (a failed wait is left to the next real use
    /// of the device to report).
    #[allow(clippy::too_many_arguments)]
    pub fn close<B: Backend>(
        &mut self,
        backend: &B,
        begun: u64,
        kind: SpanKind,
        name: impl Into<String>,
        step: Option<usize>,
        bytes: u64,
        detail: String,
    ) {
        if self.mode == TraceMode::Synced {
            let _ = backend.sync();
        }
        let end = self.now();
        self.spans.push(Span {
            device: self.device,
            kind,
            name: name.into(),
            step,
            start_ns: begun,
            dur_ns: end.saturating_sub(begun),
            bytes,
            detail,
        });
    }
}

//! The work of one worker *lane*: one or more devices driven by one thread
//! through the whole device program.
//!
//! A lane runs the program segment by segment ([`super::plan::Segment`]):
//! each of its devices runs the segment's local steps (contributing to the
//! collectives started among them, which never waits), then each
//! contributes to the closing collective, if it is one, then each receives
//! (the closing collective's result, or that of the collective a `done`
//! waits for). With one
//! device per lane this is the classic one-worker-per-device executor; with
//! every device in one lane it is the old lockstep executor. Results do not
//! depend on the split: only collectives couple devices, and the
//! communicator's results depend only on the contributions. A device with
//! a device-native path for a collective (NCCL, opt-in) runs it there
//! instead of contributing to the communicator; such devices each have a
//! lane of their own.

use super::plan::{Action, Plan};
use super::TransferStats;
use crate::backend::Backend;
use crate::comm::{CollectiveCall, Communicator};
use crate::error::RuntimeError;
use crate::exec::DeviceStats;
use crate::trace::{Recorder, SpanKind};
use weft_ir::device::{BufferId, DeviceProgram, Step};
use weft_ir::tensor::HostTensor;
use weft_ir::Op;

/// The live buffers of one device, with their byte count.
pub(crate) struct Slots<B: Backend> {
    bufs: Vec<Option<B::Buffer>>,
    /// Each buffer's byte count (from its type, computed once).
    sizes: Vec<usize>,
    live: usize,
    pub stats: DeviceStats,
}

impl<B: Backend> Slots<B> {
    pub fn new(p: &DeviceProgram) -> Slots<B> {
        Slots {
            bufs: (0..p.buffers.len()).map(|_| None).collect(),
            sizes: p.buffers.iter().map(|b| b.ty.size_bytes()).collect(),
            live: 0,
            stats: DeviceStats::default(),
        }
    }

    pub fn get(&self, b: BufferId) -> &B::Buffer {
        self.bufs[b.index()].as_ref().unwrap_or_else(|| panic!("buffer %{} is not live (verified program)", b.0))
    }

    pub fn has(&self, b: BufferId) -> bool {
        self.bufs[b.index()].is_some()
    }

    pub fn put(&mut self, b: BufferId, buf: B::Buffer) {
        self.live += self.sizes[b.index()];
        self.stats.peak_live_bytes = self.stats.peak_live_bytes.max(self.live);
        self.bufs[b.index()] = Some(buf);
    }

    pub fn take(&mut self, b: BufferId) -> B::Buffer {
        self.live -= self.sizes[b.index()];
        self.bufs[b.index()].take().unwrap_or_else(|| panic!("buffer %{} freed twice (verified program)", b.0))
    }

    pub fn finish(&mut self) -> DeviceStats {
        self.stats.final_live_bytes = self.live;
        self.stats.clone()
    }
}

/// One device as a lane drives it.
pub(crate) struct DeviceRun<'a, B: Backend> {
    pub device: usize,
    pub backend: &'a B,
    pub slots: Slots<B>,
    pub transfers: TransferStats,
    /// The spans of a traced run ([`crate::trace`]).
    pub trace: Option<Recorder>,
    /// Where the device's time went ([`crate::DeviceTime`]; the lane sets
    /// the wall time).
    pub time: crate::DeviceTime,
    /// Results of device-native collectives started and not yet done, by
    /// the step that started them.
    pub native: Vec<(usize, B::Buffer)>,
    /// Each started collective not yet done, by the step that started it:
    /// when it began, the device's time in its start, and (traced) the
    /// trace clock when it began.
    pub in_flight: Vec<(usize, std::time::Instant, std::time::Duration, Option<u64>)>,
}

impl<B: Backend> DeviceRun<'_, B> {
    /// Now on the trace's clock, when the run is traced.
    pub fn clock(&self) -> Option<u64> {
        self.trace.as_ref().map(|r| r.now())
    }

    /// Closes a span begun at `begun` (when the run is traced; its bytes
    /// and detail are only worked out then, off the untraced path).
    pub fn span(
        &mut self,
        begun: Option<u64>,
        kind: SpanKind,
        name: &str,
        step: Option<usize>,
        what: impl FnOnce() -> (u64, String),
    ) {
        if let (Some(b), Some(r)) = (begun, self.trace.as_mut()) {
            let (bytes, detail) = what();
            r.close(self.backend, b, kind, name, step, bytes, detail);
        }
    }
}

/// What every lane shares.
pub(crate) struct RunCtx<'a> {
    pub program: &'a DeviceProgram,
    pub plan: &'a Plan,
    pub comm: &'a dyn Communicator,
}

/// Runs the whole program on the lane's devices (inputs already placed).
/// On failure the communicator is aborted, so that other lanes stop too.
pub(crate) fn run_lane<B: Backend>(ctx: &RunCtx<'_>, devices: &mut [DeviceRun<'_, B>]) -> Result<(), RuntimeError> {
    for seg in &ctx.plan.segments {
        for dev in devices.iter_mut() {
            let t = std::time::Instant::now();
            let communicated = dev.time.communication;
            for i in seg.local.clone() {
                if matches!(ctx.program.steps[i], Step::Start { .. }) {
                    guard(ctx, dev.device, contribute(ctx, dev, i))?;
                    continue;
                }
                let begun = dev.clock();
                guard(ctx, dev.device, run_local(ctx, dev, i))?;
                if begun.is_some() {
                    trace_local(ctx, dev, i, begun);
                }
            }
            dev.time.compute += t.elapsed().saturating_sub(dev.time.communication - communicated);
        }
        let Some(i) = seg.wait else { continue };
        // The collective the segment waits for: this step's, or the one
        // its `done` started.
        let started = match ctx.plan.started[i] {
            Some(s) => s,
            None => {
                for dev in devices.iter_mut() {
                    guard(ctx, dev.device, contribute(ctx, dev, i))?;
                }
                i
            }
        };
        for dev in devices.iter_mut() {
            guard(ctx, dev.device, receive(ctx, dev, started))?;
        }
    }
    Ok(())
}

/// This device's part of the start of the collective of step `i` (a
/// collective or a start): its contribution to the communicator, or a
/// device-native collective (`Backend::collective_on_device`, whose result
/// never meets the host and waits in [`DeviceRun::native`]).
fn contribute<B: Backend>(ctx: &RunCtx<'_>, dev: &mut DeviceRun<'_, B>, i: usize) -> Result<(), RuntimeError> {
    let (op, input, _) = ctx.program.steps[i].collective().expect("a collective step");
    let started = std::time::Instant::now();
    let m = &ctx.plan.members[i].as_ref().expect("planned collective")[dev.device];
    let call = CollectiveCall { step: i, op, group: &m.group, rank: m.rank };
    let what = || (ctx.program.ty(input).size_bytes() as u64, format!("group {:?}", m.group));
    let begun = dev.clock();
    let flight = matches!(ctx.program.steps[i], Step::Start { .. }).then_some((i, started, begun));
    if let Some(r) = dev.backend.collective_on_device(call, dev.slots.get(input)) {
        let buf = r.map_err(|e| e.at_step(dev.device, i, op.name()))?;
        if ctx.plan.consumes[i] {
            let used = dev.slots.take(input);
            dev.backend.free(used);
        }
        dev.native.push((i, buf));
        dev.span(begun, SpanKind::Collective, op.name(), Some(i), what);
        dev.time.communication += started.elapsed();
        if let Some((i, at, clock)) = flight {
            dev.in_flight.push((i, at, at.elapsed(), clock));
        }
        return Ok(());
    }
    let t = if ctx.plan.consumes[i] {
        let buf = dev.slots.take(input);
        dev.backend.download_owned(buf)
    } else {
        dev.backend.download(dev.slots.get(input))
    };
    let t = t.map_err(|e| e.at_step(dev.device, i, op.name()))?;
    dev.transfers.count_download(&t, Transfer::Collective);
    ctx.comm.contribute(call, t)?;
    dev.span(begun, SpanKind::Contribute, op.name(), Some(i), what);
    dev.time.communication += started.elapsed();
    if let Some((i, at, clock)) = flight {
        dev.in_flight.push((i, at, at.elapsed(), clock));
    }
    Ok(())
}

/// What this device receives from the collective started at step `i`,
/// put in its output buffer.
fn receive<B: Backend>(ctx: &RunCtx<'_>, dev: &mut DeviceRun<'_, B>, i: usize) -> Result<(), RuntimeError> {
    let (op, _, output) = ctx.program.steps[i].collective().expect("a collective step");
    let flight = dev.in_flight.iter().position(|f| f.0 == i).map(|k| dev.in_flight.swap_remove(k));
    let what =
        |m: &super::plan::Membership| (ctx.program.ty(output).size_bytes() as u64, format!("group {:?}", m.group));
    if let Some(k) = dev.native.iter().position(|(s, _)| *s == i) {
        let (_, buf) = dev.native.swap_remove(k);
        dev.slots.put(output, buf);
        let m = &ctx.plan.members[i].as_ref().expect("planned collective")[dev.device];
        // A device-native collective completes at its start: nothing of it
        // is hidden, and its span shows how long its result waited.
        if let Some((_, _, _, clock)) = flight {
            dev.span(clock, SpanKind::InFlight, op.name(), Some(i), || what(m));
        }
        return Ok(());
    }
    let started = std::time::Instant::now();
    let m = &ctx.plan.members[i].as_ref().expect("planned collective")[dev.device];
    let call = CollectiveCall { step: i, op, group: &m.group, rank: m.rank };
    let begun = dev.clock();
    let t = ctx.comm.receive(call)?;
    dev.transfers.count_upload(&t, Transfer::Collective);
    let bytes = t.ty().size_bytes() as u64;
    let buf = dev.backend.upload_owned(t).map_err(|e| e.at_step(dev.device, i, op.name()))?;
    dev.slots.put(output, buf);
    dev.span(begun, SpanKind::Receive, op.name(), Some(i), || (bytes, format!("group {:?}", m.group)));
    dev.time.communication += started.elapsed();
    if let Some((_, at, own, clock)) = flight {
        dev.time.hidden += at.elapsed().saturating_sub(own + started.elapsed());
        dev.span(clock, SpanKind::InFlight, op.name(), Some(i), || what(m));
    }
    Ok(())
}

/// Aborts the communicator when `r` is a failure of this device's own
/// (a timeout included, so that the other members stop at once instead of
/// each waiting out its own timeout), not an abort caused by another.
fn guard<T>(ctx: &RunCtx<'_>, device: usize, r: Result<T, RuntimeError>) -> Result<T, RuntimeError> {
    if let Err(e) = &r {
        if !matches!(e, RuntimeError::Aborted { .. }) {
            ctx.comm.abort(device, e.to_string());
        }
    }
    r
}

/// Which kind of host transfer (for [`TransferStats`]).
#[derive(Copy, Clone)]
pub(crate) enum Transfer {
    State,
    Input,
    Output,
    Collective,
}

impl TransferStats {
    pub(crate) fn count_upload(&mut self, t: &HostTensor, kind: Transfer) {
        self.bytes_to_device += t.ty().size_bytes() as u64;
        match kind {
            Transfer::State => self.state_uploads += 1,
            Transfer::Input => self.input_uploads += 1,
            Transfer::Collective => self.collective_uploads += 1,
            Transfer::Output => unreachable!("outputs are only downloaded"),
        }
    }

    pub(crate) fn count_download(&mut self, t: &HostTensor, kind: Transfer) {
        self.bytes_from_device += t.ty().size_bytes() as u64;
        match kind {
            Transfer::State => self.state_downloads += 1,
            Transfer::Output => self.output_downloads += 1,
            Transfer::Collective => self.collective_downloads += 1,
            Transfer::Input => unreachable!("inputs are only uploaded"),
        }
    }
}

/// Runs step `i` (not a collective) on one device.
fn run_local<B: Backend>(ctx: &RunCtx<'_>, dev: &mut DeviceRun<'_, B>, i: usize) -> Result<(), RuntimeError> {
    let (p, plan, d) = (ctx.program, ctx.plan, dev.device);
    match plan.actions[i] {
        Action::InChain => Ok(()),
        Action::Chain(k) => {
            let c = &plan.chains[k];
            let out = match plan.donors[k] {
                Some(into) => {
                    let donor = dev.slots.take(c.inputs[into]);
                    let ins: Vec<Option<&B::Buffer>> =
                        c.inputs.iter().enumerate().map(|(j, &b)| (j != into).then(|| dev.slots.get(b))).collect();
                    dev.backend.compute_fused_into(c, &ins, into, donor)
                }
                None => {
                    let ins: Vec<&B::Buffer> = c.inputs.iter().map(|&b| dev.slots.get(b)).collect();
                    dev.backend.compute_fused(c, &ins)
                }
            }
            .map_err(|e| e.at_step(d, i, "fused elementwise chain"))?;
            if out.len() != 1 + c.kept.len() {
                return Err(RuntimeError::Step {
                    device: d,
                    step: i,
                    op: "fused elementwise chain".into(),
                    message: format!(
                        "the backend returned {} values, the chain writes {}",
                        out.len(),
                        1 + c.kept.len()
                    ),
                });
            }
            let mut out = out.into_iter();
            for b in std::iter::once(c.output).chain(c.kept.iter().map(|&(_, b)| b)) {
                dev.slots.put(b, out.next().expect("counted"));
            }
            for &s in &plan.chain_frees[k] {
                free(dev, &plan.frees[s]);
            }
            Ok(())
        }
        Action::Run => match &p.steps[i] {
            Step::Compute { op: op @ Op::Reshape { .. }, inputs, outputs } if plan.consumes[i] => {
                let input = dev.slots.take(inputs[0]);
                let out = dev.backend.reshape_owned(op, input).map_err(|e| e.at_step(d, i, op.name()))?;
                dev.slots.put(outputs[0], out);
                Ok(())
            }
            Step::Compute { op, inputs, outputs } => {
                let ins: Vec<&B::Buffer> = inputs.iter().map(|&b| dev.slots.get(b)).collect();
                let outs = dev.backend.compute(op, &ins).map_err(|e| e.at_step(d, i, op.name()))?;
                if outs.len() != outputs.len() {
                    return Err(RuntimeError::Step {
                        device: d,
                        step: i,
                        op: op.name().into(),
                        message: format!(
                            "backend {} returned {} results, the op has {}",
                            dev.backend.name(),
                            outs.len(),
                            outputs.len()
                        ),
                    });
                }
                for (&o, buf) in outputs.iter().zip(outs) {
                    dev.slots.put(o, buf);
                }
                Ok(())
            }
            Step::ShardSlice { input, output, .. } => {
                let op = &plan.slices[i].as_ref().expect("planned slice")[d];
                let out =
                    dev.backend.compute(op, &[dev.slots.get(*input)]).map_err(|e| e.at_step(d, i, "shard_slice"))?;
                let buf = out.into_iter().next().expect("slice has one result");
                dev.slots.put(*output, buf);
                Ok(())
            }
            Step::Free(_) => {
                free(dev, &plan.frees[i]);
                Ok(())
            }
            Step::Collective { .. } | Step::Done(_) => unreachable!("waits close segments"),
            Step::Start { .. } => unreachable!("starts are contributions"),
        },
    }
}

/// Closes the span of local step `i`, begun at `begun`: an op, or a fused
/// chain at the step that runs it (the steps inside a chain, and `free`s,
/// have none).
fn trace_local<B: Backend>(ctx: &RunCtx<'_>, dev: &mut DeviceRun<'_, B>, i: usize, begun: Option<u64>) {
    let p = ctx.program;
    let (kind, name, out) = match (ctx.plan.actions[i], &p.steps[i]) {
        (Action::Chain(k), _) => {
            let c = &ctx.plan.chains[k];
            (SpanKind::Fused, chain_name(c), c.output)
        }
        (Action::Run, Step::Compute { op, outputs, .. }) => (SpanKind::Op, op.name().to_string(), outputs[0]),
        (Action::Run, Step::ShardSlice { output, .. }) => (SpanKind::Op, "shard_slice".to_string(), *output),
        _ => return,
    };
    let ty = p.ty(out);
    dev.span(begun, kind, &name, Some(i), || (ty.size_bytes() as u64, ty.to_string()));
}

/// A fused chain's span name: `fused(n): ` and its first ops' names, so
/// that chains of the same ops add up together in a profile.
fn chain_name(c: &crate::fusion::FusedChain) -> String {
    const SHOWN: usize = 8;
    let names: Vec<&str> = c.nodes.iter().take(SHOWN).map(|n| n.op.name()).collect();
    let more = if c.nodes.len() > SHOWN { ",…" } else { "" };
    format!("fused({}): {}{more}", c.nodes.len(), names.join(","))
}

/// Releases the buffers a `free` step releases ([`Plan::frees`]).
fn free<B: Backend>(dev: &mut DeviceRun<'_, B>, bs: &[BufferId]) {
    for b in bs {
        let buf = dev.slots.take(*b);
        dev.backend.free(buf);
    }
}

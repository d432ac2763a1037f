//! Compiled executables: a device program made ready once, then run many
//! times with its state resident on the devices (what PjRt's loaded
//! executable is to JAX).
//!
//! [`Executable::new`] verifies the program, plans fusion, splits it into
//! segments at collectives and works out each device's shard-slice ops and
//! collective groups — once. It then starts the workers: threads that each
//! own one or more devices (a *lane*; by default one per device, one per
//! core for devices in host memory) for the executable's life, so a GPU
//! device's buffers are only ever touched by the thread that made them.
//! For devices in host memory ([`Backend::caller_drives_a_lane`]) the
//! thread that calls [`Executable::run`] drives the last lane itself
//! instead of waiting for a worker: one thread fewer, and no hand-off at
//! all for a one-device executable (a pipeline stage's program). Lanes
//! meet only at collectives, through a [`Communicator`] ([`InProcessComm`]
//! by default).
//!
//! **Donation.** Inputs named in [`ExecOptions::donate`] are *donated*: the
//! output paired with each replaces it on the device at the end of a run,
//! like `jax.jit(donate_argnums=...)`. A training step donates every state
//! leaf to its new value, so the state is uploaded once
//! ([`Executable::load_state`]), stays resident across steps, and comes
//! back to the host only when asked ([`Executable::read_state`], for a
//! checkpoint). A run takes only the other inputs (the batch) and returns
//! only the other outputs (the metrics). [`TransferStats`] counts every
//! host transfer by kind, so residency is checked, not assumed.
//!
//! A run that fails (a bad input is rejected before anything runs; a
//! device error mid-step stops every worker through the communicator)
//! leaves the state consumed: its buffers were donated to the failed step.
//! The next run is then [`RuntimeError::NoState`] until the state is
//! loaded again — never a silent run on half-updated state.

pub(crate) mod lane;
pub(crate) mod plan;

pub use plan::shard_slice_op;

use crate::backend::Backend;
use crate::comm::{Communicator, InProcessComm, DEFAULT_COLLECTIVE_TIMEOUT};
use crate::error::RuntimeError;
use crate::exec::DeviceStats;
use crate::trace::{Recorder, Span, SpanKind, Trace, TraceMode};
use crate::verify::verify_program;
use lane::{run_lane, DeviceRun, RunCtx, Slots, Transfer};
use plan::Plan;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;
use weft_ir::device::DeviceProgram;
use weft_ir::tensor::HostTensor;

/// Host transfers, by kind (summed over devices).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TransferStats {
    /// State leaves uploaded ([`Executable::load_state`]).
    pub state_uploads: u64,
    /// State leaves downloaded ([`Executable::read_state`]).
    pub state_downloads: u64,
    /// Non-donated inputs uploaded (the batch).
    pub input_uploads: u64,
    /// Non-donated outputs downloaded (the metrics).
    pub output_downloads: u64,
    /// Contributions to host-staged collectives.
    pub collective_downloads: u64,
    /// Results of host-staged collectives.
    pub collective_uploads: u64,
    /// Bytes moved host → device.
    pub bytes_to_device: u64,
    /// Bytes moved device → host.
    pub bytes_from_device: u64,
}

impl TransferStats {
    fn add(&mut self, o: &TransferStats) {
        self.state_uploads += o.state_uploads;
        self.state_downloads += o.state_downloads;
        self.input_uploads += o.input_uploads;
        self.output_downloads += o.output_downloads;
        self.collective_downloads += o.collective_downloads;
        self.collective_uploads += o.collective_uploads;
        self.bytes_to_device += o.bytes_to_device;
        self.bytes_from_device += o.bytes_from_device;
    }
}

/// What an executable has done so far.
#[derive(Clone, Debug, Default)]
pub struct ExecStats {
    /// Completed runs.
    pub runs: u64,
    /// Host transfers since the executable was built.
    pub transfers: TransferStats,
    /// Per device, memory of the last run (resident state included).
    pub devices: Vec<DeviceStats>,
    /// Per device, where its time went in the last run.
    pub times: Vec<crate::DeviceTime>,
}

/// How an executable is built.
#[derive(Clone, Debug)]
pub struct ExecOptions {
    /// `(input, output)` pairs: input `i` is donated and output `o`
    /// replaces it after each run (same local type on every device).
    pub donate: Vec<(usize, usize)>,
    /// Lanes: threads driving devices, the caller's among them where
    /// [`Backend::caller_drives_a_lane`]. `None`: the backend's choice
    /// ([`Backend::default_lanes`]: one per device, or one per core for
    /// devices in host memory). Devices are dealt to the lanes in
    /// contiguous runs; the results do not depend on the count. Devices
    /// with device-native collectives ([`Backend::device_collectives`])
    /// always get one thread each.
    pub threads: Option<usize>,
    /// How long a device waits at a collective for the rest of its group.
    pub collective_timeout: Duration,
}

impl Default for ExecOptions {
    fn default() -> Self {
        ExecOptions { donate: Vec::new(), threads: None, collective_timeout: DEFAULT_COLLECTIVE_TIMEOUT }
    }
}

/// What the workers share (read-only during a run).
struct Shared {
    program: DeviceProgram,
    plan: Plan,
    comm: Box<dyn Communicator>,
    /// Per program input: the output that replaces it, if donated.
    donor_output: Vec<Option<usize>>,
    /// Per program output: the input it replaces, if donated.
    donated_input: Vec<Option<usize>>,
    /// The positions of the donated inputs, in input order.
    donated: Vec<usize>,
    /// The positions of the other inputs (the batch), in input order.
    others: Vec<usize>,
}

enum Job {
    /// Per device of the lane: the donated inputs, in input order.
    Load(Vec<Vec<HostTensor>>),
    /// Per device of the lane: the other inputs, in input order; and
    /// how to trace the run, on which clock.
    Run(Vec<Vec<HostTensor>>, Option<(TraceMode, std::time::Instant)>),
    /// Download the resident state: every value, or those a mask
    /// (`[device][donated input]`, over every device of the mesh) wants.
    Read(Option<Arc<Vec<Vec<bool>>>>),
}

/// Per device of the lane: its state values read back (`None` where a
/// read did not ask for one) and their transfers.
type LaneRead = Vec<(Vec<Option<HostTensor>>, TransferStats)>;

/// Per device of the lane: its outputs, stats, transfers and spans.
type LaneRun = Vec<(Vec<HostTensor>, DeviceStats, TransferStats, Vec<Span>, crate::DeviceTime)>;

enum Reply {
    Loaded(Result<Vec<TransferStats>, RuntimeError>),
    Ran(Result<LaneRun, RuntimeError>),
    Read(Result<LaneRead, RuntimeError>),
}

/// What drives a lane.
enum Worker<B: Backend> {
    /// A thread of its own, fed jobs through a channel.
    Thread { jobs: Option<Sender<Job>>, replies: Receiver<Reply>, thread: Option<JoinHandle<()>> },
    /// The caller of the executable's methods: a job runs when it is
    /// given (after every thread's, as this is the last lane), its reply
    /// waits to be collected.
    Caller { lane: Box<Lane<B>>, reply: Option<Reply> },
}

/// Whether the donated state is on the devices.
#[derive(Clone, Debug, PartialEq)]
enum StateStatus {
    Resident,
    Missing(String),
}

/// A device program ready to run on a set of devices (see the module docs).
pub struct Executable<B: Backend> {
    shared: Arc<Shared>,
    /// The devices this executable runs (all of the mesh's, or this
    /// process's in a multi-process run), ascending.
    local: Vec<usize>,
    /// Per lane, its devices (a contiguous run of `local`).
    lanes: Vec<Vec<usize>>,
    workers: Vec<Worker<B>>,
    state: StateStatus,
    stats: ExecStats,
    backend_name: String,
    /// How the next runs are traced ([`Executable::set_trace`]).
    trace: Option<TraceMode>,
    /// The last traced run's spans, until taken.
    last_trace: Option<Trace>,
}

impl<B> Executable<B>
where
    B: Backend + Send + 'static,
    B::Buffer: Send + 'static,
{
    /// Verifies and plans `program` for `backends` (one per device of its
    /// mesh, in device order) and starts the workers.
    pub fn new(program: DeviceProgram, backends: Vec<B>, options: ExecOptions) -> Result<Executable<B>, RuntimeError> {
        let n = program.num_devices();
        if backends.len() != n {
            return Err(RuntimeError::device_count(&program, backends.len()));
        }
        let comm: Box<dyn Communicator> = Box::new(InProcessComm::new(options.collective_timeout));
        Executable::with_devices(program, (0..n).collect(), backends, comm, options)
    }

    /// Verifies and plans `program` for the devices `local` of its mesh
    /// (ascending; `backends` in the same order), whose collectives meet
    /// through `comm` — in a multi-process run, this process's devices and
    /// a [`crate::process::ProcessComm`]. Every per-device argument and
    /// result of the executable then lists these devices only, in this
    /// order.
    pub fn with_devices(
        program: DeviceProgram,
        local: Vec<usize>,
        backends: Vec<B>,
        comm: Box<dyn Communicator>,
        options: ExecOptions,
    ) -> Result<Executable<B>, RuntimeError> {
        let n = program.num_devices();
        let m = local.len();
        if m == 0 || backends.len() != m || local.windows(2).any(|w| w[0] >= w[1]) || local[m - 1] >= n {
            return Err(RuntimeError::InvalidProgram {
                program: program.name.clone(),
                step: None,
                message: format!(
                    "an executable needs ascending devices of the mesh's {n} and one backend each; given devices                      {local:?} and {} backends",
                    backends.len()
                ),
            });
        }
        verify_program(&program)?;
        let (donor_output, donated_input) = donation_maps(&program, &options.donate)?;
        let backend_name = backends[0].name();
        let plan = Plan::new(&program, backends[0].fusion());
        let (donated, others): (Vec<usize>, Vec<usize>) =
            (0..program.inputs.len()).partition(|&i| donor_output[i].is_some());
        let shared = Arc::new(Shared { program, plan, comm, donor_output, donated_input, donated, others });
        // A device-native collective blocks its caller until the group has
        // met, so such devices each get a thread (a lane) of their own.
        let threads = match backends[0].device_collectives() {
            true => m,
            false => options.threads.unwrap_or_else(|| backends[0].default_lanes(m)).clamp(1, m),
        };
        let lanes: Vec<Vec<usize>> =
            (0..threads).map(|t| local[t * m / threads..(t + 1) * m / threads].to_vec()).collect();
        let caller_drives = backends[0].caller_drives_a_lane();
        let mut backends: Vec<Option<B>> = backends.into_iter().map(Some).collect();
        let mut workers = Vec::with_capacity(threads);
        let mut next = 0;
        for (t, lane) in lanes.iter().enumerate() {
            let owned: Vec<(usize, B)> = lane
                .iter()
                .map(|&d| {
                    next += 1;
                    (d, backends[next - 1].take().expect("one lane per device"))
                })
                .collect();
            if caller_drives && t + 1 == threads {
                workers.push(Worker::Caller { lane: Box::new(Lane::new(&shared, owned)), reply: None });
                break;
            }
            let (jobs, job_rx) = channel();
            let (reply_tx, replies) = channel();
            let sh = Arc::clone(&shared);
            let thread = std::thread::Builder::new()
                .name(format!("weft-worker-{t}"))
                .spawn(move || worker_loop(sh, owned, job_rx, reply_tx))
                .map_err(|e| RuntimeError::Device {
                    backend: backend_name.clone(),
                    message: format!("spawning a worker: {e}"),
                })?;
            workers.push(Worker::Thread { jobs: Some(jobs), replies, thread: Some(thread) });
        }
        let state = if !shared.donated.is_empty() {
            StateStatus::Missing("no state was loaded".into())
        } else {
            StateStatus::Resident
        };
        Ok(Executable {
            shared,
            local,
            lanes,
            workers,
            state,
            stats: ExecStats {
                devices: vec![DeviceStats::default(); n],
                times: vec![crate::DeviceTime::default(); n],
                ..Default::default()
            },
            backend_name,
            trace: None,
            last_trace: None,
        })
    }

    /// The program.
    pub fn program(&self) -> &DeviceProgram {
        &self.shared.program
    }

    /// Chains of elementwise steps run fused (the same on every device).
    pub fn fused_chains(&self) -> usize {
        self.shared.plan.chains.len()
    }

    /// Lanes: worker threads, plus the caller's where it drives one
    /// ([`Backend::caller_drives_a_lane`]).
    pub fn threads(&self) -> usize {
        self.workers.len()
    }

    /// Counters so far.
    pub fn stats(&self) -> &ExecStats {
        &self.stats
    }

    /// The mesh devices this executable runs (all of them in one process;
    /// this process's share of a multi-process run), ascending.
    pub fn local_devices(&self) -> &[usize] {
        &self.local
    }

    /// The positions of the donated inputs, in input order.
    pub fn donated_inputs(&self) -> &[usize] {
        &self.shared.donated
    }

    /// The devices this executable runs, ascending: every per-device list
    /// it takes or returns is in this order.
    pub fn devices(&self) -> &[usize] {
        &self.local
    }

    /// Uploads the donated inputs: `state[k]` lists the values of
    /// [`Executable::donated_inputs`] of device `devices()[k]`, in that order.
    pub fn load_state(&mut self, state: Vec<Vec<HostTensor>>) -> Result<(), RuntimeError> {
        check_values(&self.shared.program, &self.local, &self.shared.donated, &state, "state")?;
        let mut per_lane = self.split_by_lane(state);
        for (w, vals) in self.workers.iter_mut().zip(per_lane.drain(..)) {
            w.send(&self.shared, Job::Load(vals));
        }
        let mut first_err = None;
        for w in &mut self.workers {
            match w.recv() {
                Ok(Reply::Loaded(Ok(ts))) => ts.iter().for_each(|t| self.stats.transfers.add(t)),
                Ok(Reply::Loaded(Err(e))) | Err(e) => {
                    first_err.get_or_insert(e);
                }
                Ok(_) => {
                    first_err.get_or_insert(mismatched());
                }
            }
        }
        match first_err {
            None => {
                self.state = StateStatus::Resident;
                Ok(())
            }
            Some(e) => {
                self.state = StateStatus::Missing(format!("loading it failed: {e}"));
                Err(e)
            }
        }
    }

    /// Downloads the resident state: per device, the values of
    /// [`Executable::donated_inputs`] in that order.
    pub fn read_state(&mut self) -> Result<Vec<Vec<HostTensor>>, RuntimeError> {
        let all = self.read(None)?;
        Ok(all.into_iter().map(|vals| vals.into_iter().map(|v| v.expect("every value is read")).collect()).collect())
    }

    /// Downloads the values of the resident state that `want` names: per
    /// device of this process, the values of
    /// [`Executable::donated_inputs`] in that order, `None` where
    /// `want[device][k]` is false. A checkpoint reads one copy of each
    /// block this way, not every replica. `want` covers every device of
    /// the mesh, each with one entry per donated input.
    pub fn read_state_where(&mut self, want: Vec<Vec<bool>>) -> Result<Vec<Vec<Option<HostTensor>>>, RuntimeError> {
        let (n, devices) = (self.donated_inputs().len(), self.shared.program.num_devices());
        if want.len() != devices || want.iter().any(|w| w.len() != n) {
            return Err(RuntimeError::InvalidProgram {
                program: self.shared.program.name.clone(),
                step: None,
                message: format!(
                    "a state read names {} devices of {} values; the program has {devices} devices and {n} state \
                     values",
                    want.len(),
                    want.first().map_or(0, Vec::len)
                ),
            });
        }
        self.read(Some(Arc::new(want)))
    }

    fn read(&mut self, want: Option<Arc<Vec<Vec<bool>>>>) -> Result<Vec<Vec<Option<HostTensor>>>, RuntimeError> {
        self.check_state()?;
        for w in &mut self.workers {
            w.send(&self.shared, Job::Read(want.clone()));
        }
        let mut out = Vec::with_capacity(self.local.len());
        let mut first_err = None;
        for w in &mut self.workers {
            match w.recv() {
                Ok(Reply::Read(Ok(devs))) => {
                    for (vals, t) in devs {
                        self.stats.transfers.add(&t);
                        out.push(vals);
                    }
                }
                Ok(Reply::Read(Err(e))) | Err(e) => {
                    first_err.get_or_insert(e);
                }
                Ok(_) => {
                    first_err.get_or_insert(mismatched());
                }
            }
        }
        match first_err {
            None => Ok(out),
            Some(e) => {
                // A worker that failed mid-read may have dropped its buffers.
                self.state = StateStatus::Missing(format!("reading it back failed ({e})"));
                Err(e)
            }
        }
    }

    /// Runs the program once. `inputs[d]` lists device `d`'s values of the
    /// inputs that are not donated, in input order; the result lists, per
    /// device, the outputs that are not donated, in output order.
    pub fn run(&mut self, inputs: Vec<Vec<HostTensor>>) -> Result<Vec<Vec<HostTensor>>, RuntimeError> {
        self.check_state()?;
        check_values(&self.shared.program, &self.local, &self.shared.others, &inputs, "input")?;
        let mut per_lane = self.split_by_lane(inputs);
        let clock = self.trace.map(|m| (m, std::time::Instant::now()));
        for (w, vals) in self.workers.iter_mut().zip(per_lane.drain(..)) {
            w.send(&self.shared, Job::Run(vals, clock));
        }
        let mut outputs = Vec::with_capacity(self.local.len());
        let mut errors = Vec::new();
        let mut spans = Vec::new();
        for (w, lane) in self.workers.iter_mut().zip(&self.lanes) {
            match w.recv() {
                Ok(Reply::Ran(Ok(devs))) => {
                    for ((outs, ds, t, s, time), &d) in devs.into_iter().zip(lane) {
                        self.stats.transfers.add(&t);
                        self.stats.devices[d] = ds;
                        self.stats.times[d] = time;
                        outputs.push(outs);
                        spans.extend(s);
                    }
                }
                Ok(Reply::Ran(Err(e))) | Err(e) => errors.push(e),
                Ok(_) => errors.push(mismatched()),
            }
        }
        self.shared.comm.reset();
        if let Some((mode, start)) = clock {
            self.last_trace = Some(Trace { start, mode, spans });
        }
        if errors.is_empty() {
            self.stats.runs += 1;
            return Ok(outputs);
        }
        let root = root_cause(errors);
        if !self.shared.donated.is_empty() {
            self.state = StateStatus::Missing(format!("it was donated to a run that failed ({root})"));
        }
        Err(root)
    }

    fn check_state(&self) -> Result<(), RuntimeError> {
        match &self.state {
            StateStatus::Resident => Ok(()),
            StateStatus::Missing(why) => {
                Err(RuntimeError::NoState { program: self.shared.program.name.clone(), why: why.clone() })
            }
        }
    }

    fn split_by_lane(&self, mut per_device: Vec<Vec<HostTensor>>) -> Vec<Vec<Vec<HostTensor>>> {
        let mut out = Vec::with_capacity(self.lanes.len());
        for lane in self.lanes.iter().rev() {
            let start = self.local.binary_search(&lane[0]).expect("a lane's devices are local");
            let rest = per_device.split_off(start);
            out.push(rest);
        }
        out.reverse();
        out
    }

    /// The backend's name.
    pub fn backend_name(&self) -> &str {
        &self.backend_name
    }

    /// Traces the runs from now on (`Some`), or stops (`None`): each run's
    /// spans are kept until [`Executable::take_trace`] (see
    /// [`crate::trace`]). Tracing never changes results.
    pub fn set_trace(&mut self, mode: Option<TraceMode>) {
        self.trace = mode;
    }

    /// The spans of the last traced run, once (of a failed run: the spans
    /// of the lanes that finished).
    pub fn take_trace(&mut self) -> Option<Trace> {
        self.last_trace.take()
    }
}

impl<B: Backend> Drop for Executable<B> {
    fn drop(&mut self) {
        for w in &mut self.workers {
            if let Worker::Thread { jobs, .. } = w {
                jobs.take();
            }
        }
        for w in &mut self.workers {
            if let Worker::Thread { thread, .. } = w {
                if let Some(t) = thread.take() {
                    let _ = t.join();
                }
            }
        }
    }
}

impl<B: Backend> Worker<B> {
    /// Gives the lane its job: a thread's starts it, the caller's runs it
    /// now (so the caller's lane must be given its job last).
    fn send(&mut self, shared: &Shared, job: Job) {
        match self {
            // A worker whose thread is gone is reported by `recv`.
            Worker::Thread { jobs, .. } => {
                let _ = jobs.as_ref().expect("workers live as long as the executable").send(job);
            }
            Worker::Caller { lane, reply } => *reply = Some(serve(shared, lane, job)),
        }
    }

    fn recv(&mut self) -> Result<Reply, RuntimeError> {
        match self {
            Worker::Thread { replies, .. } => replies.recv().map_err(|_| RuntimeError::Device {
                backend: "worker".into(),
                message: "a worker thread stopped unexpectedly".into(),
            }),
            Worker::Caller { reply, .. } => Ok(reply.take().expect("the caller's lane was given a job")),
        }
    }
}

/// A reply to another job than the one asked (a broken invariant of the
/// worker protocol, reported rather than trusted).
fn mismatched() -> RuntimeError {
    RuntimeError::Device {
        backend: "worker".into(),
        message: "a worker answered another job than the one asked".into(),
    }
}

/// The error to report from a failed run: a device's own failure rather
/// than the aborts and timeouts it caused elsewhere.
fn root_cause(mut errors: Vec<RuntimeError>) -> RuntimeError {
    let own = errors.iter().position(|e| !matches!(e, RuntimeError::Aborted { .. }));
    errors.swap_remove(own.unwrap_or(0))
}

/// Per input, the output replacing it; per output, the input it replaces.
type DonationMaps = (Vec<Option<usize>>, Vec<Option<usize>>);

fn donation_maps(p: &DeviceProgram, donate: &[(usize, usize)]) -> Result<DonationMaps, RuntimeError> {
    let mut donor_output = vec![None; p.inputs.len()];
    let mut donated_input = vec![None; p.outputs.len()];
    let bad = |message: String| RuntimeError::InvalidProgram { program: p.name.clone(), step: None, message };
    for &(i, o) in donate {
        if i >= p.inputs.len() || o >= p.outputs.len() {
            return Err(bad(format!("donation ({i} -> {o}) names no such input or output")));
        }
        if donor_output[i].is_some() || donated_input[o].is_some() {
            return Err(bad(format!("input {i} or output {o} is donated twice")));
        }
        let (ti, to) = (p.ty(p.inputs[i]), p.ty(p.outputs[o]));
        if ti != to {
            return Err(bad(format!("input {i} ({ti}) cannot be replaced by output {o} ({to})")));
        }
        donor_output[i] = Some(o);
        donated_input[o] = Some(i);
    }
    Ok((donor_output, donated_input))
}

/// Checks per-device values of the program inputs at `positions`.
pub(crate) fn check_values(
    p: &DeviceProgram,
    devices: &[usize],
    positions: &[usize],
    values: &[Vec<HostTensor>],
    what: &str,
) -> Result<(), RuntimeError> {
    if values.len() != devices.len() {
        let whose = if devices.len() == p.num_devices() { "the mesh has" } else { "this process runs" };
        return Err(RuntimeError::Input {
            device: devices.get(values.len()).copied().unwrap_or(0),
            index: 0,
            message: format!("{what} values were given for {} devices, {whose} {}", values.len(), devices.len()),
        });
    }
    for (&device, vals) in devices.iter().zip(values) {
        if vals.len() != positions.len() {
            return Err(RuntimeError::Input {
                device,
                index: vals.len().min(positions.len()),
                message: format!("{} {what} values given, the program takes {}", vals.len(), positions.len()),
            });
        }
        for (t, &k) in vals.iter().zip(positions) {
            let b = p.inputs[k];
            if !t.has_type(p.ty(b)) {
                let name = p.buffers[b.index()].name.as_deref().map(|n| format!(" (%{n})")).unwrap_or_default();
                return Err(RuntimeError::Input {
                    device,
                    index: k,
                    message: format!("buffer %{}{name} is {}, given {}", b.0, p.ty(b), t.ty()),
                });
            }
        }
    }
    Ok(())
}

/// The devices a worker owns, and their resident state.
struct Lane<B: Backend> {
    devices: Vec<usize>,
    backends: Vec<B>,
    /// Per device of the lane, per program input: the resident buffer of a
    /// donated input.
    resident: Vec<Vec<Option<B::Buffer>>>,
}

impl<B: Backend> Lane<B> {
    fn new(shared: &Shared, owned: Vec<(usize, B)>) -> Lane<B> {
        let n_inputs = shared.program.inputs.len();
        Lane {
            devices: owned.iter().map(|(d, _)| *d).collect(),
            resident: owned.iter().map(|_| (0..n_inputs).map(|_| None).collect()).collect(),
            backends: owned.into_iter().map(|(_, b)| b).collect(),
        }
    }
}

fn worker_loop<B: Backend>(shared: Arc<Shared>, owned: Vec<(usize, B)>, jobs: Receiver<Job>, replies: Sender<Reply>) {
    let mut lane = Lane::new(&shared, owned);
    while let Ok(job) = jobs.recv() {
        if replies.send(serve(&shared, &mut lane, job)).is_err() {
            break;
        }
    }
}

/// Does one job on a lane, whichever thread drives it. A panic stops the
/// other lanes through the communicator, drops the lane's state and is
/// answered as an error of the job that was asked, so every lane's reply
/// to it is read and none is left for the next job.
fn serve<B: Backend>(shared: &Shared, lane: &mut Lane<B>, job: Job) -> Reply {
    let first = lane.devices[0];
    let kind = match &job {
        Job::Load(_) => 0,
        Job::Run(..) => 1,
        Job::Read(_) => 2,
    };
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match job {
        Job::Load(vals) => Reply::Loaded(load(shared, lane, vals)),
        Job::Run(vals, clock) => Reply::Ran(run(shared, lane, vals, clock)),
        Job::Read(want) => Reply::Read(read(shared, lane, want.as_deref())),
    }));
    caught.unwrap_or_else(|p| {
        let msg = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "unknown panic".into());
        shared.comm.abort(first, format!("worker panicked: {msg}"));
        for r in lane.resident.iter_mut().flatten() {
            *r = None;
        }
        let e = RuntimeError::Device { backend: lane.backends[0].name(), message: format!("worker panicked: {msg}") };
        match kind {
            0 => Reply::Loaded(Err(e)),
            1 => Reply::Ran(Err(e)),
            _ => Reply::Read(Err(e)),
        }
    })
}

fn load<B: Backend>(
    shared: &Shared,
    lane: &mut Lane<B>,
    vals: Vec<Vec<HostTensor>>,
) -> Result<Vec<TransferStats>, RuntimeError> {
    let mut stats = Vec::with_capacity(lane.devices.len());
    for (k, vs) in vals.into_iter().enumerate() {
        let mut t = TransferStats::default();
        for (&i, v) in shared.donated.iter().zip(vs) {
            t.count_upload(&v, Transfer::State);
            lane.resident[k][i] = Some(lane.backends[k].upload_owned(v)?);
        }
        stats.push(t);
    }
    Ok(stats)
}

fn read<B: Backend>(
    shared: &Shared,
    lane: &mut Lane<B>,
    want: Option<&Vec<Vec<bool>>>,
) -> Result<LaneRead, RuntimeError> {
    let mut out = Vec::with_capacity(lane.devices.len());
    for (k, res) in lane.resident.iter().enumerate() {
        let mut t = TransferStats::default();
        let mut vals = Vec::new();
        for (i, r) in res.iter().enumerate().filter(|(i, _)| shared.donor_output[*i].is_some()) {
            let buf = r.as_ref().ok_or_else(|| RuntimeError::NoState {
                program: shared.program.name.clone(),
                why: format!("device {} holds no buffer for input {i}", lane.devices[k]),
            })?;
            if want.is_some_and(|w| !w[lane.devices[k]][vals.len()]) {
                vals.push(None);
                continue;
            }
            let v = lane.backends[k].download(buf)?;
            t.count_download(&v, Transfer::State);
            vals.push(Some(v));
        }
        out.push((vals, t));
    }
    Ok(out)
}

fn run<B: Backend>(
    shared: &Shared,
    lane: &mut Lane<B>,
    inputs: Vec<Vec<HostTensor>>,
    clock: Option<(TraceMode, std::time::Instant)>,
) -> Result<LaneRun, RuntimeError> {
    let p = &shared.program;
    let started = std::time::Instant::now();
    let ctx = RunCtx { program: p, plan: &shared.plan, comm: shared.comm.as_ref() };
    let mut runs: Vec<DeviceRun<'_, B>> = Vec::with_capacity(lane.devices.len());
    let mut placed = Ok(());
    for (k, ins) in inputs.into_iter().enumerate() {
        let (device, backend) = (lane.devices[k], &lane.backends[k]);
        let trace = clock.map(|(mode, start)| Recorder::new(mode, start, device));
        let (slots, transfers, time) = (Slots::new(p), TransferStats::default(), crate::DeviceTime::default());
        let mut dev =
            DeviceRun { device, backend, slots, transfers, trace, time, native: Vec::new(), in_flight: Vec::new() };
        let t = std::time::Instant::now();
        let mut ins = ins.into_iter();
        for (i, &b) in p.inputs.iter().enumerate() {
            if shared.donor_output[i].is_some() {
                let buf = lane.resident[k][i].take().expect("the executable checked that the state is resident");
                dev.slots.put(b, buf);
            } else {
                let v = ins.next().expect("checked input count");
                dev.transfers.count_upload(&v, Transfer::Input);
                let begun = dev.clock();
                let ty = begun.map(|_| v.ty());
                match backend.upload_owned(v) {
                    Ok(buf) => {
                        dev.slots.put(b, buf);
                        let what = || ty.map(|t| (t.size_bytes() as u64, t.to_string())).unwrap_or_default();
                        dev.span(begun, SpanKind::Upload, "input", None, what);
                    }
                    Err(e) => {
                        placed = Err(RuntimeError::Input { device, index: i, message: e.to_string() });
                    }
                }
            }
        }
        dev.time.compute += t.elapsed();
        runs.push(dev);
    }
    if let Err(e) = placed {
        shared.comm.abort(lane.devices[0], e.to_string());
        return Err(e);
    }
    run_lane(&ctx, &mut runs)?;
    let mut out = Vec::with_capacity(runs.len());
    for (k, mut dev) in runs.into_iter().enumerate() {
        let t = std::time::Instant::now();
        let mut outs = Vec::new();
        for (o, &b) in p.outputs.iter().enumerate() {
            if shared.donated_input[o].is_none() {
                let begun = dev.clock();
                let v = dev
                    .backend
                    .download(dev.slots.get(b))
                    .map_err(|e| e.at_step(dev.device, p.steps.len(), "download"))?;
                dev.transfers.count_download(&v, Transfer::Output);
                dev.span(begun, SpanKind::Download, "output", None, || {
                    (v.ty().size_bytes() as u64, v.ty().to_string())
                });
                outs.push(v);
            }
        }
        for (o, &b) in p.outputs.iter().enumerate() {
            let Some(i) = shared.donated_input[o] else { continue };
            let buf = if dev.slots.has(b) {
                dev.slots.take(b)
            } else {
                // The same buffer replaces two inputs: the second gets a copy.
                let j = shared.donated_input[..o]
                    .iter()
                    .zip(&p.outputs)
                    .find(|(d, &ob)| d.is_some() && ob == b)
                    .and_then(|(d, _)| *d)
                    .expect("a donated output buffer taken earlier");
                let src = lane.resident[k][j].as_ref().expect("placed just now");
                let v = dev.backend.download(src)?;
                dev.transfers.count_download(&v, Transfer::State);
                dev.transfers.count_upload(&v, Transfer::State);
                dev.backend.upload_owned(v)?
            };
            lane.resident[k][i] = Some(buf);
        }
        let spans = dev.trace.take().map(|r| r.spans).unwrap_or_default();
        dev.time.compute += t.elapsed();
        out.push((outs, dev.slots.finish(), dev.transfers, spans, dev.time));
    }
    // Every device of the lane spans the lane's whole run.
    let wall = started.elapsed();
    for o in &mut out {
        o.4.wall = wall;
    }
    Ok(out)
}

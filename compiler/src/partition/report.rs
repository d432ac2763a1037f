//! What a device program costs: memory per device and communication.
//!
//! All devices run the same steps on blocks of the same sizes, so one
//! number per quantity describes every device. Memory follows the program's
//! `free` steps (inputs are live from the start, a step's outputs from the
//! step on); parameters are the inputs named `params.*` and optimizer state
//! the inputs named `opt.*` (the training-state naming of
//! [`crate::train`]). Communication is counted per collective kind with the
//! bytes each device sends under ring algorithms, the same model as
//! propagation's cost (`specs/sharding.md` §7): all-reduce `2(n-1)/n` of
//! the buffer, all-gather `(n-1)/n` of the gathered buffer, reduce-scatter
//! and all-to-all `(n-1)/n` of the input, permute the whole buffer.

use std::collections::BTreeMap;
use std::fmt;
use weft_ir::device::{Collective, DeviceProgram, Step};

/// Count and volume of one kind of collective.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CollectiveStat {
    /// How many steps of this kind.
    pub count: usize,
    /// Bytes each device sends, summed over those steps.
    pub bytes_per_device: f64,
    /// Of those steps, the ones started early and waited for later
    /// (overlapped with compute: `overlap_collectives`).
    pub started: usize,
}

/// Per-device memory and communication of a device program.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ProgramReport {
    /// Devices in the mesh.
    pub devices: usize,
    /// Largest total size of simultaneously live buffers.
    pub peak_live_bytes: usize,
    /// Bytes of all inputs.
    pub input_bytes: usize,
    /// Bytes of the inputs named `params.*`.
    pub param_bytes: usize,
    /// Bytes of the inputs named `opt.*`.
    pub optimizer_bytes: usize,
    /// Bytes of the outputs.
    pub output_bytes: usize,
    /// Number of compute steps.
    pub compute_steps: usize,
    /// Collectives by mnemonic (`all_gather`, `all_reduce`, ...).
    pub collectives: BTreeMap<String, CollectiveStat>,
}

impl ProgramReport {
    /// Measures `p` (a verified program).
    pub fn of(p: &DeviceProgram) -> ProgramReport {
        let bytes = |b: &weft_ir::device::BufferId| p.ty(*b).size_bytes();
        let named = |prefix: &str| -> usize {
            p.inputs
                .iter()
                .filter(|b| p.buffers[b.index()].name.as_deref().is_some_and(|n| n.starts_with(prefix)))
                .map(bytes)
                .sum()
        };
        let mut r = ProgramReport {
            devices: p.num_devices(),
            input_bytes: p.inputs.iter().map(bytes).sum(),
            param_bytes: named("params."),
            optimizer_bytes: named("opt."),
            output_bytes: p.outputs.iter().map(bytes).sum(),
            ..Default::default()
        };
        for s in &p.steps {
            match s {
                Step::Compute { .. } => r.compute_steps += 1,
                Step::Collective { op, input, output } | Step::Start { op, input, output } => {
                    let stat = r.collectives.entry(op.name().to_string()).or_default();
                    stat.count += 1;
                    stat.started += usize::from(matches!(s, Step::Start { .. }));
                    stat.bytes_per_device += sent_bytes(p, op, bytes(input), bytes(output));
                }
                Step::ShardSlice { .. } | Step::Done(_) | Step::Free(_) => {}
            }
        }
        r.peak_live_bytes = p.peak_live_bytes();
        r
    }

    /// Number of collectives of kind `name` (`all_reduce`, ...).
    pub fn count(&self, name: &str) -> usize {
        self.collectives.get(name).map_or(0, |s| s.count)
    }

    /// Total number of collectives.
    pub fn total_collectives(&self) -> usize {
        self.collectives.values().map(|s| s.count).sum()
    }
}

/// Bytes one device sends for collective `c` (ring algorithms).
pub fn sent_bytes(p: &DeviceProgram, c: &Collective, input: usize, output: usize) -> f64 {
    let frac = |axes: &[String]| {
        let n = p.group_size(axes) as f64;
        (n - 1.0) / n
    };
    match c {
        Collective::AllGather { axes, .. } => frac(axes) * output as f64,
        Collective::AllReduce { axes, .. } => 2.0 * frac(axes) * input as f64,
        Collective::ReduceScatter { axes, .. } | Collective::AllToAll { axes, .. } => frac(axes) * input as f64,
        Collective::CollectivePermute { pairs } => {
            if pairs.iter().any(|(s, t)| s != t) {
                input as f64
            } else {
                0.0
            }
        }
    }
}

impl fmt::Display for ProgramReport {
    /// The summary `weft lower` prints.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "devices: {}", self.devices)?;
        writeln!(f, "compute steps: {}", self.compute_steps)?;
        if self.collectives.is_empty() {
            writeln!(f, "collectives: none")?;
        } else {
            writeln!(f, "collectives (bytes sent per device):")?;
            for (name, s) in &self.collectives {
                let started = if s.started > 0 { format!(", {} overlapped", s.started) } else { String::new() };
                writeln!(f, "  {name}: {} ({} bytes{started})", s.count, fmt_bytes(s.bytes_per_device))?;
            }
        }
        writeln!(f, "per device: peak live {} bytes", self.peak_live_bytes)?;
        writeln!(
            f,
            "per device: inputs {} bytes, parameters {} bytes, optimizer state {} bytes, outputs {} bytes",
            self.input_bytes, self.param_bytes, self.optimizer_bytes, self.output_bytes
        )
    }
}

fn fmt_bytes(b: f64) -> String {
    if b.fract() == 0.0 {
        format!("{b:.0}")
    } else {
        format!("{b:.1}")
    }
}

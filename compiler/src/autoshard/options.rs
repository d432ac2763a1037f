//! Options of [`super::auto_shard`] and the memory-budget parser.
//!
//! Every limit is a count (e-graph iterations and nodes, extraction states),
//! never a wall-clock time, so the same input always gives the same plan.

use crate::error::CompilerError;

/// Results that must come out sharded like a parameter (training state
/// carried from one step to the next: the new parameters and optimizer
/// slots must be laid out as the old ones, as Alpa's input/output aliases).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum AliasPolicy {
    /// No such constraint.
    None,
    /// A result whose value is named `new.<p>` aliases parameter `<p>`
    /// (the naming of `build_train_step`); a parameter returned as it is
    /// aliases itself.
    #[default]
    ByName,
    /// Explicit `(parameter position, result position)` pairs.
    Explicit(Vec<(usize, usize)>),
}

/// Limits of the search. All are counts, so the search is deterministic.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SearchLimits {
    /// Rewrite iterations of the e-graph runner.
    pub iterations: usize,
    /// E-graph size (e-nodes) after which the runner stops adding
    /// alternatives.
    pub nodes: usize,
    /// Partial plans kept per instruction by the extractor. When more
    /// distinct partial plans exist the cheapest are kept and the plan is
    /// reported as not proven optimal.
    pub beam_width: usize,
    /// Rounds of base-guided extraction (each starts from the previous
    /// round's plan; stops early when a round gains nothing).
    pub rounds: usize,
    /// Partial plans per round in all: on long programs the beam narrows
    /// to `work / instructions` (at least 4), and the number of
    /// whole-program starting plans evaluated to the same ratio (9 to 64).
    pub work: usize,
}

impl Default for SearchLimits {
    fn default() -> Self {
        SearchLimits { iterations: 8, nodes: 2_000_000, beam_width: 32, rounds: 4, work: 200_000 }
    }
}

/// How to auto-shard.
#[derive(Clone, Debug, PartialEq)]
pub struct AutoShardOptions {
    /// Per-device memory budget in bytes (a hard constraint), if any.
    pub memory_budget: Option<u64>,
    /// Floating-point operations per second of one device; `f64::INFINITY`
    /// makes compute free (Alpa's communication-only objective).
    pub device_flops: f64,
    /// Bytes per second one device streams through memory: an op costs
    /// the larger of its FLOPs at `device_flops` and the bytes of its
    /// operands and result at this rate (a roofline), which prices the
    /// element-wise ops and reductions that memory, not arithmetic, bounds.
    /// `f64::INFINITY` (the default): FLOPs only.
    pub device_memory_bandwidth: f64,
    /// Seconds every op takes on a device besides its work (dispatch,
    /// buffers): the whole step of a program of many small ops. Default 0.
    pub op_overhead: f64,
    /// Link bandwidth (bytes/s) of mesh axes that do not set their own
    /// (`Mesh::with_link`).
    pub default_bandwidth: f64,
    /// Link latency (s) of mesh axes that do not set their own.
    pub default_latency: f64,
    /// Restrict every `dot_general` to forms split over every mesh axis
    /// (Alpa's solver has no replicated dot strategy); off by default.
    pub shard_every_dot: bool,
    /// Results that must match a parameter's sharding.
    pub aliases: AliasPolicy,
    /// Search limits.
    pub limits: SearchLimits,
}

impl Default for AutoShardOptions {
    /// No budget; 100 TFLOP/s devices; 100 GB/s links with 5 µs latency.
    fn default() -> Self {
        AutoShardOptions {
            memory_budget: None,
            device_flops: 100e12,
            device_memory_bandwidth: f64::INFINITY,
            op_overhead: 0.0,
            default_bandwidth: 100e9,
            default_latency: 5e-6,
            shard_every_dot: false,
            aliases: AliasPolicy::ByName,
            limits: SearchLimits::default(),
        }
    }
}

impl AutoShardOptions {
    /// Alpa's formulation (`playground/auto_sharding_solver`): only
    /// communication is counted (compute is free) and every `dot_general`
    /// is split over the whole mesh. Link costs come from the mesh
    /// (`Mesh::with_link(axis, 1/β, α)`).
    pub fn alpa() -> AutoShardOptions {
        AutoShardOptions { device_flops: f64::INFINITY, shard_every_dot: true, ..AutoShardOptions::default() }
    }

    /// The same options with a memory budget.
    pub fn with_budget(mut self, bytes: u64) -> AutoShardOptions {
        self.memory_budget = Some(bytes);
        self
    }
}

/// Parses a memory budget with the project's one size grammar
/// ([`weft_ir::limits::parse_bytes`]: `2GiB`, `512MiB`, `1.5GB`, `1e9`,
/// case and spaces ignored).
pub fn parse_memory_budget(text: &str) -> Result<u64, CompilerError> {
    weft_ir::limits::parse_bytes(text)
        .map_err(|message| CompilerError::InvalidMemoryBudget { text: text.to_string(), message })
}

/// Formats a byte count with a binary unit: `512 B`, `1.50 KiB`, `2.00 GiB`.
pub fn fmt_bytes(bytes: f64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes;
    let mut u = 0;
    while v.abs() >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{} B", bytes.round())
    } else {
        format!("{v:.2} {}", units[u])
    }
}

/// Formats a time in seconds with a fitting unit, or a plain number when
/// the cost model is unitless (α = β = 1).
pub fn fmt_time(seconds: f64) -> String {
    let a = seconds.abs();
    if a == 0.0 {
        "0".into()
    } else if a >= 1.0 {
        format!("{seconds:.6} s")
    } else if a >= 1e-3 {
        format!("{:.3} ms", seconds * 1e3)
    } else if a >= 1e-6 {
        format!("{:.3} µs", seconds * 1e6)
    } else {
        format!("{:.3} ns", seconds * 1e9)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budgets() {
        assert_eq!(parse_memory_budget("2GiB").unwrap(), 2 << 30);
        assert_eq!(parse_memory_budget("512MiB").unwrap(), 512 << 20);
        assert_eq!(parse_memory_budget("1e9").unwrap(), 1_000_000_000);
        assert_eq!(parse_memory_budget(" 1.5 kib ").unwrap(), 1536);
        assert_eq!(parse_memory_budget("3GB").unwrap(), 3_000_000_000);
        assert_eq!(parse_memory_budget("4096").unwrap(), 4096);
        for bad in ["", "GiB", "2XB", "-1GiB", "0", "nan"] {
            assert!(parse_memory_budget(bad).is_err(), "{bad}");
        }
        assert_eq!(fmt_bytes(1536.0), "1.50 KiB");
        assert_eq!(fmt_bytes(100.0), "100 B");
    }
}

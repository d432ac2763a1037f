//! The cost model: step time = compute + communication, in seconds (or in
//! the mesh's own units when its links say α = β = 1).
//!
//! - **Compute**: an instruction's floating-point operations
//!   ([`super::space::inst_flops`]) divided by the number of devices its
//!   strategy splits the work over, at `device_flops` per second — or, when
//!   longer, the bytes of its operands and result per device at
//!   `device_memory_bandwidth` (a roofline: element-wise ops and
//!   reductions are bound by memory, not arithmetic, on a CPU). Ops without
//!   FLOPs (data movement, constants) are free. Every op adds
//!   `op_overhead` (default 0: dispatch and buffers, what sets the step of
//!   a program of many small ops).
//! - **Communication**, per collective over mesh axes `A` (`n` = product of
//!   their sizes, `α` = sum of their latencies, `β` = 1 / the smallest
//!   bandwidth; `b` = bytes per device):
//!   all-reduce `α + β·2(n−1)/n·b`; all-gather `α + β·(n−1)/n·b` with `b`
//!   the gathered buffer; reduce-scatter `α + β·(n−1)/n·b` with `b` the
//!   buffer before scattering; all-to-all `(n−1)·α + β·(n−1)/n·b` (the
//!   penalty: it sends `n−1` separate messages whose latencies do not
//!   overlap, where ring collectives pipeline theirs); collective-permute
//!   `α + β·b`; local slices and local unreduces are free.
//!
//! These are the ring-algorithm costs of Alpa's `ClusterEnvironment`.

use super::options::AutoShardOptions;
use crate::sharding::{plan_reshard, Collective, Mesh, MeshSharding};
use weft_ir::TensorType;

/// The kind of a collective (for counting and costing).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CollKind {
    /// Sum partial values over the axes.
    AllReduce,
    /// Gather the blocks of a dimension.
    AllGather,
    /// Sum partial values and keep one block.
    ReduceScatter,
    /// Move a split from one dimension to another.
    AllToAll,
    /// Exchange blocks between devices.
    Permute,
    /// Keep one block (no communication).
    LocalSlice,
    /// Become a partial value (no communication).
    LocalUnreduce,
}

impl CollKind {
    /// Whether data crosses links.
    pub fn communicates(self) -> bool {
        !matches!(self, CollKind::LocalSlice | CollKind::LocalUnreduce)
    }

    /// The name used in reports, e.g. `all-reduce`.
    pub fn name(self) -> &'static str {
        match self {
            CollKind::AllReduce => "all-reduce",
            CollKind::AllGather => "all-gather",
            CollKind::ReduceScatter => "reduce-scatter",
            CollKind::AllToAll => "all-to-all",
            CollKind::Permute => "collective-permute",
            CollKind::LocalSlice => "local-slice",
            CollKind::LocalUnreduce => "local-unreduce",
        }
    }

    /// The kind of one step of a reshard plan.
    pub fn of(c: &Collective) -> CollKind {
        match c {
            Collective::LocalSlice { .. } => CollKind::LocalSlice,
            Collective::ReduceScatter { .. } => CollKind::ReduceScatter,
            Collective::AllReduce { .. } => CollKind::AllReduce,
            Collective::AllToAll { .. } => CollKind::AllToAll,
            Collective::CollectivePermute { .. } => CollKind::Permute,
            Collective::AllGather { .. } => CollKind::AllGather,
            Collective::LocalUnreduce { .. } => CollKind::LocalUnreduce,
        }
    }
}

/// One collective with its size and cost.
#[derive(Clone, Debug, PartialEq)]
pub struct CollCost {
    /// Its kind.
    pub kind: CollKind,
    /// Mesh axes it runs over.
    pub axes: Vec<usize>,
    /// Bytes per device the formula is applied to (see the module doc).
    pub bytes: f64,
    /// Its cost.
    pub cost: f64,
}

/// Costs on one mesh under one set of options.
#[derive(Clone, Debug)]
pub struct CostModel {
    mesh: Mesh,
    device_flops: f64,
    memory_bandwidth: f64,
    op_overhead: f64,
    bandwidth: f64,
    latency: f64,
}

impl CostModel {
    /// The model for `mesh` and `opts`.
    pub fn new(mesh: &Mesh, opts: &AutoShardOptions) -> CostModel {
        CostModel {
            mesh: mesh.clone(),
            device_flops: opts.device_flops,
            memory_bandwidth: opts.device_memory_bandwidth,
            op_overhead: opts.op_overhead,
            bandwidth: opts.default_bandwidth,
            latency: opts.default_latency,
        }
    }

    /// The mesh.
    pub fn mesh(&self) -> &Mesh {
        &self.mesh
    }

    /// `(α, β)` of a collective over `axes`.
    pub fn alpha_beta(&self, axes: &[usize]) -> (f64, f64) {
        let ax = self.mesh.axes();
        let alpha = axes.iter().map(|&a| ax[a].latency.unwrap_or(self.latency)).sum();
        let bw = axes.iter().map(|&a| ax[a].bandwidth.unwrap_or(self.bandwidth)).fold(f64::INFINITY, f64::min);
        (alpha, if bw.is_finite() { 1.0 / bw } else { 0.0 })
    }

    /// Cost of one collective of `kind` over `axes` on `bytes` per device.
    pub fn collective(&self, kind: CollKind, axes: &[usize], bytes: f64) -> f64 {
        let n = self.mesh.product(axes) as f64;
        if n <= 1.0 || !kind.communicates() {
            return 0.0;
        }
        let (alpha, beta) = self.alpha_beta(axes);
        let frac = (n - 1.0) / n;
        match kind {
            CollKind::AllReduce => alpha + beta * 2.0 * frac * bytes,
            CollKind::AllGather | CollKind::ReduceScatter => alpha + beta * frac * bytes,
            CollKind::AllToAll => (n - 1.0) * alpha + beta * frac * bytes,
            CollKind::Permute => alpha + beta * bytes,
            CollKind::LocalSlice | CollKind::LocalUnreduce => 0.0,
        }
    }

    /// Time to run `flops` operations split over `split` devices.
    pub fn compute(&self, flops: f64, split: usize) -> f64 {
        if self.device_flops.is_infinite() || flops == 0.0 {
            0.0
        } else {
            flops / split as f64 / self.device_flops
        }
    }

    /// Time of an op of `flops` FLOPs split over `split` devices that reads
    /// and writes `bytes` per device: the per-op overhead plus the longer
    /// of its compute and its memory traffic (none without FLOPs).
    pub fn op_time(&self, flops: f64, split: usize, bytes: f64) -> f64 {
        if flops == 0.0 {
            return self.op_overhead;
        }
        self.op_overhead + self.compute(flops, split).max(self.streamed(bytes))
    }

    /// The time to stream `bytes` through a device's memory (0 without a
    /// memory bandwidth).
    pub fn streamed(&self, bytes: f64) -> f64 {
        if self.memory_bandwidth.is_infinite() {
            0.0
        } else {
            bytes / self.memory_bandwidth
        }
    }

    /// Bytes per device of a tensor of type `ty` in `layout`.
    pub fn local_bytes(&self, ty: &TensorType, layout: &MeshSharding) -> f64 {
        let n: usize = layout.local_shape(&ty.shape, &self.mesh).iter().product();
        (n * ty.dtype.size_bytes()) as f64
    }

    /// The collectives of resharding a `ty` from `from` to `to` in one
    /// step (`plan_reshard`), with their costs under this model.
    pub fn reshard(&self, ty: &TensorType, from: &MeshSharding, to: &MeshSharding) -> Vec<CollCost> {
        let plan = plan_reshard(ty, from, to, &self.mesh);
        let mut bytes = self.local_bytes(ty, from);
        let mut out = Vec::new();
        for s in &plan.steps {
            let kind = CollKind::of(s);
            let n = self.mesh.product(s.axes()) as f64;
            let charged = match kind {
                CollKind::AllGather => bytes * n,
                _ => bytes,
            };
            out.push(CollCost {
                kind,
                axes: s.axes().to_vec(),
                bytes: charged,
                cost: self.collective(kind, s.axes(), charged),
            });
            match kind {
                CollKind::LocalSlice | CollKind::ReduceScatter => bytes /= n,
                CollKind::AllGather => bytes *= n,
                _ => {}
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alpa_formulas() {
        // α = β = 1 on a 1-D mesh of 4, as in Alpa's solver tests.
        let mesh = Mesh::parse("x=4").unwrap().with_link("x", 1.0, 1.0).unwrap();
        let m = CostModel::new(&mesh, &AutoShardOptions::alpa());
        let b = (128 * 128 * 4) as f64;
        assert_eq!(m.collective(CollKind::AllReduce, &[0], b), 1.0 + 2.0 * 0.75 * b);
        assert_eq!(m.collective(CollKind::AllGather, &[0], b), 1.0 + 0.75 * b);
        assert_eq!(m.collective(CollKind::ReduceScatter, &[0], b), 1.0 + 0.75 * b);
        assert_eq!(m.collective(CollKind::AllToAll, &[0], b), 3.0 + 0.75 * b);
        assert_eq!(m.collective(CollKind::LocalSlice, &[0], b), 0.0);
        assert_eq!(m.compute(1e9, 4), 0.0);
        let real = CostModel::new(&mesh, &AutoShardOptions::default());
        assert_eq!(real.compute(4e12, 4), 0.01);
        // No memory rate: FLOPs only.
        assert_eq!(real.op_time(4e12, 4, 1e15), 0.01);
        // A roofline: the memory traffic when it takes longer; nothing
        // without FLOPs.
        let cpu = AutoShardOptions { device_flops: 1e9, device_memory_bandwidth: 1e8, ..AutoShardOptions::default() };
        let cpu = CostModel::new(&mesh, &cpu);
        assert_eq!(cpu.op_time(1e6, 1, 1e6), 0.01);
        assert_eq!(cpu.op_time(1e8, 2, 1e6), 0.05);
        assert_eq!(cpu.op_time(0.0, 1, 1e6), 0.0);
        let busy = AutoShardOptions { op_overhead: 1e-3, ..AutoShardOptions::default() };
        let busy = CostModel::new(&mesh, &busy);
        assert_eq!(busy.op_time(0.0, 1, 1e6), 1e-3);
        assert_eq!(busy.op_time(4e12, 4, 0.0), 0.011);
    }
}

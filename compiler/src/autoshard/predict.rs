//! The step time the cost model predicts for a partitioned program, whatever
//! chose its shardings (a named strategy, user annotations or the
//! auto-sharder).
//!
//! The auto-sharder costs its own alternatives while it searches; to ask
//! "how good is the cost model?" the same model must also price the plans
//! it did not choose. The device program is what every device runs, so it
//! is priced step by step with [`CostModel`]: a compute step's FLOPs
//! ([`inst_flops`] on its local shapes) at the device rate (or its bytes
//! at the memory rate, when longer: [`CostModel::op_time`]), a collective by
//! its α-β formula on the bytes of its buffers (all-gather: the gathered
//! buffer; reduce-scatter: the buffer before scattering, as
//! [`CostModel::reshard`] charges them), slices and frees free. The
//! devices run the same steps, so one device's sum is the step time; a
//! machine that overlaps nothing (the CPU backend) adds compute and
//! communication.

use super::cost::{CollKind, CostModel};
use super::options::AutoShardOptions;
use super::space::inst_flops;
use crate::sharding::rules::rule_for;
use crate::sharding::Mesh;
use std::collections::BTreeMap;
use weft_ir::device::{Collective, DeviceProgram, Step};
use weft_ir::TensorType;

/// The predicted step time of a device program, split by what takes it.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct StepPrediction {
    /// Compute time (seconds, or model units).
    pub compute: f64,
    /// Communication time.
    pub communication: f64,
    /// Of that, the part that runs while compute goes on (collectives
    /// started before their results are needed, [`Step::Start`]).
    pub hidden_communication: f64,
    /// The predicted step time: compute plus the communication that is
    /// not hidden. Collectives run one at a time, in the order they
    /// start, beside the compute.
    pub total: f64,
    /// FLOPs one device runs.
    pub flops: f64,
    /// Of those, the FLOPs of `dot_general`s.
    pub dot_flops: f64,
    /// Bytes one device's priced ops other than `dot_general` read and
    /// write (element-wise ops, reductions: what memory bounds).
    pub streamed_bytes: f64,
    /// Per kind of collective: how many, bytes per device (as charged) and
    /// time.
    pub collectives: BTreeMap<CollKind, super::CommStats>,
    /// Per op class (the op's or the collective's mnemonic): its steps,
    /// time and what bounds it.
    pub classes: BTreeMap<String, OpClass>,
}

impl StepPrediction {
    /// Counts one step of class `name` taking `time`; returns the class.
    fn class(&mut self, name: &str, time: f64) -> &mut OpClass {
        let c = self.classes.entry(name.to_string()).or_default();
        c.count += 1;
        c.time += time;
        c
    }
}

/// One op class of a step, as the cost model prices it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OpClass {
    /// Steps of the class.
    pub count: usize,
    /// Their predicted time (seconds).
    pub time: f64,
    /// Of that, the part the device's arithmetic takes where it is the
    /// larger (compute-bound ops).
    pub compute_bound: f64,
    /// The part its memory traffic takes where that is the larger
    /// (memory-bound ops).
    pub memory_bound: f64,
    /// Collective time (communication).
    pub communication: f64,
}

impl OpClass {
    /// What bounds the class: `compute`, `memory`, `communication`, or
    /// `overhead` (ops that move or compute nothing: their per-op cost).
    pub fn bound(&self) -> &'static str {
        let most = self.compute_bound.max(self.memory_bound).max(self.communication);
        if most <= 0.0 {
            "overhead"
        } else if most == self.communication {
            "communication"
        } else if most == self.compute_bound {
            "compute"
        } else {
            "memory"
        }
    }
}

/// Prices `program` (partitioned for `mesh`) with the cost model of `opts`.
/// Axes of a collective that `mesh` does not name are ignored (priced as a
/// group of one: free).
pub fn predict_program(program: &DeviceProgram, mesh: &Mesh, opts: &AutoShardOptions) -> StepPrediction {
    let model = CostModel::new(mesh, opts);
    let ty = |b: &weft_ir::device::BufferId| &program.buffers[b.index()].ty;
    let bytes = |t: &TensorType| (t.num_elements() * t.dtype.size_bytes()) as f64;
    let axes_of = |names: &[String]| names.iter().filter_map(|n| mesh.axis_index(n)).collect::<Vec<usize>>();
    let every_axis: Vec<usize> = (0..mesh.axes().len()).collect();
    let mut p = StepPrediction::default();
    // The timeline: `clock` is the device's, `link_free` when the
    // collective in flight (one at a time) ends; `ends` each started
    // collective's end, by output buffer.
    let (mut clock, mut link_free) = (0.0f64, 0.0f64);
    let mut ends = std::collections::HashMap::new();
    for step in &program.steps {
        let before = p.compute;
        match step {
            Step::Compute { op, inputs, outputs } => {
                let operands: Vec<&TensorType> = inputs.iter().map(ty).collect();
                let results: Vec<&TensorType> = outputs.iter().map(ty).collect();
                let (Some(rule), Some(&result)) = (rule_for(op, &operands, &results), results.first()) else {
                    let t = model.op_time(0.0, 1, 0.0);
                    p.compute += t;
                    clock += t;
                    p.class(op.name(), t);
                    continue;
                };
                let flops = inst_flops(op, &rule, &operands, result);
                let moved = operands.iter().chain(&results).map(|t| bytes(t)).sum::<f64>();
                p.flops += flops;
                if matches!(op, weft_ir::Op::DotGeneral(_)) {
                    p.dot_flops += flops;
                } else if flops > 0.0 {
                    p.streamed_bytes += moved;
                }
                let t = model.op_time(flops, 1, moved);
                p.compute += t;
                let c = p.class(op.name(), t);
                if flops > 0.0 {
                    let (arithmetic, streamed) = (model.compute(flops, 1), model.streamed(moved));
                    if arithmetic >= streamed {
                        c.compute_bound += arithmetic;
                    } else {
                        c.memory_bound += streamed;
                    }
                }
            }
            Step::Collective { op, input, output } | Step::Start { op, input, output } => {
                let (kind, axes, charged) = match op {
                    Collective::AllReduce { axes, .. } => (CollKind::AllReduce, axes_of(axes), bytes(ty(input))),
                    Collective::AllGather { axes, .. } => (CollKind::AllGather, axes_of(axes), bytes(ty(output))),
                    Collective::ReduceScatter { axes, .. } => {
                        (CollKind::ReduceScatter, axes_of(axes), bytes(ty(input)))
                    }
                    Collective::AllToAll { axes, .. } => (CollKind::AllToAll, axes_of(axes), bytes(ty(input))),
                    Collective::CollectivePermute { .. } => (CollKind::Permute, every_axis.clone(), bytes(ty(input))),
                };
                let cost = model.collective(kind, &axes, charged);
                let s = p.collectives.entry(kind).or_default();
                s.count += 1;
                s.bytes += charged;
                s.cost += cost;
                p.communication += cost;
                p.class(op.name(), cost).communication += cost;
                link_free = link_free.max(clock) + cost;
                if matches!(step, Step::Start { .. }) {
                    ends.insert(*output, link_free);
                } else {
                    clock = link_free;
                }
            }
            Step::Done(b) => clock = clock.max(ends.get(b).copied().unwrap_or(clock)),
            Step::ShardSlice { .. } | Step::Free(_) => {}
        }
        clock += p.compute - before;
    }
    p.total = clock;
    p.hidden_communication = (p.compute + p.communication - p.total).max(0.0);
    p
}

/// Spearman's rank correlation of two equally long series (ties get their
/// mean rank); `None` when fewer than two points or a series is constant.
pub fn spearman(a: &[f64], b: &[f64]) -> Option<f64> {
    if a.len() != b.len() || a.len() < 2 {
        return None;
    }
    let (ra, rb) = (ranks(a), ranks(b));
    let n = a.len() as f64;
    let mean = (n + 1.0) / 2.0;
    let cov: f64 = ra.iter().zip(&rb).map(|(x, y)| (x - mean) * (y - mean)).sum();
    let var = |r: &[f64]| r.iter().map(|x| (x - mean).powi(2)).sum::<f64>();
    let (va, vb) = (var(&ra), var(&rb));
    (va > 0.0 && vb > 0.0).then(|| cov / (va * vb).sqrt())
}

/// 1-based ranks, ties sharing their mean rank.
fn ranks(x: &[f64]) -> Vec<f64> {
    let mut order: Vec<usize> = (0..x.len()).collect();
    order.sort_by(|&i, &j| x[i].total_cmp(&x[j]));
    let mut r = vec![0.0; x.len()];
    let mut i = 0;
    while i < order.len() {
        let mut j = i;
        while j + 1 < order.len() && x[order[j + 1]] == x[order[i]] {
            j += 1;
        }
        let mean = (i + j) as f64 / 2.0 + 1.0;
        for &k in &order[i..=j] {
            r[k] = mean;
        }
        i = j + 1;
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn program(text: &str) -> DeviceProgram {
        weft_ir::device::parse_program(text).unwrap()
    }

    #[test]
    fn prices_compute_and_collectives() {
        let p = program(
            "device_program @g mesh [data=2, model=4] {
  input %0 : f32[8,16]
  input %1 : f32[16,4]
  %2 = dot_general %0, %1 {lhs_contract = [1], rhs_contract = [0]} : f32[8,4]
  %3 = all_reduce %2 {axes = [model], op = sum} : f32[8,4]
  %4 = all_gather %3 {dim = 0, axes = [data]} : f32[16,4]
  %5 = tanh %4 : f32[16,4]
  return %5
}",
        );
        let mesh = Mesh::parse("data=2,model=4").unwrap();
        let opts =
            AutoShardOptions { device_flops: 1e9, default_bandwidth: 1e6, default_latency: 1e-3, ..Default::default() };
        let x = predict_program(&p, &mesh, &opts);
        // 2·8·16·4 for the dot, one per element for tanh.
        assert_eq!(x.flops, 1024.0 + 64.0);
        assert_eq!(x.compute, 1088.0 / 1e9);
        // all-reduce over model (n = 4) of 128 bytes; all-gather over data
        // (n = 2) of the gathered 256 bytes.
        let ar = 1e-3 + 2.0 * 0.75 * 128.0 / 1e6;
        let ag = 1e-3 + 0.5 * 256.0 / 1e6;
        assert!((x.communication - (ar + ag)).abs() < 1e-15, "{x:?}");
        assert_eq!(x.collectives[&CollKind::AllReduce].count, 1);
        assert_eq!(x.collectives[&CollKind::AllGather].bytes, 256.0);
        assert!((x.total - (x.compute + x.communication)).abs() < 1e-15, "{x:?}");
        assert_eq!(x.hidden_communication, 0.0);
        // Started before the dot and done after it, the all-reduce of the
        // input hides behind it.
        let started = program(
            "device_program @g mesh [data=2, model=4] {
  input %0 : f32[8,16]
  input %1 : f32[16,4]
  %2 = all_reduce_start %0 {axes = [model], op = sum} : f32[8,16]
  %3 = dot_general %0, %1 {lhs_contract = [1], rhs_contract = [0]} : f32[8,4]
  done %2
  return %2, %3
}",
        );
        let slow_link = AutoShardOptions { default_bandwidth: 1e9, default_latency: 1e-7, ..opts.clone() };
        let y = predict_program(&started, &mesh, &slow_link);
        let dot = 1024.0 / 1e9;
        assert!(y.communication < dot, "{y:?}");
        assert!((y.total - dot).abs() < 1e-15 && (y.hidden_communication - y.communication).abs() < 1e-15, "{y:?}");
        assert_eq!((x.dot_flops, x.streamed_bytes), (1024.0, 2.0 * 256.0));
        // By class: the dot is compute-bound, tanh memory-bound (with a
        // memory bandwidth), the collectives communication.
        assert_eq!(x.classes["dot_general"].bound(), "compute");
        assert_eq!(x.classes["all_reduce"].bound(), "communication");
        assert_eq!(x.classes["all_gather"].count, 1);
        // With a slow memory, both ops take their bytes' time: the dot
        // 512 + 256 + 128 bytes, tanh 256 read and 256 written.
        let slow = AutoShardOptions { device_memory_bandwidth: 1e6, ..opts.clone() };
        let z = predict_program(&p, &mesh, &slow);
        assert_eq!((z.classes["tanh"].bound(), z.classes["dot_general"].bound()), ("memory", "memory"));
        assert!((z.compute - (896.0 + 512.0) / 1e6).abs() < 1e-15, "{z:?}");
        // Two compute steps, each with the per-op overhead; collectives
        // keep their own latency.
        let busy = AutoShardOptions { op_overhead: 1e-2, ..opts.clone() };
        let w = predict_program(&p, &mesh, &busy);
        assert!((w.compute - (x.compute + 2e-2)).abs() < 1e-15, "{w:?}");
        assert_eq!(w.communication, x.communication);
        // The same program on a mesh where `model` has one device: its
        // all-reduce is free.
        let flat = Mesh::parse("data=2,model=1").unwrap();
        let y = predict_program(&p, &flat, &opts);
        assert!((y.communication - ag).abs() < 1e-15, "{y:?}");
    }

    #[test]
    fn rank_correlation() {
        assert_eq!(spearman(&[1.0, 2.0, 3.0], &[10.0, 20.0, 30.0]), Some(1.0));
        assert_eq!(spearman(&[1.0, 2.0, 3.0], &[3.0, 2.0, 1.0]), Some(-1.0));
        // Ranks 1, 2.5, 2.5 against 1, 2, 3.
        let r = spearman(&[1.0, 5.0, 5.0], &[1.0, 2.0, 3.0]).unwrap();
        assert!((r - 0.866_025_403_784_438_6).abs() < 1e-12, "{r}");
        assert_eq!(spearman(&[1.0, 1.0], &[1.0, 2.0]), None);
        assert_eq!(spearman(&[1.0], &[1.0]), None);
    }
}

//! The chosen plan: every value's sharding, the collectives it runs, its
//! cost and its per-device memory.

use super::cost::{CollKind, CostModel};
use super::extract::Extraction;
use super::lang::ShardLang;
use super::problem::{route, Problem};
use super::rewrites::EGraphReport;
use super::space::Space;
use crate::sharding::rules::factor_name;
use crate::sharding::{fmt_sharding, Mesh, MeshSharding};
use std::collections::BTreeMap;
use weft_ir::{Function, InstId, TensorSharding, ValueDef, ValueId};

/// One collective of the plan.
#[derive(Clone, Debug, PartialEq)]
pub struct PlannedCollective {
    /// The value moved.
    pub value: ValueId,
    /// What it is.
    pub kind: CollKind,
    /// Mesh axes it runs over.
    pub axes: Vec<String>,
    /// Layout before.
    pub from: TensorSharding,
    /// Layout after.
    pub to: TensorSharding,
    /// Bytes per device the cost formula is applied to.
    pub bytes: f64,
    /// Its cost.
    pub cost: f64,
    /// The instruction that needed it (`None`: the function's return).
    pub before: Option<InstId>,
}

/// Count, bytes and time of the collectives of one kind.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct CommStats {
    /// How many.
    pub count: usize,
    /// Bytes per device, summed.
    pub bytes: f64,
    /// Time, summed.
    pub cost: f64,
}

/// Step time of the plan.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct CostBreakdown {
    /// Compute time (FLOPs per device over the device rate).
    pub compute: f64,
    /// Communication time (collectives).
    pub communication: f64,
    /// Their sum.
    pub total: f64,
}

/// What a value is, for the memory breakdown.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum MemoryKind {
    /// Trained parameters (`params.*`, `new.params.*`).
    Parameters,
    /// Optimizer state (`opt.*`, `new.opt.*`).
    OptimizerState,
    /// Other inputs (the batch, counters).
    Inputs,
    /// Everything computed: activations, gradients, temporaries.
    Activations,
}

impl MemoryKind {
    fn of(f: &Function, v: ValueId) -> MemoryKind {
        let name = f.value(v).name.as_deref().unwrap_or("");
        let name = name.strip_prefix("new.").unwrap_or(name);
        if name.starts_with("params.") {
            MemoryKind::Parameters
        } else if name.starts_with("opt.") {
            MemoryKind::OptimizerState
        } else if matches!(f.value(v).def, ValueDef::Param(_)) {
            MemoryKind::Inputs
        } else {
            MemoryKind::Activations
        }
    }

    /// Name in reports.
    pub fn name(self) -> &'static str {
        match self {
            MemoryKind::Parameters => "parameters",
            MemoryKind::OptimizerState => "optimizer state",
            MemoryKind::Inputs => "inputs",
            MemoryKind::Activations => "activations and gradients",
        }
    }
}

/// Per-device memory of the plan under the program's sequential schedule:
/// a value's home layout is live from its definition (parameters: from the
/// start) to its last use, a resharded copy from the reshard to its last
/// user. Values computed from constants only are assumed fused into their
/// users and not counted.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct MemoryReport {
    /// Peak bytes per device.
    pub peak: f64,
    /// The instruction after which the peak occurs (`None`: the return).
    pub peak_at: Option<InstId>,
    /// Bytes per kind of value live at the peak.
    pub by_kind: BTreeMap<MemoryKind, f64>,
    /// Everything live at the peak, largest first: (value, its layout,
    /// bytes per device).
    pub live_at_peak: Vec<(ValueId, TensorSharding, f64)>,
}

/// How the plan was found.
#[derive(Clone, Debug, PartialEq)]
pub struct SearchReport {
    /// The e-graph search.
    pub egraph: EGraphReport,
    /// Whether the plan is optimal over the e-graph's alternatives (the
    /// extractor never dropped a partial plan).
    pub exact: bool,
    /// Largest number of distinct partial plans at one instruction.
    pub max_states: usize,
    /// Instructions at which the beam dropped partial plans.
    pub truncated_steps: usize,
    /// Beam width used (the option, narrowed to `work / instructions` on
    /// long programs).
    pub beam_width: usize,
    /// Layouts left out of the extraction (more than 64 for a value).
    pub dropped_classes: usize,
    /// Wall time of each phase, in order (`space`, `e-graph`, `problem`,
    /// `seeds` (building and evaluating the starting plans), `extraction`
    /// (the searches), `plan`). Informative only: everything else in the plan is
    /// deterministic, these are not.
    pub phases: Vec<(&'static str, std::time::Duration)>,
}

/// The internals `explain` and `apply` need.
#[derive(Clone, Debug)]
pub(crate) struct PlanData {
    pub space: Space,
    pub problem: Problem,
    pub extraction: Extraction,
    pub cost: CostModel,
}

/// An auto-sharding plan (see [`super::auto_shard`]).
#[derive(Clone, Debug)]
pub struct AutoShardPlan {
    /// The function planned.
    pub source: Function,
    /// The mesh.
    pub mesh: Mesh,
    /// The sharding each value is produced in (closed; unreduced axes when
    /// the value is a partial sum), indexed by value id.
    pub shardings: Vec<TensorSharding>,
    /// The strategy chosen for each instruction, e.g. `i={data}, k={model}`
    /// (factors of its rule and their axes).
    pub strategies: Vec<String>,
    /// The sharding each function result is returned in.
    pub result_shardings: Vec<TensorSharding>,
    /// Every collective, in program order.
    pub collectives: Vec<PlannedCollective>,
    /// Collectives per kind.
    pub comm: BTreeMap<CollKind, CommStats>,
    /// Step time.
    pub cost: CostBreakdown,
    /// Per-device memory.
    pub memory: MemoryReport,
    /// The memory budget (bytes per device), if any.
    pub budget: Option<u64>,
    /// How the plan was found.
    pub search: SearchReport,
    pub(crate) data: PlanData,
}

/// `i={data}, k={model}` for a strategy's factor axes (`replicated` when
/// none is split).
pub fn describe_strategy(factor_axes: &[Vec<usize>], mesh: &Mesh) -> String {
    let parts: Vec<String> = factor_axes
        .iter()
        .enumerate()
        .filter(|(_, a)| !a.is_empty())
        .map(|(f, a)| {
            format!("{}={{{}}}", factor_name(f), a.iter().map(|&x| mesh.name(x)).collect::<Vec<_>>().join(", "))
        })
        .collect();
    if parts.is_empty() {
        "replicated".into()
    } else {
        parts.join(", ")
    }
}

impl AutoShardPlan {
    pub(crate) fn build(
        f: &Function,
        mesh: &Mesh,
        data: PlanData,
        search: SearchReport,
        budget: Option<u64>,
    ) -> AutoShardPlan {
        let (sp, p, x) = (&data.space, &data.problem, &data.extraction);
        let layout = |v: u32, ci: u8| sp.layouts.get(v, p.classes[v as usize][ci as usize].layout);
        let mut home: Vec<MeshSharding> = f.values.iter().map(|v| MeshSharding::replicated(v.ty.rank())).collect();
        for (i, &pv) in f.params.iter().enumerate() {
            if let Some(ci) = x.homes[i] {
                home[pv.index()] = layout(pv.0, ci).clone();
            } else if let Some(&l) = sp.param_layouts[i].first() {
                home[pv.index()] = sp.layouts.get(pv.0, l).clone();
            }
        }
        let mut strategies = Vec::new();
        let mut compute = 0.0;
        for (k, inst) in f.insts.iter().enumerate() {
            let (s, c) = match x.options[k] {
                Some(oi) => {
                    let o = &p.options[k][oi];
                    home[inst.results[0].index()] = layout(inst.results[0].0, o.class).clone();
                    compute += o.compute;
                    (o.strategy as usize, o.compute)
                }
                None => (0, 0.0),
            };
            let _ = c;
            strategies.push(describe_strategy(&sp.strategies[k][s].factor_axes, mesh));
        }
        let mut collectives = Vec::new();
        for m in &x.mats {
            let (_, _, steps) = route(p, m.value, m.have, m.target).expect("a materialised class is reachable");
            let v = ValueId(m.value);
            let ty = f.ty(v);
            for (from, ei) in steps {
                let e = &p.out[m.value as usize][from as usize][ei];
                let (fl, tl) = (layout(m.value, from), layout(m.value, e.to));
                let before = (m.step < f.insts.len()).then_some(InstId(m.step as u32));
                let parts = match &e.node {
                    ShardLang::Collective(k, _) => {
                        let axes = k.axes.to_vec();
                        let mut bytes = data.cost.local_bytes(ty, fl);
                        if k.kind == CollKind::AllGather {
                            bytes *= mesh.product(&axes) as f64;
                        }
                        vec![(k.kind, axes, bytes, e.cost)]
                    }
                    _ => data.cost.reshard(ty, fl, tl).into_iter().map(|c| (c.kind, c.axes, c.bytes, c.cost)).collect(),
                };
                for (kind, axes, bytes, cost) in parts {
                    let axes = axes.iter().map(|&a| mesh.name(a).to_string()).collect();
                    collectives.push(PlannedCollective {
                        value: v,
                        kind,
                        axes,
                        from: fl.to_ir(mesh),
                        to: tl.to_ir(mesh),
                        bytes,
                        cost,
                        before,
                    });
                }
            }
        }
        let mut comm: BTreeMap<CollKind, CommStats> = BTreeMap::new();
        for c in collectives.iter().filter(|c| c.kind.communicates()) {
            let e = comm.entry(c.kind).or_default();
            e.count += 1;
            e.bytes += c.bytes;
            e.cost += c.cost;
        }
        // (`+ 0.0`: an empty float sum is -0.)
        let communication: f64 = collectives.iter().map(|c| c.cost).sum::<f64>() + 0.0;
        let cost = CostBreakdown { compute, communication, total: x.cost };
        let result_shardings =
            f.results.iter().zip(&x.result_classes).map(|(r, &ci)| layout(r.0, ci).to_ir(mesh)).collect();
        let memory = memory(f, mesh, &data);
        AutoShardPlan {
            source: f.clone(),
            mesh: mesh.clone(),
            shardings: home.iter().map(|s| s.to_ir(mesh)).collect(),
            strategies,
            result_shardings,
            collectives,
            comm,
            cost,
            memory,
            budget,
            search,
            data,
        }
    }

    /// The sharding of the value named `name` (as produced).
    pub fn sharding_of(&self, name: &str) -> Option<&TensorSharding> {
        self.source.value_by_name(name).map(|v| &self.shardings[v.index()])
    }

    /// The sharding of `v`, printed with its unreduced axes.
    pub fn sharding_text(&self, v: ValueId) -> String {
        fmt_sharding(&self.shardings[v.index()])
    }

    /// Number of communicating collectives of `kind`.
    pub fn count(&self, kind: CollKind) -> usize {
        self.comm.get(&kind).map_or(0, |c| c.count)
    }
}

/// The plan's per-device memory along the schedule (see
/// [`MemoryReport`]): the classes the search held, with parameters held
/// from the start and resharded copies freed after their last use.
fn memory(f: &Function, mesh: &Mesh, d: &PlanData) -> MemoryReport {
    let (sp, p, x) = (&d.space, &d.problem, &d.extraction);
    let n = f.insts.len();
    // Steps at which each (value, class) is used.
    let mut uses: BTreeMap<(u32, u8), Vec<usize>> = BTreeMap::new();
    for (k, o) in x.options.iter().enumerate() {
        if let Some(oi) = o {
            for &(u, t) in &p.options[k][*oi].children {
                uses.entry((u, t)).or_default().push(k);
            }
        }
    }
    for (r, &ci) in f.results.iter().zip(&x.result_classes) {
        uses.entry((r.0, ci)).or_default().push(n);
    }
    // A class a later reshard path starts from is used then too.
    for m in &x.mats {
        let (_, _, steps) = route(p, m.value, m.have, m.target).expect("reachable");
        for (from, _) in steps {
            uses.entry((m.value, from)).or_default().push(m.step);
        }
    }
    for u in uses.values_mut() {
        u.sort_unstable();
    }
    let home = |v: u32| -> Option<u8> {
        match f.value(ValueId(v)).def {
            ValueDef::Param(i) => x.homes[i as usize],
            ValueDef::Inst { inst, .. } => x.options[inst.index()].map(|oi| p.options[inst.index()][oi].class),
        }
    };
    let mut delta = vec![0.0f64; n + 2];
    let mut spans = Vec::new();
    for &(v, c, start, end) in &x.held {
        let is_param = matches!(f.value(ValueId(v)).def, ValueDef::Param(_));
        let (start, end) = if home(v) == Some(c) {
            (if is_param { 0 } else { start }, end)
        } else {
            let last = uses.get(&(v, c)).and_then(|u| u.iter().rev().find(|&&k| k >= start && k <= end).copied());
            (start, last.unwrap_or(start))
        };
        let bytes = p.classes[v as usize][c as usize].bytes;
        delta[start] += bytes;
        delta[end + 1] -= bytes;
        spans.push((v, c, start, end, bytes));
    }
    let (mut live, mut peak, mut at) = (0.0, -1.0, 0);
    for (k, dk) in delta.iter().enumerate().take(n + 1) {
        live += dk;
        if live > peak + 1e-9 {
            peak = live;
            at = k;
        }
    }
    let mut by_kind = BTreeMap::new();
    let mut live_at_peak = Vec::new();
    for &(v, c, a, b, bytes) in &spans {
        if a <= at && at <= b {
            *by_kind.entry(MemoryKind::of(f, ValueId(v))).or_insert(0.0) += bytes;
            let l = sp.layouts.get(v, p.classes[v as usize][c as usize].layout);
            live_at_peak.push((ValueId(v), l.to_ir(mesh), bytes));
        }
    }
    live_at_peak.sort_by(|a, b| b.2.total_cmp(&a.2).then(a.0.cmp(&b.0)));
    MemoryReport { peak: peak.max(0.0), peak_at: (at < n).then_some(InstId(at as u32)), by_kind, live_at_peak }
}

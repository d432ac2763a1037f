//! Why a value is sharded as it is: the alternatives the e-graph held for
//! it and what each would cost with the rest of the plan unchanged; and the
//! printable report of a plan.

use super::options::{fmt_bytes, fmt_time};
use super::plan::{describe_strategy, AutoShardPlan};
use super::problem::Paths;
use crate::sharding::fmt_sharding;
use std::fmt::Write;
use weft_ir::{ValueDef, ValueId};

/// One way a value could have been produced.
#[derive(Clone, Debug, PartialEq)]
pub struct Alternative {
    /// The layout it would have.
    pub sharding: String,
    /// The instruction's strategy (`None` for a parameter's layout).
    pub strategy: Option<String>,
    /// Compute time of that form.
    pub compute: f64,
    /// Reshards of its operands from what the plan has of them.
    pub operands: f64,
    /// Reshards from it to what the plan's users (and the return) need.
    pub users: f64,
    /// Bytes per device of the value in that layout.
    pub bytes: f64,
    /// `compute + operands + users`: the local cost of this choice with the
    /// rest of the plan unchanged.
    pub total: f64,
    /// Whether the plan chose it.
    pub chosen: bool,
}

impl AutoShardPlan {
    /// The alternatives considered for value `v`, cheapest first (the
    /// chosen one is marked). Each is costed with every other choice of the
    /// plan fixed, so the differences show what this choice saves.
    pub fn explain(&self, v: ValueId) -> Vec<Alternative> {
        let f = &self.source;
        let (sp, p, x) = (&self.data.space, &self.data.problem, &self.data.extraction);
        let mut paths = Paths::default();
        let n = f.insts.len();
        // Classes of each value the plan makes available, by step.
        let home_class = |u: ValueId| -> Option<u8> {
            match f.value(u).def {
                ValueDef::Param(i) => x.homes[i as usize],
                ValueDef::Inst { inst, .. } => x.options[inst.index()].map(|oi| p.options[inst.index()][oi].class),
            }
        };
        let avail = |u: ValueId, before: usize| -> u64 {
            let mut m = home_class(u).map_or(1, |c| 1u64 << c);
            for r in x.mats.iter().filter(|r| r.value == u.0 && r.step < before) {
                m |= 1 << r.target;
            }
            m
        };
        // What the users of `v` need: class targets in program order.
        let mut targets: Vec<u8> = Vec::new();
        for (k, inst) in f.insts.iter().enumerate() {
            let Some(oi) = x.options[k] else { continue };
            for (j, o) in inst.operands.iter().enumerate() {
                if *o == v {
                    targets.push(p.options[k][oi].children[j].1);
                }
            }
        }
        for (r, &ci) in f.results.iter().zip(&x.result_classes) {
            if *r == v {
                targets.push(ci);
            }
        }
        let users_cost = |paths: &mut Paths, from: u8| -> f64 {
            let mut have = 1u64 << from;
            let mut total = 0.0;
            for &t in &targets {
                match paths.get(p, v.0, have, t) {
                    Some((c, add)) => {
                        total += c;
                        have |= add;
                    }
                    None => return f64::INFINITY,
                }
            }
            total
        };
        let chosen = home_class(v);
        let mut out = Vec::new();
        let classes = &p.classes[v.index()];
        match f.value(v).def {
            ValueDef::Param(i) => {
                for ci in (0..classes.len()).filter(|&c| classes[c].input) {
                    let users = users_cost(&mut paths, ci as u8);
                    out.push(Alternative {
                        sharding: fmt_sharding(&sp.layouts.get(v.0, classes[ci].layout).to_ir(&self.mesh)),
                        strategy: None,
                        compute: 0.0,
                        operands: 0.0,
                        users,
                        bytes: classes[ci].bytes,
                        total: users,
                        chosen: x.homes[i as usize] == Some(ci as u8),
                    });
                }
            }
            ValueDef::Inst { inst, .. } => {
                let k = inst.index();
                for (oi, o) in p.options[k].iter().enumerate() {
                    let mut operands = 0.0;
                    for &(u, t) in &o.children {
                        if sp.deferred[u as usize] {
                            continue;
                        }
                        operands += paths.get(p, u, avail(ValueId(u), k.min(n)), t).map_or(f64::INFINITY, |r| r.0);
                    }
                    let users = users_cost(&mut paths, o.class);
                    let s = &sp.strategies[k][o.strategy as usize];
                    out.push(Alternative {
                        sharding: fmt_sharding(
                            &sp.layouts.get(v.0, classes[o.class as usize].layout).to_ir(&self.mesh),
                        ),
                        strategy: Some(describe_strategy(&s.factor_axes, &self.mesh)),
                        compute: o.compute,
                        operands,
                        users,
                        bytes: classes[o.class as usize].bytes,
                        total: o.compute + operands + users,
                        chosen: x.options[k] == Some(oi) && chosen == Some(o.class),
                    });
                }
            }
        }
        out.sort_by(|a, b| a.total.total_cmp(&b.total).then(b.chosen.cmp(&a.chosen)));
        out
    }

    /// [`AutoShardPlan::explain`] as text, one alternative per line.
    pub fn explain_text(&self, v: ValueId) -> String {
        let f = &self.source;
        let mut s = format!("{} {}: {}\n", f.value_ref(v), f.ty(v), self.sharding_text(v));
        for a in self.explain(v) {
            let _ = writeln!(
                s,
                "  {} {:<28} {:<30} compute {} + operands {} + users {} = {}  ({} per device)",
                if a.chosen { "*" } else { " " },
                a.sharding,
                a.strategy.as_deref().unwrap_or("(input layout)"),
                fmt_time(a.compute),
                fmt_time(a.operands),
                fmt_time(a.users),
                fmt_time(a.total),
                fmt_bytes(a.bytes)
            );
        }
        s
    }

    /// How long each phase of the search took, e.g. `space 2.6 ms, e-graph
    /// 10.3 ms, …` (not part of [`Self::report`], which is deterministic).
    pub fn timings(&self) -> String {
        let phases: Vec<String> =
            self.search.phases.iter().map(|(n, t)| format!("{n} {:.1} ms", t.as_secs_f64() * 1e3)).collect();
        phases.join(", ")
    }

    /// The report `weft shard FILE --mesh … --auto` prints: search
    /// statistics, step time, memory, communication per kind, the sharding
    /// of every parameter and named value, and every collective.
    pub fn report(&self) -> String {
        let f = &self.source;
        let mut s = String::new();
        let w = &mut s;
        let _ = writeln!(w, "auto-sharding @{} on mesh {} ({} devices)", f.name, self.mesh, self.mesh.num_devices());
        let e = &self.search.egraph;
        let _ = writeln!(
            w,
            "search: e-graph of {} e-nodes in {} e-classes after {} iteration{} ({}{})",
            e.nodes,
            e.classes,
            e.iterations,
            if e.iterations == 1 { "" } else { "s" },
            e.stop,
            if e.unexpanded > 0 {
                format!("; {} instructions kept their first form", e.unexpanded)
            } else {
                String::new()
            }
        );
        let rules: Vec<String> = e.applied.iter().map(|(r, n)| format!("{r} ×{n}")).collect();
        let _ = writeln!(w, "  rewrites applied: {}", if rules.is_empty() { "none".into() } else { rules.join(", ") });
        let _ = writeln!(
            w,
            "  extraction: {} (at most {} partial plans per instruction, beam {}{})",
            if self.search.exact && !e.cut {
                "optimal over all alternatives"
            } else if self.search.exact {
                "optimal over the alternatives generated before the limit"
            } else {
                "best found, not proven optimal"
            },
            self.search.max_states,
            self.search.beam_width,
            if self.search.truncated_steps > 0 {
                format!(", cut at {} instructions", self.search.truncated_steps)
            } else {
                String::new()
            }
        );
        let c = &self.cost;
        let _ = writeln!(
            w,
            "step time: {} = compute {} + communication {}",
            fmt_time(c.total),
            fmt_time(c.compute),
            fmt_time(c.communication)
        );
        let m = &self.memory;
        let kinds: Vec<String> = m.by_kind.iter().map(|(k, b)| format!("{} {}", k.name(), fmt_bytes(*b))).collect();
        let _ = writeln!(
            w,
            "memory per device: peak {}{} = {}",
            fmt_bytes(m.peak),
            self.budget.map(|b| format!(" (budget {})", fmt_bytes(b as f64))).unwrap_or_default(),
            kinds.join(" + ")
        );
        if self.comm.is_empty() {
            let _ = writeln!(w, "communication per step: none");
        } else {
            let _ = writeln!(w, "communication per step:");
            for (k, st) in &self.comm {
                let _ = writeln!(
                    w,
                    "  {:<20} ×{:<4} {:>12} {}",
                    k.name(),
                    st.count,
                    fmt_bytes(st.bytes),
                    fmt_time(st.cost)
                );
            }
        }
        let _ = writeln!(w, "shardings:");
        for v in (0..f.values.len()).map(|i| ValueId(i as u32)) {
            let named = f.value(v).name.is_some();
            let is_param = matches!(f.value(v).def, ValueDef::Param(_));
            if !(named || is_param) {
                continue;
            }
            let strategy = match f.value(v).def {
                ValueDef::Inst { inst, .. } => {
                    format!("  [{} {}]", f.insts[inst.index()].op.name(), self.strategies[inst.index()])
                }
                ValueDef::Param(_) => "  [input]".into(),
            };
            let _ = writeln!(w, "  {} {}: {}{}", f.value_ref(v), f.ty(v), self.sharding_text(v), strategy);
        }
        let unnamed = f.insts.iter().filter(|i| f.value(i.results[0]).name.is_none()).count();
        if unnamed > 0 {
            let _ = writeln!(w, "  ({unnamed} unnamed values; see AutoShardPlan::shardings)");
        }
        let comms: Vec<_> = self.collectives.iter().filter(|c| c.kind.communicates()).collect();
        if !comms.is_empty() {
            let _ = writeln!(w, "collectives:");
            for c in comms {
                let at = match c.before {
                    Some(i) => format!("before {}", f.value_ref(f.insts[i.index()].results[0])),
                    None => "before return".into(),
                };
                let _ = writeln!(
                    w,
                    "  {}{{{}}} of {} {} -> {}: {} per device, {} ({at})",
                    c.kind.name(),
                    c.axes.join(", "),
                    f.value_ref(c.value),
                    fmt_sharding(&c.from),
                    fmt_sharding(&c.to),
                    fmt_bytes(c.bytes),
                    fmt_time(c.cost)
                );
            }
        }
        s
    }
}

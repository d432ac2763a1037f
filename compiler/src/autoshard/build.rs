//! Loading the program into the e-graph and describing its schedule for
//! the extractor.

use super::extract::Sched;
use super::lang::{reach, ComputeKey, InputKey, ShardGraph, ShardLang};
use super::problem::Problem;
use super::space::{ResultReq, Space};
use egg::Id;
use rustc_hash::FxHashMap as HashMap;
use weft_ir::Function;

/// Adds the program to `g` as it first stands: every parameter arriving in
/// its first allowed layout (replicated when allowed) and every instruction
/// under its replicated strategy when allowed (otherwise its first one),
/// with reshard chains where an operand is not laid out as needed; plus the
/// layouts the results may have to be returned in. Returns the class of
/// each value.
pub fn load(g: &mut ShardGraph, f: &Function) -> Vec<Id> {
    let mut class = vec![Id::from(0usize); f.values.len()];
    for (i, &p) in f.params.iter().enumerate() {
        let ls = &g.analysis.space.param_layouts[i];
        let l = if ls.contains(&0) { 0 } else { ls[0] };
        class[p.index()] = g.add(ShardLang::Input(InputKey { param: i as u32, layout: l }));
    }
    for (k, inst) in f.insts.iter().enumerate() {
        let strategies = &g.analysis.space.strategies[k];
        let s = strategies.iter().position(|s| s.split == 1).unwrap_or(0);
        let req = strategies[s].operands.clone();
        if !g.analysis.space.elementwise[k] {
            for (o, &l) in inst.operands.iter().zip(&req) {
                g.analysis.require(o.0, l);
            }
        }
        let ch: Box<[Id]> = inst.operands.iter().zip(&req).map(|(o, &l)| reach(g, class[o.index()], l)).collect();
        class[inst.results[0].index()] =
            g.add(ShardLang::Compute(ComputeKey { inst: k as u32, strategy: s as u16 }, ch));
    }
    let space: &Space = &g.analysis.space;
    let mut wanted: Vec<(u32, u16)> = Vec::new();
    for (r, req) in f.results.iter().zip(space.results.clone()) {
        match req {
            ResultReq::Fixed(l) => wanted.push((r.0, l)),
            ResultReq::Alias(p) => {
                let pv = f.params[p].0;
                for &l in &g.analysis.space.param_layouts[p] {
                    let layout = g.analysis.space.layouts.get(pv, l).clone();
                    wanted.push((r.0, g.analysis.space.layouts.intern(r.0, layout)));
                }
            }
            ResultReq::Reduced => {}
        }
    }
    for (v, l) in wanted {
        g.analysis.require(v, l);
        let hub = reach(g, class[v as usize], 0);
        reach(g, hub, l);
    }
    g.rebuild();
    class.iter().map(|&c| g.find(c)).collect()
}

/// The schedule of `f` for the extractor (see [`Sched`]).
pub fn schedule(f: &Function, space: &Space, p: &Problem) -> Sched {
    let n = f.insts.len();
    let nv = f.values.len();
    let mut last_use: Vec<Option<usize>> = vec![None; nv];
    let mut first_use: Vec<Option<usize>> = vec![None; nv];
    for (k, inst) in f.insts.iter().enumerate() {
        for o in &inst.operands {
            last_use[o.index()] = Some(k);
            first_use[o.index()].get_or_insert(k);
        }
    }
    let mut is_result = vec![false; nv];
    for r in &f.results {
        is_result[r.index()] = true;
        first_use[r.index()].get_or_insert(n);
    }
    let mut releases = vec![Vec::new(); n];
    for (k, inst) in f.insts.iter().enumerate() {
        let v = inst.results[0];
        if !is_result[v.index()] {
            releases[last_use[v.index()].unwrap_or(k)].push(v.0);
        }
    }
    for &pv in &f.params {
        if let (false, Some(u)) = (is_result[pv.index()], last_use[pv.index()]) {
            releases[u].push(pv.0);
        }
    }
    releases.iter_mut().for_each(|r| r.sort_unstable());
    let mut first_used_at = vec![Vec::new(); n + 1];
    let mut home_choices = Vec::new();
    let mut min_bytes = Vec::new();
    for (i, &pv) in f.params.iter().enumerate() {
        let cs = &p.classes[pv.index()];
        let choices: Vec<u8> = (0..cs.len()).filter(|&c| cs[c].input).map(|c| c as u8).collect();
        min_bytes.push(choices.iter().map(|&c| cs[c as usize].bytes).fold(f64::INFINITY, f64::min));
        home_choices.push(choices);
        if let Some(u) = first_use[pv.index()] {
            first_used_at[u].push(i);
        }
    }
    let mut undecided_after = vec![0.0; n + 1];
    for (i, &pv) in f.params.iter().enumerate() {
        if let Some(u) = first_use[pv.index()] {
            for x in undecided_after.iter_mut().take(u) {
                *x += min_bytes[i];
            }
        }
    }
    let mut alias_class = Vec::new();
    let mut fixed_class = Vec::new();
    for (r, req) in f.results.iter().zip(&space.results) {
        let mut map = HashMap::default();
        if let ResultReq::Alias(pi) = req {
            let pv = f.params[*pi].0;
            for &c in &home_choices[*pi] {
                let layout = space.layouts.get(pv, p.classes[pv as usize][c as usize].layout);
                let rl = space.layouts.find(r.0, layout);
                if let Some(rc) = rl.and_then(|l| p.class_of_layout(r.0, l)) {
                    map.insert(c, rc);
                }
            }
        }
        alias_class.push(map);
        fixed_class.push(match req {
            ResultReq::Fixed(l) => p.class_of_layout(r.0, *l),
            _ => None,
        });
    }
    Sched {
        param_value: f.params.iter().map(|p| p.0).collect(),
        inst_value: f.insts.iter().map(|i| i.results[0].0).collect(),
        first_used_at,
        releases,
        deferred: space.deferred.clone(),
        results: f.results.iter().map(|r| r.0).zip(space.results.iter().cloned()).collect(),
        home_choices,
        alias_class,
        fixed_class,
        undecided_after,
    }
}

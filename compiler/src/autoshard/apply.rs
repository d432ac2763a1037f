//! Handing the plan over: the program annotated with every chosen sharding
//! and with an explicit `reshard` for every collective of the plan, which
//! `propagate` takes as it is (every value closed, every instruction
//! locally computable) and the SPMD partitioner lowers.

use super::plan::AutoShardPlan;
use super::problem::route;
use crate::error::Result;
use crate::sharding::{propagate, MeshSharding, PropagateOptions, ShardedFunction};
use rustc_hash::FxHashMap as HashMap;
use weft_ir::{Function, Op, ValueId};

struct Emit<'a> {
    plan: &'a AutoShardPlan,
    out: Function,
    /// (source value, layout index) -> value of `out` holding it.
    have: HashMap<(u32, u16), ValueId>,
    /// (source value, layout index) -> layout it is resharded from.
    parent: HashMap<(u32, u16), u16>,
}

impl Emit<'_> {
    fn layout(&self, v: u32, l: u16) -> &MeshSharding {
        self.plan.data.space.layouts.get(v, l)
    }

    /// The value of `out` holding source value `v` in layout `l`, adding
    /// the plan's reshards to reach it.
    fn get(&mut self, v: u32, l: u16, loc: Option<weft_ir::Loc>) -> ValueId {
        if let Some(&x) = self.have.get(&(v, l)) {
            return x;
        }
        // Deferred values (fused constants) are produced replicated and
        // sliced locally; anything else follows the plan's path.
        let from = self.parent.get(&(v, l)).copied().unwrap_or(0);
        let src = self.get(v, from, loc);
        let to = self.layout(v, l).to_ir(&self.plan.mesh);
        let ty = self.out.ty(src).clone();
        let inst = self.out.add_inst(Op::Reshard { to: to.clone() }, vec![src], vec![(ty, None)], loc);
        let r = self.out.insts[inst.index()].results[0];
        self.out.values[r.index()].sharding = Some(to);
        self.have.insert((v, l), r);
        r
    }
}

impl AutoShardPlan {
    /// The program with the plan written into it: every parameter and
    /// instruction result annotated with its closed sharding (unreduced
    /// axes included), a `reshard` before every use that needs another
    /// layout (one per value and layout, following the plan's collectives),
    /// and the results' shardings. Names and source positions are kept.
    pub fn apply(&self) -> Function {
        let f = &self.source;
        let (sp, p, x) = (&self.data.space, &self.data.problem, &self.data.extraction);
        let mut out = Function::new(f.name.clone());
        (out.loc, out.return_loc) = (f.loc, f.return_loc);
        let mut e = Emit { plan: self, out, have: HashMap::default(), parent: HashMap::default() };
        for m in &x.mats {
            let (_, _, steps) = route(p, m.value, m.have, m.target).expect("reachable");
            for (from, ei) in steps {
                let cs = &p.classes[m.value as usize];
                let to = p.out[m.value as usize][from as usize][ei].to;
                e.parent.entry((m.value, cs[to as usize].layout)).or_insert(cs[from as usize].layout);
            }
        }
        let home_layout = |v: ValueId| -> u16 {
            let s = &self.shardings[v.index()];
            let ms = sp.layouts.of(v.0).position(|l| l.to_ir(&self.mesh) == *s).expect("home layout interned");
            ms as u16
        };
        for &pv in &f.params {
            let np = e.out.add_param(f.value(pv).name.clone(), f.ty(pv).clone());
            e.out.values[np.index()].sharding = Some(self.shardings[pv.index()].clone());
            e.have.insert((pv.0, home_layout(pv)), np);
        }
        for (k, inst) in f.insts.iter().enumerate() {
            let s = match x.options[k] {
                Some(oi) => p.options[k][oi].strategy as usize,
                None => 0,
            };
            let req = sp.strategies[k][s].operands.clone();
            let ops: Vec<ValueId> = inst.operands.iter().zip(&req).map(|(o, &l)| e.get(o.0, l, inst.loc)).collect();
            let r = inst.results[0];
            let id = e.out.add_inst(inst.op.clone(), ops, vec![(f.ty(r).clone(), f.value(r).name.clone())], inst.loc);
            let nr = e.out.insts[id.index()].results[0];
            e.out.values[nr.index()].sharding = Some(self.shardings[r.index()].clone());
            e.have.insert((r.0, home_layout(r)), nr);
        }
        let mut results = Vec::new();
        for (r, &ci) in f.results.iter().zip(&x.result_classes) {
            let l = if sp.deferred[r.index()] { 0 } else { p.classes[r.index()][ci as usize].layout };
            results.push(e.get(r.0, l, f.return_loc));
        }
        e.out.results = results;
        e.out.result_shardings = self.result_shardings.iter().cloned().map(Some).collect();
        e.out
    }

    /// [`AutoShardPlan::apply`], then `propagate`: the sharded program the
    /// SPMD partitioner takes. Propagation has nothing left to choose, so
    /// it inserts no reshard of its own.
    pub fn to_sharded(&self) -> Result<ShardedFunction> {
        propagate(&self.apply(), &self.mesh, &PropagateOptions::default())
    }
}

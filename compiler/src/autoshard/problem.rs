//! The saturated e-graph, flattened for extraction: per value its e-classes
//! (layouts) and the reshard edges between them, per instruction its
//! `Compute` e-nodes ("options") with costs.

use super::lang::{move_cost, ShardGraph, ShardLang};
use egg::{Id, Language};
use rustc_hash::FxHashMap as HashMap;

/// Most layouts one value may have in the extraction (a bit set per value;
/// the top bits of the extractor's per-value word hold the home class).
pub const MAX_CLASSES: usize = 58;

/// One e-class of a value.
#[derive(Clone, Debug)]
pub struct ClassRec {
    /// The e-class.
    pub id: Id,
    /// Its layout index.
    pub layout: u16,
    /// Bytes per device of the value in this layout.
    pub bytes: f64,
    /// Whether a parameter can arrive in it (`Input` node).
    pub input: bool,
    /// Whether the layout has no pending sums.
    pub reduced: bool,
}

/// A reshard e-node between two classes of one value.
#[derive(Clone, Debug)]
pub struct Edge {
    /// Target class index (within the value).
    pub to: u8,
    /// Its cost.
    pub cost: f64,
    /// The e-node (a `Collective` or a `Reshard`).
    pub node: ShardLang,
}

/// A `Compute` e-node of an instruction.
#[derive(Clone, Debug)]
pub struct Opt {
    /// Class index of the result.
    pub class: u8,
    /// Strategy index.
    pub strategy: u16,
    /// Operands: (value, class index).
    pub children: Vec<(u32, u8)>,
    /// Compute time.
    pub compute: f64,
}

/// The flattened extraction problem.
#[derive(Clone, Debug, Default)]
pub struct Problem {
    /// Classes of each value, by layout index.
    pub classes: Vec<Vec<ClassRec>>,
    /// Per value and class: the reshard edges leaving it.
    pub out: Vec<Vec<Vec<Edge>>>,
    /// Options of each instruction.
    pub options: Vec<Vec<Opt>>,
    /// Classes left out because a value had more than [`MAX_CLASSES`].
    pub dropped_classes: usize,
    /// Per value and class: the classes reachable from it through free
    /// moves only (local slices and unreduces), as a bit set.
    pub free_from: Vec<Vec<u64>>,
    /// Per value: the number of its reshard graph (its edges' targets and
    /// costs, class by class). Values with the same number have the same
    /// routes — the layers of a deep model repeat their values' graphs —
    /// so [`Paths`] memoises routes by this number, not by value.
    pub graph_of: Vec<u32>,
}

impl Problem {
    /// The class index of layout `layout` of value `v`.
    pub fn class_of_layout(&self, v: u32, layout: u16) -> Option<u8> {
        self.classes[v as usize].iter().position(|c| c.layout == layout).map(|i| i as u8)
    }
}

/// Flattens `g` (saturated) for a function with `nv` values and `ninst`
/// instructions.
pub fn build_problem(g: &ShardGraph, nv: usize, ninst: usize) -> Problem {
    let a = &g.analysis;
    let mut per: Vec<Vec<(u16, Id)>> = vec![Vec::new(); nv];
    for c in g.classes() {
        per[c.data.value as usize].push((c.data.layout, c.id));
    }
    let mut p = Problem {
        classes: vec![Vec::new(); nv],
        out: vec![Vec::new(); nv],
        options: vec![Vec::new(); ninst],
        dropped_classes: 0,
        free_from: vec![Vec::new(); nv],
        graph_of: Vec::new(),
    };
    // (value, class index) of each class, by id (ids are dense: one per
    // class ever made, `LayoutAnalysis::info`).
    let mut index: Vec<Option<(u32, u8)>> = vec![None; a.info.len()];
    for (v, list) in per.iter_mut().enumerate() {
        list.sort_unstable();
        if list.len() > MAX_CLASSES {
            p.dropped_classes += list.len() - MAX_CLASSES;
            list.truncate(MAX_CLASSES);
        }
        for (i, &(layout, id)) in list.iter().enumerate() {
            let l = a.space.layouts.get(v as u32, layout);
            p.classes[v].push(ClassRec {
                id,
                layout,
                bytes: a.cost.local_bytes(&a.types[v], l),
                input: false,
                reduced: l.unreduced.is_empty(),
            });
            index[usize::from(id)] = Some((v as u32, i as u8));
        }
        p.out[v] = vec![Vec::new(); list.len()];
    }
    for v in 0..nv {
        for ci in 0..p.classes[v].len() {
            let id = p.classes[v][ci].id;
            for node in &g[id].nodes {
                match node {
                    ShardLang::Input(_) => p.classes[v][ci].input = true,
                    ShardLang::Compute(k, ch) => {
                        let children: Option<Vec<(u32, u8)>> =
                            ch.iter().map(|c| index[usize::from(g.find(*c))]).collect();
                        let Some(children) = children else { continue };
                        let s = &a.space.strategies[k.inst as usize][k.strategy as usize];
                        // Bytes per device the op reads and writes, in
                        // the layouts of this form.
                        let bytes = p.classes[v][ci].bytes
                            + children.iter().map(|&(u, c)| p.classes[u as usize][c as usize].bytes).sum::<f64>();
                        let compute = a.cost.op_time(a.space.flops[k.inst as usize], s.split, bytes);
                        p.options[k.inst as usize].push(Opt {
                            class: ci as u8,
                            strategy: k.strategy,
                            children,
                            compute,
                        });
                    }
                    ShardLang::Collective(_, ch) | ShardLang::Reshard(_, ch) => {
                        let Some((_, from)) = index[usize::from(g.find(ch[0]))] else { continue };
                        if from as usize == ci {
                            continue;
                        }
                        let cost = move_cost(g, node).expect("a move node has a cost");
                        let node = node.clone().map_children(|c| g.find(c));
                        p.out[v][from as usize].push(Edge { to: ci as u8, cost, node });
                    }
                }
            }
        }
    }
    for opts in &mut p.options {
        opts.sort_by_key(|o| (o.class, o.strategy));
        opts.dedup_by_key(|o| (o.class, o.strategy));
    }
    for v in &mut p.out {
        for edges in v.iter_mut() {
            // A total order: the e-graph's node order within a class is
            // not canonical (it is not rebuilt).
            edges.sort_by(|a, b| a.to.cmp(&b.to).then(a.cost.total_cmp(&b.cost)).then_with(|| a.node.cmp(&b.node)));
        }
    }
    p.graph_of = number_graphs(&p.out);
    for v in 0..nv {
        let n = p.classes[v].len();
        p.free_from[v] = (0..n)
            .map(|a| {
                let (mut seen, mut stack) = (0u64, vec![a]);
                while let Some(c) = stack.pop() {
                    for e in p.out[v][c].iter().filter(|e| e.cost == 0.0) {
                        if seen & (1 << e.to) == 0 && e.to as usize != a {
                            seen |= 1 << e.to;
                            stack.push(e.to as usize);
                        }
                    }
                }
                seen
            })
            .collect();
    }
    p
}

/// Numbers the values' reshard graphs: equal numbers for equal graphs
/// (same class count, same edges in the same order with the same costs).
fn number_graphs(out: &[Vec<Vec<Edge>>]) -> Vec<u32> {
    let mut seen: HashMap<Vec<u64>, u32> = HashMap::default();
    let mut sig = Vec::new();
    out.iter()
        .map(|classes| {
            sig.clear();
            sig.push(classes.len() as u64);
            for edges in classes {
                sig.push(edges.len() as u64);
                for e in edges {
                    sig.push(e.to as u64);
                    sig.push(e.cost.to_bits());
                }
            }
            let next = seen.len() as u32;
            match seen.get(&sig) {
                Some(&n) => n,
                None => {
                    seen.insert(sig.clone(), next);
                    next
                }
            }
        })
        .collect()
}

/// Shortest reshard paths inside one value, from a set of materialised
/// classes, memoised by the value's graph number
/// ([`Problem::graph_of`]). Paths are found by Dijkstra over the value's (at most
/// 64) classes; ties go to the lower class index, so results are
/// deterministic.
#[derive(Default)]
pub struct Paths {
    /// (graph number, available classes, target) -> (cost, classes added).
    memo: HashMap<(u32, u64, u8), (f64, u64)>,
}

impl Paths {
    /// Cost of making class `t` of value `v` available when the classes in
    /// `have` (a bit set) are, and the classes the path adds (including
    /// `t`); `None` if unreachable.
    pub fn get(&mut self, p: &Problem, v: u32, have: u64, t: u8) -> Option<(f64, u64)> {
        if have & (1 << t) != 0 {
            return Some((0.0, 0));
        }
        let key = (p.graph_of[v as usize], have, t);
        if let Some(&r) = self.memo.get(&key) {
            return r.0.is_finite().then_some(r);
        }
        let r = route(p, v, have, t).map(|(c, m, _)| (c, m)).unwrap_or((f64::INFINITY, 0));
        self.memo.insert(key, r);
        r.0.is_finite().then_some(r)
    }
}

/// A reshard path: its cost, the classes it adds, and its edges as (from
/// class, edge index).
pub type Route = (f64, u64, Vec<(u8, usize)>);

/// Dijkstra from `have` to `t` in value `v`'s class graph: cost, classes
/// added, and the edges taken as (from, edge index), in order.
pub fn route(p: &Problem, v: u32, have: u64, t: u8) -> Option<Route> {
    let n = p.classes[v as usize].len();
    let out = &p.out[v as usize];
    // At most 64 classes per value (MAX_CLASSES): fixed arrays, no
    // allocation per call.
    let mut dist = [f64::INFINITY; 64];
    let mut prev: [(u8, usize); 64] = [(u8::MAX, 0); 64];
    let mut done = 0u64;
    for (i, d) in dist.iter_mut().enumerate().take(n) {
        if have & (1 << i) != 0 {
            *d = 0.0;
        }
    }
    while let Some(u) =
        (0..n).filter(|&i| done & (1 << i) == 0 && dist[i].is_finite()).min_by(|&a, &b| dist[a].total_cmp(&dist[b]))
    {
        done |= 1 << u;
        if u == t as usize {
            break;
        }
        for (ei, e) in out[u].iter().enumerate() {
            let nd = dist[u] + e.cost;
            if nd < dist[e.to as usize] {
                dist[e.to as usize] = nd;
                prev[e.to as usize] = (u as u8, ei);
            }
        }
    }
    if !dist[t as usize].is_finite() {
        return None;
    }
    let mut steps = Vec::new();
    let mut mask = 0u64;
    let mut cur = t as usize;
    while have & (1 << cur) == 0 {
        mask |= 1 << cur;
        let (from, ei) = prev[cur];
        assert!(from != u8::MAX, "a reached class of %{v} has no predecessor");
        steps.push((from, ei));
        cur = from as usize;
    }
    steps.reverse();
    Some((dist[t as usize], mask, steps))
}

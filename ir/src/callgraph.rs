//! The call graph of a module, walked without recursion.
//!
//! Everything that follows calls — the verifier's cycle check, the
//! interpreter, inlining — must survive any module the parser accepts: a
//! chain of thousands of functions must not overflow the stack, and a few
//! functions that each call the next twice must not be expanded into 2^60
//! instructions. [`CallGraph`] computes, with explicit worklists, a cycle if
//! there is one, each function's call depth (the longest chain of nested
//! calls below it) and its expanded size (instructions once every call is
//! inlined, saturating), and names the call chain that makes a function
//! deep or large, for errors.

use crate::{Module, Op};
use std::collections::HashMap;

/// Calls may nest at most this deep (a chain `@a -> @b -> ...` of at most
/// this many calls below any function). The verifier enforces it, so every
/// pass that follows calls recursively stays within a small stack.
pub const MAX_CALL_DEPTH: usize = 64;

/// The call graph of a module: who calls whom, how often.
#[derive(Clone, Debug)]
pub struct CallGraph {
    names: Vec<String>,
    /// Per function, its callees with the number of calls to each, in
    /// order of first call.
    callees: Vec<Vec<(usize, u64)>>,
    /// Per function, its instructions other than calls.
    own: Vec<u64>,
}

impl CallGraph {
    /// The call graph of `m`; calls to functions that do not exist are
    /// left out (the verifier reports them).
    pub fn new(m: &Module) -> CallGraph {
        let index: HashMap<&str, usize> = m.functions.iter().enumerate().map(|(i, f)| (f.name.as_str(), i)).collect();
        let mut callees = Vec::with_capacity(m.functions.len());
        let mut own = Vec::with_capacity(m.functions.len());
        for f in &m.functions {
            let mut list: Vec<(usize, u64)> = Vec::new();
            let mut n = 0u64;
            for inst in &f.insts {
                match &inst.op {
                    Op::Call { callee, .. } => {
                        if let Some(&c) = index.get(callee.as_str()) {
                            match list.iter_mut().find(|(g, _)| *g == c) {
                                Some((_, k)) => *k += 1,
                                None => list.push((c, 1)),
                            }
                        }
                    }
                    _ => n += 1,
                }
            }
            callees.push(list);
            own.push(n);
        }
        CallGraph { names: m.functions.iter().map(|f| f.name.clone()).collect(), callees, own }
    }

    /// The index of function `name`.
    pub fn index(&self, name: &str) -> Option<usize> {
        self.names.iter().position(|n| n == name)
    }

    /// A cycle of calls (`[a, b, a]`, function indices), if any.
    pub fn find_cycle(&self) -> Option<Vec<usize>> {
        self.find_cycles().into_iter().next()
    }

    /// Cycles of calls, at most one per depth-first search from each
    /// function not reached before (so disjoint cycles are all reported).
    pub fn find_cycles(&self) -> Vec<Vec<usize>> {
        let n = self.names.len();
        // 0 unvisited, 1 on the stack, 2 done.
        let mut colour = vec![0u8; n];
        let mut cycles = Vec::new();
        for root in 0..n {
            if colour[root] != 0 {
                continue;
            }
            // (function, index of the next callee to visit)
            let mut stack: Vec<(usize, usize)> = vec![(root, 0)];
            colour[root] = 1;
            while let Some(&mut (v, ref mut next)) = stack.last_mut() {
                if let Some(&(w, _)) = self.callees[v].get(*next) {
                    *next += 1;
                    match colour[w] {
                        1 => {
                            let start = stack.iter().position(|&(s, _)| s == w).unwrap_or(0);
                            let mut cycle: Vec<usize> = stack[start..].iter().map(|&(s, _)| s).collect();
                            cycle.push(w);
                            cycles.push(cycle);
                            // One cycle per search: the rest of it is done.
                            for &(s, _) in &stack {
                                colour[s] = 2;
                            }
                            break;
                        }
                        0 => {
                            colour[w] = 1;
                            stack.push((w, 0));
                        }
                        _ => {}
                    }
                } else {
                    colour[v] = 2;
                    stack.pop();
                }
            }
        }
        cycles
    }

    /// Functions in an order where every callee comes before its callers
    /// (`None` if the graph has a cycle).
    fn callees_first(&self) -> Option<Vec<usize>> {
        let n = self.names.len();
        let mut done = vec![false; n];
        let mut on_stack = vec![false; n];
        let mut order = Vec::with_capacity(n);
        for root in 0..n {
            if done[root] {
                continue;
            }
            let mut stack: Vec<(usize, usize)> = vec![(root, 0)];
            on_stack[root] = true;
            while let Some(&mut (v, ref mut next)) = stack.last_mut() {
                if let Some(&(w, _)) = self.callees[v].get(*next) {
                    *next += 1;
                    if on_stack[w] {
                        return None;
                    }
                    if !done[w] {
                        on_stack[w] = true;
                        stack.push((w, 0));
                    }
                } else {
                    on_stack[v] = false;
                    done[v] = true;
                    order.push(v);
                    stack.pop();
                }
            }
        }
        Some(order)
    }

    /// Per function, the depth of nested calls below it (0 for a function
    /// without calls). `None` if the graph has a cycle.
    pub fn depths(&self) -> Option<Vec<usize>> {
        let mut depth = vec![0usize; self.names.len()];
        for v in self.callees_first()? {
            depth[v] = self.callees[v].iter().map(|&(w, _)| depth[w] + 1).max().unwrap_or(0);
        }
        Some(depth)
    }

    /// Per function, its instructions once every call is inlined (calls
    /// themselves not counted; saturating at `u64::MAX`). `None` if the
    /// graph has a cycle.
    pub fn expanded_sizes(&self) -> Option<Vec<u64>> {
        let mut size = vec![0u64; self.names.len()];
        for v in self.callees_first()? {
            size[v] =
                self.callees[v].iter().fold(self.own[v], |acc, &(w, k)| acc.saturating_add(size[w].saturating_mul(k)));
        }
        Some(size)
    }

    /// The chain of calls below `f` that makes it deep or large: from `f`,
    /// repeatedly the callee with the largest expanded size (times its
    /// call count), as `@f -> @g (2 calls) -> @h`. Acyclic graphs only
    /// (returns just `@f` otherwise).
    pub fn heaviest_chain(&self, f: usize) -> String {
        let Some(sizes) = self.expanded_sizes() else { return format!("@{}", self.names[f]) };
        let mut out = format!("@{}", self.names[f]);
        let mut v = f;
        let mut steps = 0;
        while let Some(&(w, k)) = self.callees[v].iter().max_by_key(|&&(w, k)| sizes[w].saturating_mul(k)) {
            out.push_str(&format!(" -> @{}", self.names[w]));
            if k > 1 {
                out.push_str(&format!(" ({k} calls)"));
            }
            v = w;
            steps += 1;
            if steps >= 12 && !self.callees[v].is_empty() {
                out.push_str(" -> ...");
                break;
            }
        }
        out
    }

    /// The longest chain of nested calls below `f`, as `@f -> @g -> ...`
    /// (shortened in the middle when long). Acyclic graphs only.
    pub fn deepest_chain(&self, f: usize) -> String {
        let Some(depth) = self.depths() else { return format!("@{}", self.names[f]) };
        let mut chain = vec![f];
        let mut v = f;
        while let Some(&(w, _)) = self.callees[v].iter().max_by_key(|&&(w, _)| depth[w]) {
            chain.push(w);
            v = w;
        }
        let names: Vec<String> = chain.iter().map(|&i| format!("@{}", self.names[i])).collect();
        if names.len() > 8 {
            format!("{} -> ... -> {}", names[..4].join(" -> "), names[names.len() - 2..].join(" -> "))
        } else {
            names.join(" -> ")
        }
    }

    /// The name of function `i`.
    pub fn name(&self, i: usize) -> &str {
        &self.names[i]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::parse_module;

    fn chain(n: usize, calls: usize) -> String {
        let mut s = String::new();
        for i in 0..n {
            s += &format!("func @f{i}(%x: f32[2]) -> (f32[2]) {{\n");
            let mut prev = "%x".to_string();
            for c in 0..calls {
                s += &format!("  %c{c} = call @f{}({prev})\n", i + 1);
                prev = format!("%c{c}");
            }
            s += &format!("  return {prev}\n}}\n");
        }
        s + &format!("func @f{n}(%x: f32[2]) -> (f32[2]) {{\n  %y = tanh %x\n  return %y\n}}\n")
    }

    #[test]
    fn depths_sizes_and_chains_without_recursion() {
        let m = parse_module(&chain(3, 2)).unwrap();
        let g = CallGraph::new(&m);
        assert_eq!(g.find_cycle(), None);
        assert_eq!(g.depths().unwrap(), vec![3, 2, 1, 0]);
        assert_eq!(g.expanded_sizes().unwrap(), vec![8, 4, 2, 1]);
        assert_eq!(g.heaviest_chain(0), "@f0 -> @f1 (2 calls) -> @f2 (2 calls) -> @f3 (2 calls)");
        assert_eq!(g.deepest_chain(0), "@f0 -> @f1 -> @f2 -> @f3");
        // 100 functions each calling the next twice: 2^100 saturates.
        let m = parse_module(&chain(100, 2)).unwrap();
        assert_eq!(CallGraph::new(&m).expanded_sizes().unwrap()[0], u64::MAX);
        // A chain far deeper than any stack would take recursively.
        let m = parse_module(&chain(50_000, 1)).unwrap();
        let g = CallGraph::new(&m);
        assert_eq!(g.depths().unwrap()[0], 50_000);
        assert_eq!(g.deepest_chain(0), "@f0 -> @f1 -> @f2 -> @f3 -> ... -> @f49999 -> @f50000");
    }

    #[test]
    fn finds_a_cycle() {
        let text = "func @a(%x: f32[2]) -> (f32[2]) {\n  %y = call @b(%x)\n  return %y\n}\n\
                    func @b(%x: f32[2]) -> (f32[2]) {\n  %y = call @a(%x)\n  return %y\n}\n";
        let m = parse_module(text).unwrap();
        let g = CallGraph::new(&m);
        assert_eq!(g.find_cycle(), Some(vec![0, 1, 0]));
        assert_eq!(g.depths(), None);
    }
}

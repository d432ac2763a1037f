//! Replaying the chosen plan to record what it does.

use super::super::persist::PArray;
use super::ctx::Ctx;
use super::state::{State, MASK};
use super::Extraction;

/// Re-runs the chosen plan from the start to record what it does.
pub(super) fn replay(
    cx: &mut Ctx<'_>,
    last: &State,
    exact: bool,
    max_states: usize,
    truncated_steps: usize,
) -> Extraction {
    let n = cx.s.inst_value.len();
    let mut path = Vec::new();
    let mut t = last.trace.clone();
    while let Some(node) = t {
        path.push((node.opt as usize, node.combo as usize));
        t = node.prev.clone();
    }
    path.reverse();
    let steps: Vec<usize> = (0..=n)
        .filter(|&k| k == n || !cx.s.deferred[cx.s.inst_value[k] as usize] || !cx.s.first_used_at[k].is_empty())
        .collect();
    assert_eq!(steps.len(), path.len(), "the trace covers every decided step");
    let mut st = State {
        cost: 0.0,
        fut: 0.0,
        peak: 0.0,
        live: 0.0,
        hash: 0,
        mats: PArray::new(cx.p.classes.len()),
        homes: PArray::new(cx.s.param_value.len()),
        trace: None,
    };
    let mut out = Extraction {
        options: vec![None; n],
        homes: vec![None; cx.s.param_value.len()],
        mats: Vec::new(),
        result_classes: Vec::new(),
        held: Vec::new(),
        cost: 0.0,
        peak: 0.0,
        exact,
        max_states,
        truncated_steps,
    };
    // Open holding intervals: (value, class) -> first step.
    let mut open: std::collections::BTreeMap<(u32, u8), usize> = std::collections::BTreeMap::new();
    for (&step, &(oi, combo)) in steps.iter().zip(&path) {
        let opt = if step == n { None } else { Some(&cx.p.options[step][oi]) };
        let (next, rec) = cx.apply(&st, step, opt, oi, combo);
        out.mats.extend(rec.made.iter().cloned());
        for &(p, ci) in &rec.homes {
            out.homes[p] = Some(ci);
        }
        if step == n {
            out.result_classes = rec.result_classes.clone();
        } else {
            out.options[step] = Some(oi);
        }
        for &(v, w) in &rec.during {
            for c in (0..58u8).filter(|c| w & MASK & (1 << c) != 0) {
                open.entry((v, c)).or_insert(step);
            }
        }
        let mut after: std::collections::BTreeMap<u32, u64> = std::collections::BTreeMap::new();
        for &(v, w) in &rec.mats {
            after.insert(v, w & MASK);
        }
        for (&v, &m) in &after {
            let gone: Vec<(u32, u8)> =
                open.range((v, 0)..=(v, u8::MAX)).map(|(&k, _)| k).filter(|k| m & (1 << k.1) == 0).collect();
            for k in gone {
                let start = open.remove(&k).expect("open interval");
                out.held.push((k.0, k.1, start, step));
            }
        }
        st = next;
    }
    for ((v, c), start) in open {
        out.held.push((v, c, start, n));
    }
    out.held.sort_unstable();
    out.cost = st.cost;
    out.peak = st.peak;
    out
}

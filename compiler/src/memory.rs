//! Static memory estimates.
//!
//! [`peak_live_bytes`] assumes the sequential schedule given by the
//! instruction order: a value occupies its bytes from its definition to its
//! last use (parameters from the start; results until the end). It is the
//! number that rematerialisation lowers and that the partitioner reports per
//! device.

use weft_ir::Function;

/// Live-byte statistics of a function under its sequential schedule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LiveBytes {
    /// The largest total size of simultaneously live values.
    pub peak: usize,
    /// The instruction index after which the peak occurs (`None`: at entry).
    pub peak_at: Option<usize>,
    /// Bytes of the parameters.
    pub params: usize,
}

/// Peak live bytes of `f` under its sequential schedule.
pub fn peak_live_bytes(f: &Function) -> LiveBytes {
    let n = f.values.len();
    let end = f.insts.len();
    // last_use[v] = index of the last instruction using v (end for results).
    let mut last_use = vec![None::<usize>; n];
    for (i, inst) in f.insts.iter().enumerate() {
        for o in &inst.operands {
            last_use[o.index()] = Some(i);
        }
    }
    for r in &f.results {
        last_use[r.index()] = Some(end);
    }
    let mut freed_at: Vec<Vec<usize>> = vec![Vec::new(); end + 1];
    let params: usize = f.params.iter().map(|p| f.ty(*p).size_bytes()).sum();
    let mut live = params;
    for &p in &f.params {
        if let Some(u) = last_use[p.index()] {
            freed_at[u].push(p.index());
        } else {
            live -= f.ty(p).size_bytes();
        }
    }
    let mut peak = LiveBytes { peak: live, peak_at: None, params };
    for (i, inst) in f.insts.iter().enumerate() {
        for &r in &inst.results {
            live += f.ty(r).size_bytes();
            match last_use[r.index()] {
                Some(u) => freed_at[u].push(r.index()),
                None => freed_at[i].push(r.index()),
            }
        }
        if live > peak.peak {
            peak.peak = live;
            peak.peak_at = Some(i);
        }
        for &v in &freed_at[i] {
            live -= f.values[v].ty.size_bytes();
        }
    }
    peak
}

//! Per-op sharding rules, as data, in Shardy's factor notation.
//!
//! Every op is described by one [`OpRule`]: a list of *factors* (the index
//! spaces the op iterates over, each with a size and a [`FactorKind`]) and,
//! for every operand and result dimension, the factors it is made of (major
//! to minor). Sharding a factor over some axes is the same thing in every
//! tensor that has it, which is what makes propagation (move the factor's
//! axes from one tensor to another) and the local-computability check (all
//! tensors agree on every factor) one generic algorithm instead of one per
//! op. `dot_general` on `[m,k] x [k,n]` is `([i, k], [k, j])->([i, j])
//! {i=m, j=n, k=k} reduction={k}`; `specs/sharding.md` has the whole table.
//!
//! Choices made here (and documented in the spec):
//! - Reduced dimensions of `reduce_sum` and contracting dimensions of
//!   `dot_general` are *reduction* factors: sharding them leaves the result
//!   unreduced (a pending sum) over their axes. `reduce_max`/`reduce_min`
//!   reduce with a non-sum combiner, which `unreduced` cannot express, so
//!   their reduced dimensions are *combined reduction* factors: sharding one
//!   reduces locally and all-reduces the (small) result with `max`/`min`
//!   over its axes as part of the instruction, as JAX does; the result is
//!   complete (never unreduced).
//! - Dimensions whose extent changes (sliced, padded, concatenated) need
//!   replication unless the slice/pad is the identity on that dimension;
//!   their factor's size is the result's extent.
//! - A `broadcast_in_dim` operand dimension of extent 1 that is expanded has
//!   its own size-1 factor; the expanded result dimension has a factor of
//!   its own that only the result has (any sharding of it is computed
//!   locally, as for `iota` and `constant`).
//! - `reshape` is factorised as in Shardy (see `reshape_factors`); parts
//!   of dimensions that cannot be matched need replication.
//! - `call` has no rule: calls are inlined before propagation.

use std::fmt;
use weft_ir::{IndexOp, Op, ReduceOp, TensorType};

/// How a factor behaves when it is sharded.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum FactorKind {
    /// Every tensor that has it must be sharded the same way on it; no
    /// communication is needed then.
    PassThrough,
    /// Appears in operands only and is summed over: sharding it leaves the
    /// result unreduced over its axes.
    Reduction,
    /// Must not be sharded (each result element needs the whole extent).
    NeedReplication,
    /// Appears in operands only and is combined with `max` or `min`:
    /// sharding it computes the local reduction, then all-reduces the
    /// result with the same op over its axes (part of the instruction's
    /// lowering); the result is not unreduced.
    CombinedReduction,
}

/// One factor of a rule.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct Factor {
    /// Its size (the extent of the index space).
    pub size: usize,
    /// How it behaves when sharded.
    pub kind: FactorKind,
}

/// The factors of each dimension of one tensor, major to minor.
pub type TensorFactors = Vec<Vec<usize>>;

/// What kind of instruction a rule describes, beyond its factors.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum RuleKind {
    /// Computes its result from its operands.
    Compute,
    /// `sharding_constraint`: an identity whose result sharding (including
    /// unreduced axes) must equal its operand's.
    Identity,
    /// `reshard`: the one instruction that communicates; its operand may be
    /// sharded any way. Propagation does not cross it.
    Reshard,
}

/// The sharding rule of one instruction.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct OpRule {
    /// All factors, numbered by position.
    pub factors: Vec<Factor>,
    /// For each operand, the factors of each dimension.
    pub operands: Vec<TensorFactors>,
    /// For each result, the factors of each dimension.
    pub results: Vec<TensorFactors>,
    /// Compute, identity or reshard.
    pub kind: RuleKind,
}

impl OpRule {
    /// The factors of tensor `t`, counting operands first, then results.
    pub fn tensor(&self, t: usize) -> &TensorFactors {
        if t < self.operands.len() {
            &self.operands[t]
        } else {
            &self.results[t - self.operands.len()]
        }
    }

    /// Number of tensors (operands and results).
    pub fn num_tensors(&self) -> usize {
        self.operands.len() + self.results.len()
    }

    /// Whether factor `f` appears in any result.
    pub fn in_result(&self, f: usize) -> bool {
        self.results.iter().flatten().flatten().any(|&g| g == f)
    }

    /// The (tensor, dimension) pairs that contain factor `f`.
    pub fn occurrences(&self, f: usize) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        for t in 0..self.num_tensors() {
            for (d, fs) in self.tensor(t).iter().enumerate() {
                if fs.contains(&f) {
                    out.push((t, d));
                }
            }
        }
        out
    }
}

struct Builder {
    factors: Vec<Factor>,
}

impl Builder {
    fn factor(&mut self, size: usize, kind: FactorKind) -> usize {
        self.factors.push(Factor { size, kind });
        self.factors.len() - 1
    }

    /// One pass-through factor per dimension of `shape`.
    fn per_dim(&mut self, shape: &[usize]) -> TensorFactors {
        shape.iter().map(|&n| vec![self.factor(n, FactorKind::PassThrough)]).collect()
    }
}

/// The rule for `op` applied to operands of types `operands` giving results
/// of types `results` (a verified instruction). `None` for `call`, which is
/// inlined before propagation.
pub fn rule_for(op: &Op, operands: &[&TensorType], results: &[&TensorType]) -> Option<OpRule> {
    use FactorKind::*;
    let mut b = Builder { factors: Vec::new() };
    let out = results.first().map(|t| t.shape.as_slice()).unwrap_or(&[]);
    let mut kind = RuleKind::Compute;
    let (ops, res): (Vec<TensorFactors>, TensorFactors) = match op {
        Op::Call { .. } => return None,
        Op::Constant(_) | Op::Iota { .. } => (vec![], b.per_dim(out)),
        Op::Unary(_) | Op::Binary(_) | Op::Compare(_) | Op::Convert { .. } | Op::Select => {
            let f = b.per_dim(out);
            let ops = operands.iter().map(|t| if t.rank() == 0 { vec![] } else { f.clone() }).collect();
            (ops, f)
        }
        Op::ShardingConstraint { .. } | Op::Reshard { .. } => {
            kind = if matches!(op, Op::Reshard { .. }) { RuleKind::Reshard } else { RuleKind::Identity };
            let f = b.per_dim(out);
            (vec![f.clone()], f)
        }
        Op::BroadcastInDim { dims, shape } => {
            let mut res: TensorFactors = vec![vec![]; shape.len()];
            let mut opf = vec![vec![]; dims.len()];
            for (r, slot) in res.iter_mut().enumerate() {
                let f = b.factor(shape[r], PassThrough);
                slot.push(f);
                if let Some(i) = dims.iter().position(|&d| d == r) {
                    opf[i] =
                        if operands[0].shape[i] == shape[r] { vec![f] } else { vec![b.factor(1, NeedReplication)] };
                }
            }
            (vec![opf], res)
        }
        Op::Reshape { shape } => {
            let (i, o) = reshape_factors(&operands[0].shape, shape, &mut b);
            (vec![i], o)
        }
        Op::Transpose { perm } => {
            let f = b.per_dim(&operands[0].shape);
            let res = perm.iter().map(|&p| f[p].clone()).collect();
            (vec![f], res)
        }
        Op::Slice { start, limit, stride } => {
            let t = operands[0];
            let f: TensorFactors = (0..t.rank())
                .map(|d| {
                    let full = start[d] == 0 && limit[d] == t.shape[d] && stride[d] == 1;
                    vec![b.factor(out[d], if full { PassThrough } else { NeedReplication })]
                })
                .collect();
            (vec![f.clone()], f)
        }
        Op::Concatenate { dim } => {
            let f: TensorFactors = (0..out.len())
                .map(|d| vec![b.factor(out[d], if d == *dim { NeedReplication } else { PassThrough })])
                .collect();
            (vec![f.clone(); operands.len()], f)
        }
        Op::Pad { low, high, interior } => {
            let f: TensorFactors = (0..out.len())
                .map(|d| {
                    let same = low[d] == 0 && high[d] == 0 && interior[d] == 0;
                    vec![b.factor(out[d], if same { PassThrough } else { NeedReplication })]
                })
                .collect();
            (vec![f.clone(), vec![]], f)
        }
        Op::DotGeneral(dd) => {
            let (l, r) = (operands[0], operands[1]);
            let mut lf: TensorFactors = vec![vec![]; l.rank()];
            let mut rf: TensorFactors = vec![vec![]; r.rank()];
            let mut res = Vec::new();
            for (&a, &c) in dd.lhs_batch.iter().zip(&dd.rhs_batch) {
                let f = b.factor(l.shape[a], PassThrough);
                (lf[a], rf[c]) = (vec![f], vec![f]);
                res.push(vec![f]);
            }
            for (side, t, batch, contract) in
                [(&mut lf, l, &dd.lhs_batch, &dd.lhs_contract), (&mut rf, r, &dd.rhs_batch, &dd.rhs_contract)]
            {
                for d in (0..t.rank()).filter(|d| !batch.contains(d) && !contract.contains(d)) {
                    let f = b.factor(t.shape[d], PassThrough);
                    side[d] = vec![f];
                    res.push(vec![f]);
                }
            }
            for (&a, &c) in dd.lhs_contract.iter().zip(&dd.rhs_contract) {
                let f = b.factor(l.shape[a], Reduction);
                (lf[a], rf[c]) = (vec![f], vec![f]);
            }
            (vec![lf, rf], res)
        }
        Op::Index(i) => index_rule(i, operands, out, &mut b),
        Op::Reduce { op: rop, dims } => {
            let reduced = if *rop == ReduceOp::Sum { Reduction } else { CombinedReduction };
            let t = operands[0];
            let f: TensorFactors = (0..t.rank())
                .map(|d| vec![b.factor(t.shape[d], if dims.contains(&d) { reduced } else { PassThrough })])
                .collect();
            let res = (0..t.rank()).filter(|d| !dims.contains(d)).map(|d| f[d].clone()).collect();
            (vec![f], res)
        }
    };
    Some(OpRule { factors: b.factors, operands: ops, results: vec![res], kind })
}

/// The indexing ops' factors.
/// - `gather`: the paired batch dimensions and the dimensions before the
///   axis pass through; the gathered axis is a *reduction* factor of the
///   operand alone (a device holding a block of rows gathers the indices
///   that fall in it, shifted to its block, and reads zeros for the rest:
///   the partial results sum to the gather, which is Megatron's
///   vocabulary-parallel embedding); the indices' own dimensions and the
///   trailing dimensions pass through to the result.
/// - `scatter_add`: the transpose: the result's axis is a factor of the
///   result alone (each device adds the indices that fall in its block),
///   and the indices' own dimensions are reduction factors of the indices
///   and updates (a batch split of the tokens leaves per-device partial
///   sums, the data-parallel gradient of an embedding).
/// - `cumsum` needs its dimension whole; `top_k` its last dimension (and
///   its `k` positions are a factor of the result alone, also whole).
fn index_rule(
    op: &IndexOp,
    operands: &[&TensorType],
    out: &[usize],
    b: &mut Builder,
) -> (Vec<TensorFactors>, TensorFactors) {
    use FactorKind::*;
    // One factor per dimension of `shape`, of kind `kind(d)`.
    let dims = |b: &mut Builder, shape: &[usize], kind: &dyn Fn(usize) -> FactorKind| -> TensorFactors {
        shape.iter().enumerate().map(|(d, &n)| vec![b.factor(n, kind(d))]).collect()
    };
    match *op {
        IndexOp::Gather { axis, batch_dims } => {
            let (x, idx) = (operands[0], operands[1]);
            // Numbered batch, the indices' own, then the operand's other
            // dimensions (the order `specs/sharding.md` shows).
            let batch = dims(b, &x.shape[..batch_dims], &|_| PassThrough);
            let own = dims(b, &idx.shape[batch_dims..], &|_| PassThrough);
            let rest =
                dims(b, &x.shape[batch_dims..], &|d| if d + batch_dims == axis { Reduction } else { PassThrough });
            let xf = [&batch[..], &rest[..]].concat();
            let idxf = [&batch[..], &own[..]].concat();
            let res = [&xf[..axis], &own[..], &xf[axis + 1..]].concat();
            (vec![xf, idxf], res)
        }
        IndexOp::ScatterAdd { axis, batch_dims, .. } => {
            let idx = operands[0];
            let res = dims(b, out, &|_| PassThrough);
            let own = dims(b, &idx.shape[batch_dims..], &|_| Reduction);
            let idxf = [&res[..batch_dims], &own[..]].concat();
            let updf = [&res[..axis], &own[..], &res[axis + 1..]].concat();
            (vec![idxf, updf], res)
        }
        IndexOp::Cumsum { dim, .. } => {
            let f = dims(b, out, &|d| if d == dim { NeedReplication } else { PassThrough });
            (vec![f.clone()], f)
        }
        IndexOp::TopK { k } => {
            let x = operands[0];
            let last = x.rank() - 1;
            let xf = dims(b, &x.shape, &|d| if d == last { NeedReplication } else { PassThrough });
            let res = [&xf[..last], &[vec![b.factor(k, NeedReplication)]][..]].concat();
            (vec![xf], res)
        }
    }
}

/// Factorises a row-major reshape from `inp` to `out`, as Shardy does: walk
/// both shapes from the major end; where the current extents are equal or
/// one divides the other, the common part is a factor shared by both
/// dimensions (a `[6] -> [2, 3]` reshape has factors 2 and 3, the operand
/// dimension being `[ij]`); where they share a divisor `g`, the major `g`
/// is shared; where the remaining parts are coprime, every dimension part up
/// to the next point where the cumulative extents agree gets its own
/// need-replication factor. Extent-1 dimensions get their own size-1 factor.
fn reshape_factors(inp: &[usize], out: &[usize], b: &mut Builder) -> (TensorFactors, TensorFactors) {
    use FactorKind::*;
    let mut fi: TensorFactors = vec![vec![]; inp.len()];
    let mut fo: TensorFactors = vec![vec![]; out.len()];
    if inp.contains(&0) || out.contains(&0) {
        for (d, &n) in inp.iter().enumerate() {
            fi[d].push(b.factor(n, NeedReplication));
        }
        for (d, &n) in out.iter().enumerate() {
            fo[d].push(b.factor(n, NeedReplication));
        }
        return (fi, fo);
    }
    // (dimension index, remaining extent) cursors.
    let (mut i, mut ri, mut o, mut ro) = (0, 0, 0, 0);
    loop {
        // Load the next dimension when the current one is used up; extent-1
        // dimensions get a size-1 factor of their own.
        while ri <= 1 && i < inp.len() {
            if ri == 0 {
                ri = inp[i];
                if ri == 1 {
                    fi[i].push(b.factor(1, PassThrough));
                }
            }
            if ri == 1 {
                i += 1;
                ri = 0;
            }
        }
        while ro <= 1 && o < out.len() {
            if ro == 0 {
                ro = out[o];
                if ro == 1 {
                    fo[o].push(b.factor(1, PassThrough));
                }
            }
            if ro == 1 {
                o += 1;
                ro = 0;
            }
        }
        if i >= inp.len() || o >= out.len() {
            break;
        }
        let g = if ri % ro == 0 {
            ro
        } else if ro % ri == 0 {
            ri
        } else {
            gcd(ri, ro)
        };
        if g > 1 {
            let f = b.factor(g, PassThrough);
            fi[i].push(f);
            fo[o].push(f);
            ri /= g;
            ro /= g;
            continue;
        }
        // Coprime remainders: tangled until the cumulative extents agree.
        fi[i].push(b.factor(ri, NeedReplication));
        fo[o].push(b.factor(ro, NeedReplication));
        let (mut ci, mut co) = (ri, ro);
        (i, ri, o, ro) = (i + 1, 0, o + 1, 0);
        while ci != co {
            if ci < co && i < inp.len() {
                fi[i].push(b.factor(inp[i], NeedReplication));
                ci *= inp[i];
                i += 1;
            } else if o < out.len() {
                fo[o].push(b.factor(out[o], NeedReplication));
                co *= out[o];
                o += 1;
            } else {
                break;
            }
        }
    }
    (fi, fo)
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// Shardy's name for factor number `i`: `i`, `j`, ..., `z`, `z_1`, `z_2`, ...
pub fn factor_name(i: usize) -> String {
    if i < 18 {
        char::from(b'i' + i as u8).to_string()
    } else {
        format!("z_{}", i - 17)
    }
}

fn write_tensors(f: &mut fmt::Formatter<'_>, ts: &[TensorFactors]) -> fmt::Result {
    f.write_str("(")?;
    for (k, t) in ts.iter().enumerate() {
        if k > 0 {
            f.write_str(", ")?;
        }
        let dims: Vec<String> = t.iter().map(|fs| fs.iter().map(|&x| factor_name(x)).collect::<String>()).collect();
        write!(f, "[{}]", dims.join(", "))?;
    }
    f.write_str(")")
}

impl fmt::Display for OpRule {
    /// Shardy notation: `([i, k], [k, j])->([i, j]) {i=8, j=8, k=2}
    /// reduction={k}`, plus `combined_reduction={..}` and
    /// `need_replication={..}` when any.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_tensors(f, &self.operands)?;
        f.write_str("->")?;
        write_tensors(f, &self.results)?;
        let sizes: Vec<String> =
            self.factors.iter().enumerate().map(|(i, x)| format!("{}={}", factor_name(i), x.size)).collect();
        if !sizes.is_empty() {
            write!(f, " {{{}}}", sizes.join(", "))?;
        }
        for (kind, label) in [
            (FactorKind::Reduction, "reduction"),
            (FactorKind::CombinedReduction, "combined_reduction"),
            (FactorKind::NeedReplication, "need_replication"),
        ] {
            let names: Vec<String> =
                (0..self.factors.len()).filter(|&i| self.factors[i].kind == kind).map(factor_name).collect();
            if !names.is_empty() {
                write!(f, " {label}={{{}}}", names.join(", "))?;
            }
        }
        Ok(())
    }
}

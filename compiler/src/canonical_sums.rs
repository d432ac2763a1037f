//! Mesh-invariant sums: every float sum in one order that does not depend
//! on the mesh.
//!
//! Why: a sum over a dimension that is split over P devices runs as P local
//! sums folded in rank order, and float addition is not associative, so the
//! same program gives other bits on another mesh (about 1e-7 relative per
//! sum, growing over steps). Reproducible research wants the mesh to be an
//! implementation detail: `data=8`, `data=2,model=4` and one device should
//! print the same losses.
//!
//! [`canonical_sums`] rewrites every float `reduce` with `sum` and every
//! float `dot_general` so that a summed dimension of size `n` is cut into
//! `c = gcd(n, C)` chunks of `n / c` elements (`C`: a power of two,
//! [`SumChunks`]) — every summed dimension of a `reduce` (a weight's
//! `sum(g * g)` is split on its minor dimension under TP, on its major one
//! under FSDP), and the major contracting dimension of a `dot_general` (the
//! one with the smallest lhs index: the batch of a weight gradient, the
//! heads or hidden units of a Megatron contraction; chunking them all would
//! multiply the partial results), or, where that one gives a single chunk,
//! the major one of those that give the most (so a contraction over a
//! GPT's `[3, C]` of q, k and v chunks `C`):
//!
//! - the chunks are summed by one op (a `reduce` over the chunk's elements,
//!   or a `dot_general` with the chunks as a new leading batch dimension),
//!   in the kernel's own fixed order: the same chunk, same length, on
//!   every mesh;
//! - the `c` partial sums are added in a perfect binary tree, level by
//!   level: `reshape [k] -> [k/2, 2]`, then a sum over the pairs. A sum of
//!   two numbers is one addition, `a + b`, whichever device computes it.
//!
//! A `reduce` over several dimensions becomes one such chunked sum per
//! dimension, the minor one first. A `scatter_add` whose indices follow its
//! batch dimensions directly (an embedding's gradient) chunks the major
//! index dimension the same way: one partial result per chunk, added as a
//! tree.
//!
//! A mesh that splits the summed dimension over P devices (P a power of
//! two dividing `c`) gives each device whole subtrees; propagation moves
//! the last levels' operands between devices (a reshard) instead of
//! folding partial sums. So the result is bitwise the same on every such
//! mesh and on one device. What it does not cover: a split of a
//! contracting dimension other than the chunked one (for example sequence
//! parallelism of a `[batch, seq]` contraction), or a shard count that
//! does not divide `c`; those sums are still correct, only not bitwise
//! mesh-invariant.
//!
//! The price is paid on every mesh, one device included: `c` partial
//! results (a `dot_general`'s output is `c` times larger before the tree)
//! and shorter contractions. Off by default.

use crate::error::{CompilerError, Result};
use crate::inline::InlinedFunction;
use std::collections::HashMap;
use weft_ir::{infer, DotDims, Function, IndexOp, Inst, Module, NoFunctions, Op, ReduceOp, TensorType, ValueId};

/// The chunk count `C` of [`canonical_sums`]: a power of two, at least 2.
/// Every shard count of a summed dimension that should give the same bits
/// must divide `gcd(n, C)`; 8 covers meshes of up to 8 devices.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct SumChunks(usize);

impl SumChunks {
    /// The default, 8.
    pub const DEFAULT: SumChunks = SumChunks(8);

    /// `chunks` if it is a power of two of at least 2.
    pub fn new(chunks: usize) -> Result<SumChunks> {
        if chunks < 2 || !chunks.is_power_of_two() {
            return Err(CompilerError::InvalidSumChunks { chunks });
        }
        Ok(SumChunks(chunks))
    }

    /// The chunk count.
    pub fn get(self) -> usize {
        self.0
    }
}

impl Default for SumChunks {
    fn default() -> SumChunks {
        SumChunks::DEFAULT
    }
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// `f` with every float sum in the canonical chunked, tree-added order (see
/// the module docs). Values keep their names; a rewritten sum's result keeps
/// its sharding annotation.
pub fn canonical_sums(f: &InlinedFunction, chunks: SumChunks) -> Result<InlinedFunction> {
    let f = f.function();
    let mut g = Rewriter { g: Function::new(f.name.clone()), chunks: chunks.get() };
    let mut map: HashMap<ValueId, ValueId> = HashMap::new();
    for &p in &f.params {
        let v = f.value(p);
        let np = g.g.add_param(v.name.clone(), v.ty.clone());
        g.g.values[np.index()].sharding = v.sharding.clone();
        map.insert(p, np);
    }
    for inst in &f.insts {
        let operands: Vec<ValueId> = inst.operands.iter().map(|o| map[o]).collect();
        let results = match g.rewrite(inst, &operands)? {
            Some(v) => vec![v],
            None => {
                let tys: Vec<TensorType> = inst.results.iter().map(|&r| f.ty(r).clone()).collect();
                let id =
                    g.g.add_inst(inst.op.clone(), operands, tys.into_iter().map(|t| (t, None)).collect(), inst.loc);
                g.g.insts[id.index()].results.clone()
            }
        };
        for (&old, new) in inst.results.iter().zip(results) {
            let (name, sharding) = (f.value(old).name.clone(), f.value(old).sharding.clone());
            g.g.values[new.index()].name = name;
            g.g.values[new.index()].sharding = sharding;
            map.insert(old, new);
        }
    }
    g.g.results = f.results.iter().map(|r| map[r]).collect();
    g.g.result_shardings = f.result_shardings.clone();
    InlinedFunction::new(g.g)
}

struct Rewriter {
    g: Function,
    chunks: usize,
}

impl Rewriter {
    /// Appends `op` on `operands`; its one result.
    fn emit(&mut self, op: Op, operands: Vec<ValueId>, loc: Option<weft_ir::Loc>) -> Result<ValueId> {
        let tys: Vec<TensorType> = operands.iter().map(|&o| self.g.ty(o).clone()).collect();
        let refs: Vec<&TensorType> = tys.iter().collect();
        let ty = infer(&op, &refs, &NoFunctions)
            .map_err(|message| CompilerError::Internal { stage: "canonical_sums".into(), message })?
            .remove(0);
        let id = self.g.add_inst(op, operands, vec![(ty, None)], loc);
        Ok(self.g.insts[id.index()].results[0])
    }

    /// `x` with dimension `d` (size `n`) cut into `[c, n / c]`.
    fn split(&mut self, x: ValueId, d: usize, c: usize, loc: Option<weft_ir::Loc>) -> Result<ValueId> {
        let mut shape = self.g.ty(x).shape.to_vec();
        let n = shape[d];
        shape.splice(d..=d, [c, n / c]);
        self.emit(Op::Reshape { shape }, vec![x], loc)
    }

    /// The plain sum of `x` over dimension `d`.
    fn sum(&mut self, x: ValueId, d: usize, loc: Option<weft_ir::Loc>) -> Result<ValueId> {
        self.emit(Op::Reduce { op: ReduceOp::Sum, dims: vec![d] }, vec![x], loc)
    }

    /// The sum over dimension `d` (a power of two `k`) of `x`, as a tree.
    fn tree(&mut self, mut x: ValueId, d: usize, loc: Option<weft_ir::Loc>) -> Result<ValueId> {
        while self.g.ty(x).shape[d] > 2 {
            let k = self.g.ty(x).shape[d];
            let pairs = self.split(x, d, k / 2, loc)?;
            x = self.sum(pairs, d + 1, loc)?;
        }
        self.sum(x, d, loc)
    }

    /// The chunk count for a summed dimension of size `n` (1: leave it).
    fn count(&self, n: usize) -> usize {
        gcd(n, self.chunks)
    }

    /// The canonical form of `inst`'s one result, or `None` to copy it.
    fn rewrite(&mut self, inst: &Inst, operands: &[ValueId]) -> Result<Option<ValueId>> {
        match &inst.op {
            Op::Reduce { op: ReduceOp::Sum, dims } if self.g.ty(operands[0]).dtype.is_float() => {
                // Every summed dimension is chunked (a weight's `sum(g * g)`
                // is split over `model` on its minor dimension under TP and
                // over `data` on its major one under FSDP), one dimension at
                // a time, minor first: each step sums one run of consecutive
                // dimensions, which kernels do without rearranging.
                let shape = self.g.ty(operands[0]).shape.clone();
                if dims.iter().all(|&d| self.count(shape[d]) < 2) {
                    return Ok(None);
                }
                let mut x = operands[0];
                for &d in dims.iter().rev() {
                    let c = self.count(shape[d]);
                    x = if c < 2 {
                        self.sum(x, d, inst.loc)?
                    } else {
                        let split = self.split(x, d, c, inst.loc)?;
                        let partial = self.sum(split, d + 1, inst.loc)?;
                        self.tree(partial, d, inst.loc)?
                    };
                }
                Ok(Some(x))
            }
            Op::DotGeneral(dims) if self.g.ty(operands[0]).dtype.is_float() => {
                // The major contracting dimension, unless it makes one
                // chunk: then the major one of those with the most chunks
                // (a `[.., 3, C]` contraction of q, k and v chunks `C`,
                // which tensor parallelism splits, not the 3).
                let shape = &self.g.ty(operands[0]).shape;
                let chunks = |j: usize| self.count(shape[dims.lhs_contract[j]]);
                let Some(major) = (0..dims.lhs_contract.len()).min_by_key(|&j| dims.lhs_contract[j]) else {
                    return Ok(None);
                };
                let j = if chunks(major) > 1 {
                    major
                } else {
                    (0..dims.lhs_contract.len())
                        .max_by_key(|&j| (chunks(j), std::cmp::Reverse(dims.lhs_contract[j])))
                        .unwrap_or(major)
                };
                let (a, b) = (dims.lhs_contract[j], dims.rhs_contract[j]);
                let c = chunks(j);
                if c < 2 {
                    return Ok(None);
                }
                let lhs = self.split(operands[0], a, c, inst.loc)?;
                let rhs = self.split(operands[1], b, c, inst.loc)?;
                // Old dims after the split one move up by one.
                let shift = |at: usize| move |&d: &usize| if d >= at { d + 1 } else { d };
                let chunked = DotDims {
                    lhs_batch: std::iter::once(a).chain(dims.lhs_batch.iter().map(shift(a))).collect(),
                    rhs_batch: std::iter::once(b).chain(dims.rhs_batch.iter().map(shift(b))).collect(),
                    lhs_contract: dims.lhs_contract.iter().map(shift(a)).collect(),
                    rhs_contract: dims.rhs_contract.iter().map(shift(b)).collect(),
                };
                let partial = self.emit(Op::DotGeneral(chunked), vec![lhs, rhs], inst.loc)?;
                self.tree(partial, 0, inst.loc).map(Some)
            }
            Op::Index(IndexOp::ScatterAdd { axis, batch_dims, size })
                if self.g.ty(operands[1]).dtype.is_float()
                    && axis == batch_dims
                    && self.g.ty(operands[0]).rank() > *batch_dims =>
            {
                // An embedding's gradient sums the updates of every token
                // with the same id: chunk the major token dimension, which
                // then is a batch dimension of the scatter (one partial
                // table per chunk), and add the partial tables as a tree.
                let b = *batch_dims;
                let c = self.count(self.g.ty(operands[0]).shape[b]);
                if c < 2 {
                    return Ok(None);
                }
                let idx = self.split(operands[0], b, c, inst.loc)?;
                let upd = self.split(operands[1], b, c, inst.loc)?;
                let chunked = IndexOp::ScatterAdd { axis: b + 1, batch_dims: b + 1, size: *size };
                let partial = self.emit(Op::Index(chunked), vec![idx, upd], inst.loc)?;
                self.tree(partial, b, inst.loc).map(Some)
            }
            _ => Ok(None),
        }
    }
}

/// `m` with function `entry` inlined and put in the mesh-invariant order
/// (the other functions unchanged): for callers that run the function
/// without the pass pipeline too, such as the unsharded interpreter, which
/// must sum in the same order as every mesh.
pub fn canonical_sums_in(m: &Module, entry: &str, chunks: SumChunks) -> Result<Module> {
    let f = canonical_sums(&crate::inline::inline(m, entry)?, chunks)?;
    let mut out = m.clone();
    if let Some(slot) = out.function_mut(entry) {
        *slot = f.function().clone();
    }
    Ok(out)
}

//! Result-type inference: one `match` over [`Op`].
//!
//! [`infer`] checks an op's attributes against its operand types and returns
//! the result types, or a message saying what is wrong. The verifier, the
//! builder and the parser all use it, so the rules live in one place and
//! `specs/ir.md` mirrors them.

use crate::{DType, DotDims, Literal, LiteralData, Op, Signature, TensorType};
use std::collections::HashSet;

/// Looks up a callee's signature by name (for `call`).
pub trait SignatureLookup {
    /// The signature of function `name`, if it exists.
    fn signature_of(&self, name: &str) -> Option<Signature>;
}

impl SignatureLookup for crate::Module {
    fn signature_of(&self, name: &str) -> Option<Signature> {
        self.signature(name)
    }
}

/// A module's functions by name, indexed once: lookups in constant time
/// (the first definition of a name wins, as [`crate::Module::function`]).
pub struct ModuleIndex<'a> {
    module: &'a crate::Module,
    by_name: std::collections::HashMap<&'a str, usize>,
}

impl<'a> ModuleIndex<'a> {
    /// Indexes `module`'s functions.
    pub fn new(module: &'a crate::Module) -> ModuleIndex<'a> {
        let mut by_name = std::collections::HashMap::with_capacity(module.functions.len());
        for (i, f) in module.functions.iter().enumerate() {
            by_name.entry(f.name.as_str()).or_insert(i);
        }
        ModuleIndex { module, by_name }
    }
}

impl SignatureLookup for ModuleIndex<'_> {
    fn signature_of(&self, name: &str) -> Option<Signature> {
        let f = &self.module.functions[*self.by_name.get(name)?];
        Some(Signature { params: f.param_types(), results: f.result_types() })
    }
}

/// A lookup that knows no functions (for inferring ops outside a module).
pub struct NoFunctions;

impl SignatureLookup for NoFunctions {
    fn signature_of(&self, _: &str) -> Option<Signature> {
        None
    }
}

/// Infers the result types of `op` applied to operands of types `operands`.
///
/// The arity must already match (see [`Op::arity`]); a mismatch is reported
/// as an error here too, so callers may rely on this function alone.
pub fn infer(op: &Op, operands: &[&TensorType], funcs: &dyn SignatureLookup) -> Result<Vec<TensorType>, String> {
    if let Some(n) = op.arity() {
        if operands.len() != n {
            return Err(format!("`{}` takes {n} operand{}, got {}", op.name(), plural(n), operands.len()));
        }
    }
    let one = |t: TensorType| Ok(vec![t]);
    match op {
        Op::Constant(lit) => {
            check_literal(lit)?;
            one(lit.ty.clone())
        }
        Op::Iota { dim, ty } => {
            if *dim >= ty.rank() {
                return Err(format!("iota dimension {dim} is out of range for {ty}"));
            }
            if ty.dtype.is_bool() {
                return Err("iota cannot produce bool".into());
            }
            one(ty.clone())
        }
        Op::Unary(u) => {
            let t = operands[0];
            if !u.accepts(t.dtype) {
                return Err(format!("`{}` does not accept {}", u.name(), t.dtype));
            }
            one(t.with_dtype(u.result_dtype(t.dtype)))
        }
        Op::Binary(b) => {
            let (l, r) = (operands[0], operands[1]);
            same_types(op, l, r)?;
            if !b.accepts(l.dtype) {
                return Err(format!("`{}` does not accept {}", b.name(), l.dtype));
            }
            one(l.clone())
        }
        Op::Compare(_) => {
            let (l, r) = (operands[0], operands[1]);
            same_types(op, l, r)?;
            one(l.with_dtype(DType::Bool))
        }
        Op::Select => {
            let (p, t, f) = (operands[0], operands[1], operands[2]);
            if p.dtype != DType::Bool {
                return Err(format!("select predicate must be bool, got {p}"));
            }
            same_types(op, t, f)?;
            if p.rank() != 0 && p.shape != t.shape {
                return Err(format!("select predicate {p} must be a scalar or have the branches' shape {t}"));
            }
            one(t.clone())
        }
        Op::Convert { to } => one(operands[0].with_dtype(*to)),
        Op::BroadcastInDim { dims, shape } => {
            let t = operands[0];
            if dims.len() != t.rank() {
                return Err(format!(
                    "broadcast_in_dim needs one entry in dims per operand dimension ({}), got {}",
                    t.rank(),
                    dims.len()
                ));
            }
            for (i, &d) in dims.iter().enumerate() {
                if d >= shape.len() {
                    return Err(format!("broadcast_in_dim dims[{i}] = {d} is out of range for rank {}", shape.len()));
                }
                if i > 0 && dims[i - 1] >= d {
                    return Err(format!("broadcast_in_dim dims must be strictly increasing, got {dims:?}"));
                }
                if t.shape[i] != 1 && t.shape[i] != shape[d] {
                    return Err(format!(
                        "broadcast_in_dim operand dimension {i} has extent {} but result dimension {d} has {}",
                        t.shape[i], shape[d]
                    ));
                }
            }
            one(TensorType::new(t.dtype, shape.clone()))
        }
        Op::Reshape { shape } => {
            let t = operands[0];
            let count = |s: &[usize]| s.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
            let (Some(n), Some(m)) = (count(shape), count(&t.shape)) else {
                return Err(format!("reshape of {t} to {shape:?}: too many elements"));
            };
            if n != m {
                return Err(format!("reshape of {t} ({m} elements) to {shape:?} ({n} elements)"));
            }
            one(TensorType::new(t.dtype, shape.clone()))
        }
        Op::Transpose { perm } => {
            let t = operands[0];
            check_permutation(perm, t.rank())?;
            one(TensorType::new(t.dtype, perm.iter().map(|&p| t.shape[p]).collect::<Vec<_>>()))
        }
        Op::Slice { start, limit, stride } => {
            let t = operands[0];
            for (what, v) in [("start", start), ("limit", limit), ("stride", stride)] {
                if v.len() != t.rank() {
                    return Err(format!(
                        "slice {what} has {} entries but the operand {t} has rank {}",
                        v.len(),
                        t.rank()
                    ));
                }
            }
            let mut shape = Vec::with_capacity(t.rank());
            for d in 0..t.rank() {
                if stride[d] == 0 {
                    return Err(format!("slice stride in dimension {d} must be at least 1"));
                }
                if start[d] > limit[d] || limit[d] > t.shape[d] {
                    return Err(format!(
                        "slice bounds [{}, {}) in dimension {d} are outside 0..={} of {t}",
                        start[d], limit[d], t.shape[d]
                    ));
                }
                shape.push((limit[d] - start[d]).div_ceil(stride[d]));
            }
            one(TensorType::new(t.dtype, shape))
        }
        Op::Concatenate { dim } => {
            if operands.is_empty() {
                return Err("concatenate needs at least one operand".into());
            }
            let first = operands[0];
            if *dim >= first.rank() {
                return Err(format!("concatenate dimension {dim} is out of range for {first}"));
            }
            let mut shape = first.shape.clone();
            for (i, t) in operands.iter().enumerate().skip(1) {
                if t.dtype != first.dtype || t.rank() != first.rank() {
                    return Err(format!("concatenate operand {i} is {t}, incompatible with operand 0 {first}"));
                }
                for d in 0..t.rank() {
                    if d != *dim && t.shape[d] != first.shape[d] {
                        return Err(format!(
                            "concatenate operand {i} is {t}: dimension {d} must match operand 0 {first}"
                        ));
                    }
                }
                shape[*dim] = shape[*dim]
                    .checked_add(t.shape[*dim])
                    .ok_or_else(|| format!("concatenate dimension {dim} is too large"))?;
            }
            one(TensorType::new(first.dtype, shape))
        }
        Op::Pad { low, high, interior } => {
            let (t, p) = (operands[0], operands[1]);
            if p.rank() != 0 || p.dtype != t.dtype {
                return Err(format!("pad value must be a {} scalar, got {p}", t.dtype));
            }
            for (what, n) in [("low", low.len()), ("high", high.len()), ("interior", interior.len())] {
                if n != t.rank() {
                    return Err(format!("pad {what} has {n} entries but the operand {t} has rank {}", t.rank()));
                }
            }
            let mut shape = Vec::with_capacity(t.rank());
            for d in 0..t.rank() {
                let n = t.shape[d] as i128;
                let too_large = || format!("pad extent in dimension {d} is too large");
                let inner = if n == 0 { Some(0) } else { (n - 1).checked_mul(interior[d] as i128) };
                let e =
                    inner.and_then(|i| i.checked_add(n + low[d] as i128 + high[d] as i128)).ok_or_else(too_large)?;
                if e < 0 {
                    return Err(format!("pad gives a negative extent {e} in dimension {d}"));
                }
                shape.push(usize::try_from(e).map_err(|_| too_large())?);
            }
            one(TensorType::new(t.dtype, shape))
        }
        Op::Index(i) => one(i.infer(operands)?),
        Op::DotGeneral(dims) => infer_dot(dims, operands[0], operands[1]).map(|t| vec![t]),
        Op::Reduce { op: _, dims } => {
            let t = operands[0];
            if t.dtype.is_bool() {
                return Err("reductions do not accept bool".into());
            }
            for (i, &d) in dims.iter().enumerate() {
                if d >= t.rank() {
                    return Err(format!("reduce dimension {d} is out of range for {t}"));
                }
                if i > 0 && dims[i - 1] >= d {
                    return Err(format!("reduce dims must be strictly increasing, got {dims:?}"));
                }
            }
            let shape = (0..t.rank()).filter(|d| !dims.contains(d)).map(|d| t.shape[d]).collect::<Vec<_>>();
            one(TensorType::new(t.dtype, shape))
        }
        Op::ShardingConstraint { sharding: s } | Op::Reshard { to: s } => {
            let t = operands[0];
            if s.rank() != t.rank() {
                return Err(format!(
                    "`{}` has a sharding for rank {} but its operand {t} has rank {}",
                    op.name(),
                    s.rank(),
                    t.rank()
                ));
            }
            one(t.clone())
        }
        Op::Call { callee, .. } => {
            let sig = funcs.signature_of(callee).ok_or_else(|| format!("call to unknown function @{callee}"))?;
            if sig.params.len() != operands.len() {
                return Err(format!(
                    "@{callee} takes {} argument{}, got {}",
                    sig.params.len(),
                    plural(sig.params.len()),
                    operands.len()
                ));
            }
            for (i, (p, a)) in sig.params.iter().zip(operands).enumerate() {
                if p != *a {
                    return Err(format!("argument {i} of @{callee} must be {p}, got {a}"));
                }
            }
            Ok(sig.results)
        }
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

fn same_types(op: &Op, l: &TensorType, r: &TensorType) -> Result<(), String> {
    if l != r {
        return Err(format!(
            "`{}` needs operands of identical type, got {l} and {r} (broadcast explicitly with broadcast_in_dim)",
            op.name()
        ));
    }
    Ok(())
}

fn check_permutation(perm: &[usize], rank: usize) -> Result<(), String> {
    let mut seen = vec![false; rank];
    if perm.len() != rank {
        return Err(format!("transpose permutation {perm:?} must have {rank} entries"));
    }
    for &p in perm {
        if p >= rank || seen[p] {
            return Err(format!("transpose permutation {perm:?} is not a permutation of 0..{rank}"));
        }
        seen[p] = true;
    }
    Ok(())
}

fn check_literal(lit: &Literal) -> Result<(), String> {
    if let LiteralData::Dense(v) = &lit.data {
        if v.len() != lit.ty.num_elements() {
            return Err(format!("constant of type {} has {} values", lit.ty, v.len()));
        }
    }
    Ok(())
}

fn check_dims(what: &str, dims: &[usize], t: &TensorType, used: &mut HashSet<usize>) -> Result<(), String> {
    for &d in dims {
        if d >= t.rank() {
            return Err(format!("dot_general {what} dimension {d} is out of range for {t}"));
        }
        if !used.insert(d) {
            return Err(format!("dot_general dimension {d} of {t} is used twice"));
        }
    }
    Ok(())
}

fn infer_dot(dims: &DotDims, l: &TensorType, r: &TensorType) -> Result<TensorType, String> {
    if l.dtype != r.dtype {
        return Err(format!("dot_general operands must have the same dtype, got {l} and {r}"));
    }
    if l.dtype.is_bool() {
        return Err("dot_general does not accept bool".into());
    }
    if dims.lhs_batch.len() != dims.rhs_batch.len() {
        return Err("dot_general needs as many lhs batch dimensions as rhs batch dimensions".into());
    }
    if dims.lhs_contract.len() != dims.rhs_contract.len() {
        return Err("dot_general needs as many lhs contracting dimensions as rhs contracting dimensions".into());
    }
    let (mut lu, mut ru) = (HashSet::new(), HashSet::new());
    check_dims("lhs batch", &dims.lhs_batch, l, &mut lu)?;
    check_dims("lhs contracting", &dims.lhs_contract, l, &mut lu)?;
    check_dims("rhs batch", &dims.rhs_batch, r, &mut ru)?;
    check_dims("rhs contracting", &dims.rhs_contract, r, &mut ru)?;
    for (a, b) in dims.lhs_batch.iter().zip(&dims.rhs_batch) {
        if l.shape[*a] != r.shape[*b] {
            return Err(format!(
                "dot_general batch dimensions differ: lhs dimension {a} of {l} vs rhs dimension {b} of {r}"
            ));
        }
    }
    for (a, b) in dims.lhs_contract.iter().zip(&dims.rhs_contract) {
        if l.shape[*a] != r.shape[*b] {
            return Err(format!(
                "dot_general contracting dimensions differ: lhs dimension {a} of {l} vs rhs dimension {b} of {r}"
            ));
        }
    }
    let mut shape: Vec<usize> = dims.lhs_batch.iter().map(|&d| l.shape[d]).collect();
    shape.extend((0..l.rank()).filter(|d| !lu.contains(d)).map(|d| l.shape[d]));
    shape.extend((0..r.rank()).filter(|d| !ru.contains(d)).map(|d| r.shape[d]));
    Ok(TensorType::new(l.dtype, shape))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{BinaryOp, CompareOp, ReduceOp, UnaryOp};

    fn t(d: DType, s: &[usize]) -> TensorType {
        TensorType::new(d, s.to_vec())
    }

    fn inf(op: Op, ops: &[TensorType]) -> Result<Vec<TensorType>, String> {
        let refs: Vec<&TensorType> = ops.iter().collect();
        infer(&op, &refs, &NoFunctions)
    }

    #[test]
    fn dot_general_batch_and_contract() {
        let dims = DotDims { lhs_batch: vec![0], rhs_batch: vec![0], lhs_contract: vec![2], rhs_contract: vec![1] };
        let r = inf(Op::DotGeneral(dims), &[t(DType::F32, &[4, 3, 5]), t(DType::F32, &[4, 5, 7])]).unwrap();
        assert_eq!(r, vec![t(DType::F32, &[4, 3, 7])]);
        let bad = DotDims::matmul();
        let e = inf(Op::DotGeneral(bad), &[t(DType::F32, &[2, 3]), t(DType::F32, &[4, 5])]).unwrap_err();
        assert!(e.contains("contracting dimensions differ"), "{e}");
    }

    #[test]
    fn elementwise_and_compare() {
        let a = t(DType::F32, &[2, 3]);
        assert_eq!(inf(Op::Compare(CompareOp::Lt), &[a.clone(), a.clone()]).unwrap(), vec![a.with_dtype(DType::Bool)]);
        assert!(inf(Op::Binary(BinaryOp::Add), &[a.clone(), t(DType::F32, &[3, 2])]).is_err());
        assert!(inf(Op::Unary(UnaryOp::Exp), &[t(DType::I32, &[2])]).is_err());
        assert!(inf(Op::Unary(UnaryOp::Exp), &[a.clone(), a.clone()]).unwrap_err().contains("takes 1 operand"));
    }

    #[test]
    fn shape_ops() {
        let a = t(DType::F32, &[2, 3]);
        assert_eq!(
            inf(Op::Reduce { op: ReduceOp::Sum, dims: vec![1] }, std::slice::from_ref(&a)).unwrap(),
            vec![t(DType::F32, &[2])]
        );
        assert_eq!(
            inf(Op::Slice { start: vec![0, 1], limit: vec![2, 3], stride: vec![1, 2] }, std::slice::from_ref(&a))
                .unwrap(),
            vec![t(DType::F32, &[2, 1])]
        );
        assert_eq!(
            inf(
                Op::Pad { low: vec![1, -1], high: vec![0, 0], interior: vec![1, 0] },
                &[a.clone(), TensorType::scalar(DType::F32)]
            )
            .unwrap(),
            vec![t(DType::F32, &[4, 2])]
        );
        assert!(inf(Op::Transpose { perm: vec![0, 0] }, std::slice::from_ref(&a)).is_err());
        assert!(inf(Op::Reshape { shape: vec![7] }, std::slice::from_ref(&a)).is_err());
        assert!(inf(Op::BroadcastInDim { dims: vec![0, 1], shape: vec![2, 4] }, &[a]).is_err());
    }
}

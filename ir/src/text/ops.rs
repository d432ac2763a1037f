//! From a mnemonic, its attribute dictionary and its type annotation to an
//! [`Op`].
//!
//! Op attributes never depend on operand types, so ops are built during the
//! syntactic pass. The five ops whose result type is carried in the op
//! (`constant`, `iota`, `convert`, `broadcast_in_dim`, `reshape`) take it
//! from the annotation, which is therefore mandatory for them.

use super::ast::TypeAnn;
use super::attrs::{as_bool, as_i64_list, as_usize, as_usize_list, take_sharding, Attr, Attrs};
use super::literal::{literal_for, LitAst};
use crate::indexing::IndexAttr;
use crate::{BinaryOp, CompareOp, DotDims, IndexOp, Loc, Op, ParseError, ReduceOp, UnaryOp};

/// Every op mnemonic, in the order of the spec's table.
pub(crate) fn mnemonics() -> Vec<&'static str> {
    let mut v = vec!["constant", "iota"];
    v.extend(UnaryOp::ALL.iter().map(|u| u.name()));
    v.extend(BinaryOp::ALL.iter().map(|b| b.name()));
    v.extend(CompareOp::ALL.iter().map(|c| c.name()));
    v.extend(["select", "convert", "broadcast_in_dim", "reshape", "transpose", "slice", "concatenate", "pad"]);
    v.push("dot_general");
    v.extend(ReduceOp::ALL.iter().map(|r| r.name()));
    v.extend(IndexOp::names());
    v.extend(["call", "sharding_constraint", "reshard"]);
    v
}

/// The error for an unknown mnemonic, suggesting the closest known one.
pub(crate) fn unknown_op(name: &str, loc: Loc) -> ParseError {
    let all = mnemonics();
    let best = all.iter().map(|m| (strsim::levenshtein(name, m), *m)).min();
    let prefix = all.iter().find(|m| name.len() >= 3 && m.starts_with(name));
    let hint = match (best, prefix) {
        (Some((d, m)), _) if d <= 2 || d * 3 <= name.len() => format!("; did you mean `{m}`?"),
        (_, Some(m)) => format!("; did you mean `{m}`?"),
        _ => " (the ops are listed in specs/ir.md)".to_string(),
    };
    ParseError { loc, message: format!("unknown op `{name}`{hint}") }
}

/// The attribute names an op takes (in canonical order).
pub(crate) fn attr_names(mnemonic: &str) -> &'static [&'static str] {
    match mnemonic {
        "iota" | "concatenate" => &["dim"],
        "broadcast_in_dim" | "reduce_sum" | "reduce_max" | "reduce_min" => &["dims"],
        "transpose" => &["perm"],
        "slice" => &["start", "limit", "stride"],
        "pad" => &["low", "high", "interior"],
        "dot_general" => &["lhs_batch", "rhs_batch", "lhs_contract", "rhs_contract"],
        "sharding_constraint" | "reshard" => SHARDING_ATTRS,
        "call" => &["remat"],
        m => IndexOp::attr_names(m).unwrap_or(&[]),
    }
}

/// The entries of a value annotation (and of the sharding ops).
pub(crate) const SHARDING_ATTRS: &[&str] = &["sharding", "unreduced"];

/// The parts of an instruction that determine its op.
pub(crate) struct OpParts<'a> {
    /// The mnemonic.
    pub mnemonic: &'a str,
    /// Where the mnemonic is.
    pub loc: Loc,
    /// The attribute dictionary and where it starts, if present.
    pub attrs: Option<(Vec<Attr>, Loc)>,
    /// The literal of a `constant`.
    pub literal: Option<LitAst>,
    /// The callee of a `call`.
    pub callee: Option<String>,
    /// The result type annotation, if present.
    pub types: Option<&'a [TypeAnn]>,
}

/// Builds the op. The mnemonic must be one of [`mnemonics`].
pub(crate) fn make_op(p: OpParts<'_>) -> Result<Op, ParseError> {
    let m = p.mnemonic;
    let (entries, dict_loc) = p.attrs.unwrap_or((Vec::new(), p.loc));
    let mut a = Attrs::new(entries, format!("`{m}`"), dict_loc, attr_names(m))?;
    let ty = || {
        p.types.and_then(|t| t.first()).map(|t| &t.ty).ok_or_else(|| ParseError {
            loc: p.loc,
            message: format!(
                "`{m}` needs a result type annotation (`: <type>` after its operands): \
                 its result type is not determined by its operands"
            ),
        })
    };
    let op = if let Some(u) = UnaryOp::ALL.into_iter().find(|u| u.name() == m) {
        Op::Unary(u)
    } else if let Some(b) = BinaryOp::ALL.into_iter().find(|b| b.name() == m) {
        Op::Binary(b)
    } else if let Some(c) = CompareOp::ALL.into_iter().find(|c| c.name() == m) {
        Op::Compare(c)
    } else if let Some(i) = IndexOp::from_attrs(
        m,
        |name, is_bool| {
            a.optional(name)
                .map(|x| if is_bool { as_bool(&x).map(IndexAttr::Bool) } else { as_usize(&x).map(IndexAttr::Int) })
                .transpose()
        },
        |name| ParseError { loc: dict_loc, message: format!("`{m}` needs attribute `{name}`") },
    ) {
        Op::Index(i?)
    } else if let Some(r) = ReduceOp::ALL.into_iter().find(|r| r.name() == m) {
        Op::Reduce { op: r, dims: as_usize_list(&a.required("dims")?)? }
    } else {
        match m {
            "constant" => {
                let ty = ty()?;
                let lit = p
                    .literal
                    .as_ref()
                    .ok_or_else(|| ParseError { loc: p.loc, message: "`constant` needs a literal value".into() })?;
                Op::Constant(literal_for(lit, ty)?)
            }
            "iota" => {
                let dim = as_usize(&a.required("dim")?)?;
                Op::Iota { dim, ty: ty()?.clone() }
            }
            "select" => Op::Select,
            "convert" => Op::Convert { to: ty()?.dtype },
            "broadcast_in_dim" => {
                let dims = as_usize_list(&a.required("dims")?)?;
                Op::BroadcastInDim { dims, shape: ty()?.shape.clone() }
            }
            "reshape" => Op::Reshape { shape: ty()?.shape.clone() },
            "transpose" => Op::Transpose { perm: as_usize_list(&a.required("perm")?)? },
            "slice" => {
                let start = as_usize_list(&a.required("start")?)?;
                let limit = as_usize_list(&a.required("limit")?)?;
                let stride = match a.optional("stride") {
                    Some(s) => as_usize_list(&s)?,
                    None => vec![1; start.len()],
                };
                Op::Slice { start, limit, stride }
            }
            "concatenate" => Op::Concatenate { dim: as_usize(&a.required("dim")?)? },
            "pad" => {
                let low = as_i64_list(&a.required("low")?)?;
                let high = as_i64_list(&a.required("high")?)?;
                let interior = match a.optional("interior") {
                    Some(i) => as_usize_list(&i)?,
                    None => vec![0; low.len()],
                };
                Op::Pad { low, high, interior }
            }
            "dot_general" => {
                let mut list = |name| a.optional(name).map(|x| as_usize_list(&x)).transpose();
                let lhs_batch = list("lhs_batch")?.unwrap_or_default();
                let rhs_batch = list("rhs_batch")?.unwrap_or_default();
                let lhs_contract = as_usize_list(&a.required("lhs_contract")?)?;
                let rhs_contract = as_usize_list(&a.required("rhs_contract")?)?;
                Op::DotGeneral(DotDims { lhs_batch, rhs_batch, lhs_contract, rhs_contract })
            }
            "call" => {
                let remat = a.optional("remat").map(|r| as_bool(&r)).transpose()?.unwrap_or(false);
                Op::Call { callee: p.callee.clone().unwrap_or_default(), remat }
            }
            "sharding_constraint" => Op::ShardingConstraint { sharding: take_sharding(&mut a)? },
            "reshard" => Op::Reshard { to: take_sharding(&mut a)? },
            _ => return Err(unknown_op(m, p.loc)),
        }
    };
    let left = a.leftover();
    assert!(left.is_empty(), "`{m}` lists attributes {left:?} it does not read");
    Ok(op)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mnemonics_are_unique_and_complete() {
        let all = mnemonics();
        let unique: std::collections::HashSet<_> = all.iter().collect();
        assert_eq!(unique.len(), all.len());
        let fixed = 2 + 8 + 1 + 3 + 4;
        let n = UnaryOp::ALL.len() + BinaryOp::ALL.len() + CompareOp::ALL.len() + ReduceOp::ALL.len() + fixed;
        assert_eq!(all.len(), n);
        assert!(all.contains(&"shift_right_logical") && all.contains(&"reduce_min") && all.contains(&"call"));
    }

    #[test]
    fn suggestions() {
        let l = Loc { line: 1, col: 1 };
        assert_eq!(unknown_op("ad", l).message, "unknown op `ad`; did you mean `add`?");
        assert_eq!(unknown_op("dot_genral", l).message, "unknown op `dot_genral`; did you mean `dot_general`?");
        assert_eq!(unknown_op("broadcast", l).message, "unknown op `broadcast`; did you mean `broadcast_in_dim`?");
        assert!(unknown_op("frobnicate", l).message.contains("specs/ir.md"));
    }
}

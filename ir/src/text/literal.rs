//! Constant literals: reading them against their type and printing them.
//!
//! A literal is written before its type (`constant [1, 2] : i32[2]`), so the
//! parser first keeps it as a tree ([`LitAst`]) and checks it once the type is
//! known. Numbers are parsed as `f64` with Rust's correctly rounded parser and
//! then rounded to the dtype with [`DType::round`]; printing uses the shortest
//! text that reads back to the same value (the `f32` repr for `f32`, `bf16`
//! and `f16`, the `f64` repr for `f64`), so print/parse is exact.

use crate::{DType, Literal, LiteralData, Loc, ParseError, TensorType};

/// A literal as written.
#[derive(Clone, Debug)]
pub(crate) enum LitAst {
    /// One value: a number, `true`, `false`, `inf`, `-inf` or `nan`.
    Scalar {
        /// The text (`-inf` for a minus sign followed by `inf`).
        text: String,
        /// Where it starts.
        loc: Loc,
    },
    /// `[item, ...]`.
    List {
        /// The items.
        items: Vec<LitAst>,
        /// Where `[` is.
        loc: Loc,
    },
}

fn err(loc: Loc, message: String) -> ParseError {
    ParseError { loc, message }
}

/// Builds the literal of type `ty` that `lit` denotes: a single value is a
/// splat (of any shape), nested lists must match the shape exactly.
pub(crate) fn literal_for(lit: &LitAst, ty: &TensorType) -> Result<Literal, ParseError> {
    match lit {
        LitAst::Scalar { text, loc } => {
            Ok(Literal { ty: ty.clone(), data: LiteralData::Splat(scalar_value(text, *loc, ty.dtype)?) })
        }
        LitAst::List { loc, .. } if ty.rank() == 0 => {
            Err(err(*loc, format!("a constant of type {ty} is a single value, found `[`")))
        }
        LitAst::List { .. } => {
            let mut values = Vec::new();
            dense(lit, &ty.shape, ty, &mut values)?;
            Ok(Literal { ty: ty.clone(), data: LiteralData::Dense(values) })
        }
    }
}

fn dense(lit: &LitAst, dims: &[usize], ty: &TensorType, out: &mut Vec<f64>) -> Result<(), ParseError> {
    let depth = ty.rank() - dims.len();
    match (lit, dims.split_first()) {
        (LitAst::Scalar { text, loc }, None) => {
            out.push(scalar_value(text, *loc, ty.dtype)?);
            Ok(())
        }
        (LitAst::List { loc, .. }, None) => {
            Err(err(*loc, format!("the {ty} constant nests {} lists deep, found `[` at depth {depth}", ty.rank())))
        }
        (LitAst::Scalar { text, loc }, Some((n, _))) => Err(err(
            *loc,
            format!("expected `[` for dimension {depth} of the {ty} constant (a list of {n}), found `{text}`"),
        )),
        (LitAst::List { items, loc }, Some((&n, rest))) => {
            if items.len() != n {
                return Err(err(
                    *loc,
                    format!(
                        "dimension {depth} of the {ty} constant has extent {n}, but this list has {} element{}",
                        items.len(),
                        if items.len() == 1 { "" } else { "s" }
                    ),
                ));
            }
            items.iter().try_for_each(|item| dense(item, rest, ty, out))
        }
    }
}

/// Whether `s` is `-?[0-9]+`.
fn is_integer_text(s: &str) -> bool {
    let digits = s.strip_prefix('-').unwrap_or(s);
    !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
}

/// Whether `s` is `-?[0-9]+(\.[0-9]+)?([eE][+-]?[0-9]+)?`.
fn is_decimal_text(s: &str) -> bool {
    let s = s.strip_prefix('-').unwrap_or(s);
    let (mantissa, exponent) = match s.find(['e', 'E']) {
        Some(i) => (&s[..i], Some(&s[i + 1..])),
        None => (s, None),
    };
    let (int, frac) = match mantissa.split_once('.') {
        Some((i, f)) => (i, Some(f)),
        None => (mantissa, None),
    };
    let digits = |d: &str| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit());
    digits(int) && frac.is_none_or(digits) && exponent.is_none_or(|e| digits(e.strip_prefix(['+', '-']).unwrap_or(e)))
}

/// "a" or "an", as the dtype's name is read aloud ("an f32", "a u32").
fn article(d: DType) -> &'static str {
    if matches!(d, DType::F32 | DType::F64 | DType::F16 | DType::I32) {
        "an"
    } else {
        "a"
    }
}

/// The value of one literal element of dtype `d`, already rounded to it.
pub(crate) fn scalar_value(text: &str, loc: Loc, d: DType) -> Result<f64, ParseError> {
    match d {
        DType::Bool => match text {
            "true" => Ok(1.0),
            "false" => Ok(0.0),
            _ => Err(err(loc, format!("a bool constant takes `true` or `false`, found `{text}`"))),
        },
        DType::I32 | DType::U32 => {
            if !is_integer_text(text) {
                return Err(err(loc, format!("{} {d} constant takes integers, found `{text}`", article(d))));
            }
            let (lo, hi) = if d == DType::I32 { (i32::MIN as i64, i32::MAX as i64) } else { (0, u32::MAX as i64) };
            match text.parse::<i64>() {
                Ok(v) if (lo..=hi).contains(&v) => Ok(v as f64),
                _ => Err(err(loc, format!("`{text}` is out of range for {d} ({lo} to {hi})"))),
            }
        }
        _ => {
            let v = match text {
                "inf" => f64::INFINITY,
                "-inf" => f64::NEG_INFINITY,
                "nan" => f64::NAN,
                _ if is_decimal_text(text) => {
                    text.parse::<f64>().map_err(|e| err(loc, format!("invalid number `{text}`: {e}")))?
                }
                _ if text.starts_with(|c: char| c == '-' || c.is_ascii_digit()) => {
                    return Err(err(loc, format!("invalid number `{text}`")))
                }
                _ => {
                    return Err(err(
                        loc,
                        format!("{} {d} constant takes numbers, `inf`, `-inf` or `nan`, found `{text}`", article(d)),
                    ))
                }
            };
            let r = d.round(v);
            if r.is_infinite() && !matches!(text, "inf" | "-inf") {
                return Err(err(loc, format!("`{text}` is out of range for {d} (it would round to infinity)")));
            }
            Ok(r)
        }
    }
}

/// The shortest text that reads back as `v` in dtype `d`.
pub(crate) fn format_value(v: f64, d: DType) -> String {
    match d {
        DType::Bool => (if v != 0.0 { "true" } else { "false" }).to_string(),
        DType::I32 | DType::U32 => format!("{}", v as i64),
        _ if v.is_nan() => "nan".to_string(),
        _ if v.is_infinite() => (if v > 0.0 { "inf" } else { "-inf" }).to_string(),
        DType::F64 => format!("{v:?}"),
        _ => format!("{:?}", v as f32),
    }
}

/// Prints a literal: one value for a splat, nested lists for dense data (a
/// flat list if the data does not match the shape, which the verifier
/// reports).
pub(crate) fn format_literal(lit: &Literal) -> String {
    let d = lit.ty.dtype;
    match &lit.data {
        LiteralData::Splat(v) => format_value(*v, d),
        LiteralData::Dense(values) if Some(values.len()) != element_count(&lit.ty.shape) || lit.ty.rank() == 0 => {
            let items: Vec<String> = values.iter().map(|&v| format_value(v, d)).collect();
            format!("[{}]", items.join(", "))
        }
        LiteralData::Dense(values) => {
            let mut out = String::new();
            nest(&mut out, values, &lit.ty.shape, d);
            out
        }
    }
}

/// The number of elements of a shape, `None` if it overflows (computed left
/// to right like [`TensorType::num_elements`], which would panic).
pub(crate) fn element_count(shape: &[usize]) -> Option<usize> {
    shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d))
}

fn nest(out: &mut String, values: &[f64], dims: &[usize], d: DType) {
    let Some((&n, rest)) = dims.split_first() else {
        out.push_str(&format_value(values[0], d));
        return;
    };
    let stride = element_count(rest).unwrap_or(0);
    out.push('[');
    for i in 0..n {
        if i > 0 {
            out.push_str(", ");
        }
        nest(out, &values[i * stride..], rest, d);
    }
    out.push(']');
}

#[cfg(test)]
mod tests {
    use super::*;

    const L: Loc = Loc { line: 1, col: 1 };

    #[test]
    fn values_per_dtype() {
        assert_eq!(scalar_value("1e-8", L, DType::F32).unwrap(), 1e-8f32 as f64);
        assert_eq!(scalar_value("-inf", L, DType::BF16).unwrap(), f64::NEG_INFINITY);
        assert!(scalar_value("nan", L, DType::F16).unwrap().is_nan());
        assert_eq!(scalar_value("-7", L, DType::I32).unwrap(), -7.0);
        assert_eq!(scalar_value("true", L, DType::Bool).unwrap(), 1.0);
        assert!(scalar_value("1.5", L, DType::I32).unwrap_err().message.contains("takes integers"));
        assert!(scalar_value("-1", L, DType::U32).unwrap_err().message.contains("out of range"));
        assert!(scalar_value("1e39", L, DType::F32).unwrap_err().message.contains("round to infinity"));
        assert!(scalar_value("70000", L, DType::F16).unwrap_err().message.contains("out of range"));
        assert!(scalar_value("1.2.3", L, DType::F32).unwrap_err().message.contains("invalid number"));
        assert!(scalar_value("1", L, DType::Bool).unwrap_err().message.contains("`true` or `false`"));
    }

    #[test]
    fn formats_shortest() {
        assert_eq!(format_value(0.1f32 as f64, DType::F32), "0.1");
        assert_eq!(format_value(0.1, DType::F64), "0.1");
        assert_eq!(format_value(1.0, DType::BF16), "1.0");
        assert_eq!(format_value(-0.0, DType::F32), "-0.0");
        assert_eq!(format_value(4294967295.0, DType::U32), "4294967295");
        assert_eq!(format_value(f64::NEG_INFINITY, DType::F16), "-inf");
    }

    #[test]
    fn nested_dense() {
        let ty = TensorType::new(DType::I32, vec![2, 3]);
        let lit = Literal::dense(ty, vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
        assert_eq!(format_literal(&lit), "[[1, 2, 3], [4, 5, 6]]");
        let empty = Literal::dense(TensorType::new(DType::F32, vec![2, 0]), vec![]).unwrap();
        assert_eq!(format_literal(&empty), "[[], []]");
    }
}

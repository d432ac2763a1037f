//! Attribute dictionaries: `{perm = [1, 0]}`, `{sharding = [{data}, {?}]}`.
//!
//! The parser reads every dictionary into one untyped form ([`AttrValue`]),
//! and each op then takes the entries it knows with typed getters. Keeping
//! the two apart means unknown, missing, duplicate and ill-typed attributes
//! get uniform messages that name the op and the attribute.

use crate::{DimSharding, Loc, ParseError, TensorSharding};

/// One entry of an axis set `{data, model, ?}`.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum AxisItem {
    /// A mesh axis name.
    Axis(String),
    /// `?`: the dimension is open.
    Open,
}

/// An untyped attribute value.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum AttrValue {
    /// An integer.
    Int(i64),
    /// `true` or `false`.
    Bool(bool),
    /// `[v, ...]`.
    List(Vec<(AttrValue, Loc)>),
    /// `{axis, ..., ?}`.
    Axes(Vec<(AxisItem, Loc)>),
}

impl AttrValue {
    fn describe(&self) -> &'static str {
        match self {
            AttrValue::Int(_) => "an integer",
            AttrValue::Bool(_) => "a boolean",
            AttrValue::List(_) => "a list",
            AttrValue::Axes(_) => "an axis set `{...}`",
        }
    }
}

/// One `name = value` entry.
#[derive(Clone, Debug)]
pub(crate) struct Attr {
    /// The attribute name.
    pub name: String,
    /// Where the name is.
    pub loc: Loc,
    /// The value.
    pub value: AttrValue,
    /// Where the value starts.
    pub value_loc: Loc,
}

/// The entries of one dictionary, being taken by an op (or a value
/// annotation) that knows which names it takes.
pub(crate) struct Attrs {
    entries: Vec<Attr>,
    /// What the dictionary belongs to, for messages: `` `transpose` ``.
    owner: String,
    /// Where the dictionary is (or the op, if there is none).
    loc: Loc,
}

impl Attrs {
    /// Wraps the entries of a dictionary (already free of duplicates),
    /// rejecting any name not in `known`, with a suggestion when one is close.
    pub fn new(entries: Vec<Attr>, owner: String, loc: Loc, known: &[&str]) -> Result<Attrs, ParseError> {
        if let Some(a) = entries.iter().find(|a| !known.contains(&a.name.as_str())) {
            let close = known.iter().min_by_key(|k| strsim::levenshtein(&a.name, k));
            let hint = match close {
                Some(k) if strsim::levenshtein(&a.name, k) <= 3 => format!("; did you mean `{k}`?"),
                None => " (it takes no attributes)".to_string(),
                Some(_) => {
                    let names: Vec<String> = known.iter().map(|n| format!("`{n}`")).collect();
                    format!(" (it takes {})", names.join(", "))
                }
            };
            return Err(err(a.loc, format!("unknown attribute `{}` for {owner}{hint}", a.name)));
        }
        Ok(Attrs { entries, owner, loc })
    }

    /// Removes and returns attribute `name`, if present.
    pub fn optional(&mut self, name: &'static str) -> Option<Attr> {
        let i = self.entries.iter().position(|a| a.name == name)?;
        Some(self.entries.remove(i))
    }

    /// Removes and returns attribute `name`, or says it is missing.
    pub fn required(&mut self, name: &'static str) -> Result<Attr, ParseError> {
        self.optional(name).ok_or_else(|| err(self.loc, format!("{} needs attribute `{name}`", self.owner)))
    }

    /// The entries nobody took. Empty unless the `known` list given to
    /// [`Attrs::new`] names an attribute its owner does not read (a bug).
    pub fn leftover(&self) -> Vec<&str> {
        self.entries.iter().map(|a| a.name.as_str()).collect()
    }
}

fn err(loc: Loc, message: String) -> ParseError {
    ParseError { loc, message }
}

fn expected(a: &Attr, what: &str, found: &str, at: Loc) -> ParseError {
    err(at, format!("attribute `{}` must be {what}, found {found}", a.name))
}

/// `true` or `false`.
pub(crate) fn as_bool(a: &Attr) -> Result<bool, ParseError> {
    match &a.value {
        AttrValue::Bool(b) => Ok(*b),
        other => Err(expected(a, "`true` or `false`", other.describe(), a.value_loc)),
    }
}

/// A non-negative integer.
pub(crate) fn as_usize(a: &Attr) -> Result<usize, ParseError> {
    to_usize(a, &a.value, a.value_loc)
}

fn to_usize(a: &Attr, v: &AttrValue, at: Loc) -> Result<usize, ParseError> {
    let what = "a non-negative integer";
    match v {
        AttrValue::Int(i) => usize::try_from(*i).map_err(|_| expected(a, what, &format!("`{i}`"), at)),
        other => Err(expected(a, what, other.describe(), at)),
    }
}

fn as_list(a: &Attr) -> Result<&[(AttrValue, Loc)], ParseError> {
    match &a.value {
        AttrValue::List(items) => Ok(items),
        other => Err(expected(a, "a list `[...]`", other.describe(), a.value_loc)),
    }
}

/// A list of non-negative integers.
pub(crate) fn as_usize_list(a: &Attr) -> Result<Vec<usize>, ParseError> {
    let what = "a list of non-negative integers";
    as_list(a)?
        .iter()
        .map(|(v, at)| match v {
            AttrValue::Int(i) => usize::try_from(*i).map_err(|_| expected(a, what, &format!("`{i}`"), *at)),
            other => Err(expected(a, what, other.describe(), *at)),
        })
        .collect()
}

/// A list of integers.
pub(crate) fn as_i64_list(a: &Attr) -> Result<Vec<i64>, ParseError> {
    as_list(a)?
        .iter()
        .map(|(v, at)| match v {
            AttrValue::Int(i) => Ok(*i),
            other => Err(expected(a, "a list of integers", other.describe(), *at)),
        })
        .collect()
}

fn as_axes(a: &Attr, v: &AttrValue, at: Loc) -> Result<Vec<(AxisItem, Loc)>, ParseError> {
    match v {
        AttrValue::Axes(items) => Ok(items.clone()),
        other => Err(expected(a, "an axis set `{...}`", other.describe(), at)),
    }
}

/// A sharding `[{data}, {model, ?}]`, one axis set per dimension; `?`
/// may only come last.
pub(crate) fn as_sharding(a: &Attr) -> Result<Vec<DimSharding>, ParseError> {
    let mut dims = Vec::new();
    for (v, at) in as_list(a)? {
        let items = as_axes(a, v, *at)?;
        let mut dim = DimSharding::default();
        for (k, (item, loc)) in items.iter().enumerate() {
            match item {
                AxisItem::Axis(s) => dim.axes.push(s.clone()),
                AxisItem::Open if k + 1 == items.len() => dim.open = true,
                AxisItem::Open => return Err(err(*loc, "`?` must come last in a dimension's axis list".into())),
            }
        }
        dims.push(dim);
    }
    Ok(dims)
}

/// An axis set without `?`: `{model, data}`.
pub(crate) fn as_axis_names(a: &Attr) -> Result<Vec<String>, ParseError> {
    as_axes(a, &a.value, a.value_loc)?
        .into_iter()
        .map(|(item, loc)| match item {
            AxisItem::Axis(s) => Ok(s),
            AxisItem::Open => Err(err(loc, format!("attribute `{}` lists mesh axes; `?` is not allowed here", a.name))),
        })
        .collect()
}

/// Reads `sharding = [...]` and optional `unreduced = {...}`, the form shared
/// by value annotations and the sharding ops.
pub(crate) fn take_sharding(attrs: &mut Attrs) -> Result<TensorSharding, ParseError> {
    let dims = as_sharding(&attrs.required("sharding")?)?;
    let unreduced = match attrs.optional("unreduced") {
        Some(a) => as_axis_names(&a)?,
        None => Vec::new(),
    };
    Ok(TensorSharding { dims, unreduced })
}

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
    /// `[v, ...]`.
    List(Vec<(AttrValue, Loc)>),
    /// `{axis, ..., ?}`.
    Axes(Vec<(AxisItem, Loc)>),
}

impl AttrValue {
    fn describe(&self) -> &'static str {
        match self {
            AttrValue::Int(_) => "an integer",
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
/// annotation) that reports what it expected.
pub(crate) struct Attrs {
    entries: Vec<Attr>,
    /// What the dictionary belongs to, for messages: `` `transpose` ``.
    owner: String,
    /// Where the dictionary is (or the op, if there is none).
    loc: Loc,
    /// Names taken so far, for the "it takes ..." hint.
    known: Vec<&'static str>,
}

fn err(loc: Loc, message: String) -> ParseError {
    ParseError { loc, message }
}

impl Attrs {
    /// Wraps the entries of a dictionary (already free of duplicates).
    pub fn new(entries: Vec<Attr>, owner: String, loc: Loc) -> Attrs {
        Attrs { entries, owner, loc, known: Vec::new() }
    }

    /// Removes and returns attribute `name`, if present.
    pub fn optional(&mut self, name: &'static str) -> Option<Attr> {
        self.known.push(name);
        let i = self.entries.iter().position(|a| a.name == name)?;
        Some(self.entries.remove(i))
    }

    /// Removes and returns attribute `name`, or says it is missing.
    pub fn required(&mut self, name: &'static str) -> Result<Attr, ParseError> {
        self.optional(name).ok_or_else(|| err(self.loc, format!("{} needs attribute `{name}`", self.owner)))
    }

    /// Fails if any attribute was not taken.
    pub fn finish(self) -> Result<(), ParseError> {
        let Some(a) = self.entries.first() else { return Ok(()) };
        let takes = if self.known.is_empty() {
            "it takes no attributes".to_string()
        } else {
            let names: Vec<String> = self.known.iter().map(|n| format!("`{n}`")).collect();
            format!("it takes {}", names.join(", "))
        };
        Err(err(a.loc, format!("unknown attribute `{}` for {} ({takes})", a.name, self.owner)))
    }
}

fn expected(a: &Attr, what: &str, found: &str, at: Loc) -> ParseError {
    err(at, format!("attribute `{}` must be {what}, found {found}", a.name))
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

//! The syntactic pass: tokens to [`FuncAst`]s.
//!
//! A recursive-descent parser with one token of lookahead that stops at the
//! first error, saying what it expected and what it found. Nesting (literals,
//! attribute values) is bounded so that no input can overflow the stack.

use super::ast::{FuncAst, InstAst, Name, ParamAst, TypeAnn};
use super::attrs::{take_sharding, Attr, AttrValue, Attrs, AxisItem};
use super::lexer::{Tok, Token};
use super::literal::LitAst;
use super::ops::{make_op, mnemonics, unknown_op, OpParts, SHARDING_ATTRS};
use crate::{DType, Loc, ParseError, TensorType};

/// The deepest nesting of `[`/`{` accepted in literals and attributes.
const MAX_DEPTH: usize = 256;

/// Token cursor.
pub(crate) struct Parser {
    toks: Vec<Token>,
    pos: usize,
}

type PResult<T> = Result<T, ParseError>;

impl Parser {
    /// A parser over `toks`, which must end with [`Tok::Eof`].
    pub fn new(toks: Vec<Token>) -> Parser {
        Parser { toks, pos: 0 }
    }

    pub(crate) fn peek(&self) -> &Token {
        &self.toks[self.pos.min(self.toks.len() - 1)]
    }

    pub(crate) fn next(&mut self) -> Token {
        let t = self.peek().clone();
        if self.pos < self.toks.len() - 1 {
            self.pos += 1;
        }
        t
    }

    pub(crate) fn is(&self, c: char) -> bool {
        self.peek().tok == Tok::Punct(c)
    }

    pub(crate) fn eat(&mut self, c: char) -> bool {
        let yes = self.is(c);
        if yes {
            self.next();
        }
        yes
    }

    pub(crate) fn error<T>(&self, what: &str) -> PResult<T> {
        let t = self.peek();
        Err(ParseError { loc: t.loc, message: format!("expected {what}, found {}", t.tok) })
    }

    pub(crate) fn expect(&mut self, c: char) -> PResult<Loc> {
        if self.is(c) {
            Ok(self.next().loc)
        } else {
            self.error(&format!("`{c}`"))
        }
    }

    pub(crate) fn ident(&mut self, what: &str) -> PResult<(String, Loc)> {
        match self.peek().tok.clone() {
            Tok::Ident(s) => Ok((s, self.next().loc)),
            _ => self.error(what),
        }
    }

    pub(crate) fn value(&mut self, what: &str) -> PResult<Name> {
        match self.peek().tok.clone() {
            Tok::Value(text) => Ok(Name { text, loc: self.next().loc }),
            _ => self.error(what),
        }
    }

    /// A comma-separated list of `item` up to (not including) `close`.
    pub(crate) fn list<T>(&mut self, close: char, mut item: impl FnMut(&mut Self) -> PResult<T>) -> PResult<Vec<T>> {
        let mut out = Vec::new();
        if self.is(close) {
            return Ok(out);
        }
        loop {
            out.push(item(self)?);
            if !self.eat(',') {
                return Ok(out);
            }
        }
    }

    /// A whole module.
    pub fn module(&mut self) -> PResult<Vec<FuncAst>> {
        let mut funcs = Vec::new();
        while self.peek().tok != Tok::Eof {
            funcs.push(self.function()?);
        }
        Ok(funcs)
    }

    fn function(&mut self) -> PResult<FuncAst> {
        let loc = self.peek().loc;
        if self.peek().tok != Tok::Ident("func".into()) {
            return self.error("`func`");
        }
        self.next();
        let name = match self.peek().tok.clone() {
            Tok::Func(n) => n,
            _ => return self.error("a function name `@name`"),
        };
        self.next();
        self.expect('(')?;
        let params = self.list(')', |p| {
            let name = p.value("a parameter `%name`")?;
            p.expect(':')?;
            Ok(ParamAst { name, ty: p.annotated_type()? })
        })?;
        self.expect(')')?;
        if self.peek().tok != Tok::Arrow {
            return self.error("`->` and the result types");
        }
        self.next();
        self.expect('(')?;
        let results = self.list(')', Self::annotated_type)?;
        self.expect(')')?;
        self.expect('{')?;
        let mut body = Vec::new();
        loop {
            let t = self.peek().clone();
            match t.tok {
                Tok::Ident(s) if s == "return" => break,
                Tok::Ident(s) if s == "func" => return self.error("an instruction or `return`"),
                Tok::Value(_) | Tok::Ident(_) => body.push(self.instruction()?),
                _ => return self.error("an instruction or `return`"),
            }
        }
        let ret_loc = self.next().loc;
        let mut ret = Vec::new();
        if matches!(self.peek().tok, Tok::Value(_)) {
            ret = self.list('}', |p| p.value("a value"))?;
        }
        self.expect('}')?;
        Ok(FuncAst { name, loc, params, results, body, ret, ret_loc })
    }

    /// `f32[2,3]`.
    pub(crate) fn tensor_type(&mut self) -> PResult<(TensorType, Loc)> {
        const WHAT: &str = "a type such as `f32[2,3]`";
        let is_type_name = self.toks.get(self.pos + 1).is_some_and(|t| t.tok == Tok::Punct('['));
        if matches!(&self.peek().tok, Tok::Ident(n) if DType::from_name(n).is_none() && !is_type_name) {
            return self.error(WHAT);
        }
        let (name, loc) = self.ident(WHAT)?;
        let dtype = DType::from_name(&name).ok_or_else(|| {
            let names: Vec<&str> = DType::ALL.iter().map(|d| d.name()).collect();
            ParseError { loc, message: format!("unknown element type `{name}` (expected one of {})", names.join(", ")) }
        })?;
        self.expect('[')?;
        let shape = self.list(']', |p| match p.peek().tok.clone() {
            Tok::Number(s) => {
                let t = p.next();
                s.parse::<usize>().map_err(|_| ParseError {
                    loc: t.loc,
                    message: format!("expected a dimension extent (a non-negative integer), found `{s}`"),
                })
            }
            _ => p.error("a dimension extent"),
        })?;
        self.expect(']')?;
        let ty = TensorType::new(dtype, shape);
        if ty.checked_size_bytes().is_none() {
            return Err(ParseError {
                loc,
                message: format!(
                    "type {dtype}{:?} has too many elements (a tensor may have at most {} bytes)",
                    ty.shape,
                    crate::types::MAX_TENSOR_BYTES
                ),
            });
        }
        Ok((ty, loc))
    }

    /// A type with an optional value annotation `{sharding = ...}`.
    fn annotated_type(&mut self) -> PResult<TypeAnn> {
        let (ty, loc) = self.tensor_type()?;
        let mut sharding = None;
        if self.is('{') {
            let (entries, dict_loc) = self.attr_dict()?;
            let mut attrs = Attrs::new(entries, "a value annotation".into(), dict_loc, SHARDING_ATTRS)?;
            sharding = Some(take_sharding(&mut attrs)?);
        }
        Ok(TypeAnn { ty, loc, sharding })
    }

    pub(crate) fn instruction(&mut self) -> PResult<InstAst> {
        let loc = self.peek().loc;
        let mut results = Vec::new();
        if matches!(self.peek().tok, Tok::Value(_)) {
            results = self.list('=', |p| p.value("a result value"))?;
            self.expect('=')?;
        }
        let (mnemonic, mloc) = self.ident("an op name")?;
        if !mnemonics().contains(&mnemonic.as_str()) {
            return Err(unknown_op(&mnemonic, mloc));
        }
        let (mut literal, mut callee, mut operands) = (None, None, Vec::new());
        match mnemonic.as_str() {
            "constant" => literal = Some(self.literal(0)?),
            "call" => {
                match self.peek().tok.clone() {
                    Tok::Func(f) => callee = Some(f),
                    _ => return self.error("a callee `@name`"),
                }
                self.next();
                self.expect('(')?;
                operands = self.list(')', |p| p.value("an argument value"))?;
                self.expect(')')?;
            }
            _ if matches!(self.peek().tok, Tok::Value(_)) => operands = self.list(':', |p| p.value("an operand"))?,
            _ => {}
        }
        let attrs = if self.is('{') { Some(self.attr_dict()?) } else { None };
        let mut types = None;
        if self.eat(':') {
            let tys = self.list('\0', Self::annotated_type)?;
            if tys.len() != results.len() {
                return Err(ParseError {
                    loc: tys[0].loc,
                    message: format!(
                        "{} result value{} but {} result type{}",
                        results.len(),
                        if results.len() == 1 { "" } else { "s" },
                        tys.len(),
                        if tys.len() == 1 { "" } else { "s" }
                    ),
                });
            }
            types = Some(tys);
        }
        let parts = OpParts { mnemonic: &mnemonic, loc: mloc, attrs, literal, callee, types: types.as_deref() };
        let op = make_op(parts)?;
        Ok(InstAst { loc, results, op, operands, types })
    }

    /// `{name = value, ...}` with no name twice.
    fn attr_dict(&mut self) -> PResult<(Vec<Attr>, Loc)> {
        let loc = self.expect('{')?;
        let entries = self.list('}', |p| {
            let (name, loc) = p.ident("an attribute name")?;
            p.expect('=')?;
            let value_loc = p.peek().loc;
            let value = p.attr_value(0)?;
            Ok(Attr { name, loc, value, value_loc })
        })?;
        self.expect('}')?;
        for (i, a) in entries.iter().enumerate() {
            if let Some(first) = entries[..i].iter().find(|b| b.name == a.name) {
                return Err(ParseError {
                    loc: a.loc,
                    message: format!("attribute `{}` is given twice (first at {})", a.name, first.loc),
                });
            }
        }
        Ok((entries, loc))
    }

    fn too_deep<T>(&self) -> PResult<T> {
        Err(ParseError { loc: self.peek().loc, message: format!("nesting deeper than {MAX_DEPTH} levels") })
    }

    /// A sharding on its own, as an annotation writes it (`[{data}, {}]`),
    /// then the end of the text.
    pub(crate) fn sharding_alone(&mut self) -> PResult<crate::TensorSharding> {
        let loc = self.peek().loc;
        let value = self.attr_value(0)?;
        if self.peek().tok != Tok::Eof {
            return self.error("the end of the sharding");
        }
        let entries = vec![Attr { name: "sharding".into(), loc, value, value_loc: loc }];
        let mut attrs = Attrs::new(entries, "a sharding".into(), loc, &["sharding"])?;
        take_sharding(&mut attrs)
    }

    fn attr_value(&mut self, depth: usize) -> PResult<AttrValue> {
        if depth > MAX_DEPTH {
            return self.too_deep();
        }
        let t = self.peek().clone();
        match t.tok {
            Tok::Number(s) => {
                self.next();
                s.parse::<i64>()
                    .map(AttrValue::Int)
                    .map_err(|_| ParseError { loc: t.loc, message: format!("expected an integer, found `{s}`") })
            }
            Tok::Ident(s) if s == "true" || s == "false" => {
                self.next();
                Ok(AttrValue::Bool(s == "true"))
            }
            Tok::Punct('[') => {
                self.next();
                let items = self.list(']', |p| {
                    let loc = p.peek().loc;
                    Ok((p.attr_value(depth + 1)?, loc))
                })?;
                self.expect(']')?;
                Ok(AttrValue::List(items))
            }
            Tok::Punct('{') => {
                self.next();
                let items = self.list('}', |p| {
                    let t = p.next();
                    match t.tok {
                        Tok::Ident(s) => Ok((AxisItem::Axis(s), t.loc)),
                        Tok::Punct('?') => Ok((AxisItem::Open, t.loc)),
                        found => Err(ParseError {
                            loc: t.loc,
                            message: format!("expected a mesh axis name or `?`, found {found}"),
                        }),
                    }
                })?;
                self.expect('}')?;
                Ok(AttrValue::Axes(items))
            }
            _ => self.error("an attribute value (an integer, `true`, `false`, `[...]` or `{...}`)"),
        }
    }

    fn literal(&mut self, depth: usize) -> PResult<LitAst> {
        if depth > MAX_DEPTH {
            return self.too_deep();
        }
        let t = self.peek().clone();
        let scalar = |text: String| Ok(LitAst::Scalar { text, loc: t.loc });
        match t.tok {
            Tok::Number(s) => {
                self.next();
                scalar(s)
            }
            Tok::Ident(s) if matches!(s.as_str(), "true" | "false" | "inf" | "nan") => {
                self.next();
                scalar(s)
            }
            Tok::Minus if self.toks.get(self.pos + 1).is_some_and(|n| n.tok == Tok::Ident("inf".into())) => {
                self.next();
                self.next();
                scalar("-inf".into())
            }
            Tok::Punct('[') => {
                self.next();
                let items = self.list(']', |p| p.literal(depth + 1))?;
                self.expect(']')?;
                Ok(LitAst::List { items, loc: t.loc })
            }
            _ => self.error("a literal (a number, `true`, `false`, `inf`, `-inf`, `nan` or `[`)"),
        }
    }
}

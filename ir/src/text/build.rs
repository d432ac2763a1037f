//! The semantic pass: [`FuncAst`]s to a [`Module`].
//!
//! Resolves `%name`/`%N` to value ids in definition order, infers omitted
//! result types with [`crate::infer()`] (callee signatures come from the
//! headers, so calls may refer to functions defined later), and checks what
//! the IR cannot represent otherwise: that the returned values have the
//! header's types. Everything else about types is left to the verifier, so a
//! wrongly annotated program parses as written and is reported there.

use super::ast::{FuncAst, Name};
use crate::{infer, Function, Loc, Module, ParseError, Signature, SignatureLookup, TensorType, ValueId};
use std::collections::HashMap;

/// Callee signatures taken from the function headers.
struct HeaderSigs(HashMap<String, (Signature, Loc)>);

impl SignatureLookup for HeaderSigs {
    fn signature_of(&self, name: &str) -> Option<Signature> {
        self.0.get(name).map(|(s, _)| s.clone())
    }
}

fn err(loc: Loc, message: String) -> ParseError {
    ParseError { loc, message }
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

fn is_id(text: &str) -> bool {
    text.bytes().all(|b| b.is_ascii_digit())
}

/// Builds every function; fails on the first error.
pub(crate) fn build_module(funcs: Vec<FuncAst>) -> Result<Module, ParseError> {
    let mut sigs = HashMap::new();
    for f in &funcs {
        let sig = Signature {
            params: f.params.iter().map(|p| p.ty.ty.clone()).collect(),
            results: f.results.iter().map(|r| r.ty.clone()).collect(),
        };
        if let Some((_, first)) = sigs.insert(f.name.clone(), (sig, f.loc)) {
            return Err(err(f.loc, format!("function @{} is defined twice (first at {first})", f.name)));
        }
    }
    let sigs = HeaderSigs(sigs);
    let functions = funcs.into_iter().map(|f| build_function(f, &sigs)).collect::<Result<_, _>>()?;
    Ok(Module { functions })
}

/// The values defined so far in one function.
struct Scope<'a> {
    defs: HashMap<String, (ValueId, Loc)>,
    /// First definition of every name in the body, for "used before its
    /// definition" messages.
    all: HashMap<&'a str, Loc>,
}

impl Scope<'_> {
    /// Checks a new definition and returns the value's name (`None` for an
    /// id, which must be the next one).
    fn define(&mut self, id: ValueId, n: &Name) -> Result<Option<String>, ParseError> {
        if let Some((_, first)) = self.defs.get(&n.text) {
            return Err(err(n.loc, format!("value `%{}` is defined twice (first at {first})", n.text)));
        }
        self.defs.insert(n.text.clone(), (id, n.loc));
        if !is_id(&n.text) {
            return Ok(Some(n.text.clone()));
        }
        if n.text != id.0.to_string() {
            return Err(err(
                n.loc,
                format!(
                    "`%{}` is not the next value id: unnamed values are numbered in definition order \
                     (parameters first, then instruction results), so this one must be `{id}`; \
                     to label it freely, give it a name such as `%v{}`",
                    n.text, n.text
                ),
            ));
        }
        Ok(None)
    }

    fn resolve(&self, f: &Function, n: &Name) -> Result<ValueId, ParseError> {
        if let Some((id, _)) = self.defs.get(&n.text) {
            return Ok(*id);
        }
        let message = if let Some(v) = n.text.parse::<usize>().ok().filter(|&i| is_id(&n.text) && i < f.values.len()) {
            format!("`%{}` is the value named `{}`; refer to it by its name", n.text, f.value_ref(ValueId(v as u32)))
        } else if let Some(at) = self.all.get(n.text.as_str()) {
            format!("`%{}` is used before its definition at {at} (instructions run in order)", n.text)
        } else {
            let close = self.defs.keys().filter(|k| !is_id(k)).min_by_key(|k| strsim::levenshtein(k, &n.text));
            match close.filter(|k| strsim::levenshtein(k, &n.text) <= 2) {
                Some(k) => format!("use of undefined value `%{}`; did you mean `%{k}`?", n.text),
                None => format!("use of undefined value `%{}`", n.text),
            }
        };
        Err(err(n.loc, message))
    }
}

fn build_function(ast: FuncAst, sigs: &HeaderSigs) -> Result<Function, ParseError> {
    let mut f = Function::new(ast.name.clone());
    f.loc = Some(ast.loc);
    f.return_loc = Some(ast.ret_loc);
    let mut all = HashMap::new();
    for n in ast.params.iter().map(|p| &p.name).chain(ast.body.iter().flat_map(|i| &i.results)) {
        all.entry(n.text.as_str()).or_insert(n.loc);
    }
    let mut scope = Scope { defs: HashMap::new(), all };
    for p in &ast.params {
        let name = scope.define(f.next_value_id(), &p.name)?;
        let id = f.add_param(name, p.ty.ty.clone());
        f.values[id.index()].sharding = p.ty.sharding.clone();
    }
    for inst in &ast.body {
        let operands = inst.operands.iter().map(|o| scope.resolve(&f, o)).collect::<Result<Vec<_>, _>>()?;
        let (types, shardings) = match &inst.types {
            Some(t) => (t.iter().map(|t| t.ty.clone()).collect(), t.iter().map(|t| t.sharding.clone()).collect()),
            None => {
                let tys: Vec<&TensorType> = operands.iter().map(|&o| f.ty(o)).collect();
                let types = infer(&inst.op, &tys, sigs)
                    .map_err(|m| err(inst.loc, format!("cannot infer the result type: {m}")))?;
                if types.len() != inst.results.len() {
                    return Err(err(
                        inst.loc,
                        format!(
                            "`{}` produces {} result{} but {} value{} bound",
                            inst.op.name(),
                            types.len(),
                            plural(types.len()),
                            inst.results.len(),
                            if inst.results.len() == 1 { " is" } else { "s are" }
                        ),
                    ));
                }
                if let Some(t) = types.iter().find(|t| t.checked_size_bytes().is_none()) {
                    return Err(err(inst.loc, format!("the result type {t:?} has too many elements")));
                }
                let n = types.len();
                (types, vec![None; n])
            }
        };
        let mut results = Vec::with_capacity(types.len());
        let first = f.next_value_id().0;
        for (k, (name, ty)) in inst.results.iter().zip(types).enumerate() {
            // `add_inst` numbers the results consecutively from `first`.
            let id = ValueId(first.saturating_add(k as u32));
            results.push((ty, scope.define(id, name)?));
        }
        let id = f.add_inst(inst.op.clone(), operands, results, Some(inst.loc));
        for (&r, s) in f.insts[id.index()].results.clone().iter().zip(shardings) {
            f.values[r.index()].sharding = s;
        }
    }
    let results = ast.ret.iter().map(|r| scope.resolve(&f, r)).collect::<Result<Vec<_>, _>>()?;
    if results.len() != ast.results.len() {
        return Err(err(
            ast.ret_loc,
            format!(
                "`return` gives {} value{} but @{} declares {} result{}",
                results.len(),
                plural(results.len()),
                f.name,
                ast.results.len(),
                plural(ast.results.len())
            ),
        ));
    }
    for (k, ((&r, name), declared)) in results.iter().zip(&ast.ret).zip(&ast.results).enumerate() {
        if f.ty(r) != &declared.ty {
            return Err(err(
                name.loc,
                format!("result {k} (`%{}`) has type {} but @{} declares {}", name.text, f.ty(r), f.name, declared.ty),
            ));
        }
    }
    f.results = results;
    if ast.results.iter().any(|r| r.sharding.is_some()) {
        f.result_shardings = ast.results.iter().map(|r| r.sharding.clone()).collect();
    }
    Ok(f)
}

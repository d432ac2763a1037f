//! Reading the text form of a device program back: [`parse_program`].
//!
//! The text is what [`super::print_program`] writes (`specs/device-program.md`
//! §4), and `print -> parse -> print` is byte-identical. The format is
//! line-oriented (one step per line), and a defining line's trailing
//! `// name` comment is the buffer's name, so the parser reads line by line:
//! each line's code is tokenized with the IR's lexer and read with the IR
//! parser's cursor (compute steps are IR instructions, parsed by the IR's own
//! instruction parser), and its comment, if any, names what it defines.
//! Lines holding only a comment are skipped.
//!
//! Buffers are `%N`, their index. The parser does not verify (use
//! [`super::verify_program`]): a buffer may be used before its definition, or
//! never defined (it then gets the placeholder type `f32[]`, and the verifier
//! reports any use). It reports the first problem with its line, column and
//! what it expected, and never panics.

use super::{Buffer, BufferId, Collective, DeviceProgram, Step};
use crate::mesh::MeshShape;
use crate::text::ast::Name;
use crate::text::lexer::{lex, Tok, Token};
use crate::text::syntax::Parser;
use crate::{DType, IrError, Loc, ParseError, ReduceOp, TensorType};

/// The largest buffer index accepted (bounds the arena a text can ask for).
const MAX_BUFFERS: u32 = 1 << 24;

/// The mnemonics of the steps that are not IR ops.
const DEVICE_STEPS: &[&str] =
    &["shard_slice", "all_gather", "all_reduce", "reduce_scatter", "all_to_all", "collective_permute"];

type PResult<T> = Result<T, ParseError>;

fn err<T>(loc: Loc, message: impl Into<String>) -> PResult<T> {
    Err(ParseError { loc, message: message.into() })
}

/// Parses a device program printed by [`super::print_program`].
pub fn parse_program(text: &str) -> Result<DeviceProgram, IrError> {
    parse(text).map_err(IrError::Parse)
}

impl std::str::FromStr for DeviceProgram {
    type Err = IrError;

    /// [`parse_program`].
    fn from_str(text: &str) -> Result<DeviceProgram, IrError> {
        parse_program(text)
    }
}

/// One line: its tokens (positions on that line) and its comment.
struct Line {
    toks: Vec<Token>,
    comment: Option<String>,
    /// Where the line's code ends (for "expected ..., found end of line").
    end: Loc,
}

fn lines(text: &str) -> PResult<Vec<Line>> {
    let mut out = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = u32::try_from(i + 1).unwrap_or(u32::MAX);
        // `/` appears in no token, so the first `//` starts the comment.
        let (code, comment) = match raw.find("//") {
            Some(at) => (&raw[..at], Some(raw[at + 2..].trim().to_string())),
            None => (raw, None),
        };
        let mut toks = lex(code).map_err(|e| ParseError { loc: Loc { line, col: e.loc.col }, message: e.message })?;
        for t in &mut toks {
            t.loc.line = line;
        }
        if toks.len() == 1 {
            continue; // blank or comment only
        }
        let end = toks.last().map_or(Loc { line, col: 1 }, |t| t.loc);
        out.push(Line { toks, comment: comment.filter(|c| !c.is_empty()), end });
    }
    Ok(out)
}

/// The program being read.
struct Reader {
    buffers: Vec<Option<(Buffer, Loc)>>,
}

impl Reader {
    /// The id of `%N`.
    fn id(&mut self, n: &Name) -> PResult<BufferId> {
        let Some(i) = n.text.parse::<u32>().ok().filter(|&i| i < MAX_BUFFERS) else {
            return err(n.loc, format!("expected a buffer `%N` (N below {MAX_BUFFERS}), found `%{}`", n.text));
        };
        if self.buffers.len() <= i as usize {
            self.buffers.resize(i as usize + 1, None);
        }
        Ok(BufferId(i))
    }

    /// Defines buffer `n` with its type and name.
    fn define(&mut self, n: &Name, ty: TensorType, name: Option<String>) -> PResult<BufferId> {
        let b = self.id(n)?;
        if let Some((_, first)) = &self.buffers[b.index()] {
            return err(n.loc, format!("buffer `%{}` is defined twice (first at {first})", b.0));
        }
        self.buffers[b.index()] = Some((Buffer { ty, name }, n.loc));
        Ok(b)
    }
}

fn parse(text: &str) -> PResult<DeviceProgram> {
    let lines = lines(text)?;
    let Some((head, body)) = lines.split_first() else {
        return err(Loc { line: 1, col: 1 }, "expected `device_program`, found end of input");
    };
    let (name, mesh) = header(head)?;
    let mut r = Reader { buffers: Vec::new() };
    let (mut inputs, mut steps, mut outputs) = (Vec::new(), Vec::new(), None);
    let mut rest = body.iter();
    for line in rest.by_ref() {
        let first = &line.toks[0];
        match &first.tok {
            Tok::Punct('}') if outputs.is_none() => return err(first.loc, "expected `return` before `}`"),
            Tok::Ident(s) if s == "return" => {
                outputs = Some(return_line(line, &mut r)?);
                break;
            }
            Tok::Ident(s) if s == "input" => {
                if !steps.is_empty() {
                    return err(first.loc, "inputs must come before the first step");
                }
                inputs.push(input_line(line, &mut r)?);
            }
            _ => steps.push(step_line(line, &mut r)?),
        }
    }
    let Some(outputs) = outputs else {
        let end = body.last().unwrap_or(head).end;
        return err(end, "expected `return` and `}`, found end of input");
    };
    match rest.next() {
        Some(l) if l.toks[0].tok == Tok::Punct('}') => {
            let mut p = Parser::new(l.toks.clone());
            p.next();
            end_of_line(&p)?;
        }
        Some(l) => return err(l.toks[0].loc, format!("expected `}}`, found {}", l.toks[0].tok)),
        None => return err(body.last().unwrap_or(head).end, "expected `}`, found end of input"),
    }
    if let Some(l) = rest.next() {
        return err(l.toks[0].loc, format!("expected end of input after `}}`, found {}", l.toks[0].tok));
    }
    let buffers = r
        .buffers
        .into_iter()
        .map(|b| b.map(|(b, _)| b).unwrap_or(Buffer { ty: TensorType::new(DType::F32, vec![]), name: None }))
        .collect();
    Ok(DeviceProgram { name, mesh, buffers, inputs, outputs, steps })
}

fn end_of_line(p: &Parser) -> PResult<()> {
    match p.peek().tok {
        Tok::Eof => Ok(()),
        _ => p.error("end of line"),
    }
}

fn keyword(p: &mut Parser, word: &str) -> PResult<Loc> {
    match &p.peek().tok {
        Tok::Ident(s) if s == word => Ok(p.next().loc),
        _ => p.error(&format!("`{word}`")),
    }
}

fn number(p: &mut Parser, what: &str) -> PResult<(u64, Loc)> {
    match p.peek().tok.clone() {
        Tok::Number(s) => {
            let t = p.next();
            match s.parse::<u64>() {
                Ok(n) => Ok((n, t.loc)),
                Err(_) => err(t.loc, format!("expected {what}, found `{s}`")),
            }
        }
        _ => p.error(what),
    }
}

fn small(n: (u64, Loc), what: &str) -> PResult<usize> {
    match u32::try_from(n.0) {
        Ok(v) => Ok(v as usize),
        Err(_) => err(n.1, format!("{what} {} is too large", n.0)),
    }
}

/// `device_program @name mesh [a=2, b=4] {`.
fn header(line: &Line) -> PResult<(String, MeshShape)> {
    let mut p = Parser::new(line.toks.clone());
    keyword(&mut p, "device_program")?;
    let name = match p.peek().tok.clone() {
        Tok::Func(n) => {
            p.next();
            n
        }
        _ => return p.error("a program name `@name`"),
    };
    keyword(&mut p, "mesh")?;
    p.expect('[')?;
    let axes = p.list(']', |p| {
        let (axis, _) = p.ident("a mesh axis `name=size`")?;
        p.expect('=')?;
        let size = number(p, "an axis size (a positive integer)")?;
        Ok((axis, small(size, "axis size")?))
    })?;
    let close = p.expect(']')?;
    p.expect('{')?;
    end_of_line(&p)?;
    let mesh = MeshShape { axes };
    if let Err(m) = mesh.check() {
        return err(close, m);
    }
    Ok((name, mesh))
}

/// `input %0 : f32[4,16]  // x`.
fn input_line(line: &Line, r: &mut Reader) -> PResult<BufferId> {
    let mut p = Parser::new(line.toks.clone());
    keyword(&mut p, "input")?;
    let n = p.value("an input buffer `%N`")?;
    p.expect(':')?;
    let (ty, _) = p.tensor_type()?;
    end_of_line(&p)?;
    r.define(&n, ty, line.comment.clone())
}

/// `return %3, %4`.
fn return_line(line: &Line, r: &mut Reader) -> PResult<Vec<BufferId>> {
    let mut p = Parser::new(line.toks.clone());
    keyword(&mut p, "return")?;
    let names = if matches!(p.peek().tok, Tok::Value(_)) { p.list('\0', |p| p.value("a buffer"))? } else { vec![] };
    end_of_line(&p)?;
    names.iter().map(|n| r.id(n)).collect()
}

fn step_line(line: &Line, r: &mut Reader) -> PResult<Step> {
    let toks = &line.toks;
    if toks[0].tok == Tok::Ident("done".into()) {
        let mut p = Parser::new(toks.clone());
        p.next();
        let n = p.value("the buffer of a started collective `%N`")?;
        end_of_line(&p)?;
        return Ok(Step::Done(r.id(&n)?));
    }
    if toks[0].tok == Tok::Ident("free".into()) {
        let mut p = Parser::new(toks.clone());
        p.next();
        let names = p.list('\0', |p| p.value("a buffer to free"))?;
        end_of_line(&p)?;
        return Ok(Step::Free(names.iter().map(|n| r.id(n)).collect::<PResult<_>>()?));
    }
    // The mnemonic follows the first `=`.
    let mnemonic = toks.iter().position(|t| t.tok == Tok::Punct('=')).and_then(|i| match &toks.get(i + 1)?.tok {
        Tok::Ident(s)
            if DEVICE_STEPS.contains(&s.as_str())
                || s.strip_suffix("_start").is_some_and(|c| c != "shard_slice" && DEVICE_STEPS.contains(&c)) =>
        {
            Some(s.clone())
        }
        _ => None,
    });
    match mnemonic {
        Some(m) => device_step(line, &m, r),
        None => compute_step(line, r),
    }
}

/// A compute step: an IR instruction with buffer operands and local types.
fn compute_step(line: &Line, r: &mut Reader) -> PResult<Step> {
    let mut p = Parser::new(line.toks.clone());
    let start = p.peek().loc;
    if !matches!(p.peek().tok, Tok::Value(_)) {
        return p.error("a step (`%N = ...`, `free`, `input` or `return`)");
    }
    let inst = p.instruction()?;
    end_of_line(&p)?;
    let Some(types) = inst.types else {
        return err(line.end, "expected `:` and the local result types (device programs spell out every type)");
    };
    let name = if inst.results.len() == 1 { line.comment.clone() } else { None };
    let mut outputs = Vec::new();
    for (n, t) in inst.results.iter().zip(types) {
        if t.sharding.is_some() {
            return err(t.loc, "a device program's buffers have local types, without shardings");
        }
        outputs.push(r.define(n, t.ty, name.clone())?);
    }
    if outputs.is_empty() {
        return err(start, "a compute step defines at least one buffer");
    }
    let inputs = inst.operands.iter().map(|n| r.id(n)).collect::<PResult<_>>()?;
    Ok(Step::Compute { op: inst.op, inputs, outputs })
}

/// The value of one collective attribute.
enum Value {
    Int(usize),
    Axes(Vec<String>),
    Op(ReduceOp),
    Pairs(Vec<(u32, u32)>),
    Dims(Vec<Vec<String>>),
}

/// `{name = value, ...}` for shard slices and collectives; `known` lists the
/// names `m` takes, in printing order.
fn attrs(p: &mut Parser, m: &str, known: &[&str]) -> PResult<Vec<Value>> {
    let open = p.expect('{')?;
    let mut found: Vec<Option<(Value, Loc)>> = known.iter().map(|_| None).collect();
    p.list('}', |p| {
        let (name, loc) = p.ident("an attribute name")?;
        let Some(i) = known.iter().position(|k| *k == name) else {
            let names: Vec<String> = known.iter().map(|k| format!("`{k}`")).collect();
            return err(loc, format!("unknown attribute `{name}` for `{m}` (it takes {})", names.join(", ")));
        };
        p.expect('=')?;
        let v = match name.as_str() {
            "axes" => Value::Axes(axis_list(p)?),
            "op" => {
                let (s, l) = p.ident("a reduction (`sum`, `max` or `min`)")?;
                match ReduceOp::ALL.into_iter().find(|&r| super::printer::reduce_name(r) == s) {
                    Some(r) => Value::Op(r),
                    None => return err(l, format!("expected a reduction (`sum`, `max` or `min`), found `{s}`")),
                }
            }
            "pairs" => {
                p.expect('[')?;
                let pairs = p.list(']', |p| {
                    p.expect('(')?;
                    let s = number(p, "a source device")?;
                    p.expect(',')?;
                    let t = number(p, "a target device")?;
                    p.expect(')')?;
                    Ok((small(s, "device")? as u32, small(t, "device")? as u32))
                })?;
                p.expect(']')?;
                Value::Pairs(pairs)
            }
            "dims" => {
                p.expect('[')?;
                let dims = p.list(']', |p| {
                    p.expect('{')?;
                    let axes = p.list('}', |p| Ok(p.ident("a mesh axis name")?.0))?;
                    p.expect('}')?;
                    Ok(axes)
                })?;
                p.expect(']')?;
                Value::Dims(dims)
            }
            _ => Value::Int(small(number(p, "a dimension (a non-negative integer)")?, "dimension")?),
        };
        if let Some((_, first)) = &found[i] {
            return err(loc, format!("attribute `{name}` is given twice (first at {first})"));
        }
        found[i] = Some((v, loc));
        Ok(())
    })?;
    p.expect('}')?;
    let mut out = Vec::new();
    for (k, v) in known.iter().zip(found) {
        match v {
            Some((v, _)) => out.push(v),
            None => return err(open, format!("`{m}` needs attribute `{k}`")),
        }
    }
    Ok(out)
}

fn axis_list(p: &mut Parser) -> PResult<Vec<String>> {
    p.expect('[')?;
    let axes = p.list(']', |p| Ok(p.ident("a mesh axis name")?.0))?;
    p.expect(']')?;
    Ok(axes)
}

/// `%5 = all_reduce %4 {axes = [model], op = sum} : f32[4,16]  // name`.
/// `%5 = all_reduce_start %4 {...} : f32[4,16]` starts the same collective.
fn device_step(line: &Line, m: &str, r: &mut Reader) -> PResult<Step> {
    let (m, started) = match m.strip_suffix("_start") {
        Some(c) => (c, true),
        None => (m, false),
    };
    let mut p = Parser::new(line.toks.clone());
    let out = p.value("the step's result buffer `%N`")?;
    p.expect('=')?;
    p.next(); // the mnemonic, checked by the caller
    let input = p.value("the operand buffer `%N`")?;
    let known: &[&str] = match m {
        "shard_slice" => &["dims"],
        "all_gather" => &["dim", "axes"],
        "all_reduce" => &["axes", "op"],
        "reduce_scatter" => &["dim", "axes", "op"],
        "all_to_all" => &["split_dim", "concat_dim", "axes"],
        _ => &["pairs"],
    };
    let vals = attrs(&mut p, m, known)?;
    p.expect(':')?;
    let (ty, _) = p.tensor_type()?;
    end_of_line(&p)?;
    let input = r.id(&input)?;
    let output = r.define(&out, ty, line.comment.clone())?;
    let mut v = Vals(vals.into_iter());
    let step = |op| if started { Step::Start { op, input, output } } else { Step::Collective { op, input, output } };
    Ok(match m {
        "shard_slice" => Step::ShardSlice { input, output, dims: v.dims() },
        "all_gather" => step(Collective::AllGather { dim: v.int(), axes: v.axes() }),
        "all_reduce" => step(Collective::AllReduce { axes: v.axes(), op: v.op() }),
        "reduce_scatter" => step(Collective::ReduceScatter { dim: v.int(), axes: v.axes(), op: v.op() }),
        "all_to_all" => step(Collective::AllToAll { split_dim: v.int(), concat_dim: v.int(), axes: v.axes() }),
        _ => step(Collective::CollectivePermute { pairs: v.pairs() }),
    })
}

/// The attribute values of one step in `known` order; each is read as the
/// kind its name gives it (`attrs` parsed it so), so the fallbacks are
/// never taken.
struct Vals(std::vec::IntoIter<Value>);

impl Vals {
    fn int(&mut self) -> usize {
        match self.0.next() {
            Some(Value::Int(n)) => n,
            _ => 0,
        }
    }
    fn axes(&mut self) -> Vec<String> {
        match self.0.next() {
            Some(Value::Axes(a)) => a,
            _ => Vec::new(),
        }
    }
    fn op(&mut self) -> ReduceOp {
        match self.0.next() {
            Some(Value::Op(o)) => o,
            _ => ReduceOp::Sum,
        }
    }
    fn pairs(&mut self) -> Vec<(u32, u32)> {
        match self.0.next() {
            Some(Value::Pairs(p)) => p,
            _ => Vec::new(),
        }
    }
    fn dims(&mut self) -> Vec<Vec<String>> {
        match self.0.next() {
            Some(Value::Dims(d)) => d,
            _ => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::{print_program, verify_program};

    const EXAMPLE: &str = "\
device_program @main mesh [data=2, model=4] {
  input %0 : f32[4,16]  // x
  input %1 : f32[16,8]  // w1
  %2 = constant [[1.0, 2.0]] : f32[1,2]
  %3 = dot_general %0, %1 {lhs_contract = [1], rhs_contract = [0]} : f32[4,8]  // h
  free %1
  %4 = transpose %3 {perm = [1, 0]} : f32[8,4]
  %5 = all_reduce %0 {axes = [model], op = max} : f32[4,16]
  %6 = shard_slice %5 {dims = [{data}, {}]} : f32[2,16]
  %7 = all_to_all %6 {split_dim = 1, concat_dim = 0, axes = [model]} : f32[8,4]
  %8 = collective_permute %7 {pairs = [(0, 1), (1, 0)]} : f32[8,4]
  %9 = reduce_scatter %4 {dim = 0, axes = [model, data], op = sum} : f32[1,4]
  %10 = all_gather %9 {dim = 1, axes = [data]} : f32[1,8]  // g
  return %8, %10, %2
}
";

    #[test]
    fn example_round_trips() {
        let p = parse_program(EXAMPLE).unwrap();
        assert_eq!(print_program(&p), EXAMPLE);
        assert_eq!(p.buffers[3].name.as_deref(), Some("h"));
        assert_eq!(p.buffers[2].name, None);
        assert_eq!(p.inputs, vec![BufferId(0), BufferId(1)]);
        assert_eq!(
            p.steps[7],
            Step::Collective {
                op: Collective::CollectivePermute { pairs: vec![(0, 1), (1, 0)] },
                input: BufferId(7),
                output: BufferId(8)
            }
        );
        assert_eq!(parse_program(&print_program(&p)).unwrap(), p);
        assert_eq!(p.to_string(), EXAMPLE);
        assert_eq!(EXAMPLE.parse::<DeviceProgram>().unwrap(), p);
    }

    #[test]
    fn started_collectives_round_trip_and_verify() {
        let text = "\
device_program @f mesh [data=2] {
  input %0 : f32[4]  // g
  %1 = all_reduce_start %0 {axes = [data], op = sum} : f32[4]  // g_sum
  free %0
  %2 = all_gather_start %1 {dim = 0, axes = [data]} : f32[8]
  %3 = neg %1 : f32[4]
  done %1
  done %2
  return %1, %2, %3
}
";
        let p = parse_program(text).unwrap();
        assert_eq!(
            p.steps[0],
            Step::Start {
                op: Collective::AllReduce { axes: vec!["data".into()], op: crate::ReduceOp::Sum },
                input: BufferId(0),
                output: BufferId(1)
            }
        );
        assert_eq!(p.steps[4], Step::Done(BufferId(1)));
        assert_eq!(print_program(&p), text);
        // %1 is read (by the all_gather start and by `neg`) before its done.
        let e = verify_program(&p).unwrap_err().to_string();
        assert!(e.contains("step 2 (`all_gather_start`): buffer %1 is used before its collective is done"), "{e}");
        assert!(e.contains("step 3 (`neg`): buffer %1 is used before its collective is done"), "{e}");
        let fixed = text
            .replace("  %2 = all_gather_start %1 {dim = 0, axes = [data]} : f32[8]\n", "")
            .replace("  %3 = neg %1 : f32[4]\n  done %1\n", "  done %1\n  %3 = neg %1 : f32[4]\n")
            .replace("  done %2\n", "  %2 = all_gather_start %1 {dim = 0, axes = [data]} : f32[8]\n  done %2\n");
        verify_program(&parse_program(&fixed).unwrap()).unwrap();
        let never = fixed.replace("  done %2\n", "");
        let e = verify_program(&parse_program(&never).unwrap()).unwrap_err().to_string();
        assert!(e.contains("the end: the collective started for %2 is never done"), "{e}");
        let twice = fixed.replace("  done %2\n", "  done %2\n  done %2\n");
        let e = verify_program(&parse_program(&twice).unwrap()).unwrap_err().to_string();
        assert!(e.contains("`done`): buffer %2 has no collective in flight"), "{e}");
        let e = error(&fixed.replace("all_gather_start", "shard_slice_start"));
        assert!(e.contains("7:8: unknown op `shard_slice_start`"), "{e}");
    }

    #[test]
    fn empty_mesh_and_comment_lines() {
        let text = "// a comment\ndevice_program @f mesh [] {\n  // note\n  return\n}\n";
        let p = parse_program(text).unwrap();
        assert!(p.steps.is_empty() && p.mesh.axes.is_empty());
        assert_eq!(print_program(&p), "device_program @f mesh [] {\n  return\n}\n");
        verify_program(&p).unwrap();
    }

    fn error(text: &str) -> String {
        parse_program(text).unwrap_err().to_string()
    }

    #[test]
    fn errors_are_located() {
        let head = "device_program @f mesh [x=2] {\n";
        let cases = [
            ("", "1:1: expected `device_program`, found end of input"),
            ("device_program f", "1:16: expected a program name `@name`, found `f`"),
            (
                "device_program @f mesh [x=0] {\n  return\n}",
                "1:28: mesh {x=0}: axis 0 must have a name and a size >= 1",
            ),
            ("  input %a : f32[2]\n  return\n}", "2:9: expected a buffer `%N` (N below 16777216), found `%a`"),
            (
                "  input %0 : f32[2]\n  input %0 : f32[2]\n  return\n}",
                "3:9: buffer `%0` is defined twice (first at 2:9)",
            ),
            (
                "  %1 = all_reduce %0 {axes = [x], op = prod} : f32[2]\n  return\n}",
                "2:40: expected a reduction (`sum`, `max` or `min`), found `prod`",
            ),
            ("  %1 = all_gather %0 {axes = [x]} : f32[4]\n  return\n}", "2:22: `all_gather` needs attribute `dim`"),
            (
                "  %1 = all_gather %0 {dim = 0, axis = [x]} : f32[4]\n  return\n}",
                "2:32: unknown attribute `axis` for `all_gather` (it takes `dim`, `axes`)",
            ),
            ("  %1 = collective_permute %0 {pairs = [(0 1)]} : f32[4]\n  return\n}", "2:43: expected `,`, found `1`"),
            (
                "  %1 = neg %0\n  return\n}",
                "2:14: expected `:` and the local result types (device programs spell out every type)",
            ),
            ("  %1 = ngg %0 : f32[2]\n  return\n}", "2:8: unknown op `ngg`; did you mean `neg`?"),
            ("  free %0 %1\n  return\n}", "2:11: expected end of line, found `%1`"),
            ("  return %0\n", "2:12: expected `}`, found end of input"),
            ("  return %0\n}\n}", "4:1: expected end of input after `}`, found `}`"),
            ("  %1 = neg %0 : f32[2]\n", "2:23: expected `return` and `}`, found end of input"),
            (
                "  %1 = neg %0 : f32[2] {sharding = [{x}]}\n  return\n}",
                "2:17: a device program's buffers have local types, without shardings",
            ),
        ];
        let mut wrong = Vec::new();
        for (body, want) in cases {
            let text = if body.starts_with("device_program") || body.is_empty() {
                body.to_string()
            } else {
                format!("{head}{body}")
            };
            let got = error(&text);
            if got != format!("parse error at {want}") {
                wrong.push(format!("{text}\n  got: {got}\n want: {want}"));
            }
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }
}

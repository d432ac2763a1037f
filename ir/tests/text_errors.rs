//! Every kind of parse error, with its exact message and position, and the
//! convenience entry points.

use weft_ir::text::{parse_and_verify, parse_function, parse_module, print_module};
use weft_ir::{IrError, Loc, ValueDef};

/// A one-function module around `body` (instructions, then `return`).
fn func(params: &str, results: &str, body: &str) -> String {
    format!("func @f({params}) -> ({results}) {{\n{body}\n}}\n")
}

fn parse_err(text: &str) -> String {
    match parse_module(text) {
        Err(IrError::Parse(e)) => e.to_string(),
        other => panic!("expected a parse error for\n{text}\ngot {other:?}"),
    }
}

#[test]
fn name_resolution_errors() {
    let cases = [
        ("  %y = neg %z\n  return %y", "2:12: use of undefined value `%z`; did you mean `%x`?"),
        ("  %y = neg %x\n  %y = neg %x\n  return %y", "3:3: value `%y` is defined twice (first at 2:3)"),
        (
            "  %y = add %x, %w\n  %w = neg %x\n  return %y",
            "2:16: `%w` is used before its definition at 3:3 (instructions run in order)",
        ),
        ("  %1 = neg %0\n  return %1", "2:12: `%0` is the value named `%x`; refer to it by its name"),
        ("  %y = neg %x\n  return %yy", "3:10: use of undefined value `%yy`; did you mean `%y`?"),
        (
            "  %5 = neg %x\n  return %5",
            "2:3: `%5` is not the next value id: unnamed values are numbered in definition order (parameters first, \
             then instruction results), so this one must be `%1`; to label it freely, give it a name such as `%v5`",
        ),
    ];
    for (body, want) in cases {
        assert_eq!(parse_err(&func("%x: f32[2]", "f32[2]", body)), want);
    }
    assert_eq!(
        parse_err(&func("%x: f32[2], %x: f32[2]", "f32[2]", "  return %x")),
        "1:21: value `%x` is defined twice (first at 1:9)"
    );
    let twice = format!("{}\n{}", func("", "", "  return"), func("", "", "  return"));
    assert_eq!(parse_err(&twice), "5:1: function @f is defined twice (first at 1:1)");
}

#[test]
fn op_and_attribute_errors() {
    let cases = [
        ("%y = ad %x, %x", "2:8: unknown op `ad`; did you mean `add`?"),
        ("%y = transpose %x", "2:8: `transpose` needs attribute `perm`"),
        ("%y = transpose %x {perm = [0], foo = 1}", "2:34: unknown attribute `foo` for `transpose` (it takes `perm`)"),
        ("%y = reduce_sum %x {dim = [0]}", "2:23: unknown attribute `dim` for `reduce_sum`; did you mean `dims`?"),
        ("%y = add %x, %x {perm = [0]}", "2:20: unknown attribute `perm` for `add` (it takes no attributes)"),
        ("%y = transpose %x {perm = [0], perm = [0]}", "2:34: attribute `perm` is given twice (first at 2:22)"),
        ("%y = transpose %x {perm = 0}", "2:29: attribute `perm` must be a list `[...]`, found an integer"),
        (
            "%y = transpose %x {perm = [-1]}",
            "2:30: attribute `perm` must be a list of non-negative integers, found `-1`",
        ),
        ("%y = slice %x {start = [0], limit = [2], stride = [1.5]}", "2:54: expected an integer, found `1.5`"),
        ("%y = reshard %x {sharding = [{a, ?, b}]}", "2:36: `?` must come last in a dimension's axis list"),
        (
            "%y = reshard %x {sharding = [{a}], unreduced = {?}}",
            "2:51: attribute `unreduced` lists mesh axes; `?` is not allowed here",
        ),
        ("%y = reshard %x {sharding = [[0]]}", "2:32: attribute `sharding` must be an axis set `{...}`, found a list"),
    ];
    for (inst, want) in cases {
        assert_eq!(parse_err(&func("%x: f32[2]", "f32[2]", &format!("  {inst}\n  return %y"))), want, "{inst}");
    }
    let ann = func("%x: f32[2] {shard = [{a}]}", "f32[2]", "  return %x");
    assert_eq!(parse_err(&ann), "1:21: unknown attribute `shard` for a value annotation; did you mean `sharding`?");
}

#[test]
fn literal_errors() {
    let cases = [
        ("[1, 2] : f32[2,2]", "2:18: expected `[` for dimension 1 of the f32[2,2] constant (a list of 2), found `1`"),
        (
            "[[1, 2], [3]] : f32[2,2]",
            "2:26: dimension 1 of the f32[2,2] constant has extent 2, but this list has 1 element",
        ),
        ("[[[1]], [[2]]] : f32[2,1]", "2:19: the f32[2,1] constant nests 2 lists deep, found `[` at depth 2"),
        ("[1, 2.5] : i32[2]", "2:21: an i32 constant takes integers, found `2.5`"),
        ("[1, 3000000000] : i32[2]", "2:21: `3000000000` is out of range for i32 (-2147483648 to 2147483647)"),
        ("-1 : u32[2]", "2:17: `-1` is out of range for u32 (0 to 4294967295)"),
        ("1e39 : f32[2]", "2:17: `1e39` is out of range for f32 (it would round to infinity)"),
        ("1 : bool[2]", "2:17: a bool constant takes `true` or `false`, found `1`"),
        ("true : f32[2]", "2:17: an f32 constant takes numbers, `inf`, `-inf` or `nan`, found `true`"),
        ("1.2.3 : f32[2]", "2:17: invalid number `1.2.3`"),
        ("[1] : f32[]", "2:17: a constant of type f32[] is a single value, found `[`"),
        (
            "[1, 2,] : f32[2]",
            "2:23: expected a literal (a number, `true`, `false`, `inf`, `-inf`, `nan` or `[`), found `]`",
        ),
    ];
    for (lit, want) in cases {
        let body = format!("  %y = constant {lit}\n  return");
        assert_eq!(parse_err(&func("", "", &body)), want, "{lit}");
    }
}

#[test]
fn type_and_count_errors() {
    let cases = [
        ("%y, %z = neg %x : f32[2]", "2:21: 2 result values but 1 result type"),
        ("%y, %z = neg %x", "2:3: `neg` produces 1 result but 2 values are bound"),
        ("%y = add %x, %x, %x", "2:3: cannot infer the result type: `add` takes 2 operands, got 3"),
        ("%y = call @g(%x)", "2:3: cannot infer the result type: call to unknown function @g"),
        (
            "%y = reshape %x",
            "2:8: `reshape` needs a result type annotation (`: <type>` after its operands): its result type is not \
             determined by its operands",
        ),
        (
            "%y = constant 1.0",
            "2:8: `constant` needs a result type annotation (`: <type>` after its operands): its result type is not \
             determined by its operands",
        ),
        (
            "%y = neg %x : f8[2]",
            "2:17: unknown element type `f8` (expected one of f32, f64, bf16, f16, i32, u32, bool)",
        ),
        ("%y = neg %x : f32[2", "3:3: expected `]`, found `return`"),
    ];
    for (inst, want) in cases {
        assert_eq!(parse_err(&func("%x: f32[2]", "f32[2]", &format!("  {inst}\n  return %y"))), want, "{inst}");
    }
    assert_eq!(
        parse_err(&func("%x: f32[2]", "f32[3]", "  return %x")),
        "2:10: result 0 (`%x`) has type f32[2] but @f declares f32[3]"
    );
    assert_eq!(
        parse_err(&func("%x: f32[2]", "f32[2], f32[2]", "  return %x")),
        "2:3: `return` gives 1 value but @f declares 2 results"
    );
}

#[test]
fn syntax_errors() {
    assert_eq!(parse_err("func @f(%x: f32[2] %y: f32[2]) -> () {\n  return\n}"), "1:20: expected `)`, found `%y`");
    assert_eq!(parse_err("  func f"), "1:8: expected a function name `@name`, found `f`");
    assert_eq!(parse_err("fn @f() -> () {}"), "1:1: expected `func`, found `fn`");
    assert_eq!(parse_err("func @f() {\n  return\n}"), "1:11: expected `->` and the result types, found `{`");
    assert_eq!(
        parse_err(&func("%x: f32[2]", "f32[2]", "  %y = neg %x")),
        "3:1: expected an instruction or `return`, found `}`"
    );
    assert_eq!(parse_err("func @f() -> () {\n  return\n"), "3:1: expected `}`, found end of input");
    assert_eq!(parse_err("func @f() -> () {\n  $\n}"), "2:3: unexpected character `$`");
    assert_eq!(parse_err("func @f(% x: f32[]) -> () {}"), "1:10: expected a value name or id after `%`, found ` `");
}

#[test]
fn sets_locations_and_ids() {
    let text =
        "// header\nfunc @f(%0: f32[2], %b: f32[2]) -> (f32[2]) {\n  %2 = add %0, %b\n  %c = neg %2\n  return %c\n}\n";
    let f = parse_function(text).unwrap();
    assert_eq!(f.loc, Some(Loc { line: 2, col: 1 }));
    assert_eq!(f.return_loc, Some(Loc { line: 5, col: 3 }));
    assert_eq!(f.insts[1].loc, Some(Loc { line: 4, col: 3 }));
    assert_eq!(f.value_by_name("c").map(|v| v.0), Some(3));
    assert_eq!(f.values[0].name, None);
    assert_eq!(f.values[3].def, ValueDef::Inst { inst: weft_ir::InstId(1), index: 0 });
    let two = format!("{text}\n{}", text.replace("@f", "@g"));
    assert!(parse_function(&two).unwrap_err().to_string().contains("expected exactly one function, found 2"));
}

#[test]
fn parse_and_verify_reports_verifier_errors() {
    let ok = func("%x: f32[2]", "f32[2]", "  %y = neg %x\n  return %y");
    assert_eq!(print_module(&parse_and_verify(&ok).unwrap()), parse_module(&ok).map(|m| print_module(&m)).unwrap());
    let bad = func("%x: f32[2]", "f32[3]", "  %y = neg %x : f32[3]\n  return %y");
    let m = parse_module(&bad).unwrap();
    assert_eq!(m.functions[0].values[1].ty.shape, vec![3], "the wrong annotation is kept as written");
    match parse_and_verify(&bad) {
        Err(IrError::Verify(d)) => {
            assert_eq!(d.len(), 1);
            assert_eq!(d[0].to_string(), "2:3: in @f: `%y = neg`: is annotated f32[3] but `neg` gives f32[2]");
        }
        other => panic!("{other:?}"),
    }
}

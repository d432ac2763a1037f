//! Property tests: the parser never panics. Valid files are mutated byte by
//! byte and token by token; every mutant must give an error or a module,
//! and a module it gives must print and parse back to the same text (and
//! survive the verifier without panicking).

mod text_gen;

use proptest::prelude::*;
use text_gen::Choices;
use weft_ir::text::{parse_module, print_module};

const SAMPLE: &str = "// comment
func @mlp(%x: f32[8,16] {sharding = [{data}, {}]}, %w: f32[16,4]) -> (f32[8,4] {sharding = [{data}, {?}]}) {
  %c = constant 0.0 : f32[8,4]
  %3 = dot_general %x, %w {lhs_contract = [1], rhs_contract = [0]} : f32[8,4]
  %4 = max %3, %c
  %5 = sharding_constraint %4 {sharding = [{data}, {model, ?}], unreduced = {x}}
  %6, %7 = call @other(%5, %4)
  %k = constant [[1, -2], [3, 4]] : i32[2,2]
  %z = constant -3 : i32[]
  %p = pad %k, %z {low = [1, -1], high = [0, 2], interior = [1, 0]}
  %b = constant [true, false] : bool[2]
  %h = constant [-inf, nan, 1e-8] : bf16[3]
  return %4
}

func @other(%a: f32[8,4], %b: f32[8,4]) -> (f32[], f32[8,4]) {
  %s = reduce_sum %a {dims = [0, 1]}
  %t = slice %b {start = [0, 0], limit = [8, 4], stride = [2, 1]} : f32[4,4]
  %i = iota {dim = 1} : i32[8,4]
  %r = reshape %t : f32[16]
  return %s, %b
}
";

/// Whatever the parser accepts must print and re-parse to the same text.
fn check(text: &str) -> Result<(), TestCaseError> {
    if let Ok(m) = parse_module(text) {
        let _ = weft_ir::verify_module(&m);
        let printed = print_module(&m);
        let again = parse_module(&printed).map_err(|e| TestCaseError::fail(format!("{e}\n{printed}")))?;
        prop_assert_eq!(print_module(&again), printed);
    }
    Ok(())
}

/// Splits text into tokens and the whitespace between them, so that joining
/// the pieces gives the text back.
fn pieces(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let class = |c: char| {
        if c.is_whitespace() {
            0
        } else if "()[]{},:=?".contains(c) {
            1
        } else {
            2
        }
    };
    let mut prev = None;
    for c in text.chars() {
        let k = class(c);
        if prev == Some(k) && k != 1 {
            out.last_mut().expect("started").push(c);
        } else {
            out.push(c.to_string());
        }
        prev = Some(k);
    }
    out
}

fn corpus(data: Vec<u32>, pick_sample: bool) -> String {
    if pick_sample {
        SAMPLE.to_string()
    } else {
        print_module(&text_gen::module(&mut Choices::new(data)))
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn byte_mutations_never_panic(
        data in prop::collection::vec(any::<u32>(), 0..300),
        sample in any::<bool>(),
        edits in prop::collection::vec((any::<prop::sample::Index>(), 0u8..4, any::<u8>()), 1..6),
    ) {
        let mut bytes = corpus(data, sample).into_bytes();
        for (at, kind, b) in edits {
            if bytes.is_empty() {
                break;
            }
            let i = at.index(bytes.len());
            let special = b" %@[]{}(),:=-?.0123456789ex\n/";
            let b = if b < 128 { b } else { special[b as usize % special.len()] };
            match kind {
                0 => bytes[i] = b,
                1 => bytes.insert(i, b),
                2 => { bytes.remove(i); }
                _ => bytes.truncate(i),
            }
        }
        check(&String::from_utf8_lossy(&bytes))?;
    }

    #[test]
    fn token_mutations_never_panic(
        data in prop::collection::vec(any::<u32>(), 0..300),
        sample in any::<bool>(),
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<prop::sample::Index>(), 0u8..3), 1..4),
    ) {
        let mut toks = pieces(&corpus(data, sample));
        for (a, b, kind) in edits {
            let (i, j) = (a.index(toks.len()), b.index(toks.len()));
            match kind {
                0 => { toks.remove(i); }
                1 => { let t = toks[i].clone(); toks.insert(j, t); }
                _ => toks.swap(i, j),
            }
            if toks.is_empty() {
                break;
            }
        }
        check(&toks.concat())?;
    }
}

#[test]
fn sample_parses_and_round_trips() {
    let m = parse_module(SAMPLE).unwrap();
    weft_ir::verify_module(&m).unwrap();
    check(SAMPLE).unwrap();
    assert_eq!(pieces(SAMPLE).concat(), SAMPLE);
}

#[test]
fn hostile_inputs_are_errors() {
    let deep = format!("func @f() -> () {{\n  %c = constant {} : f32[1]\n  return\n}}", "[".repeat(100_000));
    assert!(parse_module(&deep).unwrap_err().to_string().contains("nesting deeper than"));
    let huge = "func @f(%x: f32[4294967296,4294967296,4294967296]) -> () {\n  return\n}";
    assert!(parse_module(huge).unwrap_err().to_string().contains("too many elements"));
    let big = "func @f(%x: f32[99999999999999999999]) -> () {\n  return\n}";
    assert!(parse_module(big).unwrap_err().to_string().contains("dimension extent"));
    let pad = "func @f(%x: f32[4294967296], %z: f32[]) -> () {
  %p = pad %x, %z {low = [0], high = [0], interior = [9223372036854775807]}
  return\n}";
    assert!(parse_module(pad).unwrap_err().to_string().contains("too large"), "{:?}", parse_module(pad));
    for s in ["", "\u{0}", "func", "func @", "%", "func @f(%x: f32[] {sharding = [{?, a}]}) -> () {\n return\n}"] {
        let _ = parse_module(s);
    }
    assert_eq!(parse_module("").unwrap().functions.len(), 0);
}

//! Property tests: random well-typed modules round-trip exactly through the
//! text format, with and without the result types the parser can infer.

mod text_gen;

use proptest::prelude::*;
use std::collections::BTreeSet;
use text_gen::Choices;
use weft_ir::text::{parse_module, print_module};
use weft_ir::{verify_module, Module, Op};

/// The module with every source position removed (generated modules have
/// none; parsed ones do).
fn strip_locs(mut m: Module) -> Module {
    for f in &mut m.functions {
        f.loc = None;
        f.return_loc = None;
        for i in &mut f.insts {
            i.loc = None;
        }
    }
    m
}

/// The text with the result types removed from every instruction whose type
/// the parser can infer (and whose results carry no sharding annotation).
fn drop_inferable_types(m: &Module, text: &str) -> String {
    let mut out = String::new();
    let mut insts = m.functions.iter().flat_map(|f| f.insts.iter());
    for line in text.lines() {
        let is_inst = line.starts_with("  ") && !line.starts_with("  return");
        let mut kept = line;
        if is_inst {
            let inst = insts.next().expect("one line per instruction");
            if let Some((head, types)) = line.split_once(" : ") {
                if !inst.op.result_type_in_attrs() && !types.contains('{') {
                    kept = head;
                }
            }
        }
        out.push_str(kept);
        out.push('\n');
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn generated_modules_round_trip(data in prop::collection::vec(any::<u32>(), 0..500)) {
        let m = text_gen::module(&mut Choices::new(data));
        verify_module(&m).map_err(|e| TestCaseError::fail(format!("generator made an invalid module: {e}")))?;
        let text = print_module(&m);
        let parsed = parse_module(&text).map_err(|e| TestCaseError::fail(format!("{e}\n{text}")))?;
        prop_assert_eq!(print_module(&parsed), text.clone());
        prop_assert_eq!(&strip_locs(parsed.clone()), &m, "{}", text);
        verify_module(&parsed).map_err(|e| TestCaseError::fail(format!("{e}\n{text}")))?;

        let short = drop_inferable_types(&m, &text);
        let inferred = parse_module(&short).map_err(|e| TestCaseError::fail(format!("{e}\n{short}")))?;
        prop_assert_eq!(print_module(&inferred), text, "{}", short);
    }
}

/// Texts the generator must produce somewhere.
const NEEDLES: [&str; 11] =
    ["nan", "inf", "-inf", "sharding =", "unreduced", "?}", "%x", "%params.", "%_t", "-> ()", "{remat = true}"];

/// The generator reaches every op, every dtype in constants, dense and splat
/// literals, NaN and infinities, names, shardings and calls.
#[test]
fn generator_covers_the_ir() {
    let mut seen = BTreeSet::new();
    let mut state = 0x2545_f491_4f6c_dd1du64;
    for _ in 0..400 {
        let data: Vec<u32> = (0..500)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state >> 32) as u32
            })
            .collect();
        let m = text_gen::module(&mut Choices::new(data));
        let text = print_module(&m);
        for f in &m.functions {
            for i in &f.insts {
                seen.insert(i.op.name().to_string());
                if let Op::Constant(l) = &i.op {
                    seen.insert(format!("constant {}", l.ty.dtype));
                    seen.insert(format!("{:?}", std::mem::discriminant(&l.data)));
                }
            }
        }
        for needle in NEEDLES {
            if text.contains(needle) {
                seen.insert(needle.to_string());
            }
        }
    }
    let mut want: Vec<String> = weft_ir::UnaryOp::ALL.iter().map(|u| u.name().to_string()).collect();
    want.extend(weft_ir::BinaryOp::ALL.iter().map(|b| b.name().to_string()));
    want.extend(weft_ir::CompareOp::ALL.iter().map(|c| c.name().to_string()));
    want.extend(weft_ir::ReduceOp::ALL.iter().map(|r| r.name().to_string()));
    want.extend(weft_ir::IndexOp::names().map(str::to_string));
    want.extend(weft_ir::DType::ALL.iter().map(|d| format!("constant {d}")));
    for s in ["constant", "iota", "select", "convert", "broadcast_in_dim", "reshape", "transpose", "slice"] {
        want.push(s.to_string());
    }
    for s in ["concatenate", "pad", "dot_general", "call", "sharding_constraint", "reshard"] {
        want.push(s.to_string());
    }
    for s in NEEDLES {
        want.push(s.to_string());
    }
    let missing: Vec<&String> = want.iter().filter(|w| !seen.contains(*w)).collect();
    assert!(missing.is_empty(), "the generator never produced {missing:?}");
    assert_eq!(seen.iter().filter(|s| s.starts_with("Discriminant")).count(), 2, "splat and dense literals");
}

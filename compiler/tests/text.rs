//! Programs written in the text format: source positions reach errors and
//! explanations, and the sharded program prints as text.
use weft_compiler::sharding::{propagate, Mesh, PropagateOptions};
use weft_ir::text::{parse_module, print_module};
use weft_ir::Module;

const SIMPLE: &str = "
// Shardy basic_propagation.mlir @simple
func @simple(%arg0: f32[8,8] {sharding = [{a}, {b}]}, %arg1: f32[8,8], %arg2: f32[8,16]) -> (f32[8,16]) {
  %add = add %arg0, %arg1
  %dot = dot_general %add, %arg2 {lhs_contract = [1], rhs_contract = [0]}
  return %dot
}
";

#[test]
fn simple_prints_fully_annotated() {
    let m = parse_module(SIMPLE).unwrap();
    let out = propagate(&m.functions[0], &Mesh::parse("a=2,b=2").unwrap(), &PropagateOptions::default()).unwrap();
    out.check().unwrap();
    let text = print_module(&Module { functions: vec![out.function.clone()] });
    let want = "func @simple(%arg0: f32[8,8] {sharding = [{a}, {b}]}, %arg1: f32[8,8] {sharding = [{a}, {b}]}, \
                %arg2: f32[8,16] {sharding = [{b}, {}]}) -> (f32[8,16] {sharding = [{a}, {}]}) {
  %add = add %arg0, %arg1 : f32[8,8] {sharding = [{a}, {b}]}
  %dot = dot_general %add, %arg2 {lhs_contract = [1], rhs_contract = [0]} : f32[8,16] {sharding = [{a}, {}], unreduced = {b}}
  %5 = reshard %dot {sharding = [{a}, {}]} : f32[8,16] {sharding = [{a}, {}]}
  return %5
}
";
    assert_eq!(text, want);
    // The printed program parses back to the same function.
    let back = parse_module(&text).unwrap();
    assert_eq!(print_module(&back), text);
    let explained = out.explain_text(m.functions[0].value_by_name("arg2").unwrap());
    assert_eq!(
        explained,
        "%arg0: [{a}, {b}] <- user annotation on parameter 0 at 3:1\n\
         %add: [{a}, {b}] <- forward through `%add = add` from %arg0\n\
         %arg2: [{b}, {}] (dim 0) <- backward through `%dot = dot_general` from %add\n"
    );
}

#[test]
fn errors_carry_source_positions() {
    let src = "func @f(%x: f32[8,6] {sharding = [{a}, {b}]}) -> (f32[8,6]) {\n  %y = neg %x\n  %z = sharding_constraint %y {sharding = [{c}, {}]}\n  return %z\n}\n";
    let m = parse_module(src).unwrap();
    let mesh = Mesh::parse("a=2,b=4").unwrap();
    let e = propagate(&m.functions[0], &mesh, &PropagateOptions::default()).unwrap_err().to_string();
    assert!(e.starts_with("1:1: in @f: parameter %x: sharding [{a}, {b}] splits dimension 1 (extent 6)"), "{e}");
    let src = src.replace("f32[8,6]", "f32[8,8]");
    let m = parse_module(&src).unwrap();
    let e = propagate(&m.functions[0], &mesh, &PropagateOptions::default()).unwrap_err().to_string();
    assert!(e.starts_with("3:3: in @f: `%z = sharding_constraint`: sharding [{c}, {}] names mesh axis `c`"), "{e}");
}

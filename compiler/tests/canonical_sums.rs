//! Mesh-invariant sums (`canonical_sums`): the rewrite's shape, and the
//! same bits from one device and from meshes that split the summed
//! dimensions (while the plain program differs between them).

use weft_compiler::canonical_sums::{canonical_sums, SumChunks};
use weft_compiler::inline;
use weft_compiler::pipeline::{Annotations, Pass, Pipeline};
use weft_compiler::sharding::{Mesh, PropagateOptions};
use weft_compiler::CompilerError;
use weft_ir::tensor::HostTensor;
use weft_ir::text::{parse_module, print_function};
use weft_ir::TensorSharding;

/// A Megatron MLP block with a data-parallel weight gradient and a loss:
/// every kind of sum a training step has (a contraction split over
/// `model`, one split over `data`, a reduction over both dimensions, and an
/// embedding gradient's `scatter_add` of tokens split over `data`, about
/// a dozen updates per row).
const BLOCK: &str = r#"
func @main(%x: f32[16,32], %w1: f32[32,64], %w2: f32[64,32]) -> (f32[], f32[32,64], f32[32], f32[20]) {
  %h = dot_general %x, %w1 {lhs_contract = [1], rhs_contract = [0]}
  %a = tanh %h
  %o = dot_general %a, %w2 {lhs_contract = [1], rhs_contract = [0]}
  %sq = mul %o, %o
  %loss = reduce_sum %sq {dims = [0, 1]}
  %gw1 = dot_general %x, %a {lhs_contract = [0], rhs_contract = [0]}
  %col = reduce_sum %o {dims = [0]}
  %k = constant 40.0 : f32[16,32]
  %s = mul %x, %k
  %ids = convert %s : i32[16,32]
  %emb = scatter_add %ids, %x {axis = 0, size = 20}
  return %loss, %gw1, %col, %emb
}
"#;

/// Inputs with no structure: every addition rounds.
fn inputs() -> Vec<HostTensor> {
    let mut s = 0x9e37_79b9_7f4a_7c15u64;
    let mut t = |shape: &[usize]| {
        let n: usize = shape.iter().product();
        let v = (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5
            })
            .collect();
        HostTensor::from_f32(shape, v).unwrap()
    };
    vec![t(&[16, 32]), t(&[32, 64]), t(&[64, 32])]
}

/// The results' bits on `mesh` with the parameters split as named
/// (`data` over the batch, `model` Megatron-style), with or without the
/// canonical sums.
fn run(mesh: &str, canonical: bool) -> Vec<Vec<u32>> {
    let mesh = Mesh::parse(mesh).unwrap();
    let has = |a: &str| mesh.axes().iter().any(|x| x.name == a);
    let data: &[&str] = if has("data") { &["data"] } else { &[] };
    let model: &[&str] = if has("model") { &["model"] } else { &[] };
    let mut pipeline = Pipeline::standard(&mesh, &PropagateOptions::default());
    pipeline.verify = true;
    let params = vec![
        ("x".to_string(), TensorSharding::new(&[data, &[]])),
        ("w1".to_string(), TensorSharding::new(&[&[], model])),
        ("w2".to_string(), TensorSharding::new(&[model, &[]])),
    ];
    pipeline.passes.insert(0, Pass::Annotate(Annotations { params, results: vec![] }));
    if canonical {
        pipeline.passes.insert(0, Pass::CanonicalSums(SumChunks::DEFAULT));
    }
    let m = parse_module(BLOCK).unwrap();
    let (p, _) = pipeline.run(&m, "main", &mut |_, _| {}).unwrap();
    let pf = p.into_partitioned().unwrap();
    let out = pf.run(&inputs(), mesh.num_devices()).unwrap();
    out.iter().map(|t| t.to_f64_vec().into_iter().map(|v| (v as f32).to_bits()).collect()).collect()
}

#[test]
fn every_mesh_gives_the_bits_of_one_device() {
    let one = run("data=1", true);
    for mesh in ["data=2", "data=8", "model=4", "data=2,model=4", "data=4,model=2", "data=8,model=2"] {
        assert!(run(mesh, true) == one, "{mesh}");
    }
}

#[test]
fn without_it_the_meshes_differ() {
    // The control: the same program and inputs, plain sums. If this held
    // bitwise by luck, the test above would prove nothing.
    let one = run("data=1", false);
    let differ = ["data=8", "data=2,model=4"].iter().filter(|m| run(m, false) != one).count();
    assert_eq!(differ, 2);
}

#[test]
fn the_rewrite_chunks_the_major_summed_dimension_and_adds_in_a_tree() {
    let m = parse_module(
        r#"
func @main(%a: f32[16,3], %b: i32[16], %c: f32[6,5], %d: f32[4,16], %e: f32[16,2]) -> (f32[], i32[], f32[5], f32[4,2], f32[16]) {
  %s = reduce_sum %a {dims = [0, 1]}
  %i = reduce_sum %b {dims = [0]}
  %t = reduce_sum %c {dims = [0]}
  %p = dot_general %d, %e {lhs_contract = [1], rhs_contract = [0]}
  %x = reduce_max %a {dims = [1]}
  return %s, %i, %t, %p, %x
}
"#,
    )
    .unwrap();
    let f = canonical_sums(&inline(&m, "main").unwrap(), SumChunks::DEFAULT).unwrap();
    let text = print_function(f.function());
    // One dimension at a time, minor first: 3 columns (gcd(3, 8) = 1: no
    // chunks), then 16 rows as 8 chunks of 2 and three levels of pairs.
    for line in [
        "%5 = reduce_sum %a {dims = [1]} : f32[16]",
        "%6 = reshape %5 : f32[8,2]",
        "%7 = reduce_sum %6 {dims = [1]} : f32[8]",
        "%8 = reshape %7 : f32[4,2]",
        "%9 = reduce_sum %8 {dims = [1]} : f32[4]",
        "%10 = reshape %9 : f32[2,2]",
        "%11 = reduce_sum %10 {dims = [1]} : f32[2]",
        "%s = reduce_sum %11 {dims = [0]} : f32[]",
        // Integers are exact; 6 rows make gcd(6, 8) = 2 chunks; max is exact.
        "%i = reduce_sum %b {dims = [0]}",
        "reshape %c : f32[2,3,5]",
        "%t = reduce_sum %15 {dims = [0]} : f32[5]",
        "%x = reduce_max %a {dims = [1]}",
        // The contraction: chunks as a leading batch dimension.
        "reshape %d : f32[4,8,2]",
        "reshape %e : f32[8,2,2]",
        "{lhs_batch = [1], rhs_batch = [0], lhs_contract = [2], rhs_contract = [1]} : f32[8,4,2]",
        "%p = reduce_sum %23 {dims = [0]} : f32[4,2]",
    ] {
        assert!(text.contains(line), "no `{line}` in\n{text}");
    }
    // Same values (to rounding) as the plain sums.
    let plain = weft_ir::interp::run(&m, "main", &probe()).unwrap();
    let mut cm = m.clone();
    *cm.function_mut("main").unwrap() = f.function().clone();
    let canon = weft_ir::interp::run(&cm, "main", &probe()).unwrap();
    for (a, b) in plain.iter().zip(&canon) {
        for (x, y) in a.to_f64_vec().into_iter().zip(b.to_f64_vec()) {
            assert!((x - y).abs() <= 1e-5 * x.abs().max(1.0), "{x} vs {y}");
        }
    }
}

fn probe() -> Vec<HostTensor> {
    let f = |shape: &[usize], k: f32| {
        let n: usize = shape.iter().product();
        HostTensor::from_f32(shape, (0..n).map(|i| (i as f32 * k).sin()).collect()).unwrap()
    };
    vec![
        f(&[16, 3], 0.7),
        HostTensor::from_i32(&[16], (0..16).collect()).unwrap(),
        f(&[6, 5], 1.3),
        f(&[4, 16], 0.3),
        f(&[16, 2], 2.1),
    ]
}

#[test]
fn chunk_counts_are_powers_of_two() {
    for bad in [0, 1, 3, 12] {
        assert!(matches!(SumChunks::new(bad), Err(CompilerError::InvalidSumChunks { chunks }) if chunks == bad));
    }
    assert_eq!(SumChunks::new(16).unwrap().get(), 16);
}

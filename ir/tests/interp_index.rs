//! The indexing ops on the interpreter: gather (embedding lookups and
//! take_along_axis), scatter_add, cumsum and top_k on hand-checked values,
//! out-of-range indices, ties, NaN, empty tensors, and their text form.

mod interp_util;

use interp_util::*;
use weft_ir::tensor::HostTensor;
use weft_ir::text::{parse_module, print_module};
use weft_ir::{IndexOp, Op};

fn ix(op: IndexOp, xs: &[&HostTensor]) -> HostTensor {
    run_op(Op::Index(op), xs)
}

#[test]
fn gather_rows_reads_zeros_out_of_range() {
    // A [4, 2] table; ids [2, 3] with -1 and 4 out of range.
    let table = f32t(&[4, 2], &[0., 1., 10., 11., 20., 21., 30., 31.]);
    let ids = i32t(&[2, 3], &[3, 0, -1, 1, 4, 1]);
    let got = ix(IndexOp::Gather { axis: 0, batch_dims: 0 }, &[&table, &ids]);
    let want = f32t(&[2, 3, 2], &[30., 31., 0., 1., 0., 0., 10., 11., 0., 0., 10., 11.]);
    assert_bits(&got, &want);
    // Unsigned ids: large values are out of range too.
    let uids = u32t(&[2], &[u32::MAX, 2]);
    assert_bits(&ix(IndexOp::Gather { axis: 0, batch_dims: 0 }, &[&table, &uids]), &f32t(&[2, 2], &[0., 0., 20., 21.]));
}

#[test]
fn gather_along_a_middle_axis_and_with_batch_dims() {
    // x[2, 3, 2]; gather axis 1 by [2] indices: result [2, 2, 2].
    let x = f32t(&[2, 3, 2], &(0..12).map(|v| v as f32).collect::<Vec<_>>());
    let idx = i32t(&[2], &[2, 0]);
    let got = ix(IndexOp::Gather { axis: 1, batch_dims: 0 }, &[&x, &idx]);
    assert_bits(&got, &f32t(&[2, 2, 2], &[4., 5., 0., 1., 10., 11., 6., 7.]));
    // take_along_axis of [2, 3] logits by [2] targets.
    let logits = f32t(&[2, 3], &[1., 2., 3., 4., 5., 6.]);
    let t = i32t(&[2], &[2, 0]);
    assert_bits(&ix(IndexOp::Gather { axis: 1, batch_dims: 1 }, &[&logits, &t]), &f32t(&[2], &[3., 4.]));
}

#[test]
fn scatter_add_is_the_transpose_and_drops_out_of_range() {
    let ids = i32t(&[2, 3], &[3, 0, -1, 1, 4, 1]);
    let upd = f32t(&[2, 3, 2], &(1..=12).map(|v| v as f32).collect::<Vec<_>>());
    let got = ix(IndexOp::ScatterAdd { axis: 0, batch_dims: 0, size: 4 }, &[&ids, &upd]);
    // Row 1 gets updates 3 and 5 (in that order), row 0 update 1, row 3 update 0.
    let want = f32t(&[4, 2], &[3., 4., 7. + 11., 8. + 12., 0., 0., 1., 2.]);
    assert_bits(&got, &want);
    // <gather(x, i), u> == <x, scatter_add(i, u)> on integers (exact).
    let x = i32t(&[4, 2], &[1, -2, 3, 4, -5, 6, 7, 8]);
    let ui = i32t(&[2, 3, 2], &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]);
    let g = ix(IndexOp::Gather { axis: 0, batch_dims: 0 }, &[&x, &ids]).to_f64_vec();
    let s = ix(IndexOp::ScatterAdd { axis: 0, batch_dims: 0, size: 4 }, &[&ids, &ui]).to_f64_vec();
    let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
    assert_eq!(dot(&g, &ui.to_f64_vec()), dot(&x.to_f64_vec(), &s));
    // Half types accumulate in f32 and round once.
    let h = t(weft_ir::DType::BF16, &[3, 1], &[256.0, 1.0, 1.0]);
    let same = i32t(&[3], &[0, 0, 0]);
    let r = ix(IndexOp::ScatterAdd { axis: 0, batch_dims: 0, size: 1 }, &[&same, &h]);
    assert_eq!(r.to_f64_vec(), vec![258.0]);
}

#[test]
fn cumsum_both_directions() {
    let x = i32t(&[2, 3], &[1, 2, 3, 4, 5, 6]);
    assert_bits(&ix(IndexOp::Cumsum { dim: 1, reverse: false }, &[&x]), &i32t(&[2, 3], &[1, 3, 6, 4, 9, 15]));
    assert_bits(&ix(IndexOp::Cumsum { dim: 1, reverse: true }, &[&x]), &i32t(&[2, 3], &[6, 5, 3, 15, 11, 6]));
    assert_bits(&ix(IndexOp::Cumsum { dim: 0, reverse: false }, &[&x]), &i32t(&[2, 3], &[1, 2, 3, 5, 7, 9]));
    let e = f32t(&[0, 3], &[]);
    assert_bits(&ix(IndexOp::Cumsum { dim: 0, reverse: false }, &[&e]), &e);
}

#[test]
fn top_k_ties_nan_and_extremes() {
    let x = f32t(&[2, 5], &[1., 3., 3., f32::NEG_INFINITY, f32::NAN, 0., -0., 0., 2., f32::INFINITY]);
    let got = ix(IndexOp::TopK { k: 3 }, &[&x]);
    assert_bits(&got, &i32t(&[2, 3], &[4, 1, 2, 4, 3, 0]));
    assert_bits(&ix(IndexOp::TopK { k: 0 }, &[&x]), &i32t(&[2, 0], &[]));
    let all = ix(IndexOp::TopK { k: 5 }, &[&i32t(&[5], &[2, 2, 7, -1, 2])]);
    assert_bits(&all, &i32t(&[5], &[2, 0, 1, 4, 3]));
}

#[test]
fn empty_indices() {
    let table = f32t(&[4, 2], &[0.; 8]);
    let none = i32t(&[0], &[]);
    assert_bits(&ix(IndexOp::Gather { axis: 0, batch_dims: 0 }, &[&table, &none]), &f32t(&[0, 2], &[]));
    let upd = f32t(&[0, 2], &[]);
    assert_bits(&ix(IndexOp::ScatterAdd { axis: 0, batch_dims: 0, size: 4 }, &[&none, &upd]), &table);
}

#[test]
fn text_form_round_trips_with_defaults_omitted() {
    let src = "\
func @f(%t: f32[4, 2], %ids: i32[3], %x: f32[3, 4]) -> (f32[3, 2], f32[4, 2], f32[3, 4], i32[3, 2], f32[3]) {
  %e = gather %t, %ids {axis = 0} : f32[3, 2]
  %s = scatter_add %ids, %e {axis = 0, size = 4} : f32[4, 2]
  %c = cumsum %x {dim = 1, reverse = true} : f32[3, 4]
  %k = top_k %x {k = 2} : i32[3, 2]
  %p = gather %x, %ids {axis = 1, batch_dims = 1} : f32[3]
  return %e, %s, %c, %k, %p
}
";
    let m = parse_module(src).unwrap();
    let printed = print_module(&m);
    assert_eq!(parse_module(&printed).unwrap().functions[0].insts.len(), 5);
    assert!(printed.contains("gather %t, %ids {axis = 0}"), "{printed}");
    assert!(printed.contains("{axis = 1, batch_dims = 1}"), "{printed}");
    let e = parse_module("func @f(%t: f32[4]) -> (f32[4]) {\n  %c = cumsum %t {reverse = true}\n  return %c\n}\n")
        .unwrap_err();
    assert!(e.to_string().contains("`cumsum` needs attribute `dim`"), "{e}");
    let e = parse_module(
        "func @f(%t: f32[4], %i: f32[2]) -> (f32[2]) {\n  %g = gather %t, %i {axis = 0}\n  return %g\n}\n",
    )
    .unwrap_err();
    assert!(e.to_string().contains("integer indices"), "{e}");
    let e = parse_module("func @f(%t: f32[4]) -> (i32[2]) {\n  %k = top_k %t {k = 2, kk = 1}\n  return %k\n}\n")
        .unwrap_err();
    assert!(e.to_string().contains("unknown attribute `kk`"), "{e}");
}

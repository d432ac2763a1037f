//! safetensors I/O: round trips for every dtype (in memory and through a
//! file), the byte layout we write, and errors naming file and tensor.

mod interp_util;

use interp_util::*;
use safetensors::tensor::{Dtype, TensorView};
use std::collections::BTreeMap;
use std::path::PathBuf;
use weft_ir::tensor::{from_safetensors_bytes, read_safetensors, to_safetensors_bytes, write_safetensors, HostTensor};
use weft_ir::{DType, IrError};

/// One tensor of every dtype, with awkward values (NaN, -0, extremes, empty).
fn every_dtype() -> BTreeMap<String, HostTensor> {
    let mut m = BTreeMap::new();
    m.insert("a.f32".into(), f32t(&[2, 3], &[1.0, -0.0, f32::NAN, f32::INFINITY, 1e-45, -3.5]));
    m.insert("b.f64".into(), f64t(&[3], &[0.1, f64::MIN, -0.0]));
    m.insert("c.bf16".into(), t(DType::BF16, &[2, 2], &[1.0, -2.5, f64::NEG_INFINITY, 3.0e38]));
    m.insert("d.f16".into(), t(DType::F16, &[1, 3], &[65504.0, -1.0 / 1024.0, 2f64.powi(-24)]));
    m.insert("e.i32".into(), i32t(&[4], &[i32::MIN, -1, 0, i32::MAX]));
    m.insert("f.u32".into(), u32t(&[2], &[0, u32::MAX]));
    m.insert("g.bool".into(), boolt(&[3], &[true, false, true]));
    m.insert("h.scalar".into(), f32t(&[], &[42.0]));
    m.insert("i.empty".into(), i32t(&[0, 5], &[]));
    m
}

fn assert_same(a: &BTreeMap<String, HostTensor>, b: &BTreeMap<String, HostTensor>) {
    assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>());
    for (k, v) in a {
        assert!(v.bitwise_eq(&b[k]), "tensor {k}: {v} vs {}", b[k]);
    }
}

fn temp_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("weft-interp-test-{}-{name}.safetensors", std::process::id()))
}

#[test]
fn in_memory_round_trip_every_dtype() {
    let tensors = every_dtype();
    let bytes = to_safetensors_bytes(&tensors).unwrap();
    assert_same(&tensors, &from_safetensors_bytes(&bytes).unwrap());
}

#[test]
fn file_round_trip_every_dtype() {
    let tensors = every_dtype();
    let path = temp_path("all");
    write_safetensors(&path, &tensors).unwrap();
    let back = read_safetensors(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    assert_same(&tensors, &back);
}

#[test]
fn written_file_is_standard_safetensors() {
    // Read what we wrote with the safetensors crate directly: dtype, shape and raw bytes.
    let mut m = BTreeMap::new();
    m.insert("w".to_string(), f32t(&[2], &[1.0, -2.0]));
    m.insert("flag".to_string(), boolt(&[1], &[true]));
    let bytes = to_safetensors_bytes(&m).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let w = st.tensor("w").unwrap();
    assert_eq!(w.dtype(), Dtype::F32);
    assert_eq!(w.shape(), &[2]);
    assert_eq!(w.data(), &[0, 0, 0x80, 0x3f, 0, 0, 0, 0xc0]);
    let f = st.tensor("flag").unwrap();
    assert_eq!((f.dtype(), f.data()), (Dtype::BOOL, &[1u8][..]));
}

#[test]
fn reads_files_written_by_others() {
    let data: Vec<u8> = [1.5f64, -0.25].iter().flat_map(|v| v.to_le_bytes()).collect();
    let view = TensorView::new(Dtype::F64, vec![2, 1], &data).unwrap();
    let bytes = safetensors::tensor::serialize([("x", view)], None).unwrap();
    let back = from_safetensors_bytes(&bytes).unwrap();
    assert_bits(&back["x"], &f64t(&[2, 1], &[1.5, -0.25]));
}

fn file_error(r: Result<BTreeMap<String, HostTensor>, IrError>) -> (String, String) {
    match r {
        Err(IrError::TensorFile { path, message }) => (path, message),
        other => panic!("expected a tensor file error, got {other:?}"),
    }
}

#[test]
fn unsupported_dtype_names_the_tensor() {
    let data = [0u8; 16];
    let view = TensorView::new(Dtype::I64, vec![2], &data).unwrap();
    let bytes = safetensors::tensor::serialize([("step", view)], None).unwrap();
    let path = temp_path("i64");
    std::fs::write(&path, &bytes).unwrap();
    let (p, msg) = file_error(read_safetensors(&path));
    std::fs::remove_file(&path).unwrap();
    assert_eq!(p, path.display().to_string());
    assert!(msg.contains("`step`") && msg.contains("I64"), "{msg}");
}

#[test]
fn bad_bool_bytes_name_the_tensor() {
    let data = [0u8, 7];
    let view = TensorView::new(Dtype::BOOL, vec![2], &data).unwrap();
    let bytes = safetensors::tensor::serialize([("mask", view)], None).unwrap();
    let (_, msg) = file_error(from_safetensors_bytes(&bytes));
    assert!(msg.contains("`mask`"), "{msg}");
}

#[test]
fn io_and_format_errors() {
    let missing = temp_path("does-not-exist");
    let (p, _) = file_error(read_safetensors(&missing));
    assert_eq!(p, missing.display().to_string());
    let (p, msg) = file_error(from_safetensors_bytes(b"not a safetensors file"));
    assert_eq!(p, "<memory>");
    assert!(msg.contains("not a safetensors file"), "{msg}");
    let dir = std::env::temp_dir().join(format!("weft-interp-test-{}-no-such-dir", std::process::id()));
    let err = write_safetensors(dir.join("x.safetensors"), &every_dtype()).unwrap_err();
    assert!(matches!(err, IrError::TensorFile { .. }), "{err}");
}

//! HostTensor: construction, accessors, conversion between every pair of
//! dtypes, bytes, comparisons and display.

mod interp_util;

use half::{bf16, f16};
use interp_util::*;
use weft_ir::tensor::{assert_close, check_close, HostTensor};
use weft_ir::{DType, IrError, Literal, TensorType};

#[test]
fn constructors_and_accessors() {
    let x = f32t(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    assert_eq!(x.ty(), TensorType::new(DType::F32, vec![2, 3]));
    assert_eq!(x.dtype(), DType::F32);
    assert_eq!(x.shape(), &[2, 3]);
    assert_eq!(x.len(), 6);
    assert_eq!(x.as_f32().unwrap()[[1, 2]], 6.0);
    assert!(x.as_f64().is_none() && x.as_i32().is_none());
    assert_eq!(x.to_f64_vec(), vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    assert_eq!(x.get_f64(4), 5.0);
    assert!(matches!(HostTensor::from_f32(&[2, 2], vec![1.0]), Err(IrError::Tensor(_))));
    assert!(HostTensor::from_bool(&[1], vec![true]).unwrap().as_bool().unwrap()[[0]]);
    assert_eq!(HostTensor::from_u32(&[], vec![7]).unwrap().as_u32().unwrap().shape(), &[] as &[usize]);
    let b = HostTensor::from_bf16(&[1], vec![bf16::from_f32(1.5)]).unwrap();
    assert_eq!(b.as_bf16().unwrap()[[0]].to_f32(), 1.5);
    let h = HostTensor::from_f16(&[1], vec![f16::from_f32(-2.0)]).unwrap();
    assert_eq!(h.as_f16().unwrap()[[0]].to_f32(), -2.0);
}

#[test]
fn from_values_rounds_to_the_dtype() {
    let v = [1.0 + 2f64.powi(-8), -2.7, 1e20, f64::NAN];
    let ty = |d| TensorType::new(d, vec![4]);
    let b = HostTensor::from_values(&ty(DType::BF16), &v).unwrap().to_f64_vec();
    assert_eq!(b[..3], [1.0, -2.703125, 9.972771014849226e19]);
    assert!(b[3].is_nan());
    let i = HostTensor::from_values(&ty(DType::I32), &v).unwrap();
    assert_bits(&i, &i32t(&[4], &[1, -2, i32::MAX, 0]));
    let u = HostTensor::from_values(&ty(DType::U32), &v).unwrap();
    assert_bits(&u, &u32t(&[4], &[1, 0, u32::MAX, 0]));
    let p = HostTensor::from_values(&ty(DType::Bool), &[0.0, -0.0, 0.5, f64::NAN]).unwrap();
    assert_bits(&p, &boolt(&[4], &[false, false, true, true]));
    assert!(HostTensor::from_values(&ty(DType::F32), &[1.0]).is_err());
}

#[test]
fn zeros_scalar_full_literal() {
    assert_bits(&HostTensor::zeros(&TensorType::new(DType::Bool, vec![2])), &boolt(&[2], &[false, false]));
    assert_bits(&HostTensor::zeros(&TensorType::new(DType::F64, vec![0])), &f64t(&[0], &[]));
    assert_bits(&HostTensor::scalar(DType::F16, 65520.0), &t(DType::F16, &[], &[f64::INFINITY]));
    assert_bits(&HostTensor::scalar(DType::I32, -3.9), &i32t(&[], &[-3]));
    let lit = Literal::splat(TensorType::new(DType::U32, vec![2, 2]), 5.0);
    assert_bits(&HostTensor::from_literal(&lit).unwrap(), &u32t(&[2, 2], &[5; 4]));
    let lit = Literal::dense(TensorType::new(DType::F32, vec![3]), vec![0.5, -1.0, 2.0]).unwrap();
    let x = HostTensor::from_literal(&lit).unwrap();
    assert_bits(&x, &f32t(&[3], &[0.5, -1.0, 2.0]));
    assert_eq!(x.to_literal(), lit);
    let broken = Literal { ty: TensorType::new(DType::F32, vec![2]), data: weft_ir::LiteralData::Dense(vec![1.0]) };
    assert!(HostTensor::from_literal(&broken).is_err());
}

/// A source tensor and the expected values after converting it to each dtype.
type Case = (HostTensor, [(DType, Vec<f64>); 7]);

/// Source values per dtype, and the expected result of converting them to
/// every dtype (written out by hand; NaN compares equal to NaN).
#[test]
fn convert_between_all_dtypes() {
    let big = 16842753.0; // 2^24 + 2^16 + 1: rounding through f32 first would give 2^24 in bf16.
    let cases: Vec<Case> = vec![
        (
            f32t(&[4], &[-1.5, 0.1, 70000.0, f32::NAN]),
            [
                (DType::F32, vec![-1.5, 0.1f32 as f64, 70000.0, f64::NAN]),
                (DType::F64, vec![-1.5, 0.1f32 as f64, 70000.0, f64::NAN]),
                (DType::BF16, vec![-1.5, 0.10009765625, 70144.0, f64::NAN]),
                (DType::F16, vec![-1.5, 0.0999755859375, f64::INFINITY, f64::NAN]),
                (DType::I32, vec![-1.0, 0.0, 70000.0, 0.0]),
                (DType::U32, vec![0.0, 0.0, 70000.0, 0.0]),
                (DType::Bool, vec![1.0, 1.0, 1.0, 1.0]),
            ],
        ),
        (
            f64t(&[3], &[0.1, -1e40, 1.0 + 2f64.powi(-30)]),
            [
                (DType::F32, vec![0.1f32 as f64, f64::NEG_INFINITY, 1.0]),
                (DType::F64, vec![0.1, -1e40, 1.0 + 2f64.powi(-30)]),
                (DType::BF16, vec![0.10009765625, f64::NEG_INFINITY, 1.0]),
                (DType::F16, vec![0.0999755859375, f64::NEG_INFINITY, 1.0]),
                (DType::I32, vec![0.0, i32::MIN as f64, 1.0]),
                (DType::U32, vec![0.0, 0.0, 1.0]),
                (DType::Bool, vec![1.0, 1.0, 1.0]),
            ],
        ),
        (
            t(DType::BF16, &[3], &[65536.0, -0.0, 3.0]),
            [
                (DType::F32, vec![65536.0, -0.0, 3.0]),
                (DType::F64, vec![65536.0, -0.0, 3.0]),
                (DType::BF16, vec![65536.0, -0.0, 3.0]),
                (DType::F16, vec![f64::INFINITY, -0.0, 3.0]),
                (DType::I32, vec![65536.0, 0.0, 3.0]),
                (DType::U32, vec![65536.0, 0.0, 3.0]),
                (DType::Bool, vec![1.0, 0.0, 1.0]),
            ],
        ),
        (
            t(DType::F16, &[2], &[1.0 + 2f64.powi(-10), -65504.0]),
            [
                (DType::F32, vec![1.0 + 2f64.powi(-10), -65504.0]),
                (DType::F64, vec![1.0 + 2f64.powi(-10), -65504.0]),
                (DType::BF16, vec![1.0, -65536.0]),
                (DType::F16, vec![1.0 + 2f64.powi(-10), -65504.0]),
                (DType::I32, vec![1.0, -65504.0]),
                (DType::U32, vec![1.0, 0.0]),
                (DType::Bool, vec![1.0, 1.0]),
            ],
        ),
        (
            i32t(&[4], &[-1, 16777217, big as i32, 0]),
            [
                (DType::F32, vec![-1.0, 16777216.0, 16842752.0, 0.0]),
                (DType::F64, vec![-1.0, 16777217.0, big, 0.0]),
                (DType::BF16, vec![-1.0, 16777216.0, 16908288.0, 0.0]),
                (DType::F16, vec![-1.0, f64::INFINITY, f64::INFINITY, 0.0]),
                (DType::I32, vec![-1.0, 16777217.0, big, 0.0]),
                (DType::U32, vec![4294967295.0, 16777217.0, big, 0.0]),
                (DType::Bool, vec![1.0, 1.0, 1.0, 0.0]),
            ],
        ),
        (
            u32t(&[3], &[u32::MAX, 257, 0]),
            [
                (DType::F32, vec![4294967296.0, 257.0, 0.0]),
                (DType::F64, vec![4294967295.0, 257.0, 0.0]),
                (DType::BF16, vec![4294967296.0, 256.0, 0.0]),
                (DType::F16, vec![f64::INFINITY, 257.0, 0.0]),
                (DType::I32, vec![-1.0, 257.0, 0.0]),
                (DType::U32, vec![4294967295.0, 257.0, 0.0]),
                (DType::Bool, vec![1.0, 1.0, 0.0]),
            ],
        ),
        (
            boolt(&[2], &[true, false]),
            [
                (DType::F32, vec![1.0, 0.0]),
                (DType::F64, vec![1.0, 0.0]),
                (DType::BF16, vec![1.0, 0.0]),
                (DType::F16, vec![1.0, 0.0]),
                (DType::I32, vec![1.0, 0.0]),
                (DType::U32, vec![1.0, 0.0]),
                (DType::Bool, vec![1.0, 0.0]),
            ],
        ),
    ];
    for (src, targets) in &cases {
        for (to, want) in targets {
            let got = src.convert(*to);
            let want = t(*to, src.shape(), want);
            assert!(got.bitwise_eq(&want), "{} -> {to}: got {got}, want {want}", src.ty());
        }
    }
}

#[test]
fn bytes_round_trip_every_dtype() {
    for d in DType::ALL {
        let x = t(d, &[2, 2], &[0.0, 1.0, 0.0, 1.0]);
        let bytes = x.to_bytes_le();
        assert_eq!(bytes.len(), 4 * d.size_bytes());
        assert!(HostTensor::from_bytes_le(&x.ty(), &bytes).unwrap().bitwise_eq(&x), "{d}");
    }
    assert_eq!(f32t(&[1], &[1.0]).to_bytes_le(), vec![0, 0, 0x80, 0x3f]);
    assert_eq!(t(DType::BF16, &[1], &[1.0]).to_bytes_le(), vec![0x80, 0x3f]);
    assert_eq!(i32t(&[1], &[-2]).to_bytes_le(), vec![0xfe, 0xff, 0xff, 0xff]);
    let ty = TensorType::new(DType::Bool, vec![1]);
    assert!(HostTensor::from_bytes_le(&ty, &[2]).is_err());
    assert!(HostTensor::from_bytes_le(&TensorType::new(DType::F32, vec![2]), &[0; 4]).is_err());
}

#[test]
fn bitwise_and_tolerance_comparisons() {
    let a = f32t(&[3], &[1.0, f32::NAN, 0.0]);
    assert!(a.bitwise_eq(&a.clone()));
    assert!(!a.bitwise_eq(&f32t(&[3], &[1.0, f32::NAN, -0.0])));
    assert!(!a.bitwise_eq(&a.convert(DType::F64)));
    assert!(!a.bitwise_eq(&f32t(&[1, 3], &[1.0, f32::NAN, 0.0])));

    let x = f32t(&[3], &[1.0, 2.0, -4.0]);
    let y = f64t(&[3], &[1.0, 2.5, -3.0]);
    assert_eq!(x.max_abs_diff(&y), 1.0);
    assert_eq!(x.max_rel_diff(&y), 0.25);
    assert_eq!(x.max_abs_diff(&f32t(&[1], &[1.0])), f64::INFINITY);
    let n = f32t(&[2], &[f32::NAN, f32::INFINITY]);
    assert_eq!(n.max_abs_diff(&n.clone()), 0.0);
    assert_eq!(n.max_abs_diff(&f32t(&[2], &[0.0, f32::INFINITY])), f64::INFINITY);

    assert!(check_close(&x, &y, 0.0, 1.0).is_ok());
    let err = check_close(&f32t(&[2, 2], &[1.0, 2.0, 3.0, 4.0]), &f32t(&[2, 2], &[1.0, 2.0, 3.5, 4.5]), 0.0, 0.1)
        .unwrap_err();
    assert!(err.contains("2 of 4 elements") && err.contains("[1, 0]"), "{err}");
    assert!(check_close(&x, &f32t(&[2], &[1.0, 2.0]), 1.0, 1.0).unwrap_err().contains("shape"));
    assert_close(&x, &f32t(&[3], &[1.0, 2.0, -4.0000005]), 1e-6, 0.0);
}

#[test]
#[should_panic(expected = "first at index [1]")]
fn assert_close_panics_with_the_index() {
    assert_close(&f32t(&[2], &[1.0, 2.0]), &f32t(&[2], &[1.0, 2.1]), 1e-3, 0.0);
}

#[test]
fn display_shows_type_and_first_values() {
    assert_eq!(f32t(&[2], &[1.5, -2.0]).to_string(), "f32[2] [1.5, -2]");
    assert_eq!(boolt(&[], &[true]).to_string(), "bool[] [true]");
    let long = i32t(&[10], &(0..10).collect::<Vec<_>>()).to_string();
    assert_eq!(long, "i32[10] [0, 1, 2, 3, 4, 5, 6, 7, ... (2 more)]");
}

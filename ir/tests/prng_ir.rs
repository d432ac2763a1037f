//! The IR-emitted Threefry generator is bit-identical to the host reference.

use weft_ir::prng::{threefry2x32, Key};
use weft_ir::tensor::HostTensor;
use weft_ir::{prng_emit, DType, Function, Module, TensorType};

fn run(f: Function, args: &[HostTensor]) -> Vec<HostTensor> {
    let name = f.name.clone();
    weft_ir::interp::run(&Module { functions: vec![f] }, &name, args).unwrap()
}

fn u32s(t: &HostTensor) -> Vec<u32> {
    t.as_u32().unwrap().iter().copied().collect()
}

#[test]
fn emitted_threefry_matches_known_answers() {
    let kats = [
        ([0u32, 0], [0u32, 0]),
        ([u32::MAX, u32::MAX], [u32::MAX, u32::MAX]),
        ([0x243f_6a88, 0x85a3_08d3], [0x1319_8a2e, 0x0370_7344]),
    ];
    for (ctr, key) in kats {
        let mut f = Function::new("tf");
        let s = |f: &mut Function, n: &str| f.add_param(Some(n.into()), TensorType::scalar(DType::U32));
        let (k0, k1, c0, c1) = (s(&mut f, "k0"), s(&mut f, "k1"), s(&mut f, "c0"), s(&mut f, "c1"));
        let [x0, x1] = prng_emit::threefry2x32(&mut f, [k0, k1], [c0, c1]);
        f.results = vec![x0, x1];
        let sc = |v: u32| HostTensor::from_u32(&[], vec![v]).unwrap();
        let out = run(f, &[sc(key[0]), sc(key[1]), sc(ctr[0]), sc(ctr[1])]);
        assert_eq!([u32s(&out[0])[0], u32s(&out[1])[0]], threefry2x32(key, ctr));
    }
}

#[test]
fn emitted_bits_uniform_and_fold_in_match_host() {
    let key = Key::from_seed(1234).fold_in(7);
    let mut f = Function::new("gen");
    let k = f.add_param(Some("key".into()), TensorType::new(DType::U32, vec![2]));
    let d = f.add_param(Some("d".into()), TensorType::scalar(DType::U32));
    let bits = prng_emit::random_bits(&mut f, k, &[3, 5, 2]);
    let uni = prng_emit::uniform(&mut f, k, &[7]);
    let folded = prng_emit::fold_in(&mut f, k, d);
    let mask = prng_emit::bernoulli(&mut f, k, 0.3, &[64]);
    let normal = prng_emit::normal(&mut f, k, &[256]);
    f.results = vec![bits, uni, folded, mask, normal];
    let out =
        run(f, &[HostTensor::from_u32(&[2], key.0.to_vec()).unwrap(), HostTensor::from_u32(&[], vec![99]).unwrap()]);
    assert_eq!(u32s(&out[0]), key.random_bits(30));
    let host_u: Vec<f64> = key.uniform_f32(7).into_iter().map(|x| x as f64).collect();
    assert_eq!(out[1].to_f64_vec(), host_u);
    assert_eq!(u32s(&out[2]), key.fold_in(99).0.to_vec());
    let host_mask: Vec<f64> = key.uniform_f32(64).into_iter().map(|u| if u < 0.3 { 1.0 } else { 0.0 }).collect();
    assert_eq!(out[3].to_f64_vec(), host_mask);
    let z = out[4].to_f64_vec();
    let mean = z.iter().sum::<f64>() / z.len() as f64;
    let var = z.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / z.len() as f64;
    assert!(mean.abs() < 0.2 && (var - 1.0).abs() < 0.25, "mean {mean} var {var}");
}

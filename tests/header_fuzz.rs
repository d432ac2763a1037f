//! Issue "every byte checked": a seeded fuzz of `.safetensors` and `.npy`
//! headers through the data loader's readers (`weft::data::table`).
//! Thousands of files with random dtypes, shapes, offsets, key orders,
//! duplicate keys, cut-off headers and data sections too short or too long.
//! Each case's consistency is decided here, independently of the reader:
//! - no case panics;
//! - a consistent file opens, with every tensor where the header says;
//! - an inconsistent one is an error, never a silent success;
//! - whatever opens lies wholly inside the file, after its header.

use weft::data::table::{npy, safetensors};
use weft::data::FileDtype;

mod fuzz_support;

use fuzz_support::Rng;

/// A tensor as the test lays it out: name, dtype (an index into
/// [`DTYPES`]), shape, data offsets.
type Tensor = (String, usize, Vec<usize>, (u64, u64));

const DTYPES: [(&str, &str, FileDtype); 8] = [
    ("U8", "|u1", FileDtype::U8),
    ("U16", "<u2", FileDtype::U16),
    ("U32", "<u4", FileDtype::U32),
    ("I32", "<i4", FileDtype::I32),
    ("I64", "<i8", FileDtype::I64),
    ("F16", "<f2", FileDtype::F16),
    ("F32", "<f4", FileDtype::F32),
    ("F64", "<f8", FileDtype::F64),
];

fn shape(r: &mut Rng) -> Vec<usize> {
    (0..r.below(4)).map(|_| r.below(6)).collect()
}

fn bytes_of(shape: &[usize], size: usize) -> u64 {
    shape.iter().product::<usize>() as u64 * size as u64
}

#[test]
fn safetensors_headers_open_exactly_when_consistent() {
    let dir = tempfile::tempdir().unwrap();
    let mut r = Rng(0x5afe_7e45);
    let (mut opened, mut refused) = (0, 0);
    for case in 0..3000 {
        // Tensors with random dtypes and shapes, laid out contiguously in a
        // random order, then perhaps disturbed.
        let n = 1 + r.below(4);
        let mut t: Vec<Tensor> = (0..n)
            .map(|i| {
                let d = r.below(DTYPES.len());
                (format!("t{i}"), d, shape(&mut r), (0, 0))
            })
            .collect();
        let mut order: Vec<usize> = (0..n).collect();
        for i in (1..n).rev() {
            order.swap(i, r.below(i + 1));
        }
        let mut at = 0;
        for &i in &order {
            let len = bytes_of(&t[i].2, DTYPES[t[i].1].2.size());
            t[i].3 = (at, at + len);
            at += len;
        }
        let mut data_len = at;
        let mut consistent = true;
        match r.below(8) {
            0 => {
                // A random offset moved.
                let i = r.below(n);
                let o = &mut t[i].3;
                let (a, b) = (r.below64(at + 9), r.below64(at + 9));
                let before = *o;
                *o = if r.chance(50) { (a, o.1) } else { (o.0, b) };
                consistent = *o == before;
            }
            1 => {
                // The data section one byte or more off.
                let d = 1 + r.below64(5);
                let longer = r.chance(50) || data_len < d;
                data_len = if longer { data_len + d } else { data_len - d };
                consistent = false;
            }
            2 => {
                // A shape changed.
                let i = r.below(n);
                let s = shape(&mut r);
                consistent = bytes_of(&s, DTYPES[t[i].1].2.size()) == bytes_of(&t[i].2, DTYPES[t[i].1].2.size());
                t[i].2 = s;
            }
            _ => {}
        }
        let mut json: Vec<String> = t
            .iter()
            .map(|(name, d, s, o)| {
                format!(r#""{name}":{{"dtype":"{}","shape":{s:?},"data_offsets":[{},{}]}}"#, DTYPES[*d].0, o.0, o.1)
            })
            .collect();
        if r.chance(10) {
            json.push(json[0].clone());
            consistent = false;
        }
        if r.chance(20) {
            json.insert(0, r#""__metadata__":{"format":"pt"}"#.into());
        }
        let mut header = format!("{{{}}}", json.join(",")).into_bytes();
        if r.chance(8) {
            let cut = r.below(header.len());
            header.truncate(cut);
            consistent = false;
        }
        let mut file = (header.len() as u64).to_le_bytes().to_vec();
        file.extend(&header);
        file.extend((0..data_len).map(|i| i as u8));
        let path = dir.path().join(format!("c{case}.safetensors"));
        std::fs::write(&path, &file).unwrap();
        match safetensors(&path) {
            Ok(arrays) => {
                assert!(consistent, "case {case}: an inconsistent header opened: {}", String::from_utf8_lossy(&header));
                assert_eq!(arrays.len(), n, "case {case}");
                for (name, d, s, o) in &t {
                    let a = &arrays[name];
                    assert_eq!((&a.shape, a.dtype), (s, DTYPES[*d].2), "case {case} {name}");
                    let start = 8 + header.len() as u64 + o.0;
                    assert_eq!(a.offset, start, "case {case} {name}");
                    assert!(a.offset + bytes_of(s, a.dtype.size()) <= file.len() as u64, "case {case} {name}");
                }
                opened += 1;
            }
            Err(e) => {
                assert!(!consistent, "case {case}: a consistent header was refused: {e}");
                assert!(e.to_string().contains(&format!("c{case}.safetensors")), "case {case}: {e}");
                refused += 1;
            }
        }
    }
    assert!(opened > 1000 && refused > 600, "{opened} opened, {refused} refused");
}

#[test]
fn npy_headers_open_exactly_when_consistent() {
    let dir = tempfile::tempdir().unwrap();
    let mut r = Rng(0x004e_5a17);
    let (mut opened, mut refused) = (0, 0);
    for case in 0..3000 {
        let d = r.below(DTYPES.len());
        let s = shape(&mut r);
        let tuple = match s.len() {
            1 => format!("({},)", s[0]),
            _ => format!("({})", s.iter().map(|v| v.to_string()).collect::<Vec<_>>().join(", ")),
        };
        let mut keys = vec![
            format!("'descr': '{}'", DTYPES[d].1),
            "'fortran_order': False".to_string(),
            format!("'shape': {tuple}"),
        ];
        for i in (1..3).rev() {
            keys.swap(i, r.below(i + 1));
        }
        let mut consistent = true;
        if r.chance(10) {
            let k = keys[r.below(3)].clone();
            keys.push(k);
            consistent = false;
        }
        let comma = if r.chance(50) { ", " } else { "" };
        let mut dict = format!("{{{}{comma}}}", keys.join(", "));
        if r.chance(10) {
            let cut = r.below(dict.len());
            dict.truncate(cut);
            consistent = false;
        }
        // Padded with spaces to a multiple of 64 with the magic, then a newline.
        let pad = (64 - (10 + dict.len() + 1) % 64) % 64;
        let text = format!("{dict}{}\n", " ".repeat(pad));
        let mut data_len = bytes_of(&s, DTYPES[d].2.size());
        if r.chance(15) {
            let off = 1 + r.below64(4);
            data_len = if r.chance(50) || data_len < off { data_len + off } else { data_len - off };
            consistent = false;
        }
        let mut file = b"\x93NUMPY\x01\x00".to_vec();
        file.extend((text.len() as u16).to_le_bytes());
        file.extend(text.as_bytes());
        file.extend((0..data_len).map(|i| i as u8));
        let path = dir.path().join(format!("c{case}.npy"));
        std::fs::write(&path, &file).unwrap();
        match npy(&path) {
            Ok(a) => {
                assert!(consistent, "case {case}: an inconsistent .npy opened: {text:?}, {data_len} bytes");
                assert_eq!((&a.shape, a.dtype), (&s, DTYPES[d].2), "case {case}");
                assert_eq!(a.offset, 10 + text.len() as u64);
                assert_eq!(a.offset + bytes_of(&s, a.dtype.size()), file.len() as u64, "case {case}");
                opened += 1;
            }
            Err(e) => {
                assert!(!consistent, "case {case}: a consistent .npy was refused: {e}\n{text:?}");
                refused += 1;
            }
        }
    }
    assert!(opened > 1500 && refused > 600, "{opened} opened, {refused} refused");
}

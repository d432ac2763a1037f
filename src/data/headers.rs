//! The headers of `.npy` and `.safetensors` files, parsed once and checked
//! field by field against the file before a byte of data is trusted.
//!
//! The data loader reads only headers up front and then single rows where
//! they lie, so a header that lies about its data would make it read the
//! wrong bytes without a word. These parsers are that loader's one home for
//! the two formats; whole-file readers (`weft run --inputs`, `init_from`,
//! checkpoints) go through the `safetensors` crate's own validated
//! deserialisation, which enforces the same rules on a buffer in memory.
//!
//! - **`.npy`** (NEP 1, versions 1–3): the header is a Python dict literal
//!   with exactly the keys `descr`, `fortran_order` and `shape` (as numpy's
//!   `read_array_header` demands), each once, closed by `}` and padded with
//!   spaces to a newline; the data that follows is exactly the shape's
//!   bytes.
//! - **`.safetensors`**: a JSON object of tensors (`dtype`, `shape`,
//!   `data_offsets`) and an optional `__metadata__` string map, each name
//!   once; sorted by offset the tensors tile the data section from 0 to its
//!   end with no gap or overlap, and each holds exactly shape × dtype bytes
//!   (the crate's `Metadata::validate` rules, plus the file length).

use super::files::FileDtype;
use serde::de::{Deserializer, MapAccess, Visitor};
use serde_json::Value;

/// A parsed `.npy` header.
#[derive(Clone, Debug, PartialEq)]
pub struct NpyHeader {
    /// The element type.
    pub dtype: FileDtype,
    /// The shape (C order).
    pub shape: Vec<usize>,
}

/// The dtype of a `.npy` `descr`.
fn npy_dtype(descr: &str) -> Result<FileDtype, String> {
    Ok(match descr {
        "|u1" | "<u1" => FileDtype::U8,
        "<u2" => FileDtype::U16,
        "<u4" => FileDtype::U32,
        "<i4" => FileDtype::I32,
        "<i8" => FileDtype::I64,
        "<f2" => FileDtype::F16,
        "<f4" => FileDtype::F32,
        "<f8" => FileDtype::F64,
        other => return Err(format!("unsupported dtype `{other}` (little-endian u1, u2, u4, i4, i8, f2, f4 or f8)")),
    })
}

/// Parses a `.npy` header dict (the text after the length field, padding and
/// newline included).
pub fn parse_npy_header(text: &str) -> Result<NpyHeader, String> {
    let body = text.trim_end_matches('\n').trim_end_matches([' ', '\x00']);
    if !text.ends_with('\n') {
        return Err("the header does not end with a newline: cut off".into());
    }
    let mut p = Cursor { s: body.as_bytes(), at: 0 };
    p.expect(b'{')?;
    let (mut descr, mut fortran, mut shape) = (None, None, None);
    loop {
        p.skip_ws();
        if p.eat(b'}') {
            break;
        }
        let key = p.string()?;
        p.skip_ws();
        p.expect(b':')?;
        p.skip_ws();
        let dup = |k: &str| format!("the key '{k}' appears twice");
        match key.as_str() {
            "descr" if descr.is_some() => return Err(dup("descr")),
            "fortran_order" if fortran.is_some() => return Err(dup("fortran_order")),
            "shape" if shape.is_some() => return Err(dup("shape")),
            "descr" => descr = Some(p.string()?),
            "fortran_order" => fortran = Some(p.boolean()?),
            "shape" => shape = Some(p.tuple()?),
            other => return Err(format!("unexpected key '{other}' (a header has descr, fortran_order and shape)")),
        }
        p.skip_ws();
        if !p.eat(b',') {
            p.skip_ws();
            p.expect(b'}')?;
            break;
        }
    }
    p.skip_ws();
    if p.at != p.s.len() {
        return Err(format!("unexpected text after the header dict at byte {}", p.at));
    }
    let missing = |k: &str| format!("no '{k}' in the header");
    let dtype = npy_dtype(&descr.ok_or_else(|| missing("descr"))?)?;
    if fortran.ok_or_else(|| missing("fortran_order"))? {
        return Err("Fortran-order arrays are not supported (save with np.ascontiguousarray)".into());
    }
    Ok(NpyHeader { dtype, shape: shape.ok_or_else(|| missing("shape"))? })
}

/// A position in a header's text.
struct Cursor<'a> {
    s: &'a [u8],
    at: usize,
}

impl Cursor<'_> {
    fn end(&self, what: &str) -> String {
        format!("the header ends inside {what}: cut off")
    }

    fn skip_ws(&mut self) {
        while self.s.get(self.at).is_some_and(|c| c.is_ascii_whitespace()) {
            self.at += 1;
        }
    }

    fn eat(&mut self, c: u8) -> bool {
        let hit = self.s.get(self.at) == Some(&c);
        self.at += hit as usize;
        hit
    }

    fn expect(&mut self, c: u8) -> Result<(), String> {
        match self.s.get(self.at) {
            Some(&got) if got == c => {
                self.at += 1;
                Ok(())
            }
            Some(&got) => Err(format!("expected `{}` at byte {}, found `{}`", c as char, self.at, got as char)),
            None => Err(self.end("the dict")),
        }
    }

    /// A quoted Python string (`'...'` or `"..."`, no escapes).
    fn string(&mut self) -> Result<String, String> {
        let q = match self.s.get(self.at) {
            Some(&q @ (b'\'' | b'"')) => q,
            Some(_) => return Err(format!("expected a quoted string at byte {}", self.at)),
            None => return Err(self.end("the dict")),
        };
        let start = self.at + 1;
        let len = self.s[start..].iter().position(|&c| c == q).ok_or_else(|| self.end("a string"))?;
        self.at = start + len + 1;
        String::from_utf8(self.s[start..start + len].to_vec()).map_err(|_| "a string that is not UTF-8".into())
    }

    fn boolean(&mut self) -> Result<bool, String> {
        for (word, v) in [("True", true), ("False", false)] {
            if self.s[self.at..].starts_with(word.as_bytes()) {
                self.at += word.len();
                return Ok(v);
            }
        }
        Err(format!("expected True or False at byte {}", self.at))
    }

    /// A tuple of non-negative integers: `()`, `(3,)`, `(3, 4)`.
    fn tuple(&mut self) -> Result<Vec<usize>, String> {
        self.expect(b'(')?;
        let mut dims = Vec::new();
        loop {
            self.skip_ws();
            if self.eat(b')') {
                return Ok(dims);
            }
            let start = self.at;
            while self.s.get(self.at).is_some_and(u8::is_ascii_digit) {
                self.at += 1;
            }
            if self.at == start {
                return match self.s.get(self.at) {
                    None => Err(self.end("the shape")),
                    Some(&c) => Err(format!("expected a dimension at byte {start}, found `{}`", c as char)),
                };
            }
            let text = std::str::from_utf8(&self.s[start..self.at]).expect("ASCII digits");
            dims.push(text.parse::<usize>().map_err(|_| format!("dimension {text} is too large"))?);
            self.skip_ws();
            if !self.eat(b',') {
                self.skip_ws();
                self.expect(b')')?;
                return Ok(dims);
            }
        }
    }
}

/// The bytes of `shape` elements of `dtype`, if that fits in a `u64`.
pub fn data_bytes(shape: &[usize], dtype: FileDtype) -> Option<u64> {
    shape.iter().try_fold(dtype.size() as u64, |a, &d| a.checked_mul(d as u64))
}

/// One tensor of a `.safetensors` header.
#[derive(Clone, Debug, PartialEq)]
pub struct SafetensorsEntry {
    /// Its name.
    pub name: String,
    /// The element type.
    pub dtype: FileDtype,
    /// The shape.
    pub shape: Vec<usize>,
    /// Where its bytes start and end, relative to the data section.
    pub offsets: (u64, u64),
}

/// The keys of a JSON object in file order, duplicates kept (serde_json's
/// own maps keep the last of two equal keys and say nothing).
struct Entries(Vec<(String, Value)>);

impl<'de> serde::Deserialize<'de> for Entries {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Entries;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object of tensors")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Entries, A::Error> {
                let mut v = Vec::new();
                while let Some(e) = m.next_entry()? {
                    v.push(e);
                }
                Ok(Entries(v))
            }
        }
        d.deserialize_map(V)
    }
}

/// The dtype of a safetensors `dtype` string.
fn safetensors_dtype(name: &str, d: Option<&str>) -> Result<FileDtype, String> {
    Ok(match d {
        Some("U8") => FileDtype::U8,
        Some("U16") => FileDtype::U16,
        Some("U32") => FileDtype::U32,
        Some("I32") => FileDtype::I32,
        Some("I64") => FileDtype::I64,
        Some("F16") => FileDtype::F16,
        Some("BF16") => FileDtype::BF16,
        Some("F32") => FileDtype::F32,
        Some("F64") => FileDtype::F64,
        other => {
            return Err(format!(
                "tensor `{name}` has unsupported dtype {} (U8, U16, U32, I32, I64, F16, BF16, F32 or F64)",
                other.unwrap_or("(none)")
            ))
        }
    })
}

/// Parses a `.safetensors` header (the JSON after the length field) for a
/// data section of `data_len` bytes, and checks it (see the module docs).
/// The tensors come back in offset order.
pub fn parse_safetensors_header(json: &[u8], data_len: u64) -> Result<Vec<SafetensorsEntry>, String> {
    let Entries(entries) = serde_json::from_slice(json).map_err(|e| format!("header: {e}"))?;
    let mut seen = std::collections::BTreeSet::new();
    let mut out = Vec::new();
    for (name, v) in entries {
        if !seen.insert(name.clone()) {
            return Err(format!("the header names `{name}` twice"));
        }
        if name == "__metadata__" {
            if !v.as_object().is_some_and(|m| m.values().all(Value::is_string)) {
                return Err("`__metadata__` is not a map of strings".into());
            }
            continue;
        }
        let obj = v.as_object().ok_or_else(|| format!("tensor `{name}` is not an object"))?;
        if let Some(k) = obj.keys().find(|k| !["dtype", "shape", "data_offsets"].contains(&k.as_str())) {
            return Err(format!("tensor `{name}` has an unknown field `{k}`"));
        }
        let dtype = safetensors_dtype(&name, obj.get("dtype").and_then(Value::as_str))?;
        let shape: Vec<usize> = obj
            .get("shape")
            .and_then(|s| serde_json::from_value(s.clone()).ok())
            .ok_or_else(|| format!("tensor `{name}` has no valid shape (a list of non-negative integers)"))?;
        let offs: [u64; 2] = obj
            .get("data_offsets")
            .and_then(|s| serde_json::from_value(s.clone()).ok())
            .ok_or_else(|| format!("tensor `{name}` has no valid data_offsets (two non-negative integers)"))?;
        if offs[1] < offs[0] {
            return Err(format!(
                "tensor `{name}` has data_offsets [{}, {}]: the end before the start",
                offs[0], offs[1]
            ));
        }
        out.push(SafetensorsEntry { name, dtype, shape, offsets: (offs[0], offs[1]) });
    }
    out.sort_by_key(|e| (e.offsets, e.name.clone()));
    let mut at = 0u64;
    for e in &out {
        let (s, t) = e.offsets;
        let need = data_bytes(&e.shape, e.dtype);
        if need != Some(t - s) {
            let need = need.map(|n| format!("{n} bytes")).unwrap_or_else(|| "more than 2^64 bytes".into());
            return Err(format!(
                "tensor `{}` of shape {:?} ({}) needs {need}, but its data_offsets [{s}, {t}] hold {}",
                e.name,
                e.shape,
                e.dtype.name(),
                t - s
            ));
        }
        if t > data_len {
            return Err(format!(
                "tensor `{}` of shape {:?} ({}) ends at data offset {t}, but the data section has {data_len} bytes: \
                 truncated",
                e.name,
                e.shape,
                e.dtype.name()
            ));
        }
        if s != at {
            let how = if s < at { "overlaps the tensor before it" } else { "leaves a gap before it" };
            return Err(format!(
                "tensor `{}` starts at data offset {s}, which {how} (it should start at {at})",
                e.name
            ));
        }
        at = t;
    }
    if at != data_len {
        return Err(format!(
            "the tensors' data ends at offset {at} but the data section has {data_len} bytes: {} unclaimed bytes \
             follow it",
            data_len - at
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn npy(text: &str) -> Result<NpyHeader, String> {
        parse_npy_header(text)
    }

    #[test]
    fn npy_headers_parse_once_with_every_key_once() {
        let h = npy("{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }   \n").unwrap();
        assert_eq!(h, NpyHeader { dtype: FileDtype::F32, shape: vec![3, 4] });
        assert_eq!(npy("{'descr': '|u1', 'fortran_order': False, 'shape': (7,)}\n").unwrap().shape, vec![7]);
        assert_eq!(npy("{'shape': (), 'fortran_order': False, 'descr': '<i8'}\n").unwrap().shape, Vec::<usize>::new());
        let cases = [
            ("{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), 'shape': (9,), }\n", "twice"),
            ("{'descr': '<f4', 'fortran_order': False, 'shape': (3", "newline"),
            ("{'descr': '<f4', 'fortran_order': False, 'shape': (3\n", "cut off"),
            ("{'descr': '<f4', 'fortran_order': False, \n", "cut off"),
            ("{'descr': '<f4', 'fortran_order': False}\n", "no 'shape'"),
            ("{'descr': '<f4', 'fortran_order': True, 'shape': (3,)}\n", "Fortran"),
            ("{'descr': '>f4', 'fortran_order': False, 'shape': (3,)}\n", "unsupported dtype"),
            ("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), 'x': 1}\n", "unexpected key"),
            ("{'descr': '<f4', 'fortran_order': False, 'shape': (-3,)}\n", "dimension"),
            ("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999999,)}\n", "too large"),
            ("{'descr': '<f4', 'fortran_order': False, 'shape': (3,)} junk\n", "after the header"),
        ];
        for (text, want) in cases {
            let e = npy(text).unwrap_err();
            assert!(e.contains(want), "{text:?}: {e}");
        }
    }

    fn st(json: &str, len: u64) -> Result<Vec<SafetensorsEntry>, String> {
        parse_safetensors_header(json.as_bytes(), len)
    }

    #[test]
    fn safetensors_headers_tile_the_data_exactly() {
        let ok = r#"{"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]},"a":{"dtype":"U8","shape":[2,4],"data_offsets":[0,8]},"__metadata__":{"k":"v"}}"#;
        let v = st(ok, 16).unwrap();
        assert_eq!(v.iter().map(|e| e.name.as_str()).collect::<Vec<_>>(), ["a", "b"]);
        let t = |a: &str| format!(r#"{{"a":{{"dtype":"F32","shape":[2],"data_offsets":{a}}}}}"#);
        let cases = [
            (t("[0,8]"), 12, "unclaimed"),
            (t("[0,8]"), 4, "ends at data offset 8, but the data section has 4 bytes: truncated"),
            (t("[0,4]"), 4, "needs 8 bytes"),
            (t("[8,0]"), 8, "end before the start"),
            (t("[4,12]"), 12, "gap"),
            (r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}"#.into(), 8, "overlaps"),
            (r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#.into(), 8, "twice"),
            (r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[2,6]}}"#.into(), 6, "overlaps"),
            (r#"{"a":{"dtype":"Q8","shape":[1],"data_offsets":[0,1]}}"#.into(), 1, "unsupported dtype"),
            (r#"{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}"#.into(), 4, "no valid shape"),
            (r#"{"a":{"dtype":"F32","shape":[4294967296,4294967296,4],"data_offsets":[0,4]}}"#.into(), 4, "2^64"),
            (r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":1}}"#.into(), 4, "unknown field"),
            (r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]"#.into(), 4, "header"),
        ];
        for (json, len, want) in cases {
            let e = st(&json, len).unwrap_err();
            assert!(e.contains(want), "{json}: {e}");
        }
    }
}

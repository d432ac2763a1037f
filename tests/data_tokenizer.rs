//! `weft data prepare --tokenizer tokenizer.json`: a Hugging Face
//! tokenizer written by hand in the test (nothing is downloaded) gives
//! exactly the expected ids, `u16` or `u32` by vocabulary size, with the
//! vocabulary in `meta.json`; a run checks its dtype and model vocabulary
//! against that; a missing or malformed tokenizer and text it cannot
//! encode are named errors, not panics.

use std::path::Path;
use std::process::Command;

/// Word-level over whitespace-split words; `big` has id 70000, so the
/// vocabulary is 70001 ids and the token files are `u32`.
const WORD_LEVEL: &str = r#"{
  "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
  "normalizer": null, "pre_tokenizer": {"type": "Whitespace"},
  "post_processor": null, "decoder": null,
  "model": {"type": "WordLevel", "unk_token": "[UNK]",
            "vocab": {"[UNK]": 0, "hello": 1, "world": 2, ",": 3, "big": 70000}}
}"#;

/// GPT-2-style byte-level BPE (its pre-tokenizer's regex has a lookahead):
/// 7 ids, `u16`.
const BYTE_BPE: &str = r#"{
  "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
  "normalizer": null,
  "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
  "post_processor": null, "decoder": null,
  "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
            "vocab": {"a": 0, "b": 1, "Ġ": 2, "ab": 3, "Ġa": 4, "Ġab": 5, "Ċ": 6},
            "merges": ["Ġ a", "a b", "Ġa b"]}
}"#;

fn weft(dir: &Path, args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_weft")).args(args).current_dir(dir).output().expect("weft runs");
    (out.status.code(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

fn u16s(path: &Path) -> Vec<u32> {
    std::fs::read(path).unwrap().chunks(2).map(|c| u32::from(u16::from_le_bytes([c[0], c[1]]))).collect()
}

fn u32s(path: &Path) -> Vec<u32> {
    std::fs::read(path).unwrap().chunks(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

fn meta(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("meta.json")).unwrap()).unwrap()
}

#[test]
fn a_tokenizer_json_gives_the_expected_ids() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    std::fs::write(d.join("word.json"), WORD_LEVEL).unwrap();
    std::fs::write(d.join("bpe.json"), BYTE_BPE).unwrap();
    std::fs::write(d.join("a.txt"), "hello world, hello big\nhello oops world\n").unwrap();
    std::fs::write(d.join("b.txt"), "ab ab\nab  ab\n").unwrap();

    // Word-level: 8 tokens, `oops` unknown; the last quarter is validation.
    let (code, stdout, stderr) =
        weft(d, &["data", "prepare", "a.txt", "-o", "w", "--tokenizer", "word.json", "--val-fraction", "0.25"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(u32s(&d.join("w/train.bin")), [1, 2, 3, 1, 70000, 1]);
    assert_eq!(u32s(&d.join("w/val.bin")), [0, 2]);
    let m = meta(&d.join("w"));
    assert_eq!((m["vocab_size"].as_u64(), m["dtype"].as_str()), (Some(70001), Some("u32")));
    assert_eq!(m["tokenizer"], "word.json");
    assert_eq!(m["tokenizer_file"]["bytes"], WORD_LEVEL.len());
    assert!(stdout.contains("vocab = 70001") && stdout.contains("dtype = \"u32\""), "{stdout}");

    // Byte-level BPE over two files: each file split by its tokens.
    let (code, stdout, stderr) =
        weft(d, &["data", "prepare", "b.txt", "b.txt", "-o", "b", "--tokenizer", "bpe.json", "--val-fraction", "0.3"]);
    assert_eq!(code, Some(0), "{stderr}");
    // "ab", " ab", "\n", "ab", " ", " ab", "\n": 7 tokens, 5 for training.
    let file = [3, 5, 6, 3, 2, 5, 6];
    assert_eq!(u16s(&d.join("b/train.bin")), [&file[..5], &file[..5]].concat());
    assert_eq!(u16s(&d.join("b/val.bin")), [&file[5..], &file[5..]].concat());
    let m = meta(&d.join("b"));
    assert_eq!((m["vocab_size"].as_u64(), m["dtype"].as_str()), (Some(7), Some("u16")));
    assert!(stdout.contains("bpe.json (7 ids), u16"), "{stdout}");

    // Past 1 MiB a file is encoded in pieces cut at line ends: the ids
    // are those of the whole file.
    std::fs::write(d.join("big.txt"), "ab ab\nab  ab\n".repeat(100_000)).unwrap();
    let (code, _, stderr) =
        weft(d, &["data", "prepare", "big.txt", "-o", "big", "--tokenizer", "bpe.json", "--val-fraction", "0.5"]);
    assert_eq!(code, Some(0), "{stderr}");
    let all = [u16s(&d.join("big/train.bin")), u16s(&d.join("big/val.bin"))].concat();
    assert_eq!(all, file.repeat(100_000), "1.3 MB in pieces: the ids of the whole text");

    // Without --tokenizer: bytes, as before.
    let (code, _, stderr) = weft(d, &["data", "prepare", "b.txt", "-o", "bytes", "--val-fraction", "0.5"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(meta(&d.join("bytes"))["vocab_size"], 256);
    assert_eq!(meta(&d.join("bytes"))["tokenizer"], "bytes");
}

#[test]
fn a_run_checks_its_dtype_and_vocabulary_against_the_prepared_meta() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    std::fs::write(d.join("bpe.json"), BYTE_BPE).unwrap();
    std::fs::write(d.join("b.txt"), "ab ab\nab  ab\n".repeat(60)).unwrap();
    assert_eq!(weft(d, &["data", "prepare", "b.txt", "-o", "tok", "--tokenizer", "bpe.json"]).0, Some(0));
    let config = |vocab: u64, dtype: &str| {
        format!(
            "steps = 2\n[model]\nkind = \"gpt\"\nvocab = {vocab}\nseq = 8\nd_model = 16\nheads = 2\nlayers = 1\n\
             batch = 4\n[data]\nsource = \"tokens\"\ntrain = \"tok/train.bin\"\nval = \"tok/val.bin\"\n\
             dtype = \"{dtype}\"\neval_every = 1\neval_batches = 1\n"
        )
    };
    // The prepared vocabulary (7) fits the model's: it trains.
    std::fs::write(d.join("c.toml"), config(8, "u16")).unwrap();
    let (code, _, stderr) = weft(d, &["train", "c.toml", "-q"]);
    assert_eq!(code, Some(0), "{stderr}");
    let cases = [
        (config(6, "u16"), "was prepared with a vocabulary of 7 ids (tokenizer bpe.json"),
        (config(8, "u32"), "holds u16 tokens"),
    ];
    for (c, message) in cases {
        std::fs::write(d.join("c.toml"), c).unwrap();
        let (code, _, stderr) = weft(d, &["train", "c.toml", "-q"]);
        assert_eq!(code, Some(1), "{stderr}");
        assert!(stderr.contains(message), "expected `{message}` in:\n{stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}

#[test]
#[rustfmt::skip]
fn a_bad_tokenizer_or_text_is_a_named_error() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    std::fs::write(d.join("word.json"), WORD_LEVEL).unwrap();
    std::fs::write(d.join("cut.json"), &WORD_LEVEL[..100]).unwrap();
    std::fs::write(d.join("model.json"), WORD_LEVEL.replace("WordLevel", "NoSuchModel")).unwrap();
    std::fs::write(d.join("no_unk.json"), WORD_LEVEL.replace("\"[UNK]\": 0, ", "")).unwrap();
    std::fs::write(d.join("a.txt"), "hello world\n").unwrap();
    std::fs::write(d.join("oops.txt"), "hello oops\n").unwrap();
    std::fs::write(d.join("latin1.txt"), b"caf\xe9 hello\n").unwrap();
    std::fs::write(d.join("space.txt"), " \n ").unwrap();
    let cases: [(&[&str], &str); 7] = [
        (&["a.txt", "--tokenizer", "gone.json"], "gone.json: no such file"),
        (&["a.txt", "--tokenizer", "cut.json"], "cut.json: is not valid JSON, so not a tokenizer.json: EOF while parsing"),
        (&["a.txt", "--tokenizer", "model.json"], "model.json: is not a tokenizer.json"),
        (&["a.txt", "--tokenizer", "."], ".: cannot read"),
        (&["oops.txt", "--tokenizer", "no_unk.json"], "oops.txt: cannot be tokenized"),
        (&["latin1.txt", "--tokenizer", "word.json"], "latin1.txt: is not UTF-8 text"),
        (&["space.txt", "--tokenizer", "word.json"], "space.txt: holds no tokens of word.json"),
    ];
    for (args, message) in cases {
        let mut all = vec!["data", "prepare", "-o", "out"];
        all.extend(args);
        let (code, _, stderr) = weft(d, &all);
        assert_eq!(code, Some(1), "{args:?}: {stderr}");
        assert!(stderr.contains(message), "{args:?}: expected `{message}` in:\n{stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
    assert!(!d.join("out").exists(), "nothing is written when tokenizing fails");
}

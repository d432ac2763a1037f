//! Bad data is a named error and nothing is lost: every case runs the
//! `weft` binary and must exit with the stated code (1: a problem in the
//! data, 2: a config value or flag) and message, never panic, and leave an
//! existing metrics file as it was.

use std::path::Path;
use std::process::Command;

const KEEP: &str = "{\"step\":0,\"loss\":1.0}\n";

fn npy(descr: &str, shape: &[usize], data: &[u8]) -> Vec<u8> {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    let shape = if dims.len() == 1 { format!("({},)", dims[0]) } else { format!("({})", dims.join(", ")) };
    let mut h = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
    while (10 + h.len() + 1) % 64 != 0 {
        h.push(' ');
    }
    h.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(h.len() as u16).to_le_bytes());
    out.extend_from_slice(h.as_bytes());
    out.extend_from_slice(data);
    out
}

fn f32s(n: usize) -> Vec<u8> {
    (0..n).flat_map(|i| (i as f32 * 0.01).to_le_bytes()).collect()
}

fn u16s(v: impl Iterator<Item = u16>) -> Vec<u8> {
    v.flat_map(|t| t.to_le_bytes()).collect()
}

fn gpt(data: &str) -> String {
    format!(
        "steps = 2\nmetrics = \"m.jsonl\"\n[model]\nkind = \"gpt\"\nvocab = 32\nseq = 8\nd_model = 16\nheads = 2\n\
         layers = 1\nbatch = 4\n[data]\nsource = \"tokens\"\n{data}\n"
    )
}

fn mlp(data: &str) -> String {
    format!(
        "steps = 2\nmetrics = \"m.jsonl\"\n[model]\nkind = \"mlp\"\nlayers = 1\nd = 4\nh = 8\nbatch = 4\n[data]\n\
         source = \"table\"\n{data}\n"
    )
}

fn weft(dir: &Path, args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_weft")).args(args).current_dir(dir).output().expect("weft runs");
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into())
}

#[test]
#[rustfmt::skip]
fn bad_data_is_a_named_error_and_nothing_is_lost() {
    let dir = std::env::temp_dir().join(format!("weft-data-bad-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let w = |name: &str, bytes: &[u8]| std::fs::write(dir.join(name), bytes).unwrap();
    w("good.bin", &u16s((0..200).map(|i| i % 32)));
    w("odd.bin", &u16s((0..200).map(|i| i % 32))[..399]);
    w("vocab.bin", &u16s((0..200).map(|i| if i == 77 { 40 } else { i % 32 })));
    w("short.bin", &u16s(0..20));
    w("x.npy", &npy("<f4", &[20, 4], &f32s(80)));
    w("y.npy", &npy("<f4", &[20, 4], &f32s(80)));
    w("x_int.npy", &npy("<i4", &[20, 4], &vec![0u8; 320]));
    w("x_wide.npy", &npy("<f4", &[20, 5], &f32s(100)));
    w("x_cut.npy", &npy("<f4", &[20, 4], &f32s(70)));
    w("x_big_endian.npy", &npy(">f4", &[20, 4], &f32s(80)));
    w("y_few.npy", &npy("<f4", &[18, 4], &f32s(72)));
    w("x_three.npy", &npy("<f4", &[3, 4], &f32s(12)));
    w("y_three.npy", &npy("<f4", &[3, 4], &f32s(12)));
    w("not.npy", b"hello, world");
    let mut st = b"\x40\x00\x00\x00\x00\x00\x00\x00".to_vec();
    st.extend_from_slice(br#"{"x":{"dtype":"F32","shape":[20,4],"data_offsets":[0,320]}}"#);
    st.resize(8 + 64, b' ');
    st.extend_from_slice(&f32s(10));
    w("cut.safetensors", &st);
    w("text.txt", b"some text\n");

    let table = |x: &str, y: &str| mlp(&format!("train = {{ x = \"{x}\", y = \"{y}\" }}"));
    let cases: Vec<(&str, String, Vec<&str>, i32, &str)> = vec![
        ("missing token file", gpt("train = \"nope.bin\""), vec![], 1, "nope.bin: no such file"),
        ("truncated token file", gpt("train = \"odd.bin\""), vec![], 1, "odd.bin: 399 bytes is not a whole number of u16 tokens"),
        ("token id past the vocabulary", gpt("train = \"vocab.bin\""), vec![], 1, "vocab.bin: token id 40 at element 77 is outside the model's vocabulary 0..32 (model.vocab)"),
        ("token file shorter than a batch", gpt("train = \"short.bin\""), vec![], 1, "short.bin: holds 20 tokens, fewer than one batch needs (4 windows of model.seq = 8, 33 tokens)"),
        ("token file read as u32", gpt("train = \"odd.bin\"\ndtype = \"u32\""), vec![], 1, "not a whole number of u32 tokens"),
        ("validation split missing", gpt("train = \"good.bin\"\nval = \"gone.bin\"\neval_every = 1"), vec![], 1, "gone.bin: no such file"),
        ("missing table file", table("x.npy", "nope.npy"), vec![], 1, "nope.npy: no such file"),
        ("dtype mismatch", table("x_int.npy", "y.npy"), vec![], 1, "x_int.npy: the array is i32, but the model's input `x` is f32"),
        ("shape mismatch", table("x_wide.npy", "y.npy"), vec![], 1, "x_wide.npy: the array has shape [20, 5], but the model's input `x` (f32[4,4]) needs [N, 4]"),
        ("truncated npy", table("x_cut.npy", "y.npy"), vec![], 1, "x_cut.npy: the array of shape [20, 4] (f32) needs 320 bytes, but the file holds 280 after its header: truncated"),
        ("big-endian npy", table("x_big_endian.npy", "y.npy"), vec![], 1, "unsupported dtype `>f4`"),
        ("not an npy file", table("not.npy", "y.npy"), vec![], 1, "not.npy: not a readable .npy file"),
        ("inputs of different lengths", table("x.npy", "y_few.npy"), vec![], 1, "y_few.npy: the array has 18 examples, but x.npy has 20"),
        ("table shorter than a batch", table("x_three.npy", "y_three.npy"), vec![], 1, "x_three.npy: holds 3 examples, fewer than one batch (model.batch = 4)"),
        ("truncated safetensors", mlp("train = \"cut.safetensors\""), vec![], 1, "cut.safetensors: not a readable .safetensors file: tensor `x` of shape [20, 4] (f32) ends at data offset 320, but the data section has 40 bytes: truncated"),
        ("npy table in one file", mlp("train = \"x.npy\""), vec![], 1, "a table in one file must be .safetensors"),
        ("table without an input", mlp("train = { x = \"x.npy\" }"), vec![], 2, "names no file for the model's input `y`"),
        ("table with an unknown input", mlp("train = { x = \"x.npy\", y = \"y.npy\", z = \"y.npy\" }"), vec![], 2, "`z` is not an input of the model (inputs: x, y)"),
        ("unknown [data] key", gpt("train = \"good.bin\"\nshufle = false"), vec![], 2, "unknown field `shufle`"),
        ("unknown source", gpt("train = \"good.bin\"").replace("\"tokens\"", "\"images\""), vec![], 2, "data.source = `images`: must be one of `tokens`, `table`"),
        ("token dtype", gpt("train = \"good.bin\"\ndtype = \"u8\""), vec![], 2, "data.dtype = `u8`: must be one of `u16`, `u32`"),
        ("prefetch out of range", gpt("train = \"good.bin\"\nprefetch = 5000"), vec![], 2, "data.prefetch = 5000: must be an integer in [0, 1024]"),
        ("eval_batches 0", gpt("train = \"good.bin\"\nval = \"good.bin\"\neval_batches = 0"), vec![], 2, "data.eval_batches = 0: must be an integer in [1, 1000000]"),
        ("eval without a validation split", gpt("train = \"good.bin\"\neval_every = 5"), vec![], 2, "data.eval_every = 5: needs a validation split"),
        ("tokens for an mlp", mlp("train = \"good.bin\"").replace("\"table\"", "\"tokens\""), vec![], 2, "data.source = `tokens`: token streams feed a model with inputs tokens and targets"),
        ("empty train path", gpt("train = \"\""), vec![], 2, "data.train = ``"),
        ("--data and [data]", gpt("train = \"good.bin\""), vec!["--data", "x.npy"], 2, "--data x.npy (one fixed batch) and a [data] table (a dataset) cannot both be given"),
    ];
    for (name, config, extra, code, message) in &cases {
        std::fs::write(dir.join("c.toml"), config).unwrap();
        std::fs::write(dir.join("m.jsonl"), KEEP).unwrap();
        let mut args = vec!["train", "c.toml", "-q"];
        args.extend(extra);
        let (got, stderr) = weft(&dir, &args);
        assert_eq!(got, Some(*code), "{name}: exit code; stderr:\n{stderr}");
        assert!(stderr.contains(message), "{name}: expected `{message}` in:\n{stderr}");
        assert!(!stderr.contains("panicked"), "{name}: {stderr}");
        assert_eq!(std::fs::read_to_string(dir.join("m.jsonl")).unwrap(), KEEP, "{name}: the metrics file changed");
    }
    // The good file trains (the cases fail for their reason, not the setup).
    std::fs::write(dir.join("c.toml"), gpt("train = \"good.bin\"")).unwrap();
    assert_eq!(weft(&dir, &["train", "c.toml", "-q"]).0, Some(0));
    std::fs::write(dir.join("c.toml"), table("x.npy", "y.npy")).unwrap();
    assert_eq!(weft(&dir, &["train", "c.toml", "-q"]).0, Some(0));

    let prepare: Vec<(&[&str], i32, &str)> = vec![
        (&["data", "prepare", "gone.txt", "-o", "out"], 1, "gone.txt: no such file"),
        (&["data", "prepare", "text.txt", "-o", "out", "--val-fraction", "1.5"], 2, "--val-fraction = 1.5: must be a number in (0, 1)"),
    ];
    for (args, code, message) in prepare {
        let (got, stderr) = weft(&dir, args);
        assert_eq!(got, Some(code), "{args:?}: {stderr}");
        assert!(stderr.contains(message), "{args:?}: expected `{message}` in:\n{stderr}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn prepare_splits_each_file_and_plot_draws_the_validation_loss() {
    let dir = std::env::temp_dir().join(format!("weft-data-prepare-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let a: Vec<u8> = (0..100u8).collect();
    let b = "héllo wörld, ".repeat(10).into_bytes();
    std::fs::write(dir.join("a.txt"), &a).unwrap();
    std::fs::write(dir.join("b.txt"), &b).unwrap();
    let (code, stderr) = weft(&dir, &["data", "prepare", "a.txt", "b.txt", "-o", "tok"]);
    assert_eq!(code, Some(0), "{stderr}");
    let read = |n: &str| -> Vec<u16> {
        std::fs::read(dir.join("tok").join(n)).unwrap().chunks(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect()
    };
    let cut = |v: &[u8]| (v.len() as f64 * 0.9).round() as usize;
    let want_train: Vec<u16> = a[..cut(&a)].iter().chain(&b[..cut(&b)]).map(|&x| x as u16).collect();
    let want_val: Vec<u16> = a[cut(&a)..].iter().chain(&b[cut(&b)..]).map(|&x| x as u16).collect();
    assert_eq!(read("train.bin"), want_train);
    assert_eq!(read("val.bin"), want_val);
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("tok/meta.json")).unwrap()).unwrap();
    assert_eq!(meta["vocab_size"], 256);
    assert_eq!(meta["sources"].as_array().unwrap().len(), 2);

    // A metrics file with a validation loss on some steps: both curves.
    let lines =
        "{\"step\":0,\"loss\":3.0,\"val_loss\":3.1}\n{\"step\":1,\"loss\":2.0}\n{\"step\":2,\"val_loss\":2.2}\n";
    std::fs::write(dir.join("run.jsonl"), lines).unwrap();
    let (code, stderr) = weft(&dir, &["plot", "run.jsonl", "-o", "p.svg"]);
    assert_eq!(code, Some(0), "{stderr}");
    let svg = std::fs::read_to_string(dir.join("p.svg")).unwrap();
    assert!(svg.contains("run loss") && svg.contains("run val_loss"), "both series are labelled");
    // Without a validation loss, only the loss.
    std::fs::write(dir.join("t.jsonl"), "{\"step\":0,\"loss\":3.0}\n{\"step\":1,\"loss\":2.0}\n").unwrap();
    assert_eq!(weft(&dir, &["plot", "t.jsonl", "-o", "t.svg"]).0, Some(0));
    assert!(!std::fs::read_to_string(dir.join("t.svg")).unwrap().contains("val_loss"));
    // A metric asked for by name must be there.
    let (code, stderr) = weft(&dir, &["plot", "t.jsonl", "-o", "t.svg", "--metric", "val_loss"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("no `val_loss` values"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

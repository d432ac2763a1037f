//! `weft lower --dump-after PASS / --dump-dir DIR / --time-passes`: the
//! compiler pipeline's passes seen from the command line.
use std::process::Command;

fn weft(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_weft")).args(args).output().expect("weft runs");
    let s = |b: Vec<u8>| String::from_utf8(b).unwrap();
    (out.status.code().unwrap_or(-1), s(out.stdout), s(out.stderr))
}

const FILE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/lower/megatron.weft");

#[test]
fn dump_after_one_pass_and_time_every_pass() {
    let (code, stdout, stderr) = weft(&["lower", FILE, "--dump-after", "fuse_reduce_scatter", "--time-passes"]);
    assert_eq!(code, 0, "{stderr}");
    // Before frees are inserted; the final program on stdout has them.
    let dump = stderr.split("// after fuse_reduce_scatter:\n").nth(1).expect("a dump");
    assert!(dump.starts_with("device_program @main") && !dump.split("\n}\n").next().unwrap().contains("free"));
    assert!(stdout.contains("  free %1\n"), "{stdout}");
    let timed: Vec<&str> =
        stderr.lines().filter_map(|l| l.strip_prefix("pass ")).map(|l| l.split_whitespace().next().unwrap()).collect();
    assert_eq!(
        timed,
        [
            "inline",
            "propagate",
            "partition",
            "compose_transposes",
            "forward_identities",
            "fold_transposes",
            "cse",
            "remove_dead_steps",
            "fuse_reduce_scatter",
            "rematerialize",
            "compact",
            "insert_frees",
            "total"
        ]
    );
}

#[test]
fn dump_dir_gets_one_file_per_pass_and_bad_names_are_usage_errors() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let (code, stdout, stderr) = weft(&["lower", FILE, "--dump-dir", d]);
    assert_eq!(code, 0, "{stderr}");
    let mut names: Vec<String> =
        std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    assert_eq!(names.len(), 12, "{names:?}");
    assert_eq!((names[0].as_str(), names[11].as_str()), ("00-inline.txt", "11-insert_frees.txt"));
    let last = std::fs::read_to_string(dir.path().join("11-insert_frees.txt")).unwrap();
    assert!(stdout.starts_with(&last), "the last dump is the printed program");
    let propagated = std::fs::read_to_string(dir.path().join("01-propagate.txt")).unwrap();
    assert!(propagated.starts_with("func @main(") && propagated.contains("sharding"), "{propagated}");

    let (code, _, stderr) = weft(&["lower", FILE, "--dump-after", "nope"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("--dump-after: unknown pass `nope` (passes: inline, propagate,"), "{stderr}");
}

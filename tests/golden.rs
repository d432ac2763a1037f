//! Golden tests: `tests/golden/<stage>/<name>.weft` is run through the stage
//! and the output compared with `<name>.expected` beside it.
//!
//! A stage is one entry in [`STAGES`], a function from the input text to the
//! output text; adding a compiler stage (shard, lower, ...) is one more entry
//! and one more directory. Errors are output too (a golden may pin down an
//! error message), so a stage function never fails.
//!
//! `BLESS=1 cargo test --test golden` (re)writes every `.expected` file; on a
//! mismatch the test prints a unified diff per file.

use similar::TextDiff;
use std::fs;
use std::path::{Path, PathBuf};
use weft_ir::text::{parse_module, print_module};
use weft_ir::{verify_module, IrError};

/// A stage: input text to output text.
type Stage = fn(&str) -> String;

/// Every stage, by directory name.
const STAGES: &[(&str, Stage)] = &[
    ("parse", parse_stage),
    ("infer", infer_stage),
    ("verify", verify_stage),
    ("shard", shard_stage),
    ("lower", lower_stage),
    ("cleanup", cleanup_stage),
];

/// The mesh from a first-line comment `// mesh: x=2,y=2`.
fn mesh_of(text: &str) -> Result<weft_compiler::sharding::Mesh, String> {
    let line = text.lines().next().unwrap_or("");
    let spec = line.strip_prefix("// mesh:").ok_or("the first line must be `// mesh: <axes>`")?;
    weft_compiler::sharding::Mesh::parse(spec.trim()).map_err(|e| e.to_string())
}

/// Sharding propagation over the mesh in the first line: the annotated
/// program (every value's sharding, reshards inserted) and the reshards'
/// collectives, or the error.
fn shard_stage(text: &str) -> String {
    use weft_compiler::pipeline::Program;
    use weft_compiler::sharding::{propagate, PropagateOptions};
    let mesh = match mesh_of(text) {
        Ok(m) => m,
        Err(e) => return format!("{e}\n"),
    };
    let m = match parse_module(text).and_then(|m| verify_module(&m).map(|()| m)) {
        Ok(m) => m,
        Err(e) => return error_lines(e),
    };
    let entry = m.functions.last().map(|f| f.name.clone()).unwrap_or_default();
    let run = || -> weft::Result<String> {
        let f = weft_compiler::inline_calls(&m, &entry)?;
        let sf = propagate(&f, &mesh, &PropagateOptions::default())?;
        sf.check()?;
        // The text `weft lower --dump-after propagate` prints.
        Ok(Program::Sharded(Box::new(sf)).text())
    };
    run().unwrap_or_else(|e| format!("error: {e}\n"))
}

/// Canonical print, or the parse error.
fn parse_stage(text: &str) -> String {
    match parse_module(text) {
        Ok(m) => print_module(&m),
        Err(e) => format!("{e}\n"),
    }
}

/// Inputs omit result types; the output shows them inferred. The module must
/// also verify, so an expectation can never pin down a wrong inference.
fn infer_stage(text: &str) -> String {
    match parse_module(text) {
        Ok(m) => match verify_module(&m) {
            Ok(()) => print_module(&m),
            Err(e) => error_lines(e),
        },
        Err(e) => format!("{e}\n"),
    }
}

/// The verifier's errors, one per line, or `ok` and the canonical print.
fn verify_stage(text: &str) -> String {
    match parse_module(text) {
        Ok(m) => match verify_module(&m) {
            Ok(()) => format!("ok\n{}", print_module(&m)),
            Err(e) => error_lines(e),
        },
        Err(e) => format!("{e}\n"),
    }
}

/// Propagation and partitioning on the mesh named in the input's first
/// line (`// mesh: x=2,y=2`): the device program and its summary, or the
/// error.
fn lower_stage(text: &str) -> String {
    use weft::cli::lower::{lower_source, LowerError};
    match lower_source(text, None, None) {
        Ok(out) => out,
        Err(LowerError::Ir(e)) => error_lines(e),
        Err(LowerError::Usage(e)) => format!("{e}\n"),
        Err(LowerError::Compiler(e)) => format!("{e}\n"),
    }
}

/// A device program (text) run through the partitioner's clean-up passes
/// named in the first line (`// passes: fuse_reduce_scatter, compact`), in
/// that order, or `bucket_collectives` and `overlap_collectives` (with
/// their default bucket size and prefetch bound):
/// the program after them, which must verify, or the error. The input must
/// verify too (the passes take verified programs).
fn cleanup_stage(text: &str) -> String {
    use weft_compiler::partition::overlap::{bucket_collectives, overlap_collectives, OverlapOptions};
    use weft_compiler::partition::{cleanup_pass, CLEANUPS};
    use weft_ir::device::{parse_program, print_program, verify_program, DeviceProgram};
    let line = text.lines().next().unwrap_or("");
    let Some(names) = line.strip_prefix("// passes:") else {
        return "the first line must be `// passes: <pass>, ...`\n".into();
    };
    type DevicePass = Box<dyn Fn(&mut DeviceProgram)>;
    let mut passes: Vec<DevicePass> = Vec::new();
    for name in names.split(',').map(str::trim) {
        match cleanup_pass(name) {
            Some(p) => passes.push(Box::new(p)),
            None if name == "overlap_collectives" => {
                passes.push(Box::new(|p| overlap_collectives(p, &OverlapOptions::default())))
            }
            None if name == "bucket_collectives" => {
                passes.push(Box::new(|p| bucket_collectives(p, OverlapOptions::default().bucket_bytes)))
            }
            None => {
                let all: Vec<&str> = CLEANUPS.iter().map(|(n, _)| *n).collect();
                let all = all.join(", ");
                return format!("unknown pass `{name}` (passes: {all}, bucket_collectives, overlap_collectives)\n");
            }
        }
    }
    let mut p = match parse_program(text) {
        Ok(p) => p,
        Err(e) => return format!("{e}\n"),
    };
    if let Err(e) = verify_program(&p) {
        return format!("input: {}", error_lines(e));
    }
    for pass in passes {
        pass(&mut p);
    }
    let out = print_program(&p);
    assert_eq!(parse_program(&out).map(|q| print_program(&q)).ok().as_deref(), Some(out.as_str()), "round trip");
    match verify_program(&p) {
        Ok(()) => out,
        Err(e) => format!("{out}output: {}", error_lines(e)),
    }
}

fn error_lines(e: IrError) -> String {
    match e {
        IrError::Verify(diags) => diags.iter().map(|d| format!("{d}\n")).collect(),
        other => format!("{other}\n"),
    }
}

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests").join("golden")
}

/// A path relative to the package root, for messages.
fn shown(p: &Path) -> String {
    p.strip_prefix(env!("CARGO_MANIFEST_DIR")).unwrap_or(p).display().to_string()
}

fn sorted_entries(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .collect();
    v.sort();
    v
}

/// Runs one input; returns a failure report, or `None` if it matches (or
/// was blessed).
fn check_file(run: Stage, input: &Path, bless: bool) -> Option<String> {
    let text = fs::read_to_string(input).unwrap_or_else(|e| panic!("cannot read {}: {e}", input.display()));
    let actual = match std::panic::catch_unwind(|| run(&text)) {
        Ok(out) => out,
        Err(_) => return Some(format!("{}: the stage panicked (see the message above)", shown(input))),
    };
    let expected_path = input.with_extension("expected");
    let expected = fs::read_to_string(&expected_path).ok();
    if expected.as_deref() == Some(actual.as_str()) {
        return None;
    }
    if bless {
        fs::write(&expected_path, &actual).unwrap_or_else(|e| panic!("cannot write {}: {e}", expected_path.display()));
        eprintln!("blessed {}", expected_path.display());
        return None;
    }
    let Some(expected) = expected else {
        return Some(format!("{}: missing (the output would be:)\n{actual}", shown(&expected_path)));
    };
    let diff = TextDiff::from_lines(&expected, &actual)
        .unified_diff()
        .context_radius(3)
        .header(&shown(&expected_path), "actual output")
        .to_string();
    Some(format!("{} differs:\n{diff}", shown(&expected_path)))
}

#[test]
fn golden() {
    let bless = std::env::var("BLESS").is_ok_and(|v| v == "1");
    let mut failures = Vec::new();
    let mut checked = 0;
    for dir in sorted_entries(&golden_dir()) {
        let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
        if dir.is_dir() && !STAGES.iter().any(|(s, _)| *s == name) {
            failures.push(format!("{}: no stage named `{name}` in STAGES", shown(&dir)));
        }
    }
    for (stage, run) in STAGES {
        let dir = golden_dir().join(stage);
        if !dir.is_dir() {
            failures.push(format!("{}: missing directory for stage `{stage}`", shown(&dir)));
            continue;
        }
        for path in sorted_entries(&dir) {
            match path.extension().and_then(|e| e.to_str()) {
                Some("weft") => {
                    checked += 1;
                    failures.extend(check_file(*run, &path, bless));
                }
                Some("expected") if !path.with_extension("weft").exists() => {
                    failures.push(format!("{}: no `.weft` input beside it", shown(&path)));
                }
                _ => {}
            }
        }
    }
    assert!(checked > 0, "no golden inputs found under {}", golden_dir().display());
    assert!(
        failures.is_empty(),
        "{} golden failure{}:\n\n{}\n\nIf the new output is right, bless it: BLESS=1 cargo test --test golden",
        failures.len(),
        if failures.len() == 1 { "" } else { "s" },
        failures.join("\n\n")
    );
}

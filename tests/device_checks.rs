//! Check-style tests of device-program passes, from text: every
//! `tests/device_checks/<name>.weft` is a device program (the text form of
//! `specs/device-program.md` §4) whose comment lines say what to run and
//! what the output must contain, where a whole expected file would be
//! brittle (the runtime's fusion planning belongs to the runtime and may
//! grow; a test pins down only the property it is about):
//!
//! - `// run: PASS, PASS, ...` — partition clean-ups by name
//!   (`weft_compiler::partition::CLEANUPS`) and `plan_fusion` (the runtime's
//!   `weft_runtime::fusion::plan_fusion`, which lists the chains after the
//!   printed program: `chain steps A..=B: inputs [..] -> %N via [..], ops [..]`);
//! - `// check: TEXT` — the next output line containing TEXT, after the
//!   previous match;
//! - `// check-next: TEXT` — the line right after the previous match
//!   contains TEXT;
//! - `// check-not: TEXT` — no line between the previous match and the next
//!   one (or the end) contains TEXT.
//!
//! The input must verify and be in the printer's form (it prints back to
//! the same text), and the output of every clean-up must verify.

use std::fs;
use std::path::Path;
use weft_compiler::partition::cleanup_pass;
use weft_ir::device::{parse_program, print_program, verify_program, BufferId, DeviceProgram};
use weft_runtime::fusion::plan_fusion;

fn bufs(bs: &[BufferId]) -> String {
    bs.iter().map(|b| format!("%{}", b.0)).collect::<Vec<_>>().join(", ")
}

/// The fusion plan, one line per chain.
fn fusion_lines(p: &DeviceProgram) -> String {
    let mut out = String::new();
    for c in plan_fusion(p) {
        let ops: Vec<&str> = c.nodes.iter().map(|n| n.op.name()).collect();
        out.push_str(&format!(
            "chain steps {}..={}: inputs [{}] -> %{} via [{}], ops [{}]\n",
            c.steps().start(),
            c.steps().end(),
            bufs(&c.inputs),
            c.output.0,
            bufs(&c.intermediates),
            ops.join(", ")
        ));
    }
    out
}

/// Runs the file's passes; the output text.
fn run(text: &str) -> Result<String, String> {
    let mut p = parse_program(text).map_err(|e| e.to_string())?;
    verify_program(&p).map_err(|e| format!("input: {e}"))?;
    // Inputs are written in the printer's form: the program after the
    // leading comments prints back to exactly that text.
    let body: String = text.lines().skip_while(|l| l.starts_with("//")).map(|l| format!("{l}\n")).collect();
    if print_program(&p) != body {
        return Err(format!("the input does not print back the same:\n{}", print_program(&p)));
    }
    let passes = text.lines().find_map(|l| l.strip_prefix("// run:")).ok_or("no `// run:` line")?;
    let mut out = String::new();
    for name in passes.split(',').map(str::trim) {
        if name == "plan_fusion" {
            out = print_program(&p) + &fusion_lines(&p);
            continue;
        }
        let pass = cleanup_pass(name).ok_or(format!("unknown pass `{name}`"))?;
        pass(&mut p);
        verify_program(&p).map_err(|e| format!("after {name}: {e}"))?;
        out = print_program(&p);
    }
    Ok(out)
}

/// Applies the check lines to `out`; the failures.
fn check(text: &str, out: &str) -> Vec<String> {
    let lines: Vec<&str> = out.lines().collect();
    let mut failures = Vec::new();
    let mut at = 0; // the first line the next `check` may match
    let mut last: Option<usize> = None;
    let mut nots: Vec<&str> = Vec::new();
    let mut checks = 0;
    for l in text.lines() {
        if let Some(pat) = l.strip_prefix("// check-not:") {
            nots.push(pat.trim());
        } else if let Some(pat) = l.strip_prefix("// check-next:") {
            checks += 1;
            let want = last.map_or(0, |i| i + 1);
            if lines.get(want).is_some_and(|x| x.contains(pat.trim())) {
                last = Some(want);
                at = want + 1;
            } else {
                failures.push(format!("check-next `{}`: line {} is {:?}", pat.trim(), want + 1, lines.get(want)));
            }
        } else if let Some(pat) = l.strip_prefix("// check:") {
            checks += 1;
            match (at..lines.len()).find(|&i| lines[i].contains(pat.trim())) {
                Some(i) => {
                    for n in nots.drain(..) {
                        if let Some(j) = (at..i).find(|&j| lines[j].contains(n)) {
                            failures.push(format!("check-not `{n}` matches line {}: {}", j + 1, lines[j]));
                        }
                    }
                    last = Some(i);
                    at = i + 1;
                }
                None => failures.push(format!("check `{}`: not found after line {at}", pat.trim())),
            }
        }
    }
    for n in nots {
        if let Some(j) = (at..lines.len()).find(|&j| lines[j].contains(n)) {
            failures.push(format!("check-not `{n}` matches line {}: {}", j + 1, lines[j]));
        }
    }
    if checks == 0 {
        failures.push("no `// check:` lines".into());
    }
    failures
}

#[test]
fn device_checks() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests").join("device_checks");
    let mut files: Vec<_> = fs::read_dir(&dir).expect("tests/device_checks").map(|e| e.unwrap().path()).collect();
    files.sort();
    let mut failures = Vec::new();
    let mut n = 0;
    for f in files.iter().filter(|f| f.extension().is_some_and(|e| e == "weft")) {
        n += 1;
        let text = fs::read_to_string(f).unwrap();
        let name = f.file_name().unwrap().to_string_lossy().to_string();
        match run(&text) {
            Ok(out) => {
                let fs = check(&text, &out);
                if !fs.is_empty() {
                    failures.push(format!("{name}:\n  {}\noutput:\n{out}", fs.join("\n  ")));
                }
            }
            Err(e) => failures.push(format!("{name}: {e}")),
        }
    }
    assert!(n > 0, "no inputs in {}", dir.display());
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// The checker itself: a wrong expectation fails.
#[test]
fn checks_can_fail() {
    let out = "a\nb\nc\n";
    assert!(check("// check: b\n// check-next: c", out).is_empty());
    assert_eq!(check("// check: c\n// check: b", out).len(), 1);
    assert_eq!(check("// check: a\n// check-next: c", out).len(), 1);
    assert_eq!(check("// check: a\n// check-not: b\n// check: c", out).len(), 1);
    assert!(check("// check: a\n// check-not: a\n// check: c", out).is_empty());
    assert_eq!(check("// check-not: c", out).len(), 2, "a file without checks fails too");
}

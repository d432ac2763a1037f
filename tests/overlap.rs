//! Collectives overlapped with compute (the `overlap_collectives` pass, on
//! by default; `--no-overlap` turns it off): metrics and checkpoint files
//! are bitwise the same with and without it, for every strategy, in one
//! process and under `mpirun -n 2` (where a thread of the communicator's
//! own makes the exchanges); and the runs do overlap (their programs start
//! collectives early), so the comparison is not of one program with
//! itself.
//!
//! The multi-process half needs `mpirun` and a weft built with `--features
//! mpi`; without them it fails under `CI=true` and prints SKIPPED
//! elsewhere.

mod mpi_support;

use mpi_support::{mpirun_or_skip, ok, read, root, step_files, train, train_args, WEFT};
use std::process::Command;

/// Metrics and the step-6 checkpoint files of `config` under `strategy` on
/// `n` processes (0: no mpirun), with overlap or without.
fn run(
    dir: &std::path::Path,
    n: usize,
    config: &str,
    strategy: &str,
    overlap: bool,
) -> (Vec<u8>, Vec<(String, Vec<u8>)>) {
    let dir = dir.join(format!("{}-{strategy}-{n}-{overlap}", config.replace('/', "_")));
    let (m, k) = (dir.join("metrics.jsonl"), dir.join("ckpt"));
    let mut args = train_args(strategy, "6", &m, &k);
    if !overlap {
        args.push("--no-overlap");
    }
    let o = train(n, config, &args, &[]);
    ok(&o, &format!("{config} {strategy} on {n} processes, overlap {overlap}"));
    (read(&m), step_files(&k.join("step_00000006")))
}

/// How many collectives the run's program overlaps (its start-up line).
fn overlapped(config: &str, strategy: &str, extra: &[&str]) -> usize {
    let o = Command::new(WEFT)
        .current_dir(root())
        .args(["train", config, "--steps", "1", "--mesh", "data=2,model=4", "--strategy", strategy])
        .args(extra)
        .output()
        .unwrap();
    ok(&o, &format!("{config} {strategy}"));
    let text = String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr);
    let line = text.lines().find(|l| l.contains("per step: ")).unwrap_or_else(|| panic!("no start-up line:\n{text}"));
    // `per step: 27 all_reduce (27 overlapped), 3 all_gather`.
    line.split(" overlapped)").filter_map(|s| s.rsplit('(').next()?.trim().parse::<usize>().ok()).sum()
}

#[test]
fn overlapped_runs_are_bitwise_the_in_order_runs_for_every_strategy() {
    let tmp = tempfile::tempdir().unwrap();
    let cases = [
        ("examples/configs/gpt.toml", "dp"),
        ("examples/configs/gpt.toml", "tp"),
        ("examples/configs/gpt.toml", "fsdp"),
        ("examples/configs/gpt.toml", "fsdp_tp"),
        ("examples/configs/gpt.toml", "zero1"),
        ("examples/configs/mlp.toml", "zero3"),
        ("examples/configs/program.toml", "fsdp_tp"),
        ("examples/configs/gpt_f16.toml", "fsdp_tp"),
    ];
    for (config, strategy) in cases {
        assert!(overlapped(config, strategy, &[]) > 0, "{config} {strategy}: nothing overlapped");
        assert_eq!(overlapped(config, strategy, &["--no-overlap"]), 0, "{config} {strategy} --no-overlap");
        let with = run(tmp.path(), 0, config, strategy, true);
        let without = run(tmp.path(), 0, config, strategy, false);
        assert!(with.0 == without.0, "{config} {strategy}: metrics differ with overlap");
        assert!(with.1 == without.1, "{config} {strategy}: checkpoint files differ with overlap");
    }
}

#[test]
fn overlapped_runs_on_two_processes_are_bitwise_the_in_order_runs() {
    let Some(_) = mpirun_or_skip("overlapped_runs_on_two_processes_are_bitwise_the_in_order_runs") else { return };
    let tmp = tempfile::tempdir().unwrap();
    for (config, strategy) in [
        ("examples/configs/gpt.toml", "dp"),
        ("examples/configs/gpt.toml", "fsdp_tp"),
        ("examples/configs/mlp.toml", "fsdp"),
    ] {
        let one = run(tmp.path(), 0, config, strategy, false);
        for overlap in [true, false] {
            let two = run(tmp.path(), 2, config, strategy, overlap);
            assert!(two.0 == one.0, "{config} {strategy}: metrics on 2 processes (overlap {overlap}) differ");
            assert!(two.1 == one.1, "{config} {strategy}: checkpoint on 2 processes (overlap {overlap}) differs");
        }
    }
}

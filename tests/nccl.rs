//! NCCL collectives (`WEFT_COLLECTIVES=nccl`, the `cuda` feature).
//!
//! Everywhere: asking for NCCL where it cannot run (a CPU backend, a build
//! without `cuda`) or naming an unknown collective path is a named error.
//!
//! With the `cuda` feature, on a machine with a CUDA GPU and NCCL
//! installed:
//! - the NCCL path at world size 1 (NCCL refuses two ranks on one GPU), and
//!   at world size G on G > 1 GPUs: all-reduce, reduce-scatter and
//!   all-gather on CubeCL buffers give the host fold's results (bitwise for
//!   gathers and at world size 1, within rounding for sums otherwise), and
//!   no collective NCCL takes is staged through the host;
//! - the training step on G > 1 GPUs with NCCL collectives gives the CPU
//!   oracle's losses within rounding (one GPU has no collectives to run:
//!   a step on one device has none, so that case only checks that a run
//!   with NCCL asked for works).
//!
//! Without a GPU, or without NCCL, these print SKIPPED, and fail under
//! `CI=true` (the same rule as `tests/train_gpu.rs`; CI builds without
//! `cuda`, so it never compiles them).
//!
//! Run on one H200 (NCCL 2.28.9, 2026-11-27): all five pass; the world-size
//! G > 1 cases need two GPUs and have not run. To verify (see
//! `specs/runtime.md` §2b; NCCL must be loadable as `libnccl.so`: with
//! pip's `nvidia-nccl-cu12` or `-cu13`, symlink `libnccl.so -> libnccl.so.2`
//! and put its directory on `LD_LIBRARY_PATH`):
//!
//! ```text
//! specs/verify-nccl.sh
//! ```
//!
//! which runs `cargo test --features cuda --test nccl -- --nocapture
//! --test-threads=1` and fails if any test printed SKIPPED.

use std::process::Command;

fn weft(args: &[&str], env: &[(&str, &str)]) -> (bool, String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_weft"));
    cmd.args(args).env_remove("WEFT_COLLECTIVES");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("weft runs");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

const MLP: &str = "steps = 2\nseed = 1\n[model]\nkind = \"mlp\"\nlayers = 2\nd = 16\nh = 32\nbatch = 16\n[optimizer]\nkind = \"sgd\"\nlr = 0.01\n";

#[test]
fn nccl_where_it_cannot_run_is_a_named_error() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("mlp.toml");
    std::fs::write(&config, MLP).unwrap();
    let config = config.to_str().unwrap();
    let args = ["train", config, "--mesh", "data=2", "--strategy", "dp", "--backend", "cpu", "-q"];
    let (ok, _, err) = weft(&args, &[("WEFT_COLLECTIVES", "nccl")]);
    assert!(!ok && err.contains("NCCL is not available"), "{err}");
    let (ok, _, err) = weft(&args, &[("WEFT_COLLECTIVES", "gloo")]);
    assert!(!ok && err.contains("WEFT_COLLECTIVES") && err.contains("gloo"), "{err}");
    let (ok, _, err) = weft(&args, &[("WEFT_COLLECTIVES", "host")]);
    assert!(ok, "{err}");
}

#[cfg(feature = "cuda")]
mod gpu {
    use super::{weft, MLP};
    use std::time::Duration;
    use weft_ir::device::DeviceProgram;
    use weft_ir::tensor::HostTensor;
    use weft_runtime::gpu::device_collectives::{attach, CollectivePath};
    use weft_runtime::{available_backends, open_devices, BackendKind, ExecOptions, Executable, RuntimeError};

    /// Whether a CUDA GPU and NCCL are here; without them, prints
    /// SKIPPED, or panics under `CI=true`.
    fn cuda_and_nccl_or_skip(test: &str) -> bool {
        let why = if !available_backends().contains(&BackendKind::Cuda) {
            "no CUDA device (or no CUDA driver)".to_string()
        } else {
            match weft_runtime::gpu::nccl::version() {
                Ok(v) => {
                    println!("{test}: NCCL {v}");
                    return true;
                }
                Err(e) => e.to_string(),
            }
        };
        let msg = format!("{test}: SKIPPED: {why}");
        if std::env::var("CI").as_deref() == Ok("true") {
            panic!("{msg} — a missing device is a failure in CI");
        }
        println!("{msg}");
        false
    }

    fn gpu_count() -> usize {
        weft_runtime::gpu::cuda_devices::device_count()
    }

    /// One of each collective NCCL takes, and one it leaves to the host (a
    /// gather along an inner dimension), on a mesh `x = n`.
    fn program(n: usize) -> DeviceProgram {
        let text = format!(
            "device_program @main mesh [x={n}] {{
  input %0 : f32[{r},3]  // x
  %1 = all_reduce %0 {{axes = [x], op = sum}} : f32[{r},3]
  %2 = all_reduce %0 {{axes = [x], op = max}} : f32[{r},3]
  %3 = reduce_scatter %0 {{dim = 0, axes = [x], op = sum}} : f32[2,3]
  %4 = all_gather %0 {{dim = 0, axes = [x]}} : f32[{g},3]
  %5 = all_gather %0 {{dim = 1, axes = [x]}} : f32[{r},{c}]
  return %1, %2, %3, %4, %5
}}
",
            r = 2 * n,
            g = 2 * n * n,
            c = 3 * n
        );
        text.parse().expect("a valid device program")
    }

    fn inputs(n: usize) -> Vec<Vec<HostTensor>> {
        (0..n)
            .map(|d| {
                let v: Vec<f32> = (0..2 * n * 3).map(|i| ((i * 7 + d * 13) % 11) as f32 * 0.1 - 0.3).collect();
                vec![HostTensor::from_f32(&[2 * n, 3], v).unwrap()]
            })
            .collect()
    }

    fn run(kind: BackendKind, path: CollectivePath, n: usize) -> (Vec<Vec<HostTensor>>, u64) {
        let p = program(n);
        let local: Vec<usize> = (0..n).collect();
        let mut devices = open_devices(kind, n).expect("open devices");
        attach(path, &p, &local, &mut devices, None, Duration::from_secs(60)).expect("attach the collective path");
        let mut exe = Executable::new(p, devices.backends, ExecOptions::default()).expect("an executable");
        let out = exe.run(inputs(n)).expect("a run");
        (out, exe.stats().transfers.collective_downloads)
    }

    fn check(n: usize) {
        let (cpu, _) = run(BackendKind::Cpu, CollectivePath::Host, n);
        let (gpu, staged) = run(BackendKind::Cuda, CollectivePath::Nccl, n);
        // Only the inner-dimension gather goes through the host.
        assert_eq!(staged, n as u64, "collectives staged through the host on {n} devices");
        for (d, (g, c)) in gpu.iter().zip(&cpu).enumerate() {
            for (k, (a, b)) in g.iter().zip(c).enumerate() {
                let exact = n == 1 || k != 0 && k != 2; // sums may round differently
                if exact {
                    assert!(a.bitwise_eq(b), "device {d}, output {k} on {n} devices: {a:?} vs {b:?}");
                } else {
                    let (a, b) = (a.to_f64_vec(), b.to_f64_vec());
                    for (x, y) in a.iter().zip(&b) {
                        assert!((x - y).abs() <= 1e-6 * (1.0 + y.abs()), "device {d}, output {k}: {x} vs {y}");
                    }
                }
            }
        }
    }

    #[test]
    fn nccl_collectives_at_world_size_one_match_the_host_fold() {
        if !cuda_and_nccl_or_skip("nccl_collectives_at_world_size_one_match_the_host_fold") {
            return;
        }
        check(1);
    }

    #[test]
    fn nccl_collectives_on_every_gpu_match_the_host_fold() {
        let test = "nccl_collectives_on_every_gpu_match_the_host_fold";
        if !cuda_and_nccl_or_skip(test) {
            return;
        }
        match gpu_count() {
            0 | 1 => {
                println!("{test}: NOT RUN: one GPU (NCCL allows one rank per GPU); world size 1 is the test above")
            }
            g => check(g.min(8)),
        }
    }

    #[test]
    fn two_devices_on_one_gpu_are_a_named_error() {
        if !cuda_and_nccl_or_skip("two_devices_on_one_gpu_are_a_named_error") || gpu_count() != 1 {
            return;
        }
        let p = program(2);
        let mut devices = open_devices(BackendKind::Cuda, 2).unwrap();
        let e = attach(CollectivePath::Nccl, &p, &[0, 1], &mut devices, None, Duration::from_secs(5)).unwrap_err();
        assert!(matches!(e, RuntimeError::NcclUnavailable { .. }) && e.to_string().contains("one rank per GPU"), "{e}");
    }

    fn losses(config: &str, mesh: &str, strategy: &str, backend: &str, nccl: bool) -> (Vec<f64>, String) {
        let dir = tempfile::tempdir().unwrap();
        let metrics = dir.path().join("metrics.jsonl");
        let args = [
            "train",
            config,
            "--mesh",
            mesh,
            "--strategy",
            strategy,
            "--backend",
            backend,
            "--metrics",
            metrics.to_str().unwrap(),
            "-q",
        ];
        let env: &[(&str, &str)] = if nccl { &[("WEFT_COLLECTIVES", "nccl"), ("NCCL_DEBUG", "INFO")] } else { &[] };
        let (ok, out, err) = weft(&args, env);
        assert!(ok, "weft train {mesh} {strategy} {backend}: {err}");
        let text = std::fs::read_to_string(&metrics).unwrap();
        let losses = text
            .lines()
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).unwrap();
                v["loss"].as_f64().unwrap()
            })
            .collect();
        // NCCL_DEBUG output goes to stdout.
        (losses, out + &err)
    }

    #[test]
    fn cuda_training_step_with_nccl_matches_the_cpu_oracle() {
        let test = "cuda_training_step_with_nccl_matches_the_cpu_oracle";
        if !cuda_and_nccl_or_skip(test) {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("mlp.toml");
        std::fs::write(&config, MLP).unwrap();
        let config = config.to_str().unwrap();
        let g = gpu_count().min(8);
        if g < 2 {
            // One device: the step has no collectives; check the run works.
            let (cpu, _) = losses(config, "data=1", "dp", "cpu", false);
            let (gpu, _) = losses(config, "data=1", "dp", "cuda", true);
            assert_eq!(cpu.len(), gpu.len());
            println!("{test}: NOT RUN with collectives: one GPU (a step on one device has none)");
            return;
        }
        let mesh = format!("data={g}");
        for strategy in ["dp", "fsdp"] {
            let (cpu, _) = losses(config, &mesh, strategy, "cpu", false);
            let (gpu, log) = losses(config, &mesh, strategy, "cuda", true);
            assert!(log.contains("NCCL"), "NCCL_DEBUG=INFO printed nothing: was NCCL used?\n{log}");
            assert_eq!(cpu.len(), gpu.len());
            for (s, (a, b)) in gpu.iter().zip(&cpu).enumerate() {
                assert!((a - b).abs() <= 1e-5 * b.abs(), "{strategy} on {mesh}, step {s}: cuda+nccl {a} vs cpu {b}");
            }
        }
    }
}

//! Measures the constants of the CPU machine model
//! (`weft::runner::report::machine_model`): the GEMM rate of the fast CPU
//! backend per core when 8 logical devices share the cores, and what an
//! in-process collective costs per byte and per call. (The streaming rate
//! of element-wise ops and the per-op overhead come from whole training
//! steps, `weft compare-strategies`: the backend fuses element-wise chains,
//! so a chain of adds measures nothing.)
//!
//! Each measurement runs a device program that repeats one step `k` times
//! and one that runs it once, on the runtime's CPU devices with one worker
//! per core (as `weft train` does); the difference over `k - 1` is the
//! step's time without the upload and download of the inputs. Median of 5
//! runs each. The machine is shared, so run it when it is otherwise idle.
//!
//! `cargo run --release --example calibrate_cpu`

use std::time::Instant;
use weft_ir::device::parse_program;
use weft_ir::tensor::HostTensor;
use weft_runtime::{open_devices, BackendKind, ExecOptions, Executable};

/// Seconds of one run of `text` (median of 5, after one warm-up).
fn time_program(text: &str) -> f64 {
    let program = parse_program(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let n = program.num_devices();
    let inputs: Vec<Vec<HostTensor>> = (0..n)
        .map(|_| program.inputs.iter().map(|b| HostTensor::zeros(&program.buffers[b.index()].ty)).collect())
        .collect();
    let devices = open_devices(BackendKind::Cpu, n).unwrap();
    let mut exe = Executable::new(program, devices.backends, ExecOptions::default()).unwrap();
    exe.run(inputs.clone()).unwrap();
    let mut t: Vec<f64> = (0..5)
        .map(|_| {
            let clock = Instant::now();
            exe.run(inputs.clone()).unwrap();
            clock.elapsed().as_secs_f64()
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[2]
}

/// Seconds of one repetition of a step: `program(k)` repeats it `k` times.
fn per_step(program: &dyn Fn(usize) -> String, k: usize) -> f64 {
    ((time_program(&program(k)) - time_program(&program(1))) / (k - 1) as f64).max(0.0)
}

/// `k` dependent GEMMs `[m,c] x [c,c]` per device on a mesh of `devices`.
fn gemms(devices: usize, m: usize, c: usize, k: usize) -> String {
    let mut t =
        format!("device_program @gemm mesh [d={devices}] {{\n  input %0 : f32[{m},{c}]\n  input %1 : f32[{c},{c}]\n");
    for i in 0..k {
        let (x, y) = (if i == 0 { 0 } else { i + 1 }, i + 2);
        t.push_str(&format!(
            "  %{y} = dot_general %{x}, %1 {{lhs_contract = [1], rhs_contract = [0]}} : f32[{m},{c}]\n"
        ));
        if i > 0 {
            t.push_str(&format!("  free %{x}\n"));
        }
    }
    t + &format!("  return %{}\n}}\n", k + 1)
}

/// `k` dependent all-reduces of `[n]` over `axes` on `data=2,model=4`.
fn all_reduces(axes: &str, n: usize, k: usize) -> String {
    let mut t = format!("device_program @ar mesh [data=2, model=4] {{\n  input %0 : f32[{n}]\n");
    for i in 0..k {
        t.push_str(&format!("  %{} = all_reduce %{i} {{axes = [{axes}], op = sum}} : f32[{n}]\n", i + 1));
        if i > 0 {
            t.push_str(&format!("  free %{i}\n"));
        }
    }
    t + &format!("  return %{k}\n}}\n")
}

fn main() {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!("{cores} cores; 8 logical CPU devices, one worker per core\n");
    println!("GEMM [m,c] x [c,c] on every device (aggregate rate / cores = the per-core rate):");
    for (m, c) in [(512, 256), (2048, 64), (2048, 256)] {
        let t = per_step(&|k| gemms(8, m, c, k), 9);
        let flops = 8.0 * 2.0 * (m * c * c) as f64;
        println!(
            "  [{m},{c}]x[{c},{c}]: {:.3} ms per GEMM on all 8, {:.1} GFLOP/s per core",
            t * 1e3,
            flops / t / cores as f64 / 1e9
        );
    }
    println!("\nall-reduce of b bytes per device on data=2,model=4 (the model's α + β·2(n-1)/n·b per device):");
    for (axes, group) in [("data, model", 8.0), ("model", 4.0), ("data", 2.0)] {
        let mut points = Vec::new();
        for n in [1 << 14, 1 << 17, 1 << 19] {
            let t = per_step(&|k| all_reduces(axes, n, k), 9);
            let b = 4.0 * n as f64;
            points.push((b, t));
            println!("  [{axes}] b = {:>8} B: {:.3} ms", b as usize, t * 1e3);
        }
        // The smallest message gives α; the largest the bandwidth.
        let (b0, t0) = points[0];
        let (b1, t1) = points[points.len() - 1];
        let beta = (t1 - t0) / (2.0 * (group - 1.0) / group * (b1 - b0));
        // Noise can put the fitted line's intercept below zero.
        let alpha = (t0 - beta * 2.0 * (group - 1.0) / group * b0).max(0.0);
        println!(
            "    => α {:.1} µs, bandwidth 1/β {:.2} GB/s per device ({:.2} GB/s x cores / devices)",
            alpha * 1e6,
            1.0 / beta / 1e9,
            8.0 / beta / cores as f64 / 1e9
        );
    }
}

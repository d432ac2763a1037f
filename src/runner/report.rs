//! The step time the cost model predicts next to the one measured: how good
//! is the auto-sharder's cost model?
//!
//! The auto-sharder ranks plans by a predicted step time; a plan it picks
//! is only as good as that prediction. To check it, every run — whatever
//! its strategy — prices its own partitioned step with the same model
//! ([`weft_compiler::autoshard::predict_program`]) under the machine model
//! of its backend ([`machine_model`]), and reports the prediction next to
//! the measured steady-state step time (printed and in `run.json`).
//! `weft compare-strategies` does it for every strategy on one config and
//! states the rank correlation.

use super::{Backend, Prepared};
use crate::error::Result;
use weft_compiler::autoshard::{fmt_bytes, predict_program, AutoShardOptions, StepPrediction};
use weft_compiler::sharding::Mesh;

pub mod machine;

pub use machine::machine_model;

/// Compiles `prepared`'s step for `mesh` as the executor of `backend` does
/// (the auto-sharder under the backend's machine model for `auto`) and
/// prices the partitioned program with the cost model.
pub fn predict(
    prepared: &Prepared,
    mesh: &Mesh,
    backend: Backend,
    compiled: Option<&weft_ir::device::DeviceProgram>,
) -> Result<StepPrediction> {
    let model = machine_model(backend, mesh, &AutoShardOptions::default());
    if let Some(program) = compiled {
        // The program the executor runs: priced as is, not compiled again.
        return Ok(predict_program(program, mesh, &model));
    }
    let auto = prepared.auto.as_ref().map(|o| machine_model(backend, mesh, o));
    let state = Some(prepared.step.state.len());
    let (pf, _) =
        super::compile::compile(&prepared.step.module, "train_step", mesh, auto.as_ref(), prepared.overlap, state)?;
    Ok(predict_program(&pf.program, mesh, &model))
}

/// `predicted step 70.1 ms (compute 66.0 ms, communication 4.1 ms, 3.0
/// ms of it hidden: 9 all-reduce 2.00 MiB, ...)`.
pub fn predicted_line(p: &StepPrediction) -> String {
    let comms: Vec<String> =
        p.collectives.iter().map(|(kind, s)| format!("{} {} {}", s.count, kind.name(), fmt_bytes(s.bytes))).collect();
    let comms = if comms.is_empty() { String::new() } else { format!(": {}", comms.join(", ")) };
    let hidden = if p.hidden_communication > 0.0 {
        format!(", {} of it hidden", ms(p.hidden_communication))
    } else {
        String::new()
    };
    format!(
        "cost model: predicted step {} (compute {}, communication {}{hidden}{comms})",
        ms(p.total),
        ms(p.compute),
        ms(p.communication)
    )
}

/// `op classes (cost model, share of the step's priced time): dot_general
/// 62% compute-bound, all_reduce 10% communication, add 4% memory-bound,
/// ...`: the six that take most, and what bounds each.
pub fn classes_line(p: &StepPrediction) -> String {
    let total: f64 = p.classes.values().map(|c| c.time).sum::<f64>().max(1e-30);
    let mut by: Vec<(&String, &weft_compiler::autoshard::OpClass)> = p.classes.iter().collect();
    by.sort_by(|a, b| b.1.time.total_cmp(&a.1.time).then(a.0.cmp(b.0)));
    let shown: Vec<String> = by
        .iter()
        .take(6)
        .map(|(name, c)| {
            let bound = match c.bound() {
                "communication" => "communication".to_string(),
                b => format!("{b}-bound"),
            };
            format!("{name} {:.0}% {bound}", 100.0 * c.time / total)
        })
        .collect();
    let more = if by.len() > 6 { format!(", {} more", by.len() - 6) } else { String::new() };
    format!("op classes (cost model, share of the step's priced time): {}{more}", shown.join(", "))
}

/// `predicted 70.12 ms, measured / predicted 1.16`.
pub fn versus(p: &StepPrediction, measured: f64) -> String {
    format!("predicted {}, measured / predicted {:.2}", ms(p.total), measured / p.total)
}

/// The prediction (and, after a run, the measured step) for `run.json`.
pub fn json(p: &StepPrediction, measured: Option<f64>) -> serde_json::Value {
    let collectives: serde_json::Map<String, serde_json::Value> = p
        .collectives
        .iter()
        .map(|(k, s)| (k.name().to_string(), serde_json::json!({ "count": s.count, "bytes": s.bytes, "s": s.cost })))
        .collect();
    serde_json::json!({
        "step_s": p.total,
        "compute_s": p.compute,
        "communication_s": p.communication,
        "hidden_communication_s": p.hidden_communication,
        "flops_per_device": p.flops,
        "gemm_flops_per_device": p.dot_flops,
        "streamed_bytes_per_device": p.streamed_bytes,
        "collectives": collectives,
        "op_classes": p
            .classes
            .iter()
            .map(|(k, c)| (k.clone(), serde_json::json!({ "count": c.count, "s": c.time, "bound": c.bound() })))
            .collect::<serde_json::Map<String, serde_json::Value>>(),
        "measured_step_s": measured,
        "measured_over_predicted": measured.map(|m| m / p.total),
    })
}

/// Milliseconds with two decimals.
pub fn ms(seconds: f64) -> String {
    format!("{:.2} ms", seconds * 1e3)
}

/// What a run's steps achieve against the machine's peak: the model's
/// FLOPs per step (the unpartitioned step's, priced by the cost model: the
/// work of the model, not the work a layout repeats on several devices),
/// the partitioned program's FLOPs on all devices (the hardware's work),
/// the FLOP/s each reaches at the measured step time, and the fraction of
/// a peak: model FLOPs utilisation (MFU) and hardware FLOPs utilisation
/// (HFU), as torchtitan and PaLM report them.
#[derive(Clone, Debug, PartialEq)]
pub struct Utilisation {
    /// FLOPs of one step of the unpartitioned program.
    pub model_flops: f64,
    /// FLOPs of one step summed over the partitioned program's devices.
    pub hardware_flops: f64,
    /// The measured step time (seconds).
    pub step_s: f64,
    /// The peak FLOP/s of the machine the run uses, and where it comes
    /// from; `None` when none is known (a GPU without `peak_tflops`).
    pub peak: Option<(f64, String)>,
}

impl Utilisation {
    /// Model FLOP/s.
    pub fn model_flops_per_s(&self) -> f64 {
        self.model_flops / self.step_s
    }

    /// Model FLOPs utilisation: model FLOP/s over the peak.
    pub fn mfu(&self) -> Option<f64> {
        self.peak.as_ref().map(|(p, _)| self.model_flops_per_s() / p)
    }

    /// Hardware FLOPs utilisation: the partitioned program's FLOP/s over
    /// the peak.
    pub fn hfu(&self) -> Option<f64> {
        self.peak.as_ref().map(|(p, _)| self.hardware_flops / self.step_s / p)
    }

    /// `model 1.23 GFLOP/step at 45.6 GFLOP/s: MFU 23.5% (HFU 24.1%) of
    /// 194 GFLOP/s (...)`.
    pub fn line(&self) -> String {
        let peak = match (&self.peak, self.mfu(), self.hfu()) {
            (Some((p, why)), Some(m), Some(h)) => {
                format!(": MFU {:.1}% (HFU {:.1}%) of {} ({why})", m * 100.0, h * 100.0, flops_per_s(*p))
            }
            _ => "; no peak known (declare one with peak_tflops)".to_string(),
        };
        format!("model {}/step at {}{peak}", si(self.model_flops, "FLOP"), flops_per_s(self.model_flops_per_s()))
    }

    /// For `run.json`.
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "model_flops_per_step": self.model_flops,
            "hardware_flops_per_step": self.hardware_flops,
            "step_s": self.step_s,
            "model_flops_per_s": self.model_flops_per_s(),
            "peak_flops_per_s": self.peak.as_ref().map(|(p, _)| *p),
            "peak_source": self.peak.as_ref().map(|(_, w)| w.clone()),
            "mfu": self.mfu(),
            "hfu": self.hfu(),
        })
    }
}

fn si(v: f64, unit: &str) -> String {
    let (scale, prefix) = [(1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")]
        .into_iter()
        .find(|(s, _)| v >= *s)
        .unwrap_or((1.0, ""));
    format!("{:.3} {prefix}{unit}", v / scale)
}

fn flops_per_s(v: f64) -> String {
    si(v, "FLOP/s")
}

/// The peak FLOP/s of a run's machine: `declared_tflops` per device where
/// given (`peak_tflops`), else for the CPU backends the calibrated GEMM
/// rate per core ([`machine::CPU_GEMM_FLOPS_PER_CORE`]) times the cores
/// of every host the run uses (`hosts`, each with this host's cores); a
/// GPU without a declared peak has none.
pub fn peak(backend: Backend, devices: usize, hosts: usize, declared_tflops: Option<f64>) -> Option<(f64, String)> {
    if let Some(t) = declared_tflops {
        return Some((t * 1e12 * devices as f64, format!("declared {t} TFLOP/s per device × {devices}")));
    }
    if !backend.on_host() {
        return None;
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let per = machine::CPU_GEMM_FLOPS_PER_CORE;
    let of = if hosts > 1 { format!(" on each of {hosts} hosts") } else { String::new() };
    Some((
        per * (cores * hosts.max(1)) as f64,
        format!("the calibrated GEMM rate {} per core × {cores} cores{of}", flops_per_s(per)),
    ))
}

/// The FLOPs of one step of `prepared`'s unpartitioned program: its step
/// compiled for a mesh of the same axes, each of size 1, and priced.
pub fn model_flops(prepared: &Prepared, mesh: &Mesh) -> Result<f64> {
    let axes: Vec<(&str, usize)> = mesh.axes().iter().map(|a| (a.name.as_str(), 1)).collect();
    let one = Mesh::new(&axes)?;
    let state = Some(prepared.step.state.len());
    let (pf, _) = super::compile::compile(&prepared.step.module, "train_step", &one, None, None, state)?;
    Ok(predict_program(&pf.program, &one, &AutoShardOptions::default()).flops)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utilisation_is_flops_over_time_over_the_peak() {
        let u = Utilisation { model_flops: 2e9, hardware_flops: 3e9, step_s: 0.5, peak: Some((8e9, "test".into())) };
        assert_eq!(u.model_flops_per_s(), 4e9);
        assert_eq!((u.mfu(), u.hfu()), (Some(0.5), Some(0.75)));
        assert_eq!(u.line(), "model 2.000 GFLOP/step at 4.000 GFLOP/s: MFU 50.0% (HFU 75.0%) of 8.000 GFLOP/s (test)");
        let none = Utilisation { peak: None, ..u };
        assert!(none.line().ends_with("no peak known (declare one with peak_tflops)"), "{}", none.line());
        assert_eq!(none.json()["mfu"], serde_json::Value::Null);
        let (cuda, cpu): (Backend, Backend) = ("cuda".parse().unwrap(), "cpu".parse().unwrap());
        let declared = peak(cuda, 8, 1, Some(989.0)).unwrap();
        assert_eq!(declared.0, 989e12 * 8.0);
        assert!(peak(cuda, 8, 1, None).is_none());
        let cpu = peak(cpu, 8, 2, None).unwrap();
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        assert_eq!(cpu.0, machine::CPU_GEMM_FLOPS_PER_CORE * cores * 2.0);
        assert!(cpu.1.ends_with("on each of 2 hosts"), "{}", cpu.1);
    }
}

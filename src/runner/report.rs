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
    let (pf, _) = super::compile::compile(&prepared.step.module, "train_step", mesh, auto.as_ref(), state)?;
    Ok(predict_program(&pf.program, mesh, &model))
}

/// `predicted step 70.1 ms (compute 66.0 ms, communication 4.1 ms: 9
/// all-reduce 2.00 MiB, ...)`.
pub fn predicted_line(p: &StepPrediction) -> String {
    let comms: Vec<String> =
        p.collectives.iter().map(|(kind, s)| format!("{} {} {}", s.count, kind.name(), fmt_bytes(s.bytes))).collect();
    let comms = if comms.is_empty() { String::new() } else { format!(": {}", comms.join(", ")) };
    format!(
        "cost model: predicted step {} (compute {}, communication {}{comms})",
        ms(p.total),
        ms(p.compute),
        ms(p.communication)
    )
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
        "flops_per_device": p.flops,
        "gemm_flops_per_device": p.dot_flops,
        "streamed_bytes_per_device": p.streamed_bytes,
        "collectives": collectives,
        "measured_step_s": measured,
        "measured_over_predicted": measured.map(|m| m / p.total),
    })
}

/// Milliseconds with two decimals.
pub fn ms(seconds: f64) -> String {
    format!("{:.2} ms", seconds * 1e3)
}

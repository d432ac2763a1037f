//! A reference executor: N simulated devices in one process.
//!
//! This is the oracle for partitioned programs, as the interpreter is for
//! global ones: each device holds host tensors, compute steps run the
//! interpreter's per-op semantics ([`crate::interp::eval_op`]), and
//! collectives are computed from the group's buffers in rank order by
//! [`super::collective`] (reductions fold left, `((b0 op b1) op b2) ...`,
//! with the interpreter's binary op) — the same definition every runtime
//! communicator uses — so every run is deterministic and every member of a
//! group receives bit-identical results. Devices advance in lockstep, one step at
//! a time. Speed is not a goal; clarity and exactness are.

use super::{collective, verify_program, BufferId, Collective, DeviceProgram, Step};
use crate::interp::eval_op;
use crate::tensor::HostTensor;
use crate::{Diagnostic, IrError};

/// Runs `p` on `inputs[d]` (the input buffers of device `d`, in program
/// order) for every device of the mesh; returns each device's outputs. The
/// program is verified first ([`verify_program`]); a wrong number of
/// devices or inputs, or an input of the wrong type, is [`IrError::Input`].
pub fn simulate(p: &DeviceProgram, inputs: Vec<Vec<HostTensor>>) -> Result<Vec<Vec<HostTensor>>, IrError> {
    verify_program(p)?;
    let n = p.num_devices();
    if inputs.len() != n {
        return Err(IrError::Input {
            name: "devices".into(),
            message: format!("@{} runs on {n} devices but inputs for {} were given", p.name, inputs.len()),
        });
    }
    let mut slots: Vec<Vec<Option<HostTensor>>> = Vec::with_capacity(n);
    for (d, ins) in inputs.into_iter().enumerate() {
        if ins.len() != p.inputs.len() {
            return Err(IrError::Input {
                name: format!("device {d}"),
                message: format!("@{} takes {} inputs, given {}", p.name, p.inputs.len(), ins.len()),
            });
        }
        let mut s: Vec<Option<HostTensor>> = vec![None; p.buffers.len()];
        for (k, (&b, t)) in p.inputs.iter().zip(ins).enumerate() {
            if !t.has_type(p.ty(b)) {
                return Err(IrError::Input {
                    name: p.buffers[b.index()].name.clone().unwrap_or_else(|| format!("input {k}")),
                    message: format!("device {d}: expected {}, given {}", p.ty(b), t.ty()),
                });
            }
            s[b.index()] = Some(t);
        }
        slots.push(s);
    }
    for (i, step) in p.steps.iter().enumerate() {
        run_step(p, step, &mut slots).map_err(|message| {
            IrError::Interp(Diagnostic {
                func: p.name.clone(),
                loc: None,
                subject: format!("step {i} (`{}`)", super::verify::step_name(step)),
                message,
            })
        })?;
    }
    Ok(slots
        .into_iter()
        .map(|mut s| {
            p.outputs
                .iter()
                .enumerate()
                .map(|(k, &b)| {
                    let again = p.outputs[k + 1..].contains(&b);
                    let t = if again { s[b.index()].clone() } else { s[b.index()].take() };
                    t.unwrap_or_else(|| panic!("output %{} has no value (verified program)", b.0))
                })
                .collect()
        })
        .collect())
}

fn get(slots: &[Option<HostTensor>], b: BufferId) -> &HostTensor {
    slots[b.index()].as_ref().unwrap_or_else(|| panic!("buffer %{} is not live (verified program)", b.0))
}

fn run_step(p: &DeviceProgram, step: &Step, slots: &mut [Vec<Option<HostTensor>>]) -> Result<(), String> {
    match step {
        Step::Compute { op, inputs, outputs } => {
            for s in slots.iter_mut() {
                let xs: Vec<&HostTensor> = inputs.iter().map(|&b| get(s, b)).collect();
                let outs = eval_op(op, &xs).map_err(|e| e.to_string())?;
                for (&b, t) in outputs.iter().zip(outs) {
                    s[b.index()] = Some(t);
                }
            }
        }
        Step::ShardSlice { input, output, dims } => {
            for (d, s) in slots.iter_mut().enumerate() {
                let coords = p.coords(d);
                let mut t = get(s, *input).clone();
                for (dim, axes) in dims.iter().enumerate().filter(|(_, a)| !a.is_empty()) {
                    let idx: Vec<usize> = axes.iter().map(|a| p.axis_index(a).expect("verified axis")).collect();
                    t = collective::block(&t, dim, p.rank_in(&coords, &idx), p.group_size(axes))?;
                }
                s[output.index()] = Some(t);
            }
        }
        // A started collective is computed at its start: its result is the
        // same whenever it is taken, and the verified program reads it only
        // after its `done`.
        Step::Collective { op, input, output } | Step::Start { op, input, output } => {
            let results = collective(p, op, *input, slots)?;
            for (d, t) in results.into_iter().enumerate() {
                slots[d][output.index()] = Some(t);
            }
        }
        Step::Done(_) => {}
        Step::Free(bs) => {
            for s in slots.iter_mut() {
                for &b in bs {
                    s[b.index()] = None;
                }
            }
        }
    }
    Ok(())
}

/// What every device receives from collective `c` on `input`.
fn collective(
    p: &DeviceProgram,
    c: &Collective,
    input: BufferId,
    slots: &[Vec<Option<HostTensor>>],
) -> Result<Vec<HostTensor>, String> {
    let n = p.num_devices();
    let mut out: Vec<Option<HostTensor>> = vec![None; n];
    if let Collective::CollectivePermute { pairs } = c {
        let all: Vec<HostTensor> = slots.iter().map(|s| get(s, input).clone()).collect();
        return Ok(collective::permute(pairs, &all));
    }
    let axes = match c {
        Collective::AllGather { axes, .. }
        | Collective::AllReduce { axes, .. }
        | Collective::ReduceScatter { axes, .. }
        | Collective::AllToAll { axes, .. } => axes,
        Collective::CollectivePermute { .. } => unreachable!("handled above"),
    };
    for group in p.groups(axes) {
        let parts: Vec<HostTensor> = group.iter().map(|&d| get(&slots[d], input).clone()).collect();
        for (&d, t) in group.iter().zip(collective::combine(c, parts)?) {
            out[d] = Some(t);
        }
    }
    Ok(out.into_iter().map(|t| t.expect("every device is in one group")).collect())
}

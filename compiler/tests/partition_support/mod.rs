//! Helpers shared by the partitioner tests: meshes, annotation choices,
//! deterministic inputs, and the equivalence check (propagate -> partition
//! -> simulate equals the unsharded interpreter).
#![allow(dead_code)]

#[path = "../common/mod.rs"]
mod common;

use weft_compiler::partition::{partition_function, PartitionedFunction};
use weft_compiler::sharding::{propagate, Mesh, MeshSharding, PropagateOptions};
use weft_compiler::Site;
use weft_ir::prng::Key;
use weft_ir::tensor::{check_close, HostTensor};
use weft_ir::{DType, Function, Module, TensorType};

/// The meshes of the equivalence suite: (1,), (2,), (2,2), (2,4), (4,2), (8,).
pub fn meshes() -> Vec<Mesh> {
    ["x=1", "x=2", "x=2,y=2", "x=2,y=4", "x=4,y=2", "x=8"].iter().map(|m| Mesh::parse(m).unwrap()).collect()
}

/// Annotations to try on a tensor of `shape` on `mesh`: unannotated, and
/// every closed sharding using at most two axes that divides the shape (at
/// most `limit` of them, spread over the list).
pub fn choices(mesh: &Mesh, shape: &[usize], limit: usize) -> Vec<Option<String>> {
    let names: Vec<&str> = mesh.axes().iter().map(|a| a.name.as_str()).collect();
    let mut per_dim: Vec<Vec<String>> = vec![vec![]];
    per_dim[0].push(String::new());
    for a in &names {
        per_dim[0].push(a.to_string());
    }
    for a in &names {
        for b in &names {
            if a != b {
                per_dim[0].push(format!("{a}, {b}"));
            }
        }
    }
    let opts = per_dim.remove(0);
    let mut all: Vec<Vec<String>> = vec![vec![]];
    for _ in shape {
        all =
            all.into_iter().flat_map(|pre| opts.iter().map(move |o| [pre.clone(), vec![o.clone()]].concat())).collect();
    }
    let ty = TensorType::new(DType::F32, shape.to_vec());
    let valid: Vec<String> = all
        .into_iter()
        .map(|dims| format!("[{}]", dims.iter().map(|d| format!("{{{d}}}")).collect::<Vec<_>>().join(", ")))
        .filter(|text| {
            let s = parse_sharding(text);
            MeshSharding::resolve(&s, &ty, mesh, &Site::new("", "", None)).is_ok()
        })
        .collect();
    let step = (valid.len() / limit.max(1)).max(1);
    let mut out: Vec<Option<String>> = vec![None];
    out.extend(valid.into_iter().step_by(step).take(limit).map(Some));
    out
}

/// Parses `[{x, y}, {}]` with an optional ` unreduced {a}` suffix.
pub use common::s as parse_sharding;

/// Deterministic values in [-1, 1) for a tensor of type `ty` (integers:
/// small values; bool: alternating).
pub fn input(ty: &TensorType, seed: u64) -> HostTensor {
    let n = ty.num_elements();
    let u = Key::from_seed(seed).uniform_f32(n);
    let vals: Vec<f64> = match ty.dtype {
        DType::Bool => u.iter().map(|&v| if v < 0.5 { 0.0 } else { 1.0 }).collect(),
        DType::I32 | DType::U32 => u.iter().map(|&v| (v * 8.0).floor() as f64).collect(),
        _ => u.iter().map(|&v| 2.0 * v as f64 - 1.0).collect(),
    };
    HostTensor::from_values(ty, &vals).unwrap()
}

/// Propagates `f` on `mesh`, partitions, runs on the simulated mesh and
/// compares with the interpreter (relative 1e-5; absolute 1e-5 of the
/// result's largest magnitude). Returns the partitioned function.
pub fn check_equivalent(f: &Function, mesh: &Mesh, inputs: &[HostTensor]) -> Result<PartitionedFunction, String> {
    let sf = propagate(f, mesh, &PropagateOptions::default()).map_err(|e| format!("propagation: {e}"))?;
    let pf = partition_function(&sf, mesh).map_err(|e| format!("partition: {e}"))?;
    weft_ir::device::verify_program(&pf.program).map_err(|e| {
        format!("the device program does not verify: {e}\n{}", weft_ir::device::print_program(&pf.program))
    })?;
    let got = pf
        .run(inputs, mesh.num_devices())
        .map_err(|e| format!("run: {e}\n{}", weft_ir::device::print_program(&pf.program)))?;
    let m = Module { functions: vec![f.clone()] };
    let want = weft_ir::interp::run(&m, &f.name, inputs).map_err(|e| format!("interpreter: {e}"))?;
    for (k, (g, w)) in got.iter().zip(&want).enumerate() {
        let scale = w.to_f64_vec().iter().fold(0.0f64, |m, v| m.max(v.abs()));
        check_close(g, w, 1e-5, 1e-5 * scale)
            .map_err(|e| format!("result {k}: {e}\n{}", weft_ir::device::print_program(&pf.program)))?;
    }
    Ok(pf)
}

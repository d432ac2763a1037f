//! A config's whole training step, compiled as `weft train` compiles it,
//! for `weft lower CONFIG` (with `--explain`, the reshards behind its
//! exchanges). Its own file: it uses both the compile and the cost model's
//! machine model, which use each other's neighbours.

use super::compile::compile;
use crate::error::Result;
use weft_compiler::partition::PartitionedFunction;
use weft_compiler::pipeline::Pipeline;
use weft_compiler::sharding::Mesh;

/// The training step of config `c` on its mesh (default: one device),
/// compiled as `weft train` compiles it (`weft lower CONFIG`); with
/// `explain`, also the reshards propagation inserted and why (from a second
/// run of the pass list up to propagation; the state layouts the compile
/// settles afterwards can add exchanges of their own).
pub fn compile_config(c: &super::RunConfig, explain: bool) -> Result<(PartitionedFunction, Vec<String>)> {
    let mesh = Mesh::parse(c.mesh.as_deref().unwrap_or("data=1"))?;
    let axes: Vec<&str> = mesh.axes().iter().map(|a| a.name.as_str()).collect();
    let prepared = super::prepare(c, &axes, &super::Overrides::default())?;
    let backend: super::Backend = c.backend.as_deref().unwrap_or("cpu").parse()?;
    let auto = prepared.auto.as_ref().map(|o| super::report::machine_model(backend, &mesh, o));
    let state = Some(prepared.step.state.len());
    let pf = compile(&prepared.step.module, "train_step", &mesh, auto.as_ref(), prepared.overlap, state)?.0;
    let mut lines = Vec::new();
    if explain {
        let mut passes = Pipeline::for_step(&mesh, auto.as_ref(), None);
        passes.passes.truncate(passes.passes.iter().position(|p| p.name() == "propagate").map_or(0, |i| i + 1));
        passes.run(&prepared.step.module, "train_step", &mut |_, p| {
            if let weft_compiler::pipeline::Program::Sharded(sf) = p {
                lines = sf.reshard_lines();
            }
        })?;
    }
    Ok((pf, lines))
}

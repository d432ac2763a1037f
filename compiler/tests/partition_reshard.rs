//! Every reshard lowers to device steps that move exactly the right blocks:
//! for every pair of shardings (split, replicated, unreduced, reordered) of
//! a tensor on the suite's meshes, `reshard` run on the simulated mesh is
//! the identity on the global value, and the collectives emitted are those
//! of the reshard's plan (`plan_reshard`), plus permutes where the plan
//! moves blocks between devices or axes must be reordered first.
mod partition_support;
use partition_support::*;
use std::collections::BTreeSet;
use weft_compiler::partition::partition_function;
use weft_compiler::sharding::{plan_reshard, propagate, Mesh, MeshSharding, PropagateOptions};
use weft_compiler::Site;
use weft_ir::{DType, Function, Op, TensorType};

/// Shardings of a rank-2 tensor `[8, 16]` on `mesh`, with every unreduced
/// subset of the axes a sharding leaves free (at most `limit`).
fn all_shardings(mesh: &Mesh, limit: usize) -> Vec<String> {
    let names: Vec<String> = mesh.axes().iter().map(|a| a.name.clone()).collect();
    let mut out = Vec::new();
    for c in choices(mesh, &[8, 16], usize::MAX).into_iter().flatten() {
        out.push(c.clone());
        let used: Vec<&String> = names.iter().filter(|n| c.contains(n.as_str())).collect();
        let free: Vec<&String> = names.iter().filter(|n| !used.contains(n)).collect();
        for mask in 1..(1usize << free.len()) {
            let u: Vec<&str> = (0..free.len()).filter(|i| mask & (1 << i) != 0).map(|i| free[i].as_str()).collect();
            out.push(format!("{c} unreduced {{{}}}", u.join(", ")));
        }
    }
    let step = (out.len() / limit).max(1);
    out.into_iter().step_by(step).collect()
}

fn reshard_fn(from: &str, to: &str) -> Function {
    let ty = TensorType::new(DType::F32, vec![8, 16]);
    let mut f = Function::new("reshard");
    let x = f.add_param(Some("x".into()), ty.clone());
    f.values[x.index()].sharding = Some(parse_sharding(from));
    let id = f.add_inst(Op::Reshard { to: parse_sharding(to) }, vec![x], vec![(ty, Some("y".into()))], None);
    let y = f.insts[id.index()].results[0];
    f.results = vec![y];
    f.result_shardings = vec![Some(parse_sharding(to))];
    f
}

fn kind(describe: &str) -> String {
    describe.split('{').next().unwrap().replace('-', "_")
}

#[test]
fn every_reshard_is_the_identity_on_the_global_value() {
    let mut failures = Vec::new();
    let mut runs = 0;
    let ty = TensorType::new(DType::F32, vec![8, 16]);
    for mesh in meshes() {
        let all = all_shardings(&mesh, usize::MAX);
        for from in &all {
            for to in &all {
                let f = reshard_fn(from, to);
                let x = input(&ty, runs as u64);
                runs += 1;
                let pf = match check_equivalent(&f, &mesh, &[x]) {
                    Ok(pf) => pf,
                    Err(e) => {
                        failures.push(format!("{from} -> {to} on ({mesh}): {e}"));
                        continue;
                    }
                };
                let shown = |s: &weft_ir::TensorSharding| weft_compiler::sharding::fmt_sharding(s);
                let io = (shown(&pf.inputs[0].sharding), shown(&pf.outputs[0].sharding));
                if io != (from.clone(), to.clone()) {
                    failures.push(format!("{from} -> {to} on ({mesh}): the program maps {io:?}"));
                }
                // The collectives are the plan's (permutes aside).
                let site = Site::new("", "", None);
                let fs = MeshSharding::resolve(&parse_sharding(from), &ty, &mesh, &site).unwrap();
                let ts = MeshSharding::resolve(&parse_sharding(to), &ty, &mesh, &site).unwrap();
                let plan = plan_reshard(&ty, &fs, &ts, &mesh);
                let planned: BTreeSet<String> = plan
                    .describe(&mesh)
                    .iter()
                    .map(|d| kind(d))
                    .filter(|k| k != "local_slice" && k != "local_unreduce" && k != "collective_permute")
                    .collect();
                let report = pf.report();
                let emitted: BTreeSet<String> =
                    report.collectives.keys().filter(|k| *k != "collective_permute").cloned().collect();
                // Size-1 axes need no collective.
                if planned != emitted && mesh.num_devices() > 1 && !mesh.axes().iter().any(|a| a.size == 1) {
                    failures.push(format!(
                        "{from} -> {to} on ({mesh}): plan {:?} but emitted {emitted:?}",
                        plan.describe(&mesh)
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{} of {runs} reshards failed:\n\n{}", failures.len(), failures.join("\n\n"));
    println!("{runs} reshards checked");
}

/// The classic transitions lower to the expected single collective.
#[test]
fn classic_transitions_emit_one_collective() {
    let mesh = Mesh::parse("x=2,y=4").unwrap();
    let cases = [
        ("[{}, {}]", "[{x}, {}]", None),
        ("[{x}, {}]", "[{}, {}]", Some("all_gather")),
        ("[{}, {}] unreduced {x}", "[{}, {}]", Some("all_reduce")),
        ("[{}, {}] unreduced {y}", "[{}, {y}]", Some("reduce_scatter")),
        ("[{x}, {}]", "[{}, {x}]", Some("all_to_all")),
        ("[{x, y}, {}]", "[{y, x}, {}]", Some("collective_permute")),
    ];
    let ty = TensorType::new(DType::F32, vec![8, 16]);
    for (from, to, want) in cases {
        let f = reshard_fn(from, to);
        let pf = check_equivalent(&f, &mesh, &[input(&ty, 1)]).unwrap();
        let r = pf.report();
        match want {
            None => {
                assert_eq!(r.total_collectives(), 0, "{from} -> {to}");
                let slices =
                    pf.program.steps.iter().filter(|s| matches!(s, weft_ir::device::Step::ShardSlice { .. })).count();
                assert_eq!(slices, 1, "replicated -> split is one local shard slice");
            }
            Some(k) => assert_eq!(
                (r.total_collectives(), r.count(k)),
                (1, 1),
                "{from} -> {to}: {:?}\n{}",
                r.collectives,
                weft_ir::device::print_program(&pf.program)
            ),
        }
    }
    let _ = propagate(&reshard_fn("[{}, {}]", "[{x}, {}]"), &mesh, &PropagateOptions::default()).unwrap();
    let _ = partition_function;
}

/// An all-reduce whose result is only sliced (two reshards in a row:
/// pending sum -> replicated -> split) is fused into one reduce-scatter.
#[test]
fn all_reduce_then_slice_fuses_into_a_reduce_scatter() {
    let mesh = Mesh::parse("x=2,y=4").unwrap();
    let ty = TensorType::new(DType::F32, vec![8, 16]);
    let mut f = Function::new("fuse");
    let x = f.add_param(Some("x".into()), ty.clone());
    f.values[x.index()].sharding = Some(parse_sharding("[{}, {x}] unreduced {y}"));
    let id = f.add_inst(Op::Reshard { to: parse_sharding("[{}, {x}]") }, vec![x], vec![(ty.clone(), None)], None);
    let r = f.insts[id.index()].results[0];
    let id = f.add_inst(Op::Reshard { to: parse_sharding("[{y}, {x}]") }, vec![r], vec![(ty.clone(), None)], None);
    f.results = vec![f.insts[id.index()].results[0]];
    f.result_shardings = vec![Some(parse_sharding("[{y}, {x}]"))];
    let pf = check_equivalent(&f, &mesh, &[input(&ty, 9)]).unwrap();
    let r = pf.report();
    assert_eq!(
        (r.count("reduce_scatter"), r.total_collectives()),
        (1, 1),
        "{}",
        weft_ir::device::print_program(&pf.program)
    );
    assert!(!pf.program.steps.iter().any(|s| matches!(s, weft_ir::device::Step::ShardSlice { .. })));
}

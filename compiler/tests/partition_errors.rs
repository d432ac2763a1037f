//! Bad input to the partitioner and to device-program execution is reported
//! before anything runs, with a clear error: a mesh larger than the devices
//! available, a program the verifier rejects, a sharded function that is not
//! locally computable, wrong inputs, disagreeing replicas.
mod partition_support;
use partition_support::*;
use weft_compiler::partition::{partition, partition_function, shard_tensor, unshard_tensor};
use weft_compiler::sharding::{propagate, Mesh, PropagateOptions};
use weft_compiler::CompilerError;
use weft_ir::device::{Collective, Step};
use weft_ir::tensor::HostTensor;
use weft_ir::{DType, DotDims, Function, Op, TensorType};

fn mlp() -> Function {
    let mut f = Function::new("mlp");
    let t = |s: &[usize]| TensorType::new(DType::F32, s.to_vec());
    let x = f.add_param(Some("x".into()), t(&[8, 4]));
    f.values[x.index()].sharding = Some(parse_sharding("[{data}, {}]"));
    let w = f.add_param(Some("w".into()), t(&[4, 8]));
    f.values[w.index()].sharding = Some(parse_sharding("[{data}, {}]"));
    let id = f.add_inst(Op::DotGeneral(DotDims::matmul()), vec![x, w], vec![(t(&[8, 8]), Some("h".into()))], None);
    f.results = vec![f.insts[id.index()].results[0]];
    f
}

fn lowered() -> weft_compiler::partition::PartitionedFunction {
    let mesh = Mesh::parse("data=2,model=4").unwrap();
    let sf = propagate(&mlp(), &mesh, &PropagateOptions::default()).unwrap();
    partition_function(&sf, &mesh).unwrap()
}

fn inputs() -> Vec<HostTensor> {
    let f = mlp();
    f.params.iter().map(|&p| input(f.ty(p), 0)).collect()
}

#[test]
fn a_mesh_larger_than_the_machine_is_rejected_before_running() {
    let pf = lowered();
    let e = pf.run(&inputs(), 4).unwrap_err();
    assert!(matches!(e, CompilerError::InvalidMesh { .. }), "{e:?}");
    assert_eq!(e.to_string(), "invalid mesh `data=2,model=4`: the mesh needs 8 devices but only 4 are available");
    assert!(pf.run(&inputs(), 8).is_ok());
}

#[test]
fn a_program_the_verifier_rejects_does_not_run() {
    let mut pf = lowered();
    let i = pf.program.steps.iter().position(|s| matches!(s, Step::Collective { .. })).expect("a collective");
    if let Step::Collective { op: Collective::AllGather { axes, .. }, .. } = &mut pf.program.steps[i] {
        axes[0] = "modle".into();
    } else {
        panic!("expected the weight's all-gather first: {}", weft_ir::device::print_program(&pf.program));
    }
    let e = pf.run(&inputs(), 8).unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, CompilerError::Ir(weft_ir::IrError::Verify(_))), "{e:?}");
    assert!(
        text.contains(&format!("step {i} (`all_gather`): mesh axis `modle` does not exist (mesh axes: data, model)")),
        "{text}"
    );
}

#[test]
fn a_function_that_is_not_locally_computable_is_rejected() {
    let mesh = Mesh::parse("data=2").unwrap();
    let mut sf = propagate(&mlp(), &mesh, &PropagateOptions::default()).unwrap();
    // Tamper with the result's sharding: the dot can no longer produce it.
    let h = *sf.function.results.first().unwrap();
    let def = sf.function.insts.iter().position(|i| i.results.contains(&h)).unwrap();
    let r = sf.function.insts[def].results[0];
    sf.function.values[r.index()].sharding = Some(parse_sharding("[{}, {data}]"));
    let e = partition(&sf, &mesh).unwrap_err();
    assert!(matches!(e, CompilerError::NotLocallyComputable { .. }), "{e}");
}

#[test]
fn wrong_inputs_name_the_parameter() {
    let pf = lowered();
    let e = pf.run(&inputs()[..1], 8).unwrap_err();
    assert_eq!(e.to_string(), "input `arg1`: @mlp takes 2 inputs (x, w), given 1");
    let mut bad = inputs();
    bad[1] = HostTensor::zeros(&TensorType::new(DType::F32, vec![4, 4]));
    let e = pf.run(&bad, 8).unwrap_err();
    assert_eq!(e.to_string(), "input `w`: expected f32[4,8], given f32[4,4]");
}

#[test]
fn unshard_reports_replicas_that_disagree() {
    let mesh = Mesh::parse("a=2,b=2").unwrap();
    let t = input(&TensorType::new(DType::F32, vec![4, 2]), 3);
    let s = parse_sharding("[{a}, {}]");
    let mut blocks = shard_tensor(&t, &s, &mesh).unwrap();
    assert_eq!(unshard_tensor(&blocks, &s, &mesh).unwrap(), t);
    blocks[1] = HostTensor::zeros(&blocks[1].ty());
    let e = unshard_tensor(&blocks, &s, &mesh).unwrap_err().to_string();
    assert!(e.contains("devices 0 and 1 should hold the same block [0, 0]"), "{e}");
    let e = shard_tensor(&t, &parse_sharding("[{c}, {}]"), &mesh).unwrap_err();
    assert!(matches!(e, CompilerError::UnknownAxis { .. }), "{e}");
}

#[test]
fn unreduced_blocks_sum_back_to_the_value() {
    let mesh = Mesh::parse("a=2,b=2").unwrap();
    let t = input(&TensorType::new(DType::F32, vec![4, 2]), 4);
    let s = parse_sharding("[{a}, {}] unreduced {b}");
    let blocks = shard_tensor(&t, &s, &mesh).unwrap();
    // Device (0, 1) holds zeros: the value lives at b = 0.
    assert_eq!(blocks[1].to_f64_vec(), vec![0.0; 4]);
    assert_eq!(blocks[0].to_f64_vec(), t.to_f64_vec()[..4].to_vec());
    assert_eq!(unshard_tensor(&blocks, &s, &mesh).unwrap(), t);
}

//! Meshes and the meaning of a sharding on one: which device holds which block.
mod common;
use common::s;
use weft_compiler::sharding::{local_shape, render_grid, shard_index, shard_offset, Mesh, MeshSharding};
use weft_compiler::{CompilerError, Site};
use weft_ir::{DType, TensorType};

#[test]
fn mesh_parse_new_and_coordinates() {
    let m = Mesh::parse("data=2, model=4").unwrap();
    assert_eq!(m, Mesh::new(&[("data", 2), ("model", 4)]).unwrap());
    assert_eq!(m.to_string(), "data=2,model=4");
    assert_eq!(m.num_devices(), 8);
    assert_eq!(m.coords(6).unwrap(), vec![1, 2]);
    assert_eq!(m.device_at(&[1, 2]), 6);
    assert_eq!(m.axes()[1].name, "model");
    assert!(matches!(m.coords(8), Err(CompilerError::UnknownDevice { device: 8, .. })));
}

#[test]
fn device_groups_along_axes() {
    let m = Mesh::parse("data=2,model=4").unwrap();
    assert_eq!(m.groups(&["model"]).unwrap(), vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7]]);
    assert_eq!(m.groups(&["data"]).unwrap(), vec![vec![0, 4], vec![1, 5], vec![2, 6], vec![3, 7]]);
    assert_eq!(m.groups(&["model", "data"]).unwrap(), vec![vec![0, 4, 1, 5, 2, 6, 3, 7]]);
    assert_eq!(m.groups(&[]).unwrap().len(), 8);
    assert!(m.groups(&["nope"]).is_err());
}

#[test]
fn explicit_devices_and_links() {
    let m = Mesh::parse("x=2,y=2").unwrap().with_devices(vec![3, 2, 1, 0]).unwrap();
    assert_eq!(m.coords(3).unwrap(), vec![0, 0]);
    assert_eq!(m.groups(&["y"]).unwrap(), vec![vec![3, 2], vec![1, 0]]);
    let m = m.with_link("x", 1e9, 1e-6).unwrap();
    assert_eq!((m.axes()[0].bandwidth, m.axes()[0].latency), (Some(1e9), Some(1e-6)));
    assert_eq!(m.axes()[1].bandwidth, None);
}

#[test]
fn mesh_errors() {
    for bad in ["data=0", "data=2,data=2", "data", "data=x", "2x=2"] {
        let e = Mesh::parse(bad).unwrap_err();
        assert!(matches!(e, CompilerError::InvalidMesh { .. }), "{bad}: {e}");
        assert!(e.to_string().contains(bad), "{e}");
    }
    let m = Mesh::parse("x=2,y=2").unwrap();
    assert!(m.clone().with_devices(vec![0, 1, 2]).unwrap_err().to_string().contains("3 device ids given for 4"));
    assert!(m.clone().with_devices(vec![0, 1, 1, 2]).unwrap_err().to_string().contains("device 1 appears twice"));
    assert!(m.with_link("z", 1.0, 0.0).is_err());
}

// A dimension split over [a, b] is cut into |a|*|b| blocks; the device at
// coordinates (ia, ib) holds block ia*|b| + ib (JAX's layout).
#[test]
fn blocks_follow_major_to_minor_axes() {
    let m = Mesh::parse("data=2,model=4").unwrap();
    assert_eq!(local_shape(&[8, 16], &s("[{data}, {model}]"), &m).unwrap(), vec![4, 4]);
    assert_eq!(shard_index(&[8, 16], &s("[{data}, {model}]"), &m, 5).unwrap(), vec![1, 1]);
    assert_eq!(shard_offset(&[8, 16], &s("[{data}, {model}]"), &m, 5).unwrap(), vec![4, 4]);
    // Device 5 is at (data=1, model=1).
    assert_eq!(shard_index(&[16, 4], &s("[{data, model}, {}]"), &m, 5).unwrap(), vec![5, 0]);
    assert_eq!(shard_index(&[16, 4], &s("[{model, data}, {}]"), &m, 5).unwrap(), vec![3, 0]);
    assert_eq!(shard_offset(&[16, 4], &s("[{model, data}, {}]"), &m, 5).unwrap(), vec![6, 0]);
    // Unmentioned axes replicate.
    assert_eq!(local_shape(&[8, 16], &s("[{}, {}]"), &m).unwrap(), vec![8, 16]);
    assert_eq!(shard_index(&[8, 16], &s("[{data}, {}]"), &m, 3).unwrap(), vec![0, 0]);
}

fn resolve_err(sharding: &str, shape: &[usize]) -> CompilerError {
    let m = Mesh::parse("data=2,model=4").unwrap();
    let site = Site::new("f", "parameter %w", None);
    MeshSharding::resolve(&s(sharding), &TensorType::new(DType::F32, shape.to_vec()), &m, &site).unwrap_err()
}

#[test]
fn validation_errors_name_value_dimension_axes_and_sizes() {
    let e = resolve_err("[{modle}, {}]", &[8, 8]);
    assert!(matches!(&e, CompilerError::UnknownAxis { suggestion: Some(x), .. } if x == "model"), "{e}");
    assert!(e.to_string().contains("parameter %w") && e.to_string().contains("did you mean `model`?"), "{e}");

    let e = resolve_err("[{}, {model}]", &[8, 6]);
    let text = e.to_string();
    assert!(matches!(e, CompilerError::NotDivisible { dim: 1, extent: 6, product: 4, .. }), "{text}");
    assert!(text.contains("dimension 1 (extent 6) over axes [model] of sizes [4]"), "{text}");

    let e = resolve_err("[{data, model}, {}]", &[4, 8]);
    assert!(e.to_string().contains("axes [data, model] of sizes [2, 4] (product 8)"), "{e}");

    let e = resolve_err("[{data}, {data}]", &[8, 8]);
    assert!(matches!(&e, CompilerError::DuplicateAxis { axis, .. } if axis == "data"), "{e}");
    let e = resolve_err("[{data}, {}] unreduced {data}", &[8, 8]);
    assert!(matches!(e, CompilerError::DuplicateAxis { .. }));

    let e = resolve_err("[{data}]", &[8, 8]);
    assert!(matches!(e, CompilerError::RankMismatch { sharding_rank: 1, rank: 2, .. }), "{e}");
}

#[test]
fn device_grid_rendering() {
    let m = Mesh::parse("data=2,model=2").unwrap();
    let ty = TensorType::new(DType::F32, vec![8, 4]);
    let site = Site::new("f", "x", None);
    let sh = MeshSharding::resolve(&s("[{data}, {}]"), &ty, &m, &site).unwrap();
    let grid = render_grid(&ty, &sh, &m).unwrap();
    let want = "f32[8,4] [{data}, {}]\n\
                +--------------------+\n\
                | dev 0,1 [0:4, 0:4] |\n\
                +--------------------+\n\
                | dev 2,3 [4:8, 0:4] |\n\
                +--------------------+\n";
    assert_eq!(grid, want, "\n{grid}");
    let sh = MeshSharding::resolve(&s("[{model}, {data}]"), &ty, &m, &site).unwrap();
    let grid = render_grid(&ty, &sh, &m).unwrap();
    assert!(grid.contains("| dev 0 [0:4, 0:2] | dev 2 [0:4, 2:4] |"), "\n{grid}");
    assert!(grid.contains("| dev 1 [4:8, 0:2] | dev 3 [4:8, 2:4] |"), "\n{grid}");
    let v = TensorType::new(DType::F32, vec![4]);
    let sh = MeshSharding::resolve(&s("[{}] unreduced {model}"), &v, &m, &site).unwrap();
    assert!(render_grid(&v, &sh, &m).unwrap().contains("hold partial sums"));
    let cube = TensorType::new(DType::F32, vec![2, 2, 2]);
    assert!(render_grid(&cube, &MeshSharding::replicated(3), &m).is_err());
}

#[test]
fn plain_helpers_report_the_tensor() {
    let m = Mesh::parse("data=2").unwrap();
    let e = local_shape(&[3], &s("[{data}]"), &m).unwrap_err().to_string();
    assert!(e.starts_with("tensor f32[3]: sharding [{data}] splits dimension 0 (extent 3)"), "{e}");
}

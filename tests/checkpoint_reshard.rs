//! Restoring onto other shardings and meshes (the Orbax-style matrix), and
//! topology mismatches.

mod checkpoint_support;

use checkpoint_support::*;
use weft::checkpoint::*;
use weft::ir::tensor::HostTensor;
use weft::ir::TensorSharding;

/// The shardings of the matrix, as per-dimension axis lists of a 2-D tensor:
/// P(), P(('x','y')), P(('y','x')), P('x'), P('y'), and two that split the
/// second dimension too.
const SPECS: [[&[&str]; 2]; 7] =
    [[&[], &[]], [&["x", "y"], &[]], [&["y", "x"], &[]], [&["x"], &[]], [&["y"], &[]], [&[], &["x"]], [&["x"], &["y"]]];

fn mesh_2x2() -> MeshSpec {
    MeshSpec::new(&[("x", 2), ("y", 2)])
}

fn target(mesh: &MeshSpec, spec: Option<&[&[&str]; 2]>) -> RestoreTarget {
    let mut t = RestoreTarget::new(mesh.clone());
    t.insert("w", f32_ty(&[8, 4]), spec.map(|s| TensorSharding::new(s)));
    t
}

#[test]
fn every_saved_sharding_restores_under_every_target_sharding() {
    let dir = tempfile::tempdir().unwrap();
    let mesh = mesh_2x2();
    let global = iota_2d(8, 4);
    let mut m = CheckpointManager::open(dir.path(), CheckpointOptions::default()).unwrap();
    for (i, saved) in SPECS.iter().enumerate() {
        let step = i as u64;
        let mut state = CheckpointState::new(mesh.clone());
        state.insert_sharded("w", shard_2d(&global, &mesh, saved));
        m.save(step, &state).unwrap();
        for wanted in &SPECS {
            let back = m.restore(Some(step), &target(&mesh, Some(wanted))).unwrap().state;
            let leaf = &back.leaves["w"];
            let ctx = format!("saved {saved:?}, restored {wanted:?}");
            assert!(leaf.to_global(&mesh).unwrap().bitwise_eq(&global), "{ctx}: global differs");
            for dev in 0..4 {
                let got = leaf.device_shard(&mesh, dev).unwrap();
                assert!(got.bitwise_eq(&expected_block_2d(&global, &mesh, wanted, dev)), "{ctx}: device {dev}: {got}");
            }
        }
        // Without a target sharding: the same layout, bitwise the same shards.
        let back = m.restore(Some(step), &target(&mesh, None)).unwrap().state;
        for dev in 0..4 {
            let got = back.leaves["w"].device_shard(&mesh, dev).unwrap();
            assert!(
                got.bitwise_eq(state.leaves["w"].device_shard(&mesh, dev).unwrap()),
                "saved {saved:?}, device {dev}"
            );
        }
        // Onto a single device.
        let single = m.restore(Some(step), &target(&MeshSpec::single(), Some(&[&[], &[]]))).unwrap().state;
        let LeafData::Global(t) = &single.leaves["w"] else { panic!("a single device gets the global tensor") };
        assert!(t.bitwise_eq(&global), "saved {saved:?} onto one device");
    }
}

#[test]
fn restores_onto_other_meshes() {
    let dir = tempfile::tempdir().unwrap();
    let mesh = mesh_2x2();
    let global = iota_2d(8, 4);
    let mut state = CheckpointState::new(mesh.clone());
    state.insert_sharded("w", shard_2d(&global, &mesh, &[&["y"], &["x"]]));
    let mut m = CheckpointManager::open(dir.path(), CheckpointOptions::default()).unwrap();
    m.save(1, &state).unwrap();
    let others = [
        (MeshSpec::new(&[("z", 4)]), [&["z"] as &[&str], &[]]),
        (MeshSpec::new(&[("z", 4)]), [&[], &["z"]]),
        (MeshSpec::new(&[("a", 2)]), [&["a"], &[]]),
        (MeshSpec::new(&[("a", 2), ("b", 4)]), [&["b"], &["a"]]),
    ];
    for (other, spec) in &others {
        let back = m.restore(None, &target(other, Some(spec))).unwrap().state;
        for dev in 0..other.num_devices() {
            let got = back.leaves["w"].device_shard(other, dev).unwrap();
            assert!(got.bitwise_eq(&expected_block_2d(&global, other, spec, dev)), "{other} {spec:?} device {dev}");
        }
    }
    // A single-device checkpoint restored onto the 2x2 mesh.
    let mut single = CheckpointState::new(MeshSpec::single());
    single.insert_global("w", global.clone());
    m.save(2, &single).unwrap();
    let back = m.restore(Some(2), &target(&mesh, Some(&[&["x", "y"], &[]]))).unwrap().state;
    let got = back.leaves["w"].device_shard(&mesh, 2).unwrap();
    assert!(got.bitwise_eq(&HostTensor::from_f32(&[2, 4], (16..24).map(|i| i as f32).collect()).unwrap()));
}

#[test]
fn another_mesh_without_a_target_sharding_is_a_topology_mismatch() {
    let dir = tempfile::tempdir().unwrap();
    let mesh = mesh_2x2();
    let mut state = CheckpointState::new(mesh.clone());
    state.insert_sharded("w", shard_2d(&iota_2d(8, 4), &mesh, &[&["x"], &[]]));
    let mut m = CheckpointManager::open(dir.path(), CheckpointOptions::default()).unwrap();
    m.save(1, &state).unwrap();
    let err = m.restore(None, &target(&MeshSpec::single(), None)).unwrap_err();
    assert!(matches!(&err, CheckpointError::TopologyMismatch { step: 1, leaf, .. } if leaf == "w"), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("topology mismatch") && msg.contains("{x=2, y=2} (4 devices)") && msg.contains("(1 devices)"),
        "{msg}"
    );
    // The other way round: saved on one device, restored onto four.
    m.save(2, &CheckpointState::from_tree([("w".to_string(), iota_2d(8, 4))].into())).unwrap();
    let err = m.restore(Some(2), &target(&mesh, None)).unwrap_err();
    assert!(matches!(err, CheckpointError::TopologyMismatch { step: 2, .. }), "{err}");
}

#[test]
fn a_target_sharding_that_does_not_fit_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let mut m = CheckpointManager::open(dir.path(), CheckpointOptions::default()).unwrap();
    m.save(1, &CheckpointState::from_tree([("w".to_string(), iota_2d(8, 4))].into())).unwrap();
    let mesh = MeshSpec::new(&[("x", 3)]);
    let err = m.restore(None, &target(&mesh, Some(&[&["x"], &[]]))).unwrap_err();
    assert!(matches!(&err, CheckpointError::InvalidSharding { leaf, .. } if leaf == "w"), "{err}");
    assert!(err.to_string().contains("not divisible"), "{err}");
}

/// One process of a multi-process run restores only its devices' blocks:
/// it reads only the files holding them (a damaged file of other devices
/// does not matter to it), gets exactly those shards, and still resharding
/// holds.
#[test]
fn a_restore_for_some_devices_reads_only_their_files() {
    let dir = tempfile::tempdir().unwrap();
    let mesh = mesh_2x2();
    let global = iota_2d(8, 4);
    let mut m = CheckpointManager::open(dir.path(), CheckpointOptions::default()).unwrap();
    let saved: [&[&str]; 2] = [&["x", "y"], &[]];
    let mut state = CheckpointState::new(mesh.clone());
    state.insert_sharded("w", shard_2d(&global, &mesh, &saved));
    m.save(0, &state).unwrap();
    // Damage device 3's file: blocks of devices 0 and 1 never touch it.
    let file = dir.path().join("step_00000000").join("shard_00003_0000.safetensors");
    let mut bytes = std::fs::read(&file).unwrap();
    let n = bytes.len();
    bytes[n - 1] ^= 0xff;
    std::fs::write(&file, bytes).unwrap();
    for wanted in [&saved, &[&["x"][..], &[][..]]] {
        let t = target(&mesh, Some(wanted)).only_devices(vec![0, 1]);
        let back = m.restore(Some(0), &t).unwrap().state;
        let LeafData::Sharded(leaf) = &back.leaves["w"] else { panic!("sharded") };
        assert_eq!(leaf.shards.keys().copied().collect::<Vec<_>>(), vec![0, 1]);
        for dev in [0, 1] {
            assert!(leaf.shards[&dev].bitwise_eq(&expected_block_2d(&global, &mesh, wanted, dev)), "{wanted:?} {dev}");
        }
    }
    // Every device's blocks need the damaged file: named corruption.
    let err = m.restore(Some(0), &target(&mesh, Some(&saved))).unwrap_err();
    assert!(err.to_string().contains("shard_00003_0000"), "{err}");
    // So does device 3 alone.
    assert!(m.restore(Some(0), &target(&mesh, Some(&saved)).only_devices(vec![3])).is_err());
}

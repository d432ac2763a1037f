//! Checkpoint round trips, the commit protocol, retention and async saves.

mod checkpoint_support;

use checkpoint_support::*;
use weft::checkpoint::*;
use weft::compiler::train::Tree;
use weft::ir::tensor::{read_safetensors, HostTensor};
use weft::ir::{DType, TensorSharding, TensorType};

fn open(root: &std::path::Path) -> CheckpointManager {
    CheckpointManager::open(root, CheckpointOptions::default()).unwrap()
}

/// A small training-like state: a few leaves of mixed dtypes, varied by `step`.
fn small_tree(step: u64) -> Tree {
    let mut t = Tree::new();
    t.insert("params.w".into(), random_tensor(&f32_ty(&[16, 8]), step));
    t.insert("opt.m.w".into(), random_tensor(&f32_ty(&[16, 8]), step + 1000));
    t.insert("step".into(), HostTensor::scalar(DType::I32, step as f64));
    t
}

#[test]
fn every_dtype_round_trips_bitwise() {
    let dir = tempfile::tempdir().unwrap();
    let mut tree = Tree::new();
    for (i, d) in DType::ALL.into_iter().enumerate() {
        for (j, shape) in [vec![], vec![7], vec![2, 3, 5], vec![0, 3]].into_iter().enumerate() {
            let ty = TensorType::new(d, shape);
            tree.insert(format!("leaf.{d}.{j}"), random_tensor(&ty, (i * 10 + j) as u64 + 1));
        }
    }
    // Special values that must survive bit for bit.
    tree.insert(
        "special".into(),
        HostTensor::from_f32(&[4], vec![-0.0, f32::from_bits(0x7fc0_1234), f32::INFINITY, 1e-45]).unwrap(),
    );
    let mut m = open(dir.path());
    let info = m.save(42, &tree_state(&tree)).unwrap();
    assert_eq!(info.path, dir.path().join("step_00000042"));
    let back = m.restore(None, &RestoreTarget::like_tree(&tree)).unwrap();
    assert_eq!(back.step, 42);
    assert_trees_bitwise_eq(&tree, &back.state.to_tree().unwrap());
    // Other tools read the shard files as plain safetensors, tensor names = leaf names.
    let file = dir.path().join("step_00000042").join("shard_00000_0000.safetensors");
    let plain = read_safetensors(&file).unwrap();
    assert_trees_bitwise_eq(&tree, &plain);
}

#[test]
fn sharded_save_writes_each_distinct_block_once() {
    let dir = tempfile::tempdir().unwrap();
    let mesh = MeshSpec::new(&[("x", 2), ("y", 2)]);
    let global = iota_2d(8, 4);
    let mut state = CheckpointState::new(mesh.clone());
    state.insert_sharded("params.w", shard_2d(&global, &mesh, &[&["x"], &[]]));
    state.insert_global("step", HostTensor::scalar(DType::I32, 3.0));
    let mut m = open(dir.path());
    let info = m.save(3, &state).unwrap();
    let manifest = m.validate(3).unwrap();
    let w = manifest.leaves.iter().find(|l| l.name == "params.w").unwrap();
    // Two distinct blocks (x splits, y replicates), taken from devices 0 and 2.
    assert_eq!(w.shards.len(), 2);
    assert_eq!(w.shards[1].offset, vec![4, 0]);
    assert_eq!(w.shards[1].file, "shard_00002_0000.safetensors");
    assert_eq!(w.sharding, vec![vec!["x".to_string()], vec![]]);
    assert_eq!(manifest.mesh, vec![("x".to_string(), 2), ("y".to_string(), 2)]);
    // 8*4 f32 plus one i32 of data, plus two safetensors headers.
    assert!(info.bytes >= 132 && info.bytes < 132 + 2 * 256, "{} bytes", info.bytes);

    // Only the owners' shards are needed; a missing block is named.
    let mut owners_only = shard_2d(&global, &mesh, &[&["x"], &[]]);
    owners_only.shards.retain(|d, _| *d == 1 || *d == 3);
    state.insert_sharded("params.w", owners_only.clone());
    m.save(4, &state).unwrap();
    let back = m.restore(Some(4), &RestoreTarget::like_state(&state)).unwrap();
    assert!(back.state.leaves["params.w"].to_global(&mesh).unwrap().bitwise_eq(&global));
    owners_only.shards.remove(&3);
    state.insert_sharded("params.w", owners_only);
    let err = m.save(5, &state).unwrap_err().to_string();
    assert!(err.contains("step 5") && err.contains("params.w") && err.contains("block 1"), "{err}");
    assert_eq!(m.list_steps().unwrap(), vec![3, 4]);
}

#[test]
fn temp_dirs_are_never_listed_and_leftovers_are_resolved() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let mut m = open(root);
    m.save(1, &tree_state(&small_tree(1))).unwrap();
    m.save(7, &tree_state(&small_tree(7))).unwrap();
    drop(m);
    // An interrupted save, an interrupted deletion, and a replaced step whose
    // replacement never committed (step 7 was renamed away, not back).
    std::fs::create_dir(root.join(".tmp_step_9_abc")).unwrap();
    std::fs::write(root.join(".tmp_step_9_abc").join("shard_00000_0000.safetensors"), b"partial").unwrap();
    std::fs::rename(root.join("step_00000001"), root.join(".del_step_1_def")).unwrap();
    std::fs::rename(root.join("step_00000007"), root.join(".old_step_7_123")).unwrap();
    std::fs::write(root.join("notes.txt"), b"not a step").unwrap();
    assert_eq!(list_steps(root).unwrap(), Vec::<u64>::new());

    let m = open(root);
    assert_eq!(m.cleaned().len(), 3, "{:?}", m.cleaned());
    assert_eq!(m.list_steps().unwrap(), vec![7]);
    let back = m.restore(None, &RestoreTarget::like_tree(&small_tree(7))).unwrap();
    assert_trees_bitwise_eq(&small_tree(7), &back.state.to_tree().unwrap());
    let names: Vec<String> =
        std::fs::read_dir(root).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    assert!(names.iter().all(|n| !n.starts_with('.')), "{names:?}");
}

#[test]
fn resaving_a_step_replaces_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut m = open(dir.path());
    m.save(5, &tree_state(&small_tree(1))).unwrap();
    m.save(5, &tree_state(&small_tree(2))).unwrap();
    assert_eq!(m.list_steps().unwrap(), vec![5]);
    let back = m.restore(Some(5), &RestoreTarget::like_tree(&small_tree(2))).unwrap();
    assert_trees_bitwise_eq(&small_tree(2), &back.state.to_tree().unwrap());
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
}

#[test]
fn retention_keeps_the_last_n_and_every_kth_step() {
    let dir = tempfile::tempdir().unwrap();
    let options = CheckpointOptions { retention: Retention::last(2, Some(4)), ..CheckpointOptions::default() };
    let mut m = CheckpointManager::open(dir.path(), options).unwrap();
    let mut deleted = Vec::new();
    for step in 1..=10 {
        deleted.extend(m.save(step, &tree_state(&small_tree(step))).unwrap().deleted);
    }
    assert_eq!(m.list_steps().unwrap(), vec![4, 8, 9, 10]);
    assert_eq!(deleted, vec![1, 2, 3, 5, 6, 7]);
    // Async saves apply it too.
    m.save_async(11, &tree_state(&small_tree(11))).unwrap();
    assert_eq!(m.finish().unwrap().unwrap().deleted, vec![9]);
    assert_eq!(list_steps(dir.path()).unwrap(), vec![4, 8, 10, 11]);
}

#[test]
fn async_saves_commit_in_the_background_from_a_copy() {
    let dir = tempfile::tempdir().unwrap();
    let mut m = open(dir.path());
    let mut state = tree_state(&small_tree(1));
    assert_eq!(m.save_async(1, &state).unwrap(), None);
    // The caller's state may change right away: the save works on a copy.
    state.insert_global("params.w", random_tensor(&f32_ty(&[16, 8]), 99));
    let previous = m.save_async(2, &state).unwrap().expect("the first save is collected");
    assert_eq!(previous.step, 1);
    assert_eq!(m.in_flight(), Some(2));
    assert_eq!(m.wait().unwrap().unwrap().step, 2);
    assert_eq!(m.wait().unwrap(), None);
    let one = m.restore(Some(1), &RestoreTarget::like_tree(&small_tree(1))).unwrap();
    assert_trees_bitwise_eq(&small_tree(1), &one.state.to_tree().unwrap());
    let two = m.restore(Some(2), &RestoreTarget::like_state(&state)).unwrap();
    assert_trees_bitwise_eq(&state.to_tree().unwrap(), &two.state.to_tree().unwrap());
}

#[test]
fn an_owned_async_save_writes_what_a_copying_one_does() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let state = tree_state(&small_tree(3));
    let (mut copying, mut owning) = (open(a.path()), open(b.path()));
    copying.save_async(3, &state).unwrap();
    owning.save_async_owned(3, state.clone()).unwrap();
    assert_eq!(owning.in_flight(), Some(3));
    // Invalid input is an error at once (after collecting the save in
    // flight), and no thread starts.
    let mut bad = tree_state(&small_tree(4));
    bad.insert_global("params@w", random_tensor(&f32_ty(&[2]), 1));
    let e = owning.save_async_owned(4, bad).unwrap_err();
    assert!(matches!(e, CheckpointError::InvalidState { step: 4, .. }), "{e}");
    assert_eq!(owning.in_flight(), None);
    copying.finish().unwrap();
    owning.finish().unwrap();
    let manifest = |root: &std::path::Path| std::fs::read(root.join(step_dir_name(3)).join(MANIFEST)).unwrap();
    assert_eq!(manifest(a.path()), manifest(b.path()), "the same files, the same checksums");
    let back = open(b.path()).restore(Some(3), &RestoreTarget::like_tree(&small_tree(3))).unwrap();
    assert_trees_bitwise_eq(&small_tree(3), &back.state.to_tree().unwrap());
    assert_eq!(list_steps(b.path()).unwrap(), vec![3], "the invalid save wrote nothing");
}

/// A manager whose root has been replaced by a plain file, so every write
/// in the background fails.
fn broken_manager() -> (tempfile::TempDir, CheckpointManager) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("ckpt");
    let m = open(&root);
    std::fs::remove_dir(&root).unwrap();
    std::fs::write(&root, b"in the way").unwrap();
    (dir, m)
}

#[test]
fn async_save_errors_surface_at_wait_next_save_finish_and_drop() {
    let state = tree_state(&small_tree(1));
    let check = |e: CheckpointError, step: u64| {
        assert!(matches!(e, CheckpointError::AsyncSave { step: s, .. } if s == step), "{e}");
        assert!(e.to_string().contains("ckpt"), "names the path: {e}");
    };
    let (_d, mut m) = broken_manager();
    m.save_async(1, &state).unwrap();
    check(m.wait().unwrap_err(), 1);
    m.wait().unwrap(); // reported once, then gone

    let (_d, mut m) = broken_manager();
    m.save_async(2, &state).unwrap();
    check(m.save_async(3, &state).unwrap_err(), 2);
    assert_eq!(m.in_flight(), None, "the failed save's successor did not start");
    m.save_async(4, &state).unwrap();
    check(m.save(5, &state).unwrap_err(), 4);

    let (_d, mut m) = broken_manager();
    m.save_async(6, &state).unwrap();
    check(m.finish().unwrap_err(), 6);

    let (_d, mut m) = broken_manager();
    m.save_async(7, &state).unwrap();
    let panic = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(m))).unwrap_err();
    let msg = panic.downcast_ref::<String>().unwrap();
    assert!(msg.contains("step 7"), "{msg}");

    // And through the facade's error type.
    let (_d, mut m) = broken_manager();
    m.save_async(8, &state).unwrap();
    let facade: weft::Error = m.wait().unwrap_err().into();
    assert!(facade.to_string().contains("async save of step 8"), "{facade}");
}

#[test]
fn restore_of_missing_steps_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let mut m = open(dir.path());
    let target = RestoreTarget::like_tree(&small_tree(1));
    assert!(matches!(m.restore(None, &target), Err(CheckpointError::NoCheckpoint { .. })));
    m.save(1, &tree_state(&small_tree(1))).unwrap();
    let err = m.restore(Some(2), &target).unwrap_err();
    assert!(matches!(&err, CheckpointError::StepNotFound { step: 2, committed, .. } if committed == &vec![1]), "{err}");
}

#[test]
fn restore_from_state_leaves_of_a_training_step() {
    use weft::compiler::train::{StateLeaf, StateRole};
    let dir = tempfile::tempdir().unwrap();
    let mesh = MeshSpec::new(&[("data", 2)]);
    let w = iota_2d(4, 6);
    let mut state = CheckpointState::new(mesh.clone());
    state.insert_global("params.w", w.clone());
    let mut m = open(dir.path());
    m.save(10, &state).unwrap();
    let leaves = vec![StateLeaf {
        name: "params.w".into(),
        ty: w.ty(),
        sharding: Some(TensorSharding::new(&[&["data"], &[]])),
        role: StateRole::Param,
    }];
    let back = m.restore(None, &RestoreTarget::from_state_leaves(mesh.clone(), &leaves)).unwrap();
    let LeafData::Sharded(s) = &back.state.leaves["params.w"] else { panic!("expected shards") };
    assert_eq!(s.shards.len(), 2);
    assert!(s.shards[&1].bitwise_eq(&HostTensor::from_f32(&[2, 6], (12..24).map(|i| i as f32).collect()).unwrap()));
}

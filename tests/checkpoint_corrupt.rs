//! Damaged checkpoints and mismatched targets are detected, named, and
//! never loaded; `latest_valid_step` falls back past them.

mod checkpoint_support;

use checkpoint_support::*;
use std::path::{Path, PathBuf};
use weft::checkpoint::*;
use weft::ir::tensor::HostTensor;
use weft::ir::{DType, TensorType};

/// A sha256 in lowercase hex, to forge manifest checksums (checking that
/// the manifest's own consistency checks catch what a checksum cannot).
fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// Saves steps 1..=3 of a state with a sharded leaf (two files per step,
/// one per distinct block) and a replicated one.
fn three_steps() -> (tempfile::TempDir, CheckpointManager, RestoreTarget) {
    let dir = tempfile::tempdir().unwrap();
    let mesh = MeshSpec::new(&[("x", 2)]);
    let mut m = CheckpointManager::open(dir.path(), CheckpointOptions::default()).unwrap();
    let mut state = CheckpointState::new(mesh.clone());
    for step in 1..=3 {
        state.insert_sharded("params.w", shard_2d(&random_tensor(&f32_ty(&[8, 4]), step), &mesh, &[&["x"], &[]]));
        state.insert_global("step", HostTensor::scalar(DType::I32, step as f64));
        m.save(step, &state).unwrap();
    }
    let target = RestoreTarget::like_state(&state);
    (dir, m, target)
}

fn step_dir(root: &Path, step: u64) -> PathBuf {
    root.join(step_dir_name(step))
}

/// Restoring step 3 fails with a `Corrupt` error naming step 3, `file` and
/// the leaf `params.w`, with `what` in the message; the fallback is step 2.
fn assert_corrupt(m: &CheckpointManager, target: &RestoreTarget, file: &str, what: &str) {
    let err = m.restore(Some(3), target).unwrap_err();
    match &err {
        CheckpointError::Corrupt { step: 3, file: f, leaves, message } => {
            assert!(f.ends_with(file), "{err}");
            assert!(leaves.contains(&"params.w".to_string()), "{err}");
            assert!(message.contains(what), "{err}");
        }
        _ => panic!("expected a corrupt-file error, got: {err}"),
    }
    let text = err.to_string();
    assert!(text.contains("step 3") && text.contains(file) && text.contains("params.w"), "{text}");
    assert!(m.restore(None, target).is_err(), "latest is step 3: still refused");
    let latest = m.latest_valid_step().unwrap();
    assert_eq!(latest.step, Some(2));
    assert_eq!(latest.skipped.len(), 1);
    assert_eq!(latest.skipped[0].step, 3);
    assert!(latest.to_string().contains("skipping step 3") && latest.to_string().contains("resuming from step 2"));
    m.restore(latest.step, target).unwrap();
}

const FILE: &str = "shard_00001_0000.safetensors";

#[test]
fn truncated_shard_file() {
    let (dir, m, target) = three_steps();
    let path = step_dir(dir.path(), 3).join(FILE);
    let len = std::fs::metadata(&path).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(len - 5).unwrap();
    assert_corrupt(&m, &target, FILE, "truncated");
}

#[test]
fn bit_flipped_shard_file() {
    let (dir, m, target) = three_steps();
    let path = step_dir(dir.path(), 3).join(FILE);
    let mut bytes = std::fs::read(&path).unwrap();
    let last = bytes.len() - 3; // in the tensor data
    bytes[last] ^= 0x10;
    std::fs::write(&path, &bytes).unwrap();
    assert_corrupt(&m, &target, FILE, "sha256 mismatch");
}

#[test]
fn missing_shard_file() {
    let (dir, m, target) = three_steps();
    std::fs::remove_file(step_dir(dir.path(), 3).join(FILE)).unwrap();
    assert_corrupt(&m, &target, FILE, "missing");
}

#[test]
fn missing_or_malformed_manifest() {
    let (dir, m, target) = three_steps();
    let d3 = step_dir(dir.path(), 3);
    std::fs::remove_file(d3.join(MANIFEST)).unwrap();
    let err = m.restore(Some(3), &target).unwrap_err();
    assert!(matches!(&err, CheckpointError::ManifestMissing { step: 3, path } if path.ends_with(MANIFEST)), "{err}");

    let d2 = step_dir(dir.path(), 2);
    std::fs::remove_file(d2.join(MANIFEST_SHA)).unwrap();
    assert!(matches!(m.validate(2), Err(CheckpointError::ManifestMissing { step: 2, .. })));
    let latest = m.latest_valid_step().unwrap();
    assert_eq!((latest.step, latest.skipped.iter().map(|s| s.step).collect::<Vec<_>>()), (Some(1), vec![3, 2]));

    // A flipped bit in the manifest: its checksum no longer matches.
    let d1 = step_dir(dir.path(), 1);
    let original = std::fs::read(d1.join(MANIFEST)).unwrap();
    let mut json = original.clone();
    let pos = json.iter().position(|&b| b == b'8').unwrap(); // a digit of the shape [8, 4]
    json[pos] = b'9';
    std::fs::write(d1.join(MANIFEST), &json).unwrap();
    let err = m.validate(1).unwrap_err();
    assert!(matches!(&err, CheckpointError::ManifestMalformed { step: 1, .. }), "{err}");
    assert!(err.to_string().contains("sha256"), "{err}");
    assert_eq!(m.latest_valid_step().unwrap().step, None);

    // Even with a matching checksum, a manifest that is not JSON, or whose
    // shards are not the blocks of its sharding, is refused.
    let forge = |json: &[u8]| {
        std::fs::write(d1.join(MANIFEST), json).unwrap();
        std::fs::write(d1.join(MANIFEST_SHA), format!("{}  {MANIFEST}\n", sha256_hex(json))).unwrap();
        m.validate(1).unwrap_err()
    };
    let err = forge(b"{\"format\": ");
    assert!(matches!(err, CheckpointError::ManifestMalformed { step: 1, .. }), "{err}");
    let err = forge(&json);
    assert!(err.to_string().contains("params.w") && err.to_string().contains("malformed"), "{err}");
    // Restoring the original makes step 1 valid again.
    std::fs::write(d1.join(MANIFEST), &original).unwrap();
    std::fs::write(d1.join(MANIFEST_SHA), format!("{}  {MANIFEST}\n", sha256_hex(&original))).unwrap();
    assert_eq!(m.latest_valid_step().unwrap().step, Some(1));
}

#[test]
fn manifest_that_contradicts_its_files() {
    // A consistent-looking manifest (right checksum) that claims another
    // dtype than the file holds: the file's header gives it away.
    let (dir, m, _) = three_steps();
    let d3 = step_dir(dir.path(), 3);
    let json = std::fs::read_to_string(d3.join(MANIFEST)).unwrap().replacen("\"f32\"", "\"i32\"", 1);
    std::fs::write(d3.join(MANIFEST), &json).unwrap();
    std::fs::write(d3.join(MANIFEST_SHA), format!("{}  {MANIFEST}\n", sha256_hex(json.as_bytes()))).unwrap();
    let err = m.validate(3).unwrap_err();
    assert!(matches!(&err, CheckpointError::Corrupt { step: 3, leaves, .. } if leaves == &["params.w"]), "{err}");
    assert!(err.to_string().contains("the manifest says"), "{err}");
}

#[test]
fn target_mismatches_are_named() {
    let (_dir, m, target) = three_steps();
    // Shape.
    let mut t = target.clone();
    t.leaves.get_mut("params.w").unwrap().ty = f32_ty(&[8, 8]);
    let err = m.restore(None, &t).unwrap_err();
    assert!(matches!(&err, CheckpointError::LeafMismatch { step: 3, leaf, .. } if leaf == "params.w"), "{err}");
    assert!(err.to_string().contains("f32[8,4]") && err.to_string().contains("f32[8,8]"), "{err}");
    // Dtype.
    let mut t = target.clone();
    t.leaves.get_mut("step").unwrap().ty = TensorType::scalar(DType::U32);
    let err = m.restore(None, &t).unwrap_err();
    assert!(matches!(&err, CheckpointError::LeafMismatch { leaf, .. } if leaf == "step"), "{err}");
    // Leaf set: one missing from the checkpoint, one not in the target.
    let mut t = target.clone();
    t.leaves.remove("step");
    t.insert("opt.m.w", f32_ty(&[8, 4]), None);
    let err = m.restore(None, &t).unwrap_err();
    match &err {
        CheckpointError::LeafSet { step: 3, missing, unexpected } => {
            assert_eq!(missing, &["opt.m.w"]);
            assert_eq!(unexpected, &["step"]);
        }
        _ => panic!("expected a leaf-set error, got {err}"),
    }
}

//! Reading: listing, validating and restoring committed steps.
//!
//! Nothing is loaded that has not been checked: a shard file is read whole,
//! its size and sha256 compared with the manifest, its safetensors header
//! compared with the manifest's shards, and only then are its bytes copied
//! into the target blocks. Restoring onto a different sharding or mesh
//! copies each saved block into every target block it overlaps
//! ([`copy_region`]), which is "assemble the global tensor, cut the target
//! blocks" without materialising the global tensor.
//!
//! These functions only read; they are safe to call while another process
//! saves into the same root.

use super::error::{io, CheckpointError, Result};
use super::fsutil::{self, step_dir_name};
use super::manifest::{hex, FileEntry, Manifest};
use super::mesh::{BlockLayout, MeshSpec};
use super::par::run_jobs;
use super::region::copy_region;
use super::state::{CheckpointState, LeafData, RestoreTarget, ShardedLeaf};
use safetensors::SafeTensors;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use weft_ir::tensor::BlockBuf;
use weft_ir::TensorType;

/// The committed steps in `root`, ascending.
pub fn list_steps(root: &Path) -> Result<Vec<u64>> {
    fsutil::list_steps(root)
}

/// A restored state and the step it came from.
#[derive(Clone, Debug, PartialEq)]
pub struct Restored {
    /// The step restored.
    pub step: u64,
    /// The state on the target mesh.
    pub state: CheckpointState,
}

/// A step [`latest_valid_step`] skipped, and why.
#[derive(Debug)]
pub struct SkippedStep {
    /// The step.
    pub step: u64,
    /// The first problem found in it.
    pub error: CheckpointError,
}

/// The answer of [`latest_valid_step`].
#[derive(Debug, Default)]
pub struct LatestValid {
    /// The newest step that fully validates, if any.
    pub step: Option<u64>,
    /// The newer steps that did not validate, newest first.
    pub skipped: Vec<SkippedStep>,
}

impl fmt::Display for LatestValid {
    /// One line per skipped step, then the chosen one, e.g.
    /// `skipping step 300: ...` / `resuming from step 200`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for s in &self.skipped {
            let e = s.error.to_string();
            // Most errors already start with "step N: ".
            if e.starts_with(&format!("step {}:", s.step)) {
                writeln!(f, "skipping {e}")?;
            } else {
                writeln!(f, "skipping step {}: {e}", s.step)?;
            }
        }
        match self.step {
            Some(s) => write!(f, "resuming from step {s}"),
            None => write!(f, "no valid checkpoint"),
        }
    }
}

/// The newest committed step whose manifest and every shard file validate,
/// with the newer steps that were skipped and why. Fails only if the root
/// cannot be listed.
pub fn latest_valid_step(root: &Path) -> Result<LatestValid> {
    let mut out = LatestValid::default();
    for step in list_steps(root)?.into_iter().rev() {
        match validate_step(root, step) {
            Ok(_) => {
                out.step = Some(step);
                break;
            }
            Err(error) => out.skipped.push(SkippedStep { step, error }),
        }
    }
    Ok(out)
}

/// Fully validates a committed step (manifest, every file's size, sha256
/// and contents) and returns its manifest.
pub fn validate_step(root: &Path, step: u64) -> Result<Manifest> {
    let dir = root.join(step_dir_name(step));
    let m = Manifest::read(&dir, step)?;
    for f in &m.files {
        let bytes = read_verified(&dir, step, &m, f)?;
        check_tensors(&dir, step, &m, f, &bytes, |_, _, _| ())?;
    }
    Ok(m)
}

/// Restores `step` (the newest committed one if `None`) onto `target`,
/// using up to `threads` threads to read files. The leaf set and every
/// leaf's type must equal the checkpoint's; a leaf with a target sharding is
/// resharded onto the target mesh, one without must be restored onto the
/// mesh it was saved on. Replicated leaves come back as
/// [`LeafData::Global`], others with a shard for every device.
pub fn restore(root: &Path, step: Option<u64>, target: &RestoreTarget, threads: usize) -> Result<Restored> {
    let committed = list_steps(root)?;
    let step = match step {
        None => *committed.last().ok_or_else(|| CheckpointError::NoCheckpoint { root: root.to_path_buf() })?,
        Some(s) if committed.contains(&s) => s,
        Some(s) => return Err(CheckpointError::StepNotFound { root: root.to_path_buf(), step: s, committed }),
    };
    let dir = root.join(step_dir_name(step));
    let m = Manifest::read(&dir, step)?;
    let plans = plan_leaves(step, &m, target)?;
    let index: BTreeMap<&str, usize> = m.leaves.iter().enumerate().map(|(i, l)| (l.name.as_str(), i)).collect();
    // Per leaf, the blocks to restore: every block, or those of the
    // target's devices.
    let wanted: Vec<Vec<bool>> = plans
        .iter()
        .map(|p| {
            let mut w = vec![target.devices.is_none(); p.layout.num_blocks()];
            for &d in target.devices.iter().flatten() {
                if d < target.mesh.num_devices() {
                    w[p.layout.block_of(d)] = true;
                }
            }
            w
        })
        .collect();
    let buffers: Vec<Mutex<Vec<Option<BlockBuf>>>> = plans
        .iter()
        .zip(&wanted)
        .map(|(p, w)| {
            let block_ty = TensorType::new(p.ty.dtype, p.layout.block_shape());
            Mutex::new(w.iter().map(|&want| want.then(|| BlockBuf::new(&block_ty))).collect())
        })
        .collect();
    // Only the files holding part of a wanted block are read.
    let files: Vec<&FileEntry> = m
        .files
        .iter()
        .filter(|f| {
            target.devices.is_none()
                || m.leaves.iter().enumerate().any(|(i, leaf)| {
                    leaf.shards.iter().filter(|s| s.file == f.name).any(|s| {
                        let p = &plans[i];
                        (0..p.layout.num_blocks()).any(|b| {
                            wanted[i][b]
                                && overlaps(&s.offset, &s.shape, &p.layout.block_offset(b), &p.layout.block_shape())
                        })
                    })
                })
        })
        .collect();
    run_jobs(files.len(), threads, |i| {
        let f = files[i];
        let bytes = read_verified(&dir, step, &m, f)?;
        check_tensors(&dir, step, &m, f, &bytes, |leaf, shard, data| {
            let p = &plans[index[leaf]];
            let (bs, elem) = (p.layout.block_shape(), p.ty.dtype.size_bytes());
            let mut out = buffers[index[leaf]].lock().unwrap();
            for (b, buf) in out.iter_mut().enumerate() {
                if let Some(buf) = buf {
                    copy_region(
                        data,
                        &shard.shape,
                        &shard.offset,
                        buf.bytes_mut(),
                        &bs,
                        &p.layout.block_offset(b),
                        elem,
                    );
                }
            }
        })
    })?;
    let mut state = CheckpointState::new(target.mesh.clone());
    for ((p, bufs), entry) in plans.into_iter().zip(buffers).zip(&m.leaves) {
        let tensors = bufs
            .into_inner()
            .unwrap()
            .into_iter()
            .map(|b| b.map(BlockBuf::finish).transpose())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| CheckpointError::Corrupt {
                step,
                file: dir.join(&entry.shards[0].file),
                leaves: vec![entry.name.clone()],
                message: e.to_string(),
            })?;
        let leaf = if p.layout.is_replicated() {
            LeafData::Global(tensors.into_iter().next().flatten().expect("the one block is wanted"))
        } else {
            let devices: Vec<usize> = match &target.devices {
                Some(d) => d.iter().copied().filter(|&d| d < target.mesh.num_devices()).collect(),
                None => (0..target.mesh.num_devices()).collect(),
            };
            let shards = devices
                .into_iter()
                .map(|d| (d, tensors[p.layout.block_of(d)].clone().expect("a wanted block")))
                .collect();
            LeafData::Sharded(ShardedLeaf { ty: p.ty, sharding: p.sharding, shards })
        };
        state.leaves.insert(entry.name.clone(), leaf);
    }
    Ok(Restored { step, state })
}

/// Whether the boxes `[a, a + ashape)` and `[b, b + bshape)` intersect.
fn overlaps(a: &[usize], ashape: &[usize], b: &[usize], bshape: &[usize]) -> bool {
    a.iter().zip(ashape).zip(b.iter().zip(bshape)).all(|((&a0, &an), (&b0, &bn))| a0 < b0 + bn && b0 < a0 + an)
}

/// How one saved leaf is laid out on the target.
struct LeafPlan {
    ty: TensorType,
    sharding: weft_ir::TensorSharding,
    layout: BlockLayout,
}

/// Checks the target against the manifest and lays out every leaf (in the
/// manifest's order) on the target mesh.
fn plan_leaves(step: u64, m: &Manifest, target: &RestoreTarget) -> Result<Vec<LeafPlan>> {
    let missing: Vec<String> =
        target.leaves.keys().filter(|k| !m.leaves.iter().any(|l| &l.name == *k)).cloned().collect();
    let unexpected: Vec<String> =
        m.leaves.iter().filter(|l| !target.leaves.contains_key(&l.name)).map(|l| l.name.clone()).collect();
    if !missing.is_empty() || !unexpected.is_empty() {
        return Err(CheckpointError::LeafSet { step, missing, unexpected });
    }
    let saved_mesh: MeshSpec = m.mesh_spec();
    m.leaves
        .iter()
        .map(|l| {
            let t = &target.leaves[&l.name];
            let ty = l.ty();
            if t.ty != ty {
                let message = format!("saved as {ty}, the target expects {}", t.ty);
                return Err(CheckpointError::LeafMismatch { step, leaf: l.name.clone(), message });
            }
            let sharding = match &t.sharding {
                Some(s) => s.clone(),
                None if target.mesh == saved_mesh => l.tensor_sharding(),
                None => {
                    return Err(CheckpointError::TopologyMismatch {
                        step,
                        leaf: l.name.clone(),
                        saved: format!("{saved_mesh} ({} devices)", saved_mesh.num_devices()),
                        target: format!("{} ({} devices)", target.mesh, target.mesh.num_devices()),
                    })
                }
            };
            let layout = BlockLayout::new(&target.mesh, &sharding, &ty.shape).map_err(|message| {
                CheckpointError::InvalidSharding {
                    leaf: l.name.clone(),
                    sharding: sharding.to_string(),
                    mesh: target.mesh.to_string(),
                    message,
                }
            })?;
            Ok(LeafPlan { ty, sharding, layout })
        })
        .collect()
}

fn corrupt(dir: &Path, step: u64, m: &Manifest, file: &str, message: String) -> CheckpointError {
    CheckpointError::Corrupt { step, file: dir.join(file), leaves: m.leaves_in(file), message }
}

/// Reads a shard file whole and checks its size and sha256.
fn read_verified(dir: &Path, step: u64, m: &Manifest, f: &FileEntry) -> Result<Vec<u8>> {
    let path: PathBuf = dir.join(&f.name);
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(corrupt(dir, step, m, &f.name, "file is missing".into()))
        }
        Err(e) => return Err(io("read", path)(e)),
    };
    if bytes.len() as u64 != f.bytes {
        let what = if (bytes.len() as u64) < f.bytes { "truncated" } else { "too long" };
        return Err(corrupt(
            dir,
            step,
            m,
            &f.name,
            format!("{what}: {} bytes, the manifest says {}", bytes.len(), f.bytes),
        ));
    }
    let got = hex(&Sha256::digest(&bytes));
    if got != f.sha256 {
        return Err(corrupt(
            dir,
            step,
            m,
            &f.name,
            format!("sha256 mismatch: file has {got}, manifest says {}", f.sha256),
        ));
    }
    Ok(bytes)
}

/// Parses a verified file and checks that every shard the manifest puts in
/// it is there with the right dtype and shape, calling `each(leaf, shard,
/// data)` for each.
fn check_tensors(
    dir: &Path,
    step: u64,
    m: &Manifest,
    f: &FileEntry,
    bytes: &[u8],
    mut each: impl FnMut(&str, &super::manifest::ShardEntry, &[u8]),
) -> Result<()> {
    let st = SafeTensors::deserialize(bytes)
        .map_err(|e| corrupt(dir, step, m, &f.name, format!("not a safetensors file: {e}")))?;
    for leaf in &m.leaves {
        for shard in leaf.shards.iter().filter(|s| s.file == f.name) {
            let bad = |msg: String| CheckpointError::Corrupt {
                step,
                file: dir.join(&f.name),
                leaves: vec![leaf.name.clone()],
                message: msg,
            };
            let view = st.tensor(&shard.tensor).map_err(|e| bad(format!("tensor `{}`: {e}", shard.tensor)))?;
            let want = weft_ir::tensor::safetensors_dtype(leaf.dtype());
            if view.dtype() != want || view.shape() != shard.shape.as_slice() {
                return Err(bad(format!(
                    "tensor `{}` is {:?}{:?}, the manifest says {:?}{:?}",
                    shard.tensor,
                    view.dtype(),
                    view.shape(),
                    want,
                    shard.shape
                )));
            }
            each(&leaf.name, shard, view.data());
        }
    }
    Ok(())
}

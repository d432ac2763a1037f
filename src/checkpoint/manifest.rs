//! The manifest: the one file that says what a checkpoint step contains.
//!
//! A reader trusts nothing it cannot check against the manifest, and
//! nothing in the manifest it cannot check against itself: the manifest has
//! a sha256 sidecar (`manifest.sha256`, in `sha256sum` format), every shard
//! file has its size and sha256 listed, and every leaf's shards must be
//! exactly the blocks its sharding gives on the saved mesh. See
//! `specs/checkpoint.md` for the format.

use super::error::{io, CheckpointError, Result};
use super::mesh::{BlockLayout, MeshSpec};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use weft_ir::{DType, DimSharding, TensorSharding, TensorType};

/// The manifest's file name in a step directory.
pub const MANIFEST: &str = "manifest.json";
/// The manifest checksum's file name (`<hex>  manifest.json`).
pub const MANIFEST_SHA: &str = "manifest.sha256";
/// The value of [`Manifest::format`].
pub const FORMAT: &str = "weft-checkpoint";
/// The format version this library writes and reads.
pub const VERSION: u32 = 1;

/// The contents of `manifest.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// Always [`FORMAT`].
    pub format: String,
    /// Always [`VERSION`].
    pub version: u32,
    /// The training step.
    pub step: u64,
    /// The mesh the state was saved on: `[["x", 2], ["y", 2]]`, major to minor.
    pub mesh: Vec<(String, usize)>,
    /// Every leaf, sorted by name.
    pub leaves: Vec<LeafEntry>,
    /// Every shard file, sorted by name.
    pub files: Vec<FileEntry>,
}

/// One state leaf.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LeafEntry {
    /// The leaf name.
    pub name: String,
    /// Its dtype name (`f32`, `bf16`, ...).
    pub dtype: String,
    /// Its global shape.
    pub shape: Vec<usize>,
    /// Per dimension, the mesh axes splitting it, major to minor (`[]`: not split).
    pub sharding: Vec<Vec<String>>,
    /// One entry per distinct block, in block order.
    pub shards: Vec<ShardEntry>,
}

/// Where one block of a leaf is stored.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShardEntry {
    /// The file (relative to the step directory).
    pub file: String,
    /// The tensor name inside the safetensors file.
    pub tensor: String,
    /// The block's offset in the global tensor.
    pub offset: Vec<usize>,
    /// The block's shape.
    pub shape: Vec<usize>,
}

/// One shard file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileEntry {
    /// The file name (relative to the step directory).
    pub name: String,
    /// Its size in bytes.
    pub bytes: u64,
    /// Its sha256, lowercase hex.
    pub sha256: String,
}

impl LeafEntry {
    /// The dtype (checked by [`Manifest::check`]).
    pub fn dtype(&self) -> DType {
        DType::from_name(&self.dtype).expect("checked manifest")
    }

    /// The global type.
    pub fn ty(&self) -> TensorType {
        TensorType::new(self.dtype(), self.shape.clone())
    }

    /// The sharding as the IR's type.
    pub fn tensor_sharding(&self) -> TensorSharding {
        TensorSharding {
            dims: self.sharding.iter().map(|a| DimSharding { axes: a.clone(), open: false }).collect(),
            unreduced: Vec::new(),
        }
    }
}

impl Manifest {
    /// The saved mesh.
    pub fn mesh_spec(&self) -> MeshSpec {
        MeshSpec { axes: self.mesh.clone() }
    }

    /// The leaves with data in `file`.
    pub fn leaves_in(&self, file: &str) -> Vec<String> {
        self.leaves.iter().filter(|l| l.shards.iter().any(|s| s.file == file)).map(|l| l.name.clone()).collect()
    }

    /// Checks the manifest against itself: format and version, the step,
    /// known dtypes, shardings that fit the mesh, shards that are exactly
    /// the blocks of each leaf's sharding, and shard files that are listed.
    pub fn check(&self, step: u64) -> Result<(), String> {
        if self.format != FORMAT || self.version != VERSION {
            return Err(format!(
                "format {} version {} (this library reads {FORMAT} version {VERSION})",
                self.format, self.version
            ));
        }
        if self.step != step {
            return Err(format!("records step {} but is in the directory of step {step}", self.step));
        }
        let mesh = self.mesh_spec();
        mesh.check()?;
        let files: BTreeSet<&str> = self.files.iter().map(|f| f.name.as_str()).collect();
        if files.len() != self.files.len() || files.iter().any(|f| !is_plain_file_name(f)) {
            return Err("file list has duplicate or invalid names".into());
        }
        let mut names = BTreeSet::new();
        let mut tensors = BTreeSet::new();
        for leaf in &self.leaves {
            let ctx = |m: String| format!("leaf `{}`: {m}", leaf.name);
            if !names.insert(leaf.name.as_str()) {
                return Err(ctx("listed twice".into()));
            }
            if DType::from_name(&leaf.dtype).is_none() {
                return Err(ctx(format!("unknown dtype `{}`", leaf.dtype)));
            }
            let layout = BlockLayout::new(&mesh, &leaf.tensor_sharding(), &leaf.shape).map_err(ctx)?;
            if leaf.shards.len() != layout.num_blocks() {
                return Err(ctx(format!(
                    "has {} shards, its sharding gives {} blocks",
                    leaf.shards.len(),
                    layout.num_blocks()
                )));
            }
            for (b, s) in leaf.shards.iter().enumerate() {
                if s.offset != layout.block_offset(b) || s.shape != layout.block_shape() {
                    return Err(ctx(format!("shard {b} is at {:?} with shape {:?}, not a block", s.offset, s.shape)));
                }
                if !files.contains(s.file.as_str()) {
                    return Err(ctx(format!("shard {b} is in unlisted file `{}`", s.file)));
                }
                if !tensors.insert((s.file.as_str(), s.tensor.as_str())) {
                    return Err(ctx(format!("tensor `{}` of `{}` is used twice", s.tensor, s.file)));
                }
            }
        }
        Ok(())
    }

    /// Writes `manifest.json` and its checksum into `dir`, fsyncing both.
    pub fn write(&self, dir: &Path) -> Result<()> {
        let json = serde_json::to_vec_pretty(self).expect("manifest serializes");
        let sum = format!("{}  {MANIFEST}\n", hex(&Sha256::digest(&json)));
        super::fsutil::write_synced(&dir.join(MANIFEST), &json)?;
        super::fsutil::write_synced(&dir.join(MANIFEST_SHA), sum.as_bytes())
    }

    /// Reads and checks the manifest of `step` in its directory `dir`.
    pub fn read(dir: &Path, step: u64) -> Result<Manifest> {
        let path = dir.join(MANIFEST);
        let sum_path = dir.join(MANIFEST_SHA);
        let read = |p: &Path| match std::fs::read(p) {
            Ok(b) => Ok(b),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                Err(CheckpointError::ManifestMissing { step, path: p.to_path_buf() })
            }
            Err(e) => Err(io("read", p)(e)),
        };
        let json = read(&path)?;
        let sum = read(&sum_path)?;
        let bad = |message: String| CheckpointError::ManifestMalformed { step, path: path.clone(), message };
        let want = String::from_utf8_lossy(&sum);
        let want = want.split_whitespace().next().unwrap_or("");
        let got = hex(&Sha256::digest(&json));
        if want != got {
            return Err(bad(format!("sha256 is {got}, {MANIFEST_SHA} says {want:?}")));
        }
        let m: Manifest = serde_json::from_slice(&json).map_err(|e| bad(e.to_string()))?;
        m.check(step).map_err(bad)?;
        Ok(m)
    }

    /// The files, by name.
    pub fn file_map(&self) -> BTreeMap<&str, &FileEntry> {
        self.files.iter().map(|f| (f.name.as_str(), f)).collect()
    }
}

/// A file name without directories or anything hidden: what a manifest may
/// refer to.
fn is_plain_file_name(s: &str) -> bool {
    !s.is_empty() && !s.starts_with('.') && !s.contains(['/', '\\'])
}

/// Lowercase hex.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

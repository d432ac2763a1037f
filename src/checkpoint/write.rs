//! Saving: choosing what to write, then writing it atomically.
//!
//! A save is split in two so that an async save blocks the training loop
//! only for the first half. [`prepare`] validates the state and picks, for
//! every distinct block of every leaf, one device's copy (replicas are
//! written once) and the file it goes to; the result can own copies of
//! exactly those tensors ([`Snapshot::into_owned`], the device-to-host copy
//! of a real run). [`write`] then encodes the files as safetensors, hashes,
//! writes and fsyncs them (in parallel) in a temporary directory, writes the manifest and
//! commits the directory with one rename ([`super::fsutil::commit`]).

use super::error::io;
use super::error::{CheckpointError, Result};
use super::fsutil;
use super::manifest::{hex, FileEntry, LeafEntry, Manifest, ShardEntry, FORMAT, VERSION};
use super::mesh::BlockLayout;
use super::par::run_jobs;
use super::state::{CheckpointState, LeafData};
use safetensors::tensor::{Metadata, TensorInfo};
use sha2::{Digest, Sha256};
use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use weft_ir::tensor::tensor_bytes;
use weft_ir::tensor::{safetensors_dtype, HostTensor};
use weft_ir::TensorType;

/// One safetensors file to write: tensor name to data.
pub(crate) struct FilePlan<'a> {
    pub(crate) name: String,
    tensors: Vec<(String, Cow<'a, HostTensor>)>,
}

/// Everything a save writes, validated; the manifest lacks only the files'
/// sizes and checksums.
pub(crate) struct Snapshot<'a> {
    pub(crate) step: u64,
    pub(crate) manifest: Manifest,
    pub(crate) files: Vec<FilePlan<'a>>,
}

/// What a committed save wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommitInfo {
    /// The step.
    pub step: u64,
    /// The committed step directory.
    pub path: PathBuf,
    /// Bytes of shard data files written.
    pub bytes: u64,
    /// Number of shard files.
    pub files: usize,
    /// Steps deleted afterwards by the retention policy.
    pub deleted: Vec<u64>,
}

impl Snapshot<'_> {
    /// The same snapshot owning copies of its tensors.
    pub(crate) fn into_owned(self) -> Snapshot<'static> {
        let files = self
            .files
            .into_iter()
            .map(|f| FilePlan {
                name: f.name,
                tensors: f.tensors.into_iter().map(|(n, t)| (n, Cow::Owned(t.into_owned()))).collect(),
            })
            .collect();
        Snapshot { step: self.step, manifest: self.manifest, files }
    }
}

/// Validates `state` and plans the files of a save of `step`: each distinct
/// block once, grouped by the device it is taken from, and files cut at
/// about `max_file_bytes`.
pub(crate) fn prepare(step: u64, state: &CheckpointState, max_file_bytes: u64) -> Result<Snapshot<'_>> {
    prepare_part(step, state, max_file_bytes, false)
}

/// [`prepare`] for one process of a multi-process save: `state` holds the
/// blocks of this process's devices only. Every block is planned (the
/// manifest is the same in every process) and taken from its lowest
/// device; this process's files get the blocks whose lowest device it
/// holds. With `partial` false, a missing block is an error.
pub(crate) fn prepare_part(
    step: u64,
    state: &CheckpointState,
    max_file_bytes: u64,
    partial: bool,
) -> Result<Snapshot<'_>> {
    let mesh = &state.mesh;
    let invalid = |leaf: &str, message: String| CheckpointError::InvalidState { step, leaf: leaf.into(), message };
    mesh.check().map_err(|m| invalid("", m))?;
    // Per device: its current file index and size, and the files.
    let mut cursor: BTreeMap<usize, (usize, u64)> = BTreeMap::new();
    let mut files: BTreeMap<String, FilePlan<'_>> = BTreeMap::new();
    let mut leaves = Vec::with_capacity(state.leaves.len());
    for (name, leaf) in &state.leaves {
        if name.is_empty() || name.contains('@') || name == "__metadata__" {
            return Err(invalid(name, "leaf names must be non-empty, without `@`, and not `__metadata__`".into()));
        }
        let (ty, sharding) = (leaf.ty(), leaf.sharding());
        let layout =
            BlockLayout::new(mesh, &sharding, &ty.shape).map_err(|message| CheckpointError::InvalidSharding {
                leaf: name.clone(),
                sharding: sharding.to_string(),
                mesh: mesh.to_string(),
                message,
            })?;
        let blocks = pick_blocks(leaf, &layout, mesh.num_devices(), partial).map_err(|m| invalid(name, m))?;
        let block_ty = TensorType::new(ty.dtype, layout.block_shape());
        let mut shards = Vec::with_capacity(blocks.len());
        for (b, (dev, t)) in blocks.into_iter().enumerate() {
            if t.is_some_and(|t| !t.has_type(&block_ty)) {
                let t = t.expect("checked");
                return Err(invalid(name, format!("shard of device {dev} is {}, its block is {block_ty}", t.ty())));
            }
            let size = block_ty.size_bytes() as u64;
            let (idx, used) = cursor.entry(dev).or_insert((0, 0));
            if *used > 0 && *used + size > max_file_bytes {
                *idx += 1;
                *used = 0;
            }
            *used += size;
            let file = format!("shard_{dev:05}_{idx:04}.safetensors");
            let tensor = if layout.is_replicated() { name.clone() } else { format!("{name}@shard{b}") };
            if let Some(t) = t {
                files
                    .entry(file.clone())
                    .or_insert_with(|| FilePlan { name: file.clone(), tensors: Vec::new() })
                    .tensors
                    .push((tensor.clone(), Cow::Borrowed(t)));
            }
            shards.push(ShardEntry { file, tensor, offset: layout.block_offset(b), shape: layout.block_shape() });
        }
        leaves.push(LeafEntry {
            name: name.clone(),
            dtype: ty.dtype.name().to_string(),
            shape: ty.shape.clone(),
            sharding: sharding.dims.iter().map(|d| d.axes.clone()).collect(),
            shards,
        });
    }
    let manifest =
        Manifest { format: FORMAT.into(), version: VERSION, step, mesh: mesh.axes.clone(), leaves, files: Vec::new() };
    Ok(Snapshot { step, manifest, files: files.into_values().collect() })
}

/// For every block of the leaf, the device it is taken from and its data:
/// the lowest given device holding the block. With `partial`, the lowest
/// device of the mesh holding it, and its data only if given.
fn pick_blocks<'a>(
    leaf: &'a LeafData,
    layout: &BlockLayout,
    devices: usize,
    partial: bool,
) -> Result<Vec<(usize, Option<&'a HostTensor>)>, String> {
    let s = match leaf {
        LeafData::Global(t) => return Ok(vec![(0, Some(t))]),
        LeafData::Sharded(s) => s,
    };
    if partial {
        for &dev in s.shards.keys() {
            if dev >= devices {
                return Err(format!("shard for device {dev}, but the mesh has {devices} devices"));
            }
        }
        return Ok(layout.owners().into_iter().map(|dev| (dev, s.shards.get(&dev))).collect());
    }
    let mut chosen: Vec<Option<(usize, &HostTensor)>> = vec![None; layout.num_blocks()];
    for (&dev, t) in &s.shards {
        if dev >= devices {
            return Err(format!("shard for device {dev}, but the mesh has {devices} devices"));
        }
        chosen[layout.block_of(dev)].get_or_insert((dev, t));
    }
    let owners = layout.owners();
    chosen
        .into_iter()
        .enumerate()
        .map(|(b, c)| {
            c.map(|(d, t)| (d, Some(t)))
                .ok_or_else(|| format!("no shard given for block {b} (held by device {} and its replicas)", owners[b]))
        })
        .collect()
}

/// Writes the snapshot into a temporary directory of `root` and commits it,
/// using up to `threads` threads for the shard files.
pub(crate) fn write(root: &Path, snap: &Snapshot<'_>, threads: usize) -> Result<CommitInfo> {
    let tmp = fsutil::create_temp_dir(root, snap.step)?;
    let files = run_jobs(snap.files.len(), threads, |i| write_file(&tmp, &snap.files[i], snap.step));
    let files = match files {
        Ok(files) => files,
        Err(e) => {
            // Best effort: the directory is hidden and cleanup removes it anyway.
            let _ = std::fs::remove_dir_all(&tmp);
            return Err(e);
        }
    };
    commit_written(root, snap, &tmp, files)
}

/// Writes the manifest of `snap` listing `files` (already written and
/// fsynced in `tmp`, by this process or, in a multi-process save, by all)
/// and commits `tmp` as the step.
pub(crate) fn commit_written(
    root: &Path,
    snap: &Snapshot<'_>,
    tmp: &Path,
    mut files: Vec<FileEntry>,
) -> Result<CommitInfo> {
    files.sort_by(|a, b| a.name.cmp(&b.name));
    let bytes = files.iter().map(|f| f.bytes).sum();
    let count = files.len();
    let manifest = Manifest { files, ..snap.manifest.clone() };
    manifest.write(tmp)?;
    let path = fsutil::commit(root, tmp, snap.step)?;
    Ok(CommitInfo { step: snap.step, path, bytes, files: count, deleted: Vec::new() })
}

/// Writes one shard file as safetensors, hashing as it goes, and fsyncs
/// it. The header is the `safetensors` crate's own [`Metadata`]; the data
/// is streamed from the tensors' memory ([`tensor_bytes`]) instead of being
/// assembled into one more buffer first. As the crate does, tensors are
/// ordered by decreasing element size, so every tensor's data is aligned.
pub(crate) fn write_file(dir: &Path, plan: &FilePlan<'_>, step: u64) -> Result<FileEntry> {
    let path = dir.join(&plan.name);
    let mut order: Vec<&(String, Cow<'_, HostTensor>)> = plan.tensors.iter().collect();
    order.sort_by(|(a, x), (b, y)| y.dtype().size_bytes().cmp(&x.dtype().size_bytes()).then(a.cmp(b)));
    let mut infos = Vec::with_capacity(order.len());
    let mut offset = 0;
    for (name, t) in &order {
        let len = t.len() * t.dtype().size_bytes();
        let info = TensorInfo {
            dtype: safetensors_dtype(t.dtype()),
            shape: t.shape().to_vec(),
            data_offsets: (offset, offset + len),
        };
        infos.push((name.clone(), info));
        offset += len;
    }
    let meta: HashMap<String, String> =
        [("format".to_string(), FORMAT.to_string()), ("step".to_string(), step.to_string())].into();
    let header = Metadata::new(Some(meta), infos).map_err(|e| CheckpointError::InvalidState {
        step,
        leaf: order.first().map(|(n, _)| n.clone()).unwrap_or_default(),
        message: format!("cannot encode {}: {e}", plan.name),
    })?;
    // The crate keeps `__metadata__` in a HashMap, whose order changes from
    // process to process; written in a fixed order instead, identical
    // states give identical files (and checksums) in every run.
    let mut value = serde_json::to_value(&header).expect("safetensors metadata serializes");
    let mut fixed = serde_json::Map::new();
    fixed.insert("format".into(), FORMAT.into());
    fixed.insert("step".into(), step.to_string().into());
    value["__metadata__"] = serde_json::Value::Object(fixed);
    let mut header = serde_json::to_vec(&value).expect("a JSON value serializes");
    header.resize(header.len().next_multiple_of(8), b' ');

    let mut file = File::options().write(true).create_new(true).open(&path).map_err(io("create", &path))?;
    let mut sha = Sha256::new();
    let mut bytes = 0u64;
    let mut put = |data: &[u8]| -> Result<()> {
        sha.update(data);
        bytes += data.len() as u64;
        file.write_all(data).map_err(io("write", &path))
    };
    put(&(header.len() as u64).to_le_bytes())?;
    put(&header)?;
    for (_, t) in &order {
        // In pieces of 1 MiB: a background writer's system calls stay
        // short, and each piece is hashed while it is in the cache.
        for piece in tensor_bytes(t).chunks(1 << 20) {
            put(piece)?;
        }
    }
    file.sync_all().map_err(io("fsync", &path))?;
    Ok(FileEntry { name: plan.name.clone(), bytes, sha256: hex(&sha.finalize()) })
}

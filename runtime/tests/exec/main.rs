//! The executor on hand-built device programs: every collective on meshes
//! (2,), (2,2), (4,2) and (8,) over every axis subset, checked against
//! values computed here from the contract of `weft_ir::device`, on the CPU
//! backend and on as many logical wgpu devices (all on one adapter under
//! lavapipe); shard slices, compute steps and frees; the verifier's
//! errors; the same collectives with the mesh split over several
//! (simulated) processes; and the device-native collective path (NCCL's
//! hook) with a stand-in implementation.

// Tests pass fresh clones of shared inputs for readability.
#![allow(clippy::cloned_ref_to_slice_refs)]

#[path = "../common/mod.rs"]
mod common;

mod collectives;
mod executable;
mod fusion;
mod native;
mod overlap;
mod processes;
mod programs;
mod shared_gpu;
mod verify_errors;

//! Every CubeCL kernel checked against the CPU reference backend on random
//! data: several shapes (scalars, odd sizes, sizes that are not multiples
//! of any tile or block, one that needs more than 65535 cubes), every
//! dtype an op accepts, and special values. Needs a Vulkan device (lavapipe
//! without a GPU); see `common::wgpu_or_skip`.

// Tests pass fresh clones of shared inputs for readability.
#![allow(clippy::cloned_ref_to_slice_refs)]

#[path = "../common/mod.rs"]
mod common;

mod elementwise;
mod fast_cpu;
mod index;
mod layout;
mod reduce_dot;

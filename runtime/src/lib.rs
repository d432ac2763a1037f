//! # weft-runtime
//!
//! Backends that execute per-device programs: the CPU reference backend and
//! CubeCL. (Being built; see the issues.)
#![warn(missing_docs)]

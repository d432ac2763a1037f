//! # weft-compiler
//!
//! Transformations over weft's IR: automatic differentiation and training
//! steps, sharding propagation on an e-graph, auto-sharding and the SPMD
//! partitioner. (Being built; see the issues.)
#![warn(missing_docs)]

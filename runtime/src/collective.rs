//! Host-side collectives for the runtime: the semantics live in
//! [`weft_ir::device::collective`] (one definition, shared with the
//! reference simulator); this module names their failures as runtime
//! errors.
//!
//! The executor stages collectives through the host: the communicator
//! takes the group's contributions, calls [`combine`] (or [`permute`]) and
//! hands back each member's result.

use crate::error::RuntimeError;
use weft_ir::device::collective as semantics;
use weft_ir::device::Collective;
use weft_ir::tensor::HostTensor;

pub use semantics::{block, combiner, permute, split_dim};

/// What one member of a reduce-scatter or all-to-all receives, from the
/// pieces of the members' contributions it needs
/// ([`semantics::combine_pieces`]).
pub fn combine_pieces(op: &Collective, pieces: Vec<HostTensor>) -> Result<HostTensor, RuntimeError> {
    semantics::combine_pieces(op, pieces).map_err(|message| RuntimeError::Op { op: op.name().to_string(), message })
}

/// What member `rank` of one group receives, given the members'
/// contributions in rank order ([`semantics::member_result`]).
pub fn member_result(op: &Collective, blocks: &[HostTensor], rank: usize) -> Result<HostTensor, RuntimeError> {
    semantics::member_result(op, blocks, rank)
        .map_err(|message| RuntimeError::Op { op: op.name().to_string(), message })
}

/// What each member of one group receives, given the members'
/// contributions in rank order ([`semantics::combine`]).
pub fn combine(op: &Collective, blocks: Vec<HostTensor>) -> Result<Vec<HostTensor>, RuntimeError> {
    semantics::combine(op, blocks).map_err(|message| RuntimeError::Op { op: op.name().to_string(), message })
}

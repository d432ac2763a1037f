//! The [`Backend`] abstraction: what the executor needs from a device.
//!
//! A backend owns one logical device's memory and runs the IR's compute ops
//! on it. The interface is deliberately small (allocate, upload, download,
//! compute one op, free) so that a new kind of device needs only kernels,
//! and so that the executor - which knows about meshes, collectives and
//! liveness - is written once for all of them. Collectives are not part of
//! the trait: the executor's workers meet at a
//! [`crate::comm::Communicator`], which stages them through the host with
//! the CPU backend's arithmetic, so every backend agrees on their results
//! bit for bit. The one exception is opt-in: a device given a device-native
//! path ([`Backend::collective_on_device`]: NCCL on CUDA, see
//! [`crate::gpu::device_collectives`]) runs the collectives that path
//! takes on device memory, with that library's arithmetic.
//!
//! The run-time choice among the compiled-in backends is
//! [`crate::any::AnyBackend`] (kept apart so that this module depends on
//! no backend); the executor is generic, so tests and benchmarks can also
//! use one backend type directly.

use crate::comm::CollectiveCall;
use crate::error::RuntimeError;
use crate::fusion::{Arg, FusedChain, FusionOptions};
use weft_ir::tensor::HostTensor;
use weft_ir::{Op, TensorType};

/// One logical device: its memory and its kernels.
pub trait Backend {
    /// A tensor stored on the device. Dropping it (or [`Backend::free`])
    /// releases the memory.
    type Buffer;

    /// A short description (`cpu`, `wgpu<wgsl> llvmpipe`, ...).
    fn name(&self) -> String;

    /// Allocates a zero-filled buffer of type `ty`.
    fn alloc(&self, ty: &TensorType) -> Result<Self::Buffer, RuntimeError>;

    /// Copies a host tensor to the device.
    fn upload(&self, t: &HostTensor) -> Result<Self::Buffer, RuntimeError>;

    /// Moves a host tensor to the device (the CPU backend keeps it as it is;
    /// others copy it, as [`Backend::upload`]).
    fn upload_owned(&self, t: HostTensor) -> Result<Self::Buffer, RuntimeError> {
        self.upload(&t)
    }

    /// Copies a buffer back to the host (waits for pending work on it).
    fn download(&self, b: &Self::Buffer) -> Result<HostTensor, RuntimeError>;

    /// Moves a buffer to the host, releasing it on the device (the CPU
    /// backends hand over the tensor itself).
    fn download_owned(&self, b: Self::Buffer) -> Result<HostTensor, RuntimeError> {
        let t = self.download(&b);
        self.free(b);
        t
    }

    /// The type of a buffer.
    fn buffer_type(&self, b: &Self::Buffer) -> TensorType;

    /// Runs one compute op (any [`Op`] but `call`; attributes describe local
    /// shapes) with the interpreter's semantics, returning one new buffer
    /// per result. Inputs are left untouched.
    fn compute(&self, op: &Op, inputs: &[&Self::Buffer]) -> Result<Vec<Self::Buffer>, RuntimeError>;

    /// Which chains of steps the executor should hand this backend to
    /// compute at once ([`crate::fusion`]). Default: none.
    fn fusion(&self) -> FusionOptions {
        FusionOptions::NONE
    }

    /// Computes a chain of elementwise ops on its `inputs` (one buffer per
    /// [`FusedChain::inputs`]), returning the last node's value followed
    /// by the values of [`FusedChain::kept`], in order. The default
    /// computes the nodes one by one with [`Backend::compute`].
    fn compute_fused(&self, chain: &FusedChain, inputs: &[&Self::Buffer]) -> Result<Vec<Self::Buffer>, RuntimeError>
    where
        Self: Sized,
    {
        compute_unfused(self, chain, inputs)
    }

    /// [`Backend::compute_fused`] where input `into` is the chain's last use
    /// of a buffer of the result's type, handed over as `donor`
    /// (`inputs[into]` is `None`): the backend may write the result into
    /// its storage. The default computes as usual and frees the donor.
    fn compute_fused_into(
        &self,
        chain: &FusedChain,
        inputs: &[Option<&Self::Buffer>],
        into: usize,
        donor: Self::Buffer,
    ) -> Result<Vec<Self::Buffer>, RuntimeError>
    where
        Self: Sized,
    {
        let _ = into;
        compute_fused_then_free(self, chain, inputs, donor)
    }

    /// Releases a buffer. (Dropping it has the same effect; this makes the
    /// point where memory is given back explicit.)
    fn free(&self, b: Self::Buffer) {
        drop(b);
    }

    /// `reshape` of a buffer this step reads for the last time, handed
    /// over ([`crate::executable`] plans which): a backend whose buffers
    /// carry their own shape reuses the storage. Default: compute, then
    /// free the input.
    fn reshape_owned(&self, op: &Op, input: Self::Buffer) -> Result<Self::Buffer, RuntimeError>
    where
        Self: Sized,
    {
        compute_then_free(self, op, input)
    }

    /// How many worker threads an executable drives `devices` of these
    /// devices with when the caller does not say ([`crate::ExecOptions`]).
    /// Default: one per device, each device being its own processor.
    fn default_lanes(&self, devices: usize) -> usize {
        devices
    }

    /// Runs collective `call` on device memory when this device was given a
    /// device-native path for it (NCCL on CUDA,
    /// [`crate::gpu::device_collectives`]): `Some` with this member's
    /// result, `None` to go through the host-staged communicator. The
    /// answer depends only on the collective and the buffer's type, so all
    /// members of a group take the same path. Default: `None`.
    fn collective_on_device(
        &self,
        call: CollectiveCall<'_>,
        input: &Self::Buffer,
    ) -> Option<Result<Self::Buffer, RuntimeError>> {
        let _ = (call, input);
        None
    }

    /// Whether the thread that calls [`crate::Executable::run`] may drive
    /// one of the executable's lanes itself instead of handing it to a
    /// worker thread and waiting. True for devices in host memory, whose
    /// buffers any thread may touch: the caller would only sleep, so it
    /// does the work of one lane (a one-device executable then runs with
    /// no thread hand-off at all). Default: `false` (a GPU context stays
    /// with the worker thread that made it).
    fn caller_drives_a_lane(&self) -> bool {
        false
    }

    /// Whether [`Backend::collective_on_device`] may answer `Some`. Such a
    /// call blocks until its whole group has met, so an executable then
    /// drives each device from a thread of its own. Default: `false`.
    fn device_collectives(&self) -> bool {
        false
    }

    /// Waits until all work submitted to the device has finished (for
    /// timing; downloads synchronise on their own).
    fn sync(&self) -> Result<(), RuntimeError> {
        Ok(())
    }
}

/// [`Backend::compute_fused`] with the donor read in place of its missing
/// input, then freed: what a backend that cannot write in place does with
/// a donor.
pub fn compute_fused_then_free<B: Backend>(
    be: &B,
    chain: &FusedChain,
    inputs: &[Option<&B::Buffer>],
    donor: B::Buffer,
) -> Result<Vec<B::Buffer>, RuntimeError> {
    let refs: Vec<&B::Buffer> = inputs.iter().map(|b| b.unwrap_or(&donor)).collect();
    let out = be.compute_fused(chain, &refs);
    drop(refs);
    be.free(donor);
    out
}

/// `op` of one input handed over, computed with [`Backend::compute`], then
/// the input freed: what a backend that cannot reuse the input's storage
/// does with it ([`Backend::reshape_owned`]).
pub fn compute_then_free<B: Backend>(be: &B, op: &Op, input: B::Buffer) -> Result<B::Buffer, RuntimeError> {
    let out = be.compute(op, &[&input])?.remove(0);
    be.free(input);
    Ok(out)
}

/// Computes a chain node by node with [`Backend::compute`] (the default
/// of [`Backend::compute_fused`], and the fallback of backends that fuse
/// only some chains).
pub fn compute_unfused<B: Backend>(
    be: &B,
    chain: &FusedChain,
    inputs: &[&B::Buffer],
) -> Result<Vec<B::Buffer>, RuntimeError> {
    let mut values: Vec<Option<B::Buffer>> = Vec::with_capacity(chain.nodes.len());
    for node in &chain.nodes {
        let args: Vec<&B::Buffer> = node
            .args
            .iter()
            .map(|a| match *a {
                Arg::Input(k) => inputs[k],
                Arg::Node(n) => values[n].as_ref().expect("a value read before it is handed out"),
            })
            .collect();
        let out = be.compute(&node.op, &args)?.remove(0);
        values.push(Some(out));
    }
    let mut outs = vec![values.pop().flatten().expect("a chain has nodes")];
    outs.extend(chain.kept.iter().map(|&(n, _)| values[n].take().expect("kept once")));
    Ok(outs)
}

//! Products handed to a vendor's GEMM library (cuBLAS on CUDA, `cublas.rs`).
//!
//! Why: cubek 0.2's tensor-core routines reach about a fifth of cuBLAS's
//! bf16 rate at 4096³ on an H200 and 5–20× less at a GPT layer's shapes
//! (BENCHMARKS.md), and its exact `f32` routine about half. JAX and PyTorch
//! call cuBLAS for these products; so does weft where the library loads.
//! The generic side ([`LibraryGemm`]) is what `dot.rs` needs: a strided,
//! batched product of `[b, m, k]` and `[b, k, n]` operands read in place,
//! into a dense `[b, m, n]` accumulator. A device without the library, or
//! a product it refuses, falls back to cubek's routines.

use super::CubeclBackend;
use crate::error::RuntimeError;
use cubecl::prelude::*;
use cubecl::server::Handle;

/// One operand of a library product: a `[b, rows, cols]` view of a buffer,
/// with element strides where rows or columns are contiguous.
pub struct GemmOperand {
    /// The buffer.
    pub handle: Handle,
    /// Element strides of the batch, row and column dimensions.
    pub strides: [usize; 3],
}

/// The element types of a library product. The output is always the `f32`
/// accumulator (`f64` for `f64` operands).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum GemmElems {
    /// `f32` operands and arithmetic (no TF32).
    F32,
    /// `f64` operands and arithmetic.
    F64,
    /// `f32`-stored operands whose values are bf16 (weft's bf16 storage):
    /// tensor cores after an exact down-conversion, `f32` accumulation.
    Bf16InF32,
    /// The same for f16 values.
    F16InF32,
    /// Operands packed into bf16 storage, `f32` accumulation.
    Bf16,
    /// Operands packed into f16 storage, `f32` accumulation.
    F16,
}

/// A vendor GEMM library attached to a device.
pub trait LibraryGemm<R: Runtime>: Send + Sync {
    /// Computes `out[i] = a[i] · b[i]` for each of `dims[0]` batch entries
    /// (`dims = [b, m, k, n]`), `out` dense. Ordered after every kernel
    /// that wrote `a` and `b`, and before every later one that reads `out`.
    fn gemm(
        &self,
        be: &CubeclBackend<R>,
        a: &GemmOperand,
        b: &GemmOperand,
        out: &Handle,
        dims: [usize; 4],
        elems: GemmElems,
    ) -> Result<(), RuntimeError>;

    /// Whether half-type products pack their operands into the half type
    /// first ([`GemmElems::Bf16`]) rather than read the `f32` storage
    /// ([`GemmElems::Bf16InF32`]).
    fn packs_half(&self) -> bool;

    /// The library's name, for reports ("cuBLAS").
    fn name(&self) -> &'static str;
}

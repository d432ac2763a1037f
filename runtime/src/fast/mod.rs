//! The fast CPU backend (`--backend cpu`): the device program's ops as
//! plain loops and GEMM calls on host memory.
//!
//! What the reference [`crate::CpuBackend`] evaluates through the
//! interpreter, this backend computes directly where it matters:
//! - `dot_general` as strided GEMM calls that read transposed operands in
//!   place ([`dot`]);
//! - chains of elementwise ops as one loop over cache-sized blocks, no
//!   intermediate tensor ([`elementwise`]; the backend asks the executor
//!   for fused chains), and single elementwise ops as slice loops;
//! - reductions over leading or trailing dimensions as vectorised loops
//!   ([`reduce`]);
//! - data movement (transpose, broadcast, slice) through the interpreter's
//!   kernels, which copy views row by row or in tiles
//!   ([`weft_ir::tensor::to_standard_layout`]).
//!
//! `bf16`/`f16` tensors are stored as such and computed in `f32`, rounded
//! where the interpreter rounds ([`halves`]).
//!
//! Everything else falls back to the interpreter's [`eval_op`]. Elementwise
//! results are bit for bit the interpreter's (the same scalar functions);
//! matrix products differ only in the GEMM's summation order, so results
//! agree with the interpreter to rounding (tests: 1e-5 relative) and are
//! identical from run to run and for any number of worker threads.

mod dot;
mod elementwise;
mod halves;
mod pool;
mod reduce;
pub mod simd;

use crate::backend::compute_unfused;
use crate::backend::Backend;
use crate::error::RuntimeError;
use crate::fusion::{FusedChain, FusionOptions};
use ndarray::{ArrayD, IxDyn};
use pool::Pool;
use std::cell::RefCell;
use weft_ir::interp::eval_op;
use weft_ir::tensor::HostTensor;
use weft_ir::{DType, Op, TensorType};

/// The fast CPU backend (one per logical device). Its state is a pool of
/// freed `f32` storage ([`pool`]), so that in the steady state the buffers
/// of one step are the memory freed by the previous one, and how many
/// threads its products may use.
#[derive(Clone, Debug)]
pub struct FastCpuBackend {
    pool: RefCell<Pool>,
    /// Threads a product or a fused chain may split its output over (1:
    /// the caller's alone).
    threads: usize,
    /// The vectors elementwise loops run in (the widest the CPU has).
    isa: simd::Isa,
}

impl Default for FastCpuBackend {
    fn default() -> Self {
        FastCpuBackend { pool: Default::default(), threads: 1, isa: simd::Isa::detect() }
    }
}

impl FastCpuBackend {
    /// A fast CPU backend.
    pub fn new() -> FastCpuBackend {
        FastCpuBackend::default()
    }

    /// The same backend with products and fused chains split over up to
    /// `threads` threads (at least 1): the results are bitwise those of one
    /// thread (`dot.rs`, `elementwise.rs`).
    pub fn with_threads(mut self, threads: usize) -> FastCpuBackend {
        self.threads = threads.max(1);
        self
    }

    /// The same backend with elementwise loops in vectors of `isa` (or the
    /// widest the CPU has, if narrower): the results are bitwise the same
    /// for every `isa` ([`simd`]).
    pub fn with_isa(mut self, isa: simd::Isa) -> FastCpuBackend {
        self.isa = isa;
        self
    }
}

fn interp(op: &Op, inputs: &[&HostTensor]) -> Result<Vec<HostTensor>, RuntimeError> {
    eval_op(op, inputs).map_err(|e| RuntimeError::Op { op: op.name().to_string(), message: e.to_string() })
}

impl Backend for FastCpuBackend {
    type Buffer = HostTensor;

    fn name(&self) -> String {
        "cpu".to_string()
    }

    crate::cpu::host_memory!();

    fn compute(&self, op: &Op, inputs: &[&HostTensor]) -> Result<Vec<HostTensor>, RuntimeError> {
        let fast = match op {
            Op::DotGeneral(dims) if inputs.len() == 2 && valid_dot(dims, inputs) => {
                dot::dot_general(inputs[0], inputs[1], dims, &mut self.pool.borrow_mut(), self.threads)
            }
            Op::Reduce { op, dims } if inputs.len() == 1 => {
                reduce::reduce(*op, inputs[0], dims, &mut self.pool.borrow_mut())
            }
            Op::Unary(_) | Op::Binary(_) | Op::Compare(_) => {
                elementwise::single(op, inputs, &mut self.pool.borrow_mut(), self.isa)
            }
            Op::BroadcastInDim { dims, shape } if inputs.len() == 1 && dims.is_empty() => match inputs[0] {
                HostTensor::F32(a) if a.ndim() == 0 => a.first().map(|&v| splat(v, shape, &mut self.pool.borrow_mut())),
                _ => None,
            },
            Op::Reshape { shape } if inputs.len() == 1 => match inputs[0] {
                HostTensor::F32(a) if a.len() == shape.iter().product::<usize>() => {
                    a.as_slice().map(|xs| reshaped(xs, shape, &mut self.pool.borrow_mut()))
                }
                _ => None,
            },
            Op::Constant(weft_ir::Literal { ty, data: weft_ir::LiteralData::Splat(v) }) if ty.dtype == DType::F32 => {
                Some(splat(*v as f32, &ty.shape, &mut self.pool.borrow_mut()))
            }
            _ => None,
        };
        match fast {
            Some(t) => Ok(vec![t]),
            None => interp(op, inputs),
        }
    }

    fn fusion(&self) -> FusionOptions {
        FusionOptions { broadcasts: true, kept: true, ..FusionOptions::ALL }
    }

    fn free(&self, b: HostTensor) {
        self.pool.borrow_mut().give(b);
    }

    fn reshape_owned(&self, op: &Op, input: HostTensor) -> Result<HostTensor, RuntimeError> {
        match (op, input) {
            (Op::Reshape { shape }, HostTensor::F32(a)) if a.is_standard_layout() => {
                let n = a.len();
                match a.into_shape_with_order(IxDyn(shape)) {
                    Ok(b) => Ok(HostTensor::F32(b)),
                    Err(_) => Err(RuntimeError::Op {
                        op: "reshape".into(),
                        message: format!("{n} elements do not fill {shape:?}"),
                    }),
                }
            }
            (op, input) => crate::backend::compute_then_free(self, op, input),
        }
    }

    fn compute_fused_into(
        &self,
        chain: &FusedChain,
        inputs: &[Option<&HostTensor>],
        into: usize,
        donor: HostTensor,
    ) -> Result<Vec<HostTensor>, RuntimeError> {
        let tried =
            elementwise::fused_into(chain, inputs, into, donor, &mut self.pool.borrow_mut(), self.threads, self.isa);
        match tried {
            Ok(values) => Ok(values),
            Err(donor) => crate::backend::compute_fused_then_free(self, chain, inputs, donor),
        }
    }

    fn compute_fused(&self, chain: &FusedChain, inputs: &[&HostTensor]) -> Result<Vec<HostTensor>, RuntimeError> {
        let fast = elementwise::fused(chain, inputs, &mut self.pool.borrow_mut(), self.threads, self.isa);
        match fast {
            Some(values) => Ok(values),
            None => compute_unfused(self, chain, inputs),
        }
    }
}

/// `v` spread over `shape` (a scalar broadcast or a splat constant: an
/// optimizer update spreads the learning rate over every parameter each
/// step) as one fill of pooled storage, instead of the interpreter's fresh
/// strided copy.
/// A row-major reshape: one copy into pooled storage (the interpreter
/// clones the array, allocating fresh pages every step).
fn reshaped(xs: &[f32], shape: &[usize], pool: &mut Pool) -> HostTensor {
    let mut out = pool.take(xs.len());
    out.copy_from_slice(xs);
    HostTensor::F32(ArrayD::from_shape_vec(IxDyn(shape), out).expect("sized from the shape"))
}

fn splat(v: f32, shape: &[usize], pool: &mut Pool) -> HostTensor {
    let mut out = pool.take(shape.iter().product());
    out.fill(v);
    HostTensor::F32(ArrayD::from_shape_vec(IxDyn(shape), out).expect("sized from the shape"))
}

/// Whether a `dot_general` is well-formed for these operands (otherwise the
/// interpreter reports the error).
fn valid_dot(dims: &weft_ir::DotDims, inputs: &[&HostTensor]) -> bool {
    let tys = [inputs[0].ty(), inputs[1].ty()];
    weft_ir::infer(&Op::DotGeneral(dims.clone()), &[&tys[0], &tys[1]], &weft_ir::NoFunctions).is_ok()
}

//! The CPU reference backend.
//!
//! Buffers are host tensors and every op is evaluated by the reference
//! interpreter's [`eval_op`], so a device program run on this backend
//! computes exactly what the interpreter would: it is the oracle the GPU
//! backends are tested against, and the backend of last resort.

use crate::backend::Backend;
use crate::error::RuntimeError;
use weft_ir::interp::eval_op;
use weft_ir::tensor::HostTensor;
use weft_ir::{Op, TensorType};

/// The [`Backend`] methods of a backend whose devices live in host memory:
/// allocation is a zeroed tensor, uploads and downloads are copies (moves
/// for the owned variants), and the devices share the host's cores.
macro_rules! host_memory {
    () => {
        /// Logical devices in host memory share the host's cores: one
        /// worker per core, each driving a contiguous run of devices. More
        /// threads than cores only adds context switches and leaves a core
        /// idle whenever the last runnable thread of a collective group
        /// finishes alone (MLP TP step on 2 cores: 93 ms with 8 threads,
        /// 86 ms with 2; BENCHMARKS.md).
        fn default_lanes(&self, devices: usize) -> usize {
            devices.min(std::thread::available_parallelism().map_or(1, |n| n.get()))
        }

        /// Host memory is every thread's: the caller drives a lane.
        fn caller_drives_a_lane(&self) -> bool {
            true
        }

        fn alloc(&self, ty: &TensorType) -> Result<HostTensor, RuntimeError> {
            Ok(HostTensor::zeros(ty))
        }

        fn upload(&self, t: &HostTensor) -> Result<HostTensor, RuntimeError> {
            Ok(t.clone())
        }

        fn upload_owned(&self, t: HostTensor) -> Result<HostTensor, RuntimeError> {
            Ok(t)
        }

        fn download(&self, b: &HostTensor) -> Result<HostTensor, RuntimeError> {
            Ok(b.clone())
        }

        fn download_owned(&self, b: HostTensor) -> Result<HostTensor, RuntimeError> {
            Ok(b)
        }

        fn buffer_type(&self, b: &HostTensor) -> TensorType {
            b.ty()
        }
    };
}
pub(crate) use host_memory;

/// The CPU reference backend (one per logical device; it holds no state).
#[derive(Clone, Debug, Default)]
pub struct CpuBackend;

impl CpuBackend {
    /// A CPU backend.
    pub fn new() -> CpuBackend {
        CpuBackend
    }
}

impl Backend for CpuBackend {
    type Buffer = HostTensor;

    fn name(&self) -> String {
        "cpu".to_string()
    }

    host_memory!();

    fn compute(&self, op: &Op, inputs: &[&HostTensor]) -> Result<Vec<HostTensor>, RuntimeError> {
        eval_op(op, inputs).map_err(|e| RuntimeError::Op { op: op.name().to_string(), message: e.to_string() })
    }
}

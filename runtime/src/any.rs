//! [`AnyBackend`]: the run-time choice among the compiled-in backends
//! (`cpu`, `cpu-ref`, `wgpu`, and `cuda` with the `cuda` feature), one enum
//! that dispatches every [`Backend`] method to the backend it holds.

use crate::backend::Backend;
use crate::comm::CollectiveCall;
use crate::cpu::CpuBackend;
use crate::error::RuntimeError;
use crate::fast::FastCpuBackend;
use crate::fusion::{FusedChain, FusionOptions};
use crate::gpu::{CubeBuffer, CubeclBackend};
use cubecl::wgpu::WgpuRuntime;
use weft_ir::tensor::HostTensor;
use weft_ir::{Op, TensorType};

/// A backend chosen at run time.
pub enum AnyBackend {
    /// The fast CPU backend.
    Cpu(FastCpuBackend),
    /// The CPU reference backend (the interpreter).
    CpuRef(CpuBackend),
    /// CubeCL on wgpu (Vulkan, Metal, DX12).
    Wgpu(CubeclBackend<WgpuRuntime>),
    /// CubeCL on CUDA.
    #[cfg(feature = "cuda")]
    Cuda(CubeclBackend<cubecl::cuda::CudaRuntime>),
}

/// A buffer of an [`AnyBackend`].
pub enum AnyBuffer {
    /// On the CPU.
    Cpu(HostTensor),
    /// On a wgpu device.
    Wgpu(CubeBuffer<WgpuRuntime>),
    /// On a CUDA device.
    #[cfg(feature = "cuda")]
    Cuda(CubeBuffer<cubecl::cuda::CudaRuntime>),
}

/// Unwraps buffers of the variant matching the backend; a buffer of another
/// backend is a broken invariant of the caller.
macro_rules! same_kind {
    ($bufs:expr, $variant:ident) => {
        $bufs
            .iter()
            .map(|b| match b {
                AnyBuffer::$variant(x) => x,
                #[allow(unreachable_patterns)]
                _ => panic!("a buffer of another backend was passed to the {} backend", stringify!($variant)),
            })
            .collect::<Vec<_>>()
    };
}

/// Dispatches a method call on every variant of [`AnyBackend`].
macro_rules! dispatch {
    ($self:expr, $b:ident => $e:expr) => {
        match $self {
            AnyBackend::Cpu($b) => $e,
            AnyBackend::CpuRef($b) => $e,
            AnyBackend::Wgpu($b) => $e,
            #[cfg(feature = "cuda")]
            AnyBackend::Cuda($b) => $e,
        }
    };
}

impl Backend for AnyBackend {
    type Buffer = AnyBuffer;

    fn name(&self) -> String {
        dispatch!(self, b => b.name())
    }

    fn default_lanes(&self, devices: usize) -> usize {
        dispatch!(self, b => b.default_lanes(devices))
    }

    fn alloc(&self, ty: &TensorType) -> Result<AnyBuffer, RuntimeError> {
        Ok(match self {
            AnyBackend::Cpu(b) => AnyBuffer::Cpu(b.alloc(ty)?),
            AnyBackend::CpuRef(b) => AnyBuffer::Cpu(b.alloc(ty)?),
            AnyBackend::Wgpu(b) => AnyBuffer::Wgpu(b.alloc(ty)?),
            #[cfg(feature = "cuda")]
            AnyBackend::Cuda(b) => AnyBuffer::Cuda(b.alloc(ty)?),
        })
    }

    fn upload(&self, t: &HostTensor) -> Result<AnyBuffer, RuntimeError> {
        Ok(match self {
            AnyBackend::Cpu(b) => AnyBuffer::Cpu(b.upload(t)?),
            AnyBackend::CpuRef(b) => AnyBuffer::Cpu(b.upload(t)?),
            AnyBackend::Wgpu(b) => AnyBuffer::Wgpu(b.upload(t)?),
            #[cfg(feature = "cuda")]
            AnyBackend::Cuda(b) => AnyBuffer::Cuda(b.upload(t)?),
        })
    }

    fn upload_owned(&self, t: HostTensor) -> Result<AnyBuffer, RuntimeError> {
        Ok(match self {
            AnyBackend::Cpu(b) => AnyBuffer::Cpu(b.upload_owned(t)?),
            AnyBackend::CpuRef(b) => AnyBuffer::Cpu(b.upload_owned(t)?),
            AnyBackend::Wgpu(b) => AnyBuffer::Wgpu(b.upload(&t)?),
            #[cfg(feature = "cuda")]
            AnyBackend::Cuda(b) => AnyBuffer::Cuda(b.upload(&t)?),
        })
    }

    fn download(&self, buf: &AnyBuffer) -> Result<HostTensor, RuntimeError> {
        match self {
            AnyBackend::Cpu(b) => b.download(same_kind!([buf], Cpu)[0]),
            AnyBackend::CpuRef(b) => b.download(same_kind!([buf], Cpu)[0]),
            AnyBackend::Wgpu(b) => b.download(same_kind!([buf], Wgpu)[0]),
            #[cfg(feature = "cuda")]
            AnyBackend::Cuda(b) => b.download(same_kind!([buf], Cuda)[0]),
        }
    }

    fn download_owned(&self, buf: AnyBuffer) -> Result<HostTensor, RuntimeError> {
        match (self, buf) {
            (AnyBackend::Cpu(b), AnyBuffer::Cpu(t)) => b.download_owned(t),
            (AnyBackend::CpuRef(b), AnyBuffer::Cpu(t)) => b.download_owned(t),
            (b, buf) => {
                let t = b.download(&buf);
                drop(buf);
                t
            }
        }
    }

    fn buffer_type(&self, buf: &AnyBuffer) -> TensorType {
        match buf {
            AnyBuffer::Cpu(t) => t.ty(),
            AnyBuffer::Wgpu(c) => c.ty().clone(),
            #[cfg(feature = "cuda")]
            AnyBuffer::Cuda(c) => c.ty().clone(),
        }
    }

    fn compute(&self, op: &Op, inputs: &[&AnyBuffer]) -> Result<Vec<AnyBuffer>, RuntimeError> {
        Ok(match self {
            AnyBackend::Cpu(b) => b.compute(op, &same_kind!(inputs, Cpu))?.into_iter().map(AnyBuffer::Cpu).collect(),
            AnyBackend::CpuRef(b) => b.compute(op, &same_kind!(inputs, Cpu))?.into_iter().map(AnyBuffer::Cpu).collect(),
            AnyBackend::Wgpu(b) => b.compute(op, &same_kind!(inputs, Wgpu))?.into_iter().map(AnyBuffer::Wgpu).collect(),
            #[cfg(feature = "cuda")]
            AnyBackend::Cuda(b) => b.compute(op, &same_kind!(inputs, Cuda))?.into_iter().map(AnyBuffer::Cuda).collect(),
        })
    }

    fn sync(&self) -> Result<(), RuntimeError> {
        dispatch!(self, b => b.sync())
    }

    fn device_collectives(&self) -> bool {
        dispatch!(self, b => b.device_collectives())
    }

    fn caller_drives_a_lane(&self) -> bool {
        dispatch!(self, b => b.caller_drives_a_lane())
    }

    fn collective_on_device(
        &self,
        call: CollectiveCall<'_>,
        input: &AnyBuffer,
    ) -> Option<Result<AnyBuffer, RuntimeError>> {
        match (self, input) {
            (AnyBackend::Wgpu(b), AnyBuffer::Wgpu(x)) => {
                b.collective_on_device(call, x).map(|r| r.map(AnyBuffer::Wgpu))
            }
            #[cfg(feature = "cuda")]
            (AnyBackend::Cuda(b), AnyBuffer::Cuda(x)) => {
                b.collective_on_device(call, x).map(|r| r.map(AnyBuffer::Cuda))
            }
            // CPU devices have no device-native path.
            _ => None,
        }
    }

    fn free(&self, buf: AnyBuffer) {
        match (self, buf) {
            (AnyBackend::Cpu(b), AnyBuffer::Cpu(t)) => b.free(t),
            (AnyBackend::CpuRef(b), AnyBuffer::Cpu(t)) => b.free(t),
            (_, buf) => drop(buf),
        }
    }

    fn fusion(&self) -> FusionOptions {
        dispatch!(self, b => b.fusion())
    }

    fn reshape_owned(&self, op: &Op, input: AnyBuffer) -> Result<AnyBuffer, RuntimeError> {
        match (self, input) {
            (AnyBackend::Cpu(b), AnyBuffer::Cpu(t)) => Ok(AnyBuffer::Cpu(b.reshape_owned(op, t)?)),
            (_, input) => crate::backend::compute_then_free(self, op, input),
        }
    }

    fn compute_fused_into(
        &self,
        chain: &FusedChain,
        inputs: &[Option<&AnyBuffer>],
        into: usize,
        donor: AnyBuffer,
    ) -> Result<Vec<AnyBuffer>, RuntimeError> {
        match (self, donor) {
            (AnyBackend::Cpu(b), AnyBuffer::Cpu(t)) => {
                let ins: Vec<Option<&HostTensor>> = inputs
                    .iter()
                    .map(|x| {
                        x.map(|x| match x {
                            AnyBuffer::Cpu(x) => x,
                            #[allow(unreachable_patterns)]
                            _ => panic!("a buffer of another backend was passed to the Cpu backend"),
                        })
                    })
                    .collect();
                Ok(b.compute_fused_into(chain, &ins, into, t)?.into_iter().map(AnyBuffer::Cpu).collect())
            }
            (_, donor) => crate::backend::compute_fused_then_free(self, chain, inputs, donor),
        }
    }

    fn compute_fused(&self, chain: &FusedChain, inputs: &[&AnyBuffer]) -> Result<Vec<AnyBuffer>, RuntimeError> {
        fn wrap<T>(outs: Vec<T>, f: fn(T) -> AnyBuffer) -> Vec<AnyBuffer> {
            outs.into_iter().map(f).collect()
        }
        Ok(match self {
            AnyBackend::Cpu(b) => wrap(b.compute_fused(chain, &same_kind!(inputs, Cpu))?, AnyBuffer::Cpu),
            AnyBackend::CpuRef(b) => wrap(b.compute_fused(chain, &same_kind!(inputs, Cpu))?, AnyBuffer::Cpu),
            AnyBackend::Wgpu(b) => wrap(b.compute_fused(chain, &same_kind!(inputs, Wgpu))?, AnyBuffer::Wgpu),
            #[cfg(feature = "cuda")]
            AnyBackend::Cuda(b) => wrap(b.compute_fused(chain, &same_kind!(inputs, Cuda))?, AnyBuffer::Cuda),
        })
    }
}

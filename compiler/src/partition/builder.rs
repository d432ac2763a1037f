//! Appending buffers and steps to a device program under construction.
//!
//! Every emitter of the partitioner goes through [`DeviceBuilder`], which
//! computes local output types itself (a shard slice divides, a gather
//! multiplies) and drops steps that would be no-ops on the mesh (a
//! collective or slice over axes whose sizes multiply to 1), so the lowering
//! code only states intent.

use crate::sharding::Mesh;
use weft_ir::device::{Buffer, BufferId, Collective, DeviceProgram, Step};
use weft_ir::{Op, TensorType};

/// A device program being built.
pub(crate) struct DeviceBuilder<'m> {
    pub program: DeviceProgram,
    pub mesh: &'m Mesh,
}

impl<'m> DeviceBuilder<'m> {
    pub fn new(name: &str, mesh: &'m Mesh) -> DeviceBuilder<'m> {
        let program = DeviceProgram {
            name: name.to_string(),
            mesh: mesh.shape().clone(),
            buffers: Vec::new(),
            inputs: Vec::new(),
            outputs: Vec::new(),
            steps: Vec::new(),
        };
        DeviceBuilder { program, mesh }
    }

    pub fn buffer(&mut self, ty: TensorType, name: Option<String>) -> BufferId {
        self.program.buffers.push(Buffer { ty, name });
        BufferId(self.program.buffers.len() as u32 - 1)
    }

    pub fn ty(&self, b: BufferId) -> &TensorType {
        self.program.ty(b)
    }

    /// Names `b` unless it already has a name.
    pub fn name(&mut self, b: BufferId, name: Option<&str>) {
        let slot = &mut self.program.buffers[b.index()].name;
        if slot.is_none() {
            *slot = name.map(str::to_string);
        }
    }

    pub fn axis_names(&self, axes: &[usize]) -> Vec<String> {
        axes.iter().map(|&a| self.mesh.name(a).to_string()).collect()
    }

    /// A compute step with one output of type `ty`.
    pub fn compute(&mut self, op: Op, inputs: Vec<BufferId>, ty: TensorType) -> BufferId {
        let out = self.buffer(ty, None);
        self.program.steps.push(Step::Compute { op, inputs, outputs: vec![out] });
        out
    }

    /// This device's block of `input`, dimension `d` split over `dims[d]`
    /// (axis indices, major to minor). No step when nothing is split.
    pub fn shard_slice(&mut self, input: BufferId, dims: &[Vec<usize>]) -> BufferId {
        if dims.iter().all(|d| self.mesh.product(d) == 1) {
            return input;
        }
        let mut ty = self.ty(input).clone();
        for (d, axes) in dims.iter().enumerate() {
            ty.shape[d] /= self.mesh.product(axes);
        }
        let output = self.buffer(ty, None);
        let dims = dims.iter().map(|d| self.axis_names(d)).collect();
        self.program.steps.push(Step::ShardSlice { input, output, dims });
        output
    }

    /// A collective over `axes` (indices); the output type follows from the
    /// input's. No step when the group has one member.
    pub fn collective(
        &mut self,
        input: BufferId,
        axes: &[usize],
        make: impl FnOnce(Vec<String>) -> Collective,
    ) -> BufferId {
        let n = self.mesh.product(axes);
        if n == 1 {
            return input;
        }
        let op = make(self.axis_names(axes));
        let mut ty = self.ty(input).clone();
        match &op {
            Collective::AllGather { dim, .. } => ty.shape[*dim] *= n,
            Collective::ReduceScatter { dim, .. } => ty.shape[*dim] /= n,
            Collective::AllToAll { split_dim, concat_dim, .. } => {
                ty.shape[*split_dim] /= n;
                ty.shape[*concat_dim] *= n;
            }
            Collective::AllReduce { .. } | Collective::CollectivePermute { .. } => {}
        }
        let output = self.buffer(ty, None);
        self.program.steps.push(Step::Collective { op, input, output });
        output
    }

    /// A collective permute (flat device pairs); no step when every device
    /// keeps its own buffer.
    pub fn permute(&mut self, input: BufferId, pairs: Vec<(u32, u32)>) -> BufferId {
        if pairs.iter().all(|(s, t)| s == t) {
            return input;
        }
        let output = self.buffer(self.ty(input).clone(), None);
        self.program.steps.push(Step::Collective { op: Collective::CollectivePermute { pairs }, input, output });
        output
    }
}

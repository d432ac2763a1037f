//! Device programs: what one device of a mesh executes.
//!
//! The SPMD partitioner lowers a sharded global [`crate::Function`] into one
//! [`DeviceProgram`] that every device of the mesh runs. Every device issues
//! the same steps in the same order (so collectives match by construction);
//! a step's effect depends on the device only through its mesh coordinates,
//! in two places: [`Step::ShardSlice`] (take this device's block of a
//! replicated buffer) and collectives (which devices form a group, and this
//! device's rank in it).
//!
//! Buffers are typed with *local* (per-device) shapes. Compute steps reuse
//! the IR's [`Op`] with local shapes and the same semantics as the
//! interpreter. [`Step::Free`] releases buffers after their last use
//! (liveness), so a backend can reuse memory and the peak of live bytes is
//! known statically. `specs/device-program.md` is the contract.
//!
//! Groups: a collective over mesh axes `[a, b]` runs within each set of
//! devices whose coordinates agree on every *other* axis. A device's rank
//! in its group is its coordinates along `a, b` linearised major to minor
//! (`rank = ia * size(b) + ib`). Reductions combine the group's buffers in
//! rank order (a fixed, deterministic order); gathers concatenate blocks in
//! rank order.
//!
//! Submodules: [`printer`] and [`parser`] (the text form, which round-trips,
//! `specs/device-program.md`),
//! [`verify`] (every step's types and every collective's groups checked
//! before anything runs) and [`sim`] (a reference executor for N simulated
//! devices in one process, built on the interpreter's per-op semantics).

pub mod collective;
pub mod parser;
pub mod printer;
pub mod sim;
pub mod verify;

pub use parser::parse_program;
pub use printer::print_program;
pub use sim::simulate;
pub use verify::verify_program;

use crate::mesh::MeshShape;
use crate::{Op, ReduceOp, TensorType};

/// Identifies a buffer of a device program. Prints as `%N`.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BufferId(pub u32);

impl BufferId {
    /// The index in [`DeviceProgram::buffers`].
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// A buffer: its local type and an optional name (from the global value).
#[derive(Clone, Debug, PartialEq)]
pub struct Buffer {
    /// Local (per-device) type.
    pub ty: TensorType,
    /// Name, when the global value had one.
    pub name: Option<String>,
}

/// A collective operation over the groups formed by `axes`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Collective {
    /// Concatenates the group's buffers along `dim` in rank order.
    AllGather {
        /// The dimension that grows by the group size.
        dim: usize,
        /// Mesh axes forming the groups, major to minor.
        axes: Vec<String>,
    },
    /// Combines the group's buffers elementwise with `op`, in rank order;
    /// every member gets the result.
    AllReduce {
        /// Mesh axes forming the groups, major to minor.
        axes: Vec<String>,
        /// The combining operation.
        op: ReduceOp,
    },
    /// Combines like `AllReduce`, then each member keeps block `rank` of the
    /// result along `dim`.
    ReduceScatter {
        /// The dimension that shrinks by the group size.
        dim: usize,
        /// Mesh axes forming the groups, major to minor.
        axes: Vec<String>,
        /// The combining operation.
        op: ReduceOp,
    },
    /// Splits the buffer into group-size blocks along `split_dim`, sends
    /// block `j` to rank `j`, and concatenates what it receives along
    /// `concat_dim` in rank order.
    AllToAll {
        /// The dimension split and scattered.
        split_dim: usize,
        /// The dimension along which received blocks are joined.
        concat_dim: usize,
        /// Mesh axes forming the groups, major to minor.
        axes: Vec<String>,
    },
    /// Each device sends its buffer to another: `pairs` lists
    /// `(source, target)` as flat device indices of the mesh (row-major over
    /// the mesh axes). A device that is no target receives zeros.
    CollectivePermute {
        /// `(source, target)` device index pairs.
        pairs: Vec<(u32, u32)>,
    },
}

impl Collective {
    /// The mnemonic (`all_gather`, ...).
    pub fn name(&self) -> &'static str {
        match self {
            Collective::AllGather { .. } => "all_gather",
            Collective::AllReduce { .. } => "all_reduce",
            Collective::ReduceScatter { .. } => "reduce_scatter",
            Collective::AllToAll { .. } => "all_to_all",
            Collective::CollectivePermute { .. } => "collective_permute",
        }
    }

    /// The mnemonic of its start (`all_gather_start`, ...).
    pub fn start_name(&self) -> &'static str {
        match self {
            Collective::AllGather { .. } => "all_gather_start",
            Collective::AllReduce { .. } => "all_reduce_start",
            Collective::ReduceScatter { .. } => "reduce_scatter_start",
            Collective::AllToAll { .. } => "all_to_all_start",
            Collective::CollectivePermute { .. } => "collective_permute_start",
        }
    }
}

/// One step of a device program.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// A compute op on local buffers (same semantics as the interpreter).
    Compute {
        /// The op, with attributes for local shapes.
        op: Op,
        /// Operand buffers.
        inputs: Vec<BufferId>,
        /// Result buffers.
        outputs: Vec<BufferId>,
    },
    /// Takes this device's block of a buffer that is replicated along the
    /// named axes: dimension `d` is split over `dims[d]` (major to minor),
    /// as a sharding would split it. No communication.
    ShardSlice {
        /// The replicated (larger) buffer.
        input: BufferId,
        /// The local block.
        output: BufferId,
        /// Mesh axes per dimension.
        dims: Vec<Vec<String>>,
    },
    /// A collective.
    Collective {
        /// Which collective.
        op: Collective,
        /// This device's contribution.
        input: BufferId,
        /// What this device receives.
        output: BufferId,
    },
    /// Begins a collective whose result is needed only later (the
    /// `overlap_collectives` pass splits a [`Step::Collective`] in two):
    /// this device's contribution is read here, so `input` may be freed
    /// right after, and `output` becomes live only at the matching
    /// [`Step::Done`]. The steps between run while the collective is in
    /// flight. Every device starts collectives in the same (program) order,
    /// and starting never waits, so no order of `done`s can deadlock.
    Start {
        /// Which collective.
        op: Collective,
        /// This device's contribution.
        input: BufferId,
        /// What this device receives (live from the `done`).
        output: BufferId,
    },
    /// Waits for the collective begun by the [`Step::Start`] whose output is
    /// this buffer; from here the buffer is live.
    Done(BufferId),
    /// The buffers are dead from here on.
    Free(Vec<BufferId>),
}

impl Step {
    /// The collective of a [`Step::Collective`] or [`Step::Start`], with its
    /// input and output.
    pub fn collective(&self) -> Option<(&Collective, BufferId, BufferId)> {
        match self {
            Step::Collective { op, input, output } | Step::Start { op, input, output } => Some((op, *input, *output)),
            _ => None,
        }
    }
}

/// The program every device of a mesh runs.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceProgram {
    /// Name (from the global function).
    pub name: String,
    /// Mesh axes and sizes, major to minor (devices are numbered row-major).
    pub mesh: MeshShape,
    /// Every buffer, indexed by [`BufferId`].
    pub buffers: Vec<Buffer>,
    /// Buffers holding the inputs (the global parameters' local blocks).
    pub inputs: Vec<BufferId>,
    /// Buffers holding the outputs (the global results' local blocks).
    pub outputs: Vec<BufferId>,
    /// The steps, in order.
    pub steps: Vec<Step>,
}

impl DeviceProgram {
    /// Number of devices of the mesh.
    pub fn num_devices(&self) -> usize {
        self.mesh.num_devices()
    }

    /// Coordinates of device `d` (row-major over the mesh axes).
    pub fn coords(&self, d: usize) -> Vec<usize> {
        self.mesh.coords(d)
    }

    /// Size of mesh axis `name`, if it exists.
    pub fn axis_size(&self, name: &str) -> Option<usize> {
        self.mesh.axis_size(name)
    }

    /// Type of a buffer.
    pub fn ty(&self, b: BufferId) -> &TensorType {
        &self.buffers[b.index()].ty
    }

    /// Index of mesh axis `name`, if it exists.
    pub fn axis_index(&self, name: &str) -> Option<usize> {
        self.mesh.axis_index(name)
    }

    /// The groups of a collective over `axes` (which must exist), each in
    /// rank order ([`MeshShape::groups`]).
    pub fn groups(&self, axes: &[String]) -> Vec<Vec<usize>> {
        self.mesh.groups(axes)
    }

    /// The rank of the device at `coords` in its group over the axes at
    /// indices `axes` ([`MeshShape::rank_in`]).
    pub fn rank_in(&self, coords: &[usize], axes: &[usize]) -> usize {
        self.mesh.rank_in(coords, axes)
    }

    /// Product of the sizes of the named axes (unknown axes count as 1).
    pub fn group_size(&self, axes: &[String]) -> usize {
        self.mesh.group_size(axes)
    }

    /// Whether some collective is started early ([`Step::Start`]).
    pub fn starts_collectives(&self) -> bool {
        self.steps.iter().any(|s| matches!(s, Step::Start { .. }))
    }

    /// The peak of live bytes on one device: inputs live from the start,
    /// each buffer from its definition to its `free`, at dense sizes.
    pub fn peak_live_bytes(&self) -> usize {
        let bytes = |b: &BufferId| self.ty(*b).size_bytes();
        let mut live: usize = self.inputs.iter().map(bytes).sum();
        let mut peak = live;
        for s in &self.steps {
            match s {
                Step::Compute { outputs, .. } => live += outputs.iter().map(bytes).sum::<usize>(),
                // A started collective's result is counted from its start:
                // its space is held (by the communicator or the device)
                // while it is in flight.
                Step::ShardSlice { output, .. } | Step::Collective { output, .. } | Step::Start { output, .. } => {
                    live += bytes(output)
                }
                Step::Done(_) => {}
                Step::Free(bs) => live -= bs.iter().map(bytes).sum::<usize>(),
            }
            peak = peak.max(live);
        }
        peak
    }
}

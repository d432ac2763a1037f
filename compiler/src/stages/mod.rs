//! Pipeline parallelism: a model split by depth into stages, microbatches
//! flowing through them under a schedule (GPipe or 1F1B).
//!
//! A pipelined training step does exactly the work of the unpipelined
//! step with gradient accumulation (forward and backward per microbatch,
//! gradients summed in microbatch order, one optimizer update), placed and
//! ordered differently: each unit of the model (embedding, block, head) is
//! assigned to a stage, each stage runs its own programs (MPMD, as Alpa
//! and `torch.distributed.pipelining` do, which is what lets stages be
//! unequal), and the activations crossing a stage boundary and their
//! cotangents travel between neighbouring stages.
//!
//! - [`schedule`]: the order of tasks on each stage, the unit-cost clock
//!   and the bubble.
//! - [`split`]: the cost-based choice of the split (Alpa's inter-operator
//!   dynamic programme) under a memory budget.
//! - [`graph`]: cutting the loss function into per-stage forward,
//!   backward (recompute + VJP) and update functions, and each unit's
//!   predicted cost and memory from the cost model.
//! - [`program`]: a stage's program (receive, run, send, accumulate, free,
//!   in schedule order) and its peak live bytes.
//!
//! The module is called `stages` because [`crate::pipeline`] is the list
//! of compile passes.

pub mod graph;
pub mod program;
pub mod schedule;
pub mod split;

pub use graph::{build_stages, profile_units, StageFns, StagedStep, Units};
pub use program::{stage_program, StageBytes, StageOp, StagePeak, StageProgram};
pub use schedule::{ideal_bubble, max_in_flight, simulate, stage_order, Phase, Schedule, Task, Trace, TraceEvent};
pub use split::{SplitProblem, StageSplit, UnitProfile};

/// How to pipeline a training step.
#[derive(Clone, Debug, PartialEq)]
pub struct PipelineConfig {
    /// Stages (positions of the stage axis).
    pub stages: usize,
    /// Microbatches per step.
    pub microbatches: usize,
    /// The schedule.
    pub schedule: Schedule,
    /// Units per stage; `None`: chosen by cost ([`SplitProblem::best`]).
    pub split: Option<Vec<usize>>,
    /// Bytes per device a stage may use.
    pub memory_budget: Option<u64>,
}

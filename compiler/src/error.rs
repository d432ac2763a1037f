//! The compiler's error type.
//!
//! Every mistake a user can make when asking the compiler for something
//! (differentiating something that cannot be, a training state that does not
//! match its step, a malformed mesh, a sharding that names an unknown axis or does not divide a
//! dimension, two annotations that contradict each other under the strict
//! policy, a call left in a program handed to propagation) is one variant of
//! [`CompilerError`], carrying enough context to find it: the function, the
//! value or instruction ([`Site`]), the source position when the program came
//! from text, and the axes and sizes involved. Broken internal invariants
//! panic instead.

use std::fmt;
use weft_ir::{IrError, Loc};

/// Where in a program a problem is: function, subject and source position.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Site {
    /// The function.
    pub func: String,
    /// What it is about: `parameter %x`, ``value %3 (`%3 = add`)``, `result 0`.
    pub subject: String,
    /// Source position, when the program came from text.
    pub loc: Option<Loc>,
}

impl Site {
    /// A site from its parts.
    pub fn new(func: impl Into<String>, subject: impl Into<String>, loc: Option<Loc>) -> Site {
        Site { func: func.into(), subject: subject.into(), loc }
    }
}

impl fmt::Display for Site {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(loc) = self.loc {
            write!(f, "{loc}: ")?;
        }
        match (self.func.is_empty(), self.subject.is_empty()) {
            (false, false) => write!(f, "in @{}: {}", self.func, self.subject),
            (false, true) => write!(f, "in @{}", self.func),
            (true, _) => f.write_str(&self.subject),
        }
    }
}

/// Every error the compiler reports.
#[derive(Debug, thiserror::Error)]
pub enum CompilerError {
    /// A mesh description is malformed (bad syntax, a zero size, a repeated
    /// axis name, a device list of the wrong length or with repeats).
    #[error("invalid mesh `{spec}`: {message}")]
    InvalidMesh {
        /// The mesh as given.
        spec: String,
        /// What is wrong.
        message: String,
    },
    /// A sharding names a mesh axis the mesh does not have.
    #[error(
        "{site}: sharding {sharding} names mesh axis `{axis}`, but the mesh is ({mesh}){}",
        suggestion.as_ref().map(|s| format!("; did you mean `{s}`?")).unwrap_or_default()
    )]
    UnknownAxis {
        /// The annotated value or instruction.
        site: Site,
        /// The sharding, as written.
        sharding: String,
        /// The unknown axis.
        axis: String,
        /// The mesh (`data=2,model=4`).
        mesh: String,
        /// The closest existing axis name, if one is close.
        suggestion: Option<String>,
    },
    /// A dimension is not divisible by the product of the sizes of its axes.
    #[error(
        "{site}: sharding {sharding} splits dimension {dim} (extent {extent}) over axes {} of sizes {} \
         (product {product}), but {extent} is not divisible by {product}",
        fmt_list(axes),
        fmt_list(sizes)
    )]
    NotDivisible {
        /// The annotated value or instruction.
        site: Site,
        /// The sharding, as written.
        sharding: String,
        /// The dimension.
        dim: usize,
        /// Its extent.
        extent: usize,
        /// The axes it is split over.
        axes: Vec<String>,
        /// Their sizes.
        sizes: Vec<usize>,
        /// The product of the sizes.
        product: usize,
    },
    /// A sharding uses one mesh axis twice (in two dimensions, twice in one,
    /// or in a dimension and the unreduced set).
    #[error("{site}: sharding {sharding} uses mesh axis `{axis}` more than once")]
    DuplicateAxis {
        /// The annotated value or instruction.
        site: Site,
        /// The sharding, as written.
        sharding: String,
        /// The repeated axis.
        axis: String,
    },
    /// A sharding's rank differs from its tensor's rank.
    #[error("{site}: sharding {sharding} has {sharding_rank} dimensions but the tensor {ty} has rank {rank}")]
    RankMismatch {
        /// The annotated value or instruction.
        site: Site,
        /// The sharding, as written.
        sharding: String,
        /// Dimensions in the sharding.
        sharding_rank: usize,
        /// The tensor type.
        ty: String,
        /// Its rank.
        rank: usize,
    },
    /// Two user annotations contradict each other (only reported under
    /// [`crate::sharding::ConflictPolicy::Error`]; the default policy inserts
    /// a reshard and records why).
    #[error(
        "conflicting sharding annotations: {first} is {first_sharding}, but {second} is {second_sharding}; {detail}"
    )]
    ConflictingAnnotations {
        /// The first annotation.
        first: Site,
        /// Its sharding.
        first_sharding: String,
        /// The second annotation.
        second: Site,
        /// Its sharding.
        second_sharding: String,
        /// Where and how they meet.
        detail: String,
    },
    /// Sharding propagation was given a program that still has calls.
    #[error("{site}: call to @{callee} must be inlined before sharding propagation (see `inline_calls`)")]
    CallNotInlined {
        /// The call.
        site: Site,
        /// The callee.
        callee: String,
    },
    /// A function named in a request does not exist.
    #[error("unknown function @{name}")]
    UnknownFunction {
        /// The name asked for.
        name: String,
    },
    /// A device id that is not part of the mesh.
    #[error("device {device} is not in the mesh ({mesh})")]
    UnknownDevice {
        /// The device id.
        device: usize,
        /// The mesh.
        mesh: String,
    },
    /// The compiler broke one of its own invariants (a bug, never the
    /// user's mistake): named by the stage that found it.
    #[error("internal error after {stage}: {message}")]
    Internal {
        /// The pass or stage after which the invariant failed.
        stage: String,
        /// What failed.
        message: String,
    },
    /// A pipeline pass was given a program in the wrong form (passes out
    /// of order).
    #[error("pass `{pass}` takes {expected}, but was given {found}")]
    PassOrder {
        /// The pass.
        pass: String,
        /// The form it takes.
        expected: &'static str,
        /// The form it was given.
        found: &'static str,
    },
    /// A pass name the pipeline does not have (`--dump-after`).
    #[error("unknown pass `{name}` (passes: {passes}, or `all`)")]
    UnknownPass {
        /// The name given.
        name: String,
        /// The pipeline's passes, in order.
        passes: String,
    },
    /// An annotation names a parameter (or result) the function lacks.
    #[error("@{func} has no {name} (it has {known})")]
    UnknownParameter {
        /// The function.
        func: String,
        /// The parameter name (or `result K`).
        name: String,
        /// What it has.
        known: String,
    },
    /// A request outside what a helper supports (e.g. drawing a rank-3 grid).
    #[error("{0}")]
    Unsupported(String),
    /// Mesh-invariant sums with a chunk count that is not a power of two of
    /// at least 2 (see [`crate::canonical_sums`]).
    #[error("mesh-invariant sums need a power of two of at least 2 chunks, got {chunks}")]
    InvalidSumChunks {
        /// The chunk count asked for.
        chunks: usize,
    },
    /// A sharded program in which some instruction cannot be computed from
    /// its operands' shards without communication (see
    /// [`crate::sharding::check_locally_computable`]).
    #[error("{} instruction{} not locally computable:\n{}", problems.len(),
        if problems.len() == 1 { " is" } else { "s are" }, problems.join("\n"))]
    NotLocallyComputable {
        /// One line per problem, naming the instruction.
        problems: Vec<String>,
    },
    /// Inlining every call would make the program larger than the limit
    /// (e.g. functions that each call the next twice).
    #[error(
        "inlining @{func} would expand it to {} instructions, more than the limit of {limit}; the calls that \
         multiply it: {chain}", if *insts == u64::MAX { "more than 2^64".to_string() } else { insts.to_string() }
    )]
    ProgramTooLarge {
        /// The function being inlined.
        func: String,
        /// Its instructions once every call is inlined (saturating).
        insts: u64,
        /// The limit.
        limit: u64,
        /// The chain of calls that dominates the expansion.
        chain: String,
    },
    /// Differentiation was asked for something it cannot do.
    #[error("autodiff of @{func}: {message}")]
    Autodiff {
        /// The function being differentiated.
        func: String,
        /// What is wrong.
        message: String,
    },
    /// A state or batch tree does not match a training step's layout.
    #[error("leaf `{leaf}`: {message}")]
    State {
        /// The offending leaf.
        leaf: String,
        /// What is wrong.
        message: String,
    },
    /// A memory size that could not be read (`2GiB`, `512MiB`, `1e9`).
    #[error("invalid memory budget `{text}`: {message}")]
    InvalidMemoryBudget {
        /// The text given.
        text: String,
        /// What is wrong.
        message: String,
    },
    /// Auto-sharding found no plan within the per-device memory budget.
    #[error(
        "no sharding of @{func} fits the memory budget of {budget} bytes per device: the smallest peak \
         found is {minimum} bytes per device{}, dominated by:\n{}", if *proven { "" } else { " (the search was \
         limited, a smaller one may exist)" }, dominant.join("\n")
    )]
    MemoryBudgetInfeasible {
        /// The function.
        func: String,
        /// The budget, bytes per device.
        budget: u64,
        /// The smallest per-device peak the search reached.
        minimum: u64,
        /// Whether `minimum` is proven minimal over the alternatives searched.
        proven: bool,
        /// The largest contributions at that peak, one line each (value,
        /// type, sharding, bytes per device).
        dominant: Vec<String>,
    },
    /// An auto-sharding plan met its memory budget but the partitioned
    /// program does not: its peak of live bytes (reshard temporaries, the
    /// new state beside the old) stayed over the budget even when the plan
    /// was searched again under a budget lowered by the excess.
    #[error(
        "the auto-sharded @{func} needs {} per device, over the memory budget of {} (the plan fits, but the \
         partitioned program's reshards and state copies do not)",
        weft_ir::limits::human_bytes(*peak),
        weft_ir::limits::human_bytes(*budget)
    )]
    ProgramOverBudget {
        /// The function.
        func: String,
        /// The partitioned program's peak, bytes per device.
        peak: u64,
        /// The budget, bytes per device.
        budget: u64,
    },
    /// A pipeline configuration that cannot be built (an unknown schedule,
    /// zero stages or microbatches, an explicit split that does not cover
    /// the layers, a model the stage splitter cannot cut).
    #[error("pipeline: {message}")]
    PipelineConfig {
        /// What is wrong.
        message: String,
    },
    /// More pipeline stages than layers to put on them.
    #[error("pipeline: {stages} {pieces} but the model has only {layers} layers to split ({names})")]
    PipelineStagesExceedLayers {
        /// Stages asked for (chunks, when interleaved).
        stages: usize,
        /// What `stages` counts: `stages`, or `chunks (S stages × V virtual
        /// stages)`.
        pieces: String,
        /// Layers (units) the model has.
        layers: usize,
        /// The layers, by name.
        names: String,
    },
    /// The microbatch count does not divide the batch.
    #[error("pipeline: {microbatches} microbatches do not divide the batch of {batch} rows")]
    PipelineMicrobatches {
        /// Microbatches asked for.
        microbatches: usize,
        /// The batch size.
        batch: usize,
    },
    /// The mesh's stage axis does not have one position per stage.
    #[error("pipeline: the stage axis `{axis}` has size {size}, but {stages} stages need size {stages}")]
    PipelineStageAxis {
        /// The axis.
        axis: String,
        /// Its size.
        size: usize,
        /// Stages asked for.
        stages: usize,
    },
    /// The mesh has no axis of the pipeline's name.
    #[error(
        "pipeline: the mesh `{mesh}` has no axis `{axis}` (its axes: {axes}); add `{axis}={stages}` to the mesh \
         or name another axis in pipeline.axis"
    )]
    PipelineNoStageAxis {
        /// The axis asked for.
        axis: String,
        /// Stages asked for.
        stages: usize,
        /// The mesh.
        mesh: String,
        /// Its axes, comma-separated.
        axes: String,
    },
    /// No split of the layers into stages fits the memory budget per device.
    #[error(
        "pipeline: no split of {layers} layers into {stages} {pieces} fits the memory budget of {} per device; \
         the best split needs {} on its largest stage ({split})",
        weft_ir::limits::human_bytes(*budget), weft_ir::limits::human_bytes(*minimum)
    )]
    PipelineMemoryInfeasible {
        /// What `stages` counts: `stages`, or `chunks (S stages × V virtual
        /// stages)`.
        pieces: String,
        /// Stages.
        stages: usize,
        /// Layers.
        layers: usize,
        /// The budget, bytes per device.
        budget: u64,
        /// The smallest largest-stage memory over all splits.
        minimum: u64,
        /// That split, as layer counts per stage.
        split: String,
    },
    /// An error from the IR: the program is ill-formed (e.g. a transform's
    /// input failed verification).
    #[error(transparent)]
    Ir(#[from] IrError),
}

fn fmt_list<T: fmt::Display>(items: &[T]) -> String {
    let parts: Vec<String> = items.iter().map(|i| i.to_string()).collect();
    format!("[{}]", parts.join(", "))
}

/// Result with [`CompilerError`].
pub type Result<T, E = CompilerError> = std::result::Result<T, E>;

//! The compile of one function as a visible list of named passes.
//!
//! ```text
//! inline -> [canonical_sums] -> [annotate] -> [autoshard] -> propagate -> partition
//!        -> compose_transposes -> forward_identities -> fold_transposes
//!        -> cse -> remove_dead_steps -> fuse_reduce_scatter -> rematerialize -> compact
//!        -> [bucket_collectives -> overlap_collectives]
//!        -> insert_frees
//! ```
//!
//! Each pass takes the program in one form ([`Program`]) to the next (or to
//! the same form): a module to an [`InlinedFunction`] (inline), an inlined
//! function to an annotated or auto-sharded one, to a
//! [`ShardedFunction`] (propagate), to a [`PartitionedFunction`]
//! (partition, then the clean-ups of [`crate::partition::CLEANUPS`]). Every
//! form has a text form ([`Program::text`]), which `weft lower
//! --dump-after PASS` prints. In debug builds (and whenever
//! [`Pipeline::verify`] is set) the program is verified after every pass,
//! and a device program must read back from its text; the final device
//! program is always verified. [`Pipeline::run`] returns the time of every
//! pass. [`crate::partition::compile`] and
//! [`crate::partition::partition_function`] are thin wrappers over it;
//! [`crate::partition::compile_stable`] runs it to a stable state layout.

use crate::autoshard::{auto_shard_inlined, AutoShardOptions};
use crate::canonical_sums::{canonical_sums, SumChunks};
use crate::error::{CompilerError, Result};
use crate::inline::{inline, InlinedFunction};
use crate::partition::overlap::{bucket_collectives, overlap_collectives, OverlapOptions};
use crate::partition::{lower_sharded, Cleanup, PartitionedFunction, CLEANUPS};
use crate::sharding::{fmt_sharding, propagate_inlined, Mesh, PropagateOptions, ShardedFunction};
use std::time::{Duration, Instant};
use weft_ir::device::{parse_program, print_program, verify_program};
use weft_ir::{Module, TensorSharding};

/// The wall time of each pass (or phase: [`crate::partition::compile_stable`]
/// sums passes into phases), in order.
pub type PassTimes = Vec<(&'static str, Duration)>;

/// The table of pass times (`weft lower --time-passes`, the
/// `pipeline_passes` example): one line per pass, then the total, each
/// starting with `prefix`.
pub fn format_pass_times(times: &[(&'static str, Duration)], prefix: &str) -> String {
    let total: Duration = times.iter().map(|(_, t)| *t).sum();
    times
        .iter()
        .copied()
        .chain([("total", total)])
        .map(|(pass, t)| format!("{prefix}{pass:<20} {:>10.3} ms\n", t.as_secs_f64() * 1e3))
        .collect()
}

/// A program between two passes.
#[derive(Clone, Debug)]
pub enum Program {
    /// After `inline` (and `annotate`, `autoshard`): one call-free function.
    Inlined(InlinedFunction),
    /// After `propagate`: every value sharded, reshards inserted.
    Sharded(Box<ShardedFunction>),
    /// After `partition` and each clean-up: the program every device runs.
    Partitioned(Box<PartitionedFunction>),
}

impl Program {
    /// What form it is in, for messages.
    pub fn form(&self) -> &'static str {
        match self {
            Program::Inlined(_) => "an inlined function",
            Program::Sharded(_) => "a sharded function",
            Program::Partitioned(_) => "a device program",
        }
    }

    /// The text form: the IR text of the function (with shardings after
    /// `propagate`, followed by one comment line per inserted reshard) or
    /// the device program's text.
    pub fn text(&self) -> String {
        match self {
            Program::Inlined(f) => weft_ir::text::print_function(f.function()),
            Program::Sharded(sf) => {
                let mut out = weft_ir::text::print_function(&sf.function);
                for r in &sf.reshards {
                    let steps = if r.collectives.is_empty() { "local".to_string() } else { r.collectives.join(", ") };
                    out.push_str(&format!(
                        "// {} = reshard {}: {} -> {}: {steps}\n",
                        sf.function.value_ref(r.value),
                        sf.reshard_operand(r),
                        fmt_sharding(&r.from),
                        fmt_sharding(&r.to),
                    ));
                }
                out
            }
            Program::Partitioned(pf) => print_program(&pf.program),
        }
    }

    /// The partitioned function, at the end of a pipeline.
    pub fn into_partitioned(self) -> Result<PartitionedFunction> {
        match self {
            Program::Partitioned(pf) => Ok(*pf),
            other => Err(CompilerError::PassOrder {
                pass: "(end of pipeline)".into(),
                expected: "a device program",
                found: other.form(),
            }),
        }
    }
}

/// Sharding annotations applied by the `annotate` pass: what a strategy or
/// the user asks for. Annotations already in the function are kept unless
/// named here.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Annotations {
    /// Parameter name and its sharding.
    pub params: Vec<(String, TensorSharding)>,
    /// Result index and its sharding.
    pub results: Vec<(usize, TensorSharding)>,
}

/// One pass.
#[derive(Clone, Debug)]
pub enum Pass {
    /// Puts every float sum in the mesh-invariant order
    /// ([`crate::canonical_sums`]).
    CanonicalSums(SumChunks),
    /// Sets parameter and result shardings.
    Annotate(Annotations),
    /// Chooses shardings for every value not annotated (auto-sharding).
    AutoShard(AutoShardOptions),
    /// Propagates shardings and inserts reshards.
    Propagate(PropagateOptions),
    /// Lowers the sharded function to a device program.
    Partition,
    /// A clean-up of the device program, by name ([`CLEANUPS`]).
    Cleanup(&'static str, Cleanup),
    /// Combines small all-reduces into buckets of up to this many bytes
    /// ([`crate::partition::overlap::bucket_collectives`]).
    Bucket(u64),
    /// Splits collectives into start and done around the compute they
    /// overlap ([`crate::partition::overlap`]).
    Overlap(OverlapOptions),
}

impl Pass {
    /// Its name (what `--dump-after` takes).
    pub fn name(&self) -> &'static str {
        match self {
            Pass::CanonicalSums(_) => "canonical_sums",
            Pass::Annotate(_) => "annotate",
            Pass::AutoShard(_) => "autoshard",
            Pass::Propagate(_) => "propagate",
            Pass::Partition => "partition",
            Pass::Cleanup(name, _) => name,
            Pass::Bucket(_) => "bucket_collectives",
            Pass::Overlap(_) => "overlap_collectives",
        }
    }

    fn wrong(&self, expected: &'static str, p: &Program) -> CompilerError {
        CompilerError::PassOrder { pass: self.name().into(), expected, found: p.form() }
    }

    fn run(&self, p: Program, mesh: &Mesh) -> Result<Program> {
        Ok(match (self, p) {
            (Pass::CanonicalSums(chunks), Program::Inlined(f)) => Program::Inlined(canonical_sums(&f, *chunks)?),
            (Pass::Annotate(a), Program::Inlined(mut f)) => {
                f.annotate(a)?;
                Program::Inlined(f)
            }
            (Pass::AutoShard(opts), Program::Inlined(f)) => {
                let plan = auto_shard_inlined(&f, mesh, opts)?;
                Program::Inlined(InlinedFunction::new(plan.apply())?)
            }
            (Pass::Propagate(opts), Program::Inlined(f)) => {
                Program::Sharded(Box::new(propagate_inlined(&f, mesh, opts)?))
            }
            (Pass::Partition, Program::Sharded(sf)) => Program::Partitioned(Box::new(lower_sharded(&sf, mesh)?)),
            (Pass::Cleanup(_, c), Program::Partitioned(mut pf)) => {
                c(&mut pf.program);
                Program::Partitioned(pf)
            }
            (Pass::Bucket(bytes), Program::Partitioned(mut pf)) => {
                bucket_collectives(&mut pf.program, *bytes);
                Program::Partitioned(pf)
            }
            (Pass::Overlap(o), Program::Partitioned(mut pf)) => {
                overlap_collectives(&mut pf.program, o);
                Program::Partitioned(pf)
            }
            (Pass::CanonicalSums(_) | Pass::Annotate(_) | Pass::AutoShard(_) | Pass::Propagate(_), p) => {
                return Err(self.wrong("an inlined function", &p))
            }
            (Pass::Partition, p) => return Err(self.wrong("a sharded function", &p)),
            (Pass::Cleanup(..) | Pass::Bucket(_) | Pass::Overlap(_), p) => {
                return Err(self.wrong("a device program", &p))
            }
        })
    }
}

/// The passes after `inline`, and how to run them.
#[derive(Clone, Debug)]
pub struct Pipeline {
    /// The mesh.
    pub mesh: Mesh,
    /// The passes after `inline`, in order.
    pub passes: Vec<Pass>,
    /// Verify after every pass (default: in debug builds).
    pub verify: bool,
}

impl Pipeline {
    /// `propagate`, `partition` and every clean-up: what
    /// [`crate::partition::compile`] runs after `inline`.
    pub fn standard(mesh: &Mesh, options: &PropagateOptions) -> Pipeline {
        let mut passes = vec![Pass::Propagate(options.clone()), Pass::Partition];
        passes.extend(Pipeline::cleanups());
        Pipeline { mesh: mesh.clone(), passes, verify: cfg!(debug_assertions) }
    }

    /// The pipeline of a training step: [`Pipeline::standard`], with the
    /// auto-sharder before `propagate` when `auto` is given and
    /// `bucket_collectives` and `overlap_collectives` before `insert_frees`
    /// when `overlap` is.
    /// Whole-mesh runs, pipeline stages and the step-time prediction all
    /// compile through it, so they compile the same program.
    pub fn for_step(
        mesh: &Mesh,
        auto: Option<&crate::autoshard::AutoShardOptions>,
        overlap: Option<OverlapOptions>,
    ) -> Pipeline {
        let mut p = Pipeline::standard(mesh, &PropagateOptions::default());
        if let Some(o) = auto {
            p.insert_before("propagate", Pass::AutoShard(o.clone()));
        }
        if let Some(o) = overlap {
            p.insert_before("insert_frees", Pass::Bucket(o.bucket_bytes));
            p.insert_before("insert_frees", Pass::Overlap(o));
        }
        p
    }

    /// The clean-up passes, in order.
    pub fn cleanups() -> impl Iterator<Item = Pass> {
        CLEANUPS.iter().map(|&(name, c)| Pass::Cleanup(name, c))
    }

    /// Inserts a pass before the first pass named `before`.
    pub fn insert_before(&mut self, before: &str, pass: Pass) {
        let at = self.passes.iter().position(|p| p.name() == before).unwrap_or(self.passes.len());
        self.passes.insert(at, pass);
    }

    /// Every pass name, `inline` first.
    pub fn names(&self) -> Vec<&'static str> {
        std::iter::once("inline").chain(self.passes.iter().map(Pass::name)).collect()
    }

    /// Checks that `name` is a pass of this pipeline (for `--dump-after`).
    pub fn check_pass_name(&self, name: &str) -> Result<()> {
        if name == "all" || self.names().contains(&name) {
            return Ok(());
        }
        Err(CompilerError::UnknownPass { name: name.into(), passes: self.names().join(", ") })
    }

    /// Runs `inline` on function `entry` of `m`, then every pass; calls
    /// `after(pass, program)` after each. Returns the final program and the
    /// time of every pass.
    pub fn run(&self, m: &Module, entry: &str, after: &mut dyn FnMut(&str, &Program)) -> Result<(Program, PassTimes)> {
        let clock = Instant::now();
        let f = inline(m, entry)?;
        let mut times = vec![("inline", clock.elapsed())];
        let p = Program::Inlined(f);
        self.check("inline", &p)?;
        after("inline", &p);
        let (p, more) = self.run_from(p, after)?;
        times.extend(more);
        Ok((p, times))
    }

    /// Runs every pass on `p`; see [`Pipeline::run`].
    pub fn run_from(&self, mut p: Program, after: &mut dyn FnMut(&str, &Program)) -> Result<(Program, PassTimes)> {
        let mut times = Vec::with_capacity(self.passes.len());
        for pass in &self.passes {
            let clock = Instant::now();
            p = pass.run(p, &self.mesh)?;
            times.push((pass.name(), clock.elapsed()));
            self.check(pass.name(), &p)?;
            after(pass.name(), &p);
        }
        if let Program::Partitioned(pf) = &p {
            verify_program(&pf.program)?;
        }
        Ok((p, times))
    }

    /// The verifier between passes (when [`Pipeline::verify`] is set).
    fn check(&self, pass: &str, p: &Program) -> Result<()> {
        if !self.verify {
            return Ok(());
        }
        let internal = |message: String| CompilerError::Internal { stage: pass.into(), message };
        match p {
            Program::Inlined(f) => weft_ir::verify_function(&Module::new(), f.function())
                .map_err(|e| internal(format!("the function does not verify: {e}"))),
            Program::Sharded(sf) => {
                weft_ir::verify_function(&Module::new(), &sf.function)
                    .map_err(|e| internal(format!("the sharded function does not verify: {e}")))?;
                sf.check().map_err(|e| internal(format!("the sharded function is not locally computable: {e}")))
            }
            Program::Partitioned(pf) => {
                verify_program(&pf.program)
                    .map_err(|e| internal(format!("the device program does not verify: {e}")))?;
                let text = print_program(&pf.program);
                let back = parse_program(&text).map_err(|e| internal(format!("its text does not parse: {e}")))?;
                // Before `compact`, buffers nothing defines are not in the
                // text; the program reads back equal once every one is.
                if print_program(&back) != text || (all_defined(&pf.program) && back != pf.program) {
                    return Err(internal(format!("the device program's text does not read back the same:\n{text}")));
                }
                Ok(())
            }
        }
    }
}

/// Whether every buffer of `p` is an input or written by a step.
fn all_defined(p: &weft_ir::device::DeviceProgram) -> bool {
    let mut defined = vec![false; p.buffers.len()];
    let written = p.steps.iter().flat_map(crate::partition::liveness::writes);
    for b in p.inputs.iter().copied().chain(written) {
        defined[b.index()] = true;
    }
    defined.into_iter().all(|d| d)
}

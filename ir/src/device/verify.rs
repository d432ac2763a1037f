//! The device-program verifier.
//!
//! A device program is the contract between the partitioner and every
//! executor (the reference simulator here, the CubeCL/CPU runtime), so it is
//! checked once, before anything runs, and every problem is reported with
//! the step it is in: the mesh is well formed; each buffer is defined once
//! (as an input or by one step), used only while live (after its definition,
//! before its `free`) and freed at most once; outputs are live at the end;
//! compute steps have exactly the types [`crate::infer()`] gives for their
//! local operand types; shard slices and collectives name existing, distinct
//! mesh axes, dimensions in range, extents divisible by the group size, and
//! output types that follow from their input; permutation pairs name devices
//! of the mesh, each at most once as a source and once as a target; a
//! started collective's output is read only after its `done`, and every
//! start has one.

use super::{BufferId, Collective, DeviceProgram, Step};
use crate::{infer, Diagnostic, IrError, NoFunctions, Op, TensorType};

#[derive(Copy, Clone, PartialEq)]
enum State {
    Undefined,
    /// Started by a collective, not yet done.
    InFlight,
    Live,
    Freed,
}

struct Checker<'p> {
    p: &'p DeviceProgram,
    state: Vec<State>,
    problems: Vec<Diagnostic>,
    subject: String,
}

impl Checker<'_> {
    fn bad(&mut self, message: String) {
        self.problems.push(Diagnostic { func: self.p.name.clone(), loc: None, subject: self.subject.clone(), message });
    }

    fn exists(&mut self, b: BufferId) -> bool {
        if b.index() < self.p.buffers.len() {
            return true;
        }
        self.bad(format!("buffer %{} does not exist ({} buffers)", b.0, self.p.buffers.len()));
        false
    }

    fn use_buf(&mut self, b: BufferId) -> Option<&TensorType> {
        if !self.exists(b) {
            return None;
        }
        match self.state[b.index()] {
            State::Live => {}
            State::Undefined => self.bad(format!("buffer %{} is used before it is defined", b.0)),
            State::InFlight => self.bad(format!("buffer %{} is used before its collective is done", b.0)),
            State::Freed => self.bad(format!("buffer %{} is used after it was freed", b.0)),
        }
        Some(self.p.ty(b))
    }

    fn define(&mut self, b: BufferId) -> Option<&TensorType> {
        if !self.exists(b) {
            return None;
        }
        if self.state[b.index()] != State::Undefined {
            self.bad(format!("buffer %{} is defined twice", b.0));
        }
        self.state[b.index()] = State::Live;
        Some(self.p.ty(b))
    }

    /// Checks axis names exist and are distinct; returns their group size.
    fn axes(&mut self, axes: &[String], seen: &mut Vec<String>) -> usize {
        let mut n = 1;
        for a in axes {
            match self.p.axis_size(a) {
                Some(s) => n *= s,
                None => {
                    let mesh: Vec<&str> = self.p.mesh.axes.iter().map(|(m, _)| m.as_str()).collect();
                    self.bad(format!("mesh axis `{a}` does not exist (mesh axes: {})", mesh.join(", ")))
                }
            }
            if seen.contains(a) {
                self.bad(format!("mesh axis `{a}` is named twice"));
            }
            seen.push(a.clone());
        }
        n
    }

    fn expect(&mut self, what: &str, got: &TensorType, want: &TensorType) {
        if got != want {
            self.bad(format!("{what} has type {got} but should be {want}"));
        }
    }

    fn dim(&mut self, what: &str, dim: usize, t: &TensorType) -> bool {
        if dim < t.rank() {
            return true;
        }
        self.bad(format!("{what} {dim} is out of range for {t}"));
        false
    }

    fn divisible(&mut self, t: &TensorType, dim: usize, n: usize) -> bool {
        if t.shape[dim] % n == 0 {
            return true;
        }
        self.bad(format!("dimension {dim} of {t} (extent {}) is not divisible by the group size {n}", t.shape[dim]));
        false
    }

    fn step(&mut self, step: &Step) {
        match step {
            Step::Compute { op, inputs, outputs } => self.compute(op, inputs, outputs),
            Step::ShardSlice { input, output, dims } => {
                let Some(t) = self.use_buf(*input).cloned() else { return };
                let o = self.define(*output).cloned();
                if dims.len() != t.rank() {
                    self.bad(format!("{} dimension entries for an input of rank {} ({t})", dims.len(), t.rank()));
                    return;
                }
                let mut seen = Vec::new();
                let mut want = t.clone();
                for (d, axes) in dims.iter().enumerate() {
                    let n = self.axes(axes, &mut seen);
                    if self.divisible(&t, d, n) {
                        want.shape[d] /= n;
                    }
                }
                if let Some(o) = o {
                    self.expect("the output", &o, &want);
                }
            }
            Step::Collective { op, input, output } | Step::Start { op, input, output } => {
                let Some(t) = self.use_buf(*input).cloned() else { return };
                let Some(o) = self.define(*output).cloned() else { return };
                if matches!(step, Step::Start { .. }) {
                    self.state[output.index()] = State::InFlight;
                }
                if let Some(want) = self.collective(op, &t) {
                    self.expect("the output", &o, &want);
                }
            }
            Step::Done(b) => {
                if !self.exists(*b) {
                    return;
                }
                match self.state[b.index()] {
                    State::InFlight => self.state[b.index()] = State::Live,
                    _ => self.bad(format!("buffer %{} has no collective in flight", b.0)),
                }
            }
            Step::Free(bs) => {
                for &b in bs {
                    if self.use_buf(b).is_some() {
                        self.state[b.index()] = State::Freed;
                    }
                }
            }
        }
    }

    fn compute(&mut self, op: &Op, inputs: &[BufferId], outputs: &[BufferId]) {
        let tys: Vec<Option<TensorType>> = inputs.iter().map(|&b| self.use_buf(b).cloned()).collect();
        let outs: Vec<Option<TensorType>> = outputs.iter().map(|&b| self.define(b).cloned()).collect();
        if matches!(op, Op::Call { .. } | Op::Reshard { .. } | Op::ShardingConstraint { .. }) {
            self.bad(format!("`{}` cannot appear in a device program", op.name()));
            return;
        }
        let (Some(tys), Some(outs)) =
            (tys.into_iter().collect::<Option<Vec<_>>>(), outs.into_iter().collect::<Option<Vec<_>>>())
        else {
            return;
        };
        let refs: Vec<&TensorType> = tys.iter().collect();
        match infer(op, &refs, &NoFunctions) {
            Err(e) => self.bad(e),
            Ok(want) if want.len() != outs.len() => {
                self.bad(format!("produces {} results but has {} output buffers", want.len(), outs.len()))
            }
            Ok(want) => {
                for (k, (o, w)) in outs.iter().zip(&want).enumerate() {
                    self.expect(&format!("output {k}"), o, w);
                }
            }
        }
    }

    /// Reports a reduction the interpreter's binary ops cannot fold (any
    /// reduction of `bool`).
    fn reducible(&mut self, op: crate::ReduceOp, t: &TensorType) {
        if t.dtype == crate::DType::Bool {
            self.bad(format!("a `{}` reduction needs numbers, not bool ({t})", op.name()));
        }
    }

    /// The output type of collective `c` on an input of type `t`, or `None`
    /// after reporting why there is none.
    fn collective(&mut self, c: &Collective, t: &TensorType) -> Option<TensorType> {
        let mut seen = Vec::new();
        let mut out = t.clone();
        match c {
            Collective::AllGather { dim, axes } => {
                let n = self.axes(axes, &mut seen);
                if !self.dim("gather dimension", *dim, t) {
                    return None;
                }
                out.shape[*dim] *= n;
            }
            Collective::AllReduce { axes, op } => {
                self.axes(axes, &mut seen);
                self.reducible(*op, t);
            }
            Collective::ReduceScatter { dim, axes, op } => {
                let n = self.axes(axes, &mut seen);
                self.reducible(*op, t);
                if !self.dim("scatter dimension", *dim, t) || !self.divisible(t, *dim, n) {
                    return None;
                }
                out.shape[*dim] /= n;
            }
            Collective::AllToAll { split_dim, concat_dim, axes } => {
                let n = self.axes(axes, &mut seen);
                if !self.dim("split dimension", *split_dim, t)
                    || !self.dim("concat dimension", *concat_dim, t)
                    || !self.divisible(t, *split_dim, n)
                {
                    return None;
                }
                out.shape[*split_dim] /= n;
                out.shape[*concat_dim] *= n;
            }
            Collective::CollectivePermute { pairs } => {
                let n = self.p.num_devices() as u32;
                let (mut sources, mut targets) = (Vec::new(), Vec::new());
                for &(s, t) in pairs {
                    if s >= n || t >= n {
                        self.bad(format!("pair ({s}, {t}) names a device outside the mesh of {n} devices"));
                    }
                    if sources.contains(&s) {
                        self.bad(format!("device {s} is the source of two pairs"));
                    }
                    if targets.contains(&t) {
                        self.bad(format!("device {t} is the target of two pairs"));
                    }
                    sources.push(s);
                    targets.push(t);
                }
            }
        }
        Some(out)
    }
}

/// Checks `p` (see the module doc); returns every problem as
/// [`IrError::Verify`], one diagnostic per problem naming the step.
pub fn verify_program(p: &DeviceProgram) -> Result<(), IrError> {
    let mut c =
        Checker { p, state: vec![State::Undefined; p.buffers.len()], problems: Vec::new(), subject: "mesh".into() };
    let mut names: Vec<&str> = Vec::new();
    for (a, n) in &p.mesh.axes {
        if !crate::verify::is_identifier(a) {
            c.bad(format!("`{a}` is not a valid axis name"));
        }
        if *n == 0 {
            c.bad(format!("axis `{a}` has size 0"));
        }
        if names.contains(&a.as_str()) {
            c.bad(format!("axis `{a}` appears twice"));
        }
        names.push(a);
    }
    for (i, &b) in p.inputs.iter().enumerate() {
        c.subject = format!("input {i}");
        c.define(b);
    }
    for (i, step) in p.steps.iter().enumerate() {
        c.subject = format!("step {i} (`{}`)", step_name(step));
        c.step(step);
    }
    for (k, &b) in p.outputs.iter().enumerate() {
        c.subject = format!("output {k}");
        c.use_buf(b);
    }
    c.subject = "the end".into();
    for b in 0..p.buffers.len() {
        if c.state[b] == State::InFlight {
            c.bad(format!("the collective started for %{b} is never done"));
        }
    }
    if c.problems.is_empty() {
        Ok(())
    } else {
        Err(IrError::Verify(c.problems))
    }
}

/// The mnemonic of a step: the op's, `shard_slice`, the collective's, `free`.
pub fn step_name(step: &Step) -> &'static str {
    match step {
        Step::Compute { op, .. } => op.name(),
        Step::ShardSlice { .. } => "shard_slice",
        Step::Collective { op, .. } => op.name(),
        Step::Start { op, .. } => op.start_name(),
        Step::Done(_) => "done",
        Step::Free(_) => "free",
    }
}

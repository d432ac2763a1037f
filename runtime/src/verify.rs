//! Checks a device program before anything runs.
//!
//! Running a malformed program on N devices would fail late and far from
//! the cause (a shape mismatch deep inside a kernel, a collective waiting
//! on a buffer that was freed). So the executor first walks the program
//! once, symbolically: every buffer is defined once before it is used and
//! not used after it is freed, every compute step's output types are what
//! [`weft_ir::infer()`] says, shard slices and collectives name existing
//! mesh axes and divide their dimensions evenly, and the outputs are live
//! at the end. Because all devices run the same program, they issue the
//! same collectives in the same order by construction; the only per-device
//! difference (the coordinates) cannot make a step invalid on one device
//! and valid on another. The walk also yields the peak of live bytes.

use crate::collective::group_size;
use crate::error::RuntimeError;
use weft_ir::device::{BufferId, Collective, DeviceProgram, Step};
use weft_ir::{infer, NoFunctions, Op, TensorType};

/// What verification learns about a program.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProgramInfo {
    /// The largest number of bytes live at once on one device (inputs
    /// included), counting each buffer at its dense size.
    pub peak_live_bytes: usize,
}

struct Walk<'p> {
    p: &'p DeviceProgram,
    state: Vec<Liveness>,
    live_bytes: usize,
    peak: usize,
    step: Option<usize>,
}

#[derive(Copy, Clone, PartialEq, Eq)]
enum Liveness {
    Undefined,
    Live,
    Freed,
}

impl<'p> Walk<'p> {
    fn err(&self, message: String) -> RuntimeError {
        RuntimeError::InvalidProgram { program: self.p.name.clone(), step: self.step, message }
    }

    fn name(&self, b: BufferId) -> String {
        match self.p.buffers.get(b.index()).and_then(|x| x.name.as_deref()) {
            Some(n) => format!("%{} (%{n})", b.0),
            None => format!("%{}", b.0),
        }
    }

    fn ty(&self, b: BufferId) -> Result<&'p TensorType, RuntimeError> {
        self.p
            .buffers
            .get(b.index())
            .map(|x| &x.ty)
            .ok_or_else(|| self.err(format!("buffer %{} does not exist ({} buffers)", b.0, self.p.buffers.len())))
    }

    fn use_(&self, b: BufferId) -> Result<&'p TensorType, RuntimeError> {
        let ty = self.ty(b)?;
        match self.state[b.index()] {
            Liveness::Live => Ok(ty),
            Liveness::Undefined => Err(self.err(format!("buffer {} is used before it is defined", self.name(b)))),
            Liveness::Freed => Err(self.err(format!("buffer {} is used after it was freed", self.name(b)))),
        }
    }

    fn define(&mut self, b: BufferId) -> Result<(), RuntimeError> {
        let bytes = self.ty(b)?.size_bytes();
        if self.state[b.index()] != Liveness::Undefined {
            return Err(self.err(format!("buffer {} is defined twice", self.name(b))));
        }
        self.state[b.index()] = Liveness::Live;
        self.live_bytes += bytes;
        self.peak = self.peak.max(self.live_bytes);
        Ok(())
    }

    fn free(&mut self, b: BufferId) -> Result<(), RuntimeError> {
        let bytes = self.use_(b)?.size_bytes();
        self.state[b.index()] = Liveness::Freed;
        self.live_bytes -= bytes;
        Ok(())
    }

    fn axes(&self, axes: &[String]) -> Result<usize, RuntimeError> {
        for (i, a) in axes.iter().enumerate() {
            if self.p.axis_size(a).is_none() {
                return Err(self.err(format!("unknown mesh axis `{a}`")));
            }
            if axes[..i].contains(a) {
                return Err(self.err(format!("mesh axis `{a}` is listed twice")));
            }
        }
        Ok(group_size(self.p, axes))
    }

    fn expect_type(&self, b: BufferId, want: &TensorType, what: &str) -> Result<(), RuntimeError> {
        let have = self.ty(b)?;
        if have != want {
            return Err(self.err(format!("{what}: buffer {} is {have}, expected {want}", self.name(b))));
        }
        Ok(())
    }

    fn step(&mut self, s: &Step) -> Result<(), RuntimeError> {
        match s {
            Step::Compute { op, inputs, outputs } => {
                if let Op::Call { callee, .. } = op {
                    return Err(self.err(format!("`call @{callee}` cannot run on a device (inline it first)")));
                }
                let tys: Vec<&TensorType> = inputs.iter().map(|&b| self.use_(b)).collect::<Result<_, _>>()?;
                let want = infer(op, &tys, &NoFunctions).map_err(|m| self.err(format!("`{}`: {m}", op.name())))?;
                if want.len() != outputs.len() {
                    return Err(self.err(format!("`{}` has {} results, not {}", op.name(), want.len(), outputs.len())));
                }
                for (&o, t) in outputs.iter().zip(&want) {
                    self.expect_type(o, t, op.name())?;
                    self.define(o)?;
                }
            }
            Step::ShardSlice { input, output, dims } => {
                let ty = self.use_(*input)?;
                if dims.len() != ty.rank() {
                    return Err(self.err(format!("shard_slice of {ty} lists axes for {} dimensions", dims.len())));
                }
                let mut all: Vec<String> = Vec::new();
                let mut shape = Vec::with_capacity(ty.rank());
                for (d, axes) in dims.iter().enumerate() {
                    let n = self.axes(axes)?;
                    all.extend(axes.iter().cloned());
                    if ty.shape[d] % n != 0 {
                        return Err(self.err(format!("shard_slice: dimension {d} of {ty} is not divisible by {n}")));
                    }
                    shape.push(ty.shape[d] / n);
                }
                self.axes(&all)?;
                self.expect_type(*output, &TensorType::new(ty.dtype, shape), "shard_slice")?;
                self.define(*output)?;
            }
            Step::Collective { op, input, output } => {
                let ty = self.use_(*input)?.clone();
                let want = self.collective_type(op, &ty)?;
                self.expect_type(*output, &want, op.name())?;
                self.define(*output)?;
            }
            Step::Free(bs) => {
                for &b in bs {
                    self.free(b)?;
                }
            }
        }
        Ok(())
    }

    fn collective_type(&self, op: &Collective, ty: &TensorType) -> Result<TensorType, RuntimeError> {
        let name = op.name();
        let dim_ok = |d: usize| {
            if d < ty.rank() {
                Ok(())
            } else {
                Err(self.err(format!("{name}: dimension {d} is out of range for {ty}")))
            }
        };
        let divides = |d: usize, n: usize| {
            if ty.shape[d] % n == 0 {
                Ok(())
            } else {
                Err(self.err(format!("{name}: dimension {d} of {ty} is not divisible by the group size {n}")))
            }
        };
        let mut out = ty.clone();
        match op {
            Collective::AllGather { dim, axes } => {
                let n = self.axes(axes)?;
                dim_ok(*dim)?;
                out.shape[*dim] *= n;
            }
            Collective::AllReduce { axes, .. } => {
                self.axes(axes)?;
            }
            Collective::ReduceScatter { dim, axes, .. } => {
                let n = self.axes(axes)?;
                dim_ok(*dim)?;
                divides(*dim, n)?;
                out.shape[*dim] /= n;
            }
            Collective::AllToAll { split_dim, concat_dim, axes } => {
                let n = self.axes(axes)?;
                dim_ok(*split_dim)?;
                dim_ok(*concat_dim)?;
                divides(*split_dim, n)?;
                out.shape[*split_dim] /= n;
                out.shape[*concat_dim] *= n;
            }
            Collective::CollectivePermute { pairs } => {
                let n = self.p.num_devices() as u32;
                for (i, &(s, t)) in pairs.iter().enumerate() {
                    if s >= n || t >= n {
                        return Err(self.err(format!("{name}: pair ({s}, {t}) names a device outside 0..{n}")));
                    }
                    if pairs[..i].iter().any(|&(s2, t2)| s2 == s || t2 == t) {
                        return Err(self.err(format!("{name}: device {s} or {t} appears in two pairs")));
                    }
                }
            }
        }
        if matches!(op, Collective::AllReduce { .. } | Collective::ReduceScatter { .. }) && ty.dtype.is_bool() {
            return Err(self.err(format!("{name} cannot reduce bool buffers")));
        }
        Ok(out)
    }
}

/// Verifies `program` (see the module documentation) and returns what the
/// walk learned.
pub fn verify_program(program: &DeviceProgram) -> Result<ProgramInfo, RuntimeError> {
    let mut w = Walk {
        p: program,
        state: vec![Liveness::Undefined; program.buffers.len()],
        live_bytes: 0,
        peak: 0,
        step: None,
    };
    for (i, (a, n)) in program.mesh.iter().enumerate() {
        if *n == 0 {
            return Err(w.err(format!("mesh axis `{a}` has size 0")));
        }
        if program.mesh[..i].iter().any(|(b, _)| b == a) {
            return Err(w.err(format!("mesh axis `{a}` appears twice")));
        }
    }
    for &b in &program.inputs {
        w.define(b)?;
    }
    for (i, s) in program.steps.iter().enumerate() {
        w.step = Some(i);
        w.step(s)?;
    }
    w.step = None;
    for &b in &program.outputs {
        w.use_(b).map_err(|_| w.err(format!("output buffer {} is not live at the end", w.name(b))))?;
    }
    Ok(ProgramInfo { peak_live_bytes: w.peak })
}

//! Why each value is sharded the way it is, and what that looks like.
//!
//! Propagation records, per value dimension, where its axes came from
//! ([`Origin`]): an annotation (with its source position when the program
//! came from text), or an instruction it came through, from which value,
//! forward (operand to result) or backward (result or sibling operand to
//! operand). [`explain_chain`] follows these back to the annotations and
//! prints the chain; [`Resolution`] records every conflict propagation had
//! to settle and why. [`render_grid`] draws which devices hold which block,
//! like `jax.debug.visualize_array_sharding`.

use super::mesh::Mesh;
use super::spec::{fmt_sharding, MeshSharding};
use crate::error::{CompilerError, Result};
use std::collections::BTreeSet;
use std::fmt;
use weft_ir::{Function, InstId, Loc, TensorSharding, TensorType, ValueId};

/// What kind of annotation a sharding came from.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum AnnotationKind {
    /// The sharding of parameter `i`.
    Param(usize),
    /// The requested sharding of function result `i`.
    Result(usize),
    /// An annotation on an instruction result.
    Value,
    /// A `sharding_constraint` instruction.
    Constraint,
    /// A `reshard` instruction written in the program.
    Reshard,
}

/// An annotation and where it was written.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct Annotation {
    /// What kind.
    pub kind: AnnotationKind,
    /// Source position, when the program came from text.
    pub loc: Option<Loc>,
}

/// Where the axes of one dimension of a value came from.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Origin {
    /// Nothing reached it: the dimension is not split.
    None,
    /// An annotation gave it.
    Annotation(Annotation),
    /// It came through instruction `inst` from its operand `from`.
    Forward {
        /// The instruction (index in the original function).
        inst: InstId,
        /// The operand it came from.
        from: ValueId,
    },
    /// It came through instruction `inst` to one of its operands, from the
    /// result or another operand `from`.
    Backward {
        /// The instruction (index in the original function).
        inst: InstId,
        /// The value it came from.
        from: ValueId,
    },
}

/// One step of an explanation: some dimensions of a value and their origin.
#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    /// The value (original function).
    pub value: ValueId,
    /// How the value is written (`%x`, `%3`).
    pub name: String,
    /// Its final sharding.
    pub sharding: TensorSharding,
    /// Which dimensions this step explains (empty: the whole value).
    pub dims: Vec<usize>,
    /// Where they came from.
    pub origin: Origin,
    /// Human-readable description of the origin.
    pub detail: String,
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.name, fmt_sharding(&self.sharding))?;
        if !self.dims.is_empty() && self.dims.len() < self.sharding.rank() {
            let d: Vec<String> = self.dims.iter().map(|d| d.to_string()).collect();
            write!(f, " (dim {})", d.join(", "))?;
        }
        write!(f, " <- {}", self.detail)
    }
}

/// A conflict propagation or reshard insertion settled, and how.
#[derive(Clone, Debug, PartialEq)]
pub struct Resolution {
    /// The instruction where the shardings met (original function).
    pub inst: InstId,
    /// The instruction's rule, in Shardy notation.
    pub rule: String,
    /// The factor concerned (Shardy name).
    pub factor: String,
    /// The value whose sharding was kept, and its axes for the factor.
    pub chosen: (ValueId, Vec<String>),
    /// The value whose sharding lost, and its axes for the factor.
    pub rejected: (ValueId, Vec<String>),
    /// Why (priority, annotation over propagated, communication, tie-break).
    pub reason: String,
    /// True when both sides come from user annotations on parameters or
    /// results (what [`super::ConflictPolicy::Error`] rejects).
    pub user_conflict: bool,
}

impl fmt::Display for Resolution {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "inst{} {}: factor {} takes {{{}}} from {} over {{{}}} from {}: {}",
            self.inst.0,
            self.rule,
            self.factor,
            self.chosen.1.join(", "),
            self.chosen.0,
            self.rejected.1.join(", "),
            self.rejected.0,
            self.reason
        )
    }
}

/// Describes an origin in words, naming values as `f` writes them.
pub fn describe(f: &Function, o: &Origin) -> String {
    let at = |loc: Option<Loc>| loc.map(|l| format!(" at {l}")).unwrap_or_default();
    let inst = |i: InstId| weft_ir::verify::inst_subject(f, i);
    match *o {
        Origin::None => "no annotation reaches it: not split".into(),
        Origin::Annotation(a) => match a.kind {
            AnnotationKind::Param(i) => format!("user annotation on parameter {i}{}", at(a.loc)),
            AnnotationKind::Result(i) => format!("user annotation on result {i}{}", at(a.loc)),
            AnnotationKind::Value => format!("annotation on the instruction result{}", at(a.loc)),
            AnnotationKind::Constraint => format!("sharding_constraint{}", at(a.loc)),
            AnnotationKind::Reshard => format!("explicit reshard{}", at(a.loc)),
        },
        Origin::Forward { inst: i, from } => format!("forward through {} from {}", inst(i), f.value_ref(from)),
        Origin::Backward { inst: i, from } => format!("backward through {} from {}", inst(i), f.value_ref(from)),
    }
}

/// The chain of steps explaining value `v` of `f`, from the annotations it
/// derives from to `v` itself. `origins[v]` holds the per-dimension origins
/// and `shardings[v]` the final sharding of each value.
pub fn explain_chain(f: &Function, origins: &[Vec<Origin>], shardings: &[TensorSharding], v: ValueId) -> Vec<Step> {
    let mut out = Vec::new();
    let mut seen = BTreeSet::new();
    visit(f, origins, shardings, v, &mut seen, &mut out);
    out
}

fn visit(
    f: &Function,
    origins: &[Vec<Origin>],
    shardings: &[TensorSharding],
    v: ValueId,
    seen: &mut BTreeSet<ValueId>,
    out: &mut Vec<Step>,
) {
    if !seen.insert(v) {
        return;
    }
    let os = &origins[v.index()];
    let mut groups: Vec<(Origin, Vec<usize>)> = Vec::new();
    for (d, o) in os.iter().enumerate() {
        if *o == Origin::None {
            continue;
        }
        match groups.iter_mut().find(|(g, _)| g == o) {
            Some((_, ds)) => ds.push(d),
            None => groups.push((*o, vec![d])),
        }
    }
    if groups.is_empty() {
        out.push(step(f, shardings, v, vec![], Origin::None));
        return;
    }
    for (o, dims) in groups {
        if let Origin::Forward { from, .. } | Origin::Backward { from, .. } = o {
            visit(f, origins, shardings, from, seen, out);
        }
        out.push(step(f, shardings, v, dims, o));
    }
}

fn step(f: &Function, shardings: &[TensorSharding], v: ValueId, dims: Vec<usize>, origin: Origin) -> Step {
    Step {
        value: v,
        name: f.value_ref(v),
        sharding: shardings[v.index()].clone(),
        dims,
        origin,
        detail: describe(f, &origin),
    }
}

/// Draws which devices hold which block of a rank-0, 1 or 2 tensor of type
/// `ty` sharded by `s` on `mesh`: one cell per block (rows: dimension 0,
/// columns: dimension 1) listing the device ids that hold it, with the
/// block's index ranges. Unreduced axes are noted below the table.
pub fn render_grid(ty: &TensorType, s: &MeshSharding, mesh: &Mesh) -> Result<String> {
    if ty.rank() > 2 {
        return Err(CompilerError::Unsupported(format!("can only draw rank 0-2 tensors, got {ty}")));
    }
    let blocks: Vec<usize> = (0..ty.rank()).map(|d| s.num_blocks(d, mesh)).collect();
    let (rows, cols) = (blocks.first().copied().unwrap_or(1), blocks.get(1).copied().unwrap_or(1));
    let local = s.local_shape(&ty.shape, mesh);
    let mut cells = vec![vec![Vec::new(); cols]; rows];
    for (pos, &dev) in mesh.devices().iter().enumerate() {
        let b = s.block_index(mesh, &mesh.coords_of_position(pos));
        cells[b.first().copied().unwrap_or(0)][b.get(1).copied().unwrap_or(0)].push(dev);
    }
    let range = |d: usize, b: usize| format!("{}:{}", b * local[d], (b + 1) * local[d]);
    let text: Vec<Vec<String>> = (0..rows)
        .map(|r| {
            (0..cols)
                .map(|c| {
                    let mut devs = cells[r][c].clone();
                    devs.sort_unstable();
                    let ids: Vec<String> = devs.iter().map(|d| d.to_string()).collect();
                    let idx = match ty.rank() {
                        0 => String::new(),
                        1 => format!(" [{}]", range(0, r)),
                        _ => format!(" [{}, {}]", range(0, r), range(1, c)),
                    };
                    format!("dev {}{idx}", ids.join(","))
                })
                .collect()
        })
        .collect();
    let width = text.iter().flatten().map(|t| t.len()).max().unwrap_or(0) + 2;
    let rule = format!("+{}\n", vec!["-".repeat(width); cols].join("+") + "+");
    let mut out = format!("{ty} {}\n", fmt_sharding(&s.to_ir(mesh)));
    out.push_str(&rule);
    for row in &text {
        out.push('|');
        for cell in row {
            out.push_str(&format!(" {cell:<w$}|", w = width - 1));
        }
        out.push('\n');
        out.push_str(&rule);
    }
    if !s.unreduced.is_empty() {
        let names: Vec<&str> = s.unreduced.iter().map(|&a| mesh.name(a)).collect();
        out.push_str(&format!("devices along {{{}}} hold partial sums of each block\n", names.join(", ")));
    }
    Ok(out)
}

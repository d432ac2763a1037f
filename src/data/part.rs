//! The part of each step's global batch that one process reads.
//!
//! A process reads only what its devices consume: in a data-parallel run
//! the rows of its devices' blocks, in a pipeline whose stages run on
//! processes also only the inputs of its stages (the first stage's
//! `tokens`, the last stage's `targets`; a middle stage reads nothing),
//! and, as a stage's microbatches are cut from the global batch, rows in
//! several ranges. The executor says which part it needs
//! (`Executor::batch_part`), the reader reads just that
//! ([`super::Split::part`]) and the executor places it
//! (`Executor::step_part`).

use crate::error::{Error, Result};
use std::collections::BTreeSet;
use std::fmt;
use std::ops::Range;
use weft_ir::tensor::HostTensor;

/// Rows and inputs of a global batch: what one process reads of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchPart {
    /// Rows of the global batch: increasing, disjoint, not adjacent and
    /// not empty ([`BatchPart::new`] makes them so). The part's tensors
    /// hold these rows one range after another.
    rows: Vec<Range<usize>>,
    /// The batch inputs read, by name; `None`: every input.
    inputs: Option<BTreeSet<String>>,
}

impl BatchPart {
    /// Rows `rows` (in any order; overlapping and adjacent ranges are
    /// merged) of the inputs `inputs` (`None`: every input).
    pub fn new(rows: impl IntoIterator<Item = Range<usize>>, inputs: Option<BTreeSet<String>>) -> BatchPart {
        let mut sorted: Vec<Range<usize>> = rows.into_iter().filter(|r| !r.is_empty()).collect();
        sorted.sort_by_key(|r| (r.start, r.end));
        let mut merged: Vec<Range<usize>> = Vec::with_capacity(sorted.len());
        for r in sorted {
            match merged.last_mut() {
                Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
                _ => merged.push(r),
            }
        }
        BatchPart { rows: merged, inputs }
    }

    /// Every input's rows `rows`.
    pub fn rows(rows: Range<usize>) -> BatchPart {
        BatchPart::new([rows], None)
    }

    /// The whole batch of `rows` rows.
    pub fn whole(rows: usize) -> BatchPart {
        BatchPart::rows(0..rows)
    }

    /// The row ranges, in order.
    pub fn ranges(&self) -> &[Range<usize>] {
        &self.rows
    }

    /// Whether input `name` is read.
    pub fn reads(&self, name: &str) -> bool {
        self.inputs.as_ref().is_none_or(|s| s.contains(name))
    }

    /// Rows in the part.
    pub fn len(&self) -> usize {
        self.rows.iter().map(|r| r.len()).sum()
    }

    /// Whether nothing is read (no row, or no input).
    pub fn is_empty(&self) -> bool {
        self.len() == 0 || self.inputs.as_ref().is_some_and(|s| s.is_empty())
    }

    /// Whether it is every input's one range of rows, and which.
    pub fn single(&self) -> Option<Range<usize>> {
        match (&self.rows[..], &self.inputs) {
            ([r], None) => Some(r.clone()),
            ([], None) => Some(0..0),
            _ => None,
        }
    }

    /// Whether it is every row (of `rows`) of every input.
    pub fn is_whole(&self, rows: usize) -> bool {
        self.single() == Some(0..rows)
    }

    /// `t` (this part's rows of one input) as that input's whole tensor
    /// of `rows` rows: each of its rows at its place, zeros in the rows the
    /// part does not read (for an executor whose devices never read them).
    pub fn spread(&self, t: &HostTensor, rows: usize) -> Result<HostTensor> {
        let ty = t.ty();
        let len = self.len();
        if ty.shape.first() != Some(&len) || self.rows.last().is_some_and(|r| r.end > rows) {
            return Err(Error::Usage(format!("{self} of a batch of {rows} rows cannot hold a tensor {ty}")));
        }
        let bytes = t.to_bytes_le();
        let row = bytes.len().checked_div(len).unwrap_or(0);
        let mut whole = vec![0u8; row * rows];
        let mut at = 0;
        for r in &self.rows {
            whole[r.start * row..r.end * row].copy_from_slice(&bytes[at..at + r.len() * row]);
            at += r.len() * row;
        }
        let mut shape = ty.shape.clone();
        shape[0] = rows;
        Ok(HostTensor::from_bytes_le(&weft_ir::TensorType::new(ty.dtype, shape), &whole)?)
    }
}

impl fmt::Display for BatchPart {
    /// `rows 0..4`, `rows 0..1, 2..3 (tokens)`, `nothing`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            return write!(f, "nothing");
        }
        let rows: Vec<String> = self.rows.iter().map(|r| format!("{}..{}", r.start, r.end)).collect();
        write!(f, "rows {}", rows.join(", "))?;
        if let Some(s) = &self.inputs {
            write!(f, " ({})", s.iter().cloned().collect::<Vec<_>>().join(", "))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_sorted_and_merged() {
        let p = BatchPart::new([6..7, 0..1, 2..3, 3..4, 4..4], Some(["tokens".to_string()].into()));
        assert_eq!(p.ranges(), &[0..1, 2..4, 6..7]);
        assert_eq!(p.len(), 4);
        assert!(p.reads("tokens") && !p.reads("targets"));
        assert_eq!(p.to_string(), "rows 0..1, 2..4, 6..7 (tokens)");
        assert_eq!(p.single(), None);
        let whole = BatchPart::whole(8);
        assert!(whole.is_whole(8) && !whole.is_whole(4) && whole.reads("anything"));
        assert_eq!(whole.to_string(), "rows 0..8");
        let none = BatchPart::new(std::iter::once(0..8), Some(BTreeSet::new()));
        assert!(none.is_empty() && !none.is_whole(8));
        assert_eq!(none.to_string(), "nothing");
        assert_eq!(BatchPart::new([0..2, 1..5], None).single(), Some(0..5));
    }

    #[test]
    fn a_part_spreads_into_its_rows_of_the_whole_tensor() {
        let p = BatchPart::new([1..2, 3..5], None);
        let t = HostTensor::from_i32(&[3, 2], vec![1, 2, 3, 4, 5, 6]).unwrap();
        let whole = p.spread(&t, 5).unwrap();
        assert_eq!(whole.ty().shape, vec![5, 2]);
        assert_eq!(whole.to_f64_vec(), vec![0., 0., 1., 2., 0., 0., 3., 4., 5., 6.]);
        let err = p.spread(&t, 4).unwrap_err().to_string();
        assert!(err.contains("rows 1..2, 3..5 of a batch of 4 rows"), "{err}");
        assert!(BatchPart::rows(0..2).spread(&t, 5).is_err());
    }
}

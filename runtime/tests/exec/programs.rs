//! Builders of small device programs, and the expected results of
//! collectives computed directly from the contract (independently of the
//! runtime's `collective` module).

use weft_ir::device::{Buffer, BufferId, Collective, DeviceProgram, Step};
use weft_ir::tensor::HostTensor;
use weft_ir::{DType, TensorType};

pub fn mesh(axes: &[(&str, usize)]) -> weft_ir::mesh::MeshShape {
    weft_ir::mesh::MeshShape::new(axes)
}

pub fn f32s(shape: &[usize]) -> TensorType {
    TensorType::new(DType::F32, shape.to_vec())
}

/// A program of one collective: input %0, output %1, then %0 is freed.
pub fn one_collective(m: &[(&str, usize)], input: TensorType, op: Collective, output: TensorType) -> DeviceProgram {
    DeviceProgram {
        name: op.name().to_string(),
        mesh: mesh(m),
        buffers: vec![Buffer { ty: input, name: Some("x".into()) }, Buffer { ty: output, name: None }],
        inputs: vec![BufferId(0)],
        outputs: vec![BufferId(1)],
        steps: vec![Step::Collective { op, input: BufferId(0), output: BufferId(1) }, Step::Free(vec![BufferId(0)])],
    }
}

/// A row-major 2-D f32 matrix, for computing expectations by hand.
#[derive(Clone, Debug, PartialEq)]
pub struct Mat {
    pub rows: usize,
    pub cols: usize,
    pub v: Vec<f32>,
}

impl Mat {
    pub fn tensor(&self) -> HostTensor {
        HostTensor::from_f32(&[self.rows, self.cols], self.v.clone()).unwrap()
    }

    pub fn at(&self, r: usize, c: usize) -> f32 {
        self.v[r * self.cols + c]
    }

    /// Device `d`'s input: element (r, c) is `1000 d + 10 r + c`.
    pub fn input(d: usize, rows: usize, cols: usize) -> Mat {
        let v = (0..rows * cols).map(|i| (1000 * d + 10 * (i / cols) + i % cols) as f32).collect();
        Mat { rows, cols, v }
    }

    pub fn concat(ms: &[Mat], dim: usize) -> Mat {
        if dim == 0 {
            Mat {
                rows: ms.iter().map(|m| m.rows).sum(),
                cols: ms[0].cols,
                v: ms.iter().flat_map(|m| m.v.clone()).collect(),
            }
        } else {
            let cols = ms.iter().map(|m| m.cols).sum();
            let v = (0..ms[0].rows)
                .flat_map(|r| ms.iter().flat_map(move |m| (0..m.cols).map(move |c| m.at(r, c))))
                .collect();
            Mat { rows: ms[0].rows, cols, v }
        }
    }

    /// Block `i` of `n` along `dim`.
    pub fn block(&self, dim: usize, i: usize, n: usize) -> Mat {
        if dim == 0 {
            let rows = self.rows / n;
            Mat { rows, cols: self.cols, v: self.v[i * rows * self.cols..(i + 1) * rows * self.cols].to_vec() }
        } else {
            let cols = self.cols / n;
            let v = (0..self.rows)
                .flat_map(|r| (i * cols..(i + 1) * cols).map(move |c| (r, c)))
                .map(|(r, c)| self.at(r, c))
                .collect();
            Mat { rows: self.rows, cols, v }
        }
    }

    pub fn zip(&self, o: &Mat, f: impl Fn(f32, f32) -> f32) -> Mat {
        Mat { rows: self.rows, cols: self.cols, v: self.v.iter().zip(&o.v).map(|(&a, &b)| f(a, b)).collect() }
    }
}

/// Mesh coordinates of device `d` (row-major).
pub fn coords(m: &[(&str, usize)], d: usize) -> Vec<usize> {
    let mut rest = d;
    let mut c = vec![0; m.len()];
    for i in (0..m.len()).rev() {
        c[i] = rest % m[i].1;
        rest /= m[i].1;
    }
    c
}

/// The members of device `d`'s group over `axes`, in rank order: every
/// device agreeing with `d` on the other axes, ordered by its coordinates
/// along `axes` linearised in the order listed.
pub fn group_of(m: &[(&str, usize)], axes: &[&str], d: usize) -> Vec<usize> {
    let n: usize = m.iter().map(|a| a.1).product();
    let pos: Vec<usize> = axes.iter().map(|a| m.iter().position(|(b, _)| b == a).unwrap()).collect();
    let cd = coords(m, d);
    let mut members: Vec<(usize, usize)> = (0..n)
        .filter(|&e| {
            let ce = coords(m, e);
            (0..m.len()).all(|i| pos.contains(&i) || ce[i] == cd[i])
        })
        .map(|e| {
            let ce = coords(m, e);
            (pos.iter().fold(0, |r, &p| r * m[p].1 + ce[p]), e)
        })
        .collect();
    members.sort();
    members.into_iter().map(|(_, e)| e).collect()
}

/// Rank of `d` within its group over `axes`.
pub fn rank_of(m: &[(&str, usize)], axes: &[&str], d: usize) -> usize {
    group_of(m, axes, d).iter().position(|&e| e == d).unwrap()
}

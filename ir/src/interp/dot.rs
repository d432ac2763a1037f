//! `dot_general`.
//!
//! Both operands are transposed and reshaped to a batch of matrices,
//! `lhs: [B, M, K]` (batch dims, free dims, contracting dims) and
//! `rhs: [B, K, N]` (batch dims, contracting dims, free dims), multiplied per
//! batch, and the `[B, M, N]` product is reshaped to StableHLO's result order
//! (batch dims, lhs free dims, rhs free dims) - which needs no permutation
//! because M and N keep the operands' free dims in order.
//!
//! Floats use ndarray's `general_mat_mul` (the `matrixmultiply` crate):
//! `f32` accumulation for `f32`, `bf16` and `f16` operands (the half types
//! are widened exactly, and the result is rounded to nearest-even once),
//! `f64` for `f64`. Integers accumulate with wrapping arithmetic in a plain
//! loop, in increasing `k` order.

use crate::tensor::HostTensor;
use crate::DotDims;
use half::{bf16, f16};
use ndarray::{linalg::general_mat_mul, Array3, ArrayD, ArrayView3, Axis, IxDyn, LinalgScalar};

// The batched-matmul layout of one `dot_general` (see `MatmulLayout`).
use crate::MatmulLayout as Plan;

fn free_dims(rank: usize, batch: &[usize], contract: &[usize], side: &str) -> Result<(), String> {
    let mut used = vec![false; rank];
    for &d in batch.iter().chain(contract) {
        if d >= rank || std::mem::replace(&mut used[d], true) {
            return Err(format!("dot_general {side} dimension {d} is out of range or used twice"));
        }
    }
    Ok(())
}

impl Plan {
    /// The layout after checking the dimension numbers against the shapes
    /// (the interpreter may run ops outside a verified module).
    fn validated(ls: &[usize], rs: &[usize], dims: &DotDims) -> Result<Plan, String> {
        if dims.lhs_batch.len() != dims.rhs_batch.len() || dims.lhs_contract.len() != dims.rhs_contract.len() {
            return Err("dot_general needs paired batch and contracting dimensions".into());
        }
        free_dims(ls.len(), &dims.lhs_batch, &dims.lhs_contract, "lhs")?;
        free_dims(rs.len(), &dims.rhs_batch, &dims.rhs_contract, "rhs")?;
        let pairs = dims.lhs_batch.iter().zip(&dims.rhs_batch).chain(dims.lhs_contract.iter().zip(&dims.rhs_contract));
        for (&a, &b) in pairs {
            if ls[a] != rs[b] {
                return Err(format!(
                    "dot_general pairs lhs dimension {a} ({}) with rhs dimension {b} ({})",
                    ls[a], rs[b]
                ));
            }
        }
        Ok(dims.matmul_layout(ls, rs))
    }

    /// Runs `f` with both operands as standard-layout `[B, M, K]` and
    /// `[B, K, N]` views (copying only if the permutation requires it).
    fn with_operands<T: Clone, R>(
        &self,
        l: &ArrayD<T>,
        r: &ArrayD<T>,
        f: impl FnOnce(ArrayView3<'_, T>, ArrayView3<'_, T>) -> R,
    ) -> R {
        let lp = l.view().permuted_axes(IxDyn(&self.lhs_perm));
        let rp = r.view().permuted_axes(IxDyn(&self.rhs_perm));
        let (lc, rc) = (lp.as_standard_layout(), rp.as_standard_layout());
        let l3 = lc.view().into_shape_with_order((self.b, self.m, self.k)).expect("standard layout, same size");
        let r3 = rc.view().into_shape_with_order((self.b, self.k, self.n)).expect("standard layout, same size");
        f(l3, r3)
    }

    fn finish<T>(&self, out: Array3<T>) -> ArrayD<T> {
        out.into_shape_with_order(IxDyn(&self.out_shape)).expect("same size")
    }
}

fn float_dot<T: LinalgScalar>(p: &Plan, l: &ArrayD<T>, r: &ArrayD<T>) -> ArrayD<T> {
    let mut out = Array3::<T>::zeros((p.b, p.m, p.n));
    p.with_operands(l, r, |l3, r3| {
        for bi in 0..p.b {
            let mut o = out.index_axis_mut(Axis(0), bi);
            general_mat_mul(T::one(), &l3.index_axis(Axis(0), bi), &r3.index_axis(Axis(0), bi), T::zero(), &mut o);
        }
    });
    p.finish(out)
}

fn int_dot<T: Copy + Default>(p: &Plan, l: &ArrayD<T>, r: &ArrayD<T>, mul_add: impl Fn(T, T, T) -> T) -> ArrayD<T> {
    let mut out = vec![T::default(); p.b * p.m * p.n];
    p.with_operands(l, r, |l3, r3| {
        let (ls, rs) = (l3.as_slice().expect("standard layout"), r3.as_slice().expect("standard layout"));
        let (m, k, n) = (p.m, p.k, p.n);
        for bi in 0..p.b {
            for i in 0..m {
                let row = &mut out[(bi * m + i) * n..][..n];
                for kk in 0..k {
                    let x = ls[(bi * m + i) * k + kk];
                    let rrow = &rs[(bi * k + kk) * n..][..n];
                    for (o, &y) in row.iter_mut().zip(rrow) {
                        *o = mul_add(*o, x, y);
                    }
                }
            }
        }
    });
    p.finish(Array3::from_shape_vec((p.b, p.m, p.n), out).expect("sized above"))
}

/// General tensor contraction of two tensors of one dtype.
pub(crate) fn dot_general(l: &HostTensor, r: &HostTensor, dims: &DotDims) -> Result<HostTensor, String> {
    let p = Plan::validated(l.shape(), r.shape(), dims)?;
    Ok(match (l, r) {
        (HostTensor::F32(a), HostTensor::F32(b)) => HostTensor::F32(float_dot(&p, a, b)),
        (HostTensor::F64(a), HostTensor::F64(b)) => HostTensor::F64(float_dot(&p, a, b)),
        (HostTensor::BF16(a), HostTensor::BF16(b)) => {
            let out = float_dot(&p, &a.mapv(bf16::to_f32), &b.mapv(bf16::to_f32));
            HostTensor::BF16(out.mapv(bf16::from_f32))
        }
        (HostTensor::F16(a), HostTensor::F16(b)) => {
            let out = float_dot(&p, &a.mapv(f16::to_f32), &b.mapv(f16::to_f32));
            HostTensor::F16(out.mapv(f16::from_f32))
        }
        (HostTensor::I32(a), HostTensor::I32(b)) => {
            HostTensor::I32(int_dot(&p, a, b, |acc, x, y| acc.wrapping_add(x.wrapping_mul(y))))
        }
        (HostTensor::U32(a), HostTensor::U32(b)) => {
            HostTensor::U32(int_dot(&p, a, b, |acc, x, y| acc.wrapping_add(x.wrapping_mul(y))))
        }
        _ => return Err(format!("dot_general does not accept {} and {}", l.ty(), r.ty())),
    })
}

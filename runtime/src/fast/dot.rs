//! `dot_general` as strided GEMM calls, without rearranging the operands.
//!
//! The interpreter transposes both operands into `[B, M, K]` and `[B, K, N]`
//! copies before multiplying. Here each operand's permuted view is tested
//! for whether its free and contracting groups each collapse into a single
//! stride (they do for every transposed matrix product a training step
//! makes: `x @ w`, `x^T @ dy`, `dy @ w^T`); if so the GEMM reads the
//! operand in place through its row and column strides, each batch element
//! from its own offset. Only operands that do not collapse are copied to
//! standard layout first.
//!
//! The GEMM is `matrixmultiply` (chosen by measurement, BENCHMARKS.md), one
//! thread per call. When a process has fewer devices than cores, a device
//! may split a product over several threads (the backend's `threads`): whole batch
//! elements per thread when there are enough, else blocks of output rows.
//! Either way each output element is computed by one call, over the whole
//! contraction in `matrixmultiply`'s order for that `k`, so the results are
//! bitwise those of one thread (tested). Its summation order is fixed for
//! given extents, so results are reproducible run to run.

use super::halves::{narrow, widen};
use super::pool::Pool;
use crate::strided::collapse;
use ndarray::{ArrayD, ArrayViewD, IxDyn};
use weft_ir::tensor::HostTensor;
use weft_ir::{DotDims, MatmulLayout};

/// An operand as a GEMM reads it: where each batch element starts (in the
/// row-major order of the batch dimensions, which need not collapse: the
/// chunk index of a mesh-invariant contraction leads the batch dimensions
/// but is the operand's minor one), then the row and column strides.
struct Strided3 {
    batch: Vec<isize>,
    strides: [isize; 2],
}

/// The offset of every batch element, row-major over the batch dims.
fn batch_offsets(shape: &[usize], strides: &[isize]) -> Vec<isize> {
    let mut offsets = vec![0isize];
    for (&n, &s) in shape.iter().zip(strides) {
        offsets = offsets.iter().flat_map(|&o| (0..n).map(move |i| o + i as isize * s)).collect();
    }
    offsets
}

fn strided(view: &ArrayViewD<'_, impl Sized>, groups: [usize; 3]) -> Option<Strided3> {
    let (shape, strides) = (view.shape(), view.strides());
    let b = collapse(shape, strides, groups[0]..groups[0] + groups[1])?;
    let c = collapse(shape, strides, groups[0] + groups[1]..shape.len())?;
    Some(Strided3 { batch: batch_offsets(&shape[..groups[0]], &strides[..groups[0]]), strides: [b, c] })
}

/// Runs the batched GEMM `out[b] = lhs[b] @ rhs[b]` for one float type.
trait Gemm: Copy + Default + 'static {
    /// `c = a @ b` for an `m x k` and a `k x n` matrix given by pointers and strides.
    ///
    /// # Safety
    /// The pointers and strides must address valid `m x k`, `k x n` and `m x n` matrices.
    #[allow(clippy::too_many_arguments)]
    unsafe fn gemm(
        m: usize,
        k: usize,
        n: usize,
        a: *const Self,
        ra: isize,
        ca: isize,
        b: *const Self,
        rb: isize,
        cb: isize,
        c: *mut Self,
        rc: isize,
    );
}

impl Gemm for f32 {
    unsafe fn gemm(
        m: usize,
        k: usize,
        n: usize,
        a: *const f32,
        ra: isize,
        ca: isize,
        b: *const f32,
        rb: isize,
        cb: isize,
        c: *mut f32,
        rc: isize,
    ) {
        matrixmultiply::sgemm(m, k, n, 1.0, a, ra, ca, b, rb, cb, 0.0, c, rc, 1)
    }
}

impl Gemm for f64 {
    unsafe fn gemm(
        m: usize,
        k: usize,
        n: usize,
        a: *const f64,
        ra: isize,
        ca: isize,
        b: *const f64,
        rb: isize,
        cb: isize,
        c: *mut f64,
        rc: isize,
    ) {
        matrixmultiply::dgemm(m, k, n, 1.0, a, ra, ca, b, rb, cb, 0.0, c, rc, 1)
    }
}

/// A raw pointer shared by the threads of one product (each writes its own
/// output rows).
#[derive(Copy, Clone)]
struct Ptr<T>(*mut T);
// SAFETY: the threads of a product read the operands and write disjoint
// rows of the output, which outlives them (`std::thread::scope`).
unsafe impl<T> Send for Ptr<T> {}
unsafe impl<T> Sync for Ptr<T> {}

impl<T> Ptr<T> {
    /// The pointer (a method, so that closures capture the whole `Ptr`).
    fn get(self) -> *mut T {
        self.0
    }
}

/// The fewest multiply-adds a thread of a split product gets (below that,
/// starting it costs more than it saves).
const MIN_WORK_PER_THREAD: usize = 1 << 20;

/// Threads for a `[b, m, k] x [b, k, n]` product given `threads` (at most
/// one per [`MIN_WORK_PER_THREAD`] multiply-adds; row blocks of at least 16
/// rows when the batch is smaller than the thread count).
fn split_threads(threads: usize, b: usize, m: usize, k: usize, n: usize) -> usize {
    let work = b.saturating_mul(m).saturating_mul(k).saturating_mul(n);
    let t = threads.min(work / MIN_WORK_PER_THREAD).max(1);
    if b >= t {
        t
    } else {
        t.min(m / 16).max(1)
    }
}

fn batched<T: Gemm + Send + Sync>(
    p: &MatmulLayout,
    dims: &DotDims,
    l: &ArrayD<T>,
    r: &ArrayD<T>,
    mut out: Vec<T>,
    threads: usize,
) -> ArrayD<T> {
    let nb = dims.lhs_batch.len();
    let lv = l.view().permuted_axes(IxDyn(&p.lhs_perm));
    let rv = r.view().permuted_axes(IxDyn(&p.rhs_perm));
    let lfree = lv.ndim() - nb - dims.lhs_contract.len();
    let rfree = rv.ndim() - nb - dims.rhs_contract.len();
    // Views that do not collapse are copied to standard layout (which always does).
    let lc;
    let (lv, ls) = match strided(&lv, [nb, lfree, dims.lhs_contract.len()]) {
        Some(s) => (lv, s),
        None => {
            lc = lv.as_standard_layout().into_owned();
            let v = lc.view();
            let s = strided(&v, [nb, lfree, dims.lhs_contract.len()]).expect("standard layout collapses");
            (v, s)
        }
    };
    let rc;
    let (rv, rs) = match strided(&rv, [nb, dims.rhs_contract.len(), rfree]) {
        Some(s) => (rv, s),
        None => {
            rc = rv.as_standard_layout().into_owned();
            let v = rc.view();
            let s = strided(&v, [nb, dims.rhs_contract.len(), rfree]).expect("standard layout collapses");
            (v, s)
        }
    };
    if p.k == 0 {
        out.fill(T::default());
    }
    if p.m * p.n > 0 && p.k > 0 {
        let (a0, b0, c0) = (Ptr(lv.as_ptr() as *mut T), Ptr(rv.as_ptr() as *mut T), Ptr(out.as_mut_ptr()));
        // One call: rows `rows` of batch element `bi`.
        let call = |bi: usize, rows: std::ops::Range<usize>| {
            // SAFETY: the views' strides address their own elements; batch
            // `bi` of each operand starts at its offset in `batch`, and row
            // `r` of the lhs and of the output at `r` row strides further.
            // Calls for distinct (batch, rows) write disjoint output rows.
            unsafe {
                let a = a0.get().offset(ls.batch[bi] + rows.start as isize * ls.strides[0]);
                let b = b0.get().offset(rs.batch[bi]);
                let c = c0.get().add(bi * p.m * p.n + rows.start * p.n);
                T::gemm(
                    rows.len(),
                    p.k,
                    p.n,
                    a,
                    ls.strides[0],
                    ls.strides[1],
                    b,
                    rs.strides[0],
                    rs.strides[1],
                    c,
                    p.n as isize,
                );
            }
        };
        let t = split_threads(threads, p.b, p.m, p.k, p.n);
        // Thread `j`'s piece: a run of whole batch elements when there are
        // enough, else a block of rows of every element.
        let piece = |j: usize| {
            if p.b >= t {
                (p.b * j / t..p.b * (j + 1) / t, 0..p.m)
            } else {
                (0..p.b, p.m * j / t..p.m * (j + 1) / t)
            }
        };
        let run = |j: usize| {
            let (batches, rows) = piece(j);
            batches.for_each(|bi| call(bi, rows.clone()));
        };
        if t <= 1 {
            run(0);
        } else {
            std::thread::scope(|s| {
                for j in 0..t {
                    let run = &run;
                    s.spawn(move || run(j));
                }
            });
        }
    }
    ArrayD::from_shape_vec(IxDyn(&p.out_shape), out).expect("sized from the layout")
}

/// `dot_general` of two float tensors, or `None` for the other dtypes (the
/// caller falls back to the interpreter). `bf16`/`f16` are widened to `f32`
/// and the result rounded once, as the interpreter does.
pub(crate) fn dot_general(
    l: &HostTensor,
    r: &HostTensor,
    dims: &DotDims,
    pool: &mut Pool,
    threads: usize,
) -> Option<HostTensor> {
    let p = dims.matmul_layout(l.shape(), r.shape());
    let len = p.b * p.m * p.n;
    Some(match (l, r) {
        (HostTensor::F32(a), HostTensor::F32(b)) => HostTensor::F32(batched(&p, dims, a, b, pool.take(len), threads)),
        (HostTensor::F64(a), HostTensor::F64(b)) => HostTensor::F64(batched(&p, dims, a, b, vec![0.0; len], threads)),
        (HostTensor::BF16(_), HostTensor::BF16(_)) | (HostTensor::F16(_), HostTensor::F16(_)) => {
            let (a, b) = (widen(l, pool)?, widen(r, pool)?);
            let out = batched(&p, dims, &a, &b, pool.take(len), threads);
            pool.give(HostTensor::F32(a));
            pool.give(HostTensor::F32(b));
            narrow(out, l.dtype(), pool)
        }
        _ => return None,
    })
}

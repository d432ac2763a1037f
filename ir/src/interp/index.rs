//! The indexing ops' kernels: `gather`, `scatter_add`, `cumsum`, `top_k`
//! (their semantics are in [`crate::indexing`]).
//!
//! Each works on the operand in row-major standard layout, viewed as a few
//! flat extents (`[batch, pre, axis, post]` for gather and scatter), so the
//! inner loops copy or add whole contiguous rows. Sums are folds in a fixed
//! order (increasing index position for `scatter_add`, along the dimension
//! for `cumsum`) in the accumulation type of `reduce_sum`: `f32` for
//! `f32`/`bf16`/`f16`, `f64` for `f64`, wrapping integers.

use crate::indexing::IndexOp;
use crate::tensor::{Element, HostTensor};
use half::{bf16, f16};
use ndarray::{ArrayD, IxDyn};

/// A number type and how `reduce_sum` accumulates it: `f32` for
/// `f32`/`bf16`/`f16`, `f64` for `f64`, wrapping integers.
trait Summand: Copy {
    /// The accumulator.
    type Acc: Copy;
    const ZERO: Self::Acc;
    fn widen(self) -> Self::Acc;
    fn add(a: Self::Acc, b: Self::Acc) -> Self::Acc;
    fn round(a: Self::Acc) -> Self;
}

macro_rules! summand {
    ($T:ty, $A:ty, $zero:expr, |$x:ident| $widen:expr, |$a:ident, $b:ident| $add:expr, |$r:ident| $round:expr) => {
        impl Summand for $T {
            type Acc = $A;
            const ZERO: $A = $zero;
            fn widen(self) -> $A {
                let $x = self;
                $widen
            }
            fn add($a: $A, $b: $A) -> $A {
                $add
            }
            fn round($r: $A) -> $T {
                $round
            }
        }
    };
}

summand!(f32, f32, 0.0, |x| x, |a, b| a + b, |r| r);
summand!(f64, f64, 0.0, |x| x, |a, b| a + b, |r| r);
summand!(bf16, f32, 0.0, |x| x.to_f32(), |a, b| a + b, |r| bf16::from_f32(r));
summand!(f16, f32, 0.0, |x| x.to_f32(), |a, b| a + b, |r| f16::from_f32(r));
summand!(i32, i32, 0, |x| x, |a, b| a.wrapping_add(b), |r| r);
summand!(u32, u32, 0, |x| x, |a, b| a.wrapping_add(b), |r| r);

/// Evaluates `$body` with `$a` bound to the typed array of a number tensor
/// (its [`Summand`] type), wrapping the result back; bool is an error.
macro_rules! summed {
    ($t:expr, $what:expr, $a:ident => $body:expr) => {
        match $t {
            HostTensor::F32($a) => HostTensor::F32($body),
            HostTensor::F64($a) => HostTensor::F64($body),
            HostTensor::BF16($a) => HostTensor::BF16($body),
            HostTensor::F16($a) => HostTensor::F16($body),
            HostTensor::I32($a) => HostTensor::I32($body),
            HostTensor::U32($a) => HostTensor::U32($body),
            HostTensor::Bool(_) => return Err(format!("`{}` does not accept bool", $what)),
        }
    };
}

/// Evaluates an indexing op on operands already checked by
/// [`IndexOp::infer`].
pub(crate) fn eval(op: &IndexOp, xs: &[&HostTensor]) -> Result<HostTensor, String> {
    let tys: Vec<crate::TensorType> = xs.iter().map(|t| t.ty()).collect();
    let out = op.infer(&tys.iter().collect::<Vec<_>>())?.shape;
    let flat = match *op {
        IndexOp::Gather { axis, batch_dims } => {
            let idx = indices(xs[1])?;
            let g = Geometry::new(xs[0].shape(), xs[1].shape(), axis, batch_dims);
            crate::tensor::map_variant!(xs[0], a => gather(a, &idx, &g))
        }
        IndexOp::ScatterAdd { axis, batch_dims, .. } => {
            let idx = indices(xs[0])?;
            // The result is the gathered-from tensor.
            let g = Geometry::new(&out, xs[0].shape(), axis, batch_dims);
            summed!(xs[1], "scatter_add", u => scatter(u, &idx, &g))
        }
        IndexOp::Cumsum { dim, reverse } => summed!(xs[0], "cumsum", a => cumsum(a, dim, reverse)),
        IndexOp::TopK { k } => crate::tensor::for_each_variant!(xs[0], a => HostTensor::I32(top_k(a, k))),
    };
    Ok(crate::tensor::map_variant!(flat, a => a.into_shape_with_order(IxDyn(&out)).expect("sized by infer")))
}

/// The indices as `i64` (any integer dtype), row-major.
fn indices(t: &HostTensor) -> Result<Vec<i64>, String> {
    match t {
        HostTensor::I32(a) => Ok(a.iter().map(|&v| v as i64).collect()),
        HostTensor::U32(a) => Ok(a.iter().map(|&v| v as i64).collect()),
        other => Err(format!("indices must be integers, got {}", other.ty())),
    }
}

/// The flat extents of a gather from `x` (or a scatter into it): `batch`
/// (the paired leading dimensions), `pre` (the rest before `axis`), `len`
/// (the extent along `axis`), `post` (after it) and `per` (index positions
/// per batch element).
struct Geometry {
    batch: usize,
    pre: usize,
    len: usize,
    post: usize,
    per: usize,
}

impl Geometry {
    fn new(x: &[usize], idx: &[usize], axis: usize, batch_dims: usize) -> Geometry {
        let p = |s: &[usize]| s.iter().product::<usize>();
        Geometry {
            batch: p(&x[..batch_dims]),
            pre: p(&x[batch_dims..axis]),
            len: x[axis],
            post: p(&x[axis + 1..]),
            per: p(&idx[batch_dims..]),
        }
    }

    /// The in-range position along the axis of index `i`, if any.
    fn pos(&self, i: i64) -> Option<usize> {
        usize::try_from(i).ok().filter(|&a| a < self.len)
    }
}

fn standard<T: Clone>(a: &ArrayD<T>) -> std::borrow::Cow<'_, [T]> {
    match a.as_slice() {
        Some(s) => std::borrow::Cow::Borrowed(s),
        None => std::borrow::Cow::Owned(a.iter().cloned().collect()),
    }
}

fn gather<T: Element>(x: &ArrayD<T>, idx: &[i64], g: &Geometry) -> ArrayD<T> {
    let x = standard(x);
    let zero = T::from_f64_rounded(0.0);
    let mut out = Vec::with_capacity(g.batch * g.pre * g.per * g.post);
    for b in 0..g.batch {
        for p in 0..g.pre {
            let base = (b * g.pre + p) * g.len;
            for &i in &idx[b * g.per..(b + 1) * g.per] {
                match g.pos(i) {
                    Some(a) => out.extend_from_slice(&x[(base + a) * g.post..(base + a + 1) * g.post]),
                    None => out.extend(std::iter::repeat_n(zero, g.post)),
                }
            }
        }
    }
    ArrayD::from_shape_vec(IxDyn(&[out.len()]), out).expect("flat")
}

fn scatter<T: Summand>(u: &ArrayD<T>, idx: &[i64], g: &Geometry) -> ArrayD<T> {
    let u = standard(u);
    let mut acc = vec![T::ZERO; g.batch * g.pre * g.len * g.post];
    for b in 0..g.batch {
        for p in 0..g.pre {
            let base = (b * g.pre + p) * g.len;
            for (j, &i) in idx[b * g.per..(b + 1) * g.per].iter().enumerate() {
                let Some(a) = g.pos(i) else { continue };
                let row = &u[((b * g.pre + p) * g.per + j) * g.post..][..g.post];
                for (o, &v) in acc[(base + a) * g.post..][..g.post].iter_mut().zip(row) {
                    *o = T::add(*o, v.widen());
                }
            }
        }
    }
    ArrayD::from_shape_vec(IxDyn(&[acc.len()]), acc.into_iter().map(T::round).collect()).expect("flat")
}

fn cumsum<T: Summand>(x: &ArrayD<T>, dim: usize, reverse: bool) -> ArrayD<T> {
    let shape = x.shape().to_vec();
    let flat = standard(x);
    let (outer, n, inner) =
        (shape[..dim].iter().product::<usize>(), shape[dim], shape[dim + 1..].iter().product::<usize>());
    let mut out = flat.to_vec();
    for o in 0..outer {
        for c in 0..inner {
            let mut run = T::ZERO;
            for s in 0..n {
                let s = if reverse { n - 1 - s } else { s };
                let at = (o * n + s) * inner + c;
                run = T::add(run, flat[at].widen());
                out[at] = T::round(run);
            }
        }
    }
    ArrayD::from_shape_vec(IxDyn(&shape), out).expect("sized from the shape")
}

fn top_k<T: Element>(x: &ArrayD<T>, k: usize) -> ArrayD<i32> {
    let shape = x.shape().to_vec();
    let n = *shape.last().expect("checked by infer");
    let flat = standard(x);
    let rows: usize = shape[..shape.len() - 1].iter().product();
    let mut out = Vec::with_capacity(rows * k);
    let mut order: Vec<usize> = Vec::with_capacity(n);
    for r in 0..rows {
        let row: Vec<f64> = flat[r * n..(r + 1) * n].iter().map(|v| v.to_f64_exact()).collect();
        order.clear();
        order.extend(0..n);
        // Stable: equal values keep increasing positions. NaN ranks first.
        order.sort_by(|&i, &j| rank_key(row[j]).partial_cmp(&rank_key(row[i])).expect("no NaN keys"));
        out.extend(order[..k].iter().map(|&i| i as i32));
    }
    let mut oshape = shape;
    *oshape.last_mut().expect("rank >= 1") = k;
    ArrayD::from_shape_vec(IxDyn(&oshape), out).expect("sized from the shape")
}

/// Orders NaN above every number (`+inf` stays below it).
fn rank_key(v: f64) -> (u8, f64) {
    if v.is_nan() {
        (1, 0.0)
    } else {
        (0, v)
    }
}

//! `dot_general` on the device.
//!
//! As in the interpreter, both operands are seen as a batch of matrices,
//! `lhs: [B, M, K]` (batch, free, contracting dimensions) and `rhs: [B, K,
//! N]` (batch, contracting, free); the `[B, M, N]` product is already in
//! StableHLO's result order. An operand whose three dimension groups each
//! collapse to one stride, rows or columns contiguous (a transposed
//! matrix), is read in place through those strides ([`Operand`]); any
//! other is rearranged with one strided copy first. Float products use
//! cubek-matmul with `f32` accumulation, as the contract asks, and half
//! types round once at the end: `f32` products its unit-tiled routine
//! (exact `f32` arithmetic, on every device including software Vulkan; no
//! TF32), half-type products its tensor-core routines where the device
//! has them ([`Routine`]); when cubek declines a problem, and for integer
//! dots, the tiled kernel of `kernels_matmul.rs` runs instead.
//!
//! Where a vendor GEMM library is attached (cuBLAS on CUDA,
//! `library_gemm.rs`), float products large enough to pay for its
//! per-product cost ([`on_library`], measured) run on it first
//! ([`Routine::Library`]), unsplit (the library splits a contraction
//! itself), and cubek's routines are the fallback.
//!
//! A single product with few output tiles and a long contraction (a
//! weight gradient: `512×512` summed over 4,096 tokens) would leave most
//! of a large GPU idle; its contraction is split into runs computed side
//! by side as a batch, and the partial products summed in order
//! ([`split_parts`]).

use super::kernels_convert::to_float;
use super::kernels_matmul::{matmul_tiled, TILE};
use super::layout::{fill_value, strides};
use super::library_gemm::{GemmElems, GemmOperand};
use super::ops::{round_to, with_storage};
use super::storage::{Rounding, Storage};
use super::{layout, reduce, CubeBuffer, CubeclBackend};
use crate::error::RuntimeError;
use crate::strided::collapse;
use cubecl::ir::StorageType;
use cubecl::prelude::*;
use cubecl::server::Handle;
use cubecl::zspace::{Shape, Strides};
use cubek::matmul::definition::{MatmulElems, MatmulGlobalElems};
use cubek::matmul::launch::{launch_ref, Strategy};
use cubek::std::InputBinding;
use weft_ir::{DType, DotDims, MatmulLayout, TensorType};

/// `x` permuted by `perm` and viewed as the 3-D `shape`.
fn as_batch<R: Runtime>(be: &CubeclBackend<R>, x: &CubeBuffer<R>, perm: &[usize], shape: [usize; 3]) -> CubeBuffer<R> {
    layout::transpose(be, x, perm).view(TensorType::new(x.ty.dtype, shape.to_vec()))
}

/// The dtype whose storage holds `d` without rounding (f32 for half types).
fn accumulator(d: DType) -> DType {
    match Storage::of(d) {
        Storage::F32 => DType::F32,
        _ => d,
    }
}

/// How a product runs on a device. Chosen once per device, dtype and
/// shape by the rules of [`candidates`] (measured on an H200, see
/// BENCHMARKS.md and `runtime/examples/gpu_gemm.rs`): the first candidate
/// the device accepts. Never by timing, so one device always runs one
/// routine, and a rerun gives the same bits.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub(super) enum Routine {
    /// The device's vendor GEMM library ([`super::library_gemm::LibraryGemm`]): cuBLAS on CUDA.
    Library,
    /// cubek's unit-tiled routine on the `f32` storage: exact `f32`
    /// arithmetic (no TF32), on every device.
    Unit,
    /// Tensor cores (cubek's double-buffered `mma` routine) on half-type
    /// operands read from their `f32` storage and staged as the half type
    /// (exact: the stored values are the half type's), `f32` accumulation.
    TensorCores,
    /// [`Routine::TensorCores`] with cubek's specialized `mma` routine
    /// (loading and computing planes apart): on the H200 25.7 against 23.6
    /// TFLOP/s at `4096×512×512` and 21.0 against 14.5 at `512×4096×512`
    /// (BENCHMARKS.md), so products from [`SPECIALIZED_FLOPS`] up take it.
    TensorCoresSpecialized,
    /// Tensor cores fed by the tensor memory accelerator (cubek's
    /// double-buffered TMA routine), on operands first packed into the half
    /// type: two conversion launches, paid back on large products only.
    TensorCoresPacked,
    /// weft's tiled kernel (integers, and whatever cubek declines).
    Tiled,
}

/// Products of at least this many flops (`2·b·m·n·k`) pack their half-type
/// operands for [`Routine::TensorCoresPacked`] (on the H200: 206 TFLOP/s
/// against 107 staged at 4096³, but two more launches, which cost more
/// than they save on a 256×512×2048 product).
const PACK_FLOPS: f64 = 8.0e9;

/// Products of at least this many flops, below [`PACK_FLOPS`], take
/// [`Routine::TensorCoresSpecialized`] (measured from `2·4096·512·512`,
/// a GPT layer's products; smaller ones keep the double-buffered routine).
const SPECIALIZED_FLOPS: f64 = 2.0e9;

/// The routines to try for a product of `dtype` with layout `p`, best
/// first.
fn candidates<R: Runtime>(be: &CubeclBackend<R>, dtype: DType, p: &MatmulLayout) -> Vec<Routine> {
    if !dtype.is_float() {
        return vec![Routine::Tiled];
    }
    let mut v = Vec::new();
    if library_takes(be, dtype, p) {
        v.push(Routine::Library);
    }
    if let Some(h) = half_storage(dtype) {
        let f32s = f32::as_type_native_unchecked().storage_type();
        let mm = &be.client.properties().features.matmul;
        if mm.mma.iter().chain(&mm.cmma).any(|c| c.a_type == h && c.b_type == h && c.cd_type == f32s) {
            let flops = 2.0 * (p.b * p.m * p.n * p.k) as f64;
            if flops >= PACK_FLOPS {
                v.push(Routine::TensorCoresPacked);
            } else if flops >= SPECIALIZED_FLOPS {
                v.push(Routine::TensorCoresSpecialized);
            }
            v.push(Routine::TensorCores);
        }
    }
    v.extend([Routine::Unit, Routine::Tiled]);
    v
}

/// `f32` and `f64` products of at least this many flops run on the
/// library: on the H200, cuBLAS through its own stream took 0.107 ms for
/// `4096×512×512` in `f32` against cubek's 0.375 ms, and the GPT step
/// (products of 1–34 GFLOP) 52.9–54.7 ms against 59.2; below it (the MLP's
/// 0.54 GFLOP products, and every product of a `data=8` MLP) the
/// library's per-product cost on the host is larger than what it saves
/// (BENCHMARKS.md, "cuBLAS...").
const LIBRARY_F32_FLOPS: f64 = 1.0e9;

/// Half-type products of at least this many flops run on the library. At
/// the GPT's shapes (up to 34 GFLOP) cubek's tensor-core routines took
/// about as long per product as cuBLAS plus its per-product cost, and the
/// bf16 GPT step was 27.6 ms on cubek against 34.9–43.2 ms on cuBLAS; at
/// 4096³ (137 GFLOP) cuBLAS took 0.54–0.66 ms against 0.88–0.92.
const LIBRARY_HALF_FLOPS: f64 = 64.0e9;

/// Whether a float product of `dtype` with layout `p` runs on the vendor
/// library (where the device has one): by size, as measured.
fn on_library(dtype: DType, p: &MatmulLayout) -> bool {
    let flops = 2.0 * (p.b * p.m * p.n * p.k) as f64;
    match dtype {
        DType::F32 | DType::F64 => flops >= LIBRARY_F32_FLOPS,
        DType::BF16 | DType::F16 => flops >= LIBRARY_HALF_FLOPS,
        _ => false,
    }
}

/// Whether `be` has a library and it takes this product ([`on_library`]).
fn library_takes<R: Runtime>(be: &CubeclBackend<R>, dtype: DType, p: &MatmulLayout) -> bool {
    be.gemm.is_some() && on_library(dtype, p)
}

/// The storage type of the half type `d` (`None` for other dtypes).
fn half_storage(d: DType) -> Option<StorageType> {
    match d {
        DType::BF16 => Some(half::bf16::as_type_native_unchecked().storage_type()),
        DType::F16 => Some(half::f16::as_type_native_unchecked().storage_type()),
        _ => None,
    }
}

/// An operand as the product reads it: a `[b, rows, cols]` view of `buf`
/// with `strides` - the operand's own buffer read in place when its
/// batch, row and column dimension groups each collapse to one stride and
/// rows or columns are contiguous (a transposed matrix, as `x^T @ dy` and
/// `dy @ w^T` give), else a dense copy.
struct Operand<R: Runtime> {
    buf: CubeBuffer<R>,
    shape: [usize; 3],
    strides: [usize; 3],
}

impl<R: Runtime> Operand<R> {
    /// `x` permuted by `perm` as a `[b, rows, cols]` view; `groups` counts
    /// the batch, row and column dimensions.
    fn new(be: &CubeclBackend<R>, x: &CubeBuffer<R>, perm: &[usize], groups: [usize; 3], shape: [usize; 3]) -> Self {
        let dense = strides(&shape);
        let (buf, st) = match in_place(&x.ty.shape, perm, groups, shape) {
            Some(st) if st[..] != dense[..] => (x.clone(), st),
            _ => (as_batch(be, x, perm, shape), [dense[0], dense[1], dense[2]]),
        };
        Operand { buf, shape, strides: st }
    }

    fn is_dense(&self) -> bool {
        self.strides[..] == strides(&self.shape)[..]
    }

    /// The same operand copied dense (one strided copy of the view).
    fn dense(&self, be: &CubeclBackend<R>) -> Operand<R> {
        let st = strides(&self.shape);
        if self.is_dense() {
            return Operand { buf: self.buf.clone(), shape: self.shape, strides: self.strides };
        }
        let buf = be.empty(&TensorType::new(self.buf.ty.dtype, self.shape.to_vec()));
        let c =
            layout::Copy { shape: &self.shape, src_off: 0, src_strides: &self.strides, dst_off: 0, dst_strides: &st };
        layout::copy(be, &self.buf, &buf, c);
        Operand { buf, shape: self.shape, strides: [st[0], st[1], st[2]] }
    }

    /// The operand of a product whose contraction is split into `parts`:
    /// the contracting dimension (`axis` 2 of a left operand, 1 of a right
    /// one) cut into `parts` runs that become the batch (the operand must
    /// have a batch of one). A view of the same buffer.
    fn split(&self, parts: usize, axis: usize) -> Operand<R> {
        debug_assert!(self.shape[0] == 1 && self.shape[axis] % parts == 0);
        let mut shape = self.shape;
        shape[axis] /= parts;
        shape[0] = parts;
        let mut st = self.strides;
        st[0] = self.strides[axis] * shape[axis];
        Operand { buf: self.buf.clone(), shape, strides: st }
    }

    fn binding(&self, handle: &Handle) -> TensorBinding<R> {
        // SAFETY: `handle` holds the operand's elements laid out with
        // these strides (its own buffer's, or a dense copy's).
        unsafe {
            TensorBinding::from_raw_parts(
                handle.clone(),
                Strides::from(self.strides.to_vec()),
                Shape::from(self.shape.to_vec()),
            )
        }
    }
}

/// Output tiles that keep a large GPU busy: a product with fewer (a
/// weight gradient's `512×512` output is 64 tiles of `64×64` on an H200's
/// 132 multiprocessors) splits its contraction ([`split_parts`]).
const BUSY_TILES: usize = 256;
/// The output tile a product's cube computes, for counting tiles.
const SPLIT_TILE: usize = 64;
/// The shortest run of the contraction a split part takes.
const MIN_SPLIT_K: usize = 512;
/// The most parts a contraction is split into.
const MAX_SPLIT: usize = 16;

/// Into how many parts the contraction of a `[b, m, n, k]` product is
/// split (split-K; 1: none): a single product (`b = 1`) with too few
/// output tiles to fill the device ([`BUSY_TILES`]) and a long contraction
/// is computed as `parts` products of `k / parts` side by side, whose
/// partial results are summed in order by one column reduction. A
/// function of the shape alone, so every run sums in the same order.
fn split_parts(b: usize, m: usize, n: usize, k: usize) -> usize {
    if b != 1 {
        return 1;
    }
    let tiles = m.div_ceil(SPLIT_TILE) * n.div_ceil(SPLIT_TILE);
    let mut parts = 1;
    while tiles * parts < BUSY_TILES && parts < MAX_SPLIT && k % (2 * parts) == 0 && k / (2 * parts) >= MIN_SPLIT_K {
        parts *= 2;
    }
    parts
}

/// The strides of `x` (a dense buffer of `shape`) permuted by `perm` and
/// viewed as `[b, rows, cols]` (`groups` dimensions each), if each group
/// collapses to one stride and rows or columns are contiguous.
fn in_place(shape: &[usize], perm: &[usize], groups: [usize; 3], ext: [usize; 3]) -> Option<[usize; 3]> {
    let st = strides(shape);
    let ps: Vec<usize> = perm.iter().map(|&d| shape[d]).collect();
    let pst: Vec<isize> = perm.iter().map(|&d| st[d] as isize).collect();
    let mut s = [0usize; 3];
    let mut at = 0;
    for j in 0..3 {
        s[j] = usize::try_from(collapse(&ps, &pst, at..at + groups[j])?).ok()?;
        at += groups[j];
    }
    // A group of extent 1 has no stride of its own: give it a dense one.
    if ext[2] == 1 {
        s[2] = 1;
    }
    if ext[1] == 1 {
        s[1] = if s[2] == 1 { ext[2] } else { 1 };
    }
    if ext[0] == 1 {
        s[0] = ext[1] * ext[2];
    }
    (s[2] == 1 || s[1] == 1).then_some(s)
}

/// What picks a product's routine: dtype, `[b, m, n, k]` and the
/// operands' strides.
pub(super) type RoutineKey = (DType, [usize; 4], [usize; 3], [usize; 3]);

/// Computes `dot_general` into a new buffer of type `ty`.
pub(super) fn dot_general<R: Runtime>(
    be: &CubeclBackend<R>,
    l: &CubeBuffer<R>,
    r: &CubeBuffer<R>,
    dims: &DotDims,
    ty: &TensorType,
) -> Result<CubeBuffer<R>, RuntimeError> {
    let p = dims.matmul_layout(&l.ty.shape, &r.ty.shape);
    if p.k == 0 {
        return fill_value(be, ty, 0.0);
    }
    let (nb, nc) = (dims.lhs_batch.len(), dims.lhs_contract.len());
    let lo = Operand::new(be, l, &p.lhs_perm, [nb, l.ty.shape.len() - nb - nc, nc], [p.b, p.m, p.k]);
    let ro = Operand::new(be, r, &p.rhs_perm, [nb, nc, r.ty.shape.len() - nb - nc], [p.b, p.k, p.n]);
    // A library splits a contraction itself.
    let parts = if library_takes(be, ty.dtype, &p) { 1 } else { split_parts(p.b, p.m, p.n, p.k) };
    let (lo, ro) = if parts > 1 { (lo.split(parts, 2), ro.split(parts, 1)) } else { (lo, ro) };
    let acc_ty = TensorType::new(accumulator(ty.dtype), vec![lo.shape[0], p.m, p.n]);
    let acc = be.empty(&acc_ty);
    let key = (ty.dtype, [lo.shape[0], p.m, p.n, lo.shape[2]], lo.strides, ro.strides);
    let known = be.lock_routines().get(&key).copied();
    match known {
        // The routine took this product before; should it decline now,
        // the tiled kernel still computes it.
        Some((routine, true)) => {
            let (ld, rd) = (lo.dense(be), ro.dense(be));
            if !run(be, routine, &ld, &rd, &acc, ty.dtype) {
                run(be, Routine::Tiled, &ld, &rd, &acc, ty.dtype);
            }
        }
        Some((routine, false)) => {
            if !run(be, routine, &lo, &ro, &acc, ty.dtype) {
                run(be, Routine::Tiled, &lo, &ro, &acc, ty.dtype);
            }
        }
        None => {
            // The first routine the device takes, on the operands in place
            // or else copied dense (copied once, and only if a routine
            // declines them in place; the tiled kernel takes everything).
            let both_dense = lo.is_dense() && ro.is_dense();
            let mut dense: Option<(Operand<R>, Operand<R>)> = None;
            let chosen = candidates(be, ty.dtype, &p)
                .into_iter()
                .find_map(|routine| {
                    if run(be, routine, &lo, &ro, &acc, ty.dtype) {
                        return Some((routine, false));
                    }
                    if both_dense {
                        return None;
                    }
                    let (ld, rd) = dense.get_or_insert_with(|| (lo.dense(be), ro.dense(be)));
                    run(be, routine, ld, rd, &acc, ty.dtype).then_some((routine, true))
                })
                .expect("the tiled kernel takes every product");
            be.lock_routines().insert(key, chosen);
        }
    }
    Ok(if parts > 1 {
        reduce::sum_rows_of(be, &acc, parts, ty)
    } else if acc_ty.dtype == ty.dtype {
        acc.view(ty.clone())
    } else {
        round_to(be, &acc, ty)
    })
}

/// Runs `routine` into `out`; false if the device declines it.
fn run<R: Runtime>(
    be: &CubeclBackend<R>,
    routine: Routine,
    l: &Operand<R>,
    r: &Operand<R>,
    out: &CubeBuffer<R>,
    dtype: DType,
) -> bool {
    let f32s = f32::as_type_native_unchecked().storage_type();
    let [b, m, k] = l.shape;
    let n = r.shape[2];
    let out_binding = || -> TensorBinding<R> {
        // SAFETY: `out` is a dense `[b, m, n]` buffer.
        unsafe {
            TensorBinding::from_raw_parts(
                out.handle.clone(),
                Strides::from(strides(&[b, m, n])),
                Shape::from(vec![b, m, n]),
            )
        }
    };
    match routine {
        Routine::Library => {
            let Some(lib) = be.gemm.as_ref() else { return false };
            let packed = half_storage(dtype).is_some() && lib.packs_half();
            let elems = match (dtype, packed) {
                (DType::F32, _) => GemmElems::F32,
                (DType::F64, _) => GemmElems::F64,
                (DType::BF16, true) => GemmElems::Bf16,
                (DType::F16, true) => GemmElems::F16,
                (DType::BF16, false) => GemmElems::Bf16InF32,
                (DType::F16, false) => GemmElems::F16InF32,
                _ => return false,
            };
            let handle = |x: &Operand<R>| if packed { pack(be, &x.buf, dtype) } else { x.buf.handle.clone() };
            let a = GemmOperand { handle: handle(l), strides: l.strides };
            let bo = GemmOperand { handle: handle(r), strides: r.strides };
            lib.gemm(be, &a, &bo, &out.handle, [b, m, k, n], elems).is_ok()
        }
        Routine::Tiled => {
            let (l, r) = (l.dense(be), r.dense(be));
            tiled(be, &l.buf, &r.buf, out, [b, m, k, n]);
            true
        }
        Routine::Unit => {
            let elem = with_storage!(out.ty.dtype, N => N::as_type_native_unchecked());
            let storage = elem.storage_type();
            let lhs = InputBinding::Normal(l.binding(&l.buf.handle), storage);
            let rhs = InputBinding::Normal(r.binding(&r.buf.handle), storage);
            let mut dtypes = MatmulElems::from_single_dtype(elem);
            let strategy = Strategy::SimpleUnit(Default::default());
            launch_ref(&strategy, &be.client, lhs, rhs, out_binding(), &mut dtypes).is_ok()
        }
        Routine::TensorCores | Routine::TensorCoresSpecialized => {
            let h = half_storage(dtype).expect("tensor cores for half types only");
            let lhs = InputBinding::Normal(l.binding(&l.buf.handle), f32s);
            let rhs = InputBinding::Normal(r.binding(&r.buf.handle), f32s);
            let mut dtypes = MatmulElems {
                lhs_global: f32s,
                rhs_global: f32s,
                acc_global: f32s,
                lhs_stage: h,
                rhs_stage: h,
                acc_stage: f32s,
                lhs_register: h,
                rhs_register: h,
                acc_register: f32s,
            };
            let strategy = match routine {
                Routine::TensorCoresSpecialized => Strategy::SpecializedCyclicMma(Default::default()),
                _ => Strategy::DoubleCyclicMma(Default::default()),
            };
            launch_ref(&strategy, &be.client, lhs, rhs, out_binding(), &mut dtypes).is_ok()
        }
        Routine::TensorCoresPacked => {
            let h = half_storage(dtype).expect("tensor cores for half types only");
            // Packing keeps the layout: element for element, the same strides.
            let (lh, rh) = (pack(be, &l.buf, dtype), pack(be, &r.buf, dtype));
            let lhs = InputBinding::Normal(l.binding(&lh), h);
            let rhs = InputBinding::Normal(r.binding(&rh), h);
            let mut dtypes = MatmulElems::from_globals(&MatmulGlobalElems { lhs: h, rhs: h, out: f32s });
            let strategy = Strategy::DoubleTmaMma(Default::default());
            launch_ref(&strategy, &be.client, lhs, rhs, out_binding(), &mut dtypes).is_ok()
        }
    }
}

/// `x`'s values (stored as `f32`, exactly representable in the half type
/// `d`) packed into a new buffer of `d` itself.
fn pack<R: Runtime>(be: &CubeclBackend<R>, x: &CubeBuffer<R>, d: DType) -> Handle {
    let n = x.len().max(1);
    let handle = be.client.empty(n * 2);
    // SAFETY: `handle` holds `n` two-byte elements.
    let out = unsafe { ArrayArg::from_raw_parts(handle.clone(), n) };
    let (count, dim) = be.grid(n);
    match d {
        DType::BF16 => to_float::launch::<f32, half::bf16, R>(&be.client, count, dim, x.arg(), out, Rounding::None),
        _ => to_float::launch::<f32, half::f16, R>(&be.client, count, dim, x.arg(), out, Rounding::None),
    }
    handle
}

/// The tiled fallback kernel, on dense `[b, m, k]` and `[b, k, n]` operands.
fn tiled<R: Runtime>(
    be: &CubeclBackend<R>,
    l: &CubeBuffer<R>,
    r: &CubeBuffer<R>,
    out: &CubeBuffer<R>,
    [b, m, k, n]: [usize; 4],
) {
    let max = u16::MAX as usize;
    let count = CubeCount::Static(
        n.div_ceil(TILE).clamp(1, max) as u32,
        m.div_ceil(TILE).clamp(1, max) as u32,
        b.clamp(1, max) as u32,
    );
    let dim = CubeDim::new_2d(TILE as u32, TILE as u32);
    let dims: Vec<u32> = [b, m, k, n].iter().map(|&v| v as u32).collect();
    let (mh, ml) = be.meta(&dims);
    // SAFETY: `ml` u32 values were just written to `mh`.
    let meta = unsafe { ArrayArg::from_raw_parts(mh, ml) };
    with_storage!(out.ty.dtype, N => matmul_tiled::launch::<N, R>(&be.client, count, dim, l.arg(), r.arg(), out.arg(), meta));
}

#[cfg(test)]
mod tests {
    use super::{in_place, on_library};
    use weft_ir::{DType, MatmulLayout};

    #[test]
    fn the_library_takes_large_float_products() {
        let p = |b, m, k, n| MatmulLayout { lhs_perm: vec![], rhs_perm: vec![], out_shape: vec![], b, m, k, n };
        // The GPT's f32 products (2.1 GFLOP and up; attention's batch of
        // 128 heads, 1.07 GFLOP), not the MLP's (0.54 GFLOP).
        assert!(on_library(DType::F32, &p(1, 4096, 512, 512)));
        assert!(on_library(DType::F32, &p(128, 256, 64, 256)));
        assert!(!on_library(DType::F32, &p(1, 256, 512, 2048)));
        assert!(on_library(DType::F64, &p(1, 4096, 512, 512)));
        // Half types only from 64 GFLOP (4096³ is 137).
        assert!(!on_library(DType::BF16, &p(1, 4096, 512, 8192)));
        assert!(on_library(DType::BF16, &p(1, 4096, 4096, 4096)));
        assert!(on_library(DType::F16, &p(1, 4096, 4096, 4096)));
        // Never integers.
        assert!(!on_library(DType::I32, &p(1, 4096, 4096, 4096)));
    }

    #[test]
    fn which_operand_views_are_read_in_place() {
        // `x^T` of a [k, m] = [29, 37] buffer as [1, m, k]: columns
        // contiguous (column-major), read in place.
        assert_eq!(in_place(&[29, 37], &[1, 0], [0, 1, 1], [1, 37, 29]), Some([37 * 29, 1, 37]));
        // The identity: row-major.
        assert_eq!(in_place(&[4, 5, 6], &[0, 1, 2], [1, 1, 1], [4, 5, 6]), Some([30, 6, 1]));
        // Attention's `q @ k^T` on [b, t, h, d] with batch (b, h): the batch
        // dimensions do not collapse to one stride.
        assert_eq!(in_place(&[2, 8, 4, 16], &[0, 2, 1, 3], [2, 1, 1], [8, 8, 16]), None);
        // Neither rows nor columns contiguous: a [2, 3, 4] buffer read as
        // rows of dimension 0 and columns of dimension 1 (dimension 2 the
        // batch).
        assert_eq!(in_place(&[2, 3, 4], &[2, 0, 1], [1, 1, 1], [4, 2, 3]), None);
        // A unit row dimension takes a dense stride.
        assert_eq!(in_place(&[1, 5], &[0, 1], [0, 1, 1], [1, 1, 5]), Some([5, 5, 1]));
    }
}

//! Data-movement kernels: one strided copy, a fill, and an index kernel.
//!
//! Every layout op of the IR (broadcast_in_dim, transpose, slice,
//! concatenate, pad, the operand rearrangement of dot_general and of
//! reductions) is a copy where element `i` of an iteration space goes from
//! `src_offset + Σ idx_k * src_stride_k` to `dst_offset + Σ idx_k *
//! dst_stride_k`. So there is one kernel, [`strided_copy`], parameterised
//! by a small metadata array, and the ops differ only in the strides the
//! host computes (`layout.rs`). Broadcasting is a zero source stride,
//! slicing an offset and scaled strides, padding a fill followed by a copy
//! into a strided window. The rank is a compile-time constant, so the
//! index loop is unrolled.
//!
//! The kernels move raw bits (`u32` for every 4-byte storage type, `f64`
//! for 8-byte), so one compiled shader serves f32, i32, u32, bool and the
//! half types alike.

use cubecl::prelude::*;

/// Metadata layout of [`strided_copy`]: `[n, src_offset, dst_offset,
/// shape[rank], src_strides[rank], dst_strides[rank]]`.
#[cube(launch)]
pub fn strided_copy<T: CubePrimitive>(src: &Array<T>, dst: &mut Array<T>, meta: &Array<u32>, #[comptime] rank: usize) {
    let i = ABSOLUTE_POS;
    if i < meta[0] as usize {
        let mut rem = i as u32;
        let mut s = meta[1];
        let mut d = meta[2];
        #[unroll]
        for k in 0..rank {
            let dim = rank - 1 - k;
            let extent = meta[3 + dim];
            let idx = rem % extent;
            rem /= extent;
            s += idx * meta[3 + rank + dim];
            d += idx * meta[3 + 2 * rank + dim];
        }
        dst[d as usize] = src[s as usize];
    }
}

/// `out[i] = value[0]`.
#[cube(launch)]
pub fn fill<T: CubePrimitive>(value: &Array<T>, out: &mut Array<T>) {
    let i = ABSOLUTE_POS;
    if i < out.len() {
        out[i] = value[0];
    }
}

/// `out[i] = (i / pitch) % extent`: the index along one dimension (the
/// dimension's extent and the product of the extents after it).
#[cube(launch)]
pub fn dim_index(out: &mut Array<u32>, pitch: u32, extent: u32) {
    let i = ABSOLUTE_POS;
    if i < out.len() {
        out[i] = (i as u32 / pitch) % extent;
    }
}

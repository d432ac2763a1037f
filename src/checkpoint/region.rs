//! Copying boxes between row-major byte buffers.
//!
//! Resharding on load is "assemble the global tensor from the saved blocks,
//! cut out the target blocks". Done literally that needs the whole global
//! tensor in memory; instead every saved block is copied straight into each
//! target block it overlaps. Both steps are the same primitive: copy the
//! intersection of two boxes of the global index space, each stored as a
//! dense row-major buffer. Working on little-endian bytes keeps it
//! dtype-agnostic and lets it read directly from a file's bytes.

/// Copies the intersection of the box `src` (shape `src_shape`, at global
/// offset `src_offset`) and the box `dst` (at `dst_offset`) from `src` into
/// `dst`. `elem` is the element size in bytes. Returns the number of
/// elements copied (0 if the boxes do not overlap). Panics if a buffer's
/// length does not match its shape (a broken invariant of the caller).
pub fn copy_region(
    src: &[u8],
    src_shape: &[usize],
    src_offset: &[usize],
    dst: &mut [u8],
    dst_shape: &[usize],
    dst_offset: &[usize],
    elem: usize,
) -> usize {
    let rank = src_shape.len();
    assert!(dst_shape.len() == rank && src_offset.len() == rank && dst_offset.len() == rank, "rank mismatch");
    assert_eq!(src.len(), src_shape.iter().product::<usize>() * elem, "source length");
    assert_eq!(dst.len(), dst_shape.iter().product::<usize>() * elem, "destination length");
    // The intersection, in global coordinates.
    let mut lo = vec![0; rank];
    let mut ext = vec![0; rank];
    for d in 0..rank {
        lo[d] = src_offset[d].max(dst_offset[d]);
        let hi = (src_offset[d] + src_shape[d]).min(dst_offset[d] + dst_shape[d]);
        if hi <= lo[d] {
            return 0;
        }
        ext[d] = hi - lo[d];
    }
    if rank == 0 {
        dst[..elem].copy_from_slice(&src[..elem]);
        return 1;
    }
    let strides = |shape: &[usize]| {
        let mut s = vec![elem; rank];
        for d in (0..rank - 1).rev() {
            s[d] = s[d + 1] * shape[d + 1];
        }
        s
    };
    let (ss, ds) = (strides(src_shape), strides(dst_shape));
    // Merge trailing dimensions that are whole in both boxes into one run.
    let mut inner = rank - 1;
    while inner > 0 && ext[inner] == src_shape[inner] && ext[inner] == dst_shape[inner] {
        inner -= 1;
    }
    let run = ext[inner] * ss[inner];
    let outer = &ext[..inner];
    let rows: usize = outer.iter().product();
    let mut idx = vec![0; inner];
    for _ in 0..rows {
        let (mut s, mut t) = (0, 0);
        for d in 0..rank {
            let i = if d < inner {
                idx[d] + lo[d]
            } else if d == inner {
                lo[d]
            } else {
                0
            };
            s += (i - if d <= inner { src_offset[d] } else { 0 }) * ss[d];
            t += (i - if d <= inner { dst_offset[d] } else { 0 }) * ds[d];
        }
        dst[t..t + run].copy_from_slice(&src[s..s + run]);
        for d in (0..inner).rev() {
            idx[d] += 1;
            if idx[d] < outer[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    ext.iter().product()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_an_overlap_between_2d_boxes() {
        // Global 4x4 holding 0..16; source is rows 1..3, all columns.
        let global: Vec<u8> = (0..16).collect();
        let src: Vec<u8> = global[4..12].to_vec();
        // Destination: the 2x2 block at (2, 2).
        let mut dst = vec![99u8; 4];
        let n = copy_region(&src, &[2, 4], &[1, 0], &mut dst, &[2, 2], &[2, 2], 1);
        assert_eq!(n, 2);
        assert_eq!(dst, vec![10, 11, 99, 99]);
    }

    #[test]
    fn whole_trailing_dims_and_elements_wider_than_a_byte() {
        let src: Vec<u8> = (0..24).collect(); // 3x2 of 4-byte elements at (0, 0)
        let mut dst = vec![0u8; 48]; // 6x2 at (0, 0): rows 0..3 filled
        assert_eq!(copy_region(&src, &[3, 2], &[0, 0], &mut dst, &[6, 2], &[0, 0], 4), 6);
        assert_eq!(&dst[..24], &src[..]);
        assert!(dst[24..].iter().all(|&b| b == 0));
        let mut scalar = vec![0u8; 2];
        assert_eq!(copy_region(&[7, 8], &[], &[], &mut scalar, &[], &[], 2), 1);
        assert_eq!(scalar, vec![7, 8]);
        assert_eq!(copy_region(&[1], &[1], &[0], &mut [0], &[1], &[1], 1), 0);
    }
}

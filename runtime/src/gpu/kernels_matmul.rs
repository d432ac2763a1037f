//! A tiled batched matrix product `[B,M,K] x [B,K,N] -> [B,M,N]`.
//!
//! Used for integer dots (which cubek-matmul does not cover, and whose
//! wrapping sums need no particular order) and as the fallback for floats
//! where cubek-matmul declines a problem. Each cube computes a
//! [`TILE`]x[`TILE`] block of the output, staging [`TILE`]-wide slabs of
//! both operands in shared memory; every thread accumulates its element
//! over `k` in increasing order. Grid: x over column tiles, y over row
//! tiles, z over batches; each axis loops in steps of the grid's extent,
//! so any problem fits under the per-dimension cube limit.

use cubecl::prelude::*;

/// Output tile edge (threads per cube: `TILE * TILE`).
pub const TILE: usize = 16;

/// `out[b] = a[b] x c[b]` for row-major `a: [B,M,K]`, `c: [B,K,N]`.
#[cube(launch)]
pub fn matmul_tiled<N: Numeric>(a: &Array<N>, c: &Array<N>, out: &mut Array<N>, dims: &Array<u32>) {
    let batches = dims[0] as usize;
    let m = dims[1] as usize;
    let k = dims[2] as usize;
    let n = dims[3] as usize;
    let tx = UNIT_POS_X as usize;
    let ty = UNIT_POS_Y as usize;
    let mut sa = SharedMemory::<N>::new(TILE * TILE);
    let mut sc = SharedMemory::<N>::new(TILE * TILE);
    let row_tiles = m.div_ceil(TILE);
    let col_tiles = n.div_ceil(TILE);
    let mut b = CUBE_POS_Z as usize;
    while b < batches {
        let mut rt = CUBE_POS_Y as usize;
        while rt < row_tiles {
            let mut ct = CUBE_POS_X as usize;
            while ct < col_tiles {
                let row = rt * TILE + ty;
                let col = ct * TILE + tx;
                let mut acc = N::from_int(0);
                let mut k0 = 0usize;
                while k0 < k {
                    let ka = k0 + tx;
                    let kc = k0 + ty;
                    sa[ty * TILE + tx] = select(
                        row < m && ka < k,
                        a[select(row < m && ka < k, (b * m + row) * k + ka, 0)],
                        N::from_int(0),
                    );
                    sc[ty * TILE + tx] = select(
                        kc < k && col < n,
                        c[select(kc < k && col < n, (b * k + kc) * n + col, 0)],
                        N::from_int(0),
                    );
                    sync_cube();
                    #[unroll]
                    for kk in 0..TILE {
                        acc += sa[ty * TILE + kk] * sc[kk * TILE + tx];
                    }
                    sync_cube();
                    k0 += TILE;
                }
                if row < m && col < n {
                    out[(b * m + row) * n + col] = acc;
                }
                ct += CUBE_COUNT_X as usize;
            }
            rt += CUBE_COUNT_Y as usize;
        }
        b += CUBE_COUNT_Z as usize;
    }
}

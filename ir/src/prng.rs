//! Counter-based random numbers: Threefry-2x32 (20 rounds), as in JAX.
//!
//! This module is the host-side reference: the bit-exact definition that the
//! IR-level generator, the interpreter and GPU kernels must reproduce.
//!
//! Keys and derivation follow JAX with `jax_threefry_partitionable=True`
//! (JAX's default since 0.5): a key is two `u32` words; `key(seed)` is
//! `[0, seed]` for a 32-bit seed; `fold_in(k, d) = threefry(k, [0, d])`;
//! `split(k, n)[i] = threefry(k, [hi(i), lo(i)])`; and the random bits of
//! an array are, for the element at row-major flat index `i`,
//! `x0 ^ x1` where `(x0, x1) = threefry(k, [hi(i), lo(i)])`. Because each
//! element's bits depend only on the key and its *global* index, a sharded
//! program draws exactly the same numbers on any mesh.
//! `specs/prng.md` documents the derivation.

/// Threefry-2x32 rotation constants (Salmon et al., 2011).
const ROTATIONS: [[u32; 4]; 2] = [[13, 15, 26, 6], [17, 29, 16, 24]];

/// The Threefry key-schedule parity constant.
pub const KS_PARITY: u32 = 0x1BD1_1BDA;

/// One Threefry-2x32 block with 20 rounds: encrypts the counter `ctr` under
/// `key`.
pub fn threefry2x32(key: [u32; 2], ctr: [u32; 2]) -> [u32; 2] {
    let ks = [key[0], key[1], key[0] ^ key[1] ^ KS_PARITY];
    let mut x = [ctr[0].wrapping_add(ks[0]), ctr[1].wrapping_add(ks[1])];
    for group in 0..5u32 {
        for &r in &ROTATIONS[(group % 2) as usize] {
            x[0] = x[0].wrapping_add(x[1]);
            x[1] = x[1].rotate_left(r);
            x[1] ^= x[0];
        }
        let g = group as usize + 1;
        x[0] = x[0].wrapping_add(ks[g % 3]);
        x[1] = x[1].wrapping_add(ks[(g + 1) % 3]).wrapping_add(g as u32);
    }
    x
}

/// A PRNG key: two 32-bit words, as `jax.random.PRNGKey` (threefry) holds.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct Key(pub [u32; 2]);

impl Key {
    /// The key for an integer seed, like `jax.random.PRNGKey(seed)` for
    /// `0 <= seed < 2^32`: `[seed >> 32, seed & 0xFFFFFFFF]`.
    pub fn from_seed(seed: u64) -> Key {
        Key([(seed >> 32) as u32, seed as u32])
    }

    /// `jax.random.fold_in(key, data)`.
    pub fn fold_in(self, data: u32) -> Key {
        Key(threefry2x32(self.0, [0, data]))
    }

    /// `jax.random.split(key, n)` (partitionable derivation).
    pub fn split(self, n: usize) -> Vec<Key> {
        (0..n as u64).map(|i| Key(threefry2x32(self.0, [(i >> 32) as u32, i as u32]))).collect()
    }

    /// The 32 random bits of the element at row-major flat index `index`.
    pub fn bits_at(self, index: u64) -> u32 {
        let [a, b] = threefry2x32(self.0, [(index >> 32) as u32, index as u32]);
        a ^ b
    }

    /// Both Threefry words of counter `index` as 64 random bits (first word
    /// high): for draws that need more than 32 bits, e.g. a position in a
    /// stream of billions of tokens.
    pub fn bits64_at(self, index: u64) -> u64 {
        let [a, b] = threefry2x32(self.0, [(index >> 32) as u32, index as u32]);
        (u64::from(a) << 32) | u64::from(b)
    }

    /// `jax.random.bits(key, shape)` for `n` elements.
    pub fn random_bits(self, n: usize) -> Vec<u32> {
        (0..n as u64).map(|i| self.bits_at(i)).collect()
    }

    /// `jax.random.uniform(key, shape, float32)` in `[0, 1)` for `n` elements:
    /// the top 23 bits become the mantissa of a float in `[1, 2)`, minus 1.
    pub fn uniform_f32(self, n: usize) -> Vec<f32> {
        self.random_bits(n).into_iter().map(bits_to_unit_f32).collect()
    }
}

/// Maps 32 random bits to a float in `[0, 1)` the way JAX does.
pub fn bits_to_unit_f32(bits: u32) -> f32 {
    f32::from_bits((bits >> 9) | 0x3F80_0000) - 1.0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Random123's `kat_vectors` for threefry2x32 with 20 rounds
    /// (counter words, key words, expected output).
    #[test]
    fn random123_known_answers() {
        let kats = [
            ([0x0000_0000, 0x0000_0000], [0x0000_0000, 0x0000_0000], [0x6b20_0159, 0x99ba_4efe]),
            ([0xffff_ffff, 0xffff_ffff], [0xffff_ffff, 0xffff_ffff], [0x1cb9_96fc, 0xbb00_2be7]),
            ([0x243f_6a88, 0x85a3_08d3], [0x1319_8a2e, 0x0370_7344], [0xc492_3a9c, 0x483d_f7a0]),
        ];
        for (ctr, key, expected) in kats {
            assert_eq!(threefry2x32(key, ctr), expected, "ctr {ctr:08x?} key {key:08x?}");
        }
    }

    #[test]
    fn derivation_is_deterministic_and_distinct() {
        let k = Key::from_seed(42);
        assert_eq!(k, Key([0, 42]));
        let s = k.split(3);
        assert_eq!(s, k.split(3));
        assert_ne!(s[0], s[1]);
        assert_ne!(k.fold_in(1), k.fold_in(2));
        // Each element depends only on its global index.
        let all = k.random_bits(100);
        assert_eq!(all[37], k.bits_at(37));
        let u = k.uniform_f32(1000);
        assert!(u.iter().all(|&x| (0.0..1.0).contains(&x)));
        let mean = u.iter().map(|&x| x as f64).sum::<f64>() / 1000.0;
        assert!((mean - 0.5).abs() < 0.05, "mean {mean}");
    }

    #[test]
    fn unit_float_mapping() {
        assert_eq!(bits_to_unit_f32(0), 0.0);
        assert_eq!(bits_to_unit_f32(u32::MAX), 1.0 - f32::EPSILON);
        assert_eq!(bits_to_unit_f32(0x8000_0000), 0.5);
    }
}

//! xxh3-64 of one 512-byte sector, with AVX2 when the CPU has it.
//!
//! Every dirty write hashes each of its sectors (the dirty checksum, see
//! [`crate::dirty_checksum`]): 128 hashes per 64 KiB write. The xxhash-rust
//! crate picks its vector width when it is compiled (SSE2 for a portable
//! x86-64 build) and goes through its general long-input path for each
//! sector; in a profile of 64 KiB writes served over NBD the
//! hashing was 11 % of the server's CPU. This is the same function (the
//! XXH3 specification's long-input hash with the default secret and seed
//! 0), written for exactly 512 bytes and compiled for AVX2, chosen at run
//! time; other CPUs use the crate's. The tests check it against the crate
//! on random sectors.
//!
//! For 512 bytes the long-input hash has no scrambling step (a block is
//! 1024 bytes with the default secret): eight 64-byte stripes are
//! accumulated, the last one with the secret at `192 - 64 - 7`, then the
//! eight accumulators are merged with the secret at 11.

use crate::le::get_u64;

/// The bytes hashed: one sector.
pub(crate) const SECTOR: usize = crate::SECTOR_BYTES as usize;

/// xxh3-64 (seed 0, default secret) of `sector`; equal to
/// `xxhash_rust::xxh3::xxh3_64(sector)`.
#[inline]
pub(crate) fn xxh3_sector(sector: &[u8; SECTOR]) -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2.
            return unsafe { avx2::xxh3_sector(sector) };
        }
    }
    xxhash_rust::xxh3::xxh3_64(sector)
}

/// `then(i, xxh3-64 of sector i)` for each 512-byte sector of `data`, into
/// `out` (as many as there are sectors), the CPU's features checked once
/// for all of them. `then` runs beside each hash: a loop of its own was
/// vectorized by the compiler into slower 64-bit multiplies.
pub(crate) fn xxh3_sectors(data: &[u8], out: &mut [u64], then: impl Fn(usize, u64) -> u64) {
    debug_assert_eq!(data.len(), out.len() * SECTOR);
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2.
            unsafe { avx2::xxh3_sectors(data, out, then) };
            return;
        }
    }
    for (i, (sector, hash)) in data.chunks_exact(SECTOR).zip(out.iter_mut()).enumerate() {
        *hash = then(i, xxhash_rust::xxh3::xxh3_64(sector));
    }
}

/// The default secret of XXH3.
const SECRET: [u8; 192] = xxhash_rust::const_xxh3::const_custom_default_secret(0);
/// Where the last stripe's secret starts (XXH_SECRET_LASTACC_START).
const LAST_STRIPE_SECRET: usize = SECRET.len() - 64 - 7;
/// Where the merge's secret starts (XXH_SECRET_MERGEACCS_START).
const MERGE_SECRET: usize = 11;

const PRIME32_1: u64 = 0x9E37_79B1;
const PRIME32_2: u64 = 0x85EB_CA77;
const PRIME32_3: u64 = 0xC2B2_AE3D;
const PRIME64_1: u64 = 0x9E37_79B1_85EB_CA87;
const PRIME64_2: u64 = 0xC2B2_AE3D_27D4_EB4F;
const PRIME64_3: u64 = 0x1656_67B1_9E37_79F9;
const PRIME64_4: u64 = 0x85EB_CA77_C2B2_AE63;
const PRIME64_5: u64 = 0x27D4_EB2F_1656_67C5;

/// The accumulators' starting values.
const INITIAL_ACC: [u64; 8] = [
    PRIME32_3, PRIME64_1, PRIME64_2, PRIME64_3, PRIME64_4, PRIME32_2, PRIME64_5, PRIME32_1,
];

/// The merge of the accumulators, and the final avalanche.
#[inline]
fn merge(acc: &[u64; 8]) -> u64 {
    let mut h = (SECTOR as u64).wrapping_mul(PRIME64_1);
    for pair in 0..4 {
        let a = acc[2 * pair] ^ get_u64(&SECRET, MERGE_SECRET + 16 * pair);
        let b = acc[2 * pair + 1] ^ get_u64(&SECRET, MERGE_SECRET + 16 * pair + 8);
        let product = u128::from(a) * u128::from(b);
        h = h.wrapping_add((product as u64) ^ ((product >> 64) as u64));
    }
    h ^= h >> 37;
    h = h.wrapping_mul(0x1656_6791_9E37_79F9);
    h ^ (h >> 32)
}

/// The hash without vector instructions, stripe by stripe as the
/// specification says (the tests' second reference).
#[cfg(test)]
fn xxh3_sector_scalar(sector: &[u8; SECTOR]) -> u64 {
    let mut acc = INITIAL_ACC;
    let mut stripe = |input: &[u8], secret_at: usize| {
        for lane in 0..8 {
            let data = get_u64(input, 8 * lane);
            let key = data ^ get_u64(&SECRET, secret_at + 8 * lane);
            acc[lane ^ 1] = acc[lane ^ 1].wrapping_add(data);
            acc[lane] = acc[lane].wrapping_add((key & 0xFFFF_FFFF).wrapping_mul(key >> 32));
        }
    };
    for n in 0..7 {
        stripe(&sector[64 * n..], 8 * n);
    }
    stripe(&sector[SECTOR - 64..], LAST_STRIPE_SECRET);
    merge(&acc)
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{merge, INITIAL_ACC, LAST_STRIPE_SECRET, SECRET, SECTOR};
    use std::arch::x86_64::*;

    /// [`super::xxh3_sectors`] with AVX2: one loop, the kernel inlined, so
    /// the sectors' hashes overlap in the CPU.
    ///
    /// # Safety
    /// The CPU must have AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn xxh3_sectors(data: &[u8], out: &mut [u64], then: impl Fn(usize, u64) -> u64) {
        for (i, (sector, hash)) in data.chunks_exact(SECTOR).zip(out.iter_mut()).enumerate() {
            let sector: &[u8; SECTOR] = sector.try_into().expect("chunks of a sector");
            // SAFETY: the caller's (AVX2).
            *hash = then(i, unsafe { xxh3_sector(sector) });
        }
    }

    /// # Safety
    /// The CPU must have AVX2.
    #[inline]
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn xxh3_sector(sector: &[u8; SECTOR]) -> u64 {
        // SAFETY (all loads and stores): unaligned 32-byte accesses within
        // `sector` (offsets up to 512 - 32), `SECRET` (up to
        // LAST_STRIPE_SECRET + 32 < 192 - 32) and `acc` (two halves).
        unsafe {
            let mut acc = INITIAL_ACC;
            let mut lo = _mm256_loadu_si256(acc.as_ptr().cast());
            let mut hi = _mm256_loadu_si256(acc.as_ptr().add(4).cast());
            let input = sector.as_ptr();
            let secret = SECRET.as_ptr();
            for n in 0..8 {
                let secret_at = if n == 7 { LAST_STRIPE_SECRET } else { 8 * n };
                lo = half(lo, input.add(64 * n), secret.add(secret_at));
                hi = half(hi, input.add(64 * n + 32), secret.add(secret_at + 32));
            }
            _mm256_storeu_si256(acc.as_mut_ptr().cast(), lo);
            _mm256_storeu_si256(acc.as_mut_ptr().add(4).cast(), hi);
            merge(&acc)
        }
    }

    /// Four lanes of one stripe: each lane adds its neighbour's data
    /// (lanes swapped in pairs) and the product of the low and high halves
    /// of its data xor the secret.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn half(acc: __m256i, input: *const u8, secret: *const u8) -> __m256i {
        // SAFETY: the caller's bounds (32 bytes at each pointer).
        unsafe {
            let data = _mm256_loadu_si256(input.cast());
            let key = _mm256_xor_si256(data, _mm256_loadu_si256(secret.cast()));
            // Each 64-bit lane's high half moved to its low half.
            let key_high = _mm256_shuffle_epi32::<0b00_11_00_01>(key);
            let product = _mm256_mul_epu32(key, key_high);
            // Lanes 0<->1 and 2<->3 swapped.
            let neighbours = _mm256_shuffle_epi32::<0b01_00_11_10>(data);
            _mm256_add_epi64(_mm256_add_epi64(acc, neighbours), product)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sector_from(seed: u64) -> [u8; SECTOR] {
        let mut x = seed;
        let mut s = [0u8; SECTOR];
        for chunk in s.chunks_exact_mut(8) {
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            chunk.copy_from_slice(&(z ^ (z >> 31)).to_le_bytes());
        }
        s
    }

    #[test]
    fn the_scalar_reference_is_xxh3() {
        for seed in 0..200 {
            let s = sector_from(seed);
            assert_eq!(
                xxh3_sector_scalar(&s),
                xxhash_rust::xxh3::xxh3_64(&s),
                "seed {seed}"
            );
        }
        let zeros = [0u8; SECTOR];
        assert_eq!(xxh3_sector_scalar(&zeros), xxhash_rust::xxh3::xxh3_64(&zeros));
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_avx2_kernel_is_xxh3() {
        if !std::arch::is_x86_feature_detected!("avx2") {
            eprintln!("SKIPPED: this CPU has no AVX2");
            return;
        }
        for seed in 0..2000 {
            let s = sector_from(seed);
            // SAFETY: checked above.
            let ours = unsafe { avx2::xxh3_sector(&s) };
            assert_eq!(ours, xxhash_rust::xxh3::xxh3_64(&s), "seed {seed}");
        }
        for fill in [0u8, 0xFF, 0x80] {
            let s = [fill; SECTOR];
            // SAFETY: checked above.
            assert_eq!(unsafe { avx2::xxh3_sector(&s) }, xxhash_rust::xxh3::xxh3_64(&s));
        }
    }

    #[test]
    fn many_sectors_hash_as_each_alone() {
        let data: Vec<u8> = (0..40).flat_map(sector_from).collect();
        let mut out = vec![0u64; 40];
        xxh3_sectors(&data, &mut out, |_, hash| hash);
        for (i, hash) in out.iter().enumerate() {
            assert_eq!(
                *hash,
                xxhash_rust::xxh3::xxh3_64(&data[i * SECTOR..(i + 1) * SECTOR]),
                "sector {i}"
            );
        }
    }

    proptest! {
        #[test]
        fn the_dispatched_hash_is_xxh3(bytes in proptest::collection::vec(any::<u8>(), SECTOR)) {
            let s: [u8; SECTOR] = bytes.try_into().expect("512 bytes");
            prop_assert_eq!(xxh3_sector(&s), xxhash_rust::xxh3::xxh3_64(&s));
            prop_assert_eq!(xxh3_sector_scalar(&s), xxhash_rust::xxh3::xxh3_64(&s));
        }
    }
}

//! The on-disk format of iocache's cache device, as pure code: functions on
//! byte slices, no I/O, no threads, no clock.
//!
//! A cache device is, in order ([`Layout`]):
//!
//! - superblock copy A at offset 0 and copy B at 4096 ([`Superblock`], 4096
//!   bytes each, crc32c-protected, updated alternately; [`pick_superblock`]
//!   takes the valid copy with the highest sequence);
//! - the metadata area: two copy regions, each with one record per slot
//!   ([`Record`], `record_bytes` each, crc32c-protected; a writer updates one
//!   copy, [`load_metadata`] takes per slot the valid copy with the highest
//!   sequence);
//! - the intent log (version 4): checksum terms of writes about to land in
//!   place on checksummed dirty data ([`Intent`], [`scan_intents`]);
//! - the data area: slot `i`'s line at `data_offset + i × line_bytes`.
//!
//! The torn-write model, the field tables and the loader's rules are in
//! `docs/format.md`. In short: the device persists each 512-byte sector of a
//! write entirely or not at all; a record copy of at most 512 bytes lies in
//! one sector (so it is written atomically), a larger one (1 MiB lines) fills
//! whole sectors of its own and a torn one fails its crc; either way the
//! loader sees the old record or the new one, never a mixture.

mod error;
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
mod intent;
mod layout;
mod le;
mod load;
mod record;
mod sector_hash;
mod settings;
mod superblock;

pub use error::{FormatError, SuperblockAt};
pub use intent::{
    encode_intent_block, intent_block_bytes, intent_bytes_for_sectors, scan_intents, Intent, IntentPair,
    IntentScan, INTENT_TAG,
};
pub use layout::{Layout, LINE_BYTES_MAX, LINE_BYTES_MIN, METADATA_OFFSET, RECORD_BYTES_MIN, REGION_ALIGN};
pub use load::{load_metadata, CorruptCopy, MetadataLoad, SlotDisk, MAX_CORRUPT_EXAMPLES};
pub use record::{
    decode_record, empty_region, encode_record, epoch_ranks, guess_record, LineRecord, Record, RecordCopy,
    RecordGuess, RECORD_KIND_LINE, RECORD_TAG,
};
pub use settings::{RecaLineSize, RecordedChange, SettingsRecord, SETTINGS_VERSION};
pub use superblock::{
    pick_superblock, Persistence, ShutdownState, Superblock, SuperblockFound, VolumeEntry, VolumeIdentity,
    MAX_SETTINGS_BYTES, MAX_VOLUMES, MAX_VOLUME_NAME_BYTES,
};

/// The format version this build writes. Version 5 lets a dirty line's
/// record carry its flush epoch (ordered write-back); a version 4 device
/// has the same layout, and its superblock is rewritten as 5 when ordered
/// write-back starts on it. Version 4 adds the intent log
/// (checksum terms of writes landing in place on checksummed dirty data,
/// made durable before those writes). Version 3 records each volume's
/// backend identity in the volume table and writes a record for every
/// slot at format time, so that a record copy of all zeroes is damage, not
/// "never written". Version 2 added the mirror field of line records (cache
/// arrays). An older device is read by its own rules and upgraded when it
/// is opened; a build that reads only older versions refuses a newer one.
pub const FORMAT_VERSION: u32 = 5;
/// The first version with an intent log ([`Layout::intent_bytes`]).
pub const FORMAT_VERSION_INTENTS: u32 = 4;
/// The first version whose record copies are never all zero (a fresh slot
/// holds an empty record of sequence 0) and whose volume entries carry an
/// identity.
pub const FORMAT_VERSION_WRITES_EVERY_RECORD: u32 = 3;
pub const FORMAT_VERSION_OLDEST: u32 = 1;
/// The first eight bytes of each superblock copy.
pub const MAGIC: [u8; 8] = *b"IOCACHE\0";
/// Bytes of one superblock copy.
pub const SUPERBLOCK_BYTES: usize = 4096;
/// Device offsets of superblock copies A and B.
pub const SUPERBLOCK_OFFSETS: [u64; 2] = [0, 4096];
/// The unit the device persists atomically, and the unit of the bitmaps.
pub const SECTOR_BYTES: u64 = 512;

/// The data hash of a line: xxh3-64 of `bytes`, which are the line's valid
/// sectors' bytes concatenated in ascending sector order (see
/// [`data_hash_valid`] to hash them in place).
pub fn data_hash(bytes: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(bytes)
}

/// The checksum a dirty record carries over its dirty sectors: the sum
/// (wrapping, mod 2^64) over those sectors of a term mixing xxh3-64 of the
/// sector's 512 bytes with the sector's index in the line. A sum, unlike
/// [`data_hash`], can be kept up to date as writes to disjoint sectors
/// arrive one by one ([`sector_checksums`]), without reading the line
/// back; it still changes when any byte or the position of any sector does.
/// No dirty sector: 0.
pub fn dirty_checksum(line: &[u8], dirty: &[u64]) -> u64 {
    let sectors = line.len() / SECTOR_BYTES as usize;
    let mut sum = 0u64;
    for s in 0..sectors {
        if dirty.get(s / 64).is_some_and(|w| w >> (s % 64) & 1 == 1) {
            let at = s * SECTOR_BYTES as usize;
            sum = sum.wrapping_add(sector_checksum(
                s as u32,
                whole_sector(&line[at..at + SECTOR_BYTES as usize]),
            ));
        }
    }
    sum
}

/// Each sector's term of [`dirty_checksum`] when `data` (whole sectors) is
/// written at sector `first_sector` of a line, in order.
pub fn sector_checksums(first_sector: u32, data: &[u8]) -> impl Iterator<Item = u64> + '_ {
    debug_assert_eq!(data.len() % SECTOR_BYTES as usize, 0, "whole sectors");
    data.chunks_exact(SECTOR_BYTES as usize)
        .zip(first_sector..)
        .map(|(sector, s)| sector_checksum(s, whole_sector(sector)))
}

/// [`sector_checksums`] into `out` (one term per sector of `data`; its
/// length must be `data.len() / 512`): the fast way for a write's lines,
/// which hashes all the sectors in one loop.
pub fn sector_checksums_into(first_sector: u32, data: &[u8], out: &mut [u64]) {
    assert_eq!(
        out.len() * SECTOR_BYTES as usize,
        data.len(),
        "one term per whole sector"
    );
    sector_hash::xxh3_sectors(data, out, |i, hash| {
        mix_sector_index(first_sector + i as u32, hash)
    });
}

/// A sector's term: xxh3-64 of its bytes, mixed with its index so that the
/// same data at another place counts differently (the SplitMix64
/// finalizer, a bijection, over the hash xor the index times the golden
/// ratio). Unseeded xxh3: a seed would derive a new secret on every call.
fn sector_checksum(sector_in_line: u32, sector: &[u8; sector_hash::SECTOR]) -> u64 {
    mix_sector_index(sector_in_line, sector_hash::xxh3_sector(sector))
}

/// `bytes` as the one sector they are.
fn whole_sector(bytes: &[u8]) -> &[u8; sector_hash::SECTOR] {
    bytes.try_into().expect("a whole sector")
}

/// [`sector_checksum`]'s mixing of a sector's hash with its index.
fn mix_sector_index(sector_in_line: u32, hash: u64) -> u64 {
    let mut x = hash ^ u64::from(sector_in_line).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// [`dirty_checksum`] from the sectors' terms (`terms[s]` for sector `s`,
/// [`sector_checksums`]): the sum of the dirty ones'.
pub fn dirty_terms_sum(terms: &[u64], dirty: &[u64]) -> u64 {
    terms
        .iter()
        .enumerate()
        .filter(|(s, _)| dirty.get(s / 64).is_some_and(|w| w >> (s % 64) & 1 == 1))
        .fold(0u64, |sum, (_, &t)| sum.wrapping_add(t))
}

/// Whether a dirty line's sectors agree with its record: `terms` holds each
/// sector's [`sector_checksums`] term as read (one per sector of the line),
/// `dirty` the record's dirty bits, `checksum` its checksum, and `intents`
/// the intents tied to the record, in log order. A dirty sector no intent
/// names must hold the term the checksum counts for it; one an intent
/// names may hold that term (its *base*, given by the first intent naming
/// it) or any term an intent gives it; and the bases of the named sectors
/// plus the terms of the others must sum to the checksum. So every mix of
/// old and new data a crash leaves verifies, and nothing else does (up to
/// the strength of 64-bit hashes).
pub fn dirty_terms_match(terms: &[u64], dirty: &[u64], checksum: u64, intents: &[&Intent]) -> bool {
    let is_dirty = |s: usize| dirty.get(s / 64).is_some_and(|w| w >> (s % 64) & 1 == 1);
    if intents.is_empty() {
        return dirty_terms_sum(terms, dirty) == checksum;
    }
    // Per sector: its base, and whether its term is one an intent allows.
    let mut base: Vec<Option<u64>> = vec![None; terms.len()];
    let mut named = vec![false; terms.len()];
    let mut allowed = vec![false; terms.len()];
    for pair in intents.iter().flat_map(|i| &i.pairs) {
        let s = usize::from(pair.sector);
        if s >= terms.len() {
            return false;
        }
        if !named[s] {
            named[s] = true;
            base[s] = pair.base;
        }
        allowed[s] |= terms[s] == pair.term;
    }
    let mut sum = 0u64;
    for s in (0..terms.len()).filter(|&s| is_dirty(s)) {
        if !named[s] {
            sum = sum.wrapping_add(terms[s]);
            continue;
        }
        let Some(b) = base[s] else {
            // Named without a base: the intent that gave it was lost.
            return false;
        };
        if terms[s] != b && !allowed[s] {
            return false;
        }
        sum = sum.wrapping_add(b);
    }
    sum == checksum
}

/// [`data_hash`] of the valid sectors of `line` (the whole line's bytes,
/// `line.len() / 512` sectors), without copying them: equal to `data_hash`
/// of their concatenation. Bits of `valid` beyond the line's sectors are
/// ignored.
pub fn data_hash_valid(line: &[u8], valid: &[u64]) -> u64 {
    let sectors = line.len() / SECTOR_BYTES as usize;
    let is_valid = |s: usize| valid.get(s / 64).is_some_and(|w| w >> (s % 64) & 1 == 1);
    let mut hasher = xxhash_rust::xxh3::Xxh3Default::new();
    let mut s = 0;
    while s < sectors {
        if !is_valid(s) {
            s += 1;
            continue;
        }
        let start = s;
        while s < sectors && is_valid(s) {
            s += 1;
        }
        hasher.update(&line[start * SECTOR_BYTES as usize..s * SECTOR_BYTES as usize]);
    }
    hasher.digest()
}

#[cfg(test)]
mod intent_match_tests {
    use super::*;

    fn terms(line: &[u8]) -> Vec<u64> {
        sector_checksums(0, line).collect()
    }

    /// A line of 8 sectors, dirty 0..6, checksummed; then sectors 2..5
    /// rewritten in place under an intent: every per-sector mix of old and
    /// new verifies, a sector holding anything else does not.
    #[test]
    fn every_mix_of_old_and_new_verifies_and_nothing_else() {
        let old: Vec<u8> = (0..8 * 512).map(|i| (i / 512) as u8 + 1).collect();
        let dirty = [0b11_1111u64];
        let checksum = dirty_checksum(&old, &dirty);
        let mut new = old.clone();
        new[2 * 512..5 * 512].fill(0xee);
        let (old_terms, new_terms) = (terms(&old), terms(&new));
        let intent = Intent {
            slot: 0,
            sequence: 1,
            pairs: (2..5)
                .map(|s| IntentPair {
                    sector: s as u16,
                    term: new_terms[s],
                    base: Some(old_terms[s]),
                })
                .collect(),
        };
        assert!(dirty_terms_match(&old_terms, &dirty, checksum, &[]));
        assert!(!dirty_terms_match(&new_terms, &dirty, checksum, &[]));
        for mix in 0..8u32 {
            let mut line = old.clone();
            for (k, s) in (2..5).enumerate() {
                if mix >> k & 1 == 1 {
                    line[s * 512..(s + 1) * 512].copy_from_slice(&new[s * 512..(s + 1) * 512]);
                }
            }
            assert!(
                dirty_terms_match(&terms(&line), &dirty, checksum, &[&intent]),
                "mix {mix}"
            );
            // Any other byte in a named sector, or in an unnamed one: refused.
            for s in [0usize, 3, 5] {
                let mut bad = line.clone();
                bad[s * 512 + 7] ^= 1;
                assert!(
                    !dirty_terms_match(&terms(&bad), &dirty, checksum, &[&intent]),
                    "mix {mix}, sector {s}"
                );
            }
        }
        // A later intent without bases (the sectors were named before) adds
        // alternatives; one naming a sector first without a base proves nothing.
        let mut newer = new.clone();
        newer[3 * 512..4 * 512].fill(0x55);
        let later = Intent {
            slot: 0,
            sequence: 1,
            pairs: vec![IntentPair {
                sector: 3,
                term: terms(&newer)[3],
                base: None,
            }],
        };
        assert!(dirty_terms_match(
            &terms(&newer),
            &dirty,
            checksum,
            &[&intent, &later]
        ));
        assert!(!dirty_terms_match(&terms(&newer), &dirty, checksum, &[&later]));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(sectors: usize) -> Vec<u8> {
        (0..sectors * SECTOR_BYTES as usize)
            .map(|i| (i * 7 + i / 512) as u8)
            .collect()
    }

    /// What sectors `first..` contribute when `data` is written there.
    fn dirty_checksum_of_run(first: u32, data: &[u8]) -> u64 {
        sector_checksums(first, data).fold(0, u64::wrapping_add)
    }

    #[test]
    fn sector_checksums_into_gives_the_same_terms() {
        let data = line(16);
        for first in [0u32, 3, 100] {
            let mut out = vec![0u64; 16];
            sector_checksums_into(first, &data, &mut out);
            let expected: Vec<u64> = sector_checksums(first, &data).collect();
            assert_eq!(out, expected, "first sector {first}");
        }
    }

    #[test]
    fn dirty_checksum_is_the_sum_of_its_runs_and_sees_every_change() {
        let data = line(8);
        let all = [0xffu64];
        let whole = dirty_checksum(&data, &all);
        let runs = dirty_checksum_of_run(0, &data[..3 * 512])
            .wrapping_add(dirty_checksum_of_run(3, &data[3 * 512..]));
        assert_eq!(whole, runs);
        assert_eq!(whole, dirty_checksum_of_run(0, &data));
        // Only dirty sectors count.
        assert_eq!(
            dirty_checksum(&data, &[0b100]),
            dirty_checksum_of_run(2, &data[1024..1536])
        );
        assert_eq!(dirty_checksum(&data, &[0]), 0);
        // A flipped bit anywhere in a dirty sector changes it.
        for at in [0, 511, 512, 4095] {
            let mut changed = data.clone();
            changed[at] ^= 1;
            assert_ne!(dirty_checksum(&changed, &all), whole, "byte {at}");
        }
        // So does a sector's data at another position (sectors swapped).
        let mut swapped = data.clone();
        swapped.copy_within(0..512, 4096 - 512);
        swapped[..512].copy_from_slice(&data[4096 - 512..]);
        assert_ne!(dirty_checksum(&swapped, &all), whole);
    }
}

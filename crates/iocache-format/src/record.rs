//! Per-slot metadata records: what a slot holds, in `record_bytes` bytes,
//! with a crc32c; two copies per slot, the newest valid one counts.
//!
//! Field offsets (relative to the record copy):
//!
//! ```text
//!  0  tag          [u8; 4]  "IOCR"
//!  4  kind         u8       1 empty, 2 line
//!  5  flags        u8       bit 0 dirty, bit 1 has data_hash, bit 2 mirrored,
//!                           bit 3 has epoch (0 for empty)
//!  6  line_shift   u8       log2(line_bytes), 9..=20
//!  7  reserved     u8       0
//!  8  sequence     u64
//! 16  volume       u32      (0 for empty)
//! 20  mirror       u32      mirror slot of a dirty line on a cache array
//!                           (format version 2; 0 unless the flag is set)
//! 24  line_index   u64      (0 for empty)
//! 32  data_hash    u64      (0 unless the flag is set)
//! 40  valid        B bytes  bit s%8 of byte s/8 = sector s, B = ceil(sectors/8)
//! 40+B dirty       B bytes
//! 40+2B epoch        u32      a dirty line's flush epoch, truncated (format
//!                           version 5, ordered write-back; 0 unless the
//!                           flag is set)
//! 44+2B padding    0 up to record_bytes - 4 (every record size has room
//!                           for the epoch: at least 4 bytes after the bitmaps)
//! record_bytes-4   crc32c   u32, Castagnoli, of bytes 0..record_bytes-4
//! ```

use crate::error::FormatError;
use crate::layout::{check_line_bytes, Layout, RECORD_CRC_BYTES, RECORD_HEADER_BYTES};
use crate::le::{get_u32, get_u64};

/// The first four bytes of every written record copy.
pub const RECORD_TAG: [u8; 4] = *b"IOCR";

const KIND_EMPTY: u8 = 1;
/// The `kind` byte (offset 4) of a record that describes a line.
pub const RECORD_KIND_LINE: u8 = 2;
const KIND_LINE: u8 = RECORD_KIND_LINE;
const FLAG_DIRTY: u8 = 1;
const FLAG_HASH: u8 = 2;
const FLAG_MIRROR: u8 = 4;
const FLAG_EPOCH: u8 = 8;
/// Bytes of the epoch field, the first of the padding.
const EPOCH_BYTES: usize = 4;

mod off {
    pub const TAG: usize = 0;
    pub const KIND: usize = 4;
    pub const FLAGS: usize = 5;
    pub const LINE_SHIFT: usize = 6;
    pub const RESERVED0: usize = 7;
    pub const SEQUENCE: usize = 8;
    pub const VOLUME: usize = 16;
    pub const MIRROR: usize = 20;
    pub const LINE_INDEX: usize = 24;
    pub const DATA_HASH: usize = 32;
    pub const BITMAPS: usize = 40;
}

/// A resident line as recorded in a slot's metadata.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LineRecord {
    /// The volume id (an entry of the superblock's volume table).
    pub volume: u32,
    /// The line's index in the volume (byte offset / line_bytes).
    pub line_index: u64,
    /// Whether the line has dirty sectors; equals `dirty_bits` having a bit set.
    pub dirty: bool,
    /// A clean line's: xxh3-64 of the valid sectors' bytes in ascending
    /// sector order ([`data_hash`](crate::data_hash)). A dirty line's: the
    /// checksum of its dirty sectors ([`dirty_checksum`](crate::dirty_checksum)).
    /// Needs at least one valid sector.
    pub data_hash: Option<u64>,
    /// One bit per sector (bit `s % 64` of word `s / 64`), `bitmap_words` words.
    pub valid: Vec<u64>,
    /// One bit per sector, a subset of `valid`, `bitmap_words` words.
    pub dirty_bits: Vec<u64>,
    /// On a cache array (cache RAID), the mirror slot holding a second copy
    /// of the dirty sectors; only on dirty lines.
    pub mirror: Option<u32>,
    /// Under ordered write-back, the flush epoch the line became dirty in
    /// (the low 32 bits; a reader orders them by wrapping distance); only
    /// on dirty lines.
    pub epoch: Option<u32>,
}

impl LineRecord {
    /// A line outside a cache array and ordered write-back (no mirror, no
    /// epoch), dirty when a bit of `dirty_bits` is set.
    pub fn new(
        volume: u32,
        line_index: u64,
        data_hash: Option<u64>,
        valid: Vec<u64>,
        dirty_bits: Vec<u64>,
    ) -> Self {
        LineRecord {
            volume,
            line_index,
            dirty: dirty_bits.iter().any(|&w| w != 0),
            data_hash,
            valid,
            dirty_bits,
            mirror: None,
            epoch: None,
        }
    }
}

/// One record: a sequence number and what the slot holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// Per-slot update counter: of the slot's two copies, the valid one with
    /// the higher sequence is current.
    pub sequence: u64,
    /// The line the slot holds, or `None` for an empty slot.
    pub line: Option<LineRecord>,
}

impl Record {
    /// An empty slot at `sequence`.
    pub fn empty(sequence: u64) -> Record {
        Record { sequence, line: None }
    }
}

/// What one record copy holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecordCopy {
    /// All zero: never written.
    Blank,
    /// A record that passed every check.
    Valid(Record),
    /// Anything else; the reason says which check failed. Never used.
    Corrupt(String),
}

/// What the fields of a corrupt record copy say, read without checking
/// anything ([`guess_record`]): a best guess at what the copy described,
/// for error messages. Nothing in it can be trusted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordGuess {
    /// The `sequence` field.
    pub sequence: u64,
    /// Whether the copy seems to describe a line rather than an empty slot
    /// (`kind` 2, or `kind` neither 1 nor 2 with a volume, line index or
    /// bitmap bit set).
    pub line: bool,
    /// The `volume` field.
    pub volume: u32,
    /// The `line_index` field.
    pub line_index: u64,
    /// The dirty flag or any dirty bit is set.
    pub dirty: bool,
    /// Number of sectors the dirty bitmap marks (bits beyond the line ignored).
    pub dirty_sectors: u32,
}

/// Reads the fields of a record copy ignoring its crc and every rule, for
/// messages about a corrupt copy. `None` when the copy's first eight bytes
/// (tag, kind, flags, line shift, reserved) are all zero: no record was
/// written there (a record always has its tag, kind and line shift
/// nonzero, so only damage to five or more of those bytes or a torn write
/// whose first sector never reached the device leaves them so), or when
/// `bytes` is not `layout.record_bytes` long.
pub fn guess_record(bytes: &[u8], layout: &Layout) -> Option<RecordGuess> {
    if check_record_layout(layout).is_err()
        || bytes.len() as u64 != layout.record_bytes
        || bytes[..8].iter().all(|&b| b == 0)
    {
        return None;
    }
    let b = layout.bitmap_bytes();
    let sectors = layout.sectors_per_line() as usize;
    let words = layout.bitmap_words();
    let valid = get_bitmap(&bytes[off::BITMAPS..off::BITMAPS + b], words);
    let dirty = get_bitmap(&bytes[off::BITMAPS + b..off::BITMAPS + 2 * b], words);
    let dirty_sectors: u32 = dirty
        .iter()
        .enumerate()
        .map(|(w, d)| (d & word_mask(sectors, w)).count_ones())
        .sum();
    let volume = get_u32(bytes, off::VOLUME);
    let line_index = get_u64(bytes, off::LINE_INDEX);
    let kind = bytes[off::KIND];
    let anything = volume != 0 || line_index != 0 || valid.iter().chain(&dirty).any(|&w| w != 0);
    Some(RecordGuess {
        sequence: get_u64(bytes, off::SEQUENCE),
        line: kind == KIND_LINE || (kind != KIND_EMPTY && anything),
        volume,
        line_index,
        dirty: bytes[off::FLAGS] & FLAG_DIRTY != 0 || dirty_sectors > 0,
        dirty_sectors,
    })
}

/// Checks a layout enough to encode or decode records with it.
fn check_record_layout(layout: &Layout) -> Result<(), FormatError> {
    check_line_bytes(layout.line_bytes)
        .map_err(|reason| FormatError::invalid("layout.line_bytes", layout.line_bytes, reason))?;
    let want = Layout::record_bytes_for(layout.line_bytes);
    if layout.record_bytes != want {
        return Err(FormatError::invalid(
            "layout.record_bytes",
            layout.record_bytes,
            format!("expected {want} for {}-byte lines", layout.line_bytes),
        ));
    }
    Ok(())
}

/// The mask of meaningful bits in bitmap word `w` for `sectors` sectors.
fn word_mask(sectors: usize, w: usize) -> u64 {
    let first = w * 64;
    if sectors >= first + 64 {
        u64::MAX
    } else if sectors <= first {
        0
    } else {
        (1u64 << (sectors - first)) - 1
    }
}

/// A broken line rule: the field, its offending value, why.
struct LineProblem {
    field: &'static str,
    value: String,
    reason: String,
}

fn problem(
    field: &'static str,
    value: impl std::fmt::Display,
    reason: impl Into<String>,
) -> Option<LineProblem> {
    Some(LineProblem {
        field,
        value: value.to_string(),
        reason: reason.into(),
    })
}

/// Why a line record breaks a rule, if it does (shared by encode and decode).
fn line_problem(line: &LineRecord, layout: &Layout) -> Option<LineProblem> {
    let words = layout.bitmap_words();
    let sectors = layout.sectors_per_line() as usize;
    if line.valid.len() != words {
        return problem(
            "valid",
            format_args!("{} words", line.valid.len()),
            format!("expected {words}"),
        );
    }
    if line.dirty_bits.len() != words {
        return problem(
            "dirty_bits",
            format_args!("{} words", line.dirty_bits.len()),
            format!("expected {words}"),
        );
    }
    for w in 0..words {
        let mask = word_mask(sectors, w);
        let (v, d) = (line.valid[w], line.dirty_bits[w]);
        let sector = |bits: u64| w * 64 + bits.trailing_zeros() as usize;
        if v & !mask != 0 {
            return problem(
                "valid",
                format_args!("bit of sector {}", sector(v & !mask)),
                format!("set beyond the line's {sectors} sectors"),
            );
        }
        if d & !mask != 0 {
            return problem(
                "dirty_bits",
                format_args!("bit of sector {}", sector(d & !mask)),
                format!("set beyond the line's {sectors} sectors"),
            );
        }
        if d & !v != 0 {
            return problem(
                "dirty_bits",
                format_args!("bit of sector {}", sector(d & !v)),
                "dirty but not valid",
            );
        }
    }
    let any_dirty = line.dirty_bits.iter().any(|&d| d != 0);
    if line.dirty && !any_dirty {
        return problem("dirty", true, "no dirty sector");
    }
    if !line.dirty && any_dirty {
        return problem("dirty", false, "the line has dirty sectors");
    }
    if let Some(hash) = line.data_hash {
        if line.valid.iter().all(|&v| v == 0) {
            return problem(
                "data_hash",
                format_args!("{hash:#018x}"),
                "set on a line with no valid sector",
            );
        }
    }
    if let Some(mirror) = line.mirror {
        if !line.dirty {
            return problem("mirror", mirror, "set on a clean line");
        }
    }
    if let Some(epoch) = line.epoch {
        if !line.dirty {
            return problem("epoch", epoch, "set on a clean line");
        }
    }
    if line.line_index.checked_mul(layout.line_bytes).is_none() {
        return problem("line_index", line.line_index, "its byte offset overflows 64 bits");
    }
    None
}

fn put_bitmap(out: &mut [u8], words: &[u64]) {
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = (words[i / 8] >> (8 * (i % 8))) as u8;
    }
}

fn get_bitmap(bytes: &[u8], words: usize) -> Vec<u64> {
    let mut out = vec![0u64; words];
    for (i, &byte) in bytes.iter().enumerate() {
        out[i / 8] |= u64::from(byte) << (8 * (i % 8));
    }
    out
}

/// Encodes `record` into `out`, which must be exactly `layout.record_bytes`
/// long (all of it is written: header, bitmaps, zero padding, crc32c).
///
/// Errors: a wrong `out` length, a layout whose `record_bytes` does not match
/// its line size, or a line that breaks a rule: bitmaps of other than
/// `bitmap_words` words, bits beyond the line's sectors, dirty bits not a
/// subset of valid bits, `dirty` not equal to "some dirty bit is set", a
/// data hash on a line with no valid sector, or a line index whose byte
/// offset overflows.
pub fn encode_record(record: &Record, layout: &Layout, out: &mut [u8]) -> Result<(), FormatError> {
    check_record_layout(layout)?;
    if out.len() as u64 != layout.record_bytes {
        return Err(FormatError::invalid(
            "out.len()",
            out.len(),
            format!("expected record_bytes = {}", layout.record_bytes),
        ));
    }
    if let Some(line) = &record.line {
        if let Some(p) = line_problem(line, layout) {
            return Err(FormatError::invalid(
                format!("record.line.{}", p.field),
                p.value,
                p.reason,
            ));
        }
    }
    out.fill(0);
    out[off::TAG..off::TAG + 4].copy_from_slice(&RECORD_TAG);
    out[off::LINE_SHIFT] = layout.line_bytes.trailing_zeros() as u8;
    out[off::SEQUENCE..off::SEQUENCE + 8].copy_from_slice(&record.sequence.to_le_bytes());
    match &record.line {
        None => out[off::KIND] = KIND_EMPTY,
        Some(line) => {
            out[off::KIND] = KIND_LINE;
            let mut flags = 0;
            if line.dirty {
                flags |= FLAG_DIRTY;
            }
            if let Some(hash) = line.data_hash {
                flags |= FLAG_HASH;
                out[off::DATA_HASH..off::DATA_HASH + 8].copy_from_slice(&hash.to_le_bytes());
            }
            if let Some(mirror) = line.mirror {
                flags |= FLAG_MIRROR;
                out[off::MIRROR..off::MIRROR + 4].copy_from_slice(&mirror.to_le_bytes());
            }
            let b = layout.bitmap_bytes();
            if let Some(epoch) = line.epoch {
                flags |= FLAG_EPOCH;
                let at = off::BITMAPS + 2 * b;
                out[at..at + EPOCH_BYTES].copy_from_slice(&epoch.to_le_bytes());
            }
            out[off::FLAGS] = flags;
            out[off::VOLUME..off::VOLUME + 4].copy_from_slice(&line.volume.to_le_bytes());
            out[off::LINE_INDEX..off::LINE_INDEX + 8].copy_from_slice(&line.line_index.to_le_bytes());
            put_bitmap(&mut out[off::BITMAPS..off::BITMAPS + b], &line.valid);
            put_bitmap(&mut out[off::BITMAPS + b..off::BITMAPS + 2 * b], &line.dirty_bits);
        }
    }
    let crc_at = out.len() - RECORD_CRC_BYTES as usize;
    let crc = crc32c::crc32c(&out[..crc_at]);
    out[crc_at..].copy_from_slice(&crc.to_le_bytes());
    Ok(())
}

/// A copy region in which every slot holds an empty record of sequence 0
/// (how a version 3 cache is formatted: no record copy is ever all zero, so
/// a zeroed one is damage), `layout.copy_region_bytes` long.
pub fn empty_region(layout: &Layout) -> Result<Vec<u8>, FormatError> {
    let record_bytes = layout.record_bytes as usize;
    let mut one = vec![0u8; record_bytes];
    encode_record(
        &Record {
            sequence: 0,
            line: None,
        },
        layout,
        &mut one,
    )?;
    let mut region = vec![0u8; layout.copy_region_bytes as usize];
    for slot in 0..layout.slots as usize {
        region[slot * record_bytes..(slot + 1) * record_bytes].copy_from_slice(&one);
    }
    Ok(region)
}

/// Decodes one record copy (`layout.record_bytes` bytes).
///
/// All zero → [`RecordCopy::Blank`]. Otherwise every check must pass for
/// [`RecordCopy::Valid`]: tag, crc32c, kind, line shift equal to the
/// layout's, reserved bytes and padding zero, an empty record's other fields
/// zero, a line's flags known, no hash value without the flag, and the line
/// rules of [`encode_record`]. Anything else is [`RecordCopy::Corrupt`] with
/// the first failed check as its reason (offsets in the reason are relative
/// to the record copy). A `Valid` record re-encodes to exactly `bytes`.
pub fn decode_record(bytes: &[u8], layout: &Layout) -> RecordCopy {
    if let Err(e) = check_record_layout(layout) {
        return RecordCopy::Corrupt(format!("unusable layout: {e}"));
    }
    if bytes.len() as u64 != layout.record_bytes {
        return RecordCopy::Corrupt(format!(
            "{} bytes, a record is {}",
            bytes.len(),
            layout.record_bytes
        ));
    }
    if bytes.iter().all(|&b| b == 0) {
        return RecordCopy::Blank;
    }
    match decode_nonblank(bytes, layout) {
        Ok(record) => RecordCopy::Valid(record),
        Err(reason) => RecordCopy::Corrupt(reason),
    }
}

fn decode_nonblank(bytes: &[u8], layout: &Layout) -> Result<Record, String> {
    if bytes[off::TAG..off::TAG + 4] != RECORD_TAG {
        return Err(format!(
            "tag {:02x?} at +0, expected \"IOCR\"",
            &bytes[off::TAG..off::TAG + 4]
        ));
    }
    let crc_at = bytes.len() - RECORD_CRC_BYTES as usize;
    let stored = get_u32(bytes, crc_at);
    let computed = crc32c::crc32c(&bytes[..crc_at]);
    if stored != computed {
        return Err(format!(
            "crc32c {stored:#010x} at +{crc_at} expected {computed:#010x}"
        ));
    }
    let shift = bytes[off::LINE_SHIFT];
    let want_shift = layout.line_bytes.trailing_zeros() as u8;
    if shift != want_shift {
        return Err(format!(
            "line_shift {shift} at +{} (lines of 2^{shift} bytes), the layout has 2^{want_shift}",
            off::LINE_SHIFT
        ));
    }
    if bytes[off::RESERVED0] != 0 {
        return Err(format!(
            "reserved byte at +{} is {:#04x}, must be zero",
            off::RESERVED0,
            bytes[off::RESERVED0]
        ));
    }
    let b = layout.bitmap_bytes();
    let epoch_at = off::BITMAPS + 2 * b;
    let has_epoch = bytes[off::KIND] == KIND_LINE && bytes[off::FLAGS] & FLAG_EPOCH != 0;
    let padding_at = epoch_at + if has_epoch { EPOCH_BYTES } else { 0 };
    if let Some(i) = bytes[padding_at..crc_at].iter().position(|&x| x != 0) {
        return Err(format!(
            "padding byte at +{} is {:#04x}, must be zero",
            padding_at + i,
            bytes[padding_at + i]
        ));
    }
    debug_assert!(padding_at as u64 <= layout.record_bytes - RECORD_CRC_BYTES);
    debug_assert_eq!(off::BITMAPS as u64, RECORD_HEADER_BYTES);
    let sequence = get_u64(bytes, off::SEQUENCE);
    let flags = bytes[off::FLAGS];
    let volume = get_u32(bytes, off::VOLUME);
    let line_index = get_u64(bytes, off::LINE_INDEX);
    let hash = get_u64(bytes, off::DATA_HASH);
    let mirror = get_u32(bytes, off::MIRROR);
    match bytes[off::KIND] {
        KIND_EMPTY => {
            if flags != 0 {
                return Err(format!("empty record with flags {flags:#04x} at +{}", off::FLAGS));
            }
            if volume != 0 || line_index != 0 || hash != 0 || mirror != 0 {
                return Err("empty record with a nonzero volume, line_index, data_hash or mirror".into());
            }
            if bytes[off::BITMAPS..epoch_at].iter().any(|&x| x != 0) {
                return Err("empty record with bitmap bits set".into());
            }
            Ok(Record::empty(sequence))
        }
        KIND_LINE => {
            if flags & !(FLAG_DIRTY | FLAG_HASH | FLAG_MIRROR | FLAG_EPOCH) != 0 {
                return Err(format!("unknown flags {flags:#04x} at +{}", off::FLAGS));
            }
            if flags & FLAG_HASH == 0 && hash != 0 {
                return Err(format!(
                    "data_hash {hash:#018x} at +{} without the hash flag",
                    off::DATA_HASH
                ));
            }
            if flags & FLAG_MIRROR == 0 && mirror != 0 {
                return Err(format!(
                    "mirror {mirror} at +{} without the mirror flag",
                    off::MIRROR
                ));
            }
            let words = layout.bitmap_words();
            let line = LineRecord {
                volume,
                line_index,
                dirty: flags & FLAG_DIRTY != 0,
                data_hash: (flags & FLAG_HASH != 0).then_some(hash),
                valid: get_bitmap(&bytes[off::BITMAPS..off::BITMAPS + b], words),
                dirty_bits: get_bitmap(&bytes[off::BITMAPS + b..epoch_at], words),
                mirror: (flags & FLAG_MIRROR != 0).then_some(mirror),
                epoch: has_epoch.then(|| get_u32(bytes, epoch_at)),
            };
            if let Some(p) = line_problem(&line, layout) {
                return Err(format!("{} = {}: {}", p.field, p.value, p.reason));
            }
            Ok(Record {
                sequence,
                line: Some(line),
            })
        }
        kind => Err(format!(
            "kind {kind} at +{}, expected 1 (empty) or 2 (line)",
            off::KIND
        )),
    }
}

/// Restores the flush epochs of a device's dirty lines from their low 32
/// bits: for each distinct value, a 64-bit epoch with those low bits, in
/// the order they were given out. The values in use span far less than
/// 2^31, so the oldest is the one after the widest gap between two values
/// going round; every epoch returned is at least 2^32 (above a line
/// recorded without one, epoch 0), and the next epoch given out after the
/// newest continues the same numbering.
pub fn epoch_ranks(epochs: impl IntoIterator<Item = u32>) -> std::collections::HashMap<u32, u64> {
    let mut values: Vec<u32> = epochs.into_iter().collect();
    values.sort_unstable();
    values.dedup();
    let Some(&last) = values.last() else {
        return std::collections::HashMap::new();
    };
    // The gap before each value, the first's going round from the last.
    let gap = |i: usize| match i {
        0 => values[0].wrapping_sub(last),
        _ => values[i] - values[i - 1],
    };
    let oldest = values[(0..values.len()).max_by_key(|&i| gap(i)).unwrap_or(0)];
    let base = (1u64 << 32) + u64::from(oldest);
    values
        .iter()
        .map(|&v| (v, base + u64::from(v.wrapping_sub(oldest))))
        .collect()
}

#[cfg(test)]
mod epoch_tests {
    use super::epoch_ranks;

    #[test]
    fn epochs_keep_their_order_and_low_bits_even_across_the_wrap() {
        let check = |given: &[u32], oldest_first: &[u32]| {
            let ranks = epoch_ranks(given.iter().copied());
            let got: Vec<u64> = oldest_first.iter().map(|v| ranks[v]).collect();
            assert!(got.windows(2).all(|w| w[0] < w[1]), "{given:?}: {got:?}");
            assert!(got
                .iter()
                .zip(oldest_first)
                .all(|(&e, &v)| e as u32 == v && e >= 1 << 32));
        };
        check(&[7, 3, 3, 9], &[3, 7, 9]);
        check(&[u32::MAX - 1, 2, u32::MAX, 0], &[u32::MAX - 1, u32::MAX, 0, 2]);
        check(&[5], &[5]);
        assert!(epoch_ranks([]).is_empty());
    }
}

//! `Layout`: where the superblocks, the two metadata copy regions and the
//! data area lie on the cache device, for a line size and a slot count.

use crate::error::FormatError;
use crate::{SECTOR_BYTES, SUPERBLOCK_BYTES, SUPERBLOCK_OFFSETS};

/// The smallest line size, one sector.
pub const LINE_BYTES_MIN: u64 = 512;
/// The largest line size, 1 MiB.
pub const LINE_BYTES_MAX: u64 = 1 << 20;
/// Where the metadata area starts: right after the two superblock copies.
pub const METADATA_OFFSET: u64 = SUPERBLOCK_OFFSETS[1] + SUPERBLOCK_BYTES as u64;
/// Alignment of each metadata copy region and of the data area.
pub const REGION_ALIGN: u64 = 4096;
/// The intent log's size per slot (see [`Layout::intent_bytes_for`]).
const INTENT_BYTES_PER_SLOT: u64 = 32;
/// The smallest intent log.
const INTENT_BYTES_MIN: u64 = 64 << 10;
/// The largest intent log, unless four whole-line intents need more.
const INTENT_BYTES_MAX: u64 = 1 << 20;
/// The smallest record size.
pub const RECORD_BYTES_MIN: u64 = 64;
/// Bytes of a record before its bitmaps (see `docs/format.md`).
pub(crate) const RECORD_HEADER_BYTES: u64 = 40;
/// Bytes of the crc32c that ends every record.
pub(crate) const RECORD_CRC_BYTES: u64 = 4;

/// Where everything lies on a cache device of `slots` lines of `line_bytes`.
///
/// Build it with [`Layout::for_slots`] or [`Layout::fitting`]: those are the
/// only layouts the format accepts (a superblock whose stored layout differs
/// from `for_slots(line_bytes, slots)` in any field is rejected). The
/// offset methods assume such a layout (one [`Layout::validate`] accepts)
/// and a slot below `slots`: on hand-made values their arithmetic may
/// overflow.
///
/// ```text
/// 0                 superblock copy A (4096 B)
/// 4096              superblock copy B (4096 B)
/// metadata_offset   metadata copy 0: slots × record_bytes, rounded up to 4096
///   + copy_region_bytes   metadata copy 1: same size
/// intent_offset     the intent log: intent_bytes (format version 4; none before)
/// data_offset       slot 0's line, slot 1's line, ... (slots × line_bytes)
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Bytes per cache line: a power of two from 512 to 1 MiB.
    pub line_bytes: u64,
    /// Number of slots (lines) on the device, at least 1.
    pub slots: u64,
    /// Bytes per metadata record copy: [`Layout::record_bytes_for`]`(line_bytes)`.
    pub record_bytes: u64,
    /// Device offset of metadata copy 0: [`METADATA_OFFSET`] (8192).
    pub metadata_offset: u64,
    /// Bytes of each metadata copy region: `slots × record_bytes` rounded up to 4096.
    pub copy_region_bytes: u64,
    /// Bytes of the intent log after metadata copy 1
    /// ([`Layout::intent_bytes_for`]; 0 in layouts of format versions
    /// before 4, which have none).
    pub intent_bytes: u64,
    /// Device offset of slot 0's line: the end of the intent log (of
    /// metadata copy 1 without one), rounded up to `max(4096, line_bytes)`.
    pub data_offset: u64,
}

/// Checks a line size: a power of two in `512..=1048576`.
pub(crate) fn check_line_bytes(line_bytes: u64) -> Result<(), String> {
    if line_bytes.is_power_of_two() && (LINE_BYTES_MIN..=LINE_BYTES_MAX).contains(&line_bytes) {
        Ok(())
    } else {
        Err(format!(
            "not a power of two in {LINE_BYTES_MIN}..={LINE_BYTES_MAX}"
        ))
    }
}

fn round_up(value: u64, align: u64) -> Option<u64> {
    debug_assert!(align.is_power_of_two());
    Some(value.checked_add(align - 1)? & !(align - 1))
}

impl Layout {
    /// Bytes of one record copy for lines of `line_bytes`: the smallest power
    /// of two, at least 64, that holds the 40-byte header, the valid and
    /// dirty bitmaps (`line_bytes / 512` bits each, rounded up to whole
    /// bytes) and the 4-byte crc32c.
    ///
    /// | line size | sectors | bitmap bytes | record bytes |
    /// |---|---|---|---|
    /// | 512 B – 32 KiB | 1 – 64 | 1 – 8 | 64 |
    /// | 64 KiB, 128 KiB | 128, 256 | 16, 32 | 128 |
    /// | 256 KiB | 512 | 64 | 256 |
    /// | 512 KiB | 1024 | 128 | 512 |
    /// | 1 MiB | 2048 | 256 | 1024 |
    ///
    /// Meaningful for valid line sizes only (any other value gives the
    /// record size of its sector count, at least one sector).
    pub fn record_bytes_for(line_bytes: u64) -> u64 {
        let sectors = (line_bytes / SECTOR_BYTES).max(1);
        let bitmap_bytes = sectors.div_ceil(8);
        (RECORD_HEADER_BYTES + 2 * bitmap_bytes + RECORD_CRC_BYTES)
            .next_power_of_two()
            .max(RECORD_BYTES_MIN)
    }

    /// Bytes of the intent log of a layout of `slots` lines of
    /// `line_bytes`: 32 bytes per slot, at least 64 KiB and at most 1 MiB,
    /// and never less than four intents covering a whole line each (so
    /// that a log never fills with one group of writes), in whole 4096-byte
    /// blocks.
    pub fn intent_bytes_for(line_bytes: u64, slots: u64) -> u64 {
        let per_slot = slots
            .saturating_mul(INTENT_BYTES_PER_SLOT)
            .clamp(INTENT_BYTES_MIN, INTENT_BYTES_MAX);
        let whole_lines =
            4 * crate::intent::intent_bytes_for_sectors((line_bytes / SECTOR_BYTES).max(1) as usize) as u64;
        per_slot.max(whole_lines).next_multiple_of(REGION_ALIGN)
    }

    /// The layout of `slots` lines of `line_bytes` in this build's format
    /// version (with an intent log).
    ///
    /// Errors: `line_bytes` not a power of two in 512..=1 MiB, `slots` = 0,
    /// or a device size that overflows 64 bits.
    pub fn for_slots(line_bytes: u64, slots: u64) -> Result<Layout, FormatError> {
        Self::build(line_bytes, slots, true)
    }

    /// The layout of `slots` lines of `line_bytes` as format version
    /// `version` lays them out: versions before 4 have no intent log.
    pub fn for_slots_in_version(version: u32, line_bytes: u64, slots: u64) -> Result<Layout, FormatError> {
        Self::build(line_bytes, slots, version >= crate::FORMAT_VERSION_INTENTS)
    }

    /// Whether the layout has an intent log (format version 4 and later).
    pub fn has_intents(&self) -> bool {
        self.intent_bytes > 0
    }

    /// Device offset of the intent log: the end of metadata copy 1.
    pub fn intent_offset(&self) -> u64 {
        self.metadata_offset + 2 * self.copy_region_bytes
    }

    fn build(line_bytes: u64, slots: u64, intents: bool) -> Result<Layout, FormatError> {
        check_line_bytes(line_bytes)
            .map_err(|reason| FormatError::invalid("line_bytes", line_bytes, reason))?;
        if slots == 0 {
            return Err(FormatError::invalid(
                "slots",
                slots,
                "at least one slot is needed",
            ));
        }
        let overflow = || FormatError::invalid("slots", slots, "the device size overflows 64 bits");
        let record_bytes = Self::record_bytes_for(line_bytes);
        let table = slots.checked_mul(record_bytes).ok_or_else(overflow)?;
        let copy_region_bytes = round_up(table, REGION_ALIGN).ok_or_else(overflow)?;
        let intent_bytes = if intents {
            Self::intent_bytes_for(line_bytes, slots)
        } else {
            0
        };
        let metadata_end = copy_region_bytes
            .checked_mul(2)
            .and_then(|both| both.checked_add(METADATA_OFFSET))
            .and_then(|end| end.checked_add(intent_bytes))
            .ok_or_else(overflow)?;
        let data_offset = round_up(metadata_end, REGION_ALIGN.max(line_bytes)).ok_or_else(overflow)?;
        slots
            .checked_mul(line_bytes)
            .and_then(|data| data.checked_add(data_offset))
            .ok_or_else(overflow)?;
        Ok(Layout {
            line_bytes,
            slots,
            record_bytes,
            metadata_offset: METADATA_OFFSET,
            copy_region_bytes,
            intent_bytes,
            data_offset,
        })
    }

    /// The layout with the most slots of `line_bytes` whose
    /// [`device_bytes`](Layout::device_bytes) is at most `device_bytes`.
    ///
    /// Errors: an invalid `line_bytes`, or a device too small for one slot.
    pub fn fitting(line_bytes: u64, device_bytes: u64) -> Result<Layout, FormatError> {
        let one = Self::for_slots(line_bytes, 1)?;
        if one.device_bytes() > device_bytes {
            return Err(FormatError::DeviceTooSmall {
                device_bytes,
                line_bytes,
                needed: one.device_bytes(),
            });
        }
        let fits =
            |slots: u64| Self::for_slots(line_bytes, slots).is_ok_and(|l| l.device_bytes() <= device_bytes);
        // The device size grows with the slot count, so binary search for
        // the last slot count that fits. `hi` cannot be exceeded: the lines
        // alone would not fit.
        let (mut lo, mut hi) = (1u64, device_bytes / line_bytes);
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            if fits(mid) {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        Self::for_slots(line_bytes, lo)
    }

    /// Checks that this layout is exactly `for_slots(line_bytes, slots)`,
    /// or the same without an intent log (format versions before 4): every
    /// field consistent, as decoding and encoding require.
    pub fn validate(&self) -> Result<(), FormatError> {
        let expected = Self::build(self.line_bytes, self.slots, self.intent_bytes != 0)?;
        let fields = [
            ("record_bytes", self.record_bytes, expected.record_bytes),
            ("metadata_offset", self.metadata_offset, expected.metadata_offset),
            (
                "copy_region_bytes",
                self.copy_region_bytes,
                expected.copy_region_bytes,
            ),
            ("intent_bytes", self.intent_bytes, expected.intent_bytes),
            ("data_offset", self.data_offset, expected.data_offset),
        ];
        for (field, value, want) in fields {
            if value != want {
                return Err(FormatError::invalid(
                    format!("layout.{field}"),
                    value,
                    format!(
                        "expected {want} for {} slots of {} bytes",
                        self.slots, self.line_bytes
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Total bytes the layout needs: `data_offset + slots × line_bytes`.
    pub fn device_bytes(&self) -> u64 {
        self.data_offset + self.slots * self.line_bytes
    }

    /// Device offset of `slot`'s record in metadata copy `copy` (0 or 1):
    /// `metadata_offset + copy × copy_region_bytes + slot × record_bytes`.
    pub fn record_offset(&self, slot: u64, copy: u8) -> u64 {
        debug_assert!(slot < self.slots, "slot {slot} of {}", self.slots);
        debug_assert!(copy < 2, "metadata copy {copy}");
        self.metadata_offset + u64::from(copy) * self.copy_region_bytes + slot * self.record_bytes
    }

    /// Device offset of metadata copy region `copy` (0 or 1).
    pub fn copy_region_offset(&self, copy: u8) -> u64 {
        debug_assert!(copy < 2, "metadata copy {copy}");
        self.metadata_offset + u64::from(copy) * self.copy_region_bytes
    }

    /// Bytes of each copy region that hold records: `slots × record_bytes`
    /// (the rest of the region, up to `copy_region_bytes`, is zero).
    pub fn record_table_bytes(&self) -> u64 {
        self.slots * self.record_bytes
    }

    /// Device offset of `slot`'s line: `data_offset + slot × line_bytes`.
    pub fn line_offset(&self, slot: u64) -> u64 {
        debug_assert!(slot < self.slots, "slot {slot} of {}", self.slots);
        self.data_offset + slot * self.line_bytes
    }

    /// Sectors (512 B) per line, 1 to 2048.
    pub fn sectors_per_line(&self) -> u32 {
        (self.line_bytes / SECTOR_BYTES) as u32
    }

    /// 64-bit words in each of a record's bitmaps (`LineRecord::valid`, `dirty_bits`).
    pub fn bitmap_words(&self) -> usize {
        (self.sectors_per_line() as usize).div_ceil(64)
    }

    /// Bytes of each bitmap on disk: one bit per sector, rounded up to whole bytes.
    pub fn bitmap_bytes(&self) -> usize {
        (self.sectors_per_line() as usize).div_ceil(8)
    }

    /// The byte range on the device that a writer updating `slot`'s record in
    /// copy `copy` writes: the record rounded out to whole sectors, so the
    /// neighbours sharing those sectors are rewritten with their current
    /// bytes. Returns `(offset, length)`.
    pub fn record_write_span(&self, slot: u64, copy: u8) -> (u64, u64) {
        let start = self.record_offset(slot, copy);
        let first = start / SECTOR_BYTES * SECTOR_BYTES;
        let end = (start + self.record_bytes).div_ceil(SECTOR_BYTES) * SECTOR_BYTES;
        (first, end - first)
    }
}

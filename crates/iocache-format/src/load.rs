//! `load_metadata`: from the two metadata copy regions to the current record
//! of every slot.

use crate::error::FormatError;
use crate::layout::Layout;
use crate::record::{decode_record, guess_record, Record, RecordCopy, RecordGuess};
use crate::FORMAT_VERSION_WRITES_EVERY_RECORD;

/// Most corrupt copies [`MetadataLoad::corrupt_examples`] lists.
pub const MAX_CORRUPT_EXAMPLES: usize = 16;

/// What the device says about one slot.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SlotDisk {
    /// The sequence of the newest valid copy (0 when there is none). The next
    /// update of the slot's record carries `sequence + 1`.
    pub sequence: u64,
    /// Which copy (0 or 1) holds the newest valid record; `None` when both
    /// copies are blank or corrupt. The next update should go to the other
    /// copy (either one when `None`).
    pub newest_copy: Option<u8>,
}

impl SlotDisk {
    /// The copy the next update of this slot's record goes to: the one that
    /// does not hold the newest valid record (copy 0 when neither does).
    pub fn next_copy(&self) -> u8 {
        match self.newest_copy {
            Some(c) => 1 - c,
            None => 0,
        }
    }
}

/// A record copy that is neither blank nor valid.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CorruptCopy {
    /// The slot it belongs to.
    pub slot: u64,
    /// Copy 0 or 1.
    pub copy: u8,
    /// Its device offset.
    pub device_offset: u64,
    /// The first check it failed.
    pub reason: String,
    /// What its fields say, read without checks ([`guess_record`]); `None`
    /// when its header is all zero (no record was ever written there).
    pub guess: Option<RecordGuess>,
}

/// The metadata area as loaded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetadataLoad {
    /// `(slot, record)` for every slot whose newest valid record holds a
    /// line, in ascending slot order.
    pub lines: Vec<(u64, Record)>,
    /// One entry per slot, indexed by slot.
    pub slots: Vec<SlotDisk>,
    /// Number of record copies (of both regions) that are neither blank nor valid.
    pub corrupt_copies: u64,
    /// `(device offset, reason)` for the first [`MAX_CORRUPT_EXAMPLES`]
    /// corrupt copies, in slot order (copy 0 before copy 1).
    pub corrupt_examples: Vec<(u64, String)>,
    /// Every corrupt copy, in slot order (copy 0 before copy 1). A corrupt
    /// copy is never used, but it may have been the slot's newest record:
    /// the caller decides whether the slot's valid copy can be trusted.
    pub corrupt: Vec<CorruptCopy>,
}

/// Loads the metadata area: `copy0` and `copy1` are the bytes of the two
/// copy regions (read from `layout.copy_region_offset(0)` and `(1)`), each at
/// least `slots × record_bytes` long (extra bytes are ignored).
///
/// For each slot, both copies are decoded ([`decode_record`]): blank copies
/// are skipped, corrupt ones counted (and the first 16 reported with their
/// device offsets), and the valid copy with the higher sequence is the
/// slot's record (copy 0 on a tie, which a writer that always writes the
/// other copy with sequence + 1 never produces).
///
/// `format_version` is the superblock's: from
/// [`FORMAT_VERSION_WRITES_EVERY_RECORD`] on, every slot's copies were
/// written at format time, so a copy of all zeroes was zeroed after it was
/// written: it is corrupt (reason "all zero", no guess), not blank.
///
/// Errors: an inconsistent layout, or a region shorter than the record table.
pub fn load_metadata(
    copy0: &[u8],
    copy1: &[u8],
    layout: &Layout,
    format_version: u32,
) -> Result<MetadataLoad, FormatError> {
    let zeroed_is_corrupt = format_version >= FORMAT_VERSION_WRITES_EVERY_RECORD;
    layout.validate()?;
    let needed = layout.record_table_bytes();
    for (copy, bytes) in [(0u8, copy0), (1u8, copy1)] {
        if (bytes.len() as u64) < needed {
            return Err(FormatError::MetadataRegionLength {
                copy,
                device_offset: layout.copy_region_offset(copy),
                len: bytes.len(),
                needed,
            });
        }
    }
    // `needed` fits in a slice length, so the slot count fits in usize.
    let record_bytes = layout.record_bytes as usize;
    let slot_count = layout.slots as usize;
    let mut load = MetadataLoad {
        lines: Vec::new(),
        slots: Vec::with_capacity(slot_count),
        corrupt_copies: 0,
        corrupt_examples: Vec::new(),
        corrupt: Vec::new(),
    };
    for slot in 0..slot_count {
        let range = slot * record_bytes..(slot + 1) * record_bytes;
        let mut best: Option<(u8, Record)> = None;
        for (copy, region) in [(0u8, copy0), (1u8, copy1)] {
            let bytes = &region[range.clone()];
            let decoded = match decode_record(bytes, layout) {
                RecordCopy::Blank if zeroed_is_corrupt => RecordCopy::Corrupt(
                    "all zero: every record of this cache was written when it was formatted, so this one \
                     was zeroed since"
                        .to_string(),
                ),
                other => other,
            };
            match decoded {
                RecordCopy::Blank => {}
                RecordCopy::Corrupt(reason) => {
                    load.corrupt_copies += 1;
                    let device_offset = layout.record_offset(slot as u64, copy);
                    if load.corrupt_examples.len() < MAX_CORRUPT_EXAMPLES {
                        load.corrupt_examples.push((
                            device_offset,
                            format!("slot {slot} metadata copy {copy}: {reason}"),
                        ));
                    }
                    load.corrupt.push(CorruptCopy {
                        slot: slot as u64,
                        copy,
                        device_offset,
                        reason,
                        guess: guess_record(bytes, layout),
                    });
                }
                RecordCopy::Valid(record) => {
                    if best.as_ref().is_none_or(|(_, b)| record.sequence > b.sequence) {
                        best = Some((copy, record));
                    }
                }
            }
        }
        match best {
            None => load.slots.push(SlotDisk::default()),
            Some((copy, record)) => {
                load.slots.push(SlotDisk {
                    sequence: record.sequence,
                    newest_copy: Some(copy),
                });
                if record.line.is_some() {
                    load.lines.push((slot as u64, record));
                }
            }
        }
    }
    Ok(load)
}

//! Entry points for fuzzing: arbitrary bytes in, no panic out.
//!
//! Both functions treat their input as (part of) a cache device image, run
//! the decoders over it, and assert the decoders' own promises: anything
//! decoded as valid re-encodes to exactly the bytes it came from, and the
//! metadata load is consistent with its input. A panic here is a bug in the
//! format code, never an expected outcome. Used by the proptests in
//! `tests/hostile.rs` and meant for a cargo-fuzz target:
//!
//! ```ignore
//! libfuzzer_sys::fuzz_target!(|data: &[u8]| {
//!     iocache_format::fuzzing::load_superblock_and_metadata(data);
//!     iocache_format::fuzzing::decode_records(data);
//! });
//! ```

use crate::error::FormatError;
use crate::layout::Layout;
use crate::load::{load_metadata, MetadataLoad, MAX_CORRUPT_EXAMPLES};
use crate::record::{decode_record, encode_record, RecordCopy};
use crate::superblock::{pick_superblock, Superblock, SuperblockFound};
use crate::{SUPERBLOCK_BYTES, SUPERBLOCK_OFFSETS};

/// What [`load_superblock_and_metadata`] made of an image.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)] // one value per call
pub enum ImageOutcome {
    /// Fewer bytes than the two superblock copies.
    TooShort,
    /// Neither superblock copy carries the magic.
    Blank,
    /// A magic but no valid superblock.
    NoValidSuperblock(FormatError),
    /// A valid superblock.
    Loaded {
        /// The current superblock.
        superblock: Superblock,
        /// Its copy (0 = A, 1 = B).
        copy: u8,
        /// The metadata load, or `None` when the metadata area does not lie
        /// within the input.
        metadata: Option<MetadataLoad>,
    },
}

/// Treats `bytes` as a device image: picks the superblock from the two
/// copies at 0 and 4096, and when one is valid and its metadata area (up to
/// `data_offset`) lies within `bytes`, loads the metadata. Never panics
/// unless a decoder breaks its own contract (see the module doc).
pub fn load_superblock_and_metadata(bytes: &[u8]) -> ImageOutcome {
    let sb_end = SUPERBLOCK_OFFSETS[1] as usize + SUPERBLOCK_BYTES;
    if bytes.len() < sb_end {
        return ImageOutcome::TooShort;
    }
    let copy_a = &bytes[..SUPERBLOCK_BYTES];
    let copy_b = &bytes[SUPERBLOCK_OFFSETS[1] as usize..sb_end];
    let (superblock, copy) = match pick_superblock(copy_a, copy_b) {
        Ok(SuperblockFound::Blank) => return ImageOutcome::Blank,
        Err(e) => return ImageOutcome::NoValidSuperblock(e),
        Ok(SuperblockFound::Found { superblock, copy, .. }) => (superblock, copy),
    };
    let source = if copy == 0 { copy_a } else { copy_b };
    let encoded = superblock.encode().expect("a decoded superblock encodes");
    assert!(
        encoded == source,
        "a decoded superblock re-encodes to other bytes"
    );
    decode_settings(&superblock.settings);
    let layout = superblock.layout;
    assert_eq!(
        Layout::for_slots_in_version(superblock.format_version, layout.line_bytes, layout.slots).ok(),
        Some(layout)
    );
    if layout.has_intents() && layout.intent_offset() + layout.intent_bytes <= bytes.len() as u64 {
        let start = layout.intent_offset() as usize;
        scan_intent_log(&bytes[start..start + layout.intent_bytes as usize], &layout);
    }
    let metadata = if layout.data_offset <= bytes.len() as u64 {
        let start0 = layout.copy_region_offset(0) as usize;
        let start1 = layout.copy_region_offset(1) as usize;
        let region = layout.copy_region_bytes as usize;
        let copy0 = &bytes[start0..start0 + region];
        let copy1 = &bytes[start1..start1 + region];
        let load = load_metadata(copy0, copy1, &layout, superblock.format_version)
            .expect("regions within the layout load");
        check_load(&load, copy0, copy1, &layout);
        Some(load)
    } else {
        None
    };
    ImageOutcome::Loaded {
        superblock,
        copy,
        metadata,
    }
}

/// Reads a settings area's text; checks that what it read encodes to a
/// text that reads back the same (less what it could not read).
pub fn decode_settings(text: &str) -> crate::SettingsRecord {
    let record = crate::SettingsRecord::decode(text);
    let again = crate::SettingsRecord::decode(&record.encode());
    assert!(again.unreadable.is_empty(), "an encoded record reads back whole");
    assert_eq!(
        (&again.opened_with, &again.changes, again.reca_line),
        (&record.opened_with, &record.changes, record.reca_line),
        "a settings record reads back as it was written"
    );
    record
}

/// Treats `bytes` as a layout choice and two metadata regions, without
/// needing a valid superblock (so a fuzzer reaches the record decoder
/// directly): byte 0 picks the line size (`512 << (byte % 12)`), the rest
/// is split into two halves, each holding as many records as fit (at most
/// 4096 slots). Every record copy is decoded and, when valid, re-encoded and
/// compared; then the halves are loaded and the load checked. Returns the
/// load, or `None` when the input holds no whole record pair.
pub fn decode_records(bytes: &[u8]) -> Option<MetadataLoad> {
    let (&selector, rest) = bytes.split_first()?;
    let line_bytes = 512u64 << (selector % 12);
    let record_bytes = Layout::record_bytes_for(line_bytes) as usize;
    let half = rest.len() / 2;
    let slots = (half / record_bytes).min(4096);
    if slots == 0 {
        return None;
    }
    let layout = Layout::for_slots(line_bytes, slots as u64).expect("small layouts exist");
    let (copy0, copy1) = rest.split_at(half);
    let mut scratch = vec![0u8; record_bytes];
    for region in [copy0, copy1] {
        for chunk in region.chunks_exact(record_bytes).take(slots) {
            if let RecordCopy::Valid(record) = decode_record(chunk, &layout) {
                encode_record(&record, &layout, &mut scratch).expect("a decoded record encodes");
                assert!(scratch == chunk, "a decoded record re-encodes to other bytes");
            }
        }
    }
    // The high bit picks the rules of a version before records were
    // written at format time (blank copies) or after (zeroed copies).
    let version = if selector & 0x80 == 0 {
        2
    } else {
        crate::FORMAT_VERSION
    };
    let load = load_metadata(copy0, copy1, &layout, version).expect("regions within the layout load");
    check_load(&load, copy0, copy1, &layout);
    Some(load)
}

/// Asserts what `load_metadata` promises about its result.
fn check_load(load: &MetadataLoad, copy0: &[u8], copy1: &[u8], layout: &Layout) {
    let rb = layout.record_bytes as usize;
    assert_eq!(load.slots.len() as u64, layout.slots);
    assert!(load.corrupt_examples.len() <= MAX_CORRUPT_EXAMPLES);
    assert!(load.corrupt_examples.len() as u64 <= load.corrupt_copies);
    assert!(load.corrupt_copies <= 2 * layout.slots);
    assert!(
        load.lines.windows(2).all(|w| w[0].0 < w[1].0),
        "lines in ascending slot order"
    );
    let mut scratch = vec![0u8; rb];
    for (slot, record) in &load.lines {
        let disk = load.slots[*slot as usize];
        let copy = disk.newest_copy.expect("a loaded line comes from a valid copy");
        assert_eq!(disk.sequence, record.sequence);
        assert!(record.line.is_some());
        let region = if copy == 0 { copy0 } else { copy1 };
        let start = *slot as usize * rb;
        encode_record(record, layout, &mut scratch).expect("a loaded record encodes");
        assert!(
            scratch == region[start..start + rb],
            "a loaded record differs from its copy's bytes"
        );
    }
    for (slot, disk) in load.slots.iter().enumerate() {
        if disk.newest_copy.is_none() {
            assert_eq!(disk.sequence, 0);
            assert!(load
                .lines
                .binary_search_by_key(&(slot as u64), |(s, _)| *s)
                .is_err());
        }
    }
}

/// Scans `log` as the intent log of `layout` and checks what the scan
/// accepts: every intent in range, and every valid block re-encoding to its
/// bytes. Returns the intents found.
pub fn scan_intent_log(log: &[u8], layout: &Layout) -> Vec<crate::Intent> {
    let scan = crate::scan_intents(log, layout);
    for intent in &scan.intents {
        assert!(intent.slot < layout.slots, "an intent's slot out of range");
        assert!(intent.pairs.len() <= layout.sectors_per_line() as usize);
        for pair in &intent.pairs {
            assert!(u32::from(pair.sector) < layout.sectors_per_line());
        }
    }
    scan.intents
}

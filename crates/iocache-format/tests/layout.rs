//! Layout arithmetic: record sizes, alignment, no overlap, `fitting`.

mod common;

use common::*;
use iocache_format::*;
use proptest::prelude::*;

#[test]
fn record_bytes_table() {
    let expected = [64, 64, 64, 64, 64, 64, 64, 128, 128, 256, 512, 1024];
    for (line, want) in ALL_LINE_BYTES.iter().zip(expected) {
        assert_eq!(Layout::record_bytes_for(*line), want, "line {line}");
        let layout = Layout::for_slots(*line, 1).unwrap();
        // Header (40) + two bitmaps + crc (4) fit.
        assert!(40 + 2 * layout.bitmap_bytes() as u64 + 4 <= want);
        assert_eq!(layout.bitmap_words(), (*line as usize / 512).div_ceil(64));
        assert_eq!(layout.sectors_per_line() as u64, line / 512);
    }
}

#[test]
fn a_small_layout_by_hand() {
    // 4 KiB lines, 100 slots: records of 64 B, table 6400 B → regions of
    // 8192; the smallest intent log, 64 KiB.
    let l = Layout::for_slots(4096, 100).unwrap();
    assert_eq!(
        l,
        Layout {
            line_bytes: 4096,
            slots: 100,
            record_bytes: 64,
            metadata_offset: 8192,
            copy_region_bytes: 8192,
            intent_bytes: 65536,
            data_offset: 8192 + 2 * 8192 + 65536,
        }
    );
    assert_eq!(l.record_offset(0, 0), 8192);
    assert_eq!(l.record_offset(99, 1), 8192 + 8192 + 99 * 64);
    assert_eq!(l.intent_offset(), 24576);
    assert_eq!(l.line_offset(3), 90112 + 3 * 4096);
    assert_eq!(l.device_bytes(), 90112 + 100 * 4096);
    assert_eq!(l.record_write_span(9, 0), (8192 + 512, 512));
    // Format versions before 4 had no intent log.
    let old = Layout::for_slots_in_version(3, 4096, 100).unwrap();
    assert_eq!(old.intent_bytes, 0);
    assert_eq!(old.data_offset, 8192 + 2 * 8192);
    assert!(old.validate().is_ok());
    assert_eq!(Layout::for_slots_in_version(4, 4096, 100).unwrap(), l);
    // 32 bytes a slot up to 1 MiB.
    assert_eq!(Layout::for_slots(4096, 8192).unwrap().intent_bytes, 256 << 10);
    assert_eq!(Layout::for_slots(4096, 1 << 20).unwrap().intent_bytes, 1 << 20);
    // 1 MiB lines: the data area starts on a 1 MiB boundary.
    let l = Layout::for_slots(1 << 20, 3).unwrap();
    assert_eq!(l.record_bytes, 1024);
    assert_eq!(l.copy_region_bytes, 4096);
    assert_eq!(l.data_offset, 1 << 20);
    assert_eq!(l.record_write_span(1, 1), (8192 + 4096 + 1024, 1024));
}

#[test]
fn invalid_layouts_are_refused() {
    let text = |r: Result<Layout, FormatError>| r.unwrap_err().to_string();
    assert_eq!(
        text(Layout::for_slots(3000, 1)),
        "line_bytes = 3000: not a power of two in 512..=1048576"
    );
    assert!(text(Layout::for_slots(256, 1)).starts_with("line_bytes = 256"));
    assert!(text(Layout::for_slots(2 << 20, 1)).starts_with("line_bytes = 2097152"));
    assert_eq!(
        text(Layout::for_slots(4096, 0)),
        "slots = 0: at least one slot is needed"
    );
    assert!(text(Layout::for_slots(4096, u64::MAX)).contains("overflows 64 bits"));
    assert!(text(Layout::for_slots(4096, u64::MAX / 4096)).contains("overflows 64 bits"));
    assert_eq!(
        text(Layout::fitting(4096, 20_000)),
        "device_bytes = 20000: too small for one 4096-byte line, the smallest layout needs 86016 bytes"
    );
    assert!(text(Layout::fitting(1000, 1 << 30)).starts_with("line_bytes = 1000"));
    let good = Layout::for_slots(4096, 10).unwrap();
    assert!(good.validate().is_ok());
    assert!(Layout {
        copy_region_bytes: 640,
        ..good
    }
    .validate()
    .is_err());
}

#[test]
fn fitting_at_the_extremes() {
    for line in ALL_LINE_BYTES {
        let one = Layout::for_slots(line, 1).unwrap();
        assert_eq!(Layout::fitting(line, one.device_bytes()).unwrap(), one);
        assert!(Layout::fitting(line, one.device_bytes() - 1).is_err());
        let huge = Layout::fitting(line, u64::MAX).unwrap();
        check_layout(&huge);
        // One more slot would not fit in 64 bits at all.
        assert!(Layout::for_slots(line, huge.slots + 1).is_err(), "line {line}");
    }
}

/// Checks everything a layout promises.
fn check_layout(l: &Layout) {
    assert!(l.validate().is_ok());
    // The superblocks end where the metadata starts.
    assert_eq!(SUPERBLOCK_OFFSETS[1] + SUPERBLOCK_BYTES as u64, l.metadata_offset);
    // Regions: 4096-aligned, in order, holding the table, before the data.
    assert!(l.copy_region_bytes.is_multiple_of(4096));
    assert!(l.copy_region_bytes >= l.slots * l.record_bytes);
    assert!(l.copy_region_bytes - l.slots * l.record_bytes < 4096);
    assert_eq!(l.copy_region_offset(0), l.metadata_offset);
    assert_eq!(l.copy_region_offset(1), l.metadata_offset + l.copy_region_bytes);
    // The intent log right after copy 1, then the data.
    assert_eq!(l.intent_offset(), l.copy_region_offset(1) + l.copy_region_bytes);
    assert!(l.intent_bytes.is_multiple_of(4096));
    assert_eq!(l.intent_bytes, Layout::intent_bytes_for(l.line_bytes, l.slots));
    assert!(l.intent_bytes >= 64 << 10);
    assert!(l.intent_offset() + l.intent_bytes <= l.data_offset);
    assert!(l.data_offset.is_multiple_of(4096.max(l.line_bytes)));
    assert!(l.data_offset - (l.intent_offset() + l.intent_bytes) < 4096.max(l.line_bytes));
    assert_eq!(l.device_bytes(), l.data_offset + l.slots * l.line_bytes);
    // Records are a power of two, at least 64.
    assert!(l.record_bytes.is_power_of_two() && l.record_bytes >= 64);
    // Sample slots: first, last, a few between.
    let samples = [0, 1, l.slots / 3, l.slots / 2, l.slots - 1];
    for &slot in samples.iter().filter(|&&s| s < l.slots) {
        for copy in 0..2u8 {
            let at = l.record_offset(slot, copy);
            let end = at + l.record_bytes;
            let region = l.copy_region_offset(copy);
            assert!(at >= region && end <= region + l.copy_region_bytes);
            if l.record_bytes <= SECTOR_BYTES {
                // Inside one sector.
                assert_eq!(
                    at / SECTOR_BYTES,
                    (end - 1) / SECTOR_BYTES,
                    "slot {slot} straddles a sector"
                );
            } else {
                // Whole sectors of its own.
                assert!(at.is_multiple_of(SECTOR_BYTES) && l.record_bytes.is_multiple_of(SECTOR_BYTES));
            }
            let (span_at, span_len) = l.record_write_span(slot, copy);
            assert!(span_at <= at && end <= span_at + span_len);
            assert!(span_at.is_multiple_of(SECTOR_BYTES) && span_len.is_multiple_of(SECTOR_BYTES));
            assert_eq!(span_len, l.record_bytes.max(SECTOR_BYTES));
            assert!(span_at >= region && span_at + span_len <= region + l.copy_region_bytes);
        }
        let line = l.line_offset(slot);
        assert!(line >= l.data_offset && line + l.line_bytes <= l.device_bytes());
        assert!(line.is_multiple_of(l.line_bytes));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn fitting_uses_the_device_and_never_exceeds_it(line in line_bytes(), device in any::<u64>()) {
        match Layout::fitting(line, device) {
            Ok(l) => {
                prop_assert_eq!(l.line_bytes, line);
                prop_assert!(l.device_bytes() <= device);
                let next = Layout::for_slots(line, l.slots + 1);
                prop_assert!(next.is_err() || next.unwrap().device_bytes() > device);
                check_layout(&l);
            }
            Err(FormatError::DeviceTooSmall { needed, .. }) => {
                prop_assert!(needed > device);
                prop_assert_eq!(needed, Layout::for_slots(line, 1).unwrap().device_bytes());
            }
            Err(e) => prop_assert!(false, "{}", e),
        }
    }

    #[test]
    fn fitting_on_realistic_devices(line in line_bytes(), device in (1u64 << 14)..(1u64 << 42)) {
        if let Ok(l) = Layout::fitting(line, device) {
            prop_assert!(l.device_bytes() <= device);
            let next = Layout::for_slots(line, l.slots + 1).unwrap();
            prop_assert!(next.device_bytes() > device);
            check_layout(&l);
        }
    }

    #[test]
    fn every_layout_keeps_its_promises(line in line_bytes(), slots in 1u64..(1 << 36)) {
        check_layout(&Layout::for_slots(line, slots).unwrap());
    }
}

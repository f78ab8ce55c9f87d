//! Bit flips are detected; superblock A/B selection; field errors name the
//! field and the device offset.

mod common;

use common::*;
use iocache_format::*;
use proptest::prelude::*;

fn sample_line(layout: &Layout) -> Record {
    let words = layout.bitmap_words();
    let valid: Vec<u64> = (0..words)
        .map(|w| 0x5555_5555_5555_5555 & word_mask(layout, w))
        .collect();
    let dirty_bits: Vec<u64> = valid.iter().map(|v| v & 0x0f0f_0f0f_0f0f_0f0f).collect();
    Record {
        sequence: 0x0102_0304_0506_0708,
        line: Some(LineRecord::new(
            42,
            123_456,
            Some(0xdead_beef_cafe_f00d),
            valid,
            dirty_bits,
        )),
    }
}

fn clean_line(layout: &Layout) -> Record {
    let mut r = sample_line(layout);
    let line = r.line.as_mut().unwrap();
    line.dirty = false;
    line.dirty_bits.iter_mut().for_each(|w| *w = 0);
    r
}

/// Every single-bit flip of every record kind, for every line size: the copy
/// becomes Corrupt (never Blank, never a valid record).
#[test]
fn every_single_bit_flip_of_a_record_is_detected() {
    for line in ALL_LINE_BYTES {
        let layout = Layout::for_slots(line, 1).unwrap();
        for record in [sample_line(&layout), clean_line(&layout), Record::empty(77)] {
            let bytes = encode(&record, &layout);
            for bit in 0..bytes.len() * 8 {
                let mut flipped = bytes.clone();
                flipped[bit / 8] ^= 1 << (bit % 8);
                match decode_record(&flipped, &layout) {
                    RecordCopy::Corrupt(reason) => assert!(!reason.is_empty()),
                    other => panic!("line {line}, bit {bit}: {other:?}"),
                }
            }
        }
    }
}

/// Records that pass the crc but break a rule are corrupt, with a reason.
#[test]
fn records_with_a_good_crc_but_a_broken_rule_are_corrupt() {
    let layout = Layout::for_slots(4096, 1).unwrap(); // 8 sectors: bitmaps at 40 and 41
    let base = encode(&sample_line(&layout), &layout);
    type Edit = Box<dyn Fn(&mut [u8])>;
    let cases: Vec<(Edit, &str)> = vec![
        (Box::new(|b| b[0] = b'X'), "tag"),
        (Box::new(|b| b[4] = 3), "kind 3"),
        (
            Box::new(|b| {
                b[5] = (b[5] & !1) | 4;
                b[41] = 0
            }),
            "mirror = 0: set on a clean line",
        ),
        (Box::new(|b| b[6] = 13), "line_shift 13"),
        (Box::new(|b| b[7] = 1), "reserved byte at +7"),
        (
            Box::new(|b| b[21] = 1),
            "mirror 256 at +20 without the mirror flag",
        ),
        (Box::new(|b| b[5] |= 16), "unknown flags"),
        // An epoch on a clean line; and one whose record has no room left.
        (
            Box::new(|b| {
                b[5] = (b[5] & !1) | 8;
                b[40 + 1] = 0;
            }),
            "epoch = 0: set on a clean line",
        ),
        (Box::new(|b| b[50] = 1), "padding byte at +50"),
        (Box::new(|b| b[41] |= 0x02), "dirty but not valid"),
        (Box::new(|b| b[5] &= !1), "dirty = false"),
        (Box::new(|b| b[5] &= !2), "without the hash flag"),
        (
            Box::new(|b| {
                b[41] = 0;
                b[5] |= 1
            }),
            "dirty = true: no dirty sector",
        ),
        (
            Box::new(|b| {
                b[40] = 0;
                b[41] = 0;
                b[5] = 2
            }),
            "no valid sector",
        ),
        (
            Box::new(|b| b[24..32].copy_from_slice(&u64::MAX.to_le_bytes())),
            "overflows",
        ),
        (
            Box::new(|b| {
                b[4] = 1;
                b[5] = 0
            }),
            "empty record with a nonzero",
        ),
    ];
    for (edit, expected) in cases {
        let mut bytes = base.clone();
        edit(&mut bytes);
        fix_record_crc(&mut bytes);
        match decode_record(&bytes, &layout) {
            RecordCopy::Corrupt(reason) => {
                assert!(reason.contains(expected), "expected {expected:?}: {reason}")
            }
            other => panic!("expected {expected:?}: {other:?}"),
        }
    }
    // Bits beyond a 512-byte line's single sector.
    let layout = Layout::for_slots(512, 1).unwrap();
    let mut bytes = encode(&clean_line(&layout), &layout);
    bytes[40] |= 0x10;
    fix_record_crc(&mut bytes);
    let RecordCopy::Corrupt(reason) = decode_record(&bytes, &layout) else {
        panic!()
    };
    assert!(reason.contains("beyond the line's 1 sectors"), "{reason}");
    // A record written for another line size.
    let other = Layout::for_slots(1024, 1).unwrap();
    let bytes = encode(&Record::empty(1), &other);
    let RecordCopy::Corrupt(reason) = decode_record(&bytes, &layout) else {
        panic!()
    };
    assert!(reason.contains("line_shift 10"), "{reason}");
    // All zero is blank, not corrupt.
    assert_eq!(decode_record(&[0u8; 64], &layout), RecordCopy::Blank);
}

/// Every single-bit flip of a superblock: decode fails, and pick_superblock
/// falls back to the other copy.
#[test]
fn every_single_bit_flip_of_a_superblock_is_detected() {
    let newer = sample_superblock(8);
    let older = sample_superblock(7);
    let bytes = newer.encode().unwrap();
    let older_bytes = older.encode().unwrap();
    for bit in 0..bytes.len() * 8 {
        let mut flipped = bytes.clone();
        flipped[bit / 8] ^= 1 << (bit % 8);
        assert!(Superblock::decode(&flipped, 4096).is_err(), "bit {bit}");
        match pick_superblock(&older_bytes, &flipped).unwrap() {
            SuperblockFound::Found {
                superblock,
                copy: 0,
                other_copy_error: Some(_),
                other_copy_damaged: true,
            } => {
                assert_eq!(superblock, older)
            }
            other => panic!("bit {bit}: {other:?}"),
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Sampled bit flips (1 to 3 bits) of random superblocks.
    #[test]
    fn sampled_bit_flips_of_random_superblocks_are_detected(
        sb in superblock(),
        bits in prop::collection::btree_set(0usize..SUPERBLOCK_BYTES * 8, 1..=3),
    ) {
        let mut bytes = sb.encode().unwrap();
        for bit in &bits {
            bytes[bit / 8] ^= 1 << (bit % 8);
        }
        prop_assert!(Superblock::decode(&bytes, 0).is_err());
    }
}

#[test]
fn newest_valid_superblock_wins() {
    let a = sample_superblock(5).encode().unwrap();
    let b = sample_superblock(6).encode().unwrap();
    let found = pick_superblock(&a, &b).unwrap();
    assert!(
        matches!(&found, SuperblockFound::Found { superblock, copy: 1, other_copy_error: None, other_copy_damaged: false } if superblock.sequence == 6)
    );
    assert_eq!(found.update_target(), Some((0, 7)));
    let found = pick_superblock(&b, &a).unwrap();
    assert!(matches!(&found, SuperblockFound::Found { superblock, copy: 0, .. } if superblock.sequence == 6));
    assert_eq!(found.update_target(), Some((1, 7)));
    // A tie (a fresh format writes both copies alike) goes to A.
    let found = pick_superblock(&a, &a).unwrap();
    assert!(matches!(
        found,
        SuperblockFound::Found {
            copy: 0,
            other_copy_error: None,
            ..
        }
    ));
}

#[test]
fn a_corrupt_newest_superblock_falls_back_to_the_older() {
    let a = sample_superblock(5).encode().unwrap();
    let mut b = sample_superblock(6).encode().unwrap();
    b[100] ^= 0x20;
    match pick_superblock(&a, &b).unwrap() {
        SuperblockFound::Found {
            superblock,
            copy: 0,
            other_copy_error: Some(e),
            other_copy_damaged: true,
        } => {
            assert_eq!(superblock.sequence, 5);
            let text = e.to_string();
            assert!(
                text.starts_with("superblock copy B at offset 4096: crc32c 0x"),
                "{text}"
            );
            assert!(text.contains(" expected 0x"), "{text}");
        }
        other => panic!("{other:?}"),
    }
    // Copy A never written, B valid.
    let zero = vec![0u8; SUPERBLOCK_BYTES];
    let b = sample_superblock(1).encode().unwrap();
    match pick_superblock(&zero, &b).unwrap() {
        SuperblockFound::Found {
            copy: 1,
            other_copy_error: Some(FormatError::NoMagic { .. }),
            other_copy_damaged: false,
            ..
        } => {}
        other => panic!("{other:?}"),
    }
}

#[test]
fn blank_devices_and_hopeless_ones() {
    let zero = vec![0u8; SUPERBLOCK_BYTES];
    assert_eq!(pick_superblock(&zero, &zero).unwrap(), SuperblockFound::Blank);
    assert_eq!(SuperblockFound::Blank.update_target(), None);
    // Whatever a device held before, without the magic it is blank.
    let garbage: Vec<u8> = (0..SUPERBLOCK_BYTES).map(|i| (i * 7 + 3) as u8).collect();
    assert_eq!(pick_superblock(&garbage, &zero).unwrap(), SuperblockFound::Blank);
    // Magic in one copy, neither valid: an error naming both copies.
    let mut a = sample_superblock(3).encode().unwrap();
    a[200] ^= 1;
    let err = pick_superblock(&a, &zero).unwrap_err();
    let text = err.to_string();
    assert!(text.contains("superblock copy A at offset 0: crc32c"), "{text}");
    assert!(
        text.contains("superblock copy B at offset 4096: field magic"),
        "{text}"
    );
    let mut b = sample_superblock(4).encode().unwrap();
    b[4092] ^= 1;
    let text = pick_superblock(&a, &b).unwrap_err().to_string();
    assert!(
        text.contains("copy A at offset 0") && text.contains("copy B at offset 4096"),
        "{text}"
    );
    // Wrong lengths are the caller's error, whatever the bytes.
    let err = pick_superblock(&zero[..100], &zero).unwrap_err().to_string();
    assert_eq!(
        err,
        "superblock copy A at offset 0: 100 bytes given, a superblock copy is exactly 4096 bytes"
    );
}

/// Decoding errors behind a correct crc name the field and its device offset.
#[test]
fn field_errors_name_the_field_and_device_offset() {
    let base = sample_superblock(2).encode().unwrap();
    let edit = |f: &dyn Fn(&mut Vec<u8>)| {
        let mut b = base.clone();
        f(&mut b);
        fix_superblock_crc(&mut b);
        b
    };
    let put64 = |b: &mut Vec<u8>, at: usize, v: u64| b[at..at + 8].copy_from_slice(&v.to_le_bytes());
    let cases: Vec<(Vec<u8>, u64, &str)> = vec![
        (
            edit(&|b| put64(b, 40, 3000)),
            4096,
            "superblock copy B at offset 4096: field line_bytes = 3000 at offset 4136: \
             not a power of two in 512..=1048576",
        ),
        (
            edit(&|b| put64(b, 48, 0)),
            0,
            "superblock copy A at offset 0: field slots = 0 at offset 48: at least one slot is needed",
        ),
        (
            edit(&|b| put64(b, 48, u64::MAX)),
            0,
            "superblock copy A at offset 0: field slots = 18446744073709551615 at offset 48: \
             the device size overflows 64 bits",
        ),
        (
            edit(&|b| put64(b, 56, 64)),
            0,
            "superblock copy A at offset 0: field record_bytes = 64 at offset 56: \
             expected 128 for 1000 slots of 65536 bytes",
        ),
        (
            edit(&|b| put64(b, 64, 0)),
            0,
            "field metadata_offset = 0 at offset 64",
        ),
        (
            edit(&|b| put64(b, 72, 0)),
            0,
            "field copy_region_bytes = 0 at offset 72",
        ),
        (
            edit(&|b| put64(b, 80, 0)),
            0,
            "field data_offset = 0 at offset 80",
        ),
        (
            edit(&|b| b[88..92].copy_from_slice(&[0; 4])),
            0,
            "field shards = 0 at offset 88",
        ),
        (edit(&|b| b[92] = 3), 0, "field persistence = 3 at offset 92"),
        (edit(&|b| b[93] = 2), 4096, "field state = 2 at offset 4189"),
        (
            edit(&|b| b[94] = 65),
            0,
            "field volume_count = 65 at offset 94: at most 64",
        ),
        (edit(&|b| b[94] = 60), 0, "field volumes["),
        (
            edit(&|b| b[96..98].copy_from_slice(&1025u16.to_le_bytes())),
            0,
            "field settings_len = 1025",
        ),
        (
            edit(&|b| b[13] = 1),
            0,
            "field reserved = 0x01 at offset 13: must be zero",
        ),
        (edit(&|b| b[127] = 1), 0, "field reserved = 0x01 at offset 127"),
        (
            edit(&|b| b[4000] = 9),
            4096,
            "field padding = 0x09 at offset 8096: must be zero",
        ),
        (
            edit(&|b| b[150] = 0xff),
            0,
            "field volumes[0].name = 4 bytes at offset 150: invalid utf-8",
        ),
        (edit(&|b| b[140] = 255), 0, "field volumes[1]"),
        (
            edit(&|b| b[141] = 0),
            0,
            "field volumes[0].identity_digest = 0x0123456789abcdef at offset 142: must be zero when \
             identity_kind is 0",
        ),
        (
            edit(&|b| b[154] = 0),
            0,
            "field volumes[1].id = 0 at offset 154: same id as volumes[0]",
        ),
        (
            edit(&|b| b[8..12].copy_from_slice(&6u32.to_le_bytes())),
            4096,
            "superblock copy B at offset 4096: field format_version = 6 at offset 4104: \
             this build reads format versions 1 to 5",
        ),
    ];
    for (bytes, offset, expected) in cases {
        let text = Superblock::decode(&bytes, offset).unwrap_err().to_string();
        assert!(text.contains(expected), "expected {expected:?} in {text:?}");
    }
}

/// An invalid copy never means "clean": whichever copy is damaged, the
/// shutdown state read is "running"; a copy never written (all zero) does
/// not count as damaged.
#[test]
fn a_damaged_copy_makes_the_state_running_whatever_the_valid_copy_says() {
    let mut clean = sample_superblock(5);
    clean.state = ShutdownState::Clean;
    let clean_bytes = clean.encode().unwrap();
    let mut running = sample_superblock(6);
    running.state = ShutdownState::Running;
    let running_bytes = running.encode().unwrap();
    let found = pick_superblock(&clean_bytes, &running_bytes).unwrap();
    assert_eq!(found.shutdown_state(), Some(ShutdownState::Running));
    // Every byte of the newest (running) copy, damaged: the older clean
    // copy is found, but the state is running.
    for at in (0..SUPERBLOCK_BYTES).step_by(7).chain([0, 3, 7, 4092, 4095]) {
        let mut damaged = running_bytes.clone();
        damaged[at] ^= 0x10;
        let found = pick_superblock(&clean_bytes, &damaged).unwrap();
        assert!(
            matches!(
                &found,
                SuperblockFound::Found {
                    copy: 0,
                    other_copy_damaged: true,
                    ..
                }
            ),
            "byte {at}: {found:?}"
        );
        assert_eq!(found.shutdown_state(), Some(ShutdownState::Running), "byte {at}");
    }
    // Torn update: the first sectors of the new copy over the old one.
    let mut torn = clean_bytes.clone();
    torn[..1024].copy_from_slice(&running_bytes[..1024]);
    let found = pick_superblock(&torn, &clean_bytes).unwrap();
    assert_eq!(found.shutdown_state(), Some(ShutdownState::Running));
    // Never written: not damage, the clean state stands.
    let zero = vec![0u8; SUPERBLOCK_BYTES];
    let found = pick_superblock(&clean_bytes, &zero).unwrap();
    assert_eq!(found.shutdown_state(), Some(ShutdownState::Clean));
    assert_eq!(SuperblockFound::Blank.shutdown_state(), None);
}

/// A flipped magic byte is told apart from a device that never held a
/// cache: with the magic put back the crc matches.
#[test]
fn a_damaged_magic_is_not_mistaken_for_a_blank_copy() {
    let bytes = sample_superblock(3).encode().unwrap();
    for at in 0..8 {
        let mut damaged = bytes.clone();
        damaged[at] ^= 0x01;
        let err = Superblock::decode(&damaged, 0).unwrap_err();
        assert!(
            matches!(err, FormatError::DamagedMagic { .. }),
            "byte {at}: {err}"
        );
        // Alone on the device (the other copy never written): an error,
        // not a blank device to format.
        let zero = vec![0u8; SUPERBLOCK_BYTES];
        let err = pick_superblock(&damaged, &zero).unwrap_err();
        assert!(err.to_string().contains("damaged"), "{err}");
    }
}

/// The best-effort guess of a corrupt record names what it described.
#[test]
fn corrupt_records_are_guessed_from_their_fields() {
    for line_bytes in [512, 4096, 65536, 1 << 20] {
        let layout = Layout::for_slots(line_bytes, 4).unwrap();
        let mut bytes = encode(&sample_line(&layout), &layout);
        bytes[40] ^= 0x80; // a valid bit: the crc fails
        assert!(matches!(decode_record(&bytes, &layout), RecordCopy::Corrupt(_)));
        let guess = guess_record(&bytes, &layout).expect("a header to read");
        assert_eq!(
            (
                guess.sequence,
                guess.line,
                guess.volume,
                guess.line_index,
                guess.dirty
            ),
            (0x0102_0304_0506_0708, true, 42, 123_456, true)
        );
        let empty = encode(&Record::empty(9), &layout);
        let guess = guess_record(&empty, &layout).unwrap();
        assert!(!guess.line && !guess.dirty);
        // A header of zeros: nothing was ever written there.
        let mut junk = vec![0u8; layout.record_bytes as usize];
        junk[20] = 7;
        assert_eq!(guess_record(&junk, &layout), None);
        // load_metadata lists every corrupt copy with its guess.
        let mut copy0 = vec![0u8; layout.copy_region_bytes as usize];
        let rb = layout.record_bytes as usize;
        copy0[rb..2 * rb].copy_from_slice(&bytes);
        copy0[2 * rb..3 * rb].copy_from_slice(&junk);
        let copy1 = vec![0u8; layout.copy_region_bytes as usize];
        let load = load_metadata(&copy0, &copy1, &layout, 2).unwrap();
        assert_eq!(load.corrupt.len(), 2);
        assert_eq!(
            (
                load.corrupt[0].slot,
                load.corrupt[0].copy,
                load.corrupt[0].device_offset
            ),
            (1, 0, layout.record_offset(1, 0))
        );
        assert!(load.corrupt[0]
            .guess
            .as_ref()
            .is_some_and(|g| g.line_index == 123_456));
        assert_eq!((load.corrupt[1].slot, load.corrupt[1].guess.clone()), (2, None));
    }
}

/// From version 3 on a record copy of all zeroes was zeroed after the
/// format wrote it: corrupt ("all zero"), never blank; before, blank.
#[test]
fn a_zeroed_record_copy_is_corrupt_from_version_3() {
    let layout = Layout::for_slots(4096, 16).unwrap();
    let mut region = empty_region(&layout).unwrap();
    let v3 = load_metadata(&region, &region, &layout, FORMAT_VERSION).unwrap();
    assert_eq!(v3.corrupt_copies, 0);
    assert!(v3
        .slots
        .iter()
        .all(|s| s.newest_copy == Some(0) && s.sequence == 0));
    let rb = layout.record_bytes as usize;
    region[3 * rb..4 * rb].fill(0);
    let zeroed = load_metadata(&region, &empty_region(&layout).unwrap(), &layout, FORMAT_VERSION).unwrap();
    assert_eq!(zeroed.corrupt_copies, 1);
    assert_eq!((zeroed.corrupt[0].slot, zeroed.corrupt[0].copy), (3, 0));
    assert!(
        zeroed.corrupt[0].reason.contains("all zero"),
        "{}",
        zeroed.corrupt[0].reason
    );
    assert_eq!(zeroed.corrupt[0].guess, None);
    let v2 = load_metadata(&region, &empty_region(&layout).unwrap(), &layout, 2).unwrap();
    assert_eq!(v2.corrupt_copies, 0, "version 2: never written");
}

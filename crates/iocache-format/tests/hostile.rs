//! Hostile input: the fuzzing entry points on random bytes and on mutated
//! valid images never panic (they assert the decoders' contracts inside).

mod common;

use common::*;
use iocache_format::fuzzing::{decode_records, load_superblock_and_metadata, ImageOutcome};
use iocache_format::*;
use proptest::prelude::*;

/// A valid image (superblocks and metadata, no data area) with some records written.
fn image() -> impl Strategy<Value = (Superblock, Vec<u8>)> {
    (superblock(), line_bytes(), 1u64..=48).prop_flat_map(|(sb, line, slots)| {
        let layout = Layout::for_slots(line, slots).unwrap();
        let sb = Superblock { layout, ..sb };
        let updates = prop::collection::vec((0..slots, prop::option::of(line_record(layout))), 0..24);
        (Just(sb), updates).prop_map(|(sb, updates)| {
            let mut img = Image::formatted(sb.layout);
            for (slot, line) in updates {
                img.update(slot, line, u64::MAX);
            }
            let a = sb.encode().unwrap();
            let b = Superblock {
                sequence: sb.sequence.wrapping_add(1),
                ..sb.clone()
            }
            .encode()
            .unwrap();
            img.bytes[..4096].copy_from_slice(&a);
            img.bytes[4096..8192].copy_from_slice(&b);
            (sb, img.bytes)
        })
    })
}

#[derive(Clone, Debug)]
enum Mutation {
    /// Overwrite one byte.
    Byte(usize, u8),
    /// Flip one bit.
    Bit(usize, u8),
    /// Overwrite one byte and recompute the crc of the superblock copy or
    /// record copy it lies in, so the field checks behind the crc run.
    ByteFixCrc(usize, u8),
}

fn apply(bytes: &mut [u8], mutation: &Mutation, layout: &Layout) {
    let len = bytes.len();
    match *mutation {
        Mutation::Byte(at, v) => bytes[at % len] = v,
        Mutation::Bit(at, bit) => bytes[at % len] ^= 1 << (bit % 8),
        Mutation::ByteFixCrc(at, v) => {
            let at = at % len;
            bytes[at] = v;
            if at < 8192 {
                let start = at / 4096 * 4096;
                fix_superblock_crc(&mut bytes[start..start + 4096]);
            } else {
                let rb = layout.record_bytes as usize;
                let start = (at - 8192) / rb * rb + 8192;
                if start + rb <= len {
                    fix_record_crc(&mut bytes[start..start + rb]);
                }
            }
        }
    }
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(a, v)| Mutation::Byte(a, v)),
        (any::<usize>(), any::<u8>()).prop_map(|(a, b)| Mutation::Bit(a, b)),
        // Bias towards the interesting fields: superblock header and volume table.
        (0usize..400, any::<u8>()).prop_map(|(a, v)| Mutation::ByteFixCrc(a, v)),
        (any::<usize>(), any::<u8>()).prop_map(|(a, v)| Mutation::ByteFixCrc(a, v)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Any settings text reads without panicking, and what it read writes
    /// back to a text that reads the same.
    #[test]
    fn any_settings_text_reads_and_writes_back(text in "[ -~\\t\\n]{0,200}") {
        iocache_format::fuzzing::decode_settings(&text);
    }

    /// Texts made of the record's own pieces, which random bytes rarely form.
    #[test]
    fn settings_made_of_tokens_read_and_write_back(
        text in "(v=1|v=2|set:|reca:line_size=|[a-z_]{1,4}|=|[|]|:|[0-9]{1,4}| ){0,40}"
    ) {
        iocache_format::fuzzing::decode_settings(&text);
    }

    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..20_000)) {
        let outcome = load_superblock_and_metadata(&bytes);
        if bytes.len() < 8192 {
            prop_assert!(matches!(outcome, ImageOutcome::TooShort));
        }
        let _ = decode_records(&bytes);
    }

    #[test]
    fn random_bytes_behind_a_magic_never_panic(mut bytes in prop::collection::vec(any::<u8>(), 8192..12_000)) {
        bytes[..8].copy_from_slice(&MAGIC);
        bytes[4096..4104].copy_from_slice(&MAGIC);
        fix_superblock_crc(&mut bytes[..4096]);
        let outcome = load_superblock_and_metadata(&bytes);
        prop_assert!(!matches!(outcome, ImageOutcome::Blank | ImageOutcome::TooShort));
    }

    #[test]
    fn mutated_images_never_panic(
        (sb, bytes) in image(),
        mutations in prop::collection::vec(mutation(), 0..6),
        truncate in prop::option::weighted(0.1, any::<usize>()),
    ) {
        let layout = sb.layout;
        let mut bytes = bytes;
        if mutations.is_empty() && truncate.is_none() {
            match load_superblock_and_metadata(&bytes) {
                ImageOutcome::Loaded { superblock, copy: 1, metadata: Some(load) } => {
                    prop_assert_eq!(superblock.sequence, sb.sequence.wrapping_add(1));
                    prop_assert_eq!(load.corrupt_copies, 0);
                }
                // sequence + 1 wrapped to 0: copy A is newer.
                ImageOutcome::Loaded { copy: 0, metadata: Some(_), .. } if sb.sequence == u64::MAX => {}
                other => prop_assert!(false, "{:?}", other),
            }
        }
        for m in &mutations {
            apply(&mut bytes, m, &layout);
        }
        if let Some(t) = truncate {
            bytes.truncate(t % (bytes.len() + 1));
        }
        let _ = load_superblock_and_metadata(&bytes);
        // The metadata part alone, through the record entry point.
        let mut records = vec![layout.line_bytes.trailing_zeros() as u8 - 9];
        records.extend_from_slice(&bytes[8192.min(bytes.len())..]);
        let _ = decode_records(&records);
    }

    /// Records with correct crcs but arbitrary contents: decode never panics,
    /// and whatever decodes as valid re-encodes to the same bytes.
    #[test]
    fn arbitrary_records_with_good_crcs((layout, raw) in layout(4).prop_flat_map(|l| {
        (Just(l), prop::collection::vec(any::<u8>(), l.record_bytes as usize))
    }), kind in 0u8..4, clear_tail in any::<bool>()) {
        let mut raw = raw;
        raw[..4].copy_from_slice(b"IOCR");
        raw[4] = kind;
        raw[6] = layout.line_bytes.trailing_zeros() as u8;
        if clear_tail {
            let padding_at = 40 + 2 * layout.bitmap_bytes();
            let crc_at = raw.len() - 4;
            raw[padding_at..crc_at].fill(0);
            raw[7] = 0;
            raw[20..24].fill(0);
        }
        fix_record_crc(&mut raw);
        if let RecordCopy::Valid(record) = decode_record(&raw, &layout) {
            prop_assert_eq!(&encode(&record, &layout), &raw);
        }
        let mut image = vec![layout.line_bytes.trailing_zeros() as u8 - 9];
        image.extend_from_slice(&raw);
        image.extend_from_slice(&raw);
        let load = decode_records(&image);
        prop_assert!(load.is_some());
    }
}

fn intent(layout: Layout) -> impl Strategy<Value = Intent> {
    let sectors = layout.sectors_per_line() as u16;
    (
        0..layout.slots,
        any::<u64>(),
        prop::collection::vec((0..sectors, any::<u64>(), prop::option::of(any::<u64>())), 0..12),
    )
        .prop_map(|(slot, sequence, mut pairs)| {
            // One pair per sector, as a write gives.
            pairs.sort_by_key(|p| p.0);
            pairs.dedup_by_key(|p| p.0);
            Intent {
                slot,
                sequence,
                pairs: pairs
                    .into_iter()
                    .map(|(sector, term, base)| IntentPair { sector, term, base })
                    .collect(),
            }
        })
}

proptest! {
    /// Intent logs written block after block, then damaged anywhere: the
    /// scan never panics, never returns an intent out of range, and finds
    /// every block the damage did not touch.
    #[test]
    fn damaged_intent_logs_never_panic_the_scan(
        (layout, groups) in line_bytes().prop_flat_map(|line| {
            let layout = Layout::for_slots(line, 8).unwrap();
            (Just(layout), prop::collection::vec(prop::collection::vec(intent(layout), 1..4), 0..6))
        }),
        damage in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..8),
    ) {
        let mut log = vec![0u8; layout.intent_bytes as usize];
        let mut spans = Vec::new();
        let mut at = 0;
        for group in &groups {
            let mut bytes = Vec::new();
            encode_intent_block(group, &mut bytes);
            log[at..at + bytes.len()].copy_from_slice(&bytes);
            spans.push((at, at + bytes.len(), group.clone()));
            at += bytes.len();
        }
        let mut touched = Vec::new();
        for (index, byte) in damage {
            let i = index.index(log.len());
            if log[i] != byte {
                log[i] = byte;
                touched.push(i);
            }
        }
        let found = iocache_format::fuzzing::scan_intent_log(&log, &layout);
        for (start, end, group) in spans {
            if touched.iter().all(|&i| i < start || i >= end) {
                for intent in &group {
                    prop_assert!(found.contains(intent));
                }
            }
        }
    }
}

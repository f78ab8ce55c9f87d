//! Encode/decode round trips, the encoders' validation, parsing and hashing.

mod common;

use common::*;
use iocache_format::*;
use proptest::prelude::*;

/// A volume of size 0 with no backend identity.
/// Why encoding `sb` fails (it must).
fn encode_error(sb: &Superblock) -> String {
    sb.encode().unwrap_err().to_string()
}

fn bare_volume(id: u32, name: impl Into<String>) -> VolumeEntry {
    VolumeEntry {
        id,
        name: name.into(),
        size_bytes: 0,
        identity: None,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn superblock_round_trips(sb in superblock()) {
        let bytes = sb.encode().unwrap();
        prop_assert_eq!(bytes.len(), SUPERBLOCK_BYTES);
        prop_assert_eq!(&bytes[..8], &MAGIC);
        prop_assert_eq!(&crc32c(&bytes[..4092]).to_le_bytes()[..], &bytes[4092..]);
        for offset in SUPERBLOCK_OFFSETS {
            prop_assert_eq!(&Superblock::decode(&bytes, offset).unwrap(), &sb);
        }
    }

    #[test]
    fn record_round_trips_named_sizes(
        (layout, record) in (named_line_bytes(), 1u64..100)
            .prop_flat_map(|(l, s)| {
                let layout = Layout::for_slots(l, s).unwrap();
                (Just(layout), record(layout))
            })
    ) {
        let bytes = encode(&record, &layout);
        prop_assert_eq!(decode_record(&bytes, &layout), RecordCopy::Valid(record));
    }

    #[test]
    fn record_round_trips_any_size((layout, record) in layout(8).prop_flat_map(|l| (Just(l), record(l)))) {
        let bytes = encode(&record, &layout);
        prop_assert!(bytes.iter().any(|&b| b != 0));
        prop_assert_eq!(decode_record(&bytes, &layout), RecordCopy::Valid(record));
    }

    #[test]
    fn data_hash_valid_equals_hash_of_concatenation(
        (line, valid) in line_bytes().prop_flat_map(|l| {
            let words = (l as usize / 512).div_ceil(64);
            (prop::collection::vec(any::<u8>(), l as usize), prop::collection::vec(any::<u64>(), words))
        })
    ) {
        let mut concatenated = Vec::new();
        for s in 0..line.len() / 512 {
            if valid[s / 64] >> (s % 64) & 1 == 1 {
                concatenated.extend_from_slice(&line[s * 512..(s + 1) * 512]);
            }
        }
        prop_assert_eq!(data_hash_valid(&line, &valid), data_hash(&concatenated));
    }
}

#[test]
fn records_of_every_line_size_round_trip_at_the_extremes() {
    for line in ALL_LINE_BYTES {
        let layout = Layout::for_slots(line, 3).unwrap();
        let words = layout.bitmap_words();
        let full: Vec<u64> = (0..words).map(|w| word_mask(&layout, w)).collect();
        let cases = [
            Record::empty(0),
            Record::empty(u64::MAX),
            Record {
                sequence: 1,
                line: Some(LineRecord {
                    volume: u32::MAX,
                    line_index: u64::MAX / line,
                    dirty: true,
                    data_hash: Some(u64::MAX),
                    valid: full.clone(),
                    dirty_bits: full.clone(),
                    mirror: Some(u32::MAX),
                    // The epoch fills the padding of 32 KiB lines exactly.
                    epoch: Some(u32::MAX),
                }),
            },
            Record {
                sequence: 2,
                line: Some(LineRecord::new(0, 0, None, vec![0; words], vec![0; words])),
            },
            Record {
                sequence: 3,
                line: Some(LineRecord::new(1, 5, Some(0), full.clone(), vec![0; words])),
            },
        ];
        for record in cases {
            let bytes = encode(&record, &layout);
            assert_eq!(
                decode_record(&bytes, &layout),
                RecordCopy::Valid(record),
                "line {line}"
            );
        }
    }
}

#[test]
fn record_bitmaps_are_little_endian_bits_per_sector() {
    let layout = Layout::for_slots(64 << 10, 1).unwrap(); // 128 sectors, 16 bitmap bytes
    let record = Record {
        sequence: 9,
        line: Some(LineRecord::new(
            3,
            4,
            None,
            vec![1 | 1 << 9, 1 << 63],
            vec![1 << 9, 0],
        )),
    };
    let bytes = encode(&record, &layout);
    assert_eq!(&bytes[..4], b"IOCR");
    assert_eq!(bytes[4], 2, "kind line");
    assert_eq!(bytes[5], 1, "dirty flag");
    assert_eq!(bytes[6], 16, "line shift");
    assert_eq!(u64::from_le_bytes(bytes[8..16].try_into().unwrap()), 9);
    assert_eq!(u32::from_le_bytes(bytes[16..20].try_into().unwrap()), 3);
    assert_eq!(u64::from_le_bytes(bytes[24..32].try_into().unwrap()), 4);
    // valid: sector 0 and 9 → bytes 40 (bit 0) and 41 (bit 1); sector 127 → byte 55 bit 7.
    assert_eq!(bytes[40], 1);
    assert_eq!(bytes[41], 2);
    assert_eq!(bytes[55], 0x80);
    // dirty bitmap starts at 56.
    assert_eq!(bytes[57], 2);
    assert_eq!(bytes.len(), 128);
    assert!(bytes[72..124].iter().all(|&b| b == 0));
    assert_eq!(crc32c(&bytes[..124]).to_le_bytes(), bytes[124..]);
}

#[test]
fn encode_record_rejects_broken_lines() {
    let layout = Layout::for_slots(4096, 4).unwrap(); // 8 sectors, one word
    let good = LineRecord::new(1, 2, None, vec![0b1111], vec![0b0011]);
    let mut out = vec![0u8; 64];
    let try_encode = |line: LineRecord, out: &mut [u8]| {
        encode_record(
            &Record {
                sequence: 1,
                line: Some(line),
            },
            &layout,
            out,
        )
        .map_err(|e| e.to_string())
    };
    assert!(try_encode(good.clone(), &mut out).is_ok());
    let cases: Vec<(LineRecord, &str)> = vec![
        (
            LineRecord {
                valid: vec![0b1111, 0],
                ..good.clone()
            },
            "record.line.valid = 2 words: expected 1",
        ),
        (
            LineRecord {
                dirty_bits: vec![],
                ..good.clone()
            },
            "record.line.dirty_bits = 0 words: expected 1",
        ),
        (
            LineRecord {
                valid: vec![1 << 8],
                dirty_bits: vec![0],
                dirty: false,
                ..good.clone()
            },
            "sector 8",
        ),
        (
            LineRecord {
                dirty_bits: vec![0b10000],
                ..good.clone()
            },
            "dirty but not valid",
        ),
        (
            LineRecord {
                dirty: false,
                ..good.clone()
            },
            "the line has dirty sectors",
        ),
        (
            LineRecord {
                dirty_bits: vec![0],
                ..good.clone()
            },
            "record.line.dirty = true: no dirty sector",
        ),
        (
            LineRecord {
                valid: vec![0],
                dirty_bits: vec![0],
                dirty: false,
                data_hash: Some(5),
                ..good.clone()
            },
            "no valid sector",
        ),
        (
            LineRecord {
                line_index: u64::MAX / 4096 + 1,
                ..good.clone()
            },
            "overflows",
        ),
    ];
    for (line, expected) in cases {
        let err = try_encode(line.clone(), &mut out).unwrap_err();
        assert!(err.contains(expected), "{line:?}: {err}");
    }
    let err = encode_record(&Record::empty(1), &layout, &mut [0u8; 128])
        .unwrap_err()
        .to_string();
    assert!(err.contains("out.len() = 128"), "{err}");
    let bad_layout = Layout {
        record_bytes: 128,
        ..layout
    };
    let err = encode_record(&Record::empty(1), &bad_layout, &mut [0u8; 128])
        .unwrap_err()
        .to_string();
    assert!(err.contains("layout.record_bytes = 128"), "{err}");
}

#[test]
fn superblock_encode_rejects_what_decode_would() {
    let sb = sample_superblock(1);
    let cases: Vec<(Superblock, &str)> = vec![
        (
            Superblock {
                shards: 0,
                ..sb.clone()
            },
            "shards = 0",
        ),
        (
            Superblock {
                layout: Layout {
                    data_offset: 0,
                    ..sb.layout
                },
                ..sb.clone()
            },
            "layout.data_offset = 0",
        ),
        (
            Superblock {
                settings: "x".repeat(1025),
                ..sb.clone()
            },
            "settings = 1025 bytes",
        ),
        (
            Superblock {
                volumes: (0..65).map(|i| bare_volume(i, format!("{i}"))).collect(),
                ..sb.clone()
            },
            "volumes = 65 entries",
        ),
        (
            Superblock {
                volumes: vec![bare_volume(1, "é".repeat(128))],
                ..sb.clone()
            },
            "volumes[0].name = 256 bytes",
        ),
        (
            Superblock {
                volumes: vec![bare_volume(1, "a"), bare_volume(1, "b")],
                ..sb.clone()
            },
            "volumes[1].id = 1: same id as volumes[0]",
        ),
        (
            Superblock {
                volumes: vec![bare_volume(1, "a"), bare_volume(2, "a")],
                ..sb.clone()
            },
            "same name as volumes[0]",
        ),
        (
            Superblock {
                volumes: (0..64).map(|i| bare_volume(i, format!("{i:0>60}"))).collect(),
                ..sb.clone()
            },
            "volumes and settings",
        ),
    ];
    for (bad, expected) in cases {
        let err = encode_error(&bad);
        assert!(err.contains(expected), "expected {expected:?} in {err:?}");
    }
    // 64 volumes with 30-byte names and identities fit beside 636 bytes of
    // settings (64 × (22 + 30) + 636 = 3964), and not beside 637.
    let full = Superblock {
        volumes: (0..64)
            .map(|i| VolumeEntry {
                id: i,
                name: format!("{i:0>30}"),
                size_bytes: u64::MAX,
                identity: Some(VolumeIdentity {
                    kind: 1,
                    digest: u64::MAX - u64::from(i),
                }),
            })
            .collect(),
        settings: "s".repeat(636),
        ..sb.clone()
    };
    let bytes = full.encode().unwrap();
    assert_eq!(Superblock::decode(&bytes, 0).unwrap(), full);
    let over = Superblock {
        settings: "s".repeat(637),
        ..full
    };
    assert!(encode_error(&over).contains("volumes and settings"));
    // An identity needs version 3, and kind 0 is "none".
    let mut old = sample_superblock(1);
    old.format_version = 2;
    old.layout = Layout::for_slots_in_version(2, old.layout.line_bytes, old.layout.slots).unwrap();
    assert!(encode_error(&old).contains("has no identities"));
    let mut zero_kind = sample_superblock(1);
    zero_kind.volumes[0].identity = Some(VolumeIdentity { kind: 0, digest: 1 });
    assert!(encode_error(&zero_kind).contains("kind 0"));
}

#[test]
fn superblock_fields_sit_at_their_documented_offsets() {
    let sb = sample_superblock(0x1122_3344_5566_7788);
    let b = sb.encode().unwrap();
    let u64_at = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
    let u32_at = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
    assert_eq!(&b[0..8], b"IOCACHE\0");
    assert_eq!(u32_at(8), 5);
    assert_eq!(u64_at(16), 0x1122_3344_5566_7788);
    assert_eq!(&b[24..40], b"0123456789abcdef");
    assert_eq!(u64_at(40), 64 << 10);
    assert_eq!(u64_at(48), 1000);
    assert_eq!(u64_at(56), 128);
    assert_eq!(u64_at(64), 8192);
    assert_eq!(u64_at(72), sb.layout.copy_region_bytes);
    assert_eq!(u64_at(80), sb.layout.data_offset);
    assert_eq!(u32_at(88), 16);
    assert_eq!(b[92], 0);
    assert_eq!(b[93], 1);
    assert_eq!(u16::from_le_bytes([b[94], b[95]]), 2);
    assert_eq!(
        u16::from_le_bytes([b[96], b[97]]),
        "policy=arc write=wb".len() as u16
    );
    assert_eq!(u32_at(128), 0);
    assert_eq!(u64_at(132), 10 << 30);
    assert_eq!(b[140], 4);
    assert_eq!(b[141], 1, "identity kind");
    assert_eq!(u64_at(142), 0x0123_4567_89ab_cdef, "identity digest");
    assert_eq!(&b[150..154], b"root");
    assert_eq!(u32_at(154), 7);
    let name2 = "données".as_bytes();
    assert_eq!(b[166] as usize, name2.len());
    assert_eq!(b[167], 0, "no identity");
    assert_eq!(u64_at(168), 0);
    assert_eq!(&b[176..176 + name2.len()], name2);
    let settings_at = 176 + name2.len();
    assert_eq!(&b[settings_at..settings_at + 19], b"policy=arc write=wb");
    assert!(b[settings_at + 19..4092].iter().all(|&x| x == 0));
}

#[test]
fn superblocks_of_versions_1_and_2_still_read_and_re_encode() {
    // Versions 1 and 2 have no identity in their volume entries (and no
    // intent log: the layout is the old one).
    let mut sb = sample_superblock(9);
    sb.format_version = 2;
    sb.layout = Layout::for_slots_in_version(2, sb.layout.line_bytes, sb.layout.slots).unwrap();
    for v in &mut sb.volumes {
        v.identity = None;
    }
    let b = sb.encode().unwrap();
    assert_eq!(u32::from_le_bytes(b[8..12].try_into().unwrap()), 2);
    assert_eq!(&b[141..145], b"root", "the name follows name_len");
    assert_eq!(Superblock::decode(&b, 0).unwrap(), sb);
    let mut v1 = b.clone();
    v1[8..12].copy_from_slice(&1u32.to_le_bytes());
    let crc = crc32c(&v1[..4092]);
    v1[4092..].copy_from_slice(&crc.to_le_bytes());
    let decoded = Superblock::decode(&v1, 0).unwrap();
    assert_eq!(decoded.format_version, 1);
    assert_eq!(decoded.volumes, sb.volumes);
    assert_eq!(decoded.encode().unwrap(), v1);
}

#[test]
fn persistence_parses_and_prints() {
    for p in [Persistence::All, Persistence::Dirty, Persistence::None] {
        assert_eq!(p.to_string().parse::<Persistence>().unwrap(), p);
    }
    assert_eq!("dirty".parse::<Persistence>().unwrap(), Persistence::Dirty);
    let err = "some".parse::<Persistence>().unwrap_err().to_string();
    assert_eq!(err, "persistence = \"some\": expected one of: all, dirty, none");
    assert_eq!(ShutdownState::Clean.to_string(), "clean");
}

#[test]
fn a_superblock_whose_layout_does_not_match_its_version_is_refused() {
    // Version 4 has an intent log, older versions none.
    let mut sb = sample_superblock(3);
    sb.layout = Layout::for_slots_in_version(3, sb.layout.line_bytes, sb.layout.slots).unwrap();
    assert!(encode_error(&sb).contains("has an intent log"));
    sb.format_version = 3;
    let bytes = sb.encode().unwrap();
    assert_eq!(Superblock::decode(&bytes, 0).unwrap(), sb);
    // A version 3 superblock read with the new layout's data offset is refused.
    let mut v4_offsets = bytes.clone();
    let new = Layout::for_slots(sb.layout.line_bytes, sb.layout.slots).unwrap();
    v4_offsets[80..88].copy_from_slice(&new.data_offset.to_le_bytes());
    let crc = crc32c(&v4_offsets[..4092]);
    v4_offsets[4092..].copy_from_slice(&crc.to_le_bytes());
    let err = Superblock::decode(&v4_offsets, 0).unwrap_err().to_string();
    assert!(err.contains("data_offset"), "{err}");
}

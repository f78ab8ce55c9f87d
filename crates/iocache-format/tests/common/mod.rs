//! Strategies and helpers shared by the format tests.
#![allow(dead_code)]

use iocache_format::{
    encode_record, Layout, LineRecord, MetadataLoad, Persistence, Record, ShutdownState, Superblock,
    VolumeEntry, VolumeIdentity,
};
use proptest::prelude::*;

/// Every valid line size, 512 B to 1 MiB.
pub const ALL_LINE_BYTES: [u64; 12] = [
    512,
    1 << 10,
    2 << 10,
    4 << 10,
    8 << 10,
    16 << 10,
    32 << 10,
    64 << 10,
    128 << 10,
    256 << 10,
    512 << 10,
    1 << 20,
];

pub fn line_bytes() -> impl Strategy<Value = u64> {
    (0u32..12).prop_map(|shift| 512u64 << shift)
}

/// The line sizes the brief names, plus the two largest record sizes.
pub fn named_line_bytes() -> impl Strategy<Value = u64> {
    prop::sample::select(vec![512u64, 4 << 10, 64 << 10, 512 << 10, 1 << 20])
}

pub fn layout(max_slots: u64) -> impl Strategy<Value = Layout> {
    (line_bytes(), 1..=max_slots).prop_map(|(l, s)| Layout::for_slots(l, s).unwrap())
}

/// Mask of the bits of word `w` that stand for real sectors.
pub fn word_mask(layout: &Layout, w: usize) -> u64 {
    let sectors = layout.sectors_per_line() as usize;
    let first = w * 64;
    if sectors >= first + 64 {
        u64::MAX
    } else {
        (1u64 << (sectors - first)) - 1
    }
}

/// A valid line record for `layout`.
pub fn line_record(layout: Layout) -> impl Strategy<Value = LineRecord> {
    let words = layout.bitmap_words();
    (
        any::<u32>(),
        0..=(u64::MAX / layout.line_bytes),
        prop::collection::vec(any::<u64>(), words),
        prop::collection::vec(any::<u64>(), words),
        prop::collection::vec(0u8..4, words),
        any::<Option<u64>>(),
        any::<Option<u32>>(),
    )
        .prop_map(move |(volume, line_index, v, d, density, hash, mirror)| {
            // Vary the density: some words full, some empty, some random.
            let valid: Vec<u64> = v
                .iter()
                .zip(&density)
                .enumerate()
                .map(|(w, (&bits, &k))| {
                    let bits = match k {
                        0 => 0,
                        1 => u64::MAX,
                        _ => bits,
                    };
                    bits & word_mask(&layout, w)
                })
                .collect();
            let dirty_bits: Vec<u64> = valid.iter().zip(&d).map(|(&v, &d)| v & d).collect();
            let dirty = dirty_bits.iter().any(|&w| w != 0);
            let data_hash = if valid.iter().any(|&w| w != 0) { hash } else { None };
            LineRecord {
                volume,
                line_index,
                dirty,
                data_hash,
                valid,
                dirty_bits,
                mirror: mirror.filter(|_| dirty),
                // Drawn from the mirror's value: some dirty lines carry
                // both, some one, some neither.
                epoch: mirror.filter(|m| dirty && m % 3 != 0).map(|m| m.rotate_left(7)),
            }
        })
}

pub fn record(layout: Layout) -> impl Strategy<Value = Record> {
    (any::<u64>(), prop::option::weighted(0.8, line_record(layout)))
        .prop_map(|(sequence, line)| Record { sequence, line })
}

pub fn encode(record: &Record, layout: &Layout) -> Vec<u8> {
    let mut out = vec![0u8; layout.record_bytes as usize];
    encode_record(record, layout, &mut out).unwrap();
    out
}

fn truncate_utf8(mut s: String, max: usize) -> String {
    while s.len() > max {
        s.pop();
    }
    s
}

pub fn superblock() -> impl Strategy<Value = Superblock> {
    let identity = prop::option::of(
        (1u8..=255, any::<u64>()).prop_map(|(kind, digest)| VolumeIdentity { kind, digest }),
    );
    let volumes = prop::collection::vec((any::<u32>(), "\\PC{0,70}", any::<u64>(), identity), 0..=8)
        .prop_map(|vs| {
            let mut out: Vec<VolumeEntry> = Vec::new();
            for (i, (id, name, size_bytes, identity)) in vs.into_iter().enumerate() {
                // Unique ids and names: the format requires them.
                if out.iter().any(|v| v.id == id) {
                    continue;
                }
                let name = truncate_utf8(format!("{i}:{name}"), 255);
                out.push(VolumeEntry {
                    id,
                    name,
                    size_bytes,
                    identity,
                });
            }
            out
        });
    (
        any::<u64>(),
        any::<[u8; 16]>(),
        line_bytes(),
        1u64..=(1 << 40),
        1u32..=256,
        prop::sample::select(vec![Persistence::All, Persistence::Dirty, Persistence::None]),
        prop::sample::select(vec![ShutdownState::Clean, ShutdownState::Running]),
        volumes,
        "\\PC{0,300}",
    )
        .prop_map(
            |(sequence, cache_uuid, line, slots, shards, persistence, state, volumes, settings)| Superblock {
                format_version: iocache_format::FORMAT_VERSION,
                sequence,
                cache_uuid,
                layout: Layout::for_slots(line, slots).unwrap(),
                shards,
                persistence,
                state,
                volumes,
                settings: truncate_utf8(settings, 1024),
            },
        )
}

/// A fixed superblock with volumes and settings.
pub fn sample_superblock(sequence: u64) -> Superblock {
    Superblock {
        format_version: iocache_format::FORMAT_VERSION,
        sequence,
        cache_uuid: *b"0123456789abcdef",
        layout: Layout::for_slots(64 << 10, 1000).unwrap(),
        shards: 16,
        persistence: Persistence::All,
        state: ShutdownState::Running,
        volumes: vec![
            VolumeEntry {
                id: 0,
                name: "root".into(),
                size_bytes: 10 << 30,
                identity: Some(VolumeIdentity {
                    kind: 1,
                    digest: 0x0123_4567_89ab_cdef,
                }),
            },
            VolumeEntry {
                id: 7,
                name: "données".into(),
                size_bytes: 512,
                identity: None,
            },
        ],
        settings: "policy=arc write=wb".into(),
    }
}

/// Sets the crc32c of a superblock copy after an edit.
pub fn fix_superblock_crc(bytes: &mut [u8]) {
    let crc = crc32c(&bytes[..4092]);
    bytes[4092..].copy_from_slice(&crc.to_le_bytes());
}

/// Sets the crc32c of a record copy after an edit.
pub fn fix_record_crc(bytes: &mut [u8]) {
    let n = bytes.len() - 4;
    let crc = crc32c(&bytes[..n]);
    bytes[n..].copy_from_slice(&crc.to_le_bytes());
}

/// Bitwise crc32c (Castagnoli), independent of the crate's dependency.
pub fn crc32c(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0x82f6_3b78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// The slot's current record as the loader reports it: `None` when neither
/// copy is valid.
pub fn slot_record(load: &MetadataLoad, slot: u64) -> Option<Record> {
    let disk = load.slots[slot as usize];
    disk.newest_copy?;
    match load.lines.binary_search_by_key(&slot, |(s, _)| *s) {
        Ok(i) => Some(load.lines[i].1.clone()),
        Err(_) => Some(Record::empty(disk.sequence)),
    }
}

/// A device image up to `data_offset` (superblocks left zero) for `layout`.
pub struct Image {
    pub layout: Layout,
    pub bytes: Vec<u8>,
}

impl Image {
    pub fn new(layout: Layout) -> Image {
        Image {
            layout,
            bytes: vec![0; layout.data_offset as usize],
        }
    }

    /// An image as a version 3 format leaves it: an empty record of
    /// sequence 0 in both copies of every slot.
    pub fn formatted(layout: Layout) -> Image {
        let mut image = Image::new(layout);
        let empty = iocache_format::empty_region(&layout).unwrap();
        for copy in 0..2u8 {
            let at = layout.copy_region_offset(copy) as usize;
            image.bytes[at..at + empty.len()].copy_from_slice(&empty);
        }
        image
    }

    pub fn region(&self, copy: u8) -> &[u8] {
        let start = self.layout.copy_region_offset(copy) as usize;
        &self.bytes[start..start + self.layout.copy_region_bytes as usize]
    }

    /// Loads the regions by the rules of format version 2, under which a
    /// copy never written is all zero (images from [`Image::new`]); those
    /// of [`Image::formatted`] load the same.
    pub fn load(&self) -> MetadataLoad {
        iocache_format::load_metadata(self.region(0), self.region(1), &self.layout, 2).unwrap()
    }

    /// Writes `record` into `copy` of `slot` as the engine would: the record's
    /// whole sectors, neighbours rewritten with their current bytes, each
    /// sector persisting only when its bit in `survive` is set.
    pub fn write_record(&mut self, slot: u64, copy: u8, record: &Record, survive: u64) {
        let (span_at, span_len) = self.layout.record_write_span(slot, copy);
        let (span_at, span_len) = (span_at as usize, span_len as usize);
        let mut span = self.bytes[span_at..span_at + span_len].to_vec();
        let rec_at = self.layout.record_offset(slot, copy) as usize - span_at;
        span[rec_at..rec_at + self.layout.record_bytes as usize]
            .copy_from_slice(&encode(record, &self.layout));
        for (i, sector) in span.chunks(512).enumerate() {
            if survive >> i & 1 == 1 {
                let at = span_at + i * 512;
                self.bytes[at..at + 512].copy_from_slice(sector);
            }
        }
    }

    /// The writer's rule: the next record of `slot` goes to the copy not
    /// holding the newest valid record, with sequence + 1.
    pub fn update(&mut self, slot: u64, line: Option<LineRecord>, survive: u64) -> Record {
        let disk = self.load().slots[slot as usize];
        let record = Record {
            sequence: disk.sequence + 1,
            line,
        };
        self.write_record(slot, disk.next_copy(), &record, survive);
        record
    }
}

//! Writes seed inputs for the `metadata_loader` fuzz target: small valid
//! device images (superblock pair and record regions with a few lines),
//! so the fuzzer starts past the checksums. Used by scripts/fuzz.sh.
//!
//! cargo run --release -p iocache-format --example format_seeds -- DIR

use iocache_format::{
    encode_record, Layout, LineRecord, Persistence, Record, ShutdownState, Superblock, VolumeEntry,
    SUPERBLOCK_OFFSETS,
};

fn image(line_bytes: u64, slots: u64, dirty: bool) -> Vec<u8> {
    let layout = Layout::for_slots(line_bytes, slots).expect("layout");
    let mut out = vec![0u8; layout.data_offset as usize];
    // Version 2: slots without a record stay all zero, as that version allows.
    let superblock = Superblock {
        format_version: 2,
        sequence: 3,
        cache_uuid: [7; 16],
        layout,
        shards: 1,
        persistence: Persistence::All,
        state: if dirty {
            ShutdownState::Running
        } else {
            ShutdownState::Clean
        },
        volumes: vec![VolumeEntry {
            id: 0,
            name: "seed".into(),
            size_bytes: 1 << 30,
            identity: None,
        }],
        settings: "write_policy=wb".into(),
    };
    let bytes = superblock.encode().expect("superblock");
    out[SUPERBLOCK_OFFSETS[0] as usize..][..bytes.len()].copy_from_slice(&bytes);
    let words = layout.bitmap_words();
    for slot in 0..slots.min(4) {
        let valid = vec![u64::MAX >> (64 - layout.sectors_per_line().min(64)); words];
        let line = LineRecord {
            volume: 0,
            line_index: slot * 3,
            dirty: dirty && slot % 2 == 0,
            data_hash: (!dirty).then_some(slot),
            dirty_bits: if dirty && slot % 2 == 0 {
                valid.clone()
            } else {
                vec![0; words]
            },
            valid,
            mirror: None,
            epoch: None,
        };
        let record = Record {
            sequence: 10 + slot,
            line: Some(line),
        };
        let at = layout.record_offset(slot, (slot % 2) as u8) as usize;
        encode_record(&record, &layout, &mut out[at..at + layout.record_bytes as usize]).expect("record");
    }
    out
}

fn main() {
    let dir = std::env::args().nth(1).expect("usage: format_seeds DIR");
    let dir = std::path::Path::new(&dir).join("metadata_loader");
    std::fs::create_dir_all(&dir).expect("corpus directory");
    for (i, (line, slots, dirty)) in [(4096, 8, true), (512, 16, false), (65536, 4, true)]
        .into_iter()
        .enumerate()
    {
        std::fs::write(dir.join(format!("seed-{i}")), image(line, slots, dirty)).expect("seed");
    }
}

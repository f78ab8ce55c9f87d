//! Damaged metadata is never trusted (issue 11, section 2): a cache whose
//! superblock copies or records are damaged after a crash either refuses to
//! start, naming what is damaged, or serves correct data, never another
//! line's data or the backend's old data in place of a flushed write.
//!
//! The two regressions replay the adversarial tester's reproductions in
//! process; the property test flips every byte of the metadata area of a
//! crashed cache, one at a time, in every persistence mode.

use std::sync::Arc;

use iocache_core::{CacheConfig, LineSize, PolicySpec, WritePolicy};
use iocache_device::{BlockDevice, MemDevice};
use iocache_engine::{Engine, EngineConfig, EngineError, InitMode, Layout, Lookup, Persistence};
use iocache_format::{load_metadata, Superblock, SUPERBLOCK_BYTES, SUPERBLOCK_OFFSETS};

mod common;
use common::{decode, stamps, Model, Rng, SECTOR, VOLUME_SECTORS};

fn config(line_bytes: u64, lines: u64) -> CacheConfig {
    let mut config = CacheConfig::new(lines, LineSize::new(line_bytes).unwrap(), PolicySpec::lru());
    config.write_policy = WritePolicy::WriteBack;
    config
}

fn engine_config(cache: &CacheConfig, persistence: Persistence, init: InitMode) -> EngineConfig {
    EngineConfig {
        lookup: Lookup::Fine,
        shards: 2,
        persistence,
        init,
        ..EngineConfig::new(cache.clone())
    }
}

fn open(
    cache: &CacheConfig,
    persistence: Persistence,
    init: InitMode,
    cache_dev: &Arc<MemDevice>,
    backend: &Arc<MemDevice>,
) -> Result<Engine, EngineError> {
    let c: Arc<dyn BlockDevice> = cache_dev.clone();
    let b: Arc<dyn BlockDevice> = backend.clone();
    Engine::new(engine_config(cache, persistence, init), c, b)
}

fn cache_device(cache: &CacheConfig) -> Arc<MemDevice> {
    let layout = Layout::for_slots(cache.line_size.bytes(), cache.capacity_lines).unwrap();
    Arc::new(MemDevice::new("cache", layout.device_bytes()))
}

/// The content of line `line` of `line_bytes` bytes, distinct per line.
fn line_content(line: u64, line_bytes: u64) -> Vec<u8> {
    stamps(line + 1, line * line_bytes / SECTOR, line_bytes / SECTOR)
}

/// Which superblock copy is the newest valid one.
fn newest_superblock_copy(dev: &MemDevice) -> usize {
    let mut best = (0, 0);
    for (copy, &offset) in SUPERBLOCK_OFFSETS.iter().enumerate() {
        let mut bytes = vec![0u8; SUPERBLOCK_BYTES];
        dev.read_at(&mut bytes, offset).unwrap();
        if let Ok(sb) = Superblock::decode(&bytes, offset) {
            if sb.sequence > best.1 {
                best = (copy, sb.sequence);
            }
        }
    }
    best.0
}

fn flip_byte(dev: &MemDevice, offset: u64, xor: u8) {
    let mut byte = [0u8; 1];
    dev.read_at(&mut byte, offset).unwrap();
    byte[0] ^= xor;
    dev.write_at(&byte, offset).unwrap();
}

/// Reproduction 1: persistence `all`, 1 MiB cache of 4 KiB lines; 1,024
/// distinct lines written, clean shutdown (the snapshot records the 256
/// resident clean lines without a hash, trusted only after a clean
/// shutdown); restart and read 300 other lines without flushing (their
/// fills overwrite the slots in place, their records are not written yet);
/// crash; one byte of the newest superblock copy (saying "running") flipped.
///
/// Before: the older copy, saying "clean", won, the stale unhashed records
/// were trusted, and hundreds of lines returned other lines' data. Now: a
/// damaged copy means "crashed", the unhashed records are dropped, every
/// line reads back right, and the report names the damaged copy.
#[test]
fn a_damaged_newest_superblock_never_makes_a_crashed_cache_look_clean() {
    let line_bytes = 4096;
    let cache = config(line_bytes, 256);
    let lines = 1024;
    let cache_dev = cache_device(&cache);
    let backend = Arc::new(MemDevice::new("backend", lines * line_bytes));

    let engine = open(&cache, Persistence::All, InitMode::Load, &cache_dev, &backend).unwrap();
    for line in 0..lines {
        engine
            .write(line * line_bytes, &line_content(line, line_bytes), false)
            .unwrap();
    }
    engine.shutdown().unwrap();
    drop(engine);

    let engine = open(&cache, Persistence::All, InitMode::Load, &cache_dev, &backend).unwrap();
    assert!(engine.stats().recovery.clean_shutdown);
    let mut buf = vec![0u8; line_bytes as usize];
    for line in 0..300 {
        engine.read(line * line_bytes, &mut buf).unwrap();
        assert_eq!(buf, line_content(line, line_bytes));
    }
    drop(engine); // kill -9: no shutdown

    let newest = newest_superblock_copy(&cache_dev);
    flip_byte(&cache_dev, SUPERBLOCK_OFFSETS[newest] + 100, 0x20);

    let engine = open(&cache, Persistence::All, InitMode::Load, &cache_dev, &backend).unwrap();
    let report = engine.stats().recovery;
    let mut wrong = Vec::new();
    // Newest first: the lines the records name are read before reads of
    // others evict them.
    for line in (0..lines).rev() {
        engine.read(line * line_bytes, &mut buf).unwrap();
        if buf != line_content(line, line_bytes) {
            wrong.push(line);
        }
    }
    assert!(
        wrong.is_empty(),
        "{} lines returned other data (first {:?}); recovery {report:?}",
        wrong.len(),
        &wrong[..wrong.len().min(8)]
    );
    assert!(!report.clean_shutdown, "{report:?}");
    let damaged = report
        .damaged_superblock
        .as_deref()
        .expect("the damaged copy is reported");
    assert!(damaged.contains("crc32c"), "{damaged}");
}

/// Reproduction 2: a flushed dirty line's record has one byte flipped
/// after a crash.
///
/// Before: the server started, logged one line, and served the backend's
/// old data for the flushed write. Now: the start is refused with an error
/// naming the slot, the record's device offset and the line it probably
/// described; with the acknowledgement (`InitMode::LoadAcceptingDamage`) it
/// starts, reports the slot, and blanks the damaged copy so that the next
/// start does not refuse again.
#[test]
fn a_damaged_dirty_record_refuses_the_start_unless_acknowledged() {
    for persistence in [Persistence::Dirty, Persistence::All] {
        let line_bytes = 4096;
        let cache = config(line_bytes, 16);
        let cache_dev = cache_device(&cache);
        let backend = Arc::new(MemDevice::new("backend", 64 * line_bytes));
        let old = vec![0x5a; line_bytes as usize];
        backend.write_at(&old, 5 * line_bytes).unwrap();

        let engine = open(&cache, persistence, InitMode::Load, &cache_dev, &backend).unwrap();
        let new = line_content(5, line_bytes);
        engine.write(5 * line_bytes, &new, false).unwrap();
        engine.flush().unwrap(); // acknowledged durable
        drop(engine); // crash

        let layout = Layout::for_slots(line_bytes, 16).unwrap();
        let region = layout.copy_region_bytes as usize;
        let mut images = [vec![0u8; region], vec![0u8; region]];
        for (copy, image) in images.iter_mut().enumerate() {
            cache_dev
                .read_at(image, layout.copy_region_offset(copy as u8))
                .unwrap();
        }
        let load = load_metadata(&images[0], &images[1], &layout).unwrap();
        let (slot, _) = load
            .lines
            .iter()
            .find(|(_, r)| r.line.as_ref().is_some_and(|l| l.dirty && l.line_index == 5))
            .expect("the flushed write has a dirty record");
        let copy = load.slots[*slot as usize].newest_copy.unwrap();
        let record_at = layout.record_offset(*slot, copy);
        // A byte of the valid bitmap: the record still parses, its crc fails.
        flip_byte(&cache_dev, record_at + 40, 0x01);

        let err = open(&cache, persistence, InitMode::Load, &cache_dev, &backend)
            .err()
            .expect("a damaged dirty record refuses the start");
        let EngineError::DamagedMetadata(damage) = &err else {
            panic!("{err}")
        };
        assert_eq!(damage.slots.len(), 1, "{err}");
        let d = &damage.slots[0];
        assert_eq!((d.slot, d.device_offsets.as_slice()), (*slot, &[record_at][..]));
        let probably = d
            .probably
            .as_ref()
            .expect("the damaged record's fields are guessed");
        assert_eq!(
            (
                probably.volume_name.as_deref(),
                probably.line_index,
                probably.dirty
            ),
            (Some("volume"), 5, true)
        );
        let text = err.to_string();
        assert!(
            text.contains(&format!("slot {slot} (record at device offset {record_at}"))
                && text.contains("probably dirty line 5 of volume `volume`"),
            "{text}"
        );

        // Acknowledged: starts, reports, serves no other line's data.
        let engine = open(
            &cache,
            persistence,
            InitMode::LoadAcceptingDamage,
            &cache_dev,
            &backend,
        )
        .unwrap();
        let report = engine.stats().recovery;
        assert_eq!(report.damaged_slots, damage.slots);
        let mut buf = vec![0u8; line_bytes as usize];
        engine.read(5 * line_bytes, &mut buf).unwrap();
        assert!(buf == new || buf == old, "line 5 holds foreign data");
        engine.shutdown().unwrap();
        drop(engine);
        // The damage was accepted once: a plain start works again.
        let engine = open(&cache, persistence, InitMode::Load, &cache_dev, &backend).unwrap();
        assert!(engine.stats().recovery.damaged_slots.is_empty());
    }
}

/// A flipped byte in the magic of the newest copy is damage, not a copy
/// that was never written: the cache is treated as crashed. With the other
/// copy never written (right after formatting), it is refused rather than
/// formatted over.
#[test]
fn a_damaged_magic_is_damage_not_a_blank_copy() {
    let line_bytes = 4096;
    let cache = config(line_bytes, 16);
    let cache_dev = cache_device(&cache);
    let backend = Arc::new(MemDevice::new("backend", 64 * line_bytes));
    let engine = open(&cache, Persistence::All, InitMode::Load, &cache_dev, &backend).unwrap();
    engine.shutdown().unwrap();
    drop(engine);
    let engine = open(&cache, Persistence::All, InitMode::Load, &cache_dev, &backend).unwrap();
    drop(engine);
    let newest = newest_superblock_copy(&cache_dev);
    flip_byte(&cache_dev, SUPERBLOCK_OFFSETS[newest] + 3, 0x40);
    let engine = open(&cache, Persistence::All, InitMode::Load, &cache_dev, &backend).unwrap();
    let report = engine.stats().recovery;
    assert!(!report.clean_shutdown);
    assert!(
        report
            .damaged_superblock
            .as_deref()
            .is_some_and(|e| e.contains("damaged")),
        "{report:?}"
    );
    drop(engine);

    // Only copy A written, its magic damaged: refused, not formatted.
    let lone = cache_device(&cache);
    let engine = open(&cache, Persistence::All, InitMode::Load, &lone, &backend).unwrap();
    drop(engine);
    lone.write_at(&vec![0u8; SUPERBLOCK_BYTES], SUPERBLOCK_OFFSETS[1])
        .unwrap();
    let newest = newest_superblock_copy(&lone);
    assert_eq!(newest, 0);
    flip_byte(&lone, 0, 0x01);
    let err = open(&cache, Persistence::All, InitMode::Load, &lone, &backend)
        .err()
        .expect("refused");
    assert!(err.to_string().contains("superblock"), "{err}");
}

/// A crashed cache: random writes (some flushed, some FUA, some not),
/// whole-line reads (hashed clean records in mode `all`), evictions with
/// write-backs, then an abandoned engine. Returns the devices' images and
/// the model of what each sector may hold.
fn crashed_cache(cache: &CacheConfig, persistence: Persistence, seed: u64) -> (Vec<u8>, Vec<u8>, Model) {
    let cache_dev = cache_device(cache);
    let backend = Arc::new(MemDevice::new("backend", VOLUME_SECTORS * SECTOR));
    let mut rng = Rng(seed);
    let mut model = Model::new();
    let line_sectors = cache.line_size.bytes() / SECTOR;
    let engine = open(cache, persistence, InitMode::Load, &cache_dev, &backend).unwrap();
    let mut write_no = 0;
    for step in 0..300 {
        match rng.below(10) {
            0 => {
                engine.flush().unwrap();
                model.flushed();
            }
            1..=6 => {
                let sectors = 1 + rng.below(16);
                let first = rng.below(VOLUME_SECTORS - sectors);
                write_no += 1;
                let fua = rng.below(8) == 0;
                engine
                    .write(first * SECTOR, &stamps(write_no, first, sectors), fua)
                    .unwrap();
                for s in first..first + sectors {
                    model.wrote(s, write_no, fua);
                }
            }
            _ => {
                let first = rng.below(VOLUME_SECTORS / line_sectors) * line_sectors;
                let mut buf = vec![0u8; (line_sectors * SECTOR) as usize];
                engine.read(first * SECTOR, &mut buf).unwrap();
            }
        }
        if step == 250 {
            engine.flush().unwrap();
            model.flushed();
        }
    }
    drop(engine); // crash
    let mut c = vec![0u8; cache_dev.len_bytes() as usize];
    cache_dev.read_at(&mut c, 0).unwrap();
    let mut b = vec![0u8; backend.len_bytes() as usize];
    backend.read_at(&mut b, 0).unwrap();
    (c, b, model)
}

/// Opens a copy of the crashed images with one byte changed; an error is
/// fine, a start must serve every sector a value the model allows.
/// Returns whether the start was refused.
fn check_corruption(
    cache: &CacheConfig,
    persistence: Persistence,
    images: &(Vec<u8>, Vec<u8>, Model),
    offset: usize,
    xor: u8,
) -> bool {
    let (c, b, model) = images;
    let cache_dev = Arc::new(MemDevice::new("cache", c.len() as u64));
    let mut damaged = c.clone();
    damaged[offset] ^= xor;
    cache_dev.write_at(&damaged, 0).unwrap();
    let backend = Arc::new(MemDevice::new("backend", b.len() as u64));
    backend.write_at(b, 0).unwrap();
    let Ok(engine) = open(cache, persistence, InitMode::Load, &cache_dev, &backend) else {
        return true;
    };
    let mut volume = vec![0u8; (VOLUME_SECTORS * SECTOR) as usize];
    if engine.read(0, &mut volume).is_err() {
        return true;
    }
    for (sector, bytes) in volume.chunks(SECTOR as usize).enumerate() {
        let sector = sector as u64;
        let found = decode(bytes, sector);
        assert!(
            found.is_some_and(|w| model.acceptable(sector, w)),
            "{persistence}: byte {offset} ^ {xor:#04x}: sector {sector} holds {found:?}, durable {} or later {:?} \
             expected; recovery {:?}",
            model.durable[sector as usize],
            model.since[sector as usize],
            engine.stats().recovery
        );
    }
    false
}

/// Every single-byte change of the metadata area of a crashed cache (both
/// superblock copies, both record regions with their unused tails), in
/// every persistence mode: a refusal, an error, or correct data.
#[test]
fn every_single_byte_corruption_of_the_metadata_of_a_crashed_cache_is_refused_or_harmless() {
    let cache = config(4096, 16);
    let layout = Layout::for_slots(4096, 16).unwrap();
    let metadata_end = (layout.metadata_offset + 2 * layout.copy_region_bytes) as usize;
    for (i, persistence) in [Persistence::All, Persistence::Dirty, Persistence::None]
        .into_iter()
        .enumerate()
    {
        let images = crashed_cache(&cache, persistence, 0x9e37_79b9 + i as u64);
        let mut rng = Rng(0x5eed + i as u64);
        let (mut refused, mut started) = (0, 0);
        // Every byte that can hold something (superblock fields and crc,
        // the records); one in 31 of the zero bytes after them.
        let superblock_used = |at: usize| at % 4096 < 512 || at % 4096 >= 4088;
        let copy_region = layout.copy_region_bytes as usize;
        let table = (layout.slots * layout.record_bytes) as usize;
        let record_used = |at: usize| (at - layout.metadata_offset as usize) % copy_region < table;
        for offset in 0..metadata_end {
            let used = if offset < layout.metadata_offset as usize {
                superblock_used(offset)
            } else {
                record_used(offset)
            };
            if !used && offset % 31 != 0 {
                continue;
            }
            let xor = 1 + rng.below(255) as u8;
            if check_corruption(&cache, persistence, &images, offset, xor) {
                refused += 1;
            } else {
                started += 1;
            }
        }
        // Damage in the records of kept lines refuses; damage in unused
        // bytes, blank copies and (mode none) the records does not.
        assert!(started > 0 && (persistence == Persistence::None || refused > 0));
        eprintln!("{persistence}: {refused} corruptions refused, {started} started and served correct data");
    }
}

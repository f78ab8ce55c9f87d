//! Damaged metadata is never trusted: a cache whose
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
use iocache_engine::{DamagedSlot, Engine, EngineConfig, EngineError, InitMode, Layout, Lookup, Persistence};
use iocache_format::{load_metadata, Superblock, SUPERBLOCK_BYTES, SUPERBLOCK_OFFSETS};

mod common;
use common::{decode, stamps, DeviceWrite, Hook, Hooked, Model, Rng, SECTOR, VOLUME_SECTORS};

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

/// A write-back cache of `slots` lines of `line_bytes` bytes, its device,
/// and a backend of `backend_lines` lines: memory devices that outlive
/// each engine (dropping one is a crash).
fn devices(line_bytes: u64, slots: u64, backend_lines: u64) -> (CacheConfig, Arc<MemDevice>, Arc<MemDevice>) {
    let cache = config(line_bytes, slots);
    let cache_dev = cache_device(&cache);
    let backend = Arc::new(MemDevice::new("backend", backend_lines * line_bytes));
    (cache, cache_dev, backend)
}

/// Writes lines `lines`, each with the content of the line `shift` after it.
fn write_lines(engine: &Engine, lines: std::ops::Range<u64>, line_bytes: u64, shift: u64) {
    for line in lines {
        engine
            .write(line * line_bytes, &line_content(line + shift, line_bytes), false)
            .unwrap();
    }
}

/// A write-back cache of 64 lines of `line_bytes` (persistence `all`) over
/// a backend of 256 lines, whose lines `lines` were written (each with its
/// own content), then `stop` ran on the engine (a flush, a shutdown)
/// before it was dropped. Returns the cache and its devices.
fn lines_written_then(
    line_bytes: u64,
    lines: std::ops::Range<u64>,
    stop: impl FnOnce(&Engine) -> Result<(), EngineError>,
) -> (CacheConfig, Arc<MemDevice>, Arc<MemDevice>) {
    let (cache, cache_dev, backend) = devices(line_bytes, 64, 256);
    let engine = open(&cache, Persistence::All, InitMode::Load, &cache_dev, &backend).unwrap();
    write_lines(&engine, lines, line_bytes, 0);
    stop(&engine).unwrap();
    drop(engine);
    (cache, cache_dev, backend)
}

/// Line 5 of a cache of 16 lines of 4 KiB holds the backend's old data
/// (0x5a); a write over it is flushed (acknowledged durable), then the
/// engine crashes. Returns the line's size, the cache, its devices, and
/// the old data.
fn crash_after_flushing_line_5(
    persistence: Persistence,
) -> (u64, CacheConfig, Arc<MemDevice>, Arc<MemDevice>, Vec<u8>) {
    let line_bytes = 4096;
    let (cache, cache_dev, backend) = devices(line_bytes, 16, 64);
    let old = vec![0x5a; line_bytes as usize];
    backend.write_at(&old, 5 * line_bytes).unwrap();

    let engine = open(&cache, persistence, InitMode::Load, &cache_dev, &backend).unwrap();
    let new = line_content(5, line_bytes);
    engine.write(5 * line_bytes, &new, false).unwrap();
    engine.flush().unwrap(); // acknowledged durable
    drop(engine); // crash
    (line_bytes, cache, cache_dev, backend, old)
}

/// A start of the crashed cache refused for damaged metadata naming one
/// slot (`why`: the damage): that slot, all that is reported damaged, and
/// the refusal's text.
fn refused_naming_one_slot(
    cache: &CacheConfig,
    persistence: Persistence,
    cache_dev: &Arc<MemDevice>,
    backend: &Arc<MemDevice>,
    why: &str,
) -> (Vec<DamagedSlot>, String) {
    let err = open(cache, persistence, InitMode::Load, cache_dev, backend)
        .err()
        .unwrap_or_else(|| panic!("{why} refuses the start"));
    let EngineError::DamagedMetadata(damage) = &err else {
        panic!("{err}")
    };
    assert_eq!(damage.slots.len(), 1, "{err}");
    (damage.slots.clone(), err.to_string())
}

/// Starts the refused cache accepting the damage and reads line 5, then
/// shuts down and starts again without accepting anything (the accepted
/// damage was blanked, so this start is not refused). Returns the slots
/// the accepting start reported, what line 5 held then, and the last engine.
fn accept_damage_and_read_line_5(
    cache: &CacheConfig,
    persistence: Persistence,
    cache_dev: &Arc<MemDevice>,
    backend: &Arc<MemDevice>,
) -> (Vec<DamagedSlot>, Vec<u8>, Engine) {
    let line_bytes = cache.line_size.bytes();
    let engine = open(
        cache,
        persistence,
        InitMode::LoadAcceptingDamage,
        cache_dev,
        backend,
    )
    .unwrap();
    let reported = engine.stats().recovery.damaged_slots;
    let mut buf = vec![0u8; line_bytes as usize];
    engine.read(5 * line_bytes, &mut buf).unwrap();
    engine.shutdown().unwrap();
    drop(engine);
    let engine = open(cache, persistence, InitMode::Load, cache_dev, backend).unwrap();
    (reported, buf, engine)
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
    write_lines(&engine, 0..lines, line_bytes, 0);
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
        let (line_bytes, cache, cache_dev, backend, old) = crash_after_flushing_line_5(persistence);
        let new = line_content(5, line_bytes);

        let layout = Layout::for_slots(line_bytes, 16).unwrap();
        let region = layout.copy_region_bytes as usize;
        let mut images = [vec![0u8; region], vec![0u8; region]];
        for (copy, image) in images.iter_mut().enumerate() {
            cache_dev
                .read_at(image, layout.copy_region_offset(copy as u8))
                .unwrap();
        }
        let load = load_metadata(&images[0], &images[1], &layout, iocache_format::FORMAT_VERSION).unwrap();
        let (slot, _) = load
            .lines
            .iter()
            .find(|(_, r)| r.line.as_ref().is_some_and(|l| l.dirty && l.line_index == 5))
            .expect("the flushed write has a dirty record");
        let copy = load.slots[*slot as usize].newest_copy.unwrap();
        let record_at = layout.record_offset(*slot, copy);
        // A byte of the valid bitmap: the record still parses, its crc fails.
        flip_byte(&cache_dev, record_at + 40, 0x01);

        let (damaged, text) = refused_naming_one_slot(
            &cache,
            persistence,
            &cache_dev,
            &backend,
            "a damaged dirty record",
        );
        let d = &damaged[0];
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
        assert!(
            text.contains(&format!("slot {slot} (record at device offset {record_at}"))
                && text.contains("probably dirty line 5 of volume `volume`"),
            "{text}"
        );

        // Acknowledged: starts, reports, serves no other line's data.
        let (reported, buf, engine) =
            accept_damage_and_read_line_5(&cache, persistence, &cache_dev, &backend);
        assert_eq!(reported, damaged);
        assert!(buf == new || buf == old, "line 5 holds foreign data");
        // The damage was accepted once: a plain start works again.
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
    let (cache, cache_dev, backend) = devices(line_bytes, 16, 64);
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
    let backend = Arc::new(MemDevice::new("backend", VOLUME_SECTORS * SECTOR).identified(same_backend()));
    let mut rng = Rng(seed);
    let mut model = Model::new();
    let line_sectors = cache.line_size.bytes() / SECTOR;
    let engine = open(cache, persistence, InitMode::Load, &cache_dev, &backend).unwrap();
    for step in 0..300 {
        if !model.flush_or_write(&engine, &mut rng) {
            let first = rng.below(VOLUME_SECTORS / line_sectors) * line_sectors;
            let mut buf = vec![0u8; (line_sectors * SECTOR) as usize];
            engine.read(first * SECTOR, &mut buf).unwrap();
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
    // The backend's bytes in a new device: the same backend.
    let backend = Arc::new(MemDevice::new("backend", b.len() as u64).identified(same_backend()));
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

/// The identity of the backend that `crashed_cache` copies into new devices.
fn same_backend() -> iocache_device::DeviceIdentity {
    iocache_device::DeviceIdentity::given("the crashed cache's backend")
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

/// The newest valid record of every slot of a cache device's image.
fn newest_records(cache_image: &[u8], layout: &Layout) -> Vec<(u64, iocache_format::LineRecord)> {
    let region = layout.copy_region_bytes as usize;
    let at = |copy: u8| layout.copy_region_offset(copy) as usize;
    let load = load_metadata(
        &cache_image[at(0)..at(0) + region],
        &cache_image[at(1)..at(1) + region],
        layout,
        iocache_format::FORMAT_VERSION,
    )
    .unwrap();
    load.lines
        .into_iter()
        .filter_map(|(slot, record)| record.line.map(|line| (slot, line)))
        .collect()
}

/// Dirty line data carries a checksum verified at recovery.
/// A flushed dirty line's data has one byte flipped on the cache device
/// after a crash.
///
/// Before: the record was valid, so the line was loaded and the flipped
/// byte served (and later written back) as the client's data. Now: the
/// start is refused naming the slot, the line and why; with the damage
/// acknowledged the line is dropped, so the backend's old data (the last
/// the cache can vouch for) is served, never the damaged bytes.
#[test]
fn a_flipped_byte_in_flushed_dirty_data_refuses_the_start_naming_the_line() {
    for persistence in [Persistence::Dirty, Persistence::All] {
        let (line_bytes, cache, cache_dev, backend, old) = crash_after_flushing_line_5(persistence);

        // A sound restart verifies the line.
        let engine = open(&cache, persistence, InitMode::Load, &cache_dev, &backend).unwrap();
        assert_eq!(engine.stats().recovery.verified_dirty_lines, 1, "{persistence}");
        drop(engine); // crash again, nothing written

        let layout = Layout::for_slots(line_bytes, 16).unwrap();
        let mut image = vec![0u8; cache_dev.len_bytes() as usize];
        cache_dev.read_at(&mut image, 0).unwrap();
        let (slot, line) = newest_records(&image, &layout)
            .into_iter()
            .find(|(_, l)| l.dirty && l.line_index == 5)
            .expect("the flushed write has a dirty record");
        assert!(line.data_hash.is_some(), "the dirty record carries a checksum");
        flip_byte(&cache_dev, layout.line_offset(slot) + 777, 0x10);

        let (damaged, text) =
            refused_naming_one_slot(&cache, persistence, &cache_dev, &backend, "damaged dirty data");
        assert_eq!(damaged[0].slot, slot);
        assert!(
            text.contains("does not match the checksum")
                && text.contains("probably dirty line 5 of volume `volume`"),
            "{text}"
        );

        let (_, mut buf, engine) = accept_damage_and_read_line_5(&cache, persistence, &cache_dev, &backend);
        assert!(
            buf == old,
            "{persistence}: line 5 must not serve the damaged data"
        );
        // Accepted once: both record copies were blanked, a plain start works.
        engine.read(5 * line_bytes, &mut buf).unwrap();
        assert!(buf == old);
    }
}

/// A flushed dirty line rewritten in place and never flushed again, then a
/// crash: legal, so never taken for damage, and still verified: an intent
/// naming the terms each rewrite leaves is durable before it lands.
#[test]
fn rewriting_flushed_dirty_data_in_place_then_crashing_is_not_damage() {
    let line_bytes = 16384; // four writes of 4 KiB per line
                            // Ten dirty lines stay far below the cleaner's dirty threshold.
    let (cache, cache_dev, backend) = devices(line_bytes, 64, 64);
    let engine = open(&cache, Persistence::All, InitMode::Load, &cache_dev, &backend).unwrap();
    let mut model = Model::new();
    let mut write_no = 0;
    let mut write = |engine: &Engine, model: &mut Model, first: u64, sectors: u64| {
        write_no += 1;
        engine
            .write(first * SECTOR, &stamps(write_no, first, sectors), false)
            .unwrap();
        for s in first..first + sectors {
            model.wrote(s, write_no, false);
        }
    };
    // Line 0: two 4 KiB writes, flushed; line 1: one whole write, flushed.
    write(&engine, &mut model, 0, 8);
    write(&engine, &mut model, 16, 8);
    write(&engine, &mut model, 32, 32);
    engine.flush().unwrap();
    model.flushed();
    let intents_before = engine.stats().intents_written;
    // Beside the checksummed sectors: no intent needed.
    write(&engine, &mut model, 8, 8);
    assert_eq!(engine.stats().intents_written, intents_before);
    // Over them, in place: an intent first, for each write.
    write(&engine, &mut model, 4, 8);
    write(&engine, &mut model, 0, 2);
    write(&engine, &mut model, 40, 8);
    assert_eq!(engine.stats().intents_written, intents_before + 3);
    // Many flushed dirty lines rewritten by one request: one flush for all.
    for line in 2..10 {
        write(&engine, &mut model, line * 32, 32);
    }
    engine.flush().unwrap();
    model.flushed();
    let before = engine.stats();
    write(&engine, &mut model, 2 * 32, 8 * 32);
    let after = engine.stats();
    assert_eq!(after.intents_written - before.intents_written, 8);
    assert_eq!(after.intent_flushes - before.intent_flushes, 1);
    drop(engine); // crash without a flush

    let engine = open(&cache, Persistence::All, InitMode::Load, &cache_dev, &backend)
        .expect("a crash after in-place rewrites is not damage");
    let report = engine.stats().recovery;
    assert_eq!(report.dirty_lines, 10, "{report:?}");
    let mut volume = vec![0u8; 320 * SECTOR as usize];
    engine.read(0, &mut volume).unwrap();
    for (sector, bytes) in volume.chunks(SECTOR as usize).enumerate() {
        let sector = sector as u64;
        let found = decode(bytes, sector);
        assert!(
            found.is_some_and(|w| model.acceptable(sector, w)),
            "sector {sector} holds {found:?}"
        );
    }
    // Every line verified: lines 0 and 1 by records the FLUSH after their
    // rewrites wrote, the eight others with the intents of the last write.
    assert_eq!(report.verified_dirty_lines, 10, "{report:?}");
    assert_eq!(report.verified_with_intents, 8, "{report:?}");
    for (first, sectors) in [(0, 24), (16, 16), (32, 20), (40, 24), (64, 256)] {
        engine
            .write(first * SECTOR, &stamps(99, first, sectors), false)
            .unwrap();
    }
    engine.flush().unwrap();
    drop(engine);
    let engine = open(&cache, Persistence::All, InitMode::Load, &cache_dev, &backend).unwrap();
    assert_eq!(engine.stats().recovery.verified_dirty_lines, 10);
}

/// Every single-byte change of the flushed dirty data of a crashed cache
/// whose record carries a checksum refuses the start; a change anywhere in
/// the data area is refused or harmless (never other data served).
#[test]
fn every_corruption_of_checksummed_dirty_data_is_refused() {
    let cache = config(4096, 16);
    let layout = Layout::for_slots(4096, 16).unwrap();
    for (i, persistence) in [Persistence::All, Persistence::Dirty].into_iter().enumerate() {
        // Which lines are still dirty, and which still carry a checksum, at
        // the crash depends on when the cleaner ran (a loaded machine once
        // left none): the next seed is tried, a bounded number of times.
        let (images, records, attempts) = (0..16u64)
            .map(|attempt| {
                let images = crashed_cache(&cache, persistence, 0x51_7cc1 + i as u64 + (attempt << 8));
                let records = newest_records(&images.0, &layout);
                (images, records, attempt + 1)
            })
            .find(|(_, records, _)| records.iter().any(|(_, l)| l.dirty && l.data_hash.is_some()))
            .unwrap_or_else(|| {
                panic!("{persistence}: 16 crashed caches, none with a checksummed dirty line")
            });
        let mut rng = Rng(0xda7a + i as u64);
        let (mut checked, mut unchecksummed) = (0, 0);
        for (slot, line) in &records {
            if !line.dirty {
                continue;
            }
            if line.data_hash.is_none() {
                unchecksummed += 1;
                continue;
            }
            for sector in 0..layout.sectors_per_line() {
                if line.dirty_bits[0] >> sector & 1 == 0 {
                    continue;
                }
                let offset = layout.line_offset(*slot) + u64::from(sector) * SECTOR + rng.below(SECTOR);
                let xor = 1 + rng.below(255) as u8;
                assert!(
                    check_corruption(&cache, persistence, &images, offset as usize, xor),
                    "{persistence}: byte {offset} of slot {slot}'s dirty sector {sector} changed, and the start was not refused"
                );
                checked += 1;
            }
        }
        assert!(checked > 0, "{persistence}: no checksummed dirty line to damage");
        // Anywhere else in the data area: refused, or correct data. (Not
        // in the lines whose checksum a write after the last flush
        // withdrew: those are trusted unverified, docs/format.md.)
        let unverified: Vec<u64> = records
            .iter()
            .filter(|(_, l)| l.dirty && l.data_hash.is_none())
            .map(|(slot, _)| *slot)
            .collect();
        let data_end = layout.line_offset(0) + layout.slots * layout.line_bytes;
        for _ in 0..400 {
            let offset = layout.line_offset(0) + rng.below(data_end - layout.line_offset(0));
            if unverified.contains(&((offset - layout.line_offset(0)) / layout.line_bytes)) {
                continue;
            }
            check_corruption(
                &cache,
                persistence,
                &images,
                offset as usize,
                1 + rng.below(255) as u8,
            );
        }
        // Records without one: lines whose checksum a write after the last
        // flush withdrew (how many depends on the cleaner's timing).
        eprintln!(
            "{persistence}: {checked} dirty-sector corruptions refused; {unchecksummed} dirty records without a checksum; crashed cache {attempts} of 16"
        );
    }
}

/// A cache written by a version 2 build (slots never written are all zero,
/// no backend identity, no intent log: its data area starts elsewhere)
/// still loads: its dirty lines are written back and the device formatted
/// in this version. From then on a zeroed record is damage and another
/// backend is refused.
#[test]
fn a_version_2_cache_is_written_back_and_formatted_anew_then_checked() {
    let line_bytes = 4096;
    // Flushed, then kill -9.
    let (cache, cache_dev, backend) = lines_written_then(line_bytes, 0..16, Engine::flush);

    // Make it what a version 2 build leaves: its layout (no intent log),
    // empty records of sequence 0 never written, no identities.
    let layout = Layout::for_slots(line_bytes, 64).unwrap();
    let old = Layout::for_slots_in_version(2, line_bytes, 64).unwrap();
    let rb = layout.record_bytes as usize;
    let mut empty = vec![0u8; rb];
    iocache_format::encode_record(
        &iocache_format::Record {
            sequence: 0,
            line: None,
        },
        &layout,
        &mut empty,
    )
    .unwrap();
    let mut image = vec![0u8; layout.device_bytes() as usize];
    cache_dev.read_at(&mut image, 0).unwrap();
    let mut moved = vec![0u8; image.len()];
    moved[..old.intent_offset() as usize].copy_from_slice(&image[..old.intent_offset() as usize]);
    for slot in 0..64 {
        let (from, to) = (layout.line_offset(slot) as usize, old.line_offset(slot) as usize);
        moved[to..to + line_bytes as usize].copy_from_slice(&image[from..from + line_bytes as usize]);
    }
    let mut image = moved;
    let mut blanked = 0;
    for copy in 0..2u8 {
        for slot in 0..layout.slots {
            let at = layout.record_offset(slot, copy) as usize;
            if image[at..at + rb] == empty[..] {
                image[at..at + rb].fill(0);
                blanked += 1;
            }
        }
    }
    assert!(blanked > 64, "most slots were never written");
    for (copy, &offset) in SUPERBLOCK_OFFSETS.iter().enumerate() {
        let at = offset as usize;
        if let Ok(mut sb) = Superblock::decode(&image[at..at + SUPERBLOCK_BYTES], offset) {
            sb.format_version = 2;
            sb.layout = old;
            for v in &mut sb.volumes {
                v.identity = None;
            }
            image[at..at + SUPERBLOCK_BYTES].copy_from_slice(&sb.encode().unwrap());
        } else {
            assert_eq!(copy, 1, "copy A is valid");
        }
    }
    cache_dev.write_at(&image, 0).unwrap();

    let engine = open(&cache, Persistence::All, InitMode::Load, &cache_dev, &backend).unwrap();
    let report = engine.stats().recovery;
    assert_eq!(report.upgraded_from_version, Some(2), "{report:?}");
    assert_eq!(report.written_back_lines, 16, "{report:?}");
    assert_eq!(report.dirty_lines, 0, "{report:?}");
    let mut buf = vec![0u8; line_bytes as usize];
    for line in 0..16 {
        let mut direct = vec![0u8; line_bytes as usize];
        backend.read_at(&mut direct, line * line_bytes).unwrap();
        assert_eq!(direct, line_content(line, line_bytes), "line {line} written back");
        engine.read(line * line_bytes, &mut buf).unwrap();
        assert_eq!(buf, line_content(line, line_bytes), "line {line}");
    }
    // Dirty again, then a crash.
    write_lines(&engine, 0..16, line_bytes, 1);
    engine.flush().unwrap();
    drop(engine);
    let engine = open(&cache, Persistence::All, InitMode::Load, &cache_dev, &backend)
        .expect("the new cache starts again");
    let report = engine.stats().recovery;
    assert_eq!(report.upgraded_from_version, None);
    assert_eq!(report.dirty_lines, 16, "{report:?}");
    drop(engine);

    // No record copy is blank, and zeroing one is damage.
    let mut image = vec![0u8; layout.data_offset as usize];
    cache_dev.read_at(&mut image, 0).unwrap();
    for copy in 0..2u8 {
        for slot in 0..layout.slots {
            let at = layout.record_offset(slot, copy) as usize;
            assert!(
                image[at..at + rb].iter().any(|&b| b != 0),
                "slot {slot} copy {copy}"
            );
        }
    }
    let other = Arc::new(MemDevice::new("other", 256 * line_bytes));
    let err = open(&cache, Persistence::All, InitMode::Load, &cache_dev, &other)
        .err()
        .expect("another backend is refused");
    assert!(matches!(err, EngineError::BackendMismatch(_)), "{err}");
    let at = layout.record_offset(0, 0);
    cache_dev.write_at(&vec![0u8; 512], at).unwrap();
    let err = open(&cache, Persistence::All, InitMode::Load, &cache_dev, &backend)
        .err()
        .expect("a zeroed sector of records is refused");
    assert!(matches!(err, EngineError::DamagedMetadata(_)), "{err}");
    assert!(err.to_string().contains("all zero"), "{err}");
}

/// A format interrupted by a crash (superblocks zeroed, records partly
/// rewritten as empty ones) is formatted again at the next start, not
/// refused: empty records describe nothing. Line records after blank
/// superblocks still refuse it.
#[test]
fn a_format_interrupted_by_a_crash_formats_again() {
    let line_bytes = 4096;
    let (cache, cache_dev, backend) = lines_written_then(line_bytes, 0..8, Engine::shutdown);
    // Line records after blank superblocks: refused.
    cache_dev.write_at(&vec![0u8; 2 * SUPERBLOCK_BYTES], 0).unwrap();
    let err = open(&cache, Persistence::All, InitMode::Load, &cache_dev, &backend)
        .err()
        .expect("line records follow blank superblocks");
    assert!(err.to_string().contains("superblocks were zeroed"), "{err}");
    // The crash came after the new (smaller) layout's empty records were
    // written over the old ones: nothing is described, so it formats.
    let smaller = Layout::for_slots(line_bytes, 32).unwrap();
    let empty = iocache_format::empty_region(&smaller).unwrap();
    let old = Layout::for_slots(line_bytes, 64).unwrap();
    for copy in 0..2u8 {
        // What the old layout's regions held beyond the new ones' is
        // rewritten too (by the other copy's region or the data area).
        cache_dev
            .write_at(
                &vec![0u8; old.copy_region_bytes as usize],
                old.copy_region_offset(copy),
            )
            .unwrap();
        cache_dev
            .write_at(&empty, smaller.copy_region_offset(copy))
            .unwrap();
    }
    let engine = open(&cache, Persistence::All, InitMode::Load, &cache_dev, &backend)
        .expect("an interrupted format formats again");
    assert!(!engine.stats().recovery.loaded);
    let mut buf = vec![0u8; line_bytes as usize];
    engine.read(0, &mut buf).unwrap();
    assert_eq!(
        buf,
        line_content(0, line_bytes),
        "written back before the old cache went"
    );
}

/// A cache device's hook that stops taking writes (a crash) right after
/// the write that zeroes both superblocks.
#[derive(Debug, Default)]
struct CrashAfterZeroingSuperblocks {
    crashed: std::sync::atomic::AtomicBool,
}

impl Hook for CrashAfterZeroingSuperblocks {
    fn write(&self, inner: &dyn BlockDevice, w: DeviceWrite<'_>) -> Result<(), iocache_device::DeviceError> {
        let DeviceWrite { data, offset, .. } = w;
        use std::sync::atomic::Ordering;
        if self.crashed.load(Ordering::SeqCst) {
            return Err(iocache_device::DeviceError::Io {
                device: "crashed".into(),
                kind: iocache_device::IoKind::Write,
                offset,
                len: data.len() as u64,
                source: std::io::Error::other("the process is gone"),
            });
        }
        inner.write_at(data, offset)?;
        if offset == 0 && data.len() >= 2 * SUPERBLOCK_BYTES && data.iter().all(|&b| b == 0) {
            self.crashed.store(true, Ordering::SeqCst);
        }
        Ok(())
    }
}

/// A start with another geometry (a line-size change, a resize) writes the
/// dirty lines back and formats the device anew; a crash right after the
/// format zeroed the superblocks leaves no line record behind them (they
/// were blanked first), so the next start formats again instead of
/// refusing, and nothing written is lost.
#[test]
fn a_start_over_interrupted_after_the_superblocks_went_formats_again() {
    let line_bytes = 4096;
    let (_, cache_dev, backend) = lines_written_then(line_bytes, 0..8, Engine::flush);
    let other_geometry = config(line_bytes, 32);
    let crashing: Arc<dyn BlockDevice> = Arc::new(Hooked {
        inner: cache_dev.clone(),
        hook: CrashAfterZeroingSuperblocks::default(),
    });
    let b: Arc<dyn BlockDevice> = backend.clone();
    assert!(
        Engine::new(
            engine_config(&other_geometry, Persistence::All, InitMode::Load),
            crashing,
            b
        )
        .is_err(),
        "the crash interrupts the format"
    );
    let engine = open(
        &other_geometry,
        Persistence::All,
        InitMode::Load,
        &cache_dev,
        &backend,
    )
    .expect("an interrupted start-over formats again");
    assert!(!engine.stats().recovery.loaded);
    let mut buf = vec![0u8; line_bytes as usize];
    for line in 0..8 {
        engine.read(line * line_bytes, &mut buf).unwrap();
        assert_eq!(buf, line_content(line, line_bytes), "line {line}");
    }
}

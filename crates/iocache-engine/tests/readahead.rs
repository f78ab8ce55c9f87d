//! Readahead through the engine: a sequential reader finds the lines
//! ahead of it already cached, filled in the background from the backend;
//! the data read is always the backend's or the latest write, even when
//! writes race the fills; random readers get no fills; the setting
//! changes at run time.

use std::sync::Arc;
use std::time::{Duration, Instant};

use iocache_core::{CacheConfig, LineSize, PolicySpec, Setting, WritePolicy};
use iocache_device::{BlockDevice, MemDevice};
use iocache_engine::{Engine, EngineConfig, Layout, Persistence};

const LINE: u64 = 4096;
const VOLUME: u64 = 16 << 20;

/// The byte the backend holds at `offset` (each 4 KiB block its own).
fn pattern(offset: u64) -> u8 {
    ((offset / LINE) * 7 % 251) as u8
}

fn engine(lines: u64, readahead: &str, policy: WritePolicy) -> Engine {
    let mut cache = CacheConfig::new(lines, LineSize::new(LINE).unwrap(), PolicySpec::lru());
    cache.write_policy = policy;
    cache.readahead = readahead.parse().unwrap();
    let layout = Layout::for_slots(LINE, lines).unwrap();
    let backend = Arc::new(MemDevice::new("backend", VOLUME));
    let data: Vec<u8> = (0..VOLUME).map(pattern).collect();
    backend.write_at(&data, 0).unwrap();
    let config = EngineConfig {
        persistence: Persistence::None,
        ..EngineConfig::new(cache)
    };
    let cache_dev = Arc::new(MemDevice::new("cache", layout.device_bytes()));
    Engine::new(config, cache_dev, backend).unwrap()
}

/// Waits until the engine's fills are done (the queue drains quickly).
fn settle(engine: &Engine) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut last = u64::MAX;
    loop {
        std::thread::sleep(Duration::from_millis(20));
        let s = engine.stats().cache;
        if s.prefetch_requests == last || Instant::now() > deadline {
            return;
        }
        last = s.prefetch_requests;
    }
}

fn read(engine: &Engine, offset: u64, length: u64) -> Vec<u8> {
    let mut b = vec![0u8; length as usize];
    engine.read(offset, &mut b).unwrap();
    b
}

#[test]
fn a_sequential_reader_finds_the_lines_ahead_cached() {
    let e = engine(4096, "seq:min=64KiB:max=1MiB", WritePolicy::WriteBack);
    let mut hits_after_warm = 0;
    let reads = (8 << 20) / (16 << 10);
    for i in 0..reads {
        let offset = i * (16 << 10);
        let before = e.stats().cache.full_hits;
        let data = read(&e, offset, 16 << 10);
        for (j, &b) in data.iter().enumerate() {
            assert_eq!(
                b,
                pattern(offset + j as u64),
                "byte {} of read {i}",
                offset + j as u64
            );
        }
        if i >= 2 {
            hits_after_warm += e.stats().cache.full_hits - before;
        }
        // Give the worker a moment, as a client's think time would.
        if i % 8 == 0 {
            settle(&e);
        }
    }
    settle(&e);
    let s = e.stats();
    let lines_read = (reads - 2) * 4;
    assert!(
        hits_after_warm * 10 >= lines_read * 9,
        "{hits_after_warm} of {lines_read} lines hit after the first two reads"
    );
    assert!(s.cache.prefetched_lines >= lines_read * 9 / 10, "{:?}", s.cache);
    assert!(s.cache.prefetch_used_lines > 0);
    assert_eq!(s.readahead_failed_fills, 0);
}

#[test]
fn random_reads_get_no_fills_and_off_gets_none() {
    let e = engine(1024, "seq", WritePolicy::WriteBack);
    let mut state = 99u64;
    for _ in 0..2000 {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        // Even lines only: no read starts where another ended.
        let offset = ((state >> 33) % (VOLUME / LINE / 2)) * 2 * LINE;
        read(&e, offset, LINE);
    }
    settle(&e);
    assert_eq!(e.stats().cache.prefetch_requests, 0);
    let off = engine(1024, "off", WritePolicy::WriteBack);
    for i in 0..256 {
        read(&off, i * LINE, LINE);
    }
    settle(&off);
    assert_eq!(off.stats().cache.prefetch_requests, 0);
}

#[test]
fn writes_racing_the_fills_are_never_undone() {
    for policy in [WritePolicy::WriteBack, WritePolicy::WriteThrough] {
        let e = Arc::new(engine(2048, "seq:min=64KiB:max=512KiB", policy));
        // A reader streams through the volume while a writer writes lines
        // just ahead of it; afterwards every written line reads back as
        // written and every other line as the backend's.
        let writer = {
            let e = Arc::clone(&e);
            std::thread::spawn(move || {
                let mut written = Vec::new();
                for i in 0..400u64 {
                    let offset = (i * 5 + 3) * LINE;
                    e.write(offset, &vec![0xEE; LINE as usize], false).unwrap();
                    written.push(offset);
                }
                written
            })
        };
        for i in 0..(4 << 20) / LINE {
            read(&e, i * LINE, LINE);
        }
        let written = writer.join().unwrap();
        settle(&e);
        for i in 0..(4 << 20) / LINE {
            let offset = i * LINE;
            let data = read(&e, offset, LINE);
            let expected = if written.contains(&offset) {
                0xEE
            } else {
                pattern(offset)
            };
            assert!(
                data.iter().all(|&b| b == expected),
                "{policy:?}: line at {offset} reads {:#x}, expected {expected:#x}",
                data[0]
            );
        }
        assert!(e.stats().cache.prefetched_lines > 0);
    }
}

#[test]
fn readahead_is_a_setting_changed_at_run_time() {
    let e = engine(1024, "off", WritePolicy::WriteBack);
    for i in 0..64 {
        read(&e, i * LINE, LINE);
    }
    settle(&e);
    assert_eq!(e.stats().cache.prefetch_requests, 0);
    let knobs = e
        .apply_settings(&["readahead=seq:min=16KiB".parse::<Setting>().unwrap()])
        .unwrap();
    let knob = knobs.iter().find(|k| k.key == "readahead").unwrap();
    assert_eq!(knob.current, "seq:min=16KiB:max=1MiB:streams=16");
    for i in 64..128 {
        read(&e, i * LINE, LINE);
    }
    settle(&e);
    assert!(e.stats().cache.prefetch_requests > 0);
    e.apply_settings(&["readahead=off".parse::<Setting>().unwrap()])
        .unwrap();
    let before = e.stats().cache.prefetch_requests;
    for i in 1000..1064 {
        read(&e, i * LINE, LINE);
    }
    settle(&e);
    assert_eq!(e.stats().cache.prefetch_requests, before);
}

/// A miss across several shards' spans is one backend read, returns the
/// backend's data, and leaves the lines cached; a failed joined read
/// fails the request and caches nothing of it.
#[test]
fn a_miss_across_spans_is_one_backend_read() {
    use iocache_device::{FaultDevice, IoKind};
    let lines = 4096;
    let mut cache = CacheConfig::new(lines, LineSize::new(LINE).unwrap(), PolicySpec::lru());
    cache.write_policy = WritePolicy::WriteBack;
    let layout = Layout::for_slots(LINE, lines).unwrap();
    let mem = MemDevice::new("backend", VOLUME);
    let data: Vec<u8> = (0..VOLUME).map(pattern).collect();
    mem.write_at(&data, 0).unwrap();
    let backend = Arc::new(FaultDevice::new(mem));
    let config = EngineConfig {
        persistence: Persistence::None,
        shards: 4,
        ..EngineConfig::new(cache)
    };
    let e = Engine::new(
        config,
        Arc::new(MemDevice::new("cache", layout.device_bytes())),
        backend.clone(),
    )
    .unwrap();
    // 1 MiB from 64 KiB in: five spans of 64 lines, in several shards.
    let before = backend.stats().reads;
    let got = read(&e, 64 << 10, 1 << 20);
    assert_eq!(
        backend.stats().reads - before,
        1,
        "one backend read for the whole miss"
    );
    assert!(got
        .iter()
        .enumerate()
        .all(|(i, &b)| b == pattern((64 << 10) + i as u64)));
    let again = e.stats().cache.full_hits;
    assert_eq!(read(&e, 64 << 10, 1 << 20), got);
    assert_eq!(e.stats().cache.full_hits - again, 256, "every line was cached");
    // A joined read that fails: the request fails, and its lines are read
    // from the backend again afterwards (nothing half-filled is served).
    backend.fail_nth(IoKind::Read, 1);
    let mut buf = vec![0u8; 1 << 20];
    assert!(e.read(4 << 20, &mut buf).is_err());
    backend.clear_faults();
    assert!(read(&e, 4 << 20, 1 << 20)
        .iter()
        .enumerate()
        .all(|(i, &b)| b == pattern((4 << 20) + i as u64)));
}

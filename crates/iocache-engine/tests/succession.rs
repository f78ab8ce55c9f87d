//! What a line size succession takes from the engine it replaces: copies
//! of the clean lines, taken straight from the cache device while it
//! serves, and of those only the ones whose lines did not change before
//! the clients were held (then they are still the backend's data).

use std::sync::Arc;
use std::time::{Duration, Instant};

use iocache_core::{CacheConfig, LineSize, PolicySpec, WritePolicy};
use iocache_device::{BlockDevice, MemDevice};
use iocache_engine::{Engine, EngineConfig, Layout};

const LINE: u64 = 4096;
const LINES: u64 = 64;

fn engine(write_policy: WritePolicy) -> Engine {
    let mut cache = CacheConfig::new(LINES, LineSize::new(LINE).unwrap(), PolicySpec::lru());
    cache.write_policy = write_policy;
    let layout = Layout::for_slots(LINE, LINES).unwrap();
    let backend: Arc<dyn BlockDevice> = Arc::new(MemDevice::new("backend", 4 * LINES * LINE));
    Engine::new(
        EngineConfig::new(cache),
        Arc::new(MemDevice::new("cache", layout.device_bytes())),
        backend,
    )
    .unwrap()
}

fn later() -> Instant {
    Instant::now() + Duration::from_secs(60)
}

#[test]
fn a_copy_is_kept_only_while_its_line_is_unchanged() {
    let engine = engine(WritePolicy::WriteThrough);
    for line in 0..8u64 {
        engine
            .write(line * LINE, &vec![line as u8 + 1; LINE as usize], false)
            .unwrap();
    }
    // Half a line: a copy of the valid sectors only.
    engine.write(8 * LINE, &vec![9u8; 2048], false).unwrap();
    let copies = engine.copy_cached(u64::MAX, later());
    assert_eq!(copies.len(), 9);
    for copy in &copies {
        let line = copy.range.offset / LINE;
        let length = if line == 8 { 2048 } else { LINE };
        assert_eq!((copy.range.offset % LINE, copy.range.length), (0, length));
        assert!(copy.data.iter().all(|&b| b == line as u8 + 1), "line {line}");
    }
    // Changed since: written again (line 2), written in part (line 5),
    // dropped (line 7).
    engine.write(2 * LINE, &vec![0xaa; LINE as usize], false).unwrap();
    engine.write(5 * LINE + 512, &vec![0xbb; 512], false).unwrap();
    engine
        .discard_with(engine.default_volume(), 7 * LINE, LINE, false)
        .unwrap();
    let kept: Vec<u64> = engine
        .copies_unchanged(copies)
        .into_iter()
        .map(|(range, _)| range.offset / LINE)
        .collect();
    assert_eq!(kept, [0, 1, 3, 4, 6, 8]);
}

#[test]
fn dirty_lines_and_the_byte_bound_are_not_copied() {
    let engine = engine(WritePolicy::WriteBack);
    for line in 0..6u64 {
        engine
            .write(line * LINE, &vec![1u8; LINE as usize], false)
            .unwrap();
    }
    assert!(
        engine.copy_cached(u64::MAX, later()).is_empty(),
        "every line is dirty"
    );
    engine.flush_all().unwrap();
    assert_eq!(engine.copy_cached(u64::MAX, later()).len(), 6);
    // A bound is met line by line (the last may pass it).
    assert_eq!(engine.copy_cached(2 * LINE, later()).len(), 2);
    assert!(engine.copy_cached(u64::MAX, Instant::now()).is_empty());
}

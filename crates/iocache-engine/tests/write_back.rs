//! Write-back in runs: adjacent dirty lines go to the backend together,
//! a gap is filled only when it can be read, and a backend that refuses
//! part of a run loses the rest of it nothing.

use std::sync::Arc;

use iocache_core::{CacheConfig, LineSize, PolicySpec, WritePolicy};
use iocache_device::{BlockDevice, FaultDevice, MemDevice};
use iocache_engine::{Engine, EngineConfig, EngineError, Layout};

const LINE: u64 = 4096;
const LINES: u64 = 64;

fn engine(gap: u64) -> (Engine, Arc<FaultDevice<MemDevice>>) {
    let mut cache = CacheConfig::new(LINES, LineSize::new(LINE).unwrap(), PolicySpec::lru());
    cache.write_policy = WritePolicy::WriteBack;
    let layout = Layout::for_slots(LINE, LINES).unwrap();
    let backend = Arc::new(FaultDevice::new(MemDevice::new("backend", 4 * LINES * LINE)));
    let dev: Arc<dyn BlockDevice> = backend.clone();
    let engine = Engine::new(
        EngineConfig {
            write_back_gap_bytes: gap,
            ..EngineConfig::new(cache)
        },
        Arc::new(MemDevice::new("cache", layout.device_bytes())),
        dev,
    )
    .unwrap();
    (engine, backend)
}

/// Lines 0-3 and 6-9 dirty (a two-line gap between), each filled with its
/// own byte; lines 4-5 hold 0xee in the backend beforehand.
fn dirty_around_a_gap(engine: &Engine, backend: &FaultDevice<MemDevice>) {
    backend
        .inner()
        .write_at(&vec![0xee; 2 * LINE as usize], 4 * LINE)
        .unwrap();
    for line in (0..4).chain(6..10) {
        engine
            .write(line * LINE, &vec![line as u8 + 1; LINE as usize], false)
            .unwrap();
    }
}

fn backend_line(backend: &FaultDevice<MemDevice>, line: u64) -> Vec<u8> {
    let mut buf = vec![0u8; LINE as usize];
    backend.inner().read_at(&mut buf, line * LINE).unwrap();
    buf
}

#[test]
fn a_gap_is_filled_with_the_backends_own_bytes() {
    let (engine, backend) = engine(2 * LINE);
    dirty_around_a_gap(&engine, &backend);
    let before = backend.stats().writes;
    engine.flush_all().unwrap();
    assert_eq!(
        backend.stats().writes - before,
        1,
        "one request for the whole run"
    );
    for line in (0..4).chain(6..10) {
        assert_eq!(backend_line(&backend, line), vec![line as u8 + 1; LINE as usize]);
    }
    for line in 4..6 {
        assert_eq!(
            backend_line(&backend, line),
            vec![0xee; LINE as usize],
            "the gap is unchanged"
        );
    }
}

#[test]
fn a_gap_that_cannot_be_read_is_left_and_the_stretches_written_apart() {
    let (engine, backend) = engine(2 * LINE);
    dirty_around_a_gap(&engine, &backend);
    backend.fail_range(4 * LINE, 2 * LINE, true, false);
    let before = backend.stats().writes;
    engine.flush_all().unwrap();
    assert_eq!(backend.stats().writes - before, 2, "one request per stretch");
    assert_eq!(engine.stats().dirty_lines, 0);
    for line in (0..4).chain(6..10) {
        assert_eq!(backend_line(&backend, line), vec![line as u8 + 1; LINE as usize]);
    }
}

#[test]
fn a_stretch_the_backend_refuses_is_retried_line_by_line() {
    let (engine, backend) = engine(0);
    for line in 0..4 {
        engine
            .write(line * LINE, &vec![line as u8 + 1; LINE as usize], false)
            .unwrap();
    }
    // Line 2 cannot be written: the stretch fails, then each line is tried.
    backend.fail_range(2 * LINE, LINE, false, true);
    match engine.flush_all() {
        Err(EngineError::DirtyLinesRemain { lines }) => assert_eq!(lines, 1),
        other => panic!("expected one line left dirty, got {other:?}"),
    }
    for line in [0, 1, 3] {
        assert_eq!(backend_line(&backend, line), vec![line as u8 + 1; LINE as usize]);
    }
    backend.clear_faults();
    engine.flush_all().unwrap();
    assert_eq!(backend_line(&backend, 2), vec![3; LINE as usize]);
}

#[test]
fn runs_to_a_slow_backend_are_written_by_several_threads_and_all_land() {
    // 1 ms a request: the runs (one line in two dirty, no gap filling)
    // are written with several in flight.
    let (engine, backend) = engine(0);
    backend.set_latency(std::time::Duration::from_millis(1));
    for round in 0..3u8 {
        for line in (0..LINES).step_by(2) {
            engine
                .write(line * LINE, &vec![round ^ line as u8; LINE as usize], false)
                .unwrap();
        }
        engine.flush_all().unwrap();
        assert_eq!(engine.stats().dirty_lines, 0);
        for line in (0..LINES).step_by(2) {
            assert_eq!(
                backend_line(&backend, line),
                vec![round ^ line as u8; LINE as usize],
                "round {round}"
            );
        }
    }
}

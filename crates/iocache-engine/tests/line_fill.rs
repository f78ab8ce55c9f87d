//! Whole-line fills through the engine: unaligned reads and writes of a
//! volume whose size is not whole lines, against a model of its bytes,
//! with the fill switched between request and line while it runs; a read
//! miss brings in whole lines (later reads of the rest hit); a restart
//! finds what the line fills cached.

use std::sync::Arc;

use iocache_core::{CacheConfig, Fill, LineSize, PolicySpec, Setting, WritePolicy};
use iocache_device::{BlockDevice, MemDevice};
use iocache_engine::{Engine, EngineConfig, InitMode, Layout, Persistence};

const LINE: u64 = 16384;
/// Not a whole number of lines: the last line runs past the end.
const VOLUME: u64 = (4 << 20) + 3 * 512;

fn pattern(offset: u64) -> u8 {
    (offset / 512 * 13 % 251) as u8
}

/// The backend's initial bytes `offset..offset + length`.
fn initial(offset: u64, length: u64) -> Vec<u8> {
    (offset..offset + length).map(pattern).collect()
}

struct Setup {
    cache_dev: Arc<MemDevice>,
    backend: Arc<MemDevice>,
    lines: u64,
}

impl Setup {
    fn new(lines: u64) -> Setup {
        let backend = Arc::new(MemDevice::new("backend", VOLUME));
        backend.write_at(&initial(0, VOLUME), 0).unwrap();
        let layout = Layout::for_slots(LINE, lines).unwrap();
        Setup {
            cache_dev: Arc::new(MemDevice::new("cache", layout.device_bytes())),
            backend,
            lines,
        }
    }

    fn open(&self, fill: Fill, persistence: Persistence, init: InitMode) -> Engine {
        let mut cache = CacheConfig::new(self.lines, LineSize::new(LINE).unwrap(), PolicySpec::lru());
        cache.write_policy = WritePolicy::WriteBack;
        cache.fill = fill;
        let config = EngineConfig {
            persistence,
            init,
            ..EngineConfig::new(cache)
        };
        Engine::new(config, self.cache_dev.clone(), self.backend.clone()).unwrap()
    }

    /// An engine filling whole lines over a freshly formatted cache.
    fn format(&self, persistence: Persistence) -> Engine {
        self.open(Fill::Line, persistence, InitMode::Format { discard_dirty: false })
    }
}

#[test]
fn unaligned_reads_and_writes_match_a_model_under_both_fills() {
    let setup = Setup::new(64);
    let e = setup.format(Persistence::None);
    let mut model = initial(0, VOLUME);
    let mut state = 3u64;
    let mut next = |n: u64| {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (state >> 33) % n
    };
    for i in 0..4000u64 {
        if i % 500 == 250 {
            let fill = if (i / 500) % 2 == 0 { "request" } else { "line" };
            e.apply_settings(&[format!("fill={fill}").parse::<Setting>().unwrap()])
                .unwrap();
        }
        let sectors = 1 + next(80);
        // Near the end one request in eight, so the last line's fill is tried.
        let start = if next(8) == 0 {
            VOLUME / 512 - sectors - next(40).min(VOLUME / 512 - sectors)
        } else {
            next(VOLUME / 512 - sectors)
        };
        let (offset, length) = (start * 512, sectors * 512);
        if next(4) == 0 {
            let data: Vec<u8> = (0..length).map(|b| (i as u8) ^ (b as u8)).collect();
            e.write(offset, &data, false).unwrap();
            model[offset as usize..(offset + length) as usize].copy_from_slice(&data);
        } else {
            let mut buf = vec![0u8; length as usize];
            e.read(offset, &mut buf).unwrap();
            assert!(
                buf == model[offset as usize..(offset + length) as usize],
                "read {i} of {length} at {offset} differs from the model"
            );
        }
    }
    let s = e.stats().cache;
    assert!(s.full_hits > 0 && s.misses > 0);
}

#[test]
fn a_line_fill_brings_in_the_rest_of_the_line_and_survives_a_restart() {
    let setup = Setup::new(64);
    {
        let e = setup.format(Persistence::All);
        let mut buf = vec![0u8; 512];
        e.read(LINE * 3 + 1024, &mut buf).unwrap();
        assert_eq!(buf, initial(LINE * 3 + 1024, 512));
        let before = e.stats().cache;
        // The rest of line 3 is cached: a read of all of it hits.
        let mut line = vec![0u8; LINE as usize];
        e.read(LINE * 3, &mut line).unwrap();
        assert_eq!(e.stats().cache.full_hits - before.full_hits, 1);
        assert_eq!(line, initial(LINE * 3, LINE));
        e.shutdown().unwrap();
    }
    let e = setup.open(Fill::Line, Persistence::All, InitMode::Load);
    let before = e.stats().cache;
    let mut line = vec![0u8; LINE as usize];
    e.read(LINE * 3, &mut line).unwrap();
    assert_eq!(
        e.stats().cache.full_hits - before.full_hits,
        1,
        "the whole line came back"
    );
    assert_eq!(line, initial(LINE * 3, LINE));
}

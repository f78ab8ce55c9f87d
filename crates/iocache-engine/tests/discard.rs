//! Discards and zeroing through the engine: dirty lines in a trimmed or
//! zeroed range are dropped and never written back, the backend is told
//! (or not), partial lines keep or get their data, a zeroing races no
//! write-back under way, and a restart after a barrier finds nothing of
//! what was dropped.

use std::sync::Arc;

use iocache_core::{CacheConfig, LineSize, PolicySpec, WritePolicy};
use iocache_device::{BlockDevice, FaultDevice, MemDevice};
use iocache_engine::{Engine, EngineConfig, EngineError, InitMode, Layout, Persistence, Zeroing};

const LINE: u64 = 4096;
const VOLUME: u64 = 1 << 20;

fn cache_config(lines: u64) -> CacheConfig {
    let mut c = CacheConfig::new(lines, LineSize::new(LINE).unwrap(), PolicySpec::lru());
    c.write_policy = WritePolicy::WriteBack;
    c
}

struct Setup {
    cache: CacheConfig,
    cache_dev: Arc<MemDevice>,
    backend: Arc<MemDevice>,
}

impl Setup {
    /// A 1 MiB volume whose backend holds 0x11 everywhere, under a cache of
    /// `lines` 4 KiB lines.
    fn new(lines: u64) -> Setup {
        let cache = cache_config(lines);
        let layout = Layout::for_slots(LINE, lines).unwrap();
        let backend = Arc::new(MemDevice::new("backend", VOLUME));
        backend.write_at(&vec![0x11; VOLUME as usize], 0).unwrap();
        Setup {
            cache_dev: Arc::new(MemDevice::new("cache", layout.device_bytes())),
            backend,
            cache,
        }
    }

    fn open(&self, persistence: Persistence, init: InitMode) -> Engine {
        let config = EngineConfig {
            persistence,
            init,
            ..EngineConfig::new(self.cache.clone())
        };
        Engine::new(config, self.cache_dev.clone(), self.backend.clone()).unwrap()
    }

    fn backend_bytes(&self, offset: u64, length: u64) -> Vec<u8> {
        let mut b = vec![0u8; length as usize];
        self.backend.read_at(&mut b, offset).unwrap();
        b
    }
}

fn read(engine: &Engine, offset: u64, length: u64) -> Vec<u8> {
    let mut b = vec![0u8; length as usize];
    engine.read(offset, &mut b).unwrap();
    b
}

fn all(bytes: &[u8], value: u8) -> bool {
    bytes.iter().all(|&b| b == value)
}

#[test]
fn a_trim_drops_dirty_lines_and_never_writes_them_back() {
    for pass_down in [false, true] {
        let s = Setup::new(64);
        let engine = s.open(Persistence::None, InitMode::Load);
        // 16 dirty lines, then a trim of 8 whole lines and two halves.
        engine.write(0, &vec![0x22; 16 * LINE as usize], false).unwrap();
        assert_eq!(engine.stats().dirty_lines, 16);
        let (from, to) = (2 * LINE + 2048, 11 * LINE + 2048);
        engine
            .discard_with(engine.default_volume(), from, to - from, pass_down)
            .unwrap();
        let stats = engine.stats();
        assert_eq!(
            (
                stats.block_commands.dropped_lines,
                stats.block_commands.dropped_dirty_lines
            ),
            (8, 8)
        );
        assert_eq!(stats.dirty_lines, 8, "the partial lines stay");
        // The lines wholly trimmed read as the backend has them now.
        let trimmed = if pass_down { 0x00 } else { 0x11 };
        assert!(
            all(&read(&engine, 3 * LINE, 8 * LINE), trimmed),
            "pass down {pass_down}"
        );
        // The partial lines keep their data, and so does everything outside.
        assert!(all(&read(&engine, 0, 3 * LINE), 0x22));
        assert!(all(&read(&engine, 11 * LINE, 5 * LINE), 0x22));
        engine.flush_all().unwrap();
        assert!(
            all(&s.backend_bytes(3 * LINE, 8 * LINE), trimmed),
            "nothing written back"
        );
        if pass_down {
            // The bytes of the partial lines were discarded too, then their
            // dirty data written back over the hole.
            assert!(all(&s.backend_bytes(2 * LINE, LINE), 0x22));
        }
        assert!(all(&s.backend_bytes(0, 2 * LINE), 0x22));
        assert!(all(&s.backend_bytes(16 * LINE, VOLUME - 16 * LINE), 0x11));
    }
}

#[test]
fn write_zeroes_drops_whole_lines_and_writes_only_the_partial_ones() {
    let s = Setup::new(64);
    let engine = s.open(Persistence::Dirty, InitMode::Load);
    engine.write(0, &vec![0x22; 32 * LINE as usize], false).unwrap();
    let writes_before = engine.stats().cache_queue.classes[1].issued;
    let (from, to) = (LINE + 512, 30 * LINE + 1024);
    let zeroing = Zeroing {
        fua: true,
        ..Zeroing::default()
    };
    engine
        .write_zeroes_with(engine.default_volume(), from, to - from, zeroing)
        .unwrap();
    let cache_writes = engine.stats().cache_queue.classes[1].issued - writes_before;
    assert!(
        cache_writes <= 2,
        "only the two partial lines go through the cache: {cache_writes}"
    );
    let stats = engine.stats();
    assert_eq!(
        (
            stats.block_commands.zeroings,
            stats.block_commands.dropped_dirty_lines
        ),
        (1, 28)
    );
    let got = read(&engine, 0, 40 * LINE);
    assert!(all(&got[..(from as usize)], 0x22));
    assert!(all(&got[from as usize..to as usize], 0x00));
    assert!(all(&got[to as usize..32 * LINE as usize], 0x22));
    assert!(all(&got[32 * LINE as usize..], 0x11));
    engine.shutdown().unwrap();
    assert_eq!(
        s.backend_bytes(0, 40 * LINE),
        got,
        "the backend agrees after write-back"
    );
}

#[test]
fn a_fast_zeroing_the_backend_cannot_do_changes_nothing() {
    let cache = cache_config(64);
    let layout = Layout::for_slots(LINE, 64).unwrap();
    // A backend that zeroes only by writing zero buffers.
    let backend = Arc::new(FaultDevice::new(MemDevice::new("b", VOLUME)));
    backend.set_zeroes_slow(true);
    let engine = Engine::new(
        EngineConfig::new(cache),
        Arc::new(MemDevice::new("cache", layout.device_bytes())),
        backend,
    )
    .unwrap();
    engine.write(0, &vec![0x22; 8 * LINE as usize], false).unwrap();
    let fast = Zeroing {
        fast_only: true,
        ..Zeroing::default()
    };
    let err = engine
        .write_zeroes_with(engine.default_volume(), 0, 8 * LINE, fast)
        .unwrap_err();
    assert!(matches!(err, EngineError::NotSupported(_)), "{err}");
    assert!(all(&read(&engine, 0, 8 * LINE), 0x22), "nothing dropped");
    assert_eq!(engine.stats().dirty_lines, 8);
    // Without FAST_ZERO it is done, with zero buffers on the backend.
    engine
        .write_zeroes_with(engine.default_volume(), 0, 8 * LINE, Zeroing::default())
        .unwrap();
    assert!(all(&read(&engine, 0, 8 * LINE), 0));
    assert_eq!(engine.stats().dirty_lines, 0);
}

#[test]
fn a_zeroing_lands_after_every_write_back_under_way() {
    // The cleaner writes back every dirty line while the same range is
    // zeroed: a write-back decided first must land before the zeroes, one
    // decided later finds the line gone.
    for round in 0..40u8 {
        let s = Setup::new(256);
        let engine = Arc::new(s.open(Persistence::Dirty, InitMode::Load));
        let value = 0x30 + round % 16;
        engine.write(0, &vec![value; 128 * LINE as usize], false).unwrap();
        let flusher = {
            let engine = Arc::clone(&engine);
            std::thread::spawn(move || engine.flush_all())
        };
        if round % 2 == 0 {
            std::thread::yield_now();
        }
        engine
            .write_zeroes_with(engine.default_volume(), 0, 128 * LINE, Zeroing::default())
            .unwrap();
        flusher.join().unwrap().unwrap();
        engine.flush_all().unwrap();
        assert!(all(&read(&engine, 0, 128 * LINE), 0), "round {round}");
        assert!(
            all(&s.backend_bytes(0, 128 * LINE), 0),
            "round {round}: a write-back landed late"
        );
    }
}

#[test]
fn a_restart_after_a_barrier_finds_no_trimmed_dirty_line() {
    for persistence in [Persistence::Dirty, Persistence::All] {
        let s = Setup::new(64);
        let engine = s.open(persistence, InitMode::Load);
        engine.write(0, &vec![0x22; 16 * LINE as usize], false).unwrap();
        engine.flush().unwrap();
        engine
            .discard_with(engine.default_volume(), 0, 8 * LINE, false)
            .unwrap();
        engine.flush().unwrap();
        // A crash: the engine is abandoned without a shutdown.
        drop(engine);
        let engine = s.open(persistence, InitMode::Load);
        assert_eq!(engine.stats().recovery.dirty_lines, 8, "{persistence:?}");
        engine.shutdown().unwrap();
        assert!(
            all(&s.backend_bytes(0, 8 * LINE), 0x11),
            "trimmed data written back"
        );
        assert!(all(&s.backend_bytes(8 * LINE, 8 * LINE), 0x22));
    }
}

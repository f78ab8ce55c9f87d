//! ReCA live: an engine with ReCA started switches category
//! when its workload changes phase, reconfigures every shard, and keeps
//! every byte written, through the switches, a crash-like restart (no
//! shutdown) and a restart with the line size a category asked for.

use std::sync::Arc;
use std::time::{Duration, Instant};

use iocache_core::reca::RecaControllerParams;
use iocache_core::{CacheConfig, LineSize, WritePolicy};
use iocache_device::{BlockDevice, MemDevice};
use iocache_engine::{
    recorded_reca_line_size, CacheArray, Engine, EngineConfig, Layout, Lookup, Persistence, RecaSetup,
    RecordedLineSize,
};

const SECTOR: u64 = 512;
const BLOCK: u64 = 4096;
const VOLUME_BYTES: u64 = 8 << 20;
const CACHE_BYTES: u64 = 1 << 20;
const WINDOW_REQUESTS: u64 = 400;

struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// A sector's content: the write that stored it and where it lies.
fn stamp(write: u64, sector: u64, out: &mut [u8]) {
    for (i, chunk) in out.chunks_mut(16).enumerate() {
        chunk[..8].copy_from_slice(&write.to_le_bytes());
        chunk[8..].copy_from_slice(&(sector ^ ((i as u64) << 48)).to_le_bytes());
    }
}

/// What every sector of the volume must hold: the number of the last write
/// to it (0: never written, zeros).
struct Model {
    last: Vec<u64>,
    writes: u64,
}

impl Model {
    fn new() -> Model {
        Model {
            last: vec![0; (VOLUME_BYTES / SECTOR) as usize],
            writes: 0,
        }
    }

    fn write(&mut self, engine: &Engine, offset: u64, length: u64) {
        self.writes += 1;
        let mut data = vec![0u8; length as usize];
        for (i, sector) in data.chunks_mut(SECTOR as usize).enumerate() {
            let s = offset / SECTOR + i as u64;
            stamp(self.writes, s, sector);
            self.last[s as usize] = self.writes;
        }
        engine.write(offset, &data, false).unwrap();
    }

    fn check(&self, engine: &Engine, offset: u64, length: u64) {
        let mut data = vec![0u8; length as usize];
        engine.read(offset, &mut data).unwrap();
        let mut want = vec![0u8; SECTOR as usize];
        for (i, got) in data.chunks(SECTOR as usize).enumerate() {
            let s = offset / SECTOR + i as u64;
            match self.last[s as usize] {
                0 => want.fill(0),
                w => stamp(w, s, &mut want),
            }
            assert!(
                got == want.as_slice(),
                "sector {s}: not write {}'s data",
                self.last[s as usize]
            );
        }
    }

    fn check_all(&self, engine: &Engine) {
        for offset in (0..VOLUME_BYTES).step_by(64 << 10) {
            self.check(engine, offset, 64 << 10);
        }
    }
}

/// An LRU cache of `lines` lines of `line_bytes` bytes.
fn lru(lines: u64, line_bytes: u64) -> CacheConfig {
    CacheConfig::new(lines, LineSize::new(line_bytes).unwrap(), "lru".parse().unwrap())
}

/// A cache device for CACHE_BYTES in lines of BLOCK bytes.
fn block_cache_device() -> Arc<MemDevice> {
    let layout = Layout::for_slots(BLOCK, CACHE_BYTES / BLOCK).unwrap();
    Arc::new(MemDevice::new("cache", layout.device_bytes()))
}

/// Starts ReCA on `engine` with windows of WINDOW_REQUESTS requests.
fn start_reca(engine: &Engine, max_requests_per_second: Option<u64>, configured_line_bytes: Option<u64>) {
    engine
        .start_reca(RecaSetup {
            params: RecaControllerParams {
                window_requests: WINDOW_REQUESTS,
                ..RecaControllerParams::default()
            },
            max_requests_per_second,
            configured_line_bytes,
            ..RecaSetup::builtin()
        })
        .unwrap();
}

/// Opens the engine with `line_bytes` (`configured_line_bytes` is what the
/// configuration says) and starts ReCA.
fn open(
    cache_dev: &Arc<MemDevice>,
    backend: &Arc<MemDevice>,
    line_bytes: u64,
    configured_line_bytes: u64,
) -> Engine {
    let mut cache = lru(CACHE_BYTES / line_bytes, line_bytes);
    cache.write_policy = WritePolicy::WriteBack;
    let engine = Engine::new(
        EngineConfig {
            persistence: Persistence::Dirty,
            lookup: Lookup::Fine,
            shards: 4,
            ..EngineConfig::new(cache)
        },
        Arc::clone(cache_dev) as Arc<dyn BlockDevice>,
        Arc::clone(backend) as Arc<dyn BlockDevice>,
    )
    .unwrap();
    start_reca(&engine, None, Some(configured_line_bytes));
    engine
}

/// Waits until ReCA has put `category` in force (the controller thread
/// works every few milliseconds behind the requests).
fn wait_for(engine: &Engine, category: &str) -> iocache_engine::RecaStatus {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let status = engine.reca_status().unwrap();
        if status.category.as_deref() == Some(category) {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "ReCA did not switch to {category}: {status:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Random 4 KiB requests over the first 2 MiB, `read_percent` of them
/// reads (each checked).
fn random_phase(engine: &Engine, model: &mut Model, rng: &mut Rng, requests: u64, read_percent: u64) {
    for _ in 0..requests {
        let offset = rng.below((2 << 20) / BLOCK) * BLOCK;
        if rng.below(100) < read_percent {
            model.check(engine, offset, BLOCK);
        } else {
            model.write(engine, offset, BLOCK);
        }
    }
}

/// Consecutive 4 KiB writes from 2 MiB on.
fn sequential_writes(engine: &Engine, model: &mut Model, requests: u64) {
    for i in 0..requests {
        let offset = (2 << 20) + (i * BLOCK) % (6 << 20);
        model.write(engine, offset, BLOCK);
    }
}

#[test]
fn reca_switches_category_with_the_workload_and_keeps_every_byte() {
    let layout = Layout::for_slots(BLOCK, CACHE_BYTES / BLOCK).unwrap();
    let cache_dev = Arc::new(MemDevice::new("cache", layout.device_bytes() + (4 << 20)));
    let backend = Arc::new(MemDevice::new("backend", VOLUME_BYTES));
    let mut model = Model::new();
    let mut rng = Rng(0x5eed_1234_abcd_0001);

    let engine = open(&cache_dev, &backend, BLOCK, BLOCK);
    // Phase 1: random reads and writes, half each.
    random_phase(&engine, &mut model, &mut rng, 10 * WINDOW_REQUESTS, 50);
    let status = wait_for(&engine, "random_producer_consumers");
    assert_eq!(status.write_policy.as_deref(), Some("wt"));
    assert!(
        status
            .policy
            .as_deref()
            .is_some_and(|p| p.starts_with("reca:evict=priority")),
        "{status:?}"
    );
    assert_eq!(status.pending_line_size, None);
    assert!(
        engine.effective_mode().cause.name() == "controller",
        "{:?}",
        engine.effective_mode()
    );
    model.check_all(&engine);

    // Phase 2: sequential writes: large file generators, who want 128 KiB
    // lines: pending, the engine keeps 4 KiB.
    sequential_writes(&engine, &mut model, 10 * WINDOW_REQUESTS);
    let status = wait_for(&engine, "large_file_generators");
    assert_eq!(status.pending_line_size, Some(128 << 10));
    assert_eq!(status.line_size, BLOCK);
    assert!(
        status.last_event.as_deref().is_some_and(
            |e| e.contains("-> large_file_generators") && e.contains("line size: 4KiB -> 128KiB pending")
        ),
        "{status:?}"
    );
    assert!(status.category_changes >= 2, "{status:?}");
    // The random category writes through; large file generators write
    // back: more of their writes leave dirty lines for the restart.
    assert_eq!(status.write_policy.as_deref(), Some("wb"));
    sequential_writes(&engine, &mut model, 2 * WINDOW_REQUESTS);
    model.check_all(&engine);

    // A crash-like restart: the metadata made durable, no write-back, no
    // shutdown. Dirty lines must come back from the cache device.
    // The cleaner may write lines back while the flush runs (the reads of
    // `check_all` ask it to): the records made durable count the dirty
    // lines at the flush's barrier, between the counts before and after.
    let dirty_before = engine.stats().dirty_lines;
    engine.flush().unwrap();
    let dirty_after = engine.stats().dirty_lines;
    assert!(dirty_after > 0, "the test needs dirty lines across the restart");
    drop(engine);
    let engine = open(&cache_dev, &backend, BLOCK, BLOCK);
    let recovered = engine.stats().recovery.dirty_lines;
    assert!(
        (dirty_after..=dirty_before).contains(&recovered),
        "{recovered} dirty lines recovered, {dirty_before} before the flush, {dirty_after} after"
    );
    assert_eq!(engine.reca_status().unwrap().category, None);
    model.check_all(&engine);

    // Phase 3: mostly random reads: random consumers, a read-only cache
    // (wa): the dirty lines are drained in the background meanwhile.
    random_phase(&engine, &mut model, &mut rng, 10 * WINDOW_REQUESTS, 90);
    let status = wait_for(&engine, "random_consumers");
    assert_eq!(status.write_policy.as_deref(), Some("wa"));
    assert_eq!(engine.effective_mode().policy, WritePolicy::WriteAround);
    model.check_all(&engine);
    sequential_writes(&engine, &mut model, 10 * WINDOW_REQUESTS);
    wait_for(&engine, "large_file_generators");
    model.check_all(&engine);

    // The line size large file generators asked for is recorded on the
    // cache device, and a start takes it (as `serve --adapt reca` does;
    // after a flush only: the reformat writes the dirty lines back).
    let recorded = recorded_reca_line_size(&*cache_dev).unwrap();
    assert_eq!(
        recorded,
        Some(RecordedLineSize {
            line_bytes: 128 << 10,
            configured_line_bytes: BLOCK,
            device_line_bytes: BLOCK,
        })
    );
    // As above: the cleaner may clean lines while the flush runs.
    let dirty_before = engine.stats().dirty_lines;
    engine.flush().unwrap();
    let dirty_after = engine.stats().dirty_lines;
    drop(engine);
    let engine = open(&cache_dev, &backend, recorded.unwrap().line_bytes, BLOCK);
    let report = engine.stats().recovery;
    assert!(report.geometry_changed.is_some(), "{report:?}");
    assert!(
        (dirty_after..=dirty_before).contains(&report.written_back_lines),
        "{report:?}: {dirty_before} dirty lines before the flush, {dirty_after} after"
    );
    let status = engine.reca_status().unwrap();
    assert_eq!(
        (status.line_size, status.configured_line_size),
        (128 << 10, BLOCK)
    );
    model.check_all(&engine);
    sequential_writes(&engine, &mut model, 10 * WINDOW_REQUESTS);
    let status = wait_for(&engine, "large_file_generators");
    assert_eq!(status.pending_line_size, None, "{status:?}");
    // Still ReCA's choice over the configuration: it stays recorded.
    assert_eq!(
        recorded_reca_line_size(&*cache_dev)
            .unwrap()
            .map(|r| r.device_line_bytes),
        Some(128 << 10)
    );
    engine.shutdown().unwrap();
    // Everything is on the backend now.
    let mut data = vec![0u8; VOLUME_BYTES as usize];
    backend.read_at(&mut data, 0).unwrap();
    let mut want = vec![0u8; SECTOR as usize];
    for (s, got) in data.chunks(SECTOR as usize).enumerate() {
        match model.last[s] {
            0 => want.fill(0),
            w => stamp(w, s as u64, &mut want),
        }
        assert!(got == want.as_slice(), "backend sector {s}");
    }
}

/// With a budget far below the request rate, ReCA characterizes a sample
/// (the rest is counted as skipped) and still finds the category.
#[test]
fn a_budget_characterizes_a_sample_and_still_finds_the_category() {
    let cache_dev = block_cache_device();
    let backend = Arc::new(MemDevice::new("backend", VOLUME_BYTES));
    let engine = Engine::new(
        EngineConfig::new(lru(CACHE_BYTES / BLOCK, BLOCK)),
        cache_dev,
        backend,
    )
    .unwrap();
    // 200 requests per 100 ms period.
    start_reca(&engine, Some(2_000), None);
    let mut model = Model::new();
    let mut rng = Rng(7);
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        random_phase(&engine, &mut model, &mut rng, 1000, 50);
        let status = engine.reca_status().unwrap();
        if status.category.as_deref() == Some("random_producer_consumers") {
            break status;
        }
        assert!(Instant::now() < deadline, "{status:?}");
    };
    assert!(status.skipped_requests > 0, "{status:?}");
    assert!(status.observed_requests >= WINDOW_REQUESTS, "{status:?}");
    model.check_all(&engine);
}

/// Each volume is its own stream: 40 volumes, each writing two sequential
/// runs, are served in turn, one request of each run per round: they are
/// sequential writers, none overlapped. In one stream a run's next request
/// would come 80 requests later, past the classifier's 64-request history,
/// and the volumes' requests (at the same offsets) would overlap.
#[test]
fn each_volume_is_its_own_stream() {
    const VOLUMES: u64 = 40;
    const VOLUME_BYTES: u64 = 1 << 20;
    let cache_dev = block_cache_device();
    let volumes: Vec<(String, Arc<dyn BlockDevice>)> = (0..VOLUMES)
        .map(|n| {
            let name = format!("v{n}");
            let backend: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(name.clone(), VOLUME_BYTES));
            (name, backend)
        })
        .collect();
    let engine = Engine::with_volumes(
        EngineConfig::new(lru(CACHE_BYTES / BLOCK, BLOCK)),
        cache_dev,
        volumes,
    )
    .unwrap();
    start_reca(&engine, None, None);
    let handles: Vec<_> = engine
        .volumes()
        .iter()
        .map(|v| engine.volume(v.id).unwrap())
        .collect();
    assert_eq!(handles.len() as u64, VOLUMES);
    let data = |n: usize, i: u64| vec![(n as u64 * 7 + i) as u8; BLOCK as usize];
    let half = VOLUME_BYTES / 2;
    // Enough for every stream to fill its history (64) several times.
    let rounds = 100;
    for i in 0..rounds {
        for (n, volume) in handles.iter().enumerate() {
            for run in [0, half] {
                engine
                    .write_with(volume, run + (i * BLOCK) % half, &data(n, i), false)
                    .unwrap();
            }
        }
    }
    let status = wait_for(&engine, "large_file_generators");
    // One stream would give about 0.80 sequential writes, 0.20 random
    // writes and 0.97 overlapped (the same sequence through the core's
    // classifier with every volume id 0).
    let features = status.last_features.unwrap().0;
    assert!(features[1] > 0.95 && features[6] < 0.05, "{status:?}");
    let mut back = vec![0u8; BLOCK as usize];
    for (n, volume) in handles.iter().enumerate() {
        for run in [0, half] {
            engine
                .read_with(volume, run + (rounds - 1) * BLOCK, &mut back)
                .unwrap();
            assert!(back == data(n, rounds - 1), "volume {n}");
        }
    }
}

/// On a cache array (members formatted for one line size) a category's
/// line size is logged as not applied, neither pending nor recorded.
#[test]
fn a_cache_array_keeps_its_line_size() {
    let members: Vec<(String, Option<Arc<dyn BlockDevice>>)> = (0..2)
        .map(|i| {
            let dev: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(format!("m{i}"), 4 << 20));
            (format!("m{i}"), Some(dev))
        })
        .collect();
    let array = Arc::new(CacheArray::open_or_create(members, BLOCK, 25).unwrap());
    let cache_dev: Arc<dyn BlockDevice> = array.clone();
    let engine = Engine::new(
        EngineConfig {
            array: Some(Arc::clone(&array)),
            ..EngineConfig::new(lru(array.geometry().slots(), BLOCK))
        },
        cache_dev,
        Arc::new(MemDevice::new("backend", VOLUME_BYTES)),
    )
    .unwrap();
    start_reca(&engine, None, None);
    let mut model = Model::new();
    sequential_writes(&engine, &mut model, 5 * WINDOW_REQUESTS);
    let status = wait_for(&engine, "large_file_generators");
    assert_eq!(status.pending_line_size, None, "{status:?}");
    assert!(
        status
            .last_event
            .as_deref()
            .is_some_and(|e| e.contains("line size: 4KiB -> 128KiB not applied: a cache array")),
        "{status:?}"
    );
    assert_eq!(recorded_reca_line_size(&*array).unwrap(), None);
    model.check_all(&engine);
}

//! A load balancer changes the cache's write policy
//! and sends requests around the cache while clients read and write; none
//! of that may serve a stale read or lose a write, now or after a restart.
//! Here LBICA (and SIB) run in the engine over a cache device slowed to
//! the point of saturation (`FaultDevice` latency through one server),
//! under a multi-threaded workload whose phases (random reads with misses,
//! mixed reads and writes, writes, calm) make LBICA switch policies
//! repeatedly; every read is checked against the thread's model, then the
//! engine is dropped after a barrier, reopened on the same devices, and
//! every sector is checked through the new engine and, after its shutdown,
//! on the backend.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use iocache_core::balance::{LbicaConfig, SibConfig};
use iocache_core::{CacheConfig, LineSize, WritePolicy};
use iocache_device::{BlockDevice, FaultDevice, MemDevice};
use iocache_engine::{BalanceConfig, BalanceController, Engine, EngineConfig, Persistence};

mod common;
use common::{owned_request, thread_pattern, Rng};

const SECTOR: u64 = 512;
const THREADS: u64 = 6;
/// A 2 MiB volume over a cache of 128 lines of 4 KiB (a quarter of it).
const VOLUME_SECTORS: u64 = 4096;
const CACHE_LINES: u64 = 128;

struct Devices {
    cache: Arc<FaultDevice<MemDevice>>,
    backend: Arc<FaultDevice<MemDevice>>,
}

impl Devices {
    fn new() -> Devices {
        let (cache, backend) = common::fault_devices(4096, CACHE_LINES, VOLUME_SECTORS * SECTOR);
        cache.set_journal(false);
        backend.set_journal(false);
        Devices { cache, backend }
    }

    fn engine(&self, balance: Option<BalanceConfig>) -> Engine {
        let mut cache = CacheConfig::new(CACHE_LINES, LineSize::new(4096).unwrap(), "lru".parse().unwrap());
        cache.write_policy = WritePolicy::WriteBack;
        Engine::new(
            EngineConfig {
                persistence: Persistence::All,
                shards: 4,
                balance,
                ..EngineConfig::new(cache)
            },
            self.cache.clone(),
            self.backend.clone(),
        )
        .unwrap()
    }
}

/// The workload's phases, by time since the start: what share of requests
/// write, over how much of the volume, and whether this thread rests.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Phase {
    /// Reads over the whole volume (four times the cache): hits and misses.
    RandomRead,
    /// Half reads, half writes, over the cache's size.
    Mixed,
    /// Nine writes in ten.
    Writes,
    /// One thread, slowly.
    Calm,
}

const PHASES: [Phase; 8] = [
    Phase::RandomRead,
    Phase::Calm,
    Phase::Mixed,
    Phase::Calm,
    Phase::Writes,
    Phase::Calm,
    Phase::RandomRead,
    Phase::Calm,
];
const PHASE: Duration = Duration::from_millis(300);

/// One thread's workload until `stop`; returns its model (the last write
/// number of each sector it owns, 0 for none).
fn workload(engine: &Engine, thread: u64, started: Instant, stop: &AtomicBool) -> Vec<u64> {
    let mut model = vec![0u64; VOLUME_SECTORS as usize];
    let mut rng = Rng::for_thread(thread);
    let mut seq = 0;
    while !stop.load(Ordering::Relaxed) {
        let phase = PHASES[(started.elapsed().as_millis() / PHASE.as_millis()) as usize % PHASES.len()];
        let (write_percent, span_sectors) = match phase {
            Phase::RandomRead => (0, VOLUME_SECTORS),
            Phase::Mixed => (50, CACHE_LINES * 8),
            Phase::Writes => (90, VOLUME_SECTORS),
            Phase::Calm if thread > 0 => {
                std::thread::sleep(Duration::from_millis(5));
                continue;
            }
            Phase::Calm => {
                std::thread::sleep(Duration::from_millis(2));
                (20, VOLUME_SECTORS)
            }
        };
        seq += 1;
        let r = rng.next();
        // A write: my sectors among those drawn, each its own request.
        let write = ((r >> 20) % 100 < write_percent).then_some(r.is_multiple_of(13));
        if let Some((first, buf)) =
            owned_request(engine, (THREADS, thread), r, span_sectors, write, seq, &mut model)
        {
            check(thread, &model, first, &buf, "read");
        }
        if r.is_multiple_of(211) {
            engine.flush().unwrap();
        }
    }
    model
}

/// `buf` holds sectors from `first`: those of `thread` must be its latest
/// writes (zeros where it wrote none).
fn check(thread: u64, model: &[u64], first: u64, buf: &[u8], what: &str) {
    for (i, got) in buf.chunks(SECTOR as usize).enumerate() {
        let sector = first + i as u64;
        if sector % THREADS != thread {
            continue;
        }
        let want = match model[sector as usize] {
            0 => [0u8; SECTOR as usize],
            seq => thread_pattern(thread, seq),
        };
        assert!(
            got == want,
            "{what}: thread {thread}, sector {sector}: stale or lost (want write {})",
            model[sector as usize]
        );
    }
}

/// Runs the phases under `balance` with the cache device saturated; checks
/// every read, then every sector after a restart. Returns the controller's
/// switches and the requests it sent around the cache. The phases run twice,
/// and on (at most eight times in all) until the controller has switched
/// `switches_wanted` times: a loaded machine slows the workload, not the
/// test's verdict.
fn run(balance: BalanceConfig, switches_wanted: u64) -> (u64, u64) {
    let devices = Devices::new();
    // About 4000 cache I/Os a second at most; the backend is slower per
    // I/O (0.5 ms) but serves any number at once: under load, the cache is
    // the bottleneck.
    devices.cache.set_latency(Duration::from_micros(250));
    devices.cache.set_servers(1);
    devices.backend.set_latency(Duration::from_micros(500));
    let engine = devices.engine(Some(balance));
    let stop = AtomicBool::new(false);
    let policies = Mutex::new(Vec::new());
    let started = Instant::now();
    let models: Vec<Vec<u64>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let (engine, stop) = (&engine, &stop);
                s.spawn(move || workload(engine, t, started, stop))
            })
            .collect();
        // Watch the policy in force while the workload runs.
        let cycle = PHASE * PHASES.len() as u32;
        let switches = || engine.stats().balance.map_or(0, |b| b.switches);
        while started.elapsed() < cycle * 2 || (started.elapsed() < cycle * 8 && switches() < switches_wanted)
        {
            let policy = engine.effective_mode().policy;
            let mut seen = policies.lock().unwrap();
            if seen.last() != Some(&policy) {
                seen.push(policy);
            }
            drop(seen);
            std::thread::sleep(Duration::from_millis(5));
        }
        stop.store(true, Ordering::Relaxed);
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let stats = engine.stats();
    let balance_stats = stats.balance.clone().expect("a controller runs");
    eprintln!(
        "{}: policies in force {:?}; {} switches in {} intervals; {} requests bypassed, {} refused (dirty); \
         cache I/O {:?}",
        balance_stats.controller,
        policies.lock().unwrap(),
        balance_stats.switches,
        balance_stats.intervals,
        stats.cache.balance_bypasses,
        stats.cache.balance_bypasses_refused_dirty,
        stats
            .cache_queue
            .classes
            .iter()
            .map(|c| (c.class, c.completed, c.mean_latency_ns() / 1000))
            .collect::<Vec<_>>()
    );
    assert!(balance_stats.intervals > 20, "{balance_stats:?}");
    assert_eq!(stats.io_errors, 0);
    // Every sector is owned by one thread: merge the models.
    let latest: Vec<(u64, u64)> = (0..VOLUME_SECTORS)
        .map(|s| (s % THREADS, models[(s % THREADS) as usize][s as usize]))
        .collect();
    // A barrier, then a crash: the restart must find every write.
    engine.flush().unwrap();
    drop(engine);
    devices.cache.set_latency(Duration::ZERO);
    devices.backend.set_latency(Duration::ZERO);
    let engine = devices.engine(None);
    let verify = |read: &dyn Fn(u64, &mut [u8]), what: &str| {
        let mut buf = vec![0u8; 64 * 1024];
        for chunk in 0..VOLUME_SECTORS * SECTOR / buf.len() as u64 {
            let offset = chunk * buf.len() as u64;
            read(offset, &mut buf);
            for (i, got) in buf.chunks(SECTOR as usize).enumerate() {
                let sector = offset / SECTOR + i as u64;
                let (thread, seq) = latest[sector as usize];
                let want = match seq {
                    0 => [0u8; SECTOR as usize],
                    seq => thread_pattern(thread, seq),
                };
                assert!(
                    got == want,
                    "{what}: sector {sector} lost (want thread {thread} write {seq})"
                );
            }
        }
    };
    verify(
        &|offset, buf| engine.read(offset, buf).unwrap(),
        "after the restart",
    );
    engine.shutdown().unwrap();
    verify(
        &|offset, buf| devices.backend.read_at(buf, offset).unwrap(),
        "the backend after the shutdown",
    );
    (balance_stats.switches, stats.cache.balance_bypasses)
}

#[test]
fn lbica_switching_policies_loses_nothing() {
    // Short intervals and holds, so that each phase makes its own episode.
    let (switches, _) = run(
        BalanceConfig {
            controller: BalanceController::Lbica(LbicaConfig {
                min_hold_intervals: 1,
                exit_intervals: 1,
                ..LbicaConfig::default()
            }),
            interval_ns: 20_000_000,
        },
        4,
    );
    assert!(switches >= 4, "LBICA switched {switches} times");
}

#[test]
fn sib_bypassing_loses_nothing() {
    let (switches, bypassed) = run(
        BalanceConfig {
            controller: BalanceController::Sib(SibConfig::default()),
            interval_ns: 20_000_000,
        },
        0,
    );
    assert_eq!(switches, 0, "SIB never changes the policy");
    assert!(bypassed > 0, "SIB sent nothing around a saturated cache");
}

/// SIB over a cache restarted warm, serving only hits: the backend serves
/// nothing, so only the controller's probe can tell SIB how fast it is;
/// once it knows, the saturated cache's tail goes to the backend, and
/// every read still returns what was written.
/// Under a load balancer no read is a quick hit (the NBD server's hint for
/// serving it inline): hits must queue at the cache device for the
/// balancer to see it as the bottleneck.
#[test]
fn no_read_is_quick_under_a_load_balancer() {
    let devices = Devices::new();
    for balance in [
        None,
        Some(BalanceConfig {
            controller: BalanceController::Sib(SibConfig::default()),
            interval_ns: 20_000_000,
        }),
    ] {
        let balanced = balance.is_some();
        let engine = devices.engine(balance);
        engine.write(0, &[7u8; 4096], false).unwrap();
        let mut buf = [0u8; 4096];
        engine.read(0, &mut buf).unwrap();
        assert_eq!(buf, [7u8; 4096]);
        let volume = engine.default_volume();
        assert_eq!(engine.read_would_hit(volume, 0, 4096), !balanced);
        engine.shutdown().unwrap();
    }
}

#[test]
fn sib_learns_a_backend_the_cache_never_used() {
    const LINES: u64 = 24;
    let devices = Devices::new();
    let data = |line: u64| thread_pattern(line % THREADS, line + 1).repeat(8);
    // A first run writes the lines; its shutdown writes them back and
    // leaves them cached and clean.
    let engine = devices.engine(None);
    for line in 0..LINES {
        engine.write(line * 4096, &data(line), false).unwrap();
    }
    engine.shutdown().unwrap();
    drop(engine);
    devices.cache.set_latency(Duration::from_micros(250));
    devices.cache.set_servers(1);
    devices.backend.set_latency(Duration::from_micros(100));
    let engine = devices.engine(Some(BalanceConfig {
        controller: BalanceController::Sib(SibConfig::default()),
        interval_ns: 20_000_000,
    }));
    // At least 800 ms of reads; on a slow machine, on until the backend was
    // probed and something bypassed (at most 20 s).
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (engine, stop) = (&engine, &stop);
            s.spawn(move || {
                let mut n = t;
                let mut buf = vec![0u8; 4096];
                while !stop.load(Ordering::Relaxed) {
                    n += 7;
                    let line = n % LINES;
                    engine.read(line * 4096, &mut buf).unwrap();
                    assert!(buf == data(line), "line {line} wrong");
                }
            });
        }
        let started = Instant::now();
        std::thread::sleep(Duration::from_millis(800));
        while started.elapsed() < Duration::from_secs(20) {
            let stats = engine.stats();
            if stats.backend_queue.classes[0].completed > 0 && stats.cache.balance_bypasses > 0 {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        stop.store(true, Ordering::Relaxed);
    });
    let stats = engine.stats();
    assert_eq!(
        stats.recovery.clean_lines, LINES,
        "the lines were not cached warm"
    );
    assert!(
        stats.backend_queue.classes[0].completed > 0,
        "the backend was never probed"
    );
    assert!(
        stats.cache.balance_bypasses > 0,
        "SIB sent nothing around a saturated cache: {:?}",
        stats.balance
    );
    engine.shutdown().unwrap();
}

/// The controller keeps running when no volume is attached (it probes the
/// backend of the first volume while the backend is unmeasured: here there
/// is none to probe).
#[test]
fn the_controller_survives_detaching_every_volume() {
    let devices = Devices::new();
    let engine = devices.engine(Some(BalanceConfig {
        controller: BalanceController::Sib(SibConfig::default()),
        interval_ns: 50_000_000,
    }));
    engine.detach(engine.default_volume().id()).unwrap();
    // 50 ms intervals: three within 300 ms, or within 10 s on a slow machine.
    let started = Instant::now();
    std::thread::sleep(Duration::from_millis(300));
    while engine.stats().balance.unwrap().intervals < 3 && started.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let intervals = engine.stats().balance.unwrap().intervals;
    assert!(intervals >= 3, "{intervals} intervals");
    engine.shutdown().unwrap();
}

//! Several volumes on one cache device: concurrent verifying workloads on
//! each, flushing one volume, detaching one while another keeps verifying,
//! attaching one at run time, and restarts (clean, crashed, power cut) that
//! find every volume's lines again and never a detached volume's.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use iocache_core::{CacheConfig, LineSize, PolicySpec, WritePolicy};
use iocache_device::{BlockDevice, FaultDevice, IoKind, MemDevice, PowerCut};
use iocache_engine::{Engine, EngineConfig, EngineError, InitMode, Layout, Lookup, Persistence};

const SECTOR: u64 = 512;
const LINE: u64 = 4096;

/// A sector's content: volume, writer and write number, and the sector.
fn stamp(volume: u64, writer: u64, seq: u64, sector: u64) -> [u8; SECTOR as usize] {
    let mut s = [0u8; SECTOR as usize];
    let a = (volume << 56 | writer << 48 | seq).to_le_bytes();
    let b = sector.to_le_bytes();
    for chunk in s.chunks_mut(16) {
        chunk[..8].copy_from_slice(&a);
        chunk[8..].copy_from_slice(&b);
    }
    s
}

struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn cache_config(lines: u64, wp: WritePolicy) -> CacheConfig {
    let mut c = CacheConfig::new(lines, LineSize::new(LINE).unwrap(), PolicySpec::lru());
    c.write_policy = wp;
    c
}

fn cache_device(config: &CacheConfig) -> Arc<MemDevice> {
    let layout = Layout::for_slots(config.line_size.bytes(), config.capacity_lines).unwrap();
    Arc::new(MemDevice::new("cache", layout.device_bytes()))
}

fn engine_config(cache: &CacheConfig, lookup: Lookup, persistence: Persistence) -> EngineConfig {
    EngineConfig {
        lookup,
        persistence,
        ..EngineConfig::new(cache.clone())
    }
}

/// An engine over a new cache device for `cache`, serving two volumes
/// (name, size in bytes) in this order, each on a new RAM backend; the
/// backends are returned in the same order.
fn two_volumes(
    config: EngineConfig,
    cache: &CacheConfig,
    volumes: [(&str, u64); 2],
) -> (Engine, [Arc<dyn BlockDevice>; 2]) {
    let devices = volumes.map(|(name, bytes)| Arc::new(MemDevice::new(name, bytes)) as Arc<dyn BlockDevice>);
    let backends = volumes
        .iter()
        .zip(&devices)
        .map(|((name, _), dev)| (name.to_string(), Arc::clone(dev)))
        .collect();
    let engine = Engine::with_volumes(config, cache_device(cache), backends).unwrap();
    (engine, devices)
}

/// Writer `writer` of volume `volume` owns the sectors `s` with
/// `s % writers == writer`: random reads across everyone's sectors check its
/// own, random writes (some FUA) change its own. Returns the last write
/// number of each sector it owns (0: never written). Stops after `steps`,
/// or when `stop` is set if `steps` is 0.
#[allow(clippy::too_many_arguments)]
fn workload(
    engine: &Engine,
    volume: u32,
    writer: u64,
    writers: u64,
    sectors: u64,
    steps: u64,
    stop: Option<&AtomicBool>,
    seed: u64,
) -> Vec<u64> {
    let mut model = vec![0u64; sectors as usize];
    let mut rng = Rng::new(seed ^ (u64::from(volume) << 32) ^ writer);
    let mut seq = 0;
    loop {
        seq += 1;
        if steps > 0 && seq > steps {
            break;
        }
        if steps == 0 && stop.is_some_and(|s| s.load(Ordering::SeqCst)) {
            break;
        }
        let count = 1 + rng.below(16);
        let first = rng.below(sectors - count);
        if rng.below(3) == 0 {
            for sector in (first..first + count).filter(|s| s % writers == writer) {
                let data = stamp(u64::from(volume), writer, seq, sector);
                engine
                    .write_volume(volume, sector * SECTOR, &data, rng.below(13) == 0)
                    .unwrap();
                model[sector as usize] = seq;
            }
        } else {
            let mut buf = vec![0u8; (count * SECTOR) as usize];
            engine.read_volume(volume, first * SECTOR, &mut buf).unwrap();
            for (i, sector) in (first..first + count).enumerate() {
                let got = &buf[i * SECTOR as usize..(i + 1) * SECTOR as usize];
                if sector % writers == writer && model[sector as usize] != 0 {
                    assert_eq!(
                        got,
                        &stamp(u64::from(volume), writer, model[sector as usize], sector)[..],
                        "volume {volume} writer {writer}: stale sector {sector}"
                    );
                }
            }
        }
        if rng.below(101) == 0 {
            engine.flush().unwrap();
        }
    }
    model
}

/// Checks that `backend` holds, for every sector a writer wrote, its last write.
fn check_backend(backend: &dyn BlockDevice, volume: u32, writers: u64, models: &[Vec<u64>]) {
    for (writer, model) in models.iter().enumerate() {
        for (sector, &seq) in model.iter().enumerate() {
            if seq == 0 {
                continue;
            }
            let mut buf = [0u8; SECTOR as usize];
            backend.read_at(&mut buf, sector as u64 * SECTOR).unwrap();
            assert_eq!(
                buf,
                stamp(u64::from(volume), writer as u64, seq, sector as u64),
                "volume {volume} sector {sector} (writers {writers}) on the backend"
            );
        }
    }
}

/// Reads every written sector through the engine and checks it.
fn check_through(engine: &Engine, volume: u32, models: &[Vec<u64>]) {
    for (writer, model) in models.iter().enumerate() {
        for (sector, &seq) in model.iter().enumerate() {
            if seq == 0 {
                continue;
            }
            let mut buf = [0u8; SECTOR as usize];
            engine
                .read_volume(volume, sector as u64 * SECTOR, &mut buf)
                .unwrap();
            assert_eq!(
                buf,
                stamp(u64::from(volume), writer as u64, seq, sector as u64),
                "volume {volume} sector {sector} through the engine"
            );
        }
    }
}

#[test]
fn two_volumes_share_a_cache_under_concurrent_io() {
    for (lookup, wp, persistence) in [
        (Lookup::Fine, WritePolicy::WriteBack, Persistence::Dirty),
        (Lookup::Coarse, WritePolicy::WriteBack, Persistence::All),
        (Lookup::Single, WritePolicy::WriteThrough, Persistence::None),
        (Lookup::Fine, WritePolicy::WriteAround, Persistence::Dirty),
    ] {
        let cache = cache_config(48, wp);
        let (engine, [a, b]) = two_volumes(
            engine_config(&cache, lookup, persistence),
            &cache,
            [("a", 2048 * SECTOR), ("b", 1024 * SECTOR)],
        );
        let engine = Arc::new(engine);
        let ids: Vec<u32> = engine.volumes().iter().map(|v| v.id).collect();
        assert_eq!(ids, vec![0, 1]);
        assert_eq!(
            engine.size_bytes(),
            2048 * SECTOR,
            "the first volume is the default"
        );
        let mut threads = Vec::new();
        for (volume, sectors) in [(0u32, 2048u64), (1, 1024)] {
            for writer in 0..2 {
                let engine = Arc::clone(&engine);
                threads.push(std::thread::spawn(move || {
                    workload(&engine, volume, writer, 2, sectors, 1500, None, 7)
                }));
            }
        }
        let models: Vec<Vec<u64>> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        let (models_a, models_b) = models.split_at(2);
        check_through(&engine, 0, models_a);
        check_through(&engine, 1, models_b);
        // The cleaner may still be writing lines back: take the per-volume
        // figures between two equal cache-wide ones.
        let (sa, sb, all) = (0..1000)
            .find_map(|_| {
                let before = engine.stats();
                let sa = engine.volume_stats(0).unwrap();
                let sb = engine.volume_stats(1).unwrap();
                let all = engine.stats();
                let still =
                    (before.dirty_lines, before.resident_lines) == (all.dirty_lines, all.resident_lines);
                still.then_some((sa, sb, all))
            })
            .expect("the cleaner settles");
        assert_eq!(sa.resident_lines + sb.resident_lines, all.resident_lines);
        assert_eq!(sa.dirty_lines + sb.dirty_lines, all.dirty_lines);
        // The core counts a request once per shard span it covers.
        assert!(sa.requests() + sb.requests() <= all.cache.requests);
        assert_eq!(sa.line_accesses + sb.line_accesses, all.cache.accesses);
        assert!(sa.read_latency.count > 0 && sb.write_latency.count > 0);
        assert!(sa.name == "a" && sb.size_bytes == 1024 * SECTOR);
        engine.flush_all().unwrap();
        check_backend(&*a, 0, 2, models_a);
        check_backend(&*b, 1, 2, models_b);
        engine.shutdown().unwrap();
    }
}

#[test]
fn flushing_one_volume_writes_back_only_its_lines() {
    let cache = cache_config(64, WritePolicy::WriteBack);
    let (engine, [a, b]) = two_volumes(
        engine_config(&cache, Lookup::Fine, Persistence::Dirty),
        &cache,
        [("a", 1 << 20), ("b", 1 << 20)],
    );
    for i in 0..10u64 {
        engine.write_volume(0, i * LINE, &[0xaa; 4096], false).unwrap();
        engine.write_volume(1, i * LINE, &[0xbb; 4096], false).unwrap();
    }
    assert_eq!(engine.volume_stats(0).unwrap().dirty_lines, 10);
    assert_eq!(engine.flush_volume(0).unwrap(), 10);
    assert_eq!(engine.volume_stats(0).unwrap().dirty_lines, 0);
    assert_eq!(
        engine.volume_stats(0).unwrap().resident_lines,
        10,
        "flushed lines stay cached"
    );
    assert_eq!(engine.volume_stats(1).unwrap().dirty_lines, 10);
    let mut buf = [0u8; 4096];
    a.read_at(&mut buf, 9 * LINE).unwrap();
    assert_eq!(buf, [0xaa; 4096]);
    b.read_at(&mut buf, 9 * LINE).unwrap();
    assert_eq!(buf, [0; 4096], "the other volume's dirty lines stay in the cache");
    assert!(matches!(
        engine.flush_volume(7),
        Err(EngineError::UnknownVolume(_))
    ));
    engine.shutdown().unwrap();
}

#[test]
fn detaching_a_volume_while_another_keeps_verifying() {
    for (lookup, persistence, seed) in [
        (Lookup::Fine, Persistence::Dirty, 1),
        (Lookup::Coarse, Persistence::All, 2),
        (Lookup::Fine, Persistence::None, 3),
        (Lookup::Single, Persistence::Dirty, 4),
    ] {
        // A small cache: the survivor's misses evict the detached volume's
        // dirty lines all the time, so some of their write-backs are in
        // flight when a detach starts.
        let cache = cache_config(24, WritePolicy::WriteBack);
        let (engine, [b, first]) = two_volumes(
            engine_config(&cache, lookup, persistence),
            &cache,
            [("b", 1024 * SECTOR), ("a", 1024 * SECTOR)],
        );
        let engine = Arc::new(engine);
        let stop = Arc::new(AtomicBool::new(false));
        let survivors: Vec<_> = (0..2)
            .map(|writer| {
                let (engine, stop) = (Arc::clone(&engine), Arc::clone(&stop));
                std::thread::spawn(move || workload(&engine, 0, writer, 2, 1024, 0, Some(&stop), seed))
            })
            .collect();
        // Rounds of: a volume runs a verifying workload, then clients keep
        // sending it requests during its detach (acknowledged writes must
        // reach its backend; the others fail with Shutdown, nothing
        // panics); the next round attaches a new one.
        for round in 0..5u64 {
            let (id, a) = if round == 0 {
                (1, first.clone())
            } else {
                let a: Arc<dyn BlockDevice> = Arc::new(MemDevice::new("a", 1024 * SECTOR));
                (engine.attach(&format!("a{round}"), a.clone()).unwrap(), a)
            };
            assert_eq!(id, 1, "the detached volume's id is reused");
            let model_a = workload(&engine, id, 0, 1, 1000, 300, None, seed + round);
            let late = Arc::new(AtomicBool::new(false));
            let late_clients: Vec<_> = (0..2u64)
                .map(|k| {
                    let (engine, late) = (Arc::clone(&engine), Arc::clone(&late));
                    std::thread::spawn(move || {
                        // Sectors 1000.. are written only here: (sector, value) acknowledged.
                        let mut acked = Vec::new();
                        let mut seq = 1_000_000 * (k + 1);
                        while !late.load(Ordering::SeqCst) {
                            seq += 1;
                            let sector = 1000 + k * 8 + seq % 8;
                            let data = stamp(1, 9, seq, sector);
                            match engine.write_volume(id, sector * SECTOR, &data, false) {
                                Ok(()) => acked.push((sector, seq)),
                                Err(EngineError::Shutdown | EngineError::UnknownVolume(_)) => break,
                                Err(e) => panic!("a request racing the detach failed with {e}"),
                            }
                            let mut buf = [0u8; 512];
                            match engine.read_volume(id, sector * SECTOR, &mut buf) {
                                Ok(()) => assert_eq!(buf, data),
                                Err(EngineError::Shutdown | EngineError::UnknownVolume(_)) => break,
                                Err(e) => panic!("a read racing the detach failed with {e}"),
                            }
                        }
                        acked
                    })
                })
                .collect();
            std::thread::sleep(std::time::Duration::from_millis(10));
            let handle = engine.volume(id).unwrap();
            let backend = engine.detach(id).unwrap();
            assert!(Arc::ptr_eq(&backend, &a));
            late.store(true, Ordering::SeqCst);
            let acked: Vec<(u64, u64)> = late_clients.into_iter().flat_map(|t| t.join().unwrap()).collect();
            // Gone from the engine: requests fail cleanly, no line of it is left.
            assert!(!handle.is_open());
            let mut buf = [0u8; 512];
            assert!(matches!(
                engine.read_with(&handle, 0, &mut buf),
                Err(EngineError::Shutdown)
            ));
            assert!(matches!(
                engine.read_volume(id, 0, &mut buf),
                Err(EngineError::UnknownVolume(_))
            ));
            assert!(engine.volume_stats(id).is_err());
            assert_eq!(engine.volumes().len(), 1);
            // Everything it acknowledged is on its backend.
            check_backend(&*a, 1, 1, std::slice::from_ref(&model_a));
            let mut last = std::collections::HashMap::new();
            for (sector, seq) in acked {
                last.insert(sector, seq);
            }
            for (sector, seq) in last {
                let mut buf = [0u8; 512];
                a.read_at(&mut buf, sector * SECTOR).unwrap();
                assert_eq!(
                    buf,
                    stamp(1, 9, seq, sector),
                    "round {round}: acknowledged write of sector {sector}"
                );
            }
        }
        // The survivor verified all along, and keeps going.
        std::thread::sleep(std::time::Duration::from_millis(10));
        stop.store(true, Ordering::SeqCst);
        let models_b: Vec<Vec<u64>> = survivors.into_iter().map(|t| t.join().unwrap()).collect();
        let sb = engine.volume_stats(0).unwrap();
        let all = engine.stats();
        assert_eq!(
            sb.resident_lines, all.resident_lines,
            "only the survivor's lines are cached"
        );
        check_through(&engine, 0, &models_b);
        engine.shutdown().unwrap();
        check_backend(&*b, 0, 2, &models_b);
    }
}

#[test]
fn attaching_a_volume_at_run_time() {
    let cache = cache_config(32, WritePolicy::WriteBack);
    let a: Arc<dyn BlockDevice> = Arc::new(MemDevice::new("a", 1 << 20));
    let cache_dev = cache_device(&cache);
    let engine = Arc::new(
        Engine::new(
            engine_config(&cache, Lookup::Fine, Persistence::Dirty),
            cache_dev.clone(),
            a.clone(),
        )
        .unwrap(),
    );
    engine.write(0, &[1u8; 4096], false).unwrap();
    let c: Arc<dyn BlockDevice> = Arc::new(MemDevice::new("c", 512 * SECTOR));
    let id = engine.attach("c", c.clone()).unwrap();
    assert_eq!(id, 1);
    assert!(matches!(
        engine.attach("c", c.clone()),
        Err(EngineError::Volume(_))
    ));
    assert!(engine.attach("", c.clone()).is_err());
    assert_eq!(engine.volume(id).unwrap().size_bytes(), 512 * SECTOR);
    // Both serve at once, each verifying.
    let t = {
        let engine = Arc::clone(&engine);
        std::thread::spawn(move || workload(&engine, 0, 0, 1, 2048, 800, None, 11))
    };
    let model_c = workload(&engine, id, 0, 1, 512, 800, None, 12);
    let model_a = t.join().unwrap();
    assert!(engine.volume_stats(id).unwrap().requests() >= 800);
    // A detached id is free again for the next volume attached.
    engine.detach(id).unwrap();
    check_backend(&*c, id, 1, std::slice::from_ref(&model_c));
    let d: Arc<dyn BlockDevice> = Arc::new(MemDevice::new("d", 512 * SECTOR));
    assert_eq!(engine.attach("d", d).unwrap(), id);
    let mut buf = [9u8; 512];
    engine.read_volume(id, 0, &mut buf).unwrap();
    assert_eq!(
        buf, [0u8; 512],
        "a new volume never sees the lines of the one detached before"
    );
    check_through(&engine, 0, std::slice::from_ref(&model_a));
    engine.shutdown().unwrap();
    check_backend(&*a, 0, 1, std::slice::from_ref(&model_a));
}

/// Devices that survive engines: a cache and one backend per volume name.
struct Disks {
    cache: Arc<FaultDevice<MemDevice>>,
    backends: Vec<(String, Arc<FaultDevice<MemDevice>>)>,
}

impl Disks {
    fn new(cache: &CacheConfig, names: &[&str]) -> Disks {
        let layout = Layout::for_slots(cache.line_size.bytes(), cache.capacity_lines).unwrap();
        Disks {
            cache: Arc::new(FaultDevice::new(MemDevice::new("cache", layout.device_bytes()))),
            backends: names
                .iter()
                .map(|n| {
                    (
                        n.to_string(),
                        Arc::new(FaultDevice::new(MemDevice::new(*n, 1024 * SECTOR))),
                    )
                })
                .collect(),
        }
    }

    /// A write-back cache of `lines` lines over backends named `names`,
    /// and an engine in `persistence` serving those of `serving`.
    fn serving(
        lines: u64,
        names: &[&str],
        persistence: Persistence,
        serving: &[&str],
    ) -> (CacheConfig, Disks, Engine) {
        let cache = cache_config(lines, WritePolicy::WriteBack);
        let disks = Disks::new(&cache, names);
        let engine = disks.open(&cache, persistence, serving).unwrap();
        (cache, disks, engine)
    }

    fn backend(&self, name: &str) -> Arc<FaultDevice<MemDevice>> {
        self.backends.iter().find(|(n, _)| n == name).unwrap().1.clone()
    }

    /// Sector `sector` as backend `name` holds it.
    fn backend_sector(&self, name: &str, sector: u64) -> [u8; 512] {
        let mut buf = [0u8; 512];
        self.backend(name).read_at(&mut buf, sector * SECTOR).unwrap();
        buf
    }

    fn open(
        &self,
        cache: &CacheConfig,
        persistence: Persistence,
        names: &[&str],
    ) -> Result<Engine, EngineError> {
        let cache_dev: Arc<dyn BlockDevice> = self.cache.clone();
        Engine::with_volumes(
            EngineConfig {
                shards: 2,
                ..engine_config(cache, Lookup::Fine, persistence)
            },
            cache_dev,
            names
                .iter()
                .map(|n| (n.to_string(), self.backend(n) as Arc<dyn BlockDevice>))
                .collect(),
        )
    }

    fn power_cut(&self) {
        self.cache.power_cut(PowerCut::DropUnflushed).unwrap();
        for (_, b) in &self.backends {
            b.power_cut(PowerCut::DropUnflushed).unwrap();
        }
    }
}

fn read_sector(engine: &Engine, volume: u32, sector: u64) -> [u8; 512] {
    let mut buf = [0u8; 512];
    engine.read_volume(volume, sector * SECTOR, &mut buf).unwrap();
    buf
}

#[test]
fn a_restart_finds_every_volume_s_lines_by_name() {
    for persistence in [Persistence::Dirty, Persistence::All] {
        // Large enough for every line written: nothing is evicted.
        let (cache, disks, engine) = Disks::serving(256, &["a", "b", "new"], persistence, &["a", "b"]);
        for sector in 0..40u64 {
            engine
                .write_volume(0, sector * 8 * SECTOR, &stamp(0, 0, 1, sector * 8), false)
                .unwrap();
            engine
                .write_volume(1, sector * 8 * SECTOR, &stamp(1, 0, 2, sector * 8), false)
                .unwrap();
        }
        engine.flush().unwrap();
        // A crash: the engine is abandoned, unflushed writes are lost.
        drop(engine);
        disks.power_cut();
        assert_eq!(
            disks.backend_sector("a", 8),
            [0u8; 512],
            "the data lives in the cache only"
        );

        // Given in the other order, each volume keeps its id by name.
        let engine = disks.open(&cache, persistence, &["b", "a"]).unwrap();
        let a = engine.volume_named("a").unwrap();
        let b = engine.volume_named("b").unwrap();
        assert_eq!((a.id(), b.id()), (0, 1));
        assert_eq!(engine.default_volume().name(), "b");
        assert_eq!(engine.stats().recovery.dirty_lines, 80);
        assert_eq!(engine.volume_stats(0).unwrap().dirty_lines, 40);
        for sector in 0..40u64 {
            assert_eq!(read_sector(&engine, 0, sector * 8), stamp(0, 0, 1, sector * 8));
            assert_eq!(read_sector(&engine, 1, sector * 8), stamp(1, 0, 2, sector * 8));
        }
        drop(engine);

        // Without `b`, its dirty lines cannot be written back: refused, naming it.
        let err = disks
            .open(&cache, persistence, &["a"])
            .err()
            .expect("refused")
            .to_string();
        assert!(
            err.contains("`b` (40 lines; backend RAM device") && err.contains("does not serve"),
            "{err}"
        );
        // A new volume alongside gets a new id; a clean shutdown writes everything back.
        let engine = disks.open(&cache, persistence, &["a", "new", "b"]).unwrap();
        assert_eq!(engine.volume_named("new").unwrap().id(), 2);
        engine.shutdown().unwrap();
        drop(engine);
        disks.power_cut();
        for sector in 0..40u64 {
            assert_eq!(disks.backend_sector("b", sector * 8), stamp(1, 0, 2, sector * 8));
        }
        // Now `b` may stay away: it has no dirty line left.
        let engine = disks.open(&cache, persistence, &["a"]).unwrap();
        assert_eq!(read_sector(&engine, 0, 8), stamp(0, 0, 1, 8));
        engine.shutdown().unwrap();
    }
}

#[test]
fn a_detached_volume_is_durable_and_never_resurrected() {
    for persistence in [Persistence::Dirty, Persistence::All, Persistence::None] {
        let (cache, disks, engine) = Disks::serving(256, &["a", "b"], persistence, &["a", "b"]);
        for sector in 0..30u64 {
            // Dirty lines of `a` (recorded by the FLUSH below), clean whole
            // lines of `a` (hashed in mode all), dirty lines of `b`.
            engine
                .write_volume(0, sector * 8 * SECTOR, &stamp(0, 0, 1, sector * 8), false)
                .unwrap();
            let mut line = vec![0u8; LINE as usize];
            engine
                .read_volume(0, (512 + sector * 8) * SECTOR, &mut line)
                .unwrap();
            engine
                .write_volume(1, sector * 8 * SECTOR, &stamp(1, 0, 2, sector * 8), false)
                .unwrap();
        }
        engine.flush().unwrap();
        engine.detach(0).unwrap();
        // The power goes right after the detach returned.
        drop(engine);
        disks.power_cut();
        for sector in 0..30u64 {
            assert_eq!(
                disks.backend_sector("a", sector * 8),
                stamp(0, 0, 1, sector * 8),
                "{persistence}: detach made `a` durable"
            );
        }
        // `a` may stay away (no dirty line of it is recorded), `b` is intact.
        let engine = disks.open(&cache, persistence, &["b"]).unwrap();
        if persistence != Persistence::None {
            assert_eq!(engine.stats().recovery.dirty_lines, 30, "{persistence}");
        }
        let b = engine.volume_named("b").unwrap().id();
        assert_eq!(b, 1, "b keeps its id");
        for sector in 0..30u64 {
            assert_eq!(read_sector(&engine, b, sector * 8), stamp(1, 0, 2, sector * 8));
        }
        drop(engine);
        // Served again, `a` finds no line of its own in the cache (its
        // records were blanked): every read comes from its backend.
        let engine = disks.open(&cache, persistence, &["a", "b"]).unwrap();
        let a = engine.volume_named("a").unwrap().id();
        assert_eq!(engine.volume_stats(a).unwrap().resident_lines, 0, "{persistence}");
        let b = engine.volume_named("b").unwrap().id();
        if persistence != Persistence::None {
            assert_eq!(engine.volume_stats(b).unwrap().dirty_lines, 30, "{persistence}");
        }
        assert_eq!(read_sector(&engine, a, 8), stamp(0, 0, 1, 8));
        engine.shutdown().unwrap();
    }
}

#[test]
fn a_detach_that_cannot_write_back_leaves_the_volume_serving() {
    let (_, disks, engine) = Disks::serving(256, &["a", "b"], Persistence::Dirty, &["a", "b"]);
    for sector in 0..20u64 {
        engine
            .write_volume(0, sector * 8 * SECTOR, &stamp(0, 0, 5, sector * 8), false)
            .unwrap();
    }
    disks.backend("a").fail_range(0, 1 << 20, false, true);
    let err = engine.detach(0).unwrap_err();
    assert!(matches!(err, EngineError::DirtyLinesRemain { .. }), "{err}");
    // Nothing lost, still served; the other volume never noticed.
    assert_eq!(read_sector(&engine, 0, 8), stamp(0, 0, 5, 8));
    // The other volume keeps working (a FUA write: a barrier, which flushes
    // every volume's backend).
    engine.write_volume(1, 0, &stamp(1, 0, 1, 0), true).unwrap();
    disks.backend("a").clear_faults();
    disks.backend("a").fail_nth(IoKind::Flush, 1);
    assert!(
        engine.detach(0).is_err(),
        "a failed backend flush fails the detach"
    );
    assert_eq!(read_sector(&engine, 0, 16), stamp(0, 0, 5, 16));
    engine.detach(0).unwrap();
    assert_eq!(disks.backend_sector("a", 16), stamp(0, 0, 5, 16));
    engine.shutdown().unwrap();
}

#[test]
fn init_formats_for_every_volume() {
    let (cache, disks, engine) = Disks::serving(16, &["a", "b"], Persistence::Dirty, &["a", "b"]);
    engine.write_volume(1, 0, &[3u8; 512], true).unwrap();
    drop(engine);
    let cache_dev: Arc<dyn BlockDevice> = disks.cache.clone();
    let refused = Engine::with_volumes(
        EngineConfig {
            init: InitMode::Format { discard_dirty: false },
            ..engine_config(&cache, Lookup::Fine, Persistence::Dirty)
        },
        cache_dev,
        vec![("b".into(), disks.backend("b") as Arc<dyn BlockDevice>)],
    );
    assert!(refused.err().unwrap().to_string().contains("dirty lines"));
    let two = Engine::with_volumes(
        engine_config(&cache, Lookup::Fine, Persistence::Dirty),
        disks.cache.clone(),
        vec![
            ("x".into(), disks.backend("a") as Arc<dyn BlockDevice>),
            ("x".into(), disks.backend("b") as Arc<dyn BlockDevice>),
        ],
    );
    assert!(
        matches!(two, Err(EngineError::Volume(_))),
        "two volumes of one name"
    );
}

#[test]
fn a_volume_never_inherits_the_lines_of_another_that_had_its_id() {
    for (middle, crash) in [
        (Persistence::None, false),
        (Persistence::Dirty, false),
        (Persistence::Dirty, true),
    ] {
        let cache = cache_config(64, WritePolicy::WriteBack);
        let disks = Disks::new(&cache, &["x", "y", "z"]);
        // `x` caches clean lines; its clean shutdown records them.
        let engine = disks.open(&cache, Persistence::All, &["x"]).unwrap();
        disks.backend("x").write_at(&[0x77; 8192], 0).unwrap();
        let mut line = vec![0u8; 8192];
        engine.read(0, &mut line).unwrap();
        engine.shutdown().unwrap();
        drop(engine);
        // Served without `x`, whose records are not loaded (and must go).
        let engine = disks.open(&cache, middle, &["y"]).unwrap();
        assert!(engine.stats().recovery.dropped_clean_lines > 0);
        if crash {
            drop(engine);
            disks.power_cut();
        } else {
            engine.shutdown().unwrap();
        }
        // `z` comes with the id `x` had: it reads its own backend.
        let engine = disks.open(&cache, Persistence::All, &["z"]).unwrap();
        assert_eq!(
            engine.volume_named("z").unwrap().id(),
            0,
            "`x`'s id is free again"
        );
        let mut buf = [1u8; 512];
        engine.read(0, &mut buf).unwrap();
        assert_eq!(buf, [0u8; 512], "{middle}: `z` read a line of `x`");
        assert_eq!(engine.stats().recovery.clean_lines, 0, "{middle}");
    }
}

/// `read_would_hit` (the NBD server's hint for serving a read at once):
/// true only when every line of the read is resident and fully valid, at
/// most 16 lines, inside the volume; the state it reports follows writes
/// and reads.
#[test]
fn a_read_would_hit_only_when_every_line_is_cached_in_full() {
    let cache = cache_config(64, WritePolicy::WriteBack);
    let a: Arc<dyn BlockDevice> = Arc::new(MemDevice::new("a", 1 << 20));
    let engine = Engine::new(
        engine_config(&cache, Lookup::Fine, Persistence::Dirty),
        cache_device(&cache),
        a,
    )
    .unwrap();
    let volume = engine.volume(0).unwrap();
    assert!(!engine.read_would_hit(&volume, 0, LINE));
    // Written in full: resident and valid.
    engine.write(0, &vec![7u8; 20 * LINE as usize], false).unwrap();
    assert!(engine.read_would_hit(&volume, 0, LINE));
    assert!(engine.read_would_hit(&volume, 512, 16 * LINE - 512));
    assert!(engine.read_would_hit(&volume, 0, 16 * LINE));
    // 17 lines: too long to ask.
    assert!(!engine.read_would_hit(&volume, 0, 17 * LINE));
    // A line written in part is not valid in full.
    engine.write(40 * LINE, &[1u8; 512], false).unwrap();
    assert!(!engine.read_would_hit(&volume, 40 * LINE, 512));
    // Read once (a miss, promoted): then a hit.
    let mut buf = vec![0u8; LINE as usize];
    engine.read(30 * LINE, &mut buf).unwrap();
    assert!(engine.read_would_hit(&volume, 30 * LINE, LINE));
    // Empty, past the end, overflowing: no.
    assert!(!engine.read_would_hit(&volume, 0, 0));
    assert!(!engine.read_would_hit(&volume, (1 << 20) - LINE, 2 * LINE));
    assert!(!engine.read_would_hit(&volume, u64::MAX - 10, 20));
    engine.shutdown().unwrap();
}

/// A cache device slower than memory (latency added, as an NVMe drive or a
/// remote one has) makes no read quick, however well cached: served on the
/// connection's own thread, each would hold up the requests behind it.
#[test]
fn no_read_is_quick_on_a_cache_device_slower_than_memory() {
    let cache = cache_config(64, WritePolicy::WriteBack);
    let device = Arc::new(FaultDevice::new(MemDevice::new(
        "cache",
        cache_device(&cache).len_bytes(),
    )));
    let a: Arc<dyn BlockDevice> = Arc::new(MemDevice::new("a", 1 << 20));
    let engine = Engine::new(
        engine_config(&cache, Lookup::Fine, Persistence::Dirty),
        device.clone(),
        a,
    )
    .unwrap();
    let volume = engine.volume(0).unwrap();
    engine.write(0, &vec![7u8; LINE as usize], false).unwrap();
    assert!(engine.read_would_hit(&volume, 0, LINE));
    device.set_latency(std::time::Duration::from_micros(50));
    assert!(!engine.read_would_hit(&volume, 0, LINE));
    // Still served from the cache, only not inline.
    let mut buf = vec![0u8; LINE as usize];
    engine.read(0, &mut buf).unwrap();
    assert_eq!(buf, vec![7u8; LINE as usize]);
    assert_eq!(engine.stats().cache.read_hits, 1);
    device.set_latency(std::time::Duration::ZERO);
    assert!(engine.read_would_hit(&volume, 0, LINE));
    engine.shutdown().unwrap();
}

//! Device faults under the engine: a backend that fails or disappears, a
//! cache device that fails reads or writes. Acknowledged writes are never
//! lost, a failed request gets an error, the engine keeps serving what it
//! can, and no read ever returns wrong data.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use iocache_core::{CacheConfig, LineSize, PolicySpec, WritePolicy};
use iocache_device::{BlockDevice, FaultDevice, IoKind, MemDevice};
use iocache_engine::{Engine, EngineConfig, Layout, Persistence};

mod common;

const SECTOR: u64 = 512;
const VOLUME_SECTORS: u64 = 1024;

type Fault = Arc<FaultDevice<MemDevice>>;

fn setup(wp: WritePolicy, lines: u64, flush: &str) -> (Engine, Fault, Fault) {
    setup_with(wp, lines, flush, Persistence::Dirty)
}

fn setup_with(wp: WritePolicy, lines: u64, flush: &str, persistence: Persistence) -> (Engine, Fault, Fault) {
    let mut cache = CacheConfig::new(lines, LineSize::new(4096).unwrap(), PolicySpec::lru());
    cache.write_policy = wp;
    cache.cleaning = flush.parse().unwrap();
    let (cache_dev, backend) = common::fault_devices(4096, lines, VOLUME_SECTORS * SECTOR);
    let engine = Engine::new(
        EngineConfig {
            shards: 2,
            persistence,
            ..EngineConfig::new(cache)
        },
        cache_dev.clone() as Arc<dyn BlockDevice>,
        backend.clone() as Arc<dyn BlockDevice>,
    )
    .unwrap();
    (engine, cache_dev, backend)
}

fn stamp(value: u64) -> Vec<u8> {
    let mut s = vec![0u8; SECTOR as usize];
    for chunk in s.chunks_mut(8) {
        chunk.copy_from_slice(&value.to_le_bytes());
    }
    s
}

fn value_of(bytes: &[u8]) -> u64 {
    let v = u64::from_le_bytes(bytes[..8].try_into().unwrap());
    assert!(
        bytes.chunks(8).all(|c| c == v.to_le_bytes()),
        "a sector that is no value ever written: {:?}",
        &bytes[..16]
    );
    v
}

/// A read of `buf` from sector `first` returned one of the values each
/// sector may hold; what was read is what the sector holds from now on.
fn check_read(possible: &mut [HashSet<u64>], first: u64, buf: &[u8], run: &str) {
    for (i, chunk) in buf.chunks(SECTOR as usize).enumerate() {
        let s = (first + i as u64) as usize;
        let got = value_of(chunk);
        assert!(
            possible[s].contains(&got),
            "{run}: sector {s} read {got}, possible {:?}",
            possible[s]
        );
        possible[s] = HashSet::from([got]);
    }
}

/// Every sector of `backend` (the first `possible.len()`) holds one of
/// the values `possible` allows it.
fn assert_backend_possible(backend: &dyn BlockDevice, possible: &[HashSet<u64>], run: &str) {
    for (s, allowed) in possible.iter().enumerate() {
        let mut buf = vec![0u8; SECTOR as usize];
        backend.read_at(&mut buf, s as u64 * SECTOR).unwrap();
        let got = value_of(&buf);
        assert!(
            allowed.contains(&got),
            "{run}: backend sector {s} holds {got}, possible {allowed:?}"
        );
    }
}

fn wait_until(what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !ok() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_backend_outage_loses_nothing_and_cached_data_stays_readable() {
    let (engine, _cache, backend) = setup(WritePolicy::WriteBack, 32, "aggressive:interval=1ms:batch=4");
    // 16 lines written (dirty), acknowledged and flushed.
    for sector in (0..128).step_by(8) {
        engine.write(sector * SECTOR, &stamp(sector + 1), false).unwrap();
    }
    engine.flush().unwrap();
    backend.set_offline(true);
    // Cached data is served; more writes to cached lines are absorbed.
    for sector in (0..128).step_by(8) {
        let mut buf = vec![0u8; SECTOR as usize];
        engine.read(sector * SECTOR, &mut buf).unwrap();
        assert_eq!(value_of(&buf), sector + 1);
        engine
            .write(sector * SECTOR, &stamp(sector + 1000), false)
            .unwrap();
    }
    // What needs the backend fails with an error, not wrong data.
    let mut buf = vec![0u8; SECTOR as usize];
    assert!(engine.read(900 * SECTOR, &mut buf).is_err());
    assert!(
        engine.flush().is_err(),
        "a FLUSH cannot succeed without the backend"
    );
    // The cleaner keeps trying, backing off.
    wait_until("failed write-backs", || engine.stats().failed_writebacks > 0);
    let stats = engine.stats();
    assert!(stats.backend_errors > 0);
    assert!(
        stats.dirty_lines > 0,
        "dirty lines stay dirty while the backend is away"
    );
    // The backend comes back: the cleaner drains the dirty lines.
    backend.set_offline(false);
    engine.flush().unwrap();
    wait_until("the cleaner to drain", || engine.stats().dirty_lines == 0);
    for sector in (0..128).step_by(8) {
        let mut buf = vec![0u8; SECTOR as usize];
        backend.read_at(&mut buf, sector * SECTOR).unwrap();
        assert_eq!(value_of(&buf), sector + 1000, "backend sector {sector}");
    }
}

#[test]
fn failing_cache_reads_are_served_from_the_backend_and_past_a_threshold_the_cache_steps_aside() {
    let (engine, cache, backend) = setup(WritePolicy::WriteThrough, 64, "nop");
    for sector in (0..256).step_by(8) {
        engine.write(sector * SECTOR, &stamp(sector + 7), false).unwrap();
    }
    let hits = engine.stats().cache.read_hits;
    // Every read of the cache device fails from now on.
    cache.fail_range(0, cache.len_bytes(), true, false);
    for round in 0..2 {
        for sector in (0..256).step_by(8) {
            let mut buf = vec![0u8; SECTOR as usize];
            engine.read(sector * SECTOR, &mut buf).unwrap();
            assert_eq!(value_of(&buf), sector + 7, "round {round}, sector {sector}");
        }
    }
    let stats = engine.stats();
    assert!(
        stats.cache.read_hits > hits,
        "the reads were hits, served around the device"
    );
    assert!(stats.cache_device_errors >= 16);
    assert!(
        stats.cache_device_failed,
        "past the threshold the volume runs pass-through"
    );
    // Said truthfully: the configured policy, and the one in force with why.
    assert_eq!(engine.write_policy(), WritePolicy::WriteThrough);
    let effective = engine.effective_mode();
    assert_eq!(effective.policy, WritePolicy::PassThrough);
    assert_eq!(effective.cause, iocache_core::ModeCause::CacheDeviceFailed);
    // Writes still work (to the backend) and reads stay right.
    engine.write(8 * SECTOR, &stamp(99), false).unwrap();
    let mut buf = vec![0u8; SECTOR as usize];
    engine.read(8 * SECTOR, &mut buf).unwrap();
    assert_eq!(value_of(&buf), 99);
    backend.read_at(&mut buf, 8 * SECTOR).unwrap();
    assert_eq!(value_of(&buf), 99);
    // The device recovers: a probe notices and the cache is used again.
    cache.clear_faults();
    wait_until("the probe", || !engine.stats().cache_device_failed);
    let effective = engine.effective_mode();
    assert_eq!(
        (effective.policy, effective.cause),
        (WritePolicy::WriteThrough, iocache_core::ModeCause::Configured)
    );
}

#[test]
fn dirty_data_on_an_unreadable_cache_device_is_an_error_not_stale_data() {
    let (engine, cache, _backend) = setup(WritePolicy::WriteBack, 32, "nop");
    engine.write(0, &stamp(1), false).unwrap();
    engine.flush().unwrap();
    engine.write(0, &stamp(2), false).unwrap();
    cache.fail_range(0, cache.len_bytes(), true, false);
    let mut buf = vec![0u8; SECTOR as usize];
    assert!(
        engine.read(0, &mut buf).is_err(),
        "the backend's older value must not be served"
    );
    cache.clear_faults();
    engine.read(0, &mut buf).unwrap();
    assert_eq!(value_of(&buf), 2);
}

/// A failed write (cache device or backend) leaves its sectors holding the
/// old or the new value; every other sector keeps its value.
#[test]
fn random_faults_never_give_wrong_data_and_lose_no_acknowledged_write() {
    let seeds: u64 = std::env::var("IOCACHE_FAULT_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(12);
    for seed in 1..=seeds {
        random_faults(seed);
    }
}

fn random_faults(seed: u64) {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let wp = [
        WritePolicy::WriteBack,
        WritePolicy::WriteThrough,
        WritePolicy::WriteOnly,
    ][(seed % 3) as usize];
    let (engine, cache, backend) = setup(wp, 16, "aggressive:interval=1ms:batch=4");
    // Per sector: the values it may hold (one after a successful write).
    let mut possible: Vec<HashSet<u64>> = vec![HashSet::from([0]); VOLUME_SECTORS as usize];
    let mut value = 0;
    for _ in 0..1500 {
        let r = next();
        match r % 20 {
            0 => cache.fail_nth(
                if r & 64 == 0 { IoKind::Read } else { IoKind::Write },
                1 + (r >> 8) % 5,
            ),
            1 => backend.fail_nth(
                if r & 64 == 0 { IoKind::Read } else { IoKind::Write },
                1 + (r >> 8) % 5,
            ),
            2 => backend.set_offline(r & 64 == 0),
            3..=10 => {
                let sectors = 1 + (r >> 8) % 12;
                let first = (r >> 20) % (VOLUME_SECTORS - sectors);
                let base = value + 1;
                value += sectors;
                let mut data = Vec::new();
                for i in 0..sectors {
                    data.extend_from_slice(&stamp(base + i));
                }
                let ok = engine.write(first * SECTOR, &data, false).is_ok();
                for i in 0..sectors {
                    let v = base + i;
                    let set = &mut possible[(first + i) as usize];
                    if ok {
                        set.clear();
                    }
                    set.insert(v);
                }
            }
            _ => {
                let sectors = 1 + (r >> 8) % 16;
                let first = (r >> 20) % (VOLUME_SECTORS - sectors);
                let mut buf = vec![0u8; (sectors * SECTOR) as usize];
                if engine.read(first * SECTOR, &mut buf).is_ok() {
                    check_read(&mut possible, first, &buf, &format!("seed {seed} ({wp})"));
                }
            }
        }
    }
    // Faults end: everything acknowledged reaches the backend.
    cache.clear_faults();
    backend.clear_faults();
    backend.set_offline(false);
    wait_until("a successful flush", || engine.flush_all().is_ok());
    assert_backend_possible(&*backend, &possible, &format!("seed {seed} ({wp})"));
}

/// A tmpfs of `bytes` mounted for the test and unmounted when dropped.
struct SmallFs(std::path::PathBuf);

impl SmallFs {
    fn mount(bytes: u64) -> Option<SmallFs> {
        let dir = std::env::temp_dir().join(format!("iocache-smallfs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).ok()?;
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
            .arg(&dir)
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        ok.then_some(SmallFs(dir))
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// The cache device fills up: its file is sparse on a tmpfs smaller than
/// the cache, so cache writes start failing with ENOSPC part way. Nothing
/// wrong is ever read, nothing acknowledged is lost, and past the error
/// threshold the volume runs pass-through.
#[test]
fn a_cache_device_that_fills_up() {
    let Some(fs) = SmallFs::mount(1 << 20) else {
        eprintln!("skipped: cannot mount a tmpfs (needs root)");
        return;
    };
    for wp in [WritePolicy::WriteThrough, WritePolicy::WriteBack] {
        let lines = 1024; // 4 MiB of lines on a 1 MiB file system
        let mut cache = CacheConfig::new(lines, LineSize::new(4096).unwrap(), PolicySpec::lru());
        cache.write_policy = wp;
        cache.cleaning = "aggressive:interval=1ms:batch=16".parse().unwrap();
        let layout = Layout::for_slots(4096, lines).unwrap();
        let path = fs.0.join(format!("cache-{wp}.img"));
        let cache_dev = iocache_device::FileDevice::open(
            &path,
            iocache_device::OpenOptions {
                create_size: Some(layout.device_bytes()),
                ..Default::default()
            },
        )
        .unwrap();
        let backend = Arc::new(MemDevice::new("backend", 8 << 20));
        let engine = Engine::new(
            EngineConfig {
                persistence: Persistence::Dirty,
                ..EngineConfig::new(cache)
            },
            Arc::new(cache_dev),
            backend.clone() as Arc<dyn BlockDevice>,
        )
        .unwrap();
        let sectors = (8u64 << 20) / SECTOR;
        let mut possible: Vec<HashSet<u64>> = vec![HashSet::from([0]); sectors as usize];
        let mut value = 0;
        // Seen during the loop, not only at its end: a probe (every 2 s)
        // that the full file system still answers ends pass-through until
        // the errors pass the threshold again, so a slow run may end in
        // either state.
        let mut failed_seen = false;
        for round in 0..3u64 {
            for line in 0..(8u64 << 20) / 4096 {
                if line % 32 == 0 {
                    failed_seen |= engine.stats().cache_device_failed;
                }
                let first = line * 8 + (round % 8);
                value += 1;
                let ok = engine.write(first * SECTOR, &stamp(value), false).is_ok();
                let set = &mut possible[first as usize];
                if ok {
                    set.clear();
                }
                set.insert(value);
                let mut buf = vec![0u8; 4096];
                if engine.read(line * 4096, &mut buf).is_ok() {
                    check_read(&mut possible, line * 8, &buf, &wp.to_string());
                }
            }
        }
        let stats = engine.stats();
        assert!(
            stats.cache_device_errors > 0,
            "{wp}: the file system never filled up"
        );
        assert!(
            failed_seen || stats.cache_device_failed,
            "{wp}: past the threshold the volume runs pass-through"
        );
        wait_until("a successful flush", || engine.flush_all().is_ok());
        assert_backend_possible(&*backend, &possible, &wp.to_string());
        drop(engine);
        let _ = std::fs::remove_file(&path);
    }
}

/// Old failure: a cache device whose flushes failed (reads and writes
/// worked) made FLUSH fail, as it must, but also most reads, which the
/// backend or the cached data could have served, and the device was never
/// marked failed. Now its first failed flush marks it failed: FLUSH keeps
/// failing while dirty data depends on it, every read is served.
#[test]
fn a_cache_device_whose_flushes_fail_is_marked_failed_and_reads_are_served() {
    for persistence in [Persistence::All, Persistence::Dirty] {
        flushes_fail(persistence);
    }
}

fn flushes_fail(persistence: Persistence) {
    let (engine, cache, _backend) = setup_with(WritePolicy::WriteBack, 64, "nop", persistence);
    let mut expected = vec![0u64; VOLUME_SECTORS as usize];
    for sector in (0..VOLUME_SECTORS).step_by(3) {
        engine.write(sector * SECTOR, &stamp(sector + 1), false).unwrap();
        expected[sector as usize] = sector + 1;
    }
    engine.flush().unwrap();
    // Dirty data not flushed yet when the device stops flushing.
    for sector in (1..VOLUME_SECTORS).step_by(7) {
        engine
            .write(sector * SECTOR, &stamp(sector + 5000), false)
            .unwrap();
        expected[sector as usize] = sector + 5000;
    }
    cache.set_flushes_fail(true);
    assert!(
        engine.flush().is_err(),
        "a FLUSH cannot succeed over a device that does not flush"
    );
    assert!(engine.stats().cache_device_failed, "marked failed at once");
    // Writes of lines the cache does not hold dirty go to the backend.
    for sector in (VOLUME_SECTORS - 64..VOLUME_SECTORS).filter(|s| s % 3 != 0 && s % 7 != 1) {
        engine
            .write(sector * SECTOR, &stamp(sector + 9000), false)
            .unwrap();
        expected[sector as usize] = sector + 9000;
    }
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut failed = 0;
    for _ in 0..1500 {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let sector = rng % VOLUME_SECTORS;
        let mut buf = vec![0u8; SECTOR as usize];
        match engine.read(sector * SECTOR, &mut buf) {
            Ok(()) => assert_eq!(value_of(&buf), expected[sector as usize], "sector {sector}"),
            Err(_) => failed += 1,
        }
    }
    assert_eq!(
        failed, 0,
        "{persistence}: reads failed that the cache or the backend could serve"
    );
}

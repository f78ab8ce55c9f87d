//! The engine under concurrent clients: every read returns the latest write of
//! the sectors its thread owns, whatever the lookup mode, write policy and
//! replacement policy, and after `flush_all` the backend holds every write.

use std::sync::Arc;

use iocache_core::{CacheConfig, LineSize, WritePolicy};
use iocache_device::{BlockDevice, MemDevice};
use iocache_engine::{Engine, EngineConfig, IoMode, Layout, Lookup, Persistence};

mod common;
use common::{owned_request, thread_pattern, Rng};

const SECTOR: u64 = 512;
const THREADS: u64 = 4;

fn config(wp: WritePolicy, policy: &str, lines: u64, line_bytes: u64, flush: &str) -> CacheConfig {
    let mut cache = CacheConfig::new(lines, LineSize::new(line_bytes).unwrap(), policy.parse().unwrap());
    cache.write_policy = wp;
    cache.cleaning = flush.parse().unwrap();
    cache
}

fn engine(
    io: IoMode,
    lookup: Lookup,
    cache: CacheConfig,
    volume_sectors: u64,
    persistence: Persistence,
    write_back_gap_bytes: u64,
) -> (Arc<Engine>, Arc<MemDevice>) {
    let layout = Layout::for_slots(cache.line_size.bytes(), cache.capacity_lines).unwrap();
    let cache_dev = Arc::new(MemDevice::new("cache", layout.device_bytes()));
    let backend = Arc::new(MemDevice::new("backend", volume_sectors * SECTOR));
    let engine = Engine::new(
        EngineConfig {
            io,
            lookup,
            persistence,
            // Small caches would get one shard by default: keep several, so
            // requests cross shards and victims live in other shards.
            shards: if lookup == Lookup::Fine { 4 } else { 0 },
            write_back_gap_bytes,
            ..EngineConfig::new(cache)
        },
        cache_dev,
        backend.clone(),
    )
    .unwrap();
    (Arc::new(engine), backend)
}

/// Every sector some thread wrote (`models[thread][sector]`, its last
/// write number; 0: never written) holds that write on the backend; each
/// thread writes the sectors `s` with `s % THREADS` equal to its number.
fn assert_backend_holds(backend: &MemDevice, models: &[Vec<u64>], run: &str) {
    let mut sector = [0u8; SECTOR as usize];
    for s in 0..backend.len_bytes() / SECTOR {
        let owner = s % THREADS;
        let seq = models[owner as usize][s as usize];
        if seq != 0 {
            backend.read_at(&mut sector, s * SECTOR).unwrap();
            assert_eq!(
                sector,
                thread_pattern(owner, seq),
                "backend lost sector {s} ({run})"
            );
        }
    }
}

fn workload(engine: &Engine, thread: u64, volume_sectors: u64, steps: u64) -> Vec<u64> {
    workload_while(engine, thread, volume_sectors, steps, || false)
}

/// `workload`, for at least `steps` steps and then on while `more()` says so,
/// so that a test can keep the load running until something else is done
/// whatever the machine's speed.
fn workload_while(
    engine: &Engine,
    thread: u64,
    volume_sectors: u64,
    steps: u64,
    more: impl Fn() -> bool,
) -> Vec<u64> {
    // Thread `t` owns the sectors with `sector % THREADS == t`; requests span
    // several sectors, so they touch lines and slots shared with other threads,
    // but a thread only writes (and checks) its own sectors.
    let mut model = vec![0u64; volume_sectors as usize];
    let mut rng = Rng::for_thread(thread);
    let mut seq = 0u64;
    while seq < steps || more() {
        seq += 1;
        let r = rng.next();
        // A write: my sectors among those drawn one by one (each a request).
        let write = r.is_multiple_of(3).then_some(r.is_multiple_of(7));
        if let Some((first, buf)) = owned_request(
            engine,
            (THREADS, thread),
            r,
            volume_sectors,
            write,
            seq,
            &mut model,
        ) {
            let count = buf.len() as u64 / SECTOR;
            for (i, sector) in (first..first + count).enumerate() {
                if sector % THREADS == thread && model[sector as usize] != 0 {
                    let got = &buf[i * SECTOR as usize..(i + 1) * SECTOR as usize];
                    assert_eq!(
                        got,
                        &thread_pattern(thread, model[sector as usize])[..],
                        "thread {thread} read a stale sector {sector}"
                    );
                }
            }
        }
        if r.is_multiple_of(97) {
            engine.flush().unwrap();
        }
    }
    model
}

fn run(lookup: Lookup, wp: WritePolicy, policy: &str, lines: u64, line_bytes: u64, flush: &str) {
    run_with(
        IoMode::Psync,
        lookup,
        wp,
        policy,
        lines,
        line_bytes,
        flush,
        Persistence::None,
        0,
    )
}

#[allow(clippy::too_many_arguments)]
fn run_with(
    io: IoMode,
    lookup: Lookup,
    wp: WritePolicy,
    policy: &str,
    lines: u64,
    line_bytes: u64,
    flush: &str,
    persistence: Persistence,
    write_back_gap_bytes: u64,
) {
    let volume_sectors = 4096;
    let (engine, backend) = engine(
        io,
        lookup,
        config(wp, policy, lines, line_bytes, flush),
        volume_sectors,
        persistence,
        write_back_gap_bytes,
    );
    let models: Vec<Vec<u64>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let engine = &engine;
                s.spawn(move || workload(engine, t, volume_sectors, 3000))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    engine.flush_all().unwrap();
    let stats = engine.stats();
    assert_eq!(stats.dirty_lines, 0);
    if wp != WritePolicy::PassThrough {
        assert!(stats.cache.evictions > 0, "the workload must overflow the cache");
    }
    assert_backend_holds(&backend, &models, &format!("{lookup}, {wp}"));
}

#[test]
fn fine_write_back_lru() {
    run(Lookup::Fine, WritePolicy::WriteBack, "lru", 64, 4096, "nop");
}

#[test]
fn fine_write_back_arc_with_aggressive_cleaning() {
    run(
        Lookup::Fine,
        WritePolicy::WriteBack,
        "arc",
        64,
        4096,
        "aggressive:interval=1ms:batch=8",
    );
}

#[test]
fn coarse_write_through() {
    run(Lookup::Coarse, WritePolicy::WriteThrough, "lru", 32, 4096, "nop");
}

#[test]
fn single_write_back_small_lines() {
    run(Lookup::Single, WritePolicy::WriteBack, "s3fifo", 128, 512, "nop");
}

#[test]
fn fine_other_write_policies() {
    for wp in [
        WritePolicy::WriteInvalidate,
        WritePolicy::WriteAround,
        WritePolicy::WriteOnly,
        WritePolicy::PassThrough,
    ] {
        run(Lookup::Fine, wp, "lru", 48, 2048, "nop");
    }
}

#[test]
fn fine_block_eviction_policy() {
    run(
        Lookup::Fine,
        WritePolicy::WriteBack,
        "bplru:block_pages=4",
        64,
        4096,
        "nop",
    );
}

#[test]
fn requests_outside_or_unaligned_are_refused() {
    let (engine, _) = engine(
        IoMode::Psync,
        Lookup::Fine,
        config(WritePolicy::WriteBack, "lru", 16, 4096, "nop"),
        64,
        Persistence::Dirty,
        0,
    );
    let mut buf = vec![0u8; 1024];
    assert!(engine.read(64 * SECTOR - 512, &mut buf).is_err());
    assert!(engine.read(100, &mut buf[..512]).is_err());
    assert!(engine.write(0, &buf[..100], false).is_err());
    engine.write(0, &buf, false).unwrap();
    engine.shutdown().unwrap();
    assert!(engine.read(0, &mut buf).is_err(), "no requests after shutdown");
}

#[test]
fn fine_write_back_small_lines_with_batched_cache_reads() {
    // 512-byte lines: a multi-sector read hit is several ReadCache ops, read as one batch.
    run_with(
        IoMode::Uring,
        Lookup::Fine,
        WritePolicy::WriteBack,
        "lru",
        256,
        512,
        "nop",
        Persistence::None,
        0,
    );
}

#[test]
fn fine_write_back_with_persistent_metadata() {
    // Every write-back, fill and slot reuse also updates the records, and
    // every FLUSH is a barrier: the data path must stay exactly as correct.
    for persistence in [Persistence::Dirty, Persistence::All] {
        run_with(
            IoMode::Psync,
            Lookup::Fine,
            WritePolicy::WriteBack,
            "lru",
            64,
            4096,
            "aggressive:interval=1ms:batch=8",
            persistence,
            0,
        );
        run_with(
            IoMode::Psync,
            Lookup::Coarse,
            WritePolicy::WriteThrough,
            "arc",
            32,
            1024,
            "nop",
            persistence,
            0,
        );
    }
}

/// Write-back that fills the gaps between dirty data with the backend's
/// own bytes (read first, written back with the dirty data in one
/// request), under four threads writing single sectors of shared lines:
/// each FLUSH (volatile metadata: every dirty line written back across
/// all shards) and each cleaner batch holds the lines of its gaps, so no
/// gap ever writes older data over a newer write-back, and no read is stale.
#[test]
fn fine_write_back_filling_gaps_under_load() {
    for (lines, line_bytes, flush, persistence) in [
        (64, 4096, "nop", Persistence::None),
        (128, 1024, "aggressive:interval=1ms:batch=16", Persistence::None),
        (64, 4096, "aggressive:interval=1ms:batch=16", Persistence::All),
    ] {
        run_with(
            IoMode::Psync,
            Lookup::Fine,
            WritePolicy::WriteBack,
            "lru",
            lines,
            line_bytes,
            flush,
            persistence,
            64 << 10,
        );
    }
}

/// Every knob switched again and again while four threads read and write
///: no read is stale, and after `flush_all` the backend holds
/// every write. Includes wb <-> wt/wa/wi/pt with dirty lines present, a
/// replacement policy rebuilt from the cached lines, and a dirty cap.
#[test]
fn fine_every_knob_switched_under_load() {
    let volume_sectors = 4096;
    let (engine, backend) = engine(
        IoMode::Psync,
        Lookup::Fine,
        config(WritePolicy::WriteBack, "lru", 256, 4096, "nop"),
        volume_sectors,
        Persistence::Dirty,
        0,
    );
    let changes = [
        "write_policy=wt",
        "policy=arc",
        "write_policy=wb",
        "max_dirty_lines=16",
        "write_policy=pt",
        "promotion=nhit:2",
        "write_policy=wo",
        "seq_cutoff=16KiB",
        "policy=s3fifo",
        "write_policy=wa",
        "flush=aggressive",
        "max_dirty_lines=off",
        "write_policy=wb",
        "write_miss_bypass=true",
        "policy=clock",
        "write_policy=wi",
        "promotion=always",
        "seq_cutoff=off",
        "flush=nop",
        "write_policy=wb",
    ];
    use std::sync::atomic::{AtomicBool, Ordering};
    /// Sets its flag when dropped, a panic's unwinding included, so that a
    /// failing thread cannot leave the others waiting for ever.
    struct SetOnDrop<'a>(&'a AtomicBool);
    impl Drop for SetOnDrop<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }
    // The load runs until the switcher has gone through every change twice,
    // and the switcher on until the load ends: every change falls during the
    // load however slow the machine.
    let done = AtomicBool::new(false);
    let switched_twice = AtomicBool::new(false);
    let models: Vec<Vec<u64>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let engine = &engine;
                let switched_twice = &switched_twice;
                s.spawn(move || {
                    workload_while(engine, t, volume_sectors, 12_000, || {
                        !switched_twice.load(Ordering::Relaxed)
                    })
                })
            })
            .collect();
        let switcher = s.spawn(|| {
            let _release_the_load = SetOnDrop(&switched_twice);
            let mut applied = 0;
            while !done.load(Ordering::Relaxed) {
                let change: iocache_core::Setting = changes[applied % changes.len()].parse().unwrap();
                let knobs = engine.apply_settings(std::slice::from_ref(&change)).unwrap();
                let knob = knobs.iter().find(|k| k.key == change.key()).unwrap();
                assert_eq!(knob.current, change.value_text());
                applied += 1;
                if applied == 2 * changes.len() {
                    switched_twice.store(true, Ordering::Relaxed);
                }
            }
            applied
        });
        let models: Vec<std::thread::Result<Vec<u64>>> = handles.into_iter().map(|h| h.join()).collect();
        done.store(true, Ordering::Relaxed);
        let applied = switcher.join().unwrap();
        eprintln!("{applied} changes applied during the load");
        models.into_iter().map(|m| m.unwrap()).collect()
    });
    engine.flush_all().unwrap();
    assert_eq!(engine.stats().dirty_lines, 0);
    assert_backend_holds(&backend, &models, "settings changed during the load");
}

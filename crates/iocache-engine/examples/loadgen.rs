//! In-process load generator: 4 KiB random reads of a hot range that fits in
//! the cache, from N threads, straight into the engine (no NBD), to compare
//! the engine's hit path with the raw cache device (fio psync, same jobs).
//!
//! cargo run --release -p iocache-engine --example loadgen -- \
//!     CACHE_FILE CACHE_BYTES HOT_BYTES JOBS SECONDS LOOKUP [WRITE_PERCENT [psync|uring [POLICY [ADAPT]]]]
//!
//! ADAPT: none (default); lbica or sib, with default knobs and a 100 ms
//! interval (the cost of a load balancer on the hit path); reca, ReCA
//! beside the engine (built-in table, 100,000-request windows, the default
//! characterization budget), or reca-all, without a budget (every request
//! characterized).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use iocache_core::balance::{LbicaConfig, SibConfig};
use iocache_core::{CacheConfig, LineSize, PolicySpec};
use iocache_device::{FileDevice, MemDevice, OpenOptions};
use iocache_engine::{
    BalanceConfig, BalanceController, Engine, EngineConfig, InitMode, IoMode, Layout, RecaSetup,
};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 6 {
        eprintln!("usage: loadgen CACHE_FILE CACHE_BYTES HOT_BYTES JOBS SECONDS LOOKUP [WRITE_PERCENT [psync|uring [POLICY [none|lbica|sib|reca|reca-all]]]]");
        std::process::exit(2);
    }
    let cache_bytes: u64 = args[1].parse().expect("CACHE_BYTES");
    let hot_bytes: u64 = args[2].parse().expect("HOT_BYTES");
    let jobs: usize = args[3].parse().expect("JOBS");
    let seconds: u64 = args[4].parse().expect("SECONDS");
    let lookup = args[5].parse().expect("LOOKUP: fine, coarse or single");
    let write_percent: u64 = args.get(6).map_or(0, |w| w.parse().expect("WRITE_PERCENT"));
    let line = LineSize::new(4096).unwrap();
    let balance = match args.get(9).map_or("none", String::as_str) {
        "none" | "reca" | "reca-all" => None,
        "lbica" => Some(BalanceController::Lbica(LbicaConfig::default())),
        "sib" => Some(BalanceController::Sib(SibConfig::default())),
        other => panic!("ADAPT: none, lbica, sib, reca or reca-all, not {other}"),
    }
    .map(|controller| BalanceConfig {
        controller,
        interval_ns: 100_000_000,
    });
    let cache_dev = FileDevice::open(
        std::path::Path::new(&args[0]),
        OpenOptions {
            direct: false,
            create_size: Some(
                Layout::for_slots(4096, cache_bytes / 4096)
                    .unwrap()
                    .device_bytes(),
            ),
            read_only: false,
            exclusive: true,
            no_follow: false,
            beneath: None,
        },
    )
    .expect("cache file");
    let backend = Arc::new(MemDevice::new("backend", hot_bytes.max(cache_bytes) * 2));
    let engine = Arc::new(
        Engine::new(
            EngineConfig {
                lookup,
                io: args
                    .get(7)
                    .map_or(IoMode::Psync, |m| m.parse().expect("IO: psync or uring")),
                init: InitMode::Format { discard_dirty: true },
                balance,
                ..EngineConfig::new(CacheConfig::new(
                    cache_bytes / 4096,
                    line,
                    args.get(8)
                        .map_or(PolicySpec::lru(), |p| p.parse().expect("POLICY")),
                ))
            },
            Arc::new(cache_dev),
            backend,
        )
        .expect("engine"),
    );
    let adapt = args.get(9).map_or("none", |a| a.as_str());
    match adapt {
        "none" | "lbica" | "sib" => {}
        "reca" => engine.start_reca(RecaSetup::builtin()).expect("ReCA"),
        // Every request characterized (no budget).
        "reca-all" => engine
            .start_reca(RecaSetup {
                max_requests_per_second: None,
                ..RecaSetup::builtin()
            })
            .expect("ReCA"),
        other => unreachable!("checked above: {other}"),
    }
    // Warm: read the hot range once, so every later read hits.
    let mut buf = vec![0u8; 1 << 20];
    let mut at = 0;
    while at < hot_bytes {
        let len = (hot_bytes - at).min(buf.len() as u64) as usize;
        engine.read(at, &mut buf[..len]).unwrap();
        at += len as u64;
    }
    let before = engine.stats().cache;
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let handles: Vec<_> = (0..jobs)
        .map(|j| {
            let (engine, stop, done) = (Arc::clone(&engine), Arc::clone(&stop), Arc::clone(&done));
            std::thread::spawn(move || {
                let mut state = 0x9e37_79b9_7f4a_7c15u64 ^ ((j as u64 + 1) * 0x1234_5678_9abc_def1);
                let mut buf = vec![0u8; 4096];
                let blocks = hot_bytes / 4096;
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    let offset = (state % blocks) * 4096;
                    if (state >> 40) % 100 < write_percent {
                        engine.write(offset, &buf, false).unwrap();
                    } else {
                        engine.read(offset, &mut buf).unwrap();
                    }
                    n += 1;
                }
                done.fetch_add(n, Ordering::Relaxed);
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(seconds));
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        h.join().unwrap();
    }
    let elapsed = started.elapsed().as_secs_f64();
    let after = engine.stats().cache;
    let stats = after.since(&before);
    println!(
        "lookup={} policy={} adapt={} jobs={} write%={} iops={:.0} hit_ratio={:.4} requests={}",
        engine.lookup(),
        args.get(8).map_or("lru", |p| p.as_str()),
        args.get(9).map_or("none", |p| p.as_str()),
        jobs,
        write_percent,
        done.load(Ordering::Relaxed) as f64 / elapsed,
        stats.hit_ratio(),
        stats.requests
    );
    if let Some(reca) = engine.reca_status() {
        println!(
            "reca: category={} windows={} observed={} skipped={} dropped={}",
            reca.category.as_deref().unwrap_or("(none)"),
            reca.windows,
            reca.observed_requests,
            reca.skipped_requests,
            reca.dropped_requests
        );
    }
}

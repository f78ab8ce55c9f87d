//! payload memory is bounded in total, not only per
//! connection. Its own test binary, because it counts every heap byte the
//! process holds (a counting global allocator), which other tests running
//! alongside would disturb.
//!
//! Old failure: each connection could hold its own `max_inflight_bytes`
//! (64 MiB) of replies its client never read, and nothing bounded the sum:
//! 64 connections pinned 4 GiB. Here 8 connections may each hold 4 MiB
//! (32 MiB together) but the server's budget is 8 MiB: the heap grows by
//! about 8 MiB, the server's own accounting never passes 8 MiB, and a fresh
//! client is served within seconds: stuck replies give their budget back
//! after `stall_timeout` once someone waits for it, not after the whole
//! `reply_timeout`.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::*;
use iocache_nbd::fuzzing::request;
use iocache_nbd::proto::NBD_CMD_READ;
use iocache_nbd::{Client, ConnectOptions, RunningServer, ServerConfig};

/// The system allocator, counting the bytes live now and the peak.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

/// Counts `size` bytes as live when the allocation `p` succeeded.
fn counted(p: *mut u8, size: usize) -> *mut u8 {
    if !p.is_null() {
        let now = LIVE.fetch_add(size, Ordering::Relaxed) + size;
        PEAK.fetch_max(now, Ordering::Relaxed);
    }
    p
}

// SAFETY: every call is passed on to the system allocator unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        counted(unsafe { System.alloc(layout) }, layout.size())
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        counted(unsafe { System.alloc_zeroed(layout) }, layout.size())
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const MIB: usize = 1 << 20;

/// The counts are process-wide: the tests of this binary take turns (a
/// test running alongside would add its own allocations to another's).
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A server on `config` with a budget of 4 MiB a connection and 8 MiB in
/// all, payloads of 1 MiB at most, and a 16 MiB export.
fn budget_server(mut config: ServerConfig) -> RunningServer {
    config.max_inflight_bytes = 4 * MIB;
    config.max_total_inflight_bytes = 8 * MIB;
    config.limits.max_payload = MIB as u32;
    start_with(config, vec![("disk", mem(16 * MIB) as _)])
}

/// A [`budget_server`] whose replies may wait a minute, their budget
/// freed after `stall_timeout` without progress, and 8 raw clients of it.
fn pinnable_server(name: &str, stall_timeout: Duration) -> (RunningServer, Vec<Raw>) {
    let server = budget_server(ServerConfig {
        reply_timeout: Some(Duration::from_secs(60)),
        stall_timeout,
        ..config(name)
    });
    let raws = (0..8).map(|_| Raw::connect(&server, true)).collect();
    (server, raws)
}

/// Sends 8 pipelined 1 MiB reads on each of `raws`, their replies not read.
fn send_unread_reads(raws: &mut [Raw]) {
    for raw in raws {
        for handle in 0..8u64 {
            raw.send(handle, NBD_CMD_READ, 0, handle * MIB as u64, MIB as u32, &[]);
        }
    }
}

/// Waits (5 s at most) until no reply holds any budget, then stops `server`.
fn assert_budget_given_back_then_stop(server: RunningServer) {
    let started = Instant::now();
    while server.stats().inflight_bytes != 0 {
        assert!(started.elapsed() < Duration::from_secs(5), "budget given back");
        std::thread::sleep(Duration::from_millis(20));
    }
    server.shutdown();
}

#[test]
fn unread_replies_across_many_connections_stay_within_the_global_budget() {
    let _turn = one_at_a_time();
    // Every connection's workers and buffers exist before the baseline.
    let (server, mut raws) = pinnable_server("global", Duration::from_millis(300));
    std::thread::sleep(Duration::from_millis(100));
    let baseline = LIVE.load(Ordering::SeqCst);
    PEAK.store(baseline, Ordering::SeqCst);

    send_unread_reads(&mut raws);
    // Looked at before `stall_timeout` (300 ms) can free anything: after
    // it, how much is in use depends on which connections broke together.
    std::thread::sleep(Duration::from_millis(200));
    let stats = server.stats();
    let grown = PEAK.load(Ordering::SeqCst).saturating_sub(baseline);
    assert!(
        stats.peak_inflight_bytes <= 8 * MIB as u64,
        "accounting: {} bytes held at the peak",
        stats.peak_inflight_bytes
    );
    assert!(
        stats.inflight_bytes >= 6 * MIB as u64,
        "the budget is in use: {} bytes",
        stats.inflight_bytes
    );
    assert!(
        grown < 12 * MIB,
        "the heap grew by {} MiB for 64 MiB of unread replies (budget 8 MiB)",
        grown / MIB
    );

    // No deadlock, and no wait for reply_timeout (60 s): while the fresh
    // client waits for budget, the replies that make no progress for
    // stall_timeout fail, their budget comes back, and it is served.
    let started = Instant::now();
    let mut fresh = Client::connect_unix(server.unix_path().unwrap(), &ConnectOptions::default()).unwrap();
    let mut buf = vec![0u8; MIB];
    fresh.read(0, &mut buf).unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "served after {:?}",
        started.elapsed()
    );
    drop(raws);
    assert_budget_given_back_then_stop(server);
}

/// A fresh client's small request is not queued behind large replies
/// nobody reads: it draws from the small requests' pool at once, long
/// before `stall_timeout` (set to a minute here) would free anything.
#[test]
fn small_requests_are_not_queued_behind_pinned_large_replies() {
    let _turn = one_at_a_time();
    let (server, mut raws) = pinnable_server("small-pool", Duration::from_secs(60));
    send_unread_reads(&mut raws);
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        server.stats().inflight_bytes >= 6 * MIB as u64,
        "the large pool is pinned"
    );
    let started = Instant::now();
    let mut fresh = Client::connect_unix(server.unix_path().unwrap(), &ConnectOptions::default()).unwrap();
    let mut buf = vec![0u8; 4096];
    for i in 0..64u64 {
        fresh.read(i * 4096, &mut buf).unwrap();
    }
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "64 small reads took {:?} behind pinned large replies",
        started.elapsed()
    );
    assert!(server.stats().peak_inflight_bytes <= 8 * MIB as u64);
    drop(raws);
    server.shutdown();
}

/// Many 64 KiB reads served inline (their replies held together, more
/// than the small requests' share in all) give their budget back to the
/// pool each came from: large reads after them are still served, and
/// nothing stays held. (A batch once gave its sum back to the large pool,
/// whose count wrapped: every large read after it waited forever.)
#[test]
fn inline_replies_give_their_budget_back_to_the_pools_they_came_from() {
    let _turn = one_at_a_time();
    let server = budget_server(config("inline-pools"));
    let mut raw = Raw::connect(&server, true);
    for round in 0..4u64 {
        // 64 reads of 64 KiB in one write: buffered, so served inline.
        let mut bytes = Vec::new();
        for i in 0..64u64 {
            bytes.extend(request(
                NBD_CMD_READ,
                0,
                round * 100 + i,
                i * 64 * 1024,
                64 * 1024,
                &[],
            ));
        }
        raw.s.write_all(&bytes).unwrap();
        for _ in 0..64 {
            let (_, errno, data) = raw.recv(|_| 64 * 1024);
            assert_eq!((errno, data.len()), (0, 64 * 1024));
        }
        // Large reads draw from the large pool: still served.
        for i in 0..4u64 {
            raw.send(9000 + i, NBD_CMD_READ, 0, i * MIB as u64, MIB as u32, &[]);
            let (h, errno, data) = raw.recv(|_| MIB);
            assert_eq!((h, errno, data.len()), (9000 + i, 0, MIB));
        }
    }
    assert!(server.stats().served_inline > 0);
    assert_budget_given_back_then_stop(server);
}

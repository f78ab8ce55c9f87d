//! Background cleaning (nop, lazy, aggressive), write-miss bypass and sequential cutoff.

mod common;

use common::{cache, ops_of, write_backend, Harness};
use iocache_core::{CleaningPolicy, FlushToken, Op, OpList, Request, SeqCutoff, WritePolicy};

const MS: u64 = 1_000_000;

/// Runs the cleaner at every wake-up up to `until_ns`, completing each batch at once.
fn clean_until(c: &mut iocache_core::Cache, until_ns: u64) -> Vec<(u64, usize)> {
    let mut ops = OpList::new();
    let mut tokens: Vec<FlushToken> = Vec::new();
    let mut runs = Vec::new();
    while let Some(at) = c.next_cleaning_ns() {
        if at > until_ns {
            break;
        }
        c.run_cleaner(at, &mut ops, &mut tokens);
        assert!(ops.ops().iter().all(|op| matches!(op, Op::WriteBack { .. })));
        for t in &tokens {
            assert!(c.complete_flush(t, true));
        }
        runs.push((at, tokens.len()));
        if tokens.is_empty() {
            break;
        }
    }
    runs
}

#[test]
fn nop_never_cleans() {
    let mut c = cache(8, 4096, |_| {});
    ops_of(&mut c, Request::write(0, 0, 4096, 0));
    assert_eq!(c.next_cleaning_ns(), None);
}

#[test]
fn aggressive_flushes_a_batch_every_interval_whatever_the_load() {
    let mut c = cache(400, 4096, |c| {
        c.cleaning = "aggressive:interval=10ms:batch=128".parse().unwrap()
    });
    assert_eq!(c.next_cleaning_ns(), None, "nothing dirty, nothing to do");
    for i in 0..300u64 {
        ops_of(&mut c, Request::write(0, i * 4096, 4096, i * 1000));
    }
    // First wake: as soon as a line is dirty (the cleaner never ran), then every 10 ms.
    assert_eq!(c.next_cleaning_ns(), Some(0));
    let runs = clean_until(&mut c, 25 * MS);
    assert_eq!(runs, vec![(0, 128), (10 * MS, 128), (20 * MS, 44)]);
    assert_eq!(c.dirty_lines(), 0);
    assert_eq!(c.stats().flushed_lines, 300);
    assert_eq!(c.stats().cleaner_runs, 3);
    assert_eq!(c.next_cleaning_ns(), None);
}

#[test]
fn lazy_waits_for_idleness_and_staleness() {
    let policy: CleaningPolicy = "lazy:idle=1s:interval=100ms:batch=2:stale=500ms".parse().unwrap();
    let mut c = cache(8, 4096, |c| c.cleaning = policy);
    ops_of(&mut c, Request::write(0, 0, 4096, 0));
    ops_of(&mut c, Request::write(0, 4096, 4096, 0));
    ops_of(&mut c, Request::write(0, 8192, 4096, 0));
    // Idle from the last request (t=0) for 1 s.
    assert_eq!(c.next_cleaning_ns(), Some(1000 * MS));
    // A request at 900 ms postpones the cleaner to 1.9 s.
    ops_of(&mut c, Request::read(0, 1 << 20, 4096, 900 * MS));
    assert_eq!(c.next_cleaning_ns(), Some(1900 * MS));
    // A line dirtied at 1.8 s is not stale until 2.3 s: the first runs take the old ones.
    ops_of(&mut c, Request::write(0, 1 << 21, 4096, 1800 * MS));
    assert!(clean_until(&mut c, 2200 * MS).is_empty(), "not idle for 1 s yet");
    // At 2.8 s the two oldest go; at 2.9 s the third and the one dirtied at 1.8 s (stale by 2.3 s).
    let runs = clean_until(&mut c, 10_000 * MS);
    assert_eq!(runs, vec![(2800 * MS, 2), (2900 * MS, 2)]);
    assert_eq!(c.dirty_lines(), 0);
}

#[test]
fn write_misses_bypass_a_cache_full_of_dirty_lines() {
    let mut c = cache(2, 4096, |c| c.write_miss_bypass = true);
    ops_of(&mut c, Request::write(0, 0, 4096, 0));
    ops_of(&mut c, Request::write(0, 4096, 4096, 1));
    let ops = ops_of(&mut c, Request::write(0, 8192, 4096, 2));
    assert_eq!(ops, vec![write_backend(0, 8192, 4096, 0)]);
    assert_eq!(c.stats().write_miss_bypasses, 1);
    assert_eq!(c.stats().evictions, 0);
    // Write hits still go to the cache, and once a line is clean, misses evict again.
    ops_of(&mut c, Request::write(0, 0, 512, 3));
    assert_eq!(c.stats().write_miss_bypasses, 1);
    c.set_write_policy(WritePolicy::WriteThrough);
    ops_of(&mut c, Request::write(0, 0, 4096, 4)); // line 0 is now clean
    c.set_write_policy(WritePolicy::WriteBack);
    ops_of(&mut c, Request::write(0, 12288, 4096, 5));
    assert_eq!(c.stats().write_miss_bypasses, 1);
    assert_eq!(c.stats().evictions, 1);
}

#[test]
fn without_bypass_a_dirty_cache_evicts() {
    let mut c = cache(2, 4096, |_| {});
    ops_of(&mut c, Request::write(0, 0, 4096, 0));
    ops_of(&mut c, Request::write(0, 4096, 4096, 1));
    let ops = ops_of(&mut c, Request::write(0, 8192, 4096, 2));
    assert!(matches!(ops[0], Op::WriteBack { .. }));
    assert_eq!(c.stats().evictions, 1);
}

#[test]
fn sequential_streams_bypass_once_past_the_threshold() {
    let mut c = cache(64, 4096, |c| c.seq_cutoff = "16KiB".parse::<SeqCutoff>().unwrap());
    for i in 0..8u64 {
        ops_of(&mut c, Request::read(0, i * 4096, 4096, i));
    }
    // The first three requests (12 KiB) are cached; from the fourth the stream bypasses.
    assert_eq!(c.resident_lines(), 3);
    assert_eq!(c.stats().seq_cutoff_requests, 5);
    // Random reads are still cached.
    ops_of(&mut c, Request::read(0, 1 << 30, 4096, 100));
    assert_eq!(c.resident_lines(), 4);
}

#[test]
fn cleaning_bypass_and_cutoff_never_lose_or_stale_data() {
    // A mixed workload with every feature on, checked against the data model.
    let mut h = Harness::new(cache(6, 1024, |c| {
        c.cleaning = "aggressive:interval=5ns:batch=2".parse().unwrap();
        c.write_miss_bypass = true;
        c.seq_cutoff = "4KiB:streams=2".parse().unwrap();
    }));
    let mut state = 7u64;
    let mut requests = Vec::new();
    for t in 0..3000u64 {
        common::xorshift(&mut state);
        let sectors = 1 + state % 6;
        let start = if state.is_multiple_of(5) {
            (t % 64) * 2
        } else {
            (state >> 8) % 60
        };
        let r = if (state >> 20).is_multiple_of(2) {
            Request::write(0, start * 512, sectors * 512, t * 3)
        } else {
            Request::read(0, start * 512, sectors * 512, t * 3)
        };
        requests.push(r);
    }
    let mut ops = OpList::new();
    let mut tokens = Vec::new();
    for r in requests {
        while let Some(at) = h.cache.next_cleaning_ns() {
            if at > r.now_ns {
                break;
            }
            h.cache.run_cleaner(at, &mut ops, &mut tokens);
            h.world.execute(&r, ops.ops(), &mut []);
            for t in &tokens {
                h.cache.complete_flush(t, true);
            }
            if tokens.is_empty() {
                break;
            }
        }
        h.run(r);
    }
    assert!(h.cache.stats().cleaner_runs > 0);
    assert!(h.cache.stats().seq_cutoff_requests > 0);
    h.flush_all_and_check_backend();
}

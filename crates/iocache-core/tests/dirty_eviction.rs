//! With `inline_dirty_eviction = false` (what the engine runs), no request
//! ever writes a dirty line back: dirty victims stay resident and only a
//! flush makes them clean. The data model must still hold for every policy
//! and write policy, and the cache must keep working once lines are clean.

mod common;

use common::{action, cache, Harness};
use iocache_core::{Op, OpList, Request};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn requests_never_write_back_and_never_lose_data(
        policy in prop::sample::select(vec!["lru", "arc", "2q", "s3fifo", "sieve", "clock", "lfu", "smq", "larc", "cflru", "bplru:block_pages=2", "reqblock"]),
        line_bytes in prop::sample::select(vec![512u64, 1024, 4096]),
        actions in prop::collection::vec(action(), 1..300),
    ) {
        let mut h = Harness::new(cache(6, line_bytes, |c| {
            c.policy = policy.parse().unwrap();
            c.inline_dirty_eviction = false;
        }));
        let mut ops = OpList::new();
        for (t, action) in actions.into_iter().enumerate() {
            // The harness checks the data; the write-back counter says
            // whether a request (rather than a flush) wrote a line back.
            let before = h.cache.stats().dirty_writebacks;
            let was_flush = matches!(action, common::Action::Flush(_));
            h.apply(action, t as u64);
            if !was_flush {
                prop_assert_eq!(h.cache.stats().dirty_writebacks, before, "a request wrote a dirty line back");
            }
        }
        h.flush_all_and_check_backend();
        // Once clean, a miss evicts again: the cache is not stuck.
        let resident = h.cache.resident_lines();
        h.cache.access(&Request::read(0, 1 << 20, 512, 10_000), &mut ops).unwrap();
        prop_assert!(h.cache.resident_lines() >= resident.min(1));
        let wrote_back = ops.ops().iter().any(|op| matches!(op, Op::WriteBack { .. }));
        prop_assert!(!wrote_back, "a read miss wrote a line back");
    }
}

#[test]
fn a_cache_full_of_dirty_lines_bypasses_and_reports_it() {
    let mut c = cache(4, 4096, |c| c.inline_dirty_eviction = false);
    let mut ops = OpList::new();
    for line in 0..4u64 {
        c.access(&Request::write(0, line * 4096, 4096, line), &mut ops)
            .unwrap();
    }
    assert_eq!(c.dirty_lines(), 4);
    let summary = c
        .access(&Request::read(0, 100 * 4096, 4096, 10), &mut ops)
        .unwrap();
    assert_eq!(summary.misses, 1);
    assert!(summary.dirty_victims_kept >= 1, "{summary:?}");
    assert!(!ops
        .ops()
        .iter()
        .any(|op| matches!(op, Op::WriteBack { .. } | Op::WriteCache { .. })));
    assert_eq!(c.resident_lines(), 4, "the read bypassed the cache");
    assert!(c
        .line_state(iocache_core::LineKey {
            volume: 0,
            line_index: 100
        })
        .is_none());
    c.check_invariants();
    // A write miss goes to the backend.
    c.access(&Request::write(0, 200 * 4096, 4096, 11), &mut ops)
        .unwrap();
    assert!(ops.ops().iter().any(|op| matches!(op, Op::WriteBackend { .. })));
    assert_eq!(c.dirty_lines(), 4);
}

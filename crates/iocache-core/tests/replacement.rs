//! Replacement policies on hand-computed sequences, and LRU against a naive model.

mod common;

use common::driver::{key, Driver, Outcome};
use common::{action, any_inserting_write_policy, cache, model_cache, Harness};
use iocache_core::policy::{Arc, Lru, ReplacementPolicy};
use iocache_core::{OpList, PolicySpec, Request};
use proptest::prelude::*;

/// One read on `d`; LRU and ARC admit every miss, evicting one line at a
/// time, and always name a victim in a full cache.
fn access<P: ReplacementPolicy>(d: &mut Driver<P>, line: u64) {
    let evicted = d.evicted.len();
    assert_ne!(d.read(line), Outcome::Bypassed);
    assert!(
        d.evicted.len() <= evicted + 1,
        "LRU and ARC evict one line at a time"
    );
}

#[test]
fn arc_follows_the_fast03_cases() {
    let mut d = Driver::new(Arc::new(2), 2);
    for line in [1, 2, 1] {
        access(&mut d, line);
    }
    assert_eq!(d.hits, 1);
    assert_eq!(d.policy.list_sizes(), (1, 1, 0, 0)); // T1=[2], T2=[1]
                                                     // Each step: the line accessed, then p (None: not checked), (|T1|, |T2|,
                                                     // |B1|, |B2|) and the resident lines after it.
    let steps = [
        // Case IV: a new line; T1's LRU (2) goes to B1.
        (3, None, (1, 1, 1, 0), [1, 3]),
        // Case II: 2 is in B1: p grows to 1; |T1| = p so T2's LRU (1) goes to B2; 2 enters T2.
        (2, Some(1.0), (1, 1, 0, 1), [2, 3]),
        // Case III: 1 is in B2: p shrinks to 0; T1's LRU (3) goes to B1; 1 enters T2.
        (1, Some(0.0), (0, 2, 1, 0), [1, 2]),
        // Case II with T1 empty: p back to 1, T2's LRU (2) goes to B2, 3 enters T2.
        (3, Some(1.0), (0, 2, 0, 1), [1, 3]),
    ];
    for (line, target_t1, sizes, resident) in steps {
        access(&mut d, line);
        if let Some(p) = target_t1 {
            assert_eq!(d.policy.target_t1(), p, "after {line}");
        }
        assert_eq!(d.policy.list_sizes(), sizes, "after {line}");
        assert_eq!(d.resident(), resident, "after {line}");
    }
    assert_eq!(d.hits, 1);
}

#[test]
fn arc_resists_a_scan_that_flushes_lru() {
    // A hot pair accessed twice, then a long one-time scan, then the pair again.
    let hot = [100, 101];
    let mut seq: Vec<u64> = Vec::new();
    seq.extend(hot);
    seq.extend(hot);
    seq.extend(0..10);
    seq.extend(hot);
    let mut arc = Driver::new(Arc::new(4), 4);
    let mut lru = Driver::new(Lru::new(4), 4);
    for &l in &seq {
        access(&mut arc, l);
        access(&mut lru, l);
    }
    assert_eq!(lru.hits, 2, "LRU lost the hot pair to the scan");
    assert_eq!(arc.hits, 4, "ARC kept the hot pair in T2");
}

#[test]
fn lru_on_a_one_line_cache() {
    let mut d = Driver::new(Lru::new(1), 1);
    for line in [7, 7, 8, 7, 7] {
        access(&mut d, line);
    }
    assert_eq!(d.hits, 2);
    assert_eq!(d.resident(), vec![7]);
}

#[test]
fn lru_evicts_least_recently_used() {
    let mut d = Driver::new(Lru::new(3), 3);
    for line in [1, 2, 3, 1, 4] {
        access(&mut d, line);
    }
    assert_eq!(d.resident(), vec![1, 3, 4]);
}

/// The simplest possible LRU: a vector ordered from most to least recent.
fn naive_lru_hits(capacity: usize, lines: &[u64]) -> (u64, Vec<u64>) {
    let mut order: Vec<u64> = Vec::new();
    let mut hits = 0;
    for &l in lines {
        if let Some(at) = order.iter().position(|&x| x == l) {
            hits += 1;
            order.remove(at);
        } else if order.len() == capacity {
            order.pop();
        }
        order.insert(0, l);
    }
    order.sort();
    (hits, order)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn lru_cache_matches_naive_model(
        capacity in 1u64..12,
        lines in prop::collection::vec(0u64..24, 0..300),
    ) {
        let mut c = cache(capacity, 512, |_| {});
        let mut ops = OpList::new();
        for (t, &l) in lines.iter().enumerate() {
            c.access(&Request::read(0, l * 512, 512, t as u64), &mut ops).unwrap();
        }
        let (hits, resident) = naive_lru_hits(capacity as usize, &lines);
        prop_assert_eq!(c.stats().full_hits, hits);
        let mut actual: Vec<u64> = resident.iter().copied()
            .filter(|&l| c.line_state(key(l)).is_some()).collect();
        actual.sort();
        prop_assert_eq!(actual, resident.clone());
        prop_assert_eq!(c.resident_lines() as usize, resident.len());
        c.check_invariants();
    }

    #[test]
    fn arc_lists_stay_within_bounds(
        capacity in 1usize..10,
        lines in prop::collection::vec(0u64..30, 0..400),
    ) {
        let mut d = Driver::new(Arc::new(capacity), capacity);
        for &l in &lines {
            access(&mut d, l);
            let (t1, t2, b1, b2) = d.policy.list_sizes();
            let c = capacity as u32;
            prop_assert!(t1 + t2 <= c);
            prop_assert!(t1 + b1 <= c);
            prop_assert!(t1 + t2 + b1 + b2 <= 2 * c);
            prop_assert!(d.policy.target_t1() <= capacity as f64);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Whatever the policies and their changes, a read returns the latest write,
    /// and after flushing everything the backend holds every write.
    #[test]
    fn reads_are_never_stale_and_flush_loses_nothing(
        capacity in 1u64..8,
        line_shift in 0u32..5,
        arc in any::<bool>(),
        nhit in any::<bool>(),
        start in any_inserting_write_policy(),
        actions in prop::collection::vec(action(), 1..120),
    ) {
        let policy = if arc { PolicySpec::arc() } else { PolicySpec::lru() };
        let mut h = Harness::new(model_cache(capacity, line_shift, policy, start, nhit));
        h.apply_all_and_flush(actions, 1, |_| Ok(()))?;
    }
}

//! FIFO, CLOCK, LFU, 2Q, SIEVE, S3-FIFO and Access (with LRU and ARC for
//! comparison) driven through the full `Cache`: random workloads with write
//! policy changes and flushes never read stale data or lose a write, a few
//! hand-computed sequences show each policy's effect through the cache, and
//! property tests drive the bare policies (with invalidations) checking that
//! their queues match the resident lines and stay within their bounds.

mod common;

use common::driver::{key, Driver};
use common::{action, any_inserting_write_policy, cache, model_cache, Harness};
use iocache_core::policy::{Access, Clock, Fifo, Lfu, S3Fifo, Sieve, TwoQ};
use iocache_core::{OpList, Request, WritePolicy};
use proptest::prelude::*;

/// Every policy of this set, with non-default parameters too.
const POLICY_NAMES: &[&str] = &[
    "lru",
    "arc",
    "fifo",
    "clock",
    "lfu",
    "2q",
    "2q:kin=0.5:kout=1",
    "sieve",
    "s3fifo",
    "s3fifo:small=0.3:threshold=0:ghost=2",
    "access",
    "access:history=1",
    "access:gate=0:history=0",
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1500))]

    /// Whatever the replacement policy and the write-policy changes, a read
    /// returns the latest write, the cache's invariants hold after every
    /// request, and after flushing everything the backend holds every write.
    #[test]
    fn reads_are_never_stale_and_flush_loses_nothing(
        policy in prop::sample::select(POLICY_NAMES),
        capacity in 1u64..10,
        line_shift in 0u32..4,
        nhit in any::<bool>(),
        start in any_inserting_write_policy(),
        actions in prop::collection::vec(action(), 1..120),
    ) {
        let mut h = Harness::new(model_cache(capacity, line_shift, policy.parse().unwrap(), start, nhit));
        h.apply_all_and_flush(actions, 1, |h| {
            prop_assert!(h.cache.resident_lines() <= capacity);
            Ok(())
        })?;
    }
}

/// Reads of one 512-byte line each through a cache of `capacity` lines;
/// returns (full hits, lines resident at the end among `probe`).
fn run_reads(policy: &str, capacity: u64, lines: &[u64], probe: &[u64]) -> (u64, usize) {
    let mut c = cache(capacity, 512, |c| c.policy = policy.parse().unwrap());
    let mut ops = OpList::new();
    for (t, &l) in lines.iter().enumerate() {
        c.access(&Request::read(0, l * 512, 512, t as u64), &mut ops)
            .unwrap();
        c.check_invariants();
    }
    let resident = probe.iter().filter(|&&l| c.line_state(key(l)).is_some()).count();
    (c.stats().full_hits, resident)
}

#[test]
fn which_policies_keep_a_hot_set_through_a_scan_in_the_cache() {
    // Capacity 10. Lines 100..105 are read three times (two hits each), then
    // a scan of 200 new lines passes. Resident hot lines afterwards:
    // - LRU, FIFO: none.
    // - CLOCK: none. The first eviction sweeps the whole ring, clearing the
    //   hot lines' bits and moving them behind the five earlier scan lines;
    //   ten scan misses later the hand reaches them with clear bits.
    // - 2Q: none. The hits happened while the lines were in A1in (correlated
    //   references, which 2Q ignores), so they leave through A1out like the scan.
    // - LFU: all five (count 3 against the scan's count 1).
    // - SIEVE: all five. The first eviction clears their bits and evicts the
    //   oldest scan line; the hand then stays among the scan lines, newer
    //   than the hot ones, and never wraps back to them.
    // - S3-FIFO: all five. The first eviction finds them at S's tail with
    //   freq 2 > 1 and moves them to M; the scan then only cycles through S.
    // - Access: all five; the scan lines after the first five (admitted to
    //   free slots) are refused, their count 1 never beating the resident 1.
    let hot: Vec<u64> = (100..105).collect();
    let mut seq = Vec::new();
    for _ in 0..3 {
        seq.extend(&hot);
    }
    seq.extend(0..200);
    let kept = |p: &str| run_reads(p, 10, &seq, &hot).1;
    for (policy, expected) in [
        ("lru", 0),
        ("fifo", 0),
        ("clock", 0),
        ("2q", 0),
        ("lfu", 5),
        ("sieve", 5),
        ("s3fifo", 5),
        ("access", 5),
    ] {
        assert_eq!(kept(policy), expected, "{policy}");
    }
    // With the hot lines re-read after leaving A1in, 2Q keeps them in Am.
    let mut seq2 = hot.clone();
    seq2.extend(200..210); // pushes the hot lines to A1out
    seq2.extend(&hot); // A1out hits: into Am
    seq2.extend(0..200);
    assert_eq!(run_reads("2q", 10, &seq2, &hot).1, 5);
    assert_eq!(run_reads("lru", 10, &seq2, &hot).1, 0);
}

#[test]
fn access_refusals_show_as_bypassed_misses_and_counters() {
    // Capacity 2: 1 read three times, 2 once, then 3 (count 1 ≤ 2's 1):
    // refused and bypassed; 3 again (count 2 > 1): admitted, 2 evicted.
    let mut c = cache(2, 512, |c| c.policy = "access".parse().unwrap());
    let mut ops = OpList::new();
    for (t, l) in [1u64, 1, 1, 2, 3, 3].into_iter().enumerate() {
        c.access(&Request::read(0, l * 512, 512, t as u64), &mut ops)
            .unwrap();
    }
    assert_eq!(c.stats().bypassed_accesses, 1);
    assert_eq!(c.stats().evictions, 1);
    assert!(c.line_state(key(2)).is_none());
    assert!(c.line_state(key(3)).is_some());
    assert_eq!(
        c.policy_counters(),
        vec![("admissions_refused", 1), ("history_forgotten", 0)]
    );
}

#[test]
fn invalidation_through_the_cache_leaves_no_ghost() {
    // 2Q, capacity 4 (Kin 1, Kout 2): 1 is pushed to A1out by 5; a write
    // under write-invalidate drops resident line 3. Reading 3 again must
    // not find it in A1out (it enters A1in: evicted next before Am lines).
    let mut c = cache(4, 512, |c| {
        c.policy = "2q".parse().unwrap();
        c.write_policy = WritePolicy::WriteInvalidate;
    });
    let mut ops = OpList::new();
    for (t, l) in [1u64, 2, 3, 4, 5].into_iter().enumerate() {
        c.access(&Request::read(0, l * 512, 512, t as u64), &mut ops)
            .unwrap();
    }
    c.access(&Request::write(0, 3 * 512, 512, 10), &mut ops).unwrap();
    assert!(c.line_state(key(3)).is_none());
    assert_eq!(c.stats().invalidations, 1);
    c.check_invariants();
    // 1 is in A1out: reading it admits it to Am (free slot, no eviction).
    c.access(&Request::read(0, 512, 512, 11), &mut ops).unwrap();
    assert_eq!(c.policy_counters(), vec![("a1out_hits", 1)]);
    // 3 was invalidated, not evicted: no A1out hit.
    c.access(&Request::read(0, 3 * 512, 512, 12), &mut ops).unwrap();
    assert_eq!(c.policy_counters(), vec![("a1out_hits", 1)]);
    c.check_invariants();
}

#[test]
fn every_policy_runs_a_mixed_workload_with_multi_line_requests() {
    // A deterministic mix of large reads and writes over 3 volumes, with
    // every write policy in turn; checks invariants and the stale-read model.
    for &name in POLICY_NAMES {
        let mut h = Harness::new(cache(16, 4096, |c| c.policy = name.parse().unwrap()));
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let policies = WritePolicy::ALL;
        for t in 0..1_500u64 {
            common::xorshift(&mut x);
            if t.is_multiple_of(250) {
                h.cache
                    .set_write_policy(policies[(t / 250) as usize % policies.len()]);
            }
            let volume = (x % 3) as u32;
            let sector = (x >> 8) % 512;
            let sectors = 1 + (x >> 20) % 40;
            let req = if (x >> 40).is_multiple_of(3) {
                Request::write(volume, sector * 512, sectors * 512, t)
            } else {
                Request::read(volume, sector * 512, sectors * 512, t)
            };
            h.run(req);
        }
        assert!(h.cache.resident_lines() <= 16, "{name}");
        h.flush_all_and_check_backend();
    }
}

fn workload() -> impl Strategy<Value = (usize, Vec<(u64, bool)>)> {
    (1usize..12).prop_flat_map(|capacity| {
        let op = (0..4 * capacity as u64, prop::bool::weighted(0.1));
        (Just(capacity), prop::collection::vec(op, 0..400))
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(150))]

    #[test]
    fn fifo_and_clock_hold_exactly_the_resident_lines((capacity, ops) in workload()) {
        Driver::new(Fifo::new(capacity), capacity).run(&ops, |p, n| assert_eq!(p.order().len(), n));
        Driver::new(Clock::new(capacity), capacity).run(&ops, |p, n| assert_eq!(p.sweep_order().len(), n));
    }

    #[test]
    fn sieve_hand_stays_on_a_resident_line((capacity, ops) in workload()) {
        Driver::new(Sieve::new(capacity), capacity).run(&ops, |p, n| {
            let order = p.order();
            assert_eq!(order.len(), n);
            if let Some(hand) = p.hand() {
                assert!(order.contains(&hand));
            }
        });
    }

    #[test]
    fn lfu_buckets_are_sorted_nonempty_and_cover_the_cache((capacity, ops) in workload()) {
        Driver::new(Lfu::new(capacity), capacity).run(&ops, |p, n| {
            let buckets = p.buckets();
            assert_eq!(buckets.iter().map(|(_, s)| s.len()).sum::<usize>(), n);
            assert!(buckets.windows(2).all(|w| w[0].0 < w[1].0));
            assert!(buckets.iter().all(|(c, s)| *c >= 1 && !s.is_empty()));
            assert!(p.node_count() <= capacity + 1);
        });
    }

    #[test]
    fn twoq_queues_stay_within_bounds(
        (capacity, ops) in workload(),
        kin in 0.0f64..=1.0,
        kout in 0.0f64..=4.0,
    ) {
        Driver::new(TwoQ::new(capacity, kin, kout), capacity).run(&ops, |p, n| {
            let (a1in, am, a1out) = p.queue_sizes();
            let (_, k_out) = p.limits();
            assert_eq!(a1in + am, n);
            assert!(n <= capacity && a1out <= k_out && k_out <= 4 * capacity);
        });
    }

    #[test]
    fn s3fifo_queues_stay_within_bounds(
        (capacity, ops) in workload(),
        small in 0.0f64..=1.0,
        threshold in 0u8..=2,
        ghost in prop::option::of(0.0f64..=4.0),
    ) {
        Driver::new(S3Fifo::new(capacity, small, threshold, ghost), capacity).run(&ops, |p, n| {
            let (s, m, g) = p.queue_sizes();
            let (_, g_cap) = p.limits();
            assert_eq!(s + m, n);
            assert!(g <= g_cap && g_cap <= 4 * capacity);
            let (sq, mq) = p.queues();
            assert!(sq.iter().chain(&mq).all(|&slot| p.freq(slot) <= 3));
        });
    }

    #[test]
    fn access_heap_and_history_stay_within_bounds(
        (capacity, ops) in workload(),
        history in 0u64..4,
        gate in any::<bool>(),
    ) {
        Driver::new(Access::new(capacity, history, gate), capacity).run(&ops, |p, n| {
            p.check();
            assert_eq!(p.resident(), n);
            let (len, cap) = p.history_len();
            assert!(len <= cap && cap == capacity * history as usize);
        });
    }
}

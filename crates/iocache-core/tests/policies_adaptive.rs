//! SMQ and LARC: hand-computed sequences on the bare policies, bounds under
//! random sequences, and both policies through the full cache with the data
//! model (no stale reads under any write policy and its run-time changes).

mod common;

use common::driver::{key, Driver, Outcome};
use common::{action, any_inserting_write_policy, cache, model_cache, Harness};
use iocache_core::policy::{AccessInfo, ClockMode, Larc, ReplacementPolicy, Smq, SmqParams};
use iocache_core::{IoKind, OpList, PolicySpec, Request};
use proptest::prelude::*;

/// SMQ ticking only when told (`force_tick`), one line per hotspot block.
fn manual_smq(capacity: usize, hotspot_min: u64) -> Smq {
    Smq::with_params(
        capacity,
        SmqParams {
            hotspot_lines: 1,
            hotspot_min,
            clock: ClockMode::Requests,
            tick_requests: 1_000_000_000,
            ..SmqParams::default()
        },
    )
    .unwrap()
}

// ---------------------------------------------------------------- SMQ

#[test]
fn smq_promotes_blocks_that_reach_the_top_levels_and_refuses_the_rest() {
    // 4 lines, 128 hotspot blocks of one line: the top 8 hotspot levels hold
    // min(128 / 64, 4 / 1) = 2 blocks (targets 1 at levels 56 and 57).
    let mut d = Driver::new(manual_smq(4, 128), 4);
    assert_eq!(d.policy.hotspot_blocks(), 128);
    // Before the first tick both promotion levels are 64: nothing qualifies.
    for line in 0..4 {
        assert_eq!(d.read(line), Outcome::Refused);
    }
    assert_eq!(d.policy.promote_levels(), (64, 64));
    // Tick 1: free slots → threshold 32; hotspot statistics 0 hits / 4 misses →
    // poor → 32 / 4 = 8: read level 56, write 58; level jump 4.
    // Redistribution of [a, b, c, d] at level 0 (targets: levels 0 and 1 one
    // each, 56 and 57 one each): level 0 keeps a and appends d, c, b to level 1;
    // level 1 keeps d and pushes b, c up; levels 2-55 (target 0) pass the pair
    // up, reversing it each time ([b, c] at even levels, [c, b] at odd ones):
    // level 55 holds [c, b] and pops b first, so level 56 is [b, c]; it keeps b
    // and sends c to level 57.
    d.policy.force_tick();
    assert_eq!(d.policy.promote_levels(), (56, 58));
    assert_eq!(d.policy.hotspot_level_jump(), 4);
    let levels: Vec<_> = (0..4).map(|l| d.policy.hotspot_level(key(l)).unwrap()).collect();
    assert_eq!(levels, vec![0, 56, 57, 1]);
    // b: first hit this tick, 56 + 4 = 60 ≥ 56: promoted, into the top cache level.
    assert_eq!(d.read(1), Outcome::Admitted);
    assert_eq!(d.policy.hotspot_level(key(1)), Some(60));
    assert_eq!(d.policy.level_of(d.slot_of(1).unwrap()), Some(63));
    // a: 0 + 4 = 4 < 56; e: a new block at level 0. Both refused.
    assert_eq!(d.read(0), Outcome::Refused);
    assert_eq!(d.policy.hotspot_level(key(0)), Some(4));
    assert_eq!(d.read(4), Outcome::Refused);
    // c: 57 + 4 = 61: promoted. A second hit on a in the same tick climbs nothing.
    assert_eq!(d.read(2), Outcome::Admitted);
    assert_eq!(d.read(0), Outcome::Refused);
    assert_eq!(d.policy.hotspot_level(key(0)), Some(4));
    // A write to d needs the write level (58): 1 + 4 = 5, refused.
    assert_eq!(d.access(3, IoKind::Write, true), Outcome::Refused);
    assert_eq!(d.resident(), vec![1, 2]);
    d.policy.check();
}

#[test]
fn smq_promotion_level_follows_cache_and_hotspot_hit_ratios() {
    // One line, one line per hotspot block, 128 blocks: the top levels hold
    // min(2, 1) = 1 block (target 1 at level 56).
    let mut d = Driver::new(manual_smq(1, 128), 1);
    assert_eq!(d.read(0), Outcome::Refused); // a: new block, level 0
                                             // Tick 1: free slot → 32, hotspot poor (0 of 1) → 8: read 56, write 58.
                                             // Redistribution lifts the only block to level 56.
    d.policy.force_tick();
    assert_eq!(d.policy.promote_levels(), (56, 58));
    assert_eq!(d.policy.hotspot_level(key(0)), Some(56));
    // a: 56 + 4 = 60: promoted (cache statistics: 1 miss; hotspot: 1 hit at ≥ 48).
    assert_eq!(d.read(0), Outcome::Admitted);
    for _ in 0..15 {
        assert_eq!(d.read(0), Outcome::Hit); // level 63 ≥ 48: 15 cache hits
    }
    // Tick 2: the cache is full: index 16 × 15 / 16 = 15 → table 2; hotspot
    // 1 hit of 1 → well → 2: read 62, write 64. Level jump 1.
    d.policy.force_tick();
    assert_eq!(d.policy.promote_levels(), (62, 64));
    assert_eq!(d.policy.hotspot_level_jump(), 1);
    // Misses on new blocks b and c, twice each: all refused (levels 0 and 1).
    for line in [1, 1, 2, 2] {
        assert_eq!(d.read(line), Outcome::Refused);
    }
    // Tick 3: cache 15 hits / 5 misses → index 12 → table 3; hotspot 0 hits of
    // 4 → poor → 3 / 4 = 0: read 64, write 66. Nothing is promoted now.
    d.policy.force_tick();
    assert_eq!(d.policy.promote_levels(), (64, 66));
    // The same history with mainline's max(): threshold 64, divided by 4 when
    // the hotspot queue is poor: read level 48 whatever the cache hit ratio.
    let mut m = Driver::new(
        Smq::with_params(
            1,
            SmqParams {
                mainline_max: true,
                write_extra: 0,
                ..*manual_smq(1, 128).params()
            },
        )
        .unwrap(),
        1,
    );
    m.read(0);
    m.policy.force_tick();
    assert_eq!(m.policy.promote_levels(), (48, 48));
}

#[test]
fn smq_keeps_its_hot_set_through_a_scan() {
    // 64 lines, 16-line hotspot blocks, a tick every 100 requests. The hot set
    // is lines 0-63 (hotspot blocks 0-3); the scan touches 500 new blocks once.
    let run = |spec: &str| {
        let mut c = cache(64, 4096, |c| {
            c.policy = spec.parse().unwrap();
        });
        let mut ops = OpList::new();
        let mut t = 0;
        let mut read = |c: &mut iocache_core::Cache, line: u64| {
            t += 1;
            c.access(&Request::read(0, line * 4096, 4096, t), &mut ops)
                .unwrap();
        };
        for _ in 0..40 {
            for line in 0..64 {
                read(&mut c, line);
            }
        }
        let warm = c.stats().full_hits;
        for i in 0..500 {
            read(&mut c, 100_000 + 16 * i);
        }
        let before = c.stats().full_hits;
        for line in 0..64 {
            read(&mut c, line);
        }
        c.check_invariants();
        (warm, c.stats().full_hits - before, c.policy_counters())
    };
    let (warm, after_scan, counters) = run("smq:clock=requests:tick_requests=100");
    // Requests 1-100 tick nothing (promotion level 64): round 1 and lines 0-35
    // of round 2 miss. Request 101 runs tick 1: the four hot blocks are the
    // only ones, so redistribution lifts them to levels 56-59 (the top levels
    // hold min(1024 / 64, 64 / 16) = 4 blocks) and the read level is 56 (free
    // slots, poor hotspot confidence); every hot line is then promoted on its
    // next miss: lines 36-63 of round 2 and 0-35 of round 3. Misses: 64 + 64 +
    // 36 = 164 of 2,560 accesses.
    assert_eq!(warm, 2560 - 164);
    // Scan blocks are seen once, at level 0 (or a recycled entry's low level):
    // none reaches the promotion level, so the hot set survives.
    assert_eq!(after_scan, 64, "{counters:?}");
    let refused = counters.iter().find(|(n, _)| *n == "smq_refused").unwrap().1;
    assert!(refused >= 500, "{counters:?}");
    let (_, lru_after_scan, _) = run("lru");
    assert_eq!(lru_after_scan, 0, "LRU lost the hot set to the scan");
}

#[test]
fn smq_demotes_clean_lines_before_dirty_ones() {
    // Replacement alone (no admission): three lines inserted at the top level.
    let mut d = Driver::new(manual_smq(3, 128), 3);
    d.insert(10, true); // dirty, oldest
    d.insert(11, false); // clean
    d.insert(12, true); // dirty
    let (clean, dirty, _) = d.policy.queue_lens();
    assert_eq!((clean, dirty), (1, 2));
    // No clean line in levels 0-31 (mainline's range); the clean line at level
    // 63 is taken before any dirty one, even though 10 is older.
    assert_eq!(d.victim(), Some(11));
    // Only dirty lines are left: the oldest at the lowest level goes.
    assert_eq!(d.victim(), Some(10));
    // A line becoming clean becomes the preferred victim.
    d.insert(13, true);
    let slot = d.slot_of(13).unwrap();
    d.policy.on_clean(slot);
    assert!(!d.policy.is_dirty(slot));
    assert_eq!(d.victim(), Some(13));
    assert_eq!(d.victim(), Some(12));
    assert_eq!(d.victim(), None);
    d.policy.check();

    // strict=1: only mainline's demotion (clean, levels 0-31), else no victim.
    let params = SmqParams {
        strict: true,
        ..*manual_smq(2, 128).params()
    };
    let mut s = Driver::new(Smq::with_params(2, params).unwrap(), 2);
    s.insert(20, false);
    s.insert(21, true);
    assert_eq!(s.victim(), None); // 20 sits at level 63
    assert_eq!(s.insert(22, false), Outcome::Bypassed);
    // Tick 1 ends a cache period: each queue is spread over its levels from 0,
    // so the clean line lands at level 0 and becomes mainline's candidate.
    s.policy.force_tick();
    assert_eq!(s.policy.level_of(s.slot_of(20).unwrap()), Some(0));
    assert_eq!(s.victim(), Some(20));
    assert_eq!(s.victim(), None); // the dirty line is never demoted
}

/// Forces ticks until tick `last` has run.
fn tick_through(d: &mut Driver<Smq>, last: u64) {
    while d.policy.ticks() < last {
        d.policy.force_tick();
    }
}

#[test]
fn smq_writeback_sentinels_age_dirty_lines_over_ticks() {
    let mut d = Driver::new(manual_smq(2, 128), 2);
    d.insert(1, true); // P, level 63
                       // Tick 1 ends the first cache period: the dirty queue is redistributed and
                       // P, alone, goes to the tail of level 0: [S0, S1, P].
    d.policy.force_tick();
    let p = d.slot_of(1).unwrap();
    assert_eq!(d.policy.level_of(p), Some(0));
    assert_eq!(d.policy.dirty_level_layout(0), vec![None, None, Some(p)]);
    d.insert(2, true); // Q at level 63: [S0, S1, Q]
    let q = d.slot_of(2).unwrap();
    // Writeback periods end at ticks 10 and 20, each moving the older set to the
    // tails: after 10, [S1, P, S0]; after 20, [P, S0, S1].
    tick_through(&mut d, 10);
    assert_eq!(d.policy.dirty_level_layout(0), vec![None, Some(p), None]);
    tick_through(&mut d, 20);
    assert_eq!(d.policy.dirty_level_layout(0), vec![Some(p), None, None]);
    assert_eq!(d.policy.dirty_level_layout(63), vec![Some(q), None, None]);
    // A hit lifts P to level 1, whose only nodes are sentinels: P goes behind
    // them ([S0, S1, P]), touched in the current period.
    d.access(1, IoKind::Write, true);
    assert_eq!(d.policy.level_of(p), Some(1));
    assert_eq!(d.policy.dirty_level_layout(1), vec![None, None, Some(p)]);
    // The dirty victim is the oldest line not behind a sentinel, lowest level
    // first: level 1 starts with a sentinel, level 63 with Q. Q goes although P
    // sits lower.
    assert_eq!(d.victim(), Some(2));
    // P ages: ticks 30 and 40 bring it in front of both sentinels again.
    tick_through(&mut d, 30);
    assert_eq!(d.policy.dirty_level_layout(1), vec![None, Some(p), None]);
    tick_through(&mut d, 40);
    assert_eq!(d.policy.dirty_level_layout(1), vec![Some(p), None, None]);
    assert_eq!(d.policy.ticks(), 40);
    d.policy.check();
}

#[test]
fn smq_ticks_from_the_clock_or_the_request_count() {
    // Time = request index (as in the ARC traces): a tick every 1000 requests.
    let mut d = Driver::new(Smq::new(8), 8);
    for line in 0..2500 {
        d.read(line);
    }
    assert_eq!(d.policy.ticks(), 2);
    // A real clock (1 ms between requests): a tick per second, 1000 ms.
    let mut s = Smq::new(8);
    for i in 0..2500u64 {
        let info = AccessInfo {
            request_seq: i,
            ..AccessInfo::read_at(i * 1_000_000)
        };
        s.admit(key(i), &info);
    }
    assert_eq!(s.ticks(), 2);
    // The clock was trusted from the second request (1 ms after the first), so
    // ticks fall at 1.001 s, 2.001 s, ... A request at 10,000 s brings the
    // 9,999th; a long idle gap runs at most 121 ticks but counts them all.
    let info = AccessInfo {
        request_seq: 2500,
        ..AccessInfo::read_at(10_000 * 1_000_000_000)
    };
    s.admit(key(0), &info);
    assert_eq!(s.ticks(), 9_999);
    s.check();
}

#[test]
fn smq_on_a_one_line_cache_and_invalidation() {
    let mut d = Driver::new(manual_smq(1, 128), 1);
    assert_eq!(d.read(7), Outcome::Refused);
    d.policy.force_tick(); // 7's block is alone: lifted to level 56
    assert_eq!(d.read(7), Outcome::Admitted);
    assert_eq!(d.read(7), Outcome::Hit);
    d.insert(8, false); // replaces 7
    assert_eq!(d.resident(), vec![8]);
    d.remove(8);
    assert_eq!(d.policy.queue_lens().0 + d.policy.queue_lens().1, 0);
    assert_eq!(d.victim(), None);
    d.insert(9, true);
    assert_eq!(d.resident(), vec![9]);
    d.policy.check();
    // Through the cache, with the default parameters and a tick per request.
    let mut c = cache(1, 512, |c| {
        c.policy = "smq:hotspot_lines=1:clock=requests:tick_requests=1"
            .parse()
            .unwrap();
    });
    let mut ops = OpList::new();
    for (t, line) in [7u64, 7, 7, 7, 8, 8, 8, 7, 7].into_iter().enumerate() {
        c.access(&Request::read(0, line * 512, 512, t as u64), &mut ops)
            .unwrap();
        c.check_invariants();
        assert!(c.resident_lines() <= 1);
    }
    assert!(c.stats().full_hits > 0);
}

#[test]
fn smq_parameters_are_validated() {
    for bad in [
        "smq:hotspot_lines=0",
        "smq:clock=sundial",
        "smq:tick_ms=0",
        "smq:strict=2",
        "smq:hotspot_ratio=9",
        "smq:write_extra=65",
        "smq:nope=1",
    ] {
        assert!(bad.parse::<PolicySpec>().is_err(), "{bad}");
    }
    let spec: PolicySpec = "smq:hotspot_lines=8:clock=time:tick_ms=500:strict=1"
        .parse()
        .unwrap();
    assert_eq!(
        spec.to_string(),
        "smq:hotspot_lines=8:clock=time:tick_ms=500:strict=1"
    );
}

// ---------------------------------------------------------------- LARC

#[test]
fn larc_admits_on_the_second_miss_within_the_window() {
    // C = 4: Cr starts at 0.4 and is capped at 3.6; Qr holds at most 3 keys.
    let mut d = Driver::new(Larc::new(4), 4);
    assert!((d.policy.ghost_target() - 0.4).abs() < 1e-9);
    // Miss a: Cr = min(3.6, 0.4 + 4 / 0.4) = 3.6; a enters Qr; not admitted.
    assert_eq!(d.read(1), Outcome::Refused);
    assert!((d.policy.ghost_target() - 3.6).abs() < 1e-9);
    assert_eq!(d.read(2), Outcome::Refused); // Qr [b, a]
    assert_eq!(d.read(3), Outcome::Refused); // Qr [c, b, a]
                                             // d: Qr [d, c, b, a] has 4 > 3.6 keys: a, the LRU key, is trimmed.
    assert_eq!(d.read(4), Outcome::Refused);
    assert_eq!(d.policy.ghost_keys(), vec![key(4), key(3), key(2)]);
    // a again: forgotten, so this counts as a first miss (and trims b).
    assert_eq!(d.read(1), Outcome::Refused);
    assert_eq!(d.policy.ghost_keys(), vec![key(1), key(4), key(3)]);
    // c again: in Qr, so admitted and removed from Qr.
    assert_eq!(d.read(3), Outcome::Admitted);
    assert_eq!(d.policy.ghost_keys(), vec![key(1), key(4)]);
    assert_eq!(d.policy.sizes(), (1, 2));
    // A hit: Cr = max(0.4, 3.6 − 4 / (4 − 3.6)) = max(0.4, −6.4) = 0.4.
    assert_eq!(d.read(3), Outcome::Hit);
    assert!((d.policy.ghost_target() - 0.4).abs() < 1e-9);
    assert_eq!(d.read(1), Outcome::Admitted);
    assert_eq!(d.read(4), Outcome::Admitted);
    assert_eq!(d.resident(), vec![1, 3, 4]);
}

#[test]
fn larc_window_size_steps() {
    // C = 100, min 0.1, max 0.9: Cr = 10.
    let mut d = Driver::new(Larc::new(100), 100);
    let cr = |d: &Driver<Larc>| d.policy.ghost_target();
    // Misses: Cr + C / Cr: 10 → 20 → 25 → 29.
    d.read(1);
    assert!((cr(&d) - 20.0).abs() < 1e-9);
    d.read(2);
    assert!((cr(&d) - 25.0).abs() < 1e-9);
    d.read(1); // a ghost hit is a miss too: 25 + 4 = 29; 1 is admitted
    assert!((cr(&d) - 29.0).abs() < 1e-9);
    // Hits: Cr − C / (C − Cr): 29 − 100/71 = 27.5915..., then − 100/72.4085 = 26.2104...
    d.read(1);
    assert!((cr(&d) - (29.0 - 100.0 / 71.0)).abs() < 1e-9);
    let before = cr(&d);
    d.read(1);
    assert!((cr(&d) - (before - 100.0 / (100.0 - before))).abs() < 1e-9);
    assert!((cr(&d) - 26.2105).abs() < 1e-3);
    // Bounds: many hits floor it at 10, many misses cap it at 90.
    for _ in 0..100 {
        d.read(1);
    }
    assert!((cr(&d) - 10.0).abs() < 1e-9);
    for line in 1000..1200 {
        d.read(line);
    }
    assert!((cr(&d) - 90.0).abs() < 1e-9);
    // Qr never exceeds ⌊0.9 C⌋ = 90 keys.
    assert_eq!(d.policy.sizes().1, 90);
    // Custom bounds through the registry.
    let spec: PolicySpec = "larc:min=0.2:max=0.5".parse().unwrap();
    assert_eq!(spec.to_string(), "larc:min=0.2:max=0.5");
    assert!("larc:min=0.6:max=0.5".parse::<PolicySpec>().is_err());
    assert!("larc:max=1".parse::<PolicySpec>().is_err());
    assert!("larc:min=0".parse::<PolicySpec>().is_err());
}

#[test]
fn larc_on_a_one_line_cache_invalidation_and_lru_order() {
    // C = 1: Cr ≤ 0.9, but Qr keeps room for one key.
    let mut d = Driver::new(Larc::new(1), 1);
    assert_eq!(d.read(7), Outcome::Refused);
    assert_eq!(d.read(7), Outcome::Admitted);
    assert_eq!(d.read(7), Outcome::Hit);
    assert_eq!(d.read(8), Outcome::Refused);
    assert_eq!(d.read(8), Outcome::Admitted); // evicts 7
    assert_eq!(d.resident(), vec![8]);
    d.remove(8);
    assert_eq!(d.policy.sizes().0, 0);
    assert_eq!(d.victim(), None);
    // LRU order among admitted lines: C = 3, lines admitted on second misses.
    let mut d = Driver::new(Larc::new(3), 3);
    for line in [1, 1, 2, 2, 3, 3] {
        d.read(line);
    }
    assert_eq!(d.resident(), vec![1, 2, 3]);
    d.read(1); // hit: 1 becomes MRU, 2 is now LRU
    assert_eq!(d.read(4), Outcome::Refused);
    assert_eq!(d.read(4), Outcome::Admitted);
    assert_eq!(d.resident(), vec![1, 3, 4]);
}

// ---------------------------------------------------------------- bounds

#[derive(Debug, Clone)]
enum Step {
    Read(u64),
    Write(u64),
    Remove(usize),
    Clean(usize),
    Tick,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        5 => (0u64..40).prop_map(Step::Read),
        3 => (0u64..40).prop_map(Step::Write),
        1 => any::<usize>().prop_map(Step::Remove),
        1 => any::<usize>().prop_map(Step::Clean),
        1 => Just(Step::Tick),
    ]
}

fn pick_resident<P: ReplacementPolicy>(d: &Driver<P>, i: usize) -> Option<(u64, u32)> {
    let resident: Vec<(u64, u32)> = d
        .slots
        .iter()
        .enumerate()
        .filter_map(|(s, l)| l.map(|l| (l, s as u32)))
        .collect();
    (!resident.is_empty()).then(|| resident[i % resident.len()])
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn smq_queues_stay_within_bounds(
        capacity in 1usize..10,
        hotspot_min in 1u64..16,
        hotspot_lines in 1u64..4,
        tick_requests in 1u64..6,
        strict in any::<bool>(),
        steps in prop::collection::vec(step(), 0..300),
    ) {
        let params = SmqParams {
            hotspot_lines,
            hotspot_min,
            hotspot_ratio: 0.25,
            clock: ClockMode::Requests,
            tick_requests,
            strict,
            ..SmqParams::default()
        };
        let mut d = Driver::new(Smq::with_params(capacity, params).unwrap(), capacity);
        for s in steps {
            match s {
                Step::Read(l) => { d.access(l, IoKind::Read, false); }
                Step::Write(l) => { d.access(l, IoKind::Write, true); }
                Step::Remove(i) => if let Some((l, _)) = pick_resident(&d, i) { d.remove(l) },
                Step::Clean(i) => if let Some((_, s)) = pick_resident(&d, i) {
                    d.policy.on_clean(s);
                    prop_assert!(!d.policy.is_dirty(s));
                },
                Step::Tick => d.policy.force_tick(),
            }
            d.policy.check();
            let (clean, dirty, hot) = d.policy.queue_lens();
            prop_assert_eq!((clean + dirty) as usize, d.resident().len());
            prop_assert!((clean + dirty) as usize <= capacity);
            prop_assert!(hot as usize <= d.policy.hotspot_blocks());
            let (read, write) = d.policy.promote_levels();
            prop_assert!(read <= 64 && write <= 64 + 2);
            for slot in 0..capacity as u32 {
                prop_assert_eq!(d.policy.level_of(slot).is_some(), d.slots[slot as usize].is_some());
            }
        }
    }

    #[test]
    fn larc_queues_stay_within_bounds(
        capacity in 1usize..12,
        steps in prop::collection::vec(step(), 0..300),
    ) {
        let mut d = Driver::new(Larc::new(capacity), capacity);
        let c = capacity as f64;
        for s in steps {
            match s {
                Step::Read(l) | Step::Write(l) => { d.read(l); }
                Step::Remove(i) => if let Some((l, _)) = pick_resident(&d, i) { d.remove(l) },
                Step::Clean(_) | Step::Tick => {}
            }
            let (q, qr) = d.policy.sizes();
            prop_assert_eq!(q as usize, d.resident().len());
            prop_assert!(q as usize <= capacity);
            prop_assert!(qr as usize <= d.policy.ghost_capacity());
            prop_assert!(qr as f64 <= (0.9 * c).floor().max(1.0));
            let cr = d.policy.ghost_target();
            prop_assert!(cr >= 0.1 * c - 1e-9 && cr <= 0.9 * c + 1e-9);
            // A key is never both resident and a ghost.
            for k in d.policy.ghost_keys() {
                prop_assert!(d.slot_of(k.line_index).is_none());
            }
        }
    }
}

// ---------------------------------------------------------------- full cache

const FULL_CACHE_SPECS: [&str; 4] = [
    "smq:hotspot_lines=2:hotspot_min=8:clock=requests:tick_requests=3",
    "smq:hotspot_lines=1:hotspot_min=4:clock=requests:tick_requests=1:strict=1",
    "larc",
    "larc:min=0.3:max=0.6",
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(150))]

    /// Under SMQ and LARC, whatever the write policy and its changes, a read
    /// returns the latest write, the cache's invariants hold, and after
    /// flushing the backend holds every write.
    #[test]
    fn smq_and_larc_never_serve_stale_data(
        capacity in 1u64..8,
        line_shift in 0u32..5,
        spec in 0usize..FULL_CACHE_SPECS.len(),
        start in any_inserting_write_policy(),
        actions in prop::collection::vec(action(), 1..150),
    ) {
        let policy = FULL_CACHE_SPECS[spec].parse().unwrap();
        let mut h = Harness::new(model_cache(capacity, line_shift, policy, start, false));
        h.apply_all_and_flush(actions, 1, |_| Ok(()))?;
    }
}

#[test]
fn smq_and_larc_run_a_skewed_random_workload_through_the_cache() {
    // A deterministic mix: 80 % of accesses to 10 % of 4,096 lines, reads and
    // writes, write-back; both policies must admit something, hit, and keep
    // the cache consistent.
    for spec in [
        "smq:clock=requests:tick_requests=200",
        "larc",
        "smq:mainline_max=1",
    ] {
        let mut h = Harness::new(cache(256, 4096, |c| {
            c.policy = spec.parse().unwrap();
        }));
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for t in 0..20_000u64 {
            common::xorshift(&mut state);
            let line = if state % 10 < 8 {
                state / 10 % 410
            } else {
                state / 10 % 4096
            };
            let request = if state.is_multiple_of(7) {
                Request::write(0, line * 4096, 4096, t)
            } else {
                Request::read(0, line * 4096, 4096, t)
            };
            h.run(request);
        }
        let s = h.cache.stats();
        assert!(s.promotions > 0 && s.full_hits > 2_000, "{spec}: {s:?}");
        h.flush_all_and_check_backend();
    }
}

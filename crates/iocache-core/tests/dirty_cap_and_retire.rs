//! The dirty-line cap (a write that would make one line too many dirty is
//! written through) and slot retirement (slots of a failed cache device are
//! never used again), checked against a simple model under random requests.

use iocache_core::{Cache, CacheConfig, LineSize, Op, OpList, PolicySpec, Request, WritePolicy};
use proptest::prelude::*;

const LINE: u64 = 4096;

fn config(lines: u64, policy: &str, cap: Option<u64>) -> CacheConfig {
    let mut c = CacheConfig::new(
        lines,
        LineSize::new(LINE).unwrap(),
        policy.parse::<PolicySpec>().unwrap(),
    );
    c.write_policy = WritePolicy::WriteBack;
    c.inline_dirty_eviction = false;
    c.max_dirty_lines = cap;
    c
}

#[test]
fn writes_past_the_cap_go_through_and_dirty_lines_stay_writable() {
    let mut cache = Cache::new(config(64, "lru", Some(3))).unwrap();
    let mut ops = OpList::new();
    for line in 0..10u64 {
        cache
            .access(&Request::write(0, line * LINE, LINE, line), &mut ops)
            .unwrap();
        let to_backend = ops.ops().iter().any(|op| matches!(op, Op::WriteBackend { .. }));
        assert_eq!(
            to_backend,
            line >= 3,
            "line {line}: write-through only past the cap"
        );
    }
    assert_eq!(cache.dirty_lines(), 3);
    assert_eq!(cache.stats().dirty_cap_write_throughs, 7);
    // A dirty line takes more writes as write-back, cap or not.
    cache.access(&Request::write(0, 512, 512, 20), &mut ops).unwrap();
    assert!(!ops.ops().iter().any(|op| matches!(op, Op::WriteBackend { .. })));
    assert!(ops
        .ops()
        .iter()
        .any(|op| matches!(op, Op::WriteCache { dirty: true, .. })));
    // Lowering the cap to zero makes every new write write-through.
    cache.set_max_dirty_lines(Some(0));
    cache
        .access(&Request::write(0, 30 * LINE, LINE, 21), &mut ops)
        .unwrap();
    assert!(ops.ops().iter().any(|op| matches!(op, Op::WriteBackend { .. })));
    assert_eq!(cache.dirty_lines(), 3);
    cache.check_invariants();
}

#[test]
fn retired_slots_are_never_used_again() {
    let mut cache = Cache::new(config(16, "lru", None)).unwrap();
    let mut ops = OpList::new();
    // Lines 0..8: writes 0..4 dirty, reads 4..8 clean.
    for line in 0..8u64 {
        let request = if line < 4 {
            Request::write(0, line * LINE, LINE, line)
        } else {
            Request::read(0, line * LINE, LINE, line)
        };
        cache.access(&request, &mut ops).unwrap();
    }
    let odd = |slot: u32| slot % 2 == 1;
    let dirty_on_odd = (0..16u32)
        .filter(|&s| {
            odd(s)
                && cache
                    .slot_snapshot(s)
                    .is_some_and(|snap| snap.dirty.iter().any(|w| *w != 0))
        })
        .count() as u64;
    let left = cache.retire_slots(odd, &mut ops);
    assert_eq!(left, dirty_on_odd);
    cache.check_invariants();
    for op in ops.ops().iter() {
        let Op::Invalidate { slot, .. } = *op else {
            panic!("retiring emits only invalidations, got {op:?}");
        };
        assert!(odd(slot));
    }
    // Fill the cache with new lines: no new line lands in an odd slot.
    for line in 100..200u64 {
        cache
            .access(&Request::read(0, line * LINE, LINE, line), &mut ops)
            .unwrap();
        for op in ops.ops().iter() {
            if let Op::WriteCache { slot, .. } = *op {
                let dirty_odd_line = cache.slot_snapshot(slot).is_some_and(|s| s.key.line_index < 4);
                assert!(
                    !odd(slot) || dirty_odd_line,
                    "line {line} placed in retired slot {slot}"
                );
            }
        }
    }
    assert_eq!(cache.retired_slots(), 8 - dirty_on_odd);
    cache.check_invariants();
}

proptest! {
    #[test]
    fn dirty_lines_never_pass_the_cap(
        policy in prop::sample::select(vec!["lru", "arc", "s3fifo", "clock", "2q"]),
        cap in 0u64..8,
        requests in prop::collection::vec((any::<bool>(), 0u64..40, 1u64..3), 1..300),
    ) {
        let mut cache = Cache::new(config(16, policy, Some(cap))).unwrap();
        let mut ops = OpList::new();
        for (i, &(write, line, lines)) in requests.iter().enumerate() {
            let request = if write {
                Request::write(0, line * LINE, lines * LINE, i as u64)
            } else {
                Request::read(0, line * LINE, lines * LINE, i as u64)
            };
            cache.access(&request, &mut ops).unwrap();
            prop_assert!(cache.dirty_lines() <= cap, "{} dirty lines, cap {}", cache.dirty_lines(), cap);
        }
        cache.check_invariants();
    }
}

//! Several volumes in one cache: flushing one volume (`FlushOrder::Volume`),
//! dropping a volume's clean lines (`Cache::drop_clean_lines`) and the
//! per-volume line counts (`Cache::volume_lines`), by hand and as properties
//! (reads never stale, nothing lost, counts equal to a scan).

mod common;

use common::{actions, cache, ops_of, Action, Harness};
use iocache_core::{
    FlushOrder, FlushToken, LineKey, Op, OpList, PolicySpec, Request, VolumeLines, WritePolicy,
};
use proptest::prelude::*;

fn key(volume: u32, line_index: u64) -> LineKey {
    LineKey { volume, line_index }
}

/// The keys `ops` invalidate, in order; any other op fails the test with
/// `expected` (what the ops should have been).
fn invalidated_keys(ops: &OpList, expected: &str) -> Vec<LineKey> {
    ops.ops()
        .iter()
        .map(|op| match op {
            Op::Invalidate { key, .. } => *key,
            other => panic!("{expected}: {other:?}"),
        })
        .collect()
}

#[test]
fn discarded_lines_leave_dirty_or_not_and_a_flush_under_way_cleans_nothing() {
    let mut c = cache(8, 4096, |_| {});
    c.count_volume_lines();
    for line in 0..6u64 {
        ops_of(&mut c, Request::write(1, line * 4096, 4096, 0));
    }
    ops_of(&mut c, Request::write(2, 4096, 4096, 0));
    // A flush of line 2 is under way when the discard arrives.
    let mut ops = OpList::new();
    let mut tokens: Vec<FlushToken> = Vec::new();
    c.begin_flush(FlushOrder::Volume(1), 1, &mut ops, &mut tokens);
    assert_eq!(tokens[0].key, key(1, 0));
    let dropped = c.discard_lines(1, 0, 3, &mut ops);
    assert_eq!((dropped.lines, dropped.dirty), (3, 3));
    let invalidated = invalidated_keys(&ops, "a discard writes nothing back");
    assert_eq!(invalidated, vec![key(1, 0), key(1, 1), key(1, 2)]);
    assert!(
        !c.complete_flush(&tokens[0], true),
        "the line left while it was flushed"
    );
    c.check_invariants();
    assert_eq!(
        c.volume_lines(1),
        VolumeLines {
            resident: 3,
            dirty: 3
        }
    );
    assert_eq!(
        c.volume_lines(2),
        VolumeLines {
            resident: 1,
            dirty: 1
        }
    );
    // A range larger than the cache walks the slots instead.
    let dropped = c.discard_lines(1, 0, 1 << 40, &mut ops);
    assert_eq!((dropped.lines, dropped.dirty), (3, 3));
    assert_eq!(c.volume_lines(1), VolumeLines::default());
    assert_eq!(c.dirty_lines(), 1, "the other volume's line stays");
    c.check_invariants();
}

#[test]
fn a_volume_flush_writes_back_only_that_volume_in_address_order() {
    let mut c = cache(16, 4096, |_| {});
    c.count_volume_lines();
    for (volume, line) in [(1u32, 7u64), (0, 3), (1, 2), (2, 5), (1, 4), (0, 1)] {
        ops_of(&mut c, Request::write(volume, line * 4096, 4096, 0));
    }
    assert_eq!(
        c.volume_lines(1),
        VolumeLines {
            resident: 3,
            dirty: 3
        }
    );
    let mut ops = OpList::new();
    let mut tokens: Vec<FlushToken> = Vec::new();
    c.begin_flush(FlushOrder::Volume(1), 2, &mut ops, &mut tokens);
    let keys: Vec<LineKey> = tokens.iter().map(|t| t.key).collect();
    assert_eq!(keys, vec![key(1, 2), key(1, 4)], "lowest addresses first");
    for op in ops.ops() {
        assert!(matches!(op, Op::WriteBack { volume: 1, .. }), "{op:?}");
    }
    // Lines being flushed are not picked again.
    let mut more: Vec<FlushToken> = Vec::new();
    let mut ops2 = OpList::new();
    c.begin_flush(FlushOrder::Volume(1), 8, &mut ops2, &mut more);
    assert_eq!(more.iter().map(|t| t.key).collect::<Vec<_>>(), vec![key(1, 7)]);
    for t in tokens.iter().chain(&more) {
        assert!(c.complete_flush(t, true));
    }
    assert_eq!(
        c.volume_lines(1),
        VolumeLines {
            resident: 3,
            dirty: 0
        }
    );
    assert_eq!(
        c.volume_lines(0),
        VolumeLines {
            resident: 2,
            dirty: 2
        }
    );
    assert_eq!(
        c.volume_lines(2),
        VolumeLines {
            resident: 1,
            dirty: 1
        }
    );
    c.begin_flush(FlushOrder::Volume(1), 8, &mut ops, &mut tokens);
    assert!(tokens.is_empty() && ops.ops().is_empty());
    c.check_invariants();
}

#[test]
fn dropping_a_volume_s_clean_lines_keeps_its_dirty_ones_and_other_volumes() {
    let mut c = cache(16, 4096, |_| {});
    for line in 0..4u64 {
        ops_of(&mut c, Request::read(1, line * 4096, 4096, 0));
        ops_of(&mut c, Request::read(0, line * 4096, 4096, 0));
    }
    ops_of(&mut c, Request::write(1, 9 * 4096, 512, 0));
    // Counting turned on late: the counts start from a scan.
    c.count_volume_lines();
    assert_eq!(
        c.volume_lines(1),
        VolumeLines {
            resident: 5,
            dirty: 1
        }
    );
    let mut ops = OpList::new();
    assert_eq!(c.drop_clean_lines(1, &mut ops), 4);
    let dropped = invalidated_keys(&ops, "only invalidations");
    assert_eq!(dropped.len(), 4);
    assert!(dropped.iter().all(|k| k.volume == 1 && k.line_index < 4));
    assert_eq!(
        c.volume_lines(1),
        VolumeLines {
            resident: 1,
            dirty: 1
        }
    );
    assert!(c.line_state(key(1, 9)).is_some(), "the dirty line stays");
    assert_eq!(c.volume_lines(0).resident, 4, "other volumes stay");
    c.check_invariants();
    // Once flushed, the last line goes too, and its slot is free for others.
    let mut tokens: Vec<FlushToken> = Vec::new();
    c.begin_flush(FlushOrder::Volume(1), 8, &mut ops, &mut tokens);
    assert_eq!(tokens.len(), 1);
    assert!(c.complete_flush(&tokens[0], true));
    assert_eq!(c.drop_clean_lines(1, &mut ops), 1);
    assert_eq!(c.volume_lines(1), VolumeLines::default());
    assert_eq!(c.resident_lines(), 4);
    c.check_invariants();
}

#[test]
fn a_flush_token_of_a_dropped_line_does_not_clean_anything() {
    let mut c = cache(4, 4096, |_| {});
    c.count_volume_lines();
    ops_of(&mut c, Request::write(3, 0, 4096, 0));
    let mut ops = OpList::new();
    let mut tokens: Vec<FlushToken> = Vec::new();
    c.begin_flush(FlushOrder::Volume(3), 1, &mut ops, &mut tokens);
    // Overwritten through write-through while the flush is in flight: clean now.
    c.set_write_policy(WritePolicy::WriteThrough);
    ops_of(&mut c, Request::write(3, 0, 4096, 1));
    assert_eq!(c.volume_lines(3).dirty, 0);
    assert_eq!(c.drop_clean_lines(3, &mut ops), 1);
    assert!(
        !c.complete_flush(&tokens[0], true),
        "the line changed since begin_flush"
    );
    assert_eq!(c.resident_lines(), 0);
    c.check_invariants();
}

fn volume_action() -> BoxedStrategy<Action> {
    prop_oneof![
        8 => actions(64, 20, true),
        1 => (0u32..2, 1usize..4).prop_map(|(v, n)| Action::FlushVolume(v, n)),
        1 => (0u32..2).prop_map(Action::DropClean),
        1 => (0u32..2, 0u64..40, 1u64..24).prop_map(|(v, first, n)| Action::Discard(v, first, n)),
    ]
    .boxed()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Flushing and dropping volumes in any order between requests never
    /// makes a read stale, and the backend still ends up with every write.
    #[test]
    fn volume_flushes_and_drops_never_lose_or_stale_data(
        capacity in 1u64..8,
        line_shift in 0u32..5,
        arc in any::<bool>(),
        counted in any::<bool>(),
        actions in prop::collection::vec(volume_action(), 1..150),
    ) {
        let c = cache(capacity, 512 << line_shift, |c| {
            c.policy = if arc { PolicySpec::arc() } else { PolicySpec::lru() };
        });
        let mut h = Harness::new(c);
        if counted {
            h.cache.count_volume_lines();
        }
        h.apply_all_and_flush(actions, 1, |_| Ok(()))?;
    }

    /// Counted line totals always equal a scan of the slots (and the
    /// invariant check compares them at every step).
    #[test]
    fn counted_volume_lines_equal_a_scan(
        capacity in 1u64..12,
        requests in prop::collection::vec((0u32..3, 0u64..24, any::<bool>()), 1..200),
    ) {
        let mut counted = cache(capacity, 4096, |_| {});
        let mut scanned = cache(capacity, 4096, |_| {});
        counted.count_volume_lines();
        let mut ops = OpList::new();
        for (t, &(volume, line, write)) in requests.iter().enumerate() {
            let r = if write {
                Request::write(volume, line * 4096, 4096, t as u64)
            } else {
                Request::read(volume, line * 4096, 4096, t as u64)
            };
            counted.access(&r, &mut ops).unwrap();
            scanned.access(&r, &mut ops).unwrap();
            if t % 17 == 16 {
                counted.drop_clean_lines(volume, &mut ops);
                scanned.drop_clean_lines(volume, &mut ops);
            }
            counted.check_invariants();
            for v in 0..3 {
                prop_assert_eq!(counted.volume_lines(v), scanned.volume_lines(v));
            }
        }
    }
}

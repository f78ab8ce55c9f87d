//! Hand-computed op sequences for every write policy, partial hits, promotion and flushing.

mod common;

use common::{cache, ops_of, read_backend, read_cache, write_back, write_backend, write_cache, Harness};
use iocache_core::{FlushOrder, LineKey, LineOutcome, Op, OpList, Promotion, Request, WritePolicy};

fn key(line_index: u64) -> LineKey {
    LineKey {
        volume: 0,
        line_index,
    }
}

fn with(wp: WritePolicy) -> impl FnOnce(&mut iocache_core::CacheConfig) {
    move |c| c.write_policy = wp
}

#[test]
fn write_back_caches_writes_and_writes_back_dirty_victims() {
    let mut c = cache(1, 4096, with(WritePolicy::WriteBack));
    let ops = ops_of(&mut c, Request::write(0, 0, 4096, 0));
    assert_eq!(ops, vec![write_cache(0, 0, 4096, 0, true, true)]);
    assert_eq!(c.dirty_lines(), 1);
    // Read hit from the cache.
    let ops = ops_of(&mut c, Request::read(0, 1024, 1024, 1));
    assert_eq!(ops, vec![read_cache(0, 1024, 1024, 0)]);
    // A read of another line evicts the dirty one: write back first, then fill.
    let ops = ops_of(&mut c, Request::read(0, 4096, 4096, 2));
    assert_eq!(
        ops,
        vec![
            write_back(0, 0, 4096, 0, 0),
            read_backend(0, 4096, 4096, 0),
            write_cache(0, 0, 4096, 0, false, true),
        ]
    );
    let s = c.stats();
    assert_eq!((s.evictions, s.dirty_writebacks, s.promotions), (1, 1, 2));
    assert_eq!((s.backend_write_bytes, s.backend_read_bytes), (4096, 4096));
    assert_eq!(c.dirty_lines(), 0);
}

#[test]
fn partial_hit_reads_valid_sectors_from_cache_and_fills_the_rest() {
    let mut c = cache(4, 4096, with(WritePolicy::WriteBack));
    ops_of(&mut c, Request::write(0, 1024, 1024, 0)); // sectors 2,3 of line 0
    let mut ops = OpList::new();
    let summary = c.access(&Request::read(0, 0, 4096, 1), &mut ops).unwrap();
    assert_eq!(summary.partial_hits, 1);
    assert_eq!(
        ops.ops(),
        &[
            read_backend(0, 0, 1024, 0),
            read_cache(0, 1024, 1024, 1024),
            read_backend(0, 2048, 2048, 2048),
            write_cache(0, 0, 1024, 0, false, true),
            write_cache(0, 2048, 2048, 2048, false, true),
        ]
    );
    let state = c.line_state(key(0)).unwrap();
    assert_eq!((state.valid_sectors, state.dirty_sectors), (8, 2));
    // Now a full hit.
    let summary = c.access(&Request::read(0, 0, 4096, 2), &mut ops).unwrap();
    assert_eq!(summary.full_hits, 1);
    assert_eq!(c.stats().hit_bytes, 1024 + 4096);
}

#[test]
fn write_through_keeps_clean_copies() {
    let mut c = cache(2, 4096, with(WritePolicy::WriteThrough));
    let ops = ops_of(&mut c, Request::write(0, 0, 8192, 0));
    assert_eq!(
        ops,
        vec![
            write_backend(0, 0, 8192, 0),
            write_cache(0, 0, 4096, 0, false, true),
            write_cache(1, 0, 4096, 4096, false, true),
        ]
    );
    assert_eq!(c.dirty_lines(), 0);
    assert_eq!(c.resident_lines(), 2);
}

#[test]
fn write_invalidate_drops_the_line_after_writing_back_other_dirty_sectors() {
    let mut c = cache(2, 4096, with(WritePolicy::WriteBack));
    ops_of(&mut c, Request::write(0, 0, 2048, 0)); // sectors 0..4 dirty
    c.set_write_policy(WritePolicy::WriteInvalidate);
    let ops = ops_of(&mut c, Request::write(0, 1024, 1024, 1)); // overwrites sectors 2,3
    assert_eq!(
        ops,
        vec![
            write_back(0, 0, 1024, 0, 0),
            Op::Invalidate { slot: 0, key: key(0) },
            write_backend(0, 1024, 1024, 0),
        ]
    );
    assert_eq!(c.line_state(key(0)), None);
    assert_eq!(c.stats().invalidations, 1);
    // Reads are still cached under write-invalidate.
    ops_of(&mut c, Request::read(0, 0, 4096, 2));
    assert!(c.line_state(key(0)).is_some());
}

#[test]
fn write_around_invalidates_only_overwritten_sectors() {
    let mut c = cache(2, 4096, with(WritePolicy::WriteAround));
    ops_of(&mut c, Request::read(0, 0, 4096, 0));
    let ops = ops_of(&mut c, Request::write(0, 0, 1024, 1));
    assert_eq!(ops, vec![write_backend(0, 0, 1024, 0)]);
    assert_eq!(c.line_state(key(0)).unwrap().valid_sectors, 6);
    // A write miss is not inserted.
    ops_of(&mut c, Request::write(0, 8192, 4096, 2));
    assert_eq!(c.line_state(key(2)), None);
    // Overwriting the rest drops the line.
    let ops = ops_of(&mut c, Request::write(0, 1024, 3072, 3));
    assert_eq!(ops[0], Op::Invalidate { slot: 0, key: key(0) });
    assert_eq!(c.resident_lines(), 0);
}

#[test]
fn write_only_caches_writes_but_not_read_misses() {
    let mut c = cache(4, 4096, with(WritePolicy::WriteOnly));
    let ops = ops_of(&mut c, Request::read(0, 0, 4096, 0));
    assert_eq!(ops.len(), 1);
    assert!(matches!(ops[0], Op::ReadBackend { .. }));
    assert_eq!(c.resident_lines(), 0);
    ops_of(&mut c, Request::write(0, 4096, 2048, 1));
    assert_eq!(c.dirty_lines(), 1);
    // Partial read of the written line: cached half from the cache, the rest from backend, no fill.
    let ops = ops_of(&mut c, Request::read(0, 4096, 4096, 2));
    assert_eq!(
        ops,
        vec![read_cache(0, 0, 2048, 0), read_backend(0, 6144, 2048, 2048),]
    );
    assert_eq!(c.line_state(key(1)).unwrap().valid_sectors, 4);
}

#[test]
fn pass_through_serves_dirty_data_from_cache_and_inserts_nothing() {
    let mut c = cache(4, 4096, with(WritePolicy::WriteBack));
    ops_of(&mut c, Request::write(0, 0, 1024, 0));
    c.set_write_policy(WritePolicy::PassThrough);
    let ops = ops_of(&mut c, Request::read(0, 0, 4096, 1));
    assert_eq!(
        ops,
        vec![read_cache(0, 0, 1024, 0), read_backend(0, 1024, 3072, 1024),]
    );
    ops_of(&mut c, Request::read(0, 8192, 4096, 2));
    ops_of(&mut c, Request::write(0, 16384, 4096, 3));
    assert_eq!(c.resident_lines(), 1);
    assert_eq!(c.stats().promotions, 1);
}

#[test]
fn nhit_promotes_on_the_second_access() {
    let mut c = cache(4, 4096, |c| {
        c.promotion = Promotion::NHit {
            threshold: 2,
            trigger_percent: 0,
        }
    });
    let mut ops = OpList::new();
    let outcomes: Vec<_> = (0..3)
        .map(|t| {
            let s = c.access(&Request::read(0, 0, 4096, t), &mut ops).unwrap();
            (s.full_hits, s.misses)
        })
        .collect();
    assert_eq!(outcomes, vec![(0, 1), (0, 1), (1, 0)]);
    assert_eq!(c.stats().bypassed_accesses, 1);
    assert_eq!(c.stats().promotions, 1);
}

#[test]
fn one_line_cache_with_a_two_line_write_keeps_op_order_correct() {
    let mut h = Harness::new(cache(1, 4096, with(WritePolicy::WriteBack)));
    h.run(Request::write(0, 0, 8192, 0));
    // The first line was written to slot 0, then evicted by the second: its
    // write-back must come after its cache write, not before.
    h.run(Request::read(0, 0, 8192, 1));
    h.flush_all_and_check_backend();
}

#[test]
fn flush_oldest_first_and_in_address_order() {
    let mut c = cache(8, 4096, with(WritePolicy::WriteBack));
    for (t, line) in [5u64, 1, 3].into_iter().enumerate() {
        ops_of(&mut c, Request::write(0, line * 4096, 4096, t as u64 * 10));
    }
    assert_eq!(c.oldest_dirty_since_ns(), Some(0));
    let mut ops = OpList::new();
    let mut tokens = Vec::new();
    c.begin_flush(FlushOrder::Oldest, 2, &mut ops, &mut tokens);
    let flushed: Vec<u64> = tokens.iter().map(|t| t.key.line_index).collect();
    assert_eq!(flushed, vec![5, 1]);
    assert_eq!(ops.ops().len(), 2);
    // A second batch skips lines already in flight.
    let mut more = Vec::new();
    let mut ops2 = OpList::new();
    c.begin_flush(FlushOrder::Oldest, 8, &mut ops2, &mut more);
    assert_eq!(more.iter().map(|t| t.key.line_index).collect::<Vec<_>>(), vec![3]);
    // A write lands on line 5 while it is being flushed: it must stay dirty.
    ops_of(&mut c, Request::write(0, 5 * 4096, 512, 100));
    assert!(!c.complete_flush(&tokens[0], true));
    assert!(c.complete_flush(&tokens[1], true));
    assert!(
        !c.complete_flush(&more[0], false),
        "a failed flush leaves the line dirty"
    );
    assert_eq!(c.dirty_lines(), 2);
    assert_eq!(
        c.oldest_dirty_since_ns(),
        Some(0),
        "line 5 is still the oldest dirty line"
    );
    assert_eq!(c.stats().flushed_lines, 1);

    // Address order: 3 then 5, continuing after the cursor.
    c.begin_flush(FlushOrder::Address, 1, &mut ops, &mut tokens);
    assert_eq!(tokens[0].key.line_index, 3);
    assert!(c.complete_flush(&tokens[0], true));
    c.begin_flush(FlushOrder::Address, 1, &mut ops, &mut tokens);
    assert_eq!(tokens[0].key.line_index, 5);
    assert!(c.complete_flush(&tokens[0], true));
    assert_eq!(c.dirty_lines(), 0);
    c.check_invariants();
}

#[test]
fn misses_on_a_resident_line_count_as_misses() {
    let mut c = cache(2, 4096, with(WritePolicy::WriteBack));
    ops_of(&mut c, Request::write(0, 0, 512, 0));
    let mut ops = OpList::new();
    let s = c.access(&Request::read(0, 2048, 512, 1), &mut ops).unwrap();
    assert_eq!((s.misses, s.full_hits, s.partial_hits), (1, 0, 0));
    let _ = LineOutcome::Miss;
}

#[test]
fn rejects_unaligned_and_empty_requests() {
    let mut c = cache(2, 4096, |_| {});
    let mut ops = OpList::new();
    assert!(c.access(&Request::read(0, 100, 512, 0), &mut ops).is_err());
    assert!(c.access(&Request::write(0, 0, 0, 0), &mut ops).is_err());
    assert_eq!(c.stats().requests, 0);
}

#[test]
fn forget_sectors_drops_what_the_device_could_not_store() {
    let mut c = cache(2, 4096, with(WritePolicy::WriteBack));
    ops_of(&mut c, Request::write(0, 0, 4096, 0));
    assert!(c.forget_sectors(key(0), 0, 4));
    let state = c.line_state(key(0)).unwrap();
    assert_eq!((state.valid_sectors, state.dirty_sectors), (4, 4));
    assert!(c.forget_sectors(key(0), 4, 8));
    assert_eq!(c.line_state(key(0)), None);
    assert_eq!(c.dirty_lines(), 0);
    assert!(!c.forget_sectors(key(0), 0, 8));
    c.check_invariants();
    // The freed slot is reused.
    ops_of(&mut c, Request::read(0, 8192, 4096, 1));
    ops_of(&mut c, Request::read(0, 16384, 4096, 2));
    assert_eq!(c.stats().evictions, 0);
    c.check_invariants();
}

//! A cache resized while it runs: shrinking keeps the lines the
//! replacement policy would keep and writes back every dirty line that
//! leaves; growing keeps every line; no read is ever stale, under every
//! policy, with dirty victims evicted inline or kept for a cleaner.

mod common;

use common::{Action, Harness};
use iocache_core::{
    Cache, CacheConfig, FlushOrder, LineKey, LineSize, Op, OpList, PolicySpec, Request, Setting, WritePolicy,
};
use proptest::prelude::*;

fn lru(lines: u64, inline: bool) -> Cache {
    common::cache(lines, 4096, |c| {
        c.write_policy = WritePolicy::WriteBack;
        c.inline_dirty_eviction = inline;
    })
}

fn touch(cache: &mut Cache, line: u64, write: bool, now: u64) {
    let request = match write {
        true => Request::write(0, line * 4096, 4096, now),
        false => Request::read(0, line * 4096, 4096, now),
    };
    cache.access(&request, &mut OpList::new()).unwrap();
}

/// An LRU cache of `lines` lines with lines `0..filled` written in order
/// (line `l` at time `l`), dirty where `dirty` says.
fn lru_with(lines: u64, inline: bool, filled: u64, dirty: impl Fn(u64) -> bool) -> Cache {
    let mut cache = lru(lines, inline);
    for line in 0..filled {
        touch(&mut cache, line, dirty(line), line);
    }
    cache
}

fn resident(cache: &Cache, line: u64) -> bool {
    cache
        .line_state(LineKey {
            volume: 0,
            line_index: line,
        })
        .is_some()
}

fn invalidated(ops: &OpList) -> Vec<u64> {
    let mut lines: Vec<u64> = (ops.ops().iter())
        .filter_map(|op| match op {
            Op::Invalidate { key, .. } => Some(key.line_index),
            _ => None,
        })
        .collect();
    lines.sort_unstable();
    lines
}

#[test]
fn shrinking_drops_the_least_recent_lines_and_growing_keeps_the_rest() {
    let mut cache = lru_with(8, true, 8, |_| false);
    touch(&mut cache, 1, false, 10); // 1 is now the most recent
    let mut ops = OpList::new();
    let progress = cache.resize(4, 20, &mut ops).unwrap();
    assert!(progress.done(), "{progress:?}");
    assert_eq!(invalidated(&ops), vec![0, 2, 3, 4]);
    for line in [1, 5, 6, 7] {
        assert!(resident(&cache, line), "line {line} was kept");
    }
    assert_eq!(cache.lines_in_service(), 4);
    // New lines now take the place of old ones: four slots only.
    for line in 100..110 {
        touch(&mut cache, line, false, 30 + line);
        assert!(cache.resident_lines() <= 4);
    }
    cache.check_invariants();
    let progress = cache.resize(8, 200, &mut ops).unwrap();
    assert!(progress.done() && ops.ops().is_empty(), "{progress:?}");
    for line in 106..110 {
        assert!(resident(&cache, line), "line {line} was kept by the growth");
    }
    for line in 200..204 {
        touch(&mut cache, line, false, 300 + line);
    }
    assert_eq!(cache.resident_lines(), 8, "the new slots are used");
    cache.check_invariants();
}

#[test]
fn free_slots_leave_before_any_line() {
    let mut cache = lru_with(8, true, 3, |_| true);
    let mut ops = OpList::new();
    assert!(cache.resize(3, 10, &mut ops).unwrap().done());
    assert!(ops.ops().is_empty(), "no line left: {:?}", ops.ops());
    assert_eq!(cache.resident_lines(), 3);
    assert_eq!(cache.dirty_lines(), 3);
    cache.check_invariants();
}

#[test]
fn dirty_lines_leave_only_once_written_back() {
    // Lines 0, 1, 2 dirty and oldest.
    let mut cache = lru_with(6, false, 6, |line| line < 3);
    let mut ops = OpList::new();
    let progress = cache.resize(2, 10, &mut ops).unwrap();
    // The four least recent leave: 3 is clean and goes; 0, 1, 2 wait.
    assert_eq!(invalidated(&ops), vec![3]);
    assert_eq!((progress.in_service, progress.dirty_leaving), (5, 3));
    assert!(!progress.done());
    // Asking again before anything was written back changes nothing.
    let again = cache.resize(2, 11, &mut ops).unwrap();
    assert_eq!(again, progress);
    assert!(ops.ops().is_empty());
    let mut tokens = Vec::new();
    cache.begin_flush(FlushOrder::Retiring, 10, &mut ops, &mut tokens);
    let mut flushed: Vec<u64> = tokens.iter().map(|t| t.key.line_index).collect();
    flushed.sort_unstable();
    assert_eq!(flushed, vec![0, 1, 2], "only the lines leaving are written back");
    assert!(ops.ops().iter().all(|op| matches!(op, Op::WriteBack { .. })));
    for token in &tokens {
        assert!(cache.complete_flush(token, true));
    }
    let progress = cache.resize(2, 12, &mut ops).unwrap();
    assert!(progress.done(), "{progress:?}");
    assert_eq!(invalidated(&ops), vec![0, 1, 2]);
    assert!(resident(&cache, 4) && resident(&cache, 5));
    cache.check_invariants();
}

#[test]
fn a_line_rewritten_while_it_waits_is_kept_and_another_leaves() {
    let mut cache = lru_with(4, false, 4, |_| true);
    let mut ops = OpList::new();
    let progress = cache.resize(3, 10, &mut ops).unwrap();
    assert_eq!(progress.dirty_leaving, 1); // line 0
    touch(&mut cache, 0, true, 11); // rewritten: now the most recent
    let progress = cache.resize(3, 12, &mut ops).unwrap();
    assert_eq!(progress.dirty_leaving, 1);
    let mut tokens = Vec::new();
    cache.begin_flush(FlushOrder::Retiring, 10, &mut ops, &mut tokens);
    assert_eq!(tokens.len(), 1);
    assert_eq!(
        tokens[0].key.line_index, 1,
        "the next least recent leaves instead"
    );
    cache.complete_flush(&tokens[0], true);
    assert!(cache.resize(3, 13, &mut ops).unwrap().done());
    assert!(resident(&cache, 0) && !resident(&cache, 1));
    cache.check_invariants();
}

#[test]
fn sizes_out_of_range_are_refused_and_the_setting_round_trips() {
    let mut cache = lru(8, true);
    let mut ops = OpList::new();
    for bad in [0, 9] {
        let err = cache.resize(bad, 0, &mut ops).unwrap_err().to_string();
        assert!(
            err.contains(&format!("{bad} lines")) && err.contains("1 to 8"),
            "{err}"
        );
    }
    let setting: Setting = "cache_size=16KiB".parse().unwrap();
    cache.apply(&setting, 0).unwrap();
    assert_eq!(cache.lines_in_service(), 4);
    assert!(cache.settings().contains(&setting), "{:?}", cache.settings());
    let mut config = CacheConfig::new(8, LineSize::new(4096).unwrap(), PolicySpec::lru());
    config.lines_in_service = Some(3);
    let cache = Cache::new(config).unwrap();
    assert_eq!(cache.lines_in_service(), 3);
    cache.check_invariants();
}

fn resize_action(lines: u64) -> BoxedStrategy<Action> {
    prop_oneof![
        12 => common::actions(64, 12, false),
        1 => (1..=lines).prop_map(Action::Resize),
    ]
    .boxed()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn no_read_is_stale_and_no_write_is_lost_across_resizes(
        policy in 0..iocache_core::policy::POLICIES.len(),
        inline in any::<bool>(),
        actions in proptest::collection::vec(resize_action(10), 1..160),
    ) {
        let name = iocache_core::policy::POLICIES[policy].name;
        let mut c = CacheConfig::new(10, LineSize::new(2048).unwrap(), name.parse::<PolicySpec>().unwrap());
        c.write_policy = WritePolicy::WriteBack;
        c.inline_dirty_eviction = inline;
        let mut h = Harness::new(Cache::new(c).unwrap());
        h.apply_all_and_flush(actions, 1000, |h| {
            prop_assert!(h.cache.resident_lines() <= h.cache.lines_in_service());
            Ok(())
        })?;
    }
}

#[test]
fn one_call_takes_a_bounded_number_of_lines_out() {
    let mut cache = lru_with(3000, true, 3000, |_| false);
    let mut ops = OpList::new();
    let first = cache.resize(100, 5000, &mut ops).unwrap();
    assert!(!first.done() && first.dirty_leaving == 0, "{first:?}");
    assert_eq!(first.in_service, 3000 - iocache_core::RESIZE_STEP_LINES);
    let mut calls = 1;
    while !cache.resize(100, 5000, &mut ops).unwrap().done() {
        calls += 1;
    }
    assert_eq!(calls, 2, "2,900 lines leave in three calls: 1,024, 1,024 and 852");
    assert!((2900..3000).all(|line| resident(&cache, line)));
    cache.check_invariants();
}

/// Line hits of `cache` over `requests` (reads of one line each).
fn hits_over(cache: &mut Cache, requests: &[u64], from: u64) -> u64 {
    let mut ops = OpList::new();
    let mut hits = 0;
    for (i, &line) in requests.iter().enumerate() {
        let summary = cache
            .access(&Request::read(0, line * 4096, 4096, from + i as u64), &mut ops)
            .unwrap();
        hits += summary.full_hits as u64;
    }
    hits
}

#[test]
fn a_shrunk_cache_ranks_lines_as_a_cache_built_that_small() {
    // A skewed mix: most reads to a hot tenth, the rest anywhere, so that
    // the policies' queue shares matter.
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = || common::xorshift(&mut seed);
    let requests: Vec<u64> = (0..60_000)
        .map(|_| match next() % 10 {
            0..=6 => next() % 300,
            _ => next() % 3000,
        })
        .collect();
    let (warm, measured) = requests.split_at(20_000);
    for policy in ["s3fifo", "2q", "arc", "larc"] {
        let build = |lines: u64| {
            let c = CacheConfig::new(
                lines,
                LineSize::new(4096).unwrap(),
                policy.parse::<PolicySpec>().unwrap(),
            );
            Cache::new(c).unwrap()
        };
        let mut shrunk = build(1200);
        hits_over(&mut shrunk, warm, 0);
        let mut ops = OpList::new();
        assert!(shrunk.resize(240, 20_000, &mut ops).unwrap().done());
        let mut small = build(240);
        hits_over(&mut small, warm, 0);
        let (a, b) = (
            hits_over(&mut shrunk, measured, 20_000) as f64,
            hits_over(&mut small, measured, 20_000) as f64,
        );
        assert!(
            (a - b).abs() / b < 0.03,
            "{policy}: {a} hits shrunk, {b} built small"
        );
        shrunk.check_invariants();
    }
}

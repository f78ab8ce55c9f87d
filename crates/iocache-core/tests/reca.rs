//! ReCA through the full `Cache`: the `reca` policy's admission
//! and eviction on hand-computed sequences, the stale-read property under
//! every eviction rule, reconfiguration between every pair of categories
//! (and line-size changes by `relayout`) under load without losing a cached
//! or dirty sector, processes of different categories at once (each with
//! its own write policy, fills and priorities) without a stale read, and a
//! workload whose phase changes being recognised within two windows.

mod common;

use std::collections::HashMap;

use common::{actions, cache, Harness};
use iocache_core::reca::{relayout, CategoryTable, RecaController, RecaControllerParams};
use iocache_core::{Cache, LineKey, LineSize, OpList, PolicySpec, Request, SECTOR_BYTES};
use proptest::prelude::*;

const RECA_SPECS: &[&str] = &[
    "reca",
    "reca:history=1",
    "reca:evict=lru:neighbours=2",
    "reca:evict=priority_lru:lru_window=2:over=1:read=1/0/2",
    "reca:sets=3:history=4:pages=0",
    "reca:evict=priority:write=0/0/5:neighbours=1:history=2",
];

#[test]
fn a_process_policy_decides_for_that_process_alone() {
    // Write-back cache-wide; process 7 is set to read-only caching (wa),
    // process 8 to write-through: only process 9's write leaves a dirty line.
    let mut c = cache(16, 4096, |c| {
        c.write_policy = iocache_core::WritePolicy::WriteBack
    });
    c.set_process_policy(7, Some(iocache_core::WritePolicy::WriteAround));
    c.set_process_policy(8, Some(iocache_core::WritePolicy::WriteThrough));
    c.set_process_policy(0, Some(iocache_core::WritePolicy::WriteAround));
    let mut ops = OpList::new();
    for (i, process) in [7u32, 8, 9].into_iter().enumerate() {
        let i = i as u64;
        let w = Request::write(0, i * 4096, 4096, i).from_process(process);
        c.access(&w, &mut ops).unwrap();
    }
    assert_eq!(c.dirty_lines(), 1);
    // The wa write went around the cache, wa's and wt's to the backend.
    assert_eq!(c.stats().bypassed_accesses, 1, "{:?}", c.stats());
    assert_eq!(c.stats().backend_write_bytes, 8192, "{:?}", c.stats());
    // Process 0 (none recorded) is never set apart; withdrawn, process 7
    // writes back like the rest.
    assert_eq!(c.process_policies().len(), 2);
    c.set_process_policy(7, None);
    c.access(&Request::write(0, 8 * 4096, 4096, 9).from_process(7), &mut ops)
        .unwrap();
    assert_eq!(c.dirty_lines(), 2);
}

fn key(i: u64) -> LineKey {
    LineKey {
        volume: 0,
        line_index: i,
    }
}

#[test]
fn algorithm_1_admits_a_miss_only_above_the_least_priority() {
    // Two 4 KiB lines; a request's priority (1 per request) reaches its
    // lines when it leaves a history queue of 1, i.e. at the next request.
    let mut c = cache(2, 4096, |c| c.policy = "reca:history=1".parse().unwrap());
    let mut ops = OpList::new();
    let mut t = 0;
    let mut read = |c: &mut Cache, line: u64| {
        t += 1;
        c.access(&Request::read(0, line * 4096, 4096, t), &mut ops)
            .unwrap()
    };
    read(&mut c, 0); // A: free slot
    read(&mut c, 1); // B: free slot; A gets 1
                     // C: B gets 1; C has 0, not above the least (1): not cached.
    assert_eq!(read(&mut c, 2).misses, 1);
    assert!(c.line_state(key(2)).is_none());
    // C again: the first C gets 1; still not above 1.
    read(&mut c, 2);
    assert!(c.line_state(key(2)).is_none());
    // C a third time: C has 2 > 1: admitted, replacing A (tied with B at 1
    // and less recently used).
    read(&mut c, 2);
    assert!(c.line_state(key(2)).is_some());
    assert!(c.line_state(key(0)).is_none());
    assert!(c.line_state(key(1)).is_some());
    assert_eq!(
        c.policy_counters().iter().find(|(n, _)| *n == "reca_rejected"),
        Some(&("reca_rejected", 2))
    );
    c.check_invariants();
}

#[test]
fn neighbour_eviction_takes_the_adjacent_resident_run() {
    let mut c = cache(5, 4096, |c| {
        c.policy = "reca:evict=lru:neighbours=2".parse().unwrap()
    });
    let mut ops = OpList::new();
    for (t, line) in [3u64, 2, 4, 5, 9].into_iter().enumerate() {
        c.access(&Request::write(0, line * 4096, 4096, t as u64), &mut ops)
            .unwrap();
    }
    // Full. A miss evicts the LRU line (3) and up to 2 resident neighbours
    // each side: 2 (then 1 is absent), 4 and 5.
    c.access(&Request::read(0, 100 * 4096, 4096, 9), &mut ops)
        .unwrap();
    let resident: Vec<u64> = [2u64, 3, 4, 5, 9, 100]
        .into_iter()
        .filter(|&l| c.line_state(key(l)).is_some())
        .collect();
    assert_eq!(resident, vec![9, 100]);
    assert_eq!(c.stats().eviction_batches, 1);
    assert_eq!(c.stats().evictions, 4);
    assert_eq!(c.stats().dirty_writebacks, 4);
    c.check_invariants();
}

#[test]
fn new_weights_recompute_the_priorities_in_place() {
    // Line 0 is read five times, line 1 written twice and read once. Under
    // read-only weights (write=0 after access=0), line 1 ranks below line 0
    // only if the counts survive the reconfiguration (halved by it: a new
    // category ages every count).
    let spec = |w: &str| -> PolicySpec { format!("reca:history=1:access=0/0/0:{w}").parse().unwrap() };
    let mut c = cache(2, 4096, |c| c.policy = spec("read=1/1/1:write=1/1/1"));
    let mut ops = OpList::new();
    let mut t = 0;
    for (line, write) in [
        (0, false),
        (1, true),
        (0, false),
        (1, true),
        (0, false),
        (0, false),
        (0, false),
        (1, false),
    ] {
        t += 1;
        let r = if write {
            Request::write(0, line * 4096, 4096, t)
        } else {
            Request::read(0, line * 4096, 4096, t)
        };
        c.access(&r, &mut ops).unwrap();
    }
    // Counts now: line 0: 5 reads; line 1: 2 writes (its read is queued).
    // Halved: 2 reads, 1 write; only reads count from here on: line 0 is
    // at 2, line 1 at 0, then 1 once its queued read is counted.
    c.apply(&iocache_core::Setting::Policy(spec("read=1/1/1:write=0/0/0")), t)
        .unwrap();
    assert_eq!(c.config().policy, spec("read=1/1/1:write=0/0/0"));
    // Line 2, read three times, reaches 2 > 1: it replaces line 1, not line 0.
    for _ in 0..3 {
        t += 1;
        c.access(&Request::read(0, 2 * 4096, 4096, t), &mut ops).unwrap();
    }
    assert!(c.line_state(key(2)).is_some());
    assert!(c.line_state(key(0)).is_some());
    assert!(c.line_state(key(1)).is_none());
    // Counted once: the in-place change is a reconfiguration, not a rebuild.
    assert_eq!(
        c.policy_counters()
            .iter()
            .find(|(n, _)| *n == "reca_reconfigurations"),
        Some(&("reca_reconfigurations", 1))
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    /// Reads return the latest write and flushing loses nothing, under every
    /// eviction rule of `reca`.
    #[test]
    fn reca_never_reads_stale_data(
        spec in prop::sample::select(RECA_SPECS),
        capacity in 1u64..10,
        line_shift in 0u32..4,
        steps in prop::collection::vec(actions(64, 20, true), 1..150),
    ) {
        let spec: PolicySpec = spec.parse().unwrap();
        let mut h = Harness::new(cache(capacity, 512 << line_shift, |c| c.policy = spec));
        h.apply_all_and_flush(steps, 1, |_| Ok(()))?;
    }

    /// Switching between any two categories under load (priorities,
    /// eviction rule, write policy, and the line size by `relayout`) keeps
    /// every cached and dirty sector, the cache's invariants, and every
    /// read's data.
    #[test]
    fn reconfiguring_between_categories_loses_nothing(
        switches in prop::collection::vec((0usize..5, prop::collection::vec(actions(96, 24, false), 0..40)), 1..8),
        capacity_kib in 8u64..64,
    ) {
        let table = CategoryTable::builtin();
        let mut controller = RecaController::new(table, RecaControllerParams::default());
        // Start in 4 KiB lines; categories then move between 4 and 128 KiB.
        let mut h = Harness::new(cache(capacity_kib / 4, 4096, |_| {}));
        let mut t = 0u64;
        for (category, steps) in switches {
            for a in steps {
                t += 1;
                h.apply(a, t);
            }
            t += 1;
            let Some(mut event) = controller.set_category(category, t, t) else { continue };
            controller.apply(&mut h.cache, &mut event, t).unwrap();
            h.cache.check_invariants();
            let want = &controller.table().categories[category];
            prop_assert_eq!(h.cache.effective_mode().policy, want.write_policy);
            prop_assert_eq!(h.cache.config().policy.name(), "reca");
            if let Some(line) = event.line_size {
                prop_assert_eq!(line, want.line_size);
                switch_line_size(&mut h, line, t);
            }
        }
        h.flush_all_and_check_backend();
    }
}

/// One step of [`per_process_settings_lose_nothing`].
#[derive(Clone, Debug)]
enum ProcessStep {
    /// (process, write, first sector, sectors)
    Io(u32, bool, u64, u64),
    /// A process takes a category, or (`None`) is forgotten.
    Category(u32, Option<usize>),
    /// The cache's line size changes (`relayout`), to 512 << shift.
    Relayout(u32),
}

/// Runs `request` of a process set apart or not: a read that fills whole
/// lines gets a buffer from its first line's start; the extent fill the
/// cache leaves is then fetched as a readahead fill. Every read returns the
/// latest write.
fn run_process_request(h: &mut Harness, request: Request) {
    let mut ops = OpList::new();
    if request.kind == iocache_core::IoKind::Write {
        h.run(request);
    } else {
        let summary = h.cache.access(&request, &mut ops).unwrap();
        let line = h.cache.line_size().bytes();
        let origin = match summary.line_origin {
            true => request.offset_bytes & !(line - 1),
            false => request.offset_bytes,
        };
        let end = match summary.line_origin {
            true => (request.offset_bytes + request.length_bytes).next_multiple_of(line),
            false => request.offset_bytes + request.length_bytes,
        };
        let mut buffer = vec![0u64; ((end - origin) / SECTOR_BYTES) as usize];
        h.world.execute(&request, ops.ops(), &mut buffer);
        h.cache.check_invariants();
        let skip = (request.offset_bytes - origin) / SECTOR_BYTES;
        let first = request.offset_bytes / SECTOR_BYTES;
        for i in 0..request.length_bytes / SECTOR_BYTES {
            let want = h
                .reference
                .get(&(request.volume, first + i))
                .copied()
                .unwrap_or(0);
            assert_eq!(
                buffer[(skip + i) as usize],
                want,
                "stale read of sector {}",
                first + i
            );
        }
    }
    if let Some(fill) = h.cache.take_extent_fill() {
        assert_eq!(fill.process, request.process);
        let prefetch = iocache_core::AccessHints {
            prefetch: true,
            ..Default::default()
        };
        // A fill returns no data: its buffer only carries what it reads.
        h.cache.access_with(&fill, prefetch, &mut ops).unwrap();
        let mut buffer = vec![0u64; (fill.length_bytes / SECTOR_BYTES) as usize];
        h.world.execute(&fill, ops.ops(), &mut buffer);
        h.cache.check_invariants();
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Processes of different categories at once (write policy, line size
    /// as fills, `reca` priorities set apart for each), processes
    /// forgotten, and the cache's line size changed under them: every read
    /// returns the latest write, the invariants hold, a relayout carries
    /// every process's settings over, and a full flush loses nothing.
    #[test]
    fn per_process_settings_lose_nothing(
        cache_wide in 0usize..5,
        steps in prop::collection::vec(prop_oneof![
            12 => (0u32..4, any::<bool>(), 0u64..2048, 1u64..40)
                .prop_map(|(p, w, s, n)| ProcessStep::Io(p, w, s, n)),
            2 => (1u32..4, prop::option::weighted(0.8, 0usize..5))
                .prop_map(|(p, c)| ProcessStep::Category(p, c)),
            1 => (2u32..8).prop_map(ProcessStep::Relayout),
        ], 1..200),
        fill_lines in any::<bool>(),
    ) {
        let table = CategoryTable::builtin();
        let mut controller = RecaController::new(table.clone(), RecaControllerParams::default());
        let mut h = Harness::new(cache(48, 4096, |c| {
            c.fill = if fill_lines { iocache_core::Fill::Line } else { iocache_core::Fill::Request };
        }));
        let mut event = controller.set_category(cache_wide, 0, 0).unwrap();
        controller.apply(&mut h.cache, &mut event, 0).unwrap();
        for (t, step) in steps.into_iter().enumerate() {
            let t = t as u64 + 1;
            match step {
                ProcessStep::Io(process, write, sector, n) => {
                    let r = match write {
                        true => Request::write(0, sector * 512, n * 512, t),
                        false => Request::read(0, sector * 512, n * 512, t),
                    };
                    run_process_request(&mut h, r.from_process(process));
                }
                ProcessStep::Category(process, category) => {
                    let settings = category
                        .map(|i| RecaController::process_settings(&table.categories[i], &h.cache));
                    h.cache.set_process_settings(process, settings).unwrap();
                }
                ProcessStep::Relayout(shift) => {
                    let before = h.cache.process_settings();
                    switch_line_size(&mut h, LineSize::new(512 << shift).unwrap(), t);
                    prop_assert_eq!(h.cache.process_settings(), before);
                }
            }
        }
        h.flush_all_and_check_backend();
    }
}

/// Every ordered pair of categories, deterministically: a mixed workload,
/// the first category, more of it, the second, more of it; every read
/// returns the latest write throughout and the backend gets every write.
#[test]
fn every_pair_of_categories_switches_without_loss() {
    let table = CategoryTable::builtin();
    let n = table.categories.len();
    let mut x = 0x1234_5678_9abc_def1u64;
    let mut step = |h: &mut Harness, t: u64| {
        common::xorshift(&mut x);
        let volume = (x % 2) as u32;
        let sector = (x >> 8) % 2048;
        let sectors = 1 + (x >> 24) % 64;
        let r = if (x >> 40).is_multiple_of(2) {
            Request::write(volume, sector * 512, sectors * 512, t)
        } else {
            Request::read(volume, sector * 512, sectors * 512, t)
        };
        h.run(r);
    };
    for a in 0..n {
        for b in 0..n {
            if a == b {
                continue;
            }
            let mut controller = RecaController::new(table.clone(), RecaControllerParams::default());
            let mut h = Harness::new(cache(64, 4096, |_| {}));
            let mut t = 0;
            for category in [a, b] {
                for _ in 0..300 {
                    t += 1;
                    step(&mut h, t);
                }
                let mut event = controller.set_category(category, t, t).expect("a change");
                controller.apply(&mut h.cache, &mut event, t).unwrap();
                if let Some(line) = event.line_size {
                    switch_line_size(&mut h, line, t);
                }
                assert_eq!(h.cache.line_size(), table.categories[category].line_size);
                assert_eq!(
                    h.cache.effective_mode().policy,
                    table.categories[category].write_policy
                );
                assert_eq!(
                    h.cache.config().policy,
                    table.categories[category].policy_spec(None)
                );
            }
            for _ in 0..300 {
                t += 1;
                step(&mut h, t);
            }
            h.flush_all_and_check_backend();
        }
    }
}

/// Replaces the harness's cache by `relayout`'s, moving the data model's
/// cache contents to the new slots, and checks every sector was kept or
/// (dirty) written back or (clean) counted as dropped.
fn switch_line_size(h: &mut Harness, line: LineSize, now_ns: u64) {
    let old_line = h.cache.line_size();
    let per_old = u64::from(old_line.sectors());
    let per_new = u64::from(line.sectors());
    // Every valid sector of the old cache: (volume, sector) -> (slot, dirty).
    let mut held: HashMap<(u32, u64), (u32, u64, bool)> = HashMap::new();
    for slot in 0..h.cache.capacity_lines() as u32 {
        if let Some(snap) = h.cache.slot_snapshot(slot) {
            for i in 0..per_old {
                let (w, b) = ((i / 64) as usize, i % 64);
                if snap.valid[w] >> b & 1 == 1 {
                    let dirty = snap.dirty[w] >> b & 1 == 1;
                    held.insert(
                        (snap.key.volume, snap.key.line_index * per_old + i),
                        (slot, i, dirty),
                    );
                }
            }
        }
    }
    let r = relayout(&h.cache, line, now_ns).unwrap();
    r.cache.check_invariants();
    assert_eq!(
        r.kept_sectors + r.dropped_clean_sectors + r.written_back_sectors,
        held.len() as u64
    );
    let dummy = Request::read(0, 0, SECTOR_BYTES, 0);
    h.world.execute(&dummy, &r.write_backs, &mut []);
    let mut new_device = HashMap::new();
    let mut kept = 0;
    for (&(volume, sector), &(old_slot, old_i, dirty)) in &held {
        let key = LineKey {
            volume,
            line_index: sector / per_new,
        };
        let i = sector % per_new;
        match r.cache.line_state(key) {
            Some(state) => {
                let snap = r.cache.slot_snapshot(state.slot).unwrap();
                let (w, b) = ((i / 64) as usize, i % 64);
                assert_eq!(snap.valid[w] >> b & 1, 1, "sector {sector} lost");
                assert_eq!(snap.dirty[w] >> b & 1 == 1, dirty, "dirtiness of {sector}");
                let v = h.world.cache_device.get(&(old_slot, old_i)).copied().unwrap_or(0);
                new_device.insert((state.slot, i), v);
                kept += 1;
            }
            None => {
                if dirty {
                    let v = h.world.cache_device.get(&(old_slot, old_i)).copied().unwrap_or(0);
                    assert_eq!(h.world.backend.get(&(volume, sector)).copied().unwrap_or(0), v);
                }
            }
        }
    }
    assert_eq!(kept, r.kept_sectors);
    if per_new <= per_old {
        assert_eq!(kept, held.len() as u64, "splitting always fits");
    }
    h.world.cache_device = new_device;
    h.cache = r.cache;
}

/// Where the phase of [`two_phase_windows`] changes.
const CHANGE_AT: u64 = 52_500;

/// A file server's sequential reads and writes of medium files, then (from
/// request [`CHANGE_AT`]) a mail server's random reads and writes, 100,000
/// requests through a controller with `params`: each window's end
/// (requests), category and whether the change test closed it early.
fn two_phase_windows(params: RecaControllerParams) -> Vec<(u64, String, bool)> {
    let mut controller = RecaController::new(CategoryTable::builtin(), params);
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut rand = move || common::xorshift(&mut x);
    let mut windows = Vec::new();
    // Phase 1: 8 files of 64 MiB, each read or written front to back in 16
    // KiB requests, files interleaved at random.
    let mut cursor = [0u64; 8];
    let mut t = 0u64;
    while t < 100_000 {
        t += 1;
        let request = if t <= CHANGE_AT {
            let f = (rand() % 8) as usize;
            let offset = ((f as u64) << 26) + cursor[f];
            cursor[f] = (cursor[f] + 16384) % (1 << 26);
            if f.is_multiple_of(2) {
                Request::read(0, offset, 16384, t)
            } else {
                Request::write(0, offset, 16384, t)
            }
        } else {
            let offset = (rand() % (1 << 18)) * 4096;
            if rand() % 100 < 55 {
                Request::read(0, offset, 4096, t)
            } else {
                Request::write(0, offset, 4096, t)
            }
        };
        if let Some(report) = controller.observe(&request) {
            windows.push((
                report.requests,
                controller.table().categories[report.category].name.clone(),
                report.early,
            ));
        }
    }
    windows
}

fn window_of(requests: u64, probes_per_window: u64) -> RecaControllerParams {
    RecaControllerParams {
        window_requests: requests,
        probes_per_window,
        ..RecaControllerParams::default()
    }
}

/// The category changes within two windows of the phase change (window:
/// 5,000 requests), and holds in the stable phases.
#[test]
fn a_phase_change_is_recognised_within_two_windows() {
    let window = 5_000u64;
    for probes in [0, 10] {
        let categories = two_phase_windows(window_of(window, probes));
        let before: Vec<_> = categories.iter().filter(|(r, ..)| *r <= CHANGE_AT).collect();
        assert!(
            before
                .iter()
                .all(|(_, n, _)| n == "sequential_producer_consumers"),
            "{categories:?}"
        );
        // The window that holds the change is mixed; the one after it must
        // be the new category (at most two windows after the change).
        let first_after = categories
            .iter()
            .find(|(r, n, _)| *r > CHANGE_AT && n == "random_producer_consumers")
            .expect("recognised");
        assert!(first_after.0 <= CHANGE_AT + 2 * window, "{categories:?}");
        assert!(categories
            .iter()
            .filter(|(r, ..)| *r > CHANGE_AT + 2 * window)
            .all(|(_, n, _)| n == "random_producer_consumers"));
    }
}

/// The change test: a window of 50,000 requests in 10 probes closes two or
/// three probes after the phase change (not at the window's end, 7,500
/// requests later), and only there: a stable phase never closes a window
/// early. Without probes, the change waits for the window's end.
#[test]
fn the_change_test_closes_the_window_early_and_only_at_a_change() {
    let window = 50_000u64;
    let probe = window / 10;
    let categories = two_phase_windows(window_of(window, 10));
    let early: Vec<_> = categories.iter().filter(|(_, _, e)| *e).collect();
    assert_eq!(early.len(), 1, "{categories:?}");
    let (at, name, _) = early[0];
    assert_eq!(name, "random_producer_consumers");
    assert!(*at > CHANGE_AT && *at <= CHANGE_AT + 3 * probe, "{categories:?}");
    // Windows after the early one run their whole length again.
    assert!(categories
        .iter()
        .filter(|(r, ..)| r > at)
        .all(|(r, n, e)| !e && (r - at).is_multiple_of(window) && n == "random_producer_consumers"));

    let without = two_phase_windows(window_of(window, 0));
    assert!(
        without.iter().all(|(r, _, e)| !e && r.is_multiple_of(window)),
        "{without:?}"
    );
    let first = without
        .iter()
        .find(|(_, n, _)| n == "random_producer_consumers")
        .expect("recognised at a window's end");
    assert_eq!(first.0, 100_000, "{without:?}");
}

//! Restoring a cache from persisted slot snapshots (what a runtime with
//! persistent metadata does at start-up) must reproduce every line, its
//! valid and dirty sectors and its place on the dirty list, and refuse
//! inconsistent input.

use iocache_core::{
    Cache, CacheConfig, LineKey, LineSize, OpList, PolicySpec, Request, RestoredLine, WritePolicy,
};
use proptest::prelude::*;

fn config(policy: &str, line_bytes: u64) -> CacheConfig {
    let mut c = CacheConfig::new(
        16,
        LineSize::new(line_bytes).unwrap(),
        policy.parse::<PolicySpec>().unwrap(),
    );
    c.write_policy = WritePolicy::WriteBack;
    c
}

type Snapshot = Vec<(u32, LineKey, Vec<u64>, Vec<u64>)>;

fn snapshot(cache: &Cache) -> Snapshot {
    (0..cache.capacity_lines() as u32)
        .filter_map(|slot| {
            cache
                .slot_snapshot(slot)
                .map(|s| (slot, s.key, s.valid.to_vec(), s.dirty.to_vec()))
        })
        .collect()
}

fn restore_into(config: CacheConfig, snap: &Snapshot) -> Result<Cache, iocache_core::CoreError> {
    let mut cache = Cache::new(config)?;
    let lines: Vec<RestoredLine<'_>> = snap
        .iter()
        .map(|(slot, key, valid, dirty)| RestoredLine {
            slot: *slot,
            key: *key,
            valid,
            dirty,
            epoch: 0,
        })
        .collect();
    cache.restore(&lines, 7)?;
    Ok(cache)
}

proptest! {
    #[test]
    fn restore_reproduces_every_slot(
        policy in prop::sample::select(vec!["lru", "arc", "s3fifo", "clock", "2q"]),
        line_bytes in prop::sample::select(vec![512u64, 4096, 65536]),
        requests in prop::collection::vec((any::<bool>(), 0u64..256, 1u64..16), 1..200),
    ) {
        let mut cache = Cache::new(config(policy, line_bytes)).unwrap();
        let mut ops = OpList::new();
        for (i, &(write, sector, sectors)) in requests.iter().enumerate() {
            let request = if write {
                Request::write(0, sector * 512 * (line_bytes / 512).min(8), sectors * 512, i as u64)
            } else {
                Request::read(0, sector * 512 * (line_bytes / 512).min(8), sectors * 512, i as u64)
            };
            cache.access(&request, &mut ops).unwrap();
        }
        let before = snapshot(&cache);
        let restored = restore_into(config(policy, line_bytes), &before).unwrap();
        restored.check_invariants();
        prop_assert_eq!(snapshot(&restored), before);
        prop_assert_eq!(restored.dirty_lines(), cache.dirty_lines());
        prop_assert_eq!(restored.resident_lines(), cache.resident_lines());
        // A read of every restored line's valid first sector is a hit.
        let mut restored = restored;
        for (_, key, valid, _) in snapshot(&restored) {
            let first = valid.iter().enumerate().find(|(_, w)| **w != 0).map(|(i, w)| i as u64 * 64 + u64::from(w.trailing_zeros())).unwrap();
            let hits_before = restored.stats().read_hits;
            restored.access(&Request::read(key.volume, key.line_index * line_bytes + first * 512, 512, 1000), &mut ops).unwrap();
            prop_assert_eq!(restored.stats().read_hits, hits_before + 1);
        }
    }
}

#[test]
fn restore_refuses_inconsistent_input() {
    let key = |line_index| LineKey {
        volume: 0,
        line_index,
    };
    let cases: Vec<(Snapshot, &str)> = vec![
        (vec![(16, key(1), vec![1], vec![0])], "beyond"),
        (
            vec![(1, key(1), vec![1], vec![0]), (1, key(2), vec![1], vec![0])],
            "twice",
        ),
        (
            vec![(1, key(1), vec![1], vec![0]), (2, key(1), vec![1], vec![0])],
            "already restored",
        ),
        (vec![(1, key(1), vec![0], vec![0])], "no valid sector"),
        (vec![(1, key(1), vec![1], vec![2])], "not valid"),
        (vec![(1, key(1), vec![1 << 8], vec![0])], "beyond the line"),
        (vec![(1, key(1), vec![1, 0], vec![0, 0])], "words"),
    ];
    for (snap, expected) in cases {
        let err = restore_into(config("lru", 4096), &snap)
            .err()
            .expect("must be refused");
        assert!(
            err.to_string().contains(expected),
            "{err} should mention {expected}"
        );
    }
}

//! The per-slot driver word belongs to the driver: whatever the cache does to
//! a slot (hits, fills, evictions, write-backs, invalidations, flushes,
//! retirement), the word the driver stored stays as it was.

use iocache_core::{Cache, CacheConfig, FlushOrder, LineSize, OpList, PolicySpec, Request, WritePolicy};
use proptest::prelude::*;

const LINE: u64 = 4096;
const SLOTS: u32 = 16;

fn word_for(slot: u32) -> u64 {
    0x9e37_79b9_7f4a_7c15u64.wrapping_mul(u64::from(slot) + 1)
}

proptest! {
    #[test]
    fn the_cache_never_changes_a_driver_word(
        policy in prop::sample::select(vec!["lru", "clock", "arc", "s3fifo", "smq"]),
        write_policy in prop::sample::select(vec![
            WritePolicy::WriteBack,
            WritePolicy::WriteThrough,
            WritePolicy::WriteInvalidate,
        ]),
        requests in prop::collection::vec((0u64..48, 1u64..4, any::<bool>(), 0u8..8), 1..200),
    ) {
        let mut config = CacheConfig::new(
            u64::from(SLOTS),
            LineSize::new(LINE).unwrap(),
            policy.parse::<PolicySpec>().unwrap(),
        );
        config.write_policy = write_policy;
        let mut cache = Cache::new(config).unwrap();
        for slot in 0..SLOTS {
            *cache.slot_driver_word_mut(slot) = word_for(slot);
        }
        let mut ops = OpList::new();
        let mut tokens = Vec::new();
        for (now, &(line, lines, write, flush)) in requests.iter().enumerate() {
            let now = now as u64;
            let request = if write {
                Request::write(0, line * LINE, lines * LINE, now)
            } else {
                Request::read(0, line * LINE, lines * LINE, now)
            };
            cache.access(&request, &mut ops).unwrap();
            if flush == 0 {
                cache.begin_flush(FlushOrder::Oldest, 4, &mut ops, &mut tokens);
                for token in &tokens {
                    cache.complete_flush(token, !now.is_multiple_of(3));
                }
            }
        }
        cache.retire_slots(|slot| slot % 5 == 0, &mut ops);
        for slot in 0..SLOTS {
            prop_assert_eq!(cache.slot_driver_word(slot), word_for(slot), "slot {}", slot);
        }
        cache.check_invariants();
    }
}

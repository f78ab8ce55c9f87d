//! First in, first out: lines leave in the order they were admitted; hits do
//! not reorder anything.
//!
//! The classic baseline of the paging literature (see e.g. Belady, "A study of
//! replacement algorithms for a virtual-storage computer", IBM Systems Journal
//! 5(2), 1966, where FIFO is one of the algorithms studied). No parameters.
//!
//! An invalidated line (`on_remove`) simply leaves the queue.

use super::{one_victim_per_miss, AccessInfo, Lru, ReplacementPolicy};
use crate::addr::{LineKey, SlotId};

/// LRU's queue without the move on a hit: admission order is eviction order.
pub struct Fifo {
    queue: Lru,
}

impl Fifo {
    pub fn new(capacity_lines: usize) -> Self {
        Fifo {
            queue: Lru::new(capacity_lines),
        }
    }

    /// Resident slots from newest to oldest (for tests and inspection).
    pub fn order(&self) -> Vec<SlotId> {
        self.queue.order()
    }

    /// LRU's victim: its tail, the oldest admitted.
    #[inline(always)]
    fn victim_for(&mut self, key: LineKey, need_victim: bool) -> Option<SlotId> {
        self.queue.victim_for(key, need_victim)
    }
}

impl ReplacementPolicy for Fifo {
    fn name(&self) -> &'static str {
        "fifo"
    }

    fn on_hit(&mut self, _slot: SlotId, _info: &AccessInfo) {}

    one_victim_per_miss!();

    fn on_insert(&mut self, slot: SlotId, key: LineKey, info: &AccessInfo) {
        self.queue.on_insert(slot, key, info);
    }

    fn on_remove(&mut self, slot: SlotId) {
        self.queue.on_remove(slot);
    }

    fn next_victims(&self) -> [Option<SlotId>; 2] {
        self.queue.next_victims()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::testing::{churn, Driver};

    #[test]
    fn hits_do_not_reorder() {
        // Capacity 3: 1 2 3 fill; 1 hits (LRU would move it to the head);
        // 4 misses and FIFO evicts 1, the oldest admitted; 1 then misses and
        // evicts 2. LRU would have evicted 2 then kept 1 (1 more hit).
        let mut d = Driver::new(Fifo::new(3), 3);
        assert_eq!(d.run(&[1, 2, 3, 1, 4, 1]), 1);
        assert_eq!(d.evicted, vec![1, 2]);
        assert_eq!(d.resident(), vec![1, 3, 4]);
        let mut lru = Driver::new(crate::policy::Lru::new(3), 3);
        assert_eq!(lru.run(&[1, 2, 3, 1, 4, 1]), 2);
        assert_eq!(lru.evicted, vec![2]);
    }

    #[test]
    fn one_line_cache() {
        // 7 miss, 7 hit, 8 miss (evicts 7), 7 miss (evicts 8), 7 hit.
        let mut d = Driver::new(Fifo::new(1), 1);
        assert_eq!(d.run(&[7, 7, 8, 7, 7]), 2);
        assert_eq!(d.evicted, vec![7, 8]);
    }

    #[test]
    fn invalidating_head_tail_and_middle() {
        let mut d = Driver::new(Fifo::new(5), 5);
        d.run(&[1, 2, 3, 4, 5]); // queue head..tail: 5 4 3 2 1
        assert!(d.remove(1)); // tail
        assert!(d.remove(5)); // head
        assert!(d.remove(3)); // middle
        assert!(!d.remove(3));
        // Queue 4 2; three free slots take 6 7 8 without eviction.
        d.run(&[6, 7, 8]);
        assert!(d.evicted.is_empty());
        d.run(&[9, 10]); // evicts 2 then 4
        assert_eq!(d.evicted, vec![2, 4]);
        assert_eq!(d.resident(), vec![6, 7, 8, 9, 10]);
    }

    #[test]
    fn queue_holds_exactly_the_resident_lines() {
        churn(0x1234_5678, 2_000, Fifo::new, |d, capacity| {
            assert_eq!(d.policy.order().len(), d.resident_count());
            assert!(d.resident_count() <= capacity);
        });
    }
}

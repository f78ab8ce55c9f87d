//! SIEVE: a FIFO queue with one visited bit per line and a hand that moves
//! from the tail (oldest) toward the head (newest), skipping and clearing
//! visited lines.
//!
//! Source: Y. Zhang, J. Yang, Y. Yue, Y. Vigfusson, K. V. Rashmi, "SIEVE is
//! Simpler than LRU: an Efficient Turn-Key Eviction Algorithm for Web Caches",
//! NSDI'24, §3 (the algorithm and its pseudo-code). No parameters.
//!
//! - A hit only sets the line's visited bit (no queue movement).
//! - A new line enters at the head with its bit clear.
//! - To evict, the hand starts where it last stopped (at the tail the first
//!   time, or after it fell off the head): each visited line it meets has its
//!   bit cleared and stays in place; the first unvisited line is the victim,
//!   and the hand stays at the line just newer than it.
//!
//! Unlike CLOCK, retained lines are not moved to the head, so new lines sit
//! between the hand and the head and old survivors stay near the tail: that
//! is what lets SIEVE drop new, unpopular lines quickly ("quick demotion").
//!
//! Invalidation (`on_remove`), which the paper does not consider: the line
//! leaves the queue; if the hand pointed at it, the hand moves to the next
//! newer line, as after an eviction.
//!
//! Per-access cost: O(1) per hit, amortized O(1) per eviction.

use super::list::{Links, ListHead, NIL};
use super::{AccessInfo, ReplacementPolicy};
use crate::addr::{LineKey, SlotId};

pub struct Sieve {
    links: Links,
    /// Head = newest, tail = oldest.
    queue: ListHead,
    visited: Vec<bool>,
    /// The next line the hand examines; `NIL` means "start at the tail".
    hand: u32,
}

impl Sieve {
    pub fn new(capacity_lines: usize) -> Self {
        Sieve {
            links: Links::new(capacity_lines),
            queue: ListHead::default(),
            visited: vec![false; capacity_lines],
            hand: NIL,
        }
    }

    /// Resident slots from newest to oldest (for tests and inspection).
    pub fn order(&self) -> Vec<SlotId> {
        self.links.iter(&self.queue).collect()
    }

    /// The slot the hand points at, if any.
    pub fn hand(&self) -> Option<SlotId> {
        (self.hand != NIL).then_some(self.hand)
    }
}

impl ReplacementPolicy for Sieve {
    fn name(&self) -> &'static str {
        "sieve"
    }

    fn on_hit(&mut self, slot: SlotId, _info: &AccessInfo) {
        self.visited[slot as usize] = true;
    }

    fn on_miss(&mut self, _key: LineKey, need_victim: bool, _info: &AccessInfo, victims: &mut Vec<SlotId>) {
        if !need_victim || self.queue.len == 0 {
            return;
        }
        let mut at = if self.hand != NIL {
            self.hand
        } else {
            self.queue.tail
        };
        // Terminates within one full turn: every bit passed is cleared.
        while std::mem::take(&mut self.visited[at as usize]) {
            at = self.links.prev(at);
            if at == NIL {
                at = self.queue.tail;
            }
        }
        self.hand = self.links.prev(at);
        self.links.unlink(&mut self.queue, at);
        victims.push(at);
    }

    fn on_insert(&mut self, slot: SlotId, _key: LineKey, _info: &AccessInfo) {
        self.visited[slot as usize] = false;
        self.links.push_head(&mut self.queue, slot);
    }

    fn on_remove(&mut self, slot: SlotId) {
        if self.hand == slot {
            self.hand = self.links.prev(slot);
        }
        self.visited[slot as usize] = false;
        self.links.unlink(&mut self.queue, slot);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::testing::{churn, Driver};
    use crate::policy::Lru;

    #[test]
    fn hand_keeps_its_place_and_new_lines_go_first() {
        // Capacity 3. 1 2 3 fill: queue (new..old) 3 2 1; 1 and 2 hit.
        // 4: hand from the tail: 1 visited (cleared), 2 visited (cleared),
        //    3 unvisited -> evicted; hand := newer than 3 = none (NIL).
        //    queue 4 2 1.
        // 5: hand at NIL -> tail 1 (clear) -> evicted; hand := 2. queue 5 4 2.
        // 6: hand at 2 (clear) -> evicted; hand := 4. queue 6 5 4.
        let mut d = Driver::new(Sieve::new(3), 3);
        assert_eq!(d.run(&[1, 2, 3, 1, 2, 4, 5, 6]), 2);
        assert_eq!(d.evicted, vec![3, 1, 2]);
        assert_eq!(d.resident(), vec![4, 5, 6]);
        assert_eq!(d.policy.hand(), d.slot_of(4));
    }

    #[test]
    fn a_scan_does_not_flush_the_popular_lines() {
        // Capacity 4: 100 and 101 are accessed twice, then a scan of ten new
        // lines, then 100 and 101 again. SIEVE keeps the visited pair near the
        // tail while the hand evicts the unvisited scan lines behind it:
        //   fill 100 101 (+hits: both visited), 0 1 fill the cache;
        //   2: hand from tail: 100, 101 cleared, 0 evicted, hand -> 1.
        //   3: 1 evicted (hand -> 2); 4: 2 evicted; ... each scan line is
        //   evicted by the next one, while 100/101 (cleared, but resident) stay
        //   behind the hand, which does not come back to them before the pair
        //   is accessed again: the scan's ten lines cause eight evictions, 0..=7.
        let hot = [100, 101];
        let mut seq = vec![];
        seq.extend(hot);
        seq.extend(hot);
        seq.extend(0..10);
        seq.extend(hot);
        let mut sieve = Driver::new(Sieve::new(4), 4);
        let mut lru = Driver::new(Lru::new(4), 4);
        sieve.run(&seq);
        lru.run(&seq);
        assert_eq!(lru.hits, 2, "LRU lost the pair to the scan");
        assert_eq!(sieve.hits, 4, "SIEVE kept the pair");
        assert_eq!(sieve.evicted, (0..8).collect::<Vec<u64>>());
    }

    #[test]
    fn one_line_cache() {
        // 7 miss, 7 hit (visited), 8: the hand clears 7, wraps to 7 and evicts it.
        let mut d = Driver::new(Sieve::new(1), 1);
        assert_eq!(d.run(&[7, 7, 8, 8, 9]), 2);
        assert_eq!(d.evicted, vec![7, 8]);
    }

    #[test]
    fn invalidating_the_hand_head_tail_and_middle() {
        let mut d = Driver::new(Sieve::new(5), 5);
        // 1..5, then 1 and 2 hit; 6: hand clears 1, 2, evicts 3; hand -> 4.
        d.run(&[1, 2, 3, 4, 5, 1, 2, 6]);
        assert_eq!(d.evicted, vec![3]);
        assert_eq!(d.policy.hand(), d.slot_of(4));
        // Queue new..old: 6 5 4 2 1. Remove the hand's line: hand -> 5.
        assert!(d.remove(4));
        assert_eq!(d.policy.hand(), d.slot_of(5));
        assert!(d.remove(1)); // tail
        assert!(d.remove(6)); // head
                              // Queue 5 2; hand at 5. Fill 7 8 9 (free slots): queue 9 8 7 5 2.
        d.run(&[7, 8, 9]);
        // 10: hand at 5 (unvisited) -> evicted; hand -> 7.
        d.run(&[10]);
        assert_eq!(d.evicted, vec![3, 5]);
        assert_eq!(d.policy.hand(), d.slot_of(7));
        d.run(&[2, 11]); // 2 visited; hand at 7 -> evicted
        assert_eq!(d.evicted, vec![3, 5, 7]);
        assert!(d.remove(11)); // head, not the hand
        assert_eq!(d.policy.hand(), d.slot_of(8));
    }

    #[test]
    fn queue_holds_exactly_the_resident_lines() {
        churn(0x5eed, 2_000, Sieve::new, |d, _| {
            let order = d.policy.order();
            assert_eq!(order.len(), d.resident_count());
            if let Some(h) = d.policy.hand() {
                assert!(order.contains(&h), "the hand points at a resident line");
            }
        });
    }
}

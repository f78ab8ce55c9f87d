//! CLOCK (second chance): one reference bit per line and a hand that sweeps
//! the lines in the order they were admitted.
//!
//! Source: F. J. Corbató, "A Paging Experiment with the Multics System",
//! MIT Project MAC report MAC-M-384 (1968), and the second-chance description
//! in A. S. Tanenbaum, *Modern Operating Systems*, §3.4 ("The Second-Chance
//! Page Replacement Algorithm", "The Clock Page Replacement Algorithm"). No
//! parameters.
//!
//! A hit sets the line's reference bit. To find a victim the hand looks at the
//! line it points to: with the bit set, the bit is cleared and the hand moves
//! on; with the bit clear, that line is the victim. New lines take their place
//! just behind the hand, so the ring order is the admission order. This is
//! kept as a queue whose tail is the hand: a line given its second chance is
//! moved from the tail to the head, which is the same order as a ring with a
//! moving hand (the equivalence libCacheSim's `Clock.c` also uses, as
//! "FIFO-Reinsertion").
//!
//! Choices:
//! - A newly admitted line starts with its bit clear (as libCacheSim's
//!   `Clock.c`): only a hit after admission earns a second chance. (A hardware
//!   reference bit would also be set by the access that faulted the page in;
//!   with every new line marked, a full sweep clears all bits and CLOCK
//!   degenerates to FIFO under a scan.)
//! - An invalidated line (`on_remove`) leaves the ring; the hand is unaffected.
//!
//! Per-access cost: a hit is O(1); an eviction is amortized O(1) (each
//! second chance consumes a bit that a hit set).

use super::list::{Links, ListHead, TailLookahead};
use super::{one_victim_per_miss, AccessInfo, ReplacementPolicy};
use crate::addr::{LineKey, SlotId};

pub struct Clock {
    links: Links,
    /// Tail = the hand's position; head = the most recently passed line.
    ring: ListHead,
    referenced: Vec<bool>,
    second_chances: u64,
    /// The nodes the hand reaches next, walked ahead for prefetching (a
    /// hint only).
    ahead: TailLookahead,
}

impl Clock {
    pub fn new(capacity_lines: usize) -> Self {
        Clock {
            links: Links::new(capacity_lines),
            ring: ListHead::default(),
            referenced: vec![false; capacity_lines],
            second_chances: 0,
            ahead: TailLookahead::default(),
        }
    }

    /// Moves the hand: lines whose reference bit is set lose it and go
    /// round again (at most one full turn: after it every bit the hand
    /// passed is clear); the first without one is the victim.
    #[inline]
    fn hand(&mut self) -> Option<SlotId> {
        while let Some(slot) = self.links.pop_tail(&mut self.ring) {
            self.ahead.advance(&self.links, &self.ring, slot);
            if std::mem::take(&mut self.referenced[slot as usize]) {
                self.second_chances += 1;
                self.links.push_head(&mut self.ring, slot);
            } else {
                return Some(slot);
            }
        }
        None
    }

    /// Resident slots in the order the hand will reach them (for tests).
    pub fn sweep_order(&self) -> Vec<SlotId> {
        let mut v: Vec<SlotId> = self.links.iter(&self.ring).collect();
        v.reverse();
        v
    }

    /// One victim at a time: the hand's.
    #[inline]
    fn victim_for(&mut self, _key: LineKey, need_victim: bool) -> Option<SlotId> {
        if need_victim {
            self.hand()
        } else {
            None
        }
    }
}

impl ReplacementPolicy for Clock {
    fn name(&self) -> &'static str {
        "clock"
    }

    fn prefetch_hit(&self, slot: SlotId) {
        if let Some(flag) = self.referenced.get(slot as usize) {
            crate::prefetch::prefetch(flag);
        }
    }

    fn on_hit(&mut self, slot: SlotId, _info: &AccessInfo) {
        self.referenced[slot as usize] = true;
    }

    one_victim_per_miss!();

    /// The nodes the hand will reach (victims unless referenced by then).
    #[inline]
    fn next_victims(&self) -> [Option<SlotId>; 2] {
        let [soon, later] = self.ahead.next_victims();
        if let Some(flag) = later.and_then(|later| self.referenced.get(later as usize)) {
            crate::prefetch::prefetch(flag);
        }
        [soon, later]
    }

    fn on_insert(&mut self, slot: SlotId, _key: LineKey, _info: &AccessInfo) {
        self.referenced[slot as usize] = false;
        self.links.push_head(&mut self.ring, slot);
    }

    fn on_remove(&mut self, slot: SlotId) {
        self.referenced[slot as usize] = false;
        self.links.unlink(&mut self.ring, slot);
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        vec![("second_chances", self.second_chances)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::testing::{churn, Driver};

    #[test]
    fn a_referenced_line_survives_one_sweep() {
        // Capacity 3: 1 2 3 fill (ring order 1 2 3, bits 0 0 0).
        // 1 hits: bit(1)=1. 4 misses: the hand clears 1 and moves on; 2 is
        // evicted; 4 joins behind the hand: order 3 1 4.
        // 5 misses: 3 (bit 0) is evicted: order 1 4 5.
        // 2 misses: 1's bit was cleared, so 1 goes now: order 4 5 2.
        let mut d = Driver::new(Clock::new(3), 3);
        assert_eq!(d.run(&[1, 2, 3, 1, 4, 5, 2]), 1);
        assert_eq!(d.evicted, vec![2, 3, 1]);
        assert_eq!(d.resident(), vec![2, 4, 5]);
        assert_eq!(d.policy.counters(), vec![("second_chances", 1)]);
    }

    #[test]
    fn differs_from_lru() {
        // 1 2 3, hit 3 then 1 (LRU order 1 3 2, so LRU evicts 2 for 4);
        // CLOCK: bits 1 0 1, the hand clears 1, evicts 2 as well; then 5:
        // LRU evicts 3; CLOCK's hand is at 3 (bit 1): clears it, 1 (bit 0) goes.
        let seq = [1, 2, 3, 3, 1, 4, 5, 3];
        let mut d = Driver::new(Clock::new(3), 3);
        d.run(&seq);
        assert_eq!(d.evicted, vec![2, 1]);
        assert_eq!(d.hits, 3); // 3, 1, and the final 3
        let mut lru = Driver::new(crate::policy::Lru::new(3), 3);
        lru.run(&seq);
        assert_eq!(lru.evicted, vec![2, 3, 1]);
        assert_eq!(lru.hits, 2);
    }

    #[test]
    fn all_referenced_degrades_to_fifo_after_one_turn() {
        let mut d = Driver::new(Clock::new(3), 3);
        d.run(&[1, 2, 3, 1, 2, 3, 4]);
        // Every bit set: the hand clears 1, 2, 3 and comes back to 1.
        assert_eq!(d.evicted, vec![1]);
        assert_eq!(d.policy.counters(), vec![("second_chances", 3)]);
    }

    #[test]
    fn one_line_cache() {
        let mut d = Driver::new(Clock::new(1), 1);
        // 7 miss, 7 hit (bit set), 8 misses: 7 gets its second chance, is
        // alone, and goes on the second look; 8 in. 8 hit.
        assert_eq!(d.run(&[7, 7, 8, 8]), 2);
        assert_eq!(d.evicted, vec![7]);
    }

    #[test]
    fn invalidating_head_tail_and_middle() {
        let mut d = Driver::new(Clock::new(5), 5);
        d.run(&[1, 2, 3, 4, 5, 2, 4]); // bits: 2 and 4 set; hand at 1
        assert!(d.remove(1)); // at the hand
        assert!(d.remove(5)); // behind the hand
        assert!(d.remove(3)); // middle
        d.run(&[6, 7, 8]); // free slots
                           // Ring: 2 4 6 7 8. 9 misses: 2 and 4 get second chances, 6 goes.
        d.run(&[9]);
        assert_eq!(d.evicted, vec![6]);
        assert_eq!(d.resident(), vec![2, 4, 7, 8, 9]);
    }

    #[test]
    fn ring_holds_exactly_the_resident_lines() {
        churn(0xdead_beef, 2_000, Clock::new, |d, _| {
            assert_eq!(d.policy.sweep_order().len(), d.resident_count());
        });
    }
}

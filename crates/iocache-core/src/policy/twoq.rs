//! 2Q, the full version: a FIFO for lines seen once recently (A1in), a ghost
//! FIFO of keys recently pushed out of it (A1out), and an LRU queue for lines
//! re-referenced while remembered (Am).
//!
//! Source: T. Johnson, D. Shasha, "2Q: A Low Overhead High Performance Buffer
//! Management Replacement Algorithm", VLDB'94, §2 (the full version of the
//! algorithm with its `reclaimfor` routine), with the paper's recommended sizes
//! Kin = 25 % and Kout = 50 % of the buffer.
//!
//! On an access to line X:
//! - X in Am: move X to Am's head (LRU).
//! - X in A1in: nothing (a correlated reference; A1in is a FIFO).
//! - X in A1out: make room, admit X at the head of Am.
//! - otherwise: make room, admit X at the head of A1in.
//!
//! Making room (`reclaimfor`) when no slot is free: if |A1in| > Kin, the tail
//! of A1in leaves and its key goes to the head of A1out (whose tail is
//! forgotten beyond Kout keys); otherwise the tail of Am leaves, without a
//! ghost entry.
//!
//! Parameters: `2q:kin=0.25:kout=0.5`, both fractions of the cache's lines:
//! `kin` from 0 to 1, `kout` from 0 to 4. Kin = ⌊kin × lines⌋, Kout =
//! ⌊kout × lines⌋ (so a tiny cache may have Kin = 0: every line then passes
//! through A1in only until the next miss).
//!
//! Choices where the paper is silent, and deviations:
//! - A key found in A1out is removed from it when the line is admitted to Am
//!   (the paper moves X to Am and does not say whether its identifier stays
//!   in A1out; a stale identifier would only take a place in A1out).
//! - If the queue `reclaimfor` picks is empty (Am empty with |A1in| ≤ Kin,
//!   possible only with `kin=1`), the other queue gives the victim.
//! - Invalidation (`on_remove`): the line leaves A1in or Am without a ghost
//!   entry; A1out is unchanged.
//!
//! Memory: the slots' links plus Kout ghost keys with their index.

use super::probation::{probation_queue_methods, OnProbationQueues, ProbationQueues, Queue};
use super::{lines_of, AccessInfo, PolicyParams, ReplacementPolicy};
use crate::addr::{LineKey, SlotId};
use crate::error::CoreError;

pub struct TwoQ {
    kin: usize,
    /// `kin` and A1out's size as shares of the lines in service.
    shares: (f64, f64),
    /// A1in is the probation queue, Am the main queue, A1out the ghosts.
    q: ProbationQueues,
}

impl TwoQ {
    /// A 2Q cache from its parameters (`kin` 0.25 and `kout` 0.5 of the
    /// cache when absent), as the registry and the cache build it.
    pub fn from_params(params: &PolicyParams, capacity_lines: usize) -> Result<Self, CoreError> {
        let kin = params.f64_or("kin", 0.25, 0.0..=1.0)?;
        let kout = params.f64_or("kout", 0.5, 0.0..=4.0)?;
        Ok(Self::new(capacity_lines, kin, kout))
    }

    /// A 2Q cache of `capacity_lines` with A1in and A1out sized as fractions of it.
    pub fn new(capacity_lines: usize, kin: f64, kout: f64) -> Self {
        TwoQ {
            kin: lines_of(kin, capacity_lines),
            shares: (kin, kout),
            q: ProbationQueues::new(capacity_lines, lines_of(kout, capacity_lines)),
        }
    }

    /// Sizes of (A1in, Am, A1out).
    pub fn queue_sizes(&self) -> (usize, usize, usize) {
        self.q.sizes()
    }

    /// (Kin, Kout) in lines.
    pub fn limits(&self) -> (usize, usize) {
        (self.kin, self.q.ghost.limit())
    }

    /// Whether `key` is remembered in A1out.
    pub fn in_a1out(&self, key: &LineKey) -> bool {
        self.q.ghost.contains(key)
    }

    fn reclaim_from_a1in(&self) -> bool {
        (self.q.probation.len as usize > self.kin && self.q.probation.len > 0) || self.q.main.len == 0
    }
}

impl OnProbationQueues for TwoQ {
    fn queues(&mut self) -> &mut ProbationQueues {
        &mut self.q
    }

    /// The paper's `reclaimfor`: A1in's oldest while A1in is over Kin,
    /// else Am's.
    fn make_room(&mut self) -> Option<SlotId> {
        let queue = if self.reclaim_from_a1in() {
            Queue::Probation
        } else {
            Queue::Main
        };
        let slot = self.q.pop_tail(queue)?;
        Some(self.q.evicted(slot, queue))
    }
}

impl ReplacementPolicy for TwoQ {
    fn name(&self) -> &'static str {
        "2q"
    }

    fn on_hit(&mut self, slot: SlotId, _info: &AccessInfo) {
        match self.q.queue_of[slot as usize] {
            Queue::Main => self.q.links.move_to_head(&mut self.q.main, slot),
            Queue::Probation => {}
            Queue::None => debug_assert!(false, "hit on a slot 2Q does not hold"),
        }
    }

    probation_queue_methods!();

    fn on_insert(&mut self, slot: SlotId, key: LineKey, _info: &AccessInfo) {
        self.q.insert(slot, key);
    }

    /// The next lines of the queue `make_room` will probably take from, and,
    /// for A1in, where the soon one's key will go in A1out. Asked between
    /// a miss and its insertion, so the incoming line is counted in the
    /// queue it is about to join: otherwise, with A1in at Kin after the
    /// reclaim, the guess would be Am and the next reclaim take A1in (the
    /// guess was right for one reclaim in five on P2 that way).
    fn next_victims(&self) -> [Option<SlotId>; 2] {
        let (a1in, am) = if self.q.incoming_to_main {
            (self.q.probation.len as usize, self.q.main.len as usize + 1)
        } else {
            (self.q.probation.len as usize + 1, self.q.main.len as usize)
        };
        let from_a1in = a1in > self.kin || am == 0;
        self.q.next_victims(from_a1in, |later| {
            crate::prefetch::prefetch_address(self.q.queue_of.as_ptr().wrapping_add(later as usize) as usize);
        })
    }

    fn set_lines_in_service(&mut self, lines: usize) {
        self.kin = lines_of(self.shares.0, lines);
        self.q.ghost.set_limit(lines_of(self.shares.1, lines));
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        vec![("a1out_hits", self.q.ghost_hits)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::testing::{key, Driver, XorShift};
    use crate::policy::Lru;

    fn twoq(capacity: usize) -> Driver<TwoQ> {
        Driver::new(TwoQ::new(capacity, 0.25, 0.5), capacity)
    }

    #[test]
    fn sizes_follow_the_parameters() {
        assert_eq!(TwoQ::new(8, 0.25, 0.5).limits(), (2, 4));
        assert_eq!(TwoQ::new(1, 0.25, 0.5).limits(), (0, 0));
        assert_eq!(TwoQ::new(10, 0.25, 0.5).limits(), (2, 5));
    }

    #[test]
    fn a_line_seen_twice_enters_am_through_a1out() {
        // Capacity 4: Kin = 1, Kout = 2.
        // 1 2 3 4 fill A1in (new..old 4 3 2 1). 1 hits: nothing moves.
        // 5: |A1in| = 4 > 1: 1 leaves, A1out = [1]. A1in 5 4 3 2.
        // 1: in A1out -> reclaim: |A1in| = 4 > 1: 2 leaves, A1out = [2];
        //    1 enters Am.
        // 6: |A1in| = 3 > 1: 3 leaves, A1out = [3, 2].
        // 7: 4 leaves, A1out = [4, 3] (2 forgotten beyond Kout = 2).
        // 8: |A1in| = 3 (7 6 5) > 1: 5 leaves, A1out = [5, 4].
        // 9: 6 leaves, A1out = [6, 5]. A1in 9 8 7, Am 1.
        // 1 hits (in Am).
        let mut d = twoq(4);
        assert_eq!(d.run(&[1, 2, 3, 4, 1, 5, 1, 6, 7, 8, 9, 1]), 2);
        assert_eq!(d.evicted, vec![1, 2, 3, 4, 5, 6]);
        assert_eq!(d.policy.queue_sizes(), (3, 1, 2));
        assert!(d.policy.in_a1out(&key(6)) && d.policy.in_a1out(&key(5)));
        assert!(!d.policy.in_a1out(&key(1)), "taken out when admitted to Am");
        assert_eq!(d.policy.counters(), vec![("a1out_hits", 1)]);
    }

    #[test]
    fn am_is_evicted_only_when_a1in_is_within_kin() {
        // Capacity 4, Kin = 1: get 1, 2, 3 into Am through A1out, then check
        // that Am's LRU is evicted once A1in holds at most one line.
        let mut d = twoq(4);
        // 1 2 3 4 5 6 fill and push 1 2 to A1out (A1in 6 5 4 3).
        d.run(&[1, 2, 3, 4, 5, 6]);
        assert_eq!(d.evicted, vec![1, 2]);
        // 1: A1out hit; A1in 4 > 1: 3 out (A1out [3, 2]); Am [1].
        // 2: A1out hit; A1in 3 > 1: 4 out (A1out [4, 3]); Am [2, 1].
        // 3: A1out hit; A1in 2 > 1: 5 out (A1out [5, 4]); Am [3, 2, 1]; A1in [6].
        d.run(&[1, 2, 3]);
        assert_eq!(d.evicted, vec![1, 2, 3, 4, 5]);
        assert_eq!(d.policy.queue_sizes(), (1, 3, 2));
        // 1 hits (Am 1 3 2). 7: |A1in| = 1, not > Kin: Am's LRU (2) leaves
        // without a ghost entry. A1in 7 6.
        d.run(&[1, 7]);
        assert_eq!(d.evicted, vec![1, 2, 3, 4, 5, 2]);
        assert!(!d.policy.in_a1out(&key(2)));
        assert_eq!(d.policy.queue_sizes(), (2, 2, 2));
    }

    #[test]
    fn resists_a_scan_that_flushes_lru() {
        // Capacity 8 (Kin 2, Kout 4).
        // 100 101 200..=205 fill A1in; 206 pushes 100 out (A1out [100]).
        // 100: A1out hit -> Am; 101 leaves A1in (A1out [101]).
        // 101: A1out hit -> Am; 200 leaves A1in. Am = 101 100, A1in 6 lines.
        // The scan 0..20 only cycles A1in (|A1in| = 6 > Kin each time), so the
        // pair still hits at the end: 2 hits.
        // LRU: 9 distinct lines evict 100 at 206; 100 then evicts 101, 101
        // evicts 200, and the scan flushes the pair: 0 hits.
        let mut seq: Vec<u64> = vec![100, 101];
        seq.extend(200..207);
        seq.extend([100, 101]);
        seq.extend(0..20);
        seq.extend([100, 101]);
        let mut q = twoq(8);
        let mut lru = Driver::new(Lru::new(8), 8);
        q.run(&seq);
        lru.run(&seq);
        assert_eq!(lru.hits, 0);
        assert_eq!(q.hits, 2);
        assert_eq!(q.policy.queue_sizes(), (6, 2, 4));
        assert_eq!(&q.evicted[..3], &[100, 101, 200]);
    }

    #[test]
    fn one_line_cache() {
        // Kin = 0, Kout = 0: every miss evicts the A1in line, nothing is remembered.
        let mut d = twoq(1);
        assert_eq!(d.run(&[7, 7, 8, 7, 7]), 2);
        assert_eq!(d.evicted, vec![7, 8]);
        assert_eq!(d.policy.queue_sizes(), (1, 0, 0));
    }

    #[test]
    fn invalidating_head_tail_and_middle() {
        let mut d = twoq(4);
        d.run(&[1, 2, 3, 4, 5, 1]); // 1 -> A1out -> Am; A1in 5 4 3 (2 -> A1out)
        assert_eq!(d.policy.queue_sizes(), (3, 1, 1));
        assert!(d.remove(3)); // A1in tail
        assert!(d.remove(5)); // A1in head
        assert!(d.remove(1)); // Am (its only line)
        assert_eq!(d.policy.queue_sizes(), (1, 0, 1));
        assert!(!d.policy.in_a1out(&key(1)), "invalidation leaves no ghost");
        d.run(&[6, 7, 8]); // free slots: A1in 8 7 6 4
        d.run(&[2]); // A1out hit: 4 leaves A1in; 2 enters Am
        assert_eq!(d.evicted, vec![1, 2, 4]);
        assert!(d.remove(7)); // A1in middle
        assert_eq!(d.policy.queue_sizes(), (2, 1, 1));
    }

    #[test]
    fn queues_stay_within_bounds() {
        let mut rng = XorShift(0x2_0_2_0);
        for capacity in 1..10usize {
            for (kin, kout) in [(0.25, 0.5), (0.0, 0.0), (1.0, 2.0), (0.5, 4.0)] {
                let mut d = Driver::new(TwoQ::new(capacity, kin, kout), capacity);
                let (_, k_out) = d.policy.limits();
                for _ in 0..1_500 {
                    d.random_step(&mut rng, 4 * capacity as u64, 10);
                    let (a1in, am, a1out) = d.policy.queue_sizes();
                    assert_eq!(a1in + am, d.resident_count());
                    assert!(a1in + am <= capacity);
                    assert!(a1out <= k_out);
                }
            }
        }
    }
}

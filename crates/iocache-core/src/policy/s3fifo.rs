//! S3-FIFO: a small FIFO S that filters new lines, a main FIFO M with
//! reinsertion, and a ghost FIFO G of keys recently dropped from S.
//!
//! Source: J. Yang, Y. Zhang, Z. Qiu, Y. Yue, K. V. Rashmi, "FIFO queues are
//! all you need for cache eviction", SOSP'23, §4 and Algorithm 1; sizes as
//! recommended there (S = 10 % of the cache, G holds as many keys as M).
//!
//! Algorithm 1, as implemented here:
//! - Each resident line has a frequency counter, 0 on admission, incremented
//!   by each hit and capped at 3.
//! - A miss whose key is in G is admitted to the head of M (and leaves G);
//!   any other miss is admitted to the head of S.
//! - To make room: if |S| ≥ small target, evict from S, else from M.
//! - Evicting from S looks at S's tail: a line with freq > `threshold` moves
//!   to the head of M with its counter cleared, and the next tail is examined;
//!   the first line with freq ≤ `threshold` is the victim and its key goes to
//!   G. If S runs empty, M gives the victim.
//! - Evicting from M looks at M's tail: a line with freq > 0 is reinserted at
//!   M's head with freq − 1; the first line with freq 0 is the victim.
//!
//! Parameters: `s3fifo:small=0.1:threshold=1:ghost=G`.
//! - `small` (0 to 1, default 0.1): S's target, ⌊small × lines⌋.
//! - `threshold` (0 to 2, default 1): a line leaves S for M when its freq is
//!   greater than this. Algorithm 1 line 23 reads "if t.freq > 1", so the
//!   default moves a line to M only if it was hit at least twice while in S;
//!   this matches the authors' simulator (libCacheSim `S3FIFOv0.c`,
//!   `move-to-main-threshold=2` tested as `freq >= 2`). The paper's prose
//!   ("accessed more than once", counting the access that admitted it) and
//!   several third-party implementations use "hit at least once":
//!   `threshold=0` gives that variant.
//! - `ghost` (0 to 4): G's size as a fraction of the cache, ⌊ghost × lines⌋
//!   keys. By default G holds as many keys as M's share of the cache
//!   (lines − ⌊small × lines⌋, so 90 % with the default `small`), as the paper
//!   sizes it.
//!
//! Deviations and choices:
//! - One victim per miss. Algorithm 1's EVICTS calls EVICTM whenever a line
//!   moved to a full M, and then keeps going until S itself drops a line, so
//!   one miss can free several slots. Here, as in the authors' simulator,
//!   moving a line to M never evicts by itself: M may exceed its share for a
//!   while, S is correspondingly below its target, and the next misses evict
//!   from M until the split is back (|S| ≥ target ⇔ |M| ≤ lines − target
//!   when the cache is full). The cache therefore stays full.
//! - The counter is cleared when a line moves from S to M (the authors'
//!   description: "its access bits are cleared during the move"; in their
//!   simulator the moved object is a new M object with freq 0). Algorithm 1 is
//!   silent on it.
//! - Invalidation (`on_remove`): the line leaves S or M without entering G.
//!
//! Per-access cost: O(1) per hit; amortized O(1) per eviction (every move and
//! reinsertion consumes counts that hits added).

use super::probation::{probation_queue_methods, OnProbationQueues, ProbationQueues, Queue};
use super::{lines_of, AccessInfo, PolicyParams, ReplacementPolicy};
use crate::addr::{LineKey, SlotId};
use crate::error::CoreError;

pub struct S3Fifo {
    small_target: usize,
    /// S's and G's sizes as shares of the lines in service (G: M's share
    /// when `None`).
    shares: (f64, Option<f64>),
    threshold: u8,
    freq: Vec<u8>,
    /// S is the probation queue, M the main queue, G the ghosts.
    q: ProbationQueues,
    moved_to_main: u64,
    reinsertions: u64,
}

const FREQ_MAX: u8 = 3;

impl S3Fifo {
    /// An S3-FIFO cache from its parameters (`small` 0.1, `threshold` 1,
    /// and G as large as M when absent), as the registry and the cache
    /// build it.
    pub fn from_params(params: &PolicyParams, capacity_lines: usize) -> Result<Self, CoreError> {
        let small = params.f64_or("small", 0.1, 0.0..=1.0)?;
        let threshold = params.u64_or("threshold", 1, 0..=2)? as u8;
        // Absent: as many ghost keys as M has lines (the paper's sizing).
        let ghost = match params.get("ghost") {
            Some(_) => Some(params.f64_or("ghost", 0.9, 0.0..=4.0)?),
            None => None,
        };
        Ok(Self::new(capacity_lines, small, threshold, ghost))
    }

    /// `small` and `ghost` are fractions of `capacity_lines`; with no `ghost`,
    /// G holds as many keys as M's share of the cache.
    pub fn new(capacity_lines: usize, small: f64, threshold: u8, ghost: Option<f64>) -> Self {
        let small_target = lines_of(small, capacity_lines);
        let ghost_lines = match ghost {
            Some(g) => lines_of(g, capacity_lines),
            None => capacity_lines - small_target,
        };
        S3Fifo {
            small_target,
            shares: (small, ghost),
            threshold,
            freq: vec![0; capacity_lines],
            q: ProbationQueues::new(capacity_lines, ghost_lines),
            moved_to_main: 0,
            reinsertions: 0,
        }
    }

    /// Sizes of (S, M, G).
    pub fn queue_sizes(&self) -> (usize, usize, usize) {
        self.q.sizes()
    }

    /// (S's target, G's capacity) in lines.
    pub fn limits(&self) -> (usize, usize) {
        (self.small_target, self.q.ghost.limit())
    }

    pub fn in_ghost(&self, key: &LineKey) -> bool {
        self.q.ghost.contains(key)
    }

    /// Resident slots of S and of M, each from head (newest) to tail.
    pub fn queues(&self) -> (Vec<SlotId>, Vec<SlotId>) {
        (
            self.q.links.iter(&self.q.probation).collect(),
            self.q.links.iter(&self.q.main).collect(),
        )
    }

    pub fn freq(&self, slot: SlotId) -> u8 {
        self.freq[slot as usize]
    }

    fn evict_small(&mut self) -> Option<SlotId> {
        while let Some(t) = self.q.pop_tail(Queue::Probation) {
            if self.freq[t as usize] > self.threshold {
                self.freq[t as usize] = 0;
                self.q.push_head(Queue::Main, t);
                self.moved_to_main += 1;
            } else {
                return Some(self.q.evicted(t, Queue::Probation));
            }
        }
        None
    }

    fn evict_main(&mut self) -> Option<SlotId> {
        while let Some(t) = self.q.pop_tail(Queue::Main) {
            let f = &mut self.freq[t as usize];
            if *f > 0 {
                *f -= 1;
                self.q.push_head(Queue::Main, t);
                self.reinsertions += 1;
            } else {
                return Some(self.q.evicted(t, Queue::Main));
            }
        }
        None
    }
}

impl OnProbationQueues for S3Fifo {
    fn queues(&mut self) -> &mut ProbationQueues {
        &mut self.q
    }

    /// From S while it is at or over its target, else from M; either
    /// gives way to the other when it has no victim.
    fn make_room(&mut self) -> Option<SlotId> {
        if self.q.probation.len as usize >= self.small_target {
            if let Some(victim) = self.evict_small() {
                return Some(victim);
            }
        }
        self.evict_main().or_else(|| self.evict_small())
    }
}

impl ReplacementPolicy for S3Fifo {
    fn name(&self) -> &'static str {
        "s3fifo"
    }

    fn on_hit(&mut self, slot: SlotId, _info: &AccessInfo) {
        let f = &mut self.freq[slot as usize];
        *f = (*f + 1).min(FREQ_MAX);
    }

    probation_queue_methods!();

    /// The next lines of the queue `make_room` will probably take from (S
    /// while it is at or over its target), and, for S, where the soon
    /// one's key will go in G. Asked between a miss and its insertion:
    /// the incoming line is counted in the queue it is about to join.
    #[inline]
    fn next_victims(&self) -> [Option<SlotId>; 2] {
        let small = self.q.probation.len as usize + usize::from(!self.q.incoming_to_main);
        self.q.next_victims(small >= self.small_target, |later| {
            if let Some(flag) = self.freq.get(later as usize) {
                crate::prefetch::prefetch(flag);
            }
        })
    }

    fn on_insert(&mut self, slot: SlotId, key: LineKey, _info: &AccessInfo) {
        self.freq[slot as usize] = 0;
        self.q.insert(slot, key);
    }

    fn set_lines_in_service(&mut self, lines: usize) {
        self.small_target = lines_of(self.shares.0, lines);
        self.q.ghost.set_limit(match self.shares.1 {
            Some(g) => lines_of(g, lines),
            None => lines - self.small_target,
        });
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("moved_to_main", self.moved_to_main),
            ("ghost_hits", self.q.ghost_hits),
            ("main_reinsertions", self.reinsertions),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::testing::{key, Driver, XorShift};
    use crate::policy::Lru;

    fn s3(capacity: usize) -> Driver<S3Fifo> {
        Driver::new(S3Fifo::new(capacity, 0.1, 1, None), capacity)
    }

    #[test]
    fn sizes_follow_the_parameters() {
        assert_eq!(S3Fifo::new(10, 0.1, 1, None).limits(), (1, 9));
        assert_eq!(S3Fifo::new(1024, 0.1, 1, None).limits(), (102, 922));
        assert_eq!(S3Fifo::new(1, 0.1, 1, None).limits(), (0, 1));
        assert_eq!(S3Fifo::new(30, 0.1, 1, Some(0.9)).limits(), (3, 27));
    }

    #[test]
    fn lines_hit_twice_in_s_move_to_m_others_go_to_g() {
        // Capacity 10: S target 1, G 9 keys. Lines 1..=10 fill S (new..old
        // 10 .. 1). 1 is hit twice (freq 2), 2 once (freq 1).
        // 11: |S| = 10 ≥ 1: S's tail 1 has freq 2 > 1: moves to M (freq 0);
        //     2 has freq 1 ≤ 1: evicted, key 2 -> G. S = 11 10 .. 3, M = 1.
        // 2: in G -> admitted to M's head; |S| = 9 ≥ 1: 3 evicted to G.
        let mut d = s3(10);
        d.run(&(1..=10).collect::<Vec<_>>());
        d.run(&[1, 1, 2, 11]);
        assert_eq!(d.evicted, vec![2]);
        assert_eq!(d.policy.queue_sizes(), (9, 1, 1));
        assert!(d.policy.in_ghost(&key(2)));
        assert_eq!(d.policy.freq(d.slot_of(1).unwrap()), 0, "cleared by the move");
        d.run(&[2]);
        assert_eq!(d.evicted, vec![2, 3]);
        let (_, main) = d.policy.queues();
        assert_eq!(main, vec![d.slot_of(2).unwrap(), d.slot_of(1).unwrap()]);
        assert!(!d.policy.in_ghost(&key(2)));
        assert!(d.policy.in_ghost(&key(3)));
        assert_eq!(
            d.policy.counters(),
            vec![("moved_to_main", 1), ("ghost_hits", 1), ("main_reinsertions", 0)]
        );
    }

    #[test]
    fn threshold_zero_moves_lines_hit_once() {
        let mut d = Driver::new(S3Fifo::new(10, 0.1, 0, None), 10);
        d.run(&(1..=10).collect::<Vec<_>>());
        d.run(&[1, 2, 11]); // 1 and 2 hit once: both move to M; 3 is evicted
        assert_eq!(d.evicted, vec![3]);
        assert_eq!(d.policy.queue_sizes(), (8, 2, 1));
    }

    #[test]
    fn main_reinserts_with_decrement() {
        // Capacity 10. Fill 1..=10, hit 1..=9 twice each: every one of them
        // moves to M when S is evicted.
        let mut d = s3(10);
        d.run(&(1..=10).collect::<Vec<_>>());
        for _ in 0..2 {
            d.run(&(1..=9).collect::<Vec<_>>());
        }
        // 11: S's tail 1..9 all move to M (freq cleared), 10 (freq 0) -> G.
        d.run(&[11]);
        assert_eq!(d.evicted, vec![10]);
        assert_eq!(d.policy.queue_sizes(), (1, 9, 1));
        // 5 hit three times (freq 3), 6 once (freq 1).
        d.run(&[5, 5, 5, 6]);
        // 12: |S| = 1 ≥ 1: S's tail 11 (freq 0) -> evicted to G.
        d.run(&[12]);
        assert_eq!(d.evicted, vec![10, 11]);
        // 13: S's tail 12 -> G. 14: the same for 13. S keeps cycling while
        // M is untouched: M only loses lines when S is below its target.
        d.run(&[13, 14]);
        assert_eq!(d.evicted, vec![10, 11, 12, 13]);
        // 10 is in G: admitted to M; |S| = 1 ≥ 1 so S's tail 14 is evicted.
        d.run(&[10]);
        assert_eq!(d.evicted, vec![10, 11, 12, 13, 14]);
        assert_eq!(d.policy.queue_sizes(), (0, 10, 4));
        // 15: |S| = 0 ≥ 1 fails: evict from M. M (head..tail): 10 9 .. 1;
        // tail 1 (freq 0) -> evicted.
        d.run(&[15]);
        assert_eq!(d.evicted.last(), Some(&1));
        // Ghost hits now go to M and force evictions from it.
        d.run(&[11]); // enters M; S [15] is the victim (|S| = 1 ≥ 1)
        assert_eq!(d.evicted.last(), Some(&15));
        d.run(&[12]); // |S| = 0: M's tail 2 (freq 0) is evicted
        assert_eq!(d.evicted.last(), Some(&2));
        d.run(&[13, 14]); // M's tails 3, 4 are evicted
        assert_eq!(d.evicted[d.evicted.len() - 2..], [3, 4]);
        // Next M tail is 5 (freq 3): reinserted with 2; then 6 (freq 1):
        // reinserted with 0; then 7 (freq 0) is evicted.
        d.run(&[15]); // 15 is in G
        assert_eq!(d.evicted.last(), Some(&7));
        assert_eq!(d.policy.freq(d.slot_of(5).unwrap()), 2);
        assert_eq!(d.policy.freq(d.slot_of(6).unwrap()), 0);
        assert_eq!(d.policy.counters()[2], ("main_reinsertions", 2));
    }

    #[test]
    fn a_scan_passes_through_s_and_spares_m() {
        // Capacity 10 (S target 1). Ten hot lines are accessed three times
        // (freq 2 each), all in S. 0: S's tail moves line after line to M
        // until S is empty, so M gives the victim: its tail, 100 (moved first).
        // The scan of 49 new lines then only cycles through S (|S| = 1 ≥ 1 at
        // each miss): M keeps 101..=109, which all hit afterwards. LRU loses
        // them all to the scan.
        let mut d = s3(10);
        let hot: Vec<u64> = (100..110).collect();
        for _ in 0..3 {
            d.run(&hot);
        }
        d.run(&[0]);
        assert_eq!(d.evicted, vec![100]);
        assert_eq!(d.policy.queue_sizes(), (1, 9, 0));
        let scan: Vec<u64> = (1..50).collect();
        d.run(&scan);
        assert_eq!(d.evicted[1..], (0..49).collect::<Vec<u64>>()[..]);
        assert_eq!(d.run(&hot[1..]), 9, "the hot lines survived the scan");
        let mut lru = Driver::new(Lru::new(10), 10);
        for _ in 0..3 {
            lru.run(&hot);
        }
        lru.run(&[0]);
        lru.run(&scan);
        assert_eq!(lru.run(&hot[1..]), 0);
    }

    #[test]
    fn one_line_cache() {
        // S target 0, G 1 key (M's share is the whole line): S gives the
        // victim whenever it holds a line.
        let mut d = s3(1);
        assert_eq!(d.run(&[7, 7, 7, 8, 8, 7]), 3);
        // 8: S's tail 7 has freq 2 > 1: moves to M; S empty -> M evicts 7.
        // 7: S's tail 8 has freq 1 -> evicted, key 8 -> G.
        assert_eq!(d.evicted, vec![7, 8]);
        assert_eq!(d.policy.queue_sizes(), (1, 0, 1));
        // 8: in G, enters M; S's tail 7 (freq 0) -> G, replacing 8.
        d.run(&[8]);
        assert_eq!(d.policy.queue_sizes(), (0, 1, 1));
        assert!(d.policy.in_ghost(&key(7)));
    }

    #[test]
    fn invalidating_head_tail_and_middle() {
        let mut d = s3(10);
        d.run(&(1..=10).collect::<Vec<_>>());
        d.run(&[1, 1, 2, 2, 3, 3, 11]); // 1 2 3 move to M; 4 -> G
        assert_eq!(d.evicted, vec![4]);
        let (_, main) = d.policy.queues(); // M: 3 2 1
        assert_eq!(main.len(), 3);
        assert!(d.remove(1)); // M tail
        assert!(d.remove(3)); // M head
        assert!(d.remove(11)); // S head
        assert!(d.remove(5)); // S tail
        assert!(d.remove(8)); // S middle
        assert_eq!(d.policy.queue_sizes(), (4, 1, 1));
        assert!(!d.policy.in_ghost(&key(5)), "invalidation leaves no ghost");
        d.run(&[20, 21, 22, 23, 24]); // free slots
        d.run(&[25]); // |S| = 9 ≥ 1: S's tail 6 -> G
        assert_eq!(d.evicted, vec![4, 6]);
    }

    #[test]
    fn queues_stay_within_bounds() {
        let mut rng = XorShift(0x53f1f0);
        for capacity in 1..14usize {
            for (small, threshold, ghost) in [
                (0.1, 1, None),
                (0.0, 0, Some(0.0)),
                (1.0, 2, Some(4.0)),
                (0.5, 2, Some(0.5)),
            ] {
                let mut d = Driver::new(S3Fifo::new(capacity, small, threshold, ghost), capacity);
                let (_, g) = d.policy.limits();
                for _ in 0..1_500 {
                    d.random_step(&mut rng, 4 * capacity as u64, 10);
                    let (s, m, gl) = d.policy.queue_sizes();
                    assert_eq!(s + m, d.resident_count());
                    assert!(gl <= g);
                    let (sq, mq) = d.policy.queues();
                    assert!(sq.iter().chain(&mq).all(|&slot| d.policy.freq(slot) <= FREQ_MAX));
                    for slot in sq.iter().chain(&mq) {
                        let k = key(d.slots_line(*slot));
                        assert!(!d.policy.in_ghost(&k), "a resident line is not a ghost");
                    }
                }
            }
        }
    }
}

//! Promotion: deciding whether a missed line is inserted at all.
//!
//! `nhit:N` counts misses per line in a bounded history, as Open CAS's nhit
//! promotion policy does (`src/promotion/nhit/` in OCF: a hash of recently
//! missed core lines sized at twice the cache's lines, `NHIT_MAPPING_RATIO 2`,
//! default threshold 3, trigger at 80 % occupancy). The history here is a ring
//! of `2 × cache lines` entries: a new line overwrites the oldest entry, so the
//! memory is fixed and lines not missed again within that window are forgotten.

use crate::addr::LineKey;
use crate::config::Promotion;
use crate::fasthash::{map_with_capacity, FxHashMap};

/// History entries per cache line (OCF's `NHIT_MAPPING_RATIO`).
pub const NHIT_HISTORY_PER_LINE: usize = 2;

pub struct Promoter {
    policy: Promotion,
    capacity_lines: u64,
    ring: Vec<Option<(LineKey, u32)>>,
    next: usize,
    index: FxHashMap<LineKey, usize>,
}

impl Promoter {
    pub fn new(policy: Promotion, capacity_lines: u64) -> Self {
        let history = match policy {
            Promotion::Always => 0,
            Promotion::NHit { .. } => (capacity_lines as usize)
                .saturating_mul(NHIT_HISTORY_PER_LINE)
                .max(1),
        };
        Promoter {
            policy,
            capacity_lines,
            ring: vec![None; history],
            next: 0,
            index: map_with_capacity(history),
        }
    }

    /// Records a miss on `key` and says whether to insert it now.
    #[inline]
    pub fn should_promote(&mut self, key: LineKey, resident_lines: u64) -> bool {
        match self.policy {
            Promotion::Always => true,
            Promotion::NHit { .. } => self.should_promote_nhit(key, resident_lines),
        }
    }

    fn should_promote_nhit(&mut self, key: LineKey, resident_lines: u64) -> bool {
        let Promotion::NHit {
            threshold,
            trigger_percent,
        } = self.policy
        else {
            return true;
        };
        if resident_lines * 100 < self.capacity_lines * trigger_percent as u64 {
            return true;
        }
        let count = match self.index.get(&key) {
            Some(&at) => {
                let entry = self.ring[at].as_mut().expect("indexed entry exists");
                entry.1 += 1;
                entry.1
            }
            None => {
                let at = self.next;
                self.next = (self.next + 1) % self.ring.len();
                if let Some((old, _)) = self.ring[at].take() {
                    self.index.remove(&old);
                }
                self.ring[at] = Some((key, 1));
                self.index.insert(key, at);
                1
            }
        };
        if count >= threshold {
            self.forget(key);
            true
        } else {
            false
        }
    }

    /// Drops the history of `key` (it was promoted).
    pub fn forget(&mut self, key: LineKey) {
        if let Some(at) = self.index.remove(&key) {
            self.ring[at] = None;
        }
    }

    /// Lines currently remembered.
    pub fn history_len(&self) -> usize {
        self.index.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(i: u64) -> LineKey {
        LineKey {
            volume: 0,
            line_index: i,
        }
    }

    #[test]
    fn always_promotes() {
        let mut p = Promoter::new(Promotion::Always, 4);
        assert!(p.should_promote(key(1), 0));
        assert_eq!(p.history_len(), 0);
    }

    #[test]
    fn nhit_promotes_on_nth_miss() {
        let nhit = Promotion::NHit {
            threshold: 3,
            trigger_percent: 0,
        };
        let mut p = Promoter::new(nhit, 4);
        assert!(!p.should_promote(key(1), 0));
        assert!(!p.should_promote(key(1), 0));
        assert!(p.should_promote(key(1), 0));
        // Promotion resets the count.
        assert!(!p.should_promote(key(1), 0));
    }

    #[test]
    fn nhit_history_is_bounded_and_forgets_oldest() {
        let nhit = Promotion::NHit {
            threshold: 2,
            trigger_percent: 0,
        };
        // 2 cache lines -> 4 history entries.
        let mut p = Promoter::new(nhit, 2);
        for i in 0..4 {
            assert!(!p.should_promote(key(i), 0));
        }
        assert!(!p.should_promote(key(99), 0)); // overwrites key 0's entry
        assert_eq!(p.history_len(), 4);
        assert!(!p.should_promote(key(0), 0), "key 0 was forgotten");
        assert!(p.should_promote(key(2), 0), "key 2 still remembered");
    }

    #[test]
    fn nhit_trigger_promotes_everything_below_occupancy() {
        let nhit = Promotion::NHit {
            threshold: 3,
            trigger_percent: 50,
        };
        let mut p = Promoter::new(nhit, 10);
        assert!(p.should_promote(key(1), 4));
        assert!(!p.should_promote(key(1), 5));
    }
}

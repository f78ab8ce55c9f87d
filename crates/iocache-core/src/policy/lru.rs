//! Least-recently-used replacement: one queue, hits move to the head, the tail is evicted.

use super::list::{Links, ListHead, TailLookahead};
use super::{one_victim_per_miss, AccessInfo, ReplacementPolicy};
use crate::addr::{LineKey, SlotId};

pub struct Lru {
    links: Links,
    queue: ListHead,
    /// The next victims, walked ahead for prefetching (a hint only).
    ahead: TailLookahead,
}

impl Lru {
    pub fn new(capacity_lines: usize) -> Self {
        Lru {
            links: Links::new(capacity_lines),
            queue: ListHead::default(),
            ahead: TailLookahead::default(),
        }
    }

    /// Resident slots from most to least recently used (for tests and inspection).
    pub fn order(&self) -> Vec<SlotId> {
        self.links.iter(&self.queue).collect()
    }

    /// The tail, when a victim is needed: LRU evicts one line at a time.
    #[inline(always)]
    pub(super) fn victim_for(&mut self, _key: LineKey, need_victim: bool) -> Option<SlotId> {
        if !need_victim {
            return None;
        }
        let victim = self.links.pop_tail(&mut self.queue)?;
        self.ahead.advance(&self.links, &self.queue, victim);
        Some(victim)
    }
}

impl ReplacementPolicy for Lru {
    fn name(&self) -> &'static str {
        "lru"
    }

    #[inline]
    fn on_hit(&mut self, slot: SlotId, _info: &AccessInfo) {
        self.links.move_to_head(&mut self.queue, slot);
    }

    #[inline]
    fn prefetch_hit(&self, slot: SlotId) {
        self.links.prefetch(slot);
    }

    one_victim_per_miss!();

    #[inline]
    fn on_insert(&mut self, slot: SlotId, _key: LineKey, _info: &AccessInfo) {
        self.links.push_head(&mut self.queue, slot);
    }

    fn on_remove(&mut self, slot: SlotId) {
        self.links.unlink(&mut self.queue, slot);
    }

    #[inline]
    fn next_victims(&self) -> [Option<SlotId>; 2] {
        self.ahead.next_victims()
    }
}

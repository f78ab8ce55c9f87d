//! Least-recently-used replacement: one queue, hits move to the head, the tail is evicted.

use super::list::{Links, ListHead, NIL};
use super::{AccessInfo, ReplacementPolicy};
use crate::addr::{LineKey, SlotId};

pub struct Lru {
    links: Links,
    queue: ListHead,
}

impl Lru {
    pub fn new(capacity_lines: usize) -> Self {
        Lru {
            links: Links::new(capacity_lines),
            queue: ListHead::default(),
        }
    }

    /// Resident slots from most to least recently used (for tests and inspection).
    pub fn order(&self) -> Vec<SlotId> {
        self.links.iter(&self.queue).collect()
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

    #[inline]
    fn on_miss(&mut self, _key: LineKey, need_victim: bool, _info: &AccessInfo, victims: &mut Vec<SlotId>) {
        if need_victim {
            if let Some(victim) = self.links.pop_tail(&mut self.queue) {
                victims.push(victim);
            }
        }
    }

    #[inline]
    fn on_insert(&mut self, slot: SlotId, _key: LineKey, _info: &AccessInfo) {
        self.links.push_head(&mut self.queue, slot);
    }

    fn on_remove(&mut self, slot: SlotId) {
        self.links.unlink(&mut self.queue, slot);
    }

    #[inline]
    fn next_victims(&self) -> [Option<SlotId>; 2] {
        let first = self.queue.tail;
        if first == NIL {
            return [None, None];
        }
        let second = self.links.prev(first);
        // The eviction after next will rewrite the links of the node after `second`.
        self.links.prefetch(second);
        [Some(first), (second != NIL).then_some(second)]
    }
}

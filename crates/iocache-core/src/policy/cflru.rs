//! CFLRU (Clean-First LRU), after S. Park, D. Jung, J. Kang, J. Kim and J. Lee,
//! "CFLRU: a replacement algorithm for flash memory", CASES'06 (§3).
//!
//! One LRU list, whose `window` least recently used pages form the
//! *clean-first region* (the rest is the working region). To replace, the
//! least recently used *clean* page inside the clean-first region is evicted,
//! since dropping it costs no flash write; if the region holds no clean page,
//! the LRU page (dirty) is evicted. Pages outside the region are never chosen
//! ahead of the LRU page, whatever their state.
//!
//! Parameter: `window`, the clean-first region's size as a fraction of the
//! cache (default 0.25, rounded to whole lines). The paper studies the window
//! size as a tunable (and a dynamic variant, not implemented here); the default
//! is this implementation's choice. `window=0` is plain LRU.
//!
//! Notes:
//! - Clean or dirty comes from the cache: `AccessInfo::dirty` on insert and
//!   hit, `on_clean` when a flush (or a write to the backend) cleans a line.
//!   Under write policy `wo` without flushing every buffered page is dirty, so
//!   CFLRU then evicts exactly like LRU.
//! - The window is counted against the cache's capacity; while fewer lines are
//!   resident than the window holds, all of them are in it.
//! - Cost: the region's boundary is kept as a pointer into the LRU list
//!   (O(1) per access); clean pages are kept ordered by recency in a B-tree,
//!   so finding the clean victim is O(log n) rather than the paper's scan of
//!   the region.

use std::collections::BTreeSet;

use super::list::{Links, ListHead, NIL};
use super::{AccessInfo, PolicyParams, ReplacementPolicy};
use crate::addr::{LineKey, SlotId};
use crate::error::CoreError;

pub struct Cflru {
    links: Links,
    /// MRU at the head.
    lru: ListHead,
    /// When each slot was last accessed (strictly increasing along the list).
    stamp: Vec<u64>,
    clock: u64,
    clean: Vec<bool>,
    in_window: Vec<bool>,
    /// The most recently used page inside the clean-first region (NIL: empty region).
    boundary: u32,
    window_len: u32,
    window_target: u32,
    /// Clean resident pages by (stamp, slot): the first is the least recently used.
    clean_pages: BTreeSet<(u64, u32)>,
    clean_evictions: u64,
}

impl Cflru {
    /// A CFLRU cache from its parameters (`window` 0.25 of the cache when
    /// absent), as the registry builds it.
    pub fn from_params(params: &PolicyParams, capacity_lines: usize) -> Result<Self, CoreError> {
        let window = params.f64_or("window", 0.25, 0.0..=1.0)?;
        Ok(Self::new(capacity_lines, window))
    }

    pub fn new(capacity_lines: usize, window: f64) -> Self {
        let target = (capacity_lines as f64 * window).round() as u64;
        Cflru {
            links: Links::new(capacity_lines),
            lru: ListHead::default(),
            stamp: vec![0; capacity_lines],
            clock: 0,
            clean: vec![false; capacity_lines],
            in_window: vec![false; capacity_lines],
            boundary: NIL,
            window_len: 0,
            window_target: target.min(capacity_lines as u64) as u32,
            clean_pages: BTreeSet::new(),
            clean_evictions: 0,
        }
    }

    /// Resident slots from MRU to LRU.
    pub fn order(&self) -> Vec<SlotId> {
        self.links.iter(&self.lru).collect()
    }

    /// Slots in the clean-first region, from its MRU end to the LRU end.
    pub fn window(&self) -> Vec<SlotId> {
        self.order()
            .into_iter()
            .filter(|&s| self.in_window[s as usize])
            .collect()
    }

    pub fn window_target(&self) -> u32 {
        self.window_target
    }

    pub fn clean_pages(&self) -> usize {
        self.clean_pages.len()
    }

    fn detach(&mut self, slot: SlotId) {
        let s = slot as usize;
        if self.in_window[s] {
            if self.boundary == slot {
                self.boundary = self.links.next(slot);
            }
            self.in_window[s] = false;
            self.window_len -= 1;
        }
        self.links.unlink(&mut self.lru, slot);
        if self.clean[s] {
            self.clean_pages.remove(&(self.stamp[s], slot));
        }
    }

    fn attach_head(&mut self, slot: SlotId, clean: bool) {
        let s = slot as usize;
        self.clock += 1;
        self.stamp[s] = self.clock;
        self.clean[s] = clean;
        self.links.push_head(&mut self.lru, slot);
        if clean {
            self.clean_pages.insert((self.clock, slot));
        }
        self.fill_window();
    }

    /// Extends the clean-first region toward the MRU end up to its size.
    fn fill_window(&mut self) {
        while self.window_len < self.window_target.min(self.lru.len) {
            let n = if self.boundary == NIL {
                self.lru.tail
            } else {
                self.links.prev(self.boundary)
            };
            self.in_window[n as usize] = true;
            self.boundary = n;
            self.window_len += 1;
        }
    }
}

impl ReplacementPolicy for Cflru {
    fn name(&self) -> &'static str {
        "cflru"
    }

    fn on_hit(&mut self, slot: SlotId, info: &AccessInfo) {
        self.detach(slot);
        self.attach_head(slot, !info.dirty);
    }

    fn on_miss(&mut self, _key: LineKey, need_victim: bool, _info: &AccessInfo, victims: &mut Vec<SlotId>) {
        if !need_victim {
            return;
        }
        let victim = match self.clean_pages.first() {
            Some(&(_, slot)) if self.in_window[slot as usize] => {
                self.clean_evictions += 1;
                slot
            }
            _ => self.lru.tail,
        };
        if victim == NIL {
            return;
        }
        self.detach(victim);
        self.fill_window();
        victims.push(victim);
    }

    fn on_insert(&mut self, slot: SlotId, _key: LineKey, info: &AccessInfo) {
        self.attach_head(slot, !info.dirty);
    }

    fn on_remove(&mut self, slot: SlotId) {
        self.detach(slot);
        self.fill_window();
    }

    fn on_clean(&mut self, slot: SlotId) {
        let s = slot as usize;
        if !self.clean[s] {
            self.clean[s] = true;
            self.clean_pages.insert((self.stamp[s], slot));
        }
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        vec![("clean_first_evictions", self.clean_evictions)]
    }
}

//! Lazy Adaptive Replacement Cache (LARC): an LRU cache that admits a line only
//! on its second miss within a window of recently missed keys, the window's
//! size adapting to the hit ratio. From Sai Huang, Qingsong Wei, Jianxi Chen,
//! Cheng Chen and Dan Feng, "Improving Flash-Based Disk Cache with Lazy
//! Adaptive Replacement", MSST 2013 (Algorithm 1), extended in ACM Transactions
//! on Storage 12(2), article 8, 2016 (same authors, order Huang, Wei, Feng,
//! Chen, Chen). The journal text was not available when this was written; the
//! rule below is the MSST'13 pseudo-code as restated in a public C
//! implementation (`larc_policy.c` of the `cache_nucleus` policy simulator,
//! which cites the MSST'13 paper) and matches the papers' description: LARC
//! targets flash caches, where every admission costs a flash write, so lines
//! seen once ("one-hit wonders") are kept out of the cache entirely.
//!
//! # Algorithm
//!
//! `C` is the cache size in lines, `Q` the cache (an LRU queue), `Qr` a ghost
//! LRU queue of keys (no data) and `Cr` its target size, a real number
//! initialised to `min × C`.
//! - Hit in `Q`: move the line to the MRU end; `Cr ← max(min × C, Cr − C / (C − Cr))`.
//! - Miss: `Cr ← min(max × C, Cr + C / Cr)`; then
//!   - if the key is in `Qr`: remove it from `Qr` and admit the line at the MRU
//!     end of `Q`, evicting `Q`'s LRU line when the cache is full;
//!   - otherwise: do not admit it; push its key at the MRU end of `Qr` and, if
//!     `|Qr| > Cr`, drop `Qr`'s LRU key (one key per miss, so `Qr` shrinks
//!     gradually after `Cr` does).
//!
//! Hits shrink the window (a stable working set needs fewer new lines), misses
//! grow it (a shifting working set needs a wider window to be recognised), by
//! steps that are large near the opposite bound.
//!
//! The decision is made in [`ReplacementPolicy::admit`], which the cache calls
//! for every miss it could fill; `on_miss` then only names the LRU victim.
//!
//! # Parameters
//!
//! `larc:min=0.1:max=0.9`: the bounds of `Cr` as fractions of `C` (the papers
//! use 0.1 and 0.9); `0.001 ≤ min ≤ max ≤ 0.999`.
//!
//! # Deviations, and why
//!
//! - `Qr` always keeps room for one key: the trim is `|Qr| > max(Cr, 1)`. With
//!   `Cr < 1` (a one-line cache has `Cr ≤ 0.9`) the paper's rule would drop
//!   every key as soon as it is inserted and the cache would never admit
//!   anything.
//! - The paper admits on the second miss even while the cache has free space,
//!   and so does this module (some implementations fill a non-full cache
//!   directly; the paper does not).
//! - Reads and writes are treated alike; misses the cache does not offer for
//!   admission (writes under write-around, write-invalidate or pass-through)
//!   do not reach the policy and do not move `Cr`.
//! - Invalidation ([`ReplacementPolicy::on_remove`]) drops the line from `Q`
//!   without creating a ghost, and does not move `Cr`.
//!
//! Memory: `Q` links per slot; `Qr` holds at most `max(⌊max × C⌋, 1)` keys
//! (ghost nodes plus a [`LineIndex`]), allocated once.

use super::list::{Links, ListHead, NIL};
use super::{AccessInfo, PolicyParams, ReplacementPolicy};
use crate::addr::{LineKey, SlotId};
use crate::error::CoreError;
use crate::index::LineIndex;

/// Parameter names `larc` accepts.
pub const LARC_PARAMS: &[&str] = &["min", "max"];

pub struct Larc {
    capacity: f64,
    min: f64,
    max: f64,
    /// `Cr`, the target size of the ghost queue, in lines.
    ghost_target: f64,
    slot_links: Links,
    resident: Vec<bool>,
    /// `Q`, head = MRU.
    queue: ListHead,
    ghost_links: Links,
    ghost_key: Vec<LineKey>,
    ghost_free: Vec<u32>,
    ghost_index: LineIndex,
    /// `Qr`, head = MRU.
    ghosts: ListHead,
    filtered: u64,
    ghost_hits: u64,
}

impl Larc {
    pub fn new(capacity_lines: usize) -> Self {
        Self::with_bounds(capacity_lines, 0.1, 0.9)
    }

    pub fn from_params(params: &PolicyParams, capacity_lines: usize) -> Result<Self, CoreError> {
        let min = params.f64_or("min", 0.1, 0.001..=0.999)?;
        let max = params.f64_or("max", 0.9, 0.001..=0.999)?;
        if min > max {
            return Err(CoreError::BadParameter {
                given: format!("min={min}:max={max}"),
                reason: "`min` must not exceed `max`".to_string(),
            });
        }
        Ok(Self::with_bounds(capacity_lines, min, max))
    }

    fn with_bounds(capacity_lines: usize, min: f64, max: f64) -> Self {
        let capacity = capacity_lines as f64;
        // |Qr| <= max(floor(max × C), 1) after every miss; one spare for the
        // key pushed before the trim.
        let ghosts = ((max * capacity) as usize).max(1) + 1;
        Larc {
            capacity,
            min,
            max,
            ghost_target: min * capacity,
            slot_links: Links::new(capacity_lines),
            resident: vec![false; capacity_lines],
            queue: ListHead::default(),
            ghost_links: Links::new(ghosts),
            ghost_key: vec![
                LineKey {
                    volume: 0,
                    line_index: 0
                };
                ghosts
            ],
            ghost_free: (0..ghosts as u32).rev().collect(),
            ghost_index: LineIndex::new(ghosts),
            ghosts: ListHead::default(),
            filtered: 0,
            ghost_hits: 0,
        }
    }

    /// `Cr`, the ghost queue's target size in lines.
    pub fn ghost_target(&self) -> f64 {
        self.ghost_target
    }

    /// `(|Q|, |Qr|)`.
    pub fn sizes(&self) -> (u32, u32) {
        (self.queue.len, self.ghosts.len)
    }

    /// Ghost keys from MRU to LRU (for tests).
    pub fn ghost_keys(&self) -> Vec<LineKey> {
        self.ghost_links
            .iter(&self.ghosts)
            .map(|g| self.ghost_key[g as usize])
            .collect()
    }

    /// Resident slots from MRU to LRU (for tests).
    pub fn order(&self) -> Vec<SlotId> {
        self.slot_links.iter(&self.queue).collect()
    }

    /// Largest number of ghost keys ever held.
    pub fn ghost_capacity(&self) -> usize {
        self.ghost_key.len() - 1
    }

    fn ghost_limit(&self) -> f64 {
        self.ghost_target.max(1.0)
    }

    fn drop_ghost(&mut self, g: u32) {
        self.ghost_links.unlink(&mut self.ghosts, g);
        let key = self.ghost_key[g as usize];
        self.ghost_index.remove(&key, g);
        self.ghost_free.push(g);
    }

    fn push_ghost(&mut self, key: LineKey) {
        if self.ghost_free.is_empty() {
            // Unreachable by the bound above; stay bounded regardless.
            let lru = self.ghosts.tail;
            self.drop_ghost(lru);
        }
        let Some(g) = self.ghost_free.pop() else {
            unreachable!("a ghost node was just freed");
        };
        self.ghost_key[g as usize] = key;
        self.ghost_links.push_head(&mut self.ghosts, g);
        self.ghost_index.insert(&key, g);
        if self.ghosts.len as f64 > self.ghost_limit() {
            let lru = self.ghosts.tail;
            self.drop_ghost(lru);
        }
    }
}

impl ReplacementPolicy for Larc {
    fn name(&self) -> &'static str {
        "larc"
    }

    fn on_hit(&mut self, slot: SlotId, _info: &AccessInfo) {
        self.slot_links.move_to_head(&mut self.queue, slot);
        let c = self.capacity;
        let step = c / (c - self.ghost_target);
        self.ghost_target = (self.ghost_target - step).max(self.min * c);
    }

    fn admit(&mut self, key: LineKey, _info: &AccessInfo) -> Option<bool> {
        let c = self.capacity;
        self.ghost_target = (self.ghost_target + c / self.ghost_target).min(self.max * c);
        let ghost_keys = &self.ghost_key;
        match self.ghost_index.get(&key, |g| ghost_keys[g as usize]) {
            Some(g) => {
                self.drop_ghost(g);
                self.ghost_hits += 1;
                Some(true)
            }
            None => {
                self.push_ghost(key);
                self.filtered += 1;
                Some(false)
            }
        }
    }

    fn on_miss(&mut self, _key: LineKey, need_victim: bool, _info: &AccessInfo, victims: &mut Vec<SlotId>) {
        if need_victim {
            if let Some(slot) = self.slot_links.pop_tail(&mut self.queue) {
                self.resident[slot as usize] = false;
                victims.push(slot);
            }
        }
    }

    fn on_insert(&mut self, slot: SlotId, _key: LineKey, _info: &AccessInfo) {
        self.slot_links.push_head(&mut self.queue, slot);
        self.resident[slot as usize] = true;
    }

    fn on_remove(&mut self, slot: SlotId) {
        if std::mem::take(&mut self.resident[slot as usize]) {
            self.slot_links.unlink(&mut self.queue, slot);
        }
    }

    /// `C` follows, `Cr` keeps its share of it (within `min` and `max`),
    /// and the oldest ghosts beyond it go.
    fn set_lines_in_service(&mut self, lines: usize) {
        let c = lines as f64;
        self.ghost_target = (self.ghost_target * c / self.capacity).clamp(self.min * c, self.max * c);
        self.capacity = c;
        while self.ghosts.len as f64 > self.ghost_limit() {
            let lru = self.ghosts.tail;
            self.drop_ghost(lru);
        }
    }

    fn next_victims(&self) -> [Option<SlotId>; 2] {
        let first = self.queue.tail;
        if first == NIL {
            return [None, None];
        }
        let second = self.slot_links.prev(first);
        [Some(first), (second != NIL).then_some(second)]
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("larc_filtered", self.filtered),
            ("larc_ghost_hits", self.ghost_hits),
            ("larc_ghost_target", self.ghost_target as u64),
        ]
    }
}

//! A bounded FIFO of line keys without data ("ghost" entries), used by 2Q
//! (its A1out queue) and S3-FIFO (its ghost queue G).
//!
//! Entries live in arrays preallocated for `capacity` keys, linked in
//! insertion order with [`Links`]; a [`LineIndex`] finds a key's entry. A push
//! into a full FIFO first forgets the oldest key, and a key can be taken out
//! from anywhere (a ghost hit), so the FIFO always holds the most recently
//! pushed `capacity` keys that were not taken.

use super::list::{Links, ListHead, TailLookahead, NIL};
use crate::addr::LineKey;
use crate::index::LineIndex;

pub struct GhostFifo {
    /// Keys it has room for.
    capacity: usize,
    /// Keys it keeps at most: `capacity`, or fewer once
    /// [`GhostFifo::set_limit`] lowered it.
    limit: usize,
    links: Links,
    keys: Vec<LineKey>,
    free: Vec<u32>,
    index: LineIndex,
    queue: ListHead,
    /// The oldest entries, walked ahead of their forgetting for
    /// prefetching (a hint only).
    ahead: TailLookahead,
}

impl GhostFifo {
    /// A FIFO of at most `capacity` keys (zero keeps none).
    pub fn new(capacity: usize) -> Self {
        let none = LineKey {
            volume: 0,
            line_index: 0,
        };
        GhostFifo {
            capacity,
            limit: capacity,
            links: Links::new(capacity),
            keys: vec![none; capacity],
            free: (0..capacity as u32).rev().collect(),
            index: LineIndex::new(capacity),
            queue: ListHead::default(),
            ahead: TailLookahead::default(),
        }
    }

    pub fn len(&self) -> usize {
        self.queue.len as usize
    }

    /// Keys it keeps at most.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Keeps at most `limit` keys (at most the room it was built with),
    /// forgetting the oldest beyond it now.
    pub fn set_limit(&mut self, limit: usize) {
        self.limit = limit.min(self.capacity);
        while self.len() > self.limit {
            let oldest = self.queue.tail;
            self.forget(oldest);
            self.ahead.advance(&self.links, &self.queue, oldest);
        }
    }

    fn find(&self, key: &LineKey) -> Option<u32> {
        let keys = &self.keys;
        self.index.get(key, |g| keys[g as usize])
    }

    pub fn contains(&self, key: &LineKey) -> bool {
        self.find(key).is_some()
    }

    fn forget(&mut self, g: u32) {
        self.links.unlink(&mut self.queue, g);
        let key = self.keys[g as usize];
        self.index.remove(&key, g);
        self.free.push(g);
    }

    /// Removes `key` if present; returns whether it was.
    pub fn take(&mut self, key: &LineKey) -> bool {
        match self.find(key) {
            Some(g) => {
                self.forget(g);
                true
            }
            None => false,
        }
    }

    /// Adds `key` as the newest entry, forgetting the oldest one when full.
    /// A key already present moves to the newest position.
    pub fn push(&mut self, key: LineKey) {
        if self.limit == 0 {
            return;
        }
        self.take(&key);
        if self.len() >= self.limit {
            let oldest = self.queue.tail;
            self.forget(oldest);
            self.ahead.advance(&self.links, &self.queue, oldest);
        }
        let Some(g) = self.free.pop() else {
            unreachable!("a full ghost FIFO frees its oldest entry first");
        };
        self.keys[g as usize] = key;
        self.links.push_head(&mut self.queue, g);
        self.index.insert(&key, g);
    }

    /// Hints: the index position a key of hash `hash` is looked up at.
    #[inline]
    pub fn prefetch_key(&self, hash: u32) {
        self.index.prefetch_hashed(hash);
    }

    /// Hints, once [`GhostFifo::prefetch_key`]'s load has arrived: the
    /// key of the entry that probably holds hash `hash`, which a lookup
    /// compares.
    #[inline]
    pub fn prefetch_found(&self, hash: u32) {
        if let Some(g) = self.index.peek_hashed(hash) {
            crate::prefetch::prefetch_address(self.keys.as_ptr().wrapping_add(g as usize) as usize);
        }
    }

    /// Hints: what forgetting the oldest entries will touch, the index
    /// position of one a few pushes away (its key was loaded when it was
    /// the later one) and the key of one further on; and where `key`, to
    /// be pushed next, will go in the index.
    #[inline]
    pub fn prefetch_push(&self, key: Option<&LineKey>) {
        let [soon, later] = self.ahead.upcoming();
        if later != NIL {
            crate::prefetch::prefetch_address(self.keys.as_ptr().wrapping_add(later as usize) as usize);
        }
        if let Some(oldest) = self.keys.get(soon as usize) {
            self.index.prefetch(oldest);
        }
        if let Some(key) = key {
            self.index.prefetch(key);
        }
    }

    /// Keys from newest to oldest (for tests).
    #[cfg(test)]
    pub fn keys(&self) -> Vec<LineKey> {
        self.links
            .iter(&self.queue)
            .map(|g| self.keys[g as usize])
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::testing::key;

    #[test]
    fn keeps_the_newest_keys_and_takes_from_the_middle() {
        let mut g = GhostFifo::new(3);
        for l in 1..=4 {
            g.push(key(l));
        }
        // 1 was forgotten when 4 arrived.
        assert_eq!(g.keys(), vec![key(4), key(3), key(2)]);
        assert!(g.take(&key(3)));
        assert!(!g.take(&key(3)));
        assert!(!g.contains(&key(1)));
        g.push(key(5));
        // Taking 3 made room: nothing is forgotten.
        assert_eq!(g.keys(), vec![key(5), key(4), key(2)]);
        g.push(key(2)); // present: moves to the newest end
        assert_eq!(g.keys(), vec![key(2), key(5), key(4)]);
        assert_eq!(g.len(), 3);
    }

    #[test]
    fn zero_capacity_holds_nothing() {
        let mut g = GhostFifo::new(0);
        g.push(key(1));
        assert_eq!(g.len(), 0);
        assert!(!g.take(&key(1)));
    }
}

//! A bounded history of lines that are not resident, a value for each key,
//! least recently touched forgotten first: the Access policy keeps one of
//! access counts and ReCA one of request-class counts.
//!
//! Entries live in arrays that grow (up to the bound) as the history fills,
//! linked in recency order with [`Links`]; a hash index finds a key's entry.

use super::list::{Links, ListHead};
use crate::addr::LineKey;
use crate::fasthash::FxHashMap;

pub(crate) struct KeyHistory<V> {
    /// Entries kept at most.
    cap: usize,
    links: Links,
    /// Head = most recently touched.
    list: ListHead,
    keys: Vec<LineKey>,
    values: Vec<V>,
    free: Vec<u32>,
    index: FxHashMap<LineKey, u32>,
    /// Entries forgotten: pushed out by newer ones, or never kept (no room).
    forgotten: u64,
}

impl<V: Copy> KeyHistory<V> {
    /// An empty history of at most `cap` entries.
    pub fn new(cap: usize) -> Self {
        KeyHistory {
            cap,
            links: Links::new(0),
            list: ListHead::default(),
            keys: Vec::new(),
            values: Vec::new(),
            free: Vec::new(),
            index: FxHashMap::default(),
            forgotten: 0,
        }
    }

    /// Entries held now.
    pub fn len(&self) -> usize {
        self.list.len as usize
    }

    /// Entries kept at most.
    pub fn cap(&self) -> usize {
        self.cap
    }

    /// Entries forgotten so far.
    pub fn forgotten(&self) -> u64 {
        self.forgotten
    }

    pub fn get(&self, key: &LineKey) -> Option<&V> {
        self.index.get(key).map(|&h| &self.values[h as usize])
    }

    pub fn contains(&self, key: &LineKey) -> bool {
        self.index.contains_key(key)
    }

    /// Takes `key`'s entry out, returning its value.
    pub fn take(&mut self, key: &LineKey) -> Option<V> {
        let h = self.index.remove(key)?;
        self.links.unlink(&mut self.list, h);
        self.free.push(h);
        Some(self.values[h as usize])
    }

    /// The value of `key`, made the most recent entry; a new entry holds
    /// `initial`, after the oldest entries beyond the bound are forgotten.
    /// `None` (and the key forgotten) when the history keeps nothing.
    pub fn entry(&mut self, key: LineKey, initial: V) -> Option<&mut V> {
        if let Some(&h) = self.index.get(&key) {
            self.links.move_to_head(&mut self.list, h);
            return Some(&mut self.values[h as usize]);
        }
        if self.cap == 0 {
            self.forgotten += 1;
            return None;
        }
        self.forget_beyond(self.cap - 1);
        let h = match self.free.pop() {
            Some(h) => {
                self.keys[h as usize] = key;
                self.values[h as usize] = initial;
                h
            }
            None => {
                self.keys.push(key);
                self.values.push(initial);
                let h = self.keys.len() - 1;
                if h >= self.links.nodes() {
                    let grown = (2 * self.links.nodes()).max(16).min(self.cap);
                    self.links.grow_to(grown.max(h + 1));
                }
                h as u32
            }
        };
        self.links.push_head(&mut self.list, h);
        self.index.insert(key, h);
        Some(&mut self.values[h as usize])
    }

    /// Keeps at most `cap` entries from now on, forgetting the oldest
    /// beyond it.
    pub fn set_cap(&mut self, cap: usize) {
        self.cap = cap;
        self.forget_beyond(cap);
    }

    fn forget_beyond(&mut self, entries: usize) {
        while self.len() > entries {
            let oldest = self.keys[self.list.tail as usize];
            self.take(&oldest);
            self.forgotten += 1;
        }
    }

    /// Every value stored, those of free entries included.
    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut V> {
        self.values.iter_mut()
    }

    /// Entries made so far, held or free: the arrays' length.
    pub fn allocated(&self) -> usize {
        self.keys.len()
    }

    /// Checks the index and the bound (for tests).
    pub fn check(&self) {
        assert_eq!(self.index.len(), self.len());
        assert!(self.len() <= self.cap);
    }
}

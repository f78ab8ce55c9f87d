//! The exact miss-ratio curve looks up every line
//! access of the trace in a table of every line ever seen (the footprint,
//! not a cache's worth), and that lookup dominated its time in a general
//! hash map (a cache miss per access). This table gives each line a dense
//! id (in order of first access) and keeps block traces' spatial locality:
//! four consecutive lines of a volume have their home positions side by
//! side, in one 64-byte cache line, so a sequential request touches a few
//! cache lines of the table instead of one per line. It grows by doubling,
//! and its positions can be prefetched ahead of the lookups.

use iocache_core::prefetch::prefetch_address;
use iocache_core::LineKey;

const EMPTY: u32 = u32::MAX;
/// A removed entry: lookups go past it, nothing is stored in it again
/// until the table is rebuilt.
const GONE: u32 = u32::MAX - 1;
/// Lines per group of neighbouring home positions (4 × 16 bytes).
const GROUP_BITS: u32 = 2;

#[derive(Clone, Copy)]
#[repr(C, align(16))]
struct Entry {
    line_index: u64,
    volume: u32,
    id: u32,
}

const FREE: Entry = Entry {
    line_index: 0,
    volume: 0,
    id: EMPTY,
};

pub(super) struct LineIds {
    entries: Vec<Entry>,
    /// log2 of the table's length.
    bits: u32,
    /// Entries in use, removed ones included.
    used: usize,
    /// Ids given so far (the next id).
    next_id: u32,
}

impl LineIds {
    pub(super) fn new() -> Self {
        Self::with_bits(12)
    }

    fn with_bits(bits: u32) -> Self {
        LineIds {
            entries: vec![FREE; 1 << bits],
            bits,
            used: 0,
            next_id: 0,
        }
    }

    /// Ids given so far: every id is below this.
    #[cfg(test)]
    fn ids_given(&self) -> usize {
        self.next_id as usize
    }

    /// Where `key`'s search starts: its group's place (a multiplicative
    /// hash of the group number and the volume, top bits) and its place in
    /// the group.
    #[inline(always)]
    fn home(&self, key: &LineKey) -> usize {
        const MIX: u64 = 0x9e37_79b9_7f4a_7c15;
        const VOLUME_MIX: u64 = 0xc2b2_ae3d_27d4_eb4f;
        let group = (key.line_index >> GROUP_BITS) ^ u64::from(key.volume).wrapping_mul(VOLUME_MIX);
        let group_bits = self.bits - GROUP_BITS;
        let place = (group.wrapping_mul(MIX) >> (64 - group_bits)) as usize;
        (place << GROUP_BITS) | (key.line_index as usize & ((1 << GROUP_BITS) - 1))
    }

    /// Hints the CPU to load the table position where `key`'s search starts.
    #[inline(always)]
    pub(super) fn prefetch(&self, key: &LineKey) {
        let at = self.home(key);
        prefetch_address(self.entries.as_ptr() as usize + at * std::mem::size_of::<Entry>());
    }

    /// `key`'s id, and whether it was given just now (the key was new).
    #[inline]
    pub(super) fn get_or_insert(&mut self, key: &LineKey) -> (u32, bool) {
        let mask = self.entries.len() - 1;
        let mut at = self.home(key);
        loop {
            let e = self.entries[at];
            if e.id == EMPTY {
                break;
            }
            if e.id != GONE && e.line_index == key.line_index && e.volume == key.volume {
                return (e.id, false);
            }
            at = (at + 1) & mask;
        }
        let id = self.next_id;
        assert!(id < GONE, "more than 2^32 - 2 distinct lines");
        self.next_id += 1;
        if (self.used + 1) * 2 > self.entries.len() {
            self.grow();
            self.store(key, id);
        } else {
            self.entries[at] = Entry {
                line_index: key.line_index,
                volume: key.volume,
                id,
            };
        }
        self.used += 1;
        (id, true)
    }

    /// Stores a new key (not present) at the first free position.
    fn store(&mut self, key: &LineKey, id: u32) {
        let mask = self.entries.len() - 1;
        let mut at = self.home(key);
        while self.entries[at].id != EMPTY {
            at = (at + 1) & mask;
        }
        self.entries[at] = Entry {
            line_index: key.line_index,
            volume: key.volume,
            id,
        };
    }

    /// A table twice as large (or as large, when removed entries made the
    /// load), with the live entries only.
    fn grow(&mut self) {
        let live: Vec<Entry> = self.entries.iter().copied().filter(|e| e.id < GONE).collect();
        let bits = if (live.len() + 1) * 4 > self.entries.len() {
            self.bits + 1
        } else {
            self.bits
        };
        let next_id = self.next_id;
        *self = Self::with_bits(bits);
        self.next_id = next_id;
        for e in &live {
            let key = LineKey {
                volume: e.volume,
                line_index: e.line_index,
            };
            self.store(&key, e.id);
        }
        self.used = live.len();
    }

    /// Removes `key`; its id is not given again. Returns the id it had.
    pub(super) fn remove(&mut self, key: &LineKey) -> Option<u32> {
        let mask = self.entries.len() - 1;
        let mut at = self.home(key);
        loop {
            let e = self.entries[at];
            if e.id == EMPTY {
                return None;
            }
            if e.id != GONE && e.line_index == key.line_index && e.volume == key.volume {
                self.entries[at].id = GONE;
                return Some(e.id);
            }
            at = (at + 1) & mask;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    proptest! {
        /// Against std's HashMap: ids in order of first sight, removals,
        /// growth (many keys, sequential runs and scattered ones).
        #[test]
        fn gives_the_ids_a_map_would(
            ops in proptest::collection::vec((0u32..3, 0u64..6000, 0u8..10), 0..3000),
        ) {
            let mut ids = LineIds::new();
            let mut model: HashMap<LineKey, u32> = HashMap::new();
            let mut next = 0u32;
            for (volume, line_index, what) in ops {
                let key = LineKey { volume, line_index };
                if what == 0 {
                    prop_assert_eq!(ids.remove(&key), model.remove(&key));
                } else {
                    let expected = match model.get(&key) {
                        Some(&id) => (id, false),
                        None => {
                            model.insert(key, next);
                            next += 1;
                            (next - 1, true)
                        }
                    };
                    prop_assert_eq!(ids.get_or_insert(&key), expected);
                }
            }
            prop_assert_eq!(ids.ids_given(), next as usize);
            for (key, id) in &model {
                prop_assert_eq!(ids.get_or_insert(key), (*id, false));
            }
        }
    }
}

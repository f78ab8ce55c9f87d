//! The line index: which slot holds a line, as a compact open-addressing table.
//!
//! Entries are 8 bytes (32 hash bits and a slot id), the table is kept at most
//! an eighth full up to 2M lines, a quarter full up to 4M and half full past
//! that (to bound memory), and probed linearly, and deletion shifts entries back instead of
//! leaving tombstones, so lookups stay short under the constant churn of a
//! cache. Keys themselves live in the slot metadata; an entry's key is read
//! only when its 32 hash bits match. This halves the memory a general hash map
//! of (key, slot) pairs needs and keeps most probes inside one cache line.

use crate::addr::{LineKey, SlotId};

const EMPTY: SlotId = SlotId::MAX;

/// The largest table kept sparse (an eighth or a quarter full): 2^24
/// entries (128 MiB: 2M lines at an eighth, 4M at a quarter); larger
/// indexes are kept at most half full.
const SPARSE_ENTRIES_MAX: usize = 1 << 24;

#[derive(Clone, Copy)]
struct Entry {
    hash: u32,
    slot: SlotId,
}

pub struct LineIndex {
    /// Never resized: its length is `mask + 1` for the table's lifetime.
    entries: Box<[Entry]>,
    mask: usize,
    len: usize,
}

/// 32 well-mixed bits of `key`: one folded 64×64→128-bit multiply (the
/// high and low halves of the product xored), cheaper than a general
/// `Hasher` and mixing every key bit into the low bits the table uses.
/// Consecutive line indices (sequential I/O) land far apart.
#[inline(always)]
pub(crate) fn hash_of(key: &LineKey) -> u32 {
    const MIX: u64 = 0x9e37_79b9_7f4a_7c15;
    const VOLUME_MIX: u64 = 0xc2b2_ae3d_27d4_eb4f;
    let x = key.line_index ^ (key.volume as u64).wrapping_mul(VOLUME_MIX);
    let product = (x as u128) * (MIX as u128);
    let folded = (product as u64) ^ ((product >> 64) as u64);
    (folded ^ (folded >> 32)) as u32
}

impl LineIndex {
    /// An index for up to `capacity` lines.
    pub fn new(capacity: usize) -> Self {
        // The sparsest of an eighth and a quarter full whose table stays
        // within SPARSE_ENTRIES_MAX entries; past that, memory wins: half
        // full. Sparse, a key is almost always at its home position, so
        // removals shift few entries and the probe loops' branches are
        // predicted: at an eighth full the simulator's LRU on P2
        // mispredicts 0.77 branches per line access against 1.38 at a
        // quarter, and runs 1.16-1.24x as fast (docs/results/sim-bench.md).
        let lines = capacity.max(1);
        let size = [8, 4]
            .into_iter()
            .filter_map(|per_line| lines.checked_mul(per_line)?.checked_next_power_of_two())
            .find(|&size| size <= SPARSE_ENTRIES_MAX)
            .unwrap_or_else(|| lines.saturating_mul(2).next_power_of_two());
        LineIndex {
            entries: vec![Entry { hash: 0, slot: EMPTY }; size].into_boxed_slice(),
            mask: size - 1,
            len: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// The entry at table position `at` (wrapped into the table).
    #[inline(always)]
    fn entry(&self, at: usize) -> Entry {
        debug_assert_eq!(self.entries.len(), self.mask + 1);
        // SAFETY: `entries` has exactly `mask + 1` elements (built so in
        // `new`, a boxed slice never resized), so `at & mask` is in bounds.
        unsafe { *self.entries.get_unchecked(at & self.mask) }
    }

    /// Stores `entry` at table position `at` (wrapped into the table).
    #[inline(always)]
    fn set_entry(&mut self, at: usize, entry: Entry) {
        debug_assert_eq!(self.entries.len(), self.mask + 1);
        // SAFETY: as in `entry`.
        unsafe { *self.entries.get_unchecked_mut(at & self.mask) = entry }
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The slot holding `key`; `key_of` reads a slot's key from the caller's metadata.
    #[inline]
    pub fn get(&self, key: &LineKey, key_of: impl Fn(SlotId) -> LineKey) -> Option<SlotId> {
        self.get_hashed(hash_of(key), |slot| key_of(slot) == *key)
    }

    /// [`LineIndex::get`] with `hash_of(key)` already computed; `holds`
    /// says whether a slot holds the key sought.
    #[inline(always)]
    pub(crate) fn get_hashed(&self, hash: u32, holds: impl Fn(SlotId) -> bool) -> Option<SlotId> {
        let mut at = hash as usize & self.mask;
        loop {
            let e = self.entry(at);
            if e.slot == EMPTY {
                return None;
            }
            if e.hash == hash && holds(e.slot) {
                return Some(e.slot);
            }
            at = (at + 1) & self.mask;
        }
    }

    /// Hints the CPU to load the table position where `key`'s search starts.
    #[inline]
    pub fn prefetch(&self, key: &LineKey) {
        self.prefetch_hashed(hash_of(key));
    }

    /// [`LineIndex::prefetch`] with `hash_of(key)` already computed.
    #[inline(always)]
    pub(crate) fn prefetch_hashed(&self, hash: u32) {
        let at = hash as usize & self.mask;
        let address = self.entries.as_ptr() as usize + at * std::mem::size_of::<Entry>();
        crate::prefetch::prefetch_address(address);
    }

    /// The slot of the first entry whose hash is `hash`, its key not
    /// checked: a guess, for prefetching only (another key may share the
    /// 32 bits). At most `PEEK_PROBES_MAX` positions are read.
    #[inline(always)]
    pub(crate) fn peek_hashed(&self, hash: u32) -> Option<SlotId> {
        const PEEK_PROBES_MAX: usize = 4;
        let mut at = hash as usize & self.mask;
        for _ in 0..PEEK_PROBES_MAX {
            let e = self.entry(at);
            if e.slot == EMPTY {
                return None;
            }
            if e.hash == hash {
                return Some(e.slot);
            }
            at = (at + 1) & self.mask;
        }
        None
    }

    /// [`LineIndex::peek_hashed`] at `hash`'s home position only, without a
    /// branch on what it finds (a lookup's hit or miss is a coin toss that
    /// a branch would mispredict half the time): the slot there when its
    /// entry's hash is `hash`, and whether it was; slot 0 when not. For
    /// prefetching only.
    #[inline(always)]
    pub(crate) fn peek_home_hashed(&self, hash: u32) -> (SlotId, bool) {
        let e = self.entry(hash as usize & self.mask);
        let found = e.hash == hash && e.slot != EMPTY;
        (if found { e.slot } else { 0 }, found)
    }

    /// A handle that prefetches this table's entries without borrowing it, so
    /// a driver can start loading a request's index entry before it takes the
    /// lock that guards the cache (see [`IndexPrefetcher`]).
    pub fn prefetcher(&self) -> IndexPrefetcher {
        IndexPrefetcher {
            base_address: self.entries.as_ptr() as usize,
            mask: self.mask,
        }
    }

    /// Adds `key` → `slot`; the key must not be present.
    #[inline]
    pub fn insert(&mut self, key: &LineKey, slot: SlotId) {
        self.insert_hashed(hash_of(key), slot);
    }

    /// [`LineIndex::insert`] with `hash_of(key)` already computed.
    #[inline]
    pub(crate) fn insert_hashed(&mut self, hash: u32, slot: SlotId) {
        debug_assert!(slot != EMPTY);
        assert!(self.len < self.entries.len() / 2, "line index over capacity");
        let mut at = hash as usize & self.mask;
        while self.entry(at).slot != EMPTY {
            at = (at + 1) & self.mask;
        }
        self.set_entry(at, Entry { hash, slot });
        self.len += 1;
    }

    /// Moves `slot` from the key of index hash `old_hash` (its entry must
    /// be there) to a key of hash `new_hash` that is not in the index: a
    /// removal then an insertion, without the length changing between them.
    #[inline]
    pub(crate) fn replace_hashed(&mut self, old_hash: u32, slot: SlotId, new_hash: u32) {
        let removed = self.remove_hashed(old_hash, slot);
        debug_assert!(removed, "replaced a slot the index did not hold");
        let mut at = new_hash as usize & self.mask;
        while self.entry(at).slot != EMPTY {
            at = (at + 1) & self.mask;
        }
        self.set_entry(at, Entry { hash: new_hash, slot });
        self.len += 1;
    }

    /// Removes the entry of `slot`, which holds `key`. Returns whether it was there.
    #[inline]
    pub fn remove(&mut self, key: &LineKey, slot: SlotId) -> bool {
        self.remove_hashed(hash_of(key), slot)
    }

    /// [`LineIndex::remove`] with `hash_of(key)` already computed.
    #[inline]
    pub(crate) fn remove_hashed(&mut self, hash: u32, slot: SlotId) -> bool {
        let mut at = hash as usize & self.mask;
        loop {
            let e = self.entry(at);
            if e.slot == EMPTY {
                return false;
            }
            if e.slot == slot {
                break;
            }
            at = (at + 1) & self.mask;
        }
        // Backward-shift deletion: move later entries of the run into the hole
        // when their home position allows it.
        let mut hole = at;
        let mut next = (hole + 1) & self.mask;
        loop {
            let e = self.entry(next);
            if e.slot == EMPTY {
                break;
            }
            let home = e.hash as usize & self.mask;
            // Distance from home to `next` and to `hole`, wrapping around.
            let dist_next = next.wrapping_sub(home) & self.mask;
            let dist_hole = hole.wrapping_sub(home) & self.mask;
            if dist_hole <= dist_next {
                self.set_entry(hole, e);
                hole = next;
            }
            next = (next + 1) & self.mask;
        }
        self.set_entry(hole, Entry { hash: 0, slot: EMPTY });
        self.len -= 1;
        true
    }
}

/// Where an index keeps its entries, for prefetching only: it holds an
/// address, never dereferences it, and so stays harmless (a prefetch does not
/// fault) even if it outlives the table. The table is allocated once at its
/// full size, so the address holds for the cache's lifetime.
#[derive(Clone, Copy, Debug)]
pub struct IndexPrefetcher {
    base_address: usize,
    mask: usize,
}

impl IndexPrefetcher {
    /// Hints the CPU to load the table position where `key`'s search starts.
    #[inline]
    pub fn prefetch(&self, key: &LineKey) {
        let at = hash_of(key) as usize & self.mask;
        let address = self.base_address.wrapping_add(at * std::mem::size_of::<Entry>());
        crate::prefetch::prefetch_address(address);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    use crate::policy::testing::XorShift;

    #[test]
    fn tables_are_sparse_within_their_memory_bound() {
        // (lines, entries): an eighth full up to 2M lines, a quarter up to
        // 4M, then half; never more than SPARSE_ENTRIES_MAX entries while
        // sparse.
        for (lines, entries) in [
            (0, 8),
            (1, 8),
            (100, 1024),
            (131_072, 1 << 20),
            (1 << 21, 1 << 24),
            ((1 << 21) + 1, 1 << 24),
            (1 << 22, 1 << 24),
            ((1 << 22) + 1, 1 << 24),
            (1 << 23, 1 << 24),
            ((1 << 23) + 1, 1 << 25),
        ] {
            let index = LineIndex::new(lines);
            assert_eq!(index.entries.len(), entries, "{lines} lines");
            assert!(
                index.entries.len() >= 2 * lines.max(1),
                "{lines} lines: at most half full"
            );
        }
    }

    #[test]
    fn matches_a_hash_map_under_churn() {
        // Slots hold keys; random inserts and removals compared with std's HashMap.
        let capacity = 64;
        let mut index = LineIndex::new(capacity);
        let mut keys: Vec<Option<LineKey>> = vec![None; capacity];
        let mut model: HashMap<LineKey, SlotId> = HashMap::new();
        let mut rng = XorShift(0x9e37_79b9_7f4a_7c15u64);
        for _ in 0..20_000 {
            let state = rng.next();
            let key = LineKey {
                volume: (state % 3) as u32,
                line_index: (state >> 8) % 200,
            };
            let key_of = |s: SlotId| keys[s as usize].expect("indexed slot has a key");
            match (index.get(&key, key_of), model.get(&key)) {
                (Some(s), Some(&m)) => {
                    assert_eq!(s, m);
                    if state & 1 == 0 {
                        assert!(index.remove(&key, s));
                        model.remove(&key);
                        keys[s as usize] = None;
                    }
                }
                (None, None) => {
                    if let Some(free) = keys.iter().position(Option::is_none) {
                        keys[free] = Some(key);
                        index.insert(&key, free as SlotId);
                        model.insert(key, free as SlotId);
                    }
                }
                (a, b) => panic!("index says {a:?}, model says {b:?}"),
            }
            assert_eq!(index.len(), model.len());
        }
    }

    #[test]
    fn a_peek_names_the_slot_of_a_present_key_and_nothing_for_an_absent_one() {
        let mut index = LineIndex::new(1024);
        let key = |line_index| LineKey {
            volume: 1,
            line_index,
        };
        for line in 0..1000u64 {
            index.insert(&key(line), line as SlotId);
        }
        let mut found = 0;
        for line in 0..1000u64 {
            // A peek may name another key's slot when their 32 hash bits
            // agree (among these 1000 keys none do), or nothing when the
            // key sits past its few probes.
            match index.peek_hashed(hash_of(&key(line))) {
                Some(slot) => {
                    assert_eq!(slot, line as SlotId);
                    found += 1;
                }
                None => assert_eq!(index.get(&key(line), |s| key(u64::from(s))), Some(line as SlotId)),
            }
        }
        assert!(
            found >= 990,
            "a sparse table keeps most keys within a peek's probes: {found}"
        );
        let absent = (1000..100_000u64)
            .filter(|&line| index.peek_hashed(hash_of(&key(line))).is_some())
            .count();
        assert_eq!(absent, 0, "peeks that named a slot for an absent key");
        assert_eq!(LineIndex::new(8).peek_hashed(hash_of(&key(3))), None);

        // The home-only peek: a key at its home position is found, a key
        // displaced from it or absent is not (and names slot 0).
        let mut at_home = 0;
        for line in 0..1000u64 {
            let hash = hash_of(&key(line));
            let home = hash as usize & index.mask;
            let there = index.entry(home);
            match index.peek_home_hashed(hash) {
                (slot, true) => {
                    assert_eq!(slot, line as SlotId);
                    assert_eq!((there.hash, there.slot), (hash, slot));
                    at_home += 1;
                }
                (slot, false) => {
                    assert_eq!(slot, 0);
                    assert_ne!(there.slot, line as SlotId, "line {line} sits at home");
                }
            }
        }
        assert!(
            at_home >= 800,
            "most keys of a sparse table sit at home: {at_home}"
        );
        for line in 1000..20_000u64 {
            assert_eq!(
                index.peek_home_hashed(hash_of(&key(line))),
                (0, false),
                "absent line {line}"
            );
        }
        // An empty position whose stored hash bits happen to match is not a find.
        assert_eq!(LineIndex::new(8).peek_home_hashed(0), (0, false));
    }
}

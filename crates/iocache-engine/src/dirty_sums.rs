//! Checksums of dirty data as the engine wrote it: per dirty line, the
//! checksum of each dirty sector, so that the checksum a dirty record
//! carries ([`iocache_format::dirty_checksum`], the sum of the sectors')
//! stays known however writes to the line overlap, without reading the line
//! back. The shadow (`persist.rs`) owns one per shard and asks it for a
//! record's checksum at each barrier.
//!
//! Memory: one `u32` per slot, and one `u64` per sector of each line dirty
//! at once (1/64 of the dirty data), kept in a slab whose entries are
//! reused when lines become clean (no allocation per write: this is on
//! every dirty write's path).

use iocache_core::bitmap::{clear_range, set_range};
use iocache_core::SlotId;

/// What is known of one dirty line's sectors.
struct LineSums {
    /// Per sector: the checksum of the data last written there (meaningful
    /// for dirty sectors not in `unknown`).
    sector: Box<[u64]>,
    /// Dirty sectors whose data this never saw (a failed write, a line
    /// restored at start-up).
    unknown: Box<[u64]>,
    /// A restored line's checksum as its record carried it (verified at
    /// start-up): the total is known while the dirty sectors are unchanged.
    restored: Option<u64>,
}

/// Per-sector checksums of the dirty lines of one shard's slots.
pub struct DirtySums {
    sectors_per_line: u32,
    words: usize,
    /// Per slot: its entry in `slab`, or [`NO_ENTRY`].
    index: Vec<u32>,
    slab: Vec<LineSums>,
    /// Entries of `slab` no slot uses.
    free: Vec<u32>,
}

const NO_ENTRY: u32 = u32::MAX;

fn any(bits: &[u64]) -> bool {
    bits.iter().any(|&w| w != 0)
}

impl DirtySums {
    /// For `slots` slots holding lines of `sectors_per_line` sectors
    /// (bitmaps of `words` words).
    pub fn new(slots: usize, sectors_per_line: u32, words: usize) -> DirtySums {
        DirtySums {
            sectors_per_line,
            words,
            index: vec![NO_ENTRY; slots],
            slab: Vec::new(),
            free: Vec::new(),
        }
    }

    fn get(&self, slot: SlotId) -> Option<&LineSums> {
        let at = *self.index.get(slot as usize)?;
        (at != NO_ENTRY).then(|| &self.slab[at as usize])
    }

    fn get_mut(&mut self, slot: SlotId) -> Option<&mut LineSums> {
        let at = *self.index.get(slot as usize)?;
        (at != NO_ENTRY).then(|| &mut self.slab[at as usize])
    }

    /// A fresh entry for `slot` (which has none) with everything unknown
    /// as `unknown` says.
    fn insert(&mut self, slot: SlotId, unknown: &[u64], restored: Option<u64>) -> &mut LineSums {
        let at = match self.free.pop() {
            Some(at) => {
                let line = &mut self.slab[at as usize];
                line.unknown.copy_from_slice(unknown);
                line.restored = restored;
                at
            }
            None => {
                self.slab.push(LineSums {
                    sector: vec![0; self.sectors_per_line as usize].into_boxed_slice(),
                    unknown: unknown.to_vec().into_boxed_slice(),
                    restored,
                });
                (self.slab.len() - 1) as u32
            }
        };
        self.index[slot as usize] = at;
        &mut self.slab[at as usize]
    }

    /// The entry of `slot`, created when missing: sectors dirty before
    /// (`dirty_before`) whose data this never saw are unknown. A restored
    /// total stops applying once the dirty sectors change, so it is turned
    /// into "every dirty sector unknown".
    fn entry(&mut self, slot: SlotId, dirty_before: &[u64]) -> &mut LineSums {
        debug_assert_eq!(dirty_before.len(), self.words);
        if self.get(slot).is_none() {
            return self.insert(slot, dirty_before, None);
        }
        let line = self.get_mut(slot).expect("an entry");
        if line.restored.take().is_some() {
            line.unknown.copy_from_slice(dirty_before);
        }
        line
    }

    /// `slot` now holds another line (or nothing): forget what it held.
    pub fn line_replaced(&mut self, slot: SlotId) {
        let at = std::mem::replace(&mut self.index[slot as usize], NO_ENTRY);
        if at != NO_ENTRY {
            self.free.push(at);
        }
    }

    /// Dirty data was written to sectors `first..` of `slot`;
    /// `sector_sums[i]` is the checksum of sector `first + i`'s new data.
    pub fn written(&mut self, slot: SlotId, dirty_before: &[u64], first: u32, sector_sums: &[u64]) {
        let line = self.entry(slot, dirty_before);
        let end = first + sector_sums.len() as u32;
        line.sector[first as usize..end as usize].copy_from_slice(sector_sums);
        clear_range(&mut line.unknown, first, end);
    }

    /// Sectors `[first, end)` of `slot`, dirty or about to be, hold data
    /// this did not see (a failed write leaves the old or the new).
    pub fn unseen(&mut self, slot: SlotId, dirty_before: &[u64], first: u32, end: u32) {
        let line = self.entry(slot, dirty_before);
        set_range(&mut line.unknown, first, end);
    }

    /// Some dirty sectors of `slot` are about to become clean (written
    /// back, overwritten clean, forgotten): `dirty_before` is the dirty set
    /// before. Call [`DirtySums::cleaned`] after.
    pub fn shrinking(&mut self, slot: SlotId, dirty_before: &[u64]) {
        if let Some(line) = self.get_mut(slot) {
            if line.restored.take().is_some() {
                line.unknown.copy_from_slice(dirty_before);
            }
        }
    }

    /// The dirty set of `slot` is now `dirty_after`: an entry is kept only
    /// while it has dirty sectors.
    pub fn cleaned(&mut self, slot: SlotId, dirty_after: &[u64]) {
        if !any(dirty_after) {
            self.line_replaced(slot);
        }
    }

    /// A dirty line loaded at start-up whose sectors were read and verified:
    /// `terms` holds each sector's term (those of dirty sectors count).
    pub fn restored_terms(&mut self, slot: SlotId, terms: &[u64]) {
        self.line_replaced(slot);
        let none = vec![0; self.words];
        let line = self.insert(slot, &none, None);
        line.sector.copy_from_slice(terms);
    }

    /// The term of dirty sector `sector` of `slot` as the writes this saw
    /// left it, if known (not for a sector whose data this never saw, nor
    /// for a line restored with its total only).
    pub fn term(&self, slot: SlotId, sector: u32) -> Option<u64> {
        let line = self.get(slot)?;
        let unknown = line.unknown[(sector / 64) as usize] >> (sector % 64) & 1 == 1;
        (line.restored.is_none() && !unknown).then(|| line.sector[sector as usize])
    }

    /// The data of `slot`'s dirty sectors `dirty` was read back: `terms`
    /// (one per sector of the line) replaces what this did not know.
    pub fn learned(&mut self, slot: SlotId, dirty: &[u64], terms: &[u64]) {
        let line = self.entry(slot, dirty);
        for (s, &term) in terms.iter().enumerate() {
            let (w, bit) = (s / 64, 1u64 << (s % 64));
            if dirty[w] & bit != 0 && line.unknown[w] & bit != 0 {
                line.sector[s] = term;
                line.unknown[w] &= !bit;
            }
        }
    }

    /// A dirty line loaded at start-up whose record carried `checksum`,
    /// verified against its data.
    pub fn restored(&mut self, slot: SlotId, checksum: u64) {
        self.line_replaced(slot);
        let none = vec![0; self.words];
        self.insert(slot, &none, Some(checksum));
    }

    /// The checksum of `slot`'s dirty sectors `dirty` (0 with none), if
    /// every one of them was seen.
    pub fn checksum(&self, slot: SlotId, dirty: &[u64]) -> Option<u64> {
        if !any(dirty) {
            return Some(0);
        }
        let line = self.get(slot)?;
        if let Some(total) = line.restored {
            return Some(total);
        }
        if line.unknown.iter().zip(dirty).any(|(u, d)| u & d != 0) {
            return None;
        }
        let mut sum = 0u64;
        for s in 0..self.sectors_per_line {
            if dirty[(s / 64) as usize] >> (s % 64) & 1 == 1 {
                sum = sum.wrapping_add(line.sector[s as usize]);
            }
        }
        Some(sum)
    }

    /// Dirty lines tracked.
    #[cfg(test)]
    pub fn lines(&self) -> usize {
        self.slab.len() - self.free.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use iocache_format::{dirty_checksum, sector_checksums};

    /// Slot 0 of a table of two 16-sector lines, with the line's bytes and
    /// dirty bits as the engine holds them.
    struct Line {
        sums: DirtySums,
        bytes: Vec<u8>,
        dirty: u64,
    }

    impl Line {
        fn new(fill: u8, dirty: u64) -> Line {
            Line {
                sums: DirtySums::new(2, 16, 1),
                bytes: vec![fill; 16 * 512],
                dirty,
            }
        }

        /// Sectors `first..end` written with `byte`, and dirty.
        fn write(&mut self, first: u32, end: u32, byte: u8) {
            let at = first as usize * 512..end as usize * 512;
            self.bytes[at.clone()].fill(byte);
            let per_sector: Vec<u64> = sector_checksums(first, &self.bytes[at]).collect();
            self.sums.written(0, &[self.dirty], first, &per_sector);
            let mut bits = [self.dirty];
            set_range(&mut bits, first, end);
            self.dirty = bits[0];
        }

        /// What the sums say the dirty sectors' checksum is.
        fn checksum(&self) -> Option<u64> {
            self.sums.checksum(0, &[self.dirty])
        }

        /// A reference: the checksum the format defines over the line's
        /// bytes and dirty bits.
        fn reference(&self) -> u64 {
            dirty_checksum(&self.bytes, &[self.dirty])
        }
    }

    #[test]
    fn overlapping_writes_keep_the_checksum_known_and_right() {
        let mut line = Line::new(0, 0);
        line.write(0, 4, 1);
        line.write(8, 12, 2);
        line.write(2, 10, 3); // overlaps both
        line.write(3, 4, 4); // inside
        assert_eq!(line.checksum(), Some(line.reference()));
        // Written back in part: the rest still counts.
        line.sums.shrinking(0, &[line.dirty]);
        let mut after = [line.dirty];
        clear_range(&mut after, 0, 6);
        line.dirty = after[0];
        line.sums.cleaned(0, &[line.dirty]);
        assert_eq!(line.checksum(), Some(line.reference()));
        // All clean: nothing kept.
        line.sums.shrinking(0, &[line.dirty]);
        line.sums.cleaned(0, &[0]);
        assert_eq!(line.sums.lines(), 0);
        assert_eq!(line.sums.checksum(0, &[0]), Some(0));
    }

    #[test]
    fn unseen_data_makes_the_checksum_unknown_until_rewritten() {
        let mut line = Line::new(0, 0);
        line.write(0, 8, 1);
        line.sums.unseen(0, &[line.dirty], 2, 4);
        assert_eq!(line.checksum(), None);
        line.write(0, 4, 5);
        assert_eq!(line.checksum(), Some(line.reference()));
    }

    #[test]
    fn restored_or_learned_terms_count_sector_by_sector() {
        let mut line = Line::new(3, 0b1111);
        let terms: Vec<u64> = sector_checksums(0, &line.bytes).collect();
        line.sums.restored_terms(0, &terms);
        assert_eq!(line.sums.term(0, 2), Some(terms[2]));
        // A write to part of it: the rest still counts, sector by sector.
        line.write(0, 2, 9);
        assert_eq!(line.checksum(), Some(line.reference()));
        // Unseen data, then read back.
        line.sums.unseen(0, &[line.dirty], 1, 3);
        assert_eq!(line.checksum(), None);
        assert_eq!(line.sums.term(0, 1), None);
        let now: Vec<u64> = sector_checksums(0, &line.bytes).collect();
        line.sums.learned(0, &[line.dirty], &now);
        assert_eq!(line.checksum(), Some(line.reference()));
    }

    #[test]
    fn a_restored_total_holds_until_the_dirty_sectors_change() {
        let mut line = Line::new(7, 0b1111);
        line.sums.restored(0, line.reference());
        assert_eq!(line.checksum(), Some(line.reference()));
        // A write to part of it: the other restored sectors were never seen.
        line.write(0, 2, 9);
        assert_eq!(line.checksum(), None);
        line.write(2, 4, 9);
        assert_eq!(line.checksum(), Some(line.reference()));
        // A line with dirty sectors this never saw: unknown.
        assert_eq!(line.sums.checksum(1, &[1]), None);
    }
}

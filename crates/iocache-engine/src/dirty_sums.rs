//! Checksums of dirty data as the engine wrote it: per dirty line, the
//! checksum of each dirty sector, so that the checksum a dirty record
//! carries ([`iocache_format::dirty_checksum`], the sum of the sectors')
//! stays known however writes to the line overlap, without reading the line
//! back. The shadow (`persist.rs`) owns one per shard and asks it for a
//! record's checksum at each barrier.
//!
//! Memory: one `u64` per sector of each *dirty* line (1/64 of the dirty
//! data), released when the line is clean again.

use iocache_core::bitmap::{clear_range, set_range};
use iocache_core::fasthash::FxHashMap;
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
    lines: FxHashMap<SlotId, LineSums>,
}

fn any(bits: &[u64]) -> bool {
    bits.iter().any(|&w| w != 0)
}

impl DirtySums {
    /// For lines of `sectors_per_line` sectors (bitmaps of `words` words).
    pub fn new(sectors_per_line: u32, words: usize) -> DirtySums {
        DirtySums {
            sectors_per_line,
            words,
            lines: FxHashMap::default(),
        }
    }

    /// The entry of `slot`, created when missing: sectors dirty before
    /// (`dirty_before`) whose data this never saw are unknown. A restored
    /// total stops applying once the dirty sectors change, so it is turned
    /// into "every dirty sector unknown".
    fn entry(&mut self, slot: SlotId, dirty_before: &[u64]) -> &mut LineSums {
        let (sectors, words) = (self.sectors_per_line as usize, self.words);
        let line = self.lines.entry(slot).or_insert_with(|| LineSums {
            sector: vec![0; sectors].into_boxed_slice(),
            unknown: dirty_before.to_vec().into_boxed_slice(),
            restored: None,
        });
        debug_assert_eq!(line.unknown.len(), words);
        if line.restored.take().is_some() {
            line.unknown.copy_from_slice(dirty_before);
        }
        line
    }

    /// `slot` now holds another line (or nothing): forget what it held.
    pub fn line_replaced(&mut self, slot: SlotId) {
        self.lines.remove(&slot);
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
        if let Some(line) = self.lines.get_mut(&slot) {
            if line.restored.take().is_some() {
                line.unknown.copy_from_slice(dirty_before);
            }
        }
    }

    /// The dirty set of `slot` is now `dirty_after`: an entry is kept only
    /// while it has dirty sectors.
    pub fn cleaned(&mut self, slot: SlotId, dirty_after: &[u64]) {
        if !any(dirty_after) {
            self.lines.remove(&slot);
        }
    }

    /// A dirty line loaded at start-up whose record carried `checksum`,
    /// verified against its data.
    pub fn restored(&mut self, slot: SlotId, checksum: u64) {
        let (sectors, words) = (self.sectors_per_line as usize, self.words);
        self.lines.insert(
            slot,
            LineSums {
                sector: vec![0; sectors].into_boxed_slice(),
                unknown: vec![0; words].into_boxed_slice(),
                restored: Some(checksum),
            },
        );
    }

    /// The checksum of `slot`'s dirty sectors `dirty` (0 with none), if
    /// every one of them was seen.
    pub fn checksum(&self, slot: SlotId, dirty: &[u64]) -> Option<u64> {
        if !any(dirty) {
            return Some(0);
        }
        let line = self.lines.get(&slot)?;
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
        self.lines.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use iocache_format::{dirty_checksum, sector_checksums};

    /// A reference: the line's bytes and dirty bits, and the checksum the
    /// format defines over them.
    fn reference(line: &[u8], dirty: u64) -> u64 {
        dirty_checksum(line, &[dirty])
    }

    fn write(sums: &mut DirtySums, line: &mut [u8], dirty: &mut u64, first: u32, end: u32, byte: u8) {
        let at = first as usize * 512..end as usize * 512;
        line[at.clone()].fill(byte);
        let per_sector: Vec<u64> = sector_checksums(first, &line[at]).collect();
        sums.written(0, &[*dirty], first, &per_sector);
        let mut bits = [*dirty];
        set_range(&mut bits, first, end);
        *dirty = bits[0];
    }

    #[test]
    fn overlapping_writes_keep_the_checksum_known_and_right() {
        let mut sums = DirtySums::new(16, 1);
        let mut line = vec![0u8; 16 * 512];
        let mut dirty = 0u64;
        write(&mut sums, &mut line, &mut dirty, 0, 4, 1);
        write(&mut sums, &mut line, &mut dirty, 8, 12, 2);
        write(&mut sums, &mut line, &mut dirty, 2, 10, 3); // overlaps both
        write(&mut sums, &mut line, &mut dirty, 3, 4, 4); // inside
        assert_eq!(sums.checksum(0, &[dirty]), Some(reference(&line, dirty)));
        // Written back in part: the rest still counts.
        sums.shrinking(0, &[dirty]);
        let mut after = [dirty];
        clear_range(&mut after, 0, 6);
        dirty = after[0];
        sums.cleaned(0, &[dirty]);
        assert_eq!(sums.checksum(0, &[dirty]), Some(reference(&line, dirty)));
        // All clean: nothing kept.
        sums.shrinking(0, &[dirty]);
        sums.cleaned(0, &[0]);
        assert_eq!(sums.lines(), 0);
        assert_eq!(sums.checksum(0, &[0]), Some(0));
    }

    #[test]
    fn unseen_data_makes_the_checksum_unknown_until_rewritten() {
        let mut sums = DirtySums::new(16, 1);
        let mut line = vec![0u8; 16 * 512];
        let mut dirty = 0u64;
        write(&mut sums, &mut line, &mut dirty, 0, 8, 1);
        sums.unseen(0, &[dirty], 2, 4);
        assert_eq!(sums.checksum(0, &[dirty]), None);
        write(&mut sums, &mut line, &mut dirty, 0, 4, 5);
        assert_eq!(sums.checksum(0, &[dirty]), Some(reference(&line, dirty)));
    }

    #[test]
    fn a_restored_total_holds_until_the_dirty_sectors_change() {
        let mut sums = DirtySums::new(16, 1);
        let mut line = vec![7u8; 16 * 512];
        let mut dirty = 0b1111u64;
        sums.restored(0, reference(&line, dirty));
        assert_eq!(sums.checksum(0, &[dirty]), Some(reference(&line, dirty)));
        // A write to part of it: the other restored sectors were never seen.
        write(&mut sums, &mut line, &mut dirty, 0, 2, 9);
        assert_eq!(sums.checksum(0, &[dirty]), None);
        write(&mut sums, &mut line, &mut dirty, 2, 4, 9);
        assert_eq!(sums.checksum(0, &[dirty]), Some(reference(&line, dirty)));
        // A line with dirty sectors this never saw: unknown.
        assert_eq!(sums.checksum(1, &[1]), None);
    }
}

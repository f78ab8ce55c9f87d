//! A stack distance is the number of distinct lines
//! used since a line's previous access, i.e. the number of lines whose
//! latest access is later than that one. With one mark per tracked line at
//! the time of its latest access, that is a count of marks after a time.
//! A Fenwick tree with one counter per time answers it in O(log n) but
//! touches log n scattered cache lines of a large array per query; here the
//! marks are a bitmap and the Fenwick tree counts whole blocks of 512 times
//! (one 64-byte cache line of bits), so a query reads one line of bits and
//! a tree 512 times smaller, which stays in the CPU caches.

/// Times per block: 8 words of 64 bits, one 64-byte cache line.
const BLOCK_WORDS: usize = 8;
pub(super) const BLOCK_TIMES: usize = BLOCK_WORDS * 64;

/// Marks over times `0..capacity`.
pub(super) struct TimeMarks {
    bits: Vec<u64>,
    /// Fenwick tree over blocks: node `i` sums blocks `(i & (i + 1))..=i`.
    blocks: Vec<u32>,
    total: u64,
}

impl TimeMarks {
    /// No marks, room for `capacity` times (rounded up to whole blocks).
    pub(super) fn new(capacity: usize) -> Self {
        Self::first_marked(0, capacity)
    }

    /// Times `0..marked` marked, room for `capacity` times (at least
    /// `marked`, rounded up to whole blocks); built in O(capacity / 64).
    pub(super) fn first_marked(marked: usize, capacity: usize) -> Self {
        let blocks_len = capacity.max(marked).max(1).div_ceil(BLOCK_TIMES);
        let mut bits = vec![0u64; blocks_len * BLOCK_WORDS];
        for (w, word) in bits.iter_mut().enumerate().take(marked.div_ceil(64)) {
            let from = w * 64;
            *word = if marked - from >= 64 {
                u64::MAX
            } else {
                (1u64 << (marked - from)) - 1
            };
        }
        let mut blocks = vec![0u32; blocks_len];
        for (b, count) in blocks.iter_mut().enumerate() {
            let from = b * BLOCK_TIMES;
            *count = marked.saturating_sub(from).min(BLOCK_TIMES) as u32;
        }
        // Each node passes its sum to its parent: the Fenwick tree in O(n).
        for i in 0..blocks_len {
            let parent = i | (i + 1);
            if parent < blocks_len {
                blocks[parent] += blocks[i];
            }
        }
        TimeMarks {
            bits,
            blocks,
            total: marked as u64,
        }
    }

    /// Times this can mark (`0..capacity`).
    pub(super) fn capacity(&self) -> usize {
        self.bits.len() * 64
    }

    #[cfg(test)]
    fn total(&self) -> u64 {
        self.total
    }

    fn add_to_block(&mut self, block: usize, delta: i32) {
        let mut i = block;
        while i < self.blocks.len() {
            self.blocks[i] = self.blocks[i].wrapping_add_signed(delta);
            i |= i + 1;
        }
    }

    /// Marks `time` (which must be unmarked and below the capacity).
    pub(super) fn set(&mut self, time: usize) {
        let bit = 1u64 << (time % 64);
        debug_assert_eq!(self.bits[time / 64] & bit, 0, "time {time} marked twice");
        self.bits[time / 64] |= bit;
        self.add_to_block(time / BLOCK_TIMES, 1);
        self.total += 1;
    }

    /// Unmarks `time` (which must be marked).
    pub(super) fn clear(&mut self, time: usize) {
        let bit = 1u64 << (time % 64);
        debug_assert_ne!(self.bits[time / 64] & bit, 0, "time {time} not marked");
        self.bits[time / 64] &= !bit;
        self.add_to_block(time / BLOCK_TIMES, -1);
        self.total -= 1;
    }

    /// Marks at times `0..=time`.
    fn up_to(&self, time: usize) -> u64 {
        let block = time / BLOCK_TIMES;
        let mut sum = 0u64;
        let mut i = block;
        while i > 0 {
            sum += u64::from(self.blocks[i - 1]);
            i &= i - 1;
        }
        let word = time / 64;
        for w in block * BLOCK_WORDS..word {
            sum += u64::from(self.bits[w].count_ones());
        }
        let upto = u64::MAX >> (63 - time % 64);
        sum + u64::from((self.bits[word] & upto).count_ones())
    }

    /// Marks at times after `time`.
    pub(super) fn after(&self, time: usize) -> u64 {
        self.total - self.up_to(time)
    }

    /// The marked times in ascending order.
    pub(super) fn marked(&self) -> impl Iterator<Item = usize> + '_ {
        self.bits.iter().enumerate().flat_map(|(w, &word)| {
            let mut rest = word;
            std::iter::from_fn(move || {
                if rest == 0 {
                    return None;
                }
                let bit = rest.trailing_zeros() as usize;
                rest &= rest - 1;
                Some(w * 64 + bit)
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn first_marked_counts_and_lists() {
        for (marked, capacity) in [(0, 1), (1, 1), (63, 100), (64, 64), (700, 2000), (1500, 1500)] {
            let m = TimeMarks::first_marked(marked, capacity);
            assert!(m.capacity() >= capacity.max(marked));
            assert_eq!(m.capacity() % BLOCK_TIMES, 0);
            assert_eq!(m.total(), marked as u64);
            assert!(m.marked().eq(0..marked), "{marked}/{capacity}");
            for t in [0, marked / 2, marked.saturating_sub(1), marked, capacity - 1] {
                assert_eq!(
                    m.after(t),
                    marked.saturating_sub(t + 1) as u64,
                    "{marked}/{capacity} after {t}"
                );
            }
        }
    }

    proptest! {
        /// Against a plain list of booleans: every count after every time,
        /// through random sets and clears, starting from a marked prefix.
        #[test]
        fn counts_as_a_brute_force_list(
            prefix in 0usize..1200,
            extra in 0usize..1500,
            ops in proptest::collection::vec((any::<bool>(), 0usize..4000), 0..400),
        ) {
            let capacity = prefix + extra + 1;
            let mut m = TimeMarks::first_marked(prefix, capacity);
            let mut model: Vec<bool> = (0..m.capacity()).map(|t| t < prefix).collect();
            for (set, pick) in ops {
                let t = pick % model.len();
                if set && !model[t] {
                    m.set(t);
                    model[t] = true;
                } else if !set && model[t] {
                    m.clear(t);
                    model[t] = false;
                }
            }
            let mut after = 0u64;
            for t in (0..model.len()).rev() {
                prop_assert_eq!(m.after(t), after, "after {}", t);
                after += u64::from(model[t]);
            }
            prop_assert_eq!(m.total(), after);
            let listed: Vec<usize> = m.marked().collect();
            let expected: Vec<usize> = (0..model.len()).filter(|&t| model[t]).collect();
            prop_assert_eq!(listed, expected);
        }
    }
}

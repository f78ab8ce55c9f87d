//! Per-sector bitmaps of one line, stored as a slice of 64-bit words.
//!
//! A line of up to 32 KiB fits one word; a 1 MiB line needs 32. All
//! functions take half-open sector ranges `[start, end)` within the line.

/// Mask of bits `[start, end)` inside word `w` (bits counted from the line's start).
#[inline]
fn word_mask(w: usize, start: u32, end: u32) -> u64 {
    let lo = (w as u32) * 64;
    single_word_mask(start.max(lo) - lo, end.min(lo + 64) - lo)
}

#[inline]
fn words_in(start: u32, end: u32) -> std::ops::Range<usize> {
    (start / 64) as usize..end.div_ceil(64) as usize
}

/// Mask of bits `[start, end)` of a one-word line (`end <= 64`).
#[inline(always)]
pub fn single_word_mask(start: u32, end: u32) -> u64 {
    if end <= start {
        return 0;
    }
    let width = end - start;
    let bits = if width == 64 {
        u64::MAX
    } else {
        (1u64 << width) - 1
    };
    bits << start
}

// Lines up to 32 KiB (the common case) have one word; each function takes
// a branch-light path for them and the general loop otherwise.

#[inline]
pub fn set_range(map: &mut [u64], start: u32, end: u32) {
    if let [word] = map {
        *word |= single_word_mask(start, end);
        return;
    }
    for w in words_in(start, end) {
        map[w] |= word_mask(w, start, end);
    }
}

#[inline]
pub fn clear_range(map: &mut [u64], start: u32, end: u32) {
    if let [word] = map {
        *word &= !single_word_mask(start, end);
        return;
    }
    for w in words_in(start, end) {
        map[w] &= !word_mask(w, start, end);
    }
}

#[inline]
pub fn count_range(map: &[u64], start: u32, end: u32) -> u32 {
    if let [word] = map {
        // All or none set needs no population count (a software loop on
        // CPUs built for without `popcnt`).
        let mask = single_word_mask(start, end);
        let set = word & mask;
        return if set == 0 {
            0
        } else if set == mask {
            end - start
        } else {
            set.count_ones()
        };
    }
    words_in(start, end)
        .map(|w| (map[w] & word_mask(w, start, end)).count_ones())
        .sum()
}

#[inline]
pub fn any(map: &[u64]) -> bool {
    if let [word] = map {
        return *word != 0;
    }
    map.iter().any(|&w| w != 0)
}

#[inline]
pub fn count(map: &[u64]) -> u32 {
    map.iter().map(|w| w.count_ones()).sum()
}

#[inline]
pub fn clear(map: &mut [u64]) {
    if let [word] = map {
        *word = 0;
        return;
    }
    map.fill(0);
}

fn bit(map: &[u64], sector: u32) -> bool {
    map[(sector / 64) as usize] >> (sector % 64) & 1 == 1
}

/// Calls `f(start, end, is_set)` for each maximal run of equal bits in `[start, end)`.
#[inline]
pub fn for_each_run(map: &[u64], start: u32, end: u32, mut f: impl FnMut(u32, u32, bool)) {
    // The common cases, one run of set or of clear bits, without the scan.
    let set = count_range(map, start, end);
    if start < end && (set == 0 || set == end - start) {
        f(start, end, set != 0);
        return;
    }
    let mut run_start = start;
    while run_start < end {
        let value = bit(map, run_start);
        let mut run_end = run_start + 1;
        while run_end < end {
            // Skip whole words when the rest of the word matches.
            let w = (run_end / 64) as usize;
            let offset = run_end % 64;
            let word = if value { !map[w] } else { map[w] } >> offset;
            let same = if word == 0 {
                64 - offset
            } else {
                word.trailing_zeros()
            };
            if same == 0 {
                break;
            }
            run_end = (run_end + same).min(end);
        }
        f(run_start, run_end, value);
        run_start = run_end;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runs(map: &[u64], start: u32, end: u32) -> Vec<(u32, u32, bool)> {
        let mut out = Vec::new();
        for_each_run(map, start, end, |s, e, v| out.push((s, e, v)));
        out
    }

    #[test]
    fn ranges_across_words() {
        let mut map = vec![0u64; 3];
        set_range(&mut map, 60, 130);
        assert_eq!(count(&map), 70);
        assert_eq!(count_range(&map, 0, 64), 4);
        assert_eq!(count_range(&map, 64, 128), 64);
        clear_range(&mut map, 64, 128);
        assert_eq!(count(&map), 6);
        assert_eq!(
            runs(&map, 0, 192),
            vec![
                (0, 60, false),
                (60, 64, true),
                (64, 128, false),
                (128, 130, true),
                (130, 192, false)
            ]
        );
        assert_eq!(runs(&map, 61, 62), vec![(61, 62, true)]);
    }

    #[test]
    fn runs_match_bit_by_bit_reference() {
        // A deterministic pseudo-random pattern checked against a naive scan.
        let mut state = 0x1234_5678_9abc_def0u64;
        // One-word maps take the single-word paths, two-word maps the loops;
        // sparse, dense, empty and full words cover the one-run shortcut.
        for round in 0..800u64 {
            let words = 1 + (round % 2) as usize;
            let mut map = vec![0u64; words];
            for w in map.iter_mut() {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                *w = match (round / 2) % 4 {
                    0 => state & (state >> 3),
                    1 => state | (state >> 3),
                    2 => 0,
                    _ => u64::MAX,
                };
            }
            let bits = 64 * words as u64;
            let start = (state % 64) as u32;
            let end = start + 1 + ((state >> 8) % (bits - start as u64)) as u32;
            let mask_count = (start..end).filter(|&s| bit(&map, s)).count() as u32;
            assert_eq!(count_range(&map, start, end), mask_count);
            let mut expected: Vec<(u32, u32, bool)> = Vec::new();
            for s in start..end {
                let v = bit(&map, s);
                match expected.last_mut() {
                    Some(last) if last.2 == v => last.1 = s + 1,
                    _ => expected.push((s, s + 1, v)),
                }
            }
            assert_eq!(runs(&map, start, end), expected);
        }
    }
}

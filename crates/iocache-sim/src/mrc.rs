//! Why this file exists: sizing a cache needs its miss ratio at every size,
//! and simulating LRU once per size is slow on large traces. A miss-ratio
//! curve (MRC) gives every size from one pass, from stack distances: LRU
//! has the inclusion property (a cache of C lines holds exactly the C most
//! recently used lines), so an access hits every cache larger than the
//! number of distinct lines used since its line's previous access.
//!
//! The curves here are those of `iocache sim --policy lru` (write-back,
//! promotion `always`), to the last access, because they count hits as the
//! policy core does: a line access is a hit only when every requested
//! sector is valid, and a line holds only the sectors accessed since it was
//! last inserted. For a cache of C lines, the line was last inserted at its
//! most recent access whose stack distance was at least C, so an access is
//! a full hit in every cache of more than `threshold` lines, where walking
//! back through the line's earlier accesses until their sectors cover the
//! request, `threshold` is the largest stack distance met on the way
//! (the current access's and those of the accesses that had to stay hits).
//!
//! Methods: `exact` (every access; a Fenwick tree over access times counts
//! distinct lines in O(log n)), and SHARDS (Waldspurger et al., FAST'15):
//! spatial sampling by a hash of the line, at a fixed rate (`shards:RATE`,
//! with the SHARDS-adj correction) or with a fixed number of sampled lines
//! (`shards-fixed:N`, the rate lowered as lines arrive). Distances among
//! sampled lines are scaled by 1/rate.

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::str::FromStr;

use iocache_core::fasthash::FxBuildHasher;
use iocache_core::{split_request, LineKey, LineSize, SECTOR_BYTES};
use iocache_trace::TraceReader;
use serde::Serialize;

use crate::error::SimError;
use crate::run::request_of;

/// The largest line this module tracks sectors of (a line's sectors are one
/// `u64` mask).
pub const MAX_LINE_BYTES: u64 = 64 * SECTOR_BYTES;

/// Earlier accesses remembered per line, at most (a line accessed in more
/// pieces than this loses its oldest ones: an access that would need them
/// counts as a miss, which can only lower the curve's hits; never reached
/// when a line's pieces are at least its size / 64).
const HISTORY_PER_LINE: usize = 64;

/// How a curve is computed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum MrcMethod {
    /// Every access.
    Exact,
    /// Lines whose hash falls below `rate` of the hash space.
    Shards { rate: f64 },
    /// At most `max_lines` sampled lines; the rate starts at 1 and drops.
    ShardsFixed { max_lines: usize },
    /// Belady's OPT (MIN): on a miss in a full cache, evict the line used
    /// farthest in the future; computed at each size (O(n log C) each), with
    /// the same sector-level hits as the others. The bound no policy beats.
    Opt,
}

impl MrcMethod {
    pub const SYNTAX: &'static str =
        "exact, shards:RATE (0 < RATE <= 1, e.g. shards:0.01) or shards-fixed:LINES";
}

impl fmt::Display for MrcMethod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MrcMethod::Exact => f.write_str("exact"),
            MrcMethod::Shards { rate } => write!(f, "shards:{rate}"),
            MrcMethod::ShardsFixed { max_lines } => write!(f, "shards-fixed:{max_lines}"),
            MrcMethod::Opt => f.write_str("opt"),
        }
    }
}

impl FromStr for MrcMethod {
    type Err = SimError;
    fn from_str(text: &str) -> Result<Self, SimError> {
        let bad = |why: &str| SimError::Spec(format!("--method `{text}`: {why}; expected {}", Self::SYNTAX));
        match text.trim().split_once(':') {
            None if text.trim() == "exact" => Ok(MrcMethod::Exact),
            None if text.trim() == "opt" => Ok(MrcMethod::Opt),
            Some(("shards", rate)) => {
                let rate: f64 = rate.parse().map_err(|_| bad("the rate is not a number"))?;
                if !(rate > 0.0 && rate <= 1.0) {
                    return Err(bad("the rate must be above 0 and at most 1"));
                }
                Ok(MrcMethod::Shards { rate })
            }
            Some(("shards-fixed", lines)) => {
                let max_lines: usize = lines
                    .parse()
                    .map_err(|_| bad("the line count is not a whole number"))?;
                if max_lines < 16 {
                    return Err(bad("keep at least 16 lines"));
                }
                Ok(MrcMethod::ShardsFixed { max_lines })
            }
            _ => Err(bad("unknown method")),
        }
    }
}

/// One point of a curve.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct MrcPoint {
    pub cache_lines: u64,
    pub cache_bytes: u64,
    pub miss_ratio: f64,
}

/// One curve.
#[derive(Clone, Debug, Serialize)]
pub struct MrcCurve {
    pub method: String,
    /// Line accesses the curve stands for (sampled ones scaled by 1/rate).
    pub accesses: f64,
    /// Line accesses actually tracked.
    pub sampled_accesses: u64,
    /// Distinct lines tracked.
    pub sampled_lines: u64,
    /// The sampling rate at the end (1 for exact).
    pub final_rate: f64,
    pub points: Vec<MrcPoint>,
    /// Largest absolute difference from the exact curve at the same sizes,
    /// when the exact curve was computed too.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_error_vs_exact: Option<f64>,
}

/// All curves of one trace.
#[derive(Clone, Debug, Serialize)]
pub struct MrcReport {
    pub trace: String,
    pub format: String,
    pub line_size: u64,
    pub requests: u64,
    pub line_accesses: u64,
    /// Distinct lines (exact when the exact curve was computed, else the
    /// first curve's estimate).
    pub footprint_lines: u64,
    pub seconds: f64,
    pub curves: Vec<MrcCurve>,
}

/// Counts markers (the latest access time of each tracked line) over
/// access times: a Fenwick tree that doubles when time outgrows it.
struct TimeMarkers {
    tree: Vec<u32>,
    marked: Vec<bool>,
}

impl TimeMarkers {
    fn new() -> Self {
        TimeMarkers {
            tree: vec![0; 1 << 16],
            marked: vec![false; 1 << 16],
        }
    }

    fn ensure(&mut self, time: usize) {
        if time < self.marked.len() {
            return;
        }
        let mut len = self.marked.len();
        while len <= time {
            len *= 2;
        }
        self.marked.resize(len, false);
        self.tree = vec![0; len];
        // Rebuild in O(n): each node passes its sum to its parent.
        for i in 0..len {
            if self.marked[i] {
                self.tree[i] += 1;
            }
            let parent = i | (i + 1);
            if parent < len {
                let v = self.tree[i];
                self.tree[parent] += v;
            }
        }
    }

    fn add(&mut self, time: usize, delta: i32) {
        self.ensure(time);
        self.marked[time] = delta > 0;
        let mut i = time;
        while i < self.tree.len() {
            self.tree[i] = self.tree[i].wrapping_add_signed(delta);
            i |= i + 1;
        }
    }

    /// Markers at times `0..end`.
    fn prefix(&self, end: usize) -> u64 {
        let mut sum = 0u64;
        let mut i = end.min(self.tree.len());
        while i > 0 {
            sum += self.tree[i - 1] as u64;
            i &= i - 1;
        }
        sum
    }
}

/// What is remembered of one line: its latest access time, and its
/// earlier accesses newest first (sector mask, stack distance).
struct LineHistory {
    last_time: usize,
    /// (mask, distance); distance `u64::MAX` for the line's first access.
    accesses: Vec<(u64, u64)>,
}

/// One curve being computed.
struct Accumulator {
    method: MrcMethod,
    /// Sample lines whose hash is below this (of 2^64).
    threshold: u64,
    lines: HashMap<LineKey, LineHistory, FxBuildHasher>,
    /// Sampled lines by hash, for shards-fixed to drop the largest.
    by_hash: BTreeSet<(u64, LineKey)>,
    markers: TimeMarkers,
    /// Lines with a marker (`lines.len()`, kept apart for the borrow).
    lines_tracked: usize,
    time: usize,
    /// Weight of accesses that hit every cache above `threshold lines`
    /// (scaled), keyed by that threshold.
    hits_above: HashMap<u64, f64, FxBuildHasher>,
    /// Weight of all accesses counted.
    accesses: f64,
    sampled_accesses: u64,
}

fn rate_of(threshold: u64) -> f64 {
    if threshold == u64::MAX {
        1.0
    } else {
        threshold as f64 / 2f64.powi(64)
    }
}

/// A line's place in the hash space (Fx is not a good sampler on its own:
/// this mixes it with a finalizer so low and high bits are uniform).
fn line_hash(key: LineKey) -> u64 {
    let mut x = key.line_index ^ (u64::from(key.volume) << 48) ^ 0x9e37_79b9_7f4a_7c15;
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

impl Accumulator {
    fn new(method: MrcMethod) -> Self {
        let threshold = match method {
            MrcMethod::Exact | MrcMethod::ShardsFixed { .. } | MrcMethod::Opt => u64::MAX,
            MrcMethod::Shards { rate } if rate >= 1.0 => u64::MAX,
            MrcMethod::Shards { rate } => (rate * 2f64.powi(64)) as u64,
        };
        Accumulator {
            method,
            threshold,
            lines: HashMap::default(),
            by_hash: BTreeSet::new(),
            markers: TimeMarkers::new(),
            lines_tracked: 0,
            time: 0,
            hits_above: HashMap::default(),
            accesses: 0.0,
            sampled_accesses: 0,
        }
    }

    fn rate(&self) -> f64 {
        rate_of(self.threshold)
    }

    fn access(&mut self, key: LineKey, mask: u64, full_mask: u64) {
        let hash = line_hash(key);
        if self.method != MrcMethod::Exact && hash >= self.threshold {
            return;
        }
        // Counts are of sampled accesses; distances are scaled to the whole.
        let weight = 1.0;
        let scale = 1.0 / self.rate();
        self.accesses += weight;
        self.sampled_accesses += 1;
        let now = self.time;
        self.time += 1;
        match self.lines.get_mut(&key) {
            None => {
                self.lines.insert(
                    key,
                    LineHistory {
                        last_time: now,
                        accesses: vec![(mask, u64::MAX)],
                    },
                );
                self.markers.add(now, 1);
                self.lines_tracked += 1;
                if matches!(self.method, MrcMethod::ShardsFixed { .. }) {
                    self.by_hash.insert((hash, key));
                    self.shrink_to_fit();
                }
            }
            Some(line) => {
                // Distinct lines since this line's previous access: every
                // tracked line has one marker, at its latest access, and
                // all of them are before `now`.
                let tracked = self.lines_tracked as u64;
                let distance = tracked - self.markers.prefix(line.last_time + 1);
                let mut covered = 0u64;
                let mut largest = distance;
                let mut threshold = None;
                for &(earlier_mask, earlier_distance) in &line.accesses {
                    covered |= earlier_mask;
                    if covered & mask == mask {
                        threshold = Some(largest);
                        break;
                    }
                    if earlier_distance == u64::MAX {
                        break;
                    }
                    largest = largest.max(earlier_distance);
                }
                if let Some(t) = threshold {
                    let scaled = (t as f64 * scale).round() as u64;
                    *self.hits_above.entry(scaled).or_insert(0.0) += weight;
                }
                self.markers.add(line.last_time, -1);
                self.markers.add(now, 1);
                line.last_time = now;
                line.accesses.insert(0, (mask, distance));
                // Keep what a later walk can reach: up to the access whose
                // sectors complete the line, at most HISTORY_PER_LINE.
                let mut union = 0u64;
                let mut keep = line.accesses.len();
                for (i, &(m, _)) in line.accesses.iter().enumerate() {
                    union |= m;
                    if union & full_mask == full_mask {
                        keep = i + 1;
                        break;
                    }
                }
                line.accesses.truncate(keep.min(HISTORY_PER_LINE));
            }
        }
    }

    /// shards-fixed: drops the lines with the largest hashes until at most
    /// `max_lines` are sampled, lowering the rate to the largest kept, and
    /// rescales what was counted at the higher rate (SHARDS §4.2).
    fn shrink_to_fit(&mut self) {
        let MrcMethod::ShardsFixed { max_lines } = self.method else {
            return;
        };
        if self.by_hash.len() <= max_lines {
            return;
        }
        let old_rate = self.rate();
        while self.by_hash.len() > max_lines {
            let (hash, key) = self.by_hash.pop_last().expect("above max_lines");
            if let Some(line) = self.lines.remove(&key) {
                self.markers.add(line.last_time, -1);
                self.lines_tracked -= 1;
            }
            self.threshold = hash;
        }
        let factor = self.rate() / old_rate;
        // Counts so far were sampled at the old rate: SHARDS rescales them
        // by the ratio of the rates (what the new rate would have sampled);
        // the distances already counted keep their old scale.
        for v in self.hits_above.values_mut() {
            *v *= factor;
        }
        self.accesses *= factor;
    }

    fn finish(self, total_accesses: u64, sizes: &[u64], line_bytes: u64) -> MrcCurve {
        let rate = self.rate();
        let mut thresholds: Vec<(u64, f64)> = self.hits_above.into_iter().collect();
        thresholds.sort_unstable_by_key(|(t, _)| *t);
        // SHARDS-adj: the expected number of sampled accesses is known
        // (rate × all accesses); the difference is put in the first bucket
        // (hits in every cache), and the total is the expected one.
        let (total, adjustment) = match self.method {
            MrcMethod::Exact | MrcMethod::Opt => (self.accesses, 0.0),
            MrcMethod::Shards { .. } => {
                let expected = total_accesses as f64 * rate;
                (expected, expected - self.accesses)
            }
            MrcMethod::ShardsFixed { .. } => (self.accesses, 0.0),
        };
        let mut points = Vec::with_capacity(sizes.len());
        let mut i = 0;
        let mut hits = adjustment;
        for &lines in sizes {
            while i < thresholds.len() && thresholds[i].0 < lines {
                hits += thresholds[i].1;
                i += 1;
            }
            let miss_ratio = if total > 0.0 {
                (1.0 - hits / total).clamp(0.0, 1.0)
            } else {
                0.0
            };
            points.push(MrcPoint {
                cache_lines: lines,
                cache_bytes: lines * line_bytes,
                miss_ratio,
            });
        }
        MrcCurve {
            method: self.method.to_string(),
            accesses: total / rate,
            sampled_accesses: self.sampled_accesses,
            sampled_lines: self.lines.len() as u64,
            final_rate: rate,
            points,
            max_error_vs_exact: None,
        }
    }
}

/// The sizes a curve is given at when none are asked: powers of two from
/// one line up to the footprint, and the footprint.
pub fn default_sizes(footprint_lines: u64) -> Vec<u64> {
    let mut sizes = Vec::new();
    let mut s = 1u64;
    while s < footprint_lines {
        sizes.push(s);
        s *= 2;
    }
    sizes.push(footprint_lines.max(1));
    sizes
}

/// Computes the curves of `methods` in one pass over `reader`, at `sizes`
/// (cache sizes in lines, ascending; `None`: [`default_sizes`]).
pub fn miss_ratio_curves(
    reader: &mut TraceReader,
    line: LineSize,
    methods: &[MrcMethod],
    sizes: Option<&[u64]>,
    progress: &mut dyn FnMut(&TraceReader, u64),
) -> Result<MrcReport, SimError> {
    if line.bytes() > MAX_LINE_BYTES {
        return Err(SimError::Spec(format!(
            "miss-ratio curves track the sectors of lines up to {} B; {} B lines are not supported",
            MAX_LINE_BYTES,
            line.bytes()
        )));
    }
    if methods.is_empty() {
        return Err(SimError::Spec("no method given".into()));
    }
    let started = std::time::Instant::now();
    let sectors = (line.bytes() / SECTOR_BYTES) as u32;
    let full_mask = if sectors == 64 {
        u64::MAX
    } else {
        (1u64 << sectors) - 1
    };
    let mut accumulators: Vec<Accumulator> = methods
        .iter()
        .filter(|m| **m != MrcMethod::Opt)
        .map(|m| Accumulator::new(*m))
        .collect();
    // OPT needs the future: every line access, as (dense line id, mask).
    let want_opt = methods.contains(&MrcMethod::Opt);
    let mut ids: HashMap<LineKey, u32, FxBuildHasher> = HashMap::default();
    let mut sequence: Vec<(u32, u64)> = Vec::new();
    let mut requests = 0u64;
    let mut line_accesses = 0u64;
    while let Some(record) = reader.next() {
        let record = record?;
        let request = request_of(&record);
        if request.length_bytes == 0 {
            continue;
        }
        requests += 1;
        for part in split_request(&request, line) {
            line_accesses += 1;
            let width = part.end_sector - part.first_sector;
            let mask = if width == 64 {
                u64::MAX
            } else {
                ((1u64 << width) - 1) << part.first_sector
            };
            for a in &mut accumulators {
                a.access(part.key, mask, full_mask);
            }
            if want_opt {
                let next = ids.len() as u32;
                let id = *ids.entry(part.key).or_insert(next);
                sequence.push((id, mask));
            }
        }
        if requests.is_multiple_of(65_536) {
            progress(reader, requests);
        }
    }
    let exact_footprint = accumulators
        .iter()
        .find(|a| a.method == MrcMethod::Exact)
        .map(|a| a.lines.len() as u64)
        .or(want_opt.then_some(ids.len() as u64));
    let footprint_lines = exact_footprint.unwrap_or_else(|| {
        let a = &accumulators[0];
        (a.lines.len() as f64 / a.rate()).round() as u64
    });
    let sizes: Vec<u64> = match sizes {
        Some(s) => s.to_vec(),
        None => default_sizes(footprint_lines),
    };
    let mut finished = accumulators
        .into_iter()
        .map(|a| a.finish(line_accesses, &sizes, line.bytes()));
    // In the order asked.
    let mut curves: Vec<MrcCurve> = methods
        .iter()
        .map(|m| match m {
            MrcMethod::Opt => opt_curve(&sequence, ids.len(), &sizes, line.bytes()),
            _ => finished.next().expect("one accumulator per other method"),
        })
        .collect();
    if let Some(exact) = curves.iter().position(|c| c.method == "exact") {
        let reference: Vec<f64> = curves[exact].points.iter().map(|p| p.miss_ratio).collect();
        for (i, curve) in curves.iter_mut().enumerate() {
            // OPT is a bound, not an estimate of the exact curve.
            if i != exact && curve.method != "opt" {
                curve.max_error_vs_exact = Some(
                    curve
                        .points
                        .iter()
                        .zip(&reference)
                        .map(|(p, r)| (p.miss_ratio - r).abs())
                        .fold(0.0, f64::max),
                );
            }
        }
    }
    Ok(MrcReport {
        trace: reader.name().to_string(),
        format: reader.format().to_string(),
        line_size: line.bytes(),
        requests,
        line_accesses,
        footprint_lines,
        seconds: started.elapsed().as_secs_f64(),
        curves,
    })
}

/// Belady's OPT at each size: hits as the core counts them (every
/// requested sector valid; a line holds what was accessed since it was
/// inserted), evicting the line whose next use is farthest.
fn opt_curve(sequence: &[(u32, u64)], lines: usize, sizes: &[u64], line_bytes: u64) -> MrcCurve {
    // next[i]: the index of the next access to the same line (or MAX).
    let mut next = vec![u64::MAX; sequence.len()];
    let mut later = vec![u64::MAX; lines];
    for (i, &(id, _)) in sequence.iter().enumerate().rev() {
        next[i] = later[id as usize];
        later[id as usize] = i as u64;
    }
    let total = sequence.len() as f64;
    let points = sizes
        .iter()
        .map(|&capacity| {
            // Per line: its next use while resident (MAX: not resident
            // is told by `valid == 0`), and its valid sectors.
            let mut resident_next = vec![0u64; lines];
            let mut valid = vec![0u64; lines];
            let mut by_next: BTreeSet<(u64, u32)> = BTreeSet::new();
            let mut hits = 0u64;
            for (i, &(id, mask)) in sequence.iter().enumerate() {
                let slot = id as usize;
                if valid[slot] != 0 {
                    if valid[slot] & mask == mask {
                        hits += 1;
                    }
                    by_next.remove(&(resident_next[slot], id));
                } else if by_next.len() as u64 >= capacity {
                    let (_, victim) = by_next.pop_last().expect("full");
                    valid[victim as usize] = 0;
                }
                valid[slot] |= mask;
                resident_next[slot] = next[i];
                // Ties (never used again) broken by id, so the set holds
                // one entry per resident line.
                by_next.insert((next[i], id));
            }
            MrcPoint {
                cache_lines: capacity,
                cache_bytes: capacity * line_bytes,
                miss_ratio: if total > 0.0 {
                    1.0 - hits as f64 / total
                } else {
                    0.0
                },
            }
        })
        .collect();
    MrcCurve {
        method: "opt".into(),
        accesses: total,
        sampled_accesses: sequence.len() as u64,
        sampled_lines: lines as u64,
        final_rate: 1.0,
        points,
        max_error_vs_exact: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_count_and_grow() {
        let mut m = TimeMarkers::new();
        for t in [3usize, 70_000, 200_000] {
            m.add(t, 1);
        }
        assert_eq!(m.prefix(4), 1);
        assert_eq!(m.prefix(70_001), 2);
        assert_eq!(m.prefix(1 << 20), 3);
        m.add(3, -1);
        assert_eq!(m.prefix(1 << 20), 2);
    }

    #[test]
    fn methods_parse_and_refuse() {
        assert_eq!("exact".parse::<MrcMethod>().unwrap(), MrcMethod::Exact);
        assert_eq!(
            "shards:0.01".parse::<MrcMethod>().unwrap(),
            MrcMethod::Shards { rate: 0.01 }
        );
        assert_eq!(
            "shards-fixed:8192".parse::<MrcMethod>().unwrap(),
            MrcMethod::ShardsFixed { max_lines: 8192 }
        );
        for bad in ["shards:0", "shards:2", "shards-fixed:3", "belady", "shards:x"] {
            assert!(bad.parse::<MrcMethod>().is_err(), "{bad}");
        }
    }

    #[test]
    fn default_sizes_end_at_the_footprint() {
        assert_eq!(default_sizes(5), vec![1, 2, 4, 5]);
        assert_eq!(default_sizes(1), vec![1]);
    }
}

//! Sizing a cache needs its miss ratio at every size,
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
//! Methods: `exact` (every access; the distinct lines since an access are
//! the marks after its time, one mark per line at its latest access, counted
//! by `marks::TimeMarks` in O(log n)), and SHARDS (Waldspurger et al., FAST'15):
//! spatial sampling by a hash of the line, at a fixed rate (`shards:RATE`,
//! with the SHARDS-adj correction) or with a fixed number of sampled lines
//! (`shards-fixed:N`, the rate lowered as lines arrive). Distances among
//! sampled lines are scaled by 1/rate. `shards:RATE:SEED` salts the hash,
//! so that the spread of the sampling error can be measured over seeds.

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::str::FromStr;

use iocache_core::bitmap::single_word_mask;
use iocache_core::fasthash::FxBuildHasher;
use iocache_core::{split_request, LineKey, LineSize, SECTOR_BYTES};
use iocache_trace::TraceReader;
use serde::Serialize;

use crate::error::SimError;
use crate::run::request_of;
use crate::timing::rng::splitmix64_mix;

mod ids;
mod marks;
mod volumes;

pub use volumes::{per_volume_curves, PerVolumeReport, VolumeCurve, VolumeSizes};

use ids::LineIds;
use marks::TimeMarks;

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
    /// Lines whose hash falls below `rate` of the hash space; `seed`
    /// changes the hash, and so which lines are sampled (0: the default).
    Shards { rate: f64, seed: u64 },
    /// At most `max_lines` sampled lines; the rate starts at 1 and drops.
    ShardsFixed { max_lines: usize },
    /// Belady's OPT (MIN): on a miss in a full cache, evict the line used
    /// farthest in the future; computed at each size (O(n log C) each), with
    /// the same sector-level hits as the others. The bound no policy beats.
    Opt,
}

impl MrcMethod {
    pub const SYNTAX: &'static str =
        "exact, shards:RATE[:SEED] (0 < RATE <= 1, e.g. shards:0.01), shards-fixed:LINES or opt";
}

impl fmt::Display for MrcMethod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MrcMethod::Exact => f.write_str("exact"),
            MrcMethod::Shards { rate, seed: 0 } => write!(f, "shards:{rate}"),
            MrcMethod::Shards { rate, seed } => write!(f, "shards:{rate}:{seed}"),
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
            Some(("shards", rest)) => {
                let (rate, seed) = match rest.split_once(':') {
                    Some((rate, seed)) => (
                        rate,
                        seed.parse().map_err(|_| bad("the seed is not a whole number"))?,
                    ),
                    None => (rest, 0),
                };
                let rate: f64 = rate.parse().map_err(|_| bad("the rate is not a number"))?;
                if !(rate > 0.0 && rate <= 1.0) {
                    return Err(bad("the rate must be above 0 and at most 1"));
                }
                Ok(MrcMethod::Shards { rate, seed })
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
    /// The replacement policy the curve is of: `lru` for the exact and
    /// SHARDS curves, `opt` for Belady's, a miniature's own policy.
    pub policy: String,
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
    /// Mean absolute difference from the exact curve over the same sizes
    /// (MAE, as the literature reports sampled curves), when the exact
    /// curve was computed too.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mean_error_vs_exact: Option<f64>,
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

impl MrcReport {
    /// The report as `iocache trace mrc` prints it: a summary, each sampled
    /// curve's rate and error, and a table of miss ratios by cache size.
    pub fn text(&self) -> String {
        let mut out = format!(
            "trace {} ({}): {} line accesses of {} B lines, footprint {} lines, {} in {:.2} s\n",
            self.trace,
            self.format,
            self.line_accesses,
            self.line_size,
            self.footprint_lines,
            iocache_core::units::count(self.curves.len() as u64, "curve"),
            self.seconds
        );
        for curve in self.curves.iter().filter(|c| c.method != "exact") {
            out += &format!(
                "{}: {} sampled lines, final rate {:.5}{}\n",
                curve.method,
                curve.sampled_lines,
                curve.final_rate,
                match (curve.max_error_vs_exact, curve.mean_error_vs_exact) {
                    (Some(max), Some(mean)) =>
                        format!(", difference from exact: mean {mean:.4}, largest {max:.4}"),
                    _ => String::new(),
                }
            );
        }
        let (header, rows) = self.miss_table();
        let header: Vec<&str> = header.iter().map(String::as_str).collect();
        out + &crate::report::table(&header, &rows)
    }

    /// The miss ratios by cache size as a table: a header (cache lines,
    /// cache size, one column per curve) and a row per size of the first
    /// curve. The text report prints it; the lab's report adds columns.
    pub fn miss_table(&self) -> (Vec<String>, Vec<Vec<String>>) {
        let mut header = vec!["cache lines".to_string(), "cache size".to_string()];
        header.extend(self.curves.iter().map(|c| format!("miss {}", c.method)));
        let rows = self.curves[0]
            .points
            .iter()
            .enumerate()
            .map(|(i, point)| {
                let mut row = vec![
                    point.cache_lines.to_string(),
                    iocache_core::units::format_byte_size(point.cache_bytes),
                ];
                row.extend(self.curves.iter().map(|c| {
                    c.points
                        .get(i)
                        .map_or(String::new(), |p| format!("{:.4}", p.miss_ratio))
                }));
                row
            })
            .collect();
        (header, rows)
    }
}

/// Times given before the first compaction (and the fewest after one).
const MIN_TIMES: usize = 1 << 16;

/// Line accesses handed to the accumulators at once, so that the exact
/// curve can prefetch the table positions of the accesses ahead.
const BATCH: usize = 4096;

/// How far ahead (in line accesses) the exact curve prefetches.
const PREFETCH_AHEAD: usize = 12;

/// What is remembered of one tracked line: the time of its latest access
/// and its history, newest first, as (sector mask, stack distance) pairs
/// (distance `u64::MAX` for the line's first access). The newest pair is
/// kept here; older ones only while the newest does not cover the whole
/// line (partial-line accesses), in `Accumulator::older`.
#[derive(Clone, Copy)]
struct LineState {
    last_time: u32,
    /// Index into `Accumulator::older`, or `NO_OLDER`.
    older: u32,
    newest_mask: u64,
    newest_distance: u64,
}

const NO_OLDER: u32 = u32::MAX;
/// `Accumulator::owner` of a time whose line has left the sample.
const NO_OWNER: u32 = u32::MAX;

/// One curve being computed.
struct Accumulator {
    method: MrcMethod,
    /// Sample lines whose hash is below this (of 2^64).
    threshold: u64,
    /// Dense ids of the tracked lines.
    ids: LineIds,
    /// By id.
    states: Vec<LineState>,
    /// Older history of lines accessed in parts, newest first; free ones
    /// are listed in `free_older` for reuse.
    older: Vec<Vec<(u64, u64)>>,
    free_older: Vec<u32>,
    /// Sampled lines by hash, for shards-fixed to drop the largest.
    by_hash: BTreeSet<(u64, LineKey)>,
    /// One mark per tracked line, at its latest access time.
    marks: TimeMarks,
    /// The line (id) each time was given to; times are renumbered densely
    /// (`compact`) when they reach the marks' capacity.
    owner: Vec<u32>,
    /// Tracked lines (one mark each).
    lines_tracked: usize,
    time: usize,
    /// Exact curve: accesses that hit every cache above `index` lines.
    exact_hits: Vec<u64>,
    /// Sampled curves: weight of accesses that hit every cache above
    /// `threshold lines` (scaled), keyed by that threshold.
    hits_above: HashMap<u64, f64, FxBuildHasher>,
    /// Weight of all accesses counted.
    accesses: f64,
    sampled_accesses: u64,
    /// Hash salt (SHARDS: which lines are sampled).
    salt: u64,
    /// The fewest times the marks hold.
    min_times: usize,
}

fn rate_of(threshold: u64) -> f64 {
    if threshold == u64::MAX {
        1.0
    } else {
        threshold as f64 / 2f64.powi(64)
    }
}

/// The hash threshold below which a line is sampled at `rate` (`u64::MAX`:
/// every line), and the salt of `seed` (0: the default hash).
pub(crate) fn sample_threshold(rate: f64, seed: u64) -> (u64, u64) {
    let salt = if seed == 0 { 0 } else { splitmix64_mix(seed) };
    if rate >= 1.0 {
        (u64::MAX, salt)
    } else {
        ((rate * 2f64.powi(64)) as u64, salt)
    }
}

/// Whether a line of hash `hash` is in the sample below `threshold`.
pub(crate) fn is_sampled(hash: u64, threshold: u64) -> bool {
    threshold == u64::MAX || hash < threshold
}

/// A line's place in the hash space: the SplitMix64 finalizer over the
/// line index, the volume and the salt, so that low and high bits are
/// uniform (Fx, the maps' hash, is not a good sampler on its own).
pub(crate) fn line_hash(key: LineKey, salt: u64) -> u64 {
    splitmix64_mix(key.line_index ^ (u64::from(key.volume) << 48) ^ 0x9e37_79b9_7f4a_7c15 ^ salt)
}

impl Accumulator {
    fn new(method: MrcMethod) -> Self {
        Self::with_min_times(method, MIN_TIMES)
    }

    fn with_min_times(method: MrcMethod, min_times: usize) -> Self {
        let (threshold, salt) = match method {
            MrcMethod::Exact | MrcMethod::ShardsFixed { .. } | MrcMethod::Opt => (u64::MAX, 0),
            MrcMethod::Shards { rate, seed } => sample_threshold(rate, seed),
        };
        let marks = TimeMarks::new(min_times);
        Accumulator {
            method,
            threshold,
            ids: LineIds::new(),
            states: Vec::new(),
            older: Vec::new(),
            free_older: Vec::new(),
            by_hash: BTreeSet::new(),
            owner: vec![NO_OWNER; marks.capacity()],
            marks,
            lines_tracked: 0,
            time: 0,
            exact_hits: Vec::new(),
            hits_above: HashMap::default(),
            accesses: 0.0,
            sampled_accesses: 0,
            salt,
            min_times,
        }
    }

    fn rate(&self) -> f64 {
        rate_of(self.threshold)
    }

    /// The accesses of `batch` in order.
    fn access_batch(&mut self, batch: &[(LineKey, u64)], full_mask: u64) {
        if self.method == MrcMethod::Exact {
            for (i, &(key, mask)) in batch.iter().enumerate() {
                if let Some((ahead, _)) = batch.get(i + PREFETCH_AHEAD) {
                    self.ids.prefetch(ahead);
                }
                self.access(key, mask, full_mask);
            }
        } else {
            for &(key, mask) in batch {
                self.access(key, mask, full_mask);
            }
        }
    }

    /// Renumbers the tracked lines' latest times densely, in order, from 0
    /// (distances only compare times, so nothing else changes), with room
    /// for at least as many times again.
    fn compact(&mut self) {
        let tracked = self.lines_tracked;
        let capacity = self.min_times.max(2 * tracked + 1).next_power_of_two();
        assert!(capacity <= 1 << 32, "more than 2^31 distinct lines");
        let mut owner = vec![NO_OWNER; capacity];
        for (new_time, old_time) in self.marks.marked().enumerate() {
            let id = self.owner[old_time];
            self.states[id as usize].last_time = new_time as u32;
            owner[new_time] = id;
        }
        self.marks = TimeMarks::first_marked(tracked, capacity);
        self.owner = owner;
        self.time = tracked;
    }

    #[inline]
    fn access(&mut self, key: LineKey, mask: u64, full_mask: u64) {
        let hash = if self.method == MrcMethod::Exact {
            0
        } else {
            let hash = line_hash(key, self.salt);
            if hash >= self.threshold {
                return;
            }
            hash
        };
        // Counts are of sampled accesses; distances are scaled to the whole.
        self.accesses += 1.0;
        self.sampled_accesses += 1;
        if self.time == self.marks.capacity() {
            self.compact();
        }
        let now = self.time;
        self.time += 1;
        let (id, new) = self.ids.get_or_insert(&key);
        self.owner[now] = id;
        self.marks.set(now);
        if new {
            debug_assert_eq!(id as usize, self.states.len());
            self.states.push(LineState {
                last_time: now as u32,
                older: NO_OLDER,
                newest_mask: mask,
                newest_distance: u64::MAX,
            });
            self.lines_tracked += 1;
            if matches!(self.method, MrcMethod::ShardsFixed { .. }) {
                self.by_hash.insert((hash, key));
                self.shrink_to_fit();
            }
            return;
        }
        let line = self.states[id as usize];
        // Distinct lines since this line's previous access: every tracked
        // line has one mark, at its latest access; `now` is marked already.
        let distance = self.marks.after(line.last_time as usize) - 1;
        self.marks.clear(line.last_time as usize);
        let threshold = if line.newest_mask & mask == mask {
            Some(distance)
        } else {
            self.walk_older(&line, mask, distance)
        };
        if let Some(t) = threshold {
            if self.method == MrcMethod::Exact {
                let t = t as usize;
                if t >= self.exact_hits.len() {
                    self.exact_hits.resize((t + 1).next_power_of_two(), 0);
                }
                self.exact_hits[t] += 1;
            } else {
                let scaled = (t as f64 * (1.0 / self.rate())).round() as u64;
                *self.hits_above.entry(scaled).or_insert(0.0) += 1.0;
            }
        }
        let older = if mask == full_mask {
            self.release_older(line.older);
            NO_OLDER
        } else {
            self.push_older(line, mask, full_mask)
        };
        self.states[id as usize] = LineState {
            last_time: now as u32,
            older,
            newest_mask: mask,
            newest_distance: distance,
        };
    }

    /// The threshold of an access whose line's newest access does not
    /// cover its sectors: walking back through the older accesses until
    /// their sectors do, the largest stack distance met (`None`: never
    /// covered, a miss in every cache).
    fn walk_older(&self, line: &LineState, mask: u64, distance: u64) -> Option<u64> {
        if line.newest_distance == u64::MAX || line.older == NO_OLDER {
            return None;
        }
        let mut covered = line.newest_mask;
        let mut largest = distance.max(line.newest_distance);
        for &(earlier_mask, earlier_distance) in &self.older[line.older as usize] {
            covered |= earlier_mask;
            if covered & mask == mask {
                return Some(largest);
            }
            if earlier_distance == u64::MAX {
                return None;
            }
            largest = largest.max(earlier_distance);
        }
        None
    }

    /// A line accessed in part (sectors `mask`): its previous newest access
    /// joins the older ones, which keep what a later walk can reach: up to
    /// the access whose sectors, with the newer ones', complete the line,
    /// and at most HISTORY_PER_LINE accesses in all. Returns the line's
    /// `older` index.
    fn push_older(&mut self, line: LineState, mask: u64, full_mask: u64) -> u32 {
        let index = if line.older != NO_OLDER {
            line.older
        } else if let Some(free) = self.free_older.pop() {
            free
        } else {
            self.older.push(Vec::new());
            (self.older.len() - 1) as u32
        };
        let history = &mut self.older[index as usize];
        history.insert(0, (line.newest_mask, line.newest_distance));
        let mut union = mask;
        let mut keep = history.len();
        for (i, &(m, _)) in history.iter().enumerate() {
            union |= m;
            if union & full_mask == full_mask {
                keep = i + 1;
                break;
            }
        }
        history.truncate(keep.min(HISTORY_PER_LINE - 1));
        index
    }

    fn release_older(&mut self, index: u32) {
        if index != NO_OLDER {
            self.older[index as usize].clear();
            self.free_older.push(index);
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
            if let Some(id) = self.ids.remove(&key) {
                let line = self.states[id as usize];
                self.marks.clear(line.last_time as usize);
                self.owner[line.last_time as usize] = NO_OWNER;
                self.release_older(line.older);
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
        thresholds.extend(
            (0u64..)
                .zip(&self.exact_hits)
                .filter(|(_, &n)| n > 0)
                .map(|(t, &n)| (t, n as f64)),
        );
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
            policy: "lru".into(),
            accesses: total / rate,
            sampled_accesses: self.sampled_accesses,
            sampled_lines: self.lines_tracked as u64,
            final_rate: rate,
            points,
            max_error_vs_exact: None,
            mean_error_vs_exact: None,
        }
    }
}

/// Sets each estimate's difference from the exact curve (mean and largest,
/// at the sizes both have), when `curves` holds the exact one. OPT is a
/// bound, not an estimate, and is left alone; a miniature curve of a
/// policy other than LRU estimates that policy's curve, not LRU's, and
/// is left alone too.
pub fn compare_with_exact(curves: &mut [MrcCurve]) {
    let Some(exact) = curves.iter().position(|c| c.method == "exact") else {
        return;
    };
    let reference: std::collections::BTreeMap<u64, f64> = curves[exact]
        .points
        .iter()
        .map(|p| (p.cache_lines, p.miss_ratio))
        .collect();
    for (i, curve) in curves.iter_mut().enumerate() {
        let estimates_lru = curve.policy == "lru";
        if i == exact || !estimates_lru {
            continue;
        }
        let errors: Vec<f64> = curve
            .points
            .iter()
            .filter_map(|p| Some((p.miss_ratio - reference.get(&p.cache_lines)?).abs()))
            .collect();
        if errors.is_empty() {
            continue;
        }
        curve.max_error_vs_exact = Some(errors.iter().copied().fold(0.0, f64::max));
        curve.mean_error_vs_exact = Some(errors.iter().sum::<f64>() / errors.len() as f64);
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
    let full_mask = single_word_mask(0, line.sectors());
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
    let mut batch: Vec<(LineKey, u64)> = Vec::with_capacity(BATCH + 64);
    while let Some(record) = reader.next() {
        let record = record?;
        let request = request_of(&record);
        if request.length_bytes == 0 {
            continue;
        }
        requests += 1;
        for part in split_request(&request, line) {
            line_accesses += 1;
            let mask = single_word_mask(part.first_sector, part.end_sector);
            batch.push((part.key, mask));
            if want_opt {
                let next = ids.len() as u32;
                let id = *ids.entry(part.key).or_insert(next);
                sequence.push((id, mask));
            }
        }
        if batch.len() >= BATCH {
            for a in &mut accumulators {
                a.access_batch(&batch, full_mask);
            }
            batch.clear();
        }
        if requests.is_multiple_of(65_536) {
            progress(reader, requests);
        }
    }
    for a in &mut accumulators {
        a.access_batch(&batch, full_mask);
    }
    let exact_footprint = accumulators
        .iter()
        .find(|a| a.method == MrcMethod::Exact)
        .map(|a| a.lines_tracked as u64)
        .or(want_opt.then_some(ids.len() as u64));
    let footprint_lines = exact_footprint.unwrap_or_else(|| {
        let a = &accumulators[0];
        (a.lines_tracked as f64 / a.rate()).round() as u64
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
    compare_with_exact(&mut curves);
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
        policy: "opt".into(),
        accesses: total,
        sampled_accesses: sequence.len() as u64,
        sampled_lines: lines as u64,
        final_rate: 1.0,
        points,
        max_error_vs_exact: None,
        mean_error_vs_exact: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A direct LRU of `capacity` lines with the core's sector rule (a hit
    /// when every requested sector is valid; a line holds the sectors
    /// accessed since it was inserted): its hits.
    fn brute_force_lru_hits(accesses: &[(LineKey, u64)], capacity: usize) -> u64 {
        let mut list: Vec<(LineKey, u64)> = Vec::new(); // most recent first
        let mut hits = 0;
        for &(key, mask) in accesses {
            if let Some(at) = list.iter().position(|(k, _)| *k == key) {
                let (_, valid) = list.remove(at);
                hits += u64::from(valid & mask == mask);
                list.insert(0, (key, valid | mask));
            } else {
                if list.len() == capacity {
                    list.pop();
                }
                list.insert(0, (key, mask));
            }
        }
        hits
    }

    proptest! {
        /// The exact curve (and SHARDS at rate 1, and shards-fixed that
        /// never drops a line, which take the other paths) against a direct
        /// LRU at every size, with partial lines over two volumes, and
        /// times renumbered every few hundred accesses.
        #[test]
        fn curves_equal_a_brute_force_lru(
            accesses in proptest::collection::vec((0u32..2, 0u64..40, 0u32..8, 1u32..9), 1..1500),
        ) {
            let full_mask = 0xffu64;
            let accesses: Vec<(LineKey, u64)> = accesses
                .into_iter()
                .map(|(volume, line_index, first, width)| {
                    let width = width.min(8 - first);
                    (LineKey { volume, line_index }, ((1u64 << width) - 1) << first)
                })
                .collect();
            let sizes: Vec<u64> = (1..=80).collect();
            for method in [
                MrcMethod::Exact,
                MrcMethod::Shards { rate: 1.0, seed: 0 },
                MrcMethod::ShardsFixed { max_lines: 100 },
            ] {
                let mut a = Accumulator::with_min_times(method, BLOCK_FOR_TESTS);
                for chunk in accesses.chunks(97) {
                    a.access_batch(chunk, full_mask);
                }
                let curve = a.finish(accesses.len() as u64, &sizes, 4096);
                for point in &curve.points {
                    let hits = ((1.0 - point.miss_ratio) * accesses.len() as f64).round() as u64;
                    prop_assert_eq!(
                        hits,
                        brute_force_lru_hits(&accesses, point.cache_lines as usize),
                        "{} at {} lines", method, point.cache_lines
                    );
                }
            }
        }
    }

    /// The fewest times the marks hold (one block), so that the tests
    /// renumber times often.
    const BLOCK_FOR_TESTS: usize = marks::BLOCK_TIMES;

    #[test]
    fn methods_parse_and_refuse() {
        assert_eq!("exact".parse::<MrcMethod>().unwrap(), MrcMethod::Exact);
        assert_eq!(
            "shards:0.01".parse::<MrcMethod>().unwrap(),
            MrcMethod::Shards { rate: 0.01, seed: 0 }
        );
        assert_eq!(
            "shards:0.01:7".parse::<MrcMethod>().unwrap(),
            MrcMethod::Shards { rate: 0.01, seed: 7 }
        );
        assert_eq!(
            MrcMethod::Shards { rate: 0.01, seed: 7 }.to_string(),
            "shards:0.01:7"
        );
        assert_eq!(
            "shards-fixed:8192".parse::<MrcMethod>().unwrap(),
            MrcMethod::ShardsFixed { max_lines: 8192 }
        );
        for bad in [
            "shards:0",
            "shards:2",
            "shards-fixed:3",
            "belady",
            "shards:x",
            "shards:0.1:x",
        ] {
            assert!(bad.parse::<MrcMethod>().is_err(), "{bad}");
        }
    }

    #[test]
    fn default_sizes_end_at_the_footprint() {
        assert_eq!(default_sizes(5), vec![1, 2, 4, 5]);
        assert_eq!(default_sizes(1), vec![1]);
    }
}

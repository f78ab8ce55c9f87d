//! Stochastic multiqueue (SMQ): the default replacement and promotion policy of
//! Linux dm-cache, written by Joe Thornber (Red Hat) and merged in Linux 4.2 (2015)
//! as `drivers/md/dm-cache-policy-smq.c`, policy version 1.0; the version
//! modelled here is 2.0 (Linux 4.12 and later, still current), which moved
//! migrations to background work. It is described in the kernel's
//! `Documentation/admin-guide/device-mapper/cache-policies.rst` ("Stochastic
//! multiqueue (smq)": memory usage, level balancing, the hotspot queue, and
//! adaptation of the promotion threshold to cache performance). There is no
//! paper; the source is the reference, and this module was written from a
//! reading of it (nothing is copied).
//!
//! # Parameters
//!
//! `smq:hotspot_lines=16:hotspot_ratio=0.25:hotspot_min=1024:clock=auto:tick_ms=1000:tick_requests=1000:write_extra=2:mainline_max=0:strict=0`
//!
//! - `hotspot_lines` (16, 1 to 65 536): cache lines per hotspot block.
//! - `hotspot_ratio` (0.25, 0.01 to 4) and `hotspot_min` (1024, 1 to 2^20): the
//!   table holds `max(hotspot_ratio × lines, hotspot_min)` hotspot blocks (the
//!   kernel's `max(cache blocks / 4, 1024)`).
//! - `clock` (`auto`), `tick_ms` (1000) and `tick_requests` (1000): how ticks are
//!   derived (see *Time* below).
//! - `write_extra` (2, 0 to 64): extra hotspot levels a write miss needs over a
//!   read miss to be promoted.
//! - `mainline_max` (0 or 1, default 0): reproduce mainline's `max()` clamp of the
//!   promotion threshold (see *Deviations*).
//! - `strict` (0 or 1, default 0): choose victims exactly as mainline's demotion
//!   does, bypassing the line when it finds none (see *Demotion*).
//!
//! # Kernel mechanisms and where they are
//!
//! **Entries and queues.** The kernel keeps one entry per cache block, per
//! hotspot block and per sentinel in one array, linked by 28-bit indices. Here
//! cache entries are the cache's slot ids and sentinels follow them in one
//! `Arena` (one [`Links`] array plus a level byte per node); hotspot entries
//! have their own arena. A `MultiQueue` is the kernel's `struct queue`: 64
//! levels, each an LRU list (head = oldest, tail = newest), a count of real
//! (non-sentinel) entries per level and per queue, and per-level targets. There
//! are three queues, as in the kernel: `clean` and `dirty` for resident lines,
//! `hotspot` for hotspot blocks. The kernel's hash tables are replaced by the
//! cache's own index (the cache names the slot on a hit) and, for hotspot
//! blocks, a [`LineIndex`].
//!
//! **Level balancing, stochastic promotion (`q_requeue`).** A hit does not
//! count anything: the entry moves up `extra` levels and swaps with the oldest
//! entry of the destination level, which moves down to the hit entry's old
//! level, so level populations stay constant between redistributions
//! (`MultiQueue::requeue`). Cache entries rise one level per hit, and at most
//! once per cache period (`cache_hit_bits`, cleared every 60 ticks); hotspot
//! entries rise `hotspot_level_jump` levels on their first hit in a tick
//! (`hotspot_hit_bits`, cleared every tick) and are only moved to the tail of
//! their level on later hits in the same tick. When a dirty entry's swap
//! partner moves down, it is placed relative to the writeback sentinels so it
//! keeps its age class (in front of the older sentinel if it had passed none,
//! in front of the newer one if it had passed one), as mainline does; the
//! swap partner of a clean entry goes to the tail, as mainline does.
//!
//! **Redistribution (`q_redistribute`, `q_set_targets`).** At the end of each
//! hotspot period (every tick) the hotspot queue, and at the end of each cache
//! period (60 ticks) the clean and dirty queues, are rebalanced to target
//! counts per level, from level 0 up: a level under target takes the oldest
//! entries of the next populated level above; a level over target pops its
//! newest entries one by one and appends each to the tail of the level above.
//! (That is mainline; it reverses the order of the entries pushed up at each
//! level. smq 1.0 put them at the head of the level above, which kept their
//! order. Mainline is followed.) Cache queues spread their
//! entries evenly; the hotspot queue reserves its top 8 levels for
//! `min(hotspot blocks / 64, cache lines / hotspot_lines)` entries, so reaching
//! them means being among the hottest blocks.
//!
//! **Sentinels (`writeback_sentinel`, `demote_sentinel`, `update_sentinels`).**
//! Each cache queue holds two sets of 64 sentinels, one per level; every
//! writeback period (10 ticks) for the dirty queue and every demote period (60
//! ticks) for the clean queue, the older set is moved to the tails of its
//! levels and becomes the current one. An entry in front of both sentinels of
//! its level has not been touched for at least one whole period. Sentinels are
//! not counted in any size.
//!
//! **Hotspot queue (`update_hotspot_queue`).** Misses (only misses, as in
//! mainline 2.0) look up the hotspot block `line / hotspot_lines` of the same
//! volume: a known block is requeued as above; an unknown one takes a free
//! hotspot entry, or recycles the oldest entry of the lowest level (keeping that
//! entry's level, as the kernel does), and is pushed at the tail of its level.
//! The kernel sizes hotspot blocks as 16 cache blocks, halved until the table
//! does not cover more than the origin device, and keeps
//! `max(cache blocks / 4, 1024)` of them; the origin size is unknown here, so
//! the block is `hotspot_lines` lines and the table `max(hotspot_ratio × lines,
//! hotspot_min)` entries.
//!
//! **Admission (`should_promote`, `update_promote_levels`).** A missed line is
//! admitted ([`ReplacementPolicy::admit`]) when its hotspot block's level, after
//! the requeue of this access, is at least `read_promote_level` (reads) or
//! `write_promote_level` (writes). Both start at 64 (nothing is promoted before
//! the first tick). Every tick they are recomputed: the threshold is 32 levels
//! while the cache has free slots, else the kernel's table
//! `{1,1,1,2,4,6,7,8,7,6,4,4,3,3,2,2,1}` indexed by `16 × hits / (hits + misses)`
//! of the cache statistics (an access to a cache entry at level ≥ 48 is a hit,
//! any lower level or a miss is a miss), so promotion is most eager at a middling
//! hit ratio ("if it isn't broken, don't fix it"); the threshold is then divided
//! by 4 or 2 when the hotspot queue's own statistics (accesses at level ≥ 48 vs
//! the rest) show a confidence under 1/16 or 1/8. `read_promote_level = 64 −
//! threshold`; `write_promote_level = read_promote_level + write_extra`.
//! The level jump of hotspot hits is 4, 2 or 1 for the same three confidence
//! classes (poor, fair, well), updated every hotspot period, after which the
//! hotspot statistics reset; cache statistics reset every cache period.
//!
//! **Insertion.** A promoted line enters its queue (clean or dirty, from
//! [`AccessInfo::dirty`]) at the tail of the top level, as mainline 2.0's
//! `__complete_background_work` does.
//!
//! **Dirty state (`smq_set_dirty`, `smq_clear_dirty`).** A hit that leaves the
//! line dirty moves a clean entry to the tail of the same level of the dirty
//! queue (after its requeue, matching the kernel's order: lookup, then
//! set_dirty); [`ReplacementPolicy::on_clean`] moves it back.
//!
//! **Demotion (`queue_demotion`, `queue_writeback`).** Mainline demotes the
//! oldest entry of the lowest populated clean level among the bottom 32,
//! crossing demote sentinels. If there is none it does not demote and instead
//! queues the write-back of the oldest dirty entry not past a writeback
//! sentinel; the promotion waits. Mainline never evicts a dirty block. Victims
//! here, in order:
//! 1. mainline's demotion candidate (clean, levels 0-31, crossing sentinels);
//! 2. the oldest clean entry not past a demote sentinel, lowest level first
//!    (smq 1.0's `demote_cblock` rule, which gives the demote sentinels a role:
//!    in mainline they are always crossed and change nothing);
//! 3. any clean entry, lowest level first;
//! 4. mainline's write-back candidate (dirty, oldest not past a writeback
//!    sentinel, lowest level first), evicted at once: its write-back and
//!    demotion collapsed into one eviction;
//! 5. any dirty entry, lowest level first.
//!
//! With `strict=1` only step 1 is taken and, when it finds nothing, no victim is
//! named, so the cache bypasses the line, as mainline skips the promotion. (The
//! simulator runs no background write-back, so in write-back mode a strict SMQ
//! stops promoting once its clean entries are all in the top 32 levels or gone.)
//!
//! **Time (`smq_tick`).** dm-cache ticks the policy from its waker, once a
//! second (`COMMIT_PERIOD` = HZ in `dm-cache-target.c`). Each tick: rotate
//! sentinels whose period has elapsed, clear the hotspot hit bits, recompute
//! the promotion levels, end the hotspot period (level jump, redistribution,
//! statistics reset), end the cache period if due (cache hit bits, both cache
//! queues redistributed, statistics reset). Periods are counted in ticks here:
//! hotspot 1, writeback 10, cache 60, demote 60. Ticks come from the caller's
//! clock ([`AccessInfo::now_ns`], one every `tick_ms`) or from the request
//! count ([`AccessInfo::request_seq`], one every `tick_requests`), checked at
//! each call. `clock=time` and `clock=requests` force one; `clock=auto` (the
//! default) counts requests until the clock has advanced by more than 1 µs per
//! request since the first access (no real device serves more than a million
//! requests a second), then switches to the clock for good. Traces without
//! timestamps (the ARC traces, whose time is the request index) thus tick every
//! `tick_requests` requests. After an idle gap, at most 121 ticks are run (two
//! demote periods and one more: every period has then elapsed at least twice, so
//! running more would change nothing but which sentinel set is called current).
//!
//! # Deviations, and why
//!
//! - Promotion and demotion are synchronous: a promoted line gets its slot at
//!   once, evicting a victim when the cache is full. Mainline queues a demotion
//!   when a promotion finds no free block (keeping 25 % free is its target) and
//!   promotes on a later miss; this core's model has no background migrations.
//! - Dirty victims are allowed after clean ones (steps 4 and 5 above), because
//!   the simulator never cleans lines in the background and the cache would
//!   otherwise stop admitting; `strict=1` gives mainline's choice.
//! - Mainline clamps the threshold with `max(threshold, 64)`, which makes it 64
//!   whatever the table says (read level 0, 32 or 48 by hotspot confidence
//!   alone). That looks like a slip for `min`: the table and the "free slots:
//!   promote eagerly" case are otherwise dead code. The default follows the
//!   evident intent (smq 1.0's behaviour); `mainline_max=1` reproduces mainline.
//! - Writes need `write_extra` (default 2) more levels, as in smq 1.0; mainline
//!   2.0 dropped the extra (`write_extra=0`). Its "fast promotion" of writes
//!   covering a whole block while the cache has free blocks is not modelled: the
//!   policy is not told whether a write covers the whole line.
//! - Only misses the cache offers for admission update the hotspot queue and the
//!   statistics: misses under write policies that never allocate (write-around,
//!   write-invalidate, pass-through writes) are invisible to the policy.
//! - Periods are whole ticks and fire when due (`>=`); the kernel compares
//!   jiffies with `time_after` (`>`), so its periods are a jiffy or a tick longer.
//! - Hotspot blocks are keyed by volume as well as by line, since the cache
//!   serves several volumes; the origin size is unknown (see *Hotspot queue*).
//! - Invalidation ([`ReplacementPolicy::on_remove`]) drops the entry like
//!   mainline's `invalidate_mapping`.
//!
//! Memory: per slot a link pair, a level byte, a state byte and a hit bit; per
//! hotspot block a link pair, a level byte, a key and an index entry; 256
//! sentinels; all fixed at construction.

use super::list::{Links, ListHead, NIL};
use super::{AccessInfo, PolicyParams, ReplacementPolicy};
use crate::addr::{IoKind, LineKey, SlotId};
use crate::error::CoreError;
use crate::index::LineIndex;

/// Levels of every multiqueue (`NR_CACHE_LEVELS`, `NR_HOTSPOT_LEVELS`).
pub const LEVELS: usize = 64;
const TOP_LEVEL: u8 = (LEVELS - 1) as u8;
/// Accesses at or above this level count as hits in the statistics (3/4 of the levels).
const STATS_HIT_LEVEL: u8 = (LEVELS * 3 / 4) as u8;
/// Promotion threshold by cache hit ratio in sixteenths (`default_promote_level`).
const PROMOTE_TABLE: [u32; 17] = [1, 1, 1, 2, 4, 6, 7, 8, 7, 6, 4, 4, 3, 3, 2, 2, 1];
/// Periods in ticks (one tick = one second in the kernel).
pub const WRITEBACK_PERIOD_TICKS: u64 = 10;
pub const DEMOTE_PERIOD_TICKS: u64 = 60;
pub const HOTSPOT_PERIOD_TICKS: u64 = 1;
pub const CACHE_PERIOD_TICKS: u64 = 60;
/// Top hotspot levels reserved for the hottest blocks.
const HOTSPOT_TOP_LEVELS: u32 = 8;
/// Ticks run at most after an idle gap.
const CATCH_UP_TICKS: u64 = 2 * DEMOTE_PERIOD_TICKS + 1;
/// `clock=auto` trusts the clock once it advanced faster than this per request.
const REAL_CLOCK_NS_PER_REQUEST: u64 = 1000;
/// Sentinels: two sets of one per level, for each of the two cache queues.
const SENTINELS: u32 = 4 * LEVELS as u32;

const ABSENT: u8 = 0;
const CLEAN: u8 = 1;
const DIRTY: u8 = 2;

/// Where ticks come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClockMode {
    /// Requests until the clock looks real, then the clock.
    Auto,
    /// `now_ns`, one tick every `tick_ms`.
    Time,
    /// `request_seq`, one tick every `tick_requests`.
    Requests,
}

/// SMQ's parameters (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SmqParams {
    pub hotspot_lines: u64,
    pub hotspot_ratio: f64,
    pub hotspot_min: u64,
    pub clock: ClockMode,
    pub tick_ms: u64,
    pub tick_requests: u64,
    pub write_extra: u32,
    pub mainline_max: bool,
    pub strict: bool,
}

impl Default for SmqParams {
    fn default() -> Self {
        SmqParams {
            hotspot_lines: 16,
            hotspot_ratio: 0.25,
            hotspot_min: 1024,
            clock: ClockMode::Auto,
            tick_ms: 1000,
            tick_requests: 1000,
            write_extra: 2,
            mainline_max: false,
            strict: false,
        }
    }
}

/// Parameter names `smq` accepts.
pub const SMQ_PARAMS: &[&str] = &[
    "hotspot_lines",
    "hotspot_ratio",
    "hotspot_min",
    "clock",
    "tick_ms",
    "tick_requests",
    "write_extra",
    "mainline_max",
    "strict",
];

impl SmqParams {
    pub fn from_params(p: &PolicyParams) -> Result<Self, CoreError> {
        let d = SmqParams::default();
        let clock = match p.get("clock") {
            None | Some("auto") => ClockMode::Auto,
            Some("time") => ClockMode::Time,
            Some("requests") => ClockMode::Requests,
            Some(other) => {
                return Err(CoreError::BadParameter {
                    given: format!("clock={other}"),
                    reason: "`clock` must be auto, time or requests".to_string(),
                })
            }
        };
        Ok(SmqParams {
            hotspot_lines: p.u64_or("hotspot_lines", d.hotspot_lines, 1..=65_536)?,
            hotspot_ratio: p.f64_or("hotspot_ratio", d.hotspot_ratio, 0.01..=4.0)?,
            hotspot_min: p.u64_or("hotspot_min", d.hotspot_min, 1..=1 << 20)?,
            clock,
            tick_ms: p.u64_or("tick_ms", d.tick_ms, 1..=86_400_000)?,
            tick_requests: p.u64_or("tick_requests", d.tick_requests, 1..=1_000_000_000)?,
            write_extra: p.u64_or("write_extra", d.write_extra as u64, 0..=64)? as u32,
            mainline_max: p.u64_or("mainline_max", 0, 0..=1)? == 1,
            strict: p.u64_or("strict", 0, 0..=1)? == 1,
        })
    }
}

/// Queue nodes: links and a level per node; ids from `first_sentinel` on are sentinels.
struct Arena {
    links: Links,
    level: Vec<u8>,
    first_sentinel: u32,
}

impl Arena {
    fn new(nodes: usize, first_sentinel: u32) -> Self {
        Arena {
            links: Links::new(nodes),
            level: vec![0; nodes],
            first_sentinel,
        }
    }

    fn is_sentinel(&self, id: u32) -> bool {
        id >= self.first_sentinel
    }

    fn level(&self, id: u32) -> usize {
        self.level[id as usize] as usize
    }
}

/// The kernel's `struct queue`: 64 LRU lists, head = oldest.
struct MultiQueue {
    lists: [ListHead; LEVELS],
    /// Real (non-sentinel) entries per level.
    count: [u32; LEVELS],
    /// Bit `l` set when level `l` holds a real entry.
    occupied: u64,
    len: u32,
    targets: [u32; LEVELS],
    targets_for: Option<u32>,
    top_levels: u32,
    in_top_levels: u32,
}

impl MultiQueue {
    fn new(top_levels: u32, in_top_levels: u32) -> Self {
        MultiQueue {
            lists: [ListHead::default(); LEVELS],
            count: [0; LEVELS],
            occupied: 0,
            len: 0,
            targets: [0; LEVELS],
            targets_for: None,
            top_levels,
            in_top_levels,
        }
    }

    fn counted(&mut self, a: &Arena, id: u32, level: usize) {
        if !a.is_sentinel(id) {
            self.count[level] += 1;
            self.occupied |= 1 << level;
        }
    }

    fn uncounted(&mut self, a: &Arena, id: u32, level: usize) {
        if !a.is_sentinel(id) {
            self.count[level] -= 1;
            if self.count[level] == 0 {
                self.occupied &= !(1 << level);
            }
        }
    }

    /// Appends `id` to the tail (newest end) of its level.
    fn push(&mut self, a: &mut Arena, id: u32) {
        let level = a.level(id);
        a.links.push_tail(&mut self.lists[level], id);
        self.counted(a, id, level);
        self.len += !a.is_sentinel(id) as u32;
    }

    /// Links `id` just in front of `old` (same level).
    fn push_before(&mut self, a: &mut Arena, old: u32, id: u32) {
        let level = a.level(id);
        debug_assert_eq!(level, a.level(old));
        a.links.insert_before(&mut self.lists[level], old, id);
        self.counted(a, id, level);
        self.len += !a.is_sentinel(id) as u32;
    }

    fn del(&mut self, a: &mut Arena, id: u32) {
        let level = a.level(id);
        a.links.unlink(&mut self.lists[level], id);
        self.uncounted(a, id, level);
        self.len -= !a.is_sentinel(id) as u32;
    }

    /// The oldest real entry of the lowest populated level below `max_level`.
    /// Without `cross`, a level counts only if its oldest node is a real entry
    /// (not behind a sentinel).
    fn peek(&self, a: &Arena, max_level: usize, cross: bool) -> Option<u32> {
        let mut mask = if max_level >= LEVELS {
            self.occupied
        } else {
            self.occupied & ((1u64 << max_level) - 1)
        };
        while mask != 0 {
            let level = mask.trailing_zeros() as usize;
            let mut at = self.lists[level].head;
            while at != NIL {
                if !a.is_sentinel(at) {
                    return Some(at);
                }
                if !cross {
                    break;
                }
                at = a.links.next(at);
            }
            mask &= mask - 1;
        }
        None
    }

    /// Removes and returns the oldest entry of the lowest level (`q_pop`).
    fn pop(&mut self, a: &mut Arena) -> Option<u32> {
        let id = self.peek(a, LEVELS, true)?;
        self.del(a, id);
        Some(id)
    }

    /// `q_requeue`: moves `e` up `extra` levels to the tail, swapping the oldest
    /// real entry of the destination level down to `e`'s old level. With
    /// `sentinels` (the bases of the older and newer sentinel sets of this
    /// queue), the swapped entry keeps its age class relative to them.
    fn requeue(&mut self, a: &mut Arena, e: u32, extra: u32, sentinels: Option<(u32, u32)>) {
        let old = a.level(e);
        let new = (old + extra as usize).min(LEVELS - 1);
        if new != old {
            let mut passed = 0;
            let mut de = self.lists[new].head;
            while de != NIL && a.is_sentinel(de) {
                passed += 1;
                de = a.links.next(de);
            }
            if de != NIL {
                self.del(a, de);
                a.level[de as usize] = old as u8;
                match (sentinels, passed) {
                    (Some((older, _)), 0) => self.push_before(a, older + old as u32, de),
                    (Some((_, newer)), 1) => self.push_before(a, newer + old as u32, de),
                    _ => self.push(a, de),
                }
            }
        }
        self.del(a, e);
        a.level[e as usize] = new as u8;
        self.push(a, e);
    }

    fn set_targets_in(&mut self, entries: u32, begin: usize, end: usize) {
        let levels = (end - begin) as u32;
        if levels == 0 {
            return;
        }
        let (each, extra) = (entries / levels, entries % levels);
        for (i, target) in self.targets[begin..end].iter_mut().enumerate() {
            *target = each + ((i as u32) < extra) as u32;
        }
    }

    /// `q_set_targets`: even targets below the top levels, `in_top_levels`
    /// entries spread over the top ones.
    fn set_targets(&mut self) {
        if self.targets_for == Some(self.len) {
            return;
        }
        self.targets_for = Some(self.len);
        let top = self.top_levels as usize;
        let split = LEVELS - top;
        self.set_targets_in(self.in_top_levels, split, LEVELS);
        self.set_targets_in(self.len.saturating_sub(self.in_top_levels), 0, split);
    }

    /// `q_redistribute`: brings each level to its target, keeping the order.
    fn redistribute(&mut self, a: &mut Arena) {
        self.set_targets();
        for level in 0..LEVELS - 1 {
            let target = self.targets[level];
            while self.count[level] < target {
                let above = self.occupied & !((2u64 << level) - 1);
                if above == 0 {
                    break;
                }
                let from = above.trailing_zeros() as usize;
                let Some(e) = self.first_real(a, from) else {
                    break;
                };
                self.del(a, e);
                a.level[e as usize] = level as u8;
                self.push(a, e);
            }
            while self.count[level] > target {
                let Some(e) = self.last_real(a, level) else {
                    break;
                };
                self.del(a, e);
                a.level[e as usize] = level as u8 + 1;
                self.push(a, e);
            }
        }
    }

    fn first_real(&self, a: &Arena, level: usize) -> Option<u32> {
        let mut at = self.lists[level].head;
        while at != NIL && a.is_sentinel(at) {
            at = a.links.next(at);
        }
        (at != NIL).then_some(at)
    }

    fn last_real(&self, a: &Arena, level: usize) -> Option<u32> {
        let mut at = self.lists[level].tail;
        while at != NIL && a.is_sentinel(at) {
            at = a.links.prev(at);
        }
        (at != NIL).then_some(at)
    }

    /// Nodes of one level, oldest first (for tests).
    fn level_nodes(&self, a: &Arena, level: usize) -> Vec<u32> {
        a.links.iter(&self.lists[level]).collect()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Performance {
    Poor,
    Fair,
    Well,
}

/// Hits at the top quarter of the levels vs everything else (`struct stats`).
#[derive(Clone, Copy, Debug, Default)]
struct Stats {
    hits: u64,
    misses: u64,
}

impl Stats {
    fn level_accessed(&mut self, level: u8) {
        if level >= STATS_HIT_LEVEL {
            self.hits += 1;
        } else {
            self.misses += 1;
        }
    }

    fn miss(&mut self) {
        self.misses += 1;
    }

    /// Confidence in 1/256ths: under 1/16 poor, under 1/8 fair.
    fn assess(&self) -> Performance {
        let total = self.hits + self.misses;
        let confidence = (self.hits << 8).checked_div(total).unwrap_or(0);
        if confidence < 16 {
            Performance::Poor
        } else if confidence < 32 {
            Performance::Fair
        } else {
            Performance::Well
        }
    }
}

/// `update_promote_levels`: how many of the top hotspot levels are promoted.
fn promote_threshold(cache: Stats, full: bool, hotspot: Performance, mainline_max: bool) -> u32 {
    let levels = LEVELS as u32;
    let threshold = if full {
        let total = cache.hits + cache.misses;
        let index = (cache.hits << 4).checked_div(total).unwrap_or(0);
        PROMOTE_TABLE[index as usize]
    } else {
        levels / 2
    };
    let threshold = if mainline_max {
        threshold.max(levels)
    } else {
        threshold.min(levels)
    };
    match hotspot {
        Performance::Poor => threshold / 4,
        Performance::Fair => threshold / 2,
        Performance::Well => threshold,
    }
}

fn test_and_set(bits: &mut [u64], i: u32) -> bool {
    let (word, bit) = ((i / 64) as usize, 1u64 << (i % 64));
    let was = bits[word] & bit != 0;
    bits[word] |= bit;
    was
}

fn clear_bit(bits: &mut [u64], i: u32) {
    bits[(i / 64) as usize] &= !(1u64 << (i % 64));
}

/// The hotspot queue and its table.
struct Hotspot {
    arena: Arena,
    queue: MultiQueue,
    keys: Vec<LineKey>,
    index: LineIndex,
    allocated: u32,
    hit_bits: Vec<u64>,
    stats: Stats,
    level_jump: u32,
    lines_per_block: u64,
}

impl Hotspot {
    fn new(blocks: usize, lines_per_block: u64, capacity_lines: usize) -> Self {
        let in_top = (blocks / LEVELS).min(capacity_lines / lines_per_block as usize) as u32;
        Hotspot {
            arena: Arena::new(blocks, blocks as u32),
            queue: MultiQueue::new(HOTSPOT_TOP_LEVELS, in_top),
            keys: vec![
                LineKey {
                    volume: 0,
                    line_index: 0
                };
                blocks
            ],
            index: LineIndex::new(blocks),
            allocated: 0,
            hit_bits: vec![0; blocks.div_ceil(64)],
            stats: Stats::default(),
            level_jump: 1,
            lines_per_block,
        }
    }

    fn block_of(&self, key: LineKey) -> LineKey {
        LineKey {
            volume: key.volume,
            line_index: key.line_index / self.lines_per_block,
        }
    }

    fn find(&self, key: LineKey) -> Option<u32> {
        let block = self.block_of(key);
        let keys = &self.keys;
        self.index.get(&block, |e| keys[e as usize])
    }

    /// `update_hotspot_queue`: the level of `key`'s block after this access.
    fn update(&mut self, key: LineKey) -> Option<u8> {
        let block = self.block_of(key);
        if let Some(e) = self.find(key) {
            self.stats.level_accessed(self.arena.level[e as usize]);
            let extra = if test_and_set(&mut self.hit_bits, e) {
                0
            } else {
                self.level_jump
            };
            self.queue.requeue(&mut self.arena, e, extra, None);
            return Some(self.arena.level[e as usize]);
        }
        self.stats.miss();
        let e = if (self.allocated as usize) < self.keys.len() {
            let e = self.allocated;
            self.allocated += 1;
            self.arena.level[e as usize] = 0;
            e
        } else {
            // Recycle the coldest block; it keeps its level, as in the kernel.
            let e = self.queue.pop(&mut self.arena)?;
            let old = self.keys[e as usize];
            self.index.remove(&old, e);
            clear_bit(&mut self.hit_bits, e);
            e
        };
        self.keys[e as usize] = block;
        self.queue.push(&mut self.arena, e);
        self.index.insert(&block, e);
        Some(self.arena.level[e as usize])
    }
}

/// Turns the caller's clock or request count into ticks.
struct Clock {
    mode: ClockMode,
    tick_ns: u64,
    tick_requests: u64,
    started: bool,
    origin_ns: u64,
    origin_seq: u64,
    real_time: bool,
    next_ns: u64,
    next_seq: u64,
}

impl Clock {
    fn new(p: &SmqParams) -> Self {
        Clock {
            mode: p.clock,
            tick_ns: p.tick_ms * 1_000_000,
            tick_requests: p.tick_requests,
            started: false,
            origin_ns: 0,
            origin_seq: 0,
            real_time: p.clock == ClockMode::Time,
            next_ns: 0,
            next_seq: 0,
        }
    }

    fn due(at: u64, next: &mut u64, period: u64) -> u64 {
        if at < *next {
            return 0;
        }
        let ticks = (at - *next) / period + 1;
        *next = next.saturating_add(ticks * period);
        ticks
    }

    /// Ticks that elapsed up to this access.
    fn ticks_due(&mut self, info: &AccessInfo) -> u64 {
        let (now, seq) = (info.now_ns, info.request_seq);
        if !self.started {
            self.started = true;
            self.origin_ns = now;
            self.origin_seq = seq;
            self.next_ns = now.saturating_add(self.tick_ns);
            self.next_seq = seq.saturating_add(self.tick_requests);
            return 0;
        }
        if self.mode == ClockMode::Auto && !self.real_time {
            let elapsed_ns = now.saturating_sub(self.origin_ns);
            let requests = seq.saturating_sub(self.origin_seq);
            if elapsed_ns > requests.saturating_mul(REAL_CLOCK_NS_PER_REQUEST) {
                self.real_time = true;
                self.next_ns = now.saturating_add(self.tick_ns);
                return 0;
            }
        }
        if self.real_time {
            Self::due(now, &mut self.next_ns, self.tick_ns)
        } else {
            Self::due(seq, &mut self.next_seq, self.tick_requests)
        }
    }
}

/// The SMQ policy (see the module documentation).
pub struct Smq {
    params: SmqParams,
    capacity: u32,
    /// Slots `0..capacity`, then the writeback sentinels (two sets of 64), then
    /// the demote sentinels.
    arena: Arena,
    state: Vec<u8>,
    clean: MultiQueue,
    dirty: MultiQueue,
    cache_hit_bits: Vec<u64>,
    cache_stats: Stats,
    writeback_base: u32,
    demote_base: u32,
    /// Which sentinel set (0 or 1) was moved to the tails last.
    current_writeback: u32,
    current_demote: u32,
    hotspot: Hotspot,
    read_promote_level: u32,
    write_promote_level: u32,
    tick: u64,
    next_writeback: u64,
    next_demote: u64,
    next_hotspot: u64,
    next_cache: u64,
    clock: Clock,
    refused: u64,
    stalls: u64,
    dirty_evictions: u64,
}

impl Smq {
    pub fn new(capacity_lines: usize) -> Self {
        Self::with_params(capacity_lines, SmqParams::default()).expect("default parameters are valid")
    }

    pub fn with_params(capacity_lines: usize, params: SmqParams) -> Result<Self, CoreError> {
        if capacity_lines as u64 + SENTINELS as u64 >= NIL as u64 {
            return Err(CoreError::BadParameter {
                given: format!("{capacity_lines} lines"),
                reason: format!("smq supports at most {} lines", NIL - SENTINELS - 1),
            });
        }
        let capacity = capacity_lines as u32;
        let blocks =
            ((capacity_lines as f64 * params.hotspot_ratio) as usize).max(params.hotspot_min as usize);
        let mut smq = Smq {
            params,
            capacity,
            arena: Arena::new(capacity_lines + SENTINELS as usize, capacity),
            state: vec![ABSENT; capacity_lines],
            clean: MultiQueue::new(0, 0),
            dirty: MultiQueue::new(0, 0),
            cache_hit_bits: vec![0; capacity_lines.div_ceil(64)],
            cache_stats: Stats::default(),
            writeback_base: capacity,
            demote_base: capacity + 2 * LEVELS as u32,
            current_writeback: 1,
            current_demote: 1,
            hotspot: Hotspot::new(blocks, params.hotspot_lines, capacity_lines),
            read_promote_level: LEVELS as u32,
            write_promote_level: LEVELS as u32,
            tick: 0,
            next_writeback: WRITEBACK_PERIOD_TICKS,
            next_demote: DEMOTE_PERIOD_TICKS,
            next_hotspot: 0,
            next_cache: 0,
            clock: Clock::new(&params),
            refused: 0,
            stalls: 0,
            dirty_evictions: 0,
        };
        // Set 0, then set 1 (the current one) at every level: [older, newer].
        for set in 0..2 {
            for level in 0..LEVELS as u32 {
                let wb = smq.writeback_base + set * LEVELS as u32 + level;
                let dm = smq.demote_base + set * LEVELS as u32 + level;
                smq.arena.level[wb as usize] = level as u8;
                smq.arena.level[dm as usize] = level as u8;
                smq.dirty.push(&mut smq.arena, wb);
                smq.clean.push(&mut smq.arena, dm);
            }
        }
        Ok(smq)
    }

    pub fn params(&self) -> &SmqParams {
        &self.params
    }

    /// Ticks run so far.
    pub fn ticks(&self) -> u64 {
        self.tick
    }

    /// (read, write) promotion levels.
    pub fn promote_levels(&self) -> (u32, u32) {
        (self.read_promote_level, self.write_promote_level)
    }

    /// Levels a hotspot hit climbs (4, 2 or 1).
    pub fn hotspot_level_jump(&self) -> u32 {
        self.hotspot.level_jump
    }

    /// The level of a resident slot, if SMQ holds it.
    pub fn level_of(&self, slot: SlotId) -> Option<u8> {
        (self.state.get(slot as usize).copied()? != ABSENT).then(|| self.arena.level[slot as usize])
    }

    /// Whether SMQ holds `slot` as dirty.
    pub fn is_dirty(&self, slot: SlotId) -> bool {
        self.state.get(slot as usize) == Some(&DIRTY)
    }

    /// The level of `key`'s hotspot block, if it is tracked.
    pub fn hotspot_level(&self, key: LineKey) -> Option<u8> {
        self.hotspot
            .find(key)
            .map(|e| self.hotspot.arena.level[e as usize])
    }

    /// (clean, dirty, hotspot) entries.
    pub fn queue_lens(&self) -> (u32, u32, u32) {
        (self.clean.len, self.dirty.len, self.hotspot.queue.len)
    }

    /// Hotspot table capacity.
    pub fn hotspot_blocks(&self) -> usize {
        self.hotspot.keys.len()
    }

    /// Nodes of one dirty level oldest first, sentinels as `None` (for tests).
    pub fn dirty_level_layout(&self, level: usize) -> Vec<Option<SlotId>> {
        self.layout(&self.dirty, level)
    }

    /// Nodes of one clean level oldest first, sentinels as `None` (for tests).
    pub fn clean_level_layout(&self, level: usize) -> Vec<Option<SlotId>> {
        self.layout(&self.clean, level)
    }

    fn layout(&self, q: &MultiQueue, level: usize) -> Vec<Option<SlotId>> {
        q.level_nodes(&self.arena, level)
            .into_iter()
            .map(|n| (!self.arena.is_sentinel(n)).then_some(n))
            .collect()
    }

    /// Checks the queues' bookkeeping against their lists (O(capacity), for tests).
    pub fn check(&self) {
        for (q, which) in [(&self.clean, CLEAN), (&self.dirty, DIRTY)] {
            let mut total = 0;
            for level in 0..LEVELS {
                let nodes = q.level_nodes(&self.arena, level);
                let real: Vec<u32> = nodes
                    .iter()
                    .copied()
                    .filter(|&n| !self.arena.is_sentinel(n))
                    .collect();
                assert_eq!(nodes.len() - real.len(), 2, "one sentinel of each set per level");
                assert_eq!(real.len() as u32, q.count[level]);
                assert_eq!(q.occupied & (1 << level) != 0, !real.is_empty());
                for n in nodes {
                    assert_eq!(self.arena.level(n), level);
                }
                for n in &real {
                    assert_eq!(self.state[*n as usize], which);
                }
                total += real.len() as u32;
            }
            assert_eq!(total, q.len);
        }
        let resident = self.state.iter().filter(|&&s| s != ABSENT).count() as u32;
        assert_eq!(resident, self.clean.len + self.dirty.len);
        assert!(resident <= self.capacity);
        let h = &self.hotspot;
        assert_eq!(h.queue.len, h.allocated);
        assert_eq!(h.index.len() as u32, h.allocated);
        assert!(h.allocated as usize <= h.keys.len());
    }

    fn resident(&self) -> u32 {
        self.clean.len + self.dirty.len
    }

    fn advance(&mut self, info: &AccessInfo) {
        let due = self.clock.ticks_due(info);
        if due == 0 {
            return;
        }
        let run = due.min(CATCH_UP_TICKS);
        self.tick += due - run;
        for _ in 0..run {
            self.tick += 1;
            self.on_tick();
        }
    }

    /// Runs one tick now, whatever the clock says (for tests and drivers).
    pub fn force_tick(&mut self) {
        self.tick += 1;
        self.on_tick();
    }

    /// `smq_tick`: sentinels, end of hotspot period, end of cache period.
    fn on_tick(&mut self) {
        let t = self.tick;
        if t >= self.next_writeback {
            self.next_writeback = t + WRITEBACK_PERIOD_TICKS;
            self.current_writeback ^= 1;
            let base = self.writeback_base + self.current_writeback * LEVELS as u32;
            Self::rotate(&mut self.dirty, &mut self.arena, base);
        }
        if t >= self.next_demote {
            self.next_demote = t + DEMOTE_PERIOD_TICKS;
            self.current_demote ^= 1;
            let base = self.demote_base + self.current_demote * LEVELS as u32;
            Self::rotate(&mut self.clean, &mut self.arena, base);
        }
        self.hotspot.hit_bits.fill(0);
        self.update_promote_levels();
        if t >= self.next_hotspot {
            self.hotspot.level_jump = match self.hotspot.stats.assess() {
                Performance::Poor => 4,
                Performance::Fair => 2,
                Performance::Well => 1,
            };
            self.hotspot.queue.redistribute(&mut self.hotspot.arena);
            self.hotspot.stats = Stats::default();
            self.next_hotspot = t + HOTSPOT_PERIOD_TICKS;
        }
        if t >= self.next_cache {
            self.cache_hit_bits.fill(0);
            self.dirty.redistribute(&mut self.arena);
            self.clean.redistribute(&mut self.arena);
            self.cache_stats = Stats::default();
            self.next_cache = t + CACHE_PERIOD_TICKS;
        }
    }

    /// Moves one sentinel set (starting at `base`) to the tails of its levels.
    fn rotate(q: &mut MultiQueue, a: &mut Arena, base: u32) {
        for level in 0..LEVELS as u32 {
            q.del(a, base + level);
            q.push(a, base + level);
        }
    }

    fn update_promote_levels(&mut self) {
        let full = self.resident() >= self.capacity;
        let hotspot = self.hotspot.stats.assess();
        let threshold = promote_threshold(self.cache_stats, full, hotspot, self.params.mainline_max);
        self.read_promote_level = LEVELS as u32 - threshold;
        self.write_promote_level = self.read_promote_level + self.params.write_extra;
    }

    /// (older, newer) writeback sentinel set bases.
    fn writeback_sets(&self) -> (u32, u32) {
        let newer = self.current_writeback;
        let base = |set: u32| self.writeback_base + set * LEVELS as u32;
        (base(newer ^ 1), base(newer))
    }

    /// Removes a resident slot from its queue.
    fn forget(&mut self, slot: SlotId) {
        match self.state.get(slot as usize) {
            Some(&DIRTY) => self.dirty.del(&mut self.arena, slot),
            Some(&CLEAN) => self.clean.del(&mut self.arena, slot),
            _ => return,
        }
        self.state[slot as usize] = ABSENT;
        clear_bit(&mut self.cache_hit_bits, slot);
    }

    /// Moves a resident slot between the clean and dirty queues (same level, tail).
    fn set_dirty(&mut self, slot: SlotId, dirty: bool) {
        let was = self.state[slot as usize];
        let now = if dirty { DIRTY } else { CLEAN };
        if was == ABSENT || was == now {
            return;
        }
        if dirty {
            self.clean.del(&mut self.arena, slot);
            self.dirty.push(&mut self.arena, slot);
        } else {
            self.dirty.del(&mut self.arena, slot);
            self.clean.push(&mut self.arena, slot);
        }
        self.state[slot as usize] = now;
    }

    /// The victim, in the order of the module documentation.
    fn choose_victim(&self) -> Option<SlotId> {
        let a = &self.arena;
        let mainline = self.clean.peek(a, LEVELS / 2, true);
        if self.params.strict {
            return mainline;
        }
        mainline
            .or_else(|| self.clean.peek(a, LEVELS, false))
            .or_else(|| self.clean.peek(a, LEVELS, true))
            .or_else(|| self.dirty.peek(a, LEVELS, false))
            .or_else(|| self.dirty.peek(a, LEVELS, true))
    }
}

impl ReplacementPolicy for Smq {
    fn name(&self) -> &'static str {
        "smq"
    }

    fn on_hit(&mut self, slot: SlotId, info: &AccessInfo) {
        self.advance(info);
        let Some(level) = self.level_of(slot) else {
            debug_assert!(false, "hit on a slot SMQ does not hold");
            return;
        };
        self.cache_stats.level_accessed(level);
        if !test_and_set(&mut self.cache_hit_bits, slot) {
            if self.state[slot as usize] == DIRTY {
                let sets = self.writeback_sets();
                self.dirty.requeue(&mut self.arena, slot, 1, Some(sets));
            } else {
                self.clean.requeue(&mut self.arena, slot, 1, None);
            }
        }
        self.set_dirty(slot, info.dirty);
    }

    fn admit(&mut self, key: LineKey, info: &AccessInfo) -> Option<bool> {
        self.advance(info);
        self.cache_stats.miss();
        let level = self.hotspot.update(key).map_or(0, u32::from);
        let needed = match info.kind {
            IoKind::Read => self.read_promote_level,
            IoKind::Write => self.write_promote_level,
        };
        let promote = level >= needed;
        self.refused += !promote as u64;
        Some(promote)
    }

    fn on_miss(&mut self, _key: LineKey, need_victim: bool, info: &AccessInfo, victims: &mut Vec<SlotId>) {
        self.advance(info);
        if !need_victim {
            return;
        }
        match self.choose_victim() {
            Some(slot) => {
                self.dirty_evictions += (self.state[slot as usize] == DIRTY) as u64;
                self.forget(slot);
                victims.push(slot);
            }
            None => self.stalls += 1,
        }
    }

    fn on_insert(&mut self, slot: SlotId, _key: LineKey, info: &AccessInfo) {
        debug_assert_eq!(self.state[slot as usize], ABSENT);
        self.arena.level[slot as usize] = TOP_LEVEL;
        clear_bit(&mut self.cache_hit_bits, slot);
        if info.dirty {
            self.state[slot as usize] = DIRTY;
            self.dirty.push(&mut self.arena, slot);
        } else {
            self.state[slot as usize] = CLEAN;
            self.clean.push(&mut self.arena, slot);
        }
    }

    fn on_remove(&mut self, slot: SlotId) {
        self.forget(slot);
    }

    fn on_clean(&mut self, slot: SlotId) {
        self.set_dirty(slot, false);
    }

    fn next_victims(&self) -> [Option<SlotId>; 2] {
        [self.choose_victim(), None]
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("smq_refused", self.refused),
            ("smq_stalls", self.stalls),
            ("smq_dirty_evictions", self.dirty_evictions),
            ("smq_ticks", self.tick),
            ("smq_read_promote_level", self.read_promote_level as u64),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An arena of `real` entries followed by `sentinels` sentinel nodes.
    fn arena(real: u32, sentinels: u32) -> Arena {
        Arena::new((real + sentinels) as usize, real)
    }

    fn put(q: &mut MultiQueue, a: &mut Arena, id: u32, level: u8) {
        a.level[id as usize] = level;
        q.push(a, id);
    }

    /// A queue without top levels holding `entries` (id, level), put in
    /// order, over an arena of `real` lines and `sentinels` sentinels.
    fn queue_with(real: u32, sentinels: u32, entries: &[(u32, u8)]) -> (MultiQueue, Arena) {
        let mut a = arena(real, sentinels);
        let mut q = MultiQueue::new(0, 0);
        for &(id, level) in entries {
            put(&mut q, &mut a, id, level);
        }
        (q, a)
    }

    /// `n` entries (0 first) at `level` of a new queue with `top_levels`
    /// levels holding `top_target` entries each, redistributed.
    fn redistributed(n: u32, level: u8, top_levels: u32, top_target: u32) -> (MultiQueue, Arena) {
        let mut a = arena(n, 0);
        let mut q = MultiQueue::new(top_levels, top_target);
        for id in 0..n {
            put(&mut q, &mut a, id, level);
        }
        q.redistribute(&mut a);
        (q, a)
    }

    fn layout(q: &MultiQueue, a: &Arena) -> Vec<(usize, Vec<u32>)> {
        (0..LEVELS)
            .map(|l| (l, q.level_nodes(a, l)))
            .filter(|(_, n)| !n.is_empty())
            .collect()
    }

    #[test]
    fn requeue_swaps_with_the_oldest_entry_above() {
        let (mut q, mut a) = queue_with(3, 0, &[(0, 0), (1, 0), (2, 1)]);
        // 0 rises to level 1; the oldest of level 1 (2) drops to level 0's tail.
        q.requeue(&mut a, 0, 1, None);
        assert_eq!(layout(&q, &a), vec![(0, vec![1, 2]), (1, vec![0])]);
        assert_eq!((q.count[0], q.count[1], q.len), (2, 1, 3));
        // No extra level: 1 only moves to the tail of level 0.
        q.requeue(&mut a, 1, 0, None);
        assert_eq!(layout(&q, &a), vec![(0, vec![2, 1]), (1, vec![0])]);
        // At the top level nothing swaps.
        q.del(&mut a, 0);
        put(&mut q, &mut a, 0, TOP_LEVEL);
        q.requeue(&mut a, 0, 1, None);
        assert_eq!(a.level[0], TOP_LEVEL);
        assert_eq!(layout(&q, &a), vec![(0, vec![2, 1]), (63, vec![0])]);
    }

    #[test]
    fn requeue_keeps_the_swapped_entry_in_its_age_class() {
        // Real 0..3; sentinels: older set 3 (level 0), 4 (level 1); newer set 5, 6.
        // x = 0 at level 0; y = 1 (passed one sentinel) and z = 2 at level 1.
        let entries = [(0, 0), (3, 0), (5, 0), (4, 1), (1, 1), (6, 1), (2, 1)];
        let (mut q, mut a) = queue_with(3, 4, &entries);
        assert_eq!(q.len, 3);
        // Level 0: [x, S3, S5]; level 1: [S4, y, S6, z]. x rises; y is the first
        // real entry of level 1 after one sentinel, so it goes in front of the
        // newer sentinel of level 0 (5).
        q.requeue(&mut a, 0, 1, Some((3, 5)));
        assert_eq!(layout(&q, &a), vec![(0, vec![3, 1, 5]), (1, vec![4, 6, 2, 0])]);
        // y (now level 0) rises: level 1's first real entry is z, behind two
        // sentinels, so z goes to the tail of level 0.
        q.requeue(&mut a, 1, 1, Some((3, 5)));
        assert_eq!(layout(&q, &a), vec![(0, vec![3, 5, 2]), (1, vec![4, 6, 0, 1])]);
        // Move x to the head of level 1, in front of both sentinels.
        q.del(&mut a, 0);
        a.level[0] = 1;
        a.links.insert_before(&mut q.lists[1], 4, 0);
        q.counted(&a, 0, 1);
        q.len += 1;
        // z rises; level 1 is [x, S4, S6, y]: x passed no sentinel, so it goes in
        // front of level 0's older sentinel (3).
        q.requeue(&mut a, 2, 1, Some((3, 5)));
        assert_eq!(layout(&q, &a), vec![(0, vec![0, 3, 5]), (1, vec![4, 6, 1, 2])]);
    }

    #[test]
    fn peek_crosses_sentinels_only_when_asked() {
        // Level 0: [S2, 0]; level 5: [1, S3].
        let (mut q, mut a) = queue_with(2, 2, &[(2, 0), (0, 0), (1, 5), (3, 5)]);
        assert_eq!(q.peek(&a, LEVELS, true), Some(0));
        assert_eq!(q.peek(&a, LEVELS, false), Some(1)); // level 0's oldest is a sentinel
        assert_eq!(q.peek(&a, 5, false), None); // level 5 is out of range
        assert_eq!(q.peek(&a, 1, true), Some(0));
        assert_eq!(q.pop(&mut a), Some(0));
        assert_eq!(q.occupied, 1 << 5);
    }

    #[test]
    fn redistribute_pushes_up_to_the_tail_as_mainline_does() {
        // Four entries at level 0 (oldest 0), 64 cache levels: targets 1,1,1,1,0...
        let (q, a) = redistributed(4, 0, 0, 0);
        // Level 0 [0,1,2,3] keeps 0 and appends 3, 2, 1 to level 1: [3, 2, 1].
        // Level 1 keeps 3 and appends 1, 2 to level 2: [1, 2]. Level 2 keeps 1
        // and appends 2 to level 3.
        assert_eq!(
            layout(&q, &a),
            vec![(0, vec![0]), (1, vec![3]), (2, vec![1]), (3, vec![2])]
        );
    }

    #[test]
    fn redistribute_pulls_down_the_oldest_and_fills_the_top_levels() {
        // Three entries at level 9: targets 1,1,1 on levels 0-2 pull them down in order.
        let (q, a) = redistributed(3, 9, 0, 0);
        assert_eq!(layout(&q, &a), vec![(0, vec![0]), (1, vec![1]), (2, vec![2])]);
        // A hotspot-like queue: top 8 levels hold 2 entries (levels 56 and 57),
        // the remaining 1 goes to level 0. Entries 0, 1, 2 at level 0.
        let (q, a) = redistributed(3, 0, 8, 2);
        // Level 0 keeps 0, pushes 2 then 1: level 1 [2, 1]; every level up to 55
        // has target 0 and pushes both, reversing them each time: [1, 2] at even
        // levels, [2, 1] at odd ones, so level 56 receives 1 then 2 and keeps 1;
        // level 57 gets 2.
        assert_eq!(layout(&q, &a), vec![(0, vec![0]), (56, vec![1]), (57, vec![2])]);
    }

    #[test]
    fn promote_threshold_follows_the_table_and_the_hotspot_confidence() {
        let stats = |hits, misses| Stats { hits, misses };
        use Performance::*;
        // Free slots: 32 levels, cut to 16 or 8 when the hotspot queue is unsure.
        assert_eq!(promote_threshold(stats(0, 0), false, Well, false), 32);
        assert_eq!(promote_threshold(stats(0, 0), false, Fair, false), 16);
        assert_eq!(promote_threshold(stats(0, 0), false, Poor, false), 8);
        // Full: index 16 × hits / total. 8/16 → 8 → table 7; 7/16 → 7 → 8;
        // 15/16 → 15 → 2; 16/16 → 16 → 1; 1/16 → 1 → 1; 3/16 → 3 → 2.
        assert_eq!(promote_threshold(stats(8, 8), true, Well, false), 7);
        assert_eq!(promote_threshold(stats(7, 9), true, Well, false), 8);
        assert_eq!(promote_threshold(stats(15, 1), true, Well, false), 2);
        assert_eq!(promote_threshold(stats(16, 0), true, Well, false), 1);
        assert_eq!(promote_threshold(stats(1, 15), true, Well, false), 1);
        assert_eq!(promote_threshold(stats(3, 13), true, Well, false), 2);
        assert_eq!(promote_threshold(stats(7, 9), true, Fair, false), 4);
        assert_eq!(promote_threshold(stats(7, 9), true, Poor, false), 2);
        // Mainline's max(): always 64, then the confidence cut only.
        assert_eq!(promote_threshold(stats(7, 9), true, Well, true), 64);
        assert_eq!(promote_threshold(stats(0, 0), false, Fair, true), 32);
        assert_eq!(promote_threshold(stats(0, 0), false, Poor, true), 16);
    }

    #[test]
    fn statistics_assess_confidence_in_sixteenths() {
        let assess = |hits, misses| Stats { hits, misses }.assess();
        assert_eq!(assess(0, 0), Performance::Poor);
        assert_eq!(assess(1, 16), Performance::Poor); // 256/17 = 15 < 16
        assert_eq!(assess(1, 15), Performance::Fair); // 16
        assert_eq!(assess(1, 7), Performance::Well); // 32
    }

    #[test]
    fn clock_auto_counts_requests_until_the_clock_is_real() {
        let p = SmqParams {
            tick_requests: 10,
            tick_ms: 1,
            ..SmqParams::default()
        };
        let at = |now_ns, seq| AccessInfo {
            request_seq: seq,
            ..AccessInfo::read_at(now_ns)
        };
        // Time = request index (an ARC trace): a tick every 10 requests.
        let mut c = Clock::new(&p);
        assert_eq!(c.ticks_due(&at(0, 0)), 0);
        assert_eq!(c.ticks_due(&at(9, 9)), 0);
        assert_eq!(c.ticks_due(&at(10, 10)), 1);
        assert_eq!(c.ticks_due(&at(35, 35)), 2); // ticks at 20 and 30
        assert!(!c.real_time);
        // A real clock: 1 ms ticks once it runs faster than 1 µs per request.
        let mut c = Clock::new(&p);
        c.ticks_due(&at(5_000, 1));
        assert_eq!(c.ticks_due(&at(5_000, 2)), 0); // same instant
        assert_eq!(c.ticks_due(&at(2_000_000, 3)), 0); // switches to the clock
        assert!(c.real_time);
        assert_eq!(c.ticks_due(&at(2_999_999, 4)), 0);
        assert_eq!(c.ticks_due(&at(5_500_000, 5)), 3); // 3, 4 and 5 ms
                                                       // Forced modes.
        let mut c = Clock::new(&SmqParams {
            clock: ClockMode::Requests,
            ..p
        });
        c.ticks_due(&at(0, 0));
        assert_eq!(c.ticks_due(&at(1 << 40, 10)), 1);
        let mut c = Clock::new(&SmqParams {
            clock: ClockMode::Time,
            ..p
        });
        c.ticks_due(&at(0, 0));
        assert_eq!(c.ticks_due(&at(1_000_000, 1)), 1);
    }
}

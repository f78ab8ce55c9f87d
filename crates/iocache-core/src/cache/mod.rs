//! The cache: line metadata, the lookup index, and the decision logic that turns
//! a request into ops under a write policy, a promotion policy and a
//! replacement policy.
//!
//! No I/O, no threads, no clock: the caller passes `now_ns` and executes the ops.

use crate::addr::{
    request_lines, split_request, split_request_keys, IoKind, LineKey, LinePart, LineSize, Request, SlotId,
    VolumeId, SECTOR_BYTES,
};
use crate::balance::AccessHints;
use crate::bitmap;
use crate::cleaning::CleaningPolicy;
use crate::config::{CacheConfig, Fill, FlushOrder, Promotion, WritePolicy};
use crate::error::CoreError;
use crate::fasthash::FxHashMap;
use crate::index::{hash_of, LineIndex};
use crate::mode::{self, EffectiveMode, LineFacts, ModeCause, ModeSettings, RequestFacts};
use crate::ops::{DiscardOps, Op, OpList, OpSink};
use crate::policy::list::{Links, ListHead};
use crate::policy::{AccessInfo, ActivePolicy, PolicySpec, ReplacementPolicy};
use crate::promotion::Promoter;
use crate::seq_cutoff::{SeqCutoff, SeqDetector};
use crate::stats::CacheStats;

mod admit;
mod ahead;
mod driver;
mod flush;
mod process;
mod read;
mod resize;
mod write;

pub use process::ProcessSettings;
pub use resize::{ResizeProgress, RESIZE_STEP_LINES};

/// How one line access found the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LineOutcome {
    /// Every requested sector was valid.
    FullHit,
    /// Some requested sectors were valid.
    PartialHit,
    /// No requested sector was valid (the line may still be resident).
    Miss,
}

/// Per-request summary returned by [`Cache::access`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AccessSummary {
    pub lines: u32,
    pub full_hits: u32,
    pub partial_hits: u32,
    pub misses: u32,
    /// Dirty victims kept resident by this request (only with
    /// `inline_dirty_eviction = false`): a runtime should clean some lines.
    pub dirty_victims_kept: u32,
    /// The ops count their buffer offsets from the start of the request's
    /// first line, not from the request's offset (a read under
    /// [`Fill::Line`]): the driver gives a buffer from there to the end of
    /// the last line, and the request's bytes are at `offset % line`.
    pub line_origin: bool,
}

impl AccessSummary {
    /// Counts one line's outcome.
    #[inline(always)]
    fn count(&mut self, outcome: LineOutcome) {
        self.lines += 1;
        match outcome {
            LineOutcome::FullHit => self.full_hits += 1,
            LineOutcome::PartialHit => self.partial_hits += 1,
            LineOutcome::Miss => self.misses += 1,
        }
    }
}

/// A snapshot of one resident line (for tests, tools and the engine's metadata).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LineState {
    pub slot: SlotId,
    pub valid_sectors: u32,
    pub dirty_sectors: u32,
}

/// A flush in progress for one line: hand it back to [`Cache::complete_flush`]
/// once its write-back ops have finished.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlushToken {
    pub slot: SlotId,
    pub key: LineKey,
    generation: u64,
}

impl FlushToken {
    /// The slot's generation when the flush began (see [`Cache::slot_generation`]).
    pub fn generation(&self) -> u64 {
        self.generation
    }
}

/// Index positions the op-building path prefetches per request at most
/// (the counting walk prefetches every line, `LOOKAHEAD_LINES_MAX` ahead).
const PREFETCH_LINES_MAX: usize = 64;

/// Lines of one request that [`Cache::prefetch_ahead`] prefetches at most
/// (8 in most requests of the ARC traces at 512 B lines; the counting
/// walk prefetches a longer request's other lines itself, this many
/// lines ahead).
const LOOKAHEAD_LINES_MAX: u64 = 16;

const VALID: usize = 0;
const DIRTY: usize = 1;

/// What a lookup and a hit read of one slot: its line's key, the key's
/// index hash and (for lines up to 32 KiB) its valid and dirty bits. 32
/// bytes, the first half of the slot's [`SlotRecord`]. The key is kept as
/// its two fields so that the hash fits in what would be the key's
/// padding: an eviction finds the victim's index entry without hashing
/// its key again.
#[derive(Clone, Copy)]
#[repr(align(32))]
struct SlotLine {
    line_index: u64,
    volume: VolumeId,
    /// `index::hash_of(key)`, kept with the key by [`SlotLine::set_key`].
    hash: u32,
    /// Valid and dirty bits, inline when one word covers the line (lines up to 32 KiB).
    inline_bits: [u64; 2],
}

impl SlotLine {
    #[inline(always)]
    fn key(&self) -> LineKey {
        LineKey {
            volume: self.volume,
            line_index: self.line_index,
        }
    }

    /// Whether this slot's key is `key` (the fields compared in place).
    #[inline(always)]
    fn holds(&self, key: &LineKey) -> bool {
        self.line_index == key.line_index && self.volume == key.volume
    }

    /// Sets the key and its index hash (`hash` must be `hash_of(&key)`).
    #[inline(always)]
    fn set_key(&mut self, key: LineKey, hash: u32) {
        debug_assert_eq!(hash, hash_of(&key));
        self.line_index = key.line_index;
        self.volume = key.volume;
        self.hash = hash;
    }
}

const _: () = assert!(std::mem::size_of::<SlotLine>() == 32);

/// The rest of a slot's state, touched when a line is admitted, evicted,
/// dirtied or flushed (and, through `used_by_request` and the driver's
/// word, by a driver that keeps ops). 32 bytes.
#[derive(Clone, Copy)]
#[repr(align(32))]
struct SlotMeta {
    /// Bumped whenever the slot's contents change; a flush only cleans what it saw.
    generation: u64,
    dirty_since_ns: u64,
    /// The driver's word for this slot (see [`Cache::slot_driver_word_mut`]).
    driver_word: u64,
    /// The last request (`request_seq`, truncated) with ops on this slot:
    /// evicting a slot the current request already used seals the op list
    /// first. A slot last used 2^32 requests ago matches too, which only
    /// seals early (op order stays correct). Not kept when the ops are
    /// discarded ([`Cache::access_counted`]): sealing then does nothing.
    used_by_request: u32,
    resident: bool,
    dirty_listed: bool,
    flushing: bool,
    /// Inserted by a readahead fill and not used since.
    prefetched: bool,
}

const _: () = assert!(std::mem::size_of::<SlotMeta>() == 32);

/// One slot's records side by side in one 64-byte CPU cache line: what a
/// lookup reads (`line`) and what an admission or eviction also touches
/// (`meta`), so that an eviction's records arrive with one memory access
/// (one prefetch, one miss) rather than two. (Two arrays pack the hit
/// path's halves two to a CPU cache line; on the ARC trace P2 one array
/// measured 8-11 % faster for LRU in alternated runs:
/// `docs/results/sim-bench.md`.)
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct SlotRecord {
    line: SlotLine,
    meta: SlotMeta,
}

const _: () = assert!(std::mem::size_of::<SlotRecord>() == 64);

/// Why a write must wait under ordered write-back ([`Cache::ordered_write_waits`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OrderedWait {
    /// A line it writes is dirty from this older epoch: wait until every
    /// line of that epoch is on the backend.
    Epoch(u64),
    /// It needs more free or clean slots, or more dirty lines under the
    /// cap, than the cache has now: wait for cleaning.
    Room,
    /// It needs more than cleaning could make room for: part of it goes to
    /// the backend, which must hold every older epoch first.
    ToBackend,
}

/// A view of one slot's line (see [`Cache::slot_snapshot`]).
#[derive(Clone, Copy, Debug)]
pub struct SlotSnapshot<'a> {
    pub key: LineKey,
    pub valid: &'a [u64],
    pub dirty: &'a [u64],
    /// The flush epoch a dirty line became dirty in (ordered write-back;
    /// 0 otherwise).
    pub epoch: u64,
}

/// How many lines of one volume a cache holds (see [`Cache::volume_lines`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VolumeLines {
    pub resident: u64,
    pub dirty: u64,
}

/// What [`Cache::discard_lines`] dropped.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DiscardedLines {
    /// Lines dropped.
    pub lines: u64,
    /// Of those, lines that held dirty data (discarded, not written back).
    pub dirty: u64,
}

/// A line to load into a slot (see [`Cache::restore`]).
#[derive(Clone, Copy, Debug)]
pub struct RestoredLine<'a> {
    pub slot: SlotId,
    pub key: LineKey,
    pub valid: &'a [u64],
    pub dirty: &'a [u64],
    /// The flush epoch a dirty line became dirty in (ordered write-back;
    /// 0 otherwise).
    pub epoch: u64,
}

pub struct Cache {
    config: CacheConfig,
    line: LineSize,
    words: usize,
    index: LineIndex,
    /// Per slot: its records (see [`SlotRecord`]).
    records: Vec<SlotRecord>,
    /// For lines over 32 KiB: per slot, `words` of valid bits then `words` of dirty bits.
    bits: Vec<u64>,
    dirty_links: Links,
    /// Dirty lines, oldest-dirtied at the head (under ordered write-back,
    /// so also in ascending epoch).
    dirty_list: ListHead,
    /// Under ordered write-back, per slot: the flush epoch its line became
    /// dirty in (empty otherwise).
    epochs: Vec<u64>,
    /// The flush epoch writes join now ([`Cache::set_epoch`]).
    epoch: u64,
    /// Where the next search for any clean victim starts (ordered
    /// write-back).
    clean_cursor: usize,
    free: Vec<SlotId>,
    /// Slots out of service: their device failed ([`Cache::retire_slots`])
    /// or a resize took them out (`resize.rs`); empty until the first.
    retired: Vec<bool>,
    retired_count: usize,
    /// Dirty lines a resize chose to leave once written back: slot and
    /// generation then (`resize.rs`).
    retiring: FxHashMap<SlotId, u64>,
    policy: ActivePolicy,
    promoter: Promoter,
    stats: CacheStats,
    flush_cursor: Option<LineKey>,
    runs: Vec<(u32, u32, bool)>,
    victims: Vec<SlotId>,
    request_seq: u64,
    /// Dirty victims kept by the request in progress.
    request_dirty_victims_kept: u32,
    /// A readahead fill is in progress: its misses are admitted whatever
    /// the promotion policy says.
    filling_ahead: bool,
    /// The read in progress fills whole lines ([`Fill::Line`]).
    request_line_fill: bool,
    /// What decides the effective write policy besides the request: the
    /// configured policy, a controller's, a failed cache device (`mode.rs`).
    mode: ModeSettings,
    /// What a controller set apart for single processes (ReCA's
    /// per-process characterization, `process.rs`); empty unless one did.
    processes: FxHashMap<u32, ProcessSettings>,
    /// The extent fill the last request left for the driver
    /// ([`Cache::take_extent_fill`]); only set while `processes` is not empty.
    extent_fill: Option<Request>,
    /// What the decision knows about the request in progress.
    request_facts: RequestFacts,
    /// The write policy for the request in progress (`mode::resolve`).
    request_policy: WritePolicy,
    seq: SeqDetector,
    last_request_ns: Option<u64>,
    cleaner_last_ns: Option<u64>,
    /// Resident and dirty lines per volume, kept up to date once
    /// [`Cache::count_volume_lines`] turned counting on.
    volume_lines: Option<FxHashMap<VolumeId, VolumeLines>>,
}

impl Cache {
    pub fn new(config: CacheConfig) -> Result<Self, CoreError> {
        config.validate()?;
        let in_service = config.lines_in_service;
        let mut cache = Cache::with_every_slot(config)?;
        if let Some(lines) = in_service {
            // Free slots only: one call.
            let progress = cache.resize(lines, 0, &mut OpList::new())?;
            debug_assert!(progress.done());
        }
        Ok(cache)
    }

    fn with_every_slot(config: CacheConfig) -> Result<Self, CoreError> {
        let lines = config.capacity_lines as usize;
        let line = config.line_size;
        let words = line.bitmap_words();
        let none = LineKey {
            volume: 0,
            line_index: 0,
        };
        Ok(Cache {
            line,
            words,
            index: LineIndex::new(lines),
            records: vec![
                SlotRecord {
                    line: SlotLine {
                        line_index: none.line_index,
                        volume: none.volume,
                        hash: hash_of(&none),
                        inline_bits: [0; 2],
                    },
                    meta: SlotMeta {
                        generation: 0,
                        dirty_since_ns: 0,
                        used_by_request: 0,
                        driver_word: 0,
                        resident: false,
                        dirty_listed: false,
                        flushing: false,
                        prefetched: false,
                    },
                };
                lines
            ],
            bits: if words == 1 {
                Vec::new()
            } else {
                vec![0; lines * words * 2]
            },
            dirty_links: Links::new(lines),
            dirty_list: ListHead::default(),
            epochs: if config.ordered_write_back {
                vec![0; lines]
            } else {
                Vec::new()
            },
            epoch: 0,
            clean_cursor: 0,
            free: (0..lines as SlotId).rev().collect(),
            retired: Vec::new(),
            retired_count: 0,
            retiring: FxHashMap::default(),
            policy: ActivePolicy::build(&config.policy, lines)?,
            promoter: Promoter::new(config.promotion, config.capacity_lines),
            stats: CacheStats::default(),
            flush_cursor: None,
            runs: Vec::new(),
            victims: Vec::new(),
            request_seq: 0,
            request_dirty_victims_kept: 0,
            filling_ahead: false,
            request_line_fill: false,
            mode: ModeSettings::new(config.write_policy),
            processes: FxHashMap::default(),
            extent_fill: None,
            request_facts: RequestFacts::default(),
            request_policy: config.write_policy,
            seq: SeqDetector::new(config.seq_cutoff),
            last_request_ns: None,
            cleaner_last_ns: None,
            volume_lines: None,
            config,
        })
    }

    pub fn config(&self) -> &CacheConfig {
        &self.config
    }

    pub fn stats(&self) -> &CacheStats {
        &self.stats
    }

    pub fn capacity_lines(&self) -> u64 {
        self.config.capacity_lines
    }

    pub fn resident_lines(&self) -> u64 {
        self.index.len() as u64
    }

    pub fn dirty_lines(&self) -> u64 {
        self.dirty_list.len as u64
    }

    /// The replacement policy's own counters (see [`ReplacementPolicy::counters`]).
    pub fn policy_counters(&self) -> Vec<(&'static str, u64)> {
        self.policy.counters()
    }

    /// The replacement policy's levels now (see `ReplacementPolicy::gauges`).
    pub fn policy_gauges(&self) -> Vec<(&'static str, u64)> {
        self.policy.gauges()
    }

    /// The configured write policy (see [`Cache::effective_mode`] for the
    /// one in force).
    pub fn write_policy(&self) -> WritePolicy {
        self.config.write_policy
    }

    /// Changes the configured write policy at run time. Dirty lines stay
    /// dirty and keep being served and flushed under any policy.
    pub fn set_write_policy(&mut self, policy: WritePolicy) {
        self.config.write_policy = policy;
        self.mode.configured = policy;
    }

    /// Sets (or, with `None`, withdraws) a controller's write policy, which
    /// replaces the configured one until withdrawn (ReCA, LBICA).
    pub fn set_controller_policy(&mut self, policy: Option<WritePolicy>) {
        self.mode.controller = policy;
    }

    /// Marks the cache device failed (everything passes through; dirty
    /// lines are still served and written back) or recovered.
    pub fn set_cache_device_failed(&mut self, failed: bool) {
        self.mode.cache_device_failed = failed;
    }

    /// The inputs of the effective-mode decision.
    pub fn mode_settings(&self) -> ModeSettings {
        self.mode
    }

    /// The write policy in force for a request that is not sequential and
    /// touches no dirty line, and why ([`mode::resolve`]).
    pub fn effective_mode(&self) -> EffectiveMode {
        mode::resolve(&self.mode, None, None)
    }

    /// Changes the dirty-line cap at run time (see
    /// [`CacheConfig::max_dirty_lines`]); lines already dirty stay dirty.
    pub fn set_max_dirty_lines(&mut self, cap: Option<u64>) {
        self.config.max_dirty_lines = cap;
    }

    /// Changes the promotion policy at run time. An `nhit` history starts
    /// empty (it is a hint of recent misses, not cache contents).
    pub fn set_promotion(&mut self, promotion: Promotion) {
        self.config.promotion = promotion;
        self.promoter = Promoter::new(promotion, self.config.capacity_lines);
    }

    /// Changes the background cleaning policy at run time.
    pub fn set_cleaning(&mut self, cleaning: CleaningPolicy) {
        self.config.cleaning = cleaning;
    }

    /// Turns write-miss bypass on or off at run time.
    pub fn set_write_miss_bypass(&mut self, on: bool) {
        self.config.write_miss_bypass = on;
    }

    /// Changes what a read miss fills, from the next request.
    pub fn set_fill(&mut self, fill: Fill) {
        self.config.fill = fill;
    }

    /// Changes the sequential cutoff at run time; streams are detected
    /// afresh from the next request.
    pub fn set_seq_cutoff(&mut self, cutoff: SeqCutoff) {
        self.config.seq_cutoff = cutoff;
        self.seq = SeqDetector::new(cutoff);
    }

    /// Replaces the replacement policy at run time, keeping every cached
    /// line: the new policy is built for the same capacity and told of each
    /// resident line as if it had just been admitted at `now_ns`, dirty ones
    /// as dirty, in ascending slot order (the old policy's ranking is not
    /// carried over: policies do not share a notion of rank). Nothing is
    /// evicted or invalidated; the switch is O(resident lines). A policy of
    /// the same name may take the new parameters in place instead, keeping
    /// its state (`ReplacementPolicy::reconfigure`).
    pub fn set_replacement_policy(&mut self, spec: PolicySpec, now_ns: u64) -> Result<(), CoreError> {
        if spec.name() == self.config.policy.name() && self.policy.reconfigure(spec.params())? {
            self.config.policy = spec;
            return Ok(());
        }
        let mut policy = ActivePolicy::build(&spec, self.config.capacity_lines as usize)?;
        policy.set_lines_in_service(self.config.lines_in_service() as usize);
        for s in 0..self.config.capacity_lines as usize {
            let meta = &self.records[s].meta;
            if !meta.resident {
                continue;
            }
            let dirty = bitmap::any(self.dirty_of(s as SlotId));
            policy.on_insert(
                s as SlotId,
                self.records[s].line.key(),
                &AccessInfo {
                    dirty,
                    ..AccessInfo::read_at(now_ns)
                },
            );
        }
        // The processes' parameters for a policy of the new one's name.
        for (&process, settings) in &self.processes {
            if let Some(own) = settings.policy.as_ref().filter(|own| own.name() == spec.name()) {
                policy.set_process_params(process, Some(own.params()))?;
            }
        }
        self.policy = policy;
        self.config.policy = spec;
        Ok(())
    }

    /// Slots out of service ([`Cache::retire_slots`], [`Cache::resize`]).
    pub fn retired_slots(&self) -> u64 {
        self.retired_count as u64
    }

    /// Takes the slots `retire` names out of service for good: free ones
    /// leave the free list, resident clean ones are dropped (one
    /// [`Op::Invalidate`] each into `ops`, cleared first). Dirty lines stay
    /// until they are clean (flush them, then call again). Returns how many
    /// named slots still hold dirty lines. O(capacity).
    pub fn retire_slots(&mut self, retire: impl Fn(SlotId) -> bool, ops: &mut OpList) -> u64 {
        ops.clear();
        if self.retired.is_empty() {
            self.retired = vec![false; self.records.len()];
        }
        let mut dirty_left = 0;
        for s in 0..self.records.len() {
            let slot = s as SlotId;
            if self.retired[s] || !retire(slot) {
                continue;
            }
            if self.records[s].meta.resident {
                if bitmap::any(self.dirty_of(slot)) {
                    dirty_left += 1;
                    continue;
                }
                let key = self.records[s].line.key();
                self.policy.on_remove(slot);
                self.empty_slot(slot, ops);
                self.emit(ops, Op::Invalidate { slot, key });
                self.stats.invalidations += 1;
            } else {
                self.free.retain(|&f| f != slot);
            }
            self.retire_one(slot);
        }
        ops.seal();
        dirty_left
    }

    /// Puts retired slots for which `restore` holds back in service, empty
    /// and free (a replaced cache device); returns how many.
    pub fn restore_slots(&mut self, mut restore: impl FnMut(SlotId) -> bool) -> u64 {
        let mut restored = 0;
        for s in 0..self.retired.len() {
            let slot = s as SlotId;
            if self.retired[s] && restore(slot) {
                debug_assert!(!self.records[s].meta.resident);
                self.retired[s] = false;
                self.retired_count -= 1;
                self.free.push(slot);
                restored += 1;
            }
        }
        restored
    }

    pub fn line_state(&self, key: LineKey) -> Option<LineState> {
        let slot = self.lookup(key)?;
        Some(LineState {
            slot,
            valid_sectors: bitmap::count(self.valid_of(slot)),
            dirty_sectors: bitmap::count(self.dirty_of(slot)),
        })
    }

    /// Decides how to serve `request` and writes the ops to perform into `ops`
    /// (cleared first), in execution order.
    pub fn access(&mut self, request: &Request, ops: &mut OpList) -> Result<AccessSummary, CoreError> {
        self.access_with(request, AccessHints::default(), ops)
    }

    /// [`Cache::access`] with what a driver adds about the request (a load
    /// balancer's bypass, `balance/`).
    pub fn access_with(
        &mut self,
        request: &Request,
        hints: AccessHints,
        ops: &mut OpList,
    ) -> Result<AccessSummary, CoreError> {
        self.access_into(request, hints, ops)
    }

    /// [`Cache::access_with`] for a driver that only counts (the simulator
    /// without a timing model): the same decisions, the same counters
    /// ([`Cache::stats`]) and the same summary, but no op list is built.
    /// It runs the very code `access_with` runs, with the ops discarded
    /// where they would be stored, so the two cannot drift apart.
    pub fn access_counted(
        &mut self,
        request: &Request,
        hints: AccessHints,
    ) -> Result<AccessSummary, CoreError> {
        self.access_into(request, hints, &mut DiscardOps)
    }

    /// The decision for one request, its ops handed to `ops`.
    #[inline]
    fn access_into<S: OpSink>(
        &mut self,
        request: &Request,
        hints: AccessHints,
        ops: &mut S,
    ) -> Result<AccessSummary, CoreError> {
        request.validate()?;
        ops.clear();
        if hints.prefetch {
            return Ok(self.fill_ahead(request, ops));
        }
        self.promoter.begin_request(request, self.stats.cache_write_bytes);
        self.stats.requests += 1;
        match request.kind {
            IoKind::Read => self.stats.read_requests += 1,
            IoKind::Write => self.stats.write_requests += 1,
        }
        self.request_seq += 1;
        self.last_request_ns = Some(
            self.last_request_ns
                .map_or(request.now_ns, |t| t.max(request.now_ns)),
        );
        // Under ordered write-back a write stays in the cache: one sent to
        // the backend would pass the older epochs still cached.
        let ordered_write = !self.epochs.is_empty() && request.kind == IoKind::Write;
        let balance_bypass = hints.balance_bypass && !ordered_write && !self.touches_dirty_sectors(request);
        let sequential_bypass = self.seq.bypass(request) && !ordered_write;
        let process = match self.processes.is_empty() {
            true => process::ProcessFacts::default(),
            false => self.process_facts(request),
        };
        // Lines of the request not admitted so far (see `plan_extent_fill`).
        let bypassed_before = match process.line_size {
            Some(_) => self.stats.bypassed_accesses,
            None => 0,
        };
        self.request_facts = RequestFacts {
            process_policy: process.write_policy,
            sequential_bypass,
            balance_bypass,
        };
        if self.request_facts.sequential_bypass {
            self.stats.seq_cutoff_requests += 1;
        }
        if hints.balance_bypass {
            match balance_bypass {
                true => self.stats.balance_bypasses += 1,
                false => self.stats.balance_bypasses_refused_dirty += 1,
            }
        }
        self.request_policy = mode::resolve(&self.mode, Some(&self.request_facts), None).policy;
        let info = AccessInfo {
            now_ns: request.now_ns,
            kind: request.kind,
            request_seq: self.request_seq,
            request_lines: request_lines(request, self.line).min(u32::MAX as u64) as u32,
            dirty: false,
        };
        self.policy.on_request(request, self.line, &info);
        let mut summary = AccessSummary::default();
        self.request_dirty_victims_kept = 0;
        // Reads that only count, on lines whose bitmaps are inline, under a
        // policy that fills on read: full hits and misses take the
        // counting path (`read_part_counted`), the rest `read_part`.
        // A process set apart with another line size than the cache's fills
        // whole lines when its lines are larger, its sectors when smaller.
        let fill_lines = match process.line_size {
            None => self.config.fill == Fill::Line,
            Some(line) => line.bytes() > self.line.bytes(),
        };
        let line_fill = request.kind == IoKind::Read && fill_lines && !hints.request_fill;
        self.request_line_fill = line_fill;
        let counted_reads = !S::KEEPS_OPS
            && request.kind == IoKind::Read
            && self.words == 1
            && !line_fill
            && self.request_policy.allocates_on_read()
            && self.request_policy != WritePolicy::PassThrough;
        if counted_reads {
            self.read_lines_counted(request, &info, &mut summary);
        } else {
            // Start loading every index position this request will probe, so the
            // lookups of a multi-line request overlap instead of queueing.
            for key in split_request_keys(request, self.line).take(PREFETCH_LINES_MAX) {
                self.index.prefetch(&key);
            }
            // Under a line fill, buffer offsets count from the first line's start.
            let shift = match line_fill {
                true => request.offset_bytes & (self.line.bytes() - 1),
                false => 0,
            };
            summary.line_origin = line_fill;
            for mut part in split_request(request, self.line) {
                part.buffer_offset_bytes += shift;
                let outcome = match request.kind {
                    IoKind::Read => self.read_part(&part, &info, ops),
                    IoKind::Write => self.write_part(&part, &info, ops),
                };
                summary.count(outcome);
            }
        }
        ops.seal();
        summary.dirty_victims_kept = self.request_dirty_victims_kept;
        if let Some(extent) = process
            .line_size
            .filter(|l| l.bytes() > self.line.bytes() && request.kind == IoKind::Read)
        {
            let all_admitted = self.stats.bypassed_accesses == bypassed_before;
            self.plan_extent_fill(request, extent, &summary, all_admitted);
        }
        Ok(summary)
    }

    /// Whether a sector `request` touches is dirty in the cache (its only
    /// up-to-date copy is here, so the request must not go around it).
    fn touches_dirty_sectors(&self, request: &Request) -> bool {
        split_request(request, self.line).any(|part| {
            self.lookup(part.key).is_some_and(|slot| {
                bitmap::count_range(self.dirty_of(slot), part.first_sector, part.end_sector) > 0
            })
        })
    }

    #[inline]
    fn lookup(&self, key: LineKey) -> Option<SlotId> {
        self.lookup_hashed(&self.policy, key, hash_of(&key))
    }

    /// [`Cache::lookup`] with the key's index hash already computed, for
    /// the policy `P` held.
    #[inline(always)]
    fn lookup_hashed<P: ReplacementPolicy + ?Sized>(
        &self,
        policy: &P,
        key: LineKey,
        hash: u32,
    ) -> Option<SlotId> {
        let records = &self.records;
        self.index.get_hashed(hash, |s| {
            // Load the policy's state of the slot while its key is read.
            policy.prefetch_hit(s);
            records[s as usize].line.holds(&key)
        })
    }

    /// A handle that prefetches index entries without borrowing the cache
    /// (see [`crate::index::IndexPrefetcher`]): a driver starts loading a
    /// request's entry before it takes the lock around the cache.
    pub fn index_prefetcher(&self) -> crate::index::IndexPrefetcher {
        self.index.prefetcher()
    }

    /// Hints the CPU to load what an access to `request` will touch, for a
    /// driver that knows its requests ahead (the simulator holds a batch of
    /// its trace): the index positions of the request's first
    /// `LOOKAHEAD_LINES_MAX` (16) lines and what the policy's miss would
    /// look up for them (`ReplacementPolicy::prefetch_key`). Issued a few
    /// requests early, so that the request's own walk finds those positions
    /// loaded and can load, a few lines ahead of each lookup, the slot
    /// records and policy state they name (see `read_lines_counted_for`).
    /// A hint only: nothing changes, and a guess made stale by the
    /// requests in between only loads a line for nothing.
    #[inline]
    pub fn prefetch_ahead(&self, request: &Request) {
        crate::policy::forward!(&self.policy, p => self.prefetch_ahead_for(&**p, request));
    }

    /// [`Cache::prefetch_ahead`] compiled for the policy `P` held.
    #[inline(always)]
    fn prefetch_ahead_for<P: ReplacementPolicy + ?Sized>(&self, policy: &P, request: &Request) {
        if request.length_bytes == 0 {
            return;
        }
        let first_line = request.offset_bytes >> self.line.shift();
        // Saturating: any request may be passed, validated or not.
        let last_line = request.offset_bytes.saturating_add(request.length_bytes - 1) >> self.line.shift();
        let end_line = last_line.min(first_line + LOOKAHEAD_LINES_MAX - 1) + 1;
        for line_index in first_line..end_line {
            let hash = hash_of(&LineKey {
                volume: request.volume,
                line_index,
            });
            self.prefetch_index_of(policy, hash);
        }
    }

    /// Loads the index position a lookup or insertion of the line whose
    /// index hash is `hash` will probe, and what the policy's miss would
    /// look up for it (`prefetch_key`). A hint only.
    #[inline(always)]
    fn prefetch_index_of<P: ReplacementPolicy + ?Sized>(&self, policy: &P, hash: u32) {
        self.index.prefetch_hashed(hash);
        policy.prefetch_key(hash);
    }

    /// Loads what a lookup of the line whose index hash is `hash` will
    /// read once its index position has arrived: a bounded peek there
    /// (see [`LineIndex::peek_hashed`]), then the slot record and the
    /// policy's state of the slot it names (`prefetch_hit`), or for a
    /// likely miss what the policy's miss will compare (`prefetch_miss`).
    /// A hint only.
    #[inline(always)]
    fn prefetch_slot_of<P: ReplacementPolicy + ?Sized>(&self, policy: &P, hash: u32) {
        // Without a branch on the outcome (slot 0's lines are loaded for
        // nothing when the line is not found at its home position), except
        // for a policy whose miss has something to prefetch.
        let (slot, found) = self.index.peek_home_hashed(hash);
        // Addresses only (a prefetch of a bad one is harmless).
        crate::prefetch::prefetch_address(self.records.as_ptr().wrapping_add(slot as usize) as usize);
        policy.prefetch_hit(slot);
        if !found {
            policy.prefetch_miss(hash);
        }
    }

    #[inline]
    fn bitmap(&self, slot: SlotId, which: usize) -> &[u64] {
        if self.words == 1 {
            std::slice::from_ref(&self.records[slot as usize].line.inline_bits[which])
        } else {
            let at = (slot as usize * 2 + which) * self.words;
            &self.bits[at..at + self.words]
        }
    }

    #[inline]
    fn bitmap_mut(&mut self, slot: SlotId, which: usize) -> &mut [u64] {
        if self.words == 1 {
            std::slice::from_mut(&mut self.records[slot as usize].line.inline_bits[which])
        } else {
            let at = (slot as usize * 2 + which) * self.words;
            &mut self.bits[at..at + self.words]
        }
    }

    fn valid_of(&self, slot: SlotId) -> &[u64] {
        self.bitmap(slot, VALID)
    }

    fn dirty_of(&self, slot: SlotId) -> &[u64] {
        self.bitmap(slot, DIRTY)
    }

    fn valid_mut(&mut self, slot: SlotId) -> &mut [u64] {
        self.bitmap_mut(slot, VALID)
    }

    fn dirty_mut(&mut self, slot: SlotId) -> &mut [u64] {
        self.bitmap_mut(slot, DIRTY)
    }

    /// Pushes `op` and counts its bytes.
    #[inline(always)]
    fn emit<S: OpSink>(&mut self, ops: &mut S, op: Op) {
        let s = &mut self.stats;
        match op {
            Op::ReadCache { length_bytes, .. } => s.cache_read_bytes += length_bytes as u64,
            Op::WriteCache { length_bytes, .. } => s.cache_write_bytes += length_bytes as u64,
            Op::ReadBackend { length_bytes, .. } => s.backend_read_bytes += length_bytes,
            Op::WriteBackend { length_bytes, .. } => s.backend_write_bytes += length_bytes,
            Op::WriteBack { length_bytes, .. } => {
                s.cache_read_bytes += length_bytes as u64;
                s.backend_write_bytes += length_bytes as u64;
            }
            Op::Invalidate { .. } => {}
        }
        ops.push(op);
    }

    #[inline]
    fn line_offset(&self, key: LineKey) -> u64 {
        key.line_index << self.line.shift()
    }

    #[inline]
    fn cache_read(&self, part: &LinePart, slot: SlotId, start: u32, end: u32) -> Op {
        Op::ReadCache {
            slot,
            line_offset_bytes: start * SECTOR_BYTES as u32,
            length_bytes: (end - start) * SECTOR_BYTES as u32,
            buffer_offset_bytes: part.buffer_offset_bytes + (start - part.first_sector) as u64 * SECTOR_BYTES,
        }
    }

    /// Writes sectors `[start, end)` of `part` into `slot`: one op per run
    /// of sectors that were valid before or not, so that each op's `fresh`
    /// is exact.
    fn emit_cache_writes<S: OpSink>(
        &mut self,
        part: &LinePart,
        slot: SlotId,
        start: u32,
        end: u32,
        dirty: bool,
        ops: &mut S,
    ) {
        let mut runs = std::mem::take(&mut self.runs);
        runs.clear();
        bitmap::for_each_run(self.valid_of(slot), start, end, |s, e, v| runs.push((s, e, v)));
        for &(s, e, _) in &runs {
            self.emit(ops, self.cache_write(part, slot, s, e, dirty));
        }
        self.runs = runs;
    }

    #[inline]
    fn cache_write(&self, part: &LinePart, slot: SlotId, start: u32, end: u32, dirty: bool) -> Op {
        let fresh = bitmap::count_range(self.valid_of(slot), start, end) == 0;
        Op::WriteCache {
            slot,
            line_offset_bytes: start * SECTOR_BYTES as u32,
            length_bytes: (end - start) * SECTOR_BYTES as u32,
            buffer_offset_bytes: part.buffer_offset_bytes + (start - part.first_sector) as u64 * SECTOR_BYTES,
            dirty,
            fresh,
        }
    }

    #[inline]
    fn backend_read(&self, part: &LinePart, start: u32, end: u32) -> Op {
        Op::ReadBackend {
            volume: part.key.volume,
            offset_bytes: self.line_offset(part.key) + start as u64 * SECTOR_BYTES,
            length_bytes: (end - start) as u64 * SECTOR_BYTES,
            buffer_offset_bytes: part.buffer_offset_bytes + (start - part.first_sector) as u64 * SECTOR_BYTES,
        }
    }

    #[inline]
    fn backend_write(&self, part: &LinePart) -> Op {
        Op::WriteBackend {
            volume: part.key.volume,
            offset_bytes: self.line_offset(part.key) + part.first_sector as u64 * SECTOR_BYTES,
            length_bytes: part.sectors() as u64 * SECTOR_BYTES,
            buffer_offset_bytes: part.buffer_offset_bytes,
        }
    }

    #[inline]
    fn write_back(&self, slot: SlotId, key: LineKey, start: u32, end: u32) -> Op {
        Op::WriteBack {
            slot,
            line_offset_bytes: start * SECTOR_BYTES as u32,
            length_bytes: (end - start) * SECTOR_BYTES as u32,
            volume: key.volume,
            offset_bytes: self.line_offset(key) + start as u64 * SECTOR_BYTES,
        }
    }
}

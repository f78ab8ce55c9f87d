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
use crate::config::{CacheConfig, FlushOrder, Promotion, WritePolicy};
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

/// A view of one slot's line (see [`Cache::slot_snapshot`]).
#[derive(Clone, Copy, Debug)]
pub struct SlotSnapshot<'a> {
    pub key: LineKey,
    pub valid: &'a [u64],
    pub dirty: &'a [u64],
}

/// How many lines of one volume a cache holds (see [`Cache::volume_lines`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VolumeLines {
    pub resident: u64,
    pub dirty: u64,
}

/// A line to load into a slot (see [`Cache::restore`]).
#[derive(Clone, Copy, Debug)]
pub struct RestoredLine<'a> {
    pub slot: SlotId,
    pub key: LineKey,
    pub valid: &'a [u64],
    pub dirty: &'a [u64],
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
    /// Dirty lines, oldest-dirtied at the head.
    dirty_list: ListHead,
    free: Vec<SlotId>,
    /// Slots taken out of service for good (their device failed); empty
    /// until [`Cache::retire_slots`] first runs.
    retired: Vec<bool>,
    retired_count: usize,
    policy: ActivePolicy,
    promoter: Promoter,
    stats: CacheStats,
    flush_cursor: Option<LineKey>,
    runs: Vec<(u32, u32, bool)>,
    victims: Vec<SlotId>,
    request_seq: u64,
    /// Dirty victims kept by the request in progress.
    request_dirty_victims_kept: u32,
    /// What decides the effective write policy besides the request: the
    /// configured policy, a controller's, a failed cache device (`mode.rs`).
    mode: ModeSettings,
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
            free: (0..lines as SlotId).rev().collect(),
            retired: Vec::new(),
            retired_count: 0,
            policy: ActivePolicy::build(&config.policy, lines)?,
            promoter: Promoter::new(config.promotion, config.capacity_lines),
            stats: CacheStats::default(),
            flush_cursor: None,
            runs: Vec::new(),
            victims: Vec::new(),
            request_seq: 0,
            request_dirty_victims_kept: 0,
            mode: ModeSettings::new(config.write_policy),
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
        self.policy = policy;
        self.config.policy = spec;
        Ok(())
    }

    /// Slots taken out of service by [`Cache::retire_slots`].
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
            self.retired[s] = true;
            self.retired_count += 1;
        }
        ops.seal();
        dirty_left
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
        let balance_bypass = hints.balance_bypass && !self.touches_dirty_sectors(request);
        self.request_facts = RequestFacts {
            sequential_bypass: self.seq.bypass(request),
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
        let counted_reads = !S::KEEPS_OPS
            && request.kind == IoKind::Read
            && self.words == 1
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
            for part in split_request(request, self.line) {
                let outcome = match request.kind {
                    IoKind::Read => self.read_part(&part, &info, ops),
                    IoKind::Write => self.write_part(&part, &info, ops),
                };
                summary.count(outcome);
            }
        }
        ops.seal();
        summary.dirty_victims_kept = self.request_dirty_victims_kept;
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

    /// Counts the access and classifies it by the valid sectors it finds.
    #[inline(always)]
    fn classify(&mut self, part: &LinePart, slot: Option<SlotId>, kind: IoKind) -> LineOutcome {
        let sectors = part.sectors();
        let valid = match slot {
            Some(slot) => bitmap::count_range(self.valid_of(slot), part.first_sector, part.end_sector),
            None => 0,
        };
        let s = &mut self.stats;
        s.accesses += 1;
        s.requested_bytes += sectors as u64 * SECTOR_BYTES;
        s.hit_bytes += valid as u64 * SECTOR_BYTES;
        let outcome = if valid == sectors {
            s.full_hits += 1;
            LineOutcome::FullHit
        } else if valid > 0 {
            s.partial_hits += 1;
            LineOutcome::PartialHit
        } else {
            s.misses += 1;
            LineOutcome::Miss
        };
        let hit = outcome == LineOutcome::FullHit;
        match kind {
            IoKind::Read => {
                s.read_accesses += 1;
                s.read_hits += hit as u64;
            }
            IoKind::Write => {
                s.write_accesses += 1;
                s.write_hits += hit as u64;
            }
        }
        outcome
    }

    fn read_part<S: OpSink>(&mut self, part: &LinePart, info: &AccessInfo, ops: &mut S) -> LineOutcome {
        let policy = self.request_policy;
        let found = self.lookup(part.key);
        let outcome = self.classify(part, found, IoKind::Read);
        match found {
            Some(slot) => {
                self.mark_used::<S>(slot);
                if policy == WritePolicy::PassThrough {
                    // Bypass, but dirty sectors exist only in the cache.
                    self.transfer_runs(part, slot, ops, |c, s| c.dirty_of(s), false);
                } else {
                    let dirty = bitmap::any(self.dirty_of(slot));
                    self.policy.on_hit(slot, &AccessInfo { dirty, ..*info });
                    if outcome == LineOutcome::FullHit {
                        // One run, all cached, nothing to fill: what the
                        // general branch below does, without the run scan.
                        self.emit(
                            ops,
                            self.cache_read(part, slot, part.first_sector, part.end_sector),
                        );
                    } else {
                        let fill = policy.allocates_on_read();
                        self.transfer_runs(part, slot, ops, |c, s| c.valid_of(s), fill);
                        if fill {
                            bitmap::set_range(self.valid_mut(slot), part.first_sector, part.end_sector);
                        }
                    }
                }
            }
            None => {
                let slot = if policy.allocates_on_read() {
                    self.try_admit(part.key, info, ops)
                } else {
                    None
                };
                self.emit(ops, self.backend_read(part, part.first_sector, part.end_sector));
                match slot {
                    Some(slot) => {
                        self.mark_used::<S>(slot);
                        self.emit(
                            ops,
                            self.cache_write(part, slot, part.first_sector, part.end_sector, false),
                        );
                        bitmap::set_range(self.valid_mut(slot), part.first_sector, part.end_sector);
                    }
                    None => self.stats.bypassed_accesses += 1,
                }
            }
        }
        outcome
    }

    /// The lines of a read for a driver that only counts, when the lines'
    /// bitmaps are inline (one word) and the write policy in force fills on
    /// read and is not pass-through: `read_part`'s decisions and counters for
    /// each line, with the full-hit and miss cases written out so that no op
    /// is built, the line keys and masks walked directly (no `LinePart`), each
    /// index hash computed once (for the prefetch, the lookup and an
    /// insertion), and the counters summed over the request. A partial hit
    /// (or a resident line missing every requested sector) goes to
    /// `read_part`. `tests/counted_access.rs` checks it against `read_part`
    /// with ops kept.
    #[inline(always)]
    fn read_lines_counted(&mut self, request: &Request, info: &AccessInfo, summary: &mut AccessSummary) {
        let sector_shift = SECTOR_BYTES.trailing_zeros();
        let per_line_shift = self.line.shift() - sector_shift;
        let last_line = ((request.offset_bytes + request.length_bytes) >> sector_shift).saturating_sub(1)
            >> per_line_shift;
        let mut from_line = request.offset_bytes >> self.line.shift();
        // Whether the request reads its first and last lines whole (always
        // so with one-sector lines): then every line's sectors are the
        // whole line's, and the walk is compiled without choosing them.
        let whole_lines = request.offset_bytes.is_multiple_of(self.line.bytes())
            && (request.offset_bytes + request.length_bytes).is_multiple_of(self.line.bytes());
        loop {
            // The policy is taken out for the walk, which then reaches it
            // as its own type; it is back in place for a partial hit.
            let mut held = self.policy.take_out();
            let partial = crate::policy::forward!(&mut held, p => match whole_lines {
                true => self.read_lines_counted_for::<_, true>(&mut **p, request, from_line, info, summary),
                false => self.read_lines_counted_for::<_, false>(&mut **p, request, from_line, info, summary),
            });
            self.policy.put_back(held);
            let Some((key, mask)) = partial else {
                return;
            };
            let outcome = self.read_part_partial(request, key, mask, info);
            summary.count(outcome);
            if key.line_index == last_line {
                return;
            }
            from_line = key.line_index + 1;
        }
    }

    /// [`Cache::read_lines_counted`] from line `from_line` on, compiled
    /// for the policy `P` held (taken out of the cache meanwhile). Stops at
    /// a partial hit, returning its key and mask, for `read_part` to decide.
    /// `WHOLE_LINES`: the request reads its first and last lines whole, as
    /// every line between.
    #[inline(never)]
    fn read_lines_counted_for<P: ReplacementPolicy + ?Sized, const WHOLE_LINES: bool>(
        &mut self,
        policy: &mut P,
        request: &Request,
        from_line: u64,
        info: &AccessInfo,
        summary: &mut AccessSummary,
    ) -> Option<(LineKey, u64)> {
        debug_assert!(self.words == 1 && self.request_policy.allocates_on_read());
        let sector_shift = SECTOR_BYTES.trailing_zeros();
        let per_line_shift = self.line.shift() - sector_shift;
        let first_sector = request.offset_bytes >> sector_shift;
        let end_sector = (request.offset_bytes + request.length_bytes) >> sector_shift;
        let first_line = first_sector >> per_line_shift;
        let last_line = (end_sector - 1) >> per_line_shift;
        let volume = request.volume;
        let whole_mask = bitmap::single_word_mask(0, self.line.sectors());
        let whole_bytes = self.line.bytes();
        // The sectors (mask and bytes) the request reads of line `line_index`.
        let part_of = |line_index: u64| {
            let line_first = line_index << per_line_shift;
            let start = (first_sector.max(line_first) - line_first) as u32;
            let end = (end_sector.min(line_first + (1 << per_line_shift)) - line_first) as u32;
            (
                bitmap::single_word_mask(start, end),
                u64::from(end - start) * SECTOR_BYTES,
            )
        };
        // Only the first and the last line may be read in part.
        let (first_part, last_part) = (part_of(first_line), part_of(last_line));
        debug_assert!(!WHOLE_LINES || (first_part == (whole_mask, whole_bytes) && last_part == first_part));
        let (mut hits, mut hit_bytes) = (0u64, 0u64);
        let (mut misses, mut miss_bytes, mut filled_bytes, mut bypassed) = (0u64, 0u64, 0u64, 0u64);
        // The walk is pipelined: line `at` of the walk is looked up while
        // the index position of line `at + INDEX_AHEAD` is loading and the
        // index entry of line `at + SLOTS_AHEAD` (loaded since) names the
        // slot record and policy state to load. The walk's first
        // `INDEX_AHEAD` index positions are loaded here too, but a driver
        // that knows its requests has loaded them earlier (`prefetch_ahead`:
        // the request's first lines, which are the walk's unless it
        // restarts after a partial hit), so the first `SLOTS_AHEAD` lines'
        // slots are asked for at once.
        const INDEX_AHEAD: u64 = LOOKAHEAD_LINES_MAX;
        const SLOTS_AHEAD: u64 = 8;
        const RING: usize = 32;
        const _: () = assert!((INDEX_AHEAD as usize) < RING && SLOTS_AHEAD < INDEX_AHEAD);
        let lines = last_line - from_line + 1;
        let mut hashes = [0u32; RING];
        let hash_at = |at: u64| {
            hash_of(&LineKey {
                volume,
                line_index: from_line + at,
            })
        };
        for at in 0..lines.min(INDEX_AHEAD) {
            let hash = hash_at(at);
            hashes[at as usize % RING] = hash;
            self.prefetch_index_of(policy, hash);
        }
        for at in 0..lines.min(SLOTS_AHEAD) {
            self.prefetch_slot_of(policy, hashes[at as usize % RING]);
        }
        let mut partial = None;
        for at in 0..lines {
            if at + INDEX_AHEAD < lines {
                let hash = hash_at(at + INDEX_AHEAD);
                hashes[(at + INDEX_AHEAD) as usize % RING] = hash;
                self.prefetch_index_of(policy, hash);
            }
            if at + SLOTS_AHEAD < lines {
                self.prefetch_slot_of(policy, hashes[(at + SLOTS_AHEAD) as usize % RING]);
            }
            let hash = hashes[at as usize % RING];
            let line_index = from_line + at;
            let key = LineKey { volume, line_index };
            let (mask, bytes) = if WHOLE_LINES {
                (whole_mask, whole_bytes)
            } else if line_index == first_line {
                first_part
            } else if line_index == last_line {
                last_part
            } else {
                (whole_mask, whole_bytes)
            };
            match self.lookup_hashed(policy, key, hash) {
                Some(slot) => {
                    let [valid, dirty] = self.records[slot as usize].line.inline_bits;
                    if valid & mask != mask {
                        partial = Some((key, mask));
                        break;
                    }
                    // `classify`'s full hit, then `read_part`'s: one
                    // ReadCache of the whole part, nothing to fill.
                    hits += 1;
                    if !WHOLE_LINES {
                        hit_bytes += bytes;
                    }
                    policy.on_hit(
                        slot,
                        &AccessInfo {
                            dirty: dirty != 0,
                            ..*info
                        },
                    );
                }
                None => {
                    // `classify`'s miss, then `read_part`'s: admit, read
                    // the backend, fill the slot if one was found.
                    misses += 1;
                    let admitted = self.admit_counted(policy, key, hash, mask, info);
                    bypassed += u64::from(!admitted);
                    if !WHOLE_LINES {
                        miss_bytes += bytes;
                        if admitted {
                            filled_bytes += bytes;
                        }
                    }
                }
            }
        }
        if WHOLE_LINES {
            // Every line whole: the byte counts follow from the line counts.
            (hit_bytes, miss_bytes, filled_bytes) = (
                hits * whole_bytes,
                misses * whole_bytes,
                (misses - bypassed) * whole_bytes,
            );
        }
        let s = &mut self.stats;
        s.accesses += hits + misses;
        s.read_accesses += hits + misses;
        s.requested_bytes += hit_bytes + miss_bytes;
        s.hit_bytes += hit_bytes;
        s.full_hits += hits;
        s.read_hits += hits;
        s.cache_read_bytes += hit_bytes;
        s.misses += misses;
        s.backend_read_bytes += miss_bytes;
        s.cache_write_bytes += filled_bytes;
        s.bypassed_accesses += bypassed;
        summary.lines += (hits + misses) as u32;
        summary.full_hits += hits as u32;
        summary.misses += misses as u32;
        partial
    }

    /// The miss of [`Cache::read_lines_counted_for`]: admits `key` (its
    /// index hash `hash`) and fills the sectors of `mask`, or says the line
    /// bypassed the cache. Out of line, so that the walk's hit path keeps
    /// its state in registers.
    #[inline(never)]
    fn admit_counted<P: ReplacementPolicy + ?Sized>(
        &mut self,
        policy: &mut P,
        key: LineKey,
        hash: u32,
        mask: u64,
        info: &AccessInfo,
    ) -> bool {
        match self.try_admit_hashed(policy, key, hash, info, &mut DiscardOps) {
            Some(slot) => {
                self.records[slot as usize].line.inline_bits[VALID] |= mask;
                true
            }
            None => false,
        }
    }

    /// A counted read of a resident line missing some of the sectors in
    /// `mask` (a one-word line's): `read_part` decides, out of the fast loop.
    #[cold]
    #[inline(never)]
    fn read_part_partial(
        &mut self,
        request: &Request,
        key: LineKey,
        mask: u64,
        info: &AccessInfo,
    ) -> LineOutcome {
        let first_sector = mask.trailing_zeros();
        let end_sector = 64 - mask.leading_zeros();
        let line_first_byte = key.line_index << self.line.shift();
        let part = LinePart {
            key,
            first_sector,
            end_sector,
            buffer_offset_bytes: line_first_byte + u64::from(first_sector) * SECTOR_BYTES
                - request.offset_bytes,
        };
        self.read_part(&part, info, &mut DiscardOps)
    }

    /// Reads a resident line's part: sectors set in `from_cache` come from the cache,
    /// the rest from the backend (and, with `fill`, are then written into the cache).
    fn transfer_runs<S: OpSink>(
        &mut self,
        part: &LinePart,
        slot: SlotId,
        ops: &mut S,
        from_cache: impl Fn(&Self, SlotId) -> &[u64],
        fill: bool,
    ) {
        let mut runs = std::mem::take(&mut self.runs);
        runs.clear();
        bitmap::for_each_run(
            from_cache(self, slot),
            part.first_sector,
            part.end_sector,
            |s, e, v| runs.push((s, e, v)),
        );
        for &(start, end, cached) in &runs {
            if cached {
                self.emit(ops, self.cache_read(part, slot, start, end));
            } else {
                self.emit(ops, self.backend_read(part, start, end));
                if fill {
                    self.emit(ops, self.cache_write(part, slot, start, end, false));
                }
            }
        }
        self.runs = runs;
    }

    fn write_part<S: OpSink>(&mut self, part: &LinePart, info: &AccessInfo, ops: &mut S) -> LineOutcome {
        let found = self.lookup(part.key);
        let outcome = self.classify(part, found, IoKind::Write);
        let (first, end) = (part.first_sector, part.end_sector);
        // The line's facts; `mode::resolve` decides (dirty supersede, dirty cap).
        let line = LineFacts {
            supersedes_dirty: found
                .is_some_and(|slot| bitmap::count_range(self.dirty_of(slot), first, end) > 0),
            already_dirty: found.is_some_and(|slot| self.records[slot as usize].meta.dirty_listed),
            dirty_lines: self.dirty_lines(),
            dirty_cap: self.config.max_dirty_lines,
            inline_dirty_eviction: self.config.inline_dirty_eviction,
        };
        let decided = mode::resolve(&self.mode, Some(&self.request_facts), Some(&line));
        let policy = decided.policy;
        if decided.cause == ModeCause::DirtyCap {
            self.stats.dirty_cap_write_throughs += 1;
        }
        match policy {
            WritePolicy::WriteBack | WritePolicy::WriteOnly | WritePolicy::WriteThrough => {
                let write_back = policy != WritePolicy::WriteThrough;
                let slot = match found {
                    Some(slot) => Some(slot),
                    None if self.config.write_miss_bypass && self.full_of_dirty_lines() => {
                        self.stats.write_miss_bypasses += 1;
                        None
                    }
                    None => self.try_admit(
                        part.key,
                        &AccessInfo {
                            dirty: write_back,
                            ..*info
                        },
                        ops,
                    ),
                };
                if !write_back || slot.is_none() {
                    self.emit(ops, self.backend_write(part));
                }
                let Some(slot) = slot else {
                    self.stats.bypassed_accesses += 1;
                    return outcome;
                };
                self.mark_used::<S>(slot);
                self.emit_cache_writes(part, slot, first, end, write_back, ops);
                bitmap::set_range(self.valid_mut(slot), first, end);
                self.records[slot as usize].meta.generation += 1;
                if write_back {
                    bitmap::set_range(self.dirty_mut(slot), first, end);
                    self.mark_dirty(slot, info.now_ns);
                } else {
                    bitmap::clear_range(self.dirty_mut(slot), first, end);
                    if self.unmark_dirty_if_clean(slot) && found.is_some() {
                        self.policy.on_clean(slot);
                    }
                }
                if found.is_some() {
                    let dirty = self.records[slot as usize].meta.dirty_listed;
                    self.policy.on_hit(slot, &AccessInfo { dirty, ..*info });
                }
            }
            WritePolicy::WriteInvalidate
                if !self.config.inline_dirty_eviction
                    && found.is_some_and(|slot| {
                        let dirty = self.dirty_of(slot);
                        bitmap::count(dirty) > bitmap::count_range(dirty, first, end)
                    }) =>
            {
                // Dropping the line would write its other dirty sectors back
                // inline: update the written sectors as write-through does.
                let slot = found.expect("checked above");
                self.emit(ops, self.backend_write(part));
                self.mark_used::<S>(slot);
                self.emit_cache_writes(part, slot, first, end, false, ops);
                bitmap::set_range(self.valid_mut(slot), first, end);
                bitmap::clear_range(self.dirty_mut(slot), first, end);
                self.records[slot as usize].meta.generation += 1;
                let dirty = self.records[slot as usize].meta.dirty_listed;
                self.policy.on_hit(slot, &AccessInfo { dirty, ..*info });
            }
            WritePolicy::WriteInvalidate => {
                if let Some(slot) = found {
                    // Dirty data outside the written range must reach the backend
                    // before the line is dropped; dirty data inside it is superseded.
                    bitmap::clear_range(self.dirty_mut(slot), first, end);
                    self.drop_line(slot, ops);
                }
                self.emit(ops, self.backend_write(part));
                self.stats.bypassed_accesses += 1;
            }
            WritePolicy::WriteAround | WritePolicy::PassThrough => {
                if let Some(slot) = found {
                    bitmap::clear_range(self.valid_mut(slot), first, end);
                    bitmap::clear_range(self.dirty_mut(slot), first, end);
                    self.records[slot as usize].meta.generation += 1;
                    if bitmap::any(self.valid_of(slot)) {
                        if self.unmark_dirty_if_clean(slot) {
                            self.policy.on_clean(slot);
                        }
                    } else {
                        self.drop_line(slot, ops);
                    }
                }
                self.emit(ops, self.backend_write(part));
                self.stats.bypassed_accesses += 1;
            }
        }
        outcome
    }

    /// Runs promotion and, if the line is admitted, finds it a slot (evicting if needed).
    /// `info.dirty` says whether the line will be dirty once the access is done.
    fn try_admit<S: OpSink>(&mut self, key: LineKey, info: &AccessInfo, ops: &mut S) -> Option<SlotId> {
        let mut policy = self.policy.take_out();
        let slot = self.try_admit_hashed(&mut policy, key, hash_of(&key), info, ops);
        self.policy.put_back(policy);
        slot
    }

    /// [`Cache::try_admit`] with the key's index hash already computed, for
    /// the policy `P` held.
    #[inline]
    fn try_admit_hashed<P: ReplacementPolicy + ?Sized, S: OpSink>(
        &mut self,
        policy: &mut P,
        key: LineKey,
        hash: u32,
        info: &AccessInfo,
        ops: &mut S,
    ) -> Option<SlotId> {
        let admit = match policy.admit(key, info) {
            Some(decision) => decision,
            None => self.promoter.should_promote(key, self.resident_lines()),
        };
        if !admit {
            return None;
        }
        let need_victim = self.free.is_empty();
        self.victims.clear();
        let single = policy.on_miss_single(
            key,
            need_victim,
            &AccessInfo {
                dirty: false,
                ..*info
            },
            &mut self.victims,
        );
        debug_assert!(
            need_victim || (single.is_none() && self.victims.is_empty()),
            "policy named victims with free slots left"
        );
        if let Some(victim) = single {
            // One victim named directly: taken now, unless it is dirty and
            // dirty victims are kept (then as if pushed into `victims`).
            if self.config.inline_dirty_eviction || !self.records[victim as usize].meta.dirty_listed {
                return Some(self.take_single_victim(policy, victim, key, hash, info, ops));
            }
            self.victims.push(victim);
        }
        if !self.config.inline_dirty_eviction {
            let mut victims = std::mem::take(&mut self.victims);
            self.keep_dirty_victims(policy, key, info, &mut victims);
            self.victims = victims;
        }
        // The victims join the free list and the last one pushed is taken;
        // a single victim (the common case) is taken directly, the same slot.
        let slot = match self.victims[..] {
            [] => self.free.pop()?,
            [victim] => return Some(self.take_single_victim(policy, victim, key, hash, info, ops)),
            _ => {
                let victims = std::mem::take(&mut self.victims);
                self.stats.record_eviction_batch(victims.len() as u64);
                for &victim in &victims {
                    self.evict(victim, ops);
                }
                self.free.extend_from_slice(&victims);
                self.prefetch_next_victims(policy);
                self.victims = victims;
                self.free.pop()?
            }
        };
        self.index.insert_hashed(hash, slot);
        let record = &mut self.records[slot as usize];
        record.line.set_key(key, hash);
        let meta = &mut record.meta;
        meta.resident = true;
        meta.generation += 1;
        self.count_lines(key.volume, 1, 0);
        policy.on_insert(slot, key, info);
        self.stats.promotions += 1;
        Some(slot)
    }

    /// Admits `key` into the slot of `victim`, the one victim its miss
    /// named (already forgotten by the policy): counts the eviction batch,
    /// evicts, inserts, and tells the policy.
    #[inline(always)]
    fn take_single_victim<P: ReplacementPolicy + ?Sized, S: OpSink>(
        &mut self,
        policy: &mut P,
        victim: SlotId,
        key: LineKey,
        hash: u32,
        info: &AccessInfo,
        ops: &mut S,
    ) -> SlotId {
        self.stats.record_eviction_batch(1);
        self.stats.evictions += 1;
        self.reuse_victim(victim, key, hash, ops);
        self.prefetch_next_victims(policy);
        policy.on_insert(victim, key, info);
        self.stats.promotions += 1;
        victim
    }

    /// Evicts `victim` (already forgotten by the policy) and gives its
    /// slot to `key` (index hash `hash`): what `evict` and the insertion
    /// after it do, in one pass over the slot's records (the slot stays
    /// resident; its generation moves by two, once for each step).
    #[inline(always)]
    fn reuse_victim<S: OpSink>(&mut self, victim: SlotId, key: LineKey, hash: u32, ops: &mut S) {
        let at = victim as usize;
        debug_assert!(
            self.records[at].meta.resident,
            "policy named a free slot as victim"
        );
        self.seal_ops_before_reuse(victim, ops);
        let meta = &mut self.records[at].meta;
        meta.generation += 2;
        let listed = meta.dirty_listed;
        let line = &self.records[at].line;
        // `write_back_dirty`, called only when it has something to do: a
        // usual victim is clean, which its records already say.
        let dirty_bits = match self.words {
            1 => line.inline_bits[DIRTY] != 0,
            _ => bitmap::any(self.dirty_of(victim)),
        };
        if listed || dirty_bits {
            self.write_back_dirty(victim, ops);
        }
        let line = &mut self.records[at].line;
        let (old_volume, old_hash) = (line.volume, line.hash);
        line.set_key(key, hash);
        if self.words == 1 {
            line.inline_bits[VALID] = 0;
        } else {
            bitmap::clear(self.valid_mut(victim));
        }
        self.index.replace_hashed(old_hash, victim, hash);
        if self.volume_lines.is_some() {
            self.count_lines(old_volume, -1, 0);
            self.count_lines(key.volume, 1, 0);
        }
    }

    /// Hands dirty victims back to the policy (they stay resident) and asks
    /// it again, a few times, for clean ones. Leaves the clean victims found,
    /// possibly none (the line then bypasses the cache).
    fn keep_dirty_victims<P: ReplacementPolicy + ?Sized>(
        &mut self,
        policy: &mut P,
        key: LineKey,
        info: &AccessInfo,
        victims: &mut Vec<SlotId>,
    ) {
        const ROUNDS: usize = 4;
        for round in 0..ROUNDS {
            if !victims
                .iter()
                .any(|&v| self.records[v as usize].meta.dirty_listed)
            {
                return;
            }
            let mut i = 0;
            while i < victims.len() {
                let victim = victims[i];
                if !self.records[victim as usize].meta.dirty_listed {
                    i += 1;
                    continue;
                }
                victims.swap_remove(i);
                let victim_key = self.records[victim as usize].line.key();
                policy.on_victim_kept(victim, victim_key, &AccessInfo { dirty: true, ..*info });
                self.stats.dirty_victims_kept += 1;
                self.request_dirty_victims_kept += 1;
            }
            if !victims.is_empty() || round + 1 == ROUNDS {
                return;
            }
            policy.on_miss_again(
                key,
                &AccessInfo {
                    dirty: false,
                    ..*info
                },
                victims,
            );
        }
        // Every round hands its dirty victims back, and the last one returns
        // whatever it found: no dirty victim leaves the loop.
    }

    /// Misses often come in runs; load what the coming evictions will touch
    /// while this one finishes: the index entry of the sooner of the
    /// policy's two likely victims (its metadata was prefetched when it was
    /// the later one) and the metadata of the later one.
    #[inline]
    fn prefetch_next_victims<P: ReplacementPolicy + ?Sized>(&self, policy: &P) {
        let [next, after] = policy.next_victims();
        if let Some(after) = after {
            // Addresses only (a prefetch of a bad one is harmless): no bounds checks.
            let at = after as usize;
            crate::prefetch::prefetch_address(self.records.as_ptr().wrapping_add(at) as usize);
        }
        if let Some(next) = next {
            let hash = self.records[next as usize].line.hash;
            self.prefetch_index_of(policy, hash);
        }
    }

    /// Records that the request in progress has ops on `slot` (see
    /// `SlotMeta::used_by_request`); nothing when the ops are discarded.
    #[inline(always)]
    fn mark_used<S: OpSink>(&mut self, slot: SlotId) {
        if S::KEEPS_OPS {
            self.records[slot as usize].meta.used_by_request = self.request_seq as u32;
        }
    }

    /// Empties `slot` (already forgotten by the policy), writing back its dirty sectors.
    #[inline(always)]
    fn evict<S: OpSink>(&mut self, slot: SlotId, ops: &mut S) {
        debug_assert!(
            self.records[slot as usize].meta.resident,
            "policy named a free slot as victim"
        );
        self.stats.evictions += 1;
        self.empty_slot(slot, ops);
    }

    /// Writes back `slot`'s dirty sectors and forgets its line.
    #[inline(always)]
    fn empty_slot<S: OpSink>(&mut self, slot: SlotId, ops: &mut S) {
        self.seal_ops_before_reuse(slot, ops);
        self.write_back_dirty(slot, ops);
        let meta = &mut self.records[slot as usize].meta;
        meta.resident = false;
        meta.generation += 1;
        let line = &self.records[slot as usize].line;
        let (volume, hash) = (line.volume, line.hash);
        self.count_lines(volume, -1, 0);
        self.index.remove_hashed(hash, slot);
        bitmap::clear(self.valid_mut(slot));
    }

    /// When this request already has ops on `slot`, seals them, so they
    /// are kept apart from what the slot's reuse adds.
    #[inline(always)]
    fn seal_ops_before_reuse<S: OpSink>(&self, slot: SlotId, ops: &mut S) {
        if S::KEEPS_OPS && self.records[slot as usize].meta.used_by_request == self.request_seq as u32 {
            ops.seal();
        }
    }

    /// Drops a resident line entirely (write invalidation), writing back its dirty sectors.
    fn drop_line<S: OpSink>(&mut self, slot: SlotId, ops: &mut S) {
        let key = self.records[slot as usize].line.key();
        self.policy.on_remove(slot);
        self.empty_slot(slot, ops);
        self.emit(ops, Op::Invalidate { slot, key });
        self.free.push(slot);
        self.stats.invalidations += 1;
    }

    #[inline(always)]
    fn write_back_dirty<S: OpSink>(&mut self, slot: SlotId, ops: &mut S) {
        if bitmap::any(self.dirty_of(slot)) {
            self.write_back_dirty_sectors(slot, ops);
        }
        // `unmark_dirty_if_clean`, its usual no-op answered inline.
        if self.records[slot as usize].meta.dirty_listed {
            self.unmark_dirty_if_clean(slot);
        }
    }

    /// The dirty half of [`Cache::write_back_dirty`], kept out of line so
    /// that evicting a clean line (the usual case) stays short.
    #[cold]
    #[inline(never)]
    fn write_back_dirty_sectors<S: OpSink>(&mut self, slot: SlotId, ops: &mut S) {
        self.emit_write_backs(slot, ops);
        self.stats.dirty_writebacks += 1;
        bitmap::clear(self.dirty_mut(slot));
    }

    /// Emits one write-back op per run of dirty sectors in `slot`.
    fn emit_write_backs<S: OpSink>(&mut self, slot: SlotId, ops: &mut S) {
        let key = self.records[slot as usize].line.key();
        let mut runs = std::mem::take(&mut self.runs);
        runs.clear();
        bitmap::for_each_run(self.dirty_of(slot), 0, self.line.sectors(), |a, b, dirty| {
            if dirty {
                runs.push((a, b, dirty))
            }
        });
        for &(start, end, _) in &runs {
            self.emit(ops, self.write_back(slot, key, start, end));
        }
        self.runs = runs;
    }

    fn mark_dirty(&mut self, slot: SlotId, now_ns: u64) {
        let meta = &mut self.records[slot as usize].meta;
        if !meta.dirty_listed {
            meta.dirty_listed = true;
            meta.dirty_since_ns = now_ns;
            let volume = self.records[slot as usize].line.volume;
            self.dirty_links.push_tail(&mut self.dirty_list, slot);
            self.count_lines(volume, 0, 1);
        }
    }

    /// Adds to the per-volume line counts, when they are kept.
    #[inline]
    fn count_lines(&mut self, volume: VolumeId, resident: i64, dirty: i64) {
        if let Some(counts) = &mut self.volume_lines {
            let entry = counts.entry(volume).or_default();
            entry.resident = entry.resident.wrapping_add_signed(resident);
            entry.dirty = entry.dirty.wrapping_add_signed(dirty);
        }
    }

    /// Takes `slot` off the dirty list if it has no dirty sector left; says whether it did.
    #[inline]
    fn unmark_dirty_if_clean(&mut self, slot: SlotId) -> bool {
        if self.records[slot as usize].meta.dirty_listed && !bitmap::any(self.dirty_of(slot)) {
            self.records[slot as usize].meta.dirty_listed = false;
            self.dirty_links.unlink(&mut self.dirty_list, slot);
            self.count_lines(self.records[slot as usize].line.volume, 0, -1);
            true
        } else {
            false
        }
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

    /// Chooses up to `max_lines` dirty lines not already being flushed, emits their
    /// write-back ops into `ops` (cleared first) and a token per line into `tokens`.
    pub fn begin_flush(
        &mut self,
        order: FlushOrder,
        max_lines: usize,
        ops: &mut OpList,
        tokens: &mut Vec<FlushToken>,
    ) {
        ops.clear();
        tokens.clear();
        let candidates: Vec<SlotId> = match order {
            FlushOrder::Oldest => self
                .dirty_links
                .iter(&self.dirty_list)
                .filter(|&s| !self.records[s as usize].meta.flushing)
                .take(max_lines)
                .collect(),
            FlushOrder::Address => {
                let mut dirty: Vec<(LineKey, SlotId)> = self
                    .dirty_links
                    .iter(&self.dirty_list)
                    .filter(|&s| !self.records[s as usize].meta.flushing)
                    .map(|s| (self.records[s as usize].line.key(), s))
                    .collect();
                dirty.sort_unstable();
                let start = match self.flush_cursor {
                    Some(cursor) => dirty.partition_point(|(k, _)| *k <= cursor),
                    None => 0,
                };
                let picked: Vec<SlotId> = dirty[start..]
                    .iter()
                    .chain(dirty[..start].iter())
                    .take(max_lines)
                    .map(|&(_, s)| s)
                    .collect();
                if let Some(&last) = picked.last() {
                    self.flush_cursor = Some(self.records[last as usize].line.key());
                }
                picked
            }
            FlushOrder::Volume(volume) => {
                let mut dirty: Vec<(LineKey, SlotId)> = self
                    .dirty_links
                    .iter(&self.dirty_list)
                    .filter(|&s| {
                        let meta = &self.records[s as usize].meta;
                        self.records[s as usize].line.volume == volume && !meta.flushing
                    })
                    .map(|s| (self.records[s as usize].line.key(), s))
                    .collect();
                dirty.sort_unstable();
                dirty.into_iter().take(max_lines).map(|(_, s)| s).collect()
            }
        };
        for slot in candidates {
            self.emit_write_backs(slot, ops);
            let key = self.records[slot as usize].line.key();
            let meta = &mut self.records[slot as usize].meta;
            meta.flushing = true;
            tokens.push(FlushToken {
                slot,
                key,
                generation: meta.generation,
            });
        }
        ops.seal();
    }

    /// Finishes a flush. On success the line becomes clean unless it changed
    /// (was written, evicted or invalidated) since `begin_flush`: then it stays
    /// dirty and a later flush writes it again. Returns whether it was cleaned.
    pub fn complete_flush(&mut self, token: &FlushToken, succeeded: bool) -> bool {
        let record = &mut self.records[token.slot as usize];
        record.meta.flushing = false;
        let unchanged = record.meta.resident
            && record.line.key() == token.key
            && record.meta.generation == token.generation;
        if !(succeeded && unchanged) {
            return false;
        }
        bitmap::clear(self.dirty_mut(token.slot));
        if self.unmark_dirty_if_clean(token.slot) {
            self.policy.on_clean(token.slot);
        }
        self.stats.flushed_lines += 1;
        true
    }

    /// No free slot, and every resident line dirty.
    fn full_of_dirty_lines(&self) -> bool {
        self.free.is_empty() && self.dirty_lines() == self.resident_lines()
    }

    /// Forgets sectors `[first_sector, end_sector)` of `key` without writing
    /// anything back, for a runtime whose cache-device write for them failed:
    /// the cache must not serve data it could not store. The line is dropped
    /// once it has no valid sector left. Returns whether anything was forgotten.
    pub fn forget_sectors(&mut self, key: LineKey, first_sector: u32, end_sector: u32) -> bool {
        let Some(slot) = self.lookup(key) else {
            return false;
        };
        let end = end_sector.min(self.line.sectors());
        bitmap::clear_range(self.valid_mut(slot), first_sector, end);
        bitmap::clear_range(self.dirty_mut(slot), first_sector, end);
        self.records[slot as usize].meta.generation += 1;
        if bitmap::any(self.valid_of(slot)) {
            if self.unmark_dirty_if_clean(slot) {
                self.policy.on_clean(slot);
            }
        } else {
            self.policy.on_remove(slot);
            self.unmark_dirty_if_clean(slot);
            let meta = &mut self.records[slot as usize].meta;
            meta.resident = false;
            self.count_lines(key.volume, -1, 0);
            self.index.remove(&key, slot);
            self.free.push(slot);
            self.stats.invalidations += 1;
        }
        true
    }

    /// What `slot` holds, for a runtime that persists metadata: its line and
    /// its valid and dirty bitmaps (`bitmap_words` each), or `None` if free.
    pub fn slot_snapshot(&self, slot: SlotId) -> Option<SlotSnapshot<'_>> {
        let meta = self.records.get(slot as usize).map(|r| &r.meta)?;
        meta.resident.then(|| SlotSnapshot {
            key: self.records[slot as usize].line.key(),
            valid: self.valid_of(slot),
            dirty: self.dirty_of(slot),
        })
    }

    /// Words per valid or dirty bitmap of a line.
    pub fn bitmap_words(&self) -> usize {
        self.words
    }

    /// Loads lines found on a persistent cache device into an empty cache,
    /// each in the slot it was found in. Dirty lines join the dirty list as
    /// dirty since `now_ns`; the replacement policy sees each as inserted, in
    /// the order given. Checked: the cache must be empty, and each line's
    /// slot in range and used once, its key unique, its bitmaps `bitmap_words`
    /// long, not empty, and its dirty bits a subset of its valid bits.
    pub fn restore(&mut self, lines: &[RestoredLine<'_>], now_ns: u64) -> Result<(), CoreError> {
        let bad = |slot: SlotId, reason: String| CoreError::BadRestore {
            slot: slot as u64,
            reason,
        };
        if let Some(line) = lines.first() {
            if !self.index.is_empty() {
                return Err(bad(line.slot, "the cache is not empty".into()));
            }
        }
        let mut taken = vec![false; self.records.len()];
        for line in lines {
            let slot = line.slot;
            if slot as usize >= self.records.len() {
                return Err(bad(
                    slot,
                    format!("beyond the cache's {} slots", self.records.len()),
                ));
            }
            if taken[slot as usize] {
                return Err(bad(slot, "listed twice".into()));
            }
            if line.valid.len() != self.words || line.dirty.len() != self.words {
                return Err(bad(
                    slot,
                    format!(
                        "bitmaps of {} and {} words, expected {}",
                        line.valid.len(),
                        line.dirty.len(),
                        self.words
                    ),
                ));
            }
            if !bitmap::any(line.valid) {
                return Err(bad(slot, "no valid sector".into()));
            }
            if line.dirty.iter().zip(line.valid).any(|(d, v)| d & !v != 0) {
                return Err(bad(slot, "dirty sectors that are not valid".into()));
            }
            let sectors = u64::from(self.line.sectors());
            let beyond = line.valid.iter().enumerate().any(|(w, &bits)| {
                let in_word = sectors.saturating_sub(w as u64 * 64).min(64);
                let mask = if in_word == 64 { !0 } else { (1u64 << in_word) - 1 };
                bits & !mask != 0
            });
            if beyond {
                return Err(bad(slot, "bits set beyond the line's sectors".into()));
            }
            if self.lookup(line.key).is_some() {
                return Err(bad(slot, format!("line {:?} is already restored", line.key)));
            }
            taken[slot as usize] = true;
            self.index.insert(&line.key, slot);
            let record = &mut self.records[slot as usize];
            record.line.set_key(line.key, hash_of(&line.key));
            let meta = &mut record.meta;
            meta.resident = true;
            meta.generation += 1;
            self.count_lines(line.key.volume, 1, 0);
            self.valid_mut(slot).copy_from_slice(line.valid);
            self.dirty_mut(slot).copy_from_slice(line.dirty);
            let dirty = bitmap::any(line.dirty);
            self.policy.on_insert(
                slot,
                line.key,
                &AccessInfo {
                    dirty,
                    ..AccessInfo::read_at(now_ns)
                },
            );
            if dirty {
                self.mark_dirty(slot, now_ns);
            }
        }
        self.free.retain(|&s| !taken[s as usize]);
        Ok(())
    }

    /// A word per slot that the cache stores for its driver and never reads
    /// or changes (zero at first, kept across evictions, restores and
    /// retirement). It shares the slot's metadata cache line, so a driver's
    /// per-slot state costs no extra memory access on a hit (the engine keeps
    /// its slot ticket queue here).
    #[inline]
    pub fn slot_driver_word_mut(&mut self, slot: SlotId) -> &mut u64 {
        &mut self.records[slot as usize].meta.driver_word
    }

    /// Reads the driver's word of `slot` (see [`Cache::slot_driver_word_mut`]).
    #[inline]
    pub fn slot_driver_word(&self, slot: SlotId) -> u64 {
        self.records[slot as usize].meta.driver_word
    }

    /// Counts changes to `slot`'s contents (writes, evictions, forgetting):
    /// a runtime compares it to detect decisions made after its own.
    pub fn slot_generation(&self, slot: SlotId) -> u64 {
        self.records[slot as usize].meta.generation
    }

    /// [`Cache::forget_sectors`], but only while `slot` still holds `key`
    /// and its generation is still `generation` (nothing decided since
    /// changed it: forgetting cannot undo a later request's decision).
    /// Returns whether it forgot.
    pub fn forget_sectors_if_unchanged(
        &mut self,
        slot: SlotId,
        key: LineKey,
        generation: u64,
        first_sector: u32,
        end_sector: u32,
    ) -> bool {
        let meta = &self.records[slot as usize].meta;
        if !(meta.resident && self.records[slot as usize].line.key() == key && meta.generation == generation)
        {
            return false;
        }
        self.forget_sectors(key, first_sector, end_sector)
    }

    /// The line held by `slot`, if any.
    pub fn key_in_slot(&self, slot: SlotId) -> Option<LineKey> {
        let meta = self.records.get(slot as usize).map(|r| &r.meta)?;
        meta.resident.then_some(self.records[slot as usize].line.key())
    }

    /// The line size.
    pub fn line_size(&self) -> LineSize {
        self.line
    }

    /// When the background cleaner should next run, if ever (see [`CleaningPolicy`]).
    /// A runtime sleeps until then (the engine) or runs it before the first
    /// request at or after that time (the simulator).
    pub fn next_cleaning_ns(&self) -> Option<u64> {
        let oldest = self.oldest_dirty_since_ns()?;
        let after_last = |interval_ns: u64| self.cleaner_last_ns.map_or(0, |t| t.saturating_add(interval_ns));
        match self.config.cleaning {
            CleaningPolicy::Nop => None,
            CleaningPolicy::Aggressive { interval_ns, .. } => Some(after_last(interval_ns).max(oldest)),
            CleaningPolicy::Lazy {
                idle_ns,
                interval_ns,
                stale_ns,
                ..
            } => {
                let idle_since = self.last_request_ns.unwrap_or(0).saturating_add(idle_ns);
                Some(
                    after_last(interval_ns)
                        .max(idle_since)
                        .max(oldest.saturating_add(stale_ns)),
                )
            }
        }
    }

    /// Runs the cleaner at `now_ns`: emits write-backs for its batch of dirty
    /// lines into `ops` and a token per line into `tokens` (both cleared
    /// first). Complete every token with [`Cache::complete_flush`].
    pub fn run_cleaner(&mut self, now_ns: u64, ops: &mut OpList, tokens: &mut Vec<FlushToken>) {
        let (batch, stale_ns) = match self.config.cleaning {
            CleaningPolicy::Nop => (0, 0),
            CleaningPolicy::Aggressive { batch_lines, .. } => (batch_lines as usize, 0),
            CleaningPolicy::Lazy {
                batch_lines,
                stale_ns,
                ..
            } => (batch_lines as usize, stale_ns),
        };
        self.cleaner_last_ns = Some(now_ns);
        // Oldest first; with a staleness threshold, only lines dirty long enough.
        let fresh_from = now_ns.saturating_sub(stale_ns);
        let eligible = self
            .dirty_links
            .iter(&self.dirty_list)
            .filter(|&s| !self.records[s as usize].meta.flushing)
            .take(batch)
            .take_while(|&s| stale_ns == 0 || self.records[s as usize].meta.dirty_since_ns <= fresh_from)
            .count();
        self.begin_flush(FlushOrder::Oldest, eligible, ops, tokens);
        if !tokens.is_empty() {
            self.stats.cleaner_runs += 1;
        }
    }

    /// When the oldest dirty line became dirty (for lazy or age-based cleaning).
    pub fn oldest_dirty_since_ns(&self) -> Option<u64> {
        let head = self.dirty_list.head;
        (head != crate::policy::list::NIL).then(|| self.records[head as usize].meta.dirty_since_ns)
    }

    /// Keeps resident and dirty line counts per volume from now on, so that
    /// [`Cache::volume_lines`] answers without scanning the slots. Costs a
    /// hash-map update whenever a line enters or leaves the cache or its
    /// dirty list (the engine turns it on; the simulator does not).
    pub fn count_volume_lines(&mut self) {
        let mut counts: FxHashMap<VolumeId, VolumeLines> = FxHashMap::default();
        for (s, meta) in self.records.iter().map(|r| &r.meta).enumerate() {
            if meta.resident {
                let entry = counts.entry(self.records[s].line.volume).or_default();
                entry.resident += 1;
                entry.dirty += u64::from(bitmap::any(self.dirty_of(s as SlotId)));
            }
        }
        self.volume_lines = Some(counts);
    }

    /// How many lines of `volume` are resident, and how many of those dirty.
    /// O(1) once [`Cache::count_volume_lines`] was called, O(capacity) before.
    pub fn volume_lines(&self, volume: VolumeId) -> VolumeLines {
        if let Some(counts) = &self.volume_lines {
            return counts.get(&volume).copied().unwrap_or_default();
        }
        let mut out = VolumeLines::default();
        for (s, meta) in self.records.iter().map(|r| &r.meta).enumerate() {
            if meta.resident && self.records[s].line.volume == volume {
                out.resident += 1;
                out.dirty += u64::from(bitmap::any(self.dirty_of(s as SlotId)));
            }
        }
        out
    }

    /// Drops every resident line of `volume` that holds no dirty sector (a
    /// volume being detached, after its dirty lines were flushed), emitting
    /// one [`Op::Invalidate`] per line into `ops` (cleared first). Dirty lines
    /// stay: flush them first. Returns how many lines were dropped. O(capacity).
    pub fn drop_clean_lines(&mut self, volume: VolumeId, ops: &mut OpList) -> u64 {
        ops.clear();
        let mut dropped = 0;
        for s in 0..self.records.len() {
            let slot = s as SlotId;
            let meta = &self.records[s].meta;
            if meta.resident && self.records[s].line.volume == volume && !bitmap::any(self.dirty_of(slot)) {
                self.drop_line(slot, ops);
                dropped += 1;
            }
        }
        ops.seal();
        dropped
    }

    /// Checks every internal invariant; panics with a description if one fails.
    /// Cost is O(capacity): for tests and debugging.
    pub fn check_invariants(&self) {
        let lines = self.config.capacity_lines as usize;
        let mut resident = 0;
        let mut dirty = 0;
        for s in 0..lines {
            let slot = s as SlotId;
            let meta = &self.records[s].meta;
            if meta.resident {
                resident += 1;
                assert_eq!(
                    self.lookup(self.records[s].line.key()),
                    Some(slot),
                    "index lost slot {s}"
                );
                assert_eq!(
                    self.records[s].line.hash,
                    hash_of(&self.records[s].line.key()),
                    "slot {s} keeps a stale hash of its key"
                );
                let (v, d) = (self.valid_of(slot), self.dirty_of(slot));
                for w in 0..self.words {
                    assert_eq!(d[w] & !v[w], 0, "slot {s} has dirty sectors that are not valid");
                }
                if bitmap::any(d) {
                    dirty += 1;
                    assert!(meta.dirty_listed, "dirty slot {s} missing from dirty list");
                }
            } else {
                assert!(!bitmap::any(self.dirty_of(slot)), "free slot {s} is dirty");
            }
            assert_eq!(
                meta.dirty_listed,
                meta.resident && bitmap::any(self.dirty_of(slot))
            );
        }
        assert_eq!(
            resident,
            self.index.len(),
            "index size differs from resident slots"
        );
        assert_eq!(
            resident + self.free.len() + self.retired_count,
            lines,
            "slots leaked"
        );
        for &f in &self.free {
            assert!(
                self.retired.is_empty() || !self.retired[f as usize],
                "retired slot {f} is on the free list"
            );
        }
        assert_eq!(dirty, self.dirty_list.len as usize, "dirty list length");
        if let Some(counts) = &self.volume_lines {
            let mut expected: FxHashMap<VolumeId, VolumeLines> = FxHashMap::default();
            for (s, meta) in self.records.iter().map(|r| &r.meta).enumerate() {
                if meta.resident {
                    let entry = expected.entry(self.records[s].line.volume).or_default();
                    entry.resident += 1;
                    entry.dirty += u64::from(bitmap::any(self.dirty_of(s as SlotId)));
                }
            }
            for (volume, counted) in counts {
                assert_eq!(
                    *counted,
                    expected.get(volume).copied().unwrap_or_default(),
                    "line counts of volume {volume}"
                );
            }
            for (volume, lines) in &expected {
                assert_eq!(counts.get(volume), Some(lines), "line counts of volume {volume}");
            }
        }
    }
}

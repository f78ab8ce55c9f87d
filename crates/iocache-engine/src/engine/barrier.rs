//! The persistence barrier: the one place that makes completed writes
//! durable and says so. A barrier (FLUSH, FUA, shutdown, the reuse of a
//! slot whose record may still name another line's dirty data) writes the
//! records of changed slots between a backend flush and cache flushes
//! (docs/format.md, "Engine write ordering"); with volatile metadata it
//! writes back the lines dirty when it arrives instead. Writes about to
//! land on checksummed dirty sectors get their intents written here too
//! (group commit). It owns the superblock, its current copy, the record
//! writer and the intent log's head ([`MetaState`]) and the barrier
//! counters ([`Durability`], held by the metadata component, `metadata.rs`). It reports whether the
//! records are durable; freeing the mirrors that waited for that is the
//! cleaner's job (`cleaner.rs`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};

use iocache_core::{FlushOrder, LineKey, SlotId};
use iocache_format::{Intent, ShutdownState, Superblock};

use super::{lock, EngineError, Inner};
use crate::persist::{PlannedRecord, RecordWriter};
use crate::recovery;

/// The superblock and the record writer: one barrier at a time.
pub(super) struct MetaState {
    pub(super) superblock: Superblock,
    pub(super) superblock_copy: u8,
    pub(super) writer: RecordWriter,
    /// Where the next intent block goes in the intent log (bytes from its
    /// start); back to 0 after each barrier whose records are durable.
    pub(super) intent_head: u64,
    /// A barrier failed after staging records: a slot's newest record on
    /// the device may be one the writer does not know of, so no intent is
    /// tied to a record before a barrier succeeds.
    pub(super) records_uncertain: bool,
}

impl MetaState {
    pub(super) fn new(superblock: Superblock, superblock_copy: u8, writer: RecordWriter) -> MetaState {
        MetaState {
            superblock,
            superblock_copy,
            writer,
            intent_head: 0,
            records_uncertain: false,
        }
    }
}

/// A write waiting for its intent to be durable.
pub(super) struct WantedIntent {
    ticket: u64,
    /// `None`: the write is issued as soon as its intent is durable (it is
    /// counted in flight then). `Some(segment)`: written ahead for a later
    /// write of that request segment.
    ahead_for: Option<usize>,
    shard: usize,
    slot: SlotId,
    first: u32,
    end: u32,
    /// The checksum term of each sector the write leaves.
    terms: Vec<u64>,
}

/// Writers waiting for their intents: the first to find no leader writes
/// everyone's with one cache flush (group commit).
#[derive(Default)]
pub(super) struct IntentQueue {
    wanted: Vec<WantedIntent>,
    leading: bool,
    next_ticket: u64,
    /// Per ticket taken by a leader: whether its write may be issued (it
    /// was counted in flight), or why not.
    outcomes: HashMap<u64, Result<(), String>>,
}

/// What the barrier owns.
pub(super) struct Durability {
    /// The superblock and the record writer: one barrier at a time.
    pub(super) meta: Mutex<MetaState>,
    /// Barriers run (FLUSH, FUA, shutdown, slot reuse).
    pub(super) barriers: AtomicU64,
    /// Records written by those barriers.
    pub(super) records_written: AtomicU64,
    /// Intents written: one per write landing on checksummed dirty sectors.
    pub(super) intents_written: AtomicU64,
    /// Writers waiting for their intents.
    intents: Mutex<IntentQueue>,
    /// Signalled when a leader is done.
    intents_done: Condvar,
    /// Cache-device flushes those intents took (one per group).
    pub(super) intent_flushes: AtomicU64,
    /// Barriers run because the intent log was full.
    pub(super) intent_log_full: AtomicU64,
}

impl Durability {
    pub(super) fn new(meta: MetaState) -> Durability {
        Durability {
            meta: Mutex::new(meta),
            barriers: AtomicU64::new(0),
            records_written: AtomicU64::new(0),
            intents_written: AtomicU64::new(0),
            intents: Mutex::new(IntentQueue::default()),
            intents_done: Condvar::new(),
            intent_flushes: AtomicU64::new(0),
            intent_log_full: AtomicU64::new(0),
        }
    }
}

impl Inner {
    /// Makes every completed write durable where the write policy keeps it
    /// (see [`Engine::flush`]); with `everything`, a full snapshot of the
    /// records (clean shutdown).
    pub(super) fn barrier(&self, everything: bool) -> Result<(), EngineError> {
        if !self.metadata.records_slots() {
            return self.volatile_barrier();
        }
        let mut meta = lock(&self.metadata.durability.meta);
        self.barrier_locked(&mut meta, everything)
    }

    /// [`Inner::barrier`] with the metadata lock held.
    fn barrier_locked(&self, meta: &mut MetaState, everything: bool) -> Result<(), EngineError> {
        self.metadata.taking_records();
        // Mirrors whose line was clean before the records below were taken:
        // the cleaner frees them once those records are durable.
        let releases = self.take_mirror_releases();
        let mut planned: Vec<(usize, Vec<PlannedRecord>)> = Vec::new();
        for (i, shard) in self.shards.iter().enumerate() {
            let mut state = lock(&shard.state);
            // Rule 5 of persist.rs: the shard's writes land first.
            if state.shadow.in_flight() > 0 {
                state.shadow.set_draining(true);
                while state.shadow.in_flight() > 0 {
                    state = shard.landed.wait(state).unwrap_or_else(|e| e.into_inner());
                }
                state.shadow.set_draining(false);
            }
            let mut records = state.shadow.take_records(self.metadata.mode(), everything);
            drop(state);
            self.read_back_unknown_checksums(i, &mut records);
            if !records.is_empty() {
                planned.push((i, records));
            }
        }
        let result = self.write_records(meta, &planned);
        if result.is_ok() {
            // Every intent is tied to a record these replace (each slot an
            // intent named was changed since): the log starts over.
            meta.intent_head = 0;
            meta.records_uncertain = false;
        }
        for (i, records) in &planned {
            let mut state = lock(&self.shards[*i].state);
            match result {
                Ok(()) => state.shadow.records_durable(records),
                Err(_) => state.shadow.requeue(records),
            }
        }
        // The barrier reports whether the records are durable; the cleaner
        // frees the mirrors (or keeps them for the next barrier).
        self.mirror_records_durable(releases, result.is_ok());
        self.metadata.durability.barriers.fetch_add(1, Ordering::Relaxed);
        result
    }

    /// With volatile metadata the cache cannot make dirty data durable: a
    /// FLUSH writes back every line dirty when it arrives, waits for the
    /// write-backs of evicted lines already under way, and flushes both
    /// devices. Lines dirtied meanwhile are left for the next one.
    pub(super) fn volatile_barrier(&self) -> Result<(), EngineError> {
        let _cleaning = lock(&self.cleaner.cleaning);
        if let Some(epochs) = &self.epochs {
            // Every epoch before the one this FLUSH started, in order.
            let (_, failed) = self.ordered_drain(Some(epochs.current()))?;
            self.metadata.durability.barriers.fetch_add(1, Ordering::Relaxed);
            if failed > 0 {
                return Err(EngineError::DirtyLinesRemain { lines: failed as u64 });
            }
            self.flush_backends()?;
            return self.flush_cache_device();
        }
        let horizon = self.cleaner.writebacks_horizon();
        let shards: Vec<usize> = (0..self.shards.len())
            .filter(|&s| lock(&self.shards[s].state).cache.dirty_lines() > 0)
            .collect();
        let dirty = shards
            .iter()
            .map(|&s| lock(&self.shards[s].state).cache.dirty_lines() as usize)
            .max()
            .unwrap_or(0);
        let failed = if dirty > 0 {
            self.flush_batch(&shards, FlushOrder::Address, dirty, false)
                .failed
        } else {
            0
        };
        self.cleaner.wait_for_writebacks_before(horizon);
        self.metadata.durability.barriers.fetch_add(1, Ordering::Relaxed);
        if failed > 0 {
            return Err(EngineError::DirtyLinesRemain { lines: failed as u64 });
        }
        self.flush_backends()?;
        self.flush_cache_device()?;
        Ok(())
    }

    fn write_records(
        &self,
        meta: &mut MetaState,
        planned: &[(usize, Vec<PlannedRecord>)],
    ) -> Result<(), EngineError> {
        // Rule 3: write-backs durable before records stop saying dirty;
        // rule 1: data durable before records say it is there.
        self.flush_backends()?;
        self.flush_cache_device()?;
        let mut staged = Vec::new();
        for (shard, records) in planned {
            let base = self.shards[*shard].base_slot;
            for record in records {
                let slot = base + u64::from(record.slot);
                if meta.writer.is_blank(slot, &record.line) {
                    continue;
                }
                let (copy, sequence) = meta
                    .writer
                    .stage(slot, record.line.clone())
                    .map_err(|e| EngineError::Format(e.to_string()))?;
                staged.push((slot, copy, sequence));
            }
        }
        if staged.is_empty() {
            return Ok(());
        }
        // From here until they are durable, a slot's newest record on the
        // device may be one the writer does not count as durable.
        meta.records_uncertain = true;
        for (offset, bytes) in meta.writer.take_writes() {
            self.slots.dev.write_at(bytes, offset)?;
        }
        self.flush_cache_device()?;
        for &(slot, copy, sequence) in &staged {
            meta.writer.durable(slot, copy, sequence);
        }
        self.metadata
            .durability
            .records_written
            .fetch_add(staged.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Dirty records whose checksum the shadow cannot give (data it never
    /// saw: a failed write): their line is read back from the cache device
    /// and checksummed as it is, so that every dirty record carries one.
    /// No write lands on those sectors meanwhile: the records' dirty
    /// sectors count as checksummed from the moment they were taken.
    fn read_back_unknown_checksums(&self, shard: usize, records: &mut [PlannedRecord]) {
        if !self.metadata.dirty_checksums() {
            return;
        }
        let mut buf = Vec::new();
        let mut terms = Vec::new();
        for record in records.iter_mut() {
            let Some(line) = record.line.as_mut().filter(|l| l.dirty && l.data_hash.is_none()) else {
                continue;
            };
            buf.resize(self.line_bytes as usize, 0);
            terms.resize(buf.len() / iocache_format::SECTOR_BYTES as usize, 0);
            if let Err(e) = self.read_slot_bytes(shard, record.slot, 0, &mut buf) {
                log::warn!(
                    "slot {} of shard {shard}: its dirty data could not be read back to checksum it ({e}); \
                     its record goes without a checksum",
                    record.slot
                );
                continue;
            }
            iocache_format::sector_checksums_into(0, &buf, &mut terms);
            line.data_hash = Some(iocache_format::dirty_terms_sum(&terms, &line.dirty_bits));
            lock(&self.shards[shard].state)
                .shadow
                .checksum_read_back(record.slot, &line.dirty_bits, &terms);
        }
    }

    /// After everything is written back: a full snapshot of the records and
    /// a superblock saying the cache was shut down cleanly.
    pub(super) fn close(&self) -> Result<(), EngineError> {
        if self.content_lost() {
            // Nothing the device holds is trusted: the superblock keeps
            // saying `running`, so no record is believed without its checks
            // (and the next start refuses a device still short).
            return Err(EngineError::Io(
                "the cache device lost its content: its records are not marked clean".into(),
            ));
        }
        self.barrier(true)?;
        self.write_superblock_state(ShutdownState::Clean)
    }

    pub(super) fn write_superblock_state(&self, state: ShutdownState) -> Result<(), EngineError> {
        self.update_superblock(|superblock| {
            superblock.state = state;
            true
        })
    }

    /// An A/B update of the superblock: `change` edits a copy of the
    /// current one (returning false when there is nothing to write); the
    /// copy is written, with the next sequence, over the copy that is not
    /// the current one, so a crash finds the old superblock or the new one.
    /// The one place the superblock is rewritten while the engine runs.
    pub(super) fn update_superblock(
        &self,
        change: impl FnOnce(&mut iocache_format::Superblock) -> bool,
    ) -> Result<(), EngineError> {
        let mut meta = lock(&self.metadata.durability.meta);
        let mut superblock = meta.superblock.clone();
        if !change(&mut superblock) {
            return Ok(());
        }
        superblock.sequence += 1;
        let copy = 1 - meta.superblock_copy;
        recovery::write_superblock(&*self.slots.dev, &superblock, copy)?;
        meta.superblock = superblock;
        meta.superblock_copy = copy;
        Ok(())
    }

    /// Records on the device that the cache is in use (not cleanly shut
    /// down), after start-up work that needs writing is done.
    pub(super) fn mark_running(&self) -> Result<(), EngineError> {
        let restored_dirty = self.shards.iter().any(|s| lock(&s.state).cache.dirty_lines() > 0);
        // Clean records left from a persistent run: no barrier will blank
        // them, and a volume attached later could take their volume id.
        let stale_records = self.recovery.dropped_clean_lines > 0 || !self.recovery.damaged_slots.is_empty();
        if !self.metadata.records_slots() && (restored_dirty || stale_records) {
            // Volatile metadata from now on: write the recovered dirty lines
            // back, then blank the records that described them.
            self.flush_all()?;
            let meta = lock(&self.metadata.durability.meta);
            let layout = meta.writer.layout;
            // Empty records, as formatting writes (never zeroes: a zeroed
            // record copy is damage).
            let empty =
                iocache_format::empty_region(&layout).map_err(|e| EngineError::Format(e.to_string()))?;
            for copy in 0..2u8 {
                self.slots.dev.write_at(&empty, layout.copy_region_offset(copy))?;
            }
            self.flush_cache_device()?;
        }
        self.write_superblock_state(ShutdownState::Running)?;
        // Records of lines that could not stay in their slots.
        self.barrier(false)
    }

    /// Before a data write of `data` to sectors `[first, end)` of `slot` is
    /// issued (persistent metadata) by request segment `owner`: counts it in
    /// flight, first making its intent durable when a checksum on the
    /// device covers some of those sectors and none was written ahead
    /// (rule 4 of `persist.rs`), or waiting behind a barrier that drains
    /// the shard.
    pub(super) fn begin_cache_write(
        &self,
        owner: usize,
        shard: usize,
        slot: SlotId,
        first: u32,
        end: u32,
        data: &[u8],
    ) -> Result<(), EngineError> {
        if lock(&self.shards[shard].state)
            .shadow
            .begin_now(owner, slot, first, end)
        {
            return Ok(());
        }
        let mut terms = vec![0u64; (end - first) as usize];
        iocache_format::sector_checksums_into(first, data, &mut terms);
        self.write_intents(vec![(None, shard, slot, first, end, terms)])
    }

    /// Writes ahead, with one flush, the intents of every write of a
    /// request that will land on checksummed dirty sectors (so that a
    /// large rewrite of flushed dirty lines costs one flush, not one per
    /// line): `writes` are (segment, shard, slot, first, end, terms). Each
    /// write still checks at its start that the record its intent is tied
    /// to is the newest. Failures are left to those checks.
    pub(super) fn write_intents_ahead(&self, writes: Vec<(usize, usize, SlotId, u32, u32, Vec<u64>)>) {
        let wanted = writes
            .into_iter()
            .map(|(owner, shard, slot, first, end, terms)| (Some(owner), shard, slot, first, end, terms))
            .collect();
        let _ = self.write_intents(wanted);
    }

    /// Queues intents and waits until they are durable, writes to be issued
    /// at once counted in flight. Whoever finds no leader leads: it takes the
    /// metadata lock (no barrier runs meanwhile) and writes the intents of
    /// every writer queued by then in one block, with one cache flush, then
    /// counts their writes in flight before letting go, so that a barrier
    /// after it waits for them to land. Followers wait on a condition, not
    /// on the metadata lock (a barrier may hold it while it waits for their
    /// writes).
    #[allow(clippy::type_complexity)]
    fn write_intents(
        &self,
        writes: Vec<(Option<usize>, usize, SlotId, u32, u32, Vec<u64>)>,
    ) -> Result<(), EngineError> {
        let mut queue = lock(&self.metadata.durability.intents);
        let mut tickets = Vec::with_capacity(writes.len());
        for (ahead_for, shard, slot, first, end, terms) in writes {
            let ticket = queue.next_ticket;
            queue.next_ticket += 1;
            tickets.push(ticket);
            queue.wanted.push(WantedIntent {
                ticket,
                ahead_for,
                shard,
                slot,
                first,
                end,
                terms,
            });
        }
        let mut result = Ok(());
        // Takes the outcomes of this caller's tickets; true when all are in.
        let mut collect = |queue: &mut IntentQueue, result: &mut Result<(), String>| {
            tickets.retain(|t| match queue.outcomes.remove(t) {
                Some(outcome) => {
                    if result.is_ok() {
                        *result = outcome;
                    }
                    false
                }
                None => true,
            });
            tickets.is_empty()
        };
        loop {
            if collect(&mut queue, &mut result) {
                return result.map_err(EngineError::Io);
            }
            if !queue.leading {
                break;
            }
            queue = self
                .metadata
                .durability
                .intents_done
                .wait(queue)
                .unwrap_or_else(|e| e.into_inner());
        }
        queue.leading = true;
        drop(queue);
        loop {
            let outcomes = {
                let mut meta = lock(&self.metadata.durability.meta);
                let batch = self.take_intent_batch(meta.writer.layout.intent_bytes);
                self.lead_intents(&mut meta, batch)
            };
            let mut queue = lock(&self.metadata.durability.intents);
            queue.outcomes.extend(outcomes);
            let done = collect(&mut queue, &mut result);
            if done {
                queue.leading = false;
            }
            self.metadata.durability.intents_done.notify_all();
            if done {
                return result.map_err(EngineError::Io);
            }
        }
    }

    /// The oldest queued intents whose blocks fit in a log of `log_bytes`
    /// together (at least one).
    fn take_intent_batch(&self, log_bytes: u64) -> Vec<WantedIntent> {
        let mut queue = lock(&self.metadata.durability.intents);
        let mut total = 0;
        let mut n = 0;
        for w in &queue.wanted {
            let bytes = iocache_format::intent_bytes_for_sectors(w.terms.len()) as u64;
            if n > 0 && total + bytes > log_bytes {
                break;
            }
            total += bytes;
            n += 1;
        }
        queue.wanted.drain(..n).collect()
    }

    /// The leader's work, under the metadata lock: each write of `batch`
    /// either needs no intent any more (counted in flight at once) or gets
    /// one tied to its slot's newest durable record; the block is written
    /// at the log's head and the cache device flushed; then the writes are
    /// counted in flight. A full log (or records a failed barrier left
    /// uncertain) runs a barrier first.
    fn lead_intents(&self, meta: &mut MetaState, batch: Vec<WantedIntent>) -> Vec<(u64, Result<(), String>)> {
        let mut outcomes = Vec::with_capacity(batch.len());
        let layout = meta.writer.layout;
        // Only writes that land on checksummed sectors need an intent (no
        // barrier drains meanwhile: this holds the metadata lock); the
        // others begin below whatever the log holds.
        let covered: Vec<bool> = batch
            .iter()
            .map(|w| {
                lock(&self.shards[w.shard].state)
                    .shadow
                    .checksum_covers(w.slot, w.first, w.end)
            })
            .collect();
        let worst: u64 = batch
            .iter()
            .zip(&covered)
            .filter(|(_, &c)| c)
            .map(|(w, _)| iocache_format::intent_bytes_for_sectors(w.terms.len()) as u64)
            .sum();
        let any_covered = covered.iter().any(|&c| c);
        if any_covered && (meta.records_uncertain || meta.intent_head + worst > layout.intent_bytes) {
            if !meta.records_uncertain {
                self.metadata
                    .durability
                    .intent_log_full
                    .fetch_add(1, Ordering::Relaxed);
            }
            if let Err(e) = self.barrier_locked(meta, false) {
                let why = format!("a barrier before writing intents failed: {e}");
                return batch.into_iter().map(|w| (w.ticket, Err(why.clone()))).collect();
            }
        }
        let mut intents: Vec<Intent> = Vec::new();
        let mut tied: Vec<(&WantedIntent, u32)> = Vec::new();
        for w in &batch {
            let global = self.shards[w.shard].base_slot + u64::from(w.slot);
            let mut unknown = Vec::new();
            let (needed, mut pairs, epoch) = {
                let mut state = lock(&self.shards[w.shard].state);
                let needed = match w.ahead_for {
                    // Issued at once: begun here unless a checksum covers it.
                    None => !state.shadow.begin_cache_write(w.slot, w.first, w.end),
                    Some(_) => state.shadow.checksum_covers(w.slot, w.first, w.end),
                };
                let pairs = if needed {
                    state.shadow.intent_pairs(w.slot, w.first, &w.terms, &mut unknown)
                } else {
                    Vec::new()
                };
                (needed, pairs, state.shadow.record_epoch(w.slot))
            };
            if !needed {
                outcomes.push((w.ticket, Ok(())));
                continue;
            }
            if !unknown.is_empty() {
                // Bases this never saw: the sectors still hold them (no
                // write lands on checksummed sectors without an intent).
                if let Err(e) = self.read_bases(w.shard, w.slot, &mut pairs, &unknown) {
                    outcomes.push((
                        w.ticket,
                        Err(format!("reading back the data an intent names failed: {e}")),
                    ));
                    continue;
                }
            }
            let sequence = meta.writer.durable_sequence(global);
            intents.push(Intent {
                slot: global,
                sequence,
                pairs,
            });
            tied.push((w, epoch));
        }
        if intents.is_empty() {
            return outcomes;
        }
        let mut block = Vec::with_capacity(iocache_format::intent_block_bytes(&intents));
        iocache_format::encode_intent_block(&intents, &mut block);
        debug_assert!(meta.intent_head + block.len() as u64 <= layout.intent_bytes);
        let written = self
            .slots
            .dev
            .write_at(&block, layout.intent_offset() + meta.intent_head)
            .map_err(EngineError::from)
            .and_then(|()| self.flush_cache_device());
        meta.intent_head += block.len() as u64;
        match written {
            Ok(()) => {
                self.metadata
                    .durability
                    .intent_flushes
                    .fetch_add(1, Ordering::Relaxed);
                self.metadata
                    .durability
                    .intents_written
                    .fetch_add(tied.len() as u64, Ordering::Relaxed);
                for (w, epoch) in tied {
                    let mut state = lock(&self.shards[w.shard].state);
                    match w.ahead_for {
                        None => state.shadow.intent_durable(w.slot, w.first, w.end),
                        Some(owner) => state
                            .shadow
                            .intent_prewritten(owner, w.slot, w.first, w.end, epoch),
                    }
                    outcomes.push((w.ticket, Ok(())));
                }
            }
            Err(e) => {
                let why = format!("writing the intent of a write failed: {e}");
                outcomes.extend(tied.into_iter().map(|(w, _)| (w.ticket, Err(why.clone()))));
            }
        }
        outcomes
    }

    /// Fills in the bases of `pairs[i]` for `i` in `unknown` by reading
    /// those sectors of `slot` from the cache device.
    fn read_bases(
        &self,
        shard: usize,
        slot: SlotId,
        pairs: &mut [iocache_format::IntentPair],
        unknown: &[usize],
    ) -> Result<(), EngineError> {
        let sector = iocache_format::SECTOR_BYTES as usize;
        let mut buf = vec![0u8; sector];
        let mut term = [0u64];
        for &i in unknown {
            let s = u32::from(pairs[i].sector);
            self.read_slot_bytes(shard, slot, s * sector as u32, &mut buf)?;
            iocache_format::sector_checksums_into(s, &buf, &mut term);
            pairs[i].base = Some(term[0]);
        }
        Ok(())
    }

    /// Waits until `key`'s data may be written into `slot` (rule 2 of
    /// `persist.rs`): runs a barrier if the slot's record on the device may
    /// still describe another line's dirty data (or, for a dirty write of
    /// ordered write-back's `epoch`, the line's from another epoch).
    pub(super) fn wait_until_reusable(
        &self,
        shard: usize,
        slot: SlotId,
        key: LineKey,
        epoch: Option<u32>,
    ) -> Result<(), EngineError> {
        for _ in 0..4 {
            if !lock(&self.shards[shard].state)
                .shadow
                .blocks_write(slot, key, epoch)
            {
                return Ok(());
            }
            self.barrier(false)?;
        }
        Err(EngineError::Io(format!(
            "slot {slot} of shard {shard} still holds another line's dirty record after barriers"
        )))
    }
}

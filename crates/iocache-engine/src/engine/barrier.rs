//! The persistence barrier: the one place that makes completed writes
//! durable and says so. A barrier (FLUSH, FUA, shutdown, the reuse of a
//! slot whose record may still name another line's dirty data) writes the
//! records of changed slots between a backend flush and cache flushes
//! (docs/format.md, "Engine write ordering"); with volatile metadata it
//! writes back the lines dirty when it arrives instead. It owns the
//! superblock, its current copy and the record writer ([`MetaState`]) and
//! the barrier counters ([`Durability`], one field of `Inner`). It reports
//! whether the records are durable; freeing the mirrors that waited for
//! that is the cleaner's job (`cleaner.rs`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use iocache_core::{FlushOrder, LineKey, SlotId};
use iocache_format::{Persistence, ShutdownState, Superblock};

use super::{lock, EngineError, Inner};
use crate::persist::{PlannedRecord, RecordWriter};
use crate::recovery;

/// The superblock and the record writer: one barrier at a time.
pub(super) struct MetaState {
    pub(super) superblock: Superblock,
    pub(super) superblock_copy: u8,
    pub(super) writer: RecordWriter,
}

/// What the barrier owns.
pub(super) struct Durability {
    /// The superblock and the record writer: one barrier at a time.
    pub(super) meta: Mutex<MetaState>,
    /// Barriers run (FLUSH, FUA, shutdown, slot reuse).
    pub(super) barriers: AtomicU64,
    /// Records written by those barriers and by checksum withdrawals.
    pub(super) records_written: AtomicU64,
    /// Dirty checksums withdrawn before an in-place write (each a record
    /// write and a cache flush).
    pub(super) checksums_withdrawn: AtomicU64,
    /// Slots (shard, shard-local slot) whose writers wait to withdraw a
    /// dirty checksum: the next withdrawal takes them all.
    pub(super) withdrawals_wanted: Mutex<Vec<(usize, SlotId)>>,
    /// Cache-device flushes those withdrawals took (one per group).
    pub(super) withdrawal_flushes: AtomicU64,
}

impl Durability {
    pub(super) fn new(meta: MetaState) -> Durability {
        Durability {
            meta: Mutex::new(meta),
            barriers: AtomicU64::new(0),
            records_written: AtomicU64::new(0),
            checksums_withdrawn: AtomicU64::new(0),
            withdrawals_wanted: Mutex::new(Vec::new()),
            withdrawal_flushes: AtomicU64::new(0),
        }
    }
}

impl Inner {
    /// Makes every completed write durable where the write policy keeps it
    /// (see [`Engine::flush`]); with `everything`, a full snapshot of the
    /// records (clean shutdown).
    pub(super) fn barrier(&self, everything: bool) -> Result<(), EngineError> {
        if self.persistence == Persistence::None {
            return self.volatile_barrier();
        }
        let mut meta = lock(&self.durability.meta);
        // Mirrors whose line was clean before the records below were taken:
        // the cleaner frees them once those records are durable.
        let releases = self.take_mirror_releases();
        let mut planned: Vec<(usize, Vec<PlannedRecord>)> = Vec::new();
        for (i, shard) in self.shards.iter().enumerate() {
            let records = lock(&shard.state)
                .shadow
                .take_records(self.persistence, everything);
            if !records.is_empty() {
                planned.push((i, records));
            }
        }
        let result = self.write_records(&mut meta, &planned);
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
        self.durability.barriers.fetch_add(1, Ordering::Relaxed);
        result
    }

    /// With volatile metadata the cache cannot make dirty data durable: a
    /// FLUSH writes back every line dirty when it arrives, waits for the
    /// write-backs of evicted lines already under way, and flushes both
    /// devices. Lines dirtied meanwhile are left for the next one.
    pub(super) fn volatile_barrier(&self) -> Result<(), EngineError> {
        let _cleaning = lock(&self.cleaner.cleaning);
        let horizon = self.cleaner.writebacks_horizon();
        let mut failed = 0;
        for shard in 0..self.shards.len() {
            let dirty = lock(&self.shards[shard].state).cache.dirty_lines() as usize;
            if dirty > 0 {
                failed += self.flush_batch(shard, FlushOrder::Address, dirty, false).failed;
            }
        }
        self.cleaner.wait_for_writebacks_before(horizon);
        self.durability.barriers.fetch_add(1, Ordering::Relaxed);
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
        for (offset, bytes) in meta.writer.take_writes() {
            self.slots.dev.write_at(bytes, offset)?;
        }
        self.flush_cache_device()?;
        for &(slot, copy, sequence) in &staged {
            meta.writer.durable(slot, copy, sequence);
        }
        self.durability
            .records_written
            .fetch_add(staged.len() as u64, Ordering::Relaxed);
        Ok(())
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
        let mut meta = lock(&self.durability.meta);
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
        if self.persistence == Persistence::None && (restored_dirty || stale_records) {
            // Volatile metadata from now on: write the recovered dirty lines
            // back, then blank the records that described them.
            self.flush_all()?;
            let meta = lock(&self.durability.meta);
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

    /// Before a data write to sectors `[first, end)` of `slot` is issued
    /// (persistent metadata): counts it in flight, first withdrawing a
    /// checksum on the device that covers some of those sectors (rule 4 of
    /// `persist.rs`).
    pub(super) fn begin_cache_write(
        &self,
        shard: usize,
        slot: SlotId,
        first: u32,
        end: u32,
    ) -> Result<(), EngineError> {
        if lock(&self.shards[shard].state)
            .shadow
            .begin_cache_write(slot, first, end)
        {
            return Ok(());
        }
        self.withdraw_dirty_checksum(shard, slot, first, end)
    }

    /// Makes a record of `slot` without a dirty checksum durable (its
    /// newest durable record again, without the checksum, under the next
    /// sequence), then begins the write to `[first, end)`. Holding the
    /// metadata lock throughout, no barrier can put a checksum back in
    /// between. Withdrawals wait for one another on that lock, so whoever
    /// gets it withdraws every slot asked for meanwhile too, with one
    /// cache-device flush for all (group commit): the others find theirs
    /// done.
    fn withdraw_dirty_checksum(
        &self,
        shard: usize,
        slot: SlotId,
        first: u32,
        end: u32,
    ) -> Result<(), EngineError> {
        lock(&self.durability.withdrawals_wanted).push((shard, slot));
        let mut meta = lock(&self.durability.meta);
        // Done by another writer's withdrawal, or by a barrier, while this
        // waited for the lock.
        if lock(&self.shards[shard].state)
            .shadow
            .begin_cache_write(slot, first, end)
        {
            return Ok(());
        }
        let mut wanted = std::mem::take(&mut *lock(&self.durability.withdrawals_wanted));
        if !wanted.contains(&(shard, slot)) {
            // Taken by a withdrawal that failed: ask again.
            wanted.push((shard, slot));
        }
        wanted.sort_unstable();
        wanted.dedup();
        let mut staged = Vec::with_capacity(wanted.len());
        for &(shard, slot) in &wanted {
            let global = self.shards[shard].base_slot + u64::from(slot);
            let line = meta
                .writer
                .newest(global)
                .and_then(|record| record.line)
                .map(|mut line| {
                    if line.dirty {
                        line.data_hash = None;
                    }
                    line
                });
            let (copy, sequence) = meta
                .writer
                .stage(global, line)
                .map_err(|e| EngineError::Format(e.to_string()))?;
            staged.push((global, copy, sequence));
        }
        for (offset, bytes) in meta.writer.take_writes() {
            self.slots.dev.write_at(bytes, offset)?;
        }
        self.flush_cache_device()?;
        self.durability.withdrawal_flushes.fetch_add(1, Ordering::Relaxed);
        for &(global, copy, sequence) in &staged {
            meta.writer.durable(global, copy, sequence);
        }
        self.durability
            .records_written
            .fetch_add(staged.len() as u64, Ordering::Relaxed);
        self.durability
            .checksums_withdrawn
            .fetch_add(staged.len() as u64, Ordering::Relaxed);
        for &(shard, slot) in &wanted {
            lock(&self.shards[shard].state).shadow.checksum_withdrawn(slot);
        }
        let begun = lock(&self.shards[shard].state)
            .shadow
            .begin_cache_write(slot, first, end);
        assert!(begun, "a withdrawn checksum still covers the write");
        Ok(())
    }

    /// Waits until `key`'s data may be written into `slot` (rule 2 of
    /// `persist.rs`): runs a barrier if the slot's record on the device may
    /// still describe another line's dirty data.
    pub(super) fn wait_until_reusable(
        &self,
        shard: usize,
        slot: SlotId,
        key: LineKey,
    ) -> Result<(), EngineError> {
        for _ in 0..4 {
            if !lock(&self.shards[shard].state).shadow.blocks_reuse(slot, key) {
                return Ok(());
            }
            self.barrier(false)?;
        }
        Err(EngineError::Io(format!(
            "slot {slot} of shard {shard} still holds another line's dirty record after barriers"
        )))
    }
}

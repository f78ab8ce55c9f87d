//! The cache-write path: preparing each `WriteCache` op (the slot may be
//! reused, the write is counted in flight, an intent made durable first
//! when it lands on checksummed dirty data), writing one op or a run of
//! them with one device write, and noting what landed in the shadow.

use super::*;

/// A `WriteCache` op ready to be written: what `Inner::prepare_cache_write`
/// worked out, for the write and for `Inner::finish_cache_write`.
pub(super) struct PreparedWrite<'b> {
    pub(super) slot: SlotId,
    pub(super) key: LineKey,
    pub(super) data: &'b [u8],
    /// Where `data` starts in the request's buffer.
    pub(super) buffer_at: usize,
    pub(super) device_offset: u64,
    pub(super) line_offset_bytes: u32,
    pub(super) first: u32,
    pub(super) end: u32,
    pub(super) dirty: bool,
    pub(super) fresh: bool,
    /// A kill may tear the write ([`Shadow::tearable`], decided once it
    /// began): the device may copy it in ([`BlockDevice::write_tearable_at`]).
    pub(super) tearable: bool,
}

impl Inner {
    /// Writes ahead the intents of every cache write of `plan` that will
    /// land on checksummed dirty sectors, with one flush for all (a 32 MiB
    /// rewrite of flushed dirty lines then costs one flush, not one per
    /// line). Returns whether there were any.
    pub(super) fn write_intents_of(&self, plan: &Plan, buffer: &Buffer<'_>) -> bool {
        // A read's fills are in its buffer only once the backend was read.
        if matches!(buffer, Buffer::Read(_)) {
            return false;
        }
        let mut covered = Vec::new();
        for segment in &plan.segments {
            let state = lock(&self.shards[segment.shard].state);
            for op in &segment.ops {
                if let Op::WriteCache {
                    slot,
                    line_offset_bytes,
                    length_bytes,
                    buffer_offset_bytes,
                    ..
                } = *op
                {
                    let first = line_offset_bytes / SECTOR_BYTES as u32;
                    let end = first + length_bytes / SECTOR_BYTES as u32;
                    if state.shadow.checksum_covers(slot, first, end) {
                        let at = segment.buffer_offset + buffer_offset_bytes as usize;
                        covered.push((segment, slot, first, end, at));
                    }
                }
            }
        }
        if covered.is_empty() {
            return false;
        }
        let writes = covered
            .into_iter()
            .map(|(segment, slot, first, end, at)| {
                let data =
                    Self::buffer_slice(buffer, at, at + ((end - first) * SECTOR_BYTES as u32) as usize);
                let mut terms = vec![0u64; (end - first) as usize];
                iocache_format::sector_checksums_into(first, data, &mut terms);
                (Self::owner_of(segment), segment.shard, slot, first, end, terms)
            })
            .collect();
        self.write_intents_ahead(writes);
        true
    }

    /// Who wrote an intent ahead for a write of `segment` (its address:
    /// unique while the request runs).
    pub(super) fn owner_of(segment: &PlannedSegment) -> usize {
        segment as *const PlannedSegment as usize
    }

    /// A `WriteCache` op: waits until the slot may be reused (persistent
    /// metadata), writes the slot (and its mirror on a cache array), notes
    /// the write in the shadow, and on failure forgets or poisons what the
    /// write was to leave there. `generation` is the slot's generation right
    /// after the decision.
    pub(super) fn write_cache_op(
        &self,
        segment: &PlannedSegment,
        op: &Op,
        generation: u64,
        buffer: &Buffer<'_>,
    ) -> Result<(), EngineError> {
        let w = self.prepare_cache_write(segment, op, buffer)?;
        let class = match buffer {
            Buffer::Read(_) => queues::cache_class::PROMOTION,
            Buffer::Write(_) => queues::cache_class::WRITE,
        };
        let (written, mirror) = self
            .queues
            .cache
            .time(&self.clock, class, || match &self.slots.array {
                None if w.tearable => (self.slots.dev.write_tearable_at(w.data, w.device_offset), None),
                None => (self.slots.dev.write_at(w.data, w.device_offset), None),
                Some(array) => {
                    let global = self.shards[segment.shard].base_slot + u64::from(w.slot);
                    self.write_array(array, global, w.key, w.data, w.line_offset_bytes, w.dirty)
                }
            });
        self.finish_cache_write(segment, &w, generation, written, mirror)
    }

    /// A run of `WriteCache` ops whose slots' ranges follow one another on
    /// the cache device and whose data follow one another in the buffer (a
    /// sequential write or fill into consecutive slots): written with one
    /// device write instead of one per line; each op's bookkeeping is its
    /// own, as in [`Inner::write_cache_op`]. Not on a cache array.
    pub(super) fn write_cache_run(
        &self,
        segment: &PlannedSegment,
        ops: &[Op],
        generations: &[u64],
        buffer: &Buffer<'_>,
    ) -> Result<(), EngineError> {
        debug_assert!(self.slots.array.is_none());
        // A 64 KiB write's lines (4 KiB) on the stack.
        let mut prepared: SmallVec<[PreparedWrite<'_>; 16]> = SmallVec::with_capacity(ops.len());
        self.prepare_cache_writes_at_once(segment, ops, buffer, &mut prepared);
        if prepared.len() < ops.len() {
            // An op must go the slow way (a barrier, an intent, a drain),
            // and a barrier waits for every begun write to land: the writes
            // begun are given up (nothing was issued), and the ops run one
            // by one.
            self.note_in_shadow(segment.shard, |state| {
                for w in &prepared {
                    state.shadow.cache_write_cancelled(w.slot);
                }
                self.wake_a_draining_barrier(segment.shard, state);
            });
            for (op, &generation) in ops.iter().zip(generations) {
                self.write_cache_op(segment, op, generation, buffer)?;
            }
            return Ok(());
        }
        self.write_prepared_run(segment, &prepared, generations, buffer)
    }

    /// Writes prepared (begun) cache writes whose ranges follow one another
    /// on the device and in the buffer with one device write.
    pub(super) fn write_prepared_run(
        &self,
        segment: &PlannedSegment,
        prepared: &[PreparedWrite<'_>],
        generations: &[u64],
        buffer: &Buffer<'_>,
    ) -> Result<(), EngineError> {
        let (first, last) = (&prepared[0], &prepared[prepared.len() - 1]);
        let data = Self::buffer_slice(buffer, first.buffer_at, last.buffer_at + last.data.len());
        let class = match buffer {
            Buffer::Read(_) => queues::cache_class::PROMOTION,
            Buffer::Write(_) => queues::cache_class::WRITE,
        };
        let tearable = prepared.iter().all(|w| w.tearable);
        let written = self.queues.cache.time(&self.clock, class, || match tearable {
            true => self.slots.dev.write_tearable_at(data, first.device_offset),
            false => self.slots.dev.write_at(data, first.device_offset),
        });
        if written.is_ok() {
            // The usual case: every op's bookkeeping under one lock.
            self.note_cache_writes(segment.shard, prepared, None);
            self.unpoison_written(segment.shard, prepared);
            return Ok(());
        }
        let mut result = Ok(());
        for (w, &generation) in prepared.iter().zip(generations) {
            let this = match &written {
                Ok(()) => Ok(()),
                Err(e) => Err(DeviceError::Io {
                    device: self.slots.dev.name().to_string(),
                    kind: iocache_device::IoKind::Write,
                    offset: w.device_offset,
                    len: w.data.len() as u64,
                    source: std::io::Error::other(e.to_string()),
                }),
            };
            if let Err(e) = self.finish_cache_write(segment, w, generation, this, None) {
                result = result.and(Err(e));
            }
        }
        result
    }

    pub(super) fn buffer_slice<'b>(buffer: &'b Buffer<'_>, from: usize, to: usize) -> &'b [u8] {
        match buffer {
            Buffer::Read(buf) => &buf[from..to],
            Buffer::Write(data) => &data[from..to],
        }
    }

    /// The length of the run of `WriteCache` ops at the start of `ops` that
    /// [`Inner::write_cache_run`] can write at once (1: none).
    pub(super) fn cache_write_run_len(&self, segment: &PlannedSegment, ops: &[Op]) -> usize {
        if self.slots.array.is_some() || self.shards[segment.shard].poisoned.load(Ordering::Relaxed) > 0 {
            return 1;
        }
        let place = |op: &Op| match *op {
            Op::WriteCache {
                slot,
                line_offset_bytes,
                length_bytes,
                buffer_offset_bytes,
                dirty,
                ..
            } => Some((
                self.cache_offset(segment.shard, slot, line_offset_bytes),
                buffer_offset_bytes,
                u64::from(length_bytes),
                dirty,
            )),
            _ => None,
        };
        contiguous_run_len(ops.iter().map(place))
    }

    /// [`Inner::prepare_cache_write`] of the first ops of a run under one
    /// lock of the shard, as long as each is the usual case (its slot is
    /// reusable now, and no checksum on the device covers what it
    /// writes): appended to `prepared`. Otherwise the caller runs the ops
    /// one by one (which waits for a barrier or writes intents as needed).
    pub(super) fn prepare_cache_writes_at_once<'b>(
        &self,
        segment: &PlannedSegment,
        ops: &[Op],
        buffer: &'b Buffer<'_>,
        prepared: &mut SmallVec<[PreparedWrite<'b>; 16]>,
    ) {
        let noted = self.note_in_shadow(segment.shard, |state| {
            for op in ops {
                let mut w = self.cache_write_of(segment, op, buffer);
                let epoch = self.record_epoch_of(state, &w);
                if state.shadow.blocks_write(w.slot, w.key, epoch)
                    || !state.shadow.begin_cache_write(w.slot, w.first, w.end)
                {
                    return;
                }
                w.tearable = state.shadow.tearable(w.slot);
                prepared.push(w);
            }
        });
        if noted.is_none() {
            // No persistent metadata: nothing is trusted after a crash.
            prepared.extend(ops.iter().map(|op| PreparedWrite {
                tearable: true,
                ..self.cache_write_of(segment, op, buffer)
            }));
        }
    }

    /// Before a `WriteCache` op's data is written: the slot may be reused,
    /// and (dirty checksums) the write is counted in flight.
    pub(super) fn prepare_cache_write<'b>(
        &self,
        segment: &PlannedSegment,
        op: &Op,
        buffer: &'b Buffer<'_>,
    ) -> Result<PreparedWrite<'b>, EngineError> {
        let mut w = self.cache_write_of(segment, op, buffer);
        let owner = Self::owner_of(segment);
        // The usual case under one lock: the slot may be reused and the
        // write begins at once (or its intent was written ahead).
        let begun = self.note_in_shadow(segment.shard, |state| {
            let epoch = self.record_epoch_of(state, &w);
            let now = !state.shadow.blocks_write(w.slot, w.key, epoch)
                && state.shadow.begin_now(owner, w.slot, w.first, w.end);
            (now, now && state.shadow.tearable(w.slot), epoch)
        });
        match begun {
            // No persistent metadata: nothing is trusted after a crash.
            None => w.tearable = true,
            Some((true, tearable, _)) => w.tearable = tearable,
            // The slow way (a barrier, an intent): written with `write_at`.
            Some((false, _, epoch)) => {
                self.wait_until_reusable(segment.shard, w.slot, w.key, epoch)?;
                self.begin_cache_write(owner, segment.shard, w.slot, w.first, w.end, w.data)?;
            }
        }
        Ok(w)
    }

    /// Under ordered write-back, the epoch a dirty write's record will give
    /// its line (the core's, low 32 bits); `None` otherwise.
    fn record_epoch_of(&self, state: &ShardState, w: &PreparedWrite<'_>) -> Option<u32> {
        if !(self.ordered() && w.dirty) {
            return None;
        }
        state.cache.slot_snapshot(w.slot).map(|s| s.epoch as u32)
    }

    /// What a `WriteCache` op writes, and where.
    pub(super) fn cache_write_of<'b>(
        &self,
        segment: &PlannedSegment,
        op: &Op,
        buffer: &'b Buffer<'_>,
    ) -> PreparedWrite<'b> {
        let Op::WriteCache {
            slot,
            line_offset_bytes,
            length_bytes,
            buffer_offset_bytes,
            dirty,
            fresh,
        } = *op
        else {
            unreachable!("only WriteCache ops are written to the cache");
        };
        let at = segment.buffer_offset + buffer_offset_bytes as usize;
        let data = Self::buffer_slice(buffer, at, at + length_bytes as usize);
        let key = self.op_key(segment, buffer_offset_bytes, line_offset_bytes);
        let first = line_offset_bytes / SECTOR_BYTES as u32;
        let end = first + length_bytes / SECTOR_BYTES as u32;
        PreparedWrite {
            slot,
            key,
            data,
            buffer_at: at,
            device_offset: self.cache_offset(segment.shard, slot, line_offset_bytes),
            line_offset_bytes,
            first,
            end,
            dirty,
            fresh,
            tearable: false,
        }
    }

    /// After a `WriteCache` op's data write returned `written`: notes it in
    /// the shadow, and on failure forgets or poisons what the write was to
    /// leave there.
    pub(super) fn finish_cache_write(
        &self,
        segment: &PlannedSegment,
        w: &PreparedWrite<'_>,
        generation: u64,
        written: Result<(), DeviceError>,
        mirror: Option<u32>,
    ) -> Result<(), EngineError> {
        let PreparedWrite {
            slot,
            key,
            first,
            end,
            dirty,
            fresh,
            ..
        } = *w;
        if written.is_ok() {
            self.note_cache_writes(segment.shard, std::slice::from_ref(w), mirror);
        }
        match written {
            Err(e) => {
                self.note_in_shadow(segment.shard, |state| {
                    state.shadow.cache_write_failed(slot, first, end);
                    self.wake_a_draining_barrier(segment.shard, state);
                });
                self.cache_error("write", &e);
                // A clean copy (a fill, write-through's) is stale
                // or foreign now, and so are sectors the line did
                // not hold before: the core must forget them and
                // requests decided before this must not read them
                // from the cache. Dirty sectors the line held
                // keep their old data (a failed write leaves the
                // old or the new), the only copy there is.
                if fresh || !dirty {
                    lock(&self.shards[segment.shard].state)
                        .shadow
                        .note_forget(slot, first, end);
                    self.forget_or_poison(segment.shard, slot, key, generation, first, end, !dirty);
                }
                if dirty {
                    return Err(e.into());
                }
                // A clean copy (a fill, or write-through's) is
                // lost: the read or write itself succeeded.
            }
            Ok(()) => self.unpoison_written(segment.shard, std::slice::from_ref(w)),
        }
        Ok(())
    }

    /// Cache writes that succeeded (all to `shard`) make what they wrote
    /// readable again where an earlier failure poisoned it.
    pub(super) fn unpoison_written(&self, shard: usize, writes: &[PreparedWrite<'_>]) {
        if self.shards[shard].poisoned.load(Ordering::Relaxed) > 0 {
            for w in writes {
                self.unpoison(shard, w.slot, w.key, w.first, w.end);
            }
        }
    }

    /// Notes cache writes that succeeded (all to `shard`) in its shadow:
    /// their data hashes and sector checksums worked out first, outside
    /// the shard's lock (a line may be a megabyte), then one lock for all.
    /// `mirror`: where a cache array mirrored the dirty ones.
    pub(super) fn note_cache_writes(&self, shard: usize, writes: &[PreparedWrite<'_>], mirror: Option<u32>) {
        if !self.metadata.records_slots() {
            return;
        }
        // A 64 KiB write's terms (4 KiB lines) stay on the stack.
        let mut full_line_hashes: SmallVec<[Option<u64>; 16]> = SmallVec::with_capacity(writes.len());
        let mut sector_sums: SmallVec<[u64; 128]> = SmallVec::new();
        for w in writes {
            full_line_hashes.push(
                (self.metadata.records_clean_lines()
                    && !w.dirty
                    && w.line_offset_bytes == 0
                    && w.data.len() as u64 == self.line_bytes)
                    .then(|| iocache_format::data_hash(w.data)),
            );
            if w.dirty && self.metadata.dirty_checksums() {
                let at = sector_sums.len();
                sector_sums.resize(at + (w.end - w.first) as usize, 0);
                iocache_format::sector_checksums_into(w.first, w.data, &mut sector_sums[at..]);
            }
        }
        let mut state = lock(&self.shards[shard].state);
        let mut at = 0;
        for (w, &full_line_hash) in writes.iter().zip(&full_line_hashes) {
            let terms = if w.dirty && self.metadata.dirty_checksums() {
                (w.end - w.first) as usize
            } else {
                0
            };
            let sums = &sector_sums[at..at + terms];
            at += terms;
            state
                .shadow
                .note_cache_write(w.slot, w.key, w.first, w.end, w.dirty, full_line_hash, sums);
            if w.dirty && self.slots.array.is_some() {
                state.shadow.note_mirror(w.slot, mirror);
            }
            if w.dirty && self.ordered() {
                let epoch = self.record_epoch_of(&state, w);
                state.shadow.note_epoch(w.slot, epoch);
            }
        }
        self.wake_a_draining_barrier(shard, &state);
        drop(state);
        // After the shadow has them: a barrier that resets the mark takes
        // their records too.
        if writes.iter().any(|w| w.dirty) {
            self.metadata.changed(|| self.now_ns());
        }
    }

    /// After writes of `shard` landed: a barrier waiting for the shard's
    /// writes in flight is woken when none is left.
    pub(super) fn wake_a_draining_barrier(&self, shard: usize, state: &ShardState) {
        if state.shadow.draining() && state.shadow.in_flight() == 0 {
            self.shards[shard].landed.notify_all();
        }
    }
}

//! Loading the lines recovery found into the shards at start-up, and what
//! is done with those that cannot stay (written back from their slot or
//! their mirror).

use super::*;

impl Inner {
    /// Loads the lines found on the cache device into their shards.
    pub(super) fn restore(
        &self,
        lines: Vec<recovery::RecoveredLine>,
        stale_dirty: &[(u64, LineKey)],
        unloaded: &[u64],
    ) -> Result<(), EngineError> {
        for &(slot, key) in stale_dirty {
            let shard = self.shards.partition_point(|s| s.base_slot <= slot) - 1;
            let local = (slot - self.shards[shard].base_slot) as SlotId;
            lock(&self.shards[shard].state)
                .shadow
                .stale_dirty_record(local, key);
        }
        // Records of clean lines not loaded (another volume's, another
        // mode's, or no longer trusted) are blanked by the first barrier, so
        // that a volume attached later never finds them.
        for &slot in unloaded {
            let shard = self.shards.partition_point(|s| s.base_slot <= slot) - 1;
            let local = (slot - self.shards[shard].base_slot) as SlotId;
            lock(&self.shards[shard].state).shadow.note_empty(local);
        }
        if lines.is_empty() {
            return Ok(());
        }
        let now_ns = self.now_ns();
        let mut per_shard: Vec<Vec<recovery::RecoveredLine>> =
            (0..self.shards.len()).map(|_| Vec::new()).collect();
        let mut written_back = false;
        for line in lines {
            let shard = self.shards.partition_point(|s| s.base_slot <= line.slot) - 1;
            if let Some(array) = self.slots.array.as_ref().filter(|a| a.primary_failed(line.slot)) {
                // Its member is gone: write its dirty sectors back from the
                // mirror (or find them in the backend already).
                written_back |= self.recover_from_mirror(array, &line)?;
                self.leave_recovered_line(shard, &line);
                continue;
            }
            if self.shard_of(line.key) != shard {
                // Its slot lies in another shard's region than its key maps
                // to now (the shard layout changed): it cannot stay there.
                if line.dirty_on_disk {
                    let local = (line.slot - self.shards[shard].base_slot) as SlotId;
                    self.write_back_dirty_sectors(shard, local, line.key, &line.dirty)?;
                    written_back = true;
                }
                self.leave_recovered_line(shard, &line);
                continue;
            }
            if let Some(array) = &self.slots.array {
                let claimed = match line.mirror {
                    Some(m) => MirrorState::Mirrored(m),
                    None if line.dirty_on_disk => MirrorState::Through,
                    None => MirrorState::None,
                };
                array
                    .claim(line.slot, claimed)
                    .map_err(|e| EngineError::Format(format!("record of slot {}: {e}", line.slot)))?;
            }
            per_shard[shard].push(line);
        }
        if written_back {
            self.flush_backends()?;
        }
        // Ordered write-back: the recorded epochs (their low 32 bits) in
        // order, from 1; a dirty line recorded without one is older still.
        let ranks = iocache_format::epoch_ranks(per_shard.iter().flatten().filter_map(|l| l.epoch));
        if let Some(epochs) = &self.epochs {
            epochs.start_after(ranks.values().copied().max().unwrap_or(0));
        }
        for (shard, lines) in per_shard.into_iter().enumerate() {
            if lines.is_empty() {
                continue;
            }
            let base = self.shards[shard].base_slot;
            let mut state = lock(&self.shards[shard].state);
            let restored: Vec<RestoredLine<'_>> = lines
                .iter()
                .map(|l| RestoredLine {
                    slot: (l.slot - base) as SlotId,
                    key: l.key,
                    valid: &l.valid,
                    dirty: &l.dirty,
                    epoch: match self.ordered() {
                        true => l.epoch.map_or(0, |e| ranks[&e]),
                        false => 0,
                    },
                })
                .collect();
            state.cache.restore(&restored, now_ns)?;
            for l in &lines {
                state.shadow.restore(
                    (l.slot - base) as SlotId,
                    l.key,
                    &l.valid,
                    &l.dirty,
                    l.hash,
                    l.terms.as_deref(),
                    l.rewrite_record,
                    l.dirty_on_disk,
                    l.mirror,
                );
                if self.ordered() {
                    state.shadow.restore_epoch((l.slot - base) as SlotId, l.epoch);
                }
            }
        }
        Ok(())
    }

    /// A recovered line that is not loaded (its dirty sectors were written
    /// back): the shadow learns what its record says, then that the slot is
    /// empty, so the next barrier records it so.
    pub(super) fn leave_recovered_line(&self, shard: usize, line: &recovery::RecoveredLine) {
        let local = (line.slot - self.shards[shard].base_slot) as SlotId;
        let mut state = lock(&self.shards[shard].state);
        state.shadow.restore(
            local,
            line.key,
            &line.valid,
            &line.dirty,
            None,
            None,
            false,
            line.dirty_on_disk,
            line.mirror,
        );
        state.shadow.note_empty(local);
    }

    /// A recovered dirty line whose cache-array member failed: writes its
    /// dirty sectors to the backend from the mirror. Returns whether it
    /// wrote anything.
    pub(super) fn recover_from_mirror(
        &self,
        array: &CacheArray,
        line: &recovery::RecoveredLine,
    ) -> Result<bool, EngineError> {
        if !line.dirty_on_disk {
            return Ok(false);
        }
        let Some(m) = line.mirror else {
            // Written through when it was written: the backend has it.
            return Ok(false);
        };
        let backend = self.backend_of(line.key.volume)?;
        let base = line.key.line_index << self.line_shift;
        let mut result = Ok(());
        bitmap::for_each_run(
            &line.dirty,
            0,
            (self.line_bytes / SECTOR_BYTES) as u32,
            |a, b, dirty| {
                if !dirty || result.is_err() {
                    return;
                }
                let offset = u64::from(a) * SECTOR_BYTES;
                let mut data = vec![0u8; ((b - a) as u64 * SECTOR_BYTES) as usize];
                result = array
                    .read_mirror(m, offset, &mut data)
                    .and_then(|()| backend.write_at(&data, base + offset));
            },
        );
        match result {
            Ok(()) => {
                self.cleaner.evacuated_lines.fetch_add(1, Ordering::Relaxed);
                Ok(true)
            }
            Err(e) => {
                self.cleaner.lost_lines.fetch_add(1, Ordering::Relaxed);
                Err(EngineError::Io(format!(
                    "line {} of volume {}: its cache-array member failed and its mirror could not be written back: {e}",
                    line.key.line_index, line.key.volume
                )))
            }
        }
    }

    pub(super) fn write_back_dirty_sectors(
        &self,
        shard: usize,
        slot: SlotId,
        key: LineKey,
        dirty: &[u64],
    ) -> Result<(), EngineError> {
        recovery::write_back_dirty_runs(
            &*self.slots.dev,
            self.cache_offset(shard, slot, 0),
            &*self.backend_of(key.volume)?,
            key.line_index << self.line_shift,
            dirty,
            (self.line_bytes / SECTOR_BYTES) as u32,
        )
    }
}

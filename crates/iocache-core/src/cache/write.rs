//! The write path: a line part written as the write policy says (into
//! the cache, through to the backend, around it, or invalidating it).

use super::*;

impl Cache {
    pub(super) fn write_part<S: OpSink>(
        &mut self,
        part: &LinePart,
        info: &AccessInfo,
        ops: &mut S,
    ) -> LineOutcome {
        let found = self.lookup(part.key);
        if let Some(slot) = found {
            self.write_back_if_older(slot, ops);
        }
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
                    self.emit_backend_write(part, ops);
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
                self.emit_backend_write(part, ops);
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
                self.emit_backend_write(part, ops);
                self.stats.bypassed_accesses += 1;
            }
            WritePolicy::WriteAround | WritePolicy::PassThrough => {
                if let Some(slot) = found {
                    if !self.clear_sectors(slot, first, end) {
                        self.drop_line(slot, ops);
                    }
                }
                self.emit_backend_write(part, ops);
                self.stats.bypassed_accesses += 1;
            }
        }
        outcome
    }

    /// The client's data to the backend. Under ordered write-back it must
    /// follow every older epoch: with inline dirty eviction the core writes
    /// them back first, as part of the request; without, the runtime waits
    /// for its cleaner before running the op.
    #[inline]
    fn emit_backend_write<S: OpSink>(&mut self, part: &LinePart, ops: &mut S) {
        if self.config.inline_dirty_eviction && !self.epochs.is_empty() {
            self.drain_before(self.epoch, ops);
        }
        self.emit(ops, self.backend_write(part));
    }

    /// Ordered write-back: a line dirty from an epoch before the current one
    /// is written back (after every line of the epochs before it) before a
    /// write changes it, so that its epoch's data still reaches the backend.
    #[inline]
    fn write_back_if_older<S: OpSink>(&mut self, slot: SlotId, ops: &mut S) {
        let older = self.records[slot as usize].meta.dirty_listed
            && self.epochs.get(slot as usize).is_some_and(|&e| e < self.epoch);
        if older {
            self.drain_before(self.epochs[slot as usize], ops);
            self.write_back_in_turn(slot, ops);
        }
    }
}

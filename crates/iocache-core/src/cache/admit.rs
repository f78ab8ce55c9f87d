//! Admission and replacement: a free slot or a victim for a line the
//! promotion policy admits, the victim's dirty data written back or kept,
//! and the dirty list kept in step.

use super::*;

impl Cache {
    /// Runs promotion and, if the line is admitted, finds it a slot (evicting if needed).
    /// `info.dirty` says whether the line will be dirty once the access is done.
    pub(super) fn try_admit<S: OpSink>(
        &mut self,
        key: LineKey,
        info: &AccessInfo,
        ops: &mut S,
    ) -> Option<SlotId> {
        let mut policy = self.policy.take_out();
        let slot = self.try_admit_hashed(&mut policy, key, hash_of(&key), info, ops);
        self.policy.put_back(policy);
        slot
    }

    /// [`Cache::try_admit`] with the key's index hash already computed, for
    /// the policy `P` held.
    #[inline]
    pub(super) fn try_admit_hashed<P: ReplacementPolicy + ?Sized, S: OpSink>(
        &mut self,
        policy: &mut P,
        key: LineKey,
        hash: u32,
        info: &AccessInfo,
        ops: &mut S,
    ) -> Option<SlotId> {
        // Under ordered write-back a written line is always admitted (see
        // `access_into`).
        let ordered_write = info.dirty && !self.epochs.is_empty();
        let admit = self.filling_ahead
            || ordered_write
            || match policy.admit(key, info) {
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
            if victims.is_empty() && need_victim && ordered_write {
                victims.extend(self.any_clean_victim(policy));
            }
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
    pub(super) fn take_single_victim<P: ReplacementPolicy + ?Sized, S: OpSink>(
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
    pub(super) fn reuse_victim<S: OpSink>(&mut self, victim: SlotId, key: LineKey, hash: u32, ops: &mut S) {
        let at = victim as usize;
        debug_assert!(
            self.records[at].meta.resident,
            "policy named a free slot as victim"
        );
        self.seal_ops_before_reuse(victim, ops);
        self.note_unused(victim);
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
    pub(super) fn keep_dirty_victims<P: ReplacementPolicy + ?Sized>(
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

    /// Ordered write-back, when the policy's rounds named only dirty
    /// victims: any clean line not used by this request, searched from
    /// where the last search stopped, taken from the policy. A runtime
    /// checks that one exists first ([`Cache::ordered_write_waits`]).
    #[cold]
    fn any_clean_victim<P: ReplacementPolicy + ?Sized>(&mut self, policy: &mut P) -> Option<SlotId> {
        let slots = self.records.len();
        for k in 0..slots {
            let slot = (self.clean_cursor + k) % slots;
            let meta = &self.records[slot].meta;
            let this_request = meta.used_by_request == self.request_seq as u32;
            if meta.resident && !meta.dirty_listed && !this_request {
                self.clean_cursor = slot + 1;
                policy.on_remove(slot as SlotId);
                return Some(slot as SlotId);
            }
        }
        None
    }

    /// Misses often come in runs; load what the coming evictions will touch
    /// while this one finishes: the index entry of the sooner of the
    /// policy's two likely victims (its metadata was prefetched when it was
    /// the later one) and the metadata of the later one.
    #[inline]
    pub(super) fn prefetch_next_victims<P: ReplacementPolicy + ?Sized>(&self, policy: &P) {
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
    pub(super) fn mark_used<S: OpSink>(&mut self, slot: SlotId) {
        if S::KEEPS_OPS {
            self.records[slot as usize].meta.used_by_request = self.request_seq as u32;
        }
    }

    /// Empties `slot` (already forgotten by the policy), writing back its dirty sectors.
    #[inline(always)]
    pub(super) fn evict<S: OpSink>(&mut self, slot: SlotId, ops: &mut S) {
        debug_assert!(
            self.records[slot as usize].meta.resident,
            "policy named a free slot as victim"
        );
        self.stats.evictions += 1;
        self.empty_slot(slot, ops);
    }

    /// Writes back `slot`'s dirty sectors and forgets its line.
    #[inline(always)]
    pub(super) fn empty_slot<S: OpSink>(&mut self, slot: SlotId, ops: &mut S) {
        self.seal_ops_before_reuse(slot, ops);
        self.write_back_dirty(slot, ops);
        self.note_unused(slot);
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
    pub(super) fn seal_ops_before_reuse<S: OpSink>(&self, slot: SlotId, ops: &mut S) {
        if S::KEEPS_OPS && self.records[slot as usize].meta.used_by_request == self.request_seq as u32 {
            ops.seal();
        }
    }

    /// Drops a resident line entirely (write invalidation), writing back its dirty sectors.
    pub(super) fn drop_line<S: OpSink>(&mut self, slot: SlotId, ops: &mut S) {
        let key = self.records[slot as usize].line.key();
        self.policy.on_remove(slot);
        self.empty_slot(slot, ops);
        self.emit(ops, Op::Invalidate { slot, key });
        self.free.push(slot);
        self.stats.invalidations += 1;
    }

    #[inline(always)]
    pub(super) fn write_back_dirty<S: OpSink>(&mut self, slot: SlotId, ops: &mut S) {
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
    pub(super) fn write_back_dirty_sectors<S: OpSink>(&mut self, slot: SlotId, ops: &mut S) {
        if let Some(&epoch) = self.epochs.get(slot as usize) {
            self.drain_before(epoch, ops);
        }
        self.emit_write_backs(slot, ops);
        self.stats.dirty_writebacks += 1;
        bitmap::clear(self.dirty_mut(slot));
    }

    /// Emits one write-back op per run of dirty sectors in `slot`.
    pub(super) fn emit_write_backs<S: OpSink>(&mut self, slot: SlotId, ops: &mut S) {
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

    pub(super) fn mark_dirty(&mut self, slot: SlotId, now_ns: u64) {
        let meta = &mut self.records[slot as usize].meta;
        if !meta.dirty_listed {
            meta.dirty_listed = true;
            meta.dirty_since_ns = now_ns;
            if let Some(epoch) = self.epochs.get_mut(slot as usize) {
                *epoch = self.epoch;
            }
            let volume = self.records[slot as usize].line.volume;
            self.dirty_links.push_tail(&mut self.dirty_list, slot);
            self.count_lines(volume, 0, 1);
        }
    }

    /// Ordered write-back: writes back every dirty line of an epoch before
    /// `epoch` (the head of the dirty list), oldest first, so that a line
    /// of `epoch` may be written back or overwritten next.
    #[cold]
    pub(super) fn drain_before<S: OpSink>(&mut self, epoch: u64, ops: &mut S) {
        loop {
            let head = self.dirty_list.head;
            if head == crate::policy::list::NIL || self.epochs[head as usize] >= epoch {
                return;
            }
            self.write_back_in_turn(head, ops);
        }
    }

    /// Ordered write-back: writes `slot`'s dirty sectors back now, in its
    /// epoch's turn, and leaves the line clean and resident.
    pub(super) fn write_back_in_turn<S: OpSink>(&mut self, slot: SlotId, ops: &mut S) {
        self.emit_write_backs(slot, ops);
        bitmap::clear(self.dirty_mut(slot));
        self.records[slot as usize].meta.generation += 1;
        self.unmark_dirty_if_clean(slot);
        self.policy.on_clean(slot);
        self.stats.ordered_drains += 1;
    }

    /// Adds to the per-volume line counts, when they are kept.
    #[inline]
    pub(super) fn count_lines(&mut self, volume: VolumeId, resident: i64, dirty: i64) {
        if let Some(counts) = &mut self.volume_lines {
            let entry = counts.entry(volume).or_default();
            entry.resident = entry.resident.wrapping_add_signed(resident);
            entry.dirty = entry.dirty.wrapping_add_signed(dirty);
        }
    }

    /// Forgets sectors `[first, end)` of `slot` (valid and dirty), a new
    /// generation of its data; a line still holding valid sectors that
    /// became clean leaves the dirty list (the policy told). Says whether
    /// the line still holds any valid sector: if not, the caller removes it.
    #[inline]
    pub(super) fn clear_sectors(&mut self, slot: SlotId, first: u32, end: u32) -> bool {
        bitmap::clear_range(self.valid_mut(slot), first, end);
        bitmap::clear_range(self.dirty_mut(slot), first, end);
        self.records[slot as usize].meta.generation += 1;
        if !bitmap::any(self.valid_of(slot)) {
            return false;
        }
        if self.unmark_dirty_if_clean(slot) {
            self.policy.on_clean(slot);
        }
        true
    }

    /// Takes `slot` off the dirty list if it has no dirty sector left; says whether it did.
    #[inline]
    pub(super) fn unmark_dirty_if_clean(&mut self, slot: SlotId) -> bool {
        if self.records[slot as usize].meta.dirty_listed && !bitmap::any(self.dirty_of(slot)) {
            self.records[slot as usize].meta.dirty_listed = false;
            self.dirty_links.unlink(&mut self.dirty_list, slot);
            self.count_lines(self.records[slot as usize].line.volume, 0, -1);
            true
        } else {
            false
        }
    }
}

//! What a driver asks of the core besides requests: restoring the lines a
//! restart found, forgetting sectors a failed write left, per-slot words
//! and generations, per-volume counts, and the invariant check.

use super::*;

impl Cache {
    /// Forgets sectors `[first_sector, end_sector)` of `key` without writing
    /// anything back, for a runtime whose cache-device write for them failed:
    /// the cache must not serve data it could not store. The line is dropped
    /// once it has no valid sector left. Returns whether anything was forgotten.
    pub fn forget_sectors(&mut self, key: LineKey, first_sector: u32, end_sector: u32) -> bool {
        let Some(slot) = self.lookup(key) else {
            return false;
        };
        let end = end_sector.min(self.line.sectors());
        if !self.clear_sectors(slot, first_sector, end) {
            self.policy.on_remove(slot);
            self.unmark_dirty_if_clean(slot);
            self.note_unused(slot);
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
            epoch: self.epochs.get(slot as usize).copied().unwrap_or(0),
        })
    }

    /// Words per valid or dirty bitmap of a line.
    pub fn bitmap_words(&self) -> usize {
        self.words
    }

    /// Loads lines found on a persistent cache device into an empty cache,
    /// each in the slot it was found in. Dirty lines join the dirty list as
    /// dirty since `now_ns` (under ordered write-back, in their epochs'
    /// order, and the cache's epoch moves past the newest); the replacement
    /// policy sees each as inserted, in the order given. Checked: the cache must be empty, and each line's
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
        let mut dirty_lines = Vec::new();
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
                dirty_lines.push((line.epoch, slot));
            }
        }
        // Ordered write-back keeps the dirty list in ascending epoch.
        dirty_lines.sort_by_key(|&(epoch, _)| epoch);
        let epoch_now = self.epoch;
        let mut newest = None;
        for (epoch, slot) in dirty_lines {
            self.epoch = epoch;
            self.mark_dirty(slot, now_ns);
            newest = Some(epoch);
        }
        self.epoch = match newest.filter(|_| !self.epochs.is_empty()) {
            Some(newest) => epoch_now.max(newest + 1),
            None => epoch_now,
        };
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

    /// Keeps resident and dirty line counts per volume from now on, so that
    /// [`Cache::volume_lines`] answers without scanning the slots. Costs a
    /// hash-map update whenever a line enters or leaves the cache or its
    /// dirty list (the engine turns it on; the simulator does not).
    pub fn count_volume_lines(&mut self) {
        self.volume_lines = Some(self.scan_volume_lines());
    }

    /// Resident and dirty lines per volume, counted over every slot.
    fn scan_volume_lines(&self) -> FxHashMap<VolumeId, VolumeLines> {
        let mut counts: FxHashMap<VolumeId, VolumeLines> = FxHashMap::default();
        for (s, meta) in self.records.iter().map(|r| &r.meta).enumerate() {
            if meta.resident {
                let entry = counts.entry(self.records[s].line.volume).or_default();
                entry.resident += 1;
                entry.dirty += u64::from(bitmap::any(self.dirty_of(s as SlotId)));
            }
        }
        counts
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

    /// Drops every resident line of `volume` with a line index in
    /// `first_line..end_line`, dirty ones included: their dirty data is
    /// discarded, never written back (the client trimmed the range, or the
    /// driver is about to zero it on the backend). Emits one
    /// [`Op::Invalidate`] per line into `ops` (cleared first). Partial lines
    /// at the ends of a byte range are the driver's to leave out. Looks up
    /// each line of a range smaller than the cache, and walks the slots of a
    /// larger one: O(min(range, capacity)).
    pub fn discard_lines(
        &mut self,
        volume: VolumeId,
        first_line: u64,
        end_line: u64,
        ops: &mut OpList,
    ) -> DiscardedLines {
        ops.clear();
        let mut found: Vec<SlotId> = Vec::new();
        let span = end_line.saturating_sub(first_line);
        if span <= self.records.len() as u64 {
            for line_index in first_line..end_line {
                if let Some(slot) = self.lookup(LineKey { volume, line_index }) {
                    found.push(slot);
                }
            }
        } else {
            for (s, record) in self.records.iter().enumerate() {
                let line = record.line.key();
                if record.meta.resident
                    && line.volume == volume
                    && (first_line..end_line).contains(&line.line_index)
                {
                    found.push(s as SlotId);
                }
            }
        }
        let mut discarded = DiscardedLines::default();
        for slot in found {
            if bitmap::any(self.dirty_of(slot)) {
                bitmap::clear(self.dirty_mut(slot));
                if self.unmark_dirty_if_clean(slot) {
                    self.policy.on_clean(slot);
                }
                discarded.dirty += 1;
            }
            self.drop_line(slot, ops);
            discarded.lines += 1;
        }
        ops.seal();
        discarded
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
            let expected = self.scan_volume_lines();
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

//! The read path: a line part classified (full hit, partial hit, miss),
//! served from the cache or the backend, and a missed line admitted; and
//! the counting path the simulator takes for whole reads.

use super::*;

impl Cache {
    /// Counts the access and classifies it by the valid sectors it finds.
    #[inline(always)]
    pub(super) fn classify(&mut self, part: &LinePart, slot: Option<SlotId>, kind: IoKind) -> LineOutcome {
        let sectors = part.sectors();
        let valid = match slot {
            Some(slot) => {
                self.note_use(slot);
                bitmap::count_range(self.valid_of(slot), part.first_sector, part.end_sector)
            }
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

    pub(super) fn read_part<S: OpSink>(
        &mut self,
        part: &LinePart,
        info: &AccessInfo,
        ops: &mut S,
    ) -> LineOutcome {
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
                    } else if self.request_line_fill && policy.allocates_on_read() {
                        self.fill_line_around(part, slot, ops);
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
                // A line fill reads the whole line into a slot found for it.
                let (filled, first, end) = match slot {
                    Some(_) if self.request_line_fill => (self.whole_line(part), 0, self.line.sectors()),
                    _ => (*part, part.first_sector, part.end_sector),
                };
                self.emit(ops, self.backend_read(&filled, first, end));
                match slot {
                    Some(slot) => {
                        self.mark_used::<S>(slot);
                        self.emit(ops, self.cache_write(&filled, slot, first, end, false));
                        bitmap::set_range(self.valid_mut(slot), first, end);
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
    pub(super) fn read_lines_counted(
        &mut self,
        request: &Request,
        info: &AccessInfo,
        summary: &mut AccessSummary,
    ) {
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
    pub(super) fn read_lines_counted_for<P: ReplacementPolicy + ?Sized, const WHOLE_LINES: bool>(
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
                    self.note_use(slot);
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
    pub(super) fn admit_counted<P: ReplacementPolicy + ?Sized>(
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
    pub(super) fn read_part_partial(
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

    /// `part`'s whole line (its buffer offset moved back to the line's
    /// start: meaningful when offsets count from the first line's start).
    fn whole_line(&self, part: &LinePart) -> LinePart {
        LinePart {
            key: part.key,
            first_sector: 0,
            end_sector: self.line.sectors(),
            buffer_offset_bytes: part.buffer_offset_bytes - u64::from(part.first_sector) * SECTOR_BYTES,
        }
    }

    /// A line fill of a resident line missing some requested sectors: the
    /// requested sectors that are cached are read from the cache, and
    /// every sector of the line that is not cached is read from the
    /// backend and filled (dirty sectors are never read over).
    fn fill_line_around<S: OpSink>(&mut self, part: &LinePart, slot: SlotId, ops: &mut S) {
        let line = self.whole_line(part);
        let mut runs = std::mem::take(&mut self.runs);
        runs.clear();
        bitmap::for_each_run(self.valid_of(slot), 0, self.line.sectors(), |s, e, v| {
            runs.push((s, e, v))
        });
        for &(start, end, cached) in &runs {
            if cached {
                let (a, b) = (start.max(part.first_sector), end.min(part.end_sector));
                if a < b {
                    self.emit(ops, self.cache_read(part, slot, a, b));
                }
            } else {
                self.emit(ops, self.backend_read(&line, start, end));
                self.emit(ops, self.cache_write(&line, slot, start, end, false));
            }
        }
        self.runs = runs;
        let sectors = self.line.sectors();
        bitmap::set_range(self.valid_mut(slot), 0, sectors);
    }

    /// Reads a resident line's part: sectors set in `from_cache` come from the cache,
    /// the rest from the backend (and, with `fill`, are then written into the cache).
    pub(super) fn transfer_runs<S: OpSink>(
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
}

//! Background flushing: the batches the cleaning policy asks for, handed
//! to the driver as tokens and completed when its write-backs are done.

use super::*;

impl Cache {
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
                let dirty = self.by_address(self.dirty_links.iter(&self.dirty_list), |_| true);
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
            FlushOrder::Epochs { through } => {
                // The dirty list is in ascending epoch: its head up to `through`.
                let head = (self.dirty_links.iter(&self.dirty_list))
                    .take_while(|&s| self.epochs.get(s as usize).is_none_or(|&e| e <= through));
                first_slots(self.by_address(head, |_| true), max_lines)
            }
            FlushOrder::Retiring => {
                // Entries whose line changed since are stale: not flushed.
                let chosen = (self.retiring.iter())
                    .filter(|&(&s, &generation)| {
                        let meta = &self.records[s as usize].meta;
                        meta.generation == generation && meta.dirty_listed
                    })
                    .map(|(&s, _)| s);
                first_slots(self.by_address(chosen, |_| true), max_lines)
            }
            FlushOrder::Volume(volume) => {
                let dirty = self.dirty_links.iter(&self.dirty_list);
                let of_volume = |line: &SlotLine| line.volume == volume;
                first_slots(self.by_address(dirty, of_volume), max_lines)
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

    /// `slots` whose line `keep` accepts and that are not being flushed,
    /// with their keys, in (volume, address) order.
    fn by_address(
        &self,
        slots: impl Iterator<Item = SlotId>,
        keep: impl Fn(&SlotLine) -> bool,
    ) -> Vec<(LineKey, SlotId)> {
        let mut picked: Vec<(LineKey, SlotId)> = slots
            .filter(|&s| {
                let record = &self.records[s as usize];
                !record.meta.flushing && keep(&record.line)
            })
            .map(|s| (self.records[s as usize].line.key(), s))
            .collect();
        picked.sort_unstable();
        picked
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
    pub(super) fn full_of_dirty_lines(&self) -> bool {
        self.free.is_empty() && self.dirty_lines() == self.resident_lines()
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

    /// Tells the cleaning policy that a runtime cleaned at `now_ns` by
    /// other means than [`Cache::run_cleaner`] (ordered write-back's
    /// batches over every cache), for its interval.
    pub fn note_cleaner_ran(&mut self, now_ns: u64) {
        self.cleaner_last_ns = Some(now_ns);
    }

    /// Starts flush epoch `epoch` for the writes that follow (ordered
    /// write-back; a runtime calls it at each client FLUSH, and with the same
    /// epoch on every cache it runs). Epochs only grow: an older one is
    /// ignored.
    pub fn set_epoch(&mut self, epoch: u64) {
        self.epoch = self.epoch.max(epoch);
    }

    /// The flush epoch writes join now.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Under ordered write-back, the epoch of the oldest dirty line (`None`
    /// when no line is dirty, or without ordered write-back).
    pub fn oldest_dirty_epoch(&self) -> Option<u64> {
        let head = self.dirty_list.head;
        (head != crate::policy::list::NIL)
            .then(|| self.epochs.get(head as usize).copied())
            .flatten()
    }

    /// Under ordered write-back, why writing `request` now would break the
    /// order unless older lines were written back as part of it, if it
    /// would. A runtime with several caches (the engine's shards) waits
    /// until the answer is `None` and then decides the write under the
    /// same lock: it then goes into the cache and nothing reaches the
    /// backend.
    pub fn ordered_write_waits(&self, request: &Request) -> Option<OrderedWait> {
        if self.epochs.is_empty() || request.kind != IoKind::Write {
            return None;
        }
        let (mut older, mut misses, mut clean_hits, mut dirty_hits) = (None::<u64>, 0u64, 0u64, 0u64);
        for part in split_request(request, self.line) {
            match self.lookup(part.key) {
                Some(slot) if self.records[slot as usize].meta.dirty_listed => {
                    let epoch = self.epochs[slot as usize];
                    if epoch < self.epoch {
                        older = Some(older.map_or(epoch, |o| o.min(epoch)));
                    }
                    dirty_hits += 1;
                }
                Some(_) => clean_hits += 1,
                None => misses += 1,
            }
        }
        if let Some(epoch) = older {
            return Some(OrderedWait::Epoch(epoch));
        }
        if !self.effective_mode().policy.keeps_dirty() {
            // Pass-through after cache-device errors, or a controller's
            // write-through: the write goes to the backend.
            return Some(OrderedWait::ToBackend);
        }
        let clean = self.resident_lines() - self.dirty_lines() - clean_hits;
        let new_dirty = misses + clean_hits;
        // Room cleaning can make: every slot but the request's own lines.
        let usable = self.lines_in_service() - clean_hits - dirty_hits;
        let cap = self.config.max_dirty_lines;
        if misses > usable || cap.is_some_and(|cap| new_dirty > cap) {
            // Some of it goes to the backend whatever is cleaned.
            return Some(OrderedWait::ToBackend);
        }
        if misses > self.free.len() as u64 + clean
            || cap.is_some_and(|cap| self.dirty_lines() + new_dirty > cap)
        {
            return Some(OrderedWait::Room);
        }
        None
    }

    /// When the oldest dirty line became dirty (for lazy or age-based cleaning).
    pub fn oldest_dirty_since_ns(&self) -> Option<u64> {
        let head = self.dirty_list.head;
        (head != crate::policy::list::NIL).then(|| self.records[head as usize].meta.dirty_since_ns)
    }
}

/// The slots of the first `max_lines` entries of `picked`.
fn first_slots(picked: Vec<(LineKey, SlotId)>, max_lines: usize) -> Vec<SlotId> {
    picked.into_iter().take(max_lines).map(|(_, s)| s).collect()
}

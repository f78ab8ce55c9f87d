//! Readahead fills: the lines a driver's [`crate::readahead::Readaheader`]
//! chose, inserted without a client asking, and the count of which of them
//! were used before they left.

use super::*;
use crate::readahead::{Readahead, ReadaheadFeedback};

impl Cache {
    /// Inserts the lines of `request` that are not in the cache, reading
    /// them from the backend (see [`AccessHints::prefetch`]).
    pub(super) fn fill_ahead<S: OpSink>(&mut self, request: &Request, ops: &mut S) -> AccessSummary {
        let mut summary = AccessSummary::default();
        self.stats.prefetch_requests += 1;
        let policy = self.fill_policy(request);
        if !policy.allocates_on_read() || policy == WritePolicy::PassThrough {
            ops.seal();
            return summary;
        }
        self.request_seq += 1;
        let info = AccessInfo {
            now_ns: request.now_ns,
            kind: IoKind::Read,
            request_seq: self.request_seq,
            request_lines: request_lines(request, self.line).min(u32::MAX as u64) as u32,
            dirty: false,
        };
        self.filling_ahead = true;
        self.request_line_fill = false;
        for part in split_request(request, self.line) {
            if self.lookup(part.key).is_some() {
                continue;
            }
            let Some(slot) = self.try_admit(part.key, &info, ops) else {
                continue;
            };
            self.mark_used::<S>(slot);
            self.emit(ops, self.backend_read(&part, part.first_sector, part.end_sector));
            self.emit(
                ops,
                self.cache_write(&part, slot, part.first_sector, part.end_sector, false),
            );
            bitmap::set_range(self.valid_mut(slot), part.first_sector, part.end_sector);
            self.records[slot as usize].meta.prefetched = true;
            self.stats.prefetched_lines += 1;
            summary.count(LineOutcome::Miss);
        }
        self.filling_ahead = false;
        ops.seal();
        summary
    }

    /// A client used `slot`: if a readahead fill brought it in, it counts
    /// as used (once).
    #[inline(always)]
    pub(super) fn note_use(&mut self, slot: SlotId) {
        if self.take_prefetched(slot) {
            self.stats.prefetch_used_lines += 1;
        }
    }

    /// `slot` is leaving the cache: if a readahead fill brought it in and
    /// nobody used it, it counts as unused.
    #[inline(always)]
    pub(super) fn note_unused(&mut self, slot: SlotId) {
        if self.take_prefetched(slot) {
            self.stats.prefetch_unused_lines += 1;
        }
    }

    /// Clears `slot`'s readahead mark, so that a fetched line counts once,
    /// used or unused; whether it was set.
    #[inline(always)]
    fn take_prefetched(&mut self, slot: SlotId) -> bool {
        let meta = &mut self.records[slot as usize].meta;
        let prefetched = meta.prefetched;
        if prefetched {
            meta.prefetched = false;
        }
        prefetched
    }

    /// The running count of fetched lines used and unused, for the
    /// driver's readahead.
    pub fn readahead_feedback(&self) -> ReadaheadFeedback {
        ReadaheadFeedback {
            used_lines: self.stats.prefetch_used_lines,
            unused_lines: self.stats.prefetch_unused_lines,
        }
    }

    /// Changes the readahead setting (kept for the driver, which owns the
    /// decisions: [`CacheConfig::readahead`]).
    pub fn set_readahead(&mut self, readahead: Readahead) {
        self.config.readahead = readahead;
    }
}

//! Counters a cache keeps about its own decisions; every byte count is derived
//! from the ops it emitted, so the simulator's numbers are the engine's numbers.

/// Buckets of [`CacheStats::eviction_batch_sizes`]: 1, 2, 3-4, ... up to 2^15 and more.
pub const EVICTION_BATCH_BUCKETS: usize = 17;

/// Cumulative counters. Subtract two snapshots ([`CacheStats::since`]) for an interval.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    pub requests: u64,
    pub read_requests: u64,
    pub write_requests: u64,
    /// Line accesses (one per line a request touches).
    pub accesses: u64,
    pub read_accesses: u64,
    pub write_accesses: u64,
    /// Line accesses whose requested sectors were all valid in the cache.
    pub full_hits: u64,
    /// Line accesses that found some but not all requested sectors.
    pub partial_hits: u64,
    /// Line accesses that found none of the requested sectors.
    pub misses: u64,
    pub read_hits: u64,
    pub write_hits: u64,
    /// Bytes the requests asked for.
    pub requested_bytes: u64,
    /// Of those, bytes whose sectors were valid in the cache when asked for.
    pub hit_bytes: u64,
    /// Lines inserted.
    pub promotions: u64,
    /// Lines replaced to make room.
    pub evictions: u64,
    /// Times the policy chose victims (one line each for LRU; block-level
    /// policies evict several lines at once).
    pub eviction_batches: u64,
    /// Eviction batches by size: entry `i` counts batches of `2^(i-1) < n <= 2^i`
    /// lines (entry 0: one line; the last entry: everything larger).
    pub eviction_batch_sizes: [u64; EVICTION_BATCH_BUCKETS],
    /// Lines dropped by write invalidation.
    pub invalidations: u64,
    /// Evicted or invalidated lines that had dirty data to write back.
    pub dirty_writebacks: u64,
    /// Lines cleaned by a completed flush.
    pub flushed_lines: u64,
    /// Dirty lines written back early to keep ordered write-back's order:
    /// lines of older epochs, written before a line of a later one was
    /// overwritten or evicted ([`CacheConfig::ordered_write_back`](crate::CacheConfig::ordered_write_back)).
    pub ordered_drains: u64,
    /// Line accesses the cache did not absorb: misses that were not inserted
    /// (promotion refused, or the write policy does not allocate), and every
    /// write under wi, wa and pt, which goes to the backend.
    pub bypassed_accesses: u64,
    /// Write misses sent to the backend because every line was dirty (write-miss bypass).
    pub write_miss_bypasses: u64,
    /// Dirty lines a miss chose as victims but kept, because dirty lines are
    /// not evicted inline (`inline_dirty_eviction = false`).
    pub dirty_victims_kept: u64,
    /// Writes handled as write-through because the dirty-line cap
    /// ([`CacheConfig::max_dirty_lines`](crate::CacheConfig::max_dirty_lines)) was reached.
    pub dirty_cap_write_throughs: u64,
    /// Requests that bypassed the cache as part of a long sequential stream.
    pub seq_cutoff_requests: u64,
    /// Requests a load balancer sent to the backend (`balance/`).
    pub balance_bypasses: u64,
    /// Requests a load balancer asked to send to the backend that stayed,
    /// because some of their sectors were dirty in the cache.
    pub balance_bypasses_refused_dirty: u64,
    /// Times the background cleaner ran (and found lines to flush).
    pub cleaner_runs: u64,
    /// Readahead fills run ([`crate::AccessHints::prefetch`]).
    pub prefetch_requests: u64,
    /// Lines a readahead fill inserted.
    pub prefetched_lines: u64,
    /// Of those, lines read or written before they left the cache.
    pub prefetch_used_lines: u64,
    /// Of those, lines evicted or dropped before any use.
    pub prefetch_unused_lines: u64,
    pub backend_read_bytes: u64,
    pub backend_write_bytes: u64,
    pub cache_read_bytes: u64,
    pub cache_write_bytes: u64,
}

/// Applies `$op` (`+=` or `-=`) to every scalar counter of `$a` with `$b`'s.
macro_rules! for_each_counter {
    ($a:expr, $b:expr, $op:tt) => {
        $a.requests $op $b.requests;
        $a.read_requests $op $b.read_requests;
        $a.write_requests $op $b.write_requests;
        $a.accesses $op $b.accesses;
        $a.read_accesses $op $b.read_accesses;
        $a.write_accesses $op $b.write_accesses;
        $a.full_hits $op $b.full_hits;
        $a.partial_hits $op $b.partial_hits;
        $a.misses $op $b.misses;
        $a.read_hits $op $b.read_hits;
        $a.write_hits $op $b.write_hits;
        $a.requested_bytes $op $b.requested_bytes;
        $a.hit_bytes $op $b.hit_bytes;
        $a.promotions $op $b.promotions;
        $a.evictions $op $b.evictions;
        $a.eviction_batches $op $b.eviction_batches;
        $a.invalidations $op $b.invalidations;
        $a.dirty_writebacks $op $b.dirty_writebacks;
        $a.flushed_lines $op $b.flushed_lines;
        $a.ordered_drains $op $b.ordered_drains;
        $a.bypassed_accesses $op $b.bypassed_accesses;
        $a.write_miss_bypasses $op $b.write_miss_bypasses;
        $a.dirty_victims_kept $op $b.dirty_victims_kept;
        $a.dirty_cap_write_throughs $op $b.dirty_cap_write_throughs;
        $a.seq_cutoff_requests $op $b.seq_cutoff_requests;
        $a.balance_bypasses $op $b.balance_bypasses;
        $a.balance_bypasses_refused_dirty $op $b.balance_bypasses_refused_dirty;
        $a.cleaner_runs $op $b.cleaner_runs;
        $a.backend_read_bytes $op $b.backend_read_bytes;
        $a.backend_write_bytes $op $b.backend_write_bytes;
        $a.cache_read_bytes $op $b.cache_read_bytes;
        $a.cache_write_bytes $op $b.cache_write_bytes;
        $a.prefetch_requests $op $b.prefetch_requests;
        $a.prefetched_lines $op $b.prefetched_lines;
        $a.prefetch_used_lines $op $b.prefetch_used_lines;
        $a.prefetch_unused_lines $op $b.prefetch_unused_lines;
    };
}

impl CacheStats {
    pub fn hit_ratio(&self) -> f64 {
        ratio(self.full_hits, self.accesses)
    }

    pub fn byte_hit_ratio(&self) -> f64 {
        ratio(self.hit_bytes, self.requested_bytes)
    }

    pub(crate) fn record_eviction_batch(&mut self, lines: u64) {
        self.eviction_batches += 1;
        let bucket = (64 - lines.saturating_sub(1).leading_zeros() as usize).min(EVICTION_BATCH_BUCKETS - 1);
        self.eviction_batch_sizes[bucket] += 1;
    }

    /// Mean lines per eviction batch.
    pub fn lines_per_eviction_batch(&self) -> f64 {
        ratio(self.evictions, self.eviction_batches)
    }

    /// Counters accumulated after `earlier` was taken.
    pub fn since(&self, earlier: &CacheStats) -> CacheStats {
        let mut out = *self;
        for (now, then) in out
            .eviction_batch_sizes
            .iter_mut()
            .zip(earlier.eviction_batch_sizes)
        {
            *now -= then;
        }
        for_each_counter!(out, earlier, -=);
        out
    }

    /// Adds `other`'s counters to these (totals over several caches).
    pub fn merge(&mut self, other: &CacheStats) {
        for (mine, theirs) in self
            .eviction_batch_sizes
            .iter_mut()
            .zip(other.eviction_batch_sizes)
        {
            *mine += theirs;
        }
        for_each_counter!(self, other, +=);
    }
}

/// `part / whole`, 0 when `whole` is 0 (a ratio of counters before any
/// access).
pub fn ratio(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

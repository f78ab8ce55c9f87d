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
    /// Line accesses the cache did not absorb: misses that were not inserted
    /// (promotion refused, or the write policy does not allocate), and every
    /// write under wi, wa and pt, which goes to the backend.
    pub bypassed_accesses: u64,
    /// Write misses sent to the backend because every line was dirty (write-miss bypass).
    pub write_miss_bypasses: u64,
    /// Requests that bypassed the cache as part of a long sequential stream.
    pub seq_cutoff_requests: u64,
    /// Times the background cleaner ran (and found lines to flush).
    pub cleaner_runs: u64,
    pub backend_read_bytes: u64,
    pub backend_write_bytes: u64,
    pub cache_read_bytes: u64,
    pub cache_write_bytes: u64,
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
        let mut eviction_batch_sizes = self.eviction_batch_sizes;
        for (now, then) in eviction_batch_sizes.iter_mut().zip(earlier.eviction_batch_sizes) {
            *now -= then;
        }
        macro_rules! diff {
            ($($field:ident),*) => {
                CacheStats { eviction_batch_sizes, $($field: self.$field - earlier.$field),* }
            };
        }
        diff!(
            requests,
            read_requests,
            write_requests,
            accesses,
            read_accesses,
            write_accesses,
            full_hits,
            partial_hits,
            misses,
            read_hits,
            write_hits,
            requested_bytes,
            hit_bytes,
            promotions,
            evictions,
            eviction_batches,
            invalidations,
            dirty_writebacks,
            flushed_lines,
            bypassed_accesses,
            write_miss_bypasses,
            seq_cutoff_requests,
            cleaner_runs,
            backend_read_bytes,
            backend_write_bytes,
            cache_read_bytes,
            cache_write_bytes
        )
    }
}

fn ratio(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

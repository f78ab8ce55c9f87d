//! Latency histograms that many threads record into without locking: log-
//! linear buckets (16 per power of two, so a percentile is within 1/16 of
//! the true value) of relaxed atomic counters, one set per stripe of
//! threads (see `stripe.rs`) so that threads do not share cache lines.
//! Memory is fixed.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::stripe::{stripe, STRIPES};

const SUB_BUCKETS: usize = 16;
const POWERS: usize = 64;

pub struct LatencyHistogram {
    counts: Vec<AtomicU64>,
}

/// Percentiles of one histogram, in nanoseconds (bucket upper bounds).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LatencyPercentiles {
    pub count: u64,
    pub p50_ns: u64,
    pub p99_ns: u64,
    pub p999_ns: u64,
    pub p9999_ns: u64,
    pub max_ns: u64,
}

const BUCKETS: usize = POWERS * SUB_BUCKETS;

impl Default for LatencyHistogram {
    fn default() -> Self {
        LatencyHistogram {
            counts: (0..BUCKETS * STRIPES).map(|_| AtomicU64::new(0)).collect(),
        }
    }
}

fn bucket_of(ns: u64) -> usize {
    if ns < SUB_BUCKETS as u64 {
        return ns as usize;
    }
    let power = 63 - ns.leading_zeros() as usize; // ns >= 16, so power >= 4
    let sub = ((ns >> (power - 4)) & (SUB_BUCKETS as u64 - 1)) as usize;
    ((power - 3) * SUB_BUCKETS + sub).min(POWERS * SUB_BUCKETS - 1)
}

/// The largest value that falls in `bucket`.
fn upper_bound(bucket: usize) -> u64 {
    if bucket < SUB_BUCKETS {
        return bucket as u64;
    }
    let power = bucket / SUB_BUCKETS + 3;
    let sub = (bucket % SUB_BUCKETS) as u64;
    let base = 1u64 << power;
    let step = 1u64 << (power - 4);
    base.saturating_add((sub + 1) * step).saturating_sub(1)
}

impl LatencyHistogram {
    pub fn record(&self, ns: u64) {
        self.counts[stripe() * BUCKETS + bucket_of(ns)].fetch_add(1, Ordering::Relaxed);
    }

    pub fn percentiles(&self) -> LatencyPercentiles {
        let mut counts = vec![0u64; BUCKETS];
        for (i, c) in self.counts.iter().enumerate() {
            counts[i % BUCKETS] += c.load(Ordering::Relaxed);
        }
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return LatencyPercentiles::default();
        }
        let at = |q: f64| {
            let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
            let mut seen = 0;
            for (i, &c) in counts.iter().enumerate() {
                seen += c;
                if seen >= rank {
                    return upper_bound(i);
                }
            }
            upper_bound(counts.len() - 1)
        };
        LatencyPercentiles {
            count: total,
            p50_ns: at(0.5),
            p99_ns: at(0.99),
            p999_ns: at(0.999),
            p9999_ns: at(0.9999),
            max_ns: at(1.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_cover_values_within_a_sixteenth() {
        let mut last = 0;
        for ns in [
            0u64,
            1,
            15,
            16,
            17,
            100,
            1000,
            12_345,
            1 << 20,
            987_654_321,
            u64::MAX / 2,
        ] {
            let b = bucket_of(ns);
            let hi = upper_bound(b);
            assert!(hi >= ns, "{ns} above its bucket's bound {hi}");
            assert!(hi - ns <= ns / 16 + 1, "{ns} too far from {hi}");
            assert!(b >= last);
            last = b;
        }
    }

    #[test]
    fn percentiles_of_a_known_distribution() {
        let h = LatencyHistogram::default();
        for ns in 1..=10_000u64 {
            h.record(ns * 1000);
        }
        let p = h.percentiles();
        assert_eq!(p.count, 10_000);
        let close = |got: u64, want: u64| got >= want && got - want <= want / 16 + 1;
        assert!(close(p.p50_ns, 5_000_000), "{p:?}");
        assert!(close(p.p99_ns, 9_900_000), "{p:?}");
        assert!(close(p.max_ns, 10_000_000), "{p:?}");
    }
}

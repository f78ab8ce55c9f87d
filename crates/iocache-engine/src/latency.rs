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
    /// Per stripe: [`BUCKETS`] counters, then the sum of the values.
    counts: Vec<AtomicU64>,
}

/// The upper bounds of the cumulative buckets exported as a Prometheus
/// histogram (`le`), in nanoseconds: 10 µs to 10 s, 1-2.5-5 per decade.
/// A recorded value is counted under a bound when the histogram bucket
/// holding it ends at or below the bound, so a count is exact to within the
/// buckets' 1/16 width.
pub const LATENCY_BOUNDS_NS: [u64; 13] = [
    10_000,
    25_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    100_000_000,
    1_000_000_000,
    10_000_000_000,
];

/// Percentiles of one histogram, in nanoseconds (bucket upper bounds), and
/// what a Prometheus histogram needs: the sum and the cumulative counts at
/// [`LATENCY_BOUNDS_NS`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LatencyPercentiles {
    pub count: u64,
    pub p50_ns: u64,
    pub p99_ns: u64,
    pub p999_ns: u64,
    pub p9999_ns: u64,
    pub max_ns: u64,
    /// The sum of every recorded value.
    pub sum_ns: u64,
    /// Values at or below each of [`LATENCY_BOUNDS_NS`].
    pub at_most: [u64; LATENCY_BOUNDS_NS.len()],
}

const BUCKETS: usize = POWERS * SUB_BUCKETS;
/// A stripe's counters: the buckets and the sum.
const STRIPE_SLOTS: usize = BUCKETS + 1;

impl Default for LatencyHistogram {
    fn default() -> Self {
        LatencyHistogram {
            counts: (0..STRIPE_SLOTS * STRIPES).map(|_| AtomicU64::new(0)).collect(),
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
        let base = stripe() * STRIPE_SLOTS;
        self.counts[base + bucket_of(ns)].fetch_add(1, Ordering::Relaxed);
        self.counts[base + BUCKETS].fetch_add(ns, Ordering::Relaxed);
    }

    pub fn percentiles(&self) -> LatencyPercentiles {
        let mut counts = vec![0u64; BUCKETS];
        let mut sum_ns = 0u64;
        for (i, c) in self.counts.iter().enumerate() {
            let value = c.load(Ordering::Relaxed);
            match i % STRIPE_SLOTS {
                BUCKETS => sum_ns = sum_ns.wrapping_add(value),
                bucket => counts[bucket] += value,
            }
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
        let mut at_most = [0u64; LATENCY_BOUNDS_NS.len()];
        for (bound, slot) in LATENCY_BOUNDS_NS.iter().zip(at_most.iter_mut()) {
            *slot = counts
                .iter()
                .enumerate()
                .take_while(|(i, _)| upper_bound(*i) <= *bound)
                .map(|(_, c)| c)
                .sum();
        }
        LatencyPercentiles {
            count: total,
            p50_ns: at(0.5),
            p99_ns: at(0.99),
            p999_ns: at(0.999),
            p9999_ns: at(0.9999),
            max_ns: at(1.0),
            sum_ns,
            at_most,
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

    /// The percentiles of 1 µs, 2 µs, ... 10 ms, once each.
    fn one_to_ten_thousand_microseconds() -> LatencyPercentiles {
        let h = LatencyHistogram::default();
        for ns in 1..=10_000u64 {
            h.record(ns * 1000);
        }
        h.percentiles()
    }

    #[test]
    fn percentiles_of_a_known_distribution() {
        let p = one_to_ten_thousand_microseconds();
        assert_eq!(p.count, 10_000);
        let close = |got: u64, want: u64| got >= want && got - want <= want / 16 + 1;
        assert!(close(p.p50_ns, 5_000_000), "{p:?}");
        assert!(close(p.p99_ns, 9_900_000), "{p:?}");
        assert!(close(p.max_ns, 10_000_000), "{p:?}");
    }

    #[test]
    fn sum_and_cumulative_counts_for_an_exported_histogram() {
        let p = one_to_ten_thousand_microseconds();
        assert_eq!(p.sum_ns, 1000 * 10_000 * 10_001 / 2);
        // Cumulative, ending with every value by 10 ms... within a bucket.
        assert!(p.at_most.windows(2).all(|w| w[0] <= w[1]), "{p:?}");
        let near = |got: u64, want: u64| got.abs_diff(want) <= want / 16 + 1;
        assert!(near(p.at_most[0], 10), "10 µs: {p:?}");
        assert!(near(p.at_most[3], 100), "100 µs: {p:?}");
        assert!(near(p.at_most[6], 1000), "1 ms: {p:?}");
        assert_eq!(p.at_most[LATENCY_BOUNDS_NS.len() - 1], 10_000);
        assert_eq!(
            LatencyHistogram::default().percentiles(),
            LatencyPercentiles::default()
        );
    }
}

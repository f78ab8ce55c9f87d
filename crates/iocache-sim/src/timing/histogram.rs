//! A log-linear latency histogram with bounded relative error and fixed memory.
//!
//! Values (nanoseconds, `u64`) below 2^[`SUB_BITS`] have a bucket each; above,
//! every power of two `[2^e, 2^(e+1))` is split into 2^`SUB_BITS` equal
//! buckets (the layout of HdrHistogram with one significant binary digit
//! group). A bucket's width is at most 2^-`SUB_BITS` of its lower bound, and a
//! percentile is reported as the bucket's midpoint (clamped to the observed
//! minimum and maximum), so its relative error is at most 2^-(`SUB_BITS`+1)
//! = 0.39 % with `SUB_BITS` = 7. Memory is [`BUCKETS`] counters (about 58 KiB)
//! whatever the number of samples. The mean is exact (a 128-bit sum).
//!
//! Percentiles use the nearest-rank definition: the p-th percentile of n
//! samples is the ⌈p·n⌉-th smallest (the smallest for p = 0).

use serde::Serialize;

/// Sub-bucket bits per power of two.
pub const SUB_BITS: u32 = 7;
const SUB: u64 = 1 << SUB_BITS;
/// Buckets in total: the exact range plus `SUB` per remaining power of two.
pub const BUCKETS: usize = ((64 - SUB_BITS + 1) as usize) << SUB_BITS;
/// Guaranteed bound on a reported percentile's relative error.
pub const MAX_RELATIVE_ERROR: f64 = 1.0 / (2u64 << SUB_BITS) as f64;

#[derive(Clone)]
pub struct Histogram {
    counts: Box<[u64]>,
    count: u64,
    sum: u128,
    min: u64,
    max: u64,
    /// Touched bucket range, so `clear` costs only what was used.
    lo: usize,
    hi: usize,
}

impl std::fmt::Debug for Histogram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Histogram")
            .field("count", &self.count)
            .field("min", &self.min)
            .field("max", &self.max)
            .finish()
    }
}

impl Default for Histogram {
    fn default() -> Self {
        Self::new()
    }
}

fn bucket_of(v: u64) -> usize {
    if v < SUB {
        return v as usize;
    }
    let e = 63 - v.leading_zeros(); // v in [2^e, 2^(e+1)), e >= SUB_BITS
    let shift = e - SUB_BITS;
    let mantissa = (v >> shift) - SUB; // in [0, SUB)
    (((shift + 1) as u64) << SUB_BITS | mantissa) as usize
}

/// Inclusive lower and exclusive upper bound of a bucket.
fn bounds_of(b: usize) -> (u64, u64) {
    let b = b as u64;
    if b < SUB {
        return (b, b + 1);
    }
    let shift = (b >> SUB_BITS) - 1;
    let mantissa = b & (SUB - 1);
    let lo = (SUB + mantissa) << shift;
    (lo, lo.saturating_add(1 << shift))
}

impl Histogram {
    pub fn new() -> Self {
        Histogram {
            counts: vec![0; BUCKETS].into_boxed_slice(),
            count: 0,
            sum: 0,
            min: u64::MAX,
            max: 0,
            lo: BUCKETS,
            hi: 0,
        }
    }

    pub fn record(&mut self, v: u64) {
        let b = bucket_of(v);
        self.counts[b] += 1;
        self.lo = self.lo.min(b);
        self.hi = self.hi.max(b + 1);
        self.count += 1;
        self.sum += v as u128;
        self.min = self.min.min(v);
        self.max = self.max.max(v);
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    pub fn mean(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.sum as f64 / self.count as f64
        }
    }

    pub fn min(&self) -> Option<u64> {
        (self.count > 0).then_some(self.min)
    }

    pub fn max(&self) -> Option<u64> {
        (self.count > 0).then_some(self.max)
    }

    /// Adds every sample of `other`.
    pub fn merge(&mut self, other: &Histogram) {
        if other.count == 0 {
            return;
        }
        for b in other.lo..other.hi {
            self.counts[b] += other.counts[b];
        }
        self.lo = self.lo.min(other.lo);
        self.hi = self.hi.max(other.hi);
        self.count += other.count;
        self.sum += other.sum;
        self.min = self.min.min(other.min);
        self.max = self.max.max(other.max);
    }

    pub fn clear(&mut self) {
        if self.lo < self.hi {
            self.counts[self.lo..self.hi].fill(0);
        }
        self.count = 0;
        self.sum = 0;
        self.min = u64::MAX;
        self.max = 0;
        self.lo = BUCKETS;
        self.hi = 0;
    }

    /// Several percentiles (each in [0, 1], ascending) in one pass; 0 when empty.
    pub fn percentiles<const N: usize>(&self, ps: [f64; N]) -> [u64; N] {
        let mut out = [0u64; N];
        if self.count == 0 {
            return out;
        }
        let ranks = ps.map(|p| ((p.clamp(0.0, 1.0) * self.count as f64).ceil() as u64).max(1));
        let mut i = 0;
        let mut seen = 0u64;
        for b in self.lo..self.hi {
            seen += self.counts[b];
            while i < N && seen >= ranks[i] {
                let (lo, hi) = bounds_of(b);
                let mid = lo + (hi - 1 - lo) / 2;
                out[i] = mid.clamp(self.min, self.max);
                i += 1;
            }
            if i == N {
                break;
            }
        }
        out
    }

    pub fn percentile(&self, p: f64) -> u64 {
        self.percentiles([p])[0]
    }

    /// The cumulative distribution at [`CDF_QUANTILES`]: `(quantile,
    /// latency)` pairs, latency ascending; empty when there are no samples.
    /// Enough points to draw the curve (every percent, and the tail to
    /// 99.999 %), not every bucket.
    pub fn cdf(&self) -> Vec<(f64, u64)> {
        if self.count == 0 {
            return Vec::new();
        }
        let values = self.percentiles(CDF_QUANTILES);
        CDF_QUANTILES.iter().copied().zip(values).collect()
    }

    /// The usual summary of this histogram.
    pub fn summary(&self) -> LatencySummary {
        let [p50, p99, p999, p9999] = self.percentiles([0.5, 0.99, 0.999, 0.9999]);
        LatencySummary {
            count: self.count,
            mean_ns: self.mean(),
            p50_ns: p50,
            p99_ns: p99,
            p999_ns: p999,
            p9999_ns: p9999,
            max_ns: self.max().unwrap_or(0),
        }
    }
}

/// The quantiles [`Histogram::cdf`] reports: 0, every percent, then the tail.
pub const CDF_QUANTILES: [f64; 106] = {
    let mut q = [0.0; 106];
    let mut i = 1;
    while i < 100 {
        q[i] = i as f64 / 100.0;
        i += 1;
    }
    let tail = [0.995, 0.999, 0.9995, 0.9999, 0.99999, 1.0];
    let mut j = 0;
    while j < tail.len() {
        q[100 + j] = tail[j];
        j += 1;
    }
    q
};

/// Count, mean and tail percentiles of a set of latencies, in nanoseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct LatencySummary {
    pub count: u64,
    pub mean_ns: f64,
    pub p50_ns: u64,
    pub p99_ns: u64,
    pub p999_ns: u64,
    pub p9999_ns: u64,
    pub max_ns: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timing::rng::SplitMix64;

    #[test]
    fn buckets_are_contiguous_and_tight() {
        let mut prev_hi = 0;
        for b in 0..BUCKETS - 1 {
            let (lo, hi) = bounds_of(b);
            assert_eq!(lo, prev_hi, "bucket {b}");
            assert!(hi > lo);
            assert_eq!(bucket_of(lo), b);
            assert_eq!(bucket_of(hi - 1), b);
            assert!((hi - lo) as f64 <= (lo.max(1) as f64) / SUB as f64 + 1.0);
            prev_hi = hi;
        }
        assert_eq!(bucket_of(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn small_values_are_exact() {
        let mut h = Histogram::new();
        for v in 1..=100 {
            h.record(v);
        }
        // Nearest rank: the 50th of 100 values 1..=100 is 50; the 99th is 99.
        assert_eq!(h.percentiles([0.0, 0.5, 0.99, 1.0]), [1, 50, 99, 100]);
        assert_eq!(h.mean(), 50.5);
    }

    /// Percentiles of random samples over nine decades stay within the bound
    /// of the exact nearest-rank values.
    #[test]
    fn percentile_error_is_bounded() {
        let mut rng = SplitMix64::new(42);
        let mut h = Histogram::new();
        let mut exact = Vec::new();
        for _ in 0..200_000 {
            // Log-uniform between 1 and 1e9 ns.
            let v = 10f64.powf(rng.next_f64() * 9.0) as u64;
            h.record(v);
            exact.push(v);
        }
        exact.sort_unstable();
        for p in [0.001, 0.1, 0.5, 0.9, 0.99, 0.999, 0.9999, 1.0] {
            let rank = ((p * exact.len() as f64).ceil() as usize).max(1);
            let want = exact[rank - 1] as f64;
            let got = h.percentile(p) as f64;
            let err = (got - want).abs() / want;
            assert!(err <= MAX_RELATIVE_ERROR + 1e-12, "p{p}: {got} vs {want} ({err})");
        }
        const { assert!(MAX_RELATIVE_ERROR < 0.01) };
        let exact_mean = exact.iter().map(|&v| v as f64).sum::<f64>() / exact.len() as f64;
        assert!((h.mean() - exact_mean).abs() / exact_mean < 1e-9);
    }

    #[test]
    fn cdf_is_monotone_and_ends_at_the_maximum() {
        assert!(Histogram::new().cdf().is_empty());
        let mut h = Histogram::new();
        for v in 1..=100 {
            h.record(v);
        }
        let cdf = h.cdf();
        assert_eq!(cdf.len(), CDF_QUANTILES.len());
        assert!(cdf.windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1));
        assert_eq!(cdf[0], (0.0, 1));
        assert_eq!(cdf[50], (0.5, 50));
        assert_eq!(*cdf.last().unwrap(), (1.0, 100));
    }

    #[test]
    fn merge_and_clear() {
        let mut a = Histogram::new();
        let mut b = Histogram::new();
        a.record(10);
        b.record(1_000_000);
        a.merge(&b);
        assert_eq!(a.count(), 2);
        assert_eq!(a.max(), Some(1_000_000));
        a.clear();
        assert_eq!(a.count(), 0);
        assert_eq!(a.percentile(0.5), 0);
        a.record(5);
        assert_eq!(a.percentile(1.0), 5);
    }
}

//! Promotion: deciding whether a missed line is inserted at all (the
//! admission policy; OCF calls it promotion).
//!
//! `nhit:N` counts misses per line in a bounded history, as Open CAS's nhit
//! promotion policy does (`src/promotion/nhit/` in OCF: a hash of recently
//! missed core lines sized at twice the cache's lines, `NHIT_MAPPING_RATIO 2`,
//! default threshold 3, trigger at 80 % occupancy). The history here is a ring
//! of `2 × cache lines` entries: a new line overwrites the oldest entry, so the
//! memory is fixed and lines not missed again within that window are forgotten.
//!
//! The others follow libCacheSim's admission algorithms and CacheLib's
//! write-budget admission: a coin (`random`), a counting Bloom filter of
//! earlier misses (`second-hit`), a request-size threshold and a token
//! bucket over the cache device's writes (`write-rate`). Every structure is
//! sized by the cache, never by the trace.

use crate::addr::{LineKey, Request};
use crate::config::Promotion;
use crate::fasthash::{map_with_capacity, FxHashMap};

/// History entries per cache line (OCF's `NHIT_MAPPING_RATIO`).
pub const NHIT_HISTORY_PER_LINE: usize = 2;

/// Hash functions of the second-hit filter.
pub const SECOND_HIT_HASHES: usize = 3;

/// Misses between two halvings of the second-hit filter, per cache line.
pub const SECOND_HIT_WINDOW_PER_LINE: u64 = 1;

const NANOS_PER_SEC: i128 = 1_000_000_000;

pub struct Promoter {
    policy: Promotion,
    capacity_lines: u64,
    ring: Vec<Option<(LineKey, u32)>>,
    next: usize,
    index: FxHashMap<LineKey, usize>,
    /// `random`'s generator state (splitmix64).
    rng: u64,
    /// `second-hit`'s filter.
    bloom: Option<CountingBloom>,
    /// The request-wide answer of `request-size` and `write-rate`, set by
    /// [`Promoter::begin_request`].
    request_admits: bool,
    bucket: Option<Bucket>,
}

/// `write-rate`'s token bucket, in byte-nanoseconds so that no refill is lost to rounding.
#[derive(Clone, Copy, Debug)]
struct Bucket {
    tokens: i128,
    last_ns: u64,
    written_bytes: u64,
}

impl Promoter {
    pub fn new(policy: Promotion, capacity_lines: u64) -> Self {
        let history = match policy {
            Promotion::NHit { .. } => (capacity_lines as usize)
                .saturating_mul(NHIT_HISTORY_PER_LINE)
                .max(1),
            _ => 0,
        };
        let (rng, bloom) = match policy {
            Promotion::Random { seed, .. } => (seed, None),
            Promotion::SecondHit { counters_per_line } => (
                0,
                Some(CountingBloom::new(
                    capacity_lines.saturating_mul(counters_per_line as u64).max(64),
                    capacity_lines.saturating_mul(SECOND_HIT_WINDOW_PER_LINE).max(1),
                )),
            ),
            _ => (0, None),
        };
        Promoter {
            policy,
            capacity_lines,
            ring: vec![None; history],
            next: 0,
            index: map_with_capacity(history),
            rng,
            bloom,
            request_admits: true,
            bucket: None,
        }
    }

    /// Tells the admission policy of the next request, before any of its
    /// lines: `cache_written_bytes` is the cache's running count of bytes
    /// written to the cache device ([`crate::CacheStats::cache_write_bytes`]).
    /// Only `request-size` and `write-rate` decide per request.
    #[inline]
    pub fn begin_request(&mut self, request: &Request, cache_written_bytes: u64) {
        match self.policy {
            Promotion::RequestSize { max_request_bytes } => {
                self.request_admits = request.length_bytes <= max_request_bytes
            }
            Promotion::WriteRate { bytes_per_sec } => {
                self.request_admits = self.refill(bytes_per_sec, request.now_ns, cache_written_bytes)
            }
            _ => {}
        }
    }

    /// Refills and drains `write-rate`'s bucket; whether it holds tokens.
    fn refill(&mut self, bytes_per_sec: u64, now_ns: u64, written_bytes: u64) -> bool {
        let burst = bytes_per_sec as i128 * NANOS_PER_SEC;
        let bucket = self.bucket.get_or_insert(Bucket {
            tokens: burst,
            last_ns: now_ns,
            written_bytes,
        });
        let elapsed = now_ns.saturating_sub(bucket.last_ns) as i128;
        let spent = written_bytes.saturating_sub(bucket.written_bytes) as i128;
        // The writes counted since the last request happened before now.
        bucket.tokens = (bucket.tokens - spent * NANOS_PER_SEC + bytes_per_sec as i128 * elapsed).min(burst);
        bucket.last_ns = bucket.last_ns.max(now_ns);
        bucket.written_bytes = written_bytes;
        bucket.tokens > 0
    }

    /// Records a miss on `key` and says whether to insert it now.
    #[inline]
    pub fn should_promote(&mut self, key: LineKey, resident_lines: u64) -> bool {
        match self.policy {
            Promotion::Always => true,
            Promotion::NHit { .. } => self.should_promote_nhit(key, resident_lines),
            Promotion::Random { per_million, .. } => {
                (splitmix64(&mut self.rng) % 1_000_000) < per_million as u64
            }
            Promotion::SecondHit { .. } => self
                .bloom
                .as_mut()
                .expect("second-hit keeps a filter")
                .seen_before(key),
            Promotion::RequestSize { .. } | Promotion::WriteRate { .. } => self.request_admits,
        }
    }

    fn should_promote_nhit(&mut self, key: LineKey, resident_lines: u64) -> bool {
        let Promotion::NHit {
            threshold,
            trigger_percent,
        } = self.policy
        else {
            return true;
        };
        if resident_lines * 100 < self.capacity_lines * trigger_percent as u64 {
            return true;
        }
        let count = match self.index.get(&key) {
            Some(&at) => {
                let entry = self.ring[at].as_mut().expect("indexed entry exists");
                entry.1 += 1;
                entry.1
            }
            None => {
                let at = self.next;
                self.next = (self.next + 1) % self.ring.len();
                if let Some((old, _)) = self.ring[at].take() {
                    self.index.remove(&old);
                }
                self.ring[at] = Some((key, 1));
                self.index.insert(key, at);
                1
            }
        };
        if count >= threshold {
            self.forget(key);
            true
        } else {
            false
        }
    }

    /// Drops the history of `key` (it was promoted).
    pub fn forget(&mut self, key: LineKey) {
        if let Some(at) = self.index.remove(&key) {
            self.ring[at] = None;
        }
    }

    /// Lines currently remembered.
    pub fn history_len(&self) -> usize {
        self.index.len()
    }
}

/// One step of splitmix64 (Steele, Lea and Flood): a fast generator whose
/// every seed, zero included, gives a full-period sequence.
#[inline]
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A counting Bloom filter of 2-bit counters, four to a byte, with aging:
/// each key checked sets its counters to 2 (where lower), and every counter
/// is halved after every `window` checks, so a key is remembered for at
/// least one window after its last check and at most two. Counters only
/// grow between agings, so a key's smallest counter is never below what
/// an exact count with the same aging would hold: no false negatives.
pub struct CountingBloom {
    quarters: Vec<u8>,
    counters: u64,
    window: u64,
    checked: u64,
}

/// A fresh record's counter value (remembered for two halvings).
const RECORDED: u8 = 2;

impl CountingBloom {
    pub fn new(counters: u64, window: u64) -> Self {
        CountingBloom {
            quarters: vec![0; counters.div_ceil(4) as usize],
            counters,
            window,
            checked: 0,
        }
    }

    /// Bytes the filter holds.
    pub fn memory_bytes(&self) -> usize {
        self.quarters.len()
    }

    fn positions(&self, key: LineKey) -> [u64; SECOND_HIT_HASHES] {
        let mut state = key.line_index ^ u64::from(key.volume).rotate_left(40);
        let h = splitmix64(&mut state);
        let (h1, h2) = (h & 0xFFFF_FFFF, (h >> 32) | 1);
        std::array::from_fn(|i| h1.wrapping_add(h2.wrapping_mul(i as u64)) % self.counters)
    }

    fn get(&self, at: u64) -> u8 {
        (self.quarters[(at / 4) as usize] >> ((at % 4) * 2)) & 0b11
    }

    fn set(&mut self, at: u64, value: u8) {
        let byte = &mut self.quarters[(at / 4) as usize];
        let shift = (at % 4) * 2;
        *byte = (*byte & !(0b11 << shift)) | ((value & 0b11) << shift);
    }

    /// The smallest of `key`'s counters (0: surely not remembered).
    pub fn estimate(&self, key: LineKey) -> u8 {
        self.positions(key)
            .iter()
            .map(|&at| self.get(at))
            .min()
            .unwrap_or(0)
    }

    /// Whether `key` is remembered; then records it (again). Every call
    /// counts towards the next halving.
    pub fn seen_before(&mut self, key: LineKey) -> bool {
        let positions = self.positions(key);
        let seen = positions.iter().all(|&at| self.get(at) > 0);
        for at in positions {
            if self.get(at) < RECORDED {
                self.set(at, RECORDED);
            }
        }
        self.checked += 1;
        if self.checked >= self.window {
            self.checked = 0;
            for byte in &mut self.quarters {
                *byte = (*byte >> 1) & 0b0101_0101;
            }
        }
        seen
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::testing::key;

    /// A promoter of N-hit promotion for a cache of `capacity_lines`.
    fn nhit(threshold: u32, trigger_percent: u32, capacity_lines: u64) -> Promoter {
        Promoter::new(
            Promotion::NHit {
                threshold,
                trigger_percent,
            },
            capacity_lines,
        )
    }

    #[test]
    fn always_promotes() {
        let mut p = Promoter::new(Promotion::Always, 4);
        assert!(p.should_promote(key(1), 0));
        assert_eq!(p.history_len(), 0);
    }

    #[test]
    fn nhit_promotes_on_nth_miss() {
        let mut p = nhit(3, 0, 4);
        assert!(!p.should_promote(key(1), 0));
        assert!(!p.should_promote(key(1), 0));
        assert!(p.should_promote(key(1), 0));
        // Promotion resets the count.
        assert!(!p.should_promote(key(1), 0));
    }

    #[test]
    fn nhit_history_is_bounded_and_forgets_oldest() {
        // 2 cache lines -> 4 history entries.
        let mut p = nhit(2, 0, 2);
        for i in 0..4 {
            assert!(!p.should_promote(key(i), 0));
        }
        assert!(!p.should_promote(key(99), 0)); // overwrites key 0's entry
        assert_eq!(p.history_len(), 4);
        assert!(!p.should_promote(key(0), 0), "key 0 was forgotten");
        assert!(p.should_promote(key(2), 0), "key 2 still remembered");
    }

    #[test]
    fn nhit_trigger_promotes_everything_below_occupancy() {
        let mut p = nhit(3, 50, 10);
        assert!(p.should_promote(key(1), 4));
        assert!(!p.should_promote(key(1), 5));
    }
}

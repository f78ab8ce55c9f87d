//! The admission policies and the readahead, each against a simple model
//! of what it promises, driven through the cache as a simulator or the
//! engine would drive it.

use std::collections::HashMap;

use iocache_core::promotion::CountingBloom;
use iocache_core::{
    AccessHints, Cache, CacheConfig, LineKey, LineSize, OpList, PolicySpec, Promotion, Readahead,
    Readaheader, Request,
};

const LINE: u64 = 4096;

fn cache(lines: u64, promotion: Promotion) -> Cache {
    let mut config = CacheConfig::new(lines, LineSize::new(LINE).unwrap(), PolicySpec::lru());
    config.promotion = promotion;
    Cache::new(config).unwrap()
}

/// A stream of `n` reads of distinct lines (every one a miss), 1 ms apart.
fn distinct_misses(n: u64) -> impl Iterator<Item = Request> {
    (0..n).map(|i| Request::read(0, i * LINE, LINE, i * 1_000_000))
}

#[test]
fn random_admission_admits_its_share_and_repeats_with_its_seed() {
    let run = |promotion: &str| {
        let mut c = cache(1 << 20, promotion.parse().unwrap());
        let mut ops = OpList::new();
        let mut admitted = Vec::new();
        for r in distinct_misses(100_000) {
            let before = c.stats().promotions;
            c.access(&r, &mut ops).unwrap();
            admitted.push(c.stats().promotions > before);
        }
        admitted
    };
    let a = run("random:0.1");
    let n = a.iter().filter(|&&x| x).count();
    // Binomial(100000, 0.1): sd 95; five of them either side.
    assert!((9_525..=10_475).contains(&n), "{n} of 100000 admitted at p = 0.1");
    assert_eq!(a, run("random:0.1"), "the same seed decides the same way");
    let b = run("random:0.1:seed=9");
    assert_ne!(a, b, "another seed, other decisions");
    let m = run("random:0.75").iter().filter(|&&x| x).count();
    assert!(
        (74_315..=75_685).contains(&m),
        "{m} of 100000 admitted at p = 0.75"
    );
}

/// The exact model of the second-hit filter: a key checked holds 2, every
/// value is halved after every `window` checks, and a key is seen when it
/// holds more than 0.
struct ExactSecondHit {
    held: HashMap<u64, u8>,
    window: u64,
    checked: u64,
}

impl ExactSecondHit {
    fn seen_before(&mut self, key: u64) -> bool {
        let seen = self.held.get(&key).is_some_and(|&v| v > 0);
        self.held.insert(key, 2);
        self.checked += 1;
        if self.checked == self.window {
            self.checked = 0;
            self.held.retain(|_, v| {
                *v /= 2;
                *v > 0
            });
        }
        seen
    }
}

#[test]
fn second_hit_never_forgets_what_the_exact_model_remembers_and_rarely_invents() {
    let lines = 4096u64;
    let mut bloom = CountingBloom::new(lines * 16, lines);
    let mut exact = ExactSecondHit {
        held: HashMap::new(),
        window: lines,
        checked: 0,
    };
    assert_eq!(bloom.memory_bytes() as u64, lines * 16 / 4);
    // Keys drawn from a range a few times the window, so that many recur
    // within it and many do not.
    let mut state = 12345u64;
    let (mut model_seen, mut false_positives, mut firsts) = (0u64, 0u64, 0u64);
    for _ in 0..200_000 {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let key = (state >> 33) % (lines * 6);
        let model = exact.seen_before(key);
        let line = LineKey {
            volume: 0,
            line_index: key,
        };
        let filter = bloom.seen_before(line);
        if model {
            model_seen += 1;
            assert!(
                filter,
                "key {key}: remembered by the model, forgotten by the filter"
            );
        } else {
            firsts += 1;
            false_positives += u64::from(filter);
        }
    }
    assert!(model_seen > 20_000 && firsts > 20_000, "{model_seen} {firsts}");
    let rate = false_positives as f64 / firsts as f64;
    eprintln!("second-hit: {false_positives} false positives in {firsts} first misses ({rate:.4})");
    assert!(rate < 0.05, "false positives {rate:.4} of first misses");
}

#[test]
fn second_hit_admits_a_line_on_its_second_miss() {
    let mut c = cache(1024, "second-hit".parse().unwrap());
    let mut ops = OpList::new();
    let r = Request::read(0, 40 * LINE, LINE, 0);
    c.access(&r, &mut ops).unwrap();
    assert_eq!(c.stats().promotions, 0, "a first miss is not admitted");
    c.access(&r, &mut ops).unwrap();
    assert_eq!(c.stats().promotions, 1, "the second is");
    let hit = c.access(&r, &mut ops).unwrap();
    assert_eq!(hit.full_hits, 1);
}

#[test]
fn request_size_admits_the_lines_of_small_requests_only() {
    let mut c = cache(1 << 16, "request-size:16KiB".parse().unwrap());
    let mut ops = OpList::new();
    let mut expected = 0;
    let mut at = 0;
    for (i, lines) in [1u64, 4, 5, 16, 2, 64, 3]
        .into_iter()
        .cycle()
        .take(700)
        .enumerate()
    {
        let r = Request::read(0, at, lines * LINE, i as u64);
        at += lines * LINE;
        if lines * LINE <= 16 << 10 {
            expected += lines;
        }
        // Both drivers' paths: ops kept and counted only.
        match i % 2 {
            0 => c.access(&r, &mut ops).map(|_| ()).unwrap(),
            _ => c.access_counted(&r, AccessHints::default()).map(|_| ()).unwrap(),
        }
    }
    assert_eq!(c.stats().promotions, expected);
}

#[test]
fn write_rate_admits_as_a_token_bucket_over_the_cache_device_writes() {
    let rate = 1u64 << 20;
    let mut c = cache(1 << 20, format!("write-rate:{rate}B/s").parse().unwrap());
    let mut ops = OpList::new();
    // The model: tokens in bytes, a burst of one second, refilled by the
    // request's clock, drained by what each admitted request wrote.
    // In byte-nanoseconds, so that the model is exact.
    const NS: i128 = 1_000_000_000;
    let mut tokens = rate as i128 * NS;
    let mut last_ns = 0u64;
    let mut written = 0u64;
    let mut demand = 0u64;
    for i in 0..20_000u64 {
        // 16 KiB requests every 2 ms: 8 MiB/s asked of a 1 MiB/s budget,
        // with idle stretches that refill the bucket.
        let now = i * 2_000_000 + (i / 5000) * 3_000_000_000;
        let r = Request::read(0, i * 4 * LINE, 4 * LINE, now);
        tokens = (tokens + rate as i128 * (now - last_ns) as i128).min(rate as i128 * NS);
        last_ns = now;
        let admit = tokens > 0;
        let before = c.stats().cache_write_bytes;
        c.access(&r, &mut ops).unwrap();
        let wrote = c.stats().cache_write_bytes - before;
        assert_eq!(wrote > 0, admit, "request {i} at {now} ns: tokens {tokens}");
        tokens -= wrote as i128 * NS;
        written += wrote;
        demand += 4 * LINE;
        let budget = rate as f64 * (now as f64 / 1e9 + 1.0) + (4 * LINE) as f64;
        assert!(
            (written as f64) <= budget,
            "request {i}: {written} written, budget {budget}"
        );
    }
    // The idle stretches refill at most one second's burst: the busy time
    // is what the budget is spent over.
    let busy_seconds = (19_999 * 2_000_000u64) as f64 / 1e9;
    assert!(
        written as f64 >= rate as f64 * busy_seconds && written < demand,
        "{written} written in {busy_seconds} busy seconds at {rate} B/s (demand {demand})"
    );
}

/// A cache with readahead driven as the simulator drives it: each request,
/// then the fill the readahead asks for.
struct Ahead {
    cache: Cache,
    readahead: Readaheader,
    fills: u64,
}

impl Ahead {
    fn new(lines: u64, readahead: &str) -> Self {
        let mut config = CacheConfig::new(lines, LineSize::new(LINE).unwrap(), PolicySpec::lru());
        config.readahead = readahead.parse().unwrap();
        let readahead = Readaheader::new(config.readahead, config.line_size);
        Ahead {
            cache: Cache::new(config).unwrap(),
            readahead,
            fills: 0,
        }
    }

    fn read(&mut self, r: Request) {
        self.cache.access_counted(&r, AccessHints::default()).unwrap();
        if let Some(fill) = self.readahead.on_request(&r, self.cache.readahead_feedback()) {
            self.fills += 1;
            let hints = AccessHints {
                prefetch: true,
                ..AccessHints::default()
            };
            self.cache.access_counted(&fill, hints).unwrap();
        }
    }
}

#[test]
fn readahead_turns_a_scan_into_hits_after_its_first_two_reads() {
    // The model of an ideal sequential prefetcher: every line after the
    // reads that reveal the stream is fetched before it is read.
    for streams in [1u64, 4] {
        let mut a = Ahead::new(1 << 16, "seq:min=32KiB:max=512KiB:streams=4");
        let reads_per_stream = 2000u64;
        for i in 0..reads_per_stream {
            for s in 0..streams {
                let base = s << 32;
                a.read(Request::read(0, base + i * 2 * LINE, 2 * LINE, i));
            }
        }
        let st = a.cache.stats();
        assert_eq!(
            st.misses,
            streams * 4,
            "{streams} streams: only the first two reads of each miss"
        );
        assert_eq!(st.full_hits, streams * (reads_per_stream * 2 - 4));
        assert_eq!(st.prefetch_unused_lines, 0);
        // Fetched at most one window (512 KiB) past the last read.
        assert!(
            st.prefetched_lines <= streams * (reads_per_stream * 2 + 128),
            "{}",
            st.prefetched_lines
        );
        assert!(st.prefetch_used_lines >= streams * (reads_per_stream * 2 - 4));
    }
}

#[test]
fn readahead_fetches_nothing_for_random_reads_or_writes() {
    let mut a = Ahead::new(1 << 12, "seq");
    let mut state = 7u64;
    for i in 0..5000 {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let offset = ((state >> 33) % (1 << 20)) * LINE;
        a.read(Request::read(0, offset, LINE, i));
        a.read(Request::write(0, i * LINE, LINE, i));
    }
    assert_eq!(a.fills, 0);
    assert_eq!(a.cache.stats().prefetch_requests, 0);
}

#[test]
fn more_streams_than_the_table_holds_get_no_readahead() {
    let mut a = Ahead::new(1 << 16, "seq:streams=2");
    for i in 0..500u64 {
        for s in 0..3u64 {
            a.read(Request::read(0, (s << 32) + i * LINE, LINE, i));
        }
    }
    assert_eq!(
        a.fills, 0,
        "three round-robin streams evict each other from a table of two"
    );
}

#[test]
fn a_cache_too_small_for_the_window_shrinks_it_to_the_minimum() {
    // Eight streams of 1 MiB windows into 256 KiB of cache: fetched lines
    // are evicted before they are read, and the cap falls to `min`.
    let mut a = Ahead::new(64, "seq:min=8KiB:max=1MiB:streams=8");
    for i in 0..400u64 {
        for s in 0..8u64 {
            a.read(Request::read(0, (s << 32) + i * LINE, LINE, i));
        }
    }
    assert!(a.cache.stats().prefetch_unused_lines > 0);
    assert_eq!(a.readahead.cap_bytes(), 8192);
    assert_eq!(
        a.readahead.config(),
        "seq:min=8KiB:max=1MiB:streams=8".parse::<Readahead>().unwrap()
    );
}

#[test]
fn a_fill_leaves_cached_lines_alone_and_ignores_the_promotion_policy() {
    let mut config = CacheConfig::new(1024, LineSize::new(LINE).unwrap(), PolicySpec::lru());
    config.promotion = "nhit:3".parse().unwrap();
    let mut c = Cache::new(config).unwrap();
    let mut ops = OpList::new();
    // Line 1 cached and dirty.
    c.access(&Request::write(0, LINE, LINE, 0), &mut ops).unwrap();
    c.access(&Request::write(0, LINE, LINE, 0), &mut ops).unwrap();
    c.access(&Request::write(0, LINE, LINE, 0), &mut ops).unwrap();
    assert_eq!(c.stats().promotions, 1);
    let hints = AccessHints {
        prefetch: true,
        ..AccessHints::default()
    };
    let before = *c.stats();
    c.access_with(&Request::read(0, 0, 4 * LINE, 1), hints, &mut ops)
        .unwrap();
    let after = *c.stats();
    assert_eq!(after.prefetched_lines, 3, "lines 0, 2 and 3; line 1 was cached");
    assert_eq!(after.requests, before.requests, "a fill is not a request");
    assert_eq!(after.accesses, before.accesses);
    assert_eq!(after.backend_read_bytes - before.backend_read_bytes, 3 * LINE);
    assert_eq!(after.cache_write_bytes - before.cache_write_bytes, 3 * LINE);
    assert!(ops
        .ops()
        .iter()
        .all(|op| !matches!(op, iocache_core::Op::WriteBack { .. })));
    // A read of the four lines hits them all, and uses three fetched lines.
    let s = c.access(&Request::read(0, 0, 4 * LINE, 2), &mut ops).unwrap();
    assert_eq!(s.full_hits, 4);
    assert_eq!(c.stats().prefetch_used_lines, 3);
}

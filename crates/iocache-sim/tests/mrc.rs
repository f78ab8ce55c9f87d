//! Miss-ratio curves against the simulator they summarize: every exact
//! point equals `simulate` with LRU at that size, access for access (also
//! with requests that cover parts of lines, reads and writes, several
//! volumes), and SHARDS stays within its error bound on a skewed workload.

use iocache_core::{LineSize, PolicySpec, WritePolicy};
use iocache_sim::mrc::{miss_ratio_curves, MrcMethod, MrcReport};
use iocache_sim::{simulate, CacheSize, SimOptions};
use iocache_trace::{TraceFormat, TraceReader};

mod common;

fn reader(text: &str) -> TraceReader {
    common::memory_reader(text, TraceFormat::Tencent)
}

/// A pseudo-random Tencent-format trace (offsets and sizes in sectors,
/// 0 = read): a hot set and a cold range, sector-granular offsets and
/// sizes so that lines are often partly accessed.
fn trace(requests: usize, span_sectors: u64, seed: u64) -> String {
    let mut state = seed | 1;
    let mut next = move || common::xorshift(&mut state);
    let mut out = String::new();
    for i in 0..requests {
        let r = next();
        let hot = r % 10 < 7;
        let offset = if hot {
            next() % (span_sectors / 20)
        } else {
            next() % span_sectors
        };
        let sectors = 1 + next() % 24;
        let write = next() % 4 == 0;
        let volume = next() % 2;
        out.push_str(&format!(
            "{},{offset},{sectors},{},{volume}\n",
            i / 100,
            write as u8
        ));
    }
    out
}

fn curves(text: &str, line: u64, methods: &[MrcMethod], sizes: &[u64]) -> MrcReport {
    miss_ratio_curves(
        &mut reader(text),
        LineSize::new(line).unwrap(),
        methods,
        Some(sizes),
        &mut |_, _| {},
    )
    .unwrap()
}

/// Hits of the simulator's LRU (write-back, promotion always) per size.
fn lru_hits(text: &str, line: u64, sizes: &[u64]) -> Vec<(u64, u64)> {
    let sizes: Vec<CacheSize> = sizes.iter().map(|&n| CacheSize::Lines(n)).collect();
    let specs = common::specs(&[PolicySpec::lru()], &sizes, line, WritePolicy::WriteBack);
    let options = SimOptions {
        threads: 1,
        ..SimOptions::default()
    };
    let report = simulate(&mut reader(text), &specs, &options, &mut |_, _| {}).unwrap();
    report
        .runs
        .iter()
        .map(|r| (r.stats.read_hits + r.stats.write_hits, r.stats.accesses))
        .collect()
}

#[test]
fn exact_points_equal_the_simulated_lru_access_for_access() {
    let sizes = [1, 2, 3, 5, 8, 13, 40, 100, 333, 1000, 4000];
    for (line, seed) in [(4096, 7), (512, 11), (16384, 13), (32768, 17)] {
        let text = trace(6000, 40_000, seed);
        let report = curves(&text, line, &[MrcMethod::Exact], &sizes);
        let simulated = lru_hits(&text, line, &sizes);
        for (point, (hits, accesses)) in report.curves[0].points.iter().zip(&simulated) {
            assert_eq!(report.line_accesses, *accesses);
            let curve_hits = ((1.0 - point.miss_ratio) * *accesses as f64).round() as u64;
            assert_eq!(
                curve_hits, *hits,
                "line {line} B, {} lines: the curve says {curve_hits} hits, LRU had {hits}",
                point.cache_lines
            );
        }
    }
}

#[test]
fn sampled_curves_stay_near_the_exact_one() {
    // A larger footprint, so that sampling has lines to sample.
    let text = trace(200_000, 4_000_000, 99);
    let sizes: Vec<u64> = (4..18).map(|p| 1u64 << p).collect();
    let report = curves(
        &text,
        4096,
        &[
            MrcMethod::Exact,
            MrcMethod::Shards { rate: 0.1, seed: 0 },
            MrcMethod::ShardsFixed { max_lines: 8192 },
        ],
        &sizes,
    );
    for curve in &report.curves[1..] {
        let error = curve.max_error_vs_exact.unwrap();
        assert!(error < 0.02, "{}: largest difference {error}", curve.method);
        assert!(curve.sampled_accesses < report.line_accesses);
    }
    let fixed = &report.curves[2];
    assert!(fixed.sampled_lines <= 8192 && fixed.final_rate < 1.0, "{fixed:?}");
    // A curve never rises with the cache size.
    for curve in &report.curves {
        assert!(curve
            .points
            .windows(2)
            .all(|w| w[1].miss_ratio <= w[0].miss_ratio + 1e-12));
    }
}

/// Belady's OPT: against a direct (quadratic) simulation of the same rule,
/// and never above LRU where every access covers its whole line.
#[test]
fn opt_is_belady_and_bounds_lru() {
    let text = trace(3000, 6000, 23);
    let sizes = [1, 4, 16, 64, 256];
    for line in [512u64, 4096] {
        let report = curves(&text, line, &[MrcMethod::Exact, MrcMethod::Opt], &sizes);
        let opt = &report.curves[1];
        assert_eq!(opt.method, "opt");
        // The line accesses, as the module splits them.
        let mut accesses: Vec<(iocache_core::LineKey, u64)> = Vec::new();
        let mut r = reader(&text);
        for record in r.by_ref() {
            let request = iocache_sim::request_of(&record.unwrap());
            for part in iocache_core::split_request(&request, LineSize::new(line).unwrap()) {
                let width = part.end_sector - part.first_sector;
                let mask = if width == 64 {
                    u64::MAX
                } else {
                    ((1u64 << width) - 1) << part.first_sector
                };
                accesses.push((part.key, mask));
            }
        }
        for (point, &capacity) in opt.points.iter().zip(&sizes) {
            let mut resident: Vec<(iocache_core::LineKey, u64)> = Vec::new();
            let mut hits = 0u64;
            for (i, &(key, mask)) in accesses.iter().enumerate() {
                let next_use = |k: iocache_core::LineKey| {
                    accesses[i + 1..]
                        .iter()
                        .position(|(x, _)| *x == k)
                        .unwrap_or(usize::MAX)
                };
                if let Some(entry) = resident.iter_mut().find(|(k, _)| *k == key) {
                    if entry.1 & mask == mask {
                        hits += 1;
                    }
                    entry.1 |= mask;
                    continue;
                }
                if resident.len() as u64 >= capacity {
                    let victim = (0..resident.len())
                        .max_by_key(|&j| (next_use(resident[j].0), resident[j].0))
                        .unwrap();
                    resident.swap_remove(victim);
                }
                resident.push((key, mask));
            }
            let curve_hits = ((1.0 - point.miss_ratio) * accesses.len() as f64).round() as u64;
            assert_eq!(curve_hits, hits, "line {line} B, {capacity} lines");
        }
        if line == 512 {
            for (o, e) in opt.points.iter().zip(&report.curves[0].points) {
                assert!(
                    o.miss_ratio <= e.miss_ratio + 1e-12,
                    "OPT above LRU at {} lines",
                    o.cache_lines
                );
            }
        }
    }
}

//! ASPLOS'23 (§5.3, Finding 3, Figs. 13-14) claims that once write bursts
//! fill an ultra-fast cache with dirty lines, lazy flushing (no flush
//! while busy; write misses go around a cache full of dirty lines) beats
//! aggressive flushing in IOPS at a high hit rate and in tail latency,
//! and makes no difference at a low hit rate. This reproduction runs the
//! paper's random 70/30 read/write workloads at about 10 % and 85 % hit
//! rate from an empty cache through the simulator's timing model (Optane
//! and NVMe cache presets over the SSD RAID-5 backend, closed loop) with
//! lazy flushing and aggressive flushing in batches of 128 and 1,024 lines,
//! then on every real trace at hand that writes.

use std::collections::BTreeMap;

use crate::error::Result;
use iocache_core::{CleaningPolicy, LineSize};
use iocache_report::{Scale, Ticks};
use iocache_sim::timing::TimingReport;
use iocache_sim::CacheSettings;

use super::asplos23::{lru_spec, simulate_each_device, BACKEND, DEVICES, OUTSTANDING};
use super::asplos23_real::{run_points, Point, FLUSHES, OUTSTANDING as TRACE_OUTSTANDING};
use super::verdict::{Check, Claim, Tally, Tolerance, Verdict};
use super::{axis, chart, one_phase_workload, series, Context, TraceInput};

/// The workloads: name, the hit rate the zones aim at (%), fio's zones.
const SETUPS: [(&str, u32, &str); 2] = [
    ("hit10", 10, "zoned:10/10:90/90"),
    ("hit85", 85, "zoned:85/10:15/90"),
];

type Key = (&'static str, u32, &'static str); // device, hit setup, flushing

pub fn run(ctx: &Context) -> Result<Verdict> {
    let mut verdict = Verdict::new(
        "asplos23-flush",
        "Rearchitecting I/O caches for emerging fast storage devices (ASPLOS'23), §5.3, Finding 3, Figs. 13-14",
    );
    let requests: u64 = if ctx.quick { 120_000 } else { 1_200_000 };
    let line_size = LineSize::new(4096)?;
    let mut specs = Vec::new();
    for (_, flush, bypass) in FLUSHES {
        let settings = CacheSettings {
            cleaning: flush.parse::<CleaningPolicy>()?,
            write_miss_bypass: bypass,
            ..CacheSettings::default()
        };
        specs.push(lru_spec(line_size, settings)?);
    }
    let mut results: BTreeMap<Key, TimingReport> = BTreeMap::new();
    let mut dirty_at_end: BTreeMap<Key, (u64, u64)> = BTreeMap::new();
    for (name, hit, zones) in SETUPS {
        let spec = one_phase_workload(31, name, requests, 70, zones)?;
        for (device, report) in simulate_each_device(ctx, &spec, &specs, requests, Some(100_000_000))? {
            for (run, (label, _, _)) in report.runs.into_iter().zip(FLUSHES) {
                dirty_at_end.insert(
                    (device, hit, label),
                    (run.dirty_lines_at_end, run.spec.capacity_lines),
                );
                if let Some(t) = run.timing {
                    results.insert((device, hit, label), t);
                }
            }
        }
    }
    verdict.setup.push(format!(
        "workloads: `iocache gen` random 70/30 read/write, 4 KiB, over 1 GiB, zoned for about 10 % and 85 % hits (zoned:10/10:90/90 and zoned:85/10:15/90), {requests} requests each from an empty cache, seed 31; IOPS and latency counted over the second half. The paper runs until the cache is fully dirty; here LRU evicts dirty lines (written back inline), so the cache holds dirty lines in the share its writes leave (listed below), not all of them"
    ));
    verdict.setup.push(format!(
        "iocache sim --trace W.csv --policy lru --cache-size 105MiB --cache-device optane|nvme --backend-device {BACKEND} --closed-loop {OUTSTANDING} --warmup 0.5 --series-interval 100ms with --flush lazy --write-miss-bypass (lazy: no flush while busy, write misses around a cache full of dirty lines), --flush aggressive:interval=10ms:batch=128 and batch=1024"
    ));
    let fills: Vec<String> = dirty_at_end
        .iter()
        .map(|((d, h, f), (dirty, lines))| format!("{d} {h} % {f}: {dirty} of {lines}"))
        .collect();
    verdict
        .setup
        .push(format!("dirty lines at the end: {}", fills.join("; ")));
    let get = |d: &'static str, h: u32, f: &'static str| results.get(&(d, h, f));
    let iops = |d, h, f| get(d, h, f).map_or(f64::NAN, |t| t.iops);

    // Fig. 13: at a low hit rate the flushing choice hardly matters.
    let mut within = Tally::default();
    let mut said = Vec::new();
    for d in DEVICES {
        for f in ["aggr-128", "aggr-1024"] {
            let ratio = iops(d, 10, "lazy") / iops(d, 10, f);
            within.count((ratio - 1.0).abs() <= 0.05);
            said.push(format!("{d} lazy/{f} {ratio:.3}"));
        }
    }
    verdict.push(Claim::new(
        "Fig. 13, Finding 3",
        "at a 10 % hit rate, once the cache is full of dirty lines, lazy and aggressive flushing give almost the same IOPS",
        format!(
            "lazy within 5 % of aggressive in {within} device x batch cases ({})",
            said.join(", ")
        ),
        within.most(),
    ));
    // Fig. 13: at 85 %, lazy 10 % above aggr-128 and 20 % above large batches.
    for (f, paper, what) in [
        ("aggr-128", 940.0 / 845.0, "10 % (940K vs 845K)"),
        ("aggr-1024", 1.25, "25 % (a 20 % loss)"),
    ] {
        for d in DEVICES {
            let ratio = iops(d, 85, "lazy") / iops(d, 85, f);
            verdict.push(Claim::new(
                "Fig. 13, Finding 3",
                format!("{d}: at an 85 % hit rate lazy flushing gives about {what} more IOPS than {f}"),
                format!(
                    "lazy / {f} IOPS = {ratio:.3} ({:.0}K vs {:.0}K)",
                    iops(d, 85, "lazy") / 1e3,
                    iops(d, 85, f) / 1e3
                ),
                Check::effect(paper, ratio, 1.0, 0.02, Tolerance::points(0.1)),
            ));
        }
    }
    // Fig. 14: tail latency, aggressive with large batches against lazy.
    for (h, kind, paper) in [(10, "write", 2.2), (85, "write", 3.3), (85, "read", 4.3)] {
        for d in DEVICES {
            let tail = |f| {
                get(d, h, f).map_or(f64::NAN, |t| match kind {
                    "read" => t.read.p9999_ns as f64,
                    _ => t.write.p9999_ns as f64,
                })
            };
            let ratio = tail("aggr-1024") / tail("lazy");
            verdict.push(Claim::new(
                "Fig. 14, Finding 3",
                format!("{d}, {h} % hit rate: aggressive flushing with large batches has up to {paper}x lazy's p99.99 {kind} latency"),
                format!(
                    "aggr-1024 / lazy p99.99 {kind} = {ratio:.2}x ({:.0} µs vs {:.0} µs)",
                    tail("aggr-1024") / 1e3,
                    tail("lazy") / 1e3
                ),
                Check::effect(paper, ratio, 1.0, 0.02, Tolerance::factor(3.0)),
            ));
        }
    }

    // Figures: IOPS over time (Fig. 13), and the tails (Fig. 14).
    for (_, h, _) in SETUPS {
        for d in DEVICES {
            let mut chart = chart(
                format!("Fig. 13: IOPS over time from an empty cache, {d}, {h} % hit rate"),
                axis("time (s, replay clock)", Scale::Linear, Ticks::Number),
                axis("IOPS", Scale::Linear, Ticks::Number),
            );
            for (f, _, _) in FLUSHES {
                let Some(t) = get(d, h, f) else { continue };
                let start = t.series.first().map_or(0, |r| r.start_ns);
                chart.series.push(series(
                    f,
                    t.series
                        .iter()
                        .map(|r| ((r.start_ns - start) as f64 / 1e9, r.iops))
                        .collect(),
                ));
            }
            ctx.figure(&mut verdict, &format!("asplos23-fig13-{d}-hit{h}"), &chart)?;
        }
    }
    for kind in ["read", "write"] {
        let mut chart = chart(
            format!("Fig. 14: {kind} tail latency by flushing (nines: 2 = p99, 4 = p99.99)"),
            axis("percentile (nines)", Scale::Linear, Ticks::Number),
            axis(&format!("{kind} latency"), Scale::Log, Ticks::Nanoseconds),
        );
        for (_, h, _) in SETUPS {
            for (f, _, _) in FLUSHES {
                let Some(t) = get("optane", h, f) else { continue };
                let l = if kind == "read" { &t.read } else { &t.write };
                chart.series.push(series(
                    format!("optane {h} % {f}"),
                    vec![
                        (2.0, l.p99_ns as f64),
                        (3.0, l.p999_ns as f64),
                        (4.0, l.p9999_ns as f64),
                    ],
                ));
            }
        }
        ctx.figure(&mut verdict, &format!("asplos23-fig14-{kind}"), &chart)?;
    }
    verdict.skipped.push(
        "the lock contention of aggressive flushing that the paper names as the cause (the timing model queues device work; it has no locks): what differs here is the flush's load on the devices".into(),
    );
    real_traces(ctx, &mut verdict)?;
    Ok(verdict)
}

/// A trace whose requests are under this share writes has too little to
/// flush for the flushing choice to matter: it is skipped.
const MIN_WRITE_SHARE: f64 = 0.01;
/// A trace is at a high hit rate (Fig. 13's 85 % case) when lazy
/// flushing's hit ratio on Optane is at least this, else at a low one
/// (the 10 % case).
const HIGH_HIT_RATIO: f64 = 0.5;
/// Below this relative difference two IOPS or latencies count as equal.
const MARGIN: f64 = 0.01;
/// A measured half shorter than this many of the aggressive flusher's
/// intervals sees it run once or twice at most.
const MIN_FLUSH_INTERVALS: u64 = 2;

/// Whether aggressive flushing had the chance to cost anything in a
/// measured half: it wrote lines back in the background during it, and
/// the half spans at least [`MIN_FLUSH_INTERVALS`] of its intervals.
/// Where it did not (a trace of a few milliseconds), "lazy and aggressive
/// give the same IOPS" holds for nothing, so such a case is not counted.
fn flusher_acted(background_write_backs: u64, span_ns: u64, interval_ns: u64) -> bool {
    background_write_backs > 0 && span_ns >= MIN_FLUSH_INTERVALS * interval_ns
}

/// The flush interval of the aggressive flushing named `flush` in
/// [`FLUSHES`] (none for lazy flushing).
fn aggressive_interval_ns(flush: &str) -> Option<u64> {
    let (_, policy, _) = FLUSHES.iter().find(|f| f.0 == flush)?;
    match policy.parse::<CleaningPolicy>().ok()? {
        CleaningPolicy::Aggressive { interval_ns, .. } => Some(interval_ns),
        _ => None,
    }
}

/// Figs. 13-14's comparisons on every real trace with writes, in
/// asplos23-real's setting (a tenth of the footprint, closed loop of 32,
/// always, 4 KiB lines): lazy against aggressive flushing in batches of
/// 128 and 1,024 on each cache device. Which of Fig. 13's claims a trace
/// checks depends on its hit ratio.
fn real_traces(ctx: &Context, verdict: &mut Verdict) -> Result<()> {
    let point = |f| Point::new("always", 4096, f);
    let points: Vec<Point> = FLUSHES.iter().map(|f| point(f.0)).collect();
    let traces = ctx.sample_traces(verdict, "Figs. 13-14 on a real trace");
    if traces.is_empty() {
        return Ok(());
    }
    verdict.setup.push(format!(
        "real traces, per trace T in ../shared/traces with writes ({:.0} % of its requests or more) and device: iocache sim --trace T --policy lru --cache-size (a tenth of T's footprint in 4 KiB lines, at least 1 MiB) --promotion always --line-size 4KiB --fill line --cache-device optane|nvme --backend-device {BACKEND} --closed-loop {TRACE_OUTSTANDING} --warmup 0.5 with --flush lazy --write-miss-bypass | aggressive:interval=10ms:batch=128|1024 (asplos23-real's setting; on Optane its numbers for these three configurations); a trace counts as at a high hit rate when lazy's hit ratio on Optane is {:.0} % or more; an effect under {:.0} % counts as none",
        MIN_WRITE_SHARE * 100.0,
        HIGH_HIT_RATIO * 100.0,
        MARGIN * 100.0
    ));
    let (mut low_within, mut high_above, mut tail_above) =
        (Tally::default(), Tally::default(), Tally::default());
    let (mut said_low, mut said_high, mut said_tail, mut measured, mut idle) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (name, path) in traces {
        let input = TraceInput::open(&path, None)?;
        let facts = &input.facts;
        if (facts.writes as f64) < MIN_WRITE_SHARE * facts.requests as f64 {
            verdict.skipped.push(format!(
                "Figs. 13-14 on {name}: {} writes in {} requests (under {:.0} %): nothing for the flushing to differ on",
                facts.writes,
                facts.requests,
                MIN_WRITE_SHARE * 100.0
            ));
            continue;
        }
        let runs: Vec<_> = DEVICES
            .iter()
            .map(|&d| Ok((d, run_points(ctx, &input, &points, d)?)))
            .collect::<Result<_>>()?;
        let high = runs[0].1.hit_ratio(point("lazy")) >= HIGH_HIT_RATIO;
        for (d, run) in &runs {
            let iops = |f| run.iops(point(f));
            let p9999_write = |f| run.timing(point(f)).map_or(f64::NAN, |t| t.write.p9999_ns as f64);
            for f in ["aggr-128", "aggr-1024"] {
                let ratio = iops("lazy") / iops(f);
                if high {
                    high_above.count(ratio > 1.0 + MARGIN);
                    said_high.push(format!("{name} {d} lazy/{f} {ratio:.3}"));
                    continue;
                }
                let (write_backs, span_ns) = run
                    .timing(point(f))
                    .map_or((0, 0), |t| (t.background_ops, t.span_ns));
                let interval_ns = aggressive_interval_ns(f).unwrap_or(u64::MAX);
                let case = format!(
                    "{name} {d} lazy/{f} {ratio:.3} ({write_backs} background write-backs in {:.1} ms)",
                    span_ns as f64 / 1e6
                );
                if flusher_acted(write_backs, span_ns, interval_ns) {
                    low_within.count((ratio - 1.0).abs() <= 0.05);
                    said_low.push(case);
                } else {
                    idle.push(case);
                }
            }
            let tail = p9999_write("aggr-1024") / p9999_write("lazy");
            tail_above.count(tail > 1.0 + MARGIN);
            said_tail.push(format!("{name} {d} {tail:.2}"));
            measured.push(format!(
                "{name} {d} ({} MiB cache, {} requests, {} writes): IOPS lazy {:.0}K, aggr-128 {:.0}K, aggr-1024 {:.0}K; hit ratio (lazy) {:.1} %; write p99.99 lazy {:.0} µs, aggr-1024 {:.0} µs",
                run.cache_bytes >> 20,
                facts.requests,
                facts.writes,
                iops("lazy") / 1e3,
                iops("aggr-128") / 1e3,
                iops("aggr-1024") / 1e3,
                run.hit_ratio(point("lazy")) * 100.0,
                p9999_write("lazy") / 1e3,
                p9999_write("aggr-1024") / 1e3
            ));
        }
    }
    let mut claim = |tally: Tally, claim: String, ours: String| {
        if tally.cases == 0 {
            verdict.skipped.push(format!(
                "on the real traces, \"{claim}\": no case to count in this class ({ours})"
            ));
        } else {
            verdict.push(Claim::new(
                "Fig. 13, Finding 3, on the real traces (not in the paper)",
                claim,
                ours,
                tally.most(),
            ));
        }
    };
    claim(
        low_within,
        format!(
            "on the real traces with writes at a low hit rate (lazy under {:.0} % hits), lazy and aggressive flushing give almost the same IOPS \
             (counted where aggressive flushing wrote lines back in the background during the measured half, over at least {MIN_FLUSH_INTERVALS} of its flush intervals)",
            HIGH_HIT_RATIO * 100.0
        ),
        format!(
            "lazy within 5 % of aggressive in {low_within} trace x device x batch cases ({}); left out, the flusher hardly running in the measured half: {}",
            said_low.join(", "),
            if idle.is_empty() { "none".to_string() } else { idle.join(", ") }
        ),
    );
    claim(
        high_above,
        format!(
            "on the real traces with writes at a high hit rate (lazy at {:.0} % hits or more), lazy flushing gives more IOPS than aggressive flushing",
            HIGH_HIT_RATIO * 100.0
        ),
        format!(
            "lazy above aggressive by more than 1 % in {high_above} trace x device x batch cases ({})",
            said_high.join(", ")
        ),
    );
    if tail_above.cases > 0 {
        verdict.push(Claim::new(
            "Fig. 14, Finding 3, on the real traces (not in the paper)",
            "on the real traces with writes, aggressive flushing with large batches has a higher p99.99 write latency than lazy flushing",
            format!(
                "aggr-1024 above lazy by more than 1 % in {tail_above} trace x device cases; aggr-1024 / lazy p99.99 write: {}",
                said_tail.join(", ")
            ),
            tail_above.most(),
        ));
        verdict
            .setup
            .push(format!("measured on the real traces: {}", measured.join("; ")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A measured half in which the aggressive flusher wrote nothing back,
    /// or ran at most once or twice, is not a case of "the same IOPS".
    #[test]
    fn a_flusher_that_hardly_ran_is_not_a_case() {
        let interval = aggressive_interval_ns("aggr-128").unwrap();
        assert_eq!(interval, 10_000_000);
        assert_eq!(aggressive_interval_ns("lazy"), None);
        assert!(!flusher_acted(0, 100 * interval, interval));
        assert!(!flusher_acted(500, interval + interval / 5, interval));
        assert!(flusher_acted(500, 3 * interval, interval));
    }
}

//! The LBICA reproduction (DATE'19, "LBICA: a load
//! balancer for I/O cache architectures", §IV, Figs. 4, 5 and 7). The
//! paper claims that under bursts a write-back cache becomes the
//! bottleneck while the disks idle, and that LBICA (a write policy chosen
//! per burst from the cache queue's mix) lowers the cache's load and the
//! mean latency against WB and against SIB (selective bypass over a WT
//! cache). This runs the burst workloads of docs/results/lbica.md
//! (`iocache_sim::burst`, the same phases, devices and cache as
//! scripts/lbica-experiments.sh) through the simulator's timing model with
//! `--adapt observe` (WB), `sib` over WT and WO, and `lbica`, and compares
//! latency and the per-interval queue times (the paper's Eq. 1 load) of
//! cache and backend during the bursts; then the same on every real trace
//! at hand that has timestamps, replayed at its own times.

use std::collections::BTreeMap;

use crate::error::{invalid, Result, Within};
use iocache_core::{LineSize, PolicySpec};
use iocache_report::{Chart, Scale, Ticks};
use iocache_sim::burst::{BurstSpec, Phase};
use iocache_sim::timing::{parse_device, ArrivalMode, TimingReport};
use iocache_sim::{AdaptReport, AdaptRow, CacheSettings, CacheSize, RunSpec, SimOptions, TimingSetup};
use iocache_trace::{ReaderOptions, TraceFormat, TraceReader};

use super::verdict::{Check, Claim, Tally, Tolerance, Verdict};
use super::{axis, chart, mean, series, Context, TraceInput};

/// The burst workloads (docs/results/lbica.md): name, what, the burst phase.
const WORKLOADS: [(&str, &str, &str); 4] = [
    ("rr", "random read", "1s@25000:read=0.95:hot=0.7"),
    ("mx", "mixed read/write", "1s@25000:read=0.5:hot=0.95"),
    ("wi", "write-intensive", "1s@20000:read=0.1:hot=0.3"),
    ("hh", "read hits", "1s@25000:read=0.98:hot=0.995"),
];
/// Between bursts: 2 s at 1,000 requests/s.
const QUIET: &str = "2s@1000:read=0.7:hot=0.9";
/// Configurations: label, write policy, controller.
const CONFIGS: [(&str, &str, &str); 4] = [
    ("WB", "wb", "observe"),
    ("SIB over WT", "wt", "sib"),
    ("SIB over WO", "wo", "sib"),
    ("LBICA", "wb", "lbica"),
];
const CACHE_DEVICE: &str = "ssd";
const BACKEND_DEVICE: &str = "hdd:servers=128:read-kib=67:write-kib=67";
const CACHE_LINES: u64 = 32_768;
const INTERVAL_NS: u64 = 100_000_000;
/// An interval is part of a burst when its arrivals exceed this rate (the
/// quiet phases run at 1,000/s, the bursts at 20,000-25,000/s).
const BURST_ARRIVALS_PER_S: f64 = 5_000.0;

/// A device pair and arrival process the workloads run in: the main one
/// (`key` empty: `lab reproduce lbica`), then those of `lab reproduce
/// lbica-setting`: the 128 disks with bounded clients, and the paper's own
/// pair (one SSD over one 7.2K disk, §IV-A) open loop and with them.
struct Setting {
    key: &'static str,
    label: &'static str,
    backend: &'static str,
    /// At most this many requests outstanding (`ArrivalMode::Clients`),
    /// else open loop at trace time.
    clients: Option<u32>,
}

impl Setting {
    fn arrivals(&self) -> ArrivalMode {
        match self.clients {
            Some(outstanding) => ArrivalMode::Clients {
                speed: 1.0,
                outstanding,
            },
            None => ArrivalMode::Open { speed: 1.0 },
        }
    }
}

/// Requests a setting with bounded clients keeps outstanding (as many as
/// the live runs of docs/results/lbica.md keep in flight).
const CLIENTS: u32 = 32;

const SETTINGS: [Setting; 4] = [
    Setting {
        key: "",
        label: "SSD over 128 disks",
        backend: BACKEND_DEVICE,
        clients: None,
    },
    Setting {
        key: "128-disks-clients",
        label: "SSD over 128 disks, 32 clients",
        backend: BACKEND_DEVICE,
        clients: Some(CLIENTS),
    },
    Setting {
        key: "one-disk",
        label: "one SSD over one disk",
        backend: "hdd",
        clients: None,
    },
    Setting {
        key: "one-disk-clients",
        label: "one SSD over one disk, 32 clients",
        backend: "hdd",
        clients: Some(CLIENTS),
    },
];

/// One run's numbers.
struct Outcome {
    timing: TimingReport,
    adapt: AdaptReport,
}

/// The intervals during bursts (after the warm-up): more than
/// [`BURST_ARRIVALS_PER_S`] arrivals per second.
fn burst_rows(rows: &[AdaptRow]) -> impl Iterator<Item = &AdaptRow> {
    rows.iter().filter(|r| {
        let seconds = (r.end_ns.saturating_sub(r.start_ns)) as f64 / 1e9;
        seconds > 0.0 && r.arrivals as f64 / seconds > BURST_ARRIVALS_PER_S
    })
}

/// Mean over burst intervals of the largest cache and backend queue
/// times (Eq. 1), in ns.
fn burst_load(rows: &[AdaptRow]) -> (f64, f64) {
    let rows: Vec<_> = burst_rows(rows).collect();
    (
        mean(&rows.iter().map(|r| r.max_cache_queue_time_ns).collect::<Vec<_>>()),
        mean(
            &rows
                .iter()
                .map(|r| r.max_backend_queue_time_ns)
                .collect::<Vec<_>>(),
        ),
    )
}

fn burst_spec(burst: &str, repeat: u32) -> Result<BurstSpec> {
    Ok(BurstSpec {
        phases: vec![QUIET.parse::<Phase>()?, burst.parse::<Phase>()?],
        repeat,
        hot_lines: 16_384,
        cold_lines: 1 << 22,
        line_bytes: 4096,
        warm_lines_per_request: 64,
        warm_gap_ns: 2_000_000,
        seed: 1,
    })
}

/// Reduction of `ours` against `base`, in percent (positive: lower).
fn reduction(ours: f64, base: f64) -> f64 {
    if base > 0.0 {
        (1.0 - ours / base) * 100.0
    } else {
        f64::NAN
    }
}

/// One configuration's run in `setting`: LRU over `cache_lines` 4 KiB
/// lines with `write_policy`, under `controller`, on the setting's devices
/// with a series every interval, the first `warmup_requests` warming.
fn lbica_run(
    setting: &Setting,
    write_policy: &str,
    controller: &str,
    cache_lines: u64,
    warmup_requests: u64,
) -> Result<(RunSpec, SimOptions)> {
    let run = RunSpec {
        policy: PolicySpec::lru(),
        size: CacheSize::Lines(cache_lines),
        capacity_lines: cache_lines,
        line_size: LineSize::new(4096)?,
        settings: CacheSettings {
            write_policy: write_policy.parse()?,
            ..CacheSettings::default()
        },
    };
    let options = SimOptions {
        warmup_requests,
        timing: Some(TimingSetup {
            cache: parse_device(CACHE_DEVICE)?,
            backend: parse_device(setting.backend)?,
            arrivals: setting.arrivals(),
            series_interval_ns: Some(INTERVAL_NS),
        }),
        adapt: Some(controller.parse()?),
        ..SimOptions::default()
    };
    Ok((run, options))
}

/// Runs every workload under every configuration in one setting.
fn run_setting(
    ctx: &Context,
    setting: &Setting,
    repeat: u32,
) -> Result<BTreeMap<(&'static str, &'static str), Outcome>> {
    let mut results = BTreeMap::new();
    for (name, _, burst) in WORKLOADS {
        let spec = burst_spec(burst, repeat)?;
        let mut trace = Vec::new();
        spec.write_disksim(&mut trace)?;
        for (label, write_policy, controller) in CONFIGS {
            let (run, options) = lbica_run(
                setting,
                write_policy,
                controller,
                CACHE_LINES,
                spec.warm_requests(),
            )?;
            let mut reader = TraceReader::from_reader(
                &format!("burst:{name}"),
                Box::new(std::io::Cursor::new(trace.clone())),
                Some(TraceFormat::Disksim),
                ReaderOptions::default(),
            )?;
            let report = ctx.simulate(&mut reader, &[run], options)?;
            let run = report.runs.into_iter().next().expect("one run");
            let (Some(timing), Some(adapt)) = (run.timing, run.adapt) else {
                return Err(invalid!(
                    "{name} {label}: the run has no timing or controller report"
                ));
            };
            results.insert((name, label), Outcome { timing, adapt });
        }
    }
    Ok(results)
}

pub fn run(ctx: &Context) -> Result<Verdict> {
    let mut verdict = Verdict::new(
        "lbica",
        "LBICA: a load balancer for I/O cache architectures (DATE'19), §IV, Figs. 4, 5 and 7",
    );
    let repeat = describe(ctx, &mut verdict);
    let setting = &SETTINGS[0];
    let results = run_setting(ctx, setting, repeat)?;
    claims(&mut verdict, setting, &results);
    figures(ctx, &mut verdict, &results)?;
    measured(&mut verdict, setting, &results);
    real_traces(ctx, &mut verdict, setting, None)?;
    Ok(verdict)
}

/// The same workloads and claims in the paper's own setting (§IV-A: one
/// SSD over one 7.2K disk), open loop and with bounded clients, and over
/// the 128 disks with bounded clients.
pub fn run_settings(ctx: &Context) -> Result<Verdict> {
    let mut verdict = Verdict::new(
        "lbica-setting",
        "LBICA (DATE'19), §IV, Figs. 4, 5 and 7, over one SSD and one disk and with bounded clients",
    );
    let repeat = describe(ctx, &mut verdict);
    for setting in &SETTINGS[1..] {
        let results = run_setting(ctx, setting, repeat)?;
        verdict.setup.push(format!(
            "{}: as above with --backend-device {}{}",
            setting.label,
            setting.backend,
            setting.clients.map_or(String::new(), |n| format!(
                " --clients {n} (trace times, at most {n} requests outstanding)"
            ))
        ));
        claims(&mut verdict, setting, &results);
        fig7(ctx, &mut verdict, setting, &results)?;
        measured(&mut verdict, setting, &results);
    }
    for setting in &SETTINGS[1..] {
        real_traces(ctx, &mut verdict, setting, Some(SETTING_TRACE_CAP))?;
    }
    Ok(verdict)
}

/// Runs `config` (a row of [`CONFIGS`]) over a real trace at its own
/// times in `setting`, with a cache of `cache_lines`, the first half
/// warming the cache.
fn run_trace(
    ctx: &Context,
    input: &TraceInput,
    setting: &Setting,
    config: (&str, &str, &str),
    cache_lines: u64,
) -> Result<Outcome> {
    let (label, write_policy, controller) = config;
    let (run, options) = lbica_run(
        setting,
        write_policy,
        controller,
        cache_lines,
        input.facts.requests / 2,
    )?;
    let report = ctx
        .simulate(&mut input.reader()?, &[run], options)
        .at_file(&input.path)?;
    let run = report.runs.into_iter().next().expect("one run");
    match (run.timing, run.adapt) {
        (Some(timing), Some(adapt)) => Ok(Outcome { timing, adapt }),
        _ => Err(invalid!(
            "{} {label}: the run has no timing or controller report",
            input.path.display()
        )),
    }
}

/// A real trace's burst intervals, by their start: those from
/// `measured_from_ns` (the end of the warm-up) in which WB's largest cache queue time exceeds the backend's,
/// the paper's own test for a burst interval (§III-A, §IV-B: the cache
/// queue's time above the disks').
fn trace_bursts(wb_rows: &[AdaptRow], measured_from_ns: u64) -> Vec<u64> {
    wb_rows
        .iter()
        .filter(|r| r.start_ns >= measured_from_ns && r.max_cache_queue_time_ns > r.max_backend_queue_time_ns)
        .map(|r| r.start_ns)
        .collect()
}

/// Mean over the intervals starting at `starts` (ascending) of a run's
/// largest cache and backend queue times (Eq. 1), in ns.
fn load_at(rows: &[AdaptRow], starts: &[u64]) -> (f64, f64) {
    let rows: Vec<&AdaptRow> = rows
        .iter()
        .filter(|r| starts.binary_search(&r.start_ns).is_ok())
        .collect();
    (
        mean(&rows.iter().map(|r| r.max_cache_queue_time_ns).collect::<Vec<_>>()),
        mean(
            &rows
                .iter()
                .map(|r| r.max_backend_queue_time_ns)
                .collect::<Vec<_>>(),
        ),
    )
}

/// The requests of each real trace lbica-setting replays: one disk left
/// alone falls far behind the longer samples, and the timing model's cost
/// grows with its queue.
const SETTING_TRACE_CAP: u64 = 20_000;

/// Below this relative difference two loads or latencies count as equal.
const MARGIN: f64 = 0.01;

/// `ours` is below every one of `others` by more than [`MARGIN`]: the
/// lowest, a gap of less being a tie.
fn lowest_by_margin(ours: f64, others: &[f64]) -> bool {
    others.iter().all(|&o| ours < o * (1.0 - MARGIN))
}

/// Figs. 4, 5 and 7's comparisons on every real trace with timestamps,
/// replayed at its own times in `setting`: the cache's load in the burst
/// intervals against WB and SIB over WT, and the mean latency.
fn real_traces(ctx: &Context, verdict: &mut Verdict, setting: &Setting, cap: Option<u64>) -> Result<()> {
    let traces = ctx.sample_traces(verdict, &format!("real traces ({})", setting.label));
    if traces.is_empty() {
        return Ok(());
    }
    verdict.setup.push(format!(
        "real traces ({}): per trace T in ../shared/traces with timestamps{}: iocache sim --trace T --cache-size (a tenth of T's footprint in 4 KiB lines) --warmup 0.5 --cache-device {CACHE_DEVICE} --backend-device {}{} --series-interval 100ms with the four configurations above; burst intervals: those after the warm-up in which WB's largest cache queue time exceeds the backend's (the paper's test), each configuration's load the mean over the same intervals; an effect under {:.0} % counts as none",
        setting.label,
        cap.map_or(String::new(), |n| format!(" (its first {n} requests)")),
        setting.backend,
        setting.clients.map_or(String::new(), |n| format!(" --clients {n}")),
        MARGIN * 100.0
    ));
    let said = |text: &str| {
        if setting.key.is_empty() {
            text.to_string()
        } else {
            format!("{text} [here: {}]", setting.label)
        }
    };
    let (mut cut_wb, mut cut_sib, mut lowest) = (Tally::default(), Tally::default(), Tally::default());
    let (mut said_wb, mut said_sib, mut said_lat, mut measured) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut untimed, mut calm) = (Vec::new(), Vec::new());
    for (name, path) in traces {
        let input = TraceInput::open(&path, cap)?;
        let facts = &input.facts;
        if !facts.timestamps {
            untimed.push(format!("{name} ({} format)", facts.format));
            continue;
        }
        let cache_lines = (facts.footprint_lines / 10).max(256);
        let mut outcomes = BTreeMap::new();
        for config in CONFIGS {
            outcomes.insert(config.0, run_trace(ctx, &input, setting, config, cache_lines)?);
        }
        let wb = &outcomes["WB"];
        let bursts = trace_bursts(&wb.adapt.rows, wb.timing.start_ns);
        let loads: BTreeMap<&str, (f64, f64)> = outcomes
            .iter()
            .map(|(&c, o)| (c, load_at(&o.adapt.rows, &bursts)))
            .collect();
        let lat = |c: &str| outcomes[c].timing.all.mean_ns;
        measured.push(format!(
            "{name} ({}, {cache_lines} lines, {} burst intervals of {}): {}",
            input.describe(),
            bursts.len(),
            outcomes["WB"].adapt.rows.len(),
            CONFIGS
                .iter()
                .map(|&(c, _, _)| format!(
                    "{c} mean {:.2} ms, burst load cache {:.2} ms / backend {:.2} ms, {} bypassed",
                    lat(c) / 1e6,
                    loads[c].0 / 1e6,
                    loads[c].1 / 1e6,
                    outcomes[c].adapt.bypassed
                ))
                .collect::<Vec<_>>()
                .join(", ")
        ));
        if bursts.is_empty() {
            calm.push(name);
            continue;
        }
        let (wb, sib, lbica) = (loads["WB"], loads["SIB over WT"], loads["LBICA"]);
        cut_wb.count(lbica.0 < wb.0 * (1.0 - MARGIN));
        cut_sib.count(lbica.0 < sib.0 * (1.0 - MARGIN));
        lowest.count(lowest_by_margin(lat("LBICA"), &[lat("WB"), lat("SIB over WT")]));
        said_wb.push(format!(
            "{name} {:.1} % ({} burst intervals, {} requests bypassed)",
            reduction(lbica.0, wb.0),
            bursts.len(),
            outcomes["LBICA"].adapt.bypassed
        ));
        said_sib.push(format!(
            "{name} {:.1} % (backend load LBICA {:.2} ms, SIB {:.2} ms)",
            reduction(lbica.0, sib.0),
            lbica.1 / 1e6,
            sib.1 / 1e6
        ));
        said_lat.push(format!(
            "{name} {:.2} / {:.2} / {:.2} ms",
            lat("LBICA") / 1e6,
            lat("WB") / 1e6,
            lat("SIB over WT") / 1e6
        ));
    }
    if !untimed.is_empty() {
        verdict.skipped.push(format!(
            "LBICA on the real traces ({}): {} without timestamps, so no bursts to replay",
            setting.label,
            untimed.join(", ")
        ));
    }
    if !calm.is_empty() {
        verdict.skipped.push(format!(
            "LBICA's claims on the real traces ({}): no burst interval (WB's cache queue time never above the backend's after the warm-up) on {}; their numbers are in the setup",
            setting.label,
            calm.join(", ")
        ));
    }
    if !measured.is_empty() {
        verdict.setup.push(format!(
            "measured on the real traces ({}): {}",
            setting.label,
            measured.join("; ")
        ));
    }
    if lowest.cases == 0 {
        return Ok(());
    }
    for (tally, source, text, ours) in [
        (
            cut_wb,
            "§IV-C, on the real traces (not in the paper)",
            "LBICA lowers the I/O cache's load in the burst intervals against WB on the real traces at hand",
            format!(
                "cut of the burst intervals' mean largest cache queue time against WB: {}",
                said_wb.join(", ")
            ),
        ),
        (
            cut_sib,
            "Figs. 4-5, on the real traces (not in the paper)",
            "LBICA lowers the I/O cache's load in the burst intervals against SIB on the real traces at hand",
            format!("the same against SIB over WT: {}", said_sib.join(", ")),
        ),
        (
            lowest,
            "Fig. 7, on the real traces (not in the paper)",
            "LBICA has the lowest mean latency of WB, SIB and LBICA on the real traces at hand",
            format!("mean latency LBICA / WB / SIB over WT: {}", said_lat.join(", ")),
        ),
    ] {
        verdict.push(Claim::new(
            source,
            said(text),
            format!("holds, by more than 1 %, on {tally} traces with burst intervals; {ours}"),
            tally.most(),
        ));
    }
    Ok(())
}

/// The workloads and the command, in the verdict's setup; returns how many
/// times the burst cycle repeats.
fn describe(ctx: &Context, verdict: &mut Verdict) -> u32 {
    let repeat = if ctx.quick { 2 } else { 5 };
    verdict.setup.push(format!(
        "workloads (`iocache_sim::burst`, seed 1, as scripts/lbica-experiments.sh): a 64 MiB hot set read once (warm-up), then {repeat} times 2 s at 1,000 requests/s (70 % reads, 90 % hot) and a 1 s burst: {}; 4 KiB requests, Poisson arrivals, 16 GiB cold range",
        WORKLOADS
            .iter()
            .map(|(n, what, b)| format!("{n} ({what}: {b})"))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    verdict.setup.push(format!(
        "iocache sim --trace W.disksim --cache-size {CACHE_LINES} --warmup 256 --cache-device {CACHE_DEVICE} --backend-device {BACKEND_DEVICE} --series-interval 100ms, with --write-policy wb --adapt observe (WB), --write-policy wt|wo --adapt sib (SIB), --write-policy wb --adapt lbica (LBICA); burst intervals are those with more than {BURST_ARRIVALS_PER_S:.0} arrivals/s; load = the interval's largest queue time Q x L (Eq. 1)"
    ));
    repeat
}

/// The paper's claims, checked on one setting's runs.
fn claims(
    verdict: &mut Verdict,
    setting: &Setting,
    results: &BTreeMap<(&'static str, &'static str), Outcome>,
) {
    let get = |w: &'static str, c: &'static str| -> &Outcome { &results[&(w, c)] };
    let lat = |w: &'static str, c: &'static str| get(w, c).timing.all.mean_ns;
    // The main setting's claims read as before; the others name theirs.
    let said = |text: &str| {
        if setting.key.is_empty() {
            text.to_string()
        } else {
            format!("{text} [here: {}]", setting.label)
        }
    };

    // Figs. 4-5 / §IV-B observation 1: WB's cache is the bottleneck in bursts.
    let mut cache_bound = Tally::default();
    for (w, _, _) in WORKLOADS {
        for row in burst_rows(&get(w, "WB").adapt.rows) {
            cache_bound.count(row.max_cache_queue_time_ns > row.max_backend_queue_time_ns);
        }
    }
    verdict.push(Claim::new(
        "Figs. 4-5, §IV-B",
        said("a WB cache is the bottleneck in the burst intervals: its queue time exceeds the disks' (the paper: in all intervals)"),
        format!("WB's largest cache queue time above the backend's in {cache_bound} burst intervals (all four workloads)"),
        cache_bound.most(),
    ));

    // Cache load (Eq. 1 queue time during bursts) against WB and SIB.
    // Workloads without a burst interval in either run (a replay that
    // never reaches the burst rate) have no load to compare: left out.
    let load_cut = |base: &'static str| -> Vec<(String, Option<f64>)> {
        WORKLOADS
            .iter()
            .map(|&(w, _, _)| {
                let (ours, theirs) = (&get(w, "LBICA").adapt.rows, &get(w, base).adapt.rows);
                let cut = (burst_rows(ours).next().is_some() && burst_rows(theirs).next().is_some())
                    .then(|| reduction(burst_load(ours).0, burst_load(theirs).0))
                    .filter(|c| c.is_finite());
                (w.to_string(), cut)
            })
            .collect()
    };
    for (base, paper, source, text) in [
        (
            "WB",
            48.0,
            "§IV-C",
            "LBICA reduces the I/O cache's load in bursts by 48 % on average against WB (up to 70 %)",
        ),
        (
            "SIB over WT",
            30.0,
            "Figs. 4-5, §IV-B",
            "LBICA reduces the I/O cache's load by 30 % on average against SIB",
        ),
    ] {
        let cuts = load_cut(base);
        let found: Vec<f64> = cuts.iter().filter_map(|c| c.1).collect();
        let avg = if found.is_empty() { f64::NAN } else { mean(&found) };
        verdict.push(Claim::new(
            source,
            said(text),
            format!(
                "mean cut of the burst intervals' largest cache queue time against {base}: {avg:.1} % ({})",
                cuts.iter()
                    .map(|(w, c)| match c {
                        Some(c) => format!("{w} {c:.1} %"),
                        None =>
                            format!("{w} none (no burst interval, or no cache queue in them under {base})"),
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Check::effect(paper, avg, 0.0, 1.0, Tolerance::either(2.0, 15.0)),
        ));
    }

    // Fig. 7: mean latency, LBICA against WB (14 % on average, up to 22 %)
    // and SIB (7 %, up to 11.7 %).
    for (base, paper_avg, paper_max) in [("WB", 14.0, 22.0), ("SIB over WT", 7.0, 11.7)] {
        let cuts: Vec<(&str, f64)> = WORKLOADS
            .iter()
            .map(|&(w, _, _)| (w, reduction(lat(w, "LBICA"), lat(w, base))))
            .collect();
        let avg = mean(&cuts.iter().map(|c| c.1).collect::<Vec<_>>());
        let detail = cuts
            .iter()
            .map(|(w, c)| {
                format!(
                    "{w} {c:.1} % ({:.1} vs {:.1} ms)",
                    lat(w, "LBICA") / 1e6,
                    lat(w, base) / 1e6
                )
            })
            .collect::<Vec<_>>()
            .join(", ");
        verdict.push(Claim::new(
            "Fig. 7, §IV-D",
            said(&format!("LBICA lowers the mean latency against {base} by {paper_avg} % on average (up to {paper_max} %)")),
            format!("mean cut {avg:.1} %: {detail}"),
            Check::effect(paper_avg, avg, 0.0, 1.0, Tolerance::either(2.0, 10.0)),
        ));
    }
    let mut lowest = Tally::default();
    for (w, _, _) in WORKLOADS {
        lowest.count(lowest_by_margin(
            lat(w, "LBICA"),
            &[lat(w, "WB"), lat(w, "SIB over WT")],
        ));
    }
    verdict.push(Claim::new(
        "Fig. 7",
        said("LBICA has the lowest mean latency of WB, SIB and LBICA on every burst workload"),
        format!("LBICA below both WB and SIB over WT by more than {:.0} % in {lowest} workloads (SIB over WO, which the paper also names, is in the table and figures)", MARGIN * 100.0),
        lowest.most(),
    ));
}

/// The Fig. 7 chart: one series per configuration, the mean latency of each
/// burst workload (numbered 1 to 4).
fn fig7_chart(title: String, results: &BTreeMap<(&'static str, &'static str), Outcome>) -> Chart {
    let mut fig7 = chart(
        title,
        axis("workload", Scale::Linear, Ticks::Number),
        axis("mean latency", Scale::Log, Ticks::Nanoseconds),
    );
    for (label, _, _) in CONFIGS {
        fig7.series.push(series(
            label,
            WORKLOADS
                .iter()
                .enumerate()
                .map(|(i, &(w, _, _))| ((i + 1) as f64, results[&(w, label)].timing.all.mean_ns))
                .collect(),
        ));
    }
    fig7
}

/// Fig. 7 (mean latency per workload) of a setting other than the main one.
fn fig7(
    ctx: &Context,
    verdict: &mut Verdict,
    setting: &Setting,
    results: &BTreeMap<(&'static str, &'static str), Outcome>,
) -> Result<()> {
    let fig7 = fig7_chart(
        format!(
            "Fig. 7, {}: mean latency per burst workload (1 rr, 2 mx, 3 wi, 4 hh)",
            setting.label
        ),
        results,
    );
    ctx.figure(verdict, &format!("lbica-fig7-latency-{}", setting.key), &fig7)
}

/// The figures of the main setting: Figs. 7, 4-5 and the latency over time.
fn figures(
    ctx: &Context,
    verdict: &mut Verdict,
    results: &BTreeMap<(&'static str, &'static str), Outcome>,
) -> Result<()> {
    let get = |w: &'static str, c: &'static str| -> &Outcome { &results[&(w, c)] };
    // Figures: Fig. 7 (mean latency per workload), Figs. 4-5 (queue times
    // over time) and the mean latency over time, per workload.
    let fig7 = fig7_chart(
        "Fig. 7: mean latency per burst workload (1 rr, 2 mx, 3 wi, 4 hh)".into(),
        results,
    );
    ctx.figure(verdict, "lbica-fig7-latency", &fig7)?;
    for (w, what, _) in WORKLOADS {
        let mut load = chart(
            format!("Figs. 4-5: largest queue time per 100 ms, {w} ({what})"),
            axis("time (s)", Scale::Linear, Ticks::Number),
            axis("largest queue time Q x L (ms)", Scale::Linear, Ticks::Number),
        );
        for label in ["WB", "SIB over WT", "LBICA"] {
            let rows = &get(w, label).adapt.rows;
            for (device, pick) in [
                (
                    "cache",
                    (|r: &AdaptRow| r.max_cache_queue_time_ns) as fn(&AdaptRow) -> f64,
                ),
                ("backend", |r: &AdaptRow| r.max_backend_queue_time_ns),
            ] {
                load.series.push(series(
                    format!("{label} {device}"),
                    rows.iter()
                        .map(|r| (r.start_ns as f64 / 1e9, pick(r) / 1e6))
                        .collect(),
                ));
            }
        }
        ctx.figure(verdict, &format!("lbica-fig4-5-load-{w}"), &load)?;
        let mut latency = chart(
            format!("Mean latency of the requests completed per 100 ms, {w} ({what})"),
            axis("time (s)", Scale::Linear, Ticks::Number),
            axis("mean latency", Scale::Log, Ticks::Nanoseconds),
        );
        for (label, _, _) in CONFIGS {
            latency.series.push(series(
                label,
                get(w, label)
                    .timing
                    .series
                    .iter()
                    .filter(|r| r.reads + r.writes > 0)
                    .map(|r| {
                        let n = (r.reads + r.writes) as f64;
                        (
                            r.start_ns as f64 / 1e9,
                            (r.read_mean_ns * r.reads as f64 + r.write_mean_ns * r.writes as f64) / n,
                        )
                    })
                    .filter(|p| p.1 > 0.0)
                    .collect(),
            ));
        }
        ctx.figure(verdict, &format!("lbica-latency-{w}"), &latency)?;
    }
    Ok(())
}

/// Every run's numbers of one setting, for the record.
fn measured(
    verdict: &mut Verdict,
    setting: &Setting,
    results: &BTreeMap<(&'static str, &'static str), Outcome>,
) {
    let table: Vec<String> = WORKLOADS
        .iter()
        .flat_map(|&(w, _, _)| {
            CONFIGS.iter().map(move |&(c, _, _)| (w, c))
        })
        .map(|(w, c)| {
            let o = &results[&(w, c)];
            let (tc, tb) = burst_load(&o.adapt.rows);
            format!(
                "{w} {c}: mean {:.1} ms, p99 {:.1} ms, burst load cache {:.1} ms / backend {:.1} ms, {} switches, {} bypassed",
                o.timing.all.mean_ns / 1e6,
                o.timing.all.p99_ns as f64 / 1e6,
                tc / 1e6,
                tb / 1e6,
                o.adapt.switches,
                o.adapt.bypassed
            )
        })
        .collect();
    if setting.key.is_empty() {
        verdict.setup.push(format!("measured: {}", table.join("; ")));
    } else {
        verdict
            .setup
            .push(format!("measured ({}): {}", setting.label, table.join("; ")));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A gap under 1 % is a tie, not the lowest latency.
    #[test]
    fn the_lowest_latency_needs_the_margin() {
        assert!(!lowest_by_margin(99.5, &[100.0, 200.0]));
        assert!(!lowest_by_margin(100.0, &[100.0]));
        assert!(lowest_by_margin(98.0, &[100.0, 200.0]));
    }

    #[test]
    fn reductions_are_percent_lower_than_the_base() {
        assert!((reduction(70.0, 100.0) - 30.0).abs() < 1e-9);
        assert!(reduction(120.0, 100.0) < 0.0);
        assert!(reduction(1.0, 0.0).is_nan());
    }

    /// On a real trace the burst intervals are WB's, after the warm-up,
    /// where its cache queue time exceeds the backend's; every run's load
    /// is averaged over those same intervals.
    #[test]
    fn a_real_trace_s_bursts_are_where_wb_s_cache_queues_longer() {
        let row = |start_ms: u64, cache_ms: f64, backend_ms: f64| AdaptRow {
            start_ns: start_ms * 1_000_000,
            end_ns: (start_ms + 100) * 1_000_000,
            max_cache_queue_time_ns: cache_ms * 1e6,
            max_backend_queue_time_ns: backend_ms * 1e6,
            ..AdaptRow::default()
        };
        // Warm-up ends at 100 ms: the first interval is not counted.
        let wb = [
            row(0, 9.0, 1.0),
            row(100, 5.0, 1.0),
            row(200, 1.0, 2.0),
            row(300, 4.0, 3.0),
        ];
        let bursts = trace_bursts(&wb, 100_000_000);
        assert_eq!(bursts, [100_000_000, 300_000_000]);
        assert_eq!(load_at(&wb, &bursts), (4.5e6, 2e6));
        let other = [
            row(0, 1.0, 1.0),
            row(100, 2.0, 4.0),
            row(200, 8.0, 8.0),
            row(300, 1.0, 2.0),
        ];
        assert_eq!(load_at(&other, &bursts), (1.5e6, 3e6));
        assert_eq!(load_at(&other, &[]), (0.0, 0.0));
    }

    #[test]
    fn burst_intervals_are_picked_by_their_arrival_rate() {
        let row = |arrivals, cache_ms: f64, backend_ms: f64| AdaptRow {
            start_ns: 0,
            end_ns: INTERVAL_NS,
            arrivals,
            max_cache_queue_time_ns: cache_ms * 1e6,
            max_backend_queue_time_ns: backend_ms * 1e6,
            ..AdaptRow::default()
        };
        // 100 arrivals in 100 ms (1,000/s) is quiet; 2,000 (20,000/s) a burst.
        let rows = [row(100, 50.0, 1.0), row(2000, 30.0, 2.0), row(2500, 10.0, 4.0)];
        assert_eq!(burst_rows(&rows).count(), 2);
        assert_eq!(burst_load(&rows), (20e6, 3e6));
        assert_eq!(burst_load(&rows[..1]), (0.0, 0.0));
    }
}

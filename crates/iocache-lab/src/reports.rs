//! The three HTML reports (`lab report`,
//! `sim --report`, `trace mrc --report`) need the same choices made once:
//! which results become which plot, how series are grouped, how numbers
//! read in a table. This file turns each command's results into an
//! `iocache_report::Report`; it draws and writes nothing itself.

use crate::error::Result;
use iocache_report::{Axis, Block, Chart, Report, Scale, Section, Series, Table, Ticks};
use iocache_sim::mrc::MrcReport;
use iocache_sim::report::JsonReport;
use iocache_sim::trace_stats::Window;
use iocache_sim::SimReport;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

fn version() -> (String, String) {
    (
        "written by".into(),
        format!("iocache {}", env!("CARGO_PKG_VERSION")),
    )
}

fn fact(name: &str, value: impl ToString) -> (String, String) {
    (name.to_string(), value.to_string())
}

/// A JSON value as a table cell: ratios and other fractions with four
/// decimals, integers as they are.
fn cell(v: &Value) -> String {
    match v {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        Value::Number(n) if n.is_f64() => {
            let f = n.as_f64().unwrap_or(f64::NAN);
            if f.abs() < 10.0 {
                format!("{f:.4}")
            } else {
                format!("{f:.1}")
            }
        }
        other => other.to_string(),
    }
}

/// A row's field as a table cell; empty when the row lacks it (a knob
/// that does not apply to the point, e.g. a device without timing).
fn text_of(row: &serde_json::Map<String, Value>, key: &str) -> String {
    row.get(key).map(cell).unwrap_or_default()
}

/// A y axis for ratios: the data's extent with a margin, within 0..1, so
/// close curves stay apart.
fn ratio_axis(label: &str, series: &[Series]) -> Axis {
    let values = series.iter().flat_map(|s| s.points.iter().map(|p| p.1));
    let (lo, hi) = values
        .filter(|v| v.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
            (lo.min(v), hi.max(v))
        });
    let range = if lo.is_finite() {
        let pad = ((hi - lo) * 0.08).max(0.01);
        Some(((lo - pad).max(0.0), (hi + pad).min(1.0)))
    } else {
        Some((0.0, 1.0))
    };
    Axis {
        label: label.into(),
        scale: Scale::Linear,
        ticks: Ticks::Percent,
        range,
    }
}

/// An x axis of cache sizes in bytes: logarithmic when they span more
/// than a factor of 4.
fn size_axis(series: &[Series]) -> Axis {
    let xs: Vec<f64> = series.iter().flat_map(|s| s.points.iter().map(|p| p.0)).collect();
    let lo = xs.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    Axis {
        label: "cache size".into(),
        scale: if lo > 0.0 && hi / lo > 4.0 {
            Scale::Log
        } else {
            Scale::Linear
        },
        ticks: Ticks::Bytes,
        range: None,
    }
}

/// A line chart of `metric` against cache size, one series per group.
fn size_chart(title: &str, y: Axis, series: Vec<Series>) -> Block {
    Block::Chart(Chart {
        title: title.into(),
        x: size_axis(&series),
        y,
        series,
    })
}

fn sorted(mut points: Vec<(f64, f64)>) -> Vec<(f64, f64)> {
    points.sort_by(|a, b| a.0.total_cmp(&b.0));
    points
}

/// Named points gathered into one series per name (in the order names
/// first appear), each sorted by x.
fn grouped_series(points: impl IntoIterator<Item = (String, f64, f64)>) -> Vec<Series> {
    let mut groups: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    for (name, x, y) in points {
        match groups.iter_mut().find(|(n, _)| *n == name) {
            Some((_, p)) => p.push((x, y)),
            None => groups.push((name, vec![(x, y)])),
        }
    }
    groups
        .into_iter()
        .map(|(name, points)| Series {
            name,
            points: sorted(points),
        })
        .collect()
}

// ---- lab report ----

/// The knobs of `lab run`, in the order the tables show them; knobs a
/// later version adds follow in name order.
const LAB_KNOBS: [&str; 10] = [
    "policy",
    "cache_size",
    "line_size",
    "write_policy",
    "promotion",
    "flush",
    "write_miss_bypass",
    "seq_cutoff",
    "readahead",
    "fill",
];
/// Result columns in table order; others follow in name order.
const LAB_METRICS: [&str; 13] = [
    "requests",
    "accesses",
    "hits",
    "hit_ratio",
    "byte_hit_ratio",
    "read_hits",
    "write_hits",
    "promotions",
    "evictions",
    "write_backs",
    "cache_lines",
    "footprint_lines",
    "seconds",
];

/// `iocache lab report`: the results of an experiment, one section per
/// workload. The knobs that vary besides the cache size make the series;
/// the ones that do not are said once at the top.
pub fn lab(rows: &[Value], series_rows: &[Value], sources: &str) -> Result<Report> {
    let objects: Vec<&serde_json::Map<String, Value>> = rows.iter().filter_map(Value::as_object).collect();
    // Knobs are the text columns (lab writes every knob as text).
    let mut knobs: Vec<String> = LAB_KNOBS.iter().map(|k| k.to_string()).collect();
    let mut extra: BTreeSet<String> = BTreeSet::new();
    let mut metrics: Vec<String> = LAB_METRICS.iter().map(|k| k.to_string()).collect();
    let mut extra_metrics: BTreeSet<String> = BTreeSet::new();
    for row in &objects {
        for (k, v) in row.iter() {
            if matches!(k.as_str(), "point" | "point_id" | "workload")
                || knobs.contains(k)
                || metrics.contains(k)
            {
                continue;
            }
            if v.is_string() {
                extra.insert(k.clone());
            } else {
                extra_metrics.insert(k.clone());
            }
        }
    }
    knobs.extend(extra);
    knobs.retain(|k| objects.iter().any(|r| r.contains_key(k)));
    metrics.extend(extra_metrics);
    metrics.retain(|k| objects.iter().any(|r| r.contains_key(k)));
    let values_of = |k: &str| -> BTreeSet<String> { objects.iter().map(|r| text_of(r, k)).collect() };
    let constant: Vec<&String> = knobs.iter().filter(|k| values_of(k).len() == 1).collect();
    let varying: Vec<&String> = knobs
        .iter()
        .filter(|k| values_of(k).len() > 1 && k.as_str() != "cache_size")
        .collect();
    let mut workloads: Vec<String> = Vec::new();
    for row in &objects {
        let w = cell(&row["workload"]);
        if !workloads.contains(&w) {
            workloads.push(w);
        }
    }
    let mut facts = vec![
        fact("results", sources),
        fact("points", objects.len()),
        fact("workloads", workloads.join(", ")),
    ];
    for k in &constant {
        facts.push(fact(k, values_of(k).into_iter().next().unwrap_or_default()));
    }
    facts.push(fact(
        "series",
        if varying.is_empty() {
            "one (no knob varies besides the cache size)".to_string()
        } else {
            varying.iter().map(|k| k.as_str()).collect::<Vec<_>>().join(" × ")
        },
    ));
    facts.push(version());

    let series_name = |row: &serde_json::Map<String, Value>| -> String {
        match varying.as_slice() {
            [] => "all".to_string(),
            [one] => text_of(row, one),
            many => many
                .iter()
                .map(|k| format!("{k}={}", text_of(row, k)))
                .collect::<Vec<_>>()
                .join(" "),
        }
    };
    // A size in bytes where the line size reads as one, else in lines.
    let bytes_of = |row: &serde_json::Map<String, Value>| -> Option<f64> {
        let lines = row.get("cache_lines")?.as_f64()?;
        let line = row
            .get("line_size")
            .and_then(Value::as_str)
            .and_then(|s| iocache_core::units::parse_byte_size(s).ok())?;
        Some(lines * line as f64)
    };

    let mut sections = Vec::new();
    for workload in &workloads {
        let mine: Vec<&&serde_json::Map<String, Value>> = objects
            .iter()
            .filter(|r| cell(&r["workload"]) == *workload)
            .collect();
        let mut blocks = Vec::new();
        // One series per group, points sorted by size.
        let series_of = |metric: &dyn Fn(&serde_json::Map<String, Value>) -> Option<f64>| -> Vec<Series> {
            grouped_series(
                mine.iter()
                    .filter_map(|row| Some((series_name(row), bytes_of(row)?, metric(row)?))),
            )
        };
        let field =
            |k: &'static str| move |r: &serde_json::Map<String, Value>| r.get(k).and_then(Value::as_f64);
        let hit = series_of(&field("hit_ratio"));
        let swept = hit.iter().any(|s| {
            s.points
                .iter()
                .map(|p| p.0.to_bits())
                .collect::<BTreeSet<_>>()
                .len()
                > 1
        });
        if swept {
            let miss: Vec<Series> = series_of(&|r| field("hit_ratio")(r).map(|h| 1.0 - h));
            let byte_hit = series_of(&field("byte_hit_ratio"));
            blocks.push(size_chart(
                &format!("{workload}: hit ratio vs cache size"),
                ratio_axis("hit ratio", &hit),
                hit,
            ));
            blocks.push(size_chart(
                &format!("{workload}: miss ratio vs cache size"),
                ratio_axis("miss ratio", &miss),
                miss,
            ));
            blocks.push(size_chart(
                &format!("{workload}: byte hit ratio vs cache size"),
                ratio_axis("byte hit ratio", &byte_hit),
                byte_hit,
            ));
            if mine
                .iter()
                .any(|r| r.get("write_backs").and_then(Value::as_u64) > Some(0))
            {
                let wb = series_of(&field("write_backs"));
                blocks.push(size_chart(
                    &format!("{workload}: write-backs vs cache size"),
                    Axis {
                        label: "lines written back".into(),
                        ..Axis::default()
                    },
                    wb,
                ));
            }
            // Latencies, when the results hold any (fields in nanoseconds).
            // The overall latencies and each kind's p99 (the table has the rest).
            for metric in metrics
                .iter()
                .filter(|m| m.ends_with("_ns") && (m.starts_with("latency_") || m.ends_with("_p99_ns")))
            {
                let key = metric.clone();
                let series = series_of(&move |r| r.get(&key).and_then(Value::as_f64));
                blocks.push(size_chart(
                    &format!("{workload}: {metric} vs cache size"),
                    Axis {
                        label: metric.clone(),
                        scale: Scale::Log,
                        ticks: Ticks::Nanoseconds,
                        range: None,
                    },
                    series,
                ));
            }
        } else {
            blocks.push(Block::Text(
                "One cache size per series: no curve to draw; the table has the results.".into(),
            ));
        }
        // The cache series (`[series]` in the experiment), every volume together.
        let sized = values_of("cache_size").len() > 1;
        let mut by_requests = false;
        let windows: Vec<WindowPoint> = series_rows
            .iter()
            .filter_map(Value::as_object)
            .filter(|w| cell(&w["workload"]) == *workload && !w.contains_key("volume"))
            .filter_map(|w| {
                by_requests |= w.get("by_requests").and_then(Value::as_bool) == Some(true);
                let run = match (series_name(w), sized) {
                    (name, true) => format!("{name} {}", text_of(w, "cache_size")),
                    (name, false) => name,
                };
                let f = |k: &str| w.get(k).and_then(Value::as_f64);
                Some(WindowPoint {
                    run,
                    x: if by_requests {
                        f("first_request")?
                    } else {
                        f("start_ns")? / 1e9
                    },
                    hit_ratio: f("hit_ratio")?,
                    dirty_lines: f("dirty_lines")?,
                    resident_lines: f("resident_lines")?,
                    backend_bytes: f("backend_read_bytes")? + f("backend_write_bytes")?,
                })
            })
            .collect();
        if !windows.is_empty() {
            let x_label = if by_requests { "requests" } else { "trace time (s)" };
            blocks.extend(window_charts(&format!("{workload}: "), x_label, &windows));
        }
        let mut header: Vec<String> = vec!["point".to_string()];
        header.extend(knobs.iter().cloned());
        header.extend(metrics.iter().cloned());
        let rows: Vec<Vec<String>> = mine
            .iter()
            .map(|r| {
                header
                    .iter()
                    .map(|k| r.get(k).map(cell).unwrap_or_default())
                    .collect()
            })
            .collect();
        blocks.push(Block::Table(Table {
            caption: Some(format!("{workload}: every point")),
            header,
            rows,
        }));
        sections.push(Section {
            heading: format!("workload {workload}"),
            blocks,
        });
    }
    Ok(Report {
        title: format!("iocache lab: {sources}"),
        facts,
        sections,
    })
}

/// One window of a cache series as the plots read it (`sim --series-every`,
/// lab `[series]`): the run's name, the x value, and the plotted values.
pub struct WindowPoint {
    pub run: String,
    pub x: f64,
    pub hit_ratio: f64,
    pub dirty_lines: f64,
    pub resident_lines: f64,
    pub backend_bytes: f64,
}

/// The cache series' plots over trace time (or requests): hit ratio,
/// dirty lines, lines in use and backend traffic, one series per run.
fn window_charts(title: &str, x_label: &str, points: &[WindowPoint]) -> Vec<Block> {
    type Pick = fn(&WindowPoint) -> f64;
    let charts: [(&str, &str, Pick); 4] = [
        ("hit ratio", "hit ratio", |p| p.hit_ratio),
        ("dirty lines", "dirty lines at the window's end", |p| {
            p.dirty_lines
        }),
        ("lines in use", "resident lines at the window's end", |p| {
            p.resident_lines
        }),
        ("backend traffic", "bytes read and written", |p| p.backend_bytes),
    ];
    charts
        .into_iter()
        .map(|(what, label, pick)| {
            let series = grouped_series(points.iter().map(|p| (p.run.clone(), p.x, pick(p))));
            let y = if what == "hit ratio" {
                ratio_axis(label, &series)
            } else {
                Axis {
                    label: label.into(),
                    ..Axis::default()
                }
            };
            Block::Chart(Chart {
                title: format!("{title}{what} over {x_label}"),
                x: Axis {
                    label: x_label.into(),
                    ..Axis::default()
                },
                y,
                series,
            })
        })
        .collect()
}

// ---- sim report ----

/// Columns of `sim --report`'s run table, from the JSON run.
const SIM_COLUMNS: [&str; 24] = [
    "policy",
    "cache_size",
    "cache_lines",
    "line_size",
    "write_policy",
    "promotion",
    "requests",
    "accesses",
    "hits",
    "hit_ratio",
    "partial_hits",
    "misses",
    "read_hit_ratio",
    "write_hit_ratio",
    "byte_hit_ratio",
    "promotions",
    "evictions",
    "dirty_writebacks",
    "backend_read_bytes",
    "backend_write_bytes",
    "cache_read_bytes",
    "cache_write_bytes",
    "dirty_lines_at_end",
    "wall_seconds",
];

/// `iocache sim --report`: the runs' table; hit and miss ratio against
/// cache size when sizes were swept; latency CDFs and percentiles with
/// timing; the time series with `--series-interval`.
pub fn sim(trace: &str, format: &str, report: &SimReport) -> Result<Report> {
    let json = serde_json::to_value(JsonReport::new(trace, format.to_string(), report))?;
    let runs: Vec<&Value> = json["runs"]
        .as_array()
        .map(|r| r.iter().collect())
        .unwrap_or_default();
    let facts = vec![
        fact("trace", trace),
        fact("format", format),
        fact("requests", report.trace_records),
        fact("warmup requests", report.warmup_requests),
        fact("skipped lines", report.skipped_lines),
        fact("ignored records", report.ignored_records),
        fact("runs", report.runs.len()),
        fact("threads", report.threads),
        fact("seconds", format!("{:.3}", report.wall_seconds)),
        version(),
    ];
    let line_sizes: BTreeSet<u64> = report.runs.iter().map(|r| r.spec.line_size.bytes()).collect();
    // A run's name in legends: its policy, with the line size when several
    // were run; with the cache size too where size is not the x axis.
    let group = |i: usize| -> String {
        let spec = &report.runs[i].spec;
        if line_sizes.len() > 1 {
            format!(
                "{} {}",
                spec.policy,
                iocache_core::units::format_byte_size(spec.line_size.bytes())
            )
        } else {
            spec.policy.to_string()
        }
    };
    let run_name = |i: usize| format!("{} {}", group(i), report.runs[i].spec.size);
    let mut sections = Vec::new();

    // Hit ratio against size, per policy.
    let by_group = |metric: &dyn Fn(&Value) -> Option<f64>| -> Vec<Series> {
        grouped_series(
            runs.iter()
                .enumerate()
                .filter_map(|(i, run)| Some((group(i), run["cache_bytes"].as_f64()?, metric(run)?))),
        )
    };
    let hit = by_group(&|r| r["hit_ratio"].as_f64());
    let mut blocks = Vec::new();
    if hit.iter().any(|s| s.points.len() > 1) {
        let miss = by_group(&|r| r["hit_ratio"].as_f64().map(|h| 1.0 - h));
        let byte_hit = by_group(&|r| r["byte_hit_ratio"].as_f64());
        blocks.push(size_chart(
            "hit ratio vs cache size",
            ratio_axis("hit ratio", &hit),
            hit,
        ));
        blocks.push(size_chart(
            "miss ratio vs cache size",
            ratio_axis("miss ratio", &miss),
            miss,
        ));
        blocks.push(size_chart(
            "byte hit ratio vs cache size",
            ratio_axis("byte hit ratio", &byte_hit),
            byte_hit,
        ));
    }
    let header: Vec<String> = SIM_COLUMNS.iter().map(|c| c.to_string()).collect();
    blocks.push(Block::Table(Table {
        caption: Some("runs (counters after the warmup)".into()),
        rows: runs
            .iter()
            .map(|r| header.iter().map(|c| cell(&r[c.as_str()])).collect())
            .collect(),
        header,
    }));
    sections.push(Section {
        heading: "hit ratio".into(),
        blocks,
    });

    // Latency, with timing.
    let timed: Vec<usize> = (0..report.runs.len())
        .filter(|&i| report.runs[i].timing.is_some())
        .collect();
    if !timed.is_empty() {
        let mut blocks = Vec::new();
        let cdf = |pick: &dyn Fn(&iocache_sim::timing::TimingReport) -> &Vec<(f64, u64)>| -> Vec<Series> {
            timed
                .iter()
                .filter_map(|&i| {
                    let t = report.runs[i].timing.as_ref()?;
                    let points: Vec<(f64, f64)> = pick(t).iter().map(|&(q, ns)| (ns as f64, q)).collect();
                    (!points.is_empty()).then(|| Series {
                        name: run_name(i),
                        points,
                    })
                })
                .collect()
        };
        for (what, series) in [("read", cdf(&|t| &t.read_cdf)), ("write", cdf(&|t| &t.write_cdf))] {
            blocks.push(Block::Chart(Chart {
                title: format!("{what} latency CDF"),
                x: Axis {
                    label: format!("{what} latency"),
                    scale: Scale::Log,
                    ticks: Ticks::Nanoseconds,
                    range: None,
                },
                y: Axis {
                    label: "fraction of requests at or below".into(),
                    scale: Scale::Linear,
                    ticks: Ticks::Percent,
                    range: Some((0.0, 1.0)),
                },
                series,
            }));
        }
        let us = |ns: f64| format!("{:.1}", ns / 1000.0);
        let mut header = vec!["run".to_string(), "IOPS".to_string()];
        for what in ["read", "write"] {
            for p in ["mean", "p50", "p99", "p99.9", "p99.99", "max"] {
                header.push(format!("{what} {p} (µs)"));
            }
        }
        header.extend(["cache util.".to_string(), "backend util.".to_string()]);
        let rows = timed
            .iter()
            .filter_map(|&i| {
                let t = report.runs[i].timing.as_ref()?;
                let mut row = vec![run_name(i), format!("{:.1}", t.iops)];
                for s in [&t.read, &t.write] {
                    row.push(us(s.mean_ns));
                    for v in [s.p50_ns, s.p99_ns, s.p999_ns, s.p9999_ns, s.max_ns] {
                        row.push(us(v as f64));
                    }
                }
                row.push(format!("{:.4}", t.cache_device.utilization));
                row.push(format!("{:.4}", t.backend_device.utilization));
                Some(row)
            })
            .collect();
        blocks.push(Block::Table(Table {
            caption: Some("latency percentiles (modelled device time)".into()),
            header,
            rows,
        }));
        sections.push(Section {
            heading: "latency".into(),
            blocks,
        });
    }

    // Time series, with --series-interval.
    let with_series: Vec<usize> = timed
        .iter()
        .copied()
        .filter(|&i| {
            report.runs[i]
                .timing
                .as_ref()
                .is_some_and(|t| !t.series.is_empty())
        })
        .collect();
    if !with_series.is_empty() {
        let t0 = with_series
            .iter()
            .filter_map(|&i| report.runs[i].timing.as_ref()?.series.first().map(|r| r.start_ns))
            .min()
            .unwrap_or(0);
        type Pick = fn(&iocache_sim::timing::SeriesRow) -> Option<f64>;
        let charts: [(&str, &str, Ticks, Pick); 6] = [
            ("IOPS over time", "requests per second", Ticks::Number, |r| {
                Some(r.iops)
            }),
            (
                "read p99 latency over time",
                "read p99",
                Ticks::Nanoseconds,
                |r| (r.reads > 0).then_some(r.read_p99_ns as f64),
            ),
            (
                "write p99 latency over time",
                "write p99",
                Ticks::Nanoseconds,
                |r| (r.writes > 0).then_some(r.write_p99_ns as f64),
            ),
            (
                "cache device utilization over time",
                "utilization",
                Ticks::Percent,
                |r| Some(r.cache_utilization),
            ),
            (
                "backend utilization over time",
                "utilization",
                Ticks::Percent,
                |r| Some(r.backend_utilization),
            ),
            (
                "backend queue over time",
                "mean ops in the device",
                Ticks::Number,
                |r| Some(r.backend_queue),
            ),
        ];
        let mut blocks = Vec::new();
        for (title, label, ticks, pick) in charts {
            let series = with_series
                .iter()
                .filter_map(|&i| {
                    let rows = &report.runs[i].timing.as_ref()?.series;
                    Some(Series {
                        name: run_name(i),
                        points: rows
                            .iter()
                            .filter_map(|r| Some((r.start_ns.saturating_sub(t0) as f64 / 1e9, pick(r)?)))
                            .collect(),
                    })
                })
                .collect();
            blocks.push(Block::Chart(Chart {
                title: title.into(),
                x: Axis {
                    label: "trace time (s)".into(),
                    ..Axis::default()
                },
                y: Axis {
                    label: label.into(),
                    ticks,
                    ..Axis::default()
                },
                series,
            }));
        }
        sections.push(Section {
            heading: "time series".into(),
            blocks,
        });
    }
    // The cache series, with --series-every (every volume together).
    let by_requests = report
        .runs
        .iter()
        .any(|r| matches!(r.series_every, Some(Window::Requests { .. })));
    let points: Vec<WindowPoint> = report
        .runs
        .iter()
        .enumerate()
        .flat_map(|(i, r)| {
            r.series
                .iter()
                .filter(|w| w.volume.is_none())
                .map(move |w| (i, w))
        })
        .map(|(i, w)| WindowPoint {
            run: run_name(i),
            x: if by_requests {
                w.first_request as f64
            } else {
                w.start_ns as f64 / 1e9
            },
            hit_ratio: w.hit_ratio,
            dirty_lines: w.dirty_lines as f64,
            resident_lines: w.resident_lines as f64,
            backend_bytes: (w.counts.backend_read_bytes + w.counts.backend_write_bytes) as f64,
        })
        .collect();
    if !points.is_empty() {
        let x_label = if by_requests { "requests" } else { "trace time (s)" };
        sections.push(Section {
            heading: "cache series".into(),
            blocks: window_charts("", x_label, &points),
        });
    }
    Ok(Report {
        title: format!("iocache sim: {trace}"),
        facts,
        sections,
    })
}

// ---- trace mrc report ----

/// `iocache trace mrc --report`: the curves, their table, and each other
/// curve's difference from the exact one when both were computed.
pub fn mrc(report: &MrcReport) -> Report {
    let line = report.line_size;
    let facts = vec![
        fact("trace", &report.trace),
        fact("format", &report.format),
        fact("line size", iocache_core::units::format_byte_size(line)),
        fact("requests", report.requests),
        fact("line accesses", report.line_accesses),
        fact(
            "footprint",
            format!(
                "{} lines ({})",
                report.footprint_lines,
                iocache_core::units::format_byte_size(report.footprint_lines * line)
            ),
        ),
        fact("seconds", format!("{:.3}", report.seconds)),
        version(),
    ];
    let curves: Vec<Series> = report
        .curves
        .iter()
        .map(|c| Series {
            name: c.method.clone(),
            points: c
                .points
                .iter()
                .map(|p| (p.cache_bytes as f64, p.miss_ratio))
                .collect(),
        })
        .collect();
    // The title names what the curves are: LRU's (exact or sampled), and
    // Belady's OPT when it is among them.
    let has_opt = report.curves.iter().any(|c| c.method == "opt");
    let has_lru = report.curves.iter().any(|c| c.method != "opt");
    let title = match (has_lru, has_opt) {
        (true, true) => "miss ratio curves: LRU and Belady's OPT",
        (false, true) => "miss ratio curve: Belady's OPT",
        _ => "miss ratio curve: LRU",
    };
    let mut blocks = vec![size_chart(title, ratio_axis("miss ratio", &curves), curves)];
    let exact = report.curves.iter().find(|c| c.method == "exact");
    let others: Vec<_> = report.curves.iter().filter(|c| c.method != "exact").collect();
    // Differences from exact at the sizes both have.
    let difference = |c: &iocache_sim::mrc::MrcCurve| -> Vec<(f64, f64)> {
        let Some(exact) = exact else { return Vec::new() };
        let at: BTreeMap<u64, f64> = exact
            .points
            .iter()
            .map(|p| (p.cache_lines, p.miss_ratio))
            .collect();
        c.points
            .iter()
            .filter_map(|p| Some((p.cache_bytes as f64, p.miss_ratio - at.get(&p.cache_lines)?)))
            .collect()
    };
    if exact.is_some() && !others.is_empty() {
        let series: Vec<Series> = others
            .iter()
            .map(|c| Series {
                name: format!("{} − exact", c.method),
                points: difference(c),
            })
            .collect();
        blocks.push(size_chart(
            "difference from the exact curve",
            Axis {
                label: "miss ratio difference".into(),
                ticks: Ticks::Number,
                ..Axis::default()
            },
            series,
        ));
    }
    let (mut header, mut rows) = report.miss_table();
    if exact.is_some() {
        header.extend(others.iter().map(|c| format!("{} − exact", c.method)));
        let diffs: Vec<BTreeMap<u64, f64>> = others
            .iter()
            .map(|c| difference(c).into_iter().map(|(b, d)| (b as u64, d)).collect())
            .collect();
        for (row, p) in rows.iter_mut().zip(&report.curves[0].points) {
            row.extend(diffs.iter().map(|d| {
                d.get(&p.cache_bytes)
                    .map_or(String::new(), |v| format!("{v:+.4}"))
            }));
        }
    }
    blocks.push(Block::Table(Table {
        caption: Some("miss ratio at each size".into()),
        header,
        rows,
    }));
    blocks.push(Block::Table(Table {
        caption: Some("methods".into()),
        header: [
            "method",
            "accesses",
            "sampled accesses",
            "sampled lines",
            "final rate",
            "mean difference from exact",
            "largest difference from exact",
        ]
        .map(String::from)
        .to_vec(),
        rows: report
            .curves
            .iter()
            .map(|c| {
                vec![
                    c.method.clone(),
                    format!("{:.0}", c.accesses),
                    c.sampled_accesses.to_string(),
                    c.sampled_lines.to_string(),
                    format!("{:.5}", c.final_rate),
                    c.mean_error_vs_exact.map_or(String::new(), |e| format!("{e:.4}")),
                    c.max_error_vs_exact.map_or(String::new(), |e| format!("{e:.4}")),
                ]
            })
            .collect(),
    }));
    Report {
        title: format!("iocache trace mrc: {}", report.trace),
        facts,
        sections: vec![Section {
            heading: "miss ratio curves".into(),
            blocks,
        }],
    }
}

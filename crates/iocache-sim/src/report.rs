//! Rendering simulation results: the stable JSON schema (documented in
//! `docs/sim-json.md`) and the human-readable table.

use iocache_core::stats::ratio;
use serde::Serialize;

use crate::run::{RunResult, SimReport};

/// JSON schema version; bump on any incompatible change.
pub const JSON_SCHEMA_VERSION: u32 = 2;

#[derive(Serialize)]
pub struct JsonReport<'a> {
    pub schema_version: u32,
    pub trace: &'a str,
    pub format: String,
    /// The report's totals (`trace_records` to `wall_seconds`), its runs
    /// left out: they follow as [`JsonRun`]s.
    #[serde(flatten)]
    pub totals: &'a SimReport,
    pub runs: Vec<JsonRun>,
}

#[derive(Serialize)]
pub struct JsonRun {
    pub policy: String,
    pub cache_size: String,
    pub cache_lines: u64,
    pub cache_bytes: u64,
    pub line_size: u64,
    pub write_policy: String,
    pub promotion: String,
    pub flush: String,
    pub write_miss_bypass: bool,
    pub seq_cutoff: String,
    pub readahead: String,
    pub fill: String,
    pub requests: u64,
    pub read_requests: u64,
    pub write_requests: u64,
    pub accesses: u64,
    pub hits: u64,
    pub hit_ratio: f64,
    pub partial_hits: u64,
    pub misses: u64,
    pub read_accesses: u64,
    pub read_hits: u64,
    pub read_hit_ratio: f64,
    pub write_accesses: u64,
    pub write_hits: u64,
    pub write_hit_ratio: f64,
    pub requested_bytes: u64,
    pub hit_bytes: u64,
    pub byte_hit_ratio: f64,
    pub promotions: u64,
    pub evictions: u64,
    pub eviction_batches: u64,
    pub lines_per_eviction_batch: f64,
    pub eviction_batch_sizes: Vec<BatchBucket>,
    pub invalidations: u64,
    pub dirty_writebacks: u64,
    pub bypassed_accesses: u64,
    pub write_miss_bypasses: u64,
    pub seq_cutoff_requests: u64,
    /// Readahead fills, the lines they inserted, and of those the lines
    /// used and the lines that left unused.
    pub prefetch_requests: u64,
    pub prefetched_lines: u64,
    pub prefetch_used_lines: u64,
    pub prefetch_unused_lines: u64,
    pub cleaner_runs: u64,
    pub flushed_lines: u64,
    pub backend_read_bytes: u64,
    pub backend_write_bytes: u64,
    pub cache_read_bytes: u64,
    pub cache_write_bytes: u64,
    pub resident_lines_at_end: u64,
    pub dirty_lines_at_end: u64,
    pub wall_seconds: f64,
    pub accesses_per_second: f64,
    pub policy_counters: std::collections::BTreeMap<&'static str, u64>,
    /// Latency, IOPS and device load when `--timing` was on (see docs/timing-model.md).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timing: Option<crate::timing::TimingReport>,
    /// The adaptive controller's intervals when `--adapt` was on (`adapt.rs`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub adapt: Option<crate::adapt::AdaptReport>,
    /// ReCA's windows, decisions and totals when `--adapt reca` was on (`reca.rs`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reca: Option<crate::reca::RecaRun>,
    /// Restarts during the replay (`--restart-every`; 0 without).
    pub restarts: u64,
    /// The per-window series without timing (`--series-every`; `tally.rs`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub cache_series: Vec<crate::tally::SeriesWindow>,
    /// Results per volume, busiest first (`--per-volume`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<crate::tally::VolumeResult>,
}

/// Eviction batches of at most `max_lines` lines (and more than the previous bucket's).
#[derive(Serialize)]
pub struct BatchBucket {
    pub max_lines: u64,
    pub batches: u64,
}

/// `text` as one CSV field: quoted when it holds a comma or a quote.
pub fn csv_field(text: &str) -> String {
    if text.contains([',', '"']) {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text.to_string()
    }
}

impl JsonRun {
    pub fn from_result(r: &RunResult) -> Self {
        let s = &r.stats;
        JsonRun {
            policy: r.spec.policy.to_string(),
            cache_size: r.spec.size.to_string(),
            cache_lines: r.spec.capacity_lines,
            cache_bytes: r.spec.capacity_lines * r.spec.line_size.bytes(),
            line_size: r.spec.line_size.bytes(),
            write_policy: r.spec.settings.write_policy.to_string(),
            promotion: r.spec.settings.promotion.to_string(),
            flush: r.spec.settings.cleaning.to_string(),
            write_miss_bypass: r.spec.settings.write_miss_bypass,
            seq_cutoff: r.spec.settings.seq_cutoff.to_string(),
            readahead: r.spec.settings.readahead.to_string(),
            fill: r.spec.settings.fill.to_string(),
            requests: s.requests,
            read_requests: s.read_requests,
            write_requests: s.write_requests,
            accesses: s.accesses,
            hits: s.full_hits,
            hit_ratio: s.hit_ratio(),
            partial_hits: s.partial_hits,
            misses: s.misses,
            read_accesses: s.read_accesses,
            read_hits: s.read_hits,
            read_hit_ratio: ratio(s.read_hits, s.read_accesses),
            write_accesses: s.write_accesses,
            write_hits: s.write_hits,
            write_hit_ratio: ratio(s.write_hits, s.write_accesses),
            requested_bytes: s.requested_bytes,
            hit_bytes: s.hit_bytes,
            byte_hit_ratio: s.byte_hit_ratio(),
            promotions: s.promotions,
            evictions: s.evictions,
            eviction_batches: s.eviction_batches,
            lines_per_eviction_batch: s.lines_per_eviction_batch(),
            eviction_batch_sizes: s
                .eviction_batch_sizes
                .iter()
                .enumerate()
                .filter(|(_, &n)| n > 0)
                .map(|(i, &n)| BatchBucket {
                    max_lines: if i + 1 == s.eviction_batch_sizes.len() {
                        u64::MAX
                    } else {
                        1 << i
                    },
                    batches: n,
                })
                .collect(),
            invalidations: s.invalidations,
            dirty_writebacks: s.dirty_writebacks,
            bypassed_accesses: s.bypassed_accesses,
            write_miss_bypasses: s.write_miss_bypasses,
            seq_cutoff_requests: s.seq_cutoff_requests,
            prefetch_requests: s.prefetch_requests,
            prefetched_lines: s.prefetched_lines,
            prefetch_used_lines: s.prefetch_used_lines,
            prefetch_unused_lines: s.prefetch_unused_lines,
            cleaner_runs: s.cleaner_runs,
            flushed_lines: s.flushed_lines,
            backend_read_bytes: s.backend_read_bytes,
            backend_write_bytes: s.backend_write_bytes,
            cache_read_bytes: s.cache_read_bytes,
            cache_write_bytes: s.cache_write_bytes,
            resident_lines_at_end: r.resident_lines_at_end,
            dirty_lines_at_end: r.dirty_lines_at_end,
            wall_seconds: r.wall_seconds,
            accesses_per_second: if r.wall_seconds > 0.0 {
                r.simulated_accesses as f64 / r.wall_seconds
            } else {
                0.0
            },
            policy_counters: r.policy_counters.iter().copied().collect(),
            timing: r.timing.clone(),
            adapt: r.adapt.clone(),
            reca: r.reca.clone(),
            restarts: r.restarts,
            cache_series: r.series.clone(),
            volumes: r.volumes.clone(),
        }
    }
}

impl<'a> JsonReport<'a> {
    pub fn new(trace: &'a str, format: String, report: &'a SimReport) -> Self {
        JsonReport {
            schema_version: JSON_SCHEMA_VERSION,
            trace,
            format,
            totals: report,
            runs: report.runs.iter().map(JsonRun::from_result).collect(),
        }
    }
}

/// A plain-text table, one row per run. Columns about batch eviction,
/// background flushing and bypass appear only when some run used them.
pub fn render_table(report: &SimReport) -> String {
    let runs: Vec<JsonRun> = report.runs.iter().map(JsonRun::from_result).collect();
    let batches = runs.iter().any(|j| j.eviction_batches != j.evictions);
    let flushing = runs.iter().any(|j| j.flushed_lines > 0 || j.cleaner_runs > 0);
    let bypass = runs
        .iter()
        .any(|j| j.write_miss_bypasses + j.seq_cutoff_requests > 0);
    let mut header = vec![
        "policy",
        "size",
        "lines",
        "line",
        "wp",
        "promotion",
        "accesses",
        "hit%",
        "read hit%",
        "write hit%",
        "byte hit%",
        "promotions",
        "evictions",
        "writebacks",
    ];
    if batches {
        header.extend(["batches", "lines/batch"]);
    }
    if flushing {
        header.push("flushed");
    }
    if bypass {
        header.extend(["wm-bypass", "seq-cutoff"]);
    }
    header.push("Macc/s");
    let rows: Vec<Vec<String>> = runs
        .into_iter()
        .map(|j| {
            let mut row = vec![
                j.policy,
                j.cache_size,
                j.cache_lines.to_string(),
                j.line_size.to_string(),
                j.write_policy,
                j.promotion,
                j.accesses.to_string(),
                format!("{:.2}", j.hit_ratio * 100.0),
                format!("{:.2}", j.read_hit_ratio * 100.0),
                format!("{:.2}", j.write_hit_ratio * 100.0),
                format!("{:.2}", j.byte_hit_ratio * 100.0),
                j.promotions.to_string(),
                j.evictions.to_string(),
                j.dirty_writebacks.to_string(),
            ];
            if batches {
                row.push(j.eviction_batches.to_string());
                row.push(format!("{:.2}", j.lines_per_eviction_batch));
            }
            if flushing {
                row.push(j.flushed_lines.to_string());
            }
            if bypass {
                row.push(j.write_miss_bypasses.to_string());
                row.push(j.seq_cutoff_requests.to_string());
            }
            row.push(format!("{:.2}", j.accesses_per_second / 1e6));
            row
        })
        .collect();
    table(&header, &rows)
}

/// The timing table: throughput, latency percentiles and device load per run.
pub fn render_timing_table(report: &SimReport) -> Option<String> {
    let us = |ns: f64| format!("{:.1}", ns / 1e3);
    let rows: Vec<Vec<String>> = report
        .runs
        .iter()
        .filter_map(|r| {
            let t = r.timing.as_ref()?;
            Some(vec![
                r.spec.policy.to_string(),
                r.spec.size.to_string(),
                format!("{:.0}", t.iops),
                us(t.read.mean_ns),
                us(t.read.p99_ns as f64),
                us(t.read.p9999_ns as f64),
                us(t.write.mean_ns),
                us(t.write.p99_ns as f64),
                us(t.write.p9999_ns as f64),
                format!("{:.2}", t.cache_device.utilization),
                format!("{:.2}", t.backend_device.utilization),
            ])
        })
        .collect();
    if rows.is_empty() {
        return None;
    }
    Some(table(
        &[
            "policy",
            "size",
            "IOPS",
            "read mean",
            "p99",
            "p99.99",
            "write mean",
            "p99",
            "p99.99",
            "cache util",
            "backend util",
        ],
        &rows,
    ))
}

/// The per-volume table (`--per-volume`): per run, its `limit` busiest
/// volumes (all with `None`), and a line saying how many were left out.
pub fn render_volume_table(report: &SimReport, limit: Option<usize>) -> Option<String> {
    let mut rows: Vec<Vec<String>> = Vec::new();
    let mut left_out = 0;
    for r in report.runs.iter().filter(|r| !r.volumes.is_empty()) {
        let shown = limit.unwrap_or(usize::MAX).min(r.volumes.len());
        left_out += r.volumes.len() - shown;
        for v in &r.volumes[..shown] {
            let c = &v.counts;
            rows.push(vec![
                r.spec.policy.to_string(),
                r.spec.size.to_string(),
                v.volume.to_string(),
                c.requests.to_string(),
                c.hits.to_string(),
                format!("{:.2}", v.hit_ratio * 100.0),
                format!("{:.2}", v.byte_hit_ratio * 100.0),
                c.read_hits.to_string(),
                c.write_hits.to_string(),
                c.backend_read_bytes.to_string(),
                c.backend_write_bytes.to_string(),
                v.resident_lines_at_end.to_string(),
            ]);
        }
    }
    if rows.is_empty() {
        return None;
    }
    let mut out = table(
        &[
            "policy",
            "size",
            "volume",
            "requests",
            "hits",
            "hit%",
            "byte hit%",
            "read hits",
            "write hits",
            "backend read B",
            "backend write B",
            "lines at end",
        ],
        &rows,
    );
    if left_out > 0 {
        out.push_str(&format!(
            "({left_out} quieter volume rows left out: --per-volume all shows every one)\n"
        ));
    }
    Some(out)
}

/// Right-aligns numeric-looking columns, left-aligns the rest.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    let numeric = |col: usize| {
        rows.iter().all(|r| {
            let cell = r[col].as_bytes();
            cell.iter().any(u8::is_ascii_digit)
                && cell.iter().all(|&b| b.is_ascii_digit() || b == b'.' || b == b'-')
        })
    };
    let mut out = String::new();
    let mut line = |cells: Vec<&str>| {
        let formatted: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(i, c)| {
                if numeric(i) {
                    format!("{c:>w$}", w = widths[i])
                } else {
                    format!("{c:<w$}", w = widths[i])
                }
            })
            .collect();
        out.push_str(formatted.join("  ").trim_end());
        out.push('\n');
    };
    line(header.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
    out
}

//! Rendering simulation results: the stable JSON schema (documented in
//! `docs/sim-json.md`) and the human-readable table.

use serde::Serialize;

use crate::run::{RunResult, SimReport};

/// JSON schema version; bump on any incompatible change.
pub const JSON_SCHEMA_VERSION: u32 = 1;

#[derive(Serialize)]
pub struct JsonReport<'a> {
    pub schema_version: u32,
    pub trace: &'a str,
    pub format: String,
    pub trace_records: u64,
    pub warmup_requests: u64,
    pub skipped_lines: u64,
    pub ignored_records: u64,
    pub threads: usize,
    pub wall_seconds: f64,
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
    pub invalidations: u64,
    pub dirty_writebacks: u64,
    pub bypassed_accesses: u64,
    pub backend_read_bytes: u64,
    pub backend_write_bytes: u64,
    pub cache_read_bytes: u64,
    pub cache_write_bytes: u64,
    pub resident_lines_at_end: u64,
    pub dirty_lines_at_end: u64,
    pub wall_seconds: f64,
    pub accesses_per_second: f64,
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
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
            write_policy: r.spec.write_policy.to_string(),
            promotion: r.spec.promotion.to_string(),
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
            invalidations: s.invalidations,
            dirty_writebacks: s.dirty_writebacks,
            bypassed_accesses: s.bypassed_accesses,
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
        }
    }
}

impl<'a> JsonReport<'a> {
    pub fn new(trace: &'a str, format: String, report: &SimReport) -> Self {
        JsonReport {
            schema_version: JSON_SCHEMA_VERSION,
            trace,
            format,
            trace_records: report.trace_records,
            warmup_requests: report.warmup_requests,
            skipped_lines: report.skipped_lines,
            ignored_records: report.ignored_records,
            threads: report.threads,
            wall_seconds: report.wall_seconds,
            runs: report.runs.iter().map(JsonRun::from_result).collect(),
        }
    }
}

/// A plain-text table, one row per run.
pub fn render_table(report: &SimReport) -> String {
    let header = [
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
        "Macc/s",
    ];
    let rows: Vec<Vec<String>> = report
        .runs
        .iter()
        .map(|r| {
            let j = JsonRun::from_result(r);
            vec![
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
                format!("{:.2}", j.accesses_per_second / 1e6),
            ]
        })
        .collect();
    table(&header, &rows)
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
            r[col]
                .bytes()
                .all(|b| b.is_ascii_digit() || b == b'.' || b == b'-')
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

//! Characterizing a trace: request mix, sizes, footprint and working-set size,
//! total and per time window (the SYSTOR'14 paper's weekly working-set idea,
//! with the window as a parameter).

use std::collections::HashSet;
use std::str::FromStr;

use iocache_core::fasthash::FxBuildHasher;
use iocache_core::{split_request_keys, IoKind, LineKey, LineSize};
use iocache_trace::TraceReader;
use serde::Serialize;

use crate::error::SimError;
use crate::run::request_of;

/// How the trace is cut into working-set windows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Window {
    /// Windows of this many nanoseconds of trace time.
    Duration { nanos: u64 },
    /// Windows of this many requests.
    Requests { count: u64 },
}

impl FromStr for Window {
    type Err = SimError;
    /// `30s`, `15m`, `6h`, `1d`, `1w` (trace time) or `100000req` (requests).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
        let (digits, unit) = t.split_at(split);
        let bad = || {
            SimError::Spec(format!(
                "window `{s}`: expected a number with a unit: ms, s, m, h, d, w (trace time) or req (requests)"
            ))
        };
        let n: u64 = digits.parse().map_err(|_| bad())?;
        if n == 0 {
            return Err(bad());
        }
        let unit_ns: u64 = match unit {
            "req" | "requests" => return Ok(Window::Requests { count: n }),
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" | "min" => 60 * 1_000_000_000,
            "h" => 3_600 * 1_000_000_000,
            "d" => 86_400 * 1_000_000_000,
            "w" => 7 * 86_400 * 1_000_000_000,
            _ => return Err(bad()),
        };
        let nanos = n.checked_mul(unit_ns).ok_or_else(bad)?;
        Ok(Window::Duration { nanos })
    }
}

impl std::fmt::Display for Window {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Window::Requests { count } => write!(f, "{count}req"),
            Window::Duration { nanos } => {
                const UNITS: [(u64, &str); 6] = [
                    (7 * 86_400 * 1_000_000_000, "w"),
                    (86_400 * 1_000_000_000, "d"),
                    (3_600 * 1_000_000_000, "h"),
                    (60 * 1_000_000_000, "m"),
                    (1_000_000_000, "s"),
                    (1_000_000, "ms"),
                ];
                for (unit_ns, name) in UNITS {
                    if nanos.is_multiple_of(unit_ns) {
                        return write!(f, "{}{name}", nanos / unit_ns);
                    }
                }
                write!(f, "{nanos}ns")
            }
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct SizeBucket {
    /// Requests of at most this many bytes (and more than the previous bucket's bound).
    pub max_bytes: u64,
    pub requests: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct WindowStats {
    pub index: u64,
    pub first_time_ns: u64,
    pub requests: u64,
    /// Distinct lines touched in this window.
    pub unique_lines: u64,
    pub unique_bytes: u64,
    /// Distinct lines touched from the start of the trace to the end of
    /// this window (the cumulative working-set curve; the last window's
    /// equals the footprint).
    pub cumulative_lines: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct TraceStats {
    pub trace: String,
    pub format: String,
    pub requests: u64,
    pub read_requests: u64,
    pub write_requests: u64,
    pub read_fraction: f64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub volumes: u64,
    /// Earliest and latest record times (traces are not always in time order).
    pub first_time_ns: u64,
    pub last_time_ns: u64,
    pub min_request_bytes: u64,
    pub max_request_bytes: u64,
    pub mean_request_bytes: f64,
    pub request_sizes: Vec<SizeBucket>,
    pub line_size: u64,
    /// Distinct lines touched over the whole trace (its footprint, the total working set).
    pub footprint_lines: u64,
    pub footprint_bytes: u64,
    pub read_footprint_lines: u64,
    pub write_footprint_lines: u64,
    pub window: Option<String>,
    pub windows: Vec<WindowStats>,
    pub skipped_lines: u64,
    pub ignored_records: u64,
}

type LineSet = HashSet<LineKey, FxBuildHasher>;

struct WindowState {
    window: Window,
    current: Option<WindowStats>,
    lines: LineSet,
    done: Vec<WindowStats>,
}

impl WindowState {
    /// Ends the current window; `cumulative_lines` distinct lines were
    /// touched from the start through it.
    fn close(&mut self, line: LineSize, cumulative_lines: u64) {
        if let Some(mut w) = self.current.take() {
            w.unique_lines = self.lines.len() as u64;
            w.unique_bytes = w.unique_lines * line.bytes();
            w.cumulative_lines = cumulative_lines;
            self.done.push(w);
        }
        self.lines.clear();
    }

    fn window_index(&self, time_ns: u64, first_ns: u64, request_index: u64) -> u64 {
        match self.window {
            Window::Duration { nanos } => time_ns.saturating_sub(first_ns) / nanos,
            Window::Requests { count } => request_index / count,
        }
    }
}

/// Reads the whole trace once and characterizes it.
pub fn trace_stats(
    reader: &mut TraceReader,
    line: LineSize,
    window: Option<Window>,
    progress: &mut dyn FnMut(&TraceReader, u64),
) -> Result<TraceStats, SimError> {
    let mut s = TraceStats {
        trace: reader.name().to_string(),
        format: reader.format().to_string(),
        requests: 0,
        read_requests: 0,
        write_requests: 0,
        read_fraction: 0.0,
        read_bytes: 0,
        write_bytes: 0,
        volumes: 0,
        first_time_ns: 0,
        last_time_ns: 0,
        min_request_bytes: 0,
        max_request_bytes: 0,
        mean_request_bytes: 0.0,
        request_sizes: Vec::new(),
        line_size: line.bytes(),
        footprint_lines: 0,
        footprint_bytes: 0,
        read_footprint_lines: 0,
        write_footprint_lines: 0,
        window: None,
        windows: Vec::new(),
        skipped_lines: 0,
        ignored_records: 0,
    };
    let mut all = LineSet::default();
    let mut read_lines = LineSet::default();
    let mut write_lines = LineSet::default();
    let mut volumes: HashSet<u32> = HashSet::new();
    // Bucket i holds sizes in (2^(i-1), 2^i] bytes.
    let mut buckets = [0u64; 65];
    let mut windows = window.map(|w| WindowState {
        window: w,
        current: None,
        lines: LineSet::default(),
        done: Vec::new(),
    });
    // Windows are counted from the first record's time.
    let mut origin_ns = 0;
    while let Some(record) = reader.next() {
        let record = record?;
        let request = request_of(&record);
        let n = s.requests;
        if n == 0 {
            origin_ns = record.time_ns;
            s.first_time_ns = record.time_ns;
            s.min_request_bytes = record.length_bytes;
        }
        s.requests += 1;
        s.first_time_ns = s.first_time_ns.min(record.time_ns);
        s.last_time_ns = s.last_time_ns.max(record.time_ns);
        s.min_request_bytes = s.min_request_bytes.min(record.length_bytes);
        s.max_request_bytes = s.max_request_bytes.max(record.length_bytes);
        volumes.insert(record.volume);
        let bucket = 64 - record.length_bytes.saturating_sub(1).leading_zeros() as usize;
        buckets[bucket] += 1;
        let kind_lines = match request.kind {
            IoKind::Read => {
                s.read_requests += 1;
                s.read_bytes += record.length_bytes;
                &mut read_lines
            }
            IoKind::Write => {
                s.write_requests += 1;
                s.write_bytes += record.length_bytes;
                &mut write_lines
            }
        };
        if let Some(ws) = windows.as_mut() {
            let index = ws.window_index(record.time_ns, origin_ns, n);
            // Records slightly out of time order stay in the current window.
            if ws.current.as_ref().is_none_or(|c| index > c.index) {
                ws.close(line, all.len() as u64);
                ws.current = Some(WindowStats {
                    index,
                    first_time_ns: record.time_ns,
                    requests: 0,
                    unique_lines: 0,
                    unique_bytes: 0,
                    cumulative_lines: 0,
                });
            }
            if let Some(c) = ws.current.as_mut() {
                c.requests += 1;
            }
        }
        for key in split_request_keys(&request, line) {
            all.insert(key);
            kind_lines.insert(key);
            if let Some(ws) = windows.as_mut() {
                ws.lines.insert(key);
            }
        }
        if s.requests.is_multiple_of(65_536) {
            progress(reader, s.requests);
        }
    }
    if let Some(ws) = windows.as_mut() {
        ws.close(line, all.len() as u64);
    }
    let total_bytes = s.read_bytes + s.write_bytes;
    s.read_fraction = if s.requests == 0 {
        0.0
    } else {
        s.read_requests as f64 / s.requests as f64
    };
    s.mean_request_bytes = if s.requests == 0 {
        0.0
    } else {
        total_bytes as f64 / s.requests as f64
    };
    s.request_sizes = buckets
        .iter()
        .enumerate()
        .filter(|(_, &n)| n > 0)
        .map(|(i, &n)| SizeBucket {
            max_bytes: if i == 64 { u64::MAX } else { 1u64 << i },
            requests: n,
        })
        .collect();
    s.volumes = volumes.len() as u64;
    s.footprint_lines = all.len() as u64;
    s.footprint_bytes = s.footprint_lines * line.bytes();
    s.read_footprint_lines = read_lines.len() as u64;
    s.write_footprint_lines = write_lines.len() as u64;
    if let Some(ws) = windows {
        s.window = Some(ws.window.to_string());
        s.windows = ws.done;
    }
    s.skipped_lines = reader.skipped_lines();
    s.ignored_records = reader.ignored_records();
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_parse() {
        assert_eq!(
            "1w".parse::<Window>().unwrap(),
            Window::Duration {
                nanos: 7 * 86_400 * 1_000_000_000
            }
        );
        assert_eq!(
            "500req".parse::<Window>().unwrap(),
            Window::Requests { count: 500 }
        );
        assert!("0s".parse::<Window>().is_err());
        assert!("5 fortnights".parse::<Window>().is_err());
        for text in ["1w", "36h", "90s", "250ms", "100req"] {
            assert_eq!(text.parse::<Window>().unwrap().to_string(), text);
        }
    }
}

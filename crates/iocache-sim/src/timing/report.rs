//! What a timing run reports: request latencies (reads and writes apart),
//! throughput, per-device utilization and queue lengths, and the time series.
//! Everything derives `Serialize`, so the CLI can write JSON; the series
//! also has a CSV form ([`TimingReport::write_series_csv`]).

use std::collections::BTreeMap;

use serde::Serialize;

use super::device::DeviceSpec;
pub use super::histogram::LatencySummary;
pub use super::series::SeriesRow;

/// Totals of one device over the measured span.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DeviceReport {
    pub name: String,
    pub spec: DeviceSpec,
    /// Queue servers, or flash chips.
    pub servers: u32,
    pub ops: u64,
    pub read_ops: u64,
    pub write_ops: u64,
    pub bytes: u64,
    /// Server (chip) busy time summed over servers.
    pub busy_ns: u64,
    /// `busy_ns / (servers × span)`: the mean fraction of servers busy.
    pub utilization: f64,
    /// Mean number of ops in the device, waiting or in service (time-average, L).
    pub mean_in_device: f64,
    /// Mean number of ops waiting for a server (Lq).
    pub mean_waiting: f64,
    pub mean_wait_ns: f64,
    pub mean_response_ns: f64,
    /// The model's own counters (flash: GC erases, page copies, ...).
    pub counters: BTreeMap<String, u64>,
}

/// The result of a timing run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TimingReport {
    /// Requests completed (that arrived after the start of measurement).
    pub requests: u64,
    pub reads: u64,
    pub writes: u64,
    /// Start of measurement: the first arrival, or the last `reset_stats`.
    pub start_ns: u64,
    /// When the last I/O (background included) finished.
    pub end_ns: u64,
    pub span_ns: u64,
    /// Requests per second, from the start to the last request completion.
    pub iops: f64,
    pub read: LatencySummary,
    pub write: LatencySummary,
    pub all: LatencySummary,
    pub cache_device: DeviceReport,
    pub backend_device: DeviceReport,
    /// Arrivals earlier than the model's clock (moved to it).
    pub clamped_arrivals: u64,
    /// `WriteBack` ops submitted as background work.
    pub background_ops: u64,
    pub series_interval_ns: Option<u64>,
    pub series: Vec<SeriesRow>,
    /// The read and write latency distributions (`Histogram::cdf`), for
    /// plots (`sim --report`); not in the JSON.
    #[serde(skip)]
    pub read_cdf: Vec<(f64, u64)>,
    #[serde(skip)]
    pub write_cdf: Vec<(f64, u64)>,
}

impl TimingReport {
    /// Writes the time series as CSV with a header line.
    pub fn write_series_csv(&self, out: &mut dyn std::io::Write) -> std::io::Result<()> {
        writeln!(out, "{}", SeriesRow::CSV_HEADER)?;
        for row in &self.series {
            writeln!(out, "{}", row.csv_record())?;
        }
        Ok(())
    }
}

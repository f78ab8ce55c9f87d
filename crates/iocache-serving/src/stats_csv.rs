//! The statistics snapshot as CSV: each volume's counters since the server
//! started (`iocache stats --csv`), and its rates over one interval
//! (`iocache stats --watch`, also printed as a table).

use crate::stats::{Snapshot, VolumeSnapshot};

/// One volume over one interval of `stats --watch`.
pub struct WatchRow {
    pub time: String,
    pub export: String,
    pub reads_per_second: f64,
    pub writes_per_second: f64,
    pub read_mib_per_second: f64,
    pub write_mib_per_second: f64,
    /// Full line hits over line accesses in the interval (none: no access).
    pub line_hit_ratio: Option<f64>,
    pub dirty_lines: u64,
    pub resident_lines: u64,
    pub failed_requests: u64,
}

impl WatchRow {
    pub const CSV_HEADER: &str = "time,export,reads_per_s,writes_per_s,read_mib_per_s,write_mib_per_s,line_hit_percent,dirty_lines,resident_lines,failed_requests";

    pub fn csv(&self) -> String {
        format!(
            "{},{},{:.1},{:.1},{:.3},{:.3},{},{},{},{}",
            self.time,
            self.export,
            self.reads_per_second,
            self.writes_per_second,
            self.read_mib_per_second,
            self.write_mib_per_second,
            // Percent, as the table and `iocache stats` say it.
            self.line_hit_ratio
                .map_or(String::new(), |r| format!("{:.2}", r * 100.0)),
            self.dirty_lines,
            self.resident_lines,
            self.failed_requests
        )
    }
}

/// Each volume's rates between two `stats` replies `seconds` apart (a
/// volume attached meanwhile counts from zero).
pub fn watch_rows(before: &Snapshot, after: &Snapshot, seconds: f64) -> Vec<WatchRow> {
    let time = time_of_day_utc();
    let seconds = seconds.max(1e-9);
    let mut rows = Vec::new();
    for v in &after.volumes {
        let old = before
            .volumes
            .iter()
            .find(|o| o.export == v.export && o.volume_id == v.volume_id);
        let delta = |count: fn(&VolumeSnapshot) -> u64| count(v).saturating_sub(old.map_or(0, count));
        let accesses = delta(|v| v.line_accesses);
        let hits = delta(|v| v.read_hits) + delta(|v| v.write_hits);
        rows.push(WatchRow {
            time: time.clone(),
            export: v.export.clone(),
            reads_per_second: delta(|v| v.read_requests) as f64 / seconds,
            writes_per_second: delta(|v| v.write_requests) as f64 / seconds,
            read_mib_per_second: delta(|v| v.read_bytes) as f64 / seconds / (1 << 20) as f64,
            write_mib_per_second: delta(|v| v.write_bytes) as f64 / seconds / (1 << 20) as f64,
            line_hit_ratio: (accesses > 0).then(|| hits as f64 / accesses as f64),
            dirty_lines: v.dirty_lines,
            resident_lines: v.resident_lines,
            failed_requests: delta(|v| v.failed_requests),
        });
    }
    rows
}

/// The time of day (UTC), `HH:MM:SS`.
fn time_of_day_utc() -> String {
    let seconds = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs()
        % 86_400;
    format!(
        "{:02}:{:02}:{:02}",
        seconds / 3600,
        seconds / 60 % 60,
        seconds % 60
    )
}

/// A counter of a volume, by its name in the JSON.
type Counter = (&'static str, fn(&VolumeSnapshot) -> u64);

/// `stats --csv`: each volume's counters since the server started.
pub fn totals_csv(snapshot: &Snapshot) -> String {
    const COLUMNS: [Counter; 14] = [
        ("read_requests", |v| v.read_requests),
        ("write_requests", |v| v.write_requests),
        ("read_bytes", |v| v.read_bytes),
        ("write_bytes", |v| v.write_bytes),
        ("line_accesses", |v| v.line_accesses),
        ("read_hits", |v| v.read_hits),
        ("write_hits", |v| v.write_hits),
        ("partial_hits", |v| v.partial_hits),
        ("full_misses", |v| v.full_misses),
        ("failed_requests", |v| v.failed_requests),
        ("resident_lines", |v| v.resident_lines),
        ("dirty_lines", |v| v.dirty_lines),
        ("promotions", |v| v.device.promotions),
        ("evictions", |v| v.device.evictions),
    ];
    let names: Vec<&str> = COLUMNS.iter().map(|(name, _)| *name).collect();
    let mut out = format!("export,{}\n", names.join(","));
    for v in &snapshot.volumes {
        let values: Vec<String> = COLUMNS.iter().map(|(_, value)| value(v).to_string()).collect();
        out += &format!("{},{}\n", v.export, values.join(","));
    }
    out
}

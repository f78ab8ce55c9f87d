//! The time series: per fixed interval of simulated time, completed requests,
//! IOPS, latency percentiles per kind, and per device utilization and queue
//! lengths.
//!
//! Device activity is added as time spans (a server busy from `s` to `e`, an
//! op in the device from arrival to completion, an op waiting from arrival to
//! start), each split over the intervals it overlaps. The engine processes
//! events in time order and never schedules work that starts before the
//! current time, so an interval is final once the clock passes its end; it is
//! then turned into a [`SeriesRow`] and forgotten. Memory is the rows plus the
//! intervals between now and the end of the furthest scheduled work.

use std::collections::VecDeque;

use serde::Serialize;

use super::histogram::Histogram;

/// One interval of the time series. Times are simulated nanoseconds (the
/// replay's clock, after the speed factor); latencies are of the requests
/// that completed in the interval.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct SeriesRow {
    pub start_ns: u64,
    pub end_ns: u64,
    pub reads: u64,
    pub writes: u64,
    /// Requests completed per second of this interval.
    pub iops: f64,
    pub read_mean_ns: f64,
    pub read_p50_ns: u64,
    pub read_p99_ns: u64,
    pub read_p999_ns: u64,
    pub read_p9999_ns: u64,
    pub write_mean_ns: f64,
    pub write_p50_ns: u64,
    pub write_p99_ns: u64,
    pub write_p999_ns: u64,
    pub write_p9999_ns: u64,
    /// Busy server time / (servers × interval).
    pub cache_utilization: f64,
    /// Mean ops in the device (waiting or in service).
    pub cache_queue: f64,
    /// Mean ops waiting for a server.
    pub cache_waiting: f64,
    pub backend_utilization: f64,
    pub backend_queue: f64,
    pub backend_waiting: f64,
}

impl SeriesRow {
    /// The CSV header matching [`SeriesRow::csv_record`].
    pub const CSV_HEADER: &'static str = "start_ns,end_ns,reads,writes,iops,\
read_mean_ns,read_p50_ns,read_p99_ns,read_p999_ns,read_p9999_ns,\
write_mean_ns,write_p50_ns,write_p99_ns,write_p999_ns,write_p9999_ns,\
cache_utilization,cache_queue,cache_waiting,backend_utilization,backend_queue,backend_waiting";

    /// This row as one CSV line (no newline).
    pub fn csv_record(&self) -> String {
        format!(
            "{},{},{},{},{:.3},{:.1},{},{},{},{},{:.1},{},{},{},{},{:.6},{:.6},{:.6},{:.6},{:.6},{:.6}",
            self.start_ns,
            self.end_ns,
            self.reads,
            self.writes,
            self.iops,
            self.read_mean_ns,
            self.read_p50_ns,
            self.read_p99_ns,
            self.read_p999_ns,
            self.read_p9999_ns,
            self.write_mean_ns,
            self.write_p50_ns,
            self.write_p99_ns,
            self.write_p999_ns,
            self.write_p9999_ns,
            self.cache_utilization,
            self.cache_queue,
            self.cache_waiting,
            self.backend_utilization,
            self.backend_queue,
            self.backend_waiting,
        )
    }
}

/// What a span of time is added to.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Span {
    Busy = 0,
    InDevice = 1,
    Waiting = 2,
}

#[derive(Clone, Copy, Default, Debug)]
struct Acc {
    /// [device][span kind], nanoseconds.
    time: [[u64; 3]; 2],
}

#[derive(Debug)]
pub(crate) struct Series {
    interval: u64,
    servers: [u32; 2],
    origin: Option<u64>,
    /// Index of `pending[0]`.
    base: u64,
    pending: VecDeque<Acc>,
    reads: Histogram,
    writes: Histogram,
    pub rows: Vec<SeriesRow>,
}

impl Series {
    pub fn new(interval: u64, servers: [u32; 2]) -> Self {
        Series {
            interval: interval.max(1),
            servers,
            origin: None,
            base: 0,
            pending: VecDeque::new(),
            reads: Histogram::new(),
            writes: Histogram::new(),
            rows: Vec::new(),
        }
    }

    pub fn start(&mut self, t: u64) {
        if self.origin.is_none() {
            self.origin = Some(t);
        }
    }

    fn start_of(&self, index: u64) -> u64 {
        self.origin.unwrap_or(0) + index * self.interval
    }

    fn acc(&mut self, index: u64) -> &mut Acc {
        let i = (index - self.base) as usize;
        if i >= self.pending.len() {
            self.pending.resize(i + 1, Acc::default());
        }
        &mut self.pending[i]
    }

    /// Adds the span `[a, b)` of `device` to the intervals it overlaps.
    pub fn add(&mut self, device: usize, what: Span, a: u64, b: u64) {
        let Some(origin) = self.origin else { return };
        let a = a.max(self.start_of(self.base)).max(origin);
        if b <= a {
            return;
        }
        let mut index = (a - origin) / self.interval;
        let mut t = a;
        while t < b {
            let end = self.start_of(index + 1).min(b);
            self.acc(index).time[device][what as usize] += end - t;
            t = end;
            index += 1;
        }
    }

    /// Closes every interval that ends at or before `now`.
    pub fn advance(&mut self, now: u64) {
        if self.origin.is_none() {
            return;
        }
        while self.start_of(self.base + 1) <= now {
            self.close(self.interval);
        }
    }

    /// Closes the current interval, `len` ns long.
    fn close(&mut self, len: u64) {
        let acc = self.pending.pop_front().unwrap_or_default();
        let start = self.start_of(self.base);
        let len_f = len.max(1) as f64;
        let [r50, r99, r999, r9999] = self.reads.percentiles([0.5, 0.99, 0.999, 0.9999]);
        let [w50, w99, w999, w9999] = self.writes.percentiles([0.5, 0.99, 0.999, 0.9999]);
        let util = |d: usize| acc.time[d][Span::Busy as usize] as f64 / (self.servers[d] as f64 * len_f);
        let mean = |d: usize, s: Span| acc.time[d][s as usize] as f64 / len_f;
        self.rows.push(SeriesRow {
            start_ns: start,
            end_ns: start + len,
            reads: self.reads.count(),
            writes: self.writes.count(),
            iops: (self.reads.count() + self.writes.count()) as f64 * 1e9 / len_f,
            read_mean_ns: self.reads.mean(),
            read_p50_ns: r50,
            read_p99_ns: r99,
            read_p999_ns: r999,
            read_p9999_ns: r9999,
            write_mean_ns: self.writes.mean(),
            write_p50_ns: w50,
            write_p99_ns: w99,
            write_p999_ns: w999,
            write_p9999_ns: w9999,
            cache_utilization: util(0),
            cache_queue: mean(0, Span::InDevice),
            cache_waiting: mean(0, Span::Waiting),
            backend_utilization: util(1),
            backend_queue: mean(1, Span::InDevice),
            backend_waiting: mean(1, Span::Waiting),
        });
        self.reads.clear();
        self.writes.clear();
        self.base += 1;
    }

    /// A request completed now (after `advance(now)`).
    pub fn complete(&mut self, write: bool, latency: u64) {
        if write {
            self.writes.record(latency);
        } else {
            self.reads.record(latency);
        }
    }

    /// Closes every interval up to `end`, the last one possibly short.
    pub fn finish(&mut self, end: u64) {
        if self.origin.is_none() {
            return;
        }
        self.advance(end);
        let start = self.start_of(self.base);
        if end > start || !self.pending.is_empty() || self.reads.count() + self.writes.count() > 0 {
            self.close(end.saturating_sub(start).max(1));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_split_over_intervals() {
        let mut s = Series::new(100, [2, 1]);
        s.start(1000);
        // Busy 1050..1250 on the cache: 50 in [1000,1100), 100 in [1100,1200), 50 in [1200,1300).
        s.add(0, Span::Busy, 1050, 1250);
        s.add(1, Span::InDevice, 1000, 1100);
        s.advance(1100);
        s.complete(false, 7);
        s.advance(1200);
        s.finish(1250);
        assert_eq!(s.rows.len(), 3);
        assert_eq!(s.rows[0].cache_utilization, 50.0 / 200.0);
        assert_eq!(s.rows[0].backend_queue, 1.0);
        assert_eq!(s.rows[1].cache_utilization, 0.5);
        assert_eq!(s.rows[1].reads, 1);
        assert_eq!(s.rows[1].read_p99_ns, 7);
        assert_eq!(s.rows[1].iops, 1e9 / 100.0);
        assert_eq!((s.rows[2].start_ns, s.rows[2].end_ns), (1200, 1250));
        assert_eq!(s.rows[2].cache_utilization, 50.0 / 100.0);
        assert_eq!(
            SeriesRow::CSV_HEADER.split(',').count(),
            s.rows[0].csv_record().split(',').count()
        );
    }
}

//! What a simulated cache did per window of the trace and per volume,
//! without the timing model: `sim --series-every` (a per-window series by
//! trace time or by request count) and `sim --per-volume` (results per
//! volume of a shared cache, SYSTOR'14 §3.1). Request counters come from the
//! cache's own counters around each access; backend traffic from the ops it
//! emitted, attributed to the volume whose data moves.

use std::collections::BTreeMap;

use iocache_core::{Cache, CacheStats, Op, Request, VolumeId};
use serde::Serialize;

use crate::trace_stats::Window;

/// Counts over some span of requests (a window, or the whole run), for all
/// volumes or one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    pub requests: u64,
    pub read_requests: u64,
    pub write_requests: u64,
    /// Line accesses, and the full hits among them (as the run counts them).
    pub accesses: u64,
    pub hits: u64,
    pub read_accesses: u64,
    pub read_hits: u64,
    pub write_accesses: u64,
    pub write_hits: u64,
    pub requested_bytes: u64,
    pub hit_bytes: u64,
    /// Backend reads (`ReadBackend` ops, adjacent lines merged into one) and their bytes.
    pub backend_reads: u64,
    pub backend_read_bytes: u64,
    /// Backend writes: client writes sent there (`WriteBackend`) and dirty
    /// data written back (`WriteBack`), and their bytes.
    pub backend_writes: u64,
    pub backend_write_bytes: u64,
    /// Of the backend writes, the write-backs of dirty data (eviction,
    /// invalidation, flush, restart) and their bytes.
    pub write_backs: u64,
    pub write_back_bytes: u64,
}

impl Counts {
    /// The request counters of `stats` (backend fields stay 0: they come from ops).
    fn of_stats(s: &CacheStats) -> Counts {
        Counts {
            requests: s.requests,
            read_requests: s.read_requests,
            write_requests: s.write_requests,
            accesses: s.accesses,
            hits: s.full_hits,
            read_accesses: s.read_accesses,
            read_hits: s.read_hits,
            write_accesses: s.write_accesses,
            write_hits: s.write_hits,
            requested_bytes: s.requested_bytes,
            hit_bytes: s.hit_bytes,
            ..Counts::default()
        }
    }

    /// Adds the request counters that moved from `before` to `after`.
    fn add_request(&mut self, before: &Counts, after: &Counts) {
        self.requests += after.requests - before.requests;
        self.read_requests += after.read_requests - before.read_requests;
        self.write_requests += after.write_requests - before.write_requests;
        self.accesses += after.accesses - before.accesses;
        self.hits += after.hits - before.hits;
        self.read_accesses += after.read_accesses - before.read_accesses;
        self.read_hits += after.read_hits - before.read_hits;
        self.write_accesses += after.write_accesses - before.write_accesses;
        self.write_hits += after.write_hits - before.write_hits;
        self.requested_bytes += after.requested_bytes - before.requested_bytes;
        self.hit_bytes += after.hit_bytes - before.hit_bytes;
    }

    /// Adds one op's backend traffic.
    fn add_op(&mut self, op: &Op) {
        match *op {
            Op::ReadBackend { length_bytes, .. } => {
                self.backend_reads += 1;
                self.backend_read_bytes += length_bytes;
            }
            Op::WriteBackend { length_bytes, .. } => {
                self.backend_writes += 1;
                self.backend_write_bytes += length_bytes;
            }
            Op::WriteBack { length_bytes, .. } => {
                self.backend_writes += 1;
                self.backend_write_bytes += u64::from(length_bytes);
                self.write_backs += 1;
                self.write_back_bytes += u64::from(length_bytes);
            }
            Op::ReadCache { .. } | Op::WriteCache { .. } | Op::Invalidate { .. } => {}
        }
    }

    pub fn hit_ratio(&self) -> f64 {
        ratio(self.hits, self.accesses)
    }
    pub fn read_hit_ratio(&self) -> f64 {
        ratio(self.read_hits, self.read_accesses)
    }
    pub fn write_hit_ratio(&self) -> f64 {
        ratio(self.write_hits, self.write_accesses)
    }
    pub fn byte_hit_ratio(&self) -> f64 {
        ratio(self.hit_bytes, self.requested_bytes)
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

/// The volume an op's backend traffic belongs to.
fn op_volume(op: &Op) -> Option<VolumeId> {
    match *op {
        Op::ReadBackend { volume, .. } | Op::WriteBackend { volume, .. } | Op::WriteBack { volume, .. } => {
            Some(volume)
        }
        Op::ReadCache { .. } | Op::WriteCache { .. } | Op::Invalidate { .. } => None,
    }
}

/// One window of the series: every volume together (`volume` absent), or
/// one volume (`--per-volume`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SeriesWindow {
    /// Windows without requests are left out, so indices can skip.
    pub index: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub volume: Option<VolumeId>,
    /// Trace time since the first request: the window's bounds for a time
    /// window; its first and last request's times for a request window.
    pub start_ns: u64,
    pub end_ns: u64,
    /// The 0-based number of the window's first request.
    pub first_request: u64,
    #[serde(flatten)]
    pub counts: Counts,
    pub hit_ratio: f64,
    pub read_hit_ratio: f64,
    pub write_hit_ratio: f64,
    pub byte_hit_ratio: f64,
    /// Lines in the cache at the window's end (of this volume with `volume`), and the dirty ones.
    pub resident_lines: u64,
    pub dirty_lines: u64,
}

impl SeriesWindow {
    /// The CSV header matching [`SeriesWindow::csv_record`].
    pub const CSV_HEADER: &'static str = "index,volume,start_ns,end_ns,first_request,requests,\
read_requests,write_requests,accesses,hits,read_accesses,read_hits,write_accesses,write_hits,\
requested_bytes,hit_bytes,backend_reads,backend_read_bytes,backend_writes,backend_write_bytes,\
write_backs,write_back_bytes,hit_ratio,read_hit_ratio,write_hit_ratio,byte_hit_ratio,\
resident_lines,dirty_lines";

    /// This window as one CSV line (no newline); `volume` is empty for the all-volume row.
    pub fn csv_record(&self) -> String {
        let c = &self.counts;
        format!(
            "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{:.6},{:.6},{:.6},{:.6},{},{}",
            self.index,
            self.volume.map(|v| v.to_string()).unwrap_or_default(),
            self.start_ns,
            self.end_ns,
            self.first_request,
            c.requests,
            c.read_requests,
            c.write_requests,
            c.accesses,
            c.hits,
            c.read_accesses,
            c.read_hits,
            c.write_accesses,
            c.write_hits,
            c.requested_bytes,
            c.hit_bytes,
            c.backend_reads,
            c.backend_read_bytes,
            c.backend_writes,
            c.backend_write_bytes,
            c.write_backs,
            c.write_back_bytes,
            self.hit_ratio,
            self.read_hit_ratio,
            self.write_hit_ratio,
            self.byte_hit_ratio,
            self.resident_lines,
            self.dirty_lines,
        )
    }
}

/// One volume's results over the run (after the warmup).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct VolumeResult {
    pub volume: VolumeId,
    #[serde(flatten)]
    pub counts: Counts,
    pub hit_ratio: f64,
    pub read_hit_ratio: f64,
    pub write_hit_ratio: f64,
    pub byte_hit_ratio: f64,
    /// Lines of this volume in the cache after the last request, and the dirty ones.
    pub resident_lines_at_end: u64,
    pub dirty_lines_at_end: u64,
}

/// What to tally besides the run's totals.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TallyOptions {
    /// A per-window series (`--series-every`): by trace time or requests.
    pub series: Option<Window>,
    /// Results per volume, and per volume in each window (`--per-volume`).
    pub per_volume: bool,
}

impl TallyOptions {
    pub fn is_on(&self) -> bool {
        self.series.is_some() || self.per_volume
    }
}

/// The running tally of one simulated cache.
#[derive(Debug)]
pub(crate) struct Tally {
    options: TallyOptions,
    /// The first request's trace time.
    first_ns: Option<u64>,
    /// The current window: its index, first request, first and last trace times.
    window: Option<(u64, u64, u64, u64)>,
    window_total: Counts,
    window_volumes: BTreeMap<VolumeId, Counts>,
    rows: Vec<SeriesWindow>,
    /// Per volume over the run, from the warmup's end.
    run_volumes: BTreeMap<VolumeId, Counts>,
    counting: bool,
    /// The cache's request counters before the current access.
    before: Counts,
}

impl Tally {
    pub(crate) fn new(options: TallyOptions, cache: &mut Cache) -> Tally {
        if options.per_volume && options.series.is_some() {
            // Occupancy per volume at every window's end, without a scan.
            cache.count_volume_lines();
        }
        Tally {
            options,
            first_ns: None,
            window: None,
            window_total: Counts::default(),
            window_volumes: BTreeMap::new(),
            rows: Vec::new(),
            run_volumes: BTreeMap::new(),
            counting: false,
            before: Counts::default(),
        }
    }

    /// Before request number `seq` (0-based) at trace time `trace_ns`: closes
    /// the current window if the request starts a new one.
    pub(crate) fn begin(&mut self, seq: u64, trace_ns: u64, cache: &Cache, counting: bool) {
        self.counting |= counting;
        self.before = Counts::of_stats(cache.stats());
        let Some(every) = self.options.series else { return };
        let first = *self.first_ns.get_or_insert(trace_ns);
        let since = trace_ns.saturating_sub(first);
        let index = match every {
            Window::Requests { count } => seq / count,
            Window::Duration { nanos } => since / nanos,
        };
        match self.window {
            // A time earlier than the window's (times not in order) counts in the current window.
            Some((current, _, _, ref mut last)) if index <= current => *last = (*last).max(since),
            Some(_) => {
                self.close(cache);
                self.window = Some((index, seq, since, since));
            }
            None => self.window = Some((index, seq, since, since)),
        }
    }

    /// From now on the run's per-volume counts count (the warmup is over).
    pub(crate) fn start_counting(&mut self) {
        self.counting = true;
    }

    /// After `request` was served with `ops` (empty when the ops were not kept).
    pub(crate) fn request(&mut self, request: &Request, cache: &Cache, ops: &[Op]) {
        let after = Counts::of_stats(cache.stats());
        let before = self.before;
        if self.options.series.is_some() {
            self.window_total.add_request(&before, &after);
            if self.options.per_volume {
                self.window_volumes
                    .entry(request.volume)
                    .or_default()
                    .add_request(&before, &after);
            }
        }
        if self.options.per_volume && self.counting {
            self.run_volumes
                .entry(request.volume)
                .or_default()
                .add_request(&before, &after);
        }
        self.ops(ops);
    }

    /// Backend traffic of `ops` (a request's, the cleaner's, a restart's).
    pub(crate) fn ops(&mut self, ops: &[Op]) {
        for op in ops {
            let Some(volume) = op_volume(op) else { continue };
            if self.options.series.is_some() {
                self.window_total.add_op(op);
                if self.options.per_volume {
                    self.window_volumes.entry(volume).or_default().add_op(op);
                }
            }
            if self.options.per_volume && self.counting {
                self.run_volumes.entry(volume).or_default().add_op(op);
            }
        }
    }

    fn close(&mut self, cache: &Cache) {
        let Some((index, first_request, start, last)) = self.window.take() else {
            return;
        };
        let (start_ns, end_ns) = match self.options.series {
            Some(Window::Duration { nanos }) => (index * nanos, (index + 1) * nanos),
            _ => (start, last),
        };
        let row = |volume: Option<VolumeId>, counts: Counts, resident: u64, dirty: u64| SeriesWindow {
            index,
            volume,
            start_ns,
            end_ns,
            first_request,
            counts,
            hit_ratio: counts.hit_ratio(),
            read_hit_ratio: counts.read_hit_ratio(),
            write_hit_ratio: counts.write_hit_ratio(),
            byte_hit_ratio: counts.byte_hit_ratio(),
            resident_lines: resident,
            dirty_lines: dirty,
        };
        let total = std::mem::take(&mut self.window_total);
        self.rows
            .push(row(None, total, cache.resident_lines(), cache.dirty_lines()));
        for (volume, counts) in std::mem::take(&mut self.window_volumes) {
            let lines = cache.volume_lines(volume);
            self.rows
                .push(row(Some(volume), counts, lines.resident, lines.dirty));
        }
    }

    /// The series and the per-volume results, busiest volume (most requests) first.
    pub(crate) fn finish(mut self, cache: &mut Cache) -> (Vec<SeriesWindow>, Vec<VolumeResult>) {
        self.close(cache);
        if !self.options.per_volume {
            return (self.rows, Vec::new());
        }
        cache.count_volume_lines();
        let mut volumes: Vec<VolumeResult> = self
            .run_volumes
            .into_iter()
            .map(|(volume, counts)| {
                let lines = cache.volume_lines(volume);
                VolumeResult {
                    volume,
                    counts,
                    hit_ratio: counts.hit_ratio(),
                    read_hit_ratio: counts.read_hit_ratio(),
                    write_hit_ratio: counts.write_hit_ratio(),
                    byte_hit_ratio: counts.byte_hit_ratio(),
                    resident_lines_at_end: lines.resident,
                    dirty_lines_at_end: lines.dirty,
                }
            })
            .collect();
        volumes.sort_by(|a, b| b.counts.requests.cmp(&a.counts.requests).then(a.volume.cmp(&b.volume)));
        (self.rows, volumes)
    }
}

/// `--series-every`: `10000` or `10000req` (requests), or a trace time
/// (`1s`, `500ms`, `1h`), as `trace stats --window` takes it.
pub fn parse_every(text: &str) -> Result<Window, crate::SimError> {
    let t = text.trim();
    if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
        return format!("{t}req").parse();
    }
    t.parse()
}

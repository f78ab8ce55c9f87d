//! What a simulated cache did per window of the trace and per volume,
//! without the timing model: `sim --series-every` (a per-window series by
//! trace time or by request count) and `sim --per-volume` (results per
//! volume of a shared cache, SYSTOR'14 §3.1). Request counters come from the
//! cache's own counters around each access; backend traffic from the ops it
//! emitted, attributed to the volume whose data moves.

use std::collections::BTreeMap;

use iocache_core::stats::ratio;
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
        volumes.sort_by(|a, b| {
            b.counts
                .requests
                .cmp(&a.counts.requests)
                .then(a.volume.cmp(&b.volume))
        });
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{simulate, CacheSettings, CacheSize, RunSpec, SimOptions};
    use iocache_core::{LineSize, PolicySpec};
    use iocache_trace::{ReaderOptions, TraceFormat, TraceReader};

    /// An MSR trace: `(ms since start, disk, write, 4 KiB block)` per request.
    fn trace(records: &[(u64, u32, bool, u64)]) -> TraceReader {
        let mut text = String::new();
        for &(ms, disk, write, block) in records {
            let ticks = 128_166_385_295_514_663u64 + ms * 10_000;
            let kind = if write { "Write" } else { "Read" };
            text += &format!("{ticks},host,{disk},{kind},{},4096,0\n", block * 4096);
        }
        TraceReader::from_bytes("test", text, Some(TraceFormat::Msr), ReaderOptions::default()).unwrap()
    }

    fn spec(lines: u64) -> RunSpec {
        RunSpec {
            policy: "lru".parse::<PolicySpec>().unwrap(),
            size: CacheSize::Lines(lines),
            capacity_lines: lines,
            line_size: LineSize::new(4096).unwrap(),
            settings: CacheSettings::default(),
        }
    }

    fn options(series: Option<Window>, per_volume: bool, warmup: u64) -> SimOptions {
        SimOptions {
            threads: 1,
            warmup_requests: warmup,
            tally: TallyOptions { series, per_volume },
            ..SimOptions::default()
        }
    }

    /// Four windows of four requests on a 4-line LRU cache: A B A B (2
    /// hits), A A A A (4), C D E F (0; the cache now holds C..F, C the
    /// oldest), then A (a miss evicting C), C (a miss evicting D), write C
    /// (a hit), write G (a miss evicting E): 1 hit, C and G dirty.
    fn known() -> Vec<(u64, u32, bool, u64)> {
        let blocks = [
            (false, 0),
            (false, 1),
            (false, 0),
            (false, 1),
            (false, 0),
            (false, 0),
            (false, 0),
            (false, 0),
            (false, 2),
            (false, 3),
            (false, 4),
            (false, 5),
            (false, 0),
            (false, 2),
            (true, 2),
            (true, 6),
        ];
        blocks
            .iter()
            .enumerate()
            .map(|(i, &(w, b))| (i as u64 * 10, 0, w, b))
            .collect()
    }

    #[test]
    fn a_known_trace_gives_the_expected_window_hit_ratios() {
        for every in [
            Window::Requests { count: 4 },
            Window::Duration { nanos: 40_000_000 },
        ] {
            let report = simulate(
                &mut trace(&known()),
                &[spec(4)],
                &options(Some(every), false, 0),
                &mut |_, _| {},
            )
            .unwrap();
            let run = &report.runs[0];
            let ratios: Vec<f64> = run.series.iter().map(|w| w.hit_ratio).collect();
            assert_eq!(ratios, [0.5, 1.0, 0.0, 0.25], "{every:?}");
            let last = &run.series[3];
            assert_eq!((last.counts.read_hits, last.counts.write_hits), (0, 1));
            assert_eq!((last.resident_lines, last.dirty_lines), (4, 2));
            assert_eq!(run.series[2].counts.backend_reads, 4);
            assert_eq!(
                run.series.iter().map(|w| w.first_request).collect::<Vec<_>>(),
                [0, 4, 8, 12]
            );
            if let Window::Duration { .. } = every {
                assert_eq!((last.start_ns, last.end_ns), (120_000_000, 160_000_000));
            }
        }
    }

    /// A trace with three volumes, reads and writes, reuse and evictions.
    fn mixed() -> Vec<(u64, u32, bool, u64)> {
        let mut x = 12345u64;
        (0..5000)
            .map(|i| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let r = x >> 33;
                (i / 3, (r % 3) as u32, r.is_multiple_of(5), (r >> 4) % 700)
            })
            .collect()
    }

    #[test]
    fn windows_and_volumes_add_up_to_the_run() {
        let lines = 256;
        for warmup in [0, 1000] {
            let plain = simulate(
                &mut trace(&mixed()),
                &[spec(lines)],
                &options(None, false, warmup),
                &mut |_, _| {},
            )
            .unwrap();
            let report = simulate(
                &mut trace(&mixed()),
                &[spec(lines)],
                &options(Some(Window::Duration { nanos: 100_000_000 }), true, warmup),
                &mut |_, _| {},
            )
            .unwrap();
            let run = &report.runs[0];
            // Tallying changes nothing the run counts.
            assert_eq!(run.stats, plain.runs[0].stats);
            let s = &run.stats;
            let all: Vec<&SeriesWindow> = run.series.iter().filter(|w| w.volume.is_none()).collect();
            assert!(all.len() > 10);
            let sum = |f: &dyn Fn(&Counts) -> u64, rows: &[&SeriesWindow]| -> u64 {
                rows.iter().map(|w| f(&w.counts)).sum()
            };
            if warmup == 0 {
                assert_eq!(sum(&|c| c.requests, &all), s.requests);
                assert_eq!(sum(&|c| c.hits, &all), s.full_hits);
                assert_eq!(sum(&|c| c.accesses, &all), s.accesses);
                assert_eq!(sum(&|c| c.backend_read_bytes, &all), s.backend_read_bytes);
                assert_eq!(sum(&|c| c.backend_write_bytes, &all), s.backend_write_bytes);
            } else {
                assert_eq!(sum(&|c| c.requests, &all), s.requests + warmup);
            }
            // The volumes of each window add up to the window.
            for w in &all {
                let parts: Vec<&SeriesWindow> = run
                    .series
                    .iter()
                    .filter(|v| v.volume.is_some() && v.index == w.index)
                    .collect();
                assert_eq!(parts.len(), 3);
                assert_eq!(sum(&|c| c.hits, &parts), w.counts.hits);
                assert_eq!(
                    sum(&|c| c.backend_write_bytes, &parts),
                    w.counts.backend_write_bytes
                );
                assert_eq!(
                    parts.iter().map(|p| p.resident_lines).sum::<u64>(),
                    w.resident_lines
                );
                assert_eq!(parts.iter().map(|p| p.dirty_lines).sum::<u64>(), w.dirty_lines);
            }
            // The volumes of the run add up to its totals (after the warmup).
            let v = &run.volumes;
            assert_eq!(v.len(), 3);
            assert!(v.windows(2).all(|p| p[0].counts.requests >= p[1].counts.requests));
            assert_eq!(v.iter().map(|v| v.counts.requests).sum::<u64>(), s.requests);
            assert_eq!(v.iter().map(|v| v.counts.hits).sum::<u64>(), s.full_hits);
            assert_eq!(v.iter().map(|v| v.counts.read_hits).sum::<u64>(), s.read_hits);
            assert_eq!(v.iter().map(|v| v.counts.hit_bytes).sum::<u64>(), s.hit_bytes);
            assert_eq!(
                v.iter().map(|v| v.counts.backend_read_bytes).sum::<u64>(),
                s.backend_read_bytes
            );
            assert_eq!(
                v.iter().map(|v| v.counts.backend_write_bytes).sum::<u64>(),
                s.backend_write_bytes
            );
            assert_eq!(
                v.iter().map(|v| v.resident_lines_at_end).sum::<u64>(),
                run.resident_lines_at_end
            );
            assert_eq!(
                v.iter().map(|v| v.dirty_lines_at_end).sum::<u64>(),
                run.dirty_lines_at_end
            );
            assert!(
                s.full_hits > 0 && s.dirty_writebacks > 0,
                "the trace exercises hits and write-backs"
            );
        }
    }

    /// `simulate_each` (the lab's one pass over points with different
    /// options) gives each run what `simulate` gives it alone.
    #[test]
    fn each_run_with_its_own_options_equals_the_run_alone() {
        use crate::timing::{parse_device, ArrivalMode};
        use crate::{simulate_each, RestartKeep, Restarts, TimingSetup};
        let timed = SimOptions {
            timing: Some(TimingSetup {
                cache: parse_device("optane").unwrap(),
                backend: parse_device("ssd-raid5").unwrap(),
                arrivals: ArrivalMode::Open { speed: 4.0 },
                series_interval_ns: None,
            }),
            ..options(None, false, 300)
        };
        let restarted = SimOptions {
            restarts: Some(Restarts {
                every_ns: 200_000_000,
                at_ns: Vec::new(),
                keep: RestartKeep::Dirty,
            }),
            ..options(Some(Window::Requests { count: 1000 }), true, 0)
        };
        let plain = options(None, false, 0);
        let runs = vec![(spec(128), timed), (spec(256), restarted), (spec(512), plain)];
        for threads in [1, 3] {
            let together = simulate_each(&mut trace(&mixed()), &runs, threads, &mut |_, _| {}).unwrap();
            for (i, (spec, options)) in runs.iter().enumerate() {
                let alone = simulate(
                    &mut trace(&mixed()),
                    std::slice::from_ref(spec),
                    options,
                    &mut |_, _| {},
                )
                .unwrap();
                let (a, b) = (&alone.runs[0], &together.runs[i]);
                assert_eq!(a.stats, b.stats, "run {i}");
                assert_eq!(a.restarts, b.restarts);
                assert_eq!(a.series, b.series);
                assert_eq!(a.volumes, b.volumes);
                assert_eq!(
                    a.timing.as_ref().map(|t| (t.all.p99_ns, t.iops.to_bits())),
                    b.timing.as_ref().map(|t| (t.all.p99_ns, t.iops.to_bits()))
                );
            }
            assert!(together.runs[0].timing.is_some() && together.runs[1].restarts > 0);
        }
    }

    #[test]
    fn every_takes_requests_or_time() {
        assert_eq!(parse_every("10000").unwrap(), Window::Requests { count: 10000 });
        assert_eq!(parse_every("5req").unwrap(), Window::Requests { count: 5 });
        assert_eq!(
            parse_every("2s").unwrap(),
            Window::Duration { nanos: 2_000_000_000 }
        );
        assert!(parse_every("0").is_err() && parse_every("soon").is_err());
    }
}

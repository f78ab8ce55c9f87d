//! The simulation loop: one pass over a trace feeds every configured cache.
//!
//! The main thread parses the trace into batches of requests; each batch is
//! shared (not copied) with worker threads, which share the caches out
//! among themselves batch by batch.
//! Memory is bounded by the batch size and channel depth, not by trace length.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::sync_channel;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use iocache_core::{
    AccessHints, Cache, CacheStats, FlushOrder, FlushToken, IoKind, OpList, Readahead, Readaheader, Request,
};
use iocache_trace::{TraceReader, TraceRecord};

use crate::adapt::{AdaptReport, AdaptSpec, Adapter};
use crate::error::SimError;
use crate::spec::RunSpec;
use crate::tally::{SeriesWindow, Tally, TallyOptions, VolumeResult};
use crate::timing::{ArrivalMode, DeviceSpec, Replay, TimingConfig, TimingError, TimingModel, TimingReport};

/// Requests per batch handed to the workers.
pub const BATCH_REQUESTS: usize = 16 * 1024;
/// Batches queued per worker before the parser waits.
const QUEUE_BATCHES: usize = 4;
/// How many requests ahead of the one being served the runner starts
/// loading the index positions of a request's lines
/// ([`Cache::prefetch_ahead`]; the request's own walk then loads the slots
/// they name). Chosen on the ARC trace P2 (`scripts/bench-sim-baseline.sh`).
const LOOKAHEAD_REQUESTS: usize = 6;

/// Device timing for every run: the same devices and arrival mode for each cache.
#[derive(Clone, Debug)]
pub struct TimingSetup {
    pub cache: DeviceSpec,
    pub backend: DeviceSpec,
    pub arrivals: ArrivalMode,
    /// Time-series interval, if a series is wanted.
    pub series_interval_ns: Option<u64>,
}

#[derive(Clone, Debug)]
pub struct SimOptions {
    /// Requests that only warm the caches before counting starts.
    pub warmup_requests: u64,
    /// Worker threads at most; 1 runs everything on the calling thread, more
    /// also moves trace parsing off the simulating threads.
    pub threads: usize,
    /// Model device time (latency, IOPS) as well as decisions.
    pub timing: Option<TimingSetup>,
    /// Knobs changed during the replay, in the order given (each applied
    /// to every simulated cache before the first request its trigger
    /// reaches, through the same `Cache::apply` the engine uses).
    pub reconfigure: Vec<Reconfigure>,
    /// `--adapt reca`: ReCA's controller beside every cache (`reca.rs`).
    pub reca: Option<crate::reca::RecaOptions>,
    /// An adaptive controller driving every cache (needs `timing`).
    pub adapt: Option<AdaptSpec>,
    /// Restarts of every cache during the replay, and what survives them.
    pub restarts: Option<Restarts>,
    /// A per-window series and per-volume results without the timing model (`tally.rs`).
    pub tally: TallyOptions,
}

/// `--restart-every DURATION[:persistence=all|dirty|none]`: every
/// `every_ns` of trace time the cache is restarted cleanly; or
/// `at=T1/T2/...[:persistence=...]`: at those trace times (from the first
/// request). What a restart keeps depends on the persistence mode, as in
/// the engine (SYSTOR'14 Fig. 19): `all` keeps every line; `dirty` keeps
/// the dirty lines only (the clean ones are dropped); `none` writes the
/// dirty lines back and starts empty.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Restarts {
    /// The interval; 0 when the restarts are at `at_ns`.
    pub every_ns: u64,
    /// Restart times (ns of trace time from the first request), ascending.
    pub at_ns: Vec<u64>,
    pub keep: RestartKeep,
}

impl Restarts {
    /// The trace time of restart number `n` (0-based), if there is one.
    fn point_ns(&self, n: u64) -> Option<u64> {
        if self.every_ns > 0 {
            return Some((n + 1).saturating_mul(self.every_ns));
        }
        self.at_ns.get(n as usize).copied()
    }
}

/// What a restart keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RestartKeep {
    All,
    Dirty,
    None,
}

impl std::str::FromStr for Restarts {
    type Err = SimError;
    fn from_str(text: &str) -> Result<Restarts, SimError> {
        let bad = |why: &str| {
            SimError::Spec(format!(
                "--restart-every `{text}`: {why} (DURATION or at=T1/T2/..., then [:persistence=all|dirty|none])"
            ))
        };
        let mut parts = text.trim().split(':');
        let when = parts.next().unwrap_or("");
        let (every_ns, at_ns) = match when.strip_prefix("at=") {
            Some(list) => {
                let mut at_ns = Vec::new();
                for t in list.split('/') {
                    let ns = crate::timing::parse_duration_ns(t).map_err(|e| bad(&e.to_string()))?;
                    if at_ns.last().is_some_and(|&last| ns <= last) {
                        return Err(bad("the times must increase"));
                    }
                    at_ns.push(ns);
                }
                (0, at_ns)
            }
            None => {
                let every_ns = crate::timing::parse_duration_ns(when).map_err(|e| bad(&e.to_string()))?;
                if every_ns == 0 {
                    return Err(bad("the interval must be above 0"));
                }
                (every_ns, Vec::new())
            }
        };
        let mut keep = RestartKeep::All;
        for part in parts {
            keep = match part.split_once('=') {
                Some(("persistence", "all")) => RestartKeep::All,
                Some(("persistence", "dirty")) => RestartKeep::Dirty,
                Some(("persistence", "none")) => RestartKeep::None,
                _ => return Err(bad(&format!("`{part}` is not persistence=all, dirty or none"))),
            };
        }
        Ok(Restarts {
            every_ns,
            at_ns,
            keep,
        })
    }
}

impl Default for SimOptions {
    fn default() -> Self {
        SimOptions {
            warmup_requests: 0,
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            timing: None,
            reconfigure: Vec::new(),
            reca: None,
            adapt: None,
            restarts: None,
            tally: TallyOptions::default(),
        }
    }
}

/// When a reconfiguration applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trigger {
    /// Before the request with this 0-based number.
    Request(u64),
    /// Before the first request at or after this trace time (ns since the
    /// trace's first request).
    TimeNs(u64),
}

/// `--reconfigure TRIGGER:KEY=VALUE[,KEY=VALUE...]`.
#[derive(Clone, Debug, PartialEq)]
pub struct Reconfigure {
    pub at: Trigger,
    pub settings: Vec<iocache_core::Setting>,
}

impl std::str::FromStr for Reconfigure {
    type Err = SimError;
    /// `100000:write_policy=wt,policy=arc` (before request 100000) or
    /// `30s:write_policy=wt` (from trace time 30 s on).
    fn from_str(text: &str) -> Result<Reconfigure, SimError> {
        let bad = |why: String| SimError::Spec(format!("--reconfigure `{text}`: {why}"));
        let (at, rest) = text
            .split_once(':')
            .ok_or_else(|| bad("expected REQUEST_OR_TIME:KEY=VALUE[,KEY=VALUE...]".into()))?;
        let at = if at.chars().all(|c| c.is_ascii_digit()) && !at.is_empty() {
            Trigger::Request(
                at.parse()
                    .map_err(|_| bad(format!("request number `{at}` too large")))?,
            )
        } else {
            Trigger::TimeNs(
                iocache_core::units::parse_duration_ns(at)
                    .map_err(|e| bad(format!("`{at}` is neither a request number nor a time: {e}")))?,
            )
        };
        let settings = rest
            .split(',')
            .map(|kv| {
                kv.parse::<iocache_core::Setting>()
                    .map_err(|e| bad(e.to_string()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Reconfigure { at, settings })
    }
}

/// The outcome of one simulated cache.
#[derive(Clone, Debug)]
pub struct RunResult {
    pub spec: RunSpec,
    /// Counters after warmup.
    pub stats: CacheStats,
    /// Time spent inside this cache's decisions, warmup included (trace parsing excluded).
    pub wall_seconds: f64,
    /// Line accesses simulated, warmup included (the work `wall_seconds` measures).
    pub simulated_accesses: u64,
    pub resident_lines_at_end: u64,
    pub dirty_lines_at_end: u64,
    /// The replacement policy's own counters at the end (warmup included).
    pub policy_counters: Vec<(&'static str, u64)>,
    /// Latency, throughput and device load, when timing was modelled (after warmup).
    pub timing: Option<TimingReport>,
    /// What ReCA's controller did, with `--adapt reca`.
    pub reca: Option<crate::reca::RecaRun>,
    /// The adaptive controller's intervals and decisions, with `--adapt`.
    pub adapt: Option<AdaptReport>,
    /// Restarts during the replay (`--restart-every`).
    pub restarts: u64,
    /// The per-window series (`--series-every`; warmup included), empty without.
    pub series: Vec<SeriesWindow>,
    /// The series' window (`--series-every`).
    pub series_every: Option<crate::trace_stats::Window>,
    /// Per-volume results after the warmup, busiest first (`--per-volume`), empty without.
    pub volumes: Vec<VolumeResult>,
}

/// The results of one simulation: every run, and the trace's totals.
/// Serialized, it gives the totals of the JSON report
/// ([`crate::report::JsonReport`]), which writes the runs itself.
#[derive(Clone, Debug, serde::Serialize)]
pub struct SimReport {
    #[serde(skip)]
    pub runs: Vec<RunResult>,
    /// Data records read from the trace.
    pub trace_records: u64,
    pub warmup_requests: u64,
    pub skipped_lines: u64,
    pub ignored_records: u64,
    /// Threads that ran caches (with `SimOptions::threads` > 1 the trace is
    /// parsed on the calling thread besides these).
    pub threads: usize,
    /// Whole simulation, parsing included.
    pub wall_seconds: f64,
}

/// Turns a trace record into a core request, widened to whole sectors.
pub fn request_of(record: &TraceRecord) -> Request {
    let kind = match record.kind {
        iocache_trace::IoKind::Read => IoKind::Read,
        iocache_trace::IoKind::Write => IoKind::Write,
    };
    Request {
        volume: record.volume,
        offset_bytes: record.offset_bytes,
        length_bytes: record.length_bytes,
        kind,
        now_ns: record.time_ns,
        process: record.process,
    }
    .aligned_outward()
}

/// A run's device model and arrival process.
struct Timed {
    model: TimingModel,
    replay: Replay,
    adapter: Option<Adapter>,
}

struct Runner {
    index: usize,
    timed: Option<Timed>,
    spec: RunSpec,
    cache: Cache,
    ops: OpList,
    tokens: Vec<FlushToken>,
    processed: u64,
    warm_base: Option<CacheStats>,
    busy: Duration,
    /// The reconfigurations, and how many were applied.
    reconfigure: Vec<Reconfigure>,
    reconfigured: usize,
    /// The first request's trace time (time triggers count from it).
    first_ns: Option<u64>,
    reca: Option<crate::reca::RecaDriver>,
    restarts: Option<Restarts>,
    /// Restarts done so far, and the volumes seen (whose lines they drop).
    restarts_done: u64,
    volumes_seen: std::collections::BTreeSet<iocache_core::VolumeId>,
    /// Requests that only warm this cache.
    warmup_requests: u64,
    /// The series and per-volume counts, when asked for.
    tally: Option<Tally>,
    tally_options: TallyOptions,
    /// The readahead decisions (off unless the cache's setting says).
    readahead: Readaheader,
}

impl Runner {
    fn new(index: usize, spec: &RunSpec, options: &SimOptions) -> Result<Self, SimError> {
        let timing = options.timing.as_ref();
        let adapt = options.adapt.as_ref();
        let timed = match timing {
            None if adapt.is_some() => {
                return Err(SimError::Spec(
                    "--adapt needs the timing model (--timing): controllers read the device queues".into(),
                ))
            }
            None => None,
            Some(t) => {
                let config = TimingConfig {
                    cache: t.cache.clone(),
                    backend: t.backend.clone(),
                    line_bytes: spec.line_size.bytes(),
                    series_interval_ns: t.series_interval_ns,
                };
                let timing_error = |e: TimingError| SimError::Spec(e.to_string());
                let mut model = TimingModel::new(&config).map_err(timing_error)?;
                let adapter = adapt.map(|a| {
                    model.track_queues();
                    Adapter::new(a, &t.cache, &t.backend, config.line_bytes, t.series_interval_ns)
                });
                Some(Timed {
                    model,
                    replay: Replay::new(t.arrivals).map_err(timing_error)?,
                    adapter,
                })
            }
        };
        let mut cache = Cache::new(spec.cache_config())?;
        let tally = options
            .tally
            .is_on()
            .then(|| Tally::new(options.tally, &mut cache));
        Ok(Runner {
            index,
            timed,
            spec: spec.clone(),
            cache,
            ops: OpList::new(),
            tokens: Vec::new(),
            processed: 0,
            warm_base: None,
            busy: Duration::ZERO,
            reconfigure: Vec::new(),
            reconfigured: 0,
            first_ns: None,
            reca: options
                .reca
                .as_ref()
                .map(|r| crate::reca::RecaDriver::new(r, timing.is_none())),
            restarts: options.restarts.clone(),
            restarts_done: 0,
            volumes_seen: std::collections::BTreeSet::new(),
            warmup_requests: options.warmup_requests,
            tally,
            tally_options: options.tally,
            readahead: Readaheader::new(spec.settings.readahead, spec.line_size),
        })
    }

    fn feed(&mut self, batch: &[Request]) {
        let started = Instant::now();
        let warmup_requests = self.warmup_requests;
        for (at, request) in batch.iter().enumerate() {
            // Start loading what the requests a little ahead will touch (a
            // hint only: the cache's decisions do not change).
            if let Some(ahead) = batch.get(at + LOOKAHEAD_REQUESTS) {
                self.cache.prefetch_ahead(ahead);
            }
            if let Some(tally) = &mut self.tally {
                // Windows go by trace time, whatever the replay's clock.
                tally.begin(
                    self.processed,
                    request.now_ns,
                    &self.cache,
                    self.processed > warmup_requests,
                );
            }
            // With timing, the cache's clock is the arrival time the model gives
            // (trace time / speed, or the closed loop's next free slot).
            let mut request = *request;
            if let Some(t) = &mut self.timed {
                request.now_ns = t.replay.next_arrival(&mut t.model, request.now_ns);
            }
            self.clean_until(request.now_ns);
            self.reconfigure_until(&request);
            self.restart_until(&request);
            if self.processed == warmup_requests {
                self.warm_base = Some(self.total_stats());
                if let Some(t) = &mut self.timed {
                    t.model.reset_stats();
                }
                if let Some(tally) = &mut self.tally {
                    tally.start_counting();
                }
            }
            let hints = match &mut self.timed {
                Some(Timed {
                    model,
                    adapter: Some(adapter),
                    ..
                }) => adapter.before_request(request.now_ns, request.kind, &mut self.cache, model),
                _ => AccessHints::default(),
            };
            // Requests were validated when the batch was built. Only the
            // timing model reads the ops; without it the cache only counts.
            if let Some(t) = &mut self.timed {
                let _ = self.cache.access_with(&request, hints, &mut self.ops);
                t.model.submit(request.now_ns, request.kind, self.ops.ops());
            } else if self.tally.is_some() {
                let _ = self.cache.access_with(&request, hints, &mut self.ops);
            } else {
                let _ = self.cache.access_counted(&request, hints);
            }
            if let Some(tally) = &mut self.tally {
                tally.request(&request, &self.cache, self.ops.ops());
            }
            // The extent a process's larger line size asks for (ReCA per
            // process), fetched as a readahead fill is.
            if let Some(fill) = self.cache.take_extent_fill() {
                self.fetch_ahead(fill);
            }
            if let Some(reca) = &mut self.reca {
                reca.after_access(&mut self.cache, &request);
            }
            self.read_ahead(&request);
            self.processed += 1;
        }
        self.busy += started.elapsed();
    }

    /// Restarts the cache as many times as `request`'s trace time passes
    /// restart points (counted from the first request).
    fn restart_until(&mut self, request: &Request) {
        let Some(r) = &self.restarts else { return };
        self.volumes_seen.insert(request.volume);
        let first = *self.first_ns.get_or_insert(request.now_ns);
        let elapsed = request.now_ns.saturating_sub(first);
        let keep = r.keep;
        while r.point_ns(self.restarts_done).is_some_and(|at| elapsed >= at) {
            self.restarts_done += 1;
            match keep {
                RestartKeep::All => {}
                RestartKeep::Dirty => {
                    for &v in &self.volumes_seen {
                        self.cache.drop_clean_lines(v, &mut self.ops);
                    }
                }
                RestartKeep::None => {
                    // A clean stop writes every dirty line back first.
                    self.cache
                        .begin_flush(FlushOrder::Oldest, usize::MAX, &mut self.ops, &mut self.tokens);
                    if let Some(tally) = &mut self.tally {
                        tally.ops(self.ops.ops());
                    }
                    for token in std::mem::take(&mut self.tokens) {
                        self.cache.complete_flush(&token, true);
                    }
                    for &v in &self.volumes_seen {
                        self.cache.drop_clean_lines(v, &mut self.ops);
                    }
                }
            }
        }
    }

    /// Applies the reconfigurations whose trigger `request` reaches.
    fn reconfigure_until(&mut self, request: &Request) {
        let first = *self.first_ns.get_or_insert(request.now_ns);
        while let Some(r) = self.reconfigure.get(self.reconfigured) {
            let due = match r.at {
                Trigger::Request(n) => self.processed >= n,
                Trigger::TimeNs(t) => request.now_ns.saturating_sub(first) >= t,
            };
            if !due {
                return;
            }
            for setting in &r.settings {
                // Checked when parsed; a policy that cannot be built for
                // this cache was refused before the replay started.
                let _ = self.cache.apply(setting, request.now_ns);
            }
            self.reconfigured += 1;
        }
    }

    /// Runs the readahead after `request`: the fill it asks for, at once
    /// (in the timing model, as background work).
    #[inline]
    fn read_ahead(&mut self, request: &Request) {
        let config = self.cache.config();
        if matches!(config.readahead, Readahead::Off) && matches!(self.readahead.config(), Readahead::Off) {
            return;
        }
        if self.readahead.config() != config.readahead || self.readahead.line() != config.line_size {
            self.readahead = Readaheader::new(config.readahead, config.line_size);
        }
        let Some(fill) = self
            .readahead
            .on_request(request, self.cache.readahead_feedback())
        else {
            return;
        };
        self.fetch_ahead(fill);
    }

    /// Fetches `fill` into the cache as a readahead fill, at once (in the
    /// timing model, as background work).
    #[inline(never)]
    fn fetch_ahead(&mut self, fill: Request) {
        let hints = AccessHints {
            prefetch: true,
            ..AccessHints::default()
        };
        if self.timed.is_none() && self.tally.is_none() {
            let _ = self.cache.access_counted(&fill, hints);
            return;
        }
        let _ = self.cache.access_with(&fill, hints, &mut self.ops);
        if let Some(t) = &mut self.timed {
            t.model.submit_background(fill.now_ns, self.ops.ops());
        }
        if let Some(tally) = &mut self.tally {
            tally.ops(self.ops.ops());
        }
    }

    /// Runs the background cleaner at each wake-up due by `now_ns` (trace time).
    /// The simulator has no devices, so every flush completes at once.
    fn clean_until(&mut self, now_ns: u64) {
        while let Some(at) = self.cache.next_cleaning_ns() {
            if at > now_ns {
                return;
            }
            self.cache.run_cleaner(at, &mut self.ops, &mut self.tokens);
            if self.tokens.is_empty() {
                return;
            }
            if let Some(t) = &mut self.timed {
                t.model.submit_background(at, self.ops.ops());
            }
            if let Some(tally) = &mut self.tally {
                tally.ops(self.ops.ops());
            }
            for token in &self.tokens {
                self.cache.complete_flush(token, true);
            }
        }
    }

    /// Counters over the whole replay (a ReCA line-size change replaces the cache).
    fn total_stats(&self) -> CacheStats {
        match &self.reca {
            Some(reca) => reca.total(&self.cache),
            None => *self.cache.stats(),
        }
    }

    fn finish(mut self) -> (usize, RunResult) {
        let adapt = self
            .timed
            .as_mut()
            .and_then(|t| t.adapter.take())
            .map(|a| a.finish(&mut self.cache));
        let (series, volumes) = match self.tally.take() {
            Some(tally) => tally.finish(&mut self.cache),
            None => (Vec::new(), Vec::new()),
        };
        let now = self.total_stats();
        let base = self.warm_base.unwrap_or(now);
        (
            self.index,
            RunResult {
                spec: self.spec,
                stats: now.since(&base),
                wall_seconds: self.busy.as_secs_f64(),
                simulated_accesses: now.accesses,
                resident_lines_at_end: self.cache.resident_lines(),
                dirty_lines_at_end: self.cache.dirty_lines(),
                policy_counters: self.cache.policy_counters(),
                timing: self.timed.map(|t| t.model.finish()),
                reca: self.reca.map(crate::reca::RecaDriver::finish),
                adapt,
                restarts: self.restarts_done,
                series,
                series_every: self.tally_options.series,
                volumes,
            },
        )
    }
}

/// Reads the next batch of requests; `Ok(empty)` at the end of the trace.
fn next_batch(reader: &mut TraceReader, records: &mut u64) -> Result<Vec<Request>, SimError> {
    let mut batch = Vec::with_capacity(BATCH_REQUESTS);
    while let Some(record) = reader.next() {
        let request = request_of(&record?);
        if let Err(e) = request.validate() {
            return Err(SimError::Spec(format!(
                "{}: record {}: {e}",
                reader.name(),
                *records + 1
            )));
        }
        batch.push(request);
        *records += 1;
        if batch.len() == BATCH_REQUESTS {
            break;
        }
    }
    Ok(batch)
}

/// One worker's share of batch `batch_no`: takes caches from `taken` (which
/// counts from `first` for this batch) until none is left, feeding each the
/// batch once it has fed the previous one.
fn feed_shared(
    shared: &[Mutex<(Runner, usize)>],
    taken: &AtomicUsize,
    first: usize,
    batch_no: usize,
    batch: &[Request],
) {
    let end = first + shared.len();
    loop {
        let at = taken.load(Ordering::Relaxed);
        if at >= end {
            return;
        }
        if taken
            .compare_exchange_weak(at, at + 1, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
        {
            continue;
        }
        let cache = &shared[at - first];
        loop {
            // A poisoned lock means another worker panicked: stop too (the
            // caller reports the first panic).
            let mut guard = cache
                .lock()
                .unwrap_or_else(|_| panic!("a simulation worker panicked"));
            let (runner, fed) = &mut *guard;
            if *fed == batch_no {
                runner.feed(batch);
                *fed += 1;
                break;
            }
            drop(guard);
            std::thread::yield_now();
        }
    }
}

/// Runs every spec over the trace in one pass. `progress` is called after each batch.
pub fn simulate(
    reader: &mut TraceReader,
    specs: &[RunSpec],
    options: &SimOptions,
    progress: &mut dyn FnMut(&TraceReader, u64),
) -> Result<SimReport, SimError> {
    let runs: Vec<(RunSpec, SimOptions)> = specs.iter().map(|s| (s.clone(), options.clone())).collect();
    let mut report = simulate_each(reader, &runs, options.threads, progress)?;
    report.warmup_requests = options.warmup_requests;
    Ok(report)
}

/// Runs every spec, each with its own options (timing, adaptation,
/// restarts, warmup, tally), over the trace in one pass, as `simulate`
/// runs one set of options (`iocache lab` runs a grid over those knobs this
/// way). `threads` is [`SimOptions::threads`] for the whole pass; the
/// report's `warmup_requests` is the first run's.
pub fn simulate_each(
    reader: &mut TraceReader,
    runs: &[(RunSpec, SimOptions)],
    threads: usize,
    progress: &mut dyn FnMut(&TraceReader, u64),
) -> Result<SimReport, SimError> {
    let started = Instant::now();
    let mut runners = runs
        .iter()
        .enumerate()
        .map(|(i, (spec, options))| Runner::new(i, spec, options))
        .collect::<Result<Vec<_>, _>>()?;
    // Reconfigurations are checked once against every cache (a policy that
    // cannot be built for one is refused before the replay), then kept in
    // trigger order.
    for (runner, (_, options)) in runners.iter_mut().zip(runs) {
        for r in &options.reconfigure {
            for setting in &r.settings {
                if let iocache_core::Setting::Policy(p) = setting {
                    p.build(runner.spec.capacity_lines as usize)
                        .map_err(|e| SimError::Spec(format!("--reconfigure {setting}: {e}")))?;
                }
            }
        }
        runner.reconfigure = options.reconfigure.clone();
    }
    // With more than one core, the calling thread parses while workers
    // simulate, even for a single cache; with one, everything runs inline.
    let inline = threads <= 1;
    let threads = threads.clamp(1, runners.len().max(1));
    let warmup = runs.first().map_or(0, |(_, o)| o.warmup_requests);
    let mut records = 0u64;

    let mut finished: Vec<(usize, RunResult)> = if inline {
        loop {
            let batch = next_batch(reader, &mut records)?;
            if batch.is_empty() {
                break;
            }
            for runner in &mut runners {
                runner.feed(&batch);
            }
            progress(reader, records);
        }
        runners.into_iter().map(Runner::finish).collect()
    } else {
        // Every worker sees every batch and takes caches for it one at a
        // time from a shared count, so the work balances whatever the
        // caches cost (a 512-byte-line cache can cost ten times a 4 KiB
        // one). Each cache still takes the batches in order: a worker that
        // takes a cache for batch k waits until it has fed batch k - 1.
        let caches = runners.len();
        let shared: Vec<Mutex<(Runner, usize)>> = runners.into_iter().map(|r| Mutex::new((r, 0))).collect();
        let taken = AtomicUsize::new(0);
        std::thread::scope(|scope| -> Result<(), SimError> {
            let mut senders = Vec::new();
            let mut handles = Vec::new();
            for _ in 0..threads {
                let (tx, rx) = sync_channel::<Arc<Vec<Request>>>(QUEUE_BATCHES);
                senders.push(tx);
                let (shared, taken) = (&shared, &taken);
                handles.push(scope.spawn(move || {
                    for (batch_no, batch) in rx.into_iter().enumerate() {
                        feed_shared(shared, taken, batch_no * caches, batch_no, &batch);
                    }
                }));
            }
            let fed = (|| {
                loop {
                    let batch = next_batch(reader, &mut records)?;
                    if batch.is_empty() {
                        return Ok(());
                    }
                    let batch = Arc::new(batch);
                    for tx in &senders {
                        // A worker only hangs up by panicking; join reports that below.
                        let _ = tx.send(Arc::clone(&batch));
                    }
                    progress(reader, records);
                }
            })();
            drop(senders);
            for handle in handles {
                if let Err(panic) = handle.join() {
                    std::panic::resume_unwind(panic);
                }
            }
            fed
        })?;
        shared
            .into_iter()
            .map(|cache| {
                let (runner, _) = cache.into_inner().unwrap_or_else(|e| e.into_inner());
                runner.finish()
            })
            .collect()
    };
    finished.sort_by_key(|(i, _)| *i);
    Ok(SimReport {
        runs: finished.into_iter().map(|(_, r)| r).collect(),
        trace_records: records,
        warmup_requests: warmup,
        skipped_lines: reader.skipped_lines(),
        ignored_records: reader.ignored_records(),
        threads,
        wall_seconds: started.elapsed().as_secs_f64(),
    })
}

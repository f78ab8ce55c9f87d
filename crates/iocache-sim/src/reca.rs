//! `iocache sim --adapt reca` runs ReCA's controller
//! (iocache_core::reca) beside each simulated cache, applies its decisions
//! at the request that closed the window, rebuilds the cache when a
//! category wants another line size (`relayout`: the core cannot change a
//! cache's line size in place, so this is the simulator's doing), and keeps
//! what happened: the change events and one row per window (hit ratios,
//! category, line size). `reca_characterize` is the same characterization
//! without a cache, for `iocache trace stats --reca`.

use iocache_core::reca::{
    relayout, CategoryTable, Classified, Classifier, Features, RecaController, RecaControllerParams,
    RecaEvent, FEATURE_NAMES,
};
use iocache_core::stats::ratio;
use iocache_core::{Cache, CacheStats, Request};
use iocache_trace::TraceReader;
use serde::Serialize;

use crate::error::SimError;
use crate::run::request_of;

/// What `--adapt reca` needs.
#[derive(Clone, Debug)]
pub struct RecaOptions {
    pub table: CategoryTable,
    pub params: RecaControllerParams,
}

/// Reads ReCA's category table: `path`, or the built-in one without.
/// Returns it with where it came from; its errors name the file, the line
/// and the field.
pub fn read_table(path: Option<&std::path::Path>) -> Result<(CategoryTable, String), SimError> {
    match path {
        None => Ok((
            CategoryTable::builtin(),
            iocache_core::reca::BUILTIN_TABLE_SOURCE.into(),
        )),
        Some(path) => {
            let shown = path.display().to_string();
            let text = std::fs::read_to_string(path).map_err(|source| SimError::File {
                path: shown.clone(),
                source,
            })?;
            Ok((CategoryTable::parse(&text, &shown)?, shown))
        }
    }
}

impl RecaOptions {
    /// The options of a category table (the built-in one without a path)
    /// and a window of `window_requests` (at least 1).
    pub fn load(table: Option<&std::path::Path>, window_requests: u64) -> Result<RecaOptions, SimError> {
        if window_requests == 0 {
            return Err(SimError::Spec("a ReCA window is at least 1 request".into()));
        }
        let (table, _) = read_table(table)?;
        let params = RecaControllerParams {
            window_requests,
            ..RecaControllerParams::default()
        };
        Ok(RecaOptions { table, params })
    }
}

/// One window of an adaptive run.
#[derive(Clone, Debug, Serialize)]
pub struct RecaWindowRow {
    pub index: u64,
    /// Requests replayed when the window closed.
    pub requests: u64,
    pub time_ns: u64,
    /// The category chosen from this window (in force from its end).
    pub category: String,
    /// Requests classified in the window (they left the history queue).
    pub classified: u64,
    /// The change test closed the window before its length.
    pub early: bool,
    /// The distance of the workload vector to every category, in table order.
    pub distances: Vec<CategoryDistance>,
    /// The line size the window's requests were served with.
    pub line_bytes: u64,
    /// The write policy they were served with (the effective one).
    pub write_policy: String,
    /// The replacement policy, with its parameters, they were served with.
    pub policy: String,
    pub accesses: u64,
    pub hit_ratio: f64,
    pub read_hit_ratio: f64,
    pub write_hit_ratio: f64,
    pub byte_hit_ratio: f64,
    /// The workload vector, in `FEATURE_NAMES` order.
    pub features: [f64; 7],
    /// The category change made at the window's end, if it changed.
    pub change: Option<RecaChange>,
    /// Per-process characterization: the processes whose category changed
    /// at the window's end, one `process N: old -> new (write policy P)`
    /// each.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub process_changes: Vec<String>,
}

/// One category's distance from a window's workload vector.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CategoryDistance {
    pub category: String,
    pub distance: f64,
}

/// A category change at the end of a window.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RecaChange {
    /// The category before (none before the first window).
    pub old: Option<String>,
    pub new: String,
    /// What changed, one `what: old -> new` each (write policy, policy,
    /// line size), and what a rebuild did or why none was made.
    pub changes: Vec<String>,
    /// The rebuild for a new line size, when one was made.
    pub relayout: Option<RecaRelayout>,
}

/// One rebuild of the cache for a new line size.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RecaRelayout {
    pub line_bytes: u64,
    pub lines: u64,
    /// Bytes a runtime would copy between slots.
    pub moved_bytes: u64,
    /// Dirty bytes written back because they did not fit.
    pub written_back_bytes: u64,
    /// Clean bytes dropped because they did not fit.
    pub dropped_clean_bytes: u64,
}

impl RecaWindowRow {
    pub fn csv_header() -> String {
        let mut h = String::from(
            "window,requests,time_ns,category,line_bytes,accesses,hit_ratio,read_hit_ratio,write_hit_ratio,byte_hit_ratio",
        );
        for name in FEATURE_NAMES {
            h.push(',');
            h.push_str(name);
        }
        h.push_str(
            ",write_policy,policy,new_category,relayout_line_bytes,moved_bytes,written_back_bytes,dropped_clean_bytes,early",
        );
        h
    }

    pub fn csv_record(&self) -> String {
        let mut r = format!(
            "{},{},{},{},{},{},{:.6},{:.6},{:.6},{:.6}",
            self.index,
            self.requests,
            self.time_ns,
            self.category,
            self.line_bytes,
            self.accesses,
            self.hit_ratio,
            self.read_hit_ratio,
            self.write_hit_ratio,
            self.byte_hit_ratio
        );
        for f in self.features {
            r.push_str(&format!(",{f:.4}"));
        }
        let change = self.change.as_ref();
        let relayout = change.and_then(|c| c.relayout).unwrap_or_default();
        r.push_str(&format!(
            ",{},{},{},{},{},{},{},{}",
            self.write_policy,
            crate::report::csv_field(&self.policy),
            change.map(|c| c.new.as_str()).unwrap_or_default(),
            relayout.line_bytes,
            relayout.moved_bytes,
            relayout.written_back_bytes,
            relayout.dropped_clean_bytes,
            self.early
        ));
        r
    }
}

/// What ReCA did during one run: the windows with their decisions, and
/// totals (the JSON of a run carries it; `events` is the text's).
#[derive(Clone, Debug, Default, Serialize)]
pub struct RecaRun {
    /// Requests per window.
    pub window_requests: u64,
    #[serde(skip)]
    pub events: Vec<RecaEvent>,
    pub windows: Vec<RecaWindowRow>,
    /// Windows whose category differed from the one before (the first included).
    pub category_changes: u64,
    /// Per-process characterization: processes' category changes (a
    /// process's first category and its forgetting included).
    pub process_changes: u64,
    /// Caches rebuilt for a new line size.
    pub relayouts: u64,
    /// Bytes a runtime would copy between slots to rebuild them.
    pub moved_bytes: u64,
    /// Dirty bytes written back because they did not fit.
    pub written_back_bytes: u64,
    /// Clean bytes dropped because they did not fit.
    pub dropped_clean_bytes: u64,
}

/// The controller beside one simulated cache.
pub(crate) struct RecaDriver {
    controller: RecaController,
    run: RecaRun,
    /// Counters of the caches replaced by a relayout (with the relayout's
    /// own traffic), so totals span the whole replay.
    carried: CacheStats,
    window_base: CacheStats,
    /// Whether line-size changes are applied (not with a timing model,
    /// whose slots have a fixed size).
    line_size_changes: bool,
}

impl RecaDriver {
    pub(crate) fn new(options: &RecaOptions, line_size_changes: bool) -> RecaDriver {
        RecaDriver {
            controller: RecaController::new(options.table.clone(), options.params),
            run: RecaRun {
                window_requests: options.params.window_requests,
                ..RecaRun::default()
            },
            carried: CacheStats::default(),
            window_base: CacheStats::default(),
            line_size_changes,
        }
    }

    /// Totals over the replay: the replaced caches' and `cache`'s.
    pub(crate) fn total(&self, cache: &Cache) -> CacheStats {
        let mut t = self.carried;
        t.merge(cache.stats());
        t
    }

    /// After `request` was served: counts it, and at a window's end
    /// records the window and applies a category change.
    pub(crate) fn after_access(&mut self, cache: &mut Cache, request: &Request) {
        let Some(report) = self.controller.observe(request) else {
            return;
        };
        let total = self.total(cache);
        let w = total.since(&self.window_base);
        self.window_base = total;
        let table = self.controller.table();
        let category = table.categories[report.category].name.clone();
        let distances = table
            .categories
            .iter()
            .zip(&report.distances)
            .map(|(c, &distance)| CategoryDistance {
                category: c.name.clone(),
                distance,
            })
            .collect();
        self.run.windows.push(RecaWindowRow {
            index: report.index,
            requests: report.requests,
            time_ns: request.now_ns,
            category,
            classified: report.classified,
            early: report.early,
            distances,
            line_bytes: cache.line_size().bytes(),
            write_policy: cache.effective_mode().policy.to_string(),
            policy: cache.config().policy.to_string(),
            accesses: w.accesses,
            hit_ratio: w.hit_ratio(),
            read_hit_ratio: ratio(w.read_hits, w.read_accesses),
            write_hit_ratio: ratio(w.write_hits, w.write_accesses),
            byte_hit_ratio: w.byte_hit_ratio(),
            features: report.features.0,
            change: None,
            process_changes: Vec::new(),
        });
        if !report.processes.is_empty() {
            let lines = self.controller.apply_processes(cache, &report.processes);
            self.run.process_changes += lines.len() as u64;
            if let Some(window) = self.run.windows.last_mut() {
                window.process_changes = lines;
            }
        }
        let Some(mut event) = report.change else {
            return;
        };
        // Policies were checked when the table was read; a failure here is
        // a bug, reported in the event rather than stopping the replay.
        if let Err(e) = self.controller.apply(cache, &mut event, request.now_ns) {
            event.changes.push(format!("not applied: {e}"));
        }
        let mut relayout = None;
        if let Some(line) = event.line_size {
            if self.line_size_changes {
                relayout = self.change_line_size(cache, line, request.now_ns, &mut event);
            } else {
                event
                    .changes
                    .push("line size not changed: the timing model's slots have a fixed size".into());
            }
        }
        if let Some(window) = self.run.windows.last_mut() {
            window.change = Some(RecaChange {
                old: event.old.clone(),
                new: event.new.clone(),
                changes: event.changes.clone(),
                relayout,
            });
        }
        self.run.category_changes += 1;
        self.run.events.push(event);
    }

    fn change_line_size(
        &mut self,
        cache: &mut Cache,
        line: iocache_core::LineSize,
        now_ns: u64,
        event: &mut RecaEvent,
    ) -> Option<RecaRelayout> {
        match relayout(cache, line, now_ns) {
            Ok(r) => {
                let sector = iocache_core::SECTOR_BYTES;
                let mut old = *cache.stats();
                // The rebuild's traffic: written-back dirty sectors, and
                // the copy of every kept sector to its new slot.
                old.backend_write_bytes += r.written_back_sectors * sector;
                old.cache_read_bytes += (r.written_back_sectors + r.kept_sectors) * sector;
                old.cache_write_bytes += r.kept_sectors * sector;
                self.carried.merge(&old);
                let done = RecaRelayout {
                    line_bytes: line.bytes(),
                    lines: r.cache.capacity_lines(),
                    moved_bytes: r.kept_sectors * sector,
                    written_back_bytes: r.written_back_sectors * sector,
                    dropped_clean_bytes: r.dropped_clean_sectors * sector,
                };
                self.run.relayouts += 1;
                self.run.moved_bytes += done.moved_bytes;
                self.run.written_back_bytes += done.written_back_bytes;
                self.run.dropped_clean_bytes += done.dropped_clean_bytes;
                event.changes.push(format!(
                    "cache rebuilt: {} lines, {} KiB kept, {} KiB written back, {} KiB clean dropped",
                    done.lines,
                    done.moved_bytes / 1024,
                    done.written_back_bytes / 1024,
                    done.dropped_clean_bytes / 1024
                ));
                *cache = r.cache;
                Some(done)
            }
            Err(e) => {
                event.changes.push(format!("line size not changed: {e}"));
                None
            }
        }
    }

    pub(crate) fn finish(self) -> RecaRun {
        self.run
    }
}

/// One window of a characterization without a cache.
#[derive(Clone, Debug, Serialize)]
pub struct RecaWindowClass {
    pub index: u64,
    pub requests: u64,
    pub classified: u64,
    pub features: [f64; 7],
    pub category: String,
    pub distance: f64,
}

/// ReCA's view of a whole trace: class shares overall and per window.
#[derive(Clone, Debug, Serialize)]
pub struct RecaCharacterization {
    pub window_requests: u64,
    pub classified: u64,
    /// Over the whole trace, in `FEATURE_NAMES` order.
    pub features: [f64; 7],
    pub category: String,
    pub distances: Vec<(String, f64)>,
    pub windows: Vec<RecaWindowClass>,
    /// Per stream (volume), most classified requests first.
    pub volumes: Vec<RecaVolumeClass>,
}

/// One stream's class shares over the whole trace: a volume, or a process
/// on a volume when the trace names processes (`process` is 0 otherwise).
#[derive(Clone, Debug, Serialize)]
pub struct RecaVolumeClass {
    pub volume: u32,
    pub process: u32,
    pub classified: u64,
    pub features: [f64; 7],
    pub category: String,
}

/// Classifies every request of the trace and matches the whole trace and
/// each window of `params.window_requests` requests against `table`.
pub fn reca_characterize(
    reader: &mut TraceReader,
    table: &CategoryTable,
    params: RecaControllerParams,
) -> Result<RecaCharacterization, SimError> {
    let mut classifier = Classifier::new(params.classifier);
    let mut out: Vec<Classified> = Vec::new();
    let mut total = [0u64; 7];
    let mut window = [0u64; 7];
    let mut classified = 0u64;
    let mut window_classified = 0u64;
    let mut in_window = 0u64;
    let mut windows = Vec::new();
    let mut per_volume: std::collections::HashMap<(u32, u32), [u64; 8]> = std::collections::HashMap::new();
    let mut count = |out: &mut Vec<Classified>, total: &mut [u64; 7], window: &mut [u64; 7]| {
        for c in out.drain(..) {
            let f = iocache_core::reca::table::feature_of(&c.class);
            let v = per_volume.entry((c.volume, c.process)).or_default();
            v[f] += 1;
            v[7] += 1;
            if c.class.overlapped {
                v[6] += 1;
            }
            for counts in [&mut *total, &mut *window] {
                counts[f] += 1;
                if c.class.overlapped {
                    counts[6] += 1;
                }
            }
        }
    };
    let close = |window: &mut [u64; 7], n: u64, in_window: u64, windows: &mut Vec<RecaWindowClass>| {
        let f = Features::from_counts(window, n);
        let (best, d) = table.nearest(&f);
        windows.push(RecaWindowClass {
            index: windows.len() as u64,
            requests: in_window,
            classified: n,
            features: f.0,
            category: table.categories[best].name.clone(),
            distance: d[best],
        });
        *window = [0; 7];
    };
    let window_requests = params.window_requests.max(1);
    for record in reader.by_ref() {
        let request = request_of(&record?);
        in_window += 1;
        let before = out.len();
        classifier.push(&request, &mut out);
        let n = (out.len() - before) as u64;
        classified += n;
        window_classified += n;
        count(&mut out, &mut total, &mut window);
        if in_window == window_requests {
            close(&mut window, window_classified, in_window, &mut windows);
            window_classified = 0;
            in_window = 0;
        }
    }
    let before = out.len();
    classifier.drain_all(&mut out);
    let n = (out.len() - before) as u64;
    classified += n;
    window_classified += n;
    count(&mut out, &mut total, &mut window);
    if in_window > 0 {
        close(&mut window, window_classified, in_window, &mut windows);
    }
    let mut volumes: Vec<RecaVolumeClass> = per_volume
        .into_iter()
        .map(|((volume, process), c)| {
            let counts: [u64; 7] = c[..7].try_into().expect("7 counts");
            let f = Features::from_counts(&counts, c[7]);
            RecaVolumeClass {
                volume,
                process,
                classified: c[7],
                features: f.0,
                category: table.categories[table.nearest(&f).0].name.clone(),
            }
        })
        .collect();
    volumes.sort_by(|a, b| {
        b.classified
            .cmp(&a.classified)
            .then(a.volume.cmp(&b.volume))
            .then(a.process.cmp(&b.process))
    });
    let f = Features::from_counts(&total, classified);
    let (best, d) = table.nearest(&f);
    Ok(RecaCharacterization {
        window_requests,
        classified,
        features: f.0,
        category: table.categories[best].name.clone(),
        distances: table
            .categories
            .iter()
            .zip(d)
            .map(|(c, d)| (c.name.clone(), d))
            .collect(),
        windows,
        volumes,
    })
}

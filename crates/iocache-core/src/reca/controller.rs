//! ReCA's online part (TPDS'18 §4, Algorithm 1 lines
//! 39-42 and Algorithm 2 ANALYZE_WORKLOAD): every window of requests
//! (100,000 in the paper) the share of each request class forms a workload
//! vector, the nearest category of the table is chosen, and when it differs
//! from the current one the cache is reconfigured for it. The controller
//! decides; it changes a cache only through the doors every adaptive
//! controller uses: `Cache::set_controller_policy` for the write policy
//! (`mode::resolve` reports it as the controller's) and `Cache::apply` with
//! a `Setting::Policy` for the `reca` policy's parameters (taken in place,
//! so priorities survive). A line size cannot be changed on a running core
//! cache: the controller reports the line size it wants, and the driver
//! (the simulator) rebuilds its cache with it.
//!
//! A phase change inside a window does not wait for its end: the window is
//! cut into probes (`probes_per_window`), and when two probes in a row are
//! nearer another category than the one in force, by at least
//! [`CHANGE_MARGIN`], the window closes early with those two probes' vector
//! (a change test on the running vector; without it a new phase runs a
//! whole window, e.g. 100,000 requests, on the old phase's line size).
//!
//! Per process (`per_process`, TPDS'18 §6.4 and Fig. 17): the requests of
//! each process (the `process` a request carries) are also counted apart,
//! and at each window's end every process with enough classified requests
//! gets the category nearest its own vector. The controller then sets apart
//! for the process's requests alone what one shared cache can honour of
//! that category (`Cache::set_process_settings`, `ProcessSettings`): its
//! write policy; its line size as what a read miss fills (the aligned
//! extent of a larger line, only the sectors asked for with a smaller one;
//! the cache keeps its own line size); and, when the cache runs `reca`, its
//! priority weights for the lines the process's requests touch. The
//! eviction rule, the neighbour eviction and the cache's line size stay the
//! cache-wide category's: one cache has one layout and one replacement
//! order. A process (nearly) silent for
//! [`PROCESS_IDLE_WINDOWS`] windows is forgotten (all it had set apart
//! withdrawn), and at most
//! [`MAX_PROCESSES`] are followed (later ones follow the cache-wide
//! category).
//!
//! Every category change is a [`RecaEvent`] (request number, time, old and
//! new category, distance to every category, the vector, what changed).
//! No I/O, no clock: time comes with each request. Memory: the classifier's
//! bound, and 7 counters.

use super::classify::{Classified, Classifier, ClassifierParams};
use super::table::{feature_of, Category, CategoryTable, Features};
use crate::addr::{LineSize, Request};
use crate::cache::{Cache, ProcessSettings};
use crate::error::CoreError;
use crate::fasthash::FxHashMap;
use crate::setting::Setting;
use crate::units::format_byte_size;

/// The controller's parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecaControllerParams {
    /// Requests per window (Workload_Check_Threshold; the paper: 100,000).
    pub window_requests: u64,
    /// Probes a window is cut into for the change test (0: none; a window
    /// then always runs its length). Probes are at least
    /// [`MIN_PROBE_REQUESTS`] long.
    pub probes_per_window: u64,
    pub classifier: ClassifierParams,
    /// Characterize each process apart as well, and give each what the
    /// cache can set apart of its category (see the module doc).
    pub per_process: bool,
}

/// How much nearer another category a probe must be than the category in
/// force (Euclidean distance over the 7 shares) to count towards a change.
pub const CHANGE_MARGIN: f64 = 0.1;

/// The shortest probe: fewer requests say too little of a workload.
pub const MIN_PROBE_REQUESTS: u64 = 500;

/// Probes in a row that must point at the same other category.
const PROBES_TO_CHANGE: u32 = 2;

impl Default for RecaControllerParams {
    fn default() -> Self {
        RecaControllerParams {
            window_requests: 100_000,
            probes_per_window: 10,
            classifier: ClassifierParams::default(),
            per_process: false,
        }
    }
}

/// Processes followed apart at the most (per-process characterization).
pub const MAX_PROCESSES: usize = 1024;

/// Windows in a row with too few classified requests to characterize it
/// after which a process is forgotten, and its write policy withdrawn.
pub const PROCESS_IDLE_WINDOWS: u32 = 4;

/// A process's category change at a window's end (per-process
/// characterization); `new` is `None` when the process was forgotten.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessChange {
    pub process: u32,
    pub old: Option<usize>,
    pub new: Option<usize>,
}

/// One process's counts in the window in progress, and its category.
#[derive(Clone, Copy, Default)]
struct ProcessWindow {
    counts: [u64; 7],
    classified: u64,
    category: Option<usize>,
    idle_windows: u32,
}

/// One window's characterization.
#[derive(Clone, Debug, PartialEq)]
pub struct WindowReport {
    /// 0 for the first window.
    pub index: u64,
    /// Requests observed when the window closed (including this window's).
    pub requests: u64,
    pub now_ns: u64,
    /// Requests classified during the window (they left the history queue).
    pub classified: u64,
    pub features: Features,
    /// The nearest category (index in the table) and the distances to all.
    pub category: usize,
    pub distances: Vec<f64>,
    /// Set when the category differs from the one before.
    pub change: Option<RecaEvent>,
    /// The window was closed before its length by the change test; its
    /// vector is then that of the probes that found the change.
    pub early: bool,
    /// Per-process characterization: the processes whose category changed.
    pub processes: Vec<ProcessChange>,
}

/// A category change.
#[derive(Clone, Debug, PartialEq)]
pub struct RecaEvent {
    pub requests: u64,
    pub now_ns: u64,
    pub old: Option<String>,
    pub new: String,
    /// (category, distance) for every category, in table order.
    pub distances: Vec<(String, f64)>,
    pub features: Features,
    /// What changed, one `what: old -> new` each; filled by
    /// [`RecaController::apply`].
    pub changes: Vec<String>,
    /// The line size the new category wants when it differs from the
    /// cache's (the driver applies it, see the module doc).
    pub line_size: Option<LineSize>,
}

impl std::fmt::Display for RecaEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "reca: request {} t={:.3}s {} -> {} [{}] distances:",
            self.requests,
            self.now_ns as f64 / 1e9,
            self.old.as_deref().unwrap_or("(none)"),
            self.new,
            self.features
        )?;
        for (name, d) in &self.distances {
            write!(f, " {name}={d:.3}")?;
        }
        if !self.changes.is_empty() {
            write!(f, "; {}", self.changes.join("; "))?;
        }
        Ok(())
    }
}

/// Windows, categories and reconfiguration (see the module doc).
pub struct RecaController {
    params: RecaControllerParams,
    table: CategoryTable,
    classifier: Classifier,
    out: Vec<Classified>,
    counts: [u64; 7],
    classified: u64,
    in_window: u64,
    requests: u64,
    windows: u64,
    current: Option<usize>,
    /// The change test: the probe in progress, the probe before it, and
    /// the other category the last probes were nearer (with how many).
    probe: Probe,
    last_probe: Probe,
    candidate: Option<(usize, u32)>,
    /// Requests per probe; 0: no change test.
    probe_requests: u64,
    /// Per-process characterization: each followed process's window.
    processes: FxHashMap<u32, ProcessWindow>,
}

/// One probe's requests and class counts.
#[derive(Clone, Copy, Default)]
struct Probe {
    requests: u64,
    counts: [u64; 7],
    classified: u64,
}

impl RecaController {
    pub fn new(table: CategoryTable, mut params: RecaControllerParams) -> RecaController {
        params.window_requests = params.window_requests.max(1);
        let probe_requests = match params.probes_per_window {
            0 => 0,
            n => Some(params.window_requests / n)
                .filter(|&len| len >= MIN_PROBE_REQUESTS)
                .unwrap_or(0),
        };
        RecaController {
            classifier: Classifier::new(params.classifier),
            params,
            table,
            out: Vec::new(),
            counts: [0; 7],
            classified: 0,
            in_window: 0,
            requests: 0,
            windows: 0,
            current: None,
            probe: Probe::default(),
            last_probe: Probe::default(),
            candidate: None,
            probe_requests,
            processes: FxHashMap::default(),
        }
    }

    pub fn table(&self) -> &CategoryTable {
        &self.table
    }

    pub fn params(&self) -> RecaControllerParams {
        self.params
    }

    /// The category in force, if one was chosen.
    pub fn current(&self) -> Option<&Category> {
        self.current.map(|i| &self.table.categories[i])
    }

    /// Puts the category at `index` in force now (a starting category, or
    /// an operator's choice); returns the change event if it is a change.
    /// Panics if `index` is not in the table.
    pub fn set_category(&mut self, index: usize, requests: u64, now_ns: u64) -> Option<RecaEvent> {
        let category = &self.table.categories[index];
        let event = (self.current != Some(index)).then(|| RecaEvent {
            requests,
            now_ns,
            old: self.current.map(|i| self.table.categories[i].name.clone()),
            new: category.name.clone(),
            distances: Vec::new(),
            features: Features::default(),
            changes: Vec::new(),
            line_size: None,
        });
        self.current = Some(index);
        event
    }

    /// Counts `request`; when it closes a window, returns the window's
    /// report (with a change event when the category changed).
    pub fn observe(&mut self, request: &Request) -> Option<WindowReport> {
        self.requests += 1;
        self.in_window += 1;
        self.out.clear();
        self.classifier.push(request, &mut self.out);
        for c in &self.out {
            let f = feature_of(&c.class);
            self.counts[f] += 1;
            self.probe.counts[f] += 1;
            if c.class.overlapped {
                self.counts[6] += 1;
                self.probe.counts[6] += 1;
            }
            self.classified += 1;
            self.probe.classified += 1;
            if self.params.per_process && c.process != 0 {
                let room = self.processes.len() < MAX_PROCESSES;
                if room || self.processes.contains_key(&c.process) {
                    let p = self.processes.entry(c.process).or_default();
                    p.counts[f] += 1;
                    p.counts[6] += u64::from(c.class.overlapped);
                    p.classified += 1;
                }
            }
        }
        if self.in_window < self.params.window_requests {
            return self.probe_changed(request.now_ns);
        }
        // Before any category is in force, a window that classified
        // nothing (every stream's queue still filling, e.g. many volumes)
        // goes on until something is: an empty vector says nothing of the
        // workload, and would put an arbitrary category in force.
        if self.current.is_none() && self.classified == 0 {
            return None;
        }
        Some(self.close_window(request.now_ns))
    }

    /// Closes the window in progress (the end of a trace); `None` if no
    /// request was classified in it.
    pub fn finish(&mut self, now_ns: u64) -> Option<WindowReport> {
        (self.classified > 0).then(|| self.close_window(now_ns))
    }

    /// At the end of a probe: whether it and the one before point at
    /// another category than the one in force; if so the window closes
    /// now, with their vector.
    fn probe_changed(&mut self, now_ns: u64) -> Option<WindowReport> {
        self.probe.requests += 1;
        if self.probe_requests == 0 || self.probe.requests < self.probe_requests {
            return None;
        }
        let probe = std::mem::take(&mut self.probe);
        let current = self.current?;
        if probe.classified == 0 {
            self.candidate = None;
            return None;
        }
        let (best, distances) = self
            .table
            .nearest(&Features::from_counts(&probe.counts, probe.classified));
        let nearer = best != current && distances[current] - distances[best] >= CHANGE_MARGIN;
        self.candidate = match self.candidate {
            _ if !nearer => None,
            Some((c, n)) if c == best => Some((c, n + 1)),
            _ => Some((best, 1)),
        };
        let last = std::mem::replace(&mut self.last_probe, probe);
        if self.candidate.is_some_and(|(_, n)| n >= PROBES_TO_CHANGE) {
            // The window's vector is the probes' that found the change:
            // the older part of the window is the phase that ended.
            for (c, (a, b)) in self.counts.iter_mut().zip(probe.counts.iter().zip(&last.counts)) {
                *c = a + b;
            }
            self.classified = probe.classified + last.classified;
            let mut report = self.close_window(now_ns);
            report.early = true;
            return Some(report);
        }
        None
    }

    fn close_window(&mut self, now_ns: u64) -> WindowReport {
        let features = Features::from_counts(&self.counts, self.classified);
        let (best, distances) = self.table.nearest(&features);
        // A window with nothing classified keeps the category in force.
        let category = match self.current {
            Some(cur) if self.classified == 0 => cur,
            _ => best,
        };
        let change = (self.current != Some(category)).then(|| RecaEvent {
            requests: self.requests,
            now_ns,
            old: self.current.map(|i| self.table.categories[i].name.clone()),
            new: self.table.categories[category].name.clone(),
            distances: self
                .table
                .categories
                .iter()
                .zip(&distances)
                .map(|(c, &d)| (c.name.clone(), d))
                .collect(),
            features,
            changes: Vec::new(),
            line_size: None,
        });
        self.current = Some(category);
        let report = WindowReport {
            index: self.windows,
            requests: self.requests,
            now_ns,
            classified: self.classified,
            features,
            category,
            distances,
            change,
            early: false,
            processes: self.close_process_windows(),
        };
        self.windows += 1;
        self.counts = [0; 7];
        self.classified = 0;
        self.in_window = 0;
        self.probe = Probe::default();
        self.last_probe = Probe::default();
        self.candidate = None;
        report
    }

    /// The fewest classified requests that give a process a category at a
    /// window's end: a twentieth of a window, at most a probe's minimum.
    fn process_min_classified(&self) -> u64 {
        (self.params.window_requests / 20).clamp(1, MIN_PROBE_REQUESTS)
    }

    /// At a window's end: each process with enough classified requests
    /// takes its nearest category; processes idle too long are forgotten.
    /// Returns the changes, by process.
    fn close_process_windows(&mut self) -> Vec<ProcessChange> {
        let min = self.process_min_classified();
        let mut changes = Vec::new();
        for (&process, p) in self.processes.iter_mut() {
            let old = p.category;
            if p.classified >= min {
                let features = Features::from_counts(&p.counts, p.classified);
                p.category = Some(self.table.nearest(&features).0);
                p.idle_windows = 0;
            } else {
                p.idle_windows += 1;
                if p.idle_windows >= PROCESS_IDLE_WINDOWS {
                    p.category = None;
                }
            }
            p.counts = [0; 7];
            p.classified = 0;
            if p.category != old {
                changes.push(ProcessChange {
                    process,
                    old,
                    new: p.category,
                });
            }
        }
        self.processes
            .retain(|_, p| p.category.is_some() || p.idle_windows < PROCESS_IDLE_WINDOWS);
        changes.sort_unstable_by_key(|c| c.process);
        changes
    }

    /// The category of each followed process that has one, by process.
    pub fn process_categories(&self) -> Vec<(u32, &Category)> {
        let mut all: Vec<_> = (self.processes.iter())
            .filter_map(|(&process, p)| Some((process, &self.table.categories[p.category?])))
            .collect();
        all.sort_unstable_by_key(|(process, _)| *process);
        all
    }

    /// What `cache` sets apart for a process of `category`: its write
    /// policy, its line size, and its `reca` parameters (see the module doc).
    pub fn process_settings(category: &Category, cache: &Cache) -> ProcessSettings {
        ProcessSettings {
            write_policy: category.write_policy,
            line_size: Some(category.line_size),
            policy: Some(category.policy_spec(Some(&cache.config().policy))),
        }
    }

    /// Gives each process in `changes` what `cache` can set apart of its
    /// new category (all withdrawn for a forgotten process); one `process
    /// N: old -> new (...)` line per change.
    pub fn apply_processes(&self, cache: &mut Cache, changes: &[ProcessChange]) -> Vec<String> {
        let name = |c: Option<usize>| c.map_or("(none)", |i| self.table.categories[i].name.as_str());
        changes
            .iter()
            .map(|change| {
                let category = change.new.map(|i| &self.table.categories[i]);
                let settings = category.map(|c| Self::process_settings(c, cache));
                let what = match category {
                    None => "the cache's settings".to_string(),
                    Some(c) => format!(
                        "write policy {}, fills of {} lines",
                        c.write_policy,
                        format_byte_size(c.line_size.bytes())
                    ),
                };
                let result = cache.set_process_settings(change.process, settings);
                format!(
                    "process {}: {} -> {} ({what}){}",
                    change.process,
                    name(change.old),
                    name(change.new),
                    // Categories were checked when the table was read; a
                    // refusal is a bug, reported rather than stopping.
                    result.map_or_else(|e| format!(" not applied: {e}"), |()| String::new())
                )
            })
            .collect()
    }

    /// Configures `cache` for the current category at `now_ns`: its write
    /// policy as the controller's, and the `reca` policy with its
    /// priorities and eviction rule (in place when the cache runs `reca`
    /// already). Records in `event` what changed, and the line size wanted
    /// when it differs from the cache's. Nothing cached is dropped.
    pub fn apply(&self, cache: &mut Cache, event: &mut RecaEvent, now_ns: u64) -> Result<(), CoreError> {
        let Some(category) = self.current() else {
            return Ok(());
        };
        let old_mode = cache.effective_mode().policy;
        cache.set_controller_policy(Some(category.write_policy));
        let new_mode = cache.effective_mode().policy;
        if old_mode != new_mode {
            event
                .changes
                .push(format!("write policy: {old_mode} -> {new_mode}"));
        }
        let old_spec = cache.config().policy.clone();
        let spec = category.policy_spec(Some(&old_spec));
        if spec != old_spec {
            cache.apply(&Setting::Policy(spec.clone()), now_ns)?;
            event.changes.push(format!("policy: {old_spec} -> {spec}"));
        }
        if category.line_size != cache.line_size() {
            event.line_size = Some(category.line_size);
            event.changes.push(format!(
                "line size: {} -> {}",
                format_byte_size(cache.line_size().bytes()),
                format_byte_size(category.line_size.bytes())
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::WritePolicy;

    #[test]
    fn the_first_window_waits_until_a_request_is_classified() {
        let mut c = small(10);
        // 20 volumes, 3 requests each: no stream's queue fills.
        for i in 0..60u64 {
            let r = Request::write((i % 20) as u32, (i / 20) * 4096, 4096, i);
            assert!(c.observe(&r).is_none(), "request {i}");
        }
        assert!(c.current().is_none());
        // One stream fills its queue: the window closes with what it holds.
        let report = (0..100u64)
            .find_map(|i| c.observe(&Request::write(99, i * 4096, 4096, 60 + i)))
            .expect("a window closes");
        assert!(report.classified > 0, "{report:?}");
        assert_eq!(
            c.table().categories[report.category].name,
            "large_file_generators"
        );
        // The first category is a change (from none).
        assert!(report.change.as_ref().is_some_and(|e| e.old.is_none()));
    }

    fn small(window: u64) -> RecaController {
        RecaController::new(
            CategoryTable::builtin(),
            RecaControllerParams {
                window_requests: window,
                ..RecaControllerParams::default()
            },
        )
    }

    #[test]
    fn a_window_of_random_reads_is_random_consumers() {
        let mut c = small(1000);
        let mut x: u64 = 1;
        let mut reports = Vec::new();
        for i in 0..3000u64 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let off = ((x >> 20) % (1 << 20)) * 4096;
            reports.extend(c.observe(&Request::read(0, off, 4096, i)));
        }
        assert_eq!(reports.len(), 3);
        let name = |r: &WindowReport| c.table().categories[r.category].name.clone();
        assert!(
            reports.iter().all(|r| name(r) == "random_consumers"),
            "{reports:?}"
        );
        // Only the first window is a change (from no category).
        assert!(reports[0].change.as_ref().is_some_and(|e| e.old.is_none()));
        assert!(reports[1..].iter().all(|r| r.change.is_none()));
        // The first window classifies all but the 64 requests still queued.
        assert_eq!(reports[0].classified, 1000 - 64);
        assert!(reports[1].features.0[4] > 0.99, "{}", reports[1].features);
    }

    /// Process 1 reads at random, process 2 writes one file front to back,
    /// one request each in turn, on one volume.
    fn two_processes(c: &mut RecaController, from: u64, to: u64) -> Vec<WindowReport> {
        let mut x: u64 = 7;
        let mut reports = Vec::new();
        for i in from..to {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let random = Request::read(0, ((x >> 20) % (1 << 20)) * 4096, 4096, 2 * i);
            reports.extend(c.observe(&random.from_process(1)));
            let sequential = Request::write(0, (1 << 40) + i * 65536, 65536, 2 * i + 1);
            reports.extend(c.observe(&sequential.from_process(2)));
        }
        reports
    }

    #[test]
    fn each_process_gets_the_write_policy_of_its_own_category() {
        let params = RecaControllerParams {
            window_requests: 1000,
            per_process: true,
            ..RecaControllerParams::default()
        };
        let mut c = RecaController::new(CategoryTable::builtin(), params);
        let reports = two_processes(&mut c, 0, 1000);
        let name = |i: Option<usize>| i.map(|i| c.table().categories[i].name.as_str());
        let first = &reports[0].processes;
        assert_eq!(first.len(), 2, "{first:?}");
        assert_eq!(
            (first[0].process, name(first[0].new)),
            (1, Some("random_consumers"))
        );
        assert_eq!(
            (first[1].process, name(first[1].new)),
            (2, Some("large_file_generators"))
        );
        // Later windows change nothing while the processes keep their ways.
        assert!(reports[1..].iter().all(|r| r.processes.is_empty()), "{reports:?}");
        let config = crate::CacheConfig::new(64, LineSize::new(4096).unwrap(), crate::PolicySpec::lru());
        let mut cache = Cache::new(config).unwrap();
        let lines = c.apply_processes(&mut cache, first);
        assert_eq!(lines.len(), 2);
        assert_eq!(
            cache.process_policies(),
            vec![(1, WritePolicy::WriteAround), (2, WritePolicy::WriteBack)]
        );
        // Each process's line size and `reca` parameters are set apart too.
        let settings = cache.process_settings();
        let sizes: Vec<u64> = (settings.iter())
            .map(|(_, s)| s.line_size.unwrap().bytes())
            .collect();
        assert_eq!(sizes, vec![4096, 128 << 10]);
        let specs: Vec<String> = (settings.iter())
            .map(|(_, s)| s.policy.as_ref().unwrap().to_string())
            .collect();
        assert!(specs[0].starts_with("reca:evict=priority:"), "{specs:?}");
        assert!(specs[1].starts_with("reca:evict=priority_lru:"), "{specs:?}");
        assert!(lines[1].contains("write policy wb, fills of 128"), "{lines:?}");
        // A process silent for PROCESS_IDLE_WINDOWS windows is forgotten.
        let mut forgotten = Vec::new();
        let mut x: u64 = 11;
        for i in 0..u64::from(PROCESS_IDLE_WINDOWS) * 1000 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let r = Request::read(0, ((x >> 20) % (1 << 20)) * 4096, 4096, 10_000 + i);
            forgotten.extend(
                c.observe(&r.from_process(1))
                    .into_iter()
                    .flat_map(|r| r.processes),
            );
        }
        assert_eq!(
            forgotten,
            vec![ProcessChange {
                process: 2,
                old: first[1].new,
                new: None
            }]
        );
        c.apply_processes(&mut cache, &forgotten);
        assert_eq!(cache.process_policies(), vec![(1, WritePolicy::WriteAround)]);
        assert_eq!(cache.process_settings().len(), 1, "all of process 2's withdrawn");
        assert_eq!(c.process_categories().len(), 1);
    }

    #[test]
    fn without_per_process_no_process_is_followed() {
        let mut c = small(1000);
        let reports = two_processes(&mut c, 0, 1000);
        assert!(reports.iter().all(|r| r.processes.is_empty()));
        assert!(c.process_categories().is_empty());
    }
}

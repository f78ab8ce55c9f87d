//! ReCA live. The core's ReCA
//! controller (`iocache_core::reca`, sans-I/O) recognises the workload
//! category of the requests it is shown and says how a cache should be
//! configured for it; this file shows it every request the engine serves
//! and applies its decisions to every shard while the engine serves.
//!
//! The hit path stays cheap: a request only appends its (volume, offset,
//! length, kind, time) to its thread stripe's buffer (a lock no other
//! request thread of that stripe holds for more than a push, and the
//! controller thread for a swap), never a lock shared by all requests.
//! The `iocache-reca` thread swaps the buffers out every
//! [`RECA_TICK`], puts the requests in time order (the classifier keeps
//! one stream per volume) and runs the controller. A full buffer drops the
//! request from the characterization only (counted in
//! [`RecaStatus::dropped_requests`]); the request itself is served as ever.
//!
//! The classifier costs about 160 ns per request (its 64-request history
//! is scanned for each; `examples/loadgen` with `reca`), a third of a core
//! at 2 million hits per second. So the controller characterizes at most
//! [`RecaSetup::max_requests_per_second`]: once a [`RECA_PERIOD`] has
//! brought that many (counted at each tick, so one tick's requests may go
//! over), the feed closes (requests then cost one relaxed load and a
//! per-stripe count) until the next period. What it sees is
//! whole ticks of consecutive requests, so runs and strides within them
//! are kept; a window of `window_requests` then spans more time. Below the
//! rate every request is characterized, as in the paper.
//!
//! On a category change the new configuration reaches every shard through
//! the doors every controller uses ([`RecaController::apply`] on each
//! shard's core: `Cache::set_controller_policy` for the write policy,
//! `Cache::apply` with `Setting::Policy` for the `reca` policy's
//! priorities, taken in place). Nothing cached or dirty is dropped; a new
//! write policy that keeps no dirty data starts the background drain, as
//! `iocache ctl set write_policy=...` does. The controller's choices are
//! not operator settings: they are not written into the superblock, and a
//! restart begins with the configured values until the first window.
//!
//! A category's line size is not applied in place: the slot layout and the
//! records on the cache device depend on it. It becomes a pending line
//! size ([`RecaStatus::pending_line_size`]), logged and shown, and is
//! recorded in the superblock's settings record
//! (`iocache_format::SettingsRecord::reca_line`, an A/B update) whenever ReCA's choice differs from the
//! configured line size. A start reads it with [`recorded_reca_line_size`]
//! and may open the cache with it (`serve --adapt reca` does, while the
//! configuration still says CONFIGURED): the engine then writes every dirty
//! line back and formats the device for the new geometry (`recovery::start_over`; a
//! crash in between finds the old superblock and does it again), so no
//! dirty sector is lost, only clean lines. A serving layer may also put it
//! in force at once by replacing the engine (`succession.rs`: the binary's
//! `iocache-serving`'s `relayout.rs` does, unless `reca_line_size = "next_start"`; a
//! successor's ReCA starts in its predecessor's category,
//! [`RecaSetup::initial_category`]). A cache array keeps its line size (its
//! members were formatted with it): the change is only logged.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use iocache_core::reca::{CategoryTable, Features, RecaController, RecaControllerParams, RecaEvent};
use iocache_core::units::format_byte_size;
use iocache_core::Request;

use iocache_device::BlockDevice;
use iocache_format::SuperblockFound;

use super::{lock, Engine, EngineError, Inner};
use crate::recovery;
use crate::stripe::{stripe, Padded, STRIPES};

/// How often the controller thread takes the buffered requests.
pub const RECA_TICK: Duration = Duration::from_millis(10);
/// The period over which [`RecaSetup::max_requests_per_second`] is counted.
pub const RECA_PERIOD: Duration = Duration::from_millis(100);
/// Requests buffered per stripe between two ticks at most (40 bytes each):
/// 1.6 million requests per second per stripe before any is dropped.
const FEED_REQUESTS_PER_STRIPE: usize = 16 * 1024;
/// The default characterization budget: about 4 % of a core.
pub const RECA_MAX_REQUESTS_PER_SECOND: u64 = 250_000;

/// What `Engine::start_reca` needs: the category table (and where it came
/// from, to show) and the controller's parameters.
#[derive(Clone, Debug)]
pub struct RecaSetup {
    pub table: CategoryTable,
    /// The table's file, or `built-in`.
    pub table_source: String,
    pub params: RecaControllerParams,
    /// Requests characterized per second at most (see the module doc);
    /// `None`: every request.
    pub max_requests_per_second: Option<u64>,
    /// The line size the configuration asks for, when the engine was
    /// opened with another (ReCA's, from [`recorded_reca_line_size`]);
    /// `None`: the engine's.
    pub configured_line_bytes: Option<u64>,
    /// The category in force from the start, applied at once (a successor
    /// engine's, see `succession.rs`); `None`: the first window chooses.
    pub initial_category: Option<String>,
    /// Whether the serving layer changes the line size while serving (by
    /// a succession) when a category wants another: only what the log and
    /// the status say about a pending line size depends on it.
    pub line_size_live: bool,
}

impl RecaSetup {
    /// The built-in table, the paper's window and the default budget.
    pub fn builtin() -> RecaSetup {
        RecaSetup {
            table: CategoryTable::builtin(),
            table_source: iocache_core::reca::BUILTIN_TABLE_SOURCE.into(),
            params: RecaControllerParams::default(),
            max_requests_per_second: Some(RECA_MAX_REQUESTS_PER_SECOND),
            configured_line_bytes: None,
            initial_category: None,
            line_size_live: false,
        }
    }
}

/// A line size ReCA chose, recorded on a cache device for the next start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordedLineSize {
    /// ReCA's choice.
    pub line_bytes: u64,
    /// The configured line size it was chosen over.
    pub configured_line_bytes: u64,
    /// The line size the device is formatted with now.
    pub device_line_bytes: u64,
}

/// The line size ReCA chose in an earlier run of the cache on `dev`, if it
/// recorded one (see the module doc); `None` for a blank device, an
/// unreadable superblock (the start reports it) or no record.
pub fn recorded_reca_line_size(dev: &dyn BlockDevice) -> Result<Option<RecordedLineSize>, EngineError> {
    if dev.len_bytes() < 2 * iocache_format::SUPERBLOCK_BYTES as u64 {
        return Ok(None);
    }
    let Ok(SuperblockFound::Found { superblock, .. }) = recovery::read_superblocks(dev)? else {
        return Ok(None);
    };
    let recorded = iocache_format::SettingsRecord::decode(&superblock.settings).reca_line;
    Ok(recorded.map(|line| RecordedLineSize {
        line_bytes: line.chosen_bytes,
        configured_line_bytes: line.configured_bytes,
        device_line_bytes: superblock.layout.line_bytes,
    }))
}

/// What ReCA is doing in a running engine.
#[derive(Clone, Debug, Default)]
pub struct RecaStatus {
    pub table_source: String,
    pub categories: Vec<String>,
    pub window_requests: u64,
    /// Requests shown to the classifier (counted at each tick).
    pub observed_requests: u64,
    /// Requests not shown to it: a stripe's buffer was full.
    pub dropped_requests: u64,
    /// Requests not shown to it: the period's budget was spent.
    pub skipped_requests: u64,
    pub max_requests_per_second: Option<u64>,
    /// Windows closed (also across table reloads).
    pub windows: u64,
    pub category_changes: u64,
    /// The category in force (none before the first window).
    pub category: Option<String>,
    /// When it came into force, on the engine's clock.
    pub since_ns: Option<u64>,
    /// The last window's workload vector and distance to every category.
    pub last_features: Option<Features>,
    pub last_distances: Vec<(String, f64)>,
    /// The configuration the category put in force (`None` before one).
    pub write_policy: Option<String>,
    pub policy: Option<String>,
    /// The engine's line size, the configured one (they differ when a
    /// start applied ReCA's), and the one the category wants when it
    /// differs from the engine's (recorded for the next start, see the
    /// module doc).
    pub line_size: u64,
    pub configured_line_size: u64,
    pub pending_line_size: Option<u64>,
    /// The last category change, as logged.
    pub last_event: Option<String>,
}

/// One stripe's requests for the controller.
#[derive(Default)]
struct StripeFeed {
    buffer: Mutex<Vec<Request>>,
    /// Requests not buffered while the feed was closed.
    skipped: AtomicU64,
}

/// The requests buffered for the controller, one buffer per stripe.
struct Feed {
    stripes: [Padded<StripeFeed>; STRIPES],
    dropped: AtomicU64,
    /// Cleared while the period's budget is spent.
    open: AtomicBool,
}

impl Feed {
    fn new() -> Feed {
        Feed {
            stripes: Default::default(),
            dropped: AtomicU64::new(0),
            open: AtomicBool::new(true),
        }
    }

    #[inline]
    fn push(&self, request: Request) {
        let stripe = &self.stripes[stripe()];
        if !self.open.load(Ordering::Relaxed) {
            stripe.skipped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let mut buffer = lock(&stripe.buffer);
        if buffer.len() < FEED_REQUESTS_PER_STRIPE {
            buffer.push(request);
        } else {
            drop(buffer);
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Moves every buffered request into `out` (each buffer keeps its
    /// allocation: it is swapped with `spare`, which the caller empties).
    fn take(&self, out: &mut Vec<Request>, spare: &mut Vec<Request>) {
        for s in &self.stripes {
            spare.clear();
            std::mem::swap(&mut *lock(&s.buffer), spare);
            out.extend_from_slice(spare);
        }
    }

    fn skipped(&self) -> u64 {
        self.stripes
            .iter()
            .map(|s| s.skipped.load(Ordering::Relaxed))
            .sum()
    }
}

/// The controller and what it did, behind one lock taken by the
/// controller thread once per tick and by the admin requests.
struct Control {
    controller: RecaController,
    status: RecaStatus,
}

/// ReCA in a running engine (held by `Inner::reca` once started).
pub(super) struct RecaLive {
    feed: Feed,
    control: Mutex<Control>,
    configured_line_bytes: u64,
    /// ReCA's line size when it differs from the configured one (0: none),
    /// recorded in the superblock.
    chosen_line_bytes: AtomicU64,
    /// [`RecaSetup::line_size_live`].
    pub(super) line_size_live: bool,
}

impl RecaLive {
    /// Shows one request to the controller (the hit path's only cost).
    #[inline]
    pub(super) fn observe(&self, request: Request) {
        self.feed.push(request);
    }
}

impl Inner {
    /// ReCA's part of the superblock's settings record (see the module doc).
    pub(super) fn reca_line(&self) -> Option<iocache_format::RecaLineSize> {
        let reca = self.reca.get()?;
        match reca.chosen_line_bytes.load(Ordering::SeqCst) {
            0 => None,
            chosen => Some(iocache_format::RecaLineSize {
                chosen_bytes: chosen,
                configured_bytes: reca.configured_line_bytes,
            }),
        }
    }

    /// The controller thread: every tick, the buffered requests in time
    /// order to the controller, and each category change applied.
    fn run_reca(self: &Arc<Inner>, reca: &RecaLive) {
        let mut batch = Vec::new();
        let mut spare = Vec::new();
        let budget = lock(&reca.control)
            .status
            .max_requests_per_second
            .map(|rate| (rate as f64 * RECA_PERIOD.as_secs_f64()).ceil() as usize);
        let mut period_start = Instant::now();
        let mut period_requests = 0;
        while !self.stopping.load(Ordering::SeqCst) {
            std::thread::sleep(RECA_TICK);
            batch.clear();
            reca.feed.take(&mut batch, &mut spare);
            if period_start.elapsed() >= RECA_PERIOD {
                period_start = Instant::now();
                period_requests = 0;
                reca.feed.open.store(true, Ordering::Relaxed);
            }
            period_requests += batch.len();
            if budget.is_some_and(|b| period_requests >= b) {
                reca.feed.open.store(false, Ordering::Relaxed);
            }
            if batch.is_empty() {
                continue;
            }
            // Stripes are taken one after the other: restore arrival order.
            batch.sort_by_key(|r| r.now_ns);
            let mut control = lock(&reca.control);
            control.status.observed_requests += batch.len() as u64;
            for request in &batch {
                self.reca_step(reca, &mut control, request);
            }
        }
    }

    fn reca_step(self: &Arc<Inner>, reca: &RecaLive, control: &mut Control, request: &Request) {
        let Some(report) = control.controller.observe(request) else {
            return;
        };
        let Control { controller, status } = control;
        status.windows += 1;
        status.last_features = Some(report.features);
        status.last_distances = controller
            .table()
            .categories
            .iter()
            .zip(&report.distances)
            .map(|(c, &d)| (c.name.clone(), d))
            .collect();
        let Some(mut event) = report.change else {
            return;
        };
        status.category_changes += 1;
        self.reca_apply(reca, controller, status, &mut event, report.now_ns);
    }

    /// Puts the controller's current category in force on every shard,
    /// records it in `status` and logs `event` (with what changed).
    fn reca_apply(
        self: &Arc<Inner>,
        reca: &RecaLive,
        controller: &RecaController,
        status: &mut RecaStatus,
        event: &mut RecaEvent,
        now_ns: u64,
    ) {
        let Some(category) = controller.current() else {
            return;
        };
        // Every shard has the same configuration: the first one's changes
        // are the event's, the others' the same.
        let mut scratch = event.clone();
        for (i, shard) in self.shards.iter().enumerate() {
            let target = if i == 0 { &mut *event } else { &mut scratch };
            let mut state = lock(&shard.state);
            // The policies were checked when the table was read.
            if let Err(e) = controller.apply(&mut state.cache, target, now_ns) {
                if i == 0 {
                    event.changes.push(format!("not applied: {e}"));
                }
            }
        }
        let policy = lock(&self.shards[0].state).cache.config().policy.to_string();
        let wanted = category.line_size.bytes();
        // A cache array's members were formatted for one line size.
        let on_array = self.slots.array.is_some();
        let chosen = if wanted == reca.configured_line_bytes || on_array {
            0
        } else {
            wanted
        };
        let recorded = if reca.chosen_line_bytes.swap(chosen, Ordering::SeqCst) == chosen {
            Ok(())
        } else {
            self.persist_settings()
        };
        if let Some(line) = event.line_size {
            let pending = match &recorded {
                Ok(()) if on_array => format!(
                    " not applied: a cache array keeps the {} lines its members were formatted with",
                    format_byte_size(self.line_bytes)
                ),
                Ok(()) if reca.line_size_live => format!(
                    " pending: the cache of {} lines is being replaced by one of {} (dirty lines \
                     written back, the device formatted again, the cached ranges read again)",
                    format_byte_size(self.line_bytes),
                    format_byte_size(line.bytes())
                ),
                Ok(()) => format!(
                    " pending: the cache keeps {} lines until the next start, which takes {} \
                     (recorded on the cache device), writing the dirty lines back and reformatting",
                    format_byte_size(self.line_bytes),
                    format_byte_size(line.bytes())
                ),
                Err(e) => format!(
                    " pending, not recorded on the cache device ({e}): the cache keeps {} lines",
                    format_byte_size(self.line_bytes)
                ),
            };
            match event.changes.iter_mut().find(|c| c.starts_with("line size:")) {
                Some(change) => change.push_str(&pending),
                None => event.changes.push(format!("line size{pending}")),
            }
        } else if let Err(e) = &recorded {
            event
                .changes
                .push(format!("the line size to start with could not be recorded: {e}"));
        }
        status.category = Some(category.name.clone());
        status.since_ns = Some(now_ns);
        status.write_policy = Some(category.write_policy.to_string());
        status.policy = Some(policy);
        status.pending_line_size = (wanted != self.line_bytes && !on_array).then_some(wanted);
        let text = format!("{} (cache of {})", event, self.volume_names().join(", "));
        log::info!("{text}");
        status.last_event = Some(text);
        Inner::drain_if_needed(self);
    }

    fn volume_names(&self) -> Vec<String> {
        self.volumes.read().unwrap_or_else(|p| p.into_inner()).names()
    }
}

impl Engine {
    /// Starts ReCA (see the module doc): from now on every request served
    /// is characterized and each category change reconfigures every shard.
    /// Fails if it runs already or the engine is stopping.
    pub fn start_reca(&self, setup: RecaSetup) -> Result<(), EngineError> {
        if self.inner.stopping.load(Ordering::SeqCst) {
            return Err(EngineError::Shutdown);
        }
        if self.inner.ordered() {
            return Err(EngineError::Config(
                "ReCA changes write policies and line sizes, which ordered write-back does not follow".into(),
            ));
        }
        let line_bytes = self.inner.line_bytes;
        let configured_line_bytes = setup.configured_line_bytes.unwrap_or(line_bytes);
        let status = RecaStatus {
            table_source: setup.table_source,
            categories: setup.table.categories.iter().map(|c| c.name.clone()).collect(),
            window_requests: setup.params.window_requests,
            max_requests_per_second: setup.max_requests_per_second,
            line_size: line_bytes,
            configured_line_size: configured_line_bytes,
            ..RecaStatus::default()
        };
        let live = Arc::new(RecaLive {
            feed: Feed::new(),
            control: Mutex::new(Control {
                controller: RecaController::new(setup.table, setup.params),
                status,
            }),
            configured_line_bytes,
            // Opened with ReCA's line size: it stays recorded until a
            // category wants another.
            chosen_line_bytes: AtomicU64::new(if line_bytes == configured_line_bytes {
                0
            } else {
                line_bytes
            }),
            line_size_live: setup.line_size_live,
        });
        if self.inner.reca.set(Arc::clone(&live)).is_err() {
            return Err(EngineError::Config("ReCA runs already".into()));
        }
        if line_bytes != configured_line_bytes {
            self.inner.persist_settings()?;
        }
        if let Some(name) = &setup.initial_category {
            let mut control = lock(&live.control);
            let index = control.controller.table().find(name).ok_or_else(|| {
                EngineError::Config(format!("ReCA's table has no category `{name}` to start with"))
            })?;
            let now_ns = self.inner.now_ns();
            control.controller.set_category(index, 0, now_ns);
            let Control { controller, status } = &mut *control;
            let mut event = RecaEvent {
                requests: 0,
                now_ns,
                old: None,
                new: name.clone(),
                distances: Vec::new(),
                features: Features::default(),
                changes: vec!["carried over from the engine this one replaced".into()],
                line_size: None,
            };
            self.inner
                .reca_apply(&live, controller, status, &mut event, now_ns);
        }
        let inner = Arc::clone(&self.inner);
        let handle = std::thread::Builder::new()
            .name("iocache-reca".into())
            .spawn(move || inner.run_reca(&live))
            .map_err(|e| EngineError::Config(format!("cannot start the ReCA thread: {e}")))?;
        lock(&self.threads).push(handle);
        Ok(())
    }

    /// ReCA's setup as it runs now, with its category in force as the
    /// successor's first ([`RecaSetup::initial_category`]); `None` when
    /// ReCA was not started.
    pub fn reca_succession(&self) -> Option<RecaSetup> {
        let live = self.inner.reca.get()?;
        let control = lock(&live.control);
        Some(RecaSetup {
            table: control.controller.table().clone(),
            table_source: control.status.table_source.clone(),
            params: control.controller.params(),
            max_requests_per_second: control.status.max_requests_per_second,
            configured_line_bytes: Some(live.configured_line_bytes),
            initial_category: control.status.category.clone(),
            line_size_live: live.line_size_live,
        })
    }

    /// What ReCA is doing; `None` when it was not started.
    pub fn reca_status(&self) -> Option<RecaStatus> {
        let live = self.inner.reca.get()?;
        let mut status = lock(&live.control).status.clone();
        status.dropped_requests = live.feed.dropped.load(Ordering::Relaxed);
        status.skipped_requests = live.feed.skipped();
        Some(status)
    }

    /// Replaces ReCA's category table while the engine serves. The
    /// classifier starts afresh; the category in force stays in force if
    /// the new table has it (with the new table's configuration, applied
    /// now), else the next window chooses. Returns the status after.
    pub fn reca_reload(&self, table: CategoryTable, table_source: String) -> Result<RecaStatus, EngineError> {
        let live = self.inner.reca.get().ok_or_else(|| {
            EngineError::Config("ReCA is not running on this cache (it was not started with it)".into())
        })?;
        {
            let mut control = lock(&live.control);
            let params = control.controller.params();
            let kept = control.status.category.as_ref().and_then(|name| table.find(name));
            control.status.categories = table.categories.iter().map(|c| c.name.clone()).collect();
            control.status.table_source = table_source.clone();
            control.controller = RecaController::new(table, params);
            let now_ns = self.inner.now_ns();
            let requests = control.status.observed_requests;
            log::info!("reca: category table reloaded from {table_source}");
            match kept {
                Some(index) => {
                    control.controller.set_category(index, requests, now_ns);
                    let Control { controller, status } = &mut *control;
                    let mut event = RecaEvent {
                        requests,
                        now_ns,
                        old: status.category.clone(),
                        new: status.category.clone().unwrap_or_default(),
                        distances: Vec::new(),
                        features: status.last_features.unwrap_or_default(),
                        changes: vec!["table reloaded".into()],
                        line_size: None,
                    };
                    self.inner
                        .reca_apply(live, controller, status, &mut event, now_ns);
                }
                None => {
                    let Control { status, .. } = &mut *control;
                    if let Some(old) = status.category.take() {
                        log::info!(
                            "reca: the new table has no category `{old}`: its configuration stays until the next window"
                        );
                    }
                }
            }
        }
        Ok(self.reca_status().unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_closed_feed_counts_requests_and_a_full_stripe_drops_them() {
        let feed = Feed::new();
        for i in 0..3 {
            feed.push(Request::read(1, i * 4096, 4096, i));
        }
        feed.open.store(false, Ordering::Relaxed);
        feed.push(Request::read(1, 0, 4096, 3));
        feed.push(Request::write(1, 0, 4096, 4));
        let (mut out, mut spare) = (Vec::new(), Vec::new());
        feed.take(&mut out, &mut spare);
        assert_eq!(out.iter().map(|r| r.now_ns).collect::<Vec<_>>(), vec![0, 1, 2]);
        assert_eq!((feed.skipped(), feed.dropped.load(Ordering::Relaxed)), (2, 0));
        // One thread fills one stripe: what does not fit is dropped.
        feed.open.store(true, Ordering::Relaxed);
        for i in 0..FEED_REQUESTS_PER_STRIPE as u64 + 5 {
            feed.push(Request::read(1, 0, 4096, i));
        }
        assert_eq!(feed.dropped.load(Ordering::Relaxed), 5);
        out.clear();
        feed.take(&mut out, &mut spare);
        assert_eq!(out.len(), FEED_REQUESTS_PER_STRIPE);
        out.clear();
        feed.take(&mut out, &mut spare);
        assert!(out.is_empty());
    }
}

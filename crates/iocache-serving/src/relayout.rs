//! ReCA may want another line size while the server
//! runs, and an engine has one line size for life (its slot
//! layout and the records on the cache device depend on it). So the
//! change is a succession of engines on the same devices, done here,
//! between the NBD server (whose exports reach the engine through an
//! `EngineCell`) and the engine. It starts once ReCA has wanted the new
//! line size for a whole window after the one that chose it ([`watch`]),
//! then:
//!
//! 1. every dirty line is written back while the old engine still serves:
//!    a first pass as the cache is (a backend that refuses it ends the
//!    attempt with nothing changed), then with its writes going through to
//!    the backend (the controller write policy `wt`,
//!    `Engine::hold_writes_through`: clients see slower writes instead of
//!    a long pause), in passes until at most
//!    [`PRE_DRAIN_ENOUGH_LINES`] are left or a pass stops gaining, so
//!    little is left for step 3;
//! 2. the cell is quiesced: every request inside the engine finishes, new
//!    ones wait (the clients see a pause, measured and logged, not an
//!    error);
//! 3. the old engine writes back what was dirtied since step 1, so every
//!    line it holds is clean (its data is the backend's), keeps the copies
//!    of its clean lines taken just before step 2 (straight from the cache
//!    device while it served, up to the new cache's size, at most
//!    [`KEEP_BYTES_MAX`] and [`KEEP_COPY_MAX`]) whose lines did not change
//!    since, and shuts down (a failure here, e.g. a backend error,
//!    ends the attempt: the old engine is opened again as it was and serves
//!    on, the dirty lines still in its cache);
//! 4. a new engine opens the same devices with the new line size: the start
//!    path finds a clean superblock of another geometry and formats the
//!    device for it (`recovery::start_over`, the same code as a restart with
//!    another line size; a crash in between is a crash during a start);
//!    the operator's knobs and ReCA (its table, parameters and category)
//!    carry over; the exports' volume handles are renewed; each volume's
//!    backend is seen through an [`iocache_device::Staged`] that answers
//!    reads of the copied ranges from memory;
//! 5. the requests go on, and a background thread reads the ranges the old
//!    cache held through the new engine (`Engine::warm_with`: not shown to
//!    ReCA): the copied ones at once (their fills come from memory: the
//!    cache holds its data again without a backend read), the others at
//!    most [`WARM_BYTES_PER_SECOND`] from the backend; then the copies go.
//!
//! No byte a client wrote is lost at any step: dirty data is on the backend
//! (flushed) before the old engine lets go of it, and a crash after the
//! format finds a cache of clean lines (or none) over a backend that has
//! everything. A copy never answers for stale data: any write, discard or
//! zeroing of the backend drops the copies it touches first. What is not
//! kept across the change is the dirty state (the lines come back clean),
//! the placement of the data on the device and the engine's counters.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::{refused, Result, ServeError, Within};
use crate::EngineCell;
use iocache_core::units::format_byte_size;
use iocache_core::LineSize;
use iocache_engine::{CachedCopy, CachedRange, Engine, InitMode};

use crate::running::{lock, CacheGroup, Running};
use iocache_device::{BlockDevice, Staged};

/// How often a cache's pending line size is looked at.
const POLL: Duration = Duration::from_millis(10);
/// Write-back passes while serving before requests are held, at most.
const PRE_DRAIN_PASSES_MAX: usize = 6;
/// Dirty lines few enough to write back while requests are held.
const PRE_DRAIN_ENOUGH_LINES: u64 = 256;
/// The pause after a failed attempt before the next.
const RETRY_AFTER: Duration = Duration::from_secs(30);
/// The warm-up's read rate at most (the backend also serves the clients).
pub const WARM_BYTES_PER_SECOND: u64 = 64 << 20;
/// The old cache's data copied into memory across a change, at most; the
/// rest is read again from the backend.
pub const KEEP_BYTES_MAX: u64 = 1 << 30;
/// How long copying the old cache's data (while it serves) may take, at
/// most; the rest is read again from the backend.
pub const KEEP_COPY_MAX: Duration = Duration::from_secs(2);

/// What one change did, for the log and `iocache stats`.
#[derive(Clone, Debug)]
pub struct Relayout {
    /// The cache's index in `Running::caches`.
    pub cache: usize,
    pub old_line_bytes: u64,
    pub new_line_bytes: u64,
    /// Dirty lines written back before the quiesce (step 1).
    pub written_back_before: u64,
    /// How long requests waited (steps 2-4).
    pub paused: Duration,
    /// Ranges and bytes to read again (step 5).
    pub warm_ranges: usize,
    pub warm_bytes: u64,
    /// Of those, the bytes copied from the old cache (step 3), which the
    /// warm-up takes from memory.
    pub kept_bytes: u64,
}

/// A pending line size seen by the watcher: since which window.
#[derive(Clone, Copy, PartialEq)]
struct Seen {
    line_bytes: u64,
    windows: u64,
}

/// Watches every cache that runs ReCA on a single device and changes its
/// line size when ReCA has wanted another for a whole window after the
/// one that chose it (a change costs a write-back, a pause and a
/// warm-up: a workload between two categories must not flip it back and
/// forth every window), until the server stops.
pub fn watch(state: Arc<Running>) {
    let caches = state.caches.len();
    let mut retry_at = vec![None::<Instant>; caches];
    let mut seen = vec![None::<Seen>; caches];
    // A line size the cache cannot take (its lines would not fit the
    // device), said once while it stays wanted.
    let mut refused = vec![None::<u64>; caches];
    while !state.stopping() {
        std::thread::sleep(POLL);
        for (index, group) in state.caches.iter().enumerate() {
            let live = group.config.reca.as_ref().is_some_and(|r| r.line_size_live);
            if !live
                || group.broken.load(Ordering::SeqCst)
                || retry_at[index].is_some_and(|t| Instant::now() < t)
            {
                continue;
            }
            let engine = group.engine();
            if engine.on_cache_array() {
                continue;
            }
            let Some(status) = engine.reca_status() else {
                continue;
            };
            let Some(wanted) = status.pending_line_size else {
                seen[index] = None;
                refused[index] = None;
                continue;
            };
            if refused[index] == Some(wanted) {
                continue;
            }
            if let Err(e) =
                crate::start::cache_lines(&group.config, engine.cache_device().len_bytes(), wanted)
            {
                log::warn!(
                    "cache {}: ReCA's line size {} is not put in force: {}",
                    group.path.display(),
                    format_byte_size(wanted),
                    crate::error_chain_text(&e)
                );
                refused[index] = Some(wanted);
                continue;
            }
            drop(engine);
            match seen[index] {
                Some(s) if s.line_bytes == wanted && status.windows > s.windows => {}
                Some(s) if s.line_bytes == wanted => continue,
                _ => {
                    seen[index] = Some(Seen {
                        line_bytes: wanted,
                        windows: status.windows,
                    });
                    continue;
                }
            }
            seen[index] = None;
            match change_line_size(&state, index, wanted) {
                Ok(Some(done)) => {
                    retry_at[index] = None;
                    lock(&state.relayouts).push(done);
                }
                Ok(None) => {}
                Err(e) => {
                    log::warn!(
                        "cache {}: the line size was not changed to {}: {}; next attempt in {} s",
                        group.path.display(),
                        format_byte_size(wanted),
                        crate::error_chain_text(&e),
                        RETRY_AFTER.as_secs()
                    );
                    retry_at[index] = Some(Instant::now() + RETRY_AFTER);
                }
            }
        }
    }
}

/// Replaces the engine of cache `index` by one with lines of `wanted`
/// bytes (see the module doc); `None` if there was nothing to do.
pub fn change_line_size(state: &Running, index: usize, wanted: u64) -> Result<Option<Relayout>> {
    // No attach, detach, flush, setting or shutdown meanwhile.
    let _admin = state.lock_admin();
    if state.stopping() {
        return Ok(None);
    }
    let group = &state.caches[index];
    let line_size = LineSize::new(wanted).map_err(|e| refused!("{e}"))?;
    let old = group.engine();
    let old_line_bytes = old.line_bytes();
    if old_line_bytes == wanted {
        return Ok(None);
    }
    let path = group.path.display().to_string();
    let dev = old.cache_device();
    let capacity_lines = crate::start::cache_lines(&group.config, dev.len_bytes(), wanted)?;
    let old_capacity_lines = crate::start::cache_lines(&group.config, dev.len_bytes(), old_line_bytes)?;
    let old_line_size = LineSize::new(old_line_bytes).map_err(|e| refused!("{e}"))?;
    // 1. Dirty lines back while serving.
    let dirty_before = old.stats().dirty_lines;
    log::info!(
        "cache {path}: changing the line size {} -> {}: writing back {dirty_before} dirty lines first",
        format_byte_size(old_line_bytes),
        format_byte_size(wanted)
    );
    // A first pass as the cache is: a backend that refuses it ends the
    // attempt before the clients see any change.
    old.flush_all()
        .map_err(|e| refused!("writing back {dirty_before} dirty lines: {e}"))?;
    // Then writes go through to the backend, so no new dirty line comes;
    // passes until few are left (ReCA may have set its own write policy
    // again).
    let controller_before = old.hold_writes_through();
    let mut dirty = old.stats().dirty_lines;
    for _ in 0..PRE_DRAIN_PASSES_MAX {
        if dirty <= PRE_DRAIN_ENOUGH_LINES {
            break;
        }
        if let Err(e) = old.flush_all() {
            old.restore_controller_policy(controller_before);
            return Err(refused!("writing back {dirty} dirty lines: {e}"));
        }
        let left = old.stats().dirty_lines;
        if left <= PRE_DRAIN_ENOUGH_LINES || left >= dirty {
            break;
        }
        dirty = left;
    }
    // The clean data the cache holds, copied while it serves; checked once
    // the requests are held (a line changed since is not kept).
    let new_cache_bytes = capacity_lines * wanted;
    let copies = old.copy_cached(
        new_cache_bytes.min(KEEP_BYTES_MAX),
        Instant::now() + KEEP_COPY_MAX,
    );
    // The records of the lines just cleaned, and the backend's flush of
    // what went through to it while the copy was taken, done while serving
    // rather than by the shutdown's barrier.
    if let Err(e) = old.flush() {
        old.restore_controller_policy(controller_before);
        return Err(refused!("writing the cleaned lines' records: {e}"));
    }
    // 2. No request inside the engine from here.
    let mut current = group.cell.quiesce();
    let paused_at = Instant::now();
    let warm = old.cached_ranges(new_cache_bytes);
    let volumes = old.volume_backends();
    let reca = old.reca_succession();
    let mut knobs: Vec<iocache_core::Setting> = Vec::new();
    for k in old.settings().into_iter().filter(|k| k.current != k.configured) {
        match format!("{}={}", k.key, k.current).parse() {
            Ok(setting) => knobs.push(setting),
            Err(e) => log::warn!("cache {path}: {}={} is not carried over: {e}", k.key, k.current),
        }
    }
    // 3. What was dirtied since step 1 goes back before the engine goes.
    let dirty_meanwhile = old.stats().dirty_lines;
    if dirty_meanwhile > 0 {
        if let Err(e) = old.flush_all() {
            old.restore_controller_policy(controller_before);
            return Err(refused!(
                "writing back the lines dirtied meanwhile: {e} (the cache keeps serving as it was)"
            ));
        }
    }
    let written_back_at = Instant::now();
    let staged = stage_backends(group, &volumes);
    let kept_bytes = keep(&old, copies, &staged);
    let volumes: Vec<(String, Arc<dyn BlockDevice>)> = staged
        .iter()
        .map(|(name, s)| (name.clone(), Arc::clone(s) as Arc<dyn BlockDevice>))
        .collect();
    let kept_at = Instant::now();
    let closed = old.shutdown();
    drop(old);
    let closed_at = Instant::now();
    // 4. The successor (or, if it cannot open, the old geometry again).
    let v = &group.config;
    let mut config = crate::start::engine_config(v, capacity_lines, InitMode::Load, None);
    config.cache.line_size = line_size;
    let opened = closed
        .map_err(|e| refused!("shutting the old engine down: {e}"))
        .and_then(|()| {
            Engine::with_volumes(config, Arc::clone(&dev), volumes.clone())
                .map_err(|e| refused!("opening the cache with {} lines: {e}", format_byte_size(wanted)))
        });
    let (engine, failure) = match opened {
        Ok(engine) => (engine, None),
        Err(e) => {
            // No warm-up follows: the copies go now.
            staged.iter().for_each(|(_, s)| {
                s.release();
            });
            // Serve on with the old geometry (the dirty lines, if any, are
            // found again on the device).
            let mut config = crate::start::engine_config(v, old_capacity_lines, InitMode::Load, None);
            config.cache.line_size = old_line_size;
            let engine = Engine::with_volumes(config, Arc::clone(&dev), volumes).map_err(|again| {
                let e = refused!(
                    "{e}; opening it again as it was failed too: {again}; its volumes answer \
                     every request with an error until the server is restarted"
                );
                log::error!("cache {path}: {}", crate::error_chain_text(&e));
                // Nothing touches the device again (not even the stop).
                group.broken.store(true, Ordering::SeqCst);
                e
            })?;
            (engine, Some(e))
        }
    };
    if !knobs.is_empty() {
        if let Err(e) = engine.apply_settings(&knobs) {
            log::warn!("cache {path}: the knobs set while serving were not carried over: {e}");
        }
    }
    if let Some(setup) = reca {
        if let Err(e) = engine.start_reca(setup) {
            log::warn!("cache {path}: ReCA was not started again: {e}");
        }
    }
    let engine = Arc::new(engine);
    EngineCell::install(&mut current, Arc::clone(&engine));
    for served in lock(&state.volumes).iter_mut().filter(|s| s.cache == index) {
        if let Some(volume) = engine.volume_named(&served.export) {
            served.volume = volume;
        }
    }
    drop(current);
    let paused = paused_at.elapsed();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let held = format!(
        "requests held {:.1} ms ({dirty_meanwhile} lines dirtied meanwhile written back {:.1} ms, \
         {} of copied data kept {:.1} ms, shutdown {:.1} ms, opening with the new line size {:.1} ms)",
        ms(paused),
        ms(written_back_at - paused_at),
        format_byte_size(kept_bytes),
        ms(kept_at - written_back_at),
        ms(closed_at - kept_at),
        ms(paused.saturating_sub(closed_at - paused_at))
    );
    if let Some(e) = failure {
        return Err(ServeError::Within {
            context: format!(
                "{held}; the cache serves on with {} lines",
                format_byte_size(old_line_bytes)
            ),
            source: Box::new(e),
        });
    }
    // 5. The old cache's data back, in the background.
    let warm_bytes = warm.iter().map(|r| r.length).sum();
    let done = Relayout {
        cache: index,
        old_line_bytes,
        new_line_bytes: wanted,
        written_back_before: dirty_before,
        paused,
        warm_ranges: warm.len(),
        warm_bytes,
        kept_bytes,
    };
    log::info!(
        "cache {path}: line size {} -> {} while serving: {} dirty lines written back first, {held}, \
         {} of {} ranges the old cache held to read again ({} from memory, the rest at most {}/s)",
        format_byte_size(old_line_bytes),
        format_byte_size(wanted),
        dirty_before,
        format_byte_size(warm_bytes),
        warm.len(),
        format_byte_size(kept_bytes),
        format_byte_size(WARM_BYTES_PER_SECOND)
    );
    let stop = state.stop_flag();
    let cell = Arc::clone(&group.cell);
    let generation = cell.read().generation;
    let copies = staged.clone();
    let spawned = std::thread::Builder::new()
        .name("iocache-warm".into())
        .spawn(move || {
            warm_up(stop, &cell, generation, &warm, &staged, &path);
            // Taken from the copies, the fills need them no longer, unless
            // a later change replaced this engine: the wrappers and what
            // they hold are that change's now, released by its warm-up.
            if cell.read().generation == generation {
                let served: u64 = staged.iter().map(|(_, s)| s.release()).sum();
                log::info!(
                    "cache {path}: {served} fills of the warm-up were answered from the old cache's copies"
                );
            }
        });
    if let Err(e) = spawned {
        copies.iter().for_each(|(_, s)| {
            s.release();
        });
        return Err(e).within(|| "starting the warm-up thread".to_string());
    }
    Ok(Some(done))
}

/// The wrappers the successor sees each volume's backend through, by
/// volume name: the cache's own from an earlier change when it is the
/// backend already (wrappers do not nest), else a new one.
fn stage_backends(
    group: &CacheGroup,
    volumes: &[(String, Arc<dyn BlockDevice>)],
) -> Vec<(String, Arc<Staged>)> {
    let mut known = lock(&group.staged);
    let out: Vec<(String, Arc<Staged>)> = volumes
        .iter()
        .map(|(name, backend)| {
            let same = |s: &&Arc<Staged>| std::ptr::addr_eq(Arc::as_ptr(*s), Arc::as_ptr(backend));
            let staged = match known.iter().find(same) {
                Some(s) => Arc::clone(s),
                None => Arc::new(Staged::new(Arc::clone(backend))),
            };
            (name.clone(), staged)
        })
        .collect();
    *known = out.iter().map(|(_, s)| Arc::clone(s)).collect();
    out
}

/// Stages the copies of the old engine's data whose lines are unchanged
/// (every line clean now: the backend's data) in the wrappers of their
/// volumes. Returns the bytes kept.
fn keep(old: &Engine, copies: Vec<CachedCopy>, staged: &[(String, Arc<Staged>)]) -> u64 {
    let mut kept = 0u64;
    for (range, data) in old.copies_unchanged(copies) {
        if let Some((_, s)) = staged.iter().find(|(name, _)| **name == *range.volume) {
            kept += data.len() as u64;
            s.stage(range.offset, data);
        }
    }
    kept
}

/// Reads `ranges` through the engine of `generation` in `cell`: first
/// those the copies in `staged` (by volume name) hold, at once (their
/// fills come from memory), then the others, paced; stops when the server
/// stops or the engine is replaced again.
fn warm_up(
    stop: &AtomicBool,
    cell: &EngineCell,
    generation: u64,
    ranges: &[CachedRange],
    staged: &[(String, Arc<Staged>)],
    path: &str,
) {
    let started = Instant::now();
    let held = |r: &CachedRange| {
        staged
            .iter()
            .any(|(name, s)| **name == *r.volume && s.holds(r.offset, r.length))
    };
    let (from_memory, from_backend): (Vec<&CachedRange>, Vec<&CachedRange>) =
        ranges.iter().partition(|r| held(r));
    let mut buf = Vec::new();
    // Bytes read from the backend (paced) and in all.
    let (mut read, mut total, mut failed) = (0u64, 0u64, 0u64);
    for (paced, range) in from_memory
        .into_iter()
        .map(|r| (false, r))
        .chain(from_backend.into_iter().map(|r| (true, r)))
    {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        if paced {
            // Never ahead of the rate.
            let due = Duration::from_secs_f64(read as f64 / WARM_BYTES_PER_SECOND as f64);
            if let Some(wait) = due.checked_sub(started.elapsed()) {
                std::thread::sleep(wait);
            }
            if stop.load(Ordering::SeqCst) {
                return;
            }
        }
        let current = cell.read();
        if current.generation != generation {
            return;
        }
        let Some(volume) = current.volume(&range.volume) else {
            continue;
        };
        buf.resize(range.length as usize, 0);
        match current.engine.warm_with(volume, range.offset, &mut buf) {
            Ok(()) => {
                total += range.length;
                if paced {
                    read += range.length;
                }
            }
            Err(_) => failed += 1,
        }
    }
    log::info!(
        "cache {path}: warm-up done: {} read again ({} of it from the backend) in {:.1} s{}",
        format_byte_size(total),
        format_byte_size(read),
        started.elapsed().as_secs_f64(),
        if failed > 0 {
            format!(", {failed} ranges failed (left to the clients' misses)")
        } else {
            String::new()
        }
    );
}

//! Several volumes sharing one cache device (SYSTOR'14 §3.1): the table of
//! attached volumes and their backends, the gate that lets a volume drain
//! before it leaves, per-volume counters, and attaching, flushing and
//! detaching one volume while the others keep serving.
//!
//! Every line of the cache carries its volume in its key, so the shards,
//! the ticket queues and the records on the device need nothing more; what
//! a volume adds is its backend (every backend access goes through
//! [`Inner::backend_of`]) and its entry in the superblock's volume table,
//! which gives it a stable id across restarts (matched by name).
//!
//! Detaching a volume:
//! 1. closes its gate (new requests fail with [`EngineError::Shutdown`],
//!    ESHUTDOWN over NBD) and waits until its requests in flight are done;
//! 2. with the cleaning lock held (no cleaner or other flush runs), writes
//!    back every dirty line of the volume (`FlushOrder::Volume`), flushes
//!    its backend, drops its clean lines from the core
//!    (`Cache::drop_clean_lines`) and from the shadow of the records, and
//!    waits for every ticket still queued on one of its lines (any
//!    operation on them decided before step 1 that has not run yet; with
//!    the engine's `inline_dirty_eviction = false` requests of other
//!    volumes no longer write its dirty victims back, but whatever still
//!    holds a ticket on its lines must finish before its backend leaves);
//! 3. runs a barrier, which flushes the backends (rule 3 of `persist.rs`:
//!    a record saying dirty is replaced only after the backend is flushed)
//!    and writes an empty record for each of its slots, so a restart never
//!    resurrects its lines;
//! 4. removes it from the superblock's volume table, then from the engine's.
//!
//! If step 2 cannot write everything back, the volume is reopened and the
//! error returned: nothing is lost, and detaching can be tried again.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use iocache_core::{AccessSummary, FlushOrder, IoKind, LineKey, Op, VolumeId};
use iocache_device::BlockDevice;
use iocache_format::VolumeEntry;

use super::{lock, Engine, EngineError, Inner, ShardState, Ticket, TicketKey};
use crate::latency::{LatencyHistogram, LatencyPercentiles};
use crate::stripe::{stripe, Padded, STRIPES};

/// Longest volume name: the superblock stores its length in one byte.
const NAME_BYTES_MAX: usize = 255;
/// How often a detach checks whether the volume's requests have drained.
const DRAIN_POLL: Duration = Duration::from_micros(200);

/// One attached volume.
pub(super) struct VolumeState {
    pub(super) id: VolumeId,
    pub(super) name: String,
    pub(super) backend: Arc<dyn BlockDevice>,
    pub(super) size_bytes: u64,
    /// Requests of this volume between [`VolumeState::enter`] and the end
    /// of their [`Serving`].
    inflight: [Padded<AtomicI64>; STRIPES],
    /// Set while the volume is being detached (and for good once it is).
    closed: AtomicBool,
    pub(super) counters: VolumeCounters,
}

/// A request of a volume in progress: the volume cannot finish detaching
/// until this is dropped.
pub(super) struct Serving<'a>(&'a VolumeState, usize);

impl Drop for Serving<'_> {
    fn drop(&mut self) {
        self.0.inflight[self.1].fetch_sub(1, Ordering::SeqCst);
    }
}

impl VolumeState {
    pub(super) fn new(id: VolumeId, name: String, backend: Arc<dyn BlockDevice>) -> Arc<VolumeState> {
        Arc::new(VolumeState {
            id,
            name,
            size_bytes: backend.len_bytes(),
            backend,
            inflight: Default::default(),
            closed: AtomicBool::new(false),
            counters: VolumeCounters::default(),
        })
    }

    /// Lets a request in, unless the volume is closed. (The count goes up
    /// before the flag is read, and a detach sets the flag before it reads
    /// the count, both sequentially consistent: a request either sees the
    /// flag or is waited for.)
    pub(super) fn enter(&self) -> Result<Serving<'_>, EngineError> {
        let stripe = stripe();
        self.inflight[stripe].fetch_add(1, Ordering::SeqCst);
        let serving = Serving(self, stripe);
        if self.closed.load(Ordering::SeqCst) {
            return Err(EngineError::Shutdown);
        }
        Ok(serving)
    }

    /// Requests let in and not yet done. A request may end on another
    /// stripe than its thread's next one, never on another than it began:
    /// the sum is what is in flight.
    fn in_flight(&self) -> i64 {
        self.inflight.iter().map(|c| c.load(Ordering::SeqCst)).sum()
    }

    fn reopen(&self) {
        self.closed.store(false, Ordering::SeqCst);
    }
}

/// Per-volume request counters (the core's counters are per cache), one
/// set per stripe of request threads (`stripe.rs`).
#[derive(Default)]
pub(super) struct VolumeCounters {
    stripes: [Padded<CounterStripe>; STRIPES],
    read_latency: LatencyHistogram,
    write_latency: LatencyHistogram,
}

#[derive(Default)]
struct CounterStripe {
    read_requests: AtomicU64,
    write_requests: AtomicU64,
    read_bytes: AtomicU64,
    write_bytes: AtomicU64,
    line_accesses: AtomicU64,
    read_hits: AtomicU64,
    write_hits: AtomicU64,
    partial_hits: AtomicU64,
    misses: AtomicU64,
    errors: AtomicU64,
}

impl VolumeCounters {
    /// The sum of one counter over the stripes.
    fn sum(&self, field: impl Fn(&CounterStripe) -> &AtomicU64) -> u64 {
        self.stripes
            .iter()
            .map(|s| field(&s.0).load(Ordering::Relaxed))
            .sum()
    }

    /// Counts one request of `bytes` whose lines the core judged as
    /// `summary`, which took `took_ns`.
    pub(super) fn record(&self, kind: IoKind, bytes: u64, summary: &AccessSummary, took_ns: u64, ok: bool) {
        let c = &self.stripes[stripe()].0;
        let add = |counter: &AtomicU64, n: u64| {
            if n > 0 {
                counter.fetch_add(n, Ordering::Relaxed);
            }
        };
        match kind {
            IoKind::Read => {
                add(&c.read_requests, 1);
                add(&c.read_bytes, bytes);
                add(&c.read_hits, u64::from(summary.full_hits));
                self.read_latency.record(took_ns);
            }
            IoKind::Write => {
                add(&c.write_requests, 1);
                add(&c.write_bytes, bytes);
                add(&c.write_hits, u64::from(summary.full_hits));
                self.write_latency.record(took_ns);
            }
        }
        add(&c.line_accesses, u64::from(summary.lines));
        add(&c.partial_hits, u64::from(summary.partial_hits));
        add(&c.misses, u64::from(summary.misses));
        if !ok {
            add(&c.errors, 1);
        }
    }
}

/// An attached volume, for [`Engine::read_with`] and [`Engine::write_with`]
/// (which skip the look-up of [`Engine::read_volume`]). Cheap to clone;
/// once the volume is detached, requests through it fail with
/// [`EngineError::Shutdown`].
#[derive(Clone)]
pub struct Volume(Arc<VolumeState>);

impl std::fmt::Debug for Volume {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Volume")
            .field("id", &self.0.id)
            .field("name", &self.0.name)
            .finish_non_exhaustive()
    }
}

impl Volume {
    pub fn id(&self) -> VolumeId {
        self.0.id
    }

    pub fn name(&self) -> &str {
        &self.0.name
    }

    pub fn size_bytes(&self) -> u64 {
        self.0.size_bytes
    }

    /// The volume's backend.
    pub fn backend(&self) -> &Arc<dyn BlockDevice> {
        &self.0.backend
    }

    /// False once the volume is being detached or is detached.
    pub fn is_open(&self) -> bool {
        !self.0.closed.load(Ordering::SeqCst)
    }

    pub(super) fn state(&self) -> &VolumeState {
        &self.0
    }

    /// The state, shared (for work that outlives the request).
    pub(super) fn shared(&self) -> &Arc<VolumeState> {
        &self.0
    }
}

/// The attached volumes, in the order they were given or attached.
pub(super) struct VolumeTable {
    volumes: Vec<Arc<VolumeState>>,
}

/// Closes the gates of `volumes` (new requests fail with
/// [`EngineError::Shutdown`]) and waits for the requests already let in,
/// until `deadline` if one is given; returns how many are still in flight
/// then (0 without a deadline).
fn close_and_drain(volumes: &[Arc<VolumeState>], deadline: Option<std::time::Instant>) -> i64 {
    for volume in volumes {
        volume.closed.store(true, Ordering::SeqCst);
    }
    loop {
        let left: i64 = volumes.iter().map(|v| v.in_flight()).sum();
        if left <= 0 || deadline.is_some_and(|d| std::time::Instant::now() >= d) {
            return left.max(0);
        }
        std::thread::sleep(DRAIN_POLL);
    }
}

impl Inner {
    /// Closes every volume's gate (new requests fail with
    /// [`EngineError::Shutdown`]) and waits until `deadline` for the
    /// requests already let in; returns how many are still in flight then.
    /// A shutdown must not record `clean` while a write-through request
    /// may be between its backend write and its cache write: the next
    /// start would load that line's older cached copy unchecked.
    pub(super) fn close_gates_and_drain(&self, deadline: std::time::Instant) -> i64 {
        let volumes: Vec<Arc<VolumeState>> = self
            .volumes
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .volumes
            .clone();
        close_and_drain(&volumes, Some(deadline))
    }
}

impl VolumeTable {
    pub(super) fn new(volumes: Vec<Arc<VolumeState>>) -> VolumeTable {
        VolumeTable { volumes }
    }

    /// The first volume (the engine's default).
    pub(super) fn first(&self) -> Volume {
        Volume(Arc::clone(&self.volumes[0]))
    }

    /// The backend of the first volume attached, if any is.
    pub(super) fn first_backend(&self) -> Option<Arc<dyn BlockDevice>> {
        self.volumes.first().map(|v| Arc::clone(&v.backend))
    }

    fn get(&self, id: VolumeId) -> Option<&Arc<VolumeState>> {
        self.volumes.iter().find(|v| v.id == id)
    }

    /// The volumes' names, in order.
    pub(super) fn names(&self) -> Vec<String> {
        self.volumes.iter().map(|v| v.name.clone()).collect()
    }
}

/// An attached volume, as [`Engine::volumes`] lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeInfo {
    pub id: VolumeId,
    pub name: String,
    pub size_bytes: u64,
}

/// One volume's share of the cache and of the requests.
#[derive(Clone, Debug, Default)]
pub struct VolumeStats {
    pub id: VolumeId,
    pub name: String,
    pub size_bytes: u64,
    pub read_requests: u64,
    pub write_requests: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    /// Line accesses (one per cache line a request touches).
    pub line_accesses: u64,
    /// Line accesses of reads (writes) whose sectors were all cached.
    pub read_hits: u64,
    pub write_hits: u64,
    pub partial_hits: u64,
    pub misses: u64,
    /// Requests that failed.
    pub errors: u64,
    /// Lines of this volume in the cache, and how many of them are dirty.
    pub resident_lines: u64,
    pub dirty_lines: u64,
    pub read_latency: LatencyPercentiles,
    pub write_latency: LatencyPercentiles,
}

impl VolumeStats {
    pub fn requests(&self) -> u64 {
        self.read_requests + self.write_requests
    }

    /// Full hits over line accesses (the core's definition of a hit).
    pub fn hit_ratio(&self) -> f64 {
        if self.line_accesses == 0 {
            0.0
        } else {
            (self.read_hits + self.write_hits) as f64 / self.line_accesses as f64
        }
    }
}

/// Volume names must be unique, not empty, and fit the superblock.
pub(super) fn check_names<'a>(names: impl Iterator<Item = &'a str>) -> Result<(), EngineError> {
    let mut seen: Vec<&str> = Vec::new();
    for name in names {
        check_name(name)?;
        if seen.contains(&name) {
            return Err(EngineError::Volume(format!("`{name}` names two volumes")));
        }
        seen.push(name);
    }
    if seen.is_empty() {
        return Err(EngineError::Volume("an engine needs at least one volume".into()));
    }
    Ok(())
}

fn check_name(name: &str) -> Result<(), EngineError> {
    if name.is_empty() || name.len() > NAME_BYTES_MAX {
        return Err(EngineError::Volume(format!(
            "a volume name must have 1 to {NAME_BYTES_MAX} bytes, `{name}` has {}",
            name.len()
        )));
    }
    Ok(())
}

impl Inner {
    /// The backend of `volume`: every backend access of the engine goes
    /// through here.
    pub(super) fn backend_of(&self, volume: VolumeId) -> Result<Arc<dyn BlockDevice>, EngineError> {
        let table = self.volumes.read().unwrap_or_else(|p| p.into_inner());
        table
            .get(volume)
            .map(|v| Arc::clone(&v.backend))
            .ok_or_else(|| EngineError::UnknownVolume(format!("with id {volume}")))
    }

    /// Flushes the backend of every attached volume (all are tried; the
    /// first error is returned).
    pub(super) fn flush_backends(&self) -> Result<(), EngineError> {
        let backends: Vec<Arc<dyn BlockDevice>> = {
            let table = self.volumes.read().unwrap_or_else(|p| p.into_inner());
            table.volumes.iter().map(|v| Arc::clone(&v.backend)).collect()
        };
        let mut result = Ok(());
        for backend in backends {
            if let Err(e) = backend.flush() {
                if result.is_ok() {
                    result = Err(e.into());
                }
            }
        }
        result
    }

    fn volume_state(&self, id: VolumeId) -> Result<Arc<VolumeState>, EngineError> {
        let table = self.volumes.read().unwrap_or_else(|p| p.into_inner());
        table
            .get(id)
            .cloned()
            .ok_or_else(|| EngineError::UnknownVolume(format!("with id {id}")))
    }

    pub(super) fn dirty_lines_of(&self, volume: VolumeId) -> u64 {
        self.shards
            .iter()
            .map(|s| lock(&s.state).cache.volume_lines(volume).dirty)
            .sum()
    }

    /// Writes back the lines of `volume` dirty when called (lines dirtied
    /// meanwhile may be left), then flushes its backend. The caller holds
    /// the cleaning lock. Returns how many lines were written back.
    fn write_back_volume(&self, volume: &VolumeState) -> Result<u64, EngineError> {
        if let Some(epochs) = &self.epochs {
            // Epochs span volumes: everything goes back, oldest first.
            let written = self.drain_epochs_so_far(epochs)?;
            volume.backend.flush()?;
            return Ok(written);
        }
        let mut written = 0;
        let mut failed = 0;
        let shards = self.all_shards();
        let mut remaining = self.dirty_lines_of(volume.id) as usize;
        while remaining > 0 {
            let batch = self.flush_batch(
                &shards,
                FlushOrder::Volume(volume.id),
                self.flush_all_share(),
                false,
            );
            written += (batch.taken - batch.failed) as u64;
            failed += batch.failed as u64;
            if batch.taken == 0 || batch.failed > 0 {
                break;
            }
            remaining = remaining.saturating_sub(batch.taken);
        }
        if failed > 0 {
            return Err(EngineError::DirtyLinesRemain { lines: failed });
        }
        volume.backend.flush()?;
        Ok(written)
    }

    /// Steps 2 of a detach (see the module documentation): the volume's
    /// gate is closed and its requests drained.
    fn empty_volume(&self, volume: &VolumeState) -> Result<(), EngineError> {
        let _cleaning = lock(&self.cleaner.cleaning);
        self.write_back_volume(volume)?;
        let dirty = self.dirty_lines_of(volume.id);
        if dirty > 0 {
            return Err(EngineError::DirtyLinesRemain { lines: dirty });
        }
        let mut tickets: Vec<Ticket> = Vec::new();
        for (index, shard) in self.shards.iter().enumerate() {
            let mut state = lock(&shard.state);
            let ShardState {
                cache,
                ops,
                shadow,
                queues,
                ..
            } = &mut *state;
            cache.drop_clean_lines(volume.id, ops);
            for op in ops.ops() {
                if let Op::Invalidate { slot, .. } = *op {
                    shadow.note_empty(slot);
                }
            }
            let left = cache.volume_lines(volume.id).resident;
            if left > 0 {
                return Err(EngineError::Volume(format!(
                    "volume `{}`: {left} lines stay in shard {index} after writing back and dropping",
                    volume.name
                )));
            }
            // Operations on the volume's lines decided before it closed may
            // still hold tickets: wait behind them.
            let queued: Vec<LineKey> = queues.queued_lines(volume.id).collect();
            for key in queued {
                let (ticket, _) = queues.take(key);
                tickets.push((index, TicketKey::Line(key), ticket));
            }
        }
        self.wait_for_tickets(&tickets);
        self.release_tickets(&tickets);
        Ok(())
    }

    /// Replaces the superblock's volume table (an A/B update).
    fn update_volume_table(&self, change: impl FnOnce(&mut Vec<VolumeEntry>)) -> Result<(), EngineError> {
        self.update_superblock(|superblock| {
            change(&mut superblock.volumes);
            true
        })
    }
}

impl Engine {
    /// The attached volumes, in the order they were given or attached.
    pub fn volumes(&self) -> Vec<VolumeInfo> {
        let table = self.inner.volumes.read().unwrap_or_else(|p| p.into_inner());
        table
            .volumes
            .iter()
            .map(|v| VolumeInfo {
                id: v.id,
                name: v.name.clone(),
                size_bytes: v.size_bytes,
            })
            .collect()
    }

    /// A handle on the attached volume `id`.
    pub fn volume(&self, id: VolumeId) -> Result<Volume, EngineError> {
        self.inner.volume_state(id).map(Volume)
    }

    /// A handle on the attached volume named `name`.
    pub fn volume_named(&self, name: &str) -> Option<Volume> {
        let table = self.inner.volumes.read().unwrap_or_else(|p| p.into_inner());
        table
            .volumes
            .iter()
            .find(|v| v.name == name)
            .map(|v| Volume(Arc::clone(v)))
    }

    /// The volume of [`Engine::read`] and [`Engine::write`].
    pub fn default_volume(&self) -> &Volume {
        &self.default
    }

    /// Reads `buf.len()` bytes at `offset` of volume `id`.
    pub fn read_volume(&self, id: VolumeId, offset: u64, buf: &mut [u8]) -> Result<(), EngineError> {
        self.read_with(&self.volume(id)?, offset, buf)
    }

    /// Writes `data` at `offset` of volume `id`; with `fua`, durable before
    /// returning.
    pub fn write_volume(&self, id: VolumeId, offset: u64, data: &[u8], fua: bool) -> Result<(), EngineError> {
        self.write_with(&self.volume(id)?, offset, data, fua)
    }

    /// [`Engine::flush`] on behalf of a client of `volume`: refused with
    /// [`EngineError::Shutdown`] once the volume is detached.
    pub fn flush_with(&self, volume: &Volume) -> Result<(), EngineError> {
        let _serving = volume.state().enter()?;
        self.flush()
    }

    /// Writes back every line of volume `id` dirty at the call (the volume
    /// keeps serving; lines written meanwhile may stay dirty) and flushes
    /// its backend; with persistent metadata, a barrier then records the
    /// lines as clean. Returns how many lines were written back.
    pub fn flush_volume(&self, id: VolumeId) -> Result<u64, EngineError> {
        let _admin = lock(&self.inner.admin);
        let volume = self.inner.volume_state(id)?;
        let _serving = volume.enter()?;
        let written = {
            let _cleaning = lock(&self.inner.cleaner.cleaning);
            self.inner.write_back_volume(&volume)?
        };
        self.inner.sync_records()?;
        Ok(written)
    }

    /// Adds a volume to the cache while the others serve, and returns its
    /// id (the smallest id the device's volume table does not use). The
    /// table on the device lists it before any of its lines is recorded.
    pub fn attach(&self, name: &str, backend: Arc<dyn BlockDevice>) -> Result<VolumeId, EngineError> {
        check_name(name)?;
        let _admin = lock(&self.inner.admin);
        if self.inner.stopping.load(Ordering::SeqCst) {
            return Err(EngineError::Shutdown);
        }
        if self.volume_named(name).is_some() {
            return Err(EngineError::Volume(format!(
                "a volume named `{name}` is already attached"
            )));
        }
        let id = {
            let meta = lock(&self.inner.metadata.durability.meta);
            let table = self.inner.volumes.read().unwrap_or_else(|p| p.into_inner());
            (0..)
                .find(|id| table.get(*id).is_none() && meta.superblock.volumes.iter().all(|v| v.id != *id))
                .unwrap_or(VolumeId::MAX)
        };
        let identity = crate::recovery::backend_identity(&*backend);
        let table = self.inner.volumes.read().unwrap_or_else(|p| p.into_inner());
        if let Some(other) = table
            .volumes
            .iter()
            .find(|v| identity.is_some() && crate::recovery::backend_identity(&*v.backend) == identity)
        {
            return Err(EngineError::Volume(format!(
                "volume `{}` already has this backend ({}): two volumes would cache it apart",
                other.name,
                crate::recovery::describe_backend(&*backend)
            )));
        }
        drop(table);
        let entry = VolumeEntry {
            id,
            name: name.to_string(),
            size_bytes: backend.len_bytes(),
            identity,
        };
        self.inner.update_volume_table(|volumes| volumes.push(entry))?;
        let state = VolumeState::new(id, name.to_string(), backend);
        self.inner
            .volumes
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .volumes
            .push(state);
        Ok(id)
    }

    /// Detaches volume `id` while the others serve: its requests in flight
    /// finish, later ones fail with [`EngineError::Shutdown`], its dirty
    /// lines are written back and its backend flushed, its lines leave the
    /// cache and their records the device, and it leaves the device's
    /// volume table. On an error before its lines are gone it is serving
    /// again, with nothing lost. Returns the backend, flushed.
    pub fn detach(&self, id: VolumeId) -> Result<Arc<dyn BlockDevice>, EngineError> {
        let _admin = lock(&self.inner.admin);
        if self.inner.stopping.load(Ordering::SeqCst) {
            return Err(EngineError::Shutdown);
        }
        let volume = self.inner.volume_state(id)?;
        close_and_drain(std::slice::from_ref(&volume), None);
        if let Err(e) = self.inner.empty_volume(&volume) {
            volume.reopen();
            return Err(e);
        }
        // Its slots' records become empty (after the backends are flushed).
        self.inner.sync_records()?;
        self.inner
            .update_volume_table(|volumes| volumes.retain(|v| v.id != id))?;
        self.inner
            .volumes
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .volumes
            .retain(|v| v.id != id);
        Ok(Arc::clone(&volume.backend))
    }

    /// The counters of volume `id` and its lines in the cache.
    pub fn volume_stats(&self, id: VolumeId) -> Result<VolumeStats, EngineError> {
        let volume = self.inner.volume_state(id)?;
        let c = &volume.counters;
        let mut stats = VolumeStats {
            id,
            name: volume.name.clone(),
            size_bytes: volume.size_bytes,
            read_requests: c.sum(|s| &s.read_requests),
            write_requests: c.sum(|s| &s.write_requests),
            read_bytes: c.sum(|s| &s.read_bytes),
            write_bytes: c.sum(|s| &s.write_bytes),
            line_accesses: c.sum(|s| &s.line_accesses),
            read_hits: c.sum(|s| &s.read_hits),
            write_hits: c.sum(|s| &s.write_hits),
            partial_hits: c.sum(|s| &s.partial_hits),
            misses: c.sum(|s| &s.misses),
            errors: c.sum(|s| &s.errors),
            read_latency: c.read_latency.percentiles(),
            write_latency: c.write_latency.percentiles(),
            ..VolumeStats::default()
        };
        for shard in &self.inner.shards {
            let lines = lock(&shard.state).cache.volume_lines(id);
            stats.resident_lines += lines.resident;
            stats.dirty_lines += lines.dirty;
        }
        Ok(stats)
    }
}

//! An engine has one line size for life (its slot
//! layout and the records on the cache device depend on it), so a line size
//! changed while serving (ReCA's) is a succession: the serving
//! layer quiesces the engine, shuts it down (every dirty line written back),
//! opens a successor on the same devices with the new line size (the start
//! path formats the device for the new geometry) and warms it. This file is
//! what the successor needs from the engine it replaces and nothing else:
//! what was cached ([`Engine::cached_ranges`], read again through the
//! successor so its lines come back), ReCA's table, parameters and category
//! ([`Engine::reca_succession`]), and the devices ([`Engine::cache_device`],
//! [`Engine::volume_backends`]).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use iocache_core::{bitmap, LineKey, SlotId, SlotSnapshot, VolumeId, WritePolicy};
use iocache_device::BlockDevice;

use super::{lock, Buffer, Engine, EngineError, Inner, ShardState, Volume, SECTOR_BYTES};

/// A copy of a clean range the cache holds, taken while serving
/// ([`Engine::copy_cached`]), and what must stay unchanged for it to be
/// the backend's data still.
pub struct CachedCopy {
    pub range: CachedRange,
    pub data: Vec<u8>,
    shard: usize,
    slot: SlotId,
    key: LineKey,
    generation: u64,
}

/// A range of a volume the cache holds (every sector valid), to read again
/// through a successor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CachedRange {
    /// The volume's name (ids are the cache device's and may change when
    /// it is formatted again).
    pub volume: Arc<str>,
    pub offset: u64,
    pub length: u64,
}

impl Engine {
    /// The ranges of valid sectors the cache holds, at most `max_bytes` in
    /// all, slot by slot of each shard (shards taken in turn, so a bound
    /// keeps a share of each); runs of one line only (adjacent lines are
    /// separate ranges). Takes each shard's lock once.
    pub fn cached_ranges(&self, max_bytes: u64) -> Vec<CachedRange> {
        let names = self.volume_names();
        let mut per_shard: Vec<Vec<CachedRange>> = Vec::with_capacity(self.inner.shards.len());
        for shard in &self.inner.shards {
            let state = lock(&shard.state);
            let mut ranges = Vec::new();
            self.inner
                .each_cached_run(&state, &names, |range| ranges.push(range));
            per_shard.push(ranges);
        }
        // Round-robin over shards until the bound.
        let mut out = Vec::new();
        let mut total = 0u64;
        let mut cursors = vec![0usize; per_shard.len()];
        loop {
            let mut progressed = false;
            for (ranges, at) in per_shard.iter().zip(cursors.iter_mut()) {
                let Some(range) = ranges.get(*at) else { continue };
                if total + range.length > max_bytes {
                    return out;
                }
                total += range.length;
                out.push(range.clone());
                *at += 1;
                progressed = true;
            }
            if !progressed {
                return out;
            }
        }
    }

    /// The attached volumes' ids and names.
    fn volume_names(&self) -> Vec<(VolumeId, Arc<str>)> {
        self.volumes()
            .into_iter()
            .map(|v| (v.id, Arc::from(v.name.as_str())))
            .collect()
    }

    /// Copies of the clean lines the cache holds, straight from the cache
    /// device, slot by slot (each under its shard's lock, with no op on
    /// it under way), up to `max_bytes` or until `deadline`, while the
    /// engine serves. A copy is the backend's data as long as its line is
    /// unchanged: [`Engine::copies_unchanged`] keeps only those. Copies
    /// nothing after a cache-device error.
    pub fn copy_cached(&self, max_bytes: u64, deadline: Instant) -> Vec<CachedCopy> {
        let mut out = Vec::new();
        if self.inner.health.io_errors.load(Ordering::Relaxed) > 0 || self.inner.content_lost() {
            return out;
        }
        let names = self.volume_names();
        let line_bytes = self.inner.line_bytes;
        let mut bytes = 0u64;
        let mut line = vec![0u8; line_bytes as usize];
        for (i, shard) in self.inner.shards.iter().enumerate() {
            let capacity = lock(&shard.state).cache.capacity_lines();
            for slot in 0..capacity as SlotId {
                if bytes >= max_bytes || Instant::now() >= deadline {
                    return out;
                }
                let state = lock(&shard.state);
                let Some(snap) = state.cache.slot_snapshot(slot) else {
                    continue;
                };
                if bitmap::any(snap.dirty)
                    || !state.slot_idle(slot, snap.key)
                    || shard.poisoned.load(Ordering::Acquire) > 0
                {
                    continue;
                }
                let Some((_, volume)) = names.iter().find(|(id, _)| *id == snap.key.volume) else {
                    continue;
                };
                let at = self.inner.cache_offset(i, slot, 0);
                if self.inner.slots.dev.read_at(&mut line, at).is_err() {
                    return out;
                }
                let generation = state.cache.slot_generation(slot);
                valid_runs(&snap, volume, line_bytes, |range, from| {
                    let from = from as usize;
                    bytes += range.length;
                    out.push(CachedCopy {
                        data: line[from..from + range.length as usize].to_vec(),
                        range,
                        shard: i,
                        slot,
                        key: snap.key,
                        generation,
                    });
                });
            }
        }
        out
    }

    /// Of `copies` ([`Engine::copy_cached`]), those whose line is unchanged
    /// since (the same line in the same slot, nothing written, filled over,
    /// dropped or moved), with their data: still the backend's data, as
    /// long as nothing changes the lines (a caller holds the clients and has
    /// written every dirty line back).
    pub fn copies_unchanged(&self, copies: Vec<CachedCopy>) -> Vec<(CachedRange, Vec<u8>)> {
        let mut out = Vec::with_capacity(copies.len());
        let mut locked: Option<(usize, std::sync::MutexGuard<'_, ShardState>)> = None;
        for copy in copies {
            if locked.as_ref().is_none_or(|(i, _)| *i != copy.shard) {
                locked = Some((copy.shard, lock(&self.inner.shards[copy.shard].state)));
            }
            let Some((_, state)) = &locked else { continue };
            let unchanged = state.cache.slot_snapshot(copy.slot).is_some_and(|snap| {
                snap.key == copy.key
                    && !bitmap::any(snap.dirty)
                    && state.cache.slot_generation(copy.slot) == copy.generation
            });
            if unchanged {
                out.push((copy.range, copy.data));
            }
        }
        out
    }

    /// Reads like [`Engine::read_with`] (a miss may bring the lines in, as
    /// the policy decides), but the request is not a client's: not shown
    /// to ReCA (reading a predecessor's cached ranges again is not the
    /// clients' workload) and not counted in the volume's requests or the
    /// latency histograms (the core's hit, miss and promotion counts do
    /// count it).
    pub fn warm_with(&self, volume: &Volume, offset: u64, buf: &mut [u8]) -> Result<(), EngineError> {
        self.request(volume, offset, Buffer::Read(buf), false, false, None)
    }

    /// Stops new dirty data while a successor is prepared: every shard's
    /// controller write policy becomes write-through (writes reach the
    /// backend before they are acknowledged; reads are served as before),
    /// so a write-back of the dirty lines converges while the clients
    /// write. Returns the controller policy it replaced, for
    /// [`Engine::restore_controller_policy`] if the succession is given up.
    /// (ReCA may set its own again at its next category change.)
    pub fn hold_writes_through(&self) -> Option<WritePolicy> {
        let before = lock(&self.inner.shards[0].state).cache.mode_settings().controller;
        self.restore_controller_policy(Some(WritePolicy::WriteThrough));
        before
    }

    /// Sets every shard's controller write policy (see
    /// [`Engine::hold_writes_through`]).
    pub fn restore_controller_policy(&self, policy: Option<WritePolicy>) {
        self.inner.set_controller_policy(policy);
    }

    /// The cache device (with a cache array, the array).
    pub fn cache_device(&self) -> Arc<dyn BlockDevice> {
        Arc::clone(&self.inner.slots.dev)
    }

    /// Whether the cache device is a cache array (its members were
    /// formatted for one line size: no succession changes it).
    pub fn on_cache_array(&self) -> bool {
        self.inner.slots.array.is_some()
    }

    /// Bytes per cache line.
    pub fn line_bytes(&self) -> u64 {
        self.inner.line_bytes
    }

    /// The attached volumes' names and backends, in their order.
    pub fn volume_backends(&self) -> Vec<(String, Arc<dyn BlockDevice>)> {
        self.volumes()
            .into_iter()
            .filter_map(|v| {
                let handle = self.volume_named(&v.name)?;
                Some((v.name, Arc::clone(handle.backend())))
            })
            .collect()
    }
}

impl Inner {
    /// Calls `f` with every run of valid sectors of a shard (locked:
    /// `state`) of a volume in `names`, slot by slot.
    fn each_cached_run(
        &self,
        state: &ShardState,
        names: &[(VolumeId, Arc<str>)],
        mut f: impl FnMut(CachedRange),
    ) {
        // Lines of one volume mostly follow each other: look its name up
        // again only when the volume changes.
        let mut named: Option<(VolumeId, Arc<str>)> = None;
        for slot in 0..state.cache.capacity_lines() {
            let Some(snap) = state.cache.slot_snapshot(slot as iocache_core::SlotId) else {
                continue;
            };
            if named.as_ref().is_none_or(|(id, _)| *id != snap.key.volume) {
                named = names.iter().find(|(id, _)| *id == snap.key.volume).cloned();
            }
            let Some((_, volume)) = &named else {
                continue;
            };
            valid_runs(&snap, volume, self.line_bytes, |range, _| f(range));
        }
    }
}

/// Calls `f` with each run of valid sectors of the line `snap` (of
/// `volume`, lines of `line_bytes`) as a range of the volume, and where
/// the run starts in the line, in bytes.
fn valid_runs(
    snap: &SlotSnapshot<'_>,
    volume: &Arc<str>,
    line_bytes: u64,
    mut f: impl FnMut(CachedRange, u64),
) {
    let base = snap.key.line_index * line_bytes;
    let sectors = (line_bytes / SECTOR_BYTES) as u32;
    bitmap::for_each_run(snap.valid, 0, sectors, |a, b, valid| {
        if valid {
            let from = u64::from(a) * SECTOR_BYTES;
            let range = CachedRange {
                volume: Arc::clone(volume),
                offset: base + from,
                length: u64::from(b - a) * SECTOR_BYTES,
            };
            f(range, from);
        }
    });
}

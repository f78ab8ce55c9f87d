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

use std::sync::Arc;

use iocache_core::{bitmap, WritePolicy};
use iocache_device::BlockDevice;

use super::{lock, Buffer, Engine, EngineError, Volume, SECTOR_BYTES};

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
        let names: Vec<(iocache_core::VolumeId, Arc<str>)> = self
            .volumes()
            .into_iter()
            .map(|v| (v.id, Arc::from(v.name.as_str())))
            .collect();
        let line_bytes = self.inner.line_bytes;
        let sectors = (line_bytes / SECTOR_BYTES) as u32;
        let mut per_shard: Vec<Vec<CachedRange>> = Vec::with_capacity(self.inner.shards.len());
        for shard in &self.inner.shards {
            let state = lock(&shard.state);
            let mut ranges = Vec::new();
            // Lines of one volume mostly follow each other: look its name
            // up again only when the volume changes.
            let mut named: Option<(iocache_core::VolumeId, Arc<str>)> = None;
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
                let base = snap.key.line_index * line_bytes;
                bitmap::for_each_run(snap.valid, 0, sectors, |a, b, valid| {
                    if valid {
                        ranges.push(CachedRange {
                            volume: Arc::clone(volume),
                            offset: base + u64::from(a) * SECTOR_BYTES,
                            length: u64::from(b - a) * SECTOR_BYTES,
                        });
                    }
                });
            }
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

//! The slot store: the cache device, or the cache array of several (clean
//! lines striped, dirty lines mirrored), and where a slot's line lies on it
//! (`cache_offset`: `data_offset` plus the slot's global index times the
//! line size). Here are the reads of cached sectors (`read_cache`, served
//! from the backend when a failed or poisoned slot held them clean:
//! `read_around`; from the mirror on a cache array whose member failed:
//! `read_degraded`), the batched reads of a multi-line hit through the I/O
//! engine (`read_cache_batch`), and the cache array's write path
//! (`write_array`: dirty data to the slot and its mirror, or through to the
//! backend when no mirror is to be had). Its state is [`SlotStore`], one
//! field of `Inner`.

use std::sync::Arc;

use iocache_core::{bitmap, LineKey, Op, SlotId, SECTOR_BYTES};
use iocache_device::{BlockDevice, DeviceError, IoEngine, IoRequest};

use super::queues::cache_class;
use super::{lock, CacheRead, EngineError, Inner};
use crate::raid::{CacheArray, MirrorState};

/// What the slot store owns.
pub(super) struct SlotStore {
    /// The cache device (with a cache array, the array itself).
    pub(super) dev: Arc<dyn BlockDevice>,
    /// Cache RAID (see `raid.rs`); `dev` is this array.
    pub(super) array: Option<Arc<CacheArray>>,
    /// Where slot 0's line starts on the cache device.
    pub(super) data_offset: u64,
    /// Batches the reads of a multi-line hit (`IoMode::Uring`).
    pub(super) io_engine: Option<Box<dyn IoEngine>>,
}

impl Inner {
    pub(super) fn cache_offset(&self, shard: usize, slot: u32, line_offset: u32) -> u64 {
        self.slots.data_offset
            + (self.shards[shard].base_slot + u64::from(slot)) * self.line_bytes
            + u64::from(line_offset)
    }

    /// Reads a run of consecutive `ReadCache` ops (disjoint buffer ranges) as
    /// one batch through the I/O engine, so a multi-line hit's reads overlap.
    pub(super) fn read_cache_batch(
        &self,
        shard: usize,
        base: usize,
        ops: &[Op],
        buf: &mut [u8],
    ) -> Result<(), EngineError> {
        let Some(io) = &self.slots.io_engine else {
            unreachable!("batches are only formed with an I/O engine");
        };
        if self.content_lost() {
            return Err(EngineError::Io("the cache device lost its content".into()));
        }
        // (buffer start, length, device offset), in buffer order for splitting.
        let mut parts: Vec<(usize, usize, u64)> = ops
            .iter()
            .map(|op| {
                let read = CacheRead::of(op, base).expect("only ReadCache ops are batched");
                let range = read.buffer_range();
                (
                    range.start,
                    range.len(),
                    self.cache_offset(shard, read.slot, read.line_offset_bytes),
                )
            })
            .collect();
        parts.sort_unstable_by_key(|p| p.0);
        let device: &dyn BlockDevice = &*self.slots.dev;
        let mut requests = Vec::with_capacity(parts.len());
        // The buffer range the reads fill (parts are in buffer order).
        let read_from = parts.first().map_or(0, |p| p.0);
        let read_end = parts.last().map_or(0, |p| p.0 + p.1);
        let mut rest = &mut *buf;
        let mut consumed = 0;
        for (start, len, offset) in parts {
            let (_, tail) = rest.split_at_mut(start - consumed);
            let (chunk, tail) = tail.split_at_mut(len);
            requests.push(IoRequest::read(device, chunk, offset));
            rest = tail;
            consumed = start + len;
        }
        let n = requests.len() as u64;
        self.queues
            .cache
            .time_n(&self.clock, cache_class::READ_HIT, n, || io.submit(&mut requests))?;
        for request in &requests {
            if let Err(e) = request.outcome() {
                return Err(EngineError::Io(e.to_string()));
            }
        }
        drop(requests);
        if self.slots.array.is_none() && !self.cache_read_believable(&buf[read_from..read_end]) {
            // Redone op by op, each read around the lost device.
            return Err(EngineError::Io("the cache device lost its content".into()));
        }
        Ok(())
    }

    /// Reads sectors of `key` held in `slot` from the cache device, or, if
    /// that fails or the sectors were poisoned by a failed cache write, from
    /// the backend when the cache's copy is clean (else an error: the only
    /// copy of dirty data cannot be read).
    pub(super) fn read_cache(
        &self,
        shard: usize,
        slot: SlotId,
        key: LineKey,
        line_offset: u32,
        out: &mut [u8],
    ) -> Result<(), EngineError> {
        let first = line_offset / SECTOR_BYTES as u32;
        let end = first + (out.len() as u64 / SECTOR_BYTES) as u32;
        if self.content_lost() {
            return self.read_around(shard, slot, key, line_offset, out, None);
        }
        match self.poisoned_in(shard, slot, key, first, end) {
            Some(true) if self.slots.array.is_some() => {
                let array = self.slots.array.as_deref().expect("checked");
                return self.read_degraded(array, shard, slot, key, line_offset, out);
            }
            Some(true) => return self.read_around(shard, slot, key, line_offset, out, None),
            Some(false) => {
                return Err(EngineError::Io(format!(
                    "sectors {first}..{end} of line {} were lost with a failed cache-device write",
                    key.line_index
                )))
            }
            None => {}
        }
        if let Some(array) = &self.slots.array {
            let global = self.shards[shard].base_slot + u64::from(slot);
            if array.primary_failed(global)
                || self
                    .queues
                    .cache
                    .time(&self.clock, cache_class::READ_HIT, || {
                        self.slots
                            .dev
                            .read_at(out, self.cache_offset(shard, slot, line_offset))
                    })
                    .is_err()
            {
                return self.read_degraded(array, shard, slot, key, line_offset, out);
            }
            return Ok(());
        }
        match self.queues.cache.time(&self.clock, cache_class::READ_HIT, || {
            self.slots
                .dev
                .read_at(out, self.cache_offset(shard, slot, line_offset))
        }) {
            Ok(()) if self.cache_read_believable(out) => Ok(()),
            Ok(()) => self.read_around(shard, slot, key, line_offset, out, None),
            Err(e) => {
                self.cache_error("read", &e);
                self.read_around(shard, slot, key, line_offset, out, Some(e))
            }
        }
    }

    /// Writes a cache op's data on a cache array: clean data to the slot's
    /// member only; dirty data to the slot and to its mirror, or, with no
    /// mirror to be had, to the backend too. Succeeds when the data is
    /// where later reads and write-backs look for it (a dirty write whose
    /// slot's member failed is still readable from its mirror or the
    /// backend). Returns the mirror the record must name.
    pub(super) fn write_array(
        &self,
        array: &CacheArray,
        global: u64,
        key: LineKey,
        data: &[u8],
        line_offset: u32,
        dirty: bool,
    ) -> (Result<(), DeviceError>, Option<u32>) {
        let offset = self.slots.data_offset + global * self.line_bytes + u64::from(line_offset);
        if !dirty {
            return (self.slots.dev.write_at(data, offset), None);
        }
        let state = array.ensure_mirror(global);
        let primary = if array.primary_failed(global) {
            Err(None)
        } else {
            self.slots.dev.write_at(data, offset).map_err(Some)
        };
        match state {
            MirrorState::Mirrored(m) => {
                let mirrored = array.write_mirror(m, u64::from(line_offset), data).is_ok();
                let result = match primary {
                    Ok(()) => Ok(()),
                    Err(_) if mirrored => Ok(()),
                    Err(Some(e)) => Err(e),
                    Err(None) => Err(self.array_member_failed(array, offset, data.len())),
                };
                (result, Some(m))
            }
            MirrorState::Through | MirrorState::None => {
                array.note_through_write();
                let backend = self
                    .backend_of(key.volume)
                    .map_err(|e| DeviceError::Io {
                        device: self.slots.dev.name().to_string(),
                        kind: iocache_device::IoKind::Write,
                        offset,
                        len: data.len() as u64,
                        source: std::io::Error::other(e.to_string()),
                    })
                    .and_then(|b| {
                        b.write_at(data, (key.line_index << self.line_shift) + u64::from(line_offset))
                    });
                // With the backend written, a failed slot write only means
                // its member has failed (any error fails it): reads and
                // write-backs of the line find the data in the backend.
                let _ = primary;
                let result = backend;
                (result, None)
            }
        }
    }

    pub(super) fn array_member_failed(&self, array: &CacheArray, offset: u64, len: usize) -> DeviceError {
        DeviceError::Io {
            device: array.name().to_string(),
            kind: iocache_device::IoKind::Write,
            offset,
            len: len as u64,
            source: std::io::Error::other("the cache array member of this line and its mirror failed"),
        }
    }

    /// Reads what the cache device holds at `line_offset` of `slot` (not
    /// through the core: metadata work that needs the bytes as they lie).
    /// On a cache array whose primary copy does not read, the mirror's, or
    /// the backend's for a line whose dirty writes went there too. Call
    /// without the shard's lock.
    pub(super) fn read_slot_bytes(
        &self,
        shard: usize,
        slot: SlotId,
        line_offset: u32,
        out: &mut [u8],
    ) -> Result<(), EngineError> {
        let primary = self
            .slots
            .dev
            .read_at(out, self.cache_offset(shard, slot, line_offset));
        match (&self.slots.array, primary) {
            (_, Ok(())) => Ok(()),
            (Some(array), Err(e)) => {
                let global = self.shards[shard].base_slot + u64::from(slot);
                match array.mirror_state(global) {
                    MirrorState::Mirrored(m) => Ok(array.read_mirror(m, u64::from(line_offset), out)?),
                    // Every dirty write of the line went to the backend
                    // too, and its clean sectors are the backend's: the
                    // backend holds what the slot does.
                    MirrorState::Through => {
                        let key = lock(&self.shards[shard].state).cache.key_in_slot(slot).ok_or(e)?;
                        self.backend_of(key.volume)?
                            .read_at(out, (key.line_index << self.line_shift) + u64::from(line_offset))
                            .map_err(|e| self.backend_error(e))
                    }
                    MirrorState::None => Err(e.into()),
                }
            }
            (None, Err(e)) => Err(e.into()),
        }
    }

    /// Serves a cache read whose slot's member failed (or failed now):
    /// clean sectors from the backend, dirty ones from the mirror (or the
    /// backend, when the line's dirty writes went there too).
    pub(super) fn read_degraded(
        &self,
        array: &CacheArray,
        shard: usize,
        slot: SlotId,
        key: LineKey,
        line_offset: u32,
        out: &mut [u8],
    ) -> Result<(), EngineError> {
        let first = line_offset / SECTOR_BYTES as u32;
        let end = first + (out.len() as u64 / SECTOR_BYTES) as u32;
        let dirty: Option<Vec<u64>> = {
            let state = lock(&self.shards[shard].state);
            state
                .cache
                .slot_snapshot(slot)
                .filter(|snap| snap.key == key && bitmap::count_range(snap.dirty, first, end) > 0)
                .map(|snap| snap.dirty.to_vec())
        };
        self.backend_of(key.volume)?
            .read_at(out, (key.line_index << self.line_shift) + u64::from(line_offset))
            .map_err(|e| self.backend_error(e))?;
        let Some(dirty) = dirty else {
            return Ok(());
        };
        let global = self.shards[shard].base_slot + u64::from(slot);
        match array.mirror_state(global) {
            MirrorState::Through => Ok(()),
            MirrorState::Mirrored(m) => {
                let mut result = Ok(());
                bitmap::for_each_run(&dirty, first, end, |a, b, is_dirty| {
                    if !is_dirty || result.is_err() {
                        return;
                    }
                    let at = ((a - first) as u64 * SECTOR_BYTES) as usize;
                    let len = ((b - a) as u64 * SECTOR_BYTES) as usize;
                    result = array.read_mirror(m, u64::from(a) * SECTOR_BYTES, &mut out[at..at + len]);
                });
                result.map_err(|e| {
                    EngineError::Io(format!(
                        "dirty sectors {first}..{end} of line {}: both cache copies failed: {e}",
                        key.line_index
                    ))
                })
            }
            MirrorState::None => Err(EngineError::Io(format!(
                "dirty sectors {first}..{end} of line {}: the cache device holding them failed and they have no mirror",
                key.line_index
            ))),
        }
    }

    /// Serves a cache read from the backend, if the policy core says those
    /// sectors of `key` are clean (the backend holds them).
    pub(super) fn read_around(
        &self,
        shard: usize,
        slot: SlotId,
        key: LineKey,
        line_offset: u32,
        out: &mut [u8],
        cause: Option<DeviceError>,
    ) -> Result<(), EngineError> {
        let first = line_offset / SECTOR_BYTES as u32;
        let end = first + (out.len() as u64 / SECTOR_BYTES) as u32;
        let clean = {
            let state = lock(&self.shards[shard].state);
            state
                .cache
                .slot_snapshot(slot)
                .is_none_or(|snap| snap.key != key || bitmap::count_range(snap.dirty, first, end) == 0)
        };
        if !clean {
            return Err(EngineError::Io(format!(
                "cache device read of dirty sectors {first}..{end} of line {} failed{}",
                key.line_index,
                cause.map(|e| format!(": {e}")).unwrap_or_default()
            )));
        }
        self.backend_of(key.volume)?
            .read_at(out, (key.line_index << self.line_shift) + u64::from(line_offset))
            .map_err(|e| self.backend_error(e))
    }
}

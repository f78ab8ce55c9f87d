//! Poisoning and health: what the engine does when a device fails. A
//! failed or abandoned cache write poisons the sectors concerned per slot
//! (`poison`, `unpoison`, `forget_or_poison`), so that requests decided
//! before the failure read the backend instead (`poisoned_in`) and no flush
//! writes them back (`poison_blocks_write_back`); the poisoned map of a
//! shard lives in its `ShardState` (under the shard lock, like its ticket
//! queues) with a count in `Shard` that the hit path checks. Cache-device
//! errors are counted (`cache_error`): past the threshold the cores are told
//! the device failed (`set_cache_device_failed`: pass-through) until a probe
//! of the device succeeds (`probe_cache_device`, run by the cleaner). Its
//! state is [`HealthState`], one field of `Inner`: the error counters and
//! back-off of `health.rs`, and the engine's counters of failed requests and
//! forgotten lines.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use iocache_core::{bitmap, FlushToken, LineKey, Op, SlotId, SECTOR_BYTES};
use iocache_device::DeviceError;
use smallvec::SmallVec;

use super::{lock, EngineError, Inner};
use crate::health::Health;

/// How often at most a read that returned a zeroed sector makes the engine
/// check that the cache device still holds its content.
const ZERO_READ_CHECK_INTERVAL: std::time::Duration = std::time::Duration::from_millis(1);

/// What poisoning and health own.
pub(super) struct HealthState {
    /// Device error counters, the cache device's pass-through fall-back and
    /// its probes, the cleaner's back-off (`health.rs`).
    pub(super) devices: Health,
    /// Requests that failed with a device error (`EngineStats::io_errors`).
    pub(super) io_errors: AtomicU64,
    /// Lines whose sectors the core forgot after a failed cache write
    /// (`EngineStats::forgotten_lines`).
    pub(super) forgotten_lines: AtomicU64,
    /// The cache device lost what it held (a file truncated under it): it
    /// is failed for good, nothing is read from it again (clean data comes
    /// from the backend, dirty data is an error), and no probe brings it
    /// back (`cache_intact`).
    pub(super) content_lost: AtomicBool,
    /// When a zeroed sector read from the cache device last made the
    /// engine check the device (`cache_read_believable`), engine clock ns.
    zero_read_checked_ns: AtomicU64,
    /// A flush of the cache device failed: failed until the server
    /// restarts (no probe brings it back).
    pub(super) flush_failed: AtomicBool,
}

impl HealthState {
    pub(super) fn new() -> HealthState {
        HealthState {
            devices: Health::default(),
            io_errors: AtomicU64::new(0),
            forgotten_lines: AtomicU64::new(0),
            content_lost: AtomicBool::new(false),
            zero_read_checked_ns: AtomicU64::new(0),
            flush_failed: AtomicBool::new(false),
        }
    }
}

#[derive(Clone, Debug)]
pub(super) struct Poisoned {
    key: LineKey,
    /// Sectors the cache must not serve (or write back) from the slot.
    sectors: SectorBits,
    /// Of those, the ones whose data the backend holds (else a read fails).
    clean: SectorBits,
}

/// A line's sector bitmap (up to 2048 sectors: 1 MiB lines).
pub(super) type SectorBits = SmallVec<[u64; 1]>;

pub(super) fn bits_range(words: usize, first: u32, end: u32) -> SectorBits {
    let mut bits: SectorBits = SmallVec::from_elem(0, words);
    bitmap::set_range(&mut bits, first, end);
    bits
}

pub(super) fn bits_overlap(a: &[u64], b: &[u64]) -> bool {
    a.iter().zip(b).any(|(x, y)| x & y != 0)
}

impl Inner {
    /// Makes the core forget sectors of `key` in `slot` that the device does
    /// not hold, unless a later decision changed the slot; then poisons them
    /// (`clean`: the backend has their data; else reading them fails).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn forget_or_poison(
        &self,
        shard: usize,
        slot: SlotId,
        key: LineKey,
        generation: u64,
        first: u32,
        end: u32,
        clean: bool,
    ) {
        let forgot = {
            let mut state = lock(&self.shards[shard].state);
            state
                .cache
                .forget_sectors_if_unchanged(slot, key, generation, first, end)
        };
        if forgot {
            self.health.forgotten_lines.fetch_add(1, Ordering::Relaxed);
        }
        // Requests decided before this may still read the slot: poison it
        // either way.
        self.poison(shard, slot, key, first, end, clean);
    }

    pub(super) fn words(&self) -> usize {
        ((self.line_bytes / SECTOR_BYTES) as usize).div_ceil(64)
    }

    /// Whether sectors `[first, end)` of `key` in `slot` are poisoned, and
    /// if so whether all of those poisoned are clean.
    pub(super) fn poisoned_in(
        &self,
        shard: usize,
        slot: SlotId,
        key: LineKey,
        first: u32,
        end: u32,
    ) -> Option<bool> {
        if self.shards[shard].poisoned.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let range = bits_range(self.words(), first, end);
        let state = lock(&self.shards[shard].state);
        let p = state.poisoned.get(&slot).filter(|p| p.key == key)?;
        if !bits_overlap(&p.sectors, &range) {
            return None;
        }
        let all_clean = p
            .sectors
            .iter()
            .zip(&p.clean)
            .zip(&range)
            .all(|((s, c), r)| s & r & !c == 0);
        Some(all_clean)
    }

    pub(super) fn poison(
        &self,
        shard: usize,
        slot: SlotId,
        key: LineKey,
        first_sector: u32,
        end_sector: u32,
        clean: bool,
    ) {
        let shard_ref = &self.shards[shard];
        let words = self.words();
        let range = bits_range(words, first_sector, end_sector);
        let mut state = lock(&shard_ref.state);
        let fresh_entry = || Poisoned {
            key,
            sectors: SmallVec::from_elem(0, words),
            clean: SmallVec::from_elem(0, words),
        };
        let entry = state.poisoned.entry(slot).or_insert_with(|| {
            shard_ref.poisoned.fetch_add(1, Ordering::Relaxed);
            fresh_entry()
        });
        if entry.key != key {
            *entry = fresh_entry();
        }
        for w in 0..words {
            entry.sectors[w] |= range[w];
            if clean {
                entry.clean[w] |= range[w];
            } else {
                entry.clean[w] &= !range[w];
            }
        }
    }

    /// A write of sectors `[first, end)` of `key` into `slot` succeeded:
    /// they are no longer poisoned (nor anything of another line).
    pub(super) fn unpoison(
        &self,
        shard: usize,
        slot: SlotId,
        key: LineKey,
        first_sector: u32,
        end_sector: u32,
    ) {
        let shard_ref = &self.shards[shard];
        let range = bits_range(self.words(), first_sector, end_sector);
        let mut state = lock(&shard_ref.state);
        let Some(entry) = state.poisoned.get_mut(&slot) else {
            return;
        };
        let empty = if entry.key != key {
            true
        } else {
            for (w, r) in range.iter().enumerate() {
                entry.sectors[w] &= !r;
                entry.clean[w] &= !r;
            }
            entry.sectors.iter().all(|&w| w == 0)
        };
        if empty {
            state.poisoned.remove(&slot);
            shard_ref.poisoned.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Before a flush writes back `token`'s line: if a failed cache write
    /// poisoned some of its sectors, the slot holds nothing of the line
    /// there, so they must not reach the backend. The core forgets them if
    /// nothing was decided about the slot since the flush began (and the
    /// flush then counts as failed: the next one writes the rest back);
    /// else the flush just fails and is retried.
    pub(super) fn poison_blocks_write_back(&self, shard: usize, token: &FlushToken, ops: &[Op]) -> bool {
        if self.shards[shard].poisoned.load(Ordering::Relaxed) == 0 {
            return false;
        }
        let mut written = bits_range(self.words(), 0, 0);
        for op in ops {
            if let Op::WriteBack {
                slot,
                line_offset_bytes,
                length_bytes,
                ..
            } = *op
            {
                if slot == token.slot {
                    let first = line_offset_bytes / SECTOR_BYTES as u32;
                    bitmap::set_range(&mut written, first, first + length_bytes / SECTOR_BYTES as u32);
                }
            }
        }
        let mut state = lock(&self.shards[shard].state);
        let Some(p) = state.poisoned.get(&token.slot).filter(|p| p.key == token.key) else {
            return false;
        };
        if !bits_overlap(&p.sectors, &written) {
            return false;
        }
        let sectors: SectorBits = p.sectors.iter().zip(&written).map(|(a, b)| a & b).collect();
        let line_sectors = (self.line_bytes / SECTOR_BYTES) as u32;
        bitmap::for_each_run(&sectors, 0, line_sectors, |start, end, poisoned| {
            if poisoned {
                state.cache.forget_sectors_if_unchanged(
                    token.slot,
                    token.key,
                    token.generation(),
                    start,
                    end,
                );
            }
        });
        true
    }

    /// Counts a backend error and logs it, at most once per
    /// `BACKEND_LOG_INTERVAL` with the count since the last line.
    pub(super) fn backend_error(&self, e: DeviceError) -> EngineError {
        if let Some(count) = self.health.devices.backend_error(self.now_ns()) {
            log::warn!(
                "backend error: {e} ({count} backend error{} since the last such line, {} in all)",
                if count == 1 { "" } else { "s" },
                self.health.devices.backend_errors.load(Ordering::Relaxed)
            );
        }
        e.into()
    }

    /// Flushes the cache device; a failed flush fails the device at once
    /// (`cache_error` with `at_once`): the data written since the last
    /// flush is not known durable, and a device that cannot flush cannot
    /// take new data.
    pub(super) fn flush_cache_device(&self) -> Result<(), EngineError> {
        self.slots.dev.flush().map_err(|e| {
            self.health.flush_failed.store(true, Ordering::SeqCst);
            self.cache_error_at_once("flush", &e);
            EngineError::from(e)
        })
    }

    /// Counts a cache-device error; past the threshold the volume falls
    /// back to pass-through (dirty lines stay and are still served and
    /// written back; nothing new is cached) until a probe succeeds.
    pub(super) fn cache_error(&self, what: &str, e: &DeviceError) {
        self.count_cache_error(what, e, false);
    }

    /// A cache-device error that fails the device without waiting for the
    /// threshold (a failed flush).
    pub(super) fn cache_error_at_once(&self, what: &str, e: &DeviceError) {
        self.count_cache_error(what, e, true);
    }

    /// Whether the cache device still holds what it held: false once it
    /// lost content (checked now with `BlockDevice::check_intact`, and
    /// remembered). Called by every cache error, every cleaner tick, every
    /// probe, and before a read of the device that returned a zeroed sector
    /// is believed (a truncated file re-extended by a later write reads as
    /// zeroes, without an error).
    pub(super) fn cache_intact(&self) -> bool {
        if self.health.content_lost.load(Ordering::SeqCst) {
            return false;
        }
        match self.slots.dev.check_intact() {
            Err(e @ DeviceError::Shrunk { .. }) => {
                self.cache_content_lost(&e);
                false
            }
            // Could not tell (a failed fstat): an ordinary error, not a loss.
            Ok(()) | Err(_) => true,
        }
    }

    /// Whether the cache device is known to have lost content.
    pub(super) fn content_lost(&self) -> bool {
        self.health.content_lost.load(Ordering::Relaxed)
    }

    /// The cache device lost content: failed for good (pass-through, never
    /// probed back), logged with the dirty lines whose data is gone.
    pub(super) fn cache_content_lost(&self, e: &DeviceError) {
        if self.health.content_lost.swap(true, Ordering::SeqCst) {
            return;
        }
        self.health.devices.cache_failed.store(true, Ordering::SeqCst);
        let mut dirty = 0;
        for shard in &self.shards {
            let mut state = lock(&shard.state);
            state.cache.set_cache_device_failed(true);
            dirty += state.cache.dirty_lines();
        }
        log::error!(
            "cache device {}: {e}. It is not used again: clean data is read from the backend; the {dirty} dirty \
             lines it held cannot be read or written back (reads of them fail, FLUSH fails) until the server \
             restarts, which refuses the device",
            self.slots.dev.name()
        );
    }

    /// Sectors of `buf` read from the cache device: believed unless one is
    /// all zero and the device turns out to have lost content. The check
    /// runs at most once per `ZERO_READ_CHECK_INTERVAL` (a cache of zeroed
    /// data reads zeroes on every hit; the cleaner checks every tick too).
    pub(super) fn cache_read_believable(&self, buf: &[u8]) -> bool {
        if !buf
            .chunks(SECTOR_BYTES as usize)
            .any(|s| s.iter().all(|&b| b == 0))
        {
            return !self.content_lost();
        }
        let now = self.now_ns();
        let last = self.health.zero_read_checked_ns.load(Ordering::Relaxed);
        if last != 0 && now.saturating_sub(last) < ZERO_READ_CHECK_INTERVAL.as_nanos() as u64 {
            return !self.content_lost();
        }
        self.health
            .zero_read_checked_ns
            .store(now.max(1), Ordering::Relaxed);
        self.cache_intact()
    }

    fn count_cache_error(&self, what: &str, e: &DeviceError, at_once: bool) {
        self.cache_intact();
        if self.slots.array.as_ref().is_some_and(|a| a.live_members() > 0) {
            // A cache array fails members one by one and runs degraded on
            // the others (the cleaner evacuates); pass-through is for when
            // none is left.
            return;
        }
        let now = self.now_ns();
        let crossed = if at_once {
            self.health.devices.cache_failed_now(now)
        } else {
            self.health.devices.cache_error(now)
        };
        if crossed {
            log::warn!(
                "cache device {}: {} I/O errors (last: {what}: {e}); falling back to pass-through until it answers again",
                self.slots.dev.name(),
                self.health.devices.cache_errors.load(Ordering::Relaxed)
            );
            for shard in &self.shards {
                lock(&shard.state).cache.set_cache_device_failed(true);
            }
        }
    }

    /// Probes a failed cache device: a read and a rewrite of the
    /// superblock's blocks. On success the configured write policy returns.
    pub(super) fn probe_cache_device(&self) {
        if !self.cache_intact() || self.health.flush_failed.load(Ordering::SeqCst) {
            // Lost content is never taken back, nor a device whose flush
            // failed (after a failed fsync, a later one may succeed with the
            // earlier writes dropped).
            return;
        }
        let mut head = vec![0u8; 8192];
        let ok = self.slots.dev.read_at(&mut head, 0).is_ok()
            && self.slots.dev.write_at(&head, 0).is_ok()
            && self.slots.dev.flush().is_ok();
        if ok && !self.content_lost() {
            self.health.devices.cache_recovered(self.now_ns());
            for shard in &self.shards {
                lock(&shard.state).cache.set_cache_device_failed(false);
            }
            log::info!(
                "cache device {} answers again; back to write policy {}",
                self.slots.dev.name(),
                lock(&self.shards[0].state).cache.effective_mode().policy
            );
        }
    }
}

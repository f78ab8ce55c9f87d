//! Replacing a member of a cache array while the cache serves. The new
//! device takes the member's place at once and is rebuilt from the other
//! copies: each of its slots gets its line back (dirty sectors from their
//! mirror, clean ones from the backend), each of its mirror slots the
//! dirty sectors of its line; until then reads go to the other copy, as
//! for a failed member. With another member failed too there is no other
//! copy to rebuild from: the member's dirty lines are written back
//! instead (degraded mode, `cleaner.rs`) and its slots come back empty.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use iocache_core::fasthash::FxHashMap;
use iocache_core::{bitmap, LineKey, SlotId, SECTOR_BYTES};
use iocache_device::BlockDevice;

use super::{lock, Engine, EngineError, Inner};
use crate::raid::{CacheArray, MirrorState};

/// The longest a replacement waits for the member's dirty lines to be
/// written back.
pub const EVACUATION_PATIENCE: Duration = Duration::from_secs(600);

/// What a replacement did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberReplacement {
    /// The member's index in the array.
    pub member: usize,
    /// The member was live and was retired first.
    pub retired: bool,
    /// Line slots put back in service (empty) on the new device.
    pub restored_slots: u64,
    /// Lines copied back into the new device's slots, and mirror slots
    /// whose dirty sectors were (0 when the member was evacuated instead).
    pub rebuilt_lines: u64,
    pub rebuilt_mirrors: u64,
}

impl Engine {
    /// The cache array the engine runs on, if any.
    pub fn cache_array(&self) -> Option<&Arc<CacheArray>> {
        self.inner.slots.array.as_ref()
    }

    /// Puts `device`, named `new_name`, in place of the array member named
    /// `old_name` (failed, or live: it is then retired by this) while
    /// requests are served. When every other member is live, the new
    /// device takes the place at once and is rebuilt from the other copies
    /// (see the module doc), without waiting for write-backs; this returns when the
    /// rebuild is done, and a restart before that resumes it. Otherwise a
    /// live member is retired, this waits until the cleaner has written
    /// back every dirty line that had a copy on the member, then puts the
    /// new device in and its slots back in service, empty. Either wait
    /// ends early, with an error, once `give_up` says so (the server stops)
    /// or after [`EVACUATION_PATIENCE`] (a backend that refuses the
    /// write-backs): the same call later picks up where this one left off.
    pub fn replace_cache_member(
        &self,
        old_name: &str,
        new_name: &str,
        device: Arc<dyn BlockDevice>,
        give_up: &dyn Fn() -> bool,
    ) -> Result<MemberReplacement, EngineError> {
        let inner = &self.inner;
        let Some(array) = inner.slots.array.clone() else {
            return Err(EngineError::NotSupported(
                "replacing a member: the cache is not an array".into(),
            ));
        };
        let member = array
            .member_index(old_name)
            .ok_or_else(|| EngineError::Config(format!("the cache array has no member named {old_name}")))?;
        if array.member_index(new_name).is_some_and(|other| other != member) {
            return Err(EngineError::Config(format!(
                "{new_name} is already a member of the cache array"
            )));
        }
        // Checked before a healthy member is retired for nothing.
        array.check_member_size(new_name, &*device)?;
        let retired = !array.member_failed(member);
        let others_live = (0..array.geometry().members).all(|k| k == member || !array.member_failed(k));
        if others_live {
            array.begin_rebuild(member, new_name, device)?;
            let restored_slots = inner.restore_member_slots(&array, member);
            let (rebuilt_lines, rebuilt_mirrors) = inner.rebuild_member(&array, member, give_up)?;
            return Ok(MemberReplacement {
                member,
                retired,
                restored_slots,
                rebuilt_lines,
                rebuilt_mirrors,
            });
        }
        if retired {
            array.retire_member(member)?;
        }
        // The cleaner evacuates the member (writes back what lost a copy,
        // takes its slots out of service); wait for it.
        let deadline = Instant::now() + EVACUATION_PATIENCE;
        while inner.cleaner.array_failures_handled.load(Ordering::Acquire) != array.failures() {
            if inner.stopping.load(Ordering::Relaxed) {
                return Err(EngineError::Shutdown);
            }
            if give_up() || Instant::now() > deadline {
                return Err(EngineError::DirtyLinesRemain {
                    lines: inner
                        .shards
                        .iter()
                        .map(|s| lock(&s.state).cache.dirty_lines())
                        .sum(),
                });
            }
            inner.wake_cleaner();
            std::thread::sleep(Duration::from_millis(5));
        }
        array.replace_member(member, new_name, device)?;
        let restored_slots = inner.restore_member_slots(&array, member);
        Ok(MemberReplacement {
            member,
            retired,
            restored_slots,
            rebuilt_lines: 0,
            rebuilt_mirrors: 0,
        })
    }

    /// Finishes the rebuild of a replacement that a restart found under
    /// way (the start calls it); nothing when there is none.
    pub(super) fn resume_rebuild(&self) -> Result<(), EngineError> {
        let Some(array) = self.inner.slots.array.clone() else {
            return Ok(());
        };
        let Some(member) = array.rebuilding_member() else {
            return Ok(());
        };
        log::warn!("cache array: resuming the rebuild of member {member}");
        self.inner.rebuild_member(&array, member, &|| false)?;
        Ok(())
    }
}

impl Inner {
    /// Puts the slots of `member` that an evacuation took out of service
    /// back in service, empty; returns how many. The dirty caps follow the
    /// members now live.
    fn restore_member_slots(&self, array: &CacheArray, member: usize) -> u64 {
        // No flush batch in flight while the slots come back.
        let _cleaning = lock(&self.cleaner.cleaning);
        let mut restored = 0;
        for shard in &self.shards {
            let base = shard.base_slot;
            restored += lock(&shard.state)
                .cache
                .restore_slots(|slot| array.member_of(base + u64::from(slot)) == member);
        }
        self.set_dirty_caps(lock(&self.knobs).dirty_cap());
        restored
    }

    /// Rebuilds `member`, a replacement: every line slot marked pending
    /// gets its line's valid sectors back, every mirror slot its line's
    /// dirty sectors, then the array stops marking the member. Returns the
    /// lines and the mirrors copied.
    fn rebuild_member(
        &self,
        array: &CacheArray,
        member: usize,
        give_up: &dyn Fn() -> bool,
    ) -> Result<(u64, u64), EngineError> {
        let started = Instant::now();
        let stop = || {
            if self.stopping.load(Ordering::Relaxed) || give_up() {
                return Err(EngineError::Shutdown);
            }
            Ok(())
        };
        let (mut lines, mut mirrors) = (0, 0);
        for (index, shard) in self.shards.iter().enumerate() {
            let slots = lock(&shard.state).cache.capacity_lines();
            for local in 0..slots as SlotId {
                if array.primary_pending(shard.base_slot + u64::from(local)) {
                    stop()?;
                    lines += u64::from(self.rebuild_slot(array, index, local)?);
                }
            }
        }
        let owners: FxHashMap<u32, u64> = array.mirror_owners(member).into_iter().collect();
        for mirror in array.mirrors_of_member(member) {
            if array.mirror_pending(mirror) {
                stop()?;
                mirrors += u64::from(self.rebuild_mirror(array, mirror, owners.get(&mirror).copied())?);
            }
        }
        // The records made durable first: a line that was written back
        // since its mirror's turn (and so skipped) must not be recorded
        // dirty, naming that mirror, once the mark below is gone.
        self.sync_records()?;
        if array.member_failed(member) {
            return Err(EngineError::Io(format!(
                "the replacement of cache-array member {member} failed while it was rebuilt"
            )));
        }
        {
            // Every shard locked: no mirror is released while the unused
            // ones go back to the free list.
            let _shards: Vec<_> = self.shards.iter().map(|s| lock(&s.state)).collect();
            array.finish_rebuild(member)?;
        }
        array.record_rebuilt(member)?;
        // What the evacuation of a failed member may have retired since.
        self.restore_member_slots(array, member);
        log::warn!(
            "cache array: member {member} rebuilt in {:.1} s: {lines} lines and {mirrors} mirrors copied",
            started.elapsed().as_secs_f64()
        );
        Ok((lines, mirrors))
    }

    /// Runs `copy(first, end, buffer)` for each run of sectors set in
    /// `sectors` (a line's bitmap), with a buffer of the run's length.
    fn copy_runs(
        &self,
        sectors: &[u64],
        mut copy: impl FnMut(u32, u32, &mut [u8]) -> Result<(), EngineError>,
    ) -> Result<(), EngineError> {
        let mut buf = vec![0u8; self.line_bytes as usize];
        let mut result = Ok(());
        bitmap::for_each_run(
            sectors,
            0,
            (self.line_bytes / SECTOR_BYTES) as u32,
            |a, b, set| {
                if set && result.is_ok() {
                    let len = (u64::from(b - a) * SECTOR_BYTES) as usize;
                    result = copy(a, b, &mut buf[..len]);
                }
            },
        );
        result
    }

    /// Runs `copy` on the line `slot` of `shard` holds (if any) once the
    /// requests decided before are done with the slot and the line: under
    /// tickets for both, taken now as a request would. When the copy
    /// succeeds, `rebuilt` runs before the tickets are released.
    fn with_slot_tickets(
        &self,
        shard: usize,
        slot: SlotId,
        copy: impl FnOnce(Option<LineKey>) -> Result<bool, EngineError>,
        rebuilt: impl FnOnce(),
    ) -> Result<bool, EngineError> {
        let mut tickets = Vec::with_capacity(2);
        let key = {
            let mut state = lock(&self.shards[shard].state);
            let key = state.cache.key_in_slot(slot);
            state.take_slot_tickets(shard, slot, key, &mut tickets);
            key
        };
        self.wait_for_tickets(&tickets);
        let copied = copy(key);
        if copied.is_ok() {
            rebuilt();
        }
        self.release_tickets(&tickets);
        copied
    }

    /// Rebuilds `slot`, a pending slot of the replacement: its line's valid
    /// sectors are copied from where a degraded read finds them (clean ones
    /// from the backend, dirty ones from the mirror, or the backend for a
    /// line written through), then the slot is marked rebuilt. Returns
    /// whether there was a line.
    fn rebuild_slot(&self, array: &CacheArray, shard: usize, slot: SlotId) -> Result<bool, EngineError> {
        let global = self.shards[shard].base_slot + u64::from(slot);
        let copy = |key: Option<LineKey>| -> Result<bool, EngineError> {
            let Some(key) = key else { return Ok(false) };
            let valid = {
                let state = lock(&self.shards[shard].state);
                let snapshot = state.cache.slot_snapshot(slot).filter(|s| s.key == key);
                snapshot.map(|s| s.valid.to_vec())
            };
            // Gone since (decided after these tickets): what comes next
            // writes the slot itself.
            let Some(valid) = valid else { return Ok(false) };
            self.copy_runs(&valid, |a, b, out| {
                let at = u64::from(a) * SECTOR_BYTES;
                match array.mirror_state(global) {
                    MirrorState::Mirrored(_) | MirrorState::Through => {
                        self.read_degraded(array, shard, slot, key, at as u32, out)?
                    }
                    // No mirror yet, so no dirty sector but those of a
                    // write decided since these tickets, which has not run
                    // and writes them itself: the rest is the backend's.
                    MirrorState::None => self
                        .backend_of(key.volume)?
                        .read_at(out, (key.line_index << self.line_shift) + at)
                        .map_err(|e| self.backend_error(e))?,
                }
                array.write_rebuilt_primary(global, at, out)?;
                // A write that failed with the old member left them
                // poisoned: what the slot holds now is the line's.
                self.unpoison(shard, slot, key, a, b);
                Ok(())
            })?;
            Ok(true)
        };
        self.with_slot_tickets(shard, slot, copy, || array.rebuilt_primary(global))
    }

    /// Copies the dirty sectors of the line whose mirror is `mirror` (a
    /// pending mirror slot of the replacement; `owner`: its slot when the
    /// rebuild began) from the line's slot, then marks the mirror rebuilt.
    /// Returns whether a line used it.
    fn rebuild_mirror(
        &self,
        array: &CacheArray,
        mirror: u32,
        owner: Option<u64>,
    ) -> Result<bool, EngineError> {
        let owner = owner
            .filter(|&g| array.mirror_state(g) == MirrorState::Mirrored(mirror))
            .or_else(|| array.owner_of_mirror(mirror));
        let Some(global) = owner else {
            // No line uses it: a line that takes it writes all its dirty
            // sectors to it.
            array.rebuilt_mirror(mirror);
            return Ok(false);
        };
        let shard = self.shards.partition_point(|s| s.base_slot <= global) - 1;
        let slot = (global - self.shards[shard].base_slot) as SlotId;
        let copy = |key: Option<LineKey>| -> Result<bool, EngineError> {
            let dirty = {
                let state = lock(&self.shards[shard].state);
                let snapshot = state.cache.slot_snapshot(slot).filter(|s| Some(s.key) == key);
                snapshot.map(|s| s.dirty.to_vec())
            };
            // Released since (the line was written back), or another line's
            // now: its writes are all there.
            let (Some(dirty), MirrorState::Mirrored(m)) = (dirty, array.mirror_state(global)) else {
                return Ok(false);
            };
            if m != mirror {
                return Ok(false);
            }
            self.copy_runs(&dirty, |a, _, out| {
                let at = u64::from(a) * SECTOR_BYTES;
                self.slots
                    .dev
                    .read_at(out, self.cache_offset(shard, slot, at as u32))?;
                Ok(array.write_mirror(mirror, at, out)?)
            })?;
            Ok(true)
        };
        self.with_slot_tickets(shard, slot, copy, || array.rebuilt_mirror(mirror))
    }
}

//! A cache resized while it runs: slots taken out of service (the lines
//! the replacement policy would evict first leave, dirty ones once the
//! driver has written them back) and put back in service, empty.

use super::*;

/// The key a shrink "misses" to ask the replacement policy for victims: no
/// volume has this id, so no policy holds history of it.
const SHRINK_KEY: LineKey = LineKey {
    volume: VolumeId::MAX,
    line_index: u64::MAX,
};

/// The most lines one call of [`Cache::resize`] takes out of service
/// (free slots do not count), so that a driver holding a lock around it
/// holds it briefly.
pub const RESIZE_STEP_LINES: u64 = 1024;

/// Where a resize stands after [`Cache::resize`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ResizeProgress {
    /// Slots in service now.
    pub in_service: u64,
    /// Slots in service asked for.
    pub target: u64,
    /// Dirty lines chosen to leave: they go at the next call once they are
    /// clean (a driver writes them back with [`FlushOrder::Retiring`]).
    pub dirty_leaving: u64,
}

impl ResizeProgress {
    /// The cache has the size asked for.
    pub fn done(&self) -> bool {
        self.in_service == self.target
    }
}

impl Cache {
    /// Slots in service: the capacity less the slots out of service.
    pub fn lines_in_service(&self) -> u64 {
        self.capacity_lines() - self.retired_slots()
    }

    /// Puts `target` slots in service (1 to the capacity), keeping every
    /// line that fits. Growing puts slots back in service, empty. Shrinking
    /// takes free slots out first, then the lines the replacement policy
    /// would evict next: a clean one leaves now (one [`Op::Invalidate`]
    /// into `ops`, cleared first), a dirty one is written back first: with
    /// inline dirty eviction, by the `WriteBack` ops before its
    /// invalidation; without, it stays until a driver has flushed it
    /// ([`FlushOrder::Retiring`]) and calls again. At most
    /// [`RESIZE_STEP_LINES`] lines leave per call, besides free slots:
    /// call until [`ResizeProgress::done`]. O(slots leaving + dirty lines
    /// waiting). Slots a driver retired ([`Cache::retire_slots`]) may come
    /// back with a growth: a driver that retires slots does not resize.
    pub fn resize(
        &mut self,
        target: u64,
        now_ns: u64,
        ops: &mut OpList,
    ) -> Result<ResizeProgress, CoreError> {
        let capacity = self.capacity_lines();
        if target == 0 || target > capacity {
            return Err(CoreError::BadSetting(format!(
                "a cache of {target} lines: it holds 1 to {capacity} lines"
            )));
        }
        ops.clear();
        self.config.lines_in_service = (target < capacity).then_some(target);
        self.policy.set_lines_in_service(target as usize);
        let in_service = self.lines_in_service();
        if target >= in_service {
            self.retiring.clear();
            self.put_in_service(target - in_service);
        } else {
            self.take_out_of_service(in_service - target, now_ns, ops);
        }
        ops.seal();
        let progress = ResizeProgress {
            in_service: self.lines_in_service(),
            target,
            dirty_leaving: self.retiring.len() as u64,
        };
        if progress.done() {
            // Again, now that the lines that left are gone from its lists.
            self.policy.set_lines_in_service(target as usize);
        }
        Ok(progress)
    }

    /// [`Cache::resize`] to the end for a driver that only counts (the
    /// simulator): the write-backs of dirty lines leaving are counted in
    /// the stats, their ops dropped. Refused when dirty victims wait for a
    /// driver's flush (no inline dirty eviction): such a driver calls
    /// [`Cache::resize`] and executes the ops.
    pub(crate) fn resize_counted(&mut self, target: u64, now_ns: u64) -> Result<(), CoreError> {
        let mut ops = OpList::new();
        loop {
            let progress = self.resize(target, now_ns, &mut ops)?;
            if progress.done() {
                return Ok(());
            }
            if progress.dirty_leaving > 0 {
                return Err(CoreError::BadSetting(format!(
                    "cache_size: {} dirty lines must be written back first (Cache::resize)",
                    progress.dirty_leaving
                )));
            }
        }
    }

    /// The lowest-numbered `count` slots out of service come back, free.
    fn put_in_service(&mut self, mut count: u64) {
        self.restore_slots(|_| {
            let more = count > 0;
            count = count.saturating_sub(1);
            more
        });
    }

    /// Marks `slot` out of service (it holds no line).
    pub(super) fn retire_one(&mut self, slot: SlotId) {
        if self.retired.is_empty() {
            self.retired = vec![false; self.records.len()];
        }
        debug_assert!(!self.retired[slot as usize]);
        self.retired[slot as usize] = true;
        self.retired_count += 1;
    }

    /// Drops the clean resident line of `slot` (already forgotten by the
    /// policy), or writes back and drops a dirty one when the cache evicts
    /// dirty lines inline.
    fn drop_leaving(&mut self, slot: SlotId, ops: &mut OpList) {
        let key = self.records[slot as usize].line.key();
        self.evict(slot, ops);
        self.emit(ops, Op::Invalidate { slot, key });
    }

    /// Under ordered write-back, the newest flush epoch among the dirty
    /// lines chosen to leave ([`ResizeProgress::dirty_leaving`]): a driver
    /// writes back the epochs up to it, which takes them along, and no
    /// newer one. `None` without ordered write-back or such lines.
    pub fn retiring_epoch_max(&self) -> Option<u64> {
        if self.epochs.is_empty() {
            return None;
        }
        self.retiring
            .iter()
            .filter(|&(&slot, &generation)| {
                let meta = &self.records[slot as usize].meta;
                meta.resident && meta.generation == generation && meta.dirty_listed
            })
            .map(|(&slot, _)| self.epochs[slot as usize])
            .max()
    }

    fn take_out_of_service(&mut self, mut need: u64, now_ns: u64, ops: &mut OpList) {
        // Free slots first, all that are needed.
        while need > 0 {
            let Some(slot) = self.free.pop() else { break };
            self.retire_one(slot);
            need -= 1;
        }
        let mut need = need.min(RESIZE_STEP_LINES);
        // Lines chosen before: a clean one leaves now; a dirty one still
        // waits; one that changed since (rewritten, evicted) is chosen again.
        let mut chosen: Vec<(SlotId, u64)> = self.retiring.drain().collect();
        chosen.sort_unstable();
        let mut waiting = FxHashMap::default();
        for (slot, generation) in chosen {
            let meta = &self.records[slot as usize].meta;
            if need == 0 || !meta.resident || meta.generation != generation {
                continue;
            }
            need -= 1;
            if meta.dirty_listed {
                waiting.insert(slot, generation);
            } else {
                self.policy.on_remove(slot);
                self.drop_leaving(slot, ops);
                self.retire_one(slot);
            }
        }
        // Then the policy's next victims, as if a line missed.
        let info = AccessInfo::read_at(now_ns);
        let kept_info = AccessInfo { dirty: true, ..info };
        let mut policy = self.policy.take_out();
        let mut victims = std::mem::take(&mut self.victims);
        let mut idle_rounds = 0;
        while need > 0 && idle_rounds < 4 {
            victims.clear();
            policy.on_miss(SHRINK_KEY, true, &info, &mut victims);
            if victims.is_empty() {
                break;
            }
            idle_rounds += 1;
            for &victim in &victims {
                let meta = &self.records[victim as usize].meta;
                let key = self.records[victim as usize].line.key();
                if waiting.contains_key(&victim) {
                    // Named again before it was written back: stays.
                    policy.on_victim_kept(victim, key, &kept_info);
                    continue;
                }
                if need == 0 {
                    // A block-level policy's batch beyond the need: these
                    // lines were forgotten by it, so they leave, and their
                    // slots stay in service, free.
                    if meta.dirty_listed && !self.config.inline_dirty_eviction {
                        policy.on_victim_kept(victim, key, &kept_info);
                    } else {
                        self.drop_leaving(victim, ops);
                        self.free.push(victim);
                    }
                    continue;
                }
                idle_rounds = 0;
                need -= 1;
                if meta.dirty_listed && !self.config.inline_dirty_eviction {
                    policy.on_victim_kept(victim, key, &kept_info);
                    waiting.insert(victim, meta.generation);
                } else {
                    self.drop_leaving(victim, ops);
                    self.retire_one(victim);
                }
            }
        }
        self.victims = victims;
        self.policy.put_back(policy);
        self.retiring = waiting;
    }
}

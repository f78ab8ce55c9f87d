//! The cleaner: the one component that writes dirty lines back. It owns
//! the background cleaner thread (`run_cleaner`: the core's cleaning
//! policy when due, demand cleaning when requests found only dirty
//! victims, back-off after failed write-backs, probing a failed cache
//! device), flush batches (`flush_batch`, `flush_all`), the tracking of
//! write-backs of evicted lines run on request threads (a FLUSH with
//! volatile metadata waits for them), the evacuation of a cache array's
//! failed members, and the freeing of mirrors once their line is clean
//! (with persistent metadata, once a barrier has made a record that no
//! longer names the line dirty durable: the barrier reports durability,
//! the cleaner frees). Its state is [`Cleaner`], one field of `Inner`, so
//! that engine.rs does not grow with every cleaning feature.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use iocache_core::{FlushOrder, Op, SlotId, SECTOR_BYTES};
use iocache_device::BlockDevice;

use super::tickets::{DroppedSlots, Ticket};
use super::writeback::{plan_runs, Piece, WRITE_BACK_RUN_BYTES};
use super::{lock, slot_is_dirty, EngineError, Inner, ShardState, TicketKey};
use crate::raid::{CacheArray, MirrorState};
use iocache_core::{FlushToken, LineKey};

/// Longest sleep of the background cleaner between checks.
const CLEANER_POLL: Duration = Duration::from_millis(50);

/// Lines written back per batch when flushing everything, over all shards
/// (each shard gives its share, at least [`FLUSH_ALL_SHARD_MIN`]). Each
/// shard picks its lines in address order from where it left off; the
/// larger the batch, the fewer runs are cut where one shard's share ends
/// before another's.
const FLUSH_ALL_BATCH: usize = 8192;
const FLUSH_ALL_SHARD_MIN: usize = 256;

/// Lines cleaned when requests found only dirty victims in a shard. A
/// batch holds the tickets of its lines until each is written back, so
/// requests for them wait up to a batch of backend writes: with 32 lines
/// and a 1 ms backend, the 70/30 mix of `scripts/bench-engine.py` had a
/// p99.99 of 16-34 ms; with 8, 4-5 ms at the same IOPS. The cleaning rate
/// is the same (one write-back after the other either way).
const DEMAND_CLEAN_BATCH: usize = 8;

#[derive(Default)]
struct WritebackTracker {
    next: u64,
    in_flight: std::collections::BTreeSet<u64>,
}

/// What one flush batch did.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct FlushBatch {
    pub(super) taken: usize,
    pub(super) failed: usize,
}

/// What the cleaner owns.
pub(super) struct Cleaner {
    /// Wakes the cleaner early (a request found only dirty victims).
    wake: (Mutex<bool>, Condvar),
    /// Ordered write-back: a write waits for the backend to take an older
    /// epoch, or for room (`ordering.rs`).
    pub(super) ordered_demand: AtomicBool,
    /// Write-backs of evicted lines in progress on request threads (volatile
    /// metadata only: a FLUSH waits for those that began before it).
    writebacks: Mutex<WritebackTracker>,
    writeback_done: Condvar,
    /// Held while a batch of lines is being cleaned (cleaner, FLUSH with
    /// volatile metadata, flush_all), so that a FLUSH sees no line in flight.
    pub(super) cleaning: Mutex<()>,
    /// Member failures the cleaner has finished evacuating.
    pub(super) array_failures_handled: AtomicU64,
    /// Global slots whose mirror may be freed after the next barrier (a
    /// durable record may still name it).
    pub(super) mirror_releases: Mutex<Vec<u64>>,
    /// Lines of failed members dropped (evacuation) or recovered from their
    /// mirrors (start-up).
    pub(super) evacuated_lines: AtomicU64,
    /// Dirty lines of a failed member with no mirror to recover them from.
    pub(super) lost_lines: AtomicU64,
    /// Clock reading of the last mirror sweep.
    last_mirror_sweep_ns: AtomicU64,
}

impl Cleaner {
    pub(super) fn new() -> Cleaner {
        Cleaner {
            ordered_demand: AtomicBool::new(false),
            wake: (Mutex::new(false), Condvar::new()),
            writebacks: Mutex::new(WritebackTracker::default()),
            writeback_done: Condvar::new(),
            cleaning: Mutex::new(()),
            array_failures_handled: AtomicU64::new(0),
            mirror_releases: Mutex::new(Vec::new()),
            evacuated_lines: AtomicU64::new(0),
            lost_lines: AtomicU64::new(0),
            last_mirror_sweep_ns: AtomicU64::new(0),
        }
    }

    /// The id the next write-back of an evicted line will get: a FLUSH
    /// waits for those below it.
    pub(super) fn writebacks_horizon(&self) -> u64 {
        lock(&self.writebacks).next
    }

    /// Waits until every write-back of an evicted line with an id below
    /// `horizon` has ended.
    pub(super) fn wait_for_writebacks_before(&self, horizon: u64) {
        let mut tracker = lock(&self.writebacks);
        while tracker.in_flight.first().is_some_and(|&id| id < horizon) {
            tracker = self
                .writeback_done
                .wait(tracker)
                .unwrap_or_else(|p| p.into_inner());
        }
    }
}

impl Inner {
    /// The background cleaner: runs each shard's cleaning policy when due,
    /// cleans on demand when requests found only dirty victims, backs off
    /// after failed write-backs (the lines stay dirty and are retried), and
    /// probes a failed cache device.
    pub(super) fn run_cleaner(&self) {
        while !self.stopping.load(Ordering::Relaxed) {
            let now = self.now_ns();
            let mut next_wake = now + CLEANER_POLL.as_nanos() as u64;
            if self.slots.array.is_none() {
                // A file truncated under the server is noticed within a tick.
                self.cache_intact();
            }
            if self.health.devices.probe_due(now) {
                self.probe_cache_device();
            }
            if let Some(array) = &self.slots.array {
                if !self.evacuate_failed_members(array) {
                    next_wake = next_wake.min(now + 10_000_000);
                }
                self.sweep_mirrors(array);
            }
            if self.ordered() && self.health.devices.may_clean(now) {
                self.run_ordered_cleaner(now, &mut next_wake);
            } else if self.health.devices.may_clean(now) {
                let mut failed = 0;
                let mut taken = 0;
                for shard in 0..self.shards.len() {
                    let demand = self.shards[shard].wants_cleaning.swap(false, Ordering::Relaxed);
                    let due = lock(&self.shards[shard].state).cache.next_cleaning_ns();
                    let batch = match due {
                        Some(at) if at <= now => {
                            let _cleaning = lock(&self.cleaner.cleaning);
                            Some(self.flush_batch(&[shard], FlushOrder::Oldest, 0, true))
                        }
                        Some(at) => {
                            next_wake = next_wake.min(at);
                            None
                        }
                        None => None,
                    };
                    let batch = match (batch, demand) {
                        (None, true) => {
                            let _cleaning = lock(&self.cleaner.cleaning);
                            Some(self.flush_batch(&[shard], FlushOrder::Oldest, DEMAND_CLEAN_BATCH, false))
                        }
                        (batch, _) => batch,
                    };
                    if let Some(b) = batch {
                        failed += b.failed;
                        taken += b.taken;
                    }
                }
                if taken > 0 {
                    self.health.devices.cleaned(self.now_ns(), failed);
                }
            }
            if let Some(due) = self.commit_if_due(self.now_ns()) {
                next_wake = next_wake.min(due);
            }
            let sleep = next_wake.saturating_sub(self.now_ns()).max(100_000);
            let (flag, cv) = &self.cleaner.wake;
            let mut woken = lock(flag);
            if !*woken {
                woken = cv
                    .wait_timeout(woken, Duration::from_nanos(sleep).min(CLEANER_POLL))
                    .map(|(g, _)| g)
                    .unwrap_or_else(|p| p.into_inner().0);
            }
            *woken = false;
        }
    }

    /// The cleaner's turn under ordered write-back: when a shard's
    /// cleaning policy is due, a request waits, or a request found only
    /// dirty victims, one batch of the oldest epoch over every shard.
    fn run_ordered_cleaner(&self, now: u64, next_wake: &mut u64) {
        let mut wanted = self.cleaner.ordered_demand.swap(false, Ordering::Relaxed);
        for shard in &self.shards {
            wanted |= shard.wants_cleaning.swap(false, Ordering::Relaxed);
            match lock(&shard.state).cache.next_cleaning_ns() {
                Some(at) if at <= now => wanted = true,
                Some(at) => *next_wake = (*next_wake).min(at),
                None => {}
            }
        }
        if !wanted {
            return;
        }
        let _cleaning = lock(&self.cleaner.cleaning);
        for shard in &self.shards {
            lock(&shard.state).cache.note_cleaner_ran(now);
        }
        let batch = self.ordered_clean_batch(self.flush_all_share());
        let (taken, failed) = batch.map_or((1, 1), |b| (b.taken, b.failed));
        if taken > 0 {
            self.health.devices.cleaned(self.now_ns(), failed);
            if failed < taken {
                // More may be waiting: look again at once.
                *next_wake = now;
            }
        }
    }

    pub(super) fn wake_cleaner(&self) {
        let (flag, cv) = &self.cleaner.wake;
        *lock(flag) = true;
        cv.notify_one();
    }

    /// One batch of flushing over `shards` (ascending): pick lines in each,
    /// wait for their keys, write them back, then tell the core. The
    /// shards are locked together, in order, while the lines are picked,
    /// their write-backs planned into runs (writeback.rs) and the tickets
    /// taken (the locking protocol of lib.rs), so that a run can join lines
    /// of several shards and hold the lines of the gaps it fills.
    pub(super) fn flush_batch(
        &self,
        shards: &[usize],
        order: FlushOrder,
        batch: usize,
        cleaner: bool,
    ) -> FlushBatch {
        debug_assert!(shards.windows(2).all(|w| w[0] < w[1]));
        // Per line: its shard and flush token; per run: the tickets of the
        // lines in its gaps (a range of `tickets` after the tokens' own).
        let mut tokens: Vec<(usize, FlushToken)> = Vec::new();
        let mut tickets: Vec<Ticket> = Vec::new();
        let mut pieces = Vec::new();
        let (runs, gap_tickets) = {
            let mut states: Vec<_> = shards.iter().map(|&s| lock(&self.shards[s].state)).collect();
            for (&shard, state) in shards.iter().zip(states.iter_mut()) {
                let ShardState {
                    cache,
                    ops,
                    tokens: picked,
                    ..
                } = &mut **state;
                if cleaner {
                    cache.run_cleaner(self.now_ns(), ops, picked);
                } else {
                    cache.begin_flush(order, batch, ops, picked);
                }
                // The core emits each line's write-backs together, in the
                // order of the tokens: one pass pairs them.
                let mut at = 0;
                for op in ops.ops() {
                    if let Some(mut piece) = Piece::of(op, 0, shard) {
                        while picked[at].slot != piece.slot {
                            at += 1;
                        }
                        piece.token = tokens.len() + at;
                        pieces.push(piece);
                    }
                }
                let picked = std::mem::take(picked);
                for token in &picked {
                    for key in [TicketKey::Line(token.key), TicketKey::Slot(token.slot)] {
                        let (ticket, _) = state.take_ticket(key);
                        tickets.push((shard, key, ticket));
                    }
                }
                tokens.extend(picked.iter().map(|&t| (shard, t)));
                state.tokens = picked;
            }
            if tokens.is_empty() {
                return FlushBatch::default();
            }
            // A gap may be filled when the lines strictly inside it are of
            // locked shards: their tickets are taken with the others.
            let line_shift = self.line_shift;
            let runs = plan_runs(
                &mut pieces,
                WRITE_BACK_RUN_BYTES,
                self.write_back_gap_bytes,
                &mut |before, after| {
                    let inside =
                        ((before.end_bytes() - 1) >> line_shift) + 1..after.offset_bytes >> line_shift;
                    inside.into_iter().all(|line_index| {
                        let key = LineKey {
                            volume: after.volume,
                            line_index,
                        };
                        shards.binary_search(&self.shard_of(key)).is_ok()
                    })
                },
            );
            let mut gap_tickets = Vec::with_capacity(runs.len());
            for run in &runs {
                let from = tickets.len();
                for w in pieces[run.clone()].windows(2) {
                    let inside = ((w[0].end_bytes() - 1) >> line_shift) + 1..w[1].offset_bytes >> line_shift;
                    for line_index in inside {
                        let key = LineKey {
                            volume: w[1].volume,
                            line_index,
                        };
                        let shard = self.shard_of(key);
                        let state = &mut states[shards.binary_search(&shard).expect("a locked shard")];
                        let (ticket, _) = state.take_ticket(TicketKey::Line(key));
                        tickets.push((shard, TicketKey::Line(key), ticket));
                    }
                }
                gap_tickets.push(from..tickets.len());
            }
            (runs, gap_tickets)
        };
        self.wait_for_tickets(&tickets);
        // Lines whose poisoned sectors must not reach the backend.
        let mut token_ops: Vec<Vec<Op>> = vec![Vec::new(); tokens.len()];
        if shards
            .iter()
            .any(|&s| self.shards[s].poisoned.load(Ordering::Relaxed) > 0)
        {
            for piece in &pieces {
                token_ops[piece.token].push(piece.op());
            }
        }
        let blocked: Vec<bool> = tokens
            .iter()
            .zip(&token_ops)
            .map(|(&(shard, token), ops)| self.poison_blocks_write_back(shard, &token, ops))
            .collect();
        // Each line is told to the core and its tickets are released as
        // soon as its own pieces are written, so a request for a line early
        // in the batch does not wait for the whole batch (a batch of 32
        // lines on a backend taking 1 ms per write held every one of its
        // lines for 32 ms when they were written one after the other).
        let mut pending: Vec<AtomicUsize> = (0..tokens.len()).map(|_| AtomicUsize::new(0)).collect();
        for piece in &pieces {
            *pending[piece.token].get_mut() += 1;
        }
        let unwritten: Vec<AtomicBool> = blocked.iter().map(|&b| AtomicBool::new(b)).collect();
        let failed = AtomicUsize::new(0);
        let finish = |i: usize| {
            let (shard, token) = &tokens[i];
            let written = !unwritten[i].load(Ordering::Acquire);
            {
                let mut state = lock(&self.shards[*shard].state);
                state.cache.complete_flush(token, written);
                if self.slots.array.is_some() {
                    self.mirror_unneeded(&state, *shard, token.slot);
                }
            }
            failed.fetch_add(usize::from(!written), Ordering::Relaxed);
            // This token's line and slot tickets, taken in that order above.
            self.release_tickets(&tickets[2 * i..2 * i + 2]);
        };
        for (i, count) in pending.iter().enumerate() {
            if count.load(Ordering::Relaxed) == 0 {
                finish(i);
            }
        }
        self.write_back_runs(&pieces, &runs, &|piece| blocked[piece.token], &|run, written| {
            let index = runs.partition_point(|r| r.start < run.start);
            self.release_tickets(&tickets[gap_tickets[index].clone()]);
            for (piece, &ok) in pieces[run].iter().zip(written) {
                if !ok {
                    unwritten[piece.token].store(true, Ordering::Release);
                }
                if pending[piece.token].fetch_sub(1, Ordering::AcqRel) == 1 {
                    finish(piece.token);
                }
            }
        });
        let failed = failed.into_inner();
        if failed > 0 {
            self.health.io_errors.fetch_add(1, Ordering::Relaxed);
        }
        FlushBatch {
            taken: tokens.len(),
            failed,
        }
    }

    /// Each shard's share of a batch flushing everything.
    pub(super) fn flush_all_share(&self) -> usize {
        (FLUSH_ALL_BATCH / self.shards.len()).max(FLUSH_ALL_SHARD_MIN)
    }

    /// Every shard, for a batch over all of them.
    pub(super) fn all_shards(&self) -> Vec<usize> {
        (0..self.shards.len()).collect()
    }

    /// [`Inner::flush_all`] (without ordered write-back) in batches, each
    /// under the cleaning lock, for as long as `go_on` holds. Returns
    /// whether every dirty line was written back and the backends flushed,
    /// or `go_on` stopped holding.
    fn flush_while(&self, go_on: impl Fn() -> bool) -> bool {
        let shards = self.all_shards();
        let mut failed_since_success = 0u64;
        for _round in 0..1_000_000 {
            if !go_on() {
                return true;
            }
            let batch = {
                let _cleaning = lock(&self.cleaner.cleaning);
                self.flush_batch(&shards, FlushOrder::Address, self.flush_all_share(), false)
            };
            if batch.taken == 0 {
                break;
            }
            failed_since_success = match batch.failed == batch.taken {
                true => failed_since_success + batch.failed as u64,
                false => batch.failed as u64,
            };
            let dirty = self.dirty_lines_all();
            if dirty == 0 || failed_since_success >= dirty {
                break;
            }
        }
        self.dirty_lines_all() == 0 && self.flush_backends().is_ok()
    }

    pub(super) fn flush_all(&self) -> Result<(), EngineError> {
        let _cleaning = lock(&self.cleaner.cleaning);
        if let Some(epochs) = &self.epochs {
            // Writes from now on may stay dirty, as they would here.
            self.drain_epochs_so_far(epochs)?;
            return self.flush_backends();
        }
        let shards = self.all_shards();
        let dirty_lines = || self.dirty_lines_all();
        // Bounded: the address cursors move past a line whose write-back
        // failed, so flushing is given up once every line still dirty has
        // failed since the last success (a backend that is down must not
        // keep this loop, and so a shutdown, spinning), and in any case
        // after a million rounds.
        let mut failed_since_success = 0u64;
        for _round in 0..1_000_000 {
            let batch = self.flush_batch(&shards, FlushOrder::Address, self.flush_all_share(), false);
            if batch.taken == 0 {
                break;
            }
            if batch.failed == batch.taken {
                failed_since_success += batch.failed as u64;
            } else {
                failed_since_success = batch.failed as u64;
            }
            let dirty = dirty_lines();
            if dirty == 0 || failed_since_success >= dirty {
                break;
            }
        }
        let remaining = dirty_lines();
        if remaining > 0 {
            return Err(EngineError::DirtyLinesRemain { lines: remaining });
        }
        self.flush_backends()?;
        Ok(())
    }

    /// Dirty data read from the cache device for a write-back must be what
    /// was written there (its sectors' checksum terms as the shadow knows
    /// them): a device that lost acknowledged writes would otherwise hand
    /// the backend another line's data. Read twice before concluding; a
    /// mismatch then is lost content (the device is failed for good) and
    /// nothing is written back.
    pub(super) fn check_written_back_data(
        &self,
        shard: usize,
        slot: SlotId,
        line_offset: u32,
        data: &mut [u8],
    ) -> Result<(), EngineError> {
        let first = line_offset / SECTOR_BYTES as u32;
        let mut terms = vec![0u64; data.len() / SECTOR_BYTES as usize];
        let unlike = |data: &[u8], terms: &mut [u64]| -> Option<u32> {
            iocache_format::sector_checksums_into(first, data, terms);
            let state = lock(&self.shards[shard].state);
            terms.iter().zip(first..).find_map(|(&term, s)| {
                state
                    .shadow
                    .dirty_term(slot, s)
                    .is_some_and(|known| known != term)
                    .then_some(s)
            })
        };
        let Some(_) = unlike(data, &mut terms) else {
            return Ok(());
        };
        self.read_slot_bytes(shard, slot, line_offset, data)?;
        let Some(sector) = unlike(data, &mut terms) else {
            return Ok(());
        };
        let e = iocache_device::DeviceError::Io {
            device: self.slots.dev.name().to_string(),
            kind: iocache_device::IoKind::Read,
            offset: self.cache_offset(shard, slot, sector * SECTOR_BYTES as u32),
            len: SECTOR_BYTES,
            source: std::io::Error::other(format!(
                "sector {sector} of slot {slot} does not hold the dirty data written there (the device lost \
                 acknowledged writes)"
            )),
        };
        self.cache_content_lost(&e);
        Err(EngineError::Io(format!("write-back of slot {slot}: {e}")))
    }

    /// A `WriteBack` op on a request thread (an evicted dirty line),
    /// tracked with volatile metadata so that a FLUSH waits for it.
    pub(super) fn write_back_evicted(&self, shard: usize, op: &Op) -> Result<(), EngineError> {
        let piece = Piece::of(op, 0, shard).expect("only WriteBack ops are written back");
        // A volatile barrier waits for the write-backs under way; records
        // need not (rule 3 of persist.rs: they flush the backend first).
        let tracked = (!self.metadata.records_slots()).then(|| self.writeback_started());
        let result = self.write_back(&piece);
        if let Some(id) = tracked {
            self.writeback_ended(id);
        }
        result
    }

    pub(super) fn writeback_started(&self) -> u64 {
        let mut tracker = lock(&self.cleaner.writebacks);
        let id = tracker.next;
        tracker.next += 1;
        tracker.in_flight.insert(id);
        id
    }

    pub(super) fn writeback_ended(&self, id: u64) {
        lock(&self.cleaner.writebacks).in_flight.remove(&id);
        self.cleaner.writeback_done.notify_all();
    }

    /// Degraded mode, run by the cleaner after a cache-array member failed:
    /// lowers the dirty-line cap to what the live members can mirror,
    /// writes back every dirty line (those that lost a copy among them;
    /// reads fall back to the surviving copy), and takes the failed
    /// members' slots out of service. Returns whether it finished.
    fn evacuate_failed_members(&self, array: &CacheArray) -> bool {
        let failures = array.failures();
        if self.cleaner.array_failures_handled.load(Ordering::Acquire) == failures {
            return true;
        }
        let any_failed = || (0..array.geometry().members).any(|k| array.member_failed(k));
        if !any_failed() {
            // Replaced (and being rebuilt) before it was evacuated.
            self.cleaner
                .array_failures_handled
                .store(failures, Ordering::Release);
            return true;
        }
        let cap = array.dirty_cap();
        let user_cap = lock(&self.knobs).dirty_cap();
        self.set_dirty_caps(user_cap);
        let retire = |this: &Self| -> u64 {
            let mut dirty_left = 0;
            let mut dropped = DroppedSlots::default();
            for (i, shard) in this.shards.iter().enumerate() {
                let mut guard = lock(&shard.state);
                let state = &mut *guard;
                let base = shard.base_slot;
                let mut ops = std::mem::take(&mut state.ops);
                // A failed member's slots (not those of a replacement being
                // rebuilt, which reads also avoid for now).
                dirty_left += state.cache.retire_slots(
                    |slot| array.member_failed(array.member_of(base + u64::from(slot))),
                    &mut ops,
                );
                for op in ops.ops() {
                    if let Op::Invalidate { slot, key } = *op {
                        dropped.add(state, i, slot, key);
                    }
                }
                state.ops = ops;
            }
            this.empty_dropped_slots(dropped, |state, i, slot| {
                this.mirror_unneeded(state, i, slot);
                this.cleaner.evacuated_lines.fetch_add(1, Ordering::Relaxed);
            });
            dirty_left
        };
        retire(self);
        if !self.flush_while(any_failed) {
            return false;
        }
        if !any_failed() {
            self.cleaner
                .array_failures_handled
                .store(failures, Ordering::Release);
            return true;
        }
        if retire(self) > 0 {
            return false;
        }
        // Make the dropped lines' records say so before anything reuses
        // their mirrors.
        if self.sync_records().is_err() {
            return false;
        }
        self.cleaner
            .array_failures_handled
            .store(failures, Ordering::Release);
        log::warn!(
            "cache array degraded: {} of {} members live, dirty lines capped at {cap}; lost lines written back",
            array.live_members(),
            array.geometry().members
        );
        true
    }

    /// Frees mirrors whose line is no longer dirty but were missed (a
    /// forgotten line, a failed write); with persistent metadata, runs a
    /// barrier when releases wait for one.
    fn sweep_mirrors(&self, array: &CacheArray) {
        let now = self.now_ns();
        let last = self.cleaner.last_mirror_sweep_ns.load(Ordering::Relaxed);
        if now.saturating_sub(last) < 1_000_000_000 {
            return;
        }
        self.cleaner.last_mirror_sweep_ns.store(now, Ordering::Relaxed);
        for (i, shard) in self.shards.iter().enumerate() {
            let state = lock(&shard.state);
            for slot in 0..state.cache.capacity_lines() as SlotId {
                if matches!(
                    array.mirror_state(shard.base_slot + u64::from(slot)),
                    MirrorState::Mirrored(_)
                ) {
                    self.mirror_unneeded(&state, i, slot);
                }
            }
        }
        let waiting = {
            let mut releases = lock(&self.cleaner.mirror_releases);
            releases.sort_unstable();
            releases.dedup();
            releases.len()
        };
        if waiting > 0 {
            let _ = self.sync_records();
        }
    }

    /// A line of `slot` stopped being dirty (or left the slot): its mirror
    /// can go, now with volatile metadata, else once a barrier made a
    /// record that no longer names it durable. Call under the shard lock.
    pub(super) fn mirror_unneeded(&self, state: &ShardState, shard: usize, slot: SlotId) {
        let Some(array) = &self.slots.array else { return };
        let global = self.shards[shard].base_slot + u64::from(slot);
        if array.mirror_state(global) == MirrorState::None || slot_is_dirty(state, slot) {
            return;
        }
        if !self.metadata.records_slots() {
            array.release_mirror(global);
        } else {
            lock(&self.cleaner.mirror_releases).push(global);
        }
    }

    /// The mirrors waiting for a barrier, handed to one about to take its
    /// records (those lines were clean before the records are taken).
    pub(super) fn take_mirror_releases(&self) -> Vec<u64> {
        std::mem::take(&mut *lock(&self.cleaner.mirror_releases))
    }

    /// A barrier's report on the records it took after
    /// `take_mirror_releases`: durable, so the mirrors of lines still clean
    /// go; or not, so they wait for the next barrier.
    pub(super) fn mirror_records_durable(&self, releases: Vec<u64>, durable: bool) {
        if let Some(array) = &self.slots.array {
            if durable {
                for global in releases {
                    let shard = self.shards.partition_point(|s| s.base_slot <= global) - 1;
                    let state = lock(&self.shards[shard].state);
                    let local = (global - self.shards[shard].base_slot) as SlotId;
                    // Dirty again since (it kept its mirror): keep it.
                    if !slot_is_dirty(&state, local) {
                        array.release_mirror(global);
                    }
                }
            } else {
                lock(&self.cleaner.mirror_releases).extend(releases);
            }
        }
    }
}

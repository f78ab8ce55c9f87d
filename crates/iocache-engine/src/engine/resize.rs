//! A cache resized while it serves (`cache_size` set at run time or at a
//! start): each shard takes its share of the new size. Growing puts slots
//! the device was formatted with back in service, empty; shrinking drops
//! the lines each shard's replacement policy would evict first, writing
//! dirty ones back before they go, and the new size is recorded only once
//! the records say those lines left, so a crash finds the old size or the
//! new one, with every acknowledged write.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use iocache_core::units::format_byte_size;
use iocache_core::{FlushOrder, Op};
use iocache_device::BlockDevice;
use iocache_format::SuperblockFound;

use super::tickets::DroppedSlots;
use super::{lock, EngineError, Inner};

/// The longest a shrink waits for its dirty lines to be written back.
pub const RESIZE_PATIENCE: Duration = Duration::from_secs(600);

/// Dirty lines leaving that one write-back batch takes, over all shards.
/// A request for a line of a batch waits until that line is written:
/// small batches keep that wait short, larger ones write back faster
/// (measured in docs/results/resize.md).
const RESIZE_FLUSH_LINES: usize = 64;

/// The lines the cache on `dev` is formatted for, if it holds one of
/// lines of `line_bytes` (`None` for a blank device, an unreadable
/// superblock, which the start reports, or another line size).
pub fn formatted_lines(dev: &dyn BlockDevice, line_bytes: u64) -> Result<Option<u64>, EngineError> {
    if dev.len_bytes() < 2 * iocache_format::SUPERBLOCK_BYTES as u64 {
        return Ok(None);
    }
    let Ok(SuperblockFound::Found { superblock, .. }) = crate::recovery::read_superblocks(dev)? else {
        return Ok(None);
    };
    Ok((superblock.layout.line_bytes == line_bytes).then_some(superblock.layout.slots))
}

impl Inner {
    /// Each shard's lines in service for `lines` in all: one each, the
    /// rest in proportion to the lines each holds beyond it, so that the
    /// shares add up to `lines` exactly.
    fn shard_targets(&self, lines: u64) -> Result<Vec<u64>, EngineError> {
        let held: Vec<u64> = (self.shards.iter())
            .map(|s| lock(&s.state).cache.capacity_lines())
            .collect();
        let formatted: u64 = held.iter().sum();
        let shards = held.len() as u64;
        if lines < shards || lines > formatted {
            return Err(EngineError::Config(format!(
                "a cache of {} ({lines} lines of {}): this cache device holds {} to {} ({shards} to {formatted} \
                 lines: it was formatted for {formatted}, and each of its {shards} shards needs one)",
                format_byte_size(lines * self.line_bytes),
                format_byte_size(self.line_bytes),
                format_byte_size(shards * self.line_bytes),
                format_byte_size(formatted * self.line_bytes),
            )));
        }
        let (spare, room) = (lines - shards, formatted - shards);
        let mut targets: Vec<u64> = (held.iter())
            .map(|&h| 1 + (spare as u128 * (h - 1) as u128 / room.max(1) as u128) as u64)
            .collect();
        let mut left = lines - targets.iter().sum::<u64>();
        for (target, &h) in targets.iter_mut().zip(&held) {
            let more = left.min(h - *target);
            *target += more;
            left -= more;
        }
        debug_assert_eq!(left, 0);
        Ok(targets)
    }

    /// Whether the cache can be given `bytes` of lines (whole lines; at
    /// most what the device was formatted for); each shard's share if so.
    pub(super) fn check_size(&self, bytes: u64) -> Result<Vec<u64>, EngineError> {
        if self.slots.array.is_some() {
            return Err(EngineError::NotSupported(
                "resizing a cache array (its members' slots are taken out of service when they fail)".into(),
            ));
        }
        self.shard_targets(bytes / self.line_bytes)
    }

    /// Puts `lines` lines in service (see the module doc). A growth is
    /// recorded before the slots come back (a crash then finds the new
    /// size, which a start applies); a shrink once its lines are gone. A
    /// shrink that cannot finish (a backend refusing write-backs for
    /// [`RESIZE_PATIENCE`], a stop) puts back the slots it took out, and
    /// the cache keeps its size.
    pub(super) fn resize(&self, lines: u64) -> Result<(), EngineError> {
        let targets = self.check_size(lines * self.line_bytes)?;
        let before: Vec<u64> = (self.shards.iter())
            .map(|s| lock(&s.state).cache.lines_in_service())
            .collect();
        if before == targets {
            return Ok(());
        }
        if lines > before.iter().sum::<u64>() {
            self.record_size(lines * self.line_bytes)?;
        }
        let started = Instant::now();
        let result = self.resize_shards(&targets);
        if result.is_err() {
            for (shard, &lines) in self.shards.iter().zip(&before) {
                let mut state = lock(&shard.state);
                let mut ops = std::mem::take(&mut state.ops);
                let _ = state.cache.resize(lines, self.now_ns(), &mut ops);
                state.ops = ops;
            }
        }
        self.set_dirty_caps(lock(&self.knobs).dirty_cap());
        let written_back = result?;
        let lines_gone_after = started.elapsed();
        // The dropped lines' records durable before the size is recorded.
        self.sync_records()?;
        let took = started.elapsed();
        log::info!(
            "cache resized from {} to {lines} lines in {:.1} ms ({written_back} dirty lines written back \
             first; records made durable in {:.1} ms)",
            before.iter().sum::<u64>(),
            took.as_secs_f64() * 1e3,
            (took - lines_gone_after).as_secs_f64() * 1e3
        );
        Ok(())
    }

    /// Returns the dirty lines written back.
    fn resize_shards(&self, targets: &[u64]) -> Result<u64, EngineError> {
        let deadline = Instant::now() + RESIZE_PATIENCE;
        let give_up = |leaving: u64| -> Result<(), EngineError> {
            if self.stopping.load(Ordering::Relaxed) || self.closing.load(Ordering::Relaxed) {
                return Err(EngineError::Shutdown);
            }
            if Instant::now() > deadline {
                return Err(EngineError::DirtyLinesRemain { lines: leaving });
            }
            Ok(())
        };
        let shards = self.all_shards();
        let mut short_before = u64::MAX;
        let mut written_back = 0;
        loop {
            let (short, leaving) = self.resize_step(targets)?;
            if short == 0 {
                return Ok(written_back);
            }
            if short < short_before && leaving == 0 {
                // Clean lines left (a step takes a bounded number): more to take.
                short_before = short;
                continue;
            }
            short_before = short;
            give_up(leaving)?;
            if leaving == 0 {
                return Err(EngineError::NotSupported(format!(
                    "shrinking the cache: the replacement policy named no line to leave ({short} to go)"
                )));
            }
            if self.epochs.is_some() {
                // Ordered write-back: the backend takes epochs in turn, so
                // the lines leaving go with every older one (and no newer).
                let newest = self
                    .shards
                    .iter()
                    .filter_map(|shard| lock(&shard.state).cache.retiring_epoch_max())
                    .max();
                let drained = newest.map(|newest| {
                    let _cleaning = lock(&self.cleaner.cleaning);
                    self.ordered_drain(Some(newest + 1))
                });
                match drained {
                    Some(Ok((written, 0))) => written_back += written,
                    Some(Ok((written, _))) => {
                        written_back += written;
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    Some(Err(_)) | None => std::thread::sleep(Duration::from_millis(20)),
                }
                continue;
            }
            // The lines chosen so far, in small batches one after the
            // other; as many batches as it takes them all, at most.
            let share = RESIZE_FLUSH_LINES.div_ceil(shards.len());
            for _ in 0..=(leaving as usize).div_ceil(RESIZE_FLUSH_LINES) {
                let batch = {
                    let _cleaning = lock(&self.cleaner.cleaning);
                    self.flush_batch(&shards, FlushOrder::Retiring, share, false)
                };
                written_back += (batch.taken - batch.failed) as u64;
                if batch.taken == 0 || batch.failed > 0 || give_up(leaving).is_err() {
                    if batch.taken > 0 && batch.failed == batch.taken {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    break;
                }
            }
        }
    }

    /// One round over the shards: each takes lines out of service toward
    /// its target. Returns the lines still to go and the dirty lines among
    /// them waiting to be written back.
    fn resize_step(&self, targets: &[u64]) -> Result<(u64, u64), EngineError> {
        let (mut short, mut leaving) = (0, 0);
        let mut dropped = DroppedSlots::default();
        for (i, (shard, &target)) in self.shards.iter().zip(targets).enumerate() {
            let mut guard = lock(&shard.state);
            let state = &mut *guard;
            let mut ops = std::mem::take(&mut state.ops);
            let progress = state.cache.resize(target, self.now_ns(), &mut ops);
            for op in ops.ops() {
                let Op::Invalidate { slot, key } = *op else {
                    unreachable!("the engine's shards keep dirty victims: a resize only drops clean lines");
                };
                dropped.add(state, i, slot, key);
            }
            state.ops = ops;
            let progress = progress?;
            short += progress.in_service - progress.target.min(progress.in_service);
            leaving += progress.dirty_leaving;
        }
        self.empty_dropped_slots(dropped, |_, _, _| {});
        Ok((short, leaving))
    }
}

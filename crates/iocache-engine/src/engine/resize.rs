//! A cache resized while it serves (`cache_size` set at run time or at a
//! start): each shard takes its share of the new size. Growing puts slots
//! the device was formatted with back in service, empty; shrinking drops
//! the lines each shard's replacement policy would evict first, writing
//! dirty ones back before they go, and the new size is recorded only once
//! the records say those lines left, so a crash finds the old size or the
//! new one, with every acknowledged write.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use iocache_core::{FlushOrder, Op};

use super::tickets::TicketKey;
use super::{lock, EngineError, Inner};

/// The longest a shrink waits for its dirty lines to be written back.
pub const RESIZE_PATIENCE: Duration = Duration::from_secs(600);

impl Inner {
    /// Each shard's lines in service for `lines` in all: in proportion to
    /// the lines each holds, and at least one.
    fn shard_targets(&self, lines: u64) -> Result<Vec<u64>, EngineError> {
        let held: Vec<u64> = (self.shards.iter())
            .map(|s| lock(&s.state).cache.capacity_lines())
            .collect();
        let formatted: u64 = held.iter().sum();
        if lines < held.len() as u64 || lines > formatted {
            return Err(EngineError::Config(format!(
                "a cache of {lines} lines: this cache device was formatted for at most {formatted} lines \
                 (and its {} shards need one each)",
                held.len()
            )));
        }
        // Largest remainders: the shares add up to `lines` exactly.
        let mut targets: Vec<u64> = held.iter().map(|&h| lines * h / formatted).collect();
        let mut left = lines - targets.iter().sum::<u64>();
        for (target, &h) in targets.iter_mut().zip(&held) {
            if left > 0 && *target < h {
                *target += 1;
                left -= 1;
            }
        }
        for target in &mut targets {
            *target = (*target).max(1);
        }
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

    /// Puts `lines` lines in service (see the module doc). A shrink that
    /// cannot finish (a backend refusing write-backs for
    /// [`RESIZE_PATIENCE`], a stop) puts back the slots it took out, and
    /// the cache keeps its size.
    pub(super) fn resize(&self, lines: u64) -> Result<(), EngineError> {
        let targets = self.check_size(lines * self.line_bytes)?;
        let before: Vec<u64> = (self.shards.iter())
            .map(|s| lock(&s.state).cache.lines_in_service())
            .collect();
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
        result?;
        // The dropped lines' records durable before the size is recorded.
        self.sync_records()
    }

    fn resize_shards(&self, targets: &[u64]) -> Result<(), EngineError> {
        let deadline = Instant::now() + RESIZE_PATIENCE;
        let shards = self.all_shards();
        loop {
            let (short, leaving) = self.resize_step(targets)?;
            if short == 0 {
                return Ok(());
            }
            if self.stopping.load(Ordering::Relaxed) {
                return Err(EngineError::Shutdown);
            }
            if Instant::now() > deadline {
                return Err(EngineError::DirtyLinesRemain { lines: leaving });
            }
            if leaving == 0 {
                return Err(EngineError::NotSupported(format!(
                    "shrinking the cache: the replacement policy named no line to leave ({short} to go)"
                )));
            }
            if self.epochs.is_some() {
                // Ordered write-back: the backend takes epochs in turn, so
                // the lines leaving go with every older one.
                self.flush_all()?;
            } else {
                let batch = {
                    let _cleaning = lock(&self.cleaner.cleaning);
                    self.flush_batch(&shards, FlushOrder::Retiring, self.flush_all_share(), false)
                };
                if batch.taken > 0 && batch.failed == batch.taken {
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        }
    }

    /// One round over the shards: each takes lines out of service toward
    /// its target. Returns the lines still to go and the dirty lines among
    /// them waiting to be written back.
    fn resize_step(&self, targets: &[u64]) -> Result<(u64, u64), EngineError> {
        let (mut short, mut leaving) = (0, 0);
        let mut tickets = Vec::new();
        for (i, (shard, &target)) in self.shards.iter().zip(targets).enumerate() {
            let mut guard = lock(&shard.state);
            let state = &mut *guard;
            let mut ops = std::mem::take(&mut state.ops);
            let progress = state.cache.resize(target, self.now_ns(), &mut ops);
            for op in ops.ops() {
                let Op::Invalidate { slot, key } = *op else {
                    unreachable!("the engine's shards keep dirty victims: a resize only drops clean lines");
                };
                state.shadow.note_empty(slot);
                // Requests decided before may still read the slot.
                for key in [TicketKey::Line(key), TicketKey::Slot(slot)] {
                    let (ticket, _) = state.take_ticket(key);
                    tickets.push((i, key, ticket));
                }
            }
            state.ops = ops;
            let progress = progress?;
            short += progress.in_service - progress.target.min(progress.in_service);
            leaving += progress.dirty_leaving;
        }
        self.wait_for_tickets(&tickets);
        self.release_tickets(&tickets);
        Ok((short, leaving))
    }
}

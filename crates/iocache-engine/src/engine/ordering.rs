//! Ordered write-back across shards: the flush epoch new writes join (a
//! client FLUSH starts the next), and the epoch before which everything is
//! on the backend and flushed there. The core keeps each dirty line's epoch
//! and picks a batch's lines by epoch; this component decides when the
//! backend may take the next epoch (after a backend flush once no line of an
//! older one is dirty in any shard) and holds writes that would break the
//! order until it may. Waits happen before a request takes its tickets, so
//! the cleaner, which takes tickets of lines of the oldest epochs, never
//! waits for a request that waits for it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use iocache_core::{FlushOrder, OrderedWait};

use super::{lock, EngineError, Inner};

/// Longest a waiting write sleeps between looks at the cleaner's progress
/// (it is woken as soon as the backend takes a new epoch).
const WAIT_POLL: Duration = Duration::from_millis(5);

/// Longest a write waits for the backend to take older epochs before it
/// fails (write-backs failing, a cache device gone): an error, not a hang.
const WAIT_LIMIT: Duration = Duration::from_secs(60);

/// What ordered write-back keeps beyond the core's per-line epochs.
pub(super) struct Epochs {
    /// The epoch writes decided now join.
    current: AtomicU64,
    /// Every write of an epoch before this one is on the backend, which
    /// has flushed since (guarded: one thread at a time flushes for it).
    durable_before: Mutex<u64>,
    /// Its value, read with the shards locked (the mutex is taken before
    /// them, never after).
    durable_seen: AtomicU64,
    advanced: Condvar,
    /// Writes that waited for the backend to take older epochs.
    pub(super) waits: AtomicU64,
    /// Backend flushes that let the backend take a new epoch.
    pub(super) backend_flushes: AtomicU64,
}

impl Epochs {
    pub(super) fn new() -> Epochs {
        Epochs {
            // Recovered lines without an epoch count as epoch 0: older
            // than any other, and not yet known to be on the backend.
            current: AtomicU64::new(1),
            durable_before: Mutex::new(0),
            durable_seen: AtomicU64::new(0),
            advanced: Condvar::new(),
            waits: AtomicU64::new(0),
            backend_flushes: AtomicU64::new(0),
        }
    }

    /// The epoch writes decided now join.
    pub(super) fn current(&self) -> u64 {
        self.current.load(Ordering::Acquire)
    }

    /// A client FLUSH (or a FUA write) was received: writes decided from
    /// now on join the next epoch, which is returned.
    pub(super) fn next(&self) -> u64 {
        self.current.fetch_add(1, Ordering::AcqRel) + 1
    }

    /// After a restart: writes join an epoch after every one recovered.
    pub(super) fn start_after(&self, newest_recovered: u64) {
        self.current.fetch_max(newest_recovered + 1, Ordering::AcqRel);
    }

    pub(super) fn stats(&self) -> super::OrderedStats {
        let (epoch, durable_before) = (self.current(), *lock(&self.durable_before));
        super::OrderedStats {
            epoch,
            durable_before,
            epochs_behind: epoch.saturating_sub(durable_before),
            waits: self.waits.load(Ordering::Relaxed),
            backend_flushes: self.backend_flushes.load(Ordering::Relaxed),
        }
    }
}

impl Inner {
    /// Whether ordered write-back is on.
    pub(super) fn ordered(&self) -> bool {
        self.epochs.is_some()
    }

    /// The oldest epoch with a dirty line in some shard, or the current
    /// one when none has. Read before the shards: a line dirtied after it
    /// joins an epoch at least as new.
    fn oldest_dirty_epoch(&self, epochs: &Epochs) -> u64 {
        let current = epochs.current();
        self.dirty_epoch_min()
            .map_or(current, |oldest| oldest.min(current))
    }

    /// The oldest epoch with a dirty line in some shard.
    fn dirty_epoch_min(&self) -> Option<u64> {
        self.shards
            .iter()
            .filter_map(|shard| lock(&shard.state).cache.oldest_dirty_epoch())
            .min()
    }

    /// Dirty lines in every shard.
    pub(super) fn dirty_lines_all(&self) -> u64 {
        self.shards
            .iter()
            .map(|s| lock(&s.state).cache.dirty_lines())
            .sum()
    }

    /// Lets the backend take every epoch with no dirty line left: once no
    /// shard has a dirty line of an epoch before `oldest`, the backend is
    /// flushed and everything before `oldest` is durable there. Returns the
    /// epoch before which everything is.
    pub(super) fn advance_durable_epoch(&self) -> Result<u64, EngineError> {
        let Some(epochs) = &self.epochs else {
            return Ok(u64::MAX);
        };
        let mut durable = lock(&epochs.durable_before);
        let oldest = self.oldest_dirty_epoch(epochs);
        if oldest > *durable {
            self.flush_backends()?;
            epochs.backend_flushes.fetch_add(1, Ordering::Relaxed);
            *durable = oldest;
            epochs.durable_seen.store(oldest, Ordering::Release);
            epochs.advanced.notify_all();
        }
        Ok(*durable)
    }

    /// Waits, holding no ticket, until everything before epoch `before` is
    /// on the backend, asking the cleaner for it.
    pub(super) fn wait_durable_before(&self, before: u64) -> Result<(), EngineError> {
        let Some(epochs) = &self.epochs else {
            return Ok(());
        };
        let mut counted = false;
        let started = self.now_ns();
        loop {
            if self.advance_durable_epoch()? >= before {
                return Ok(());
            }
            if self.stopping.load(Ordering::Relaxed) {
                return Err(EngineError::Shutdown);
            }
            if self.now_ns().saturating_sub(started) > WAIT_LIMIT.as_nanos() as u64 {
                return Err(EngineError::Io(format!(
                    "ordered write-back: the backend has not taken the writes before epoch {before} \
                     in {} s (failing write-backs, or the cache device failed with them)",
                    WAIT_LIMIT.as_secs()
                )));
            }
            if !counted {
                epochs.waits.fetch_add(1, Ordering::Relaxed);
                counted = true;
            }
            self.ask_cleaner_and_wait(epochs, before);
        }
    }

    /// Asks the cleaner for a batch and sleeps until the backend takes a
    /// new epoch or a batch ends, at most [`WAIT_POLL`], unless everything
    /// before `before` is already there.
    fn ask_cleaner_and_wait(&self, epochs: &Epochs, before: u64) {
        self.cleaner.ordered_demand.store(true, Ordering::Relaxed);
        self.wake_cleaner();
        let durable = lock(&epochs.durable_before);
        if *durable < before {
            let _ = epochs.advanced.wait_timeout(durable, WAIT_POLL);
        }
    }

    /// Whether a write first decided in `epoch` may go ahead despite
    /// `wait`: one that must write the backend may once every epoch before
    /// that is there (FLUSHes since then do not cover it: it was not
    /// acknowledged before them).
    pub(super) fn ordered_may_go(&self, wait: OrderedWait, epoch: u64) -> bool {
        let epochs = self.epochs.as_ref().expect("ordered write-back is on");
        wait == OrderedWait::ToBackend && epochs.durable_seen.load(Ordering::Acquire) >= epoch
    }

    /// Waits for `wait` ([`iocache_core::Cache::ordered_write_waits`]) of a
    /// write decided in `epoch`, with no lock held: an older epoch on the
    /// backend, or a batch of cleaning.
    pub(super) fn wait_ordered(&self, wait: OrderedWait, epoch: u64) -> Result<(), EngineError> {
        match wait {
            OrderedWait::Epoch(older) => self.wait_durable_before(older + 1),
            OrderedWait::ToBackend => self.wait_durable_before(epoch),
            OrderedWait::Room => {
                let epochs = self.epochs.as_ref().expect("ordered write-back is on");
                if self.stopping.load(Ordering::Relaxed) {
                    return Err(EngineError::Shutdown);
                }
                epochs.waits.fetch_add(1, Ordering::Relaxed);
                // Woken by the cleaner's next batch.
                self.ask_cleaner_and_wait(epochs, u64::MAX);
                Ok(())
            }
        }
    }

    /// Every line dirty so far, epoch by epoch (writes from now on join a
    /// new epoch); fails when some could not be written back. Returns the
    /// lines written back.
    pub(super) fn drain_epochs_so_far(&self, epochs: &Epochs) -> Result<u64, EngineError> {
        let (written, failed) = self.ordered_drain(Some(epochs.next()))?;
        if failed > 0 {
            return Err(EngineError::DirtyLinesRemain { lines: failed as u64 });
        }
        Ok(written)
    }

    /// Writes back, oldest epoch first, every line dirty from an epoch
    /// before `before` (`None`: every dirty line), each epoch on the
    /// backend before the next. The caller holds the cleaning lock.
    /// Returns the lines written back and those still dirty after their
    /// write-back failed (given up once every line left has failed since
    /// the last success: a backend that is down must not keep it spinning).
    pub(super) fn ordered_drain(&self, before: Option<u64>) -> Result<(u64, usize), EngineError> {
        let (mut written, mut failed_since_success) = (0u64, 0usize);
        for _round in 0..1_000_000 {
            match (self.dirty_epoch_min(), before) {
                (None, _) => break,
                (Some(oldest), Some(before)) if oldest >= before => break,
                _ => {}
            }
            let batch = self.ordered_clean_batch(self.flush_all_share())?;
            written += (batch.taken - batch.failed) as u64;
            if batch.taken == 0 {
                break;
            }
            failed_since_success = match batch.failed == batch.taken {
                true => failed_since_success + batch.failed,
                false => batch.failed,
            };
            if failed_since_success as u64 >= self.dirty_lines_all() {
                return Ok((written, failed_since_success));
            }
        }
        self.advance_durable_epoch()?;
        // Bounded like `flush_all`: if lines of the epochs asked for are
        // still dirty (rounds ran out), the dirty lines count as left.
        let left = match self.dirty_epoch_min() {
            Some(oldest) if before.is_none_or(|b| oldest < b) => self.dirty_lines_all(),
            _ => 0,
        };
        Ok((written, left as usize))
    }

    /// One batch of ordered cleaning over every shard: the lines of the
    /// oldest epoch not yet on the backend (after a backend flush if the
    /// epochs before it just emptied), in address order. Returns the batch.
    pub(super) fn ordered_clean_batch(
        &self,
        lines: usize,
    ) -> Result<super::cleaner::FlushBatch, EngineError> {
        let through = self.advance_durable_epoch()?;
        let shards = self.all_shards();
        let batch = self.flush_batch(&shards, FlushOrder::Epochs { through }, lines, false);
        if batch.taken > batch.failed {
            self.advance_durable_epoch()?;
        }
        if let Some(epochs) = &self.epochs {
            epochs.advanced.notify_all();
        }
        Ok(batch)
    }
}

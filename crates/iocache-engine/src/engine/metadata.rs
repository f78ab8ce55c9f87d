//! The metadata component: what the engine keeps on the cache device about
//! its slots so that a restart finds every dirty line. It is recorded
//! (records at barriers, intents, dirty checksums: the rules of
//! `persist.rs`) or volatile, the variant that records nothing; every
//! question the rest of the engine asks about metadata is answered here, so
//! the volatile case is decided in one place instead of at each call site.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use iocache_format::Persistence;

use super::barrier::Durability;
use super::{lock, EngineError, Inner, ShardState};

/// How the engine's metadata is kept, and the barrier's state.
pub(super) struct Metadata {
    /// What the records say: nothing (volatile), the dirty lines, or all.
    mode: Persistence,
    /// Dirty records carry checksums of the dirty data.
    dirty_checksums: bool,
    /// The barrier's state: superblock, record writer, intent log,
    /// counters (`barrier.rs`).
    pub(super) durability: Durability,
    /// The longest a write may wait for a record (`None`: no limit).
    commit_interval_ns: Option<u64>,
    /// Clock reading of the first write noted since the last barrier took
    /// its records, plus one (0: none).
    first_unrecorded_ns: AtomicU64,
    /// Barriers the commit interval ran.
    commits: AtomicU64,
}

impl Metadata {
    pub(super) fn new(
        mode: Persistence,
        dirty_checksums: bool,
        commit_interval: Option<Duration>,
        durability: Durability,
    ) -> Metadata {
        Metadata {
            mode,
            dirty_checksums: mode != Persistence::None && dirty_checksums,
            durability,
            commit_interval_ns: commit_interval.map(|d| d.as_nanos().min(u128::from(u64::MAX)) as u64),
            first_unrecorded_ns: AtomicU64::new(0),
            commits: AtomicU64::new(0),
        }
    }

    /// A change the records do not show yet was made (a dirty write noted,
    /// a dirty line dropped): the commit interval runs from the first such
    /// change after a barrier. The clock (`now_ns`) is read only when that
    /// mark is set, once per interval, not on every write.
    pub(super) fn changed(&self, now_ns: impl FnOnce() -> u64) {
        if self.commit_interval_ns.is_some()
            && self.records_slots()
            && self.first_unrecorded_ns.load(Ordering::Relaxed) == 0
        {
            let _ = self.first_unrecorded_ns.compare_exchange(
                0,
                now_ns() + 1,
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
        }
    }

    /// A barrier is about to take the records: changes from now on wait
    /// for the next one.
    pub(super) fn taking_records(&self) {
        self.first_unrecorded_ns.store(0, Ordering::Relaxed);
    }

    /// When the commit interval wants a barrier: `None` when nothing waits
    /// for one (or there is no interval).
    fn commit_due_ns(&self) -> Option<u64> {
        let interval = self.commit_interval_ns?;
        let first = self.first_unrecorded_ns.load(Ordering::Relaxed);
        (first != 0).then(|| (first - 1).saturating_add(interval))
    }

    pub(super) fn commits(&self) -> u64 {
        self.commits.load(Ordering::Relaxed)
    }

    pub(super) fn mode(&self) -> Persistence {
        self.mode
    }

    /// Whether slots are recorded on the device: a shadow tracks what each
    /// holds, and a barrier writes its records. Volatile metadata records
    /// nothing and a barrier writes dirty lines back instead.
    pub(super) fn records_slots(&self) -> bool {
        self.mode != Persistence::None
    }

    /// Whether clean lines are recorded too (with a hash of their data).
    pub(super) fn records_clean_lines(&self) -> bool {
        self.mode == Persistence::All
    }

    /// Whether dirty records carry checksums of the dirty sectors.
    pub(super) fn dirty_checksums(&self) -> bool {
        self.dirty_checksums
    }
}

impl Inner {
    /// Runs `note` on the state of `shard` when its slots are recorded (the
    /// shadow's bookkeeping); volatile metadata has nothing to note and takes
    /// no lock.
    pub(super) fn note_in_shadow<R>(
        &self,
        shard: usize,
        note: impl FnOnce(&mut ShardState) -> R,
    ) -> Option<R> {
        if !self.metadata.records_slots() {
            return None;
        }
        Some(note(&mut lock(&self.shards[shard].state)))
    }

    /// Runs a barrier when a change has waited the commit interval for its
    /// record (the cleaner's thread calls this on each round). Returns when
    /// the next one may be due, if any change waits.
    pub(super) fn commit_if_due(&self, now_ns: u64) -> Option<u64> {
        let due = self.metadata.commit_due_ns()?;
        if due > now_ns {
            return Some(due);
        }
        self.metadata.commits.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = self.barrier(false) {
            log::debug!("the commit interval's barrier failed: {e}");
            // Its records were put back: try again an interval later.
            self.metadata.changed(|| now_ns);
        }
        self.metadata.commit_due_ns()
    }

    /// Makes the records say what the slots hold now (a barrier that writes
    /// no dirty line back). Volatile metadata has no records: nothing to do.
    pub(super) fn sync_records(&self) -> Result<(), EngineError> {
        if !self.metadata.records_slots() {
            return Ok(());
        }
        self.barrier(false)
    }
}

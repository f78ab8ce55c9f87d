//! The metadata component: what the engine keeps on the cache device about
//! its slots so that a restart finds every dirty line. It is recorded
//! (records at barriers, intents, dirty checksums: the rules of
//! `persist.rs`) or volatile, the variant that records nothing; every
//! question the rest of the engine asks about metadata is answered here, so
//! the volatile case is decided in one place instead of at each call site.

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
}

impl Metadata {
    pub(super) fn new(mode: Persistence, dirty_checksums: bool, durability: Durability) -> Metadata {
        Metadata {
            mode,
            dirty_checksums: mode != Persistence::None && dirty_checksums,
            durability,
        }
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

    /// Makes the records say what the slots hold now (a barrier that writes
    /// no dirty line back). Volatile metadata has no records: nothing to do.
    pub(super) fn sync_records(&self) -> Result<(), EngineError> {
        if !self.metadata.records_slots() {
            return Ok(());
        }
        self.barrier(false)
    }
}

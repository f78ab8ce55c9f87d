//! The real cache: executes the policy core's decisions on block devices,
//! concurrently, for any caller (the serving layer, iocache-serving, puts
//! it behind NBD).
//!
//! ## Concurrency
//!
//! The cache is split into shards, each a [`Cache`] of the policy core with
//! its own lines and its own region of the cache device, behind its own
//! mutex (`lookup = fine`; `coarse` is one shard, `single` is one shard whose
//! decisions are all made by one dedicated thread). Lines are assigned to
//! shards in runs of [`SHARD_SPAN_LINES`], so a typical request touches one
//! shard.
//!
//! A request:
//! 1. locks the shards it touches, in ascending order;
//! 2. asks each shard's core for its decisions (the op list) and, for every
//!    key those ops touch, takes a ticket in that key's FIFO queue: the slot
//!    of every cache op, the line of every victim written back or
//!    invalidated, and the request's own lines when its ops touch the
//!    backend (a request served wholly by the cache is ordered by its slots:
//!    every op that changes a slot's contents takes the slot's ticket);
//! 3. unlocks the shards, waits until each of its tickets is served, runs its
//!    ops on the devices, and releases its tickets.
//!
//! Because tickets are taken while all involved shards are locked, the order
//! of tickets on every key is one global serialization order of requests,
//! so waiting for tickets cannot deadlock, and I/O on any line (including a
//! victim's write-back and the refill of its slot) happens in the order the
//! decisions were made: a read never sees stale data and a write that lands
//! on a line being flushed or evicted waits for it. The hit path takes only
//! its shard's mutex, briefly, and no global lock.

mod clock;
mod dirty_sums;
mod engine;
mod health;
mod latency;
pub mod layout;
mod persist;
mod raid;
mod recovery;
mod stripe;

pub use engine::{
    formatted_lines, recorded_reca_line_size, ArrayEngineStats, BalanceConfig, BalanceController,
    BalanceDecision, BalanceLoad, BalanceStats, CachedCopy, CachedRange, DeviceQueueStats, Engine,
    EngineConfig, EngineError, EngineStats, InPlace, IoMode, KnobState, Lookup, MemberReplacement,
    OrderedStats, QueueClassStats, RecaSetup, RecaStatus, RecordedLineSize, Volume, VolumeInfo, VolumeStats,
    DEFAULT_CLEAN_CHECK_BUDGET, DEFAULT_COMMIT_INTERVAL, EVACUATION_PATIENCE, RECA_MAX_REQUESTS_PER_SECOND,
    RECA_PERIOD, RECA_TICK, RESIZE_PATIENCE, SHARD_SPAN_LINES, SHUTDOWN_WRITE_BACK_PATIENCE,
};
pub use engine::{BlockCommandStats, Zeroing};
pub use iocache_format::{Layout, Persistence};
pub use latency::{LatencyHistogram, LatencyPercentiles, LATENCY_BOUNDS_NS};
pub use layout::LayoutError;
pub use raid::{
    ArrayError, ArrayGeometry, ArrayStats, CacheArray, MirrorState, MEMBERS_MAX as RAID_MEMBERS_MAX,
    MEMBER_HEADER_BYTES as RAID_MEMBER_HEADER_BYTES,
};
pub use recovery::{
    backend_identity, check_not_shrunk, describe_backend, describe_identity, is_blank, Acknowledgement,
    BackendMismatch, DamagedMetadata, DamagedSlot, InitMode, ProbableLine, RecoveryReport,
};

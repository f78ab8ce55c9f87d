//! The engine: shards of the policy core, per-key ticket queues, and the code
//! that runs each request's ops on the cache device and the backend. See the
//! crate documentation for the locking protocol.

use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, RwLock};
use std::thread::JoinHandle;
use std::time::Duration;

use iocache_core::bitmap;
use iocache_core::fasthash::FxHashMap;
use iocache_core::index::IndexPrefetcher;
use iocache_core::EffectiveMode;
use iocache_core::{
    Cache, CacheConfig, CacheStats, CoreError, FlushToken, IoKind, LineKey, Op, OpList, RestoredLine, SlotId,
    VolumeId, WritePolicy, SECTOR_BYTES,
};
use iocache_device::{BlockDevice, DeviceError, IoEngine, UringEngine};
use iocache_format::Persistence;

use crate::clock::Clock;
use crate::latency::{LatencyHistogram, LatencyPercentiles};
use crate::persist::Shadow;
use crate::raid::{ArrayStats, CacheArray, MirrorState};
use crate::recovery::{self, DamagedMetadata, InitMode, OpenSpec, RecoveryReport};
use barrier::{Durability, MetaState};
use cleaner::Cleaner;
use execute::CacheRead;
use health_state::{HealthState, Poisoned};
use metadata::Metadata;
use planning::{Plan, PlannedSegment, Segments};
use slots::SlotStore;
use smallvec::SmallVec;
use thiserror::Error;
use tickets::{LineQueues, Ticket, TicketKey};
use volumes::{VolumeState, VolumeTable};

mod balance;
mod barrier;
mod cleaner;
mod discard;
mod execute;
pub use discard::{BlockCommandStats, Zeroing};
mod health_state;
mod in_place;
pub use in_place::InPlace;
mod members;
pub use members::{MemberReplacement, EVACUATION_PATIENCE};
pub use resize::{formatted_lines, RESIZE_PATIENCE};
mod metadata;
mod ordering;
mod planning;
mod queues;
mod readahead;
mod reca;
mod resize;
mod restore;
mod settings;
mod slots;
mod succession;
mod tickets;
mod volumes;
mod writeback;
mod writes;

pub use balance::{BalanceConfig, BalanceController, BalanceDecision, BalanceLoad, BalanceStats};
pub use queues::{DeviceQueueStats, QueueClassStats};
pub use reca::{
    recorded_reca_line_size, RecaSetup, RecaStatus, RecordedLineSize, RECA_MAX_REQUESTS_PER_SECOND,
    RECA_PERIOD, RECA_TICK,
};
pub use settings::KnobState;
pub use succession::{CachedCopy, CachedRange};

pub use volumes::{Volume, VolumeInfo, VolumeStats};

/// Lines are assigned to shards in runs of this many, so that a request
/// usually stays within one shard and its backend transfers stay merged.
pub const SHARD_SPAN_LINES: u64 = 64;

/// The most lines a read may span for [`Engine::read_would_hit`] to look
/// (64 KiB of 4 KiB lines, the NBD server's largest inline read): longer
/// reads are not "quick".
pub const QUICK_READ_MAX_LINES: u64 = 16;

/// Shards at most in `fine` mode.
const SHARDS_MAX: usize = 64;
/// Lines per shard at least in `fine` mode (when the shard count is
/// chosen): 128 spans. Spans land in shards by hash and each shard has a
/// fixed share of the capacity, so a shard's share of a working set varies
/// like a binomial draw, and an over-full shard misses while others have
/// room. With 128 spans per shard a working set of 90 % of the cache loses
/// about 0.5 % of its hits that way (75 %: none); with the 4 spans per
/// shard used before, a 256 MiB cache of 4 KiB lines (64 shards) served a
/// working set of 90 % of its size with a hit ratio of 0.940 where one
/// shard gives 1.000 (`examples/loadgen`), and 0.996 at 50 %.
const SHARD_LINES_MIN: u64 = 128 * SHARD_SPAN_LINES;

/// How long an acknowledged write may stay out of the records by default
/// (`EngineConfig::commit_interval`): a killed process or a power cut loses
/// at most this much of a client that never flushes.
pub const DEFAULT_COMMIT_INTERVAL: Duration = Duration::from_secs(1);

/// How long, after a crash, comparing the recovered clean lines with the
/// backend may take by default (`EngineConfig::clean_check_budget`).
pub const DEFAULT_CLEAN_CHECK_BUDGET: Duration = Duration::from_secs(60);

/// How long [`Engine::shutdown`] keeps retrying write-backs that fail
/// before it leaves the dirty lines on the cache device.
pub const SHUTDOWN_WRITE_BACK_PATIENCE: Duration = Duration::from_secs(10);

/// How lookups are parallelized (the ASPLOS'23 lookup architectures).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lookup {
    /// Many independently locked shards; no global lock on the hit path.
    Fine,
    /// One shard behind one global lock.
    Coarse,
    /// One thread makes every lookup decision.
    Single,
}

impl Lookup {
    /// Each lookup's name, for parsing and printing alike.
    const NAMES: [(&'static str, Lookup); 3] = [
        ("fine", Lookup::Fine),
        ("coarse", Lookup::Coarse),
        ("single", Lookup::Single),
    ];
}

impl FromStr for Lookup {
    type Err = EngineError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        keyword(s, &Lookup::NAMES, "lookup", "fine, coarse or single")
    }
}

impl std::fmt::Display for Lookup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (name, _) = Lookup::NAMES
            .iter()
            .find(|(_, l)| l == self)
            .expect("every lookup is named");
        f.write_str(name)
    }
}

/// The value `s` names in `table` (surrounding blanks ignored), or a
/// configuration error naming `what` was asked for and what is `expected`:
/// one lookup for every keyword setting of the engine.
fn keyword<T: Copy>(s: &str, table: &[(&str, T)], what: &str, expected: &str) -> Result<T, EngineError> {
    let s = s.trim();
    table
        .iter()
        .find(|(name, _)| *name == s)
        .map(|&(_, value)| value)
        .ok_or_else(|| EngineError::Config(format!("unknown {what} `{s}`; expected {expected}")))
}

#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// The whole cache: `capacity_lines` is split across the shards.
    pub cache: CacheConfig,
    pub lookup: Lookup,
    /// Shards in `fine` mode; 0 chooses (up to 64, at least 256 lines each).
    pub shards: usize,
    /// How cache reads of several lines are issued.
    pub io: IoMode,
    /// Which lines' metadata survives a restart (docs/format.md).
    pub persistence: Persistence,
    /// Load the cache the device holds, or format over it.
    pub init: InitMode,
    /// The volume's name, recorded on the cache device.
    pub volume_name: String,
    /// Cache RAID: the cache device given to the engine is this array
    /// (clean lines striped, dirty lines mirrored; see `raid.rs`).
    pub array: Option<Arc<CacheArray>>,
    /// A load balancer (LBICA, SIB) driven by the engine's I/O accounting
    /// (`balance.rs`); none by default.
    pub balance: Option<BalanceConfig>,
    /// Dirty records carry a checksum of the dirty data, verified at every
    /// start (persistent metadata only; `persist.rs`, rule 4). On by default.
    pub dirty_checksums: bool,
    /// After a crash (persistence `all`), how long comparing the recovered
    /// clean lines with the backend may take before the rest are dropped
    /// (`recovery/lines.rs`, `check_clean_lines`). 60 s by default.
    pub clean_check_budget: Duration,
    /// With persistent metadata, the longest an acknowledged write stays
    /// out of the records when the client never flushes: a barrier runs
    /// this long after the first write it would record (`metadata.rs`), so
    /// a killed process or a power cut loses at most this much. `None`:
    /// only FLUSH, FUA and the engine's own needs run barriers.
    /// [`DEFAULT_COMMIT_INTERVAL`] by default.
    pub commit_interval: Option<Duration>,
    /// The operator acknowledges that backends whose identity differs from
    /// the one the cache recorded are their volumes' own (restored from a
    /// copy, say): their dirty lines are kept for them, their clean lines
    /// dropped (`recovery/`). Off by default: such a start is refused.
    pub rebind_backends: bool,
    /// Write-back may fill a gap of at most this many bytes between two
    /// dirty runs with the backend's own data (read first), so that both
    /// go in one request (`engine/writeback.rs`). 0 by default: write-back
    /// never reads the backend.
    pub write_back_gap_bytes: u64,
}

impl EngineConfig {
    /// A configuration with `fine` lookup, automatic shards, psync reads,
    /// volatile metadata and a volume named `volume`.
    pub fn new(cache: CacheConfig) -> EngineConfig {
        EngineConfig {
            cache,
            lookup: Lookup::Fine,
            shards: 0,
            io: IoMode::Psync,
            persistence: Persistence::None,
            init: InitMode::Load,
            volume_name: "volume".into(),
            array: None,
            balance: None,
            dirty_checksums: true,
            clean_check_budget: DEFAULT_CLEAN_CHECK_BUDGET,
            commit_interval: Some(DEFAULT_COMMIT_INTERVAL),
            rebind_backends: false,
            write_back_gap_bytes: 0,
        }
    }
}

/// How the engine issues a request's cache-device reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum IoMode {
    /// One positional read after the other, on the request's thread.
    #[default]
    Psync,
    /// Reads of several lines as one io_uring batch.
    Uring,
}

impl FromStr for IoMode {
    type Err = EngineError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let names = [
            ("psync", IoMode::Psync),
            ("uring", IoMode::Uring),
            ("io_uring", IoMode::Uring),
        ];
        keyword(s, &names, "I/O engine", "psync or uring")
    }
}

#[derive(Debug, Error)]
pub enum EngineError {
    #[error(transparent)]
    Core(#[from] CoreError),
    #[error(transparent)]
    Device(#[from] DeviceError),
    #[error("request at offset {offset} of length {length} lies outside the volume of {size} bytes")]
    OutOfRange { offset: u64, length: u64, size: u64 },
    #[error("request at offset {offset} of length {length} is not aligned to 512-byte sectors")]
    Unaligned { offset: u64, length: u64 },
    #[error("the cache device holds {device_bytes} bytes, less than the cache's {cache_bytes}")]
    CacheDeviceTooSmall { device_bytes: u64, cache_bytes: u64 },
    #[error("engine configuration: {0}")]
    Config(String),
    #[error("the engine is shut down")]
    Shutdown,
    #[error("{lines} dirty lines could not be written back to the backend")]
    DirtyLinesRemain { lines: u64 },
    #[error(
        "{lines} dirty lines could not be written back to the backend, and the metadata could not \
         be marked clean at shutdown ({close}): the next start recovers the cache as after a crash, \
         from the records of the last barrier"
    )]
    ShutdownIncomplete { lines: u64, close: String },
    #[error("cache read failed: {0}")]
    Io(String),
    #[error("cache device format: {0}")]
    Format(String),
    #[error("refusing to start: {0}")]
    Refused(String),
    /// A start refused unless the operator acknowledges what it would
    /// lose ([`Acknowledgement`](crate::recovery::Acknowledgement); the
    /// front end names how).
    #[error("refusing to start: {reason}; {acknowledgement}")]
    Unacknowledged {
        reason: String,
        acknowledgement: crate::recovery::Acknowledgement,
    },
    /// Records that may describe dirty lines are damaged (see
    /// [`InitMode::LoadAcceptingDamage`] to start anyway).
    #[error("refusing to start: {0}")]
    DamagedMetadata(#[from] DamagedMetadata),
    /// A backend is not the one the cache holds the volume's lines for.
    #[error("refusing to start: {0}")]
    BackendMismatch(#[from] crate::recovery::BackendMismatch),
    #[error(transparent)]
    Array(#[from] crate::raid::ArrayError),
    #[error("no volume {0} is attached")]
    UnknownVolume(String),
    /// A request asked for what this cache or its backend cannot do (a
    /// quick zeroing the backend does not offer); nothing was changed.
    #[error("not supported: {0}")]
    NotSupported(String),
    #[error("volume: {0}")]
    Volume(String),
}

/// Counters of the whole engine.
#[derive(Clone, Debug, Default)]
pub struct EngineStats {
    /// The policy cores' counters, summed over shards.
    pub cache: CacheStats,
    pub capacity_lines: u64,
    /// Lines in service: `capacity_lines` less those a resize (or a
    /// failed cache-array member) took out of service.
    pub lines_in_service: u64,
    pub resident_lines: u64,
    pub dirty_lines: u64,
    pub shards: usize,
    /// Requests that failed with a device error.
    pub io_errors: u64,
    /// Lines whose cache-device write failed and were forgotten.
    pub forgotten_lines: u64,
    /// Readahead fills dropped because the fill queue was full, and fills
    /// that failed (the lines fetched are in `cache`'s `prefetch_*`).
    pub readahead_dropped_fills: u64,
    pub readahead_failed_fills: u64,
    pub persistence: Option<Persistence>,
    /// What opening the cache device found.
    pub recovery: RecoveryReport,
    /// Metadata barriers run (FLUSH, FUA, shutdown, slot reuse).
    pub barriers: u64,
    /// Records written by those barriers.
    pub records_written: u64,
    /// Intents written: one per write about to land in place on dirty
    /// sectors that a durable record's checksum covers (each on the
    /// write's path: an intent block and a cache-device flush).
    pub intents_written: u64,
    /// Cache-device flushes those intents took (writers waiting at once
    /// share one).
    pub intent_flushes: u64,
    /// Barriers run because the intent log was full.
    pub intent_log_full: u64,
    pub cache_device_errors: u64,
    pub backend_errors: u64,
    /// Lines whose write-back failed (left dirty, retried with back-off).
    pub failed_writebacks: u64,
    /// Past the error threshold: the volume runs pass-through.
    pub cache_device_failed: bool,
    /// Cache RAID: members, mirror slots and degraded-mode counters.
    pub array: Option<ArrayEngineStats>,
    /// Request latency seen by clients of `read` and `write`.
    pub read_latency: LatencyPercentiles,
    pub write_latency: LatencyPercentiles,
    /// The I/O issued to the cache device (R, W, P, E) and to the backends
    /// (read, write, writeback): counts, in flight, latencies (`queues.rs`).
    pub cache_queue: DeviceQueueStats,
    pub backend_queue: DeviceQueueStats,
    /// The load balancer's state, when one runs.
    pub balance: Option<BalanceStats>,
    /// Barriers run by the commit interval (`EngineConfig::commit_interval`).
    pub commits: u64,
    /// Discards, zeroings and warming.
    pub block_commands: BlockCommandStats,
    /// Ordered write-back's state, when it is on.
    pub ordered: Option<OrderedStats>,
}

/// Ordered write-back as the engine sees it (`engine/ordering.rs`); a
/// server reports it as it is (serialized).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct OrderedStats {
    /// The flush epoch writes join now (one more per client FLUSH).
    pub epoch: u64,
    /// Everything before this epoch is on the backend and flushed there.
    pub durable_before: u64,
    /// Epochs written since (held in the cache, not yet on the backend).
    pub epochs_behind: u64,
    /// Writes that waited for an older epoch or for room.
    pub waits: u64,
    /// Backend flushes that let the backend take a new epoch.
    pub backend_flushes: u64,
}

/// A cache array's state as the engine sees it.
#[derive(Clone, Debug, Default)]
pub struct ArrayEngineStats {
    pub array: ArrayStats,
    /// Members failed: the array runs degraded.
    pub degraded: bool,
    /// Dirty lines the array may hold now (mirror slots a failure leaves).
    pub dirty_cap: u64,
    /// Lines dropped from failed members' slots (after their dirty data
    /// was written back from the mirror or was already in the backend).
    pub evacuated_lines: u64,
    /// Slots out of service on failed members.
    pub retired_slots: u64,
    /// Dirty lines whose both copies were lost (two failures): never
    /// written back, reads of them fail.
    pub lost_lines: u64,
    /// Degraded-mode evacuation finished for every failure seen.
    pub evacuated: bool,
}

struct ShardState {
    cache: Cache,
    queues: LineQueues,
    /// What the shard's slots hold on the device (persistence on).
    shadow: Shadow,
    /// Slots whose cache-device write failed, with the line and the sectors
    /// concerned and whether they were clean (the backend has them) or the
    /// client's dirty data (lost with the failed write): requests decided
    /// before the failure must not read them from the cache.
    poisoned: FxHashMap<SlotId, Poisoned>,
    /// Threads waiting on `served`: releases notify only when someone waits.
    waiters: usize,
    ops: OpList,
    tokens: Vec<FlushToken>,
}

/// Aligned so that no two shards share a cache line (threads working on
/// different shards must not slow each other down).
#[repr(align(128))]
struct Shard {
    state: Mutex<ShardState>,
    served: Condvar,
    /// Signalled when the last write in flight lands while a barrier
    /// drains the shard (rule 5 of `persist.rs`).
    landed: Condvar,
    /// Entries in the state's `poisoned` map: readers check it only when
    /// non-zero.
    poisoned: AtomicU64,
    /// A request found only dirty victims: the cleaner should clean some.
    wants_cleaning: AtomicBool,
    /// First slot of this shard on the cache device.
    base_slot: u64,
}

/// The client's buffer: read into, or written from.
enum Buffer<'a> {
    Read(&'a mut [u8]),
    Write(&'a [u8]),
}

struct Inner {
    /// The knobs' configured and current values (`settings.rs`).
    knobs: Mutex<settings::Knobs>,
    /// The configuration this start opened with, as the superblock's
    /// settings record shows it.
    opened_with: Vec<(String, String)>,
    /// A background drain of dirty lines is running (`settings.rs`).
    draining: AtomicBool,
    shards: Vec<Shard>,
    /// Per shard, starts loading a line's index entry before the shard is
    /// locked (the entry is the first memory access of a lookup, and a miss
    /// in the CPU caches when the cache is large). Apart from the shards so
    /// that these few bytes stay in the CPU caches.
    index_prefetchers: Vec<IndexPrefetcher>,
    line_bytes: u64,
    line_shift: u32,
    /// See [`EngineConfig::write_back_gap_bytes`].
    write_back_gap_bytes: u64,
    /// The attached volumes, each with its backend (see `volumes.rs`).
    volumes: RwLock<VolumeTable>,
    /// Serializes attach, detach, volume flushes and shutdown.
    admin: Mutex<()>,
    clock: Clock,
    stopping: AtomicBool,
    /// A shutdown was asked for: long admin work (a resize, which holds
    /// the admin lock a shutdown takes) gives up.
    closing: AtomicBool,
    read_latency: LatencyHistogram,
    write_latency: LatencyHistogram,
    /// Recorded or volatile metadata, and the barrier's state
    /// (`metadata.rs`, `barrier.rs`).
    metadata: Metadata,
    recovery: RecoveryReport,
    /// Poisoning and health: device error counters, pass-through
    /// fall-back, failed requests, forgotten lines (`health_state.rs`).
    health: HealthState,
    /// The background cleaner's state: wake-ups, write-back tracking,
    /// evacuation, mirror releases (`cleaner.rs`).
    cleaner: Cleaner,
    /// The slot store: cache device or array, where slots lie on it
    /// (`slots.rs`).
    slots: SlotStore,
    /// The I/O in flight on each device, by class, and its latency
    /// (`queues.rs`).
    queues: queues::Queues,
    /// The load balancer, if configured (`balance.rs`).
    balance: Option<balance::Balance>,
    /// Discards and zeroings served, lines they dropped (`discard.rs`).
    discard_counters: discard::DiscardCounters,
    /// ReCA, once started (`reca.rs`): every request served is shown to it.
    reca: OnceLock<Arc<reca::RecaLive>>,
    /// Sequential readahead's decisions and fills (`readahead.rs`).
    readahead: readahead::ReadaheadDriver,
    /// Ordered write-back's epochs, when it is on (`ordering.rs`).
    epochs: Option<ordering::Epochs>,
}

type DecideJob = (Segments, mpsc::Sender<Result<Plan, EngineError>>);

pub struct Engine {
    inner: Arc<Inner>,
    /// The volume `read`, `write` and `size_bytes` are about: the first one
    /// given at construction.
    default: Volume,
    lookup: Lookup,
    single: Option<Mutex<mpsc::Sender<DecideJob>>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl Engine {
    /// Builds the engine over a cache device and one backend volume, named
    /// `config.volume_name`: formats a blank cache device, or loads the cache
    /// it holds and recovers its lines (see [`InitMode`] and docs/format.md).
    pub fn new(
        config: EngineConfig,
        cache_dev: Arc<dyn BlockDevice>,
        backend: Arc<dyn BlockDevice>,
    ) -> Result<Engine, EngineError> {
        let name = config.volume_name.clone();
        Engine::with_volumes(config, cache_dev, vec![(name, backend)])
    }

    /// Builds the engine over a cache device shared by several volumes, each
    /// a name and a backend (`config.volume_name` is not used). The first is
    /// the default volume of [`Engine::read`], [`Engine::write`] and
    /// [`Engine::size_bytes`]. A volume keeps the id the cache device's
    /// volume table gives its name, so its lines are found again after a
    /// restart; see [`Engine::attach`] for volumes added later.
    pub fn with_volumes(
        config: EngineConfig,
        cache_dev: Arc<dyn BlockDevice>,
        volumes: Vec<(String, Arc<dyn BlockDevice>)>,
    ) -> Result<Engine, EngineError> {
        config.cache.validate()?;
        volumes::check_names(volumes.iter().map(|(name, _)| name.as_str()))?;
        let line_bytes = config.cache.line_size.bytes();
        let capacity = config.cache.capacity_lines;
        let shards = match config.lookup {
            Lookup::Coarse | Lookup::Single => 1,
            Lookup::Fine if config.shards > 0 => config.shards,
            Lookup::Fine => (capacity / SHARD_LINES_MIN).clamp(1, SHARDS_MAX as u64) as usize,
        };
        if shards as u64 > capacity {
            return Err(EngineError::Config(format!(
                "{shards} shards for a cache of {capacity} lines: each shard needs a line"
            )));
        }
        if config.cache.ordered_write_back && (config.array.is_some() || config.balance.is_some()) {
            return Err(EngineError::Config(
                "ordered write-back is not combined with a cache array or a load balancer".into(),
            ));
        }
        if let Some(array) = &config.array {
            let g = array.geometry();
            if g.slots() != capacity || g.line_bytes != line_bytes {
                return Err(EngineError::Config(format!(
                    "the cache array holds {} lines of {} bytes; the configuration asks for {capacity} of {line_bytes}",
                    g.slots(),
                    g.line_bytes
                )));
            }
        }
        let backends: Vec<&dyn BlockDevice> = volumes.iter().map(|(_, b)| &**b).collect();
        let opened_with = vec![
            ("write_policy".to_string(), config.cache.write_policy.to_string()),
            ("policy".to_string(), config.cache.policy.to_string()),
            ("lookup".to_string(), config.lookup.to_string()),
        ];
        let mut opened = recovery::open(
            &*cache_dev,
            &backends,
            &OpenSpec {
                line_bytes,
                slots: capacity,
                shards: shards as u32,
                persistence: config.persistence,
                init: config.init,
                volumes: volumes
                    .iter()
                    .map(|(name, backend)| (name.clone(), backend.len_bytes()))
                    .collect(),
                settings: iocache_format::SettingsRecord {
                    opened_with: opened_with.clone(),
                    ..Default::default()
                },
                clean_check_budget: config.clean_check_budget,
                rebind: config.rebind_backends,
            },
            config.array.as_deref(),
        )?;
        let data_offset = opened.writer.layout.data_offset;
        if config.cache.ordered_write_back {
            // Records will carry epochs: a version 4 device (the same
            // layout) says version 5 from this start on, so that an older
            // build refuses it rather than read epochs as damage.
            opened.superblock.format_version = iocache_format::FORMAT_VERSION;
        }
        let metadata = Metadata::new(
            config.persistence,
            config.dirty_checksums,
            config.commit_interval,
            Durability::new(MetaState::new(
                opened.superblock,
                opened.superblock_copy,
                opened.writer,
            )),
        );
        let words = config.cache.line_size.bitmap_words();
        let mut built = Vec::with_capacity(shards);
        let mut index_prefetchers = Vec::with_capacity(shards);
        let mut base_slot = 0;
        for i in 0..shards {
            let lines = capacity / shards as u64 + u64::from((i as u64) < capacity % shards as u64);
            let mut shard_config = config.cache.clone();
            shard_config.capacity_lines = lines;
            // Every slot in service while lines are restored; the size in
            // service is applied after (`resize.rs`).
            shard_config.lines_in_service = None;
            // A backend write can fail: dirty lines are cleaned by the
            // cleaner (with retries), never written back inside a request
            // whose slot reuse could not be undone.
            shard_config.inline_dirty_eviction = false;
            // The operator's cap is cache-wide: each shard takes its share.
            // On an array, each shard may also use the whole mirror pool
            // (lines are spread over shards unevenly); when the pool runs
            // out, dirty writes also go to the backend (`MirrorState::Through`).
            shard_config.max_dirty_lines = settings::shard_dirty_cap(
                config.cache.max_dirty_lines,
                config.array.as_ref().map(|a| a.dirty_cap()),
                lines,
                capacity,
            );
            let mut cache = Cache::new(shard_config)?;
            cache.count_volume_lines();
            index_prefetchers.push(cache.index_prefetcher());
            built.push(Shard {
                state: Mutex::new(ShardState {
                    cache,
                    queues: LineQueues::default(),
                    shadow: Shadow::new(
                        lines as usize,
                        words,
                        (line_bytes / SECTOR_BYTES) as u32,
                        metadata.records_slots(),
                        metadata.dirty_checksums(),
                    ),
                    poisoned: FxHashMap::default(),
                    waiters: 0,
                    ops: OpList::new(),
                    tokens: Vec::new(),
                }),
                served: Condvar::new(),
                landed: Condvar::new(),
                poisoned: AtomicU64::new(0),
                wants_cleaning: AtomicBool::new(false),
                base_slot,
            });
            base_slot += lines;
        }
        let io_engine: Option<Box<dyn IoEngine>> = match config.io {
            IoMode::Psync => None,
            IoMode::Uring => Some(Box::new(UringEngine::new(64, 2)?)),
        };
        let table = VolumeTable::new(
            volumes
                .into_iter()
                .zip(&opened.volume_ids)
                .map(|((name, backend), &id)| VolumeState::new(id, name, backend))
                .collect(),
        );
        let default = table.first();
        // Knobs changed at run time in an earlier run come back if the
        // configuration still says what it said then (settings.rs).
        let knobs = settings::Knobs::new(iocache_core::Setting::all_of(&config.cache));
        let (restored, mut dropped) = knobs.recorded(&opened.previous_settings.changes);
        dropped.extend(
            (opened.previous_settings.unreadable.iter())
                .map(|token| format!("`{token}`: not a setting this version reads")),
        );
        opened.report.restored_settings = restored.iter().map(ToString::to_string).collect();
        opened.report.dropped_settings = dropped;
        let (readahead, fills) =
            readahead::ReadaheadDriver::new(config.cache.readahead, config.cache.line_size);
        let inner = Arc::new(Inner {
            knobs: Mutex::new(knobs),
            opened_with,
            draining: AtomicBool::new(false),
            shards: built,
            index_prefetchers,
            line_bytes,
            line_shift: config.cache.line_size.shift(),
            // A gap's lines would be taken by the cleaner from writes that
            // wait for it (`ordering.rs`): no gaps under ordered write-back.
            write_back_gap_bytes: match config.cache.ordered_write_back {
                true => 0,
                false => config.write_back_gap_bytes,
            },
            volumes: RwLock::new(table),
            admin: Mutex::new(()),
            clock: Clock::new(),
            stopping: AtomicBool::new(false),
            closing: AtomicBool::new(false),
            read_latency: LatencyHistogram::default(),
            write_latency: LatencyHistogram::default(),
            metadata,
            discard_counters: Default::default(),
            recovery: opened.report,
            health: HealthState::new(),
            cleaner: Cleaner::new(),
            slots: SlotStore {
                dev: cache_dev,
                array: config.array.clone(),
                data_offset,
                io_engine,
            },
            queues: queues::Queues::default(),
            balance: config.balance.map(balance::Balance::new),
            reca: OnceLock::new(),
            readahead,
            epochs: config.cache.ordered_write_back.then(ordering::Epochs::new),
        });
        inner.restore(opened.lines, &opened.stale_dirty, &opened.unloaded_slots)?;
        inner.mark_running()?;
        // The size in service, applied here only: recorded at run time,
        // else configured (a smaller one than the device holds drops
        // lines, as at run time).
        let (recorded_size, restored): (Vec<_>, Vec<_>) =
            (restored.into_iter()).partition(|s| matches!(s, iocache_core::Setting::CacheSize(_)));
        let recorded_size = recorded_size.into_iter().find_map(|s| match s {
            iocache_core::Setting::CacheSize(bytes) => Some(bytes),
            _ => None,
        });
        if let Some(lines) = recorded_size
            .map(|bytes| bytes / line_bytes)
            .or(config.cache.lines_in_service)
        {
            // Not applied (a backend refusing the write-backs of the lines
            // that would leave): served at the size it has, said why.
            match inner.resize(lines) {
                Ok(()) => recorded_size.into_iter().for_each(|bytes| inner.note_size(bytes)),
                Err(e) => {
                    log::warn!(
                        "cache_size of {lines} lines not applied at start, the cache keeps its size: {e}"
                    )
                }
            }
        }
        inner.apply_settings(&restored)?;
        inner.persist_settings()?;
        let mut threads = Vec::new();
        let single = if config.lookup == Lookup::Single {
            let (tx, rx) = mpsc::channel::<DecideJob>();
            let decider = Arc::clone(&inner);
            threads.push(
                std::thread::Builder::new()
                    .name("iocache-lookup".into())
                    .spawn(move || {
                        for (segments, reply) in rx {
                            let _ = reply.send(decider.decide(&segments));
                        }
                    })
                    .map_err(|e| EngineError::Config(format!("cannot start the lookup thread: {e}")))?,
            );
            Some(Mutex::new(tx))
        } else {
            None
        };
        let filler = Arc::clone(&inner);
        threads.push(
            std::thread::Builder::new()
                .name("iocache-readahead".into())
                .spawn(move || filler.run_readahead(fills))
                .map_err(|e| EngineError::Config(format!("cannot start the readahead thread: {e}")))?,
        );
        let cleaner = Arc::clone(&inner);
        threads.push(
            std::thread::Builder::new()
                .name("iocache-cleaner".into())
                .spawn(move || cleaner.run_cleaner())
                .map_err(|e| EngineError::Config(format!("cannot start the cleaner thread: {e}")))?,
        );
        if inner.balance.is_some() {
            let balancer = Arc::clone(&inner);
            threads.push(
                std::thread::Builder::new()
                    .name("iocache-balance".into())
                    .spawn(move || balancer.run_balancer())
                    .map_err(|e| {
                        EngineError::Config(format!("cannot start the load balancer thread: {e}"))
                    })?,
            );
        }
        let engine = Engine {
            inner,
            default,
            lookup: config.lookup,
            single,
            threads: Mutex::new(threads),
        };
        // After a crash the members' copies of the metadata may differ:
        // the others take the one this start read.
        if let Some(array) = engine
            .inner
            .slots
            .array
            .as_ref()
            .filter(|_| !engine.inner.recovery.clean_shutdown)
        {
            array.resync_metadata()?;
        }
        // A replacement member a restart found half rebuilt is rebuilt now;
        // until it is, its slots are read elsewhere, as a failed member's.
        if let Err(e) = engine.resume_rebuild() {
            log::warn!("cache array: the rebuild of the replacement member stopped: {e}");
        }
        Ok(engine)
    }

    pub fn lookup(&self) -> Lookup {
        self.lookup
    }

    /// The default volume's size.
    pub fn size_bytes(&self) -> u64 {
        self.default.size_bytes()
    }

    /// The configured write policy (every shard has the same).
    pub fn write_policy(&self) -> WritePolicy {
        lock(&self.inner.shards[0].state).cache.write_policy()
    }

    /// The write policy in force and why (`iocache_core::mode::resolve`):
    /// the configured one, a controller's, or pass-through while the cache
    /// device is failed.
    pub fn effective_mode(&self) -> EffectiveMode {
        lock(&self.inner.shards[0].state).cache.effective_mode()
    }

    /// Reads `buf.len()` bytes at `offset` of the default volume.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), EngineError> {
        self.read_with(&self.default, offset, buf)
    }

    /// Writes `data` at `offset` of the default volume; with `fua`, durable
    /// before returning.
    pub fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), EngineError> {
        self.write_with(&self.default, offset, data, fua)
    }

    /// Reads `buf.len()` bytes at `offset` of `volume` (a handle from
    /// [`Engine::volume`]).
    pub fn read_with(&self, volume: &Volume, offset: u64, buf: &mut [u8]) -> Result<(), EngineError> {
        self.request(volume, offset, Buffer::Read(buf), false, true, None)
    }

    /// Writes `data` at `offset` of `volume`; with `fua`, durable before
    /// returning.
    pub fn write_with(
        &self,
        volume: &Volume,
        offset: u64,
        data: &[u8],
        fua: bool,
    ) -> Result<(), EngineError> {
        self.request(volume, offset, Buffer::Write(data), fua, true, None)
    }

    /// Whether a read of `length` bytes at `offset` of `volume` would now be
    /// served from the cache device alone: it spans at most
    /// [`QUICK_READ_MAX_LINES`] lines, each resident with every sector
    /// valid, in shards with no poisoned line, on a cache device that reads
    /// at memory speed ([`BlockDevice::reads_at_memory_speed`]), and no load
    /// balancer runs. A hint for a scheduler (the NBD server serves such
    /// reads on the thread that read them instead of waking another): it
    /// changes nothing, and the cache may change before the read runs,
    /// which then only takes longer. On a slower device (NVMe, an array of
    /// them) a read served inline would hold up every request behind it on
    /// its connection, so a client's hits would never overlap. Under a load
    /// balancer no read is quick either: served one at a time per
    /// connection, hits would never queue at the cache device, and the
    /// balancer, which measures that queue, would never see the cache as
    /// the bottleneck (nor could a hit it sends to the backend be quick).
    pub fn read_would_hit(&self, volume: &Volume, offset: u64, length: u64) -> bool {
        let volume = volume.state();
        let Some(end) = offset.checked_add(length) else {
            return false;
        };
        if length == 0 || end > volume.size_bytes {
            return false;
        }
        let inner = &*self.inner;
        if inner.balance.is_some() || !inner.slots.dev.reads_at_memory_speed() {
            return false;
        }
        let first = offset >> inner.line_shift;
        let last = (end - 1) >> inner.line_shift;
        if last - first >= QUICK_READ_MAX_LINES {
            return false;
        }
        let sectors_per_line = ((1u64 << inner.line_shift) / SECTOR_BYTES) as u32;
        // Lines of one span share a shard: one lock per shard met.
        let mut held: Option<(usize, MutexGuard<'_, ShardState>)> = None;
        for line_index in first..=last {
            let key = LineKey {
                volume: volume.id,
                line_index,
            };
            let index = inner.shard_of(key);
            if held.as_ref().is_none_or(|(at, _)| *at != index) {
                let shard = &inner.shards[index];
                if shard.poisoned.load(Ordering::Relaxed) != 0 {
                    return false;
                }
                // Never two shard locks at once.
                drop(held.take());
                held = Some((index, lock(&shard.state)));
            }
            let (_, state) = held.as_ref().expect("just locked");
            if state
                .cache
                .line_state(key)
                .is_none_or(|line| line.valid_sectors != sectors_per_line)
            {
                return false;
            }
        }
        true
    }

    /// One client request: decide, run, and count it (latency, the volume's
    /// counters); a write with `fua` is flushed before it returns.
    fn request(
        &self,
        volume: &Volume,
        offset: u64,
        buffer: Buffer<'_>,
        fua: bool,
        from_client: bool,
        in_place: Option<InPlace<'_>>,
    ) -> Result<(), EngineError> {
        let handle = volume;
        let volume = volume.state();
        // The request's first index entry is the first memory access of its
        // lookup and usually a miss in the CPU caches: start loading it now,
        // so the gate, the clock and the segmenting below overlap it.
        self.inner.prefetch_index(volume.id, offset);
        let _serving = volume.enter()?;
        let started_ns = self.inner.clock.now_ns();
        let (kind, length) = match &buffer {
            Buffer::Read(buf) => (IoKind::Read, buf.len() as u64),
            Buffer::Write(data) => (IoKind::Write, data.len() as u64),
        };
        let segments = self
            .inner
            .segments(volume.id, volume.size_bytes, kind, offset, length, started_ns)?;
        if let Some(reca) = self.inner.reca.get().filter(|_| from_client) {
            reca.observe(iocache_core::Request {
                volume: volume.id,
                offset_bytes: offset,
                length_bytes: length,
                kind,
                now_ns: started_ns,
                process: 0,
            });
        }
        let mut plan = Plan::default();
        self.decide(segments, &mut plan)?;
        // Time the caller of a read in place took with its bytes: not the
        // read's.
        let mut caller_took_ns = 0;
        let mut result = match buffer {
            Buffer::Read(buf) if plan.segments.iter().any(|s| s.line_origin) => {
                self.inner.run_line_fill(&mut plan, offset, buf)
            }
            Buffer::Read(buf) if in_place.is_some() => {
                let in_place = in_place.expect("checked");
                self.inner.run_in_place(&plan, buf, in_place, &mut caller_took_ns)
            }
            buffer => self.inner.run(&plan, buffer),
        };
        if fua && result.is_ok() {
            result = self.flush();
        }
        if from_client && kind == IoKind::Read && result.is_ok() {
            self.inner.read_ahead(handle.shared(), offset, length, started_ns);
        }
        if !from_client {
            // The engine's own reads (`warm_with`): counted by the core
            // (hits, misses, promotions), not as a volume's requests.
            return result;
        }
        let took = self
            .inner
            .clock
            .now_ns()
            .saturating_sub(started_ns)
            .saturating_sub(caller_took_ns);
        match kind {
            IoKind::Read => self.inner.read_latency.record(took),
            IoKind::Write => self.inner.write_latency.record(took),
        }
        volume
            .counters
            .record(kind, length, &plan.summary, took, result.is_ok());
        result
    }

    /// Makes every write completed before the call durable where the write
    /// policy keeps it: the cache device for write-back and write-only, the
    /// backend otherwise. Both are flushed, which covers a policy change.
    ///
    /// With persistent metadata this is a barrier: the records of every line
    /// changed since the last one are written (docs/format.md). With volatile
    /// metadata the cache cannot make dirty data durable, so every dirty
    /// line is written back first.
    pub fn flush(&self) -> Result<(), EngineError> {
        if let Some(epochs) = &self.inner.epochs {
            // Writes acknowledged before this FLUSH reach the backend
            // before any write decided after it.
            let _ = epochs.next();
        }
        self.inner.barrier(false)
    }

    /// Writes every dirty line back to the backend and flushes it.
    pub fn flush_all(&self) -> Result<(), EngineError> {
        self.inner.flush_all()
    }

    pub fn stats(&self) -> EngineStats {
        let mut stats = EngineStats {
            shards: self.inner.shards.len(),
            io_errors: self.inner.health.io_errors.load(Ordering::Relaxed),
            forgotten_lines: self.inner.health.forgotten_lines.load(Ordering::Relaxed),
            readahead_dropped_fills: self.inner.readahead.dropped_fills.load(Ordering::Relaxed),
            readahead_failed_fills: self.inner.readahead.failed_fills.load(Ordering::Relaxed),
            read_latency: self.inner.read_latency.percentiles(),
            write_latency: self.inner.write_latency.percentiles(),
            persistence: Some(self.inner.metadata.mode()),
            recovery: self.inner.recovery.clone(),
            barriers: self.inner.metadata.durability.barriers.load(Ordering::Relaxed),
            records_written: self
                .inner
                .metadata
                .durability
                .records_written
                .load(Ordering::Relaxed),
            intents_written: self
                .inner
                .metadata
                .durability
                .intents_written
                .load(Ordering::Relaxed),
            intent_flushes: self
                .inner
                .metadata
                .durability
                .intent_flushes
                .load(Ordering::Relaxed),
            commits: self.inner.metadata.commits(),
            block_commands: self.inner.discard_counters.read(),
            intent_log_full: self
                .inner
                .metadata
                .durability
                .intent_log_full
                .load(Ordering::Relaxed),
            cache_device_errors: self.inner.health.devices.cache_errors.load(Ordering::Relaxed),
            backend_errors: self.inner.health.devices.backend_errors.load(Ordering::Relaxed),
            failed_writebacks: self
                .inner
                .health
                .devices
                .failed_writebacks
                .load(Ordering::Relaxed),
            cache_device_failed: self.inner.health.devices.cache_failed.load(Ordering::Relaxed),
            cache_queue: self.inner.queues.cache.stats(&queues::cache_class::NAMES),
            backend_queue: self.inner.queues.backend.stats(&queues::backend_class::NAMES),
            balance: self.inner.balance.as_ref().map(|b| lock(&b.status).clone()),
            ordered: self.inner.epochs.as_ref().map(|e| e.stats()),
            ..EngineStats::default()
        };
        let mut retired = 0;
        for shard in &self.inner.shards {
            let state = lock(&shard.state);
            stats.cache.merge(state.cache.stats());
            stats.capacity_lines += state.cache.capacity_lines();
            stats.lines_in_service += state.cache.lines_in_service();
            stats.resident_lines += state.cache.resident_lines();
            stats.dirty_lines += state.cache.dirty_lines();
            retired += state.cache.retired_slots();
        }
        if let Some(array) = &self.inner.slots.array {
            let failures = array.failures();
            stats.array = Some(ArrayEngineStats {
                array: array.stats(),
                degraded: array.live_members() < array.geometry().members,
                dirty_cap: array.dirty_cap(),
                evacuated_lines: self.inner.cleaner.evacuated_lines.load(Ordering::Relaxed),
                retired_slots: retired,
                lost_lines: self.inner.cleaner.lost_lines.load(Ordering::Relaxed),
                evacuated: self.inner.cleaner.array_failures_handled.load(Ordering::Acquire) == failures,
            });
        }
        stats
    }

    /// Stops the background threads, writes back every dirty line and
    /// flushes the devices. Requests still arriving afterwards fail. See
    /// [`Engine::shutdown_within`]; this one tries for
    /// [`SHUTDOWN_WRITE_BACK_PATIENCE`].
    ///
    /// New requests fail from the start; requests already in progress are
    /// waited for (see [`Engine::shutdown_within`]).
    pub fn shutdown(&self) -> Result<(), EngineError> {
        self.shutdown_within(SHUTDOWN_WRITE_BACK_PATIENCE)
    }

    /// Shuts down in bounded time: write-back rounds are retried with
    /// back-off while they make progress or until `patience` has passed;
    /// then the metadata is written whatever happened, so dirty lines that
    /// could not be written back (a backend that is down) stay on the
    /// cache device, described by durable records, for the next start.
    /// The error then says how many remain.
    ///
    /// Requests already in progress are waited for, up to `patience`,
    /// before the device is said to be shut down cleanly: a write-through
    /// request between its backend write and its cache write would
    /// otherwise leave a clean line older than the backend, which a start
    /// after a clean shutdown loads without comparing it
    /// (`check_clean_lines` runs only after a crash). If some are still in
    /// progress then, the records are written but the superblock keeps
    /// saying `running`, so the next start treats it as a crash.
    pub fn shutdown_within(&self, patience: Duration) -> Result<(), EngineError> {
        self.inner.closing.store(true, Ordering::SeqCst);
        let _admin = lock(&self.inner.admin);
        let still_in_flight = self
            .inner
            .close_gates_and_drain(std::time::Instant::now() + patience);
        self.stop_threads();
        let deadline = std::time::Instant::now() + patience;
        // A drain thread (settings.rs) sees `stopping` after its current
        // pass: nothing of this engine may write to the device after it
        // is closed (a successor may format it).
        while self.inner.draining.load(Ordering::SeqCst) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        let mut wait = Duration::from_millis(50);
        let written_back = loop {
            match self.inner.flush_all() {
                Ok(()) => break Ok(()),
                Err(e) if std::time::Instant::now() + wait < deadline => {
                    let _ = e;
                    std::thread::sleep(wait);
                    wait = (wait * 2).min(Duration::from_secs(1));
                }
                Err(e) => break Err(e),
            }
        };
        let closed = if still_in_flight > 0 {
            log::warn!(
                "{still_in_flight} requests were still in progress {patience:?} into the shutdown: the cache is \
                 left marked as not shut down cleanly, so the next start checks its clean lines"
            );
            self.inner.barrier(false)
        } else {
            self.inner.close()
        };
        match (written_back, closed) {
            (Ok(()), closed) => closed,
            (Err(e), Ok(())) => Err(e),
            (Err(EngineError::DirtyLinesRemain { lines }), Err(close)) => {
                Err(EngineError::ShutdownIncomplete {
                    lines,
                    close: close.to_string(),
                })
            }
            (Err(e), Err(_)) => Err(e),
        }
    }

    /// Tells the engine's threads to stop and joins them: the cleaner, the
    /// lookup thread (single locking), readahead and the load balancer.
    fn stop_threads(&self) {
        self.inner.stopping.store(true, Ordering::SeqCst);
        // The cleaner would otherwise notice only at its next poll.
        self.inner.wake_cleaner();
        if let Some(single) = &self.single {
            // Closing the channel ends the lookup thread.
            drop(std::mem::replace(&mut *lock(single), mpsc::channel().0));
        }
        self.inner.readahead.close();
        for handle in lock(&self.threads).drain(..) {
            // The load balancer sleeps parked until its next interval.
            handle.thread().unpark();
            let _ = handle.join();
        }
    }

    fn decide(&self, segments: Segments, plan: &mut Plan) -> Result<(), EngineError> {
        match &self.single {
            None => self.inner.decide_into(&segments, plan),
            Some(sender) => {
                let (tx, rx) = mpsc::channel();
                lock(sender)
                    .send((segments, tx))
                    .map_err(|_| EngineError::Shutdown)?;
                *plan = rx.recv().map_err(|_| EngineError::Shutdown)??;
                Ok(())
            }
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.inner.closing.store(true, Ordering::SeqCst);
        self.stop_threads();
    }
}

/// How many of `places` (device offset, buffer offset, length, and a kind
/// that must not change), from the first, follow one another both on the
/// device and in the buffer, at most 1 MiB in all (a bounded I/O, like a
/// client's): one device read or write can do them (1: none can join).
fn contiguous_run_len(mut places: impl Iterator<Item = Option<(u64, u64, u64, bool)>>) -> usize {
    let Some(Some(mut at)) = places.next() else {
        return 1;
    };
    let mut n = 1;
    let mut bytes = at.2;
    for next in places {
        let Some(next) = next else { break };
        if next.0 != at.0 + at.2 || next.1 != at.1 + at.2 || next.3 != at.3 || bytes + next.2 > 1 << 20 {
            break;
        }
        bytes += next.2;
        at = next;
        n += 1;
    }
    n
}

/// Whether the core holds dirty sectors in `slot`.
fn slot_is_dirty(state: &ShardState, slot: SlotId) -> bool {
    state
        .cache
        .slot_snapshot(slot)
        .is_some_and(|snap| bitmap::any(snap.dirty))
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding a shard lock leaves its state as consistent as the
    // core keeps it between calls; keep serving rather than poison everything.
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn mix(mut x: u64) -> u64 {
    x ^= x >> 30;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

impl Inner {
    fn now_ns(&self) -> u64 {
        self.clock.now_ns()
    }

    fn shard_of(&self, key: LineKey) -> usize {
        if self.shards.len() == 1 {
            return 0;
        }
        let span = (u64::from(key.volume) << 48) ^ (key.line_index / SHARD_SPAN_LINES);
        (mix(span) % self.shards.len() as u64) as usize
    }

    /// Starts loading the index entry of the line at `offset_bytes` of
    /// `volume` (a hint: any offset is harmless).
    #[inline]
    fn prefetch_index(&self, volume: VolumeId, offset_bytes: u64) {
        let key = self.key_of(volume, offset_bytes);
        self.index_prefetchers[self.shard_of(key)].prefetch(&key);
    }

    fn key_of(&self, volume: u32, offset_bytes: u64) -> LineKey {
        LineKey {
            volume,
            line_index: offset_bytes >> self.line_shift,
        }
    }
}

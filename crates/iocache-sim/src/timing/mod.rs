//! Device timing for the simulator: how long the cache's decisions take on
//! real devices, and what latency and throughput clients would see.
//!
//! The policy core says *what* I/O each request causes (its [`Op`] list);
//! this module says *when* that I/O runs. It models the cache device and the
//! backend as queueing servers ([`device`]) or, for an SSD's internal DRAM
//! write buffer, as flash with channels, chips, an FTL and garbage collection
//! ([`flash`]), or as a disk head whose cost depends on the seek
//! ([`hdd`]), turns each request's ops into device I/Os with the
//! dependencies between them, runs them in simulated time ([`engine`]), and
//! reports latency percentiles, throughput, device utilization and queue
//! lengths, overall and as a time series ([`report`], [`series`]).
//!
//! Use:
//!
//! ```
//! use iocache_core::{Cache, CacheConfig, IoKind, LineSize, OpList, PolicySpec, Request};
//! use iocache_sim::timing::{preset, ArrivalMode, Replay, TimingConfig, TimingModel};
//!
//! let mut cache = Cache::new(CacheConfig::new(1024, LineSize::new(4096).unwrap(), PolicySpec::lru())).unwrap();
//! let mut model = TimingModel::new(&TimingConfig {
//!     cache: preset("optane").unwrap(),
//!     backend: preset("ssd-raid5").unwrap(),
//!     line_bytes: 4096,
//!     series_interval_ns: None,
//! })
//! .unwrap();
//! let mut replay = Replay::new(ArrivalMode::Open { speed: 20.0 }).unwrap();
//! let mut ops = OpList::new();
//! for (i, trace_ns) in [0u64, 1_000_000, 2_000_000].into_iter().enumerate() {
//!     let now = replay.next_arrival(&mut model, trace_ns);
//!     let request = Request::read(0, 4096 * (i as u64 % 2), 4096, now);
//!     cache.access(&request, &mut ops).unwrap();
//!     model.submit(now, IoKind::Read, ops.ops());
//! }
//! let report = model.finish();
//! assert_eq!(report.requests, 3);
//! assert!(report.read.mean_ns > 6_000.0); // misses went to the backend
//! ```
//!
//! [`Op`]: iocache_core::Op

pub mod device;
pub mod engine;
pub mod flash;
pub mod hdd;
pub mod histogram;
pub mod presets;
pub mod queues;
pub mod replay;
pub mod report;
pub mod rng;
pub mod series;

pub use device::{DeviceModel, DeviceSpec, Dir, OpCost, QueueSpec};
pub use engine::{Completion, RequestId, TimingConfig, TimingModel};
pub use flash::FlashSpec;
pub use hdd::HddSpec;
pub use histogram::{Histogram, LatencySummary};
pub use presets::{parse_device, parse_duration_ns, preset, Preset, PRESETS};
pub use queues::{DeviceQueue, QueueTracker};
pub use replay::{ArrivalMode, Replay};
pub use report::{DeviceReport, TimingReport};
pub use series::SeriesRow;

/// Invalid timing-model parameters.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum TimingError {
    #[error("timing: {0}")]
    BadParameter(String),
}

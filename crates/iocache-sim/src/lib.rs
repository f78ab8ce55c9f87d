//! Trace-driven simulation of iocache's policy core.
//!
//! The simulator feeds trace records to [`iocache_core::Cache`] instances, the
//! same code the real engine runs, and reports what they decided: hit ratios,
//! promotions, evictions and the bytes each device would move.

pub mod adapt;
pub mod allocate;
pub mod burst;
mod error;
pub mod huge_alloc;
pub mod mini;
pub mod mrc;
pub mod reca;
pub mod report;
mod run;
pub mod spec;
pub mod tally;
pub mod timing;
pub mod trace_stats;
pub mod workload;

pub use adapt::{AdaptReport, AdaptRow, AdaptSpec, Adapter};
pub use error::SimError;
pub use run::{
    request_of, simulate, simulate_each, Reconfigure, RestartKeep, Restarts, RunResult, SimOptions,
    SimReport, TimingSetup, Trigger, BATCH_REQUESTS,
};
pub use spec::{combinations, CacheSettings, CacheSize, RunSpec, Warmup};
pub use tally::{Counts, SeriesWindow, TallyOptions, VolumeResult};

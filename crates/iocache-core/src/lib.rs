//! The policy core of iocache: it decides hits, promotion, replacement, write
//! policy and flushing, and does nothing else.
//!
//! It performs no I/O, spawns no thread and reads no clock: callers pass time
//! in (`now_ns`) and carry out the [`Op`]s it returns. The simulator and the
//! real engine both drive this crate, so a simulated decision and a real one
//! are the same code.
//!
//! ```
//! use iocache_core::{Cache, CacheConfig, LineSize, OpList, PolicySpec, Request};
//! let config = CacheConfig::new(1024, LineSize::new(4096).unwrap(), PolicySpec::lru());
//! let mut cache = Cache::new(config).unwrap();
//! let mut ops = OpList::new();
//! let first = cache.access(&Request::read(0, 8192, 4096, 0), &mut ops).unwrap();
//! assert_eq!(first.misses, 1); // read from the backend, then filled into the cache
//! let again = cache.access(&Request::read(0, 8192, 4096, 1), &mut ops).unwrap();
//! assert_eq!(again.full_hits, 1);
//! ```

/// `Display` for a type with a `&'static str` name method (`name`,
/// `short_name`): it prints that name, the text logs and reports show and
/// the type's `FromStr`, where it has one, reads back.
macro_rules! display_by_name {
    ($type:ty, $name:ident) => {
        impl std::fmt::Display for $type {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.$name())
            }
        }
    };
}

pub mod addr;
pub mod balance;
pub mod bitmap;
mod cache;
pub mod cleaning;
pub mod config;
mod error;
pub mod fasthash;
pub mod index;
pub mod mode;
pub mod ops;
pub mod policy;
pub mod prefetch;
pub mod promotion;
pub mod readahead;
pub mod reca;
pub mod seq_cutoff;
pub mod setting;
pub mod stats;
#[cfg(test)]
mod test_util;
pub mod units;

pub use addr::{
    split_request, split_request_keys, IoKind, LineKey, LinePart, LineSize, Request, SlotId, VolumeId,
    SECTOR_BYTES,
};
pub use balance::AccessHints;
pub use cache::{
    AccessSummary, Cache, DiscardedLines, FlushToken, LineOutcome, LineState, OrderedWait, ProcessSettings,
    ResizeProgress, RestoredLine, SlotSnapshot, VolumeLines, RESIZE_STEP_LINES,
};
pub use cleaning::CleaningPolicy;
pub use config::{CacheConfig, Fill, FlushOrder, Promotion, WritePolicy};
pub use error::CoreError;
pub use mode::{EffectiveMode, ModeCause, ModeSettings};
pub use ops::{Op, OpList};
pub use policy::{PolicySpec, ReplacementPolicy};
pub use readahead::{Readahead, ReadaheadFeedback, Readaheader};
pub use seq_cutoff::SeqCutoff;
pub use setting::Setting;
pub use stats::CacheStats;

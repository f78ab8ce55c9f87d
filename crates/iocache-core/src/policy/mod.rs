//! Replacement policies behind one trait, and their names for configuration.
//!
//! A policy sees the lines the cache admits, keyed by the slot that holds
//! them, and chooses victims. It owns its own queues and any history (ghost
//! entries) it needs; the cache owns the data layout and the index.

mod arc;
pub mod list;
mod lru;

use std::fmt;
use std::str::FromStr;

pub use self::arc::Arc;
pub use self::lru::Lru;
use crate::addr::{LineKey, SlotId};
use crate::error::CoreError;

/// The decisions a replacement policy makes. Calls for one admission come in
/// the order `on_miss` (which may name a victim), then `on_insert`.
pub trait ReplacementPolicy: Send {
    /// The name it is selected by.
    fn name(&self) -> &'static str;

    /// A resident line was accessed.
    fn on_hit(&mut self, slot: SlotId, now_ns: u64);

    /// `key` is about to be admitted. When `need_victim` is true the cache has no
    /// free slot and the policy must return a resident slot to evict, after
    /// forgetting it; otherwise it returns `None`. Policies with history (ARC's
    /// ghosts) update it here.
    fn on_miss(&mut self, key: LineKey, need_victim: bool, now_ns: u64) -> Option<SlotId>;

    /// `key` now lives in `slot`.
    fn on_insert(&mut self, slot: SlotId, key: LineKey, now_ns: u64);

    /// The line in `slot` was dropped by the cache (invalidation), not chosen as a victim.
    fn on_remove(&mut self, slot: SlotId);

    /// The slots this policy would most likely evict next and after that, if it
    /// can tell cheaply. A hint only (used to prefetch metadata); it may be wrong.
    fn next_victims(&self) -> [Option<SlotId>; 2] {
        [None, None]
    }

    /// Policies that decide admission themselves (SMQ, LARC) answer here; `None`
    /// leaves the decision to the cache's promotion policy.
    fn admit(&mut self, _key: LineKey, _now_ns: u64) -> Option<bool> {
        None
    }
}

/// A replacement policy chosen by name, with its parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PolicySpec {
    Lru,
    Arc,
}

impl PolicySpec {
    pub const NAMES: &'static str = "lru, arc";

    pub fn build(self, capacity_lines: usize) -> Box<dyn ReplacementPolicy> {
        match self {
            PolicySpec::Lru => Box::new(Lru::new(capacity_lines)),
            PolicySpec::Arc => Box::new(Arc::new(capacity_lines)),
        }
    }
}

impl fmt::Display for PolicySpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PolicySpec::Lru => "lru",
            PolicySpec::Arc => "arc",
        })
    }
}

impl FromStr for PolicySpec {
    type Err = CoreError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "lru" => Ok(PolicySpec::Lru),
            "arc" => Ok(PolicySpec::Arc),
            _ => Err(CoreError::UnknownName {
                what: "replacement policy",
                given: s.to_string(),
                expected: Self::NAMES,
            }),
        }
    }
}

//! Replacement policies behind one trait, and their names for configuration.
//!
//! A policy sees the lines the cache admits, keyed by the slot that holds
//! them, and chooses victims. It owns its own queues and any history (ghost
//! entries) it needs; the cache owns the data layout and the index.

mod access;
mod active;
mod arc;
mod bplru;
mod cflru;
mod clock;
mod fifo;
mod ghost;
mod groups;
pub(crate) mod history;
mod larc;
mod lfu;
pub mod list;
mod lru;
mod probation;
mod reqblock;
mod s3fifo;
mod sieve;
pub(crate) mod slot_heap;
mod smq;
#[cfg(test)]
pub(crate) mod testing;
mod twoq;
mod vbbms;

use std::fmt;
use std::str::FromStr;

pub use self::access::Access;
pub(crate) use self::active::{forward, ActivePolicy};
pub use self::arc::Arc;
pub use self::bplru::Bplru;
pub use self::cflru::Cflru;
pub use self::clock::Clock;
pub use self::fifo::Fifo;
pub use self::larc::Larc;
pub use self::lfu::Lfu;
pub use self::lru::Lru;
pub use self::reqblock::{BlockView, ReqBlock, ReqList};
pub use self::s3fifo::S3Fifo;
pub use self::sieve::Sieve;
pub use self::smq::{ClockMode, Smq, SmqParams};
pub use self::twoq::TwoQ;
pub use self::vbbms::{Region, Vbbms};
use crate::addr::{IoKind, LineKey, LineSize, Request, SlotId};
use crate::error::CoreError;

/// What the cache tells a policy about the access in progress.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AccessInfo {
    /// The caller's clock.
    pub now_ns: u64,
    pub kind: IoKind,
    /// Numbers requests in arrival order; equal for every line of one request.
    pub request_seq: u64,
    /// How many lines the whole request touches.
    pub request_lines: u32,
    /// Whether the line holds dirty data after this access (for `on_hit` and
    /// `on_insert`; false in `on_miss`).
    pub dirty: bool,
}

impl AccessInfo {
    /// An access for tests and simple drivers: a one-line read at `now_ns`.
    pub fn read_at(now_ns: u64) -> Self {
        AccessInfo {
            now_ns,
            kind: IoKind::Read,
            request_seq: now_ns,
            request_lines: 1,
            dirty: false,
        }
    }
}

/// The decisions a replacement policy makes. Calls for one admission come in
/// the order `on_miss` (which may name victims), then `on_insert`.
pub trait ReplacementPolicy: Send {
    /// The name it is selected by.
    fn name(&self) -> &'static str;

    /// A resident line was accessed (after the access changed its state).
    fn on_hit(&mut self, slot: SlotId, info: &AccessInfo);

    /// `key` is about to be admitted. When `need_victim` is true the cache has
    /// no free slot and the policy must push at least one resident slot to
    /// evict into `victims`, after forgetting them; block-level policies may
    /// push several (one eviction batch). Pushing none when a victim is needed
    /// makes the cache bypass this line. Policies with history (ARC's ghosts)
    /// update it here.
    fn on_miss(&mut self, key: LineKey, need_victim: bool, info: &AccessInfo, victims: &mut Vec<SlotId>);

    /// [`ReplacementPolicy::on_miss`] for a cache that takes one victim
    /// directly when there is only one: a policy that evicts one line at a
    /// time returns it (`Some`, with `victims` left alone) after the very
    /// steps `on_miss` takes; any other answer goes through `victims` as
    /// `on_miss` gives it, and `None` is returned (the default).
    #[inline]
    fn on_miss_single(
        &mut self,
        key: LineKey,
        need_victim: bool,
        info: &AccessInfo,
        victims: &mut Vec<SlotId>,
    ) -> Option<SlotId> {
        self.on_miss(key, need_victim, info, victims);
        None
    }

    /// `key` now lives in `slot`.
    fn on_insert(&mut self, slot: SlotId, key: LineKey, info: &AccessInfo);

    /// `slot`, holding `key`, a victim this policy just named for the miss
    /// in progress, is handed back: it is dirty and the cache keeps dirty
    /// lines for its cleaner (`inline_dirty_eviction = false`). Take it
    /// back as resident, undoing what naming it did (a ghost made of its
    /// key), without touching what the miss decided for the incoming line.
    /// The default is [`ReplacementPolicy::on_insert`], right for policies
    /// whose miss keeps nothing for the incoming line and whose victims
    /// leave no trace.
    fn on_victim_kept(&mut self, slot: SlotId, key: LineKey, info: &AccessInfo) {
        self.on_insert(slot, key, info);
    }

    /// The miss of `key` in progress asks again for victims (those named
    /// before were dirty and kept): name others, without treating `key`
    /// as missed a second time. The default is
    /// [`ReplacementPolicy::on_miss`], right for policies whose miss does
    /// nothing with the key besides naming victims.
    fn on_miss_again(&mut self, key: LineKey, info: &AccessInfo, victims: &mut Vec<SlotId>) {
        self.on_miss(key, true, info, victims);
    }

    /// The line in `slot` was dropped by the cache (invalidation), not chosen as a victim.
    fn on_remove(&mut self, slot: SlotId);

    /// The resident line in `slot` became clean (flushed, or its dirty sectors overwritten
    /// by a write that went to the backend).
    fn on_clean(&mut self, _slot: SlotId) {}

    /// Policies that decide admission themselves (SMQ, LARC) answer here; `None`
    /// leaves the decision to the cache's promotion policy.
    fn admit(&mut self, _key: LineKey, _info: &AccessInfo) -> Option<bool> {
        None
    }

    /// Two slots this policy will probably evict soon, if it can tell
    /// cheaply: one a few evictions away and one further on (policies that
    /// walk their queues ahead, `list::TailLookahead`, give about 4 and up
    /// to 8 evictions away), or the next two. A hint only (used to
    /// prefetch metadata); it may be wrong.
    fn next_victims(&self) -> [Option<SlotId>; 2] {
        [None, None]
    }

    /// A lookup is about to find `slot` (its index entry matched): start
    /// loading what [`ReplacementPolicy::on_hit`] will touch, so that load
    /// overlaps the cache's own read of the slot. A hint only.
    #[inline]
    fn prefetch_hit(&self, _slot: SlotId) {}

    /// A line whose key has index hash `hash` ([`crate::index::hash_of`])
    /// may soon be admitted, or evicted: start loading what
    /// [`ReplacementPolicy::on_miss`] would touch for it (a ghost list's
    /// entry for its key, say). A hint only.
    #[inline]
    fn prefetch_key(&self, _hash: u32) {}

    /// A later step of [`ReplacementPolicy::prefetch_key`] for a line
    /// that will probably miss (the cache's index holds no entry of its
    /// hash), issued once what `prefetch_key` loaded has had time to
    /// arrive: read it and load what it names (a ghost entry's key, say).
    /// A hint only.
    #[inline]
    fn prefetch_miss(&self, _hash: u32) {}

    /// Counters of the policy's own (for example BPLRU's padding pages), by
    /// name; reported beside the cache's statistics.
    fn counters(&self) -> Vec<(&'static str, u64)> {
        Vec::new()
    }

    /// Levels of the policy's own structures now (for example Req-block's
    /// pages per list, BPLRU's blocks), by name: they go up and down.
    fn gauges(&self) -> Vec<(&'static str, u64)> {
        Vec::new()
    }

    /// A request arrives, before any of its lines is looked up, with the
    /// cache's line size. Policies that characterise whole requests (ReCA)
    /// look here.
    fn on_request(&mut self, _request: &Request, _line: LineSize, _info: &AccessInfo) {}

    /// The cache now has `lines` lines in service (resized, at most the
    /// capacity the policy was built for): sizes the policy keeps as
    /// shares of the cache follow (ARC's target, S3-FIFO's small queue and
    /// ghosts, 2Q's A1in and A1out, LARC's ghost queue). The default keeps
    /// none.
    fn set_lines_in_service(&mut self, _lines: usize) {}

    /// New parameters for this policy, taken in place without losing its
    /// state: `Ok(true)` when taken, `Ok(false)` when the cache must build
    /// a new policy instead (the default).
    fn reconfigure(&mut self, _params: &PolicyParams) -> Result<bool, CoreError> {
        Ok(false)
    }

    /// Parameters for the accesses of one process (with `None`, withdrawn):
    /// a controller characterizing each process apart sets them
    /// (`Cache::set_process_settings`). `Ok(true)` when taken, `Ok(false)`
    /// when the policy has no per-process parameters (the default: the
    /// process's accesses count as everyone's).
    fn set_process_params(
        &mut self,
        _process: u32,
        _params: Option<&PolicyParams>,
    ) -> Result<bool, CoreError> {
        Ok(false)
    }
}

/// The miss methods of a policy that evicts one line at a time, for its
/// `impl ReplacementPolicy`: both take the victim from the type's own
/// `fn victim_for(&mut self, key: LineKey, need_victim: bool) -> Option<SlotId>`
/// (`on_miss` pushes it, `on_miss_single` returns it), so the two answer
/// alike.
macro_rules! one_victim_per_miss {
    () => {
        #[inline(always)]
        fn on_miss(
            &mut self,
            key: LineKey,
            need_victim: bool,
            _info: &AccessInfo,
            victims: &mut Vec<SlotId>,
        ) {
            victims.extend(self.victim_for(key, need_victim));
        }

        #[inline(always)]
        fn on_miss_single(
            &mut self,
            key: LineKey,
            need_victim: bool,
            _info: &AccessInfo,
            _victims: &mut Vec<SlotId>,
        ) -> Option<SlotId> {
            self.victim_for(key, need_victim)
        }
    };
}
use one_victim_per_miss;

/// Parameters given after a policy's name: `s3fifo:small=0.1:ghost=0.9`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PolicyParams {
    pairs: Vec<(String, String)>,
}

impl PolicyParams {
    /// Whether no parameter was given.
    pub fn is_empty(&self) -> bool {
        self.pairs.is_empty()
    }

    /// A number parameter, `default` when absent; must lie in `range`.
    pub fn f64_or(
        &self,
        name: &str,
        default: f64,
        range: std::ops::RangeInclusive<f64>,
    ) -> Result<f64, CoreError> {
        self.parsed_or(name, default, range, "a number")
    }

    /// An integer parameter, `default` when absent; must lie in `range`.
    pub fn u64_or(
        &self,
        name: &str,
        default: u64,
        range: std::ops::RangeInclusive<u64>,
    ) -> Result<u64, CoreError> {
        self.parsed_or(name, default, range, "an integer")
    }

    /// A parameter parsed as `T`, `default` when absent; must lie in
    /// `range` (`what` names the kind of value in the error).
    fn parsed_or<T: FromStr + PartialOrd + fmt::Display>(
        &self,
        name: &str,
        default: T,
        range: std::ops::RangeInclusive<T>,
        what: &str,
    ) -> Result<T, CoreError> {
        let Some(text) = self.get(name) else {
            return Ok(default);
        };
        match text.parse::<T>() {
            Ok(v) if range.contains(&v) => Ok(v),
            _ => Err(self.bad(
                name,
                text,
                &format!("{what} from {} to {}", range.start(), range.end()),
            )),
        }
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        self.pairs
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    fn bad(&self, name: &str, value: &str, expected: &str) -> CoreError {
        CoreError::BadParameter {
            given: format!("{name}={value}"),
            reason: format!("`{name}` must be {expected}"),
        }
    }
}

/// ⌊fraction × lines⌋ for sizing a policy's queues, immune to the last-bit
/// error of products like 0.1 × 30 = 2.9999999999999996.
pub(crate) fn lines_of(fraction: f64, lines: usize) -> usize {
    (fraction * lines as f64 + 1e-9) as usize
}

/// Builds a policy for a cache of the given number of lines, checking its parameters.
pub type PolicyBuilder = fn(&PolicyParams, usize) -> Result<Box<dyn ReplacementPolicy>, CoreError>;

/// One selectable policy: its name, accepted parameters and constructor.
pub struct PolicyEntry {
    pub name: &'static str,
    /// Parameter names it accepts (anything else is rejected).
    pub params: &'static [&'static str],
    /// One line for `--help` and documentation.
    pub summary: &'static str,
    pub build: PolicyBuilder,
}

/// A [`PolicyEntry`] for a policy built by `new(lines)` when it takes no
/// parameters, or else by `from_params(params, lines)`, which checks them.
macro_rules! entry {
    ($name:literal, $summary:expr, $policy:ty) => {
        PolicyEntry {
            name: $name,
            params: &[],
            summary: $summary,
            build: |_, lines| Ok(Box::new(<$policy>::new(lines))),
        }
    };
    ($name:literal, $params:expr, $summary:expr, $policy:ty) => {
        PolicyEntry {
            name: $name,
            params: $params,
            summary: $summary,
            build: |p, lines| Ok(Box::new(<$policy>::from_params(p, lines)?)),
        }
    };
}

/// Every replacement policy, by name.
pub static POLICIES: &[PolicyEntry] = &[
    entry!("lru", "least recently used", Lru),
    entry!(
        "arc",
        "Adaptive Replacement Cache (Megiddo & Modha, FAST'03)",
        Arc
    ),
    entry!("fifo", "first in, first out", Fifo),
    entry!("clock", "CLOCK / second chance (Corbató, 1968)", Clock),
    entry!(
        "lfu",
        "least frequently used among resident lines, O(1) (Shah, Mitra & Matani, 2010)",
        Lfu
    ),
    entry!(
        "2q",
        &["kin", "kout"],
        "2Q, full version (Johnson & Shasha, VLDB'94); kin=0.25 kout=0.5 of the cache",
        TwoQ
    ),
    entry!("sieve", "SIEVE (Zhang et al., NSDI'24)", Sieve),
    entry!(
        "s3fifo",
        &["small", "threshold", "ghost"],
        "S3-FIFO (Yang et al., SOSP'23); small=0.1 threshold=1, ghost as large as M",
        S3Fifo
    ),
    PolicyEntry {
        name: "smq",
        params: smq::SMQ_PARAMS,
        summary: "stochastic multiqueue with hotspot admission (Linux dm-cache's default)",
        build: |params, lines| {
            Ok(Box::new(Smq::with_params(
                lines,
                SmqParams::from_params(params)?,
            )?))
        },
    },
    entry!(
        "larc",
        larc::LARC_PARAMS,
        "Lazy Adaptive Replacement Cache: admit on the second miss (Huang et al., MSST'13/TOS'16)",
        Larc
    ),
    entry!(
        "access",
        &["history", "gate"],
        "access-count baseline of ReCA (TPDS'18); history=64 x the cache, gate=1",
        Access
    ),
    entry!(
        "reca",
        crate::reca::policy::RECA_PARAMS,
        "ReCA's priority admission and eviction (TPDS'18 Algorithm 1); evict=priority|lru|priority_lru",
        crate::reca::RecaPolicy
    ),
    entry!(
        "cflru",
        &["window"],
        "Clean-First LRU (Park et al., CASES'06): clean pages first in the LRU window",
        Cflru
    ),
    entry!(
        "bplru",
        &["block_pages"],
        "Block Padding LRU (Kim & Ahn, FAST'08): flash-block LRU, padding, LRU compensation",
        Bplru
    ),
    entry!(
        "vbbms",
        &["random", "random_vb", "seq_vb", "seq_threshold"],
        "VBBMS (Du et al., TCE'19): random/sequential regions of virtual blocks, LRU and FIFO",
        Vbbms
    ),
    entry!(
        "reqblock",
        &["delta"],
        "Req-block (Lin et al., ICPP'22): request blocks on IRL/SRL/DRL, Freq-based batch eviction",
        ReqBlock
    ),
];

/// A replacement policy chosen by name, with its parameters.
#[derive(Clone)]
pub struct PolicySpec {
    entry: &'static PolicyEntry,
    params: PolicyParams,
}

impl PartialEq for PolicySpec {
    fn eq(&self, other: &Self) -> bool {
        self.entry.name == other.entry.name && self.params == other.params
    }
}

impl fmt::Debug for PolicySpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PolicySpec({self})")
    }
}

impl PolicySpec {
    pub fn lru() -> Self {
        "lru".parse().expect("lru is registered")
    }

    pub fn arc() -> Self {
        "arc".parse().expect("arc is registered")
    }

    pub fn name(&self) -> &'static str {
        self.entry.name
    }

    pub fn params(&self) -> &PolicyParams {
        &self.params
    }

    /// The names accepted by `FromStr`, comma separated.
    pub fn names() -> String {
        POLICIES.iter().map(|e| e.name).collect::<Vec<_>>().join(", ")
    }

    /// Builds the policy for a cache of `capacity_lines` (parameters were checked
    /// when parsed, but a policy may still refuse a capacity).
    pub fn build(&self, capacity_lines: usize) -> Result<Box<dyn ReplacementPolicy>, CoreError> {
        (self.entry.build)(&self.params, capacity_lines)
    }
}

impl fmt::Display for PolicySpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.entry.name)?;
        for (k, v) in &self.params.pairs {
            write!(f, ":{k}={v}")?;
        }
        Ok(())
    }
}

impl FromStr for PolicySpec {
    type Err = CoreError;
    /// `name` or `name:key=value[:key=value...]`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut parts = s.trim().split(':');
        let name = parts.next().unwrap_or("").to_ascii_lowercase();
        let Some(entry) = POLICIES.iter().find(|e| e.name == name) else {
            return Err(CoreError::UnknownPolicy {
                given: s.to_string(),
                expected: Self::names(),
            });
        };
        let mut params = PolicyParams::default();
        for part in parts {
            let Some((key, value)) = part.split_once('=') else {
                return Err(CoreError::BadParameter {
                    given: s.to_string(),
                    reason: format!("`{part}` is not key=value"),
                });
            };
            if !entry.params.contains(&key) {
                let accepted = if entry.params.is_empty() {
                    "none".to_string()
                } else {
                    entry.params.join(", ")
                };
                return Err(CoreError::BadParameter {
                    given: s.to_string(),
                    reason: format!("{} has no parameter `{key}` (accepted: {accepted})", entry.name),
                });
            }
            if params.get(key).is_some() {
                return Err(CoreError::BadParameter {
                    given: s.to_string(),
                    reason: format!("`{key}` is given twice"),
                });
            }
            params.pairs.push((key.to_string(), value.to_string()));
        }
        // Validate the values once, on the smallest cache.
        (entry.build)(&params, 1)?;
        Ok(PolicySpec { entry, params })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::testing::key;

    #[test]
    fn names_and_parameters_parse_and_print() {
        assert_eq!("LRU".parse::<PolicySpec>().unwrap().to_string(), "lru");
        let err = "mru".parse::<PolicySpec>().unwrap_err().to_string();
        assert!(
            err.contains("mru") && err.contains("lru") && err.contains("arc"),
            "{err}"
        );
        let err = "lru:size=3".parse::<PolicySpec>().unwrap_err().to_string();
        assert!(err.contains("no parameter `size`"), "{err}");
        let err = "2q:kin=0.1:kin=0.2"
            .parse::<PolicySpec>()
            .unwrap_err()
            .to_string();
        assert!(err.contains("twice"), "{err}");
        let err = "arc:oops".parse::<PolicySpec>().unwrap_err().to_string();
        assert!(err.contains("key=value"), "{err}");
    }

    #[test]
    fn every_registered_policy_survives_a_one_line_cache() {
        for entry in POLICIES {
            let mut policy = (entry.build)(&PolicyParams::default(), 1).unwrap();
            let info = AccessInfo::read_at(0);
            let mut victims = Vec::new();
            policy.on_miss(key(0), false, &info, &mut victims);
            assert!(victims.is_empty(), "{}", entry.name);
            policy.on_insert(0, key(0), &info);
            policy.on_hit(0, &info);
            for i in 1..5 {
                victims.clear();
                policy.on_miss(key(i), true, &info, &mut victims);
                if victims.is_empty() {
                    continue; // the policy bypassed this line
                }
                assert_eq!(victims, vec![0], "{}", entry.name);
                policy.on_insert(0, key(i), &info);
            }
        }
    }
}

//! The replacement policy a `Cache` holds, with the most used policies (LRU,
//! ARC, FIFO, CLOCK, 2Q and S3-FIFO) held as their own types (boxed, so that
//! taking the policy out moves a pointer) so their per-access calls are
//! direct and can be inlined into the cache's hot loop; every other policy
//! stays behind the trait object the registry builds.
//!
//! The cache's counting read path takes the policy out (leaving
//! [`ActivePolicy::Vacant`] for the duration) and is compiled once per
//! policy type, so that within it each call reaches the policy directly.
//!
//! This changes no decision: the policies held here are built exactly as
//! the registry builds them (`Lru::new`, `Arc::new`, `Fifo::new` and
//! `Clock::new` take no parameters; `TwoQ::from_params` and
//! `S3Fifo::from_params` are the registry's builders), and every trait call
//! is forwarded unchanged.

use super::{AccessInfo, Arc, Clock, Fifo, Lru, PolicyParams, PolicySpec, ReplacementPolicy, S3Fifo, TwoQ};
use crate::addr::{LineKey, LineSize, Request, SlotId};
use crate::error::CoreError;

pub(crate) enum ActivePolicy {
    Lru(Box<Lru>),
    Arc(Box<Arc>),
    Fifo(Box<Fifo>),
    Clock(Box<Clock>),
    TwoQ(Box<TwoQ>),
    S3Fifo(Box<S3Fifo>),
    Other(Box<dyn ReplacementPolicy>),
    /// No policy: only while the cache has taken its policy out for a
    /// path compiled for the policy's own type (see `Cache::try_admit`).
    Vacant,
}

impl ActivePolicy {
    /// Takes the policy out, leaving [`ActivePolicy::Vacant`] until
    /// [`ActivePolicy::put_back`].
    #[inline(always)]
    pub(crate) fn take_out(&mut self) -> ActivePolicy {
        std::mem::replace(self, ActivePolicy::Vacant)
    }

    /// Puts back the policy [`ActivePolicy::take_out`] took, over the
    /// vacancy it left (which has nothing to drop: not dropping it saves
    /// the call that a plain assignment makes per request).
    #[inline(always)]
    pub(crate) fn put_back(&mut self, held: ActivePolicy) {
        let vacant = std::mem::replace(self, held);
        assert!(
            matches!(vacant, ActivePolicy::Vacant),
            "a policy was put back over another"
        );
        std::mem::forget(vacant);
    }

    /// Builds `spec`'s policy for `capacity_lines` lines.
    pub(crate) fn build(spec: &PolicySpec, capacity_lines: usize) -> Result<ActivePolicy, CoreError> {
        let no_params = spec.params().is_empty();
        Ok(match spec.name() {
            "lru" if no_params => ActivePolicy::Lru(Box::new(Lru::new(capacity_lines))),
            "arc" if no_params => ActivePolicy::Arc(Box::new(Arc::new(capacity_lines))),
            "fifo" if no_params => ActivePolicy::Fifo(Box::new(Fifo::new(capacity_lines))),
            "clock" if no_params => ActivePolicy::Clock(Box::new(Clock::new(capacity_lines))),
            "2q" => ActivePolicy::TwoQ(Box::new(TwoQ::from_params(spec.params(), capacity_lines)?)),
            "s3fifo" => ActivePolicy::S3Fifo(Box::new(S3Fifo::from_params(spec.params(), capacity_lines)?)),
            _ => ActivePolicy::Other(spec.build(capacity_lines)?),
        })
    }
}

/// Forwards a call to whichever policy is held, compiled once per held
/// type (the cache's counting read path uses it too).
macro_rules! forward {
    ($self:expr, $p:ident => $call:expr) => {
        match $self {
            ActivePolicy::Lru($p) => $call,
            ActivePolicy::Arc($p) => $call,
            ActivePolicy::Fifo($p) => $call,
            ActivePolicy::Clock($p) => $call,
            ActivePolicy::TwoQ($p) => $call,
            ActivePolicy::S3Fifo($p) => $call,
            ActivePolicy::Other($p) => $call,
            ActivePolicy::Vacant => unreachable!("the replacement policy was used while taken out"),
        }
    };
}
pub(crate) use forward;

impl ReplacementPolicy for ActivePolicy {
    fn name(&self) -> &'static str {
        forward!(self, p => p.name())
    }
    #[inline(always)]
    fn on_hit(&mut self, slot: SlotId, info: &AccessInfo) {
        forward!(self, p => p.on_hit(slot, info))
    }
    #[inline(always)]
    fn on_miss(&mut self, key: LineKey, need_victim: bool, info: &AccessInfo, victims: &mut Vec<SlotId>) {
        forward!(self, p => p.on_miss(key, need_victim, info, victims))
    }
    #[inline(always)]
    fn on_miss_single(
        &mut self,
        key: LineKey,
        need_victim: bool,
        info: &AccessInfo,
        victims: &mut Vec<SlotId>,
    ) -> Option<SlotId> {
        forward!(self, p => p.on_miss_single(key, need_victim, info, victims))
    }
    #[inline(always)]
    fn on_insert(&mut self, slot: SlotId, key: LineKey, info: &AccessInfo) {
        forward!(self, p => p.on_insert(slot, key, info))
    }
    #[inline]
    fn on_remove(&mut self, slot: SlotId) {
        forward!(self, p => p.on_remove(slot))
    }
    #[inline]
    fn on_clean(&mut self, slot: SlotId) {
        forward!(self, p => p.on_clean(slot))
    }
    #[inline(always)]
    fn admit(&mut self, key: LineKey, info: &AccessInfo) -> Option<bool> {
        forward!(self, p => p.admit(key, info))
    }
    #[inline(always)]
    fn next_victims(&self) -> [Option<SlotId>; 2] {
        forward!(self, p => p.next_victims())
    }
    #[inline(always)]
    fn prefetch_hit(&self, slot: SlotId) {
        forward!(self, p => p.prefetch_hit(slot))
    }
    #[inline(always)]
    fn prefetch_key(&self, hash: u32) {
        forward!(self, p => p.prefetch_key(hash))
    }
    fn on_victim_kept(&mut self, slot: SlotId, key: LineKey, info: &AccessInfo) {
        forward!(self, p => p.on_victim_kept(slot, key, info))
    }
    fn on_miss_again(&mut self, key: LineKey, info: &AccessInfo, victims: &mut Vec<SlotId>) {
        forward!(self, p => p.on_miss_again(key, info, victims))
    }
    #[inline(always)]
    fn prefetch_miss(&self, hash: u32) {
        forward!(self, p => p.prefetch_miss(hash))
    }
    fn counters(&self) -> Vec<(&'static str, u64)> {
        forward!(self, p => p.counters())
    }
    fn gauges(&self) -> Vec<(&'static str, u64)> {
        forward!(self, p => p.gauges())
    }
    #[inline(always)]
    fn on_request(&mut self, request: &Request, line: LineSize, info: &AccessInfo) {
        forward!(self, p => p.on_request(request, line, info))
    }
    fn reconfigure(&mut self, params: &PolicyParams) -> Result<bool, CoreError> {
        forward!(self, p => p.reconfigure(params))
    }
    fn set_lines_in_service(&mut self, lines: usize) {
        forward!(self, p => p.set_lines_in_service(lines))
    }
    fn set_process_params(&mut self, process: u32, params: Option<&PolicyParams>) -> Result<bool, CoreError> {
        forward!(self, p => p.set_process_params(process, params))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::testing::{Driver, XorShift};
    use crate::policy::POLICIES;

    #[test]
    fn every_policy_is_held_under_its_own_name() {
        for entry in POLICIES {
            let spec: PolicySpec = entry.name.parse().unwrap();
            let held = ActivePolicy::build(&spec, 64).unwrap();
            assert_eq!(held.name(), entry.name);
            let by_value = !matches!(held, ActivePolicy::Other(_) | ActivePolicy::Vacant);
            let held_by_type = matches!(entry.name, "lru" | "arc" | "fifo" | "clock" | "2q" | "s3fifo");
            assert_eq!(by_value, held_by_type, "{}", entry.name);
        }
    }

    /// A policy held by its own type decides as the registry's trait
    /// object built from the same spec and as the policy built directly
    /// with the parameters the spec names (or the documented defaults).
    #[test]
    fn a_policy_held_by_type_decides_as_the_registry_builds_it() {
        const LINES: usize = 64;
        /// Each access's hit or miss, then the lines resident at the end.
        fn decisions(policy: ActivePolicy) -> (Vec<bool>, Vec<u64>) {
            let mut driver = Driver::new(policy, LINES);
            let mut rng = XorShift(7);
            let hits = (0..5_000)
                .map(|_| {
                    // Mostly a working set a little larger than the cache, with scans.
                    let line = match rng.below(10) {
                        0 => 1_000 + rng.below(10_000),
                        _ => rng.below(96),
                    };
                    driver.access(line)
                })
                .collect();
            (hits, driver.resident())
        }
        let direct = |policy: Box<dyn ReplacementPolicy>| ActivePolicy::Other(policy);
        for (given, built) in [
            ("fifo", direct(Box::new(Fifo::new(LINES)))),
            ("clock", direct(Box::new(Clock::new(LINES)))),
            ("2q", direct(Box::new(TwoQ::new(LINES, 0.25, 0.5)))),
            (
                "2q:kin=0.4:kout=1.5",
                direct(Box::new(TwoQ::new(LINES, 0.4, 1.5))),
            ),
            ("s3fifo", direct(Box::new(S3Fifo::new(LINES, 0.1, 1, None)))),
            (
                "s3fifo:small=0.3:threshold=2:ghost=0.5",
                direct(Box::new(S3Fifo::new(LINES, 0.3, 2, Some(0.5)))),
            ),
        ] {
            let spec: PolicySpec = given.parse().unwrap();
            let held = ActivePolicy::build(&spec, LINES).unwrap();
            assert!(
                !matches!(held, ActivePolicy::Other(_)),
                "{given} is not held by type"
            );
            let by_type = decisions(held);
            assert_eq!(
                by_type,
                decisions(direct(spec.build(LINES).unwrap())),
                "{given}: registry"
            );
            assert_eq!(by_type, decisions(built), "{given}: built directly");
        }
    }
}

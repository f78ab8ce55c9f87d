//! The replacement policy a `Cache` holds, with the most used policies (LRU
//! and ARC) held by value so their per-access calls are direct and can be
//! inlined into the cache's hot loop; every other policy stays behind the
//! trait object the registry builds.
//!
//! [`HeldPolicy`] lets the cache's hottest paths be compiled once per
//! policy held by value: within such a path each call reaches the policy
//! directly (no dispatch per call, and the calls inline), and the cache
//! chooses the path once per request from the policy it holds.
//!
//! This changes no decision: the LRU and ARC held here are built exactly as
//! the registry builds them (`Lru::new`, `Arc::new`: neither takes
//! parameters), and every trait call is forwarded unchanged.

use super::{AccessInfo, Arc, Lru, PolicyParams, PolicySpec, ReplacementPolicy};
use crate::addr::{LineKey, LineSize, Request, SlotId};
use crate::error::CoreError;

pub(crate) enum ActivePolicy {
    Lru(Lru),
    Arc(Box<Arc>),
    Other(Box<dyn ReplacementPolicy>),
}

impl ActivePolicy {
    /// Builds `spec`'s policy for `capacity_lines` lines.
    pub(crate) fn build(spec: &PolicySpec, capacity_lines: usize) -> Result<ActivePolicy, CoreError> {
        let no_params = spec.params().is_empty();
        Ok(match spec.name() {
            "lru" if no_params => ActivePolicy::Lru(Lru::new(capacity_lines)),
            "arc" if no_params => ActivePolicy::Arc(Box::new(Arc::new(capacity_lines))),
            _ => ActivePolicy::Other(spec.build(capacity_lines)?),
        })
    }
}

/// How the cache's generic paths reach the policy it holds: through
/// [`ActivePolicy`] itself (each call dispatched), or as the one type held
/// by value, which the path is compiled for.
pub(crate) trait HeldPolicy: ReplacementPolicy {
    /// The policy `held` holds; only called on a path chosen for it.
    fn held(held: &mut ActivePolicy) -> &mut Self;
    /// [`HeldPolicy::held`] for reading.
    fn held_ref(held: &ActivePolicy) -> &Self;
}

impl HeldPolicy for ActivePolicy {
    #[inline(always)]
    fn held(held: &mut ActivePolicy) -> &mut Self {
        held
    }
    #[inline(always)]
    fn held_ref(held: &ActivePolicy) -> &Self {
        held
    }
}

impl HeldPolicy for Lru {
    #[inline(always)]
    fn held(held: &mut ActivePolicy) -> &mut Self {
        match held {
            ActivePolicy::Lru(p) => p,
            _ => unreachable!("a path compiled for LRU met another policy"),
        }
    }
    #[inline(always)]
    fn held_ref(held: &ActivePolicy) -> &Self {
        match held {
            ActivePolicy::Lru(p) => p,
            _ => unreachable!("a path compiled for LRU met another policy"),
        }
    }
}

impl HeldPolicy for Arc {
    #[inline(always)]
    fn held(held: &mut ActivePolicy) -> &mut Self {
        match held {
            ActivePolicy::Arc(p) => p,
            _ => unreachable!("a path compiled for ARC met another policy"),
        }
    }
    #[inline(always)]
    fn held_ref(held: &ActivePolicy) -> &Self {
        match held {
            ActivePolicy::Arc(p) => p,
            _ => unreachable!("a path compiled for ARC met another policy"),
        }
    }
}

/// Forwards a call to whichever policy is held.
macro_rules! forward {
    ($self:ident, $p:ident => $call:expr) => {
        match $self {
            ActivePolicy::Lru($p) => $call,
            ActivePolicy::Arc($p) => $call,
            ActivePolicy::Other($p) => $call,
        }
    };
}

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
    fn counters(&self) -> Vec<(&'static str, u64)> {
        forward!(self, p => p.counters())
    }
    #[inline(always)]
    fn on_request(&mut self, request: &Request, line: LineSize, info: &AccessInfo) {
        forward!(self, p => p.on_request(request, line, info))
    }
    fn reconfigure(&mut self, params: &PolicyParams) -> Result<bool, CoreError> {
        forward!(self, p => p.reconfigure(params))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::POLICIES;

    #[test]
    fn every_policy_is_held_under_its_own_name() {
        for entry in POLICIES {
            let spec: PolicySpec = entry.name.parse().unwrap();
            let held = ActivePolicy::build(&spec, 64).unwrap();
            assert_eq!(held.name(), entry.name);
            let by_value = matches!(held, ActivePolicy::Lru(_) | ActivePolicy::Arc(_));
            assert_eq!(by_value, matches!(entry.name, "lru" | "arc"), "{}", entry.name);
        }
    }
}

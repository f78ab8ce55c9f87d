//! Why this module exists: under a burst the cache device itself can become
//! the bottleneck (every hit, write, promotion and eviction queues on it
//! while the backend idles). A *load balancer* watches both devices' queues
//! and moves work to the backend: LBICA (DATE'19) by changing the cache's
//! write policy for a while, SIB (TC'18) by sending single requests around
//! the cache. Both are sans-I/O controllers like the rest of the core: the
//! driver (simulator or engine) measures the queues and passes them in with
//! the time, and the controllers answer with a write policy for
//! [`Cache::set_controller_policy`](crate::Cache::set_controller_policy) and,
//! per request, whether to bypass ([`AccessHints::balance_bypass`], decided
//! by `mode::resolve` like every other reason to pass through).
//!
//! - [`queue_mix`]: the R/W/P/E mix of the cache device's queue and the
//!   paper's workload groups.
//! - [`lbica`]: the bottleneck test (Eq. 1), the policy choice of §III-C and
//!   the hysteresis around it.
//! - [`sib`]: the selective-bypass baseline.

pub mod lbica;
pub mod queue_mix;
pub mod sib;

use crate::config::WritePolicy;
pub use lbica::{Lbica, LbicaConfig};
pub use queue_mix::{MixShares, QueueMix, RequestClass, WorkloadGroup};
pub use sib::{Sib, SibConfig};

/// What a driver adds to one request besides the request itself.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AccessHints {
    /// A load balancer asks to serve the request from the backend. The
    /// cache honours it only when none of the request's sectors is dirty in
    /// the cache (then the backend holds the latest data: no stale read, and
    /// a write around the cache loses nothing); otherwise it is served as
    /// usual and counted in `CacheStats::balance_bypasses_refused_dirty`.
    pub balance_bypass: bool,
    /// The request is a readahead fill ([`crate::readahead`]), not a
    /// client's: its lines not in the cache are read from the backend and
    /// inserted, whatever the promotion policy says, and marked as fetched
    /// ahead; lines already cached are left alone. It counts in the
    /// `prefetch_*` counters, not as a request or an access.
    pub prefetch: bool,
    /// A read fills only the sectors it asks for, whatever
    /// [`crate::Fill`] says: the driver cannot read the rest of its last
    /// line (it runs past the volume's end).
    pub request_fill: bool,
}

/// The load on one device: how many requests are queued or in service, and
/// what each costs.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct DeviceLoad {
    /// Requests queued or in service (a mean over an interval, or now).
    pub queued: f64,
    /// How much later the last queued request completes per request ahead
    /// of it: the service time of one request divided by the requests the
    /// device serves at once (`L` of the paper's Eq. 1, which assumes one).
    pub per_request_ns: f64,
    /// The time one request takes on the idle device.
    pub service_ns: f64,
}

impl DeviceLoad {
    /// The paper's Eq. 1: the maximum queue time `T = Q × L`, the wait of
    /// the request at the tail of the queue.
    pub fn queue_time_ns(&self) -> f64 {
        self.queued * self.per_request_ns
    }

    /// The estimated response time of a request that joins the queue now,
    /// behind the `queued` requests: its wait plus its own service.
    pub fn response_ns_if_joined(&self) -> f64 {
        self.queue_time_ns() + self.service_ns
    }
}

/// The inputs of one controller interval.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct IntervalInputs {
    /// The interval's number, from 0.
    pub interval: u64,
    /// The time at the interval's end.
    pub now_ns: u64,
    /// The cache device's load (the mean over the interval).
    pub cache: DeviceLoad,
    /// The backend's load (the mean over the interval).
    pub backend: DeviceLoad,
    /// The cache device queue's content by request class (the mean over
    /// the interval).
    pub cache_mix: QueueMix,
    /// Client requests that arrived during the interval.
    pub arrivals: u64,
}

/// What a controller does to the cache until its next decision.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Action {
    /// The write policy set with `Cache::set_controller_policy` (`None`:
    /// the configured one).
    pub policy: Option<WritePolicy>,
    /// Whether requests that would wait longer at the cache than at the
    /// backend are sent to the backend ([`Balancer::bypass`]).
    pub bypass: bool,
}

impl Action {
    /// The policy in force under `configured`, as text (`wb`, `wo+bypass`).
    pub fn describe(&self, configured: WritePolicy) -> String {
        let policy = self.policy.unwrap_or(configured);
        if self.bypass {
            format!("{policy}+bypass")
        } else {
            policy.to_string()
        }
    }
}

/// One interval's decision: the event a controller reports every interval.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Decision {
    pub interval: u64,
    pub now_ns: u64,
    /// `T_cache` and `T_backend` of Eq. 1 over the interval.
    pub cache_queue_time_ns: f64,
    pub backend_queue_time_ns: f64,
    /// The cache queue's R/W/P/E shares.
    pub shares: MixShares,
    /// Whether the cache was the bottleneck in this interval.
    pub bottleneck: bool,
    /// The workload group, when the controller characterized the queue.
    pub group: Option<WorkloadGroup>,
    /// The action in force from now on.
    pub action: Action,
    /// Whether the action differs from the previous interval's.
    pub changed: bool,
}

impl Decision {
    /// The decision of an interval: its number, time and queue times from
    /// `inputs`, the rest as the controller found it.
    pub fn new(
        inputs: &IntervalInputs,
        shares: MixShares,
        bottleneck: bool,
        group: Option<WorkloadGroup>,
        action: Action,
        changed: bool,
    ) -> Decision {
        Decision {
            interval: inputs.interval,
            now_ns: inputs.now_ns,
            cache_queue_time_ns: inputs.cache.queue_time_ns(),
            backend_queue_time_ns: inputs.backend.queue_time_ns(),
            shares,
            bottleneck,
            group,
            action,
            changed,
        }
    }

    /// What a controller that does not act on the interval reports: the
    /// measurements (the cache is the bottleneck when its queue time is
    /// the longer), the group the default thresholds give, and `action`
    /// unchanged.
    pub fn observed(inputs: &IntervalInputs, action: Action) -> Decision {
        let shares = inputs.cache_mix.shares();
        let bottleneck = inputs.cache.queue_time_ns() > inputs.backend.queue_time_ns();
        let group = queue_mix::characterize(&shares, &queue_mix::GroupThresholds::default());
        Decision::new(inputs, shares, bottleneck, Some(group), action, false)
    }
}

/// A load balancer between the cache device and the backend, driven once
/// per interval and asked once per request.
pub trait Balancer: Send {
    /// The name `--adapt` knows it by.
    fn name(&self) -> &'static str;
    /// Closes an interval and decides what to do until the next one.
    fn on_interval(&mut self, inputs: &IntervalInputs) -> Decision;
    /// The action in force.
    fn action(&self) -> Action;
    /// Whether a request arriving now, with the devices loaded as given
    /// (their queues at this instant), should go to the backend.
    fn bypass(&self, cache_now: &DeviceLoad, backend_now: &DeviceLoad) -> bool;
    /// The per-request test in force, in a form a driver can evaluate on
    /// its request path without the controller (the engine publishes it
    /// once per interval): `Some(margin)` when [`Balancer::bypass`] is
    /// [`bypass_with_margin`] with that margin, `None` when it bypasses
    /// nothing.
    fn bypass_margin(&self) -> Option<f64>;
}

/// The per-request bypass test of LBICA's tail bypass and SIB: a request
/// joining the cache queue now would complete later there than `margin`
/// times its completion at the backend.
pub fn bypass_with_margin(margin: f64, cache_now: &DeviceLoad, backend_now: &DeviceLoad) -> bool {
    cache_now.response_ns_if_joined() > margin * backend_now.response_ns_if_joined()
}

/// The bypass test LBICA's tail bypass and SIB share: a request joining the
/// cache queue now would complete later there than at the backend (it is
/// in the queue's tail past the point where the backend is faster).
pub fn backend_is_faster(cache_now: &DeviceLoad, backend_now: &DeviceLoad) -> bool {
    bypass_with_margin(1.0, cache_now, backend_now)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eq1_and_the_bypass_test() {
        let cache = DeviceLoad {
            queued: 40.0,
            per_request_ns: 10_000.0,
            service_ns: 150_000.0,
        };
        assert_eq!(cache.queue_time_ns(), 400_000.0);
        assert_eq!(cache.response_ns_if_joined(), 550_000.0);
        let backend = DeviceLoad {
            queued: 0.0,
            per_request_ns: 12_500_000.0,
            service_ns: 12_500_000.0,
        };
        // A 12.5 ms disk is slower than 0.55 ms of queue...
        assert!(!backend_is_faster(&cache, &backend));
        // ...but not than 100 ms of it.
        let long = DeviceLoad {
            queued: 10_000.0,
            ..cache
        };
        assert!(backend_is_faster(&long, &backend));
    }
}

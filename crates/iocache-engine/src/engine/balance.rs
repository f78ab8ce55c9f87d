//! A load balancer of the policy core (LBICA or SIB,
//! `iocache_core::balance`) is sans-I/O: it reads no clock and no device.
//! Here the engine drives one: a thread (`iocache-balance`) closes an
//! interval every [`BalanceConfig::interval_ns`], turns the I/O accounting
//! of `queues.rs` into the controller's inputs, and applies its decision
//! to every shard (`Cache::set_controller_policy`, the door an operator's
//! knob changes go through too); and, per request, `balance_hints` asks
//! the controller's published bypass test whether the request goes to the
//! backend (`Cache::access_with`, which refuses it when any of the
//! request's sectors is dirty: never a stale read, never a lost write).
//!
//! # The measurements, per device and interval
//!
//! - `Q` (mean I/Os queued or in service): the sum of the latencies of the
//!   I/Os completed in the interval over its length (Little's law); by
//!   class, that is the cache queue's R/W/P/E mix.
//! - `S` (the time of one I/O alone): the mean latency when the mean
//!   queue was at most one I/O (requests seldom waited), else the
//!   smallest latency of the interval (the I/O that found the shortest
//!   queue); the last value is kept through intervals without I/O.
//! - `L` (time per queued I/O, Eq. 1): the interval's length over its
//!   completions (the rate the device drained at), at most `S`: a busy
//!   device with `k` servers drains one I/O every `S / k`, an idle one is
//!   charged `S` per I/O, as with one server.
//!
//! The request path reads the I/Os in flight on both devices now and the
//! last interval's `L` and `S` (`DeviceLoad`), only when the controller
//! has a bypass in force. No bypass is published before both devices have
//! a measured `S`; a device that has served nothing yet (the backend of a
//! cache that absorbs every request, which SIB alone would never send
//! anything to) is probed with one line-sized read per interval until it
//! has (counted with the backend's, or the cache's R, reads).
//!
//! Volumes sharing the cache device count as one backend (a known limit).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, RwLock, RwLockReadGuard};
use std::time::Duration;

use iocache_core::balance::queue_mix::QueueMix;
use iocache_core::balance::{
    bypass_with_margin, Balancer, DeviceLoad, IntervalInputs, Lbica, LbicaConfig, Sib, SibConfig,
};
use iocache_core::{AccessHints, WritePolicy};

use super::queues::{backend_class, cache_class, QueueSnapshot};
use super::{lock, Inner};

/// Which controller, with its knobs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum BalanceController {
    Lbica(LbicaConfig),
    Sib(SibConfig),
}

impl BalanceController {
    pub fn name(&self) -> &'static str {
        match self {
            BalanceController::Lbica(_) => "lbica",
            BalanceController::Sib(_) => "sib",
        }
    }

    fn build(&self) -> Box<dyn Balancer> {
        match *self {
            BalanceController::Lbica(c) => Box::new(Lbica::new(c)),
            BalanceController::Sib(c) => Box::new(Sib::new(c)),
        }
    }
}

/// A load balancer for the engine (`EngineConfig::balance`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BalanceConfig {
    pub controller: BalanceController,
    /// The controller's interval (positive).
    pub interval_ns: u64,
}

/// One device's load over the last interval, as the controller saw it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BalanceLoad {
    /// Mean I/Os queued or in service (`Q`).
    pub queued: f64,
    /// Time per queued I/O (`L`) and one I/O alone (`S`).
    pub per_request_ns: f64,
    pub service_ns: f64,
    /// Eq. 1: `T = Q × L`.
    pub queue_time_ns: f64,
    /// I/Os completed in the interval.
    pub completed: u64,
}

/// The controller's last interval (`EngineStats::balance`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BalanceDecision {
    /// The interval's number, from 0.
    pub interval: u64,
    pub cache: BalanceLoad,
    pub backend: BalanceLoad,
    /// The cache queue's R/W/P/E shares (each in [0, 1]).
    pub shares: [f64; 4],
    /// Client requests in the interval, and those sent around the cache.
    pub arrivals: u64,
    pub bypassed: u64,
    /// Whether the cache was the bottleneck (Eq. 1 and the floor).
    pub bottleneck: bool,
    /// The workload group, when the controller characterized the queue.
    pub group: Option<&'static str>,
}

/// The controller's state for `iocache stats`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BalanceStats {
    pub controller: &'static str,
    pub interval_ns: u64,
    /// The write policy the controller set (`None`: the configured one).
    pub policy: Option<WritePolicy>,
    /// Whether the per-request bypass is in force.
    pub bypass: bool,
    /// The action in force, as text (`wo`, `wb+bypass`).
    pub action: String,
    /// Intervals closed, and how many of them changed the action.
    pub intervals: u64,
    pub switches: u64,
    pub last: Option<BalanceDecision>,
}

/// What the request path and `stats` read (`Inner::balance`).
pub(super) struct Balance {
    pub config: BalanceConfig,
    /// The bypass margin in force, as f64 bits (NaN: no bypass).
    margin_bits: AtomicU64,
    /// `L` and `S` of the cache device and the backend, as f64 bits.
    cache_cost: [AtomicU64; 2],
    backend_cost: [AtomicU64; 2],
    pub status: Mutex<BalanceStats>,
}

impl Balance {
    pub fn new(config: BalanceConfig) -> Balance {
        Balance {
            config,
            margin_bits: AtomicU64::new(f64::NAN.to_bits()),
            cache_cost: [AtomicU64::new(0), AtomicU64::new(0)],
            backend_cost: [AtomicU64::new(0), AtomicU64::new(0)],
            status: Mutex::new(BalanceStats {
                controller: config.controller.name(),
                interval_ns: config.interval_ns,
                action: "configured".into(),
                ..BalanceStats::default()
            }),
        }
    }

    fn publish(&self, margin: Option<f64>, cache: &Cost, backend: &Cost) {
        let store = |a: &[AtomicU64; 2], c: &Cost| {
            a[0].store(c.per_request_ns.to_bits(), Ordering::Relaxed);
            a[1].store(c.service_ns.unwrap_or(0.0).to_bits(), Ordering::Relaxed);
        };
        store(&self.cache_cost, cache);
        store(&self.backend_cost, backend);
        let margin = match (cache.service_ns, backend.service_ns) {
            (Some(_), Some(_)) => margin.unwrap_or(f64::NAN),
            _ => f64::NAN,
        };
        self.margin_bits.store(margin.to_bits(), Ordering::Release);
    }
}

/// A device's `L` and `S` as the controller carries them from interval to
/// interval.
#[derive(Clone, Copy, Debug, Default)]
struct Cost {
    per_request_ns: f64,
    /// `None` until the device completed an I/O.
    service_ns: Option<f64>,
}

impl Cost {
    /// Updates the costs from an interval of `elapsed_ns` and returns the
    /// device's load over it.
    fn update<const N: usize>(
        &mut self,
        delta: &QueueSnapshot<N>,
        min_latency_ns: Option<u64>,
        elapsed_ns: u64,
    ) -> (DeviceLoad, [f64; N], u64) {
        let elapsed = elapsed_ns.max(1) as f64;
        let by_class: [f64; N] = std::array::from_fn(|c| delta.latency_ns[c] as f64 / elapsed);
        let queued: f64 = by_class.iter().sum();
        let completed: u64 = delta.completed.iter().sum();
        let latency: u64 = delta.latency_ns.iter().sum();
        if completed > 0 {
            let mean = latency as f64 / completed as f64;
            let service = if queued <= 1.0 {
                mean
            } else {
                min_latency_ns.map_or(mean, |m| m as f64)
            };
            self.service_ns = Some(service);
            self.per_request_ns = (elapsed / completed as f64).min(service);
        } else if let Some(s) = self.service_ns {
            self.per_request_ns = s;
        }
        (
            DeviceLoad {
                queued,
                per_request_ns: self.per_request_ns,
                service_ns: self.service_ns.unwrap_or(0.0),
            },
            by_class,
            completed,
        )
    }
}

fn load_stats(load: &DeviceLoad, completed: u64) -> BalanceLoad {
    BalanceLoad {
        queued: load.queued,
        per_request_ns: load.per_request_ns,
        service_ns: load.service_ns,
        queue_time_ns: load.queue_time_ns(),
        completed,
    }
}

impl Inner {
    /// The hints of a request arriving now: whether the controller's
    /// bypass test sends it to the backend (see the module doc).
    #[inline]
    pub(super) fn balance_hints(&self) -> AccessHints {
        let Some(balance) = &self.balance else {
            return AccessHints::default();
        };
        let margin = f64::from_bits(balance.margin_bits.load(Ordering::Acquire));
        if margin.is_nan() {
            return AccessHints::default();
        }
        let load = |queued: u64, cost: &[AtomicU64; 2]| DeviceLoad {
            queued: queued as f64,
            per_request_ns: f64::from_bits(cost[0].load(Ordering::Relaxed)),
            service_ns: f64::from_bits(cost[1].load(Ordering::Relaxed)),
        };
        let cache_now = load(self.queues.cache.in_flight(), &balance.cache_cost);
        let backend_now = load(self.queues.backend.in_flight(), &balance.backend_cost);
        AccessHints {
            balance_bypass: bypass_with_margin(margin, &cache_now, &backend_now),
            ..Default::default()
        }
    }

    /// Sets (or withdraws) the controller's write policy on every shard.
    pub(super) fn set_controller_policy(&self, policy: Option<WritePolicy>) {
        for shard in &self.shards {
            lock(&shard.state).cache.set_controller_policy(policy);
        }
    }

    /// The client requests and balance bypasses the cores have counted.
    fn requests_and_bypasses(&self) -> (u64, u64) {
        let mut requests = 0;
        let mut bypasses = 0;
        for shard in &self.shards {
            let state = lock(&shard.state);
            requests += state.cache.stats().requests;
            bypasses += state.cache.stats().balance_bypasses;
        }
        (requests, bypasses)
    }

    /// One line-sized read of the cache device (at slot 0's place) or of
    /// the first volume's backend (at its start), timed like the others:
    /// the `S` of a device that has served nothing yet. A failed probe (or
    /// no volume attached) measures nothing.
    fn probe(&self, backend: bool) {
        if backend {
            let Some(device) = lock_read(&self.volumes).first_backend() else {
                return;
            };
            let mut buf = vec![0u8; self.line_bytes.min(device.len_bytes()) as usize];
            let _ = self
                .queues
                .backend
                .time(&self.clock, backend_class::READ, || device.read_at(&mut buf, 0));
        } else {
            let mut buf = vec![0u8; self.line_bytes as usize];
            let _ = self.queues.cache.time(&self.clock, cache_class::READ_HIT, || {
                self.slots.dev.read_at(&mut buf, self.slots.data_offset)
            });
        }
    }

    /// The controller thread (see the module doc): runs until the engine
    /// stops, then withdraws its policy.
    pub(super) fn run_balancer(&self) {
        let Some(balance) = &self.balance else {
            return;
        };
        let config = balance.config;
        let mut balancer = config.controller.build();
        let interval_ns = config.interval_ns.max(1);
        let mut applied: Option<WritePolicy> = None;
        let mut costs = [Cost::default(), Cost::default()];
        let mut index = 0u64;
        let mut last_ns = self.now_ns();
        let mut last_cache = self.queues.cache.snapshot();
        let mut last_backend = self.queues.backend.snapshot();
        let (mut last_requests, mut last_bypasses) = self.requests_and_bypasses();
        self.queues.cache.take_min_latency_ns();
        self.queues.backend.take_min_latency_ns();
        loop {
            let deadline = last_ns + interval_ns;
            while !self.stopping.load(Ordering::Relaxed) {
                let now = self.now_ns();
                if now >= deadline {
                    break;
                }
                std::thread::park_timeout(Duration::from_nanos(deadline - now));
            }
            if self.stopping.load(Ordering::Relaxed) {
                break;
            }
            let now_ns = self.now_ns();
            let elapsed_ns = now_ns - last_ns;
            let cache_snap = self.queues.cache.snapshot();
            let backend_snap = self.queues.backend.snapshot();
            let (requests, bypasses) = self.requests_and_bypasses();
            let (cache, mix, cache_done) = costs[0].update(
                &cache_snap.since(&last_cache),
                self.queues.cache.take_min_latency_ns(),
                elapsed_ns,
            );
            let (backend, _, backend_done) = costs[1].update(
                &backend_snap.since(&last_backend),
                self.queues.backend.take_min_latency_ns(),
                elapsed_ns,
            );
            let arrivals = requests.saturating_sub(last_requests);
            let inputs = IntervalInputs {
                interval: index,
                now_ns,
                cache,
                backend,
                cache_mix: QueueMix { by_class: mix },
                arrivals,
            };
            let decision = balancer.on_interval(&inputs);
            // The configured policy, which `ctl set` may have changed.
            let configured = lock(&self.shards[0].state).cache.write_policy();
            let policy = decision.action.policy;
            if policy != applied {
                self.set_controller_policy(policy);
                applied = policy;
            }
            balance.publish(balancer.bypass_margin(), &costs[0], &costs[1]);
            for (device, cost) in costs.iter().enumerate() {
                if cost.service_ns.is_none() {
                    self.probe(device == 1);
                }
            }
            let group = decision.group.map(|g| g.name());
            let shares = decision.shares;
            if decision.changed {
                log::info!(
                    "{}: interval {index}: {} (T_cache {:.3} ms, T_backend {:.3} ms, R/W/P/E {:.0}/{:.0}/{:.0}/{:.0} %, group {})",
                    config.controller.name(),
                    decision.action.describe(configured),
                    decision.cache_queue_time_ns / 1e6,
                    decision.backend_queue_time_ns / 1e6,
                    shares.read_hits * 100.0,
                    shares.writes * 100.0,
                    shares.promotions * 100.0,
                    shares.evictions * 100.0,
                    group.unwrap_or("-")
                );
            }
            {
                let mut status = lock(&balance.status);
                status.policy = policy;
                status.bypass = decision.action.bypass;
                status.action = decision.action.describe(configured);
                status.intervals += 1;
                status.switches += u64::from(decision.changed);
                status.last = Some(BalanceDecision {
                    interval: index,
                    cache: load_stats(&cache, cache_done),
                    backend: load_stats(&backend, backend_done),
                    shares: [
                        shares.read_hits,
                        shares.writes,
                        shares.promotions,
                        shares.evictions,
                    ],
                    arrivals,
                    bypassed: bypasses.saturating_sub(last_bypasses),
                    bottleneck: decision.bottleneck,
                    group,
                });
            }
            index += 1;
            last_ns = now_ns;
            last_cache = cache_snap;
            last_backend = backend_snap;
            last_requests = requests;
            last_bypasses = bypasses;
        }
        balance.publish(None, &costs[0], &costs[1]);
        if applied.is_some() {
            self.set_controller_policy(None);
        }
    }
}

fn lock_read<T>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delta(completed: [u64; 2], latency_ns: [u64; 2]) -> QueueSnapshot<2> {
        QueueSnapshot {
            issued: completed,
            completed,
            latency_ns,
        }
    }

    #[test]
    fn costs_from_an_interval() {
        let mut cost = Cost::default();
        // Nothing yet: no S, nothing queued.
        let (load, _, done) = cost.update(&delta([0, 0], [0, 0]), None, 100_000_000);
        assert_eq!((load.queued, load.service_ns, done), (0.0, 0.0, 0));
        assert_eq!(cost.service_ns, None);
        // Light load: 100 I/Os of 200 µs in 100 ms, Q = 0.2: S is their
        // mean, and L = S (the device idled between them).
        let (load, _, _) = cost.update(
            &delta([60, 40], [12_000_000, 8_000_000]),
            Some(150_000),
            100_000_000,
        );
        assert!((load.queued - 0.2).abs() < 1e-9, "{load:?}");
        assert_eq!((load.service_ns, load.per_request_ns), (200_000.0, 200_000.0));
        // Saturated: 1,000 I/Os in 100 ms, each 3.2 ms (32 queued at 100 µs):
        // Q = 32, S = the smallest latency, L = 100 µs (the drain rate).
        let (load, mix, _) = cost.update(&delta([1000, 0], [3_200_000_000, 0]), Some(120_000), 100_000_000);
        assert!(
            (load.queued - 32.0).abs() < 1e-9 && mix == [32.0, 0.0],
            "{load:?}"
        );
        assert_eq!((load.service_ns, load.per_request_ns), (120_000.0, 100_000.0));
        assert!((load.queue_time_ns() - 3_200_000.0).abs() < 1.0);
        // An idle interval keeps S and charges it per request.
        let (load, _, _) = cost.update(&delta([0, 0], [0, 0]), None, 100_000_000);
        assert_eq!(
            (load.queued, load.service_ns, load.per_request_ns),
            (0.0, 120_000.0, 120_000.0)
        );
    }
}
